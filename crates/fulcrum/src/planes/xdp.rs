//! The in-kernel data plane (forwarding = "nat" | "dr" | "tunnel"): builds fulcrum-xdp's maps
//! from the same Pool / Member objects as every other plane and keeps them current.
//!
//! - VIPs: every `listen` address of an in-kernel tcp/udp service; a service's addresses share
//!   one VIP index (ring and counters), stable across reloads while the service exists. Port 0
//!   is a tcp/udp VIP of every port; a `protocol = "ip"` service's addresses are VIPs of every
//!   protocol (`VIP_PROTO_ANY`), always hashed by the client address so all of a client's
//!   protocols take one member, and never port-translated in nat mode.
//! - Reals: one per member address, numbered from 1 and never renumbered while the member is
//!   in a pool, so connection-table entries stay valid across reloads (no flow lost). A
//!   member in no pool any more gives its number back once its flows are gone
//!   (fulcrum_xdp::RealSlots), so members coming and going never exhaust the 4,095.
//! - Rings: weighted Maglev over the members that accept new clients, with their effective
//!   weights (weight × agent % × slow-start ramp); a drained or down member gets no slots.
//!   Rewritten only when the weights change (a few slots change per step of a ramp).
//! - A member that goes down or is disabled has its flows dropped from the connection table, so
//!   its clients are rescheduled on their next packet; a drained member keeps them.
//! - Next-hop MACs come from the kernel's routing and neighbour tables (`ip -j route get`,
//!   `ip -j neigh`), retried every second while unknown and checked again every 30 s; an
//!   unresolved member gets no ring slots. Rings, next hops and flows are kept current by
//!   fulcrum_xdp::refresh; this plane turns the configuration into its tables.
//! - With `ha.sync`, the program reports every new flow (`flow_events`); a thread drains them
//!   into the HA plane's stream as `FlowEntry`s (by service name and member address: the peer
//!   numbers its VIPs and reals its own way), and writes the peer's flows into this node's
//!   tables (fulcrum_xdp::flow_sync; `FlowSync` here carries its flows as the HA stream's).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::Pool;
use fulcrum_config::{Config, Forwarding, HaMode, PersistenceKind, Protocol, VirtualService};
use fulcrum_ha::sync::{FlowEntry, FlowHop};
use fulcrum_net::StreamHandler;
use fulcrum_xdp::tables::{RealState, Service, State};
use fulcrum_xdp::{flow_sync, refresh};
use fulcrum_xdp::{
    Dataplane, DropReason, Global, Limits, VipKey, VipMeta, MODE_DR, MODE_NAT, MODE_TUNNEL,
    VIP_F_PERSIST_SRC, VIP_PROTO_ANY,
};
use parking_lot::Mutex;

use crate::planes::{BuildCx, DataPlane};

fn prefixes(nets: &[ipnet::IpNet]) -> Vec<(IpAddr, u8)> {
    nets.iter().map(|n| (n.addr(), n.prefix_len())).collect()
}

/// Trie entries a service's lists take: IPv4 prefixes also go in as IPv4-mapped IPv6.
fn acl_size(vs: &VirtualService) -> usize {
    vs.access
        .allow
        .iter()
        .chain(&vs.access.deny)
        .map(|n| if n.addr().is_ipv4() { 2 } else { 1 })
        .sum()
}

fn flow_limits(vs: &VirtualService) -> Option<fulcrum_xdp::FlowLimits> {
    vs.forwarding()
        .flow_limits
        .map(|l| fulcrum_xdp::FlowLimits {
            new_per_second: l.new_per_second.unwrap_or(0),
            burst: l.burst.or(l.new_per_second).unwrap_or(0),
            max: l.max.unwrap_or(0),
        })
}

pub struct XdpPlane {
    state: Arc<Mutex<Option<State>>>,
    running: Arc<AtomicBool>,
    /// The in-kernel services of the configuration being applied, collected by `build`.
    collected: Mutex<Vec<VirtualService>>,
    /// Interfaces `complete` attached for the configuration being applied: `abort` detaches
    /// them, so a refused configuration leaves the kernel as it was.
    attached_now: Mutex<Vec<String>>,
    flows: Arc<FlowSync>,
}

impl Default for XdpPlane {
    fn default() -> XdpPlane {
        let state = Arc::new(Mutex::new(None));
        XdpPlane {
            flows: Arc::new(FlowSync(Arc::new(flow_sync::FlowSync::new(state.clone())))),
            state,
            running: Arc::new(AtomicBool::new(false)),
            collected: Mutex::new(Vec::new()),
            attached_now: Mutex::new(Vec::new()),
        }
    }
}

/// `ha.sync` of the connection tables (fulcrum_xdp::flow_sync) in the HA stream's terms: its
/// flows as `FlowEntry`s, its counters as `sync.flows` of `GET /api/v1/ha`.
pub struct FlowSync(Arc<flow_sync::FlowSync>);

/// Where a new flow goes: the HA plane's bounded queue (false: it was full).
pub type FlowSink = Box<dyn Fn(FlowEntry) -> bool + Send + Sync>;

fn flow_entry(f: flow_sync::Flow) -> FlowEntry {
    FlowEntry {
        vs: f.vs,
        client: f.client,
        vip: f.vip,
        proto: f.proto,
        member: f.member,
        hop: f.hop.map(|h| FlowHop {
            mac: h.mac,
            interface: h.interface,
        }),
        idle_ms: f.idle_ms,
    }
}

fn flow_of(e: &FlowEntry) -> flow_sync::Flow {
    flow_sync::Flow {
        vs: e.vs.clone(),
        client: e.client,
        vip: e.vip,
        proto: e.proto,
        member: e.member,
        hop: e.hop.as_ref().map(|h| flow_sync::Hop {
            mac: h.mac,
            interface: h.interface.clone(),
        }),
        idle_ms: e.idle_ms,
    }
}

impl FlowSync {
    /// Turns the stream of new flows on (ha.sync has started): each goes to `sink`.
    pub fn set_sink(&self, sink: FlowSink) {
        self.0.set_sink(Box::new(move |f| sink(flow_entry(f))));
    }

    /// Every live flow of this node (see `fulcrum_xdp::flow_sync::FlowSync::dump`).
    pub fn dump(&self, active_within: Option<Duration>) -> Vec<FlowEntry> {
        self.0
            .dump(active_within)
            .into_iter()
            .map(flow_entry)
            .collect()
    }

    /// Writes a peer's flows, sent at `sent_ms`, into this node's tables.
    pub fn apply(&self, flows: &[FlowEntry], sent_ms: u64) {
        let flows: Vec<flow_sync::Flow> = flows.iter().map(flow_of).collect();
        self.0.apply(&flows, sent_ms);
    }

    /// Counters for `sync.flows` of `GET /api/v1/ha` and the metrics.
    pub fn counts(&self) -> [(&'static str, u64); 5] {
        self.0.counts()
    }

    /// `sync.flows` of `GET /api/v1/ha`.
    pub fn status(&self) -> serde_json::Value {
        let mut v = serde_json::Map::new();
        for (k, n) in self.counts() {
            v.insert(k.to_string(), serde_json::json!(n));
        }
        let (last, max) = self.0.lags();
        v.insert("lag_ms".into(), serde_json::json!(last));
        v.insert("lag_max_ms".into(), serde_json::json!(max));
        serde_json::Value::Object(v)
    }

    /// The last flow batch's lag (ms).
    pub fn lag_ms(&self) -> Option<f64> {
        self.0.lag_ms()
    }
}

fn mode_flags(f: Forwarding) -> u32 {
    match f {
        Forwarding::Dr => MODE_DR,
        Forwarding::Tunnel => MODE_TUNNEL,
        _ => MODE_NAT,
    }
}

fn attach_mode(mode: fulcrum_config::XdpMode) -> aya::programs::XdpMode {
    match mode {
        fulcrum_config::XdpMode::Auto => aya::programs::XdpMode::Default,
        fulcrum_config::XdpMode::Native => aya::programs::XdpMode::Driver,
        fulcrum_config::XdpMode::Generic => aya::programs::XdpMode::Skb,
    }
}

fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Udp => 17,
        Protocol::Ip => VIP_PROTO_ANY,
        _ => 6,
    }
}

impl XdpPlane {
    /// Loads the program and starts its flow thread the first time an in-kernel service
    /// appears (loading attaches nothing: no packet takes it yet).
    fn ensure_loaded(
        &self,
        guard: &mut Option<State>,
        services: &[VirtualService],
    ) -> Result<(), Vec<String>> {
        if guard.is_none() {
            let mut dp = Dataplane::load(Limits::default())
                .map_err(|e| vec![format!("cannot load the XDP forwarder: {e}")])?;
            let events = dp
                .take_flow_events()
                .map_err(|e| vec![format!("cannot load the XDP forwarder: {e}")])?;
            let alive = Arc::new(());
            let (flows, weak) = (self.flows.0.clone(), Arc::downgrade(&alive));
            let refresh = flow_sync::refresh_period(
                services
                    .iter()
                    .map(|v| match v.as_udp() {
                        Some(udp) => udp.session_timeout,
                        None => v.idle_timeout,
                    })
                    .min(),
            );
            std::thread::Builder::new()
                .name("fulcrum-xdp-sync".into())
                .spawn(move || flow_sync::drain_flow_events(events, flows, weak, refresh))
                .map_err(|e| vec![format!("cannot start the XDP flow sync thread: {e}")])?;
            *guard = Some(State::new(dp, alive));
            self.start_refresher();
        }
        Ok(())
    }

    /// `complete`: loads the program and attaches it to the interfaces the new configuration
    /// adds (what can fail: an interface that does not exist, a mode the driver refuses, more
    /// services than the maps hold). What it attached is recorded for `abort`.
    fn attach_new(&self, services: &[VirtualService]) -> Result<(), Vec<String>> {
        if services.is_empty() {
            return Ok(());
        }
        let mut guard = self.state.lock();
        self.ensure_loaded(&mut guard, services)?;
        let Some(st) = guard.as_mut() else {
            return Ok(());
        };
        let limit = st.dp.limits().vips as usize;
        if services.len() > limit {
            return Err(vec![format!("more than {limit} nat/dr/tunnel services")]);
        }
        // The access lists must fit the trie, with room for one service's old and new lists
        // side by side while a reload switches them.
        let acl_room = st.dp.limits().acl_entries as usize;
        let total: usize = services.iter().map(acl_size).sum();
        let largest = services.iter().map(acl_size).max().unwrap_or(0);
        if total + largest > acl_room {
            return Err(vec![format!(
                "allow/deny of the nat/dr/tunnel services take {total} prefixes in the kernel (IPv4 ones count twice), more than {} fit",
                acl_room.saturating_sub(largest)
            )]);
        }
        let mut attached = self.attached_now.lock();
        for vs in services {
            let mode = attach_mode(vs.forwarding().xdp_mode);
            for ifname in &vs.forwarding().interfaces {
                if st.dp.attached().contains(ifname) {
                    continue;
                }
                if let Err(e) = st.dp.attach(ifname, mode) {
                    for done in attached.drain(..) {
                        let _ = st.dp.detach(&done);
                    }
                    return Err(vec![format!("{e}")]);
                }
                tracing::info!(interface = %ifname, mode = %vs.forwarding().xdp_mode, "XDP forwarder attached");
                attached.push(ifname.clone());
            }
        }
        Ok(())
    }

    /// `abort`: detaches what `attach_new` attached for the refused configuration.
    fn detach_new(&self) {
        let attached: Vec<String> = self.attached_now.lock().drain(..).collect();
        if attached.is_empty() {
            return;
        }
        if let Some(st) = self.state.lock().as_mut() {
            for ifname in attached {
                match st.dp.detach(&ifname) {
                    Ok(()) => {
                        tracing::info!(interface = %ifname, "XDP forwarder detached: the configuration that attached it was refused")
                    }
                    Err(e) => {
                        tracing::error!(interface = %ifname, error = %e, "XDP: cannot detach after a refused configuration")
                    }
                }
            }
        }
    }

    /// `commit`: updates the maps in place for `services` (on the interfaces `attach_new`
    /// attached) and detaches from interfaces no longer listed. With no in-kernel service
    /// left, the program is detached and unloaded.
    fn apply(
        &self,
        services: &[VirtualService],
        config: &Config,
        pools: &[Arc<Pool>],
    ) -> Result<(), Vec<String>> {
        let mut guard = self.state.lock();
        if services.is_empty() {
            if guard.take().is_some() {
                tracing::info!("no nat/dr/tunnel service left: XDP program detached");
            }
            return Ok(());
        }
        self.ensure_loaded(&mut guard, services)?;
        let Some(st) = guard.as_mut() else {
            return Ok(());
        };
        set_program_config(st, services, config)?;
        detach_unlisted(st, services)?;
        // VIP indices: kept by service name, new services take the lowest free index.
        let limit = st.dp.limits().vips;
        let mut used: HashSet<u32> = HashSet::new();
        let mut next = Vec::new();
        let mut old: HashMap<String, Service> =
            st.services.drain(..).map(|s| (s.name.clone(), s)).collect();
        for vs in services {
            let Some(pool) = vs
                .pool
                .as_ref()
                .and_then(|n| pools.iter().find(|p| &*p.name == n))
                .cloned()
            else {
                continue;
            };
            let prev = old.remove(&vs.name);
            let index = match &prev {
                Some(p) => p.index,
                None => (0..limit)
                    .find(|i| {
                        !used.contains(i)
                            && !old.values().any(|o| o.index == *i)
                            && !next.iter().any(|s: &Service| s.index == *i)
                    })
                    .ok_or_else(|| vec![format!("more than {limit} nat/dr/tunnel services")])?,
            };
            used.insert(index);
            next.push(program_service(st, vs, config, pool, index, prev)?);
        }
        for gone in old.into_values() {
            remove_service(st, &gone)?;
        }
        refresh::retire_unlisted_reals(st, &next);
        st.services = next;
        self.flows.0.set_names(st);
        // A cap that is new or changed counts from the flows there are now.
        st.last_recount = None;
        refresh::refresh(st);
        Ok(())
    }

    /// ha.sync of the connection tables (shared with the HA plane).
    pub fn flow_sync(&self) -> Arc<FlowSync> {
        self.flows.clone()
    }

    fn start_refresher(&self) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(e) = refresh::spawn(self.state.clone(), self.running.clone()) {
            tracing::error!(error = %e, "cannot start the XDP refresh thread");
        }
    }

    /// Detaches (SIGTERM): the bpf_links go with the loaded object.
    pub fn shutdown(&self) {
        self.running.store(false, Ordering::Release);
        if self.state.lock().take().is_some() {
            tracing::info!("XDP forwarder detached");
        }
    }

    /// `GET /api/v1/xdp`: attachments, services with their counters, members with theirs.
    pub fn api(&self) -> (u16, serde_json::Value) {
        use serde_json::json;
        let guard = self.state.lock();
        let Some(st) = guard.as_ref() else {
            return (404, json!({ "error": "no nat/dr/tunnel service" }));
        };
        let services: Vec<serde_json::Value> = st
            .services
            .iter()
            .map(|s| {
                let v = st.dp.vip_stats(s.index).unwrap_or_default();
                let drops: serde_json::Map<String, serde_json::Value> = DropReason::ALL
                    .iter()
                    .map(|r| (r.name().to_string(), json!(v.drops[*r as usize])))
                    .collect();
                let members: Vec<serde_json::Value> = s
                    .pool
                    .members()
                    .iter()
                    .zip(s.weights.iter().chain(std::iter::repeat(&0)))
                    .map(|(m, w)| {
                        let r = st.reals.get(&m.address);
                        let rs = r
                            .and_then(|r| st.dp.real_stats(r.index).ok())
                            .unwrap_or_default();
                        json!({
                            "address": m.address.to_string(),
                            "next_hop_resolved": r.is_some_and(|r| r.resolved),
                            "ring_weight": w,
                            "packets": rs.packets,
                            "bytes": rs.bytes,
                            "new_flows": rs.new_flows,
                        })
                    })
                    .collect();
                json!({
                    "name": s.name,
                    "vip_index": s.index,
                    "packets": v.packets,
                    "bytes": v.bytes,
                    "new_flows": v.new_flows,
                    "reply_packets": v.reply_packets,
                    "reply_bytes": v.reply_bytes,
                    "drops": drops,
                    "access_list": s.acl.2 != 0,
                    "flow_limits": s.limits.map(|l| json!({
                        "new_per_second": l.new_per_second,
                        "burst": l.burst,
                        "max": l.max,
                        "flows": st.dp.flow_state(s.index).ok().map(|(_, n)| n.max(0)),
                        "flows_at_last_recount": st.flow_counts.get(&s.index),
                    })),
                    "members": members,
                })
            })
            .collect();
        let global: serde_json::Map<String, serde_json::Value> = Global::ALL
            .iter()
            .map(|g| (g.name().to_string(), json!(st.dp.global(*g).unwrap_or(0))))
            .collect();
        (
            200,
            json!({
                "interfaces": st.dp.attached(),
                "connections": st.dp.conn_count().unwrap_or(0),
                "services": services,
                "packets": global,
            }),
        )
    }

    pub fn metrics(&self, out: &mut fulcrum_admin::MetricFamilies) {
        let guard = self.state.lock();
        let Some(st) = guard.as_ref() else {
            return;
        };
        let stats: Vec<(&str, fulcrum_xdp::VipStats)> = st
            .services
            .iter()
            .filter_map(|s| Some((s.name.as_str(), st.dp.vip_stats(s.index).ok()?)))
            .collect();
        type Field = fn(&fulcrum_xdp::VipStats) -> u64;
        let families: [(&str, &str, Field); 5] = [
            (
                "fulcrum_xdp_vs_packets_total",
                "Client packets to the service's VIPs.",
                |s| s.packets,
            ),
            (
                "fulcrum_xdp_vs_bytes_total",
                "Bytes of client packets to the VIPs.",
                |s| s.bytes,
            ),
            (
                "fulcrum_xdp_vs_new_flows_total",
                "Flows scheduled from the ring.",
                |s| s.new_flows,
            ),
            (
                "fulcrum_xdp_vs_reply_packets_total",
                "nat: member replies rewritten back.",
                |s| s.reply_packets,
            ),
            (
                "fulcrum_xdp_vs_reply_bytes_total",
                "nat: bytes of member replies.",
                |s| s.reply_bytes,
            ),
        ];
        for (name, help, f) in families {
            let mut samples = out.counter(name, help);
            for (svc, s) in &stats {
                samples.sample(&[("service", svc)], f(s));
            }
        }
        let mut samples = out.counter(
            "fulcrum_xdp_vs_drops_total",
            "Packets to the VIPs dropped in the kernel, by reason.",
        );
        for (svc, s) in &stats {
            for r in DropReason::ALL {
                samples.sample(
                    &[("service", svc), ("reason", r.name())],
                    s.drops[r as usize],
                );
            }
        }
        let mut samples = out.gauge(
            "fulcrum_xdp_vs_flows",
            "Flows of a service with flow_limits.max, as the kernel counts them against the cap.",
        );
        for s in st
            .services
            .iter()
            .filter(|s| s.limits.is_some_and(|l| l.max > 0))
        {
            if let Ok((_, n)) = st.dp.flow_state(s.index) {
                samples.sample(&[("service", &s.name)], n.max(0));
            }
        }
        let mut samples = out.counter(
            "fulcrum_xdp_member_packets_total",
            "Client packets forwarded to the member.",
        );
        let mut reals: Vec<(&SocketAddr, &RealState)> = st.reals.iter().collect();
        reals.sort_by_key(|(_, r)| r.index);
        let real_stats: Vec<(String, fulcrum_xdp::RealStats)> = reals
            .iter()
            .filter_map(|(a, r)| Some((a.to_string(), st.dp.real_stats(r.index).ok()?)))
            .collect();
        for (a, s) in &real_stats {
            samples.sample(&[("member", a)], s.packets);
        }
        let mut samples = out.counter(
            "fulcrum_xdp_member_bytes_total",
            "Bytes forwarded to the member.",
        );
        for (a, s) in &real_stats {
            samples.sample(&[("member", a)], s.bytes);
        }
        let mut samples = out.counter(
            "fulcrum_xdp_member_new_flows_total",
            "Flows scheduled to the member.",
        );
        for (a, s) in &real_stats {
            samples.sample(&[("member", a)], s.new_flows);
        }
        let mut samples = out.counter(
            "fulcrum_xdp_packets_total",
            "Packets the XDP program did not forward, by what it did.",
        );
        for g in Global::ALL {
            if let Ok(v) = st.dp.global(g) {
                samples.sample(&[("kind", g.name())], v);
            }
        }
    }
}

fn xdp_err(e: fulcrum_xdp::Error) -> Vec<String> {
    vec![format!("XDP: {e}")]
}

/// The program's settings for `services`: NAT on or off, flow timeouts, and whether new flows
/// are reported for ha.sync.
fn set_program_config(
    st: &mut State,
    services: &[VirtualService],
    config: &Config,
) -> Result<(), Vec<String>> {
    let nat = services
        .iter()
        .any(|v| v.forwarding().forwarding == Forwarding::Nat);
    // An ip service's idle_timeout is its flows' whatever their protocol: it counts towards
    // the TCP and UDP timeouts too (the longest of each applies, the table is shared).
    let ip_idle = services
        .iter()
        .filter(|v| v.protocol() == Protocol::Ip)
        .map(|v| v.idle_timeout);
    let tcp_idle = services
        .iter()
        .filter(|v| v.protocol() == Protocol::Tcp)
        .map(|v| v.idle_timeout)
        .chain(ip_idle.clone())
        .max()
        .unwrap_or(Duration::from_secs(900));
    let udp_idle = services
        .iter()
        .filter_map(|v| v.as_udp())
        .map(|u| u.session_timeout)
        .chain(ip_idle.clone())
        .max()
        .unwrap_or(Duration::from_secs(300));
    let other_idle = ip_idle.max().unwrap_or(Duration::from_secs(300));
    let any_proto = services.iter().any(|v| v.protocol() == Protocol::Ip);
    let wildcard = any_proto
        || services
            .iter()
            .any(|v| v.listen.iter().any(|a| a.port() == 0));
    // ha.sync on (a running node keeps the [ha] it started with: see HaPlane::reload).
    let sync = config
        .ha
        .as_ref()
        .is_some_and(|h| h.sync.is_some() && h.mode != HaMode::ActiveActive);
    st.dp
        .set_config(&fulcrum_xdp::Config {
            tcp_idle,
            udp_idle,
            other_idle,
            nat,
            sync,
            wildcard,
            any_proto,
            ..fulcrum_xdp::Config::default()
        })
        .map_err(xdp_err)?;
    st.timeouts = (tcp_idle, udp_idle);
    Ok(())
}

fn detach_unlisted(st: &mut State, services: &[VirtualService]) -> Result<(), Vec<String>> {
    let wanted: HashSet<&str> = services
        .iter()
        .flat_map(|v| v.forwarding().interfaces.iter().map(String::as_str))
        .collect();
    for ifname in st.dp.attached() {
        if !wanted.contains(ifname.as_str()) {
            st.dp.detach(&ifname).map_err(xdp_err)?;
            tracing::info!(interface = %ifname, "XDP forwarder detached (no longer listed)");
        }
    }
    Ok(())
}

/// Writes service `vs` at VIP `index` (its access list, flow limits, VIP keys and member
/// numbers); `prev` is the service of the same name before, whose state carries over.
fn program_service(
    st: &mut State,
    vs: &VirtualService,
    config: &Config,
    pool: Arc<Pool>,
    index: u32,
    prev: Option<Service>,
) -> Result<Service, Vec<String>> {
    // ip services hash by the client address whatever the protocol: ESP, GRE and the IKE or
    // control connection of one client meet on one member.
    let persist = vs.protocol() == Protocol::Ip
        || vs
            .persistence
            .as_ref()
            .and_then(|n| config.persistence(n))
            .is_some_and(|p| p.kind == PersistenceKind::SourceIp);
    if prev.is_none() {
        // A new service at this index: no flows, a full bucket, no stale list.
        st.dp.reset_flows(index).map_err(xdp_err)?;
        st.dp.clear_acl(index, true).map_err(xdp_err)?;
        st.dp.clear_acl(index, false).map_err(xdp_err)?;
    }
    // allow / deny: a changed list goes in under the other generation and is put in force by
    // the VIP update below; the previous one is removed after it.
    let acl_text = format!("{:?}", vs.access);
    let old_gen = prev.as_ref().is_none_or(|p| p.acl.1);
    let acl = match &prev {
        Some(p) if p.acl.0 == acl_text => p.acl.clone(),
        _ => {
            let gen = !old_gen;
            let flags = st
                .dp
                .set_acl(
                    index,
                    gen,
                    &prefixes(&vs.access.allow),
                    &prefixes(&vs.access.deny),
                )
                .map_err(xdp_err)?;
            (acl_text, gen, flags)
        }
    };
    let limits = flow_limits(vs);
    let limit_flag = st.dp.set_flow_limits(index, limits).map_err(xdp_err)?;
    let meta = VipMeta {
        index,
        flags: mode_flags(vs.forwarding().forwarding)
            | if persist { VIP_F_PERSIST_SRC } else { 0 }
            | acl.2
            | limit_flag,
    };
    let keys: Vec<VipKey> = vs
        .listen
        .iter()
        .map(|a| VipKey::new(a.ip(), a.port(), proto_number(vs.protocol())))
        .collect();
    for k in &keys {
        st.dp.set_vip(*k, meta).map_err(xdp_err)?;
    }
    if let Some(p) = &prev {
        for k in p.keys.iter().filter(|k| !keys.contains(k)) {
            st.dp.remove_vip(k).map_err(xdp_err)?;
        }
    }
    if acl.1 != old_gen {
        st.dp.clear_acl(index, old_gen).map_err(xdp_err)?;
    }
    number_members(st, vs, &pool);
    Ok(Service {
        name: vs.name.clone(),
        index,
        flags: meta.flags,
        pool,
        keys,
        // Forces the first ring write of a new service; a kept service keeps its ring.
        built_from: prev
            .as_ref()
            .map(|p| p.built_from.clone())
            .unwrap_or_default(),
        weights: prev.map(|p| p.weights).unwrap_or_default(),
        acl,
        limits,
    })
}

/// Gives each member of `pool` a real number (once), and the port NAT rewrites to: a member
/// whose port changed is resolved again.
fn number_members(st: &mut State, vs: &VirtualService, pool: &Pool) {
    for m in pool.members() {
        if !st.reals.contains_key(&m.address) {
            let Some(index) = st.slots.allocate() else {
                tracing::warn!(member = %m.address, "XDP: all member numbers in use; the member gets no new flows");
                continue;
            };
            st.reals.insert(m.address, RealState::new(index));
        }
        if let Some(r) = st.reals.get_mut(&m.address) {
            // An ip service forwards every port as it came: no port translation.
            let port =
                if vs.forwarding().forwarding == Forwarding::Nat && vs.protocol() != Protocol::Ip {
                    m.address.port()
                } else {
                    0
                };
            if r.nat_port != port {
                r.nat_port = port;
                r.resolved = false;
                r.last_try = None;
            }
        }
    }
}

/// A service no longer configured: its VIPs, ring, access list and flow limits go.
fn remove_service(st: &mut State, gone: &Service) -> Result<(), Vec<String>> {
    for k in &gone.keys {
        st.dp.remove_vip(k).map_err(xdp_err)?;
    }
    st.dp.set_ring(gone.index, &[]).map_err(xdp_err)?;
    st.dp.clear_acl(gone.index, gone.acl.1).map_err(xdp_err)?;
    st.dp.set_flow_limits(gone.index, None).map_err(xdp_err)?;
    Ok(())
}

/// The XDP forwarder in the assembly: it claims the services with in-kernel forwarding, collects
/// them as they are built, and programs the kernel for all of them at once in `complete`, the
/// last step that may refuse a configuration (an interface that does not exist, a program the
/// kernel rejects).
impl DataPlane for XdpPlane {
    fn prepare(&self, _config: &Config) -> Result<(), Vec<String>> {
        self.collected.lock().clear();
        Ok(())
    }

    fn serves(&self, vs: &VirtualService) -> bool {
        vs.in_kernel()
    }

    fn build(
        &self,
        vs: &VirtualService,
        _cx: &mut BuildCx,
    ) -> Result<Option<Arc<dyn StreamHandler>>, String> {
        self.collected.lock().push(vs.clone());
        Ok(None)
    }

    fn complete(&self, _cx: &BuildCx) -> Result<(), Vec<String>> {
        let services = self.collected.lock().clone();
        self.attach_new(&services)
    }

    /// The maps are written only now, when nothing can refuse the configuration any more.
    fn commit(&self, cx: &mut crate::planes::CommitCx) {
        let services = std::mem::take(&mut *self.collected.lock());
        self.attached_now.lock().clear();
        if let Err(errors) = self.apply(&services, cx.config, cx.pools) {
            tracing::error!(errors = %errors.join("; "), "XDP: the in-kernel services could not be programmed completely");
        }
    }

    fn abort(&self) {
        self.collected.lock().clear();
        self.detach_new();
    }

    fn shutdown(&self) {
        XdpPlane::shutdown(self);
    }

    fn metrics(&self, out: &mut fulcrum_admin::MetricFamilies) {
        XdpPlane::metrics(self, out);
    }

    fn api(&self, request: &fulcrum_admin::ApiRequest) -> Option<(u16, serde_json::Value)> {
        match (request.method, request.path) {
            ("GET", ["xdp"]) => Some(XdpPlane::api(self)),
            _ => None,
        }
    }
}

/// `fulcrum decap`: attaches the member-side decapsulator and waits for SIGTERM / SIGINT;
/// the bpf_links (and with them the program) go when the process exits.
pub fn run_decap(interfaces: &[String], mode: &str, sources: &[String]) -> std::process::ExitCode {
    use std::process::ExitCode;
    let mode = match mode {
        "auto" => aya::programs::XdpMode::Default,
        "native" => aya::programs::XdpMode::Driver,
        "generic" => aya::programs::XdpMode::Skb,
        other => {
            eprintln!("--mode {other:?}: expected auto, native or generic");
            return ExitCode::FAILURE;
        }
    };
    let limits = Limits {
        vips: 1,
        conns: 1,
        nat_entries: 1,
        acl_entries: 1,
    };
    let mut dp = match Dataplane::load(limits) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cannot load the XDP decapsulator: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sources = match fulcrum_xdp::decap_sources(sources) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("--allow-source {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = dp.set_decap_sources(&sources) {
        eprintln!("cannot set the XDP decapsulator's sources: {e}");
        return ExitCode::FAILURE;
    }
    for i in interfaces {
        if let Err(e) = dp.attach_decap(i, mode) {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
        tracing::info!(interface = %i, "tunnel decapsulation attached");
    }
    let mut signals = [libc::SIGTERM, libc::SIGINT].map(|s| {
        // SAFETY: blocking the two signals for this (single) thread only changes how they
        // are delivered: sigwait below receives them instead of the default handler.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, s);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        s
    });
    signals.sort_unstable();
    // SAFETY: `set` is initialised by sigemptyset/sigaddset before sigwait reads it, and `sig`
    // is a valid place for sigwait to store the signal number.
    let sig = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, s);
        }
        let mut sig = 0;
        libc::sigwait(&set, &mut sig);
        sig
    };
    tracing::info!(signal = sig, "decapsulation detached");
    drop(dp);
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_kernel_services_are_claimed_by_xdp_and_not_by_the_proxy() {
        let text = r#"
[[virtual_service]]
name = "a"
listen = "198.18.10.1:80"
protocol = "tcp"
pool = "p"
forwarding = "dr"
interfaces = ["eth0"]

[[virtual_service]]
name = "b"
listen = "127.0.0.1:8080"
protocol = "tcp"
pool = "p"

[[pool]]
name = "p"

[[pool.member]]
address = "198.18.0.11:80"
"#;
        let config =
            fulcrum_config::parse(text, "t.toml", std::path::Path::new("/")).expect("valid");
        let xdp = XdpPlane::default();
        let claimed: Vec<&str> = config
            .virtual_services
            .iter()
            .filter(|v| xdp.serves(v))
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(claimed, ["a"]);
        assert!(!crate::planes::tcp::TcpPlane.serves(&config.virtual_services[0]));
        assert!(crate::planes::tcp::TcpPlane.serves(&config.virtual_services[1]));
    }
}

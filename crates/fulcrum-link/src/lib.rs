//! Link load balancing: Fulcrum decides, the kernel enforces per flow.
//!
//! For each `[[outbound]]`, new flows from its `sources` get a connection mark in nftables
//! (table `inet fulcrum_link`): from the proximity map when the destination is in a link's
//! `isp` ip_table, else from a slot map indexed by `numgen inc` (or `jhash ip saddr` with
//! source persistence). Every later packet of the flow takes its mark from conntrack, so a flow
//! never changes link. The mark selects a routing table per link (default via the link's
//! gateway) and the link's SNAT rule. Fulcrum fills the slot map from the pool's algorithm
//! (`fulcrum_balance::link_shares`) over the weighted Maglev table of `fulcrum-balance`, from
//! health (link monitors probing targets through each link, fed to the one health state
//! machine) and from link rates measured on the interfaces' counters; it rewrites the map only
//! when the table changes, so flows already running are never touched.

mod dns_proxy;
mod flows;
mod nft;
mod plan;
mod route;
pub mod transparent;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_balance::{kernel_slots, CheckSpec, LinkLoad, Pool};
use fulcrum_config::{Algorithm, Config, MonitorKind};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::mpsc;

pub use plan::{build as build_plan, mark_of, GroupSlots, Plan, MARK_BASE, RULE_PREF_BASE, TABLE};

/// How often link rates are sampled and shares recomputed.
const TICK: Duration = Duration::from_secs(1);
/// How long a reload waits for the link plane; an apply that ends later is undone.
const APPLY_WAIT: Duration = Duration::from_secs(30);
/// Probe results kept per target for the loss figure.
const LOSS_WINDOW: usize = 10;

enum Command {
    Apply(Plan, std::sync::mpsc::Sender<Result<(), Vec<String>>>),
    Shutdown(std::sync::mpsc::Sender<()>),
}

/// The link plane: a control task owning the kernel state it installed.
pub struct Links {
    tx: mpsc::UnboundedSender<Command>,
    view: Arc<Mutex<Vec<Arc<OutboundState>>>>,
}

#[derive(Debug, Default)]
struct TargetStats {
    monitor: String,
    address: Option<SocketAddr>,
    recent: VecDeque<bool>,
    rtt_us: Option<f64>,
    detail: String,
}

#[derive(Debug)]
struct LinkStats {
    up_bps: AtomicU64,
    down_bps: AtomicU64,
    last: Mutex<Option<(Instant, u64, u64)>>,
    targets: Mutex<Vec<TargetStats>>,
    slots: AtomicU64,
    share: AtomicU64,
    new_flows: AtomicU64,
    /// Flows in the connection table with this member's mark (counted only for the
    /// algorithms that need it; `u64::MAX` = not counted).
    active_flows: AtomicU64,
}

impl Default for LinkStats {
    fn default() -> Self {
        LinkStats {
            up_bps: AtomicU64::new(0),
            down_bps: AtomicU64::new(0),
            last: Mutex::new(None),
            targets: Mutex::new(Vec::new()),
            slots: AtomicU64::new(0),
            share: AtomicU64::new(0),
            new_flows: AtomicU64::new(0),
            active_flows: AtomicU64::new(u64::MAX),
        }
    }
}

impl LinkStats {
    fn rate(a: &AtomicU64) -> f64 {
        f64::from_bits(a.load(Ordering::Relaxed))
    }

    /// Samples the interface's byte counters (tx = up, rx = down).
    fn sample(&self, interface: &str) {
        let read = |what: &str| {
            std::fs::read_to_string(format!("/sys/class/net/{interface}/statistics/{what}"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        let (Some(tx), Some(rx)) = (read("tx_bytes"), read("rx_bytes")) else {
            return;
        };
        let now = Instant::now();
        let mut last = self.last.lock();
        if let Some((t, ptx, prx)) = *last {
            let dt = now.duration_since(t).as_secs_f64();
            if dt > 0.05 {
                let up = tx.saturating_sub(ptx) as f64 * 8.0 / dt;
                let down = rx.saturating_sub(prx) as f64 * 8.0 / dt;
                // Half old, half new: a 1 s sample moves the figure quickly without flapping on
                // one burst.
                let blend = |a: &AtomicU64, v: f64| {
                    let old = Self::rate(a);
                    a.store((0.5 * old + 0.5 * v).to_bits(), Ordering::Relaxed)
                };
                blend(&self.up_bps, up);
                blend(&self.down_bps, down);
            }
        }
        *last = Some((now, tx, rx));
    }

    /// Mean round-trip time of the targets that answered last.
    fn rtt_us(&self) -> Option<f64> {
        let t = self.targets.lock();
        let v: Vec<f64> = t.iter().filter_map(|t| t.rtt_us).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

struct OutboundState {
    plan: plan::OutboundPlan,
    pool: Arc<Pool>,
    stats: Vec<Arc<LinkStats>>,
    /// `rtt` pools: destination prefixes (IPv4 /24, IPv6 /48) the LAN's flows went to, each with an address
    /// seen there and the round-trip time through each link (None: no answer yet).
    rtt: Mutex<RttTable>,
    /// DNS queries to the proxy from outside the LAN, dropped (its nftables counter).
    dns_refused: AtomicU64,
}

/// Destination prefix → (an address seen there, round-trip time through each link in µs).
type RttTable = HashMap<IpNet, (IpAddr, Vec<Option<f64>>)>;

/// Destination prefixes an `rtt` pool measures at most.
const RTT_PREFIXES: usize = 256;
/// How often every known prefix is probed through every link.
const RTT_EVERY: Duration = Duration::from_secs(2);

/// A placeholder member address per link (the scheduler library keys members by address; a
/// link is known by its name).
fn link_member_addr(k: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x4c, 0, 0, 0, 0, 0, k as u16)),
        0,
    )
}

fn balance_pool(o: &plan::OutboundPlan, previous: Option<&Pool>) -> Pool {
    let members = o
        .links
        .iter()
        .enumerate()
        .map(|(k, l)| fulcrum_config::Member {
            address: link_member_addr(k),
            weight: l.config.weight,
            priority: l.config.priority,
            max_connections: 0,
            standby: false,
            state: l.config.state,
        })
        .collect();
    let pc = fulcrum_config::Pool {
        name: format!("link:{}", o.pool),
        algorithm: o.algorithm,
        hash_key: fulcrum_config::HashKey::SourceIp,
        monitors: vec![],
        slow_start: None,
        min_active: 1,
        retries: 0,
        connect_timeout: Duration::from_secs(1),
        members,
        reuse: fulcrum_config::Reuse::Safe,
        tls: None,
        http: Default::default(),
        kind: fulcrum_config::PoolKind::Link,
        links: vec![],
        gateways: vec![],
        busy: o.busy,
        elastic: None,
        zero_window_timeout: None,
        vrf: None,
    };
    let labels: Vec<Arc<str>> = o.links.iter().map(|l| Arc::from(l.name.as_str())).collect();
    let pool = Pool::new_labeled(&pc, &[], previous, &labels);
    for (m, l) in pool.members().iter().zip(&o.links) {
        let checks: Vec<CheckSpec> = l
            .monitors
            .iter()
            .map(|m| CheckSpec {
                monitor: m.name.clone(),
                rise: m.rise,
                fall: m.fall,
            })
            .collect();
        m.configure_checks(&checks);
    }
    pool
}

impl Links {
    /// Starts the control task on the current tokio runtime. Nothing is installed until
    /// `apply`.
    pub fn start() -> Links {
        let (tx, rx) = mpsc::unbounded_channel();
        let view = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(control(rx, view.clone()));
        Links { tx, view }
    }

    /// Installs (or replaces) what `cfg`'s outbounds need and waits until it is in place.
    /// Blocks the calling thread: call it off the runtime's workers or from `block_on`.
    pub fn apply(&self, cfg: &Config) -> Result<(), Vec<String>> {
        let plan = plan::build(cfg)?;
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx
            .send(Command::Apply(plan, tx))
            .map_err(|_| vec!["the link control task stopped".to_string()])?;
        rx.recv_timeout(APPLY_WAIT).map_err(|_| {
            vec![format!(
                "the link plane did not finish within {APPLY_WAIT:?} (routes or nftables slow to answer); the running links stay"
            )]
        })?
    }

    /// Removes everything Fulcrum installed (nftables table, rules, routes) and stops probing.
    pub async fn shutdown(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(Command::Shutdown(tx)).is_ok() {
            let _ =
                tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(10))).await;
        }
    }

    /// Whether link `name` (of any outbound) can take new flows: up, enabled and, with the
    /// pool's `busy`, below it. `None` for an unknown link.
    pub fn link_available(&self, name: &str) -> Option<bool> {
        let outbounds = self.view.lock().clone();
        for o in outbounds.iter().filter(|o| o.plan.gateway.is_none()) {
            for ((l, m), st) in o.plan.links.iter().zip(o.pool.members()).zip(&o.stats) {
                if l.name != name {
                    continue;
                }
                let load = LinkLoad {
                    up_bps: LinkStats::rate(&st.up_bps),
                    down_bps: LinkStats::rate(&st.down_bps),
                    capacity_up: l.config.bandwidth.map_or(0, |b| b.up),
                    capacity_down: l.config.bandwidth.map_or(0, |b| b.down),
                    ..LinkLoad::default()
                };
                let busy = o.plan.busy.is_some_and(|b| load.utilisation() >= b);
                return Some(
                    m.health.is_up()
                        && m.effective_state() == fulcrum_config::AdminState::Enabled
                        && !busy,
                );
            }
        }
        None
    }

    /// `GET /api/v1/links`.
    pub fn view(&self) -> Value {
        let outbounds = self.view.lock().clone();
        let mut links = Vec::new();
        for o in &outbounds {
            for ((l, m), st) in o.plan.links.iter().zip(o.pool.members()).zip(&o.stats) {
                let targets: Vec<Value> = st
                    .targets
                    .lock()
                    .iter()
                    .map(|t| {
                        let n = t.recent.len().max(1) as f64;
                        let lost = t.recent.iter().filter(|ok| !**ok).count() as f64;
                        json!({
                            "monitor": t.monitor,
                            "target": t.address.map(|a| a.to_string()),
                            "rtt_ms": t.rtt_us.map(|r| (r / 10.0).round() / 100.0),
                            "loss": if t.recent.is_empty() { Value::Null } else { json!(lost / n) },
                            "last": t.detail,
                        })
                    })
                    .collect();
                let up = LinkStats::rate(&st.up_bps);
                let down = LinkStats::rate(&st.down_bps);
                let bw = l.config.bandwidth;
                let (group_key, kind) = match o.plan.gateway {
                    None => ("outbound", "link"),
                    Some(_) => ("gateway_service", "gateway"),
                };
                links.push(json!({
                    "name": l.name,
                    "kind": kind,
                    (group_key): o.plan.name,
                    "pool": o.plan.pool,
                    "interface": l.interface,
                    "gateway": l.gateway.map(|a| a.to_string()),
                    "snat": l.snat.map(|a| a.to_string()),
                    "gateway6": l.gateway6.map(|a| a.to_string()),
                    "snat6": l.nat6.address().filter(|_| l.gateway6.is_some()).map(|a| a.to_string()),
                    "nat6": match (l.gateway6, l.nat6) {
                        (None, _) => Value::Null,
                        (Some(_), fulcrum_config::LinkNat::To(_)) => json!("snat"),
                        (Some(_), fulcrum_config::LinkNat::Masquerade) => json!("masquerade"),
                        (Some(_), fulcrum_config::LinkNat::Off) => json!("none"),
                    },
                    "mark": format!("{:#x}", l.mark),
                    "state": m.effective_state().as_str(),
                    "health": if m.health.is_up() { "up" } else { "down" },
                    "weight": m.weight(),
                    "share": st.share.load(Ordering::Relaxed),
                    "slots": st.slots.load(Ordering::Relaxed),
                    "rate_up_bps": up.round(),
                    "rate_down_bps": down.round(),
                    "bandwidth_up_bps": bw.map(|b| b.up),
                    "bandwidth_down_bps": bw.map(|b| b.down),
                    "flows_total": st.new_flows.load(Ordering::Relaxed),
                    "flows_active": match st.active_flows.load(Ordering::Relaxed) {
                        u64::MAX => Value::Null,
                        n => json!(n),
                    },
                    "targets": targets,
                }));
            }
        }
        let dns_proxies: Vec<Value> = outbounds
            .iter()
            .filter(|o| o.plan.dns_proxy.is_some() || o.plan.dns_proxy6.is_some())
            .map(|o| {
                json!({
                    "outbound": o.plan.name,
                    "address": o.plan.dns_proxy.map(|a| a.to_string()),
                    "address6": o.plan.dns_proxy6.map(|a| a.to_string()),
                    "refused": o.dns_refused.load(Ordering::Relaxed),
                })
            })
            .collect();
        json!({ "links": links, "dns_proxies": dns_proxies })
    }
}

/// `rtt` pools learn where the LAN's flows go: the destinations of the flows with their marks
/// in the connection table, by /24 (IPv4) and /48 (IPv6).
fn learn_destinations(outbounds: &[Arc<OutboundState>], flows: &mut flows::FlowWatch) {
    let seen = flows.destinations(1024);
    for o in outbounds
        .iter()
        .filter(|o| o.plan.algorithm == Algorithm::Rtt)
    {
        let mut rtt = o.rtt.lock();
        for l in &o.plan.links {
            for dst in seen.get(&l.mark).into_iter().flatten() {
                if rtt.len() >= RTT_PREFIXES {
                    return;
                }
                // A /24 is about one site of an IPv4 network; a /48 is one site of an IPv6 one.
                let prefix = match dst {
                    IpAddr::V4(a) => Ipv4Net::new(*a, 24).map(|p| IpNet::V4(p.trunc())),
                    IpAddr::V6(a) => Ipv6Net::new(*a, 48).map(|p| IpNet::V6(p.trunc())),
                };
                let Ok(prefix) = prefix else {
                    continue;
                };
                rtt.entry(prefix)
                    .or_insert_with(|| (*dst, vec![None; o.plan.links.len()]));
            }
        }
    }
}

/// An ICMP echo check for `rtt` probes (the server monitors' own).
fn echo_monitor() -> fulcrum_config::Monitor {
    fulcrum_config::Monitor {
        name: "rtt".into(),
        kind: MonitorKind::Icmp,
        interval: RTT_EVERY,
        timeout: Duration::from_secs(1),
        rise: 1,
        fall: 1,
        port: None,
        path: "/".into(),
        method: "GET".into(),
        host: None,
        expect_status: Vec::new(),
        expect_body: None,
        send: None,
        expect: None,
        query: None,
        query_type: "A".into(),
        expect_rcode: "NOERROR".into(),
        expect_answer: None,
        secret: None,
        username: None,
        password: None,
        newsgroup: None,
        link: Default::default(),
        snmp: Default::default(),
        weight_share: 1,
    }
}

/// Dynamic proximity: every `RTT_EVERY`, each learned destination prefix is pinged through
/// every link; the fastest link takes the prefix's new flows.
async fn rtt_loop(o: Arc<OutboundState>, wake: Arc<tokio::sync::Notify>) {
    let monitor = echo_monitor();
    // Per link, its way out for each family it has a next hop of (IPv4, IPv6).
    type Vias = (Option<fulcrum_health::Via>, Option<fulcrum_health::Via>);
    let vias: Vec<Vias> = o
        .plan
        .links
        .iter()
        .map(|l| {
            let via = |source| fulcrum_health::Via::new(&l.interface, source, l.mark);
            (
                l.gateway.and_then(|_| via(l.snat.map(IpAddr::V4))),
                l.gateway6
                    .and_then(|_| via(l.nat6.address().map(IpAddr::V6))),
            )
        })
        .collect();
    let mut every = tokio::time::interval(RTT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let targets: Vec<(IpNet, IpAddr)> =
            o.rtt.lock().iter().map(|(p, (a, _))| (*p, *a)).collect();
        for (prefix, addr) in targets {
            let runs = vias.iter().map(|(via4, via6)| {
                let monitor = &monitor;
                let via = if addr.is_ipv6() { *via6 } else { *via4 };
                async move {
                    let via = via?;
                    let r =
                        fulcrum_health::probe_through(monitor, SocketAddr::new(addr, 0), via).await;
                    r.ok.then_some(r.rtt.as_secs_f64() * 1e6)
                }
            });
            let rtts = futures_util::future::join_all(runs).await;
            if let Some(e) = o.rtt.lock().get_mut(&prefix) {
                e.1 = rtts;
            }
        }
        wake.notify_one();
    }
}

/// The target address a link monitor probes.
fn target_addr(m: &fulcrum_config::Monitor, t: &fulcrum_config::LinkTarget) -> SocketAddr {
    let default = match m.kind {
        MonitorKind::Dns => 53,
        MonitorKind::Http => 80,
        MonitorKind::Https => 443,
        _ => 0,
    };
    SocketAddr::new(t.address, t.port.or(m.port).unwrap_or(default))
}

/// Probes one link with one monitor forever: every interval all targets at once; the link
/// passes while `up_when` of them answer.
async fn probe_loop(
    pool: Arc<Pool>,
    member: usize,
    link: plan::LinkPlan,
    monitor: fulcrum_config::Monitor,
    stats: Arc<LinkStats>,
    first_target: usize,
    wake: Arc<tokio::sync::Notify>,
) {
    // One way out per family: the same interface and mark, the source of the target's family.
    let (Some(via4), Some(via6)) = (
        fulcrum_health::Via::new(&link.interface, link.snat.map(IpAddr::V4), link.mark),
        fulcrum_health::Via::new(
            &link.interface,
            link.nat6.address().map(IpAddr::V6),
            link.mark,
        ),
    ) else {
        return;
    };
    let targets: Vec<SocketAddr> = monitor
        .link
        .targets
        .iter()
        .map(|t| target_addr(&monitor, t))
        .collect();
    let mut every = tokio::time::interval(monitor.interval.max(Duration::from_millis(100)));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let runs = targets.iter().map(|t| {
            let via = if t.is_ipv6() { via6 } else { via4 };
            fulcrum_health::probe_through(&monitor, *t, via)
        });
        let results = futures_util::future::join_all(runs).await;
        let answered = results.iter().filter(|r| r.ok).count();
        {
            let mut ts = stats.targets.lock();
            for (k, r) in results.iter().enumerate() {
                if let Some(t) = ts.get_mut(first_target + k) {
                    t.recent.push_back(r.ok);
                    if t.recent.len() > LOSS_WINDOW {
                        t.recent.pop_front();
                    }
                    t.rtt_us = r.ok.then_some(r.rtt.as_secs_f64() * 1e6);
                    t.detail = r.detail.clone();
                }
            }
        }
        let ok = answered >= monitor.link.up_when as usize;
        let detail = format!("{answered} of {} targets answered", targets.len());
        if let Some(m) = pool.members().get(member) {
            let was = m.health.is_up();
            m.record_check(&monitor.name, ok, &detail);
            if was != m.health.is_up() {
                if m.health.is_up() {
                    tracing::info!(link = %link.name, %detail, "link up");
                } else {
                    tracing::warn!(link = %link.name, %detail, "link down");
                }
                wake.notify_one();
            }
        }
    }
}

struct Running {
    plan: Plan,
    outbounds: Vec<Arc<OutboundState>>,
    slots: Vec<GroupSlots>,
    up: Vec<Vec<bool>>,
    nearest: Vec<plan::Nearest>,
    probes: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for p in &self.probes {
            p.abort();
        }
    }
}

/// Shares and slot tables of every outbound from health, weights and measured rates.
type Computed = (Vec<GroupSlots>, Vec<Vec<bool>>, Vec<plan::Nearest>);

/// `kernel_slots` over the members `keep` names (those with a next hop of one family); slots
/// and shares indexed by the group's members.
fn family_slots(
    o: &OutboundState,
    loads: &[LinkLoad],
    names: &[String],
    keep: &[bool],
) -> (plan::Slots, Vec<u32>) {
    let members = o.pool.members();
    if keep.iter().all(|k| *k) {
        return kernel_slots(o.plan.algorithm, members, loads, o.plan.busy, names);
    }
    let index: Vec<usize> = (0..members.len())
        .filter(|&i| keep.get(i).copied().unwrap_or(false))
        .collect();
    if index.is_empty() {
        // No member carries this family (an IPv6-only pool's IPv4 table): no slots.
        return (Vec::new(), vec![0; members.len()]);
    }
    let pick = |i: &usize| members[*i].clone();
    let sub: Vec<_> = index.iter().map(pick).collect();
    let sub_loads: Vec<LinkLoad> = index.iter().map(|&i| loads[i]).collect();
    let sub_names: Vec<String> = index.iter().map(|&i| names[i].clone()).collect();
    let (slots, shares) = kernel_slots(o.plan.algorithm, &sub, &sub_loads, o.plan.busy, &sub_names);
    let slots = slots
        .into_iter()
        .map(|s| index[s as usize] as u32)
        .collect();
    let mut all = vec![0; members.len()];
    for (j, &i) in index.iter().enumerate() {
        all[i] = shares.get(j).copied().unwrap_or(0);
    }
    (slots, all)
}

fn compute(outbounds: &[Arc<OutboundState>]) -> Computed {
    let mut all_slots = Vec::new();
    let mut all_up = Vec::new();
    let mut all_nearest = Vec::new();
    for o in outbounds {
        let loads: Vec<LinkLoad> = o
            .plan
            .links
            .iter()
            .zip(&o.stats)
            .map(|(l, st)| LinkLoad {
                up_bps: LinkStats::rate(&st.up_bps),
                down_bps: LinkStats::rate(&st.down_bps),
                capacity_up: l.config.bandwidth.map_or(0, |b| b.up),
                capacity_down: l.config.bandwidth.map_or(0, |b| b.down),
                flows: match st.active_flows.load(Ordering::Relaxed) {
                    u64::MAX => 0,
                    n => n,
                },
                rtt_us: st.rtt_us(),
            })
            .collect();
        let members = o.pool.members();
        let names: Vec<String> = o.plan.links.iter().map(|l| l.name.clone()).collect();
        // One scheduler and one health state for both families; a member without a next hop
        // of a family only leaves that family's table.
        let four = o.plan.family_members(false);
        let six = o.plan.family_members(true);
        let (slots, mut shares) = family_slots(o, &loads, &names, &four);
        let slots6 = if o.plan.carries_v6() && six != four {
            let (v6, shares6) = family_slots(o, &loads, &names, &six);
            for (k, s) in shares.iter_mut().enumerate() {
                if !four[k] {
                    *s = shares6[k];
                }
            }
            Some(v6)
        } else {
            None
        };
        for (k, st) in o.stats.iter().enumerate() {
            st.share.store(u64::from(shares[k]), Ordering::Relaxed);
        }
        // Proximity follows health and admin state, not weight: a weight of 0 only keeps a
        // link out of the spread of the other destinations.
        all_up.push(
            members
                .iter()
                .map(|m| {
                    m.health.is_up() && m.effective_state() == fulcrum_config::AdminState::Enabled
                })
                .collect(),
        );
        // `rtt`: each measured prefix goes to the link that answered it fastest.
        let mut nearest: plan::Nearest = o
            .rtt
            .lock()
            .iter()
            .filter_map(|(p, (_, rtts))| {
                rtts.iter()
                    .enumerate()
                    // As for the isp tables: health and admin state, not weight.
                    .filter(|(i, _)| {
                        members.get(*i).is_some_and(|m| {
                            m.health.is_up()
                                && m.effective_state() == fulcrum_config::AdminState::Enabled
                        })
                    })
                    .filter_map(|(i, r)| r.map(|r| (i, r)))
                    .min_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(i, _)| (*p, i))
            })
            .collect();
        nearest.sort();
        all_nearest.push(nearest);
        all_slots.push(GroupSlots {
            v4: slots,
            v6: slots6,
        });
    }
    (all_slots, all_up, all_nearest)
}

/// Each link's count of slots, stored once the kernel's maps hold them, so that the API never
/// reports a spread the kernel does not apply yet.
fn publish_slots(outbounds: &[Arc<OutboundState>], all_slots: &[GroupSlots]) {
    for (o, slots) in outbounds.iter().zip(all_slots) {
        for (k, (st, l)) in o.stats.iter().zip(&o.plan.links).enumerate() {
            // A member without an IPv4 next hop owns slots of the IPv6 table only.
            let table = match &slots.v6 {
                Some(v6) if l.gateway.is_none() => v6,
                _ => &slots.v4,
            };
            let n = table.iter().filter(|&&s| s as usize == k).count();
            st.slots.store(n as u64, Ordering::Relaxed);
        }
    }
}

async fn control(
    mut rx: mpsc::UnboundedReceiver<Command>,
    view: Arc<Mutex<Vec<Arc<OutboundState>>>>,
) {
    let mut handle: Option<rtnetlink::Handle> = None;
    // Opened at the first apply, kept for the life of the plane: its socket owns the table.
    let mut nft: Option<nft::Session> = None;
    let mut running: Option<Running> = None;
    // Runs while a least-connections or rtt pool needs the flows of the links.
    let mut flows: Option<flows::FlowWatch> = None;
    let wake = Arc::new(tokio::sync::Notify::new());
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(Command::Apply(plan, reply)) => {
                    let before = running.as_ref().map(|r| r.plan.clone());
                    let r = apply(&mut handle, &mut nft, &mut running, plan, &wake).await;
                    let applied = r.is_ok();
                    if reply.send(r).is_err() && applied {
                        // The reload stopped waiting (`APPLY_WAIT`) and was refused: what this
                        // apply installed must not outlive it. Back to what ran before.
                        tracing::warn!("link plane: an apply finished after the reload gave up on it; restoring the previous links");
                        let back = before.unwrap_or_default();
                        if let Err(e) = apply(&mut handle, &mut nft, &mut running, back, &wake).await {
                            tracing::error!(errors = %e.join("; "), "link plane: cannot restore the previous links");
                        }
                    }
                    if let Some(run) = &running {
                        *view.lock() = run.outbounds.clone();
                    }
                }
                Some(Command::Shutdown(reply)) => {
                    running = None;
                    view.lock().clear();
                    remove(&mut handle, &mut nft).await;
                    let _ = reply.send(());
                }
                None => {
                    remove(&mut handle, &mut nft).await;
                    return;
                }
            },
            // nft, conntrack and /sys reads block: let the runtime move other tasks off this
            // worker meanwhile (Fulcrum's runtime is multi-threaded).
            _ = tick.tick() => tokio::task::block_in_place(|| refresh(&mut running, &mut nft, &mut flows, true)),
            _ = wake.notified() => tokio::task::block_in_place(|| refresh(&mut running, &mut nft, &mut flows, false)),
        }
    }
}

/// Resamples rates (on the tick) and rewrites the maps when the slot table or health changed.
fn refresh(
    running: &mut Option<Running>,
    nft: &mut Option<nft::Session>,
    flows: &mut Option<flows::FlowWatch>,
    sample: bool,
) {
    let (Some(run), Some(nft)) = (running, nft) else {
        *flows = None;
        return;
    };
    if run.plan.outbounds.is_empty() {
        *flows = None;
        return;
    }
    if sample {
        for o in &run.outbounds {
            for (l, st) in o.plan.links.iter().zip(&o.stats) {
                st.sample(&l.interface);
            }
        }
        let learning = run
            .plan
            .outbounds
            .iter()
            .any(|o| o.algorithm == Algorithm::Rtt);
        let counting = run.plan.outbounds.iter().any(|o| {
            matches!(
                o.algorithm,
                fulcrum_config::Algorithm::LeastConnections
                    | fulcrum_config::Algorithm::WeightedLeastConnections
            )
        });
        if !(learning || counting) {
            *flows = None;
        }
        let mut active = std::collections::HashMap::new();
        if learning || counting {
            let watch = flows.get_or_insert_with(flows::FlowWatch::start);
            if learning {
                learn_destinations(&run.outbounds, watch);
            }
            if counting {
                active = watch.per_mark();
            }
        }
        for o in &run.outbounds {
            for (l, st) in o.plan.links.iter().zip(&o.stats) {
                let n = if counting {
                    active.get(&l.mark).copied().unwrap_or(0)
                } else {
                    u64::MAX
                };
                st.active_flows.store(n, Ordering::Relaxed);
            }
        }
        let counters = nft::counters(TABLE);
        let proxied =
            |o: &&Arc<OutboundState>| o.plan.dns_proxy.is_some() || o.plan.dns_proxy6.is_some();
        for o in run.outbounds.iter().filter(proxied) {
            let name = plan::dns_refused_counter(o.plan.index);
            if let Some((_, n)) = counters.iter().find(|(c, _)| *c == name) {
                o.dns_refused.store(*n, Ordering::Relaxed);
            }
        }
        for o in &run.outbounds {
            for (l, st) in o.plan.links.iter().zip(&o.stats) {
                let name = format!("flows_{}_{}", o.plan.index, l.mark & 0xff);
                if let Some((_, n)) = counters.iter().find(|(c, _)| *c == name) {
                    st.new_flows.store(*n, Ordering::Relaxed);
                }
            }
        }
    }
    let (slots, up, nearest) = compute(&run.outbounds);
    if slots == run.slots && up == run.up && nearest == run.nearest {
        return;
    }
    match nft.run(&plan::render_maps(&run.plan, &slots, &up, &nearest)) {
        Ok(()) => {
            tracing::debug!("link slot maps rewritten");
            publish_slots(&run.outbounds, &slots);
            run.slots = slots;
            run.up = up;
            run.nearest = nearest;
        }
        Err(e) => tracing::error!(error = %e, "cannot update the link maps"),
    }
}

async fn remove(handle: &mut Option<rtnetlink::Handle>, nft: &mut Option<nft::Session>) {
    if let Some(session) = nft.as_mut() {
        if let Err(e) = tokio::task::block_in_place(|| session.remove_table()) {
            tracing::warn!(error = %e, "removing the link table");
        }
    }
    if let Some(h) = handle.as_ref() {
        if let Err(e) = route::remove_all(h).await {
            tracing::warn!(error = %e, "removing link routes and rules");
        }
    }
}

async fn apply(
    handle: &mut Option<rtnetlink::Handle>,
    nft: &mut Option<nft::Session>,
    running: &mut Option<Running>,
    plan: Plan,
    wake: &Arc<tokio::sync::Notify>,
) -> Result<(), Vec<String>> {
    if plan.outbounds.is_empty() {
        if running.take().is_some() {
            remove(handle, nft).await;
        }
        return Ok(());
    }
    if nft.is_none() {
        *nft = Some(nft::Session::open().map_err(|e| vec![e])?);
    }
    let Some(session) = nft.as_mut() else {
        return Err(vec!["no nftables session".into()]);
    };
    if handle.is_none() {
        *handle = Some(route::connect().map_err(|e| vec![e])?);
    }
    let Some(h) = handle.as_ref() else {
        return Err(vec!["no netlink handle".into()]);
    };
    // Keep each link's health and measurements across a reload.
    let previous = running
        .as_ref()
        .map(|r| r.outbounds.clone())
        .unwrap_or_default();
    let outbounds: Vec<Arc<OutboundState>> = plan
        .outbounds
        .iter()
        .map(|o| {
            let prev = previous
                .iter()
                .find(|p| p.plan.pool == o.pool && p.plan.kind() == o.kind());
            let pool = Arc::new(balance_pool(o, prev.map(|p| p.pool.as_ref())));
            let stats = o
                .links
                .iter()
                .map(|l| {
                    let keep = prev.and_then(|p| {
                        p.plan
                            .links
                            .iter()
                            .position(|x| {
                                x.name == l.name
                                    && x.monitors
                                        .iter()
                                        .map(|m| &m.name)
                                        .eq(l.monitors.iter().map(|m| &m.name))
                            })
                            .map(|i| p.stats[i].clone())
                    });
                    keep.unwrap_or_else(|| {
                        let st = LinkStats::default();
                        *st.targets.lock() = l
                            .monitors
                            .iter()
                            .flat_map(|m| {
                                m.link.targets.iter().map(|t| TargetStats {
                                    monitor: m.name.clone(),
                                    address: Some(target_addr(m, t)),
                                    ..TargetStats::default()
                                })
                            })
                            .collect();
                        Arc::new(st)
                    })
                })
                .collect();
            let rtt = prev
                .map(|p| std::mem::take(&mut *p.rtt.lock()))
                .unwrap_or_default();
            Arc::new(OutboundState {
                plan: o.clone(),
                pool,
                stats,
                rtt: Mutex::new(rtt),
                dns_refused: AtomicU64::new(0),
            })
        })
        .collect();
    let (slots, up, nearest) = compute(&outbounds);
    // Sockets first: a refused bind changes nothing in the kernel.
    let mut proxies = Vec::new();
    for o in &outbounds {
        let v6 = o.plan.dns_proxy6.map(SocketAddr::V6);
        for addr in o.plan.dns_proxy.map(SocketAddr::V4).into_iter().chain(v6) {
            let s = dns_proxy::bind(addr).map_err(|e| vec![e])?;
            proxies.push((s, o.plan.links.clone(), o.pool.clone()));
        }
    }
    let installed = match route::install(h, &plan).await {
        Ok(()) => tokio::task::block_in_place(|| {
            session.replace_table(&plan::render_table(&plan, &slots, &up, &nearest))
        }),
        Err(e) => Err(e),
    };
    if let Err(e) = installed {
        // A refused configuration leaves the running one as it was (or nothing at all).
        let _ = match running.as_ref() {
            Some(old) => route::install(h, &old.plan).await,
            None => route::remove_all(h).await,
        };
        return Err(vec![e]);
    }
    publish_slots(&outbounds, &slots);
    let mut probes: Vec<tokio::task::JoinHandle<()>> = proxies
        .into_iter()
        .map(|(s, links, pool)| tokio::spawn(dns_proxy::serve(s, links, pool)))
        .collect();
    for o in outbounds
        .iter()
        .filter(|o| o.plan.algorithm == Algorithm::Rtt)
    {
        probes.push(tokio::spawn(rtt_loop(o.clone(), wake.clone())));
    }
    for o in &outbounds {
        for (k, (l, st)) in o.plan.links.iter().zip(&o.stats).enumerate() {
            let mut first = 0;
            for m in &l.monitors {
                probes.push(tokio::spawn(probe_loop(
                    o.pool.clone(),
                    k,
                    l.clone(),
                    m.clone(),
                    st.clone(),
                    first,
                    wake.clone(),
                )));
                first += m.link.targets.len();
            }
        }
    }
    *running = Some(Running {
        plan,
        outbounds,
        slots,
        up,
        nearest,
        probes,
    });
    Ok(())
}

//! High availability: VRRPv3 (RFC 5798) for IPv4 between Fulcrum nodes, or a Fulcrum node and
//! keepalived.
//!
//! `machine` is the protocol without I/O (tested on a virtual clock), `packet` the wire format,
//! `net` the sockets and netlink, and `Node` the task that joins them: it advertises, moves the
//! VIPs with mastership (adding them through rtnetlink and announcing them with gratuitous ARPs),
//! follows the health view the binary gives it, and resigns on shutdown.
//!
//! `bgp` is the other mode, scale-out (active-active): every node serves the VIPs and announces
//! them through its local BIRD while it can serve them.

pub mod bgp;
pub mod conntrack;
pub mod machine;
pub mod net;
pub mod packet;
pub mod sync;

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::watch;

use crate::conntrack::{ConntrackConfig, ConntrackStatus, Conntrackd};
use crate::machine::{Action, Machine, Params, State};
use crate::net::{Announcer, Interface, Netlink, VrrpSocket};
use crate::packet::Advert;

pub use crate::net::HaError;
pub use crate::packet::MIN_INTERVAL;

/// What a node runs with (from `[ha]`).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node: String,
    pub interface: String,
    pub vrid: u8,
    /// 3, or 2 to pair with a VRRPv2 peer such as keepalived at its defaults (IPv4 only).
    pub vrrp_version: u8,
    pub priority: u8,
    pub advert_interval: Duration,
    pub preempt: bool,
    pub preempt_delay: Duration,
    /// Of the VIPs' family.
    pub peers: Vec<IpAddr>,
    /// All of one family: it decides whether VRRP runs over IPv4 or IPv6.
    pub vips: Vec<Vip>,
    pub track_weight: Option<u8>,
    pub garp_repeat: u32,
    pub garp_interval: Duration,
    /// Start in maintenance (kept across restarts by the binary's state file).
    pub maintenance: bool,
    /// Routed flows copied to the peer by conntrackd, committed on becoming master.
    pub conntrack: Option<ConntrackConfig>,
}

/// An address that moves with mastership, and the interface it goes on when that is not the
/// node's VRRP interface (a gateway pair's uplink SNAT addresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vip {
    pub net: IpNet,
    pub interface: Option<String>,
}

impl std::fmt::Display for Vip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.interface {
            Some(dev) => write!(f, "{} dev {dev}", self.net),
            None => write!(f, "{}", self.net),
        }
    }
}

/// Whether this node can serve: the binary's view of its pools.
pub type HealthView = Arc<dyn Fn() -> bool + Send + Sync>;

#[derive(Debug, Default)]
struct Counters {
    adverts_sent: AtomicU64,
    adverts_received: AtomicU64,
    priority_zero_sent: AtomicU64,
    priority_zero_received: AtomicU64,
    other_vrid: AtomicU64,
    address_mismatch: AtomicU64,
    dropped_truncated: AtomicU64,
    dropped_not_vrrp: AtomicU64,
    dropped_ttl: AtomicU64,
    dropped_version: AtomicU64,
    dropped_checksum: AtomicU64,
    dropped_not_a_peer: AtomicU64,
    became_master: AtomicU64,
    garps_sent: AtomicU64,
    netlink_errors: AtomicU64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Peer {
    pub address: IpAddr,
    pub priority: u8,
}

#[derive(Debug, Clone, Serialize)]
pub struct TransitionStatus {
    pub from: State,
    pub to: State,
    pub reason: &'static str,
    /// Unix time in seconds (with milliseconds).
    pub at: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Adverts {
    pub sent: u64,
    pub received: u64,
    pub priority_zero_sent: u64,
    pub priority_zero_received: u64,
    /// Adverts of other virtual routers on the segment (ignored).
    pub other_vrid: u64,
    /// Adverts for this VRID whose address list differs from `vips` (a misconfiguration).
    pub address_mismatch: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Dropped {
    pub truncated: u64,
    pub not_vrrp: u64,
    pub ttl: u64,
    pub version: u64,
    pub checksum: u64,
    /// Adverts whose source is not one of the configured unicast `peers` (a stranger on the
    /// segment, or a peer missing from the list); never dropped in multicast mode.
    pub not_a_peer: u64,
}

/// `GET /api/v1/ha`.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    pub node: String,
    pub role: State,
    pub vrid: u8,
    pub interface: String,
    /// The address adverts come from (IPv6: the link-local one).
    pub address: Option<IpAddr>,
    pub priority: u8,
    pub configured_priority: u8,
    pub healthy: bool,
    /// Taken out by the operator (`PUT /api/v1/ha/maintenance`): no mastership until it ends.
    pub maintenance: bool,
    pub preempt: bool,
    pub advert_interval_ms: f64,
    pub master_down_interval_ms: f64,
    pub vips: Vec<String>,
    /// The unicast peers; empty: multicast.
    pub peers: Vec<IpAddr>,
    /// The master this node hears (as backup), if any.
    pub peer: Option<Peer>,
    pub last_transition: Option<TransitionStatus>,
    pub transitions: u64,
    pub became_master: u64,
    pub adverts: Adverts,
    pub dropped: Dropped,
    pub garps_sent: u64,
    pub netlink_errors: u64,
    /// The API's sync lag; the binary fills it in from `sync::StateSync` (null without it).
    pub sync_lag_ms: Option<f64>,
    /// Set when the node could not start (no interface, no raw socket permission).
    pub error: Option<String>,
    /// `[ha] conntrack_sync`: conntrackd and its commits (null without it).
    pub conntrack_sync: Option<ConntrackStatus>,
}

struct Shared {
    /// Replaced by `Node::reconfigure` (the keys a reload may change); read where used.
    cfg: arc_swap::ArcSwap<NodeConfig>,
    counters: Counters,
    view: Mutex<View>,
    /// Started by the VRRP task once the sync link's address is known.
    conntrack: std::sync::OnceLock<Arc<Conntrackd>>,
}

/// The machine's state as last published by the task.
struct View {
    role: State,
    priority: u8,
    healthy: bool,
    master_down: Duration,
    address: Option<IpAddr>,
    peer: Option<Peer>,
    last_transition: Option<TransitionStatus>,
    transitions: u64,
    error: Option<String>,
}

/// A running VRRP node.
pub struct Node {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    maintenance: watch::Sender<bool>,
    /// Bumped when `reconfigure` changed what the machine runs with.
    params: watch::Sender<u64>,
    /// Fires when the VRRP thread has finished (after resigning).
    done: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

/// Nice −10 for the calling thread (best effort: without CAP_SYS_NICE it stays as it is).
fn raise_priority() {
    // SAFETY: gettid(2) and setpriority(2) take integers and touch no memory of ours; on Linux
    // PRIO_PROCESS with a thread id sets that thread's nice value only.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -10)
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "HA: VRRP thread keeps its scheduling priority");
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| (d.as_millis() as f64) / 1000.0)
}

impl Node {
    /// Starts the node's task. Errors of the environment (no such interface, no permission) are
    /// logged and shown in `status().error`; the node then stays in `init` and holds no VIP.
    pub fn start(cfg: NodeConfig, health: HealthView) -> Node {
        let shared = Arc::new(Shared {
            view: Mutex::new(View {
                role: State::Init,
                priority: cfg.priority,
                healthy: true,
                master_down: Duration::ZERO,
                address: None,
                peer: None,
                last_transition: None,
                transitions: 0,
                error: None,
            }),
            cfg: arc_swap::ArcSwap::from_pointee(cfg),
            counters: Counters::default(),
            conntrack: std::sync::OnceLock::new(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let (maintenance, maintenance_rx) = watch::channel(shared.cfg.load().maintenance);
        let (params, params_rx) = watch::channel(0u64);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let s = shared.clone();
        // Its own thread and runtime, at a raised scheduling priority: a master whose adverts
        // wait behind a saturated data plane for three intervals is declared dead by its
        // backup (the spurious failovers keepalived users meet when HAProxy eats the CPU).
        let spawned = std::thread::Builder::new()
            .name("fulcrum-vrrp".into())
            .spawn(move || {
                raise_priority();
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| HaError::Socket("runtime", e))
                    .and_then(|rt| {
                        rt.block_on(run(s.clone(), health, stop_rx, maintenance_rx, params_rx))
                    });
                if let Err(e) = result {
                    tracing::error!(error = %e, "HA: cannot run VRRP; this node holds no VIP");
                    s.view.lock().error = Some(e.to_string());
                }
                let _ = done_tx.send(());
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "HA: cannot start the VRRP thread; this node holds no VIP");
            shared.view.lock().error = Some(e.to_string());
        }
        Node {
            shared,
            stop,
            maintenance,
            params,
            done: Mutex::new(Some(done_rx)),
        }
    }

    /// A reload: applies what can change while running — priority, advert interval,
    /// preemption and its delay, track weight, gratuitous ARP repeat and interval. Every other
    /// key (node, interface, vrid, peers, vips, conntrack_sync: the sockets, addresses and
    /// daemons are set up with them) keeps its running value until a restart; the binary's HA
    /// plane names those to the operator.
    pub fn reconfigure(&self, new: &NodeConfig) {
        let cur = self.shared.cfg.load_full();
        let mut next = (*cur).clone();
        next.priority = new.priority;
        // An interval checked against another VRRP version (VRRPv2 sends whole seconds) waits
        // for the restart that changes the version.
        if new.vrrp_version == cur.vrrp_version {
            next.advert_interval = new.advert_interval;
        }
        next.preempt = new.preempt;
        next.preempt_delay = new.preempt_delay;
        next.track_weight = new.track_weight;
        next.garp_repeat = new.garp_repeat;
        next.garp_interval = new.garp_interval;
        let live_changed = next.priority != cur.priority
            || next.advert_interval != cur.advert_interval
            || next.preempt != cur.preempt
            || next.preempt_delay != cur.preempt_delay
            || next.track_weight != cur.track_weight
            || next.garp_repeat != cur.garp_repeat
            || next.garp_interval != cur.garp_interval;
        if live_changed {
            self.shared.cfg.store(Arc::new(next));
            self.params.send_modify(|g| *g += 1);
        }
    }

    /// Resigns mastership (priority 0 advert) and removes the VIPs, then returns.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        let done = self.done.lock().take();
        if let Some(d) = done {
            let _ = tokio::time::timeout(Duration::from_secs(5), d).await;
        }
        if let Some(ct) = self.shared.conntrack.get() {
            ct.stop();
        }
    }

    /// Takes the node out of (or back into) service: a master resigns at once.
    pub fn set_maintenance(&self, on: bool) {
        self.maintenance.send_replace(on);
    }

    pub fn status(&self) -> Status {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let cfg = self.shared.cfg.load_full();
        let v = self.shared.view.lock();
        Status {
            node: cfg.node.clone(),
            role: v.role,
            vrid: cfg.vrid,
            interface: cfg.interface.clone(),
            address: v.address,
            priority: v.priority,
            configured_priority: cfg.priority,
            healthy: v.healthy,
            maintenance: *self.maintenance.borrow(),
            preempt: cfg.preempt,
            advert_interval_ms: cfg.advert_interval.as_secs_f64() * 1e3,
            master_down_interval_ms: (v.master_down.as_secs_f64() * 1e6).round() / 1e3,
            vips: cfg.vips.iter().map(ToString::to_string).collect(),
            peers: cfg.peers.clone(),
            peer: v.peer.clone(),
            last_transition: v.last_transition.clone(),
            transitions: v.transitions,
            became_master: g(&c.became_master),
            adverts: Adverts {
                sent: g(&c.adverts_sent),
                received: g(&c.adverts_received),
                priority_zero_sent: g(&c.priority_zero_sent),
                priority_zero_received: g(&c.priority_zero_received),
                other_vrid: g(&c.other_vrid),
                address_mismatch: g(&c.address_mismatch),
            },
            dropped: Dropped {
                truncated: g(&c.dropped_truncated),
                not_vrrp: g(&c.dropped_not_vrrp),
                ttl: g(&c.dropped_ttl),
                version: g(&c.dropped_version),
                checksum: g(&c.dropped_checksum),
                not_a_peer: g(&c.dropped_not_a_peer),
            },
            garps_sent: g(&c.garps_sent),
            netlink_errors: g(&c.netlink_errors),
            sync_lag_ms: None,
            error: v.error.clone(),
            conntrack_sync: self.shared.conntrack.get().map(|c| c.status()),
        }
    }
}

/// The I/O around the machine.
struct Io {
    shared: Arc<Shared>,
    netlink: Netlink,
    iface: Interface,
    sock: VrrpSocket,
    /// Each VIP with the interface it goes on and that interface's announcer (the VRRP
    /// interface's for most; a `dev` VIP's own).
    vips: Vec<(IpNet, Arc<VipLink>)>,
    /// Bumped on every change of mastership, so a GARP burst of an old term stops.
    term: Arc<AtomicU64>,
    /// When the last re-announcement burst went out: during a split brain the other master's
    /// every advert asks for one, and one burst a second is plenty.
    last_reannounce: Mutex<Option<Instant>>,
}

impl Io {
    fn advert(&self, priority: u8) -> Advert {
        let cfg = self.shared.cfg.load_full();
        Advert {
            version: cfg.vrrp_version,
            vrid: cfg.vrid,
            priority,
            interval_cs: (cfg.advert_interval.as_millis() / 10).clamp(1, 0x0fff) as u16,
            addresses: cfg.vips.iter().map(|v| v.net.addr()).collect(),
        }
    }

    fn garp_burst(&self) {
        let cfg = self.shared.cfg.load_full();
        let (vips, term, shared) = (self.vips.clone(), self.term.clone(), self.shared.clone());
        let my_term = term.load(Ordering::Acquire);
        let (repeat, gap) = (cfg.garp_repeat.max(1), cfg.garp_interval);
        tokio::spawn(async move {
            for i in 0..repeat {
                if term.load(Ordering::Acquire) != my_term {
                    return;
                }
                for (vip, link) in &vips {
                    match link.announcer.announce(link.mac, vip.addr()) {
                        Ok(()) => {
                            shared.counters.garps_sent.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            tracing::warn!(vip = %vip.addr(), interface = %link.name, error = %e, "HA: gratuitous ARP not sent")
                        }
                    }
                }
                if i + 1 < repeat {
                    tokio::time::sleep(gap).await;
                }
            }
        });
    }

    async fn perform(&self, actions: Vec<Action>) {
        let c = &self.shared.counters;
        for a in actions {
            match a {
                Action::Send(p) => {
                    if self.sock.send(&self.advert(p)) > 0 {
                        c.adverts_sent.fetch_add(1, Ordering::Relaxed);
                        if p == 0 {
                            c.priority_zero_sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Action::TakeVips => {
                    self.term.fetch_add(1, Ordering::AcqRel);
                    c.became_master.fetch_add(1, Ordering::Relaxed);
                    // The peer's routed flows go into the kernel before the first of their
                    // packets can arrive here.
                    if let Some(ct) = self.shared.conntrack.get() {
                        ct.becoming_master().await;
                    }
                    for (vip, link) in &self.vips {
                        if let Err(e) = self.netlink.add(link.index, *vip).await {
                            c.netlink_errors.fetch_add(1, Ordering::Relaxed);
                            tracing::error!(vip = %vip, error = %e, "HA: cannot add VIP");
                        }
                    }
                    self.garp_burst();
                }
                Action::Reannounce => {
                    let mut last = self.last_reannounce.lock();
                    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                        *last = Some(Instant::now());
                        drop(last);
                        self.garp_burst();
                    }
                }
                Action::ReleaseVips => {
                    self.term.fetch_add(1, Ordering::AcqRel);
                    self.release().await;
                    if let Some(ct) = self.shared.conntrack.get() {
                        ct.left_master();
                    }
                }
            }
        }
    }

    async fn release(&self) {
        for (vip, link) in &self.vips {
            if let Err(e) = self.netlink.remove(link.index, *vip).await {
                self.shared
                    .counters
                    .netlink_errors
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(vip = %vip, error = %e, "HA: cannot remove VIP");
            }
        }
    }

    fn received(
        &self,
        r: Option<Result<packet::Received, packet::Drop>>,
        m: &mut Machine,
        now: Duration,
    ) -> Vec<Action> {
        let c = &self.shared.counters;
        let p = match r {
            None => return Vec::new(),
            Some(Ok(p)) => p,
            Some(Err(d)) => {
                let counter = match d {
                    packet::Drop::Truncated => &c.dropped_truncated,
                    packet::Drop::NotVrrp => &c.dropped_not_vrrp,
                    packet::Drop::Ttl => &c.dropped_ttl,
                    packet::Drop::Version => &c.dropped_version,
                    packet::Drop::Checksum => &c.dropped_checksum,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(reason = d.as_str(), "HA: advert dropped");
                return Vec::new();
            }
        };
        // With unicast peers the pair is a closed set: anyone else on the segment could
        // otherwise keep every node backup with a priority-255 advert (keepalived's
        // check_unicast_src). Checked before anything else, so a stranger moves no counter of
        // the protocol either.
        let peers = &self.shared.cfg.load().peers;
        if !peers.is_empty() && !peers.contains(&p.src) {
            if c.dropped_not_a_peer.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(from = %p.src, "HA: advert from an address that is not one of ha.peers dropped (counted in dropped.not_a_peer; logged once)");
            }
            return Vec::new();
        }
        if p.advert.vrid != self.shared.cfg.load().vrid {
            c.other_vrid.fetch_add(1, Ordering::Relaxed);
            return Vec::new();
        }
        let ours = self.shared.cfg.load().vrrp_version;
        if p.advert.version != ours {
            // A peer of the other version would never see this node's adverts either: both
            // would be master. Said loudly once, counted always.
            if c.dropped_version.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::error!(from = %p.src, theirs = p.advert.version, ours,
                    "HA: a peer of this VRID speaks another VRRP version; both nodes will be master until [ha] vrrp_version (or keepalived's vrrp_version) matches");
            }
            return Vec::new();
        }
        c.adverts_received.fetch_add(1, Ordering::Relaxed);
        if p.advert.priority == 0 {
            c.priority_zero_received.fetch_add(1, Ordering::Relaxed);
        }
        let mut mine = self.advert(0).addresses;
        let mut theirs = p.advert.addresses.clone();
        mine.sort_unstable();
        theirs.sort_unstable();
        if mine != theirs && c.address_mismatch.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(from = %p.src, theirs = ?theirs, ours = ?mine, "HA: a peer advertises other addresses for this VRID (misconfiguration?)");
        }
        m.on_advert(now, p.src, &p.advert)
    }
}

fn publish(shared: &Shared, m: &Machine, origin: (Instant, f64)) {
    let mut v = shared.view.lock();
    let before = v.role;
    v.role = m.state();
    v.priority = m.priority();
    v.master_down = m.master_down_interval();
    v.peer = m
        .master
        .map(|(address, priority)| Peer { address, priority });
    v.transitions = m.transitions;
    v.last_transition = m.last_transition.map(|t| TransitionStatus {
        from: t.from,
        to: t.to,
        reason: t.reason,
        at: origin.1 + t.at.as_secs_f64(),
    });
    if before != v.role {
        let reason = m.last_transition.map_or("", |t| t.reason);
        tracing::info!(
            vrid = shared.cfg.load().vrid,
            from = before.as_str(),
            to = v.role.as_str(),
            reason,
            priority = v.priority,
            "HA: state changed"
        );
    }
}

async fn run(
    shared: Arc<Shared>,
    health: HealthView,
    mut stop: watch::Receiver<bool>,
    mut maintenance: watch::Receiver<bool>,
    mut params: watch::Receiver<u64>,
) -> Result<(), HaError> {
    let cfg = shared.cfg.load_full();
    let netlink = Netlink::open()?;
    let v6 = cfg.vips.first().is_some_and(|v| v.net.addr().is_ipv6());
    let nets: Vec<IpNet> = cfg.vips.iter().map(|v| v.net).collect();
    // The interface may not be ready yet (created later at boot, or its IPv6 link-local address
    // still tentative during duplicate address detection): try again until it is, holding no
    // VIP meanwhile, and say why in the status.
    let mut logged = false;
    let (iface, sock, vips) = loop {
        let attempt = async {
            let iface = netlink.interface(&cfg.interface, &nets, v6).await?;
            let sock = VrrpSocket::open(&iface, &cfg.peers)?;
            let vips = vip_links(&netlink, &iface, &cfg.vips).await?;
            Ok::<_, HaError>((iface, sock, vips))
        };
        match attempt.await {
            Ok(ready) => break ready,
            Err(e) => {
                if !logged {
                    tracing::warn!(error = %e, "HA: VRRP cannot start yet; retrying every 200 ms");
                    logged = true;
                }
                shared.view.lock().error = Some(e.to_string());
                tokio::select! {
                    _ = stop.changed() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        }
    };
    {
        let mut v = shared.view.lock();
        v.address = Some(iface.primary);
        v.error = None;
    }
    let io = Io {
        shared: shared.clone(),
        netlink,
        iface,
        sock,
        vips,
        term: Arc::new(AtomicU64::new(0)),
        last_reannounce: Mutex::new(None),
    };
    // A node that died as master (kill -9) left its VIPs behind; until it is master again they
    // are not its to answer for.
    io.release().await;
    if let Some(ct_cfg) = &cfg.conntrack {
        start_conntrackd(&shared, &io.netlink, ct_cfg, &nets).await;
    }

    let mut m = Machine::new(Params {
        vrid: cfg.vrid,
        priority: cfg.priority,
        advert_interval: cfg.advert_interval,
        preempt: cfg.preempt,
        preempt_delay: cfg.preempt_delay,
        local: io.iface.primary,
        track_weight: cfg.track_weight,
    });
    let start = Instant::now();
    let origin = (start, unix_now());
    let now = || start.elapsed();
    let healthy = health();
    m.set_healthy(now(), healthy);
    m.set_maintenance(now(), *maintenance.borrow_and_update());
    shared.view.lock().healthy = healthy;
    let acts = m.start(now());
    io.perform(acts).await;
    publish(&shared, &m, origin);
    tracing::info!(vrid = cfg.vrid, interface = %cfg.interface, address = %io.iface.primary, priority = cfg.priority, "HA: VRRP running");

    let mut health_tick = tokio::time::interval(
        cfg.advert_interval
            .clamp(Duration::from_millis(20), Duration::from_millis(200)),
    );
    health_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = vec![0u8; 2048];
    loop {
        let deadline = m
            .deadline()
            .map(|d| tokio::time::Instant::from_std(start + d));
        let acts = tokio::select! {
            biased;
            _ = stop.changed() => {
                let acts = m.shutdown(now());
                io.perform(acts).await;
                publish(&shared, &m, origin);
                return Ok(());
            }
            _ = async { match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            } } => m.on_timer(now()),
            r = io.sock.recv(&mut buf) => match r {
                Ok(r) => io.received(r, &mut m, now()),
                Err(e) => {
                    tracing::warn!(error = %e, "HA: receive failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Vec::new()
                }
            },
            r = maintenance.changed() => match r {
                Ok(()) => {
                    let on = *maintenance.borrow_and_update();
                    tracing::info!(maintenance = on, "HA: maintenance set by the operator");
                    m.set_maintenance(now(), on)
                }
                // The sender lives as long as the Node; gone means the process is ending.
                Err(_) => std::future::pending().await,
            },
            r = params.changed() => match r {
                Ok(()) => {
                    params.borrow_and_update();
                    let c = shared.cfg.load_full();
                    tracing::info!(priority = c.priority, advert_interval = ?c.advert_interval, preempt = c.preempt, "HA: reconfigured by a reload");
                    m.set_params(now(), Params {
                        vrid: c.vrid,
                        priority: c.priority,
                        advert_interval: c.advert_interval,
                        preempt: c.preempt,
                        preempt_delay: c.preempt_delay,
                        local: m.params().local,
                        track_weight: c.track_weight,
                    })
                }
                Err(_) => std::future::pending().await,
            },
            _ = health_tick.tick() => {
                let h = health();
                shared.view.lock().healthy = h;
                m.set_healthy(now(), h)
            }
        };
        io.perform(acts).await;
        publish(&shared, &m, origin);
    }
}

/// An interface VIPs go on, with what announcing them there takes.
struct VipLink {
    name: String,
    index: u32,
    mac: [u8; 6],
    announcer: Announcer,
}

/// Each VIP with its interface: the VRRP interface, or the one its `dev` names (resolved once
/// per interface; an interface without an address of its own announces from the VIP's).
async fn vip_links(
    netlink: &Netlink,
    main: &Interface,
    vips: &[Vip],
) -> Result<Vec<(IpNet, Arc<VipLink>)>, HaError> {
    let main_link = Arc::new(VipLink {
        name: main.name.clone(),
        index: main.index,
        mac: main.mac,
        announcer: Announcer::open(main)?,
    });
    let mut links: Vec<Arc<VipLink>> = vec![main_link.clone()];
    let mut out = Vec::with_capacity(vips.len());
    for vip in vips {
        let link = match vip.interface.as_deref() {
            None => main_link.clone(),
            Some(name) if name == main.name => main_link.clone(),
            Some(name) => match links.iter().find(|l| l.name == name) {
                Some(l) => l.clone(),
                None => {
                    let iface = netlink.link(name, vip.net.addr()).await?;
                    let l = Arc::new(VipLink {
                        name: name.to_string(),
                        index: iface.index,
                        mac: iface.mac,
                        announcer: Announcer::open(&iface)?,
                    });
                    links.push(l.clone());
                    l
                }
            },
        };
        out.push((vip.net, link));
    }
    Ok(out)
}

/// Starts conntrackd for `[ha] conntrack_sync`, from this node's IPv4 address on the sync link.
/// A failure is logged and shown; VRRP runs on without it.
async fn start_conntrackd(
    shared: &Arc<Shared>,
    netlink: &Netlink,
    cfg: &ConntrackConfig,
    vips: &[IpNet],
) {
    let local = match netlink.interface(&cfg.interface, &[], false).await {
        Ok(Interface {
            primary: IpAddr::V4(a),
            ..
        }) => a,
        Ok(_) => return,
        Err(e) => {
            tracing::error!(error = %e, "HA: conntrack_sync interface unusable; routed flows will not survive a failover");
            shared.view.lock().error = Some(format!("conntrack_sync: {e}"));
            return;
        }
    };
    let mut ignore: Vec<IpAddr> = netlink.all_addresses().await.unwrap_or_default();
    ignore.extend(vips.iter().map(IpNet::addr));
    match Conntrackd::start(cfg, local, &ignore) {
        Ok(ct) => {
            let _ = shared.conntrack.set(ct);
        }
        Err(e) => {
            tracing::error!(error = %e, "HA: cannot prepare conntrackd; routed flows will not survive a failover");
            shared.view.lock().error = Some(format!("conntrack_sync: {e}"));
        }
    }
}

//! The UDP data plane (`protocol = "udp"`), full proxy: datagrams from clients are forwarded to
//! members from an upstream socket Fulcrum owns, and replies go back to the client from the
//! virtual service's address.
//!
//! **Flows.** Every client address (ip:port) seen on a listening socket gets a *flow*: its own
//! unconnected upstream socket (dual-stack when the host has IPv6) and a task relaying what
//! arrives on it back to that client. Replies are matched to clients by the socket they arrive
//! on, so no protocol knowledge is needed and, in `per_packet` mode, datagrams of one client
//! can go to different members while every reply still reaches the client that sent the
//! request. Only datagrams from members of the service's pool are relayed.
//!
//! - `session`: the flow is pinned to one member (scheduler, then kept) until it has been idle
//!   for `session_timeout`, or its member can no longer take it (down, disabled, removed, or an
//!   ICMP error), when the next datagram picks another one. A pinned flow counts as a
//!   connection of its member (`open_connection`).
//! - `per_packet`: every datagram is scheduled on its own (the seeds' forced per-packet load,
//!   for RADIUS and DNS where one request and one reply make a session).
//! - rules (`rules`): a new flow's pool is chosen once, when the flow is made (persistence,
//!   then the first matching rule, else the service's pool), and kept for the flow's life,
//!   across reloads while the service still has a pool of that name. A `drop` rule makes no
//!   flow: the datagram is dropped (and the next one from that client is judged again).
//! - `radius` persistence: the configured attribute of each RADIUS packet is looked up in a
//!   persistence table first, in both modes, so a user's Access-Request and Accounting-Request
//!   reach the same server whatever source port the NAS used.
//!
//! **Tables.** Each listening socket (one per worker, `SO_REUSEPORT`; the kernel keeps a client
//! on one socket) owns its flow table outright: no lock between workers. The service's
//! `max_sessions` bounds the flows of all its sockets together; at the bound, expired flows go
//! first, then the longest-idle sixteenth of the socket's table.
//!
//! **Batching.** Clients' datagrams are read with `recvmmsg` (up to 32 per call) and sent on,
//! grouped by flow, with `sendmmsg`; replies likewise. Counters are atomics.
//!
//! **Passive health.** Upstream sockets set `IP_RECVERR`, so an ICMP error (port or host
//! unreachable) for a datagram sent to a member is read from the error queue and reported to
//! that member as a failed connect; `fall` of them in a row take it down. A reply from a member
//! clears the run.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use fulcrum_balance::clock::now_ms;
use fulcrum_balance::{ConnectionGuard, Member, PersistTable, PickContext, Pool};
use fulcrum_config::UdpMode;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::io::unix::AsyncFd;
use tokio::io::{Interest, Ready};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::radius::{self, KeyOf};
use crate::rules::{Choice, L4Rules};
use crate::tcp::{l4_hash, SourcePersistence};
use fulcrum_net::listener::DatagramService;
use fulcrum_net::stats::{ServiceConnection, ServiceStats};

use fulcrum_net::datagram;
pub use fulcrum_net::datagram::{normalize, BATCH};

/// Batches a receive loop handles before it lets other tasks of its worker run.
const BATCHES_PER_WAKE: usize = 8;

/// Counters of a udp service beyond the per-service ones every protocol has (`ServiceStats`:
/// `connections_*` are flows, `requests_total` datagrams from clients). Kept across reloads by
/// service name.
#[derive(Debug, Default)]
pub struct UdpStats {
    /// Datagrams relayed from members to clients.
    pub datagrams_out: AtomicU64,
    /// Flows ended by `session_timeout`.
    pub sessions_expired: AtomicU64,
    /// Flows evicted because the table was full.
    pub sessions_evicted: AtomicU64,
    /// Datagrams dropped because no flow could be made (table full of other sockets' flows, or
    /// no socket could be opened).
    pub table_full: AtomicU64,
    /// Session flows moved to another member because theirs could no longer take them.
    pub rescheduled: AtomicU64,
    /// Datagrams that arrived on a flow socket from an address that is not a member.
    pub foreign_replies: AtomicU64,
    /// Datagrams that could not be sent (full socket buffer, unreachable route).
    pub send_errors: AtomicU64,
    /// ICMP errors received for datagrams sent to members.
    pub icmp_errors: AtomicU64,
    /// RADIUS persistence: datagrams that were not well-formed RADIUS packets.
    pub radius_malformed: AtomicU64,
    /// RADIUS persistence: well-formed packets without the attribute.
    pub radius_no_attribute: AtomicU64,
    /// RADIUS persistence: datagrams dropped by `malformed = "drop"`.
    pub radius_dropped: AtomicU64,
    /// Datagrams dropped because their source had its share of one-way flows already.
    pub source_limited: AtomicU64,
    /// Flows that are not two-way sessions yet, over every socket of the service.
    pub one_way: OneWayFlows,
}

/// Shards of the per-source counters: workers creating flows for different sources rarely
/// meet on one lock.
const SOURCE_SHARDS: usize = 16;

/// The flows of a service that are not two-way sessions (yet), shared by the flow tables of all
/// its listening sockets (one per worker, `SO_REUSEPORT`), in all and per source (an IPv4
/// address, an IPv6 /64).
///
/// Each socket's table evicts on its own, and the kernel spreads sources over the sockets: a
/// flood that lands on one socket used to make another socket's table — holding only real
/// sessions — evict those to make room. With these counts, a table with no one-way flow of its
/// own leaves its two-way sessions alone while one-way flows exist in another table (the new
/// flow is refused instead, as the flood's flows expire or are evicted where they are), and no
/// source may hold more than a quarter of `max_sessions` in one-way flows, whatever socket its
/// datagrams reach.
#[derive(Debug, Default)]
pub struct OneWayFlows {
    total: AtomicU64,
    sources: [parking_lot::Mutex<HashMap<u128, u32>>; SOURCE_SHARDS],
}

impl OneWayFlows {
    /// The key of a source: the address (IPv4, or IPv4-mapped IPv6), or an IPv6 /64.
    fn key(ip: IpAddr) -> u128 {
        match ip.to_canonical() {
            IpAddr::V4(a) => u128::from(u32::from(a)) | (1 << 127),
            IpAddr::V6(a) => u128::from(a) & !((1u128 << 64) - 1),
        }
    }

    fn shard(&self, key: u128) -> &parking_lot::Mutex<HashMap<u128, u32>> {
        let h = (key as u64 ^ (key >> 64) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.sources[(h >> 60) as usize % SOURCE_SHARDS]
    }

    /// One-way flows of the service now.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// One-way flows one source may hold: a quarter of `max_sessions`, at least 16 (a small table
/// is shared by few clients, often behind one address).
fn per_source_limit(svc: &UdpService) -> u64 {
    (svc.max_sessions / 4).max(16)
}

/// A flow counted as one-way for its source, until it becomes a two-way session or ends.
struct OneWay {
    udp: Arc<UdpStats>,
    key: u128,
}

impl OneWay {
    /// Counts a new flow from `ip`, unless its source has `limit` one-way flows already.
    fn admit(udp: &Arc<UdpStats>, ip: IpAddr, limit: u64) -> Option<OneWay> {
        let key = OneWayFlows::key(ip);
        {
            let mut m = udp.one_way.shard(key).lock();
            let n = m.entry(key).or_insert(0);
            if u64::from(*n) >= limit {
                return None;
            }
            *n += 1;
        }
        udp.one_way.total.fetch_add(1, Ordering::Relaxed);
        Some(OneWay {
            udp: udp.clone(),
            key,
        })
    }
}

impl Drop for OneWay {
    fn drop(&mut self) {
        self.udp.one_way.total.fetch_sub(1, Ordering::Relaxed);
        let mut m = self.udp.one_way.shard(self.key).lock();
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// RADIUS attribute persistence of a udp service.
#[derive(Debug, Clone)]
pub struct RadiusPersistence {
    /// Shared by every service that names the profile: entries match members by IP address
    /// across services (authentication on :1812, accounting on :1813).
    pub table: Arc<PersistTable>,
    /// The attribute type number (User-Name = 1, …).
    pub attribute: u8,
    /// Drop datagrams that are not well-formed RADIUS or lack the attribute, instead of
    /// scheduling them like any datagram.
    pub drop_malformed: bool,
}

/// A `protocol = "udp"` virtual service, as compiled from the config.
#[derive(Debug)]
pub struct UdpService {
    pub name: Arc<str>,
    /// The service's own pool (`rules.pools()[0]`).
    pub pool: Arc<Pool>,
    /// The rules choosing the pool of a new flow.
    pub rules: L4Rules,
    pub mode: UdpMode,
    pub session_timeout: Duration,
    pub max_sessions: u64,
    pub radius: Option<RadiusPersistence>,
    /// `source_ip` persistence: a client address (masked) keeps its member across flows.
    pub source: Option<SourcePersistence>,
    pub stats: Arc<ServiceStats>,
    pub udp: Arc<UdpStats>,
    /// `allow` / `deny`, checked on every datagram before its flow is looked up; `None` when
    /// the service has no lists.
    pub access: Option<Arc<fulcrum_config::AccessList>>,
}

impl DatagramService for UdpService {
    fn run(
        socket: std::net::UdpSocket,
        current: Arc<ArcSwap<Self>>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        receive_loop(socket, current)
    }
}

/// Aborts the flow's reply task when the flow leaves the table.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the reply task shares with the receive loop.
struct FlowShared {
    client: SockAddr,
    /// `now_ms()` of the last datagram in either direction.
    last_active: AtomicU64,
    /// Set by the reply task on an ICMP error: a session flow picks a new member.
    repick: AtomicBool,
    /// A member answered on this flow.
    replied: AtomicBool,
    /// The client spoke again after a member's answer: a real two-way session (conntrack's
    /// ASSURED). A flood of one-datagram sources (spoofed ones) never gets there, so a full
    /// table evicts those flows first.
    assured: AtomicBool,
}

/// A client's flow; owned by the receive loop of the socket the client talks to.
struct Flow {
    socket: Arc<AsyncFd<std::net::UdpSocket>>,
    /// Whether the upstream socket is IPv6 (dual-stack): IPv4 members are then addressed as
    /// IPv4-mapped.
    v6: bool,
    shared: Arc<FlowShared>,
    /// `session` mode: the member and its connection count.
    session: Option<(Arc<Member>, ConnectionGuard)>,
    _reply: AbortOnDrop,
    _counted: ServiceConnection,
    /// Counted as one-way for its source until the client speaks after a member's answer.
    one_way: Option<OneWay>,
    /// The flow's pool: an index into `routed_by.rules.pools()`, chosen when the flow was made.
    route: usize,
    /// The service (configuration) `route` indexes; after a reload the pool is found again by
    /// name in the new one.
    routed_by: Arc<UdpService>,
    /// The local port the client sent to (for the rules, if the flow is judged again).
    port: u16,
}

/// Where a datagram goes.
enum Route {
    To(Arc<Member>),
    NoMember,
    Drop,
}

async fn receive_loop(socket: std::net::UdpSocket, current: Arc<ArcSwap<UdpService>>) {
    let local = socket.local_addr().ok();
    let listen = match register(socket) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::error!(error = %e, listen = ?local, "cannot register a udp socket");
            return;
        }
    };
    let mut flows: HashMap<SocketAddr, Flow> = HashMap::new();
    let port = local.map_or(0, |a| a.port());
    let mut next_sweep = Instant::now() + sweep_period(&current.load());
    loop {
        tokio::select! {
            ready = listen.readable() => {
                let Ok(mut guard) = ready else { return };
                for _ in 0..BATCHES_PER_WAKE {
                    let svc = current.load_full();
                    // A short batch means the queue was empty: report "would block" so the
                    // readiness is cleared without one more, empty, recvmmsg. A datagram that
                    // arrives after it raises a new (edge) event, which tokio keeps.
                    let batch = |s: &AsyncFd<std::net::UdpSocket>| match receive_batch(s.get_ref(), &svc, &mut flows, &listen, &current, port) {
                        Ok(n) if n < BATCH => Err(io::ErrorKind::WouldBlock.into()),
                        other => other.map(|_| ()),
                    };
                    match guard.try_io(batch) {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "udp receive failed");
                            break;
                        }
                        Err(_would_block) => break,
                    }
                }
            }
            _ = tokio::time::sleep_until(next_sweep) => {
                let svc = current.load();
                expire(&mut flows, &svc, now_ms());
                next_sweep = Instant::now() + sweep_period(&svc);
            }
        }
    }
}

/// How often idle flows are looked for: a quarter of the timeout, between 10 ms and 1 s.
fn sweep_period(svc: &UdpService) -> Duration {
    (svc.session_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

fn timeout_ms(svc: &UdpService) -> u64 {
    u64::try_from(svc.session_timeout.as_millis()).unwrap_or(u64::MAX)
}

/// Removes flows idle for longer than the session timeout.
fn expire(flows: &mut HashMap<SocketAddr, Flow>, svc: &UdpService, now: u64) {
    let timeout = timeout_ms(svc);
    let before = flows.len();
    flows.retain(|_, f| now.saturating_sub(f.shared.last_active.load(Ordering::Relaxed)) < timeout);
    let gone = before - flows.len();
    if gone > 0 {
        svc.udp
            .sessions_expired
            .fetch_add(gone as u64, Ordering::Relaxed);
    }
}

/// Makes room for one flow: expired ones first, then up to a sixteenth of this socket's table,
/// one-way flows first and the longest idle among them. A table holding only two-way sessions
/// evicts none while another socket's table holds one-way flows (see `OneWayFlows`). Returns
/// whether there is room now.
fn make_room(flows: &mut HashMap<SocketAddr, Flow>, svc: &UdpService, now: u64) -> bool {
    let full = || svc.stats.connections_active.load(Ordering::Relaxed) >= svc.max_sessions;
    if !full() {
        return true;
    }
    expire(flows, svc, now);
    if !full() {
        return true;
    }
    if flows.is_empty() {
        return false;
    }
    // Flows that are not two-way sessions go first, then the longest idle.
    let mut idle: Vec<(bool, u64, SocketAddr)> = flows
        .iter()
        .map(|(a, f)| {
            (
                f.shared.assured.load(Ordering::Relaxed),
                f.shared.last_active.load(Ordering::Relaxed),
                *a,
            )
        })
        .collect();
    let one_way_here = idle.iter().filter(|(assured, _, _)| !assured).count();
    let mut n = (idle.len() / 16).max(1);
    if one_way_here > 0 {
        n = n.min(one_way_here);
    } else if svc.udp.one_way.total() > 1 {
        // (One of them is the flow being made room for, admitted already.)
        return false;
    }
    idle.select_nth_unstable(n - 1);
    for (_, _, addr) in &idle[..n] {
        flows.remove(addr);
    }
    svc.udp
        .sessions_evicted
        .fetch_add(n as u64, Ordering::Relaxed);
    !full()
}

/// Reads one batch of client datagrams and forwards each to its member.
fn receive_batch(
    socket: &std::net::UdpSocket,
    svc: &Arc<UdpService>,
    flows: &mut HashMap<SocketAddr, Flow>,
    listen: &Arc<AsyncFd<std::net::UdpSocket>>,
    current: &Arc<ArcSwap<UdpService>>,
    port: u16,
) -> io::Result<usize> {
    datagram::with_client_batch(|b| {
        let n = b.recv(socket.as_raw_fd())?;
        let now = now_ms();
        // (flow socket, datagram index, destination), sent grouped by flow socket.
        let mut plan: Vec<(i32, usize, SockAddr)> = Vec::with_capacity(n);
        let (mut datagrams, mut bytes) = (0u64, 0u64);
        for i in 0..n {
            let Some((data, client)) = b.get(i) else {
                continue;
            };
            if let Some(access) = &svc.access {
                // Before the flow lookup, so a reload that adds a `deny` also stops the
                // flows already open from that source.
                if !access.permits(client.ip()) {
                    svc.stats.denied.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            datagrams += 1;
            bytes += data.len() as u64;
            // One hash lookup for a known client; a new one pays for the insert too.
            if let Some(flow) = flows.get_mut(&client) {
                forward_one(svc, flow, data, client, i, now, &mut plan);
                continue;
            }
            // A new flow: persistence, then the rules, choose its pool (once).
            let route = match choose(svc, client, port) {
                Choice::Pool(i) => i,
                Choice::Drop => continue,
            };
            let Some(one_way) = OneWay::admit(&svc.udp, client.ip(), per_source_limit(svc)) else {
                svc.udp.source_limited.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            // The flow's place in `max_sessions`, taken in one atomic step: the workers' tables
            // share the bound.
            let counted = match svc.stats.open_within(svc.max_sessions) {
                Some(c) => c,
                None => {
                    // The plan names flow sockets by descriptor: send before any flow is
                    // evicted, so no descriptor is closed (and reused) under a planned datagram.
                    flush(b, &mut plan, svc);
                    let room = make_room(flows, svc, now);
                    match room
                        .then(|| svc.stats.open_within(svc.max_sessions))
                        .flatten()
                    {
                        Some(c) => c,
                        None => {
                            svc.udp.table_full.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    }
                }
            };
            let admitted = (one_way, counted);
            let mut flow = match new_flow(
                client,
                svc,
                listen,
                current,
                now,
                admitted,
                (route, port),
            ) {
                Ok(flow) => flow,
                Err(e) => {
                    svc.udp.table_full.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(service = %svc.name, error = %e, "cannot open an upstream udp socket; datagram dropped");
                    continue;
                }
            };
            forward_one(svc, &mut flow, data, client, i, now, &mut plan);
            flows.insert(client, flow);
        }
        svc.stats
            .requests_total
            .fetch_add(datagrams, Ordering::Relaxed);
        svc.stats.bytes_in.fetch_add(bytes, Ordering::Relaxed);

        flush(b, &mut plan, svc);
        Ok(n)
    })
}

/// Sends the planned datagrams, grouped by flow socket, and empties the plan.
fn flush(b: &datagram::RecvBatch, plan: &mut Vec<(i32, usize, SockAddr)>, svc: &UdpService) {
    let mut items: Vec<(&[u8], &SockAddr)> = Vec::with_capacity(plan.len());
    let mut start = 0;
    while start < plan.len() {
        let fd = plan[start].0;
        items.clear();
        let mut end = start;
        while end < plan.len() && plan[end].0 == fd {
            if let Some((data, _)) = b.get(plan[end].1) {
                items.push((data, &plan[end].2));
            }
            end += 1;
        }
        let (sent, err) = datagram::send_all(fd, &items);
        if sent < items.len() {
            svc.udp
                .send_errors
                .fetch_add((items.len() - sent) as u64, Ordering::Relaxed);
            if let Some(e) = err {
                tracing::debug!(service = %svc.name, error = %e, "sending to members failed");
            }
        }
        start = end;
    }
    drop(items);
    plan.clear();
}

/// The pool a new flow from `client` to local `port` goes to: persistence (`source_ip`), then
/// the rules, else the service's pool.
fn choose(svc: &UdpService, client: SocketAddr, port: u16) -> Choice {
    if svc.rules.is_empty() {
        return Choice::Pool(0);
    }
    let remembered = svc
        .source
        .as_ref()
        .and_then(|s| s.table.get(&s.key(client)));
    svc.rules.choose(client.ip(), port, remembered)
}

/// The pool of a flow in the service running now: the one chosen when the flow was made,
/// found again by name after a reload; chosen anew when the service no longer has it. `None`:
/// a `drop` rule now matches the flow.
fn flow_pool<'s>(
    svc: &'s Arc<UdpService>,
    flow: &mut Flow,
    client: SocketAddr,
) -> Option<&'s Arc<Pool>> {
    if !Arc::ptr_eq(&flow.routed_by, svc) {
        let old = flow.routed_by.rules.pools().get(flow.route);
        let kept = old.and_then(|o| svc.rules.pools().iter().position(|p| p.name == o.name));
        flow.route = match kept {
            Some(i) => i,
            None => match choose(svc, client, flow.port) {
                Choice::Pool(i) => i,
                Choice::Drop => return None,
            },
        };
        flow.routed_by = svc.clone();
    }
    svc.rules.pools().get(flow.route)
}

/// The member of the service at `addr`, in any of the pools its flows can use (the service's
/// own first).
fn member_of(svc: &UdpService, addr: SocketAddr) -> Option<&Arc<Member>> {
    svc.rules
        .pools()
        .iter()
        .find_map(|p| p.member_by_addr(addr).map(|(_, m)| m))
}

/// Routes datagram `i` of the batch and adds it to the send plan.
fn forward_one(
    svc: &Arc<UdpService>,
    flow: &mut Flow,
    data: &[u8],
    client: SocketAddr,
    i: usize,
    now: u64,
    plan: &mut Vec<(i32, usize, SockAddr)>,
) {
    flow.shared.last_active.store(now, Ordering::Relaxed);
    if flow.one_way.is_some() && flow.shared.replied.load(Ordering::Relaxed) {
        flow.shared.assured.store(true, Ordering::Relaxed);
        flow.one_way = None;
    }
    match route(svc, flow, data, client) {
        Route::To(member) => {
            member.stats.requests_total.fetch_add(1, Ordering::Relaxed);
            member.stats.add_bytes(data.len() as u64, 0);
            plan.push((
                flow.socket.as_raw_fd(),
                i,
                upstream_addr(member.address, flow.v6),
            ));
        }
        Route::NoMember => {
            svc.stats.no_member.fetch_add(1, Ordering::Relaxed);
        }
        Route::Drop => {}
    }
}

/// The member address as the flow's socket needs it.
fn upstream_addr(member: SocketAddr, v6: bool) -> SockAddr {
    match (member, v6) {
        (SocketAddr::V4(a), true) => SockAddr::from(SocketAddr::new(
            IpAddr::V6(a.ip().to_ipv6_mapped()),
            a.port(),
        )),
        (a, _) => SockAddr::from(a),
    }
}

/// Chooses the member for one datagram, in the flow's pool: RADIUS persistence, then the
/// session's member, then the scheduler.
fn route(svc: &Arc<UdpService>, flow: &mut Flow, data: &[u8], client: SocketAddr) -> Route {
    let Some(pool) = flow_pool(svc, flow, client) else {
        return Route::Drop;
    };
    if let Some(r) = &svc.radius {
        match radius::key_of(data, r.attribute) {
            KeyOf::Value(v) => {
                let key = r.table.key(v);
                if let Some(member) = r.table.get(&key).and_then(|a| persistent_across(pool, a)) {
                    return Route::To(member);
                }
                let ctx = PickContext {
                    hash: l4_hash(&pool.hash_key, client),
                };
                return match pool.pick(&ctx, &[]) {
                    Some(p) => {
                        r.table.insert(key, p.member.address);
                        Route::To(p.member)
                    }
                    None => Route::NoMember,
                };
            }
            KeyOf::Absent => {
                svc.udp.radius_no_attribute.fetch_add(1, Ordering::Relaxed);
                if r.drop_malformed {
                    svc.udp.radius_dropped.fetch_add(1, Ordering::Relaxed);
                    return Route::Drop;
                }
            }
            KeyOf::Malformed(_) => {
                svc.udp.radius_malformed.fetch_add(1, Ordering::Relaxed);
                if r.drop_malformed {
                    svc.udp.radius_dropped.fetch_add(1, Ordering::Relaxed);
                    return Route::Drop;
                }
            }
        }
    }
    let ctx = PickContext {
        hash: l4_hash(&pool.hash_key, client),
    };
    // Source persistence: the remembered member, else the scheduler's choice, remembered.
    let pick = || -> Option<Arc<Member>> {
        let Some(src) = &svc.source else {
            return pool.pick(&ctx, &[]).map(|p| p.member);
        };
        let key = src.key(client);
        if let Some(m) = src.table.get(&key).and_then(|a| pool.persistent(a, &[])) {
            return Some(m.member);
        }
        let p = pool.pick(&ctx, &[])?;
        src.table.insert(key, p.member.address);
        Some(p.member)
    };
    match svc.mode {
        UdpMode::PerPacket => pick().map_or(Route::NoMember, Route::To),
        UdpMode::Session => {
            let repick = flow.shared.repick.swap(false, Ordering::Relaxed);
            if let Some((m, _)) = &flow.session {
                if !repick {
                    if let Some(p) = pool.persistent(m.address, &[]) {
                        if Arc::ptr_eq(&p.member, m) {
                            return Route::To(p.member);
                        }
                    }
                }
            }
            let had = flow.session.take().is_some();
            match pick() {
                Some(member) => {
                    if had {
                        svc.udp.rescheduled.fetch_add(1, Ordering::Relaxed);
                    }
                    let guard = member.open_connection();
                    flow.session = Some((member.clone(), guard));
                    Route::To(member)
                }
                None => Route::NoMember,
            }
        }
    }
}

/// The member a persistence entry names, if it may take the client: the same address, or a
/// member with the same IP (a server's accounting port, when the entry was made by its
/// authentication port's service).
fn persistent_across(pool: &Pool, addr: SocketAddr) -> Option<Arc<Member>> {
    if let Some(p) = pool.persistent(addr, &[]) {
        return Some(p.member);
    }
    let same_ip = pool
        .members()
        .iter()
        .find(|m| m.address.ip() == addr.ip())?;
    pool.persistent(same_ip.address, &[]).map(|p| p.member)
}

/// Opens the upstream socket of a new flow and starts its reply task.
fn new_flow(
    client: SocketAddr,
    svc: &Arc<UdpService>,
    listen: &Arc<AsyncFd<std::net::UdpSocket>>,
    current: &Arc<ArcSwap<UdpService>>,
    now: u64,
    (one_way, counted): (OneWay, ServiceConnection),
    (route, port): (usize, u16),
) -> io::Result<Flow> {
    let vrf = svc
        .rules
        .pools()
        .get(route)
        .and_then(|p| p.config.vrf.as_deref());
    let (socket, v6) = upstream_socket(vrf)?;
    let socket = Arc::new(register(socket)?);
    let shared = Arc::new(FlowShared {
        client: SockAddr::from(client),
        last_active: AtomicU64::new(now),
        repick: AtomicBool::new(false),
        replied: AtomicBool::new(false),
        assured: AtomicBool::new(false),
    });
    let reply = tokio::spawn(relay_replies(
        socket.clone(),
        shared.clone(),
        listen.clone(),
        current.clone(),
    ));
    Ok(Flow {
        socket,
        v6,
        shared,
        session: None,
        _reply: AbortOnDrop(reply),
        _counted: counted,
        one_way: Some(one_way),
        route,
        routed_by: svc.clone(),
        port,
    })
}

/// Registers an owned UDP socket with the reactor, for reading (ICMP errors are reported too).
fn register(socket: std::net::UdpSocket) -> io::Result<AsyncFd<std::net::UdpSocket>> {
    // SAFETY: the AsyncFd owns the std socket, which owns its descriptor and returns that same
    // descriptor from as_raw_fd until it is dropped together with the AsyncFd.
    unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE) }.map_err(io::Error::from)
}

/// A non-blocking upstream socket on an ephemeral port: dual-stack IPv6 when the host has IPv6,
/// so one flow can reach IPv4 and IPv6 members alike, else IPv4. ICMP errors are queued. With
/// the pool's `vrf`, bound into that VRF's device.
fn upstream_socket(vrf: Option<&str>) -> io::Result<(std::net::UdpSocket, bool)> {
    let (socket, v6) = match Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP)) {
        Ok(s) if s.set_only_v6(false).is_ok() => (s, true),
        _ => (
            Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?,
            false,
        ),
    };
    socket.set_nonblocking(true)?;
    if let Some(device) = vrf {
        socket.bind_device(Some(device.as_bytes()))?;
    }
    let any: SocketAddr = if v6 {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        ([0, 0, 0, 0], 0).into()
    };
    socket.bind(&any.into())?;
    datagram::enable_recverr(socket.as_raw_fd(), v6)?;
    Ok((socket.into(), v6))
}

/// Relays what members send on a flow's socket back to its client, from the listening socket
/// (the virtual service's address), and reports ICMP errors to the members they concern.
async fn relay_replies(
    socket: Arc<AsyncFd<std::net::UdpSocket>>,
    flow: Arc<FlowShared>,
    listen: Arc<AsyncFd<std::net::UdpSocket>>,
    current: Arc<ArcSwap<UdpService>>,
) {
    loop {
        let Ok(mut guard) = socket.ready(Interest::READABLE | Interest::ERROR).await else {
            return;
        };
        let svc = current.load_full();
        if guard.ready().is_error() {
            report_icmp_errors(guard.get_ref().get_ref(), &svc, &flow);
            guard.clear_ready_matching(Ready::ERROR);
        }
        if !guard.ready().is_readable() {
            continue;
        }
        for _ in 0..BATCHES_PER_WAKE {
            match relay_batch(guard.get_ref().get_ref(), &svc, &flow, listen.get_ref()) {
                Ok(n) if n == BATCH => {}
                // A short batch emptied the queue (see `receive_loop`).
                Ok(_) => {
                    guard.clear_ready_matching(Ready::READABLE);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    guard.clear_ready_matching(Ready::READABLE);
                    break;
                }
                Err(_) => {
                    // The socket's pending error (an ICMP error under IP_RECVERR): the details
                    // are in the error queue.
                    report_icmp_errors(guard.get_ref().get_ref(), &svc, &flow);
                }
            }
        }
    }
}

fn report_icmp_errors(socket: &std::net::UdpSocket, svc: &UdpService, flow: &FlowShared) {
    datagram::read_errors(socket.as_raw_fd(), 64, |e| {
        svc.udp.icmp_errors.fetch_add(1, Ordering::Relaxed);
        if let Some(member) = member_of(svc, e.destination) {
            let detail = format!("ICMP: {}", e.error);
            tracing::debug!(service = %svc.name, member = %member.label, %detail, "udp datagram refused");
            member.record_connect_failure(&detail);
            flow.repick.store(true, Ordering::Relaxed);
        }
    });
}

fn relay_batch(
    socket: &std::net::UdpSocket,
    svc: &UdpService,
    flow: &FlowShared,
    listen: &std::net::UdpSocket,
) -> io::Result<usize> {
    datagram::with_member_batch(|b| {
        let n = b.recv(socket.as_raw_fd())?;
        let mut items: [(&[u8], &SockAddr); BATCH] = [(&[], &flow.client); BATCH];
        let mut k = 0;
        let mut bytes = 0u64;
        // Replies of a batch mostly come from one member: look it up once.
        let mut last: Option<(SocketAddr, &Arc<Member>)> = None;
        for i in 0..n {
            let Some((data, from)) = b.get(i) else {
                continue;
            };
            let member = match last {
                Some((addr, m)) if addr == from => m,
                _ => match member_of(svc, from) {
                    Some(m) => {
                        last = Some((from, m));
                        m
                    }
                    None => {
                        svc.udp.foreign_replies.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                },
            };
            member.stats.add_bytes(0, data.len() as u64);
            member.record_exchange_success();
            bytes += data.len() as u64;
            items[k] = (data, &flow.client);
            k += 1;
        }
        if k == 0 {
            return Ok(n);
        }
        flow.last_active.store(now_ms(), Ordering::Relaxed);
        flow.replied.store(true, Ordering::Relaxed);
        let (sent, err) = datagram::send_all(listen.as_raw_fd(), &items[..k]);
        svc.udp
            .datagrams_out
            .fetch_add(sent as u64, Ordering::Relaxed);
        svc.stats.bytes_out.fetch_add(bytes, Ordering::Relaxed);
        if sent < k {
            svc.udp
                .send_errors
                .fetch_add((k - sent) as u64, Ordering::Relaxed);
            if let Some(e) = err {
                tracing::debug!(service = %svc.name, error = %e, "sending to a client failed");
            }
        }
        Ok(n)
    })
}

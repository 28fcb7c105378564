//! Inbound dynamic proximity (`algorithm = "proximity"`): each site's RTT to the client's
//! resolver, measured by that site's own instance, shared over the exchange.
//!
//! The key of a client is its /24 (IPv6: /48): of the EDNS Client Subnet address when the query
//! has one, else of the resolver's. The first query from an unknown prefix is answered by the
//! name's `fallback` (nothing waits for a probe) and starts one here: a DNS query (`.` NS, no
//! recursion) to the address the query came with, at `[gslb.proximity] port`; the time to any
//! reply is this site's RTT to the prefix, no reply within `timeout` makes it unreachable. The
//! prefix also goes into this instance's next reports as a request, so every other instance
//! probes it from its own site and sends its RTT back in its reports. Once every up site whose
//! instance reports has a measurement, the prefix is answered by the site with the lowest
//! RTT × (1 + load_weight × load). A measurement older than `max_age` is taken again at the next
//! query, the old one answering meanwhile.
//!
//! Bounds: `max_prefixes` entries per site (the least recently used go first), `max_in_flight`
//! probes waiting at once, `probes_per_second` started; a probe that finds the queue full is
//! dropped and counted, and tried again at a later query. Measurements and requests wait in a
//! queue (`MAX_QUEUED`) for the reports: each rides in the reports for `SHARE_WINDOW` from the
//! first one that carries it, at most `MAX_SHARED` at once. A report the dialer skipped (it
//! sends the newest) is healed by asking again: a query that still finds a site without the
//! prefix's RTT `ASK_AGAIN_AFTER` after the request asks again, and an instance asked about a
//! prefix it has measured sends its RTT again.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Semaphore};

/// Measurements (and requests) one report carries at most.
pub const MAX_SHARED: usize = 512;
/// How long a measurement or request rides in the reports from the first that carries it:
/// several reports carry it (one per 100 ms while there is news), so one a dialer skipped (it
/// sends the newest report) is not lost.
pub const SHARE_WINDOW: Duration = Duration::from_millis(500);
/// Measurements (and requests) waiting for the reports at most; the oldest go first, counted.
pub const MAX_QUEUED: usize = 8192;
/// A prefix still not measured by every site this long after its request is asked again.
pub const ASK_AGAIN_AFTER: Duration = Duration::from_secs(3);
/// Entries compared when one must be evicted (an approximate least-recently-used).
const EVICTION_SAMPLE: usize = 8;

/// The /24 (IPv4) or /48 (IPv6) of an address: the key RTTs are kept under.
pub fn prefix_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & 0xffff_ff00)),
        IpAddr::V6(v6) => {
            let mask: u128 = !0u128 << 80;
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// The prefix length of a key (for the ECS scope and display).
pub fn prefix_len(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        24
    } else {
        48
    }
}

/// One site's measurement of one prefix, as reports carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// The prefix's network address (`prefix_of`).
    pub prefix: IpAddr,
    /// RTT in ms; None: no reply within the timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<f64>,
}

/// A prefix an instance asks the others to measure, with the address its queries came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub prefix: IpAddr,
    pub target: IpAddr,
}

/// What an entry knows.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The address probes go to (the first one seen in the prefix).
    target: IpAddr,
    /// Some(None): measured unreachable.
    rtt: Option<Option<f64>>,
    measured_at: Option<Instant>,
    used_at: Instant,
    in_flight: bool,
    /// When the other instances were last asked to measure it.
    requested_at: Option<Instant>,
    /// When its measurement last went into the reports.
    shared_at: Option<Instant>,
}

/// Items waiting to go out in the reports, oldest first.
struct ShareQueue<T> {
    /// Each with the time of the first report that carried it.
    q: VecDeque<(T, Option<Instant>)>,
}

impl<T> Default for ShareQueue<T> {
    fn default() -> Self {
        ShareQueue { q: VecDeque::new() }
    }
}

impl<T: Clone> ShareQueue<T> {
    /// Queues `item`; false when the oldest had to go to make room.
    fn push(&mut self, item: T) -> bool {
        let room = self.q.len() < MAX_QUEUED;
        if !room {
            self.q.pop_front();
        }
        self.q.push_back((item, None));
        room
    }

    /// What the next report carries: the items riding now (at most `MAX_SHARED`), after those
    /// whose window ended left.
    fn take(&mut self, now: Instant) -> Vec<T> {
        while self
            .q
            .front()
            .is_some_and(|(_, at)| at.is_some_and(|t| now.duration_since(t) > SHARE_WINDOW))
        {
            self.q.pop_front();
        }
        self.q
            .iter_mut()
            .take(MAX_SHARED)
            .map(|(item, at)| {
                at.get_or_insert(now);
                item.clone()
            })
            .collect()
    }
}

/// Counters, for the API and metrics.
#[derive(Debug, Default)]
pub struct Counters {
    pub probes_sent: AtomicU64,
    pub probes_unreachable: AtomicU64,
    /// Probes not started: the queue of probes waiting for the rate or in-flight limit was full.
    pub probes_dropped: AtomicU64,
    pub evictions: AtomicU64,
    /// Answers by the RTTs, and by the fallback while a prefix is not measured everywhere.
    pub warm_answers: AtomicU64,
    pub cold_answers: AtomicU64,
    pub requests_received: AtomicU64,
    /// Measurements and requests that left the report queue unsent (it was full).
    pub share_dropped: AtomicU64,
    /// Requests sent again because a site still had no RTT for the prefix.
    pub asked_again: AtomicU64,
}

/// A probe to run: the prefix and the address to ask.
type Job = (IpAddr, IpAddr);

/// Another site's RTT to each prefix (None: unreachable), and when its report said so.
type SiteRtts = HashMap<IpAddr, (Option<f64>, Instant)>;

/// RTTs of this site (measured here) and of the other sites (from their reports).
pub struct Proximity {
    config: ArcSwap<fulcrum_config::GslbProximity>,
    local: Mutex<HashMap<IpAddr, Entry>>,
    remote: Mutex<HashMap<Arc<str>, SiteRtts>>,
    recent: Mutex<ShareQueue<Measured>>,
    requests: Mutex<ShareQueue<Request>>,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// Other sites whose instance reports now (fresh reports): their RTTs are waited for.
    reporting: ArcSwap<Vec<Arc<str>>>,
    pub counters: Counters,
}

impl Default for Proximity {
    fn default() -> Self {
        Proximity {
            config: ArcSwap::from_pointee(fulcrum_config::GslbProximity::default()),
            local: Mutex::new(HashMap::new()),
            remote: Mutex::new(HashMap::new()),
            recent: Mutex::new(ShareQueue::default()),
            requests: Mutex::new(ShareQueue::default()),
            jobs: Mutex::new(None),
            reporting: ArcSwap::from_pointee(Vec::new()),
            counters: Counters::default(),
        }
    }
}

/// What the ranking of one prefix knows about one site.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SiteRtt {
    /// Measured: ms, or None for unreachable.
    Known(Option<f64>),
    /// Its instance reports, but has not measured the prefix yet.
    Pending,
    /// Nobody can measure it (no instance reports for the site).
    Unmeasurable,
}

impl Proximity {
    pub fn set_config(&self, c: &fulcrum_config::GslbProximity) {
        if **self.config.load() != *c {
            self.config.store(Arc::new(c.clone()));
        }
    }

    /// Starts the prober on `handle`: probes queued by `touch` run there, within the limits.
    pub fn start(self: &Arc<Self>, handle: &tokio::runtime::Handle) {
        let (tx, rx) = mpsc::channel::<Job>(1024);
        *self.jobs.lock() = Some(tx);
        handle.spawn(run_prober(Arc::downgrade(self), rx));
    }

    /// A query for a proximity name came from `addr` (its prefix `prefix_of(addr)`): notes the
    /// use and starts a probe if the prefix is new or its measurement is older than `max_age`.
    /// `request`: also ask the other instances (false when the request came from one).
    pub fn touch(&self, addr: IpAddr, request: bool) {
        let prefix = prefix_of(addr);
        let config = self.config.load();
        let now = Instant::now();
        let probe = {
            let mut local = self.local.lock();
            if !local.contains_key(&prefix) && local.len() >= config.max_prefixes as usize {
                evict(&mut local);
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            }
            let e = local.entry(prefix).or_insert(Entry {
                target: addr,
                rtt: None,
                measured_at: None,
                used_at: now,
                in_flight: false,
                requested_at: None,
                shared_at: None,
            });
            e.used_at = now;
            let due = e.measured_at.is_none_or(|t| now - t >= config.max_age);
            let start = due && !e.in_flight;
            if start {
                e.in_flight = true;
                if request {
                    e.requested_at = Some(now);
                }
            }
            start.then_some(e.target)
        };
        let Some(target) = probe else { return };
        if request {
            self.share_request(Request { prefix, target });
        }
        let sent = self
            .jobs
            .lock()
            .as_ref()
            .is_some_and(|tx| tx.try_send((prefix, target)).is_ok());
        if !sent {
            self.counters.probes_dropped.fetch_add(1, Ordering::Relaxed);
            if let Some(e) = self.local.lock().get_mut(&prefix) {
                e.in_flight = false;
            }
        }
    }

    fn share_request(&self, r: Request) {
        if !self.requests.lock().push(r) {
            self.counters.share_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn share_measured(&self, m: Measured) {
        if !self.recent.lock().push(m) {
            self.counters.share_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A query found a site without an RTT for `addr`'s prefix: the other instances are asked
    /// again if the last request is `ASK_AGAIN_AFTER` old (its report may have been skipped, or
    /// their answer's).
    pub fn ask_again(&self, addr: IpAddr) {
        let prefix = prefix_of(addr);
        let now = Instant::now();
        let target = {
            let mut local = self.local.lock();
            let Some(e) = local.get_mut(&prefix) else {
                return;
            };
            if e.requested_at
                .is_some_and(|t| now.duration_since(t) < ASK_AGAIN_AFTER)
            {
                return;
            }
            e.requested_at = Some(now);
            e.target
        };
        self.counters.asked_again.fetch_add(1, Ordering::Relaxed);
        self.share_request(Request { prefix, target });
    }

    /// Records a probe's result.
    fn measured(&self, prefix: IpAddr, rtt: Option<f64>) {
        let now = Instant::now();
        if let Some(e) = self.local.lock().get_mut(&prefix) {
            e.rtt = Some(rtt);
            e.measured_at = Some(now);
            e.in_flight = false;
            e.shared_at = Some(now);
        }
        self.share_measured(Measured { prefix, ms: rtt });
    }

    /// Another instance asks about `r`: measured here and not older than `max_age`, the RTT
    /// goes out again (once per share window); otherwise it is probed.
    fn requested(&self, r: &Request) {
        let prefix = prefix_of(r.prefix);
        let now = Instant::now();
        let max_age = self.config.load().max_age;
        let again = {
            let mut local = self.local.lock();
            match local.get_mut(&prefix) {
                Some(e) if e.measured_at.is_some_and(|t| now - t < max_age) => {
                    let fresh_share = e
                        .shared_at
                        .is_some_and(|t| now.duration_since(t) <= SHARE_WINDOW);
                    if !fresh_share {
                        e.shared_at = Some(now);
                    }
                    e.used_at = now;
                    Some((!fresh_share).then_some(e.rtt).flatten())
                }
                _ => None,
            }
        };
        match again {
            Some(Some(ms)) => self.share_measured(Measured { prefix, ms }),
            Some(None) => {}
            None => self.touch(r.target, false),
        }
    }

    /// This site's RTT to `prefix` (None: not measured yet).
    pub fn local_rtt(&self, prefix: IpAddr) -> Option<Option<f64>> {
        self.local.lock().get(&prefix).and_then(|e| e.rtt)
    }

    /// `site`'s RTT to `prefix` from its reports.
    pub fn remote_rtt(&self, site: &str, prefix: IpAddr) -> Option<Option<f64>> {
        self.remote
            .lock()
            .get(site)
            .and_then(|m| m.get(&prefix))
            .map(|(ms, _)| *ms)
    }

    /// What this instance's next report carries: its recent measurements and requests.
    pub fn to_share(&self) -> (Vec<Measured>, Vec<Request>) {
        let now = Instant::now();
        let m = self.recent.lock().take(now);
        let r = self.requests.lock().take(now);
        (m, r)
    }

    /// A peer's report arrived: its measurements are `site`'s RTTs, its requests are probed
    /// from here.
    pub fn received(&self, site: &str, measured: &[Measured], requests: &[Request]) {
        let max = self.config.load().max_prefixes as usize;
        if !measured.is_empty() {
            let now = Instant::now();
            let mut remote = self.remote.lock();
            let m = remote.entry(Arc::from(site)).or_default();
            for x in measured.iter().take(MAX_SHARED) {
                let prefix = prefix_of(x.prefix);
                if !m.contains_key(&prefix) && m.len() >= max {
                    if let Some(k) = m.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| *k) {
                        m.remove(&k);
                    }
                }
                let ms = x.ms.filter(|v| v.is_finite() && *v >= 0.0);
                m.insert(prefix, (ms, now));
            }
        }
        for r in requests.iter().take(MAX_SHARED) {
            if prefix_of(r.target) != prefix_of(r.prefix) {
                continue;
            }
            self.counters
                .requests_received
                .fetch_add(1, Ordering::Relaxed);
            self.requested(r);
        }
    }

    /// The other sites whose instance reports now.
    pub fn set_reporting(&self, sites: Vec<Arc<str>>) {
        if **self.reporting.load() != sites {
            self.reporting.store(Arc::new(sites));
        }
    }

    pub fn is_reporting(&self, site: &str) -> bool {
        self.reporting.load().iter().any(|s| **s == *site)
    }

    /// Forgets the measurements of sites no longer configured.
    pub fn retain_sites(&self, sites: &[Arc<str>]) {
        self.remote.lock().retain(|k, _| sites.contains(k));
    }

    /// Prefixes measured here, and those waiting for a probe.
    pub fn cached(&self) -> (usize, usize) {
        let local = self.local.lock();
        let in_flight = local.values().filter(|e| e.in_flight).count();
        (local.len(), in_flight)
    }

    pub fn load_weight(&self) -> f64 {
        self.config.load().load_weight
    }
}

/// Removes the least recently used of a few entries not waiting for a probe.
fn evict(local: &mut HashMap<IpAddr, Entry>) {
    let victim = local
        .iter()
        .filter(|(_, e)| !e.in_flight)
        .take(EVICTION_SAMPLE)
        .min_by_key(|(_, e)| e.used_at)
        .map(|(k, _)| *k)
        .or_else(|| local.keys().next().copied());
    if let Some(k) = victim {
        local.remove(&k);
    }
}

/// Orders sites by RTT × (1 + load_weight × load): the index order of `rtts`, best first, or
/// None while a site that can be measured is not yet (`Pending`). Unreachable and unmeasurable
/// sites come last, in their order.
pub fn rank(rtts: &[(SiteRtt, f64)], load_weight: f64, out: &mut Vec<usize>) -> bool {
    out.clear();
    if rtts.iter().any(|(r, _)| *r == SiteRtt::Pending) {
        return false;
    }
    let score = |i: usize| match rtts[i] {
        (SiteRtt::Known(Some(ms)), load) => ms.max(0.001) * (1.0 + load_weight * load),
        _ => f64::INFINITY,
    };
    out.extend(0..rtts.len());
    out.sort_by(|&a, &b| score(a).total_cmp(&score(b)).then(a.cmp(&b)));
    true
}

/// Runs probes as they are queued, at most `probes_per_second` started and `max_in_flight`
/// waiting at once; ends when the `Proximity` is dropped.
async fn run_prober(p: std::sync::Weak<Proximity>, mut rx: mpsc::Receiver<Job>) {
    let slots = Arc::new(Semaphore::new(0));
    let mut granted = 0u32;
    let mut next_start = tokio::time::Instant::now();
    while let Some((prefix, target)) = rx.recv().await {
        let Some(px) = p.upgrade() else { return };
        let config = px.config.load_full();
        drop(px);
        // The in-flight limit follows the configuration (raised at once, lowered as probes end).
        if config.max_in_flight > granted {
            slots.add_permits((config.max_in_flight - granted) as usize);
            granted = config.max_in_flight;
        }
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        tokio::time::sleep_until(next_start).await;
        next_start = tokio::time::Instant::now()
            + Duration::from_secs_f64(1.0 / f64::from(config.probes_per_second.max(1)));
        let p = p.clone();
        tokio::spawn(async move {
            let dest = SocketAddr::new(target, config.port);
            let rtt = probe(dest, config.source, config.timeout).await;
            drop(permit);
            if let Some(px) = p.upgrade() {
                px.counters.probes_sent.fetch_add(1, Ordering::Relaxed);
                if rtt.is_none() {
                    px.counters
                        .probes_unreachable
                        .fetch_add(1, Ordering::Relaxed);
                }
                px.measured(prefix, rtt);
            }
        });
    }
}

/// The probe query: `.` NS, no recursion, with id `id`.
pub fn probe_query(id: u16) -> [u8; 17] {
    let [a, b] = id.to_be_bytes();
    [a, b, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1]
}

/// Whether `reply` is an answer (any response code) to the probe query with id `id`.
pub fn is_reply(id: u16, reply: &[u8]) -> bool {
    reply.len() >= 12 && reply[..2] == id.to_be_bytes() && reply[2] & 0x80 != 0
}

/// One probe: the time from the query to a reply from `dest`, in ms; None without one in time.
async fn probe(dest: SocketAddr, source: Option<IpAddr>, timeout: Duration) -> Option<f64> {
    let bind = match (source, dest) {
        (Some(s), _) if s.is_ipv4() == dest.is_ipv4() => SocketAddr::new(s, 0),
        (_, SocketAddr::V4(_)) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        (_, SocketAddr::V6(_)) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    let socket = tokio::net::UdpSocket::bind(bind).await.ok()?;
    socket.connect(dest).await.ok()?;
    let id: u16 = rand_id();
    let started = Instant::now();
    socket.send(&probe_query(id)).await.ok()?;
    let mut buf = [0u8; 512];
    let wait = async {
        // Bounded: each datagram that is not the reply is read and dropped until the timeout.
        loop {
            match socket.recv(&mut buf).await {
                Ok(n) if is_reply(id, &buf[..n]) => return Some(started.elapsed()),
                Ok(_) => continue,
                // An ICMP port unreachable is a reply too: the resolver's host answered.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    return Some(started.elapsed())
                }
                Err(_) => return None,
            }
        }
    };
    let elapsed = tokio::time::timeout(timeout, wait).await.ok()??;
    Some((elapsed.as_secs_f64() * 1e6).round() / 1e3)
}

fn rand_id() -> u16 {
    let mut b = [0u8; 2];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    u16::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_24_and_48() {
        assert_eq!(
            prefix_of("198.51.100.77".parse().unwrap()),
            "198.51.100.0".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            prefix_of("2001:db8:1:2:3::9".parse().unwrap()),
            "2001:db8:1::".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn ranking_waits_for_every_measurable_site_and_weighs_load() {
        let mut out = Vec::new();
        let known = |ms: f64, load: f64| (SiteRtt::Known(Some(ms)), load);
        assert!(!rank(
            &[known(5.0, 0.0), (SiteRtt::Pending, 0.0)],
            1.0,
            &mut out
        ));
        assert!(rank(&[known(50.0, 0.0), known(5.0, 0.0)], 1.0, &mut out));
        assert_eq!(out, [1, 0]);
        // 5 ms at full load counts as 10 with load_weight 1, 20 with 3.
        assert!(rank(&[known(8.0, 0.0), known(5.0, 1.0)], 1.0, &mut out));
        assert_eq!(out, [0, 1]);
        assert!(rank(&[known(8.0, 0.0), known(5.0, 1.0)], 0.0, &mut out));
        assert_eq!(out, [1, 0]);
        assert!(rank(
            &[
                (SiteRtt::Known(None), 0.0),
                (SiteRtt::Unmeasurable, 0.0),
                known(90.0, 0.5)
            ],
            1.0,
            &mut out
        ));
        assert_eq!(out, [2, 0, 1]);
    }

    #[test]
    fn replies_match_the_query_id_and_are_responses() {
        let q = probe_query(0xabcd);
        assert!(!is_reply(0xabcd, &q), "the query itself is not a reply");
        let mut r = q;
        r[2] |= 0x80;
        assert!(is_reply(0xabcd, &r));
        assert!(!is_reply(0xabce, &r));
        assert!(!is_reply(0xabcd, &r[..11]));
    }

    #[test]
    fn a_queue_carries_each_item_for_a_window_and_at_most_max_shared_at_once() {
        let mut q = ShareQueue::default();
        for i in 0..MAX_SHARED + 10 {
            q.push(i);
        }
        let t0 = Instant::now();
        let first = q.take(t0);
        assert_eq!(first.len(), MAX_SHARED);
        assert_eq!(first[0], 0);
        assert_eq!(q.take(t0 + SHARE_WINDOW / 2), first, "rides again");
        let later = q.take(t0 + SHARE_WINDOW + Duration::from_millis(1));
        assert_eq!(later, (MAX_SHARED..MAX_SHARED + 10).collect::<Vec<_>>());
        let mut full = ShareQueue::default();
        assert!((0..MAX_QUEUED).all(|i| full.push(i)));
        assert!(!full.push(MAX_QUEUED), "the oldest makes room");
    }

    #[test]
    fn a_request_for_a_measured_prefix_sends_the_rtt_again_once_per_window() {
        let p = Proximity::default();
        let addr = IpAddr::from([10, 0, 0, 1]);
        let prefix = prefix_of(addr);
        p.touch(addr, false);
        p.measured(prefix, Some(3.0));
        let request = Request {
            prefix,
            target: addr,
        };
        p.requested(&request);
        assert_eq!(p.recent.lock().q.len(), 1, "just shared: not again");
        std::thread::sleep(SHARE_WINDOW + Duration::from_millis(50));
        p.requested(&request);
        p.requested(&request);
        assert_eq!(p.recent.lock().q.len(), 2, "once more");
    }

    #[test]
    fn entries_are_bounded_and_requests_shared() {
        let p = Proximity::default();
        p.set_config(&fulcrum_config::GslbProximity {
            max_prefixes: 3,
            ..Default::default()
        });
        for i in 0..10u8 {
            p.touch(IpAddr::from([10, 0, i, 1]), true);
        }
        assert!(p.cached().0 <= 3);
        assert_eq!(p.counters.evictions.load(Ordering::Relaxed), 7);
        // No prober: every probe is dropped and counted, and the prefix is tried again later.
        assert_eq!(p.counters.probes_dropped.load(Ordering::Relaxed), 10);
        let (_, requests) = p.to_share();
        assert_eq!(requests.len(), 10);
        p.measured(prefix_of(IpAddr::from([10, 0, 9, 1])), Some(4.5));
        assert_eq!(p.local_rtt(IpAddr::from([10, 0, 9, 0])), Some(Some(4.5)));
        p.received(
            "west",
            &[Measured {
                prefix: IpAddr::from([10, 0, 9, 0]),
                ms: Some(f64::NAN),
            }],
            &[],
        );
        assert_eq!(
            p.remote_rtt("west", IpAddr::from([10, 0, 9, 0])),
            Some(None)
        );
    }
}

//! The GSLB control plane: samples this instance's view of the sites, exchanges reports with
//! the peers, keeps the distribution table current, and answers the API.
//!
//! Partitions and stale peers: a peer's report counts while it is younger than `stale_after`.
//! A peer that stops reporting (crashed, or cut off by a partition) drops out of the table
//! after that time, and the table is computed from the reports left, this instance's own always
//! among them; when the partition heals, the next report brings the peer back. Answers never
//! depend on a peer: a site is answered only while this instance's own monitors see it up (or
//! when every site is down). During a partition the instances on either side compute their
//! tables from different reports and may share traffic differently; they agree again one
//! report after the partition ends.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use fulcrum_balance::Pool;
use parking_lot::Mutex;
use ring::hmac;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::exchange::{self, FrameError, MAGIC, NONCE_LEN};
use crate::gslb::{local_figures, GslbState};
use crate::learnt::{LearntTable, LocalService};
use crate::table::{LearntService, Report};

/// How often this instance's own view is sampled (health changes are reported within this).
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// Exchange settings from the config.
#[derive(Debug, Clone, PartialEq)]
struct ExchangeConfig {
    local: Option<String>,
    listen: Option<SocketAddr>,
    /// (site, address) of every other site with a peer.
    peers: Vec<(String, SocketAddr)>,
    interval: Duration,
    stale_after: Duration,
}

/// A report received from a peer.
#[derive(Debug, Clone)]
struct Received {
    report: Report,
    at: Instant,
}

/// What the API shows of one peer.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PeerStatus {
    pub site: String,
    pub address: String,
    /// Our connection to it (we send our reports there).
    pub connected: bool,
    pub reports_sent: u64,
    pub last_error: Option<String>,
    /// Its reports to us.
    pub last_report_age_ms: Option<u64>,
    pub reports_received: u64,
    pub stale: bool,
}

#[derive(Default)]
struct Tasks {
    listener: Option<(SocketAddr, JoinHandle<()>)>,
    dialers: HashMap<(String, SocketAddr), JoinHandle<()>>,
}

impl Drop for Tasks {
    fn drop(&mut self) {
        if let Some((_, t)) = &self.listener {
            t.abort();
        }
        for t in self.dialers.values() {
            t.abort();
        }
    }
}

/// Shared between the tasks.
struct Shared {
    state: ArcSwap<GslbState>,
    config: ArcSwap<ExchangeConfig>,
    keys: ArcSwap<Vec<hmac::Key>>,
    received: Mutex<BTreeMap<String, Received>>,
    peers: Mutex<BTreeMap<String, PeerStatus>>,
    local_pools: ArcSwap<Vec<Arc<Pool>>>,
    /// This instance's virtual services with `gslb`, and what was last sampled of them.
    local_services: ArcSwap<Vec<LocalService>>,
    own_services: Mutex<Vec<LearntService>>,
    own: watch::Sender<Option<Arc<Report>>>,
    version: AtomicU64,
    auth_failures: AtomicU64,
    /// Connections closed at accept: too many were not authenticated yet.
    unauthenticated_refused: AtomicU64,
    reports_received: AtomicU64,
}

/// Where the HTTP redirect fallback sends a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedirectTarget {
    /// The site's `redirect_host` (`host[:port]`): the client keeps a name its certificate and
    /// virtual hosts match.
    Host(Arc<str>),
    /// One of the site's addresses (a site without `redirect_host`).
    Address(IpAddr),
}

/// GSLB's running side, kept across reloads.
pub struct GslbService {
    shared: Arc<Shared>,
    tasks: Mutex<Tasks>,
    handle: Handle,
    sampler: JoinHandle<()>,
}

impl Drop for GslbService {
    fn drop(&mut self) {
        self.sampler.abort();
    }
}

impl GslbService {
    /// Starts the sampler; must be called in a tokio runtime.
    pub fn new(state: GslbState) -> GslbService {
        let (own, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            state: ArcSwap::from_pointee(state),
            config: ArcSwap::from_pointee(ExchangeConfig {
                local: None,
                listen: None,
                peers: Vec::new(),
                interval: Duration::from_secs(1),
                stale_after: Duration::from_secs(5),
            }),
            keys: ArcSwap::from_pointee(Vec::new()),
            received: Mutex::new(BTreeMap::new()),
            peers: Mutex::new(BTreeMap::new()),
            local_pools: ArcSwap::from_pointee(Vec::new()),
            local_services: ArcSwap::from_pointee(Vec::new()),
            own_services: Mutex::new(Vec::new()),
            own,
            version: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            unauthenticated_refused: AtomicU64::new(0),
            reports_received: AtomicU64::new(0),
        });
        let handle = Handle::current();
        shared.state.load().proximity.start(&handle);
        let sampler = handle.spawn(sample(shared.clone()));
        GslbService {
            shared,
            tasks: Mutex::new(Tasks::default()),
            handle,
            sampler,
        }
    }

    pub fn state(&self) -> Arc<GslbState> {
        self.shared.state.load_full()
    }

    /// Binds the exchange listener if its address is new (a failure changes nothing).
    pub fn prepare_listener(
        &self,
        config: &fulcrum_config::Config,
    ) -> Result<Option<std::net::TcpListener>, String> {
        let want = exchange_config(config).listen;
        let tasks = self.tasks.lock();
        match (want, &tasks.listener) {
            (Some(a), Some((have, _))) if *have == a => Ok(None),
            (Some(a), _) => {
                let s = socket2::Socket::new(
                    socket2::Domain::for_address(a),
                    socket2::Type::STREAM,
                    None,
                )
                .map_err(|e| format!("cannot listen on {a} (gslb exchange): {e}"))?;
                let _ = s.set_reuse_address(true);
                let _ = s.set_nonblocking(true);
                s.bind(&a.into())
                    .and_then(|_| s.listen(64))
                    .map_err(|e| format!("cannot listen on {a} (gslb exchange): {e}"))?;
                Ok(Some(s.into()))
            }
            (None, _) => Ok(None),
        }
    }

    /// Installs a new state and exchange settings; `listener` from `prepare_listener`.
    pub fn apply(
        &self,
        state: GslbState,
        config: &fulcrum_config::Config,
        listener: Option<std::net::TcpListener>,
        local_pools: Vec<Arc<Pool>>,
        local_services: Vec<LocalService>,
    ) {
        let sh = &self.shared;
        sh.local_pools.store(Arc::new(local_pools));
        *sh.own_services.lock() = local_services.iter().map(sample_service).collect();
        sh.local_services.store(Arc::new(local_services));
        sh.keys.store(Arc::new(exchange::keys(&config.gslb.keys)));
        let xc = exchange_config(config);
        sh.config.store(Arc::new(xc.clone()));
        state.proximity.set_config(&config.gslb.proximity);
        state.proximity.retain_sites(
            &state
                .sites
                .iter()
                .map(|s| s.name.clone())
                .collect::<Vec<_>>(),
        );
        sh.state.store(Arc::new(state));
        // Reports from sites that no longer exist go.
        let names: Vec<String> = config.gslb.sites.iter().map(|s| s.name.clone()).collect();
        sh.received.lock().retain(|k, _| names.contains(k));
        sh.peers
            .lock()
            .retain(|k, _| xc.peers.iter().any(|(s, _)| s == k));
        refresh_learnt(sh);
        recompute(sh);

        let mut tasks = self.tasks.lock();
        match (xc.listen, listener) {
            (Some(a), Some(l)) => {
                let _g = self.handle.enter();
                match TcpListener::from_std(l) {
                    Ok(l) => {
                        if let Some((_, old)) = tasks.listener.take() {
                            old.abort();
                        }
                        tasks.listener = Some((a, self.handle.spawn(accept(l, sh.clone()))));
                        tracing::info!(addr = %a, "gslb site state exchange listening");
                    }
                    Err(e) => tracing::error!(error = %e, "cannot serve the gslb exchange"),
                }
            }
            (None, _) => {
                if let Some((_, old)) = tasks.listener.take() {
                    old.abort();
                }
            }
            _ => {}
        }
        tasks.dialers.retain(|k, t| {
            let keep = xc.peers.contains(k);
            if !keep {
                t.abort();
            }
            keep
        });
        for p in &xc.peers {
            if !tasks.dialers.contains_key(p) {
                let t = self.handle.spawn(dial(sh.clone(), p.0.clone(), p.1));
                tasks.dialers.insert(p.clone(), t);
            }
        }
    }

    pub fn shutdown(&self) {
        let mut t = self.tasks.lock();
        *t = Tasks::default();
    }

    /// The best site of `fqdn` for `client` other than this instance's own site: where an HTTP
    /// service sends a client (302) that it cannot serve itself — the site's `redirect_host` if
    /// it has one, else an address of it (of the client's family preferably).
    pub fn best_other_site(&self, fqdn: &str, client: IpAddr) -> Option<RedirectTarget> {
        let st = self.state();
        let wire = crate::zone::parse_name(fqdn).ok()?;
        let ni = st.name_index(&wire)?;
        let c = st.client(client, None);
        let mut found = None;
        for v6 in [client.is_ipv6(), !client.is_ipv6()] {
            st.select(ni, &c, v6, st.local_site, &mut |ip| {
                if found.is_none() {
                    found = Some(ip);
                }
            });
            if found.is_some() {
                break;
            }
        }
        let ip = found?;
        // The site that owns the chosen address names the host to keep the client's name on.
        let host = st
            .site_of(ni, ip)
            .and_then(|s| st.sites[s].redirect_host.clone());
        Some(match host {
            Some(h) => RedirectTarget::Host(h),
            None => RedirectTarget::Address(ip),
        })
    }

    /// Peers as the API shows them.
    pub fn peers(&self) -> Vec<PeerStatus> {
        let sh = &self.shared;
        let stale_after = sh.config.load().stale_after;
        let received = sh.received.lock();
        let mut out: Vec<PeerStatus> = sh.peers.lock().values().cloned().collect();
        for p in &mut out {
            if let Some(r) = received.get(&p.site) {
                p.last_report_age_ms = Some(r.at.elapsed().as_millis() as u64);
                p.stale = r.at.elapsed() >= stale_after;
            } else {
                p.stale = true;
            }
        }
        out
    }

    /// Sets the operator's state of a site (API); false if there is no such site.
    pub fn set_site_state(&self, site: &str, state: fulcrum_config::AdminState) -> bool {
        let st = self.state();
        match st.sites.iter().find(|s| *s.name == *site) {
            Some(s) => {
                s.set_admin_state(state);
                recompute(&self.shared);
                true
            }
            None => false,
        }
    }

    /// Inbound link load balancing: whether `site`'s link can take it; the distribution table is
    /// recomputed when that changes. False for an unknown site.
    pub fn set_site_link_ok(&self, site: &str, ok: bool) -> bool {
        let st = self.state();
        match st.sites.iter().find(|s| *s.name == *site) {
            Some(s) => {
                if s.set_link_ok(ok) {
                    tracing::info!(site, link_ok = ok, "gslb site's link changed");
                    recompute(&self.shared);
                }
                true
            }
            None => false,
        }
    }

    pub fn auth_failures(&self) -> u64 {
        self.shared.auth_failures.load(Ordering::Relaxed)
    }

    /// Exchange connections closed at accept because too many were not authenticated yet.
    pub fn unauthenticated_refused(&self) -> u64 {
        self.shared.unauthenticated_refused.load(Ordering::Relaxed)
    }

    pub fn reports_received(&self) -> u64 {
        self.shared.reports_received.load(Ordering::Relaxed)
    }

    /// `GET /api/v1/gslb/sites`: every site, its addresses' health and the table's factors.
    pub fn sites_json(&self, member: &dyn Fn(&fulcrum_balance::Member) -> Value) -> Value {
        let st = self.state();
        let table = st.table.load();
        let sites: Vec<Value> = st
            .sites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let addrs: Vec<Value> = s
                    .addresses
                    .iter()
                    .enumerate()
                    .map(|(k, a)| {
                        let m = s.pool.as_ref().and_then(|p| p.members().get(k));
                        json!({
                            "address": a.to_string(),
                            "health": if s.address_up(k) { "up" } else { "down" },
                            "check_ms": m.map(|m| (m.stats.check_time_us() / 10.0).round() / 100.0),
                            "member": m.map(|m| member(m)),
                        })
                    })
                    .collect();
                json!({
                    "name": &*s.name,
                    "health": if st.site_up(i) { "up" } else { "down" },
                    "state": s.admin_state().to_string(),
                    "local": st.local_site == Some(i),
                    "weight": s.weight,
                    "regions": s.regions.iter().filter_map(|r| st.locator.names().get(*r as usize)).collect::<Vec<_>>(),
                    "addresses": addrs,
                    "learnt": st.learnt_of_site(i).iter().map(|(ni, a)| json!({
                        "name": st.names[*ni].text,
                        "address": a.address.to_string(),
                        "service": &*a.service,
                        "health": if a.up { "up" } else { "down" },
                    })).collect::<Vec<_>>(),
                    "factors": table.factors.get(i),
                })
            })
            .collect();
        json!({ "sites": sites })
    }

    /// `GET /api/v1/gslb/names`: every name with its shares per region.
    pub fn names_json(&self) -> Value {
        let st = self.state();
        let table = st.table.load();
        let names: Vec<Value> = st
            .names
            .iter()
            .map(|n| {
                json!({
                    "fqdn": n.text,
                    "algorithm": n.algorithm.to_string(),
                    "fallback": n.fallback.to_string(),
                    "ttl": n.ttl,
                    "answers": n.answers,
                    "sites": n.sites.iter().map(|&s| st.sites[s].name.to_string()).collect::<Vec<_>>(),
                    "queries": n.queries.load(Ordering::Relaxed),
                    "fallbacks": n.fallbacks.load(Ordering::Relaxed),
                    "shares": table.shares.get(&n.text),
                })
            })
            .collect();
        json!({ "names": names })
    }

    /// `GET /api/v1/gslb/proximity`: the RTT cache and probe counters of `algorithm =
    /// "proximity"`.
    pub fn proximity_json(&self) -> Value {
        let st = self.state();
        let px = &st.proximity;
        let c = &px.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (cached, in_flight) = px.cached();
        json!({
            "prefixes": cached,
            "probes_in_flight": in_flight,
            "probes_sent": n(&c.probes_sent),
            "probes_unreachable": n(&c.probes_unreachable),
            "probes_dropped": n(&c.probes_dropped),
            "evictions": n(&c.evictions),
            "requests_received": n(&c.requests_received),
            "asked_again": n(&c.asked_again),
            "share_dropped": n(&c.share_dropped),
            "warm_answers": n(&c.warm_answers),
            "cold_answers": n(&c.cold_answers),
        })
    }

    /// `GET /api/v1/gslb/table`: the distribution table and the reports it came from.
    pub fn table_json(&self) -> Value {
        let st = self.state();
        let table = st.table.load();
        let received = self.shared.received.lock();
        let reports: BTreeMap<&String, &Report> =
            received.iter().map(|(k, v)| (k, &v.report)).collect();
        json!({
            "local_site": st.local_site.map(|i| st.sites[i].name.to_string()),
            "reporters": table.reporters,
            "factors": table.factors,
            "shares": table.shares,
            "own_report": self.shared.own.borrow().as_deref().cloned(),
            "peer_reports": reports,
        })
    }
}

fn exchange_config(c: &fulcrum_config::Config) -> ExchangeConfig {
    let g = &c.gslb;
    let local = g.local_site.clone();
    let local_peer = local
        .as_deref()
        .and_then(|l| g.site(l))
        .and_then(|s| s.peer);
    let peers = match &local {
        Some(l) => g
            .sites
            .iter()
            .filter(|s| s.name != *l)
            .filter_map(|s| Some((s.name.clone(), s.peer?)))
            .collect(),
        None => Vec::new(),
    };
    ExchangeConfig {
        listen: local.as_ref().and(g.listen.or(local_peer)),
        local,
        peers,
        interval: g.interval,
        stale_after: g.stale_after,
    }
}

/// Rebuilds the learnt addresses from this instance's services (its own site) and the peers'
/// reports (theirs; down once stale); stored only when something changed.
fn refresh_learnt(sh: &Shared) {
    let st = sh.state.load();
    let xc = sh.config.load();
    let own = sh.own_services.lock().clone();
    let received = sh.received.lock();
    let local = xc.local.as_deref().filter(|_| st.local_site.is_some());
    let sources = local.map(|l| (l, own.as_slice(), true)).into_iter().chain(
        received
            .iter()
            .filter(|(k, _)| Some(k.as_str()) != local)
            .map(|(k, r)| {
                (
                    k.as_str(),
                    r.report.services.as_slice(),
                    r.at.elapsed() < xc.stale_after,
                )
            }),
    );
    let table = LearntTable::build(&st.name_sites(), sources);
    if **st.learnt.load() != table {
        st.learnt.store(Arc::new(table));
    }
    st.proximity.set_reporting(
        received
            .iter()
            .filter(|(k, r)| Some(k.as_str()) != local && r.at.elapsed() < xc.stale_after)
            .map(|(k, _)| Arc::from(k.as_str()))
            .collect(),
    );
}

/// Recomputes the table from the fresh reports and this instance's own view.
fn recompute(sh: &Shared) {
    let st = sh.state.load();
    let stale_after = sh.config.load().stale_after;
    let mut reports: BTreeMap<String, Report> = sh
        .received
        .lock()
        .iter()
        .filter(|(_, r)| r.at.elapsed() < stale_after)
        .map(|(k, r)| (k.clone(), r.report.clone()))
        .collect();
    match sh.own.borrow().as_ref() {
        Some(own) if st.local_site.is_some() => {
            reports.insert(own.instance.clone(), (**own).clone());
        }
        _ => {
            reports.insert(String::new(), st.anonymous_view());
        }
    }
    st.apply_table(&reports);
}

/// Busy fraction of the host's CPUs since the previous call.
struct CpuSampler {
    last: Option<(u64, u64)>,
}

impl CpuSampler {
    fn sample(&mut self) -> Option<f64> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let line = text.lines().next()?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let total: u64 = v.iter().sum();
        let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
        let prev = self.last.replace((total, idle));
        let (t0, i0) = prev?;
        let dt = total.saturating_sub(t0);
        (dt > 0).then(|| (1.0 - idle.saturating_sub(i0) as f64 / dt as f64).clamp(0.0, 1.0))
    }
}

/// Samples this instance's view; publishes a report at each interval and at once when a site's
/// health changes; recomputes the table.
async fn sample(sh: Arc<Shared>) {
    let mut cpu = CpuSampler { last: None };
    let mut cpu_value = None;
    let mut last_cpu = Instant::now() - Duration::from_secs(10);
    let mut last_publish = Instant::now() - Duration::from_secs(3600);
    let mut last_health: Vec<(bool, u32)> = Vec::new();
    let mut last_shares = Default::default();
    let mut last_recompute = Instant::now() - Duration::from_secs(3600);
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let st = sh.state.load_full();
        let xc = sh.config.load_full();
        if last_cpu.elapsed() >= Duration::from_secs(1) {
            cpu_value = cpu.sample().map(|c| (c * 1000.0).round() / 1000.0);
            last_cpu = Instant::now();
        }
        let services: Vec<LearntService> = sh
            .local_services
            .load()
            .iter()
            .map(sample_service)
            .collect();
        let services_changed = {
            let mut own = sh.own_services.lock();
            let changed = !same_services(&own, &services);
            *own = services.clone();
            changed
        };
        refresh_learnt(&sh);
        let health: Vec<(bool, u32)> = st
            .sites
            .iter()
            .map(|s| (s.is_up(), s.addresses_up()))
            .collect();
        // New RTTs or probe requests go out at once (every tick at most).
        let shares = st.proximity.to_share();
        let proximity_changed = shares != last_shares;
        last_shares = shares;
        let changed = health != last_health || services_changed;
        let publish_now = changed || proximity_changed;
        if publish_now || last_publish.elapsed() >= xc.interval {
            let figures = local_figures(&sh.local_pools.load(), cpu_value);
            let version = sh.version.fetch_add(1, Ordering::Relaxed) + 1;
            let report = st.local_report(version, figures, services).map(Arc::new);
            sh.own.send_replace(report);
            last_publish = Instant::now();
            if changed && !last_health.is_empty() {
                tracing::debug!("site health changed; report sent to peers at once");
            }
            last_health = health;
        }
        if changed || last_recompute.elapsed() >= Duration::from_millis(500) {
            recompute(&sh);
            last_recompute = Instant::now();
        }
    }
}

/// What this instance's report says of one of its services with `gslb` now.
fn sample_service(s: &LocalService) -> LearntService {
    s.sample(local_figures(&s.pools, None).capacity)
}

/// Whether two samples of the local services differ in what peers answer from: which addresses
/// each name has and whether they are up (capacity alone travels with the periodic report).
fn same_services(a: &[LearntService], b: &[LearntService]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.name == y.name && x.addresses == y.addresses && x.up == y.up)
}

fn set_peer(sh: &Shared, site: &str, addr: SocketAddr, f: impl FnOnce(&mut PeerStatus)) {
    let mut peers = sh.peers.lock();
    let p = peers.entry(site.to_string()).or_insert_with(|| PeerStatus {
        site: site.to_string(),
        address: addr.to_string(),
        ..PeerStatus::default()
    });
    p.address = addr.to_string();
    f(p);
}

/// Keeps a connection to one peer and pushes our reports over it.
async fn dial(sh: Arc<Shared>, site: String, addr: SocketAddr) {
    set_peer(&sh, &site, addr, |_| {});
    loop {
        let err = match push(&sh, &site, addr).await {
            Ok(()) => "closed by the peer".to_string(),
            Err(e) => e,
        };
        set_peer(&sh, &site, addr, |p| {
            if p.connected || p.last_error.as_deref() != Some(&err) {
                tracing::info!(peer = %site, %addr, error = %err, "gslb peer connection lost");
            }
            p.connected = false;
            p.last_error = Some(err);
        });
        tokio::time::sleep(RETRY_EVERY).await;
    }
}

async fn push(sh: &Shared, site: &str, addr: SocketAddr) -> Result<(), String> {
    let mut s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| "connect: timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    let _ = s.set_nodelay(true);
    let mut hello = [0u8; 4 + NONCE_LEN];
    tokio::time::timeout(CONNECT_TIMEOUT, s.read_exact(&mut hello))
        .await
        .map_err(|_| "no challenge from the peer".to_string())?
        .map_err(|e| format!("reading the challenge: {e}"))?;
    if &hello[..4] != MAGIC {
        return Err("the peer does not speak the gslb exchange".into());
    }
    let nonce = hello[4..].to_vec();
    set_peer(sh, site, addr, |p| {
        p.connected = true;
        p.last_error = None;
    });
    tracing::info!(peer = %site, %addr, "gslb peer connected");
    let mut rx = sh.own.subscribe();
    let mut seq = 0u64;
    let mut read_probe = [0u8; 1];
    loop {
        let report = rx.borrow_and_update().clone();
        if let Some(r) = report {
            let keys = sh.keys.load();
            let Some(key) = keys.first() else {
                return Err("no key configured".into());
            };
            seq += 1;
            let frame = exchange::encode_frame(key, &nonce, seq, &r);
            tokio::time::timeout(CONNECT_TIMEOUT, s.write_all(&frame))
                .await
                .map_err(|_| "write: timed out".to_string())?
                .map_err(|e| format!("write: {e}"))?;
            set_peer(sh, site, addr, |p| p.reports_sent += 1);
        }
        let interval = sh.config.load().interval;
        tokio::select! {
            r = rx.changed() => { if r.is_err() { return Ok(()); } }
            _ = tokio::time::sleep(interval) => {}
            // The acceptor never writes after its challenge: a readable socket means it closed
            // (e.g. it refused our key).
            r = s.read(&mut read_probe) => {
                return match r {
                    Ok(0) | Err(_) => Err("the peer closed the connection (a key mismatch is logged there)".into()),
                    Ok(_) => Err("unexpected data from the peer".into()),
                };
            }
        }
    }
}

/// Accepts peers' connections and records their reports.
async fn accept(l: TcpListener, sh: Arc<Shared>) {
    let admission = fulcrum_frame::Admission::new();
    loop {
        let (s, from) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "gslb exchange accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(pending) = admission.admit(from.ip()) else {
            sh.unauthenticated_refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%from, "gslb exchange: too many unauthenticated connections; closed");
            drop(s);
            continue;
        };
        let sh = sh.clone();
        tokio::spawn(async move {
            if let Err(e) = receive(&sh, s, pending).await {
                tracing::warn!(%from, error = %e, "gslb peer connection refused");
            }
        });
    }
}

async fn receive(
    sh: &Shared,
    mut s: TcpStream,
    mut pending: fulcrum_frame::Pending,
) -> Result<(), String> {
    let mut nonce = [0u8; NONCE_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
        .map_err(|_| "no randomness for the challenge".to_string())?;
    let mut hello = Vec::with_capacity(4 + NONCE_LEN);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&nonce);
    s.write_all(&hello).await.map_err(|e| e.to_string())?;
    let mut last_seq = 0;
    let mut body = Vec::new();
    loop {
        // A peer reports at least every interval; twice stale_after of silence ends the stream.
        // Its first frame comes at once (it dials to report).
        let mut idle = sh.config.load().stale_after * 2;
        if pending.waiting() {
            idle = idle.min(fulcrum_frame::FIRST_FRAME_TIMEOUT);
        }
        // An Arc rather than a guard: the read may wait for many seconds.
        let keys = sh.keys.load_full();
        let (seq, report) =
            match exchange::read_report(&mut s, &keys, &nonce, last_seq, &mut body, idle).await {
                Ok(Some(x)) => x,
                Ok(None) => return Ok(()),
                Err(FrameError::TimedOut) => {
                    return Err("no report within twice stale_after".into())
                }
                Err(e) => {
                    if e == FrameError::BadTag {
                        sh.auth_failures.fetch_add(1, Ordering::Relaxed);
                    }
                    return Err(e.to_string());
                }
            };
        last_seq = seq;
        pending.authenticated();
        let xc = sh.config.load();
        if Some(&report.instance) == xc.local.as_ref()
            || !sh
                .state
                .load()
                .sites
                .iter()
                .any(|x| *x.name == report.instance)
        {
            return Err(format!(
                "report from {:?}, which is not another configured site",
                report.instance
            ));
        }
        sh.reports_received.fetch_add(1, Ordering::Relaxed);
        let site = report.instance.clone();
        sh.state
            .load()
            .proximity
            .received(&site, &report.rtt, &report.probe);
        {
            let mut peers = sh.peers.lock();
            if let Some(p) = peers.get_mut(&site) {
                p.reports_received += 1;
            }
        }
        let changed = {
            let mut rec = sh.received.lock();
            let before = rec
                .get(&site)
                .map(|r| r.report.sites.iter().map(|v| v.up).collect::<Vec<_>>());
            let now: Vec<bool> = report.sites.iter().map(|v| v.up).collect();
            rec.insert(
                site,
                Received {
                    report,
                    at: Instant::now(),
                },
            );
            before.as_ref() != Some(&now)
        };
        // The peer's learnt addresses are answered from now on (cheap: stored only if changed).
        refresh_learnt(sh);
        if changed {
            recompute(sh);
        }
    }
}

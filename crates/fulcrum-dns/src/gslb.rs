//! GSLB names and sites: which addresses a name answers for a client.
//!
//! A site is a `fulcrum_balance::Member` of a pool per name (and per client region where the
//! algorithm depends on it), so round robin, weighted, first available and hash come from the
//! one scheduler library; topology is a region filter in front of it, and least_load and
//! fastest_response are weighted round robin over the distribution table's shares.
//!
//! Site health comes from a second kind of pool: each site's addresses are members of a pool
//! checked by the site's monitor at the monitor's port, so `HealthService::apply` checks them
//! like any other member. A site is up for a family (A or AAAA) while one of its addresses of
//! that family is up; down sites and addresses are never answered while one is up. When every
//! site of a name is down, the name answers as if all were up: a GSLB that answers nothing takes
//! the service down for certain, while the monitors may be the ones that are wrong.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use fulcrum_balance::{hash::hash_ip, CheckSpec, PickContext, Pool};
use fulcrum_config::{AdminState, Algorithm, GslbAlgorithm};
use serde::Serialize;

use crate::iptable::{Locator, Region};
use crate::learnt::{LearntAddress, LearntTable};
use crate::proximity::{self, Proximity, SiteRtt};
use crate::table::{self, LearntService, Report, SiteFactors, SiteView, TableSite};

/// Sites one name may list (the per-query exclusion list lives on the stack).
pub const MAX_SITES: usize = 64;
/// Addresses one answer may carry.
pub const MAX_ANSWERS: u32 = 32;

/// A data centre: addresses answered for it and the pool that checks them.
pub struct Site {
    pub name: Arc<str>,
    pub addresses: Vec<IpAddr>,
    /// ip_table indices of the clients that prefer this site.
    pub regions: Vec<u16>,
    pub weight: u32,
    /// `host[:port]` the HTTP redirect fallback sends clients to, instead of an address.
    pub redirect_host: Option<Arc<str>>,
    /// The site's addresses as members, checked by its monitor; None without a monitor.
    pub pool: Option<Arc<Pool>>,
    cursor: AtomicUsize,
    /// The operator's state (API): a site not enabled gets no answers, even when every other
    /// site is down. Kept across reloads.
    admin: AtomicU8,
    /// Whether the link the site is tied to (`link`) is up and not busy; true without one.
    link_ok: std::sync::atomic::AtomicBool,
}

impl Site {
    pub fn admin_state(&self) -> AdminState {
        match self.admin.load(Ordering::Relaxed) {
            0 => AdminState::Enabled,
            1 => AdminState::Drain,
            _ => AdminState::Disabled,
        }
    }

    pub fn set_admin_state(&self, s: AdminState) {
        let v = match s {
            AdminState::Enabled => 0,
            AdminState::Drain => 1,
            AdminState::Disabled => 2,
        };
        if self.admin.swap(v, Ordering::Relaxed) != v {
            tracing::info!(site = %self.name, state = %s, "gslb site state changed");
        }
    }

    fn answerable(&self) -> bool {
        self.admin.load(Ordering::Relaxed) == 0
    }

    /// Sets whether the site's link can take it (inbound link load balancing); true when it
    /// changed.
    pub fn set_link_ok(&self, ok: bool) -> bool {
        self.link_ok.swap(ok, Ordering::Relaxed) != ok
    }

    /// Whether address `i` may be answered: up, not disabled by the operator, and its link (if
    /// the site has one) up and not busy.
    pub fn address_up(&self, i: usize) -> bool {
        if !self.link_ok.load(Ordering::Relaxed) {
            return false;
        }
        match &self.pool {
            None => true,
            Some(p) => p
                .members()
                .get(i)
                .is_some_and(|m| m.health.is_up() && m.effective_state() != AdminState::Disabled),
        }
    }

    fn has_family(&self, v6: bool) -> bool {
        self.addresses.iter().any(|a| a.is_ipv6() == v6)
    }

    fn up_for(&self, v6: bool) -> bool {
        self.addresses
            .iter()
            .enumerate()
            .any(|(i, a)| a.is_ipv6() == v6 && self.address_up(i))
    }

    /// Up for either family.
    pub fn is_up(&self) -> bool {
        (0..self.addresses.len()).any(|i| self.address_up(i))
    }

    pub fn addresses_up(&self) -> u32 {
        (0..self.addresses.len())
            .filter(|&i| self.address_up(i))
            .count() as u32
    }

    /// Mean duration of the passing checks of its addresses, in ms.
    pub fn check_ms(&self) -> Option<f64> {
        let p = self.pool.as_ref()?;
        let t: Vec<f64> = p
            .members()
            .iter()
            .map(|m| m.stats.check_time_us())
            .filter(|t| *t > 0.0)
            .collect();
        (!t.is_empty()).then(|| t.iter().sum::<f64>() / t.len() as f64 / 1000.0)
    }

    /// Emits up to `max` of its addresses of the family and of the `learnt` ones (the name's
    /// for this site), rotating; only healthy ones unless `all`.
    fn emit(
        &self,
        v6: bool,
        all: bool,
        max: u32,
        learnt: &[LearntAddress],
        out: &mut dyn FnMut(IpAddr),
    ) -> u32 {
        let own = self.addresses.len();
        let n = own + learnt.len();
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        let mut emitted = 0;
        for k in 0..n {
            if emitted == max {
                break;
            }
            let i = (start + k) % n;
            let (a, up) = match learnt.get(i.wrapping_sub(own)) {
                Some(l) if i >= own => (l.address, l.up),
                _ => (self.addresses[i], all || self.address_up(i)),
            };
            if a.is_ipv6() == v6 && (all || up) {
                out(a);
                emitted += 1;
            }
        }
        emitted
    }
}

/// A name answered by GSLB.
pub struct Name {
    /// Lower-case wire form.
    pub fqdn: Vec<u8>,
    pub text: String,
    /// Indices into `GslbState::sites`, in the name's order.
    pub sites: Vec<usize>,
    pub algorithm: GslbAlgorithm,
    pub fallback: GslbAlgorithm,
    pub ttl: u32,
    pub answers: u32,
    /// Whether the choice depends on the client's region (one pool per region slot).
    region_dependent: bool,
    /// Slot 0: clients in no table; slot t + 1: clients in ip_table t.
    pools: Vec<Arc<Pool>>,
    fallback_pool: Arc<Pool>,
    /// Answers per (region slot, site): `slot * sites.len() + k`.
    answers_by: Vec<AtomicU64>,
    pub queries: AtomicU64,
    /// Queries answered by the fallback algorithm.
    pub fallbacks: AtomicU64,
}

/// A client as GSLB sees it.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    /// The EDNS Client Subnet address, else the resolver's.
    pub ip: IpAddr,
    pub region: Option<Region>,
    /// ECS source prefix length, when the address came from ECS.
    pub source_prefix: Option<u8>,
}

/// The shares last computed, for the API.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TableView {
    pub factors: Vec<SiteFactors>,
    /// name → region ("*" for clients in no table) → site → share.
    pub shares: BTreeMap<String, BTreeMap<String, BTreeMap<String, f64>>>,
    /// Instances whose reports went into the table.
    pub reporters: Vec<String>,
}

/// Everything GSLB answers from, rebuilt on reload (members keep their state).
pub struct GslbState {
    pub sites: Vec<Site>,
    pub names: Vec<Name>,
    pub locator: Arc<Locator>,
    pub local_site: Option<usize>,
    pub table: ArcSwap<TableView>,
    /// Addresses learnt from virtual services with `gslb` (this instance's and the peers').
    pub learnt: ArcSwap<LearntTable>,
    /// RTTs of `algorithm = "proximity"`: one for the process, carried across reloads.
    pub proximity: Arc<Proximity>,
}

fn site_pool_name(site: &str) -> String {
    format!("gslb-site:{site}")
}

/// A stable placeholder address for site `k` as a member of a name's pool (the scheduler keys
/// members by address; a site has several, or none of one family).
fn site_member_addr(k: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, k as u16)),
        0,
    )
}

fn pool_algorithm(a: GslbAlgorithm) -> Algorithm {
    match a {
        GslbAlgorithm::RoundRobin | GslbAlgorithm::Proximity => Algorithm::RoundRobin,
        GslbAlgorithm::FirstAvailable => Algorithm::FirstAvailable,
        GslbAlgorithm::Hash => Algorithm::Hash,
        GslbAlgorithm::Weighted
        | GslbAlgorithm::LeastLoad
        | GslbAlgorithm::FastestResponse
        | GslbAlgorithm::Topology => Algorithm::WeightedRoundRobin,
    }
}

/// Whether the algorithm's weights come from the distribution table.
fn table_driven(a: GslbAlgorithm) -> bool {
    matches!(
        a,
        GslbAlgorithm::Weighted
            | GslbAlgorithm::LeastLoad
            | GslbAlgorithm::FastestResponse
            | GslbAlgorithm::Topology
    )
}

fn region_dependent(a: GslbAlgorithm) -> bool {
    matches!(a, GslbAlgorithm::FastestResponse | GslbAlgorithm::Topology)
}

/// The monitor port a site's addresses are probed at.
fn probe_port(m: &fulcrum_config::Monitor) -> u16 {
    m.port
        .or_else(|| fulcrum_config::site_monitor_port(m.kind))
        .unwrap_or(80)
}

/// Lower-case wire form of a configured fqdn (validated to parse).
fn fqdn_wire(s: &str) -> Vec<u8> {
    crate::zone::parse_name(s).unwrap_or_else(|_| vec![0])
}

/// A pool configuration for the scheduler library: GSLB's pools are built in code, not read,
/// so everything but what a site or name decides is the library's plain default.
fn scheduler_pool_config(
    name: String,
    algorithm: Algorithm,
    monitors: Vec<String>,
    connect_timeout: std::time::Duration,
    members: Vec<fulcrum_config::Member>,
) -> fulcrum_config::Pool {
    fulcrum_config::Pool {
        name,
        algorithm,
        hash_key: fulcrum_config::HashKey::SourceIp,
        monitors,
        slow_start: None,
        min_active: 1,
        retries: 0,
        connect_timeout,
        zero_window_timeout: None,
        members,
        reuse: fulcrum_config::Reuse::Safe,
        tls: None,
        http: Default::default(),
        kind: fulcrum_config::PoolKind::Server,
        links: vec![],
        gateways: vec![],
        busy: None,
        elastic: None,
        vrf: None,
    }
}

fn plain_member(address: SocketAddr, weight: u32) -> fulcrum_config::Member {
    fulcrum_config::Member {
        address,
        weight,
        priority: 0,
        max_connections: 0,
        standby: false,
        state: AdminState::Enabled,
    }
}

impl GslbState {
    /// Builds from the config; pools of `previous` are reused by name so health, counters and
    /// the state of members survive a reload.
    pub fn build(
        config: &fulcrum_config::Config,
        locator: Arc<Locator>,
        previous: Option<&GslbState>,
    ) -> GslbState {
        let g = &config.gslb;
        let sites: Vec<Site> = g
            .sites
            .iter()
            .map(|sc| Site::build(config, &locator, previous, sc))
            .collect();
        let slots = locator.names().len() + 1;
        let names = g
            .names
            .iter()
            .map(|nc| {
                let prev = previous.and_then(|p| p.names.iter().find(|n| n.text == nc.fqdn));
                Name::build(nc, &sites, slots, prev)
            })
            .collect();
        GslbState {
            local_site: g
                .local_site
                .as_deref()
                .and_then(|l| sites.iter().position(|s| *s.name == *l)),
            sites,
            names,
            locator,
            table: ArcSwap::from_pointee(TableView::default()),
            learnt: ArcSwap::from_pointee(LearntTable::default()),
            proximity: previous.map_or_else(Arc::default, |p| p.proximity.clone()),
        }
    }
}

impl Site {
    /// Site `sc`, keeping the health pool, link state and admin state of the site of the same
    /// name in `previous`.
    fn build(
        config: &fulcrum_config::Config,
        locator: &Locator,
        previous: Option<&GslbState>,
        sc: &fulcrum_config::Site,
    ) -> Site {
        let prev = previous.and_then(|p| p.sites.iter().find(|s| *s.name == sc.name));
        let monitor = sc.monitor.as_deref().and_then(|m| config.monitor(m));
        let pool = monitor.map(|m| Site::health_pool(sc, m, prev.and_then(|s| s.pool.as_deref())));
        Site {
            name: Arc::from(sc.name.as_str()),
            addresses: sc.addresses.clone(),
            regions: sc
                .regions
                .iter()
                .filter_map(|r| locator.names().iter().position(|n| n == r))
                .map(|i| i as u16)
                .collect(),
            weight: sc.weight,
            redirect_host: sc.redirect_host.as_deref().map(Arc::from),
            pool,
            cursor: AtomicUsize::new(0),
            link_ok: std::sync::atomic::AtomicBool::new(
                prev.is_none_or(|s| s.link_ok.load(Ordering::Relaxed)),
            ),
            admin: AtomicU8::new(prev.map_or(0, |s| s.admin.load(Ordering::Relaxed))),
        }
    }

    /// The site's addresses as members of a pool checked by monitor `m` at its probe port.
    fn health_pool(
        sc: &fulcrum_config::Site,
        m: &fulcrum_config::Monitor,
        prev: Option<&Pool>,
    ) -> Arc<Pool> {
        let members = sc
            .addresses
            .iter()
            .map(|a| plain_member(SocketAddr::new(*a, probe_port(m)), 1))
            .collect();
        let pc = scheduler_pool_config(
            site_pool_name(&sc.name),
            Algorithm::RoundRobin,
            vec![m.name.clone()],
            m.timeout,
            members,
        );
        let checks = [CheckSpec {
            monitor: m.name.clone(),
            rise: m.rise,
            fall: m.fall,
        }];
        Arc::new(Pool::new(&pc, &checks, prev))
    }
}

impl Name {
    /// Name `nc` over `sites`, with `slots` region slots; pools and counters of `prev` (the
    /// name of the same fqdn before a reload) carry over.
    fn build(
        nc: &fulcrum_config::GslbName,
        sites: &[Site],
        slots: usize,
        prev: Option<&Name>,
    ) -> Name {
        let idx: Vec<usize> = nc
            .sites
            .iter()
            .filter_map(|s| sites.iter().position(|x| *x.name == *s))
            .take(MAX_SITES)
            .collect();
        let rd = region_dependent(nc.algorithm);
        let pools: Vec<Arc<Pool>> = (0..if rd { slots } else { 1 })
            .map(|slot| {
                let pp = prev.and_then(|p| p.pools.get(slot)).map(|p| p.as_ref());
                Name::site_pool(nc, sites, &idx, nc.algorithm, &slot.to_string(), pp)
            })
            .collect();
        let fb = if nc.fallback == GslbAlgorithm::Topology {
            GslbAlgorithm::Weighted
        } else {
            nc.fallback
        };
        let fallback_pool = Name::site_pool(
            nc,
            sites,
            &idx,
            fb,
            "fallback",
            prev.map(|p| p.fallback_pool.as_ref()),
        );
        let answers_by = (0..slots * idx.len()).map(|_| AtomicU64::new(0)).collect();
        let n = Name {
            fqdn: fqdn_wire(&nc.fqdn),
            text: nc.fqdn.clone(),
            sites: idx,
            algorithm: nc.algorithm,
            fallback: nc.fallback,
            ttl: nc.ttl,
            answers: nc.answers.clamp(1, MAX_ANSWERS),
            region_dependent: rd,
            pools,
            fallback_pool,
            answers_by,
            queries: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
        };
        if let Some(p) = prev {
            n.carry_counters(p);
        }
        n
    }

    /// A pool whose members stand for the name's sites `idx` (placeholder addresses, labelled
    /// with the sites' names), scheduled by `alg`.
    fn site_pool(
        nc: &fulcrum_config::GslbName,
        sites: &[Site],
        idx: &[usize],
        alg: GslbAlgorithm,
        tag: &str,
        prev_pool: Option<&Pool>,
    ) -> Arc<Pool> {
        let members = idx
            .iter()
            .enumerate()
            .map(|(k, &s)| plain_member(site_member_addr(k), sites[s].weight))
            .collect();
        let pc = scheduler_pool_config(
            format!("gslb:{}:{tag}", nc.fqdn),
            pool_algorithm(alg),
            vec![],
            std::time::Duration::from_secs(1),
            members,
        );
        let labels: Vec<Arc<str>> = idx.iter().map(|&s| sites[s].name.clone()).collect();
        Arc::new(Pool::new_labeled(&pc, &[], prev_pool, &labels))
    }

    /// Counters carry over when the shape stays.
    fn carry_counters(&self, p: &Name) {
        if p.answers_by.len() == self.answers_by.len() && p.sites.len() == self.sites.len() {
            for (a, b) in self.answers_by.iter().zip(&p.answers_by) {
                a.store(b.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            self.queries
                .store(p.queries.load(Ordering::Relaxed), Ordering::Relaxed);
            self.fallbacks
                .store(p.fallbacks.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

impl GslbState {
    /// The pools of site addresses, for `HealthService::apply`.
    pub fn site_pools(&self) -> Vec<Arc<Pool>> {
        self.sites.iter().filter_map(|s| s.pool.clone()).collect()
    }

    pub fn name_index(&self, fqdn_wire: &[u8]) -> Option<usize> {
        self.names.iter().position(|n| n.fqdn == fqdn_wire)
    }

    /// Places a client.
    pub fn client(&self, ip: IpAddr, source_prefix: Option<u8>) -> Client {
        Client {
            ip,
            region: self.locator.locate(ip),
            source_prefix,
        }
    }

    /// Chooses the addresses of family `v6` that name `ni` answers for `client`, calling `out`
    /// for each; `skip` excludes a site (the local one, for HTTP redirects). Returns the ECS
    /// scope the choice depended on, or None when the name has no address of the family.
    pub fn select(
        &self,
        ni: usize,
        client: &Client,
        v6: bool,
        skip: Option<usize>,
        out: &mut dyn FnMut(IpAddr),
    ) -> Option<u8> {
        let n = &self.names[ni];
        n.queries.fetch_add(1, Ordering::Relaxed);
        let learnt = self.learnt.load();
        let count = n.sites.len();
        let mut down = [true; MAX_SITES];
        let mut any_family = false;
        let mut any_up = false;
        let of_family = |k: usize, s: usize| {
            self.sites[s].has_family(v6)
                || learnt.at(ni, k).iter().any(|a| a.address.is_ipv6() == v6)
        };
        for (k, &s) in n.sites.iter().enumerate() {
            let site = &self.sites[s];
            if Some(s) == skip || !of_family(k, s) || !site.answerable() {
                continue;
            }
            any_family = true;
            let learnt_up = learnt
                .at(ni, k)
                .iter()
                .any(|a| a.up && a.address.is_ipv6() == v6);
            if site.link_ok.load(Ordering::Relaxed) && (site.up_for(v6) || learnt_up) {
                down[k] = false;
                any_up = true;
            }
        }
        if !any_family {
            return None;
        }
        let fail_open = !any_up;
        if fail_open {
            for (k, &s) in n.sites.iter().enumerate() {
                let site = &self.sites[s];
                down[k] = Some(s) == skip || !of_family(k, s) || !site.answerable();
            }
        }
        let region_slot = client.region.map_or(0, |r| r.table as usize + 1);
        let slot = if n.region_dependent { region_slot } else { 0 };
        let preferred = |k: usize| {
            client
                .region
                .is_some_and(|r| self.sites[n.sites[k]].regions.contains(&r.table))
        };
        let has_preferred =
            n.algorithm == GslbAlgorithm::Topology && (0..count).any(|k| !down[k] && preferred(k));
        let mut ranking = Vec::new();
        let ranked = n.algorithm == GslbAlgorithm::Proximity
            && self.proximity_rank(ni, client.ip, &down[..count], &mut ranking);
        let ctx = PickContext {
            hash: Some(hash_ip(client.ip)),
        };
        let mut chosen = [0usize; MAX_SITES];
        let mut nchosen = 0;
        let mut emitted = 0;
        let mut used_fallback = false;
        let mut exclude = [0usize; MAX_SITES];
        while emitted < n.answers && nchosen < count {
            let mut ex = 0;
            for (k, &is_down) in down.iter().enumerate().take(count) {
                let out_of_play =
                    is_down || chosen[..nchosen].contains(&k) || (has_preferred && !preferred(k));
                if out_of_play {
                    exclude[ex] = k;
                    ex += 1;
                }
            }
            let primary = if n.algorithm == GslbAlgorithm::Proximity {
                ranking
                    .iter()
                    .find(|&&k| !exclude[..ex].contains(&k))
                    .map(|&k| fulcrum_balance::Picked {
                        index: k,
                        member: n.pools[0].members()[k].clone(),
                    })
            } else if n.algorithm == GslbAlgorithm::Topology && !has_preferred {
                None
            } else {
                n.pools[slot.min(n.pools.len() - 1)].pick(&ctx, &exclude[..ex])
            };
            let picked = match primary {
                Some(p) => Some(p.index),
                None => {
                    ex = 0;
                    for (k, &is_down) in down.iter().enumerate().take(count) {
                        if is_down || chosen[..nchosen].contains(&k) {
                            exclude[ex] = k;
                            ex += 1;
                        }
                    }
                    let fb = n.fallback_pool.pick(&ctx, &exclude[..ex]).map(|p| p.index);
                    used_fallback |= fb.is_some();
                    fb
                }
            };
            let Some(k) = picked else { break };
            chosen[nchosen] = k;
            nchosen += 1;
            let got = self.sites[n.sites[k]].emit(
                v6,
                fail_open,
                n.answers - emitted,
                learnt.at(ni, k),
                out,
            );
            if got > 0 {
                n.answers_by[region_slot * count + k].fetch_add(1, Ordering::Relaxed);
            }
            emitted += got;
        }
        if used_fallback {
            n.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        let source = client.source_prefix.unwrap_or(0);
        let scope = match n.algorithm {
            GslbAlgorithm::Topology | GslbAlgorithm::FastestResponse => match client.region {
                Some(r) => r.prefix_len.min(source),
                None => source,
            },
            GslbAlgorithm::Hash => source,
            GslbAlgorithm::Proximity if ranked => source.min(proximity::prefix_len(client.ip)),
            _ => 0,
        };
        Some(scope)
    }

    /// Orders the sites of proximity name `ni` for a client at `ip` (best first) into `out`;
    /// false while a site that can be measured has no measurement of the client's prefix yet
    /// (the fallback answers). Starts the probe of a new or old prefix.
    fn proximity_rank(&self, ni: usize, ip: IpAddr, down: &[bool], out: &mut Vec<usize>) -> bool {
        let n = &self.names[ni];
        let px = &self.proximity;
        px.touch(ip, true);
        let prefix = proximity::prefix_of(ip);
        let table = self.table.load();
        let mut rtts = [(SiteRtt::Unmeasurable, 0.0); MAX_SITES];
        for (k, &s) in n.sites.iter().enumerate() {
            let site = &self.sites[s];
            let measured = if down.get(k).copied().unwrap_or(true) {
                None
            } else if Some(s) == self.local_site {
                Some(px.local_rtt(prefix))
            } else if px.is_reporting(&site.name) {
                Some(px.remote_rtt(&site.name, prefix))
            } else {
                None
            };
            let rtt = match measured {
                None => SiteRtt::Unmeasurable,
                Some(None) => SiteRtt::Pending,
                Some(Some(ms)) => SiteRtt::Known(ms),
            };
            let capacity = table.factors.get(s).and_then(|f| f.capacity);
            rtts[k] = (rtt, 1.0 - capacity.unwrap_or(1.0).clamp(0.0, 1.0));
        }
        let ranked = proximity::rank(&rtts[..n.sites.len()], px.load_weight(), out);
        if ranked {
            px.counters.warm_answers.fetch_add(1, Ordering::Relaxed);
        } else {
            px.counters.cold_answers.fetch_add(1, Ordering::Relaxed);
            px.ask_again(ip);
        }
        ranked
    }

    /// The learnt addresses of site `s`, over every name that lists it.
    pub fn learnt_of_site(&self, s: usize) -> Vec<(usize, LearntAddress)> {
        let learnt = self.learnt.load();
        let mut out = Vec::new();
        for (ni, n) in self.names.iter().enumerate() {
            for (k, _) in n.sites.iter().enumerate().filter(|(_, &x)| x == s) {
                out.extend(learnt.at(ni, k).iter().map(|a| (ni, a.clone())));
            }
        }
        out
    }

    /// Whether site `s` is up: one of its own addresses, or of those it learnt, is up.
    pub fn site_up(&self, s: usize) -> bool {
        self.sites.get(s).is_some_and(|site| site.is_up())
            || self.learnt_of_site(s).iter().any(|(_, a)| a.up)
    }

    /// Every name with its lower-case fqdn and its sites' names, for `LearntTable::build`.
    pub fn name_sites(&self) -> Vec<(String, Vec<Arc<str>>)> {
        self.names
            .iter()
            .map(|n| {
                (
                    n.text.to_ascii_lowercase(),
                    n.sites
                        .iter()
                        .map(|&s| self.sites[s].name.clone())
                        .collect(),
                )
            })
            .collect()
    }

    /// The site answering `ip` for name `ni`: the one with that address of its own, else the
    /// one that learnt it.
    pub fn site_of(&self, ni: usize, ip: IpAddr) -> Option<usize> {
        if let Some(s) = self.sites.iter().position(|s| s.addresses.contains(&ip)) {
            return Some(s);
        }
        let learnt = self.learnt.load();
        let n = self.names.get(ni)?;
        n.sites
            .iter()
            .enumerate()
            .find(|(k, _)| learnt.at(ni, *k).iter().any(|a| a.address == ip))
            .map(|(_, &s)| s)
    }

    /// How this instance sees each site, in configuration order: its own addresses and those
    /// it learnt for the site.
    fn site_views(&self) -> impl Iterator<Item = SiteView> + '_ {
        self.sites.iter().enumerate().map(|(i, s)| {
            let learnt = self.learnt_of_site(i);
            let learnt_up = learnt.iter().filter(|(_, a)| a.up).count() as u32;
            SiteView {
                name: s.name.to_string(),
                up: s.is_up() || learnt_up > 0,
                addresses_up: s.addresses_up() + learnt_up,
                addresses: (s.addresses.len() + learnt.len()) as u32,
                check_ms: s.check_ms(),
            }
        })
    }

    /// This instance's view of every site, its own site's figures and its services with `gslb`.
    pub fn local_report(
        &self,
        version: u64,
        own: LocalFigures,
        services: Vec<LearntService>,
    ) -> Option<Report> {
        let (rtt, probe) = self.proximity.to_share();
        let local = self.local_site?;
        Some(Report {
            instance: self.sites[local].name.to_string(),
            version,
            sites: self
                .site_views()
                .map(|v| SiteView {
                    check_ms: v.check_ms.map(|ms| (ms * 1000.0).round() / 1000.0),
                    ..v
                })
                .collect(),
            capacity: own.capacity,
            cpu: own.cpu,
            response_ms: own.response_ms,
            services,
            rtt,
            probe,
        })
    }

    /// A report of what this instance sees when it has no local site (no exchange): used only
    /// to compute its own table.
    pub fn anonymous_view(&self) -> Report {
        Report {
            instance: String::new(),
            version: 0,
            sites: self.site_views().collect(),
            capacity: None,
            cpu: None,
            response_ms: None,
            services: Vec::new(),
            rtt: Vec::new(),
            probe: Vec::new(),
        }
    }

    /// Recomputes the distribution table from `reports` and sets the site members' weights of
    /// the table-driven names.
    pub fn apply_table(&self, reports: &BTreeMap<String, Report>) {
        let tsites: Vec<TableSite> = self
            .sites
            .iter()
            .map(|s| TableSite {
                name: s.name.to_string(),
                weight: s.weight,
                regions: s.regions.clone(),
            })
            .collect();
        let factors = table::factors(&tsites, reports);
        let mut view = TableView {
            factors: factors.clone(),
            shares: BTreeMap::new(),
            reporters: reports.keys().filter(|k| !k.is_empty()).cloned().collect(),
        };
        let region_names: Vec<String> = std::iter::once("*".to_string())
            .chain(self.locator.names().iter().cloned())
            .collect();
        for n in &self.names {
            let sub: Vec<TableSite> = n.sites.iter().map(|&s| tsites[s].clone()).collect();
            let subf: Vec<SiteFactors> = n.sites.iter().map(|&s| factors[s].clone()).collect();
            let mut by_region = BTreeMap::new();
            for (slot, rname) in region_names.iter().enumerate() {
                let region = slot.checked_sub(1).map(|t| t as u16);
                let shares = table::shares(n.algorithm, &sub, &subf, reports, region);
                if table_driven(n.algorithm) && (n.region_dependent || slot == 0) {
                    let pool = &n.pools[if n.region_dependent { slot } else { 0 }];
                    for (m, share) in pool.members().iter().zip(&shares) {
                        let w = (share * 1000.0).round() as u32;
                        m.set_weight(if *share > 0.0 { w.max(1) } else { 0 });
                    }
                    pool.refresh();
                }
                let row: BTreeMap<String, f64> = n
                    .sites
                    .iter()
                    .zip(&shares)
                    .map(|(&s, v)| {
                        (
                            self.sites[s].name.to_string(),
                            (v * 10000.0).round() / 10000.0,
                        )
                    })
                    .collect();
                by_region.insert(rname.clone(), row);
            }
            view.shares.insert(n.text.clone(), by_region);
        }
        self.table.store(Arc::new(view));
    }

    /// Region names by slot: "*" (no table) then the ip_tables.
    pub fn region_names(&self) -> Vec<String> {
        std::iter::once("*".to_string())
            .chain(self.locator.names().iter().cloned())
            .collect()
    }

    /// Answers given per (name, site, region), for metrics.
    pub fn answer_counts(&self) -> Vec<(String, String, String, u64)> {
        let regions = self.region_names();
        let mut out = Vec::new();
        for n in &self.names {
            let c = n.sites.len();
            for (slot, r) in regions.iter().enumerate() {
                for (k, &s) in n.sites.iter().enumerate() {
                    let v = n.answers_by[slot * c + k].load(Ordering::Relaxed);
                    if v > 0 {
                        out.push((n.text.clone(), self.sites[s].name.to_string(), r.clone(), v));
                    }
                }
            }
        }
        out
    }
}

/// This instance's own site figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalFigures {
    pub capacity: Option<f64>,
    pub cpu: Option<f64>,
    pub response_ms: Option<f64>,
}

/// Capacity left and response time of the local site, from the pools this instance serves:
/// with connection limits, 1 − active / limit over the limited members; otherwise the share of
/// members that can take a client.
pub fn local_figures(pools: &[Arc<Pool>], cpu: Option<f64>) -> LocalFigures {
    let mut limit = 0u64;
    let mut active = 0u64;
    let mut total = 0usize;
    let mut available = 0usize;
    let mut rt = Vec::new();
    for p in pools {
        for m in p.members() {
            total += 1;
            if m.accepts_new(0) {
                available += 1;
            }
            let max = u64::from(m.max_connections());
            if max > 0 {
                limit += max;
                active += m.stats.active_connections.load(Ordering::Relaxed).min(max);
            }
            let t = m.stats.response_time_us();
            if t > 0.0 {
                rt.push(t);
            }
        }
    }
    let capacity = if limit > 0 {
        Some(1.0 - active as f64 / limit as f64)
    } else if total > 0 {
        Some(available as f64 / total as f64)
    } else {
        None
    };
    LocalFigures {
        capacity: capacity.map(|c| (c * 1000.0).round() / 1000.0),
        cpu,
        response_ms: (!rt.is_empty()).then(|| {
            ((rt.iter().sum::<f64>() / rt.len() as f64) / 1000.0 * 1000.0).round() / 1000.0
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptable::GeoCache;

    fn state(algorithm: &str, extra: &str) -> GslbState {
        let text = format!(
            r#"
[[ip_table]]
name = "tel"
cidrs = ["198.51.100.0/24"]
[gslb]
local_site = "east"
{extra}
[[gslb.site]]
name = "east"
addresses = ["192.0.2.10", "192.0.2.11", "2001:db8::10"]
regions = ["tel"]
[[gslb.site]]
name = "west"
addresses = ["192.0.2.20"]
[[gslb.name]]
fqdn = "app.example.com."
sites = ["east", "west"]
algorithm = "{algorithm}"
answers = 2
"#
        );
        let config = fulcrum_config::parse(&text, "t.toml", std::path::Path::new(".")).unwrap();
        let locator = Locator::build(&config.ip_tables, &mut GeoCache::new()).unwrap();
        GslbState::build(&config, Arc::new(locator), None)
    }

    fn answer(
        st: &GslbState,
        client: &str,
        v6: bool,
        skip: Option<usize>,
    ) -> (Vec<IpAddr>, Option<u8>) {
        let mut out = Vec::new();
        let c = st.client(client.parse().unwrap(), Some(24));
        let scope = st.select(0, &c, v6, skip, &mut |ip| out.push(ip));
        (out, scope)
    }

    #[test]
    fn answers_fill_from_the_chosen_site_first_then_the_next() {
        let st = state("topology", "");
        let (a, scope) = answer(&st, "198.51.100.7", false, None);
        assert_eq!(a.len(), 2);
        assert!(
            a.iter().all(|ip| ip.to_string().starts_with("192.0.2.1")),
            "{a:?}"
        );
        assert_eq!(scope, Some(24));
        let (a, _) = answer(&st, "198.51.100.7", true, None);
        assert_eq!(
            a,
            ["2001:db8::10".parse::<IpAddr>().unwrap()],
            "only east has IPv6"
        );
        let st = state("round_robin", "");
        let (a, scope) = answer(&st, "203.0.113.1", false, Some(0));
        assert_eq!(
            a,
            ["192.0.2.20".parse::<IpAddr>().unwrap()],
            "skipping the local site"
        );
        assert_eq!(scope, Some(0));
        let (a, scope) = answer(&st, "203.0.113.1", true, Some(0));
        assert!(a.is_empty());
        assert_eq!(scope, None, "no address of the family: NODATA");
    }

    #[test]
    fn a_disabled_site_is_never_answered() {
        let st = state("first_available", "");
        st.sites[0].set_admin_state(AdminState::Disabled);
        for _ in 0..5 {
            let (a, _) = answer(&st, "198.51.100.7", false, None);
            assert_eq!(a, ["192.0.2.20".parse::<IpAddr>().unwrap()]);
        }
    }
}

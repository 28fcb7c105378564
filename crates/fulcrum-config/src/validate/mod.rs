//! Checks that need the whole config: references between sections, duplicates, shared listening
//! addresses, and which protocols use a pool or a persistence profile. What a single section can
//! check is checked where it is read. `links` and `messages` hold the cross-checks of those
//! sections, apart so that the sections themselves never need the whole `Config`.

mod links;
mod messages;
mod wildcards;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use crate::error::{did_you_mean, ConfigError};
use crate::monitor::MonitorKind;
use crate::persistence::PersistenceKind;
use crate::protocol::Protocol;
use crate::rule::RuleAction;
use crate::schema::Config;
use crate::service::VirtualService;
use crate::Locations;

struct Checker<'a> {
    loc: &'a Locations,
    errors: Vec<ConfigError>,
    /// Sections in which an element failed to parse: references into them are not reported,
    /// since the target may be the element that failed.
    broken: &'a HashSet<String>,
}

impl Checker<'_> {
    fn err(&mut self, path: &str, msg: impl Into<String>) {
        self.errors.push(self.loc.error(path, msg));
    }

    /// Reports a reference to a name that does not exist, suggesting the closest one.
    fn reference<'n>(
        &mut self,
        path: &str,
        what: &str,
        section: &str,
        name: &str,
        known: impl Iterator<Item = &'n str> + Clone,
    ) {
        if known.clone().any(|k| k == name) || self.broken.contains(section) {
            return;
        }
        let hint = match did_you_mean(name, known.clone()) {
            Some(s) => format!(" (did you mean {s:?}?)"),
            None => {
                let all: Vec<&str> = known.collect();
                if all.is_empty() {
                    format!("; no {what} is defined")
                } else {
                    format!("; defined: {}", all.join(", "))
                }
            }
        };
        self.err(path, format!("no {what} named {name:?}{hint}"));
    }

    fn unique<'n>(&mut self, section: &str, names: impl Iterator<Item = &'n str>, key: &str) {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, n) in names.enumerate() {
            if let Some(first) = seen.insert(n, i) {
                self.err(
                    &format!("{section}[{i}].{key}"),
                    format!("duplicate {key} {n:?}: already used by {section}[{first}]"),
                );
            }
        }
    }
}

/// The port a site monitor probes when it names none: the well-known port of its kind, if it
/// has one (a site's addresses carry no port).
pub fn site_monitor_port(kind: MonitorKind) -> Option<u16> {
    match kind {
        MonitorKind::Http => Some(80),
        MonitorKind::Https => Some(443),
        MonitorKind::Dns => Some(53),
        MonitorKind::Radius => Some(1812),
        MonitorKind::Smtp => Some(25),
        MonitorKind::Pop3 => Some(110),
        MonitorKind::Imap => Some(143),
        MonitorKind::Ftp => Some(21),
        MonitorKind::Nntp => Some(119),
        MonitorKind::Icmp => Some(7),
        MonitorKind::Snmp => Some(161),
        MonitorKind::Tcp | MonitorKind::SendExpect | MonitorKind::Agent => None,
    }
}

/// `"a"`, `"a" and "b"`, `"a", "b" and "c"`.
fn listed(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => quoted.concat(),
    }
}

/// A pool that combines several monitors' weight readings (`weight_share`) must use them: an
/// algorithm that counts every member as weight 1 would throw the combined figure away, and the
/// operator would believe the CPU and memory feedback works.
fn weight_readings_used(c: &mut Checker<'_>, cfg: &Config, i: usize) {
    let pool = &cfg.pools[i];
    let readers: Vec<&str> = pool
        .monitors
        .iter()
        .filter_map(|m| cfg.monitor(m))
        .filter(|m| m.reports_weight())
        .map(|m| m.name.as_str())
        .collect();
    if readers.len() < 2 || !pool.algorithm.ignores_weights() {
        return;
    }
    c.err(
        &format!("pool[{i}].algorithm"),
        format!(
            "{} counts every member as weight 1, so the weight readings of monitors {} (combined by their weight_share) would be thrown away; expected an algorithm that uses weights: dynamic_feedback (meant for them), weighted_round_robin, weighted_least_connections, weighted_least_traffic, hash, priority, least_request",
            pool.algorithm,
            listed(&readers)
        ),
    );
}

/// Who listens on each address, one owner per (transport, address, VRF: `None` is the main
/// routing domain, and the same address and port in two VRFs are two listeners); the owner's
/// description is what a later claimant is told.
#[derive(Default)]
struct Listeners {
    stream: HashMap<(SocketAddr, Option<String>), String>,
    dgram: HashMap<(SocketAddr, Option<String>), String>,
}

fn pool_names(cfg: &Config) -> impl Iterator<Item = &str> + Clone {
    cfg.pools.iter().map(|p| p.name.as_str())
}

fn monitor_names(cfg: &Config) -> impl Iterator<Item = &str> + Clone {
    cfg.monitors.iter().map(|p| p.name.as_str())
}

fn site_names(cfg: &Config) -> impl Iterator<Item = &str> + Clone {
    cfg.gslb.sites.iter().map(|s| s.name.as_str())
}

pub(crate) fn validate(cfg: &Config, broken: &HashSet<String>) -> Vec<ConfigError> {
    let mut c = Checker {
        loc: &cfg.locations,
        errors: Vec::new(),
        broken,
    };
    check_admin_ha_global(&mut c, cfg);

    c.unique(
        "virtual_service",
        cfg.virtual_services.iter().map(|v| v.name.as_str()),
        "name",
    );
    c.unique("pool", cfg.pools.iter().map(|v| v.name.as_str()), "name");
    check_kernel_acl_room(&mut c, cfg);
    c.unique(
        "monitor",
        cfg.monitors.iter().map(|v| v.name.as_str()),
        "name",
    );
    c.unique(
        "persistence",
        cfg.persistence.iter().map(|v| v.name.as_str()),
        "name",
    );
    c.unique(
        "ip_table",
        cfg.ip_tables.iter().map(|v| v.name.as_str()),
        "name",
    );
    c.unique(
        "gslb.site",
        cfg.gslb.sites.iter().map(|v| v.name.as_str()),
        "name",
    );

    let mut listeners = Listeners::default();
    listeners
        .stream
        .insert((cfg.admin.listen, None), "admin.listen".into());
    let protocols_of_pool = check_virtual_services(&mut c, cfg, &mut listeners);
    wildcards::check_wildcards(&mut c, cfg);
    check_pools(&mut c, cfg, &protocols_of_pool);

    let mut errs = Vec::new();
    links::check(cfg, &mut errs);
    for (path, msg) in errs {
        c.err(&path, msg);
    }

    check_dns_listen(&mut c, cfg, &mut listeners);
    check_gslb_sites(&mut c, cfg);
    check_gslb_local_site(&mut c, cfg, &mut listeners);
    check_gslb_names(&mut c, cfg);

    c.errors.extend(messages::validate(cfg));
    c.errors
}

/// The admin API's exposure, the pools HA tracks and the shutdown timeout.
fn check_admin_ha_global(c: &mut Checker<'_>, cfg: &Config) {
    if !cfg.admin.listen.ip().is_loopback() && !cfg.admin.token_configured() {
        c.err(
            "admin.listen",
            format!(
                "{} is not a loopback address: set admin.token (or admin.token_file) so the API is not open to the network",
                cfg.admin.listen
            ),
        );
    }
    if let Some(ha) = &cfg.ha {
        for (i, name) in ha.track.iter().enumerate() {
            c.reference(
                &format!("ha.track[{i}]"),
                "pool",
                "pool",
                name,
                pool_names(cfg),
            );
        }
    }
    if cfg.global.shutdown_timeout.is_zero() && cfg.locations.contains("global.shutdown_timeout") {
        c.err("global.shutdown_timeout", "must be longer than 0s");
    }
}

/// allow / deny of nat / dr / tunnel services go into one kernel trie (IPv4 prefixes twice:
/// also as IPv4-mapped IPv6), with room kept for a reload to write a list beside the old one.
fn check_kernel_acl_room(c: &mut Checker<'_>, cfg: &Config) {
    let mut in_kernel = 0usize;
    for (i, vs) in cfg.virtual_services.iter().enumerate() {
        if !vs.in_kernel() {
            continue;
        }
        in_kernel += vs
            .access
            .allow
            .iter()
            .chain(&vs.access.deny)
            .map(|n| if n.addr().is_ipv4() { 2 } else { 1 })
            .sum::<usize>();
        if in_kernel > crate::forwarding::XDP_ACL_ENTRIES_MAX {
            let key = if vs.access.deny.is_empty() {
                "allow"
            } else {
                "deny"
            };
            c.err(
                &format!("virtual_service[{i}].{key}"),
                format!(
                    "the allow/deny lists of the nat/dr/tunnel services take {in_kernel} kernel entries by this service (IPv4 prefixes count twice), more than the {} they may hold together",
                    crate::forwarding::XDP_ACL_ENTRIES_MAX
                ),
            );
            break;
        }
    }
}

/// Checks each virtual service; returns the protocols each pool is used with (by a service or
/// one of its rules), which decide the keys a pool may set.
fn check_virtual_services<'a>(
    c: &mut Checker<'_>,
    cfg: &'a Config,
    listeners: &mut Listeners,
) -> HashMap<&'a str, Vec<Protocol>> {
    let mut protocols_of_pool: HashMap<&str, Vec<Protocol>> = HashMap::new();
    for (i, vs) in cfg.virtual_services.iter().enumerate() {
        let protocol = vs.protocol();
        claim_service_listen(c, i, vs, listeners);
        if let Some(p) = &vs.pool {
            let at = format!("virtual_service[{i}].pool");
            c.reference(&at, "pool", "pool", p, pool_names(cfg));
            protocols_of_pool
                .entry(p.as_str())
                .or_default()
                .push(protocol);
        }
        if let Some(p) = &vs.persistence {
            check_service_persistence(c, cfg, i, p, protocol);
        }
        if vs.transparent() && protocol.is_http() {
            check_transparent_without_http2(c, cfg, i, vs);
        }
        if !protocol.is_http() {
            check_rule_names_unique(c, i, vs);
        }
        check_service_rules(c, cfg, i, vs, &mut protocols_of_pool);
    }
    protocols_of_pool
}

fn claim_service_listen(
    c: &mut Checker<'_>,
    i: usize,
    vs: &VirtualService,
    listeners: &mut Listeners,
) {
    let owners = if vs.protocol().is_datagram() {
        &mut listeners.dgram
    } else {
        &mut listeners.stream
    };
    // An ip service's addresses are no socket's: wildcards::check_wildcards checks them.
    let sockets = if vs.protocol() == Protocol::Ip {
        &[][..]
    } else {
        &vs.listen[..]
    };
    for (j, addr) in sockets.iter().enumerate() {
        let me = format!("virtual_service[{i}] ({})", vs.name);
        if let Some(prev) = owners.insert((*addr, vs.vrf.clone()), me) {
            let vrf = vs.vrf.as_ref().map(|v| format!(" in vrf {v:?}"));
            c.err(
                &format!("virtual_service[{i}].listen[{j}]"),
                format!(
                    "{addr}{} is already used by {prev}",
                    vrf.unwrap_or_default()
                ),
            );
        }
    }
    if vs.vrf.is_some() && vs.protocol() == Protocol::Ftp {
        c.err(
            &format!("virtual_service[{i}].vrf"),
            "`vrf` is not available on ftp services in this build: their data connections are not bound to it",
        );
    }
    if vs.vrf.is_some() && vs.in_kernel() {
        c.err(
            &format!("virtual_service[{i}].vrf"),
            "`vrf` applies to proxied services; the in-kernel forwarding (nat / dr / tunnel) serves the interfaces it is attached to (`interfaces`)",
        );
    }
}

/// The persistence profile exists and its kind applies to the service's protocol.
fn check_service_persistence(
    c: &mut Checker<'_>,
    cfg: &Config,
    i: usize,
    p: &str,
    protocol: Protocol,
) {
    let at = format!("virtual_service[{i}].persistence");
    let persistence_names = cfg.persistence.iter().map(|p| p.name.as_str());
    c.reference(
        &at,
        "persistence profile",
        "persistence",
        p,
        persistence_names,
    );
    let Some(prof) = cfg.persistence(p) else {
        return;
    };
    let ok = match prof.kind {
        PersistenceKind::SourceIp => true,
        PersistenceKind::CookieInsert
        | PersistenceKind::CookiePassive
        | PersistenceKind::CookieRewrite
        | PersistenceKind::Header => protocol.is_http(),
        PersistenceKind::Radius => protocol == Protocol::Udp,
        PersistenceKind::RtspSession => protocol == Protocol::Rtsp,
    };
    if !ok {
        c.err(
            &at,
            format!(
                "persistence {p:?} is of type {}, which does not apply to protocol {protocol}",
                prof.kind
            ),
        );
    }
}

/// HTTP/2 member connections are one per member, shared by every client of the pool: none can
/// come from one client's address.
fn check_transparent_without_http2(
    c: &mut Checker<'_>,
    cfg: &Config,
    i: usize,
    vs: &VirtualService,
) {
    let rule_pools = vs.rules().iter().filter_map(|r| match &r.action {
        RuleAction::Pool(p) => Some(p.as_str()),
        _ => None,
    });
    let h2 = vs
        .pool
        .as_deref()
        .into_iter()
        .chain(rule_pools)
        .find(|p| cfg.pool(p).is_some_and(|p| p.http.http2));
    if let Some(p) = h2 {
        c.err(
            &format!("virtual_service[{i}].source"),
            format!(
                "`source = \"client\"` needs a member connection per client, but pool {p:?} has http2 = true (one HTTP/2 connection per member, shared by every client); remove one of them"
            ),
        );
    }
}

/// The name labels the rule's counters (API, metrics): one series per rule.
fn check_rule_names_unique(c: &mut Checker<'_>, i: usize, vs: &VirtualService) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (r, rule) in vs.rules().iter().enumerate() {
        let Some(name) = rule.name.as_deref() else {
            continue;
        };
        if let Some(first) = seen.insert(name, r) {
            c.err(
                &format!("virtual_service[{i}].rule[{r}].name"),
                format!(
                    "duplicate rule name {name:?}: already used by rule[{first}] (the name labels the rule's counters)"
                ),
            );
        }
    }
}

/// Each rule's ports and pool; records the protocol each rule's pool is used with.
fn check_service_rules<'a>(
    c: &mut Checker<'_>,
    cfg: &Config,
    i: usize,
    vs: &'a VirtualService,
    protocols_of_pool: &mut HashMap<&'a str, Vec<Protocol>>,
) {
    let protocol = vs.protocol();
    for (r, rule) in vs.rules().iter().enumerate() {
        // An L4 rule's ports are the ones the service listens on: a rule naming none of
        // them could never match (a typo, or a listen address removed).
        let ports = &rule.destination_port;
        if !protocol.is_http()
            && !ports.is_empty()
            && !vs
                .listen
                .iter()
                .any(|a| ports.iter().any(|p| p.contains(&a.port())))
        {
            let listen: Vec<String> = vs.listen.iter().map(|a| a.port().to_string()).collect();
            c.err(
                &format!("virtual_service[{i}].rule[{r}].destination_port"),
                format!(
                    "matches none of the ports the service listens on ({}): the rule could never match",
                    listen.join(", ")
                ),
            );
        }
        if let RuleAction::Pool(p) = &rule.action {
            let path = format!("virtual_service[{i}].rule[{r}].pool");
            c.reference(&path, "pool", "pool", p, pool_names(cfg));
            protocols_of_pool
                .entry(p.as_str())
                .or_default()
                .push(protocol);
        }
    }
}

/// Each pool's monitors, weight readings and the keys that only some protocols use.
fn check_pools(
    c: &mut Checker<'_>,
    cfg: &Config,
    protocols_of_pool: &HashMap<&str, Vec<Protocol>>,
) {
    for (i, pool) in cfg.pools.iter().enumerate() {
        for (j, m) in pool.monitors.iter().enumerate() {
            c.reference(
                &format!("pool[{i}].monitors[{j}]"),
                "monitor",
                "monitor",
                m,
                monitor_names(cfg),
            );
        }
        weight_readings_used(c, cfg, i);
        let Some(protos) = protocols_of_pool.get(pool.name.as_str()) else {
            continue;
        };
        if pool.hash_key.is_l7() {
            if let Some(p) = protos.iter().find(|p| !p.is_http()) {
                c.err(
                    &format!("pool[{i}].hash_key"),
                    format!(
                        "hash key {} needs an HTTP request, but a {p} service uses this pool",
                        pool.hash_key
                    ),
                );
            }
        }
        if pool.vrf.is_some() && protos.contains(&Protocol::Ftp) {
            c.err(
                &format!("pool[{i}].vrf"),
                "`vrf` is not available on pools of ftp services in this build: their data connections are not bound to it",
            );
        }
        check_http_pool_keys(c, cfg, i, protos);
    }
}

/// A pool no HTTP service uses may not set the HTTP-only keys (nor `tls`, unless all its users
/// are tcp or message services, for which it re-encrypts too).
fn check_http_pool_keys(c: &mut Checker<'_>, cfg: &Config, i: usize, protos: &[Protocol]) {
    let Some(p) = protos
        .iter()
        .find(|p| !p.is_http())
        .filter(|_| protos.iter().all(|p| !p.is_http()))
    else {
        return;
    };
    let at = |k: &str| format!("pool[{i}].{k}");
    let tls_ok = protos
        .iter()
        .all(|p| matches!(p, Protocol::Tcp | Protocol::Message));
    for key in ["reuse", "tls"]
        .iter()
        .chain(crate::http::HTTP_POOL_KEYS)
        .filter(|k| !(tls_ok && **k == "tls"))
    {
        if cfg.locations.contains(&at(key)) {
            let users = if *key == "tls" {
                "http, https, tcp and message services"
            } else {
                "http/https services"
            };
            c.err(
                &at(key),
                format!("`{key}` applies to pools of {users}; this pool serves {p}"),
            );
        }
    }
}

/// The DNS server listens on both transports of each address.
fn check_dns_listen(c: &mut Checker<'_>, cfg: &Config, listeners: &mut Listeners) {
    let Some(dns) = &cfg.dns else {
        return;
    };
    for (j, addr) in dns.listen.iter().enumerate() {
        for owners in [&mut listeners.stream, &mut listeners.dgram] {
            if let Some(prev) = owners.insert((*addr, None), "dns".into()) {
                c.err(
                    &format!("dns.listen[{j}]"),
                    format!("{addr} is already used by {prev}"),
                );
            }
        }
    }
}

/// Each GSLB site's regions and monitor; the monitor must know which port to probe.
fn check_gslb_sites(c: &mut Checker<'_>, cfg: &Config) {
    let table_names = cfg.ip_tables.iter().map(|t| t.name.as_str());
    for (i, s) in cfg.gslb.sites.iter().enumerate() {
        for (j, r) in s.regions.iter().enumerate() {
            c.reference(
                &format!("gslb.site[{i}].regions[{j}]"),
                "ip_table",
                "ip_table",
                r,
                table_names.clone(),
            );
        }
        if let Some(m) = &s.monitor {
            c.reference(
                &format!("gslb.site[{i}].monitor"),
                "monitor",
                "monitor",
                m,
                monitor_names(cfg),
            );
        }
        if let Some(m) = s.monitor.as_deref().and_then(|m| cfg.monitor(m)) {
            if m.port.is_none() && site_monitor_port(m.kind).is_none() {
                c.err(
                    &format!("gslb.site[{i}].monitor"),
                    format!(
                        "monitor {:?} (type {}) has no `port`, and a site's addresses have none: set `port` on the monitor",
                        m.name, m.kind
                    ),
                );
            }
        }
    }
}

/// The local site exists and, when site state is exchanged with peers, there is a key and an
/// address to accept the peers on.
fn check_gslb_local_site(c: &mut Checker<'_>, cfg: &Config, listeners: &mut Listeners) {
    let g = &cfg.gslb;
    let Some(local) = &g.local_site else {
        return;
    };
    c.reference(
        "gslb.local_site",
        "gslb.site",
        "gslb.site",
        local,
        site_names(cfg),
    );
    let local_peer = g.site(local).and_then(|s| s.peer);
    let exchanging =
        g.listen.is_some() || g.sites.iter().any(|s| s.peer.is_some() && s.name != *local);
    if exchanging && g.keys.is_empty() {
        c.err(
            "gslb",
            "site state exchange with peers needs `key`: a shared secret of at least 16 characters, the same on every instance",
        );
    }
    if exchanging && g.listen.is_none() && local_peer.is_none() {
        c.err(
            "gslb.local_site",
            format!("the local site {local:?} has no `peer` address to accept the other instances on: set its `peer` or gslb.listen"),
        );
    }
    if let Some(addr) = g.listen.or(local_peer) {
        if let Some(prev) = listeners
            .stream
            .insert((addr, None), "gslb site state exchange".into())
        {
            let at = if g.listen.is_some() {
                "gslb.listen"
            } else {
                "gslb.local_site"
            };
            c.err(at, format!("{addr} is already used by {prev}"));
        }
    }
}

/// GSLB names are unique, name existing sites, and are what HTTP services redirect to.
fn check_gslb_names(c: &mut Checker<'_>, cfg: &Config) {
    c.unique(
        "gslb.name",
        cfg.gslb.names.iter().map(|n| n.fqdn.as_str()),
        "fqdn",
    );
    for (i, n) in cfg.gslb.names.iter().enumerate() {
        for (j, s) in n.sites.iter().enumerate() {
            c.reference(
                &format!("gslb.name[{i}].sites[{j}]"),
                "gslb.site",
                "gslb.site",
                s,
                site_names(cfg),
            );
        }
    }
    let gslb_names = cfg.gslb.names.iter().map(|n| n.fqdn.as_str());
    for (i, vs) in cfg.virtual_services.iter().enumerate() {
        if let Some(r) = vs.as_http().and_then(|h| h.gslb_redirect.as_ref()) {
            let at = format!("virtual_service[{i}].gslb_redirect");
            c.reference(&at, "gslb.name", "gslb.name", &r.name, gslb_names.clone());
        }
    }
    check_learnt_addresses(c, cfg);
    check_proximity_names(c, cfg);
}

/// Proximity ranks sites by RTTs each site's own instance measures: this instance must know
/// which site it is, and a fallback must answer without them.
fn check_proximity_names(c: &mut Checker<'_>, cfg: &Config) {
    use crate::GslbAlgorithm;
    for (i, n) in cfg.gslb.names.iter().enumerate() {
        if n.fallback == GslbAlgorithm::Proximity {
            c.err(
                &format!("gslb.name[{i}].fallback"),
                "proximity cannot be a fallback: the fallback answers while no RTT is measured; expected topology, round_robin, weighted, least_load, fastest_response, first_available or hash",
            );
        }
        if n.algorithm == GslbAlgorithm::Proximity && cfg.gslb.local_site.is_none() {
            c.err(
                &format!("gslb.name[{i}].algorithm"),
                "proximity needs gslb.local_site: each instance measures the RTT from its own site, and shares it over the site state exchange",
            );
        }
    }
}

/// Services adding their addresses to a GSLB name (`gslb`) add them at the local site, so there
/// must be one and the name must list it; a site with no address of its own must be able to
/// learn some (the local site from such services, another site from its instance's reports).
fn check_learnt_addresses(c: &mut Checker<'_>, cfg: &Config) {
    let g = &cfg.gslb;
    let local = g.local_site.as_deref();
    for (i, vs) in cfg.virtual_services.iter().enumerate() {
        let Some(name) = &vs.gslb else { continue };
        let at = format!("virtual_service[{i}].gslb");
        let Some(n) = g.names.iter().find(|n| n.fqdn.eq_ignore_ascii_case(name)) else {
            c.reference(
                &at,
                "gslb.name",
                "gslb.name",
                name,
                g.names.iter().map(|n| n.fqdn.as_str()),
            );
            continue;
        };
        match local {
            None => c.err(
                &at,
                format!("{name:?}: the service's addresses are added to the name at this instance's own site, and gslb.local_site is not set; expected gslb.local_site naming the site this instance runs at"),
            ),
            Some(l) if !n.sites.iter().any(|s| s == l) => c.err(
                &at,
                format!("gslb.name {name:?} does not list the local site {l:?} in its `sites`, so this service's addresses would never be answered; add {l:?} to its sites"),
            ),
            Some(_) => {}
        }
    }
    // The local site may have none while no service adds one (the last VIP was taken out by a
    // reload): it is answered again when one does.
    for (i, s) in g.sites.iter().enumerate() {
        let is_local = local == Some(s.name.as_str());
        if s.addresses.is_empty() && !is_local && (s.peer.is_none() || local.is_none()) {
            c.err(
                &format!("gslb.site[{i}].addresses"),
                format!("site {:?} has no addresses, and another site's addresses can only be learnt from its own instance's reports: it needs `peer` (and this instance gslb.local_site); expected `addresses` or `peer`", s.name),
            );
        }
    }
}

//! Checks that need the whole config: references between sections, duplicates, shared listening
//! addresses, and which protocols use a pool or a persistence profile. What a single section can
//! check is checked where it is read. `links` and `messages` hold the cross-checks of those
//! sections, apart so that the sections themselves never need the whole `Config`.

mod links;
mod messages;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use crate::error::{did_you_mean, ConfigError};
use crate::monitor::MonitorKind;
use crate::persistence::PersistenceKind;
use crate::protocol::Protocol;
use crate::rule::RuleAction;
use crate::schema::Config;
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

pub(crate) fn validate(cfg: &Config, broken: &HashSet<String>) -> Vec<ConfigError> {
    let mut c = Checker {
        loc: &cfg.locations,
        errors: Vec::new(),
        broken,
    };
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
            let pools = cfg.pools.iter().map(|p| p.name.as_str());
            c.reference(&format!("ha.track[{i}]"), "pool", "pool", name, pools);
        }
    }
    if cfg.global.shutdown_timeout.is_zero() && cfg.locations.contains("global.shutdown_timeout") {
        c.err("global.shutdown_timeout", "must be longer than 0s");
    }

    c.unique(
        "virtual_service",
        cfg.virtual_services.iter().map(|v| v.name.as_str()),
        "name",
    );
    c.unique("pool", cfg.pools.iter().map(|v| v.name.as_str()), "name");
    // allow / deny of nat / dr / tunnel services go into one kernel trie (IPv4 prefixes twice:
    // also as IPv4-mapped IPv6), with room kept for a reload to write a list beside the old one.
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

    let pool_names = cfg.pools.iter().map(|p| p.name.as_str());
    let monitor_names = cfg.monitors.iter().map(|p| p.name.as_str());
    let persistence_names = cfg.persistence.iter().map(|p| p.name.as_str());

    // Listening addresses: one owner per (transport, address).
    let mut stream_owner: HashMap<SocketAddr, String> = HashMap::new();
    let mut dgram_owner: HashMap<SocketAddr, String> = HashMap::new();
    stream_owner.insert(cfg.admin.listen, "admin.listen".into());

    let mut protocols_of_pool: HashMap<&str, Vec<Protocol>> = HashMap::new();

    for (i, vs) in cfg.virtual_services.iter().enumerate() {
        let at = |k: &str| format!("virtual_service[{i}].{k}");
        let protocol = vs.protocol();
        for (j, addr) in vs.listen.iter().enumerate() {
            let owners = if protocol.is_datagram() {
                &mut dgram_owner
            } else {
                &mut stream_owner
            };
            let me = format!("virtual_service[{i}] ({})", vs.name);
            if let Some(prev) = owners.insert(*addr, me) {
                c.err(
                    &format!("{}[{j}]", at("listen")),
                    format!("{addr} is already used by {prev}"),
                );
            }
        }
        if let Some(p) = &vs.pool {
            c.reference(&at("pool"), "pool", "pool", p, pool_names.clone());
            protocols_of_pool
                .entry(p.as_str())
                .or_default()
                .push(protocol);
        }
        if let Some(p) = &vs.persistence {
            c.reference(
                &at("persistence"),
                "persistence profile",
                "persistence",
                p,
                persistence_names.clone(),
            );
            if let Some(prof) = cfg.persistence(p) {
                let ok = match prof.kind {
                    PersistenceKind::SourceIp => true,
                    PersistenceKind::CookieInsert
                    | PersistenceKind::CookiePassive
                    | PersistenceKind::CookieRewrite
                    | PersistenceKind::Header => protocol.is_http(),
                    PersistenceKind::Radius => protocol == Protocol::Udp,
                };
                if !ok {
                    c.err(
                        &at("persistence"),
                        format!(
                            "persistence {p:?} is of type {}, which does not apply to protocol {protocol}",
                            prof.kind
                        ),
                    );
                }
            }
        }
        if vs.transparent() && protocol.is_http() {
            // HTTP/2 member connections are one per member, shared by every client of the
            // pool: none can come from one client's address.
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
                    &at("source"),
                    format!(
                        "`source = \"client\"` needs a member connection per client, but pool {p:?} has http2 = true (one HTTP/2 connection per member, shared by every client); remove one of them"
                    ),
                );
            }
        }
        if !protocol.is_http() {
            // The name labels the rule's counters (API, metrics): one series per rule.
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
                c.reference(&path, "pool", "pool", p, pool_names.clone());
                protocols_of_pool
                    .entry(p.as_str())
                    .or_default()
                    .push(protocol);
            }
        }
    }

    for (i, pool) in cfg.pools.iter().enumerate() {
        let at = |k: &str| format!("pool[{i}].{k}");
        for (j, m) in pool.monitors.iter().enumerate() {
            c.reference(
                &format!("{}[{j}]", at("monitors")),
                "monitor",
                "monitor",
                m,
                monitor_names.clone(),
            );
        }
        weight_readings_used(&mut c, cfg, i);
        if pool.hash_key.is_l7() {
            if let Some(protos) = protocols_of_pool.get(pool.name.as_str()) {
                if let Some(p) = protos.iter().find(|p| !p.is_http()) {
                    c.err(
                        &at("hash_key"),
                        format!(
                            "hash key {} needs an HTTP request, but a {p} service uses this pool",
                            pool.hash_key
                        ),
                    );
                }
            }
        }
        if let Some(protos) = protocols_of_pool.get(pool.name.as_str()) {
            if let Some(p) = protos
                .iter()
                .find(|p| !p.is_http())
                .filter(|_| protos.iter().all(|p| !p.is_http()))
            {
                // `tls` also re-encrypts for tcp and message services.
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
        }
    }

    let mut errs = Vec::new();
    links::check(cfg, &mut errs);
    for (path, msg) in errs {
        c.err(&path, msg);
    }

    if let Some(dns) = &cfg.dns {
        for (j, addr) in dns.listen.iter().enumerate() {
            for owners in [&mut stream_owner, &mut dgram_owner] {
                if let Some(prev) = owners.insert(*addr, "dns".into()) {
                    c.err(
                        &format!("dns.listen[{j}]"),
                        format!("{addr} is already used by {prev}"),
                    );
                }
            }
        }
    }

    let table_names = cfg.ip_tables.iter().map(|t| t.name.as_str());
    let site_names = cfg.gslb.sites.iter().map(|s| s.name.as_str());
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
                monitor_names.clone(),
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
    let g = &cfg.gslb;
    if let Some(local) = &g.local_site {
        c.reference(
            "gslb.local_site",
            "gslb.site",
            "gslb.site",
            local,
            site_names.clone(),
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
            if let Some(prev) = stream_owner.insert(addr, "gslb site state exchange".into()) {
                let at = if g.listen.is_some() {
                    "gslb.listen"
                } else {
                    "gslb.local_site"
                };
                c.err(at, format!("{addr} is already used by {prev}"));
            }
        }
    }
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
                site_names.clone(),
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

    c.errors.extend(messages::validate(cfg));
    c.errors
}

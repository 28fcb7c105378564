//! Checks that need the whole config: references between sections, duplicates, shared listening
//! addresses, and which protocols use a pool or a persistence profile. What a single section can
//! check is checked where it is read.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use crate::error::{did_you_mean, ConfigError};
use crate::schema::{
    radius_attribute, Config, MonitorKind, PersistenceKind, Protocol, RuleAction,
    MONITOR_KIND_KEYS, RADIUS_ATTRIBUTES,
};
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

/// Continent codes of the MaxMind databases.
pub const CONTINENTS: [&str; 7] = ["AF", "AN", "AS", "EU", "NA", "OC", "SA"];

/// Checks a `redirect_host`: a DNS host name (letters, digits, `-`, dots; labels of 1–63
/// characters) optionally followed by `:port`. It becomes the authority of a `Location` header,
/// so nothing else may pass.
fn check_redirect_host(h: &str) -> Result<(), String> {
    let expected = "expected a host name with an optional port, like \"eu.app.example.com\" or \"eu.app.example.com:8443\"";
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (h, None),
    };
    if let Some(p) = port {
        if p.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("{h:?}: bad port {p:?}; {expected}"));
        }
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    if host.is_empty() || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(format!("{h:?} is not a host name; {expected}"));
    }
    Ok(())
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
        MonitorKind::Icmp => Some(7),
        MonitorKind::Snmp => Some(161),
        MonitorKind::Tcp | MonitorKind::SendExpect | MonitorKind::Agent => None,
    }
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
        for (r, rule) in vs.rules().iter().enumerate() {
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
        let mut seen = HashMap::new();
        for (j, m) in pool.members.iter().enumerate() {
            if let Some(first) = seen.insert(m.address, j) {
                c.err(
                    &format!("pool[{i}].member[{j}].address"),
                    format!(
                        "duplicate member {}: already pool[{i}].member[{first}]",
                        m.address
                    ),
                );
            }
        }
        for (j, m) in pool.monitors.iter().enumerate() {
            c.reference(
                &format!("{}[{j}]", at("monitors")),
                "monitor",
                "monitor",
                m,
                monitor_names.clone(),
            );
        }
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
        if pool.name.starts_with("gslb:") || pool.name.starts_with("gslb-site:") {
            c.err(
                &at("name"),
                format!("{:?}: pool names starting with \"gslb:\" or \"gslb-site:\" are reserved for GSLB's own pools", pool.name),
            );
        }
        let mut errs = Vec::new();
        crate::http::check_pool(&format!("pool[{i}]"), &pool.http, &mut errs);
        for (path, msg) in errs {
            c.err(&path, msg);
        }
        if pool.min_active == 0 {
            c.err(&at("min_active"), "must be at least 1");
        }
        if pool.connect_timeout.is_zero() {
            c.err(&at("connect_timeout"), "must be longer than 0s");
        }
        if pool.zero_window_timeout.is_some_and(|d| d.is_zero()) {
            c.err(
                &at("zero_window_timeout"),
                "must be longer than 0s (leave it out to not watch zero windows)",
            );
        }
    }

    let mut errs = Vec::new();
    crate::link::check(cfg, &mut errs);
    for (path, msg) in errs {
        c.err(&path, msg);
    }

    for (i, m) in cfg.monitors.iter().enumerate() {
        let at = |k: &str| format!("monitor[{i}].{k}");
        if m.interval.is_zero() {
            c.err(&at("interval"), "must be longer than 0s");
        }
        if m.timeout.is_zero() {
            c.err(&at("timeout"), "must be longer than 0s");
        } else if m.timeout > m.interval {
            c.err(
                &at("timeout"),
                format!(
                    "{} is longer than the interval ({}): a check would still run when the next starts",
                    humantime::format_duration(m.timeout),
                    humantime::format_duration(m.interval)
                ),
            );
        }
        for s in &m.expect_status {
            if !(100..=599).contains(s) {
                c.err(
                    &at("expect_status"),
                    format!("{s} is not an HTTP status (100 to 599)"),
                );
            }
        }
        if m.kind == MonitorKind::SendExpect && m.expect.is_none() {
            c.err(
                &format!("monitor[{i}]"),
                "type send_expect needs `expect` (and usually `send`)",
            );
        }
        if m.port == Some(0) {
            c.err(&at("port"), "0 is not a port");
        }
        check_protocol_monitor(&mut c, &cfg.locations, i, m);
    }

    for (i, p) in cfg.persistence.iter().enumerate() {
        let at = format!("persistence[{i}]");
        match p.kind {
            PersistenceKind::Header if p.header.is_none() => c.err(
                &at,
                "type header needs `header`: the request header to route by",
            ),
            PersistenceKind::Radius if p.attribute.is_none() => {
                c.err(&at, "type radius needs `attribute`, e.g. \"User-Name\"")
            }
            _ => {}
        }
        if let Some(a) = p.attribute.as_deref() {
            if p.kind == PersistenceKind::Radius && radius_attribute(a).is_none() {
                let names: Vec<&str> = RADIUS_ATTRIBUTES.iter().map(|(n, _)| *n).collect();
                let hint = did_you_mean(a, names.iter().copied())
                    .map(|m| format!(" (did you mean {m:?}?)"))
                    .unwrap_or_default();
                c.err(
                    &format!("{at}.attribute"),
                    format!(
                        "unknown RADIUS attribute {a:?}{hint}; expected one of {} or a type number from 1 to 255",
                        names.join(", ")
                    ),
                );
            }
        }
        if p.kind != PersistenceKind::Radius && cfg.locations.contains(&format!("{at}.malformed")) {
            c.err(
                &format!("{at}.malformed"),
                format!(
                    "`malformed` applies to type radius; this profile is {}",
                    p.kind
                ),
            );
        }
        if p.cookie.is_empty()
            || !p
                .cookie
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.!#$%&'*+^`|~".contains(&b))
        {
            c.err(
                &format!("{at}.cookie"),
                format!("{:?} is not a valid cookie name", p.cookie),
            );
        }
        let cookie_kind = matches!(
            p.kind,
            PersistenceKind::CookieInsert | PersistenceKind::CookieRewrite
        );
        if p.secret.is_some() && !cookie_kind {
            c.err(
                &format!("{at}.secret"),
                format!(
                    "`secret` signs cookie_insert and cookie_rewrite cookies; this profile is {}",
                    p.kind
                ),
            );
        }
        if p.secret
            .iter()
            .chain(&p.previous_secrets)
            .any(|s| s.len() < 16)
        {
            c.err(
                &format!("{at}.secret"),
                "too short: use at least 16 characters (e.g. `openssl rand -hex 32`)",
            );
        }
        if p.same_site.is_some() && p.kind != PersistenceKind::CookieInsert {
            c.err(
                &format!("{at}.same_site"),
                format!(
                    "`same_site` applies to cookie_insert; this profile is {}",
                    p.kind
                ),
            );
        }
        if p.max_entries == 0 {
            c.err(&format!("{at}.max_entries"), "must be at least 1");
        }
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
        for (z, zone) in dns.zones.iter().enumerate() {
            if !zone.origin.ends_with('.') {
                c.err(
                    &format!("dns.zone[{z}].origin"),
                    format!(
                        "{:?} must be fully qualified, ending in a dot: \"{}.\"",
                        zone.origin, zone.origin
                    ),
                );
            }
        }
    }

    let table_names = cfg.ip_tables.iter().map(|t| t.name.as_str());
    for (i, t) in cfg.ip_tables.iter().enumerate() {
        let geo = !t.countries.is_empty() || !t.continents.is_empty();
        if t.cidrs.is_empty() && t.file.is_none() && !geo {
            c.err(
                &format!("ip_table[{i}]"),
                "needs `cidrs`, `file`, or `geoip` with `countries`/`continents`",
            );
        }
        if geo && t.geoip.is_none() {
            c.err(
                &format!("ip_table[{i}]"),
                "`countries` and `continents` need `geoip`: the MaxMind database to look clients up in",
            );
        }
        if t.geoip.is_some() && !geo {
            c.err(
                &format!("ip_table[{i}].geoip"),
                "`geoip` needs `countries` or `continents` to say which clients belong to the table",
            );
        }
        for (j, code) in t.countries.iter().enumerate() {
            if code.len() != 2 || !code.bytes().all(|b| b.is_ascii_uppercase()) {
                c.err(
                    &format!("ip_table[{i}].countries[{j}]"),
                    format!("{code:?} is not an ISO 3166-1 country code (two upper-case letters, e.g. \"CN\")"),
                );
            }
        }
        for (j, code) in t.continents.iter().enumerate() {
            if !CONTINENTS.contains(&code.as_str()) {
                c.err(
                    &format!("ip_table[{i}].continents[{j}]"),
                    format!(
                        "{code:?} is not a continent code; expected one of: {}",
                        CONTINENTS.join(", ")
                    ),
                );
            }
        }
    }
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
        if s.addresses.is_empty() {
            c.err(
                &format!("gslb.site[{i}].addresses"),
                "at least one address is required",
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
        if let Some(h) = &s.redirect_host {
            if let Err(why) = check_redirect_host(h) {
                c.err(&format!("gslb.site[{i}].redirect_host"), why);
            }
        }
        if s.weight > crate::MAX_WEIGHT {
            c.err(
                &format!("gslb.site[{i}].weight"),
                format!(
                    "{} is too large; expected 0 to {}",
                    s.weight,
                    crate::MAX_WEIGHT
                ),
            );
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
    } else if g.listen.is_some() {
        c.err(
            "gslb.listen",
            "the site state exchange needs gslb.local_site: the site this instance runs at",
        );
    }
    for (j, k) in g.keys.iter().enumerate() {
        if k.len() < 16 {
            c.err(
                &format!("gslb.key[{j}]"),
                "a key must be at least 16 characters long",
            );
        }
    }
    if g.interval.is_zero() {
        c.err("gslb.interval", "must be longer than 0s");
    }
    if g.stale_after <= g.interval {
        c.err(
            "gslb.stale_after",
            format!(
                "{} must be longer than the report interval ({})",
                humantime::format_duration(g.stale_after),
                humantime::format_duration(g.interval)
            ),
        );
    }
    c.unique(
        "gslb.name",
        cfg.gslb.names.iter().map(|n| n.fqdn.as_str()),
        "fqdn",
    );
    for (i, n) in cfg.gslb.names.iter().enumerate() {
        if !n.fqdn.ends_with('.') {
            c.err(
                &format!("gslb.name[{i}].fqdn"),
                format!("{:?} must be fully qualified, ending in a dot", n.fqdn),
            );
        }
        for (j, s) in n.sites.iter().enumerate() {
            c.reference(
                &format!("gslb.name[{i}].sites[{j}]"),
                "gslb.site",
                "gslb.site",
                s,
                site_names.clone(),
            );
        }
        if n.answers == 0 {
            c.err(&format!("gslb.name[{i}].answers"), "must be at least 1");
        }
        if n.sites.is_empty() {
            c.err(
                &format!("gslb.name[{i}].sites"),
                "at least one site is required",
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

    c.errors.extend(crate::message::validate(cfg));
    c.errors
}

/// DNS record types a dns monitor may ask for.
pub const DNS_QUERY_TYPES: &[&str] = &[
    "A", "AAAA", "NS", "CNAME", "SOA", "PTR", "MX", "TXT", "SRV", "CAA", "ANY",
];
/// DNS response codes a dns monitor may expect.
pub const DNS_RCODES: &[&str] = &[
    "NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED",
];

/// Keys of the protocol monitors: required ones present, values well-formed, and no key of
/// another kind.
fn check_protocol_monitor(
    c: &mut Checker<'_>,
    loc: &Locations,
    i: usize,
    m: &crate::schema::Monitor,
) {
    let at = |k: &str| format!("monitor[{i}].{k}");
    for (key, kinds) in MONITOR_KIND_KEYS {
        if loc.contains(&at(key)) && !kinds.contains(&m.kind) {
            let names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
            c.err(
                &at(key),
                format!(
                    "`{key}` applies to monitor type {}; this monitor is {}",
                    names.join(" / "),
                    m.kind
                ),
            );
        }
    }
    match m.kind {
        MonitorKind::Snmp if m.snmp.oid.is_none() && !loc.contains(&at("oid")) => {
            c.err(
                &format!("monitor[{i}]"),
                "type snmp needs `oid`: the value read, e.g. \"1.3.6.1.4.1.2021.10.1.5.1\" (laLoadInt.1)",
            );
        }
        MonitorKind::Dns => {
            match m.query.as_deref() {
                None => c.err(
                    &format!("monitor[{i}]"),
                    "type dns needs `query`: the name to ask for, e.g. \"health.example.com.\"",
                ),
                Some(q) if !dns_name_ok(q) => c.err(
                    &at("query"),
                    format!("{q:?} is not a DNS name (labels of 1 to 63 characters, 253 in all)"),
                ),
                Some(_) => {}
            }
            if !DNS_QUERY_TYPES.contains(&m.query_type.as_str()) {
                c.err(
                    &at("query_type"),
                    format!(
                        "unknown record type {:?}; expected one of: {}",
                        m.query_type,
                        DNS_QUERY_TYPES.join(", ")
                    ),
                );
            }
            if !DNS_RCODES.contains(&m.expect_rcode.as_str()) {
                c.err(
                    &at("expect_rcode"),
                    format!(
                        "unknown response code {:?}; expected one of: {}",
                        m.expect_rcode,
                        DNS_RCODES.join(", ")
                    ),
                );
            }
        }
        MonitorKind::Radius => {
            if m.secret.as_deref().is_none_or(str::is_empty) {
                c.err(
                    &format!("monitor[{i}]"),
                    "type radius needs `secret`: the shared secret the member has for Fulcrum",
                );
            }
            if m.password.is_some() && m.username.is_none() {
                c.err(&at("password"), "`password` needs `username`");
            }
        }
        MonitorKind::Pop3 | MonitorKind::Imap if m.username.is_some() != m.password.is_some() => {
            c.err(
                &format!("monitor[{i}]"),
                "give both `username` and `password`, or neither",
            );
        }
        MonitorKind::Ftp if m.password.is_some() && m.username.is_none() => {
            c.err(&at("password"), "`password` needs `username`");
        }
        _ => {}
    }
}

/// A DNS name in text form: "." or dot-separated labels of 1–63 bytes, 253 bytes in all, no
/// spaces or control characters.
fn dns_name_ok(name: &str) -> bool {
    if name == "." {
        return true;
    }
    let bare = name.strip_suffix('.').unwrap_or(name);
    !bare.is_empty()
        && bare.len() <= 253
        && bare
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_graphic()))
}

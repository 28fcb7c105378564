//! Cross-checks of the `[[outbound]]`, link and gateway sections against the rest of the config.

use crate::link::{
    GatewayMember, LinkMember, LinkTarget, Outbound, PoolKind, Snat6, GATEWAY_ALGORITHMS,
    LINK_ALGORITHMS, LINK_ONLY_ALGORITHMS, MAX_LINKS,
};
use ipnet::IpNet;

use crate::member::Algorithm;
use crate::monitor::{Monitor, MonitorKind};
use crate::pool::Pool;
use crate::schema::Config;

/// (key path, message) pairs, in the order they are found.
type Errors = Vec<(String, String)>;

/// Cross-checks of the link and gateway sections; returns (key path, message) pairs.
pub(crate) fn check(cfg: &Config, out: &mut Errors) {
    check_link_monitors(cfg, out);
    for (i, pool) in cfg.pools.iter().enumerate() {
        match pool.kind {
            PoolKind::Server => check_server_pool(i, pool, out),
            PoolKind::Link => check_link_pool(cfg, i, pool, out),
            PoolKind::Gateway => check_gateway_pool(cfg, i, pool, out),
        }
    }
    check_service_pools_are_servers(cfg, out);
    check_outbounds(cfg, out);
    check_outbound_pools_unshared(cfg, out);
    check_gslb_site_links(cfg, out);
    check_gateway_services(cfg, out);
}

/// A monitor with `targets`, the kind links and gateways use: it probes through the link.
fn link_monitor<'a>(cfg: &'a Config, name: &str) -> Option<&'a Monitor> {
    cfg.monitor(name).filter(|m| !m.link.targets.is_empty())
}

/// Whether next hops of the families `(v4, v6)` reach `a`.
fn has_next_hop(a: std::net::IpAddr, (v4, v6): (bool, bool)) -> bool {
    if a.is_ipv4() {
        v4
    } else {
        v6
    }
}

/// The first target of a link monitor that no next hop of the families `(v4, v6)` reaches.
fn target_without_next_hop(m: &Monitor, families: (bool, bool)) -> Option<&LinkTarget> {
    m.link
        .targets
        .iter()
        .find(|t| !has_next_hop(t.address, families))
}

fn pool_kind(cfg: &Config, name: &str) -> Option<PoolKind> {
    cfg.pool(name).map(|p| p.kind)
}

fn check_link_monitors(cfg: &Config, out: &mut Errors) {
    let monitor_kinds = [
        MonitorKind::Icmp,
        MonitorKind::Tcp,
        MonitorKind::Dns,
        MonitorKind::Http,
    ];
    for (i, m) in cfg.monitors.iter().enumerate() {
        let at = |k: &str| format!("monitor[{i}].{k}");
        if m.link.targets.is_empty() {
            if cfg.locations.contains(&at("up_when")) {
                out.push((at("up_when"), "`up_when` needs `targets`".into()));
            }
            continue;
        }
        if !monitor_kinds.contains(&m.kind) {
            out.push((
                at("targets"),
                format!(
                    "a link monitor (with `targets`) is of type icmp, tcp, dns or http; this one is {}",
                    m.kind
                ),
            ));
        }
        if m.link.up_when == 0 || m.link.up_when as usize > m.link.targets.len() {
            out.push((
                at("up_when"),
                format!(
                    "{} is out of range; expected 1 to the number of targets ({})",
                    m.link.up_when,
                    m.link.targets.len()
                ),
            ));
        }
        if matches!(m.kind, MonitorKind::Tcp | MonitorKind::Http) {
            for (j, t) in m.link.targets.iter().enumerate() {
                if t.port.is_none() && m.port.is_none() && m.kind == MonitorKind::Tcp {
                    out.push((
                        format!("monitor[{i}].targets[{j}]"),
                        format!(
                            "a tcp probe needs a port: write \"{}:PORT\" or set `port`",
                            t.address
                        ),
                    ));
                }
            }
        }
    }
}

fn check_server_pool(i: usize, pool: &Pool, out: &mut Errors) {
    if LINK_ONLY_ALGORITHMS.contains(&pool.algorithm) {
        out.push((
            format!("pool[{i}].algorithm"),
            format!(
                "algorithm {} is for link pools (kind = \"link\"); this pool is of servers",
                pool.algorithm
            ),
        ));
    }
    if pool.busy.is_some() {
        out.push((
            format!("pool[{i}].busy"),
            "`busy` applies to link pools (kind = \"link\")".into(),
        ));
    }
}

/// For each of `names`, the index of the last one before it with the same name.
fn earlier_same<'n>(names: impl Iterator<Item = &'n str>) -> Vec<Option<usize>> {
    let mut seen = std::collections::HashMap::new();
    names.enumerate().map(|(i, n)| seen.insert(n, i)).collect()
}

fn check_algorithm(pool: &Pool, takes: &[Algorithm], what: &str, path: String, out: &mut Errors) {
    if !takes.contains(&pool.algorithm) {
        let names: Vec<&str> = takes.iter().map(|a| a.as_str()).collect();
        out.push((
            path,
            format!(
                "algorithm {} does not apply to {what}; expected one of: {}",
                pool.algorithm,
                names.join(", ")
            ),
        ));
    }
}

fn check_link_pool(cfg: &Config, i: usize, pool: &Pool, out: &mut Errors) {
    let at = |k: &str| format!("pool[{i}].{k}");
    check_algorithm(pool, LINK_ALGORITHMS, "links", at("algorithm"), out);
    if pool.links.is_empty() {
        out.push((at("member"), "a link pool needs at least one link".into()));
    }
    if pool.links.len() > MAX_LINKS {
        out.push((at("member"), format!("at most {MAX_LINKS} links per pool")));
    }
    if let Some(b) = pool.busy {
        if !(b > 0.0 && b <= 1.0) {
            out.push((
                at("busy"),
                format!("{b} is out of range; expected a share above 0 and at most 1"),
            ));
        }
    }
    let earlier = earlier_same(pool.links.iter().map(|l| l.name.as_str()));
    for ((j, l), first) in pool.links.iter().enumerate().zip(earlier) {
        if let Some(first) = first {
            out.push((
                format!("pool[{i}].member[{j}].name"),
                format!(
                    "duplicate link {:?}: already pool[{i}].member[{first}]",
                    l.name
                ),
            ));
        }
        check_link(cfg, i, pool, j, l, out);
    }
    if pool.algorithm == Algorithm::Proximity && pool.links.iter().all(|l| l.isp.is_none()) {
        out.push((
            at("algorithm"),
            "proximity needs `isp` (an ip_table) on at least one link".into(),
        ));
    }
    if !pool.members.is_empty() || !pool.monitors.is_empty() {
        out.push((
            at("monitors"),
            "a link pool's monitors are set per link (member key `monitors`)".into(),
        ));
    }
}

/// One link of a link pool: its name, addresses, the bandwidth its pool's algorithm needs, its
/// ISP table and monitors.
fn check_link(cfg: &Config, i: usize, pool: &Pool, j: usize, l: &LinkMember, out: &mut Errors) {
    let mp = |k: &str| format!("pool[{i}].member[{j}].{k}");
    if !l
        .name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        || l.name.is_empty()
    {
        out.push((
            mp("name"),
            format!("{:?}: a link name is letters, digits, '-' and '_'", l.name),
        ));
    }
    check_link_families(cfg, l, &mp, out);
    let needs_bw = matches!(
        pool.algorithm,
        Algorithm::BandwidthRatio | Algorithm::Spillover | Algorithm::WeightedLeastTraffic
    ) || pool.busy.is_some();
    if needs_bw && l.bandwidth.is_none() {
        out.push((
            mp("bandwidth"),
            format!(
                "link {:?} needs `bandwidth = {{ up, down }}` (algorithm {}{})",
                l.name,
                pool.algorithm,
                if pool.busy.is_some() { ", busy" } else { "" }
            ),
        ));
    }
    if let Some(isp) = &l.isp {
        if !cfg.ip_tables.iter().any(|t| &t.name == isp) {
            let hint =
                crate::error::did_you_mean(isp, cfg.ip_tables.iter().map(|t| t.name.as_str()))
                    .map(|s| format!(" (did you mean {s:?}?)"))
                    .unwrap_or_default();
            out.push((mp("isp"), format!("no ip_table named {isp:?}{hint}")));
        }
    }
    for (k, m) in l.monitors.iter().enumerate() {
        match cfg.monitor(m) {
            None => out.push((
                format!("pool[{i}].member[{j}].monitors[{k}]"),
                format!("no monitor named {m:?}"),
            )),
            Some(_) if link_monitor(cfg, m).is_none() => out.push((
                format!("pool[{i}].member[{j}].monitors[{k}]"),
                format!("monitor {m:?} has no `targets`: a link monitor names the targets it probes through the link"),
            )),
            Some(_) => {}
        }
    }
}

/// A `<key>6` address is the IPv6 next hop of a `<key>` that is IPv4: it must be IPv6, and
/// only stands beside an IPv4 `<key>`.
fn check_ipv6_beside(
    owner: &str,
    noun: &str,
    (key, first): (&str, std::net::IpAddr),
    (key6, second, path): (&str, Option<std::net::IpAddr>, String),
    out: &mut Errors,
) {
    match second {
        Some(a) if !a.is_ipv6() => out.push((
            path,
            format!("{a}: expected an IPv6 address (the {owner}'s IPv6 next hop; its IPv4 one is `{key}`)"),
        )),
        Some(a) if first.is_ipv6() => out.push((
            path,
            format!("{a}: `{key}` is already IPv6; `{key6}` is the IPv6 {noun} beside an IPv4 `{key}`"),
        )),
        _ => {}
    }
}

/// The address families of one link: `gateway6`, `snat6` and (when `gateway` is IPv6) `snat`
/// are IPv6; each source address, resolver and monitor target needs a next hop of its family.
fn check_link_families(
    cfg: &Config,
    l: &LinkMember,
    mp: &dyn Fn(&str) -> String,
    out: &mut Errors,
) {
    let (v4, v6) = (l.gateway_v4().is_some(), l.gateway_v6().is_some());
    let gateway6 = ("gateway6", l.gateway6, mp("gateway6"));
    check_ipv6_beside("line", "next hop", ("gateway", l.gateway), gateway6, out);
    match l.snat {
        Some(a @ std::net::IpAddr::V4(_)) if !v4 => out.push((
            mp("snat"),
            format!("{a}: an IPv4 source needs an IPv4 `gateway`; this link's is {}", l.gateway),
        )),
        Some(a @ std::net::IpAddr::V6(_)) if l.snat6.is_some() || !v6 => out.push((
            mp("snat"),
            format!("{a}: expected an address of the family of `gateway` ({}); the IPv6 source goes in `snat6`", l.gateway),
        )),
        _ => {}
    }
    match l.snat6 {
        Some(Snat6::To(a)) if !a.is_ipv6() => out.push((
            mp("snat6"),
            format!(
                "{a}: expected an IPv6 address or \"none\" (the source of the line's IPv6 flows)"
            ),
        )),
        Some(_) if !v6 => out.push((
            mp("snat6"),
            "the link has no IPv6 next hop: set `gateway6` (or an IPv6 `gateway`)".into(),
        )),
        _ => {}
    }
    if let Some(r) = l.resolver {
        if !has_next_hop(r.ip(), (v4, v6)) {
            out.push((
                mp("resolver"),
                format!(
                    "{r}: the link has no next hop of this address family (`gateway`, `gateway6`)"
                ),
            ));
        }
    }
    for m in l.monitors.iter().filter_map(|m| link_monitor(cfg, m)) {
        if let Some(t) = target_without_next_hop(m, (v4, v6)) {
            out.push((
                mp("monitors"),
                format!(
                    "monitor {:?} probes {} but the link has no next hop of its address family (`gateway`, `gateway6`)",
                    m.name, t.address
                ),
            ));
        }
    }
}

fn check_gateway_pool(cfg: &Config, i: usize, pool: &Pool, out: &mut Errors) {
    let at = |k: &str| format!("pool[{i}].{k}");
    check_algorithm(pool, GATEWAY_ALGORITHMS, "gateways", at("algorithm"), out);
    if pool.gateways.is_empty() {
        out.push((
            at("member"),
            "a gateway pool needs at least one gateway".into(),
        ));
    }
    if pool.busy.is_some() {
        out.push((
            at("busy"),
            "`busy` applies to link pools (kind = \"link\")".into(),
        ));
    }
    for (j, g) in pool.gateways.iter().enumerate() {
        check_gateway(cfg, i, j, g, out);
    }
}

fn check_gateway(cfg: &Config, i: usize, j: usize, g: &GatewayMember, out: &mut Errors) {
    let at = |k: &str| format!("pool[{i}].member[{j}].{k}");
    let address6 = ("address6", g.address6, at("address6"));
    check_ipv6_beside("gateway", "address", ("address", g.address), address6, out);
    let (v4, v6) = (g.address_v4().is_some(), g.address_v6().is_some());
    for (k, m) in g.monitors.iter().enumerate() {
        let Some(monitor) = link_monitor(cfg, m) else {
            out.push((
                format!("pool[{i}].member[{j}].monitors[{k}]"),
                format!("no monitor named {m:?} with `targets`"),
            ));
            continue;
        };
        if let Some(t) = target_without_next_hop(monitor, (v4, v6)) {
            out.push((
                format!("pool[{i}].member[{j}].monitors[{k}]"),
                format!(
                    "monitor {m:?} probes {} but the gateway has no address of its family (`address`, `address6`)",
                    t.address
                ),
            ));
        }
    }
}

fn check_service_pools_are_servers(cfg: &Config, out: &mut Errors) {
    for (i, vs) in cfg.virtual_services.iter().enumerate() {
        if let Some(k) = vs
            .pool
            .as_deref()
            .and_then(|p| pool_kind(cfg, p))
            .filter(|k| *k != PoolKind::Server)
        {
            out.push((
                format!("virtual_service[{i}].pool"),
                format!(
                    "pool {:?} is a {k} pool; a virtual service needs a pool of servers",
                    vs.pool.as_deref().unwrap_or_default()
                ),
            ));
        }
    }
}

fn check_outbounds(cfg: &Config, out: &mut Errors) {
    let earlier = earlier_same(cfg.outbound.iter().map(|o| o.name.as_str()));
    for ((i, o), first) in cfg.outbound.iter().enumerate().zip(earlier) {
        let at = |k: &str| format!("outbound[{i}].{k}");
        if let Some(first) = first {
            out.push((
                at("name"),
                format!("duplicate outbound {:?}: already outbound[{first}]", o.name),
            ));
        }
        match cfg.pool(&o.pool) {
            None => out.push((at("pool"), format!("no pool named {:?}", o.pool))),
            Some(p) if p.kind != PoolKind::Link => out.push((
                at("pool"),
                format!(
                    "pool {:?} is a {} pool; an outbound needs kind = \"link\"",
                    o.pool, p.kind
                ),
            )),
            Some(p) => check_outbound_against_pool(i, o, p, out),
        }
        if o.sources.is_empty() {
            out.push((at("sources"), "expected at least one prefix".into()));
        }
        check_outbound_proxies(i, o, out);
    }
}

/// `dns_proxy` and `dns_proxy6`: one address per family, each with sources of its family.
fn check_outbound_proxies(i: usize, o: &Outbound, out: &mut Errors) {
    let at = |k: &str| format!("outbound[{i}].{k}");
    if let Some(a) = o.dns_proxy6 {
        if !a.is_ipv6() {
            out.push((
                at("dns_proxy6"),
                format!("{a}: expected an IPv6 socket address such as \"[fd00::1]:53\" (the IPv4 proxy is `dns_proxy`)"),
            ));
        } else if o.dns_proxy.is_some_and(|p| p.is_ipv6()) {
            out.push((
                at("dns_proxy6"),
                "`dns_proxy` is already IPv6; `dns_proxy6` is the IPv6 proxy beside an IPv4 `dns_proxy`".into(),
            ));
        }
    }
    let sources = |v6: bool| o.sources.iter().any(|s| matches!(s, IpNet::V6(_)) == v6);
    for (key, proxy) in [("dns_proxy", o.dns_proxy), ("dns_proxy6", o.dns_proxy6)] {
        if let Some(a) = proxy.filter(|a| !sources(a.is_ipv6())) {
            out.push((
                at(key),
                format!(
                    "{a}: no prefix of this address family in `sources`, so no query would be sent here"
                ),
            ));
        }
    }
}

/// An outbound's rules name links of its pool, and its DNS proxy has a resolver to ask.
fn check_outbound_against_pool(i: usize, o: &Outbound, p: &Pool, out: &mut Errors) {
    for (r, rule) in o.rules.iter().enumerate() {
        if !p.links.iter().any(|l| l.name == rule.link) {
            let names: Vec<&str> = p.links.iter().map(|l| l.name.as_str()).collect();
            out.push((
                format!("outbound[{i}].rule[{r}].link"),
                format!(
                    "pool {:?} has no link named {:?}; its links: {}",
                    o.pool,
                    rule.link,
                    names.join(", ")
                ),
            ));
        }
    }
    for (j, s) in o.sources.iter().enumerate() {
        let (v6, family) = match s {
            IpNet::V4(_) => (false, "IPv4"),
            IpNet::V6(_) => (true, "IPv6"),
        };
        let routed = p.links.iter().any(|l| {
            if v6 {
                l.gateway_v6().is_some()
            } else {
                l.gateway_v4().is_some()
            }
        });
        if !routed {
            out.push((
                format!("outbound[{i}].sources[{j}]"),
                format!(
                    "{s}: no link of pool {:?} has an {family} next hop; expected `{}` on at least one link",
                    o.pool,
                    if v6 { "gateway6" } else { "gateway" }
                ),
            ));
            // One error per family is enough.
            break;
        }
    }
    if o.dns_proxy.is_some() && p.links.iter().all(|l| l.resolver.is_none()) {
        out.push((
            format!("outbound[{i}].dns_proxy"),
            format!(
                "no link of pool {:?} has a `resolver` to send queries to",
                o.pool
            ),
        ));
    }
}

/// Each outbound owns the links of its pool's routing tables; two outbounds on one pool would
/// fight over its slot map.
fn check_outbound_pools_unshared(cfg: &Config, out: &mut Errors) {
    if cfg.outbound.len() <= 1 {
        return;
    }
    let earlier = earlier_same(cfg.outbound.iter().map(|o| o.pool.as_str()));
    for ((i, o), first) in cfg.outbound.iter().enumerate().zip(earlier) {
        if let Some(first) = first {
            out.push((
                format!("outbound[{i}].pool"),
                format!(
                    "pool {:?} is already used by outbound[{first}]; add the sources there",
                    o.pool
                ),
            ));
        }
    }
}

fn check_gslb_site_links(cfg: &Config, out: &mut Errors) {
    for (i, site) in cfg.gslb.sites.iter().enumerate() {
        let Some(l) = &site.link else {
            continue;
        };
        let known = cfg
            .pools
            .iter()
            .filter(|p| p.kind == PoolKind::Link)
            .flat_map(|p| p.links.iter().map(|l| l.name.as_str()));
        if !known.clone().any(|n| n == l) {
            let hint = crate::error::did_you_mean(l, known)
                .map(|s| format!(" (did you mean {s:?}?)"))
                .unwrap_or_default();
            out.push((
                format!("gslb.site[{i}].link"),
                format!("no link named {l:?} in a kind = \"link\" pool{hint}"),
            ));
        }
    }
}

fn check_gateway_services(cfg: &Config, out: &mut Errors) {
    let earlier = earlier_same(cfg.gateway_services.iter().map(|g| g.name.as_str()));
    for ((i, g), first) in cfg.gateway_services.iter().enumerate().zip(earlier) {
        let at = |k: &str| format!("gateway_service[{i}].{k}");
        if let Some(first) = first {
            out.push((
                at("name"),
                format!(
                    "duplicate gateway_service {:?}: already gateway_service[{first}]",
                    g.name
                ),
            ));
        }
        match pool_kind(cfg, &g.pool) {
            None => out.push((at("pool"), format!("no pool named {:?}", g.pool))),
            Some(PoolKind::Gateway) => {}
            Some(k) => out.push((
                at("pool"),
                format!(
                    "pool {:?} is a {k} pool; a gateway_service needs kind = \"gateway\"",
                    g.pool
                ),
            )),
        }
        if g.interfaces.is_empty() {
            out.push((at("interfaces"), "expected at least one interface".into()));
        }
        if let Some(p) = cfg.pool(&g.pool).filter(|p| p.kind == PoolKind::Gateway) {
            let pi = cfg.pools.iter().position(|x| x.name == p.name).unwrap_or(0);
            for (j, m) in p.gateways.iter().enumerate() {
                if m.interface.is_none() {
                    out.push((
                        format!("pool[{pi}].member[{j}]"),
                        format!(
                            "gateway {} needs `interface` (where it is reached) to serve gateway_service {:?}",
                            m.address, g.name
                        ),
                    ));
                }
            }
        }
    }
}

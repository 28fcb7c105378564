//! Cross-checks of the `[[outbound]]`, link and gateway sections against the rest of the config.

use crate::link::{PoolKind, GATEWAY_ALGORITHMS, LINK_ALGORITHMS, LINK_ONLY_ALGORITHMS, MAX_LINKS};
use ipnet::IpNet;

use crate::member::Algorithm;
use crate::monitor::MonitorKind;
use crate::schema::Config;

/// Cross-checks of the link and gateway sections; returns (key path, message) pairs.
pub(crate) fn check(cfg: &Config, out: &mut Vec<(String, String)>) {
    let mut err = |p: String, m: String| out.push((p, m));
    let located = |p: &str| cfg.locations.contains(p);
    let monitor_kinds = [
        MonitorKind::Icmp,
        MonitorKind::Tcp,
        MonitorKind::Dns,
        MonitorKind::Http,
    ];
    for (i, m) in cfg.monitors.iter().enumerate() {
        let at = |k: &str| format!("monitor[{i}].{k}");
        if m.link.targets.is_empty() {
            if located(&at("up_when")) {
                err(at("up_when"), "`up_when` needs `targets`".into());
            }
            continue;
        }
        if !monitor_kinds.contains(&m.kind) {
            err(
                at("targets"),
                format!(
                    "a link monitor (with `targets`) is of type icmp, tcp, dns or http; this one is {}",
                    m.kind
                ),
            );
        }
        if m.link.up_when == 0 || m.link.up_when as usize > m.link.targets.len() {
            err(
                at("up_when"),
                format!(
                    "{} is out of range; expected 1 to the number of targets ({})",
                    m.link.up_when,
                    m.link.targets.len()
                ),
            );
        }
        if matches!(m.kind, MonitorKind::Tcp | MonitorKind::Http) {
            for (j, t) in m.link.targets.iter().enumerate() {
                if t.port.is_none() && m.port.is_none() && m.kind == MonitorKind::Tcp {
                    err(
                        format!("monitor[{i}].targets[{j}]"),
                        format!(
                            "a tcp probe needs a port: write \"{}:PORT\" or set `port`",
                            t.address
                        ),
                    );
                }
            }
        }
    }
    let link_monitor = |name: &str| cfg.monitor(name).filter(|m| !m.link.targets.is_empty());

    for (i, pool) in cfg.pools.iter().enumerate() {
        let at = |k: &str| format!("pool[{i}].{k}");
        match pool.kind {
            PoolKind::Server => {
                if LINK_ONLY_ALGORITHMS.contains(&pool.algorithm) {
                    err(
                        at("algorithm"),
                        format!(
                            "algorithm {} is for link pools (kind = \"link\"); this pool is of servers",
                            pool.algorithm
                        ),
                    );
                }
                if pool.busy.is_some() {
                    err(
                        at("busy"),
                        "`busy` applies to link pools (kind = \"link\")".into(),
                    );
                }
            }
            PoolKind::Link => {
                if !LINK_ALGORITHMS.contains(&pool.algorithm) {
                    err(
                        at("algorithm"),
                        format!(
                            "algorithm {} does not apply to links; expected one of: {}",
                            pool.algorithm,
                            LINK_ALGORITHMS
                                .iter()
                                .map(|a| a.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
                if pool.links.is_empty() {
                    err(at("member"), "a link pool needs at least one link".into());
                }
                if pool.links.len() > MAX_LINKS {
                    err(at("member"), format!("at most {MAX_LINKS} links per pool"));
                }
                if let Some(b) = pool.busy {
                    if !(b > 0.0 && b <= 1.0) {
                        err(
                            at("busy"),
                            format!("{b} is out of range; expected a share above 0 and at most 1"),
                        );
                    }
                }
                let needs_bw = matches!(
                    pool.algorithm,
                    Algorithm::BandwidthRatio
                        | Algorithm::Spillover
                        | Algorithm::WeightedLeastTraffic
                ) || pool.busy.is_some();
                let mut names = std::collections::HashMap::new();
                for (j, l) in pool.links.iter().enumerate() {
                    let mp = |k: &str| format!("pool[{i}].member[{j}].{k}");
                    if let Some(first) = names.insert(l.name.as_str(), j) {
                        err(
                            mp("name"),
                            format!(
                                "duplicate link {:?}: already pool[{i}].member[{first}]",
                                l.name
                            ),
                        );
                    }
                    if !l
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                        || l.name.is_empty()
                    {
                        err(
                            mp("name"),
                            format!("{:?}: a link name is letters, digits, '-' and '_'", l.name),
                        );
                    }
                    if !l.gateway.is_ipv4() {
                        err(
                            mp("gateway"),
                            "links are IPv4 today: expected an IPv4 next hop".into(),
                        );
                    }
                    if let Some(s) = l.snat.filter(|s| !s.is_ipv4()) {
                        err(mp("snat"), format!("{s}: expected an IPv4 address"));
                    }
                    if needs_bw && l.bandwidth.is_none() {
                        err(
                            mp("bandwidth"),
                            format!(
                                "link {:?} needs `bandwidth = {{ up, down }}` (algorithm {}{})",
                                l.name,
                                pool.algorithm,
                                if pool.busy.is_some() { ", busy" } else { "" }
                            ),
                        );
                    }
                    if let Some(isp) = &l.isp {
                        if !cfg.ip_tables.iter().any(|t| &t.name == isp) {
                            let hint = crate::error::did_you_mean(
                                isp,
                                cfg.ip_tables.iter().map(|t| t.name.as_str()),
                            )
                            .map(|s| format!(" (did you mean {s:?}?)"))
                            .unwrap_or_default();
                            err(mp("isp"), format!("no ip_table named {isp:?}{hint}"));
                        }
                    }
                    for (k, m) in l.monitors.iter().enumerate() {
                        match cfg.monitor(m) {
                            None => err(
                                format!("pool[{i}].member[{j}].monitors[{k}]"),
                                format!("no monitor named {m:?}"),
                            ),
                            Some(_) if link_monitor(m).is_none() => err(
                                format!("pool[{i}].member[{j}].monitors[{k}]"),
                                format!("monitor {m:?} has no `targets`: a link monitor names the targets it probes through the link"),
                            ),
                            Some(_) => {}
                        }
                    }
                }
                if pool.algorithm == Algorithm::Proximity
                    && pool.links.iter().all(|l| l.isp.is_none())
                {
                    err(
                        at("algorithm"),
                        "proximity needs `isp` (an ip_table) on at least one link".into(),
                    );
                }
                if !pool.members.is_empty() || !pool.monitors.is_empty() {
                    err(
                        at("monitors"),
                        "a link pool's monitors are set per link (member key `monitors`)".into(),
                    );
                }
            }
            PoolKind::Gateway => {
                if !GATEWAY_ALGORITHMS.contains(&pool.algorithm) {
                    err(
                        at("algorithm"),
                        format!(
                            "algorithm {} does not apply to gateways; expected one of: round_robin, weighted_round_robin, hash",
                            pool.algorithm
                        ),
                    );
                }
                if pool.gateways.is_empty() {
                    err(
                        at("member"),
                        "a gateway pool needs at least one gateway".into(),
                    );
                }
                if pool.busy.is_some() {
                    err(
                        at("busy"),
                        "`busy` applies to link pools (kind = \"link\")".into(),
                    );
                }
                for (j, g) in pool.gateways.iter().enumerate() {
                    if !g.address.is_ipv4() {
                        err(
                            format!("pool[{i}].member[{j}].address"),
                            "gateways are IPv4 today: expected an IPv4 next hop".into(),
                        );
                    }
                    for (k, m) in g.monitors.iter().enumerate() {
                        if link_monitor(m).is_none() {
                            err(
                                format!("pool[{i}].member[{j}].monitors[{k}]"),
                                format!("no monitor named {m:?} with `targets`"),
                            );
                        }
                    }
                }
            }
        }
    }

    let pool_kind = |name: &str| cfg.pool(name).map(|p| p.kind);
    for (i, vs) in cfg.virtual_services.iter().enumerate() {
        if let Some(k) = vs
            .pool
            .as_deref()
            .and_then(pool_kind)
            .filter(|k| *k != PoolKind::Server)
        {
            err(
                format!("virtual_service[{i}].pool"),
                format!(
                    "pool {:?} is a {k} pool; a virtual service needs a pool of servers",
                    vs.pool.as_deref().unwrap_or_default()
                ),
            );
        }
    }
    let mut names = std::collections::HashMap::new();
    for (i, o) in cfg.outbound.iter().enumerate() {
        let at = |k: &str| format!("outbound[{i}].{k}");
        if let Some(first) = names.insert(o.name.as_str(), i) {
            err(
                at("name"),
                format!("duplicate outbound {:?}: already outbound[{first}]", o.name),
            );
        }
        match cfg.pool(&o.pool) {
            None => err(at("pool"), format!("no pool named {:?}", o.pool)),
            Some(p) if p.kind != PoolKind::Link => err(
                at("pool"),
                format!(
                    "pool {:?} is a {} pool; an outbound needs kind = \"link\"",
                    o.pool, p.kind
                ),
            ),
            Some(p) => {
                for (r, rule) in o.rules.iter().enumerate() {
                    if !p.links.iter().any(|l| l.name == rule.link) {
                        let names: Vec<&str> = p.links.iter().map(|l| l.name.as_str()).collect();
                        err(
                            format!("outbound[{i}].rule[{r}].link"),
                            format!(
                                "pool {:?} has no link named {:?}; its links: {}",
                                o.pool,
                                rule.link,
                                names.join(", ")
                            ),
                        );
                    }
                }
                if o.dns_proxy.is_some() && p.links.iter().all(|l| l.resolver.is_none()) {
                    err(
                        at("dns_proxy"),
                        format!(
                            "no link of pool {:?} has a `resolver` to send queries to",
                            o.pool
                        ),
                    );
                }
            }
        }
        if o.sources.is_empty() {
            err(at("sources"), "expected at least one prefix".into());
        }
        if let Some((j, s)) = o
            .sources
            .iter()
            .enumerate()
            .find(|(_, s)| !matches!(s, IpNet::V4(_)))
        {
            err(
                format!("outbound[{i}].sources[{j}]"),
                format!("{s}: links are IPv4 today"),
            );
        }
    }
    if cfg.outbound.len() > 1 {
        // Each outbound owns the links of its pool's routing tables; two outbounds on one pool
        // would fight over its slot map.
        let mut by_pool = std::collections::HashMap::new();
        for (i, o) in cfg.outbound.iter().enumerate() {
            if let Some(first) = by_pool.insert(o.pool.as_str(), i) {
                err(
                    format!("outbound[{i}].pool"),
                    format!(
                        "pool {:?} is already used by outbound[{first}]; add the sources there",
                        o.pool
                    ),
                );
            }
        }
    }
    for (i, site) in cfg.gslb.sites.iter().enumerate() {
        if let Some(l) = &site.link {
            let known = cfg
                .pools
                .iter()
                .filter(|p| p.kind == PoolKind::Link)
                .flat_map(|p| p.links.iter().map(|l| l.name.as_str()));
            if !known.clone().any(|n| n == l) {
                let hint = crate::error::did_you_mean(l, known)
                    .map(|s| format!(" (did you mean {s:?}?)"))
                    .unwrap_or_default();
                err(
                    format!("gslb.site[{i}].link"),
                    format!("no link named {l:?} in a kind = \"link\" pool{hint}"),
                );
            }
        }
    }
    let mut names = std::collections::HashMap::new();
    for (i, g) in cfg.gateway_services.iter().enumerate() {
        let at = |k: &str| format!("gateway_service[{i}].{k}");
        if let Some(first) = names.insert(g.name.as_str(), i) {
            err(
                at("name"),
                format!(
                    "duplicate gateway_service {:?}: already gateway_service[{first}]",
                    g.name
                ),
            );
        }
        match pool_kind(&g.pool) {
            None => err(at("pool"), format!("no pool named {:?}", g.pool)),
            Some(PoolKind::Gateway) => {}
            Some(k) => err(
                at("pool"),
                format!(
                    "pool {:?} is a {k} pool; a gateway_service needs kind = \"gateway\"",
                    g.pool
                ),
            ),
        }
        if g.interfaces.is_empty() {
            err(at("interfaces"), "expected at least one interface".into());
        }
        if let Some(p) = cfg.pool(&g.pool).filter(|p| p.kind == PoolKind::Gateway) {
            let pi = cfg.pools.iter().position(|x| x.name == p.name).unwrap_or(0);
            for (j, m) in p.gateways.iter().enumerate() {
                if m.interface.is_none() {
                    err(
                        format!("pool[{pi}].member[{j}]"),
                        format!(
                            "gateway {} needs `interface` (where it is reached) to serve gateway_service {:?}",
                            m.address, g.name
                        ),
                    );
                }
            }
        }
    }
}

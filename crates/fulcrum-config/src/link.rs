//! Link and gateway load balancing: `kind = "link" | "gateway"` pools and
//! their members, the link keys of a monitor (`targets`, `up_when`), `[[outbound]]` and
//! `[[gateway_service]]`, and the checks that tie them together.
//!
//! They live apart from `schema.rs` so the server pools' tables stay readable; `schema.rs` only
//! calls in here.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::reader::{Cx, FromNode, Node, Shape, TableReader};
use crate::schema::{AdminState, Algorithm, Config, MonitorKind, MAX_WEIGHT};
use crate::string_enum;
use crate::types::read_table;

string_enum!(
    /// What a pool's members are: servers (default), links (ISP lines for outbound
    /// flows) or gateways (next hops of a firewall sandwich).
    PoolKind {
        Server = "server",
        Link = "link",
        Gateway = "gateway",
    }
);

/// Bit rates of a link (`bandwidth = { up = "100Mbit", down = "100Mbit" }`), in bits per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bandwidth {
    pub up: u64,
    pub down: u64,
}

/// Parses a bit rate the way tc writes them: "100Mbit", "1Gbit", "512kbit", "2500000" (bit/s).
/// Decimal units (k = 1000), as ISPs sell lines.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a rate such as \"100Mbit\""))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "bit" | "bps" => 1,
        "kbit" | "kbps" => 1_000,
        "mbit" | "mbps" => 1_000_000,
        "gbit" | "gbps" => 1_000_000_000,
        other => {
            return Err(format!(
                "unknown rate unit {other:?}; expected bit, kbit, Mbit or Gbit"
            ))
        }
    };
    match n.checked_mul(mult) {
        Some(0) => Err("a rate must be larger than 0".into()),
        Some(v) => Ok(v),
        None => Err("too large".into()),
    }
}

struct Rate(u64);

impl FromNode for Rate {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        let r = match node.shape() {
            Shape::Str(s) => parse_rate(s),
            Shape::Int(i) if i > 0 => Ok(i as u64),
            _ => Err(format!(
                "expected a rate such as \"100Mbit\", found {}",
                node.type_name()
            )),
        };
        match r {
            Ok(v) => Some(Rate(v)),
            Err(e) => {
                cx.error(node, e);
                None
            }
        }
    }
}

impl FromNode for Bandwidth {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let up = t.req::<Rate>(cx, "up");
            let down = t.req::<Rate>(cx, "down");
            Some(Bandwidth {
                up: up?.0,
                down: down?.0,
            })
        })
    }
}

/// A member of a `kind = "link"` pool: one ISP line.
#[derive(Debug, Clone)]
pub struct LinkMember {
    pub name: String,
    /// The interface flows leave through.
    pub interface: String,
    /// The ISP's next hop on that interface.
    pub gateway: IpAddr,
    /// Source address of flows leaving through the link (default: the interface's own, i.e.
    /// masquerade).
    pub snat: Option<IpAddr>,
    pub bandwidth: Option<Bandwidth>,
    /// The ip_table of destinations this link reaches best (proximity).
    pub isp: Option<String>,
    /// This ISP's DNS resolver, for the transparent DNS proxy.
    pub resolver: Option<SocketAddr>,
    pub monitors: Vec<String>,
    pub weight: u32,
    pub priority: i32,
    pub state: AdminState,
}

/// Linux's IFNAMSIZ less the terminating NUL.
const IFNAME_MAX: usize = 15;

/// What an interface name may be here: the names reach the nftables ruleset Fulcrum writes
/// (inside quotes), where a quote, a brace or a newline would change the ruleset. Letters,
/// digits, '.', '_' and '-' are what interfaces are named in practice and what nft accepts
/// in a quoted name; `.` and `..` are refused by the kernel.
fn ifname_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= IFNAME_MAX
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Refuses, at its own line, an interface name (or array of them) under `key` that
/// `ifname_ok` refuses; reading the value itself is left to the caller.
fn check_ifnames(t: &mut TableReader<'_>, cx: &mut Cx<'_>, key: &'static str) {
    let Some(node) = t.node(key) else { return };
    let items = match node.shape() {
        Shape::Array(items) => items,
        _ => vec![node],
    };
    for item in items {
        if let Shape::Str(s) = item.shape() {
            if !ifname_ok(s) {
                cx.error(
                    &item,
                    format!("{s:?} is not an interface name: expected 1 to 15 characters of letters, digits, '.', '_' and '-'"),
                );
            }
        }
    }
}

impl FromNode for LinkMember {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req::<String>(cx, "name");
            let interface = t.req::<String>(cx, "interface");
            check_ifnames(t, cx, "interface");
            let gateway = t.req(cx, "gateway");
            let weight = t.opt(cx, "weight").unwrap_or(1);
            if weight > MAX_WEIGHT {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.weight", t.path()),
                    format!("{weight} is too large; expected 0 to {MAX_WEIGHT}"),
                );
            }
            let resolver = t.node("resolver").and_then(|n| socket_or_ip(&n, cx, 53));
            Some(LinkMember {
                snat: t.opt(cx, "snat"),
                bandwidth: t.opt(cx, "bandwidth"),
                isp: t.opt(cx, "isp"),
                resolver,
                monitors: t.opt(cx, "monitors").unwrap_or_default(),
                weight,
                priority: t.opt(cx, "priority").unwrap_or(0),
                state: t.opt(cx, "state").unwrap_or(AdminState::Enabled),
                name: name?,
                interface: interface?,
                gateway: gateway?,
            })
        })
    }
}

/// `"198.51.100.53"` or `"198.51.100.53:5353"`.
fn socket_or_ip(node: &Node<'_>, cx: &mut Cx<'_>, default_port: u16) -> Option<SocketAddr> {
    if let Shape::Str(s) = node.shape() {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Some(a);
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Some(SocketAddr::new(ip, default_port));
        }
    }
    cx.error(
        node,
        "expected an address such as \"198.51.100.53\" or \"198.51.100.53:53\"",
    );
    None
}

/// A member of a `kind = "gateway"` pool: a firewall (or any router) as a next hop.
#[derive(Debug, Clone)]
pub struct GatewayMember {
    /// The gateway's address on this side (the next hop flows are sent to).
    pub address: IpAddr,
    /// The gateway's identity in the flow hash (default: its position, "#1", "#2", …): both
    /// sides of a sandwich must give a gateway the same name to hash flows alike.
    pub name: Option<String>,
    /// The interface the gateway is reached on.
    pub interface: Option<String>,
    pub monitors: Vec<String>,
    pub weight: u32,
    pub state: AdminState,
}

impl FromNode for GatewayMember {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let address = t.req(cx, "address");
            let weight = t.opt(cx, "weight").unwrap_or(1);
            if weight > MAX_WEIGHT {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.weight", t.path()),
                    format!("{weight} is too large; expected 0 to {MAX_WEIGHT}"),
                );
            }
            let interface = t.opt(cx, "interface");
            check_ifnames(t, cx, "interface");
            Some(GatewayMember {
                name: t.opt(cx, "name"),
                interface,
                monitors: t.opt(cx, "monitors").unwrap_or_default(),
                weight,
                state: t.opt(cx, "state").unwrap_or(AdminState::Enabled),
                address: address?,
            })
        })
    }
}

/// One target of a link monitor: an address, and a port for tcp/dns/http probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkTarget {
    pub address: IpAddr,
    pub port: Option<u16>,
}

impl FromNode for LinkTarget {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        if let Shape::Str(s) = node.shape() {
            if let Ok(a) = s.parse::<SocketAddr>() {
                return Some(LinkTarget {
                    address: a.ip(),
                    port: Some(a.port()),
                });
            }
            if let Ok(ip) = s.parse::<IpAddr>() {
                return Some(LinkTarget {
                    address: ip,
                    port: None,
                });
            }
        }
        cx.error(
            node,
            "expected a target address such as \"198.51.100.1\" or \"198.51.100.1:443\"",
        );
        None
    }
}

/// The link keys of a `[[monitor]]`: probed out of the link being checked, to these targets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkProbe {
    pub targets: Vec<LinkTarget>,
    /// The link is up while at least this many targets answer (default 1).
    pub up_when: u32,
}

impl LinkProbe {
    /// Reads the link keys of a `[[monitor]]` table.
    pub fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> LinkProbe {
        LinkProbe {
            targets: t.opt(cx, "targets").unwrap_or_default(),
            up_when: t.opt(cx, "up_when").unwrap_or(1),
        }
    }
}

string_enum!(
    /// How an outbound flow's link is kept: per flow (default) or per client address.
    OutboundPersistence {
        BySource = "by-source",
        SourceIp = "source_ip",
    }
);

/// `[[outbound]]`: link load balancing of flows leaving the LAN.
#[derive(Debug, Clone)]
pub struct Outbound {
    pub name: String,
    /// Client prefixes whose new flows are balanced over the links.
    pub sources: Vec<IpNet>,
    /// A `kind = "link"` pool.
    pub pool: String,
    pub persistence: Option<OutboundPersistence>,
    /// Where LAN DNS queries are intercepted (transparent DNS proxy).
    pub dns_proxy: Option<SocketAddr>,
}

impl FromNode for Outbound {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let sources = t.req(cx, "sources");
            let pool = t.req(cx, "pool");
            Some(Outbound {
                persistence: t.opt(cx, "persistence"),
                dns_proxy: t.opt(cx, "dns_proxy"),
                name: name?,
                sources: sources?,
                pool: pool?,
            })
        })
    }
}

string_enum!(
    /// How a gateway service hashes a flow onto a gateway.
    GatewayHash {
        /// (source, destination) in sorted order, so both directions pick the same gateway.
        Symmetric = "symmetric",
    }
);

/// `[[gateway_service]]`: a firewall sandwich side.
#[derive(Debug, Clone)]
pub struct GatewayService {
    pub name: String,
    /// The interfaces whose forwarded flows are spread over the gateways.
    pub interfaces: Vec<String>,
    /// A `kind = "gateway"` pool.
    pub pool: String,
    pub hash: GatewayHash,
}

impl FromNode for GatewayService {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let interfaces = t.req(cx, "interfaces");
            check_ifnames(t, cx, "interfaces");
            let pool = t.req(cx, "pool");
            Some(GatewayService {
                hash: t.opt(cx, "hash").unwrap_or(GatewayHash::Symmetric),
                name: name?,
                interfaces: interfaces?,
                pool: pool?,
            })
        })
    }
}

/// Algorithms only link pools take.
pub const LINK_ONLY_ALGORITHMS: &[Algorithm] = &[
    Algorithm::BandwidthRatio,
    Algorithm::Proximity,
    Algorithm::Rtt,
    Algorithm::Spillover,
];

/// Algorithms a link pool takes: per-request measures (response time, requests) mean nothing
/// for a line that carries whole flows.
pub const LINK_ALGORITHMS: &[Algorithm] = &[
    Algorithm::RoundRobin,
    Algorithm::WeightedRoundRobin,
    Algorithm::LeastConnections,
    Algorithm::WeightedLeastConnections,
    Algorithm::WeightedLeastTraffic,
    Algorithm::Hash,
    Algorithm::Priority,
    Algorithm::FirstAvailable,
    Algorithm::BandwidthRatio,
    Algorithm::Proximity,
    Algorithm::Rtt,
    Algorithm::Spillover,
];

/// Algorithms a gateway pool takes: the kernel spreads flows by a symmetric hash, so only the
/// members' shares matter.
pub const GATEWAY_ALGORITHMS: &[Algorithm] = &[
    Algorithm::RoundRobin,
    Algorithm::WeightedRoundRobin,
    Algorithm::Hash,
];

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

/// Links per pool: each takes a connection mark and a routing table.
pub const MAX_LINKS: usize = 32;

#[cfg(test)]
mod tests {
    use crate::{parse, Algorithm, PoolKind};
    use std::path::Path;

    const GOOD: &str = r#"
[[monitor]]
name = "probe"
type = "icmp"
targets = ["198.51.100.1", "198.51.100.2", "198.51.100.3"]
up_when = 2

[[ip_table]]
name = "telecom"
cidrs = ["198.51.100.0/24"]

[[pool]]
name = "uplinks"
kind = "link"
algorithm = "weighted_least_traffic"
busy = 0.8
[[pool.member]]
name = "telecom"
interface = "wan0"
gateway = "203.0.113.1"
snat = "203.0.113.10"
bandwidth = { up = "100Mbit", down = "1Gbit" }
isp = "telecom"
resolver = "203.0.113.53"
monitors = ["probe"]
[[pool.member]]
name = "unicom"
interface = "wan1"
gateway = "192.0.2.1"
bandwidth = { up = 50000000, down = "50Mbit" }

[[pool]]
name = "firewalls"
kind = "gateway"
[[pool.member]]
address = "198.18.10.2"
interface = "fw0"
[[pool.member]]
address = "198.18.10.3"
name = "fw-b"
interface = "fw1"

[[outbound]]
name = "lan"
sources = ["10.0.0.0/8"]
pool = "uplinks"
persistence = "by-source"

[[gateway_service]]
name = "fw"
interfaces = ["inside0", "outside0"]
pool = "firewalls"
hash = "symmetric"
"#;

    fn errors(text: &str) -> String {
        match parse(text, "t.toml", Path::new(".")) {
            Ok(_) => String::new(),
            Err(e) => e.messages().join("\n"),
        }
    }

    #[test]
    fn the_contract_reads() {
        let c = parse(GOOD, "t.toml", Path::new(".")).unwrap();
        let p = c.pool("uplinks").unwrap();
        assert_eq!(p.kind, PoolKind::Link);
        assert_eq!(p.algorithm, Algorithm::WeightedLeastTraffic);
        assert_eq!(p.busy, Some(0.8));
        let l = &p.links[0];
        assert_eq!(l.bandwidth.unwrap().up, 100_000_000);
        assert_eq!(l.bandwidth.unwrap().down, 1_000_000_000);
        assert_eq!(l.resolver.unwrap().to_string(), "203.0.113.53:53");
        assert_eq!(p.links[1].bandwidth.unwrap().up, 50_000_000);
        assert_eq!(c.monitors[0].link.up_when, 2);
        assert_eq!(c.monitors[0].link.targets.len(), 3);
        assert_eq!(c.pool("firewalls").unwrap().gateways.len(), 2);
        assert!(c.outbound[0].persistence.is_some());
        assert_eq!(c.gateway_services[0].interfaces.len(), 2);
        let e = errors(&GOOD.replace("interface = \"fw0\"\n", ""));
        assert!(
            e.contains("pool[1].member[0]") && e.contains("needs `interface`"),
            "{e}"
        );
    }

    #[test]
    fn errors_are_located_and_cross_checked() {
        let e = errors(&GOOD.replace("gateway = \"192.0.2.1\"", "gatway = \"192.0.2.1\""));
        assert!(
            e.contains("unknown key `gatway`") && e.contains("did you mean `gateway`"),
            "{e}"
        );
        assert!(e.contains("t.toml:"), "{e}");
        let e = errors(&GOOD.replace("up = \"100Mbit\"", "up = \"100 parsecs\""));
        assert!(e.contains("pool[0].member[0].bandwidth.up"), "{e}");
        let e = errors(&GOOD.replace("up_when = 2", "up_when = 4"));
        assert!(
            e.contains("monitor[0].up_when") && e.contains("1 to the number of targets (3)"),
            "{e}"
        );
        let e = errors(&GOOD.replace("pool = \"uplinks\"", "pool = \"firewalls\""));
        assert!(
            e.contains("outbound[0].pool") && e.contains("kind = \"link\""),
            "{e}"
        );
        let e = errors(&GOOD.replace("pool = \"firewalls\"\nhash", "pool = \"uplinks\"\nhash"));
        assert!(e.contains("gateway_service[0].pool"), "{e}");
        let e = errors(&GOOD.replace("isp = \"telecom\"", "isp = \"telcom\""));
        assert!(
            e.contains("no ip_table named \"telcom\"") && e.contains("did you mean"),
            "{e}"
        );
        let e = errors(&GOOD.replace("bandwidth = { up = 50000000, down = \"50Mbit\" }", ""));
        assert!(
            e.contains("pool[0].member[1].bandwidth") && e.contains("busy"),
            "{e}"
        );
        let e = errors(&GOOD.replace("busy = 0.8", "busy = 1.5"));
        assert!(e.contains("pool[0].busy"), "{e}");
        let e = errors(&GOOD.replace(
            "interface = \"wan0\"",
            "interface = \"a-very-long-interface\"",
        ));
        assert!(e.contains("pool[0].member[0].interface"), "{e}");
        // A link algorithm on a server pool, and `busy` there.
        let e = errors("[[pool]]\nname = \"p\"\nalgorithm = \"spillover\"\nbusy = 0.5\nmember = [{ address = \"127.0.0.1:80\" }]\n");
        assert!(
            e.contains("pool[0].algorithm") && e.contains("for link pools"),
            "{e}"
        );
        assert!(e.contains("pool[0].busy"), "{e}");
        // Link members need a name; a server pool's members need an address.
        let e = errors("[[pool]]\nname = \"p\"\nkind = \"link\"\nmember = [{ interface = \"wan0\", gateway = \"192.0.2.1\" }]\n");
        assert!(e.contains("missing required key `name`"), "{e}");
        let e = errors(&format!(
            "{GOOD}\n[[gslb.site]]\nname = \"s\"\naddresses = [\"192.0.2.10\"]\nlink = \"telecon\"\n"
        ));
        assert!(
            e.contains("gslb.site[0].link") && e.contains("did you mean \"telecom\""),
            "{e}"
        );
        let e = errors(&GOOD.replace("monitors = [\"probe\"]", "monitors = [\"prob\"]"));
        assert!(e.contains("no monitor named \"prob\""), "{e}");
    }
}

//! Link and gateway load balancing: `kind = "link" | "gateway"` pools and
//! their members, the link keys of a monitor (`targets`, `up_when`), `[[outbound]]` and
//! `[[gateway_service]]`, and the checks that tie them together.
//!
//! They live apart from `schema.rs` so the server pools' tables stay readable; `schema.rs` only
//! calls in here.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::member::{read_weight, AdminState, Algorithm};
use crate::reader::{Cx, FromNode, Node, Shape, TableReader};
use crate::string_enum;
use crate::types::{ifname_ok, read_table};

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
            let weight = read_weight(node, t, cx);
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
            let weight = read_weight(node, t, cx);
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
    /// `[[outbound.rule]]`: links chosen by protocol and destination port, first match wins,
    /// ahead of the pool's algorithm.
    pub rules: Vec<OutboundRule>,
}

string_enum!(
    /// The transport protocol an outbound rule matches.
    L4Protocol {
        Tcp = "tcp",
        Udp = "udp",
    }
);

/// One `[[outbound.rule]]`: new flows of these protocols to these destination ports leave by
/// `link` while it is up.
#[derive(Debug, Clone)]
pub struct OutboundRule {
    pub name: Option<String>,
    /// Empty: tcp and udp.
    pub protocol: Vec<L4Protocol>,
    /// Empty: every port.
    pub destination_port: Vec<std::ops::RangeInclusive<u16>>,
    /// The name of a member of the outbound's pool.
    pub link: String,
}

impl FromNode for OutboundRule {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let link = t.req(cx, "link");
            Some(OutboundRule {
                name: t.opt(cx, "name"),
                protocol: t
                    .opt::<crate::types::OneOrMany<L4Protocol>>(cx, "protocol")
                    .map(|p| p.0)
                    .unwrap_or_default(),
                destination_port: t
                    .opt::<crate::types::OneOrMany<crate::rule::PortSpec>>(cx, "destination_port")
                    .map(|m| m.0.into_iter().map(|p| p.0).collect())
                    .unwrap_or_default(),
                link: link?,
            })
        })
    }
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
                rules: t.opt(cx, "rule").unwrap_or_default(),
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

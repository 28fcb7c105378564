//! Link and gateway load balancing: `kind = "link" | "gateway"` pools and
//! their members, the link keys of a monitor (`targets`, `up_when`), `[[outbound]]` and
//! `[[gateway_service]]`, and the checks that tie them together.
//!
//! They live apart from `schema.rs` so the server pools' tables stay readable; `schema.rs` only
//! calls in here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

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
    /// The ISP's next hop on that interface (IPv4 or IPv6).
    pub gateway: IpAddr,
    /// The IPv6 next hop of a dual-stack line whose `gateway` is IPv4 (`validate` refuses any
    /// other address family here).
    pub gateway6: Option<IpAddr>,
    /// Source address of flows leaving through the link, of `gateway`'s family (default: the
    /// interface's own, i.e. masquerade).
    pub snat: Option<IpAddr>,
    /// IPv6 flows of a dual-stack line: an address to `snat` to, or no NAT at all.
    pub snat6: Option<Snat6>,
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
                gateway6: t.opt(cx, "gateway6"),
                snat: t.opt(cx, "snat"),
                snat6: t.opt(cx, "snat6"),
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

/// `snat6` of a link: the source address of its IPv6 flows, or `"none"` (the LAN's prefix is
/// routed, or translated by NPTv6 elsewhere: flows leave with their own source).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snat6 {
    /// `snat6 = "2001:db8::10"` (`validate` refuses an IPv4 address here).
    To(IpAddr),
    /// `snat6 = "none"`.
    Off,
}

impl FromNode for Snat6 {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        if let Shape::Str(s) = node.shape() {
            if s == "none" {
                return Some(Snat6::Off);
            }
            if let Ok(a) = s.parse::<IpAddr>() {
                return Some(Snat6::To(a));
            }
        }
        cx.error(
            node,
            "expected an IPv6 address such as \"2001:db8:1::10\", or \"none\" (no source NAT)",
        );
        None
    }
}

/// How a link's flows of one family leave: source NAT to an address, masquerade (the
/// interface's own address) or untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkNat<A> {
    To(A),
    Masquerade,
    Off,
}

impl<A: Copy> LinkNat<A> {
    /// The source address probes and DNS queries out of the link bind to, if fixed.
    pub fn address(&self) -> Option<A> {
        match self {
            LinkNat::To(a) => Some(*a),
            LinkNat::Masquerade | LinkNat::Off => None,
        }
    }
}

impl LinkMember {
    /// The IPv4 next hop: `gateway` when it is IPv4.
    pub fn gateway_v4(&self) -> Option<Ipv4Addr> {
        match self.gateway {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }

    /// The IPv6 next hop: `gateway6`, or `gateway` when it is IPv6.
    pub fn gateway_v6(&self) -> Option<Ipv6Addr> {
        match (self.gateway6, self.gateway) {
            (Some(IpAddr::V6(a)), _) | (None, IpAddr::V6(a)) => Some(a),
            _ => None,
        }
    }

    /// Source NAT of the link's IPv4 flows.
    pub fn nat_v4(&self) -> LinkNat<Ipv4Addr> {
        match self.snat {
            Some(IpAddr::V4(a)) => LinkNat::To(a),
            _ => LinkNat::Masquerade,
        }
    }

    /// Source NAT of the link's IPv6 flows: `snat6`, else `snat` when it is IPv6, else
    /// masquerade.
    pub fn nat_v6(&self) -> LinkNat<Ipv6Addr> {
        match (self.snat6, self.snat) {
            (Some(Snat6::Off), _) => LinkNat::Off,
            (Some(Snat6::To(IpAddr::V6(a))), _) | (None, Some(IpAddr::V6(a))) => LinkNat::To(a),
            _ => LinkNat::Masquerade,
        }
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
    /// The gateway's address on this side (the next hop flows are sent to), IPv4 or IPv6.
    pub address: IpAddr,
    /// The IPv6 address of a dual-stack gateway whose `address` is IPv4.
    pub address6: Option<IpAddr>,
    /// The gateway's identity in the flow hash (default: its position, "#1", "#2", …): both
    /// sides of a sandwich must give a gateway the same name to hash flows alike.
    pub name: Option<String>,
    /// The interface the gateway is reached on.
    pub interface: Option<String>,
    pub monitors: Vec<String>,
    pub weight: u32,
    pub state: AdminState,
}

impl GatewayMember {
    /// The IPv4 next hop: `address` when it is IPv4.
    pub fn address_v4(&self) -> Option<Ipv4Addr> {
        match self.address {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }

    /// The IPv6 next hop: `address6`, or `address` when it is IPv6.
    pub fn address_v6(&self) -> Option<Ipv6Addr> {
        match (self.address6, self.address) {
            (Some(IpAddr::V6(a)), _) | (None, IpAddr::V6(a)) => Some(a),
            _ => None,
        }
    }
}

impl FromNode for GatewayMember {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let address = t.req(cx, "address");
            let weight = read_weight(node, t, cx);
            let interface = t.opt(cx, "interface");
            check_ifnames(t, cx, "interface");
            Some(GatewayMember {
                address6: t.opt(cx, "address6"),
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

impl Outbound {
    /// The proxy of IPv4 queries.
    pub fn dns_proxy_v4(&self) -> Option<std::net::SocketAddrV4> {
        match self.dns_proxy {
            Some(SocketAddr::V4(a)) => Some(a),
            _ => None,
        }
    }

    /// The proxy of IPv6 queries: `dns_proxy6`, or `dns_proxy` when it is IPv6.
    pub fn dns_proxy_v6(&self) -> Option<std::net::SocketAddrV6> {
        match (self.dns_proxy6, self.dns_proxy) {
            (Some(SocketAddr::V6(a)), _) | (None, Some(SocketAddr::V6(a))) => Some(a),
            _ => None,
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
    /// Where LAN DNS queries are intercepted (transparent DNS proxy), IPv4 or IPv6.
    pub dns_proxy: Option<SocketAddr>,
    /// The IPv6 proxy of a dual-stack LAN whose `dns_proxy` is IPv4.
    pub dns_proxy6: Option<SocketAddr>,
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
                dns_proxy6: t.opt(cx, "dns_proxy6"),
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

    /// Dual-stack links: `gateway6`/`snat6` beside IPv4 ones, or IPv6 `gateway`/`snat` alone;
    /// what cannot work is refused at its key.
    #[test]
    fn ipv6_links_read_and_what_cannot_work_is_refused() {
        let dual = GOOD
            .replace(
                "snat = \"203.0.113.10\"",
                "snat = \"203.0.113.10\"\ngateway6 = \"2001:db8:1::1\"\nsnat6 = \"2001:db8:1::10\"",
            )
            .replace(
                "gateway = \"192.0.2.1\"",
                "gateway = \"2001:db8:2::1\"\nsnat6 = \"none\"",
            )
            .replace(
                "sources = [\"10.0.0.0/8\"]",
                "sources = [\"10.0.0.0/8\", \"fd00:100::/64\"]\ndns_proxy = \"10.0.0.1:53\"\ndns_proxy6 = \"[fd00:100::1]:53\"",
            );
        let c = parse(&dual, "t.toml", Path::new(".")).unwrap();
        let p = c.pool("uplinks").unwrap();
        let (a, b) = (&p.links[0], &p.links[1]);
        assert_eq!(a.gateway_v6().unwrap().to_string(), "2001:db8:1::1");
        assert_eq!(
            a.nat_v6(),
            crate::LinkNat::To("2001:db8:1::10".parse().unwrap())
        );
        assert_eq!(b.gateway_v4(), None);
        assert_eq!(b.nat_v6(), crate::LinkNat::Off);
        assert_eq!(
            c.outbound[0].dns_proxy_v6().unwrap().to_string(),
            "[fd00:100::1]:53"
        );

        let e = errors(&dual.replace("gateway6 = \"2001:db8:1::1\"", "gateway6 = \"203.0.113.2\""));
        assert!(
            e.contains("pool[0].member[0].gateway6") && e.contains("expected an IPv6 address"),
            "{e}"
        );
        let e = errors(&dual.replace("snat6 = \"2001:db8:1::10\"", "snat6 = \"203.0.113.11\""));
        assert!(e.contains("pool[0].member[0].snat6"), "{e}");
        // IPv6 sources with no link that has an IPv6 next hop.
        let e = errors(&GOOD.replace(
            "sources = [\"10.0.0.0/8\"]",
            "sources = [\"10.0.0.0/8\", \"fd00:100::/64\"]",
        ));
        assert!(
            e.contains("outbound[0].sources[1]")
                && e.contains("IPv6 next hop")
                && e.contains("gateway6"),
            "{e}"
        );
        // snat6 on a line without an IPv6 next hop.
        let e = errors(&GOOD.replace(
            "snat = \"203.0.113.10\"",
            "snat = \"203.0.113.10\"\nsnat6 = \"none\"",
        ));
        assert!(
            e.contains("pool[0].member[0].snat6") && e.contains("gateway6"),
            "{e}"
        );
        // An IPv4 address in dns_proxy6, and a proxy of a family `sources` lacks.
        let e = errors(&dual.replace("[fd00:100::1]:53", "10.0.0.2:53"));
        assert!(e.contains("outbound[0].dns_proxy6"), "{e}");
        let e = errors(&GOOD.replace(
            "sources = [\"10.0.0.0/8\"]",
            "sources = [\"10.0.0.0/8\"]\ndns_proxy6 = \"[fd00:100::1]:53\"",
        ));
        assert!(
            e.contains("outbound[0].dns_proxy6") && e.contains("no prefix"),
            "{e}"
        );
        // An IPv6 monitor target on a line without an IPv6 next hop.
        let e = errors(&GOOD.replace("\"198.51.100.3\"]", "\"2001:db8:9::1\"]"));
        assert!(
            e.contains("pool[0].member[0].monitors") && e.contains("2001:db8:9::1"),
            "{e}"
        );
        // A gateway's address6 must be IPv6.
        let e = errors(&GOOD.replace(
            "address = \"198.18.10.2\"",
            "address = \"198.18.10.2\"\naddress6 = \"198.18.10.9\"",
        ));
        assert!(e.contains("pool[1].member[0].address6"), "{e}");
    }
}

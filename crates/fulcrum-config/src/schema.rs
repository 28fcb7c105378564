//! The typed configuration and how each table is read.
//!
//! Defaults live here, next to the key they belong to; docs/configuration.md mirrors them. A
//! virtual service is read by section: service.rs and the protocol modules (tcp.rs, udp.rs,
//! http.rs, message.rs).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use crate::admin::Admin;
use crate::reader::{Cx, FromNode, Node, Shape};
use crate::service::VirtualService;
use crate::string_enum;
use crate::types::{read_table, OneOrMany};
use crate::Locations;

/// A whole, validated configuration.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub global: Global,
    pub admin: Admin,
    pub virtual_services: Vec<VirtualService>,
    pub pools: Vec<Pool>,
    pub monitors: Vec<Monitor>,
    pub persistence: Vec<Persistence>,
    pub dns: Option<Dns>,
    pub ip_tables: Vec<IpTable>,
    pub gslb: Gslb,
    /// `[ha]`: VRRP active/standby (crate fulcrum-ha).
    pub ha: Option<crate::ha::Ha>,
    /// `[bgp]`: announce the VIPs through a local BGP speaker (active_active).
    pub bgp: Option<crate::bgp::Bgp>,
    /// `[[alert]]` rules (crate::alert).
    pub alerts: Vec<crate::alert::AlertRule>,
    /// Link load balancing of flows leaving the LAN (`[[outbound]]`).
    pub outbound: Vec<crate::link::Outbound>,
    /// Firewall sandwich sides (`[[gateway_service]]`).
    pub gateway_services: Vec<crate::link::GatewayService>,
    /// Where key paths stand in the file, for errors found after parsing (e.g. at bind time).
    pub locations: Locations,
}

impl Config {
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }
    pub fn monitor(&self, name: &str) -> Option<&Monitor> {
        self.monitors.iter().find(|m| m.name == name)
    }
    pub fn persistence(&self, name: &str) -> Option<&Persistence> {
        self.persistence.iter().find(|p| p.name == name)
    }
}

#[derive(Debug, Clone)]
pub struct Global {
    /// Worker threads of the data planes; 0 = one per CPU.
    pub workers: usize,
    /// On SIGTERM, how long established connections may run before they are closed.
    pub shutdown_timeout: Duration,
    /// Client connections of every stream service together; 0 = derived from the descriptor
    /// limit, keeping a reserve for health checks, the API and DNS (see docs/operations.md).
    pub max_connections: u64,
}

impl Default for Global {
    fn default() -> Self {
        Global {
            workers: 0,
            shutdown_timeout: Duration::from_secs(30),
            max_connections: 0,
        }
    }
}

string_enum!(Protocol {
    Tcp = "tcp",
    Udp = "udp",
    Http = "http",
    Https = "https",
    Message = "message",
});

impl Protocol {
    pub fn is_http(self) -> bool {
        matches!(self, Protocol::Http | Protocol::Https)
    }
    /// Whether the protocol's listeners are UDP sockets (a UDP and a TCP service may share ip:port).
    pub fn is_datagram(self) -> bool {
        matches!(self, Protocol::Udp)
    }
}

string_enum!(ProxyProtocol { V1 = "v1", V2 = "v2" });

string_enum!(Algorithm {
    RoundRobin = "round_robin",
    WeightedRoundRobin = "weighted_round_robin",
    LeastConnections = "least_connections",
    WeightedLeastConnections = "weighted_least_connections",
    WeightedLeastTraffic = "weighted_least_traffic",
    FastestResponse = "fastest_response",
    DynamicFeedback = "dynamic_feedback",
    Hash = "hash",
    Priority = "priority",
    FirstAvailable = "first_available",
    LeastRequest = "least_request",
    BandwidthRatio = "bandwidth_ratio",
    Proximity = "proximity",
    Rtt = "rtt",
    Spillover = "spillover",
});

/// What `algorithm = "hash"` hashes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HashKey {
    SourceIp,
    SourceIpPort,
    Uri,
    Host,
    Header(String),
    Cookie(String),
}

impl HashKey {
    /// Keys that need an HTTP request to compute.
    pub fn is_l7(&self) -> bool {
        !matches!(self, HashKey::SourceIp | HashKey::SourceIpPort)
    }
}

impl std::fmt::Display for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HashKey::SourceIp => f.write_str("source_ip"),
            HashKey::SourceIpPort => f.write_str("source_ip_port"),
            HashKey::Uri => f.write_str("uri"),
            HashKey::Host => f.write_str("host"),
            HashKey::Header(h) => write!(f, "header:{h}"),
            HashKey::Cookie(c) => write!(f, "cookie:{c}"),
        }
    }
}

impl FromNode for HashKey {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        const ALL: &[&str] = &[
            "source_ip",
            "source_ip_port",
            "uri",
            "host",
            "header:NAME",
            "cookie:NAME",
        ];
        let s: String = String::from_node(node, cx)?;
        let key = match s.as_str() {
            "source_ip" => Some(HashKey::SourceIp),
            "source_ip_port" => Some(HashKey::SourceIpPort),
            "uri" => Some(HashKey::Uri),
            "host" => Some(HashKey::Host),
            other => match other.split_once(':') {
                Some(("header", name)) if !name.is_empty() => {
                    Some(HashKey::Header(name.to_string()))
                }
                Some(("cookie", name)) if !name.is_empty() => {
                    Some(HashKey::Cookie(name.to_string()))
                }
                _ => None,
            },
        };
        if key.is_none() {
            let hint = crate::error::did_you_mean(&s, ALL.iter().copied())
                .map(|m| format!(" (did you mean {m:?}?)"))
                .unwrap_or_default();
            cx.error(
                node,
                format!(
                    "unknown hash key {s:?}; expected one of: {}{hint}",
                    ALL.join(", ")
                ),
            );
        }
        key
    }
}

string_enum!(Reuse {
    Never = "never",
    Safe = "safe",
    Always = "always",
});

#[derive(Debug, Clone)]
pub struct Pool {
    pub name: String,
    pub algorithm: Algorithm,
    pub hash_key: HashKey,
    pub monitors: Vec<String>,
    pub slow_start: Option<SlowStart>,
    pub min_active: u32,
    pub retries: u32,
    pub connect_timeout: Duration,
    /// A member connection whose receive window stays at zero this long, while Fulcrum has
    /// bytes for it, counts as a passive failure (Fulcrum addition; None = not watched).
    pub zero_window_timeout: Option<Duration>,
    pub members: Vec<Member>,
    pub reuse: Reuse,
    pub tls: Option<UpstreamTls>,
    /// How the HTTP data plane talks to the members (Fulcrum additions).
    pub http: crate::http::HttpPoolOptions,
    /// server (default), link or gateway; `members` holds servers, `links` and `gateways` the
    /// members of the other kinds.
    pub kind: crate::link::PoolKind,
    pub links: Vec<crate::link::LinkMember>,
    pub gateways: Vec<crate::link::GatewayMember>,
    /// Link pools: a link above this share of its bandwidth takes no new flows.
    pub busy: Option<f64>,
    /// Standby members joining on utilisation (crate::elastic; Fulcrum addition).
    pub elastic: Option<crate::elastic::Elastic>,
}

impl FromNode for Pool {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let kind = t.opt(cx, "kind").unwrap_or(crate::link::PoolKind::Server);
            let (mut members, mut links, mut gateways) = (Vec::new(), Vec::new(), Vec::new());
            match kind {
                crate::link::PoolKind::Server => members = t.opt(cx, "member").unwrap_or_default(),
                crate::link::PoolKind::Link => links = t.opt(cx, "member").unwrap_or_default(),
                crate::link::PoolKind::Gateway => {
                    gateways = t.opt(cx, "member").unwrap_or_default()
                }
            }
            let elastic = t.opt(cx, "elastic");
            let path = t.path().to_string();
            crate::elastic::check_pool(elastic.as_ref(), &members, node, &path, cx);
            let value = Pool {
                kind,
                links,
                gateways,
                elastic,
                busy: t.opt(cx, "busy"),
                algorithm: t.opt(cx, "algorithm").unwrap_or(Algorithm::RoundRobin),
                hash_key: t.opt(cx, "hash_key").unwrap_or(HashKey::SourceIp),
                monitors: t.opt(cx, "monitors").unwrap_or_default(),
                slow_start: t.opt(cx, "slow_start"),
                min_active: t.opt(cx, "min_active").unwrap_or(1),
                retries: t.opt(cx, "retries").unwrap_or(2),
                connect_timeout: t
                    .opt(cx, "connect_timeout")
                    .unwrap_or(Duration::from_secs(3)),
                zero_window_timeout: t.opt(cx, "zero_window_timeout"),
                members,
                reuse: t.opt(cx, "reuse").unwrap_or(Reuse::Safe),
                tls: t.opt(cx, "tls"),
                http: crate::http::HttpPoolOptions::read(t, cx),
                name: name?,
            };
            crate::pool::check(t.path(), &value, cx);
            Some(value)
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlowStart {
    pub recovery: Duration,
    pub warm: Duration,
}

impl FromNode for SlowStart {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            Some(SlowStart {
                recovery: t.opt(cx, "recovery").unwrap_or_default(),
                warm: t.opt(cx, "warm").unwrap_or_default(),
            })
        })
    }
}

#[derive(Debug, Clone)]
pub struct UpstreamTls {
    pub verify: bool,
    pub ca: Option<PathBuf>,
    pub sni: Option<String>,
}

impl FromNode for UpstreamTls {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            Some(UpstreamTls {
                verify: t.opt(cx, "verify").unwrap_or(true),
                ca: t.opt::<String>(cx, "ca").map(PathBuf::from),
                sni: t.opt(cx, "sni"),
            })
        })
    }
}

string_enum!(
    /// Operator-set state of a member.
    AdminState {
        Enabled = "enabled",
        Disabled = "disabled",
        Drain = "drain",
    }
);

#[derive(Debug, Clone)]
pub struct Member {
    pub address: SocketAddr,
    pub weight: u32,
    pub priority: i32,
    pub max_connections: u32,
    pub state: AdminState,
    /// Takes traffic only while its pool's `elastic` utilisation asks for it (Fulcrum addition).
    pub standby: bool,
}

/// The largest weight a member may have (F5's ratio range); big enough for capacity ratios.
pub const MAX_WEIGHT: u32 = 65535;

impl FromNode for Member {
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
            Some(Member {
                weight,
                priority: t.opt(cx, "priority").unwrap_or(0),
                max_connections: t.opt(cx, "max_connections").unwrap_or(0),
                state: t.opt(cx, "state").unwrap_or(AdminState::Enabled),
                standby: t.opt(cx, "standby").unwrap_or(false),
                address: address?,
            })
        })
    }
}

string_enum!(MonitorKind {
    Tcp = "tcp",
    Http = "http",
    Https = "https",
    SendExpect = "send_expect",
    Agent = "agent",
    Dns = "dns",
    Radius = "radius",
    Smtp = "smtp",
    Pop3 = "pop3",
    Imap = "imap",
    Ftp = "ftp",
    Icmp = "icmp",
    Snmp = "snmp",
});

#[derive(Debug, Clone)]
pub struct Monitor {
    pub name: String,
    pub kind: MonitorKind,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    pub port: Option<u16>,
    pub path: String,
    pub method: String,
    pub host: Option<String>,
    pub expect_status: Vec<u16>,
    pub expect_body: Option<String>,
    pub send: Option<String>,
    pub expect: Option<String>,
    /// dns: the name asked for (required for dns).
    pub query: Option<String>,
    /// dns: the record type asked for, e.g. "A" (default), "AAAA", "SOA".
    pub query_type: String,
    /// dns: the response code that passes, e.g. "NOERROR" (default), "NXDOMAIN".
    pub expect_rcode: String,
    /// dns: text one of the answer records must contain (an address, a name).
    pub expect_answer: Option<String>,
    /// radius: the shared secret (required for radius).
    pub secret: Option<String>,
    /// radius (Access-Request instead of Status-Server), pop3, imap, ftp: log in as this user.
    pub username: Option<String>,
    pub password: Option<String>,
    /// snmp: community, OID, and the value that means "no more load" (crate::snmp).
    pub snmp: crate::snmp::SnmpOptions,
    /// Link monitors: the targets probed through the link, and how many must answer.
    pub link: crate::link::LinkProbe,
}

/// Monitor keys added for the protocol monitors, with the kinds that use them; validation refuses
/// them on other kinds.
pub const MONITOR_KIND_KEYS: &[(&str, &[MonitorKind])] = &[
    ("query", &[MonitorKind::Dns]),
    ("query_type", &[MonitorKind::Dns]),
    ("expect_rcode", &[MonitorKind::Dns]),
    ("expect_answer", &[MonitorKind::Dns]),
    ("secret", &[MonitorKind::Radius]),
    (
        "username",
        &[
            MonitorKind::Radius,
            MonitorKind::Pop3,
            MonitorKind::Imap,
            MonitorKind::Ftp,
        ],
    ),
    (
        "password",
        &[
            MonitorKind::Radius,
            MonitorKind::Pop3,
            MonitorKind::Imap,
            MonitorKind::Ftp,
        ],
    ),
    ("community", &[MonitorKind::Snmp]),
    ("oid", &[MonitorKind::Snmp]),
    ("max", &[MonitorKind::Snmp]),
];

impl FromNode for Monitor {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let kind = t.req(cx, "type");
            let rise = t.opt(cx, "rise").unwrap_or(2);
            let fall = t.opt(cx, "fall").unwrap_or(3);
            for (key, v) in [("rise", rise), ("fall", fall)] {
                if v == 0 {
                    cx.error_at(
                        node.span.clone(),
                        &format!("{}.{key}", t.path()),
                        "must be at least 1",
                    );
                }
            }
            let value = Monitor {
                interval: t.opt(cx, "interval").unwrap_or(Duration::from_secs(2)),
                timeout: t.opt(cx, "timeout").unwrap_or(Duration::from_secs(1)),
                rise,
                fall,
                port: t.opt(cx, "port"),
                path: t.opt(cx, "path").unwrap_or_else(|| "/".to_string()),
                method: t.opt(cx, "method").unwrap_or_else(|| "GET".to_string()),
                host: t.opt(cx, "host"),
                expect_status: t.opt(cx, "expect_status").unwrap_or_default(),
                expect_body: t.opt(cx, "expect_body"),
                send: t.opt(cx, "send"),
                expect: t.opt(cx, "expect"),
                query: t.opt(cx, "query"),
                query_type: t
                    .opt::<String>(cx, "query_type")
                    .map_or_else(|| "A".to_string(), |s| s.to_ascii_uppercase()),
                expect_rcode: t
                    .opt::<String>(cx, "expect_rcode")
                    .map_or_else(|| "NOERROR".to_string(), |s| s.to_ascii_uppercase()),
                expect_answer: t.opt(cx, "expect_answer"),
                secret: t.opt(cx, "secret"),
                username: t.opt(cx, "username"),
                password: t.opt(cx, "password"),
                snmp: crate::snmp::SnmpOptions::read(t, cx),
                link: crate::link::LinkProbe::read(t, cx),
                name: name?,
                kind: kind?,
            };
            crate::monitor::check(t.path(), &value, cx);
            Some(value)
        })
    }
}

string_enum!(PersistenceKind {
    SourceIp = "source_ip",
    CookieInsert = "cookie_insert",
    CookiePassive = "cookie_passive",
    CookieRewrite = "cookie_rewrite",
    Header = "header",
    Radius = "radius",
});

#[derive(Debug, Clone)]
pub struct Persistence {
    pub name: String,
    pub kind: PersistenceKind,
    /// Idle expiry of table entries; for cookie_insert the cookie's lifetime (None: session cookie).
    pub timeout: Option<Duration>,
    pub cookie: String,
    pub header: Option<String>,
    pub attribute: Option<String>,
    pub source_mask: u8,
    pub source_mask_v6: u8,
    /// Bound on the entries of a persistence table; the least recently used go first.
    pub max_entries: u64,
    /// cookie_insert / cookie_rewrite: the key that signs the member id in the cookie. Without
    /// it the process uses the secret file beside `admin.token_file` (generated once, kept
    /// across restarts).
    pub secret: Option<String>,
    /// Older keys whose cookies are still accepted (and re-issued with `secret`): the rest of
    /// `secret` when it is an array, newest first (rotation).
    pub previous_secrets: Vec<String>,
    /// cookie_insert: the cookie's `SameSite` attribute (none written when unset).
    pub same_site: Option<crate::http::SameSite>,
    /// radius: what happens to a datagram that is not a well-formed RADIUS packet.
    pub malformed: Malformed,
}

string_enum!(
    /// What a radius-persistent udp service does with a datagram that is not a well-formed
    /// RADIUS packet (or lacks the attribute): schedule it like any datagram, or drop it.
    Malformed {
        Schedule = "schedule",
        Drop = "drop",
    }
);

/// RADIUS attribute names Fulcrum knows (RFC 2865, 2866, 2869, 3162), with their type numbers.
pub const RADIUS_ATTRIBUTES: &[(&str, u8)] = &[
    ("User-Name", 1),
    ("NAS-IP-Address", 4),
    ("NAS-Port", 5),
    ("Framed-IP-Address", 8),
    ("Class", 25),
    ("Called-Station-Id", 30),
    ("Calling-Station-Id", 31),
    ("NAS-Identifier", 32),
    ("Acct-Session-Id", 44),
    ("Acct-Multi-Session-Id", 50),
    ("NAS-Port-Id", 87),
    ("Framed-Interface-Id", 96),
    ("Framed-IPv6-Prefix", 97),
];

/// The type number of a RADIUS attribute given by name (case-insensitive, as in the table above)
/// or as a number from 1 to 255.
pub fn radius_attribute(name: &str) -> Option<u8> {
    if let Ok(n) = name.parse::<u8>() {
        return (n != 0).then_some(n);
    }
    RADIUS_ATTRIBUTES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, t)| *t)
}

impl Persistence {
    /// Idle expiry of the entries of a persistence table.
    pub fn table_timeout(&self) -> Duration {
        self.timeout.unwrap_or(Duration::from_secs(30 * 60))
    }
}

impl FromNode for Persistence {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let kind = t.req(cx, "type");
            let source_mask = t.opt(cx, "source_mask").unwrap_or(32);
            let source_mask_v6 = t.opt(cx, "source_mask_v6").unwrap_or(128);
            if source_mask > 32 {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.source_mask", t.path()),
                    format!("{source_mask} is not an IPv4 prefix length (0 to 32)"),
                );
            }
            if source_mask_v6 > 128 {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.source_mask_v6", t.path()),
                    format!("{source_mask_v6} is not an IPv6 prefix length (0 to 128)"),
                );
            }
            let secrets: Option<OneOrMany<String>> = t.opt(cx, "secret");
            let value = Persistence {
                timeout: t.opt(cx, "timeout"),
                cookie: t.opt(cx, "cookie").unwrap_or_else(|| "FULCRUM".to_string()),
                header: t.opt(cx, "header"),
                attribute: t.opt(cx, "attribute"),
                source_mask,
                source_mask_v6,
                max_entries: t.opt(cx, "max_entries").unwrap_or(1_000_000),
                malformed: t.opt(cx, "malformed").unwrap_or(Malformed::Schedule),
                secret: secrets.as_ref().and_then(|s| s.0.first().cloned()),
                previous_secrets: secrets
                    .map(|s| s.0.into_iter().skip(1).collect())
                    .unwrap_or_default(),
                same_site: t.opt(cx, "same_site"),
                name: name?,
                kind: kind?,
            };
            crate::persistence::check(t.path(), &value, cx);
            Some(value)
        })
    }
}

#[derive(Debug, Clone)]
pub struct Dns {
    pub listen: Vec<SocketAddr>,
    pub zones: Vec<Zone>,
    /// Largest UDP response sent to an EDNS client (the client's own limit applies if smaller).
    pub udp_payload: u16,
    /// Response rate limiting against reflection (off when absent).
    pub rate_limit: Option<RateLimit>,
    /// Closes a DNS-over-TCP connection idle this long.
    pub tcp_idle_timeout: Duration,
}

impl FromNode for Dns {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let listen: Option<OneOrMany<SocketAddr>> = t.req(cx, "listen");
            let udp_payload: u16 = t.opt(cx, "udp_payload").unwrap_or(1232);
            if udp_payload < 512 {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.udp_payload", t.path()),
                    format!("{udp_payload} is below 512, the size every DNS client accepts"),
                );
            }
            Some(Dns {
                zones: t.opt(cx, "zone").unwrap_or_default(),
                udp_payload,
                rate_limit: t.opt(cx, "rate_limit"),
                tcp_idle_timeout: t
                    .opt(cx, "tcp_idle_timeout")
                    .unwrap_or(Duration::from_secs(10)),
                listen: listen?.0,
            })
        })
    }
}

/// Response rate limiting (BIND's RRL): answers per second to one client network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    pub responses_per_second: u32,
    /// Every `slip`-th limited response is sent truncated (TC) instead of dropped; 0 = drop all.
    pub slip: u32,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
}

impl FromNode for RateLimit {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let rps = t.req(cx, "responses_per_second");
            let ipv4_prefix = t.opt(cx, "ipv4_prefix").unwrap_or(24);
            let ipv6_prefix = t.opt(cx, "ipv6_prefix").unwrap_or(56);
            if ipv4_prefix > 32 {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.ipv4_prefix", t.path()),
                    format!("{ipv4_prefix} is not an IPv4 prefix length (0 to 32)"),
                );
            }
            if ipv6_prefix > 128 {
                cx.error_at(
                    node.span.clone(),
                    &format!("{}.ipv6_prefix", t.path()),
                    format!("{ipv6_prefix} is not an IPv6 prefix length (0 to 128)"),
                );
            }
            Some(RateLimit {
                slip: t.opt(cx, "slip").unwrap_or(2),
                ipv4_prefix,
                ipv6_prefix,
                responses_per_second: rps?,
            })
        })
    }
}

#[derive(Debug, Clone)]
pub struct Zone {
    pub origin: String,
    pub file: Option<PathBuf>,
    pub records: Vec<String>,
}

impl FromNode for Zone {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let origin = t.req(cx, "origin");
            let value = Zone {
                file: t.opt::<String>(cx, "file").map(PathBuf::from),
                records: t.opt(cx, "records").unwrap_or_default(),
                origin: origin?,
            };
            check_zone(t.path(), &value, cx);
            Some(value)
        })
    }
}

fn check_zone(at: &str, zone: &Zone, cx: &mut Cx<'_>) {
    if !zone.origin.ends_with('.') {
        cx.error_path(
            &format!("{at}.origin"),
            format!(
                "{:?} must be fully qualified, ending in a dot: \"{}.\"",
                zone.origin, zone.origin
            ),
        );
    }
}

#[derive(Debug, Clone)]
pub struct IpTable {
    pub name: String,
    pub cidrs: Vec<IpNet>,
    pub file: Option<PathBuf>,
    /// A MaxMind DB (GeoIP2 / GeoLite2 Country or City) for `countries` and `continents`.
    pub geoip: Option<PathBuf>,
    /// ISO 3166-1 alpha-2 country codes whose clients belong to the table.
    pub countries: Vec<String>,
    /// Continent codes (AF, AN, AS, EU, NA, OC, SA) whose clients belong to the table.
    pub continents: Vec<String>,
}

impl FromNode for IpTable {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let value = IpTable {
                cidrs: t.opt(cx, "cidrs").unwrap_or_default(),
                file: t.opt::<String>(cx, "file").map(PathBuf::from),
                geoip: t.opt::<String>(cx, "geoip").map(PathBuf::from),
                countries: t.opt(cx, "countries").unwrap_or_default(),
                continents: t.opt(cx, "continents").unwrap_or_default(),
                name: name?,
            };
            crate::iptable::check(t.path(), &value, cx);
            Some(value)
        })
    }
}

#[derive(Debug, Clone)]
pub struct Gslb {
    pub sites: Vec<Site>,
    pub names: Vec<GslbName>,
    /// The site this instance runs at: its reports carry that site's own figures, and its
    /// `peer` address is where it accepts the other instances' reports.
    pub local_site: Option<String>,
    /// Where the site state exchange accepts peers; default: the local site's `peer`.
    pub listen: Option<SocketAddr>,
    /// Shared secrets authenticating the exchange (HMAC-SHA256): the first signs, any verifies.
    pub keys: Vec<String>,
    /// Period of the state reports sent to peers (changes are also sent at once).
    pub interval: Duration,
    /// A peer whose last report is older than this is stale and left out of the table.
    pub stale_after: Duration,
}

impl Default for Gslb {
    fn default() -> Self {
        Gslb {
            sites: Vec::new(),
            names: Vec::new(),
            local_site: None,
            listen: None,
            keys: Vec::new(),
            interval: Duration::from_secs(1),
            stale_after: Duration::from_secs(5),
        }
    }
}

impl Gslb {
    pub fn site(&self, name: &str) -> Option<&Site> {
        self.sites.iter().find(|s| s.name == name)
    }
}

impl FromNode for Gslb {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = Gslb::default();
            let value = Gslb {
                sites: t.opt(cx, "site").unwrap_or_default(),
                names: t.opt(cx, "name").unwrap_or_default(),
                local_site: t.opt(cx, "local_site"),
                listen: t.opt(cx, "listen"),
                keys: t
                    .opt::<OneOrMany<String>>(cx, "key")
                    .map(|k| k.0)
                    .unwrap_or_default(),
                interval: t.opt(cx, "interval").unwrap_or(d.interval),
                stale_after: t.opt(cx, "stale_after").unwrap_or(d.stale_after),
            };
            crate::gslb::check(t.path(), &value, cx);
            Some(value)
        })
    }
}

#[derive(Debug, Clone)]
pub struct Site {
    pub name: String,
    pub addresses: Vec<IpAddr>,
    pub regions: Vec<String>,
    pub monitor: Option<String>,
    pub weight: u32,
    pub peer: Option<SocketAddr>,
    /// `host[:port]` the HTTP redirect fallback (`gslb_redirect`) sends clients to for this
    /// site, instead of one of its addresses.
    pub redirect_host: Option<String>,
    /// The link (a member of a `kind = "link"` pool) the site's addresses are reached by:
    /// while it is down or busy the site is out of the answers (Fulcrum addition).
    pub link: Option<String>,
}

impl FromNode for Site {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let name = t.req(cx, "name");
            let addresses = t.req(cx, "addresses");
            let value = Site {
                regions: t.opt(cx, "regions").unwrap_or_default(),
                monitor: t.opt(cx, "monitor"),
                weight: t.opt(cx, "weight").unwrap_or(1),
                peer: t.opt(cx, "peer"),
                redirect_host: t.opt(cx, "redirect_host"),
                link: t.opt(cx, "link"),
                name: name?,
                addresses: addresses?,
            };
            crate::gslb::check_site(t.path(), &value, cx);
            Some(value)
        })
    }
}

string_enum!(GslbAlgorithm {
    Topology = "topology",
    RoundRobin = "round_robin",
    Weighted = "weighted",
    LeastLoad = "least_load",
    FastestResponse = "fastest_response",
    FirstAvailable = "first_available",
    Hash = "hash",
});

#[derive(Debug, Clone)]
pub struct GslbName {
    pub fqdn: String,
    pub sites: Vec<String>,
    pub algorithm: GslbAlgorithm,
    pub fallback: GslbAlgorithm,
    pub ttl: u32,
    pub answers: u32,
}

impl FromNode for GslbName {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let fqdn = t.req(cx, "fqdn");
            let sites = t.req(cx, "sites");
            let value = GslbName {
                algorithm: t.opt(cx, "algorithm").unwrap_or(GslbAlgorithm::Topology),
                fallback: t.opt(cx, "fallback").unwrap_or(GslbAlgorithm::RoundRobin),
                ttl: t.opt(cx, "ttl").unwrap_or(30),
                answers: t.opt(cx, "answers").unwrap_or(1),
                fqdn: fqdn?,
                sites: sites?,
            };
            crate::gslb::check_name(t.path(), &value, cx);
            Some(value)
        })
    }
}

impl FromNode for Global {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let d = Global::default();
            Some(Global {
                workers: t.opt(cx, "workers").unwrap_or(d.workers),
                shutdown_timeout: t.opt(cx, "shutdown_timeout").unwrap_or(d.shutdown_timeout),
                max_connections: t.opt(cx, "max_connections").unwrap_or(d.max_connections),
            })
        })
    }
}

/// Reads the whole document; cross-references are checked afterwards by `validate`.
pub(crate) fn read_config(root: &Node<'_>, cx: &mut Cx<'_>) -> Option<Config> {
    if !matches!(root.shape(), Shape::Table(_)) {
        cx.error(root, "the document must be a table");
        return None;
    }
    read_table(root, cx, |t, cx| {
        Some(Config {
            global: t.opt(cx, "global").unwrap_or_default(),
            admin: t.opt(cx, "admin").unwrap_or_default(),
            virtual_services: t.opt(cx, "virtual_service").unwrap_or_default(),
            pools: t.opt(cx, "pool").unwrap_or_default(),
            monitors: t.opt(cx, "monitor").unwrap_or_default(),
            persistence: t.opt(cx, "persistence").unwrap_or_default(),
            dns: t.opt(cx, "dns"),
            ip_tables: t.opt(cx, "ip_table").unwrap_or_default(),
            gslb: t.opt(cx, "gslb").unwrap_or_default(),
            ha: t.opt(cx, "ha"),
            bgp: t.opt(cx, "bgp"),
            alerts: t.opt(cx, "alert").unwrap_or_default(),
            outbound: t.opt(cx, "outbound").unwrap_or_default(),
            gateway_services: t.opt(cx, "gateway_service").unwrap_or_default(),
            locations: Locations::default(),
        })
    })
}

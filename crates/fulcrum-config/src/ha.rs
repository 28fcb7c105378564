//! `[ha]`: VRRPv3 active/standby between Fulcrum nodes (or a Fulcrum node and keepalived).
//!
//! The contract keys plus Fulcrum additions (`track`, `track_weight`,
//! `garp_repeat`, `garp_interval`), documented in docs/configuration.md "High availability".

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;

use crate::reader::{Cx, FromNode, Node, Shape};
use crate::string_enum;
use crate::types::{ifname_ok, read_table};

string_enum! {
    /// `ha.mode`.
    HaMode {
        ActiveStandby = "active_standby",
        ActiveActive = "active_active",
    }
}

/// VRRPv3 carries the advertisement interval in centiseconds in 12 bits.
pub const MIN_ADVERT_INTERVAL: Duration = Duration::from_millis(10);
pub const MAX_ADVERT_INTERVAL: Duration = Duration::from_millis(40_950);

/// A VIP: an address with the prefix length of its subnet ("10.0.0.100/24"; a bare address
/// is a /32; the host bits are the point, unlike a prefix elsewhere in the file), and the
/// interface it goes on when that is not `[ha] interface` ("198.18.1.2/24 dev wan0", as
/// keepalived writes it): a gateway pair moves its uplinks' SNAT addresses with mastership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vip {
    pub net: IpNet,
    /// `None`: `[ha] interface`.
    pub interface: Option<String>,
}

impl std::fmt::Display for Vip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.interface {
            Some(dev) => write!(f, "{} dev {dev}", self.net),
            None => write!(f, "{}", self.net),
        }
    }
}

impl FromNode for Vip {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        const EXPECTED: &str = "expected an address with its prefix length, such as \"10.0.0.100/24\", optionally followed by \"dev <interface>\"";
        let Shape::Str(s) = node.shape() else {
            cx.error(node, EXPECTED);
            return None;
        };
        let mut words = s.split_whitespace();
        let address = words.next().unwrap_or("");
        let interface = match (words.next(), words.next(), words.next()) {
            (None, _, _) => None,
            (Some("dev"), Some(dev), None) if ifname_ok(dev) => Some(dev.to_string()),
            (Some("dev"), Some(dev), None) => {
                cx.error(
                    node,
                    format!("{dev:?} is not an interface name: expected 1 to 15 characters of letters, digits, '.', '_' and '-'"),
                );
                return None;
            }
            _ => {
                cx.error(node, EXPECTED);
                return None;
            }
        };
        let parsed = address
            .parse::<IpNet>()
            .or_else(|_| address.parse::<IpAddr>().map(IpNet::from))
            .ok();
        match parsed {
            Some(n) if n.addr() == n.network() && n.prefix_len() != n.max_prefix_len() => {
                cx.error(
                    node,
                    format!("{n} is a network address, not a host address for a VIP"),
                );
                None
            }
            Some(net) => Some(Vip { net, interface }),
            None => {
                cx.error(node, EXPECTED);
                None
            }
        }
    }
}

/// `[ha] conntrack_sync`: where conntrackd exchanges the pair's connection-tracking state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackSync {
    /// The dedicated link between the two nodes (its first IPv4 address is this node's end).
    pub interface: String,
    /// The peer's address on that link: unicast UDP; absent: multicast to 225.0.0.50.
    pub peer: Option<Ipv4Addr>,
    /// UDP port of the exchange (both nodes use the same).
    pub port: u16,
}

impl FromNode for ConntrackSync {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let interface: Option<String> = t.req(cx, "interface");
            if let (Some(i), Some(n)) = (&interface, t.node("interface")) {
                if !ifname_ok(i) {
                    cx.error(
                        &n,
                        format!("{i:?} is not an interface name: expected 1 to 15 characters of letters, digits, '.', '_' and '-'"),
                    );
                }
            }
            let peer: Option<IpAddr> = t.opt(cx, "peer");
            let peer = match (peer, t.node("peer")) {
                (Some(IpAddr::V4(a)), _) => Some(a),
                (Some(IpAddr::V6(_)), Some(n)) => {
                    cx.error(
                        &n,
                        "the conntrack_sync link is IPv4 (conntrackd's unicast and multicast exchange here): give the peer's IPv4 address on it",
                    );
                    None
                }
                _ => None,
            };
            let port: u16 = t.opt(cx, "port").unwrap_or(3780);
            if let (0, Some(n)) = (port, t.node("port")) {
                cx.error(&n, "port must be from 1 to 65535");
            }
            Some(ConntrackSync {
                interface: interface?,
                peer,
                port,
            })
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaSync {
    pub listen: SocketAddr,
    pub peers: Vec<SocketAddr>,
    pub key: String,
}

impl FromNode for HaSync {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let listen = t.req(cx, "listen");
            let peers = t.opt(cx, "peers").unwrap_or_default();
            let key: Option<String> = t.req(cx, "key");
            if let (Some(k), Some(n)) = (&key, t.node("key")) {
                if k.len() < 16 {
                    cx.error(&n, "the sync key must be at least 16 characters");
                }
            }
            Some(HaSync {
                listen: listen?,
                peers,
                key: key?,
            })
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ha {
    pub mode: HaMode,
    /// This node's name, shown in the API and logs (default: the host name).
    pub node: Option<String>,
    /// Where adverts are sent and received and where the VIPs are added.
    pub interface: String,
    /// Virtual router id, 1 to 255; both nodes of a pair use the same one.
    pub vrid: u8,
    /// 3 (RFC 5798, default) or 2 (RFC 3768: IPv4 only, whole-second adverts) to pair with a
    /// VRRPv2 node such as keepalived at its defaults.
    pub vrrp_version: u8,
    /// 1 to 254 (255: this node owns the addresses and is master whenever it runs).
    pub priority: u8,
    pub advert_interval: Duration,
    /// A higher-priority node takes mastership back from a lower-priority master.
    pub preempt: bool,
    /// How long a higher-priority node waits, as backup, before preempting.
    pub preempt_delay: Duration,
    /// Unicast VRRP to these addresses; empty: multicast to 224.0.0.18.
    pub peers: Vec<IpAddr>,
    /// Addresses that move with mastership.
    pub vips: Vec<Vip>,
    /// Pools whose health the priority follows; empty: every pool.
    pub track: Vec<String>,
    /// When a tracked pool has no available member: lower the priority by this much, or
    /// (unset) go to the fault state — resign mastership and never take it.
    pub track_weight: Option<u8>,
    /// Gratuitous ARPs sent per VIP on becoming master, `garp_interval` apart.
    pub garp_repeat: u32,
    pub garp_interval: Duration,
    pub sync: Option<HaSync>,
    /// The shared part of the configuration file (everything but `[admin]`, `[ha]`, `[bgp]` and
    /// `[global]`) travels to the peer over `sync` and is applied there.
    pub config_sync: bool,
    /// Routed flows' connection tracking copied to the peer by conntrackd (FTFW), committed
    /// to the kernel when this node becomes master.
    pub conntrack_sync: Option<ConntrackSync>,
}

impl FromNode for Ha {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let mode = t.opt(cx, "mode").unwrap_or(HaMode::ActiveStandby);
            let node_name = t.opt(cx, "node");
            if mode == HaMode::ActiveActive {
                return Some(active_active(t, cx, node_name));
            }
            let interface = t.req(cx, "interface");
            let vrid: Option<u8> = t.req(cx, "vrid");
            if let (Some(0), Some(n)) = (vrid, t.node("vrid")) {
                cx.error(&n, "vrid must be from 1 to 255");
            }
            let priority: u8 = t.opt(cx, "priority").unwrap_or(100);
            if let (0, Some(n)) = (priority, t.node("priority")) {
                cx.error(
                    &n,
                    "priority must be from 1 to 255 (0 is reserved for a master resigning)",
                );
            }
            let vrrp_version: u8 = t.opt(cx, "vrrp_version").unwrap_or(3);
            if let (false, Some(n)) = (
                vrrp_version == 2 || vrrp_version == 3,
                t.node("vrrp_version"),
            ) {
                cx.error(
                    &n,
                    "vrrp_version must be 3 (RFC 5798) or 2 (RFC 3768, to pair with a VRRPv2 peer)",
                );
            }
            let advert_interval = t
                .opt(cx, "advert_interval")
                .unwrap_or(Duration::from_secs(1));
            if let (2, Some(n)) = (vrrp_version, t.node("advert_interval")) {
                if advert_interval.subsec_nanos() != 0
                    || advert_interval < Duration::from_secs(1)
                    || advert_interval > Duration::from_secs(255)
                {
                    cx.error(
                        &n,
                        "with vrrp_version = 2, advert_interval must be whole seconds from 1s to 255s (VRRPv2 sends seconds)",
                    );
                }
            } else if let Some(n) = t.node("advert_interval") {
                if advert_interval < MIN_ADVERT_INTERVAL
                    || advert_interval > MAX_ADVERT_INTERVAL
                    || advert_interval.as_nanos() % 10_000_000 != 0
                {
                    cx.error(
                        &n,
                        "advert_interval must be a multiple of 10ms from 10ms to 40950ms (VRRPv3 centiseconds)",
                    );
                }
            }
            let preempt = t.opt(cx, "preempt").unwrap_or(true);
            let preempt_delay = t.opt(cx, "preempt_delay").unwrap_or(Duration::ZERO);
            let peers: Vec<IpAddr> = t.opt(cx, "peers").unwrap_or_default();
            let vips: Vec<Vip> = t.opt(cx, "vips").unwrap_or_default();
            if let Some(n) = t.node("vips") {
                if matches!(n.shape(), Shape::Array(items) if items.is_empty()) {
                    cx.error(&n, "list at least one address that moves with mastership");
                }
                if vips.iter().any(|v| v.net.addr().is_ipv6())
                    && vips.iter().any(|v| v.net.addr().is_ipv4())
                {
                    cx.error(
                        &n,
                        "IPv4 and IPv6 VIPs cannot share one virtual router (VRRP runs one instance per family); use one [ha] family",
                    );
                }
            } else {
                t.req::<Vec<Vip>>(cx, "vips");
            }
            if let (2, Some(n)) = (vrrp_version, t.node("vrrp_version")) {
                if vips.iter().any(|v| v.net.addr().is_ipv6()) {
                    cx.error(
                        &n,
                        "VRRPv2 runs over IPv4 only; IPv6 VIPs need vrrp_version = 3",
                    );
                }
            }
            if let (Some(n), Some(first)) = (t.node("peers"), vips.first()) {
                if peers
                    .iter()
                    .any(|p| p.is_ipv6() != first.net.addr().is_ipv6())
                {
                    cx.error(&n, "peers must be of the VIPs' address family");
                }
                // An IPv6 advert comes from its sender's link-local address (RFC 5798
                // §5.1.2.1), and a node drops adverts whose source is not a listed peer: a
                // global address would never match, and both nodes would be master.
                if peers.iter().any(|p| match p {
                    IpAddr::V6(a) => a.segments()[0] & 0xffc0 != 0xfe80,
                    IpAddr::V4(_) => false,
                }) {
                    cx.error(
                        &n,
                        "IPv6 peers must be link-local addresses (fe80::/10): adverts come from the sender's link-local address, and only adverts from a listed peer are accepted",
                    );
                }
            }
            let track = t.opt(cx, "track").unwrap_or_default();
            let track_weight = t.opt(cx, "track_weight");
            let garp_repeat = t.opt(cx, "garp_repeat").unwrap_or(3);
            let garp_interval = t
                .opt(cx, "garp_interval")
                .unwrap_or(Duration::from_millis(100));
            let sync = t.opt(cx, "sync");
            let config_sync = config_sync(t, cx, sync.is_some());
            let conntrack_sync = t.opt(cx, "conntrack_sync");
            Some(Ha {
                mode,
                node: node_name,
                interface: interface?,
                vrid: vrid?,
                vrrp_version,
                priority,
                advert_interval,
                preempt,
                preempt_delay,
                peers,
                vips,
                track,
                track_weight,
                garp_repeat,
                garp_interval,
                sync,
                config_sync,
                conntrack_sync,
            })
        })
    }
}

/// The `[ha]` keys that only VRRP (active_standby) uses.
const VRRP_KEYS: &[&str] = &[
    "interface",
    "vrid",
    "vrrp_version",
    "priority",
    "advert_interval",
    "preempt",
    "preempt_delay",
    "peers",
    "vips",
    "track_weight",
    "garp_repeat",
    "garp_interval",
    "track",
    "conntrack_sync",
];

/// `mode = "active_active"`: every node serves the VIPs at once and `[bgp]` announces them
/// (crate fulcrum-ha, `bgp`); there is no VRRP, so its keys are errors rather than ignored.
/// The VRRP fields are left empty: the binary never starts a VRRP node in this mode.
fn active_active(
    t: &mut crate::reader::TableReader<'_>,
    cx: &mut Cx<'_>,
    node: Option<String>,
) -> Ha {
    for key in VRRP_KEYS {
        if let Some(n) = t.node(key) {
            cx.error(
                &n,
                format!("`{key}` is a VRRP key; with mode = \"active_active\" there is no VRRP: the VIPs are announced through [bgp] (remove it, or use mode = \"active_standby\")"),
            );
        }
    }
    Ha {
        mode: HaMode::ActiveActive,
        node,
        interface: String::new(),
        vrid: 0,
        vrrp_version: 3,
        priority: 0,
        advert_interval: Duration::from_secs(1),
        preempt: false,
        preempt_delay: Duration::ZERO,
        peers: Vec::new(),
        vips: Vec::new(),
        track: Vec::new(),
        track_weight: None,
        garp_repeat: 0,
        garp_interval: Duration::ZERO,
        config_sync: false,
        conntrack_sync: None,
        sync: None,
    }
    .with_sync(t, cx)
}

impl Ha {
    fn with_sync(mut self, t: &mut crate::reader::TableReader<'_>, cx: &mut Cx<'_>) -> Ha {
        self.sync = t.opt(cx, "sync");
        self.config_sync = config_sync(t, cx, self.sync.is_some());
        self
    }
}

/// `config_sync = true` travels on the `sync` channel: refused without one.
fn config_sync(t: &mut crate::reader::TableReader<'_>, cx: &mut Cx<'_>, has_sync: bool) -> bool {
    let on = t.opt(cx, "config_sync").unwrap_or(false);
    if on && !has_sync {
        if let Some(n) = t.node("config_sync") {
            cx.error(
                &n,
                "config_sync needs `sync` (the authenticated channel the configuration travels on): add sync = { listen, peers, key }",
            );
        }
    }
    on
}

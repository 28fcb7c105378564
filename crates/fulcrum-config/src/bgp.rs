//! `[bgp]`: scale-out (active-active). Every node serves the VIPs at once and announces them
//! through a local BGP speaker while it can serve them; the upstream router spreads clients over
//! the nodes with ECMP. The keys of DESIGN §4 "Phase 2" (`speaker`, `control`, `announce`) plus
//! Fulcrum additions (`include`, `interface`), documented in docs/configuration.md "Scale-out".

use ipnet::IpNet;

use crate::reader::{Cx, FromNode, Node, Shape};
use crate::string_enum;
use crate::types::read_table;

string_enum! {
    /// `bgp.speaker`.
    BgpSpeaker {
        Bird = "bird",
        Gobgp = "gobgp",
    }
}

/// Where Fulcrum writes the BIRD configuration fragment it owns (BIRD's config includes it).
pub const DEFAULT_BGP_INCLUDE: &str = "/var/lib/fulcrum/bird-announce.conf";
/// The interface whose life is the Fulcrum process's: BIRD's routes for the prefixes point at it,
/// so they vanish when the process dies, however it dies.
pub const DEFAULT_BGP_INTERFACE: &str = "fulcrum-bgp";

/// `[bgp]`: announce the VIPs through a local BGP daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct Bgp {
    pub speaker: BgpSpeaker,
    /// BIRD's control socket (a path), or GoBGP's API address.
    pub control: String,
    /// The prefixes announced while their services have a healthy member.
    pub announce: Vec<IpNet>,
    /// The BIRD configuration fragment Fulcrum rewrites (one `protocol static` per family).
    pub include: String,
    /// The liveness interface (a TUN device held open by the process).
    pub interface: String,
}

impl FromNode for Bgp {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let speaker = t.req(cx, "speaker");
            let control: Option<String> = t.req(cx, "control");
            let announce: Option<Vec<IpNet>> = t.req(cx, "announce");
            if let Some(n) = t.node("announce") {
                if matches!(n.shape(), Shape::Array(items) if items.is_empty()) {
                    cx.error(
                        &n,
                        "list at least one prefix to announce, such as \"198.51.100.10/32\"",
                    );
                }
            }
            if let (Some(c), Some(n)) = (&control, t.node("control")) {
                if c.trim().is_empty() {
                    cx.error(&n, "expected the path of BIRD's control socket, such as \"/run/bird/bird.ctl\"");
                }
            }
            let include: String = t
                .opt(cx, "include")
                .unwrap_or_else(|| DEFAULT_BGP_INCLUDE.to_string());
            if let Some(n) = t.node("include") {
                if !include.starts_with('/') || include.contains('"') {
                    cx.error(
                        &n,
                        "expected an absolute path without quotes (BIRD's config includes it)",
                    );
                }
            }
            let interface: String = t
                .opt(cx, "interface")
                .unwrap_or_else(|| DEFAULT_BGP_INTERFACE.to_string());
            if let Some(n) = t.node("interface") {
                let ok = !interface.is_empty()
                    && interface.len() < 16
                    && interface
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !ok {
                    cx.error(
                        &n,
                        "expected an interface name of 1 to 15 letters, digits, '-' or '_'",
                    );
                }
            }
            Some(Bgp {
                speaker: speaker?,
                control: control?,
                announce: announce?,
                include,
                interface,
            })
        })
    }
}

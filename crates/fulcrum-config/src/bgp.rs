//! `[bgp]`: scale-out (active-active). Every node serves the VIPs at once and announces them
//! through a local BGP speaker while it can serve them; the upstream router spreads clients over
//! the nodes with ECMP. The contract keys (`speaker`, `control`, `announce`) plus
//! Fulcrum additions (`include`, `interface`), documented in docs/configuration.md "Scale-out".

use std::time::Duration;

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
/// gobgpd's gRPC API address when `control` is not given (gobgpd's own default `--api-hosts`).
pub const DEFAULT_GOBGP_API: &str = "127.0.0.1:50051";

/// `host:port` with a port number (an IPv6 host in brackets).
fn is_host_port(s: &str) -> bool {
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    match s.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !host.contains(':')
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        }
        None => false,
    }
}

/// `[bgp]`: announce the VIPs through a local BGP daemon.
#[derive(Debug, Clone, PartialEq)]
pub struct Bgp {
    pub speaker: BgpSpeaker,
    /// BIRD's control socket (a path), or gobgpd's gRPC API address (host:port, default
    /// 127.0.0.1:50051).
    pub control: String,
    /// The prefixes announced while their services have a healthy member.
    pub announce: Vec<IpNet>,
    /// The BIRD configuration fragment Fulcrum rewrites (one `protocol static` per family).
    pub include: String,
    /// The liveness interface (a TUN device held open by the process).
    pub interface: String,
    /// Also export the healthy prefixes into OSPF through the same BIRD (speaker = "bird").
    pub ospf: Option<BgpOspf>,
}

/// `[bgp] ospf`: BIRD's OSPF (v2 for IPv4, v3 for IPv6) in `area` on `interfaces`, exporting
/// the prefixes as external type-1 routes: at `cost` while this node serves them, at
/// `drain_cost` while it is in maintenance (BGP withdraws them then; OSPF keeps them reachable
/// at a cost the other nodes beat).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BgpOspf {
    /// Dotted quad ("0.0.0.0") or a number.
    pub area: String,
    pub interfaces: Vec<String>,
    pub cost: u32,
    pub drain_cost: u32,
    /// Hello interval and dead interval (both sides of an adjacency must agree).
    pub hello: Duration,
    pub dead: Duration,
    /// "broadcast" (elects a designated router first) or "ptp" (a point-to-point link).
    pub network: String,
}

/// OSPF's external metrics are 24 bits (RFC 2328 A.4.5).
const OSPF_MAX_METRIC: u32 = 0xff_ffff;

impl FromNode for BgpOspf {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let area: String = t.opt(cx, "area").unwrap_or_else(|| "0.0.0.0".to_string());
            if let Some(n) = t.node("area") {
                let ok = area.parse::<std::net::Ipv4Addr>().is_ok() || area.parse::<u32>().is_ok();
                if !ok {
                    cx.error(&n, "expected an area id, dotted (\"0.0.0.0\") or a number");
                }
            }
            let interfaces: Option<Vec<String>> = t.req(cx, "interfaces");
            if let (Some(list), Some(n)) = (&interfaces, t.node("interfaces")) {
                if list.is_empty() {
                    cx.error(&n, "list the interfaces OSPF runs on, such as [\"eth0\"]");
                }
                for i in list {
                    if !crate::types::ifname_ok(i) {
                        cx.error(
                            &n,
                            format!("{i:?} is not an interface name: expected 1 to 15 characters of letters, digits, '.', '_' and '-'"),
                        );
                    }
                }
            }
            let cost: u32 = t.opt(cx, "cost").unwrap_or(10);
            let drain_cost: u32 = t.opt(cx, "drain_cost").unwrap_or(60_000);
            for (key, v) in [("cost", cost), ("drain_cost", drain_cost)] {
                if let (true, Some(n)) = (v == 0 || v > OSPF_MAX_METRIC, t.node(key)) {
                    cx.error(&n, format!("{key} must be from 1 to {OSPF_MAX_METRIC} (OSPF external metrics are 24 bits)"));
                }
            }
            if let (true, Some(n)) = (drain_cost <= cost, t.node("drain_cost")) {
                cx.error(&n, "drain_cost must be higher than cost (it moves traffic away from a node in maintenance)");
            }
            let hello: Duration = t.opt(cx, "hello").unwrap_or(Duration::from_secs(10));
            let dead: Duration = t.opt(cx, "dead").unwrap_or(hello * 4);
            for (key, v) in [("hello", hello), ("dead", dead)] {
                let whole = v.subsec_nanos() == 0 && v >= Duration::from_secs(1);
                if let (false, Some(n)) = (whole && v <= Duration::from_secs(65535), t.node(key)) {
                    cx.error(&n, format!("{key} must be whole seconds from 1s to 65535s"));
                }
            }
            if let (true, Some(n)) = (dead <= hello, t.node("dead")) {
                cx.error(&n, "dead must be longer than hello");
            }
            let network: String = t.opt(cx, "network").unwrap_or_else(|| "broadcast".into());
            if let (false, Some(n)) = (
                matches!(network.as_str(), "broadcast" | "ptp"),
                t.node("network"),
            ) {
                cx.error(&n, "expected \"broadcast\" or \"ptp\"");
            }
            Some(BgpOspf {
                area,
                interfaces: interfaces?,
                cost,
                drain_cost,
                hello,
                dead,
                network,
            })
        })
    }
}

impl FromNode for Bgp {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let speaker: Option<BgpSpeaker> = t.req(cx, "speaker");
            // gobgpd's API has a well-known default address; BIRD's socket path has none that
            // fits every distribution, so BIRD's must be given.
            let control: Option<String> = if speaker == Some(BgpSpeaker::Gobgp) {
                Some(
                    t.opt(cx, "control")
                        .unwrap_or_else(|| DEFAULT_GOBGP_API.to_string()),
                )
            } else {
                t.req(cx, "control")
            };
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
                match speaker {
                    Some(BgpSpeaker::Gobgp) if !is_host_port(c) => cx.error(
                        &n,
                        "expected gobgpd's gRPC API address as host:port, such as \"127.0.0.1:50051\"",
                    ),
                    Some(BgpSpeaker::Bird) if c.trim().is_empty() => cx.error(
                        &n,
                        "expected the path of BIRD's control socket, such as \"/run/bird/bird.ctl\"",
                    ),
                    _ => {}
                }
            }
            if speaker == Some(BgpSpeaker::Gobgp) {
                for key in ["include", "interface", "ospf"] {
                    if let Some(n) = t.node(key) {
                        cx.error(
                            &n,
                            "only for speaker = \"bird\" (GoBGP's paths are added through its API; a watchdog process withdraws them if Fulcrum dies)",
                        );
                    }
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
                ospf: t.opt(cx, "ospf"),
                speaker: speaker?,
                control: control?,
                announce: announce?,
                include,
                interface,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<crate::Config, Vec<String>> {
        crate::parse(text, "t.toml", std::path::Path::new("/etc/fulcrum")).map_err(|e| e.messages())
    }

    #[test]
    fn ospf_is_read_with_defaults_and_its_errors_are_located() {
        let base = "[bgp]\nspeaker = \"bird\"\ncontrol = \"/run/bird/bird.ctl\"\nannounce = [\"10.0.0.1/32\"]\n";
        let c = parse(&format!("{base}ospf = {{ interfaces = [\"eth0\"] }}\n")).expect("parses");
        let o = c.bgp.expect("bgp").ospf.expect("ospf");
        assert_eq!(o.area, "0.0.0.0");
        assert_eq!((o.cost, o.drain_cost), (10, 60_000));
        assert_eq!(
            (o.hello, o.dead),
            (Duration::from_secs(10), Duration::from_secs(40))
        );
        assert_eq!(o.network, "broadcast");
        let e = parse(&format!(
            "{base}ospf = {{ area = \"x\", interfaces = [\"eth 0\"], cost = 0, drain_cost = 0, hello = \"500ms\", network = \"nbma\" }}\n"
        ))
        .expect_err("refused")
        .join("\n");
        for want in [
            "bgp.ospf.area: expected an area id",
            "bgp.ospf.interfaces: \"eth 0\" is not an interface name",
            "bgp.ospf.cost: cost must be from 1 to 16777215",
            "bgp.ospf.drain_cost: drain_cost must be higher than cost",
            "bgp.ospf.hello: hello must be whole seconds",
            "bgp.ospf.network: expected \"broadcast\" or \"ptp\"",
        ] {
            assert!(e.contains(want), "{want}\n{e}");
        }
        let gobgp = "[bgp]\nspeaker = \"gobgp\"\nannounce = [\"10.0.0.1/32\"]\nospf = { interfaces = [\"eth0\"] }\n";
        let e = parse(gobgp).expect_err("gobgp has no ospf").join("\n");
        assert!(e.contains("bgp.ospf: only for speaker = \"bird\""), "{e}");
    }

    #[test]
    fn gobgp_takes_an_api_address_with_a_default() {
        let c = parse("[bgp]\nspeaker = \"gobgp\"\nannounce = [\"2001:db8::10/128\"]\n")
            .expect("parses");
        let b = c.bgp.expect("[bgp]");
        assert_eq!(
            (b.speaker, b.control.as_str()),
            (BgpSpeaker::Gobgp, "127.0.0.1:50051")
        );
        for ok in ["[::1]:50051", "localhost:50051", "10.0.0.1:1"] {
            let text = format!(
                "[bgp]\nspeaker = \"gobgp\"\ncontrol = \"{ok}\"\nannounce = [\"10.0.0.1/32\"]\n"
            );
            assert_eq!(parse(&text).expect(ok).bgp.expect("bgp").control, ok);
        }
        for bad in ["/run/gobgpd.sock", "127.0.0.1", "::1:50051", "host:0", ""] {
            let text = format!(
                "[bgp]\nspeaker = \"gobgp\"\ncontrol = \"{bad}\"\nannounce = [\"10.0.0.1/32\"]\n"
            );
            let e = parse(&text).expect_err(bad).join("\n");
            assert!(
                e.contains(
                    "t.toml:3:1: bgp.control: expected gobgpd's gRPC API address as host:port"
                ),
                "{bad}: {e}"
            );
        }
        let e =
            parse("[bgp]\nspeaker = \"gobgp\"\nannounce = [\"10.0.0.1/32\"]\ninterface = \"x\"\n")
                .expect_err("interface")
                .join("\n");
        assert!(
            e.contains("bgp.interface: only for speaker = \"bird\""),
            "{e}"
        );
        // BIRD's socket has no default.
        let e = parse("[bgp]\nspeaker = \"bird\"\nannounce = [\"10.0.0.1/32\"]\n")
            .expect_err("no control")
            .join("\n");
        assert!(e.contains("bgp: missing required key `control`"), "{e}");
    }
}

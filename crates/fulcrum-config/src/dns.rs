//! `[dns]`: the authoritative listeners, their zones and response rate limiting.

use crate::reader::{Cx, FromNode, Node};
use crate::types::{read_table, OneOrMany};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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

//! The keys every stream protocol (tcp, http, https, message) shares, read by each protocol's
//! section; a module of its own so that the sections and `service` do not import each other.

use std::net::IpAddr;

use crate::accel::TcpTuning;
use crate::protocol::ProxyProtocol;
use crate::reader::{Cx, FromNode, Node, TableReader};
use crate::types::OneOrMany;

/// Keys of the stream protocols (tcp, http, https, message): the client-side sockets and how
/// member connections are opened.
#[derive(Debug, Clone, Default)]
pub struct StreamOptions {
    /// Client-side TCP options (Fulcrum addition).
    pub tcp: Option<TcpTuning>,
    pub proxy_protocol: Option<ProxyProtocol>,
    /// Source addresses of member connections, one per connection in turn; empty = the
    /// host's choice.
    pub snat: Vec<IpAddr>,
}

/// The keys `StreamOptions` reads.
pub const STREAM_KEYS: &[&str] = &["tcp", "proxy_protocol", "snat"];

impl StreamOptions {
    pub(crate) fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> StreamOptions {
        StreamOptions {
            tcp: t.opt(cx, "tcp"),
            proxy_protocol: t.opt(cx, "proxy_protocol"),
            snat: t
                .opt::<SourceAddresses>(cx, "snat")
                .map(|s| s.0)
                .unwrap_or_default(),
        }
    }
}

/// `snat`: one address or many, each one this host can send from, none twice.
pub(crate) struct SourceAddresses(Vec<IpAddr>);

impl FromNode for SourceAddresses {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        let list = OneOrMany::<IpAddr>::from_node(node, cx)?.0;
        for (j, ip) in list.iter().enumerate() {
            let at = format!("{}[{j}]", node.path);
            if ip.is_unspecified() || ip.is_multicast() {
                cx.error_path(
                    &at,
                    format!("{ip} cannot be a source address; expected an address of this host"),
                );
            } else if list[..j].contains(ip) {
                cx.error_path(&at, format!("{ip} is listed twice"));
            }
        }
        Some(SourceAddresses(list))
    }
}

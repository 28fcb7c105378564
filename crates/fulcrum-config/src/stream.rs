//! The keys every stream protocol (tcp, http, https, message) shares, read by each protocol's
//! section; a module of its own so that the sections and `service` do not import each other.

use std::net::IpAddr;

use crate::accel::TcpTuning;
use crate::protocol::ProxyProtocol;
use crate::reader::{Cx, FromNode, Node, TableReader};
use crate::string_enum;
use crate::types::OneOrMany;

string_enum!(
    /// `source`: where a service's member connections come from. `local`: an address of this
    /// host (the kernel's choice, or `snat`). `client`: the client's own address
    /// (`IP_TRANSPARENT`), so members see who connected; their replies must route through
    /// Fulcrum.
    #[derive(Default)]
    MemberSource {
        #[default]
        Local = "local",
        Client = "client",
    }
);

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
    /// `source`: member connections from this host or from the client's address. Read by the
    /// sections that take it (`read_source`); `local` elsewhere (ftp).
    pub source: MemberSource,
}

/// The keys `StreamOptions` reads.
pub const STREAM_KEYS: &[&str] = &["tcp", "proxy_protocol", "snat"];

/// `source`: read by the tcp, http, https and message sections (not ftp, whose data
/// connections Fulcrum opens itself).
pub const SOURCE_KEYS: &[&str] = &["source"];

impl StreamOptions {
    pub(crate) fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>) -> StreamOptions {
        StreamOptions {
            tcp: t.opt(cx, "tcp"),
            proxy_protocol: t.opt(cx, "proxy_protocol"),
            snat: t
                .opt::<SourceAddresses>(cx, "snat")
                .map(|s| s.0)
                .unwrap_or_default(),
            source: MemberSource::Local,
        }
    }

    /// Reads `source` (after `read`): `client` together with `snat` is refused, as each names
    /// the source of the same connections.
    pub(crate) fn read_source(&mut self, t: &mut TableReader<'_>, cx: &mut Cx<'_>) {
        self.source = t.opt(cx, "source").unwrap_or_default();
        if self.source == MemberSource::Client && !self.snat.is_empty() {
            cx.error_path(
                &format!("{}.source", t.path()),
                "`source = \"client\"` connects from the client's own address; it cannot be combined with `snat` (remove one of them)",
            );
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

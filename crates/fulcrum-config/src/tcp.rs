//! The section of a `protocol = "tcp"` virtual service: the stream keys, TLS termination and
//! how packets reach the members (proxy, or in-kernel nat / dr / tunnel).

use crate::forwarding::ForwardingOptions;
use crate::protocol::Protocol;
use crate::reader::{Cx, Node, TableReader};
use crate::stream::StreamOptions;
use crate::tls::TlsTermination;

#[derive(Debug, Clone)]
pub struct TcpSection {
    pub stream: StreamOptions,
    /// TLS terminated in front of the members (`tls`); `None`: bytes pass as they come.
    pub tls: Option<TlsTermination>,
    pub forwarding: ForwardingOptions,
}

impl TcpSection {
    pub(crate) fn read(t: &mut TableReader<'_>, cx: &mut Cx<'_>, node: &Node<'_>) -> TcpSection {
        TcpSection {
            stream: StreamOptions::read(t, cx),
            tls: TlsTermination::read(t, cx, node, Protocol::Tcp),
            forwarding: ForwardingOptions::read(t, cx),
        }
    }
}

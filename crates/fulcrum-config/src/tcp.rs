//! The section of a `protocol = "tcp"` virtual service: the stream keys, TLS termination and
//! how packets reach the members (proxy, or in-kernel nat / dr / tunnel). A `protocol = "ftp"`
//! service is a tcp service whose control channel is read (`ftp`): it shares the stream keys
//! but neither TLS termination (the control lines must stay readable) nor in-kernel forwarding.

use std::ops::RangeInclusive;

use crate::forwarding::ForwardingOptions;
use crate::protocol::Protocol;
use crate::reader::{Cx, FromNode, Node, Shape, TableReader};
use crate::rule::{read_l4_rules, Rule};
use crate::stream::{MemberSource, StreamOptions};
use crate::tls::TlsTermination;

#[derive(Debug, Clone)]
pub struct TcpSection {
    pub stream: StreamOptions,
    /// TLS terminated in front of the members (`tls`); `None`: bytes pass as they come.
    pub tls: Option<TlsTermination>,
    pub forwarding: ForwardingOptions,
    /// `protocol = "ftp"`: the FTP helper's settings; `None` for a plain tcp service.
    pub ftp: Option<FtpOptions>,
    /// `protocol = "rtsp"`: the RTSP proxy's settings; `None` for a plain tcp service.
    pub rtsp: Option<RtspOptions>,
    /// Rules choosing the pool of a connection (first match wins; none: the service's pool).
    /// Always empty for ftp; for rtsp they match the first request of a connection (URL and
    /// headers, as http rules match a request).
    pub rules: Vec<Rule>,
}

/// What a `protocol = "ftp"` service adds to a tcp one.
#[derive(Debug, Clone, Default)]
pub struct FtpOptions {
    /// `ftp_passive_ports`: the ports offered to clients in PASV / EPSV answers (and forwarded
    /// as they are after `AUTH TLS`); `None`: any free port the host gives.
    pub passive_ports: Option<RangeInclusive<u16>>,
}

/// What a `protocol = "rtsp"` service adds to a tcp one (read by `rtsp.rs`).
#[derive(Debug, Clone, Default)]
pub struct RtspOptions {
    /// `rtsp_rtp_ports`: the UDP ports Fulcrum relays RTP / RTCP on (pairs: an even port for
    /// RTP, the next one for RTCP), on both sides; `None`: any free pair the host gives.
    pub rtp_ports: Option<RangeInclusive<u16>>,
}

/// The keys only `protocol = "ftp"` takes.
pub const FTP_KEYS: &[&str] = &["ftp_passive_ports"];

impl TcpSection {
    pub(crate) fn read(
        t: &mut TableReader<'_>,
        cx: &mut Cx<'_>,
        node: &Node<'_>,
        protocol: Protocol,
    ) -> TcpSection {
        // (rtsp services are read by rtsp.rs: their rules are http rules.)
        if protocol == Protocol::Ftp {
            return TcpSection {
                stream: StreamOptions::read(t, cx),
                tls: None,
                forwarding: ForwardingOptions::default(),
                ftp: Some(FtpOptions {
                    passive_ports: t.opt::<PortRange>(cx, "ftp_passive_ports").map(|r| r.0),
                }),
                rtsp: None,
                rules: Vec::new(),
            };
        }
        let mut stream = StreamOptions::read(t, cx);
        stream.read_source(t, cx);
        let forwarding = ForwardingOptions::read(t, cx);
        if stream.source == MemberSource::Client && forwarding.forwarding.in_kernel() {
            cx.error_path(
                &format!("{}.source", t.path()),
                format!(
                    "`source = \"client\"` applies to proxied connections (forwarding = \"proxy\"); with forwarding = \"{}\" the kernel forwards the client's packets and Fulcrum opens no member connection",
                    forwarding.forwarding
                ),
            );
        }
        let rules = read_l4_rules(t, cx, Protocol::Tcp, &forwarding);
        TcpSection {
            stream,
            tls: TlsTermination::read(t, cx, node, Protocol::Tcp),
            forwarding,
            ftp: None,
            rtsp: None,
            rules,
        }
    }
}

/// `"A-B"`: a range of TCP ports, 1 ≤ A ≤ B ≤ 65535.
pub(crate) struct PortRange(pub(crate) RangeInclusive<u16>);

impl FromNode for PortRange {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        let Shape::Str(text) = node.shape() else {
            cx.error(
                node,
                format!(
                    "expected a port range as a string \"A-B\", found {}",
                    node.type_name()
                ),
            );
            return None;
        };
        match crate::types::parse_port_range(text) {
            Ok(r) => Some(PortRange(r)),
            Err(why) => {
                cx.error(node, format!("{text:?} is not a port range: {why}"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::types::parse_port_range;

    #[test]
    fn port_ranges_are_bounded_and_ordered() {
        assert_eq!(parse_port_range("50000-50100"), Ok(50000..=50100));
        assert_eq!(parse_port_range("21-21"), Ok(21..=21));
        for bad in ["0-10", "10-5", "5", "1-65536", "a-b", "-"] {
            assert!(parse_port_range(bad).is_err(), "{bad}");
        }
    }
}

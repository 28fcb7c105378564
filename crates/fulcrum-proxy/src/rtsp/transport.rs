//! The `Transport` header of SETUP requests and replies (RFC 2326 §12.39): which of the
//! transports offered are RTP over unicast UDP, their port pairs, and the same header with
//! those pairs (and `source`) pointed at Fulcrum's relays. Interleaved (TCP) and multicast
//! transports pass as they are.

use std::net::IpAddr;

/// An RTP port and its RTCP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortPair {
    pub rtp: u16,
    pub rtcp: u16,
}

impl PortPair {
    /// `a-b`, or `a` alone (RTCP on the next port, RFC 3550 §11).
    pub fn parse(text: &str) -> Option<PortPair> {
        let (a, b) = match text.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let a: u16 = text.trim().parse().ok()?;
                (a, a.checked_add(1)?)
            }
        };
        (a != 0 && b != 0).then_some(PortPair { rtp: a, rtcp: b })
    }

    fn text(self) -> String {
        format!("{}-{}", self.rtp, self.rtcp)
    }
}

/// Whether a transport spec (`RTP/AVP;unicast;client_port=…`) is RTP over unicast UDP.
fn is_unicast_udp(spec: &str) -> bool {
    let mut params = spec.split(';').map(str::trim);
    let protocol = params.next().unwrap_or_default();
    let udp = [
        "RTP/AVP",
        "RTP/AVP/UDP",
        "RTP/AVPF",
        "RTP/AVPF/UDP",
        "RTP/SAVP",
        "RTP/SAVP/UDP",
    ]
    .iter()
    .any(|p| protocol.eq_ignore_ascii_case(p));
    udp && !params.any(|p| p.eq_ignore_ascii_case("multicast"))
}

/// The value of parameter `key` of a spec.
fn param<'a>(spec: &'a str, key: &str) -> Option<&'a str> {
    spec.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim().eq_ignore_ascii_case(key).then_some(v.trim())
    })
}

/// The `key` port pair (`client_port`, `server_port`) of the first unicast UDP transport that
/// has one; `None` when there is none (interleaved, multicast) or the header is not text.
pub fn ports(value: &[u8], key: &str) -> Option<PortPair> {
    let text = std::str::from_utf8(value).ok()?;
    text.split(',')
        .filter(|s| is_unicast_udp(s))
        .find_map(|s| param(s, key))
        .and_then(PortPair::parse)
}

/// The `source` address of the first unicast UDP transport that names one (a member may send
/// its media from another address than the one its control connection reached).
pub fn source(value: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(value).ok()?;
    text.split(',')
        .filter(|s| is_unicast_udp(s))
        .find_map(|s| param(s, "source"))
        .and_then(|ip| ip.parse().ok())
}

/// The header with, in each unicast UDP transport, the parameters `edits` names set to their
/// new values (only those the transport has); other transports as they were.
pub fn rewrite(value: &[u8], edits: &[(&str, String)]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(value).ok()?;
    let specs: Vec<String> = text
        .split(',')
        .map(|spec| {
            if !is_unicast_udp(spec) {
                return spec.to_string();
            }
            let params: Vec<String> = spec
                .split(';')
                .enumerate()
                .map(|(i, p)| {
                    let edit = (i > 0)
                        .then(|| p.split_once('='))
                        .flatten()
                        .and_then(|(k, _)| {
                            edits.iter().find(|(e, _)| k.trim().eq_ignore_ascii_case(e))
                        });
                    match edit {
                        Some((k, v)) => format!("{k}={v}"),
                        None => p.to_string(),
                    }
                })
                .collect();
            params.join(";")
        })
        .collect();
    Some(specs.join(",").into_bytes())
}

/// A SETUP request's header with the client's port pair replaced by Fulcrum's member-side one.
pub fn request_to_member(value: &[u8], member_side: PortPair) -> Option<Vec<u8>> {
    rewrite(value, &[("client_port", member_side.text())])
}

/// A SETUP reply's header for the client: its own client ports back, the server ports and
/// source of Fulcrum's client-side relay.
pub fn reply_to_client(
    value: &[u8],
    client: PortPair,
    client_side: PortPair,
    vip: IpAddr,
) -> Option<Vec<u8>> {
    rewrite(
        value,
        &[
            ("client_port", client.text()),
            ("server_port", client_side.text()),
            ("source", vip.to_string()),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unicast_udp_ports_are_read_and_rewritten() {
        let offer = b"RTP/AVP/TCP;unicast;interleaved=0-1,RTP/AVP;unicast;client_port=5000-5001";
        assert_eq!(
            ports(offer, "client_port"),
            Some(PortPair {
                rtp: 5000,
                rtcp: 5001
            })
        );
        let out = request_to_member(
            offer,
            PortPair {
                rtp: 6000,
                rtcp: 6001,
            },
        )
        .unwrap();
        assert_eq!(
            out,
            b"RTP/AVP/TCP;unicast;interleaved=0-1,RTP/AVP;unicast;client_port=6000-6001"
        );
        let reply = b"RTP/AVP;unicast;client_port=6000-6001;server_port=7000-7001;source=10.0.0.5;ssrc=1234";
        let out = reply_to_client(
            reply,
            PortPair {
                rtp: 5000,
                rtcp: 5001,
            },
            PortPair {
                rtp: 8000,
                rtcp: 8001,
            },
            "192.0.2.1".parse().unwrap(),
        )
        .unwrap();
        assert_eq!(
            out,
            b"RTP/AVP;unicast;client_port=5000-5001;server_port=8000-8001;source=192.0.2.1;ssrc=1234"
        );
        // Interleaved and multicast transports have nothing to relay.
        assert_eq!(
            ports(b"RTP/AVP/TCP;unicast;interleaved=0-1", "client_port"),
            None
        );
        assert_eq!(
            ports(b"RTP/AVP;multicast;client_port=5000-5001", "client_port"),
            None
        );
        assert_eq!(
            ports(b"RTP/AVP;unicast;client_port=5000", "client_port"),
            Some(PortPair {
                rtp: 5000,
                rtcp: 5001
            })
        );
        assert_eq!(
            ports(b"RTP/AVP;unicast;client_port=0-1", "client_port"),
            None
        );
        assert_eq!(
            ports(b"RTP/AVP;unicast;client_port=a-b", "client_port"),
            None
        );
    }
}

//! PROXY protocol headers (HAProxy's spec, v1 text and v2 binary) sent to members so they see
//! the client's address through the full proxy.

use std::net::{IpAddr, SocketAddr};

use fulcrum_config::ProxyProtocol;

const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

fn unmap(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    }
}

/// The header for a connection from `client` to our address `local`.
pub fn header(version: ProxyProtocol, client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    let (client, local) = (unmap(client), unmap(local));
    match version {
        ProxyProtocol::V1 => v1(client, local),
        ProxyProtocol::V2 => v2(client, local),
    }
}

/// The header for a connection that carries no single client (it is the proxy's own, e.g. a
/// member connection shared by many clients' messages): v1 `UNKNOWN`, v2 the `LOCAL` command.
/// Receivers then use the connection's real endpoints.
pub fn local_header(version: ProxyProtocol) -> Vec<u8> {
    match version {
        ProxyProtocol::V1 => b"PROXY UNKNOWN\r\n".to_vec(),
        ProxyProtocol::V2 => {
            let mut h = V2_SIGNATURE.to_vec();
            // version 2, LOCAL command; UNSPEC family; no address block.
            h.extend_from_slice(&[0x20, 0x00, 0x00, 0x00]);
            h
        }
    }
}

fn v1(client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    match (client.ip(), local.ip()) {
        (IpAddr::V4(c), IpAddr::V4(l)) => {
            format!("PROXY TCP4 {c} {l} {} {}\r\n", client.port(), local.port()).into_bytes()
        }
        (IpAddr::V6(c), IpAddr::V6(l)) => {
            format!("PROXY TCP6 {c} {l} {} {}\r\n", client.port(), local.port()).into_bytes()
        }
        // Families differ (cannot happen on one socket): the spec's "unknown" form.
        _ => b"PROXY UNKNOWN\r\n".to_vec(),
    }
}

fn v2(client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    let mut h = Vec::with_capacity(52);
    h.extend_from_slice(&V2_SIGNATURE);
    h.push(0x21); // version 2, PROXY command
    match (client.ip(), local.ip()) {
        (IpAddr::V4(c), IpAddr::V4(l)) => {
            h.push(0x11); // AF_INET, STREAM
            h.extend_from_slice(&12u16.to_be_bytes());
            h.extend_from_slice(&c.octets());
            h.extend_from_slice(&l.octets());
        }
        (IpAddr::V6(c), IpAddr::V6(l)) => {
            h.push(0x21); // AF_INET6, STREAM
            h.extend_from_slice(&36u16.to_be_bytes());
            h.extend_from_slice(&c.octets());
            h.extend_from_slice(&l.octets());
        }
        _ => {
            h.push(0x00); // UNSPEC
            h.extend_from_slice(&0u16.to_be_bytes());
            return h;
        }
    }
    h.extend_from_slice(&client.port().to_be_bytes());
    h.extend_from_slice(&local.port().to_be_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_text() {
        let h = header(
            ProxyProtocol::V1,
            "192.0.2.1:5000".parse().unwrap(),
            "127.0.0.1:80".parse().unwrap(),
        );
        assert_eq!(h, b"PROXY TCP4 192.0.2.1 127.0.0.1 5000 80\r\n");
        let h = header(
            ProxyProtocol::V1,
            "[2001:db8::1]:5000".parse().unwrap(),
            "[::1]:80".parse().unwrap(),
        );
        assert_eq!(h, b"PROXY TCP6 2001:db8::1 ::1 5000 80\r\n");
        let h = header(
            ProxyProtocol::V1,
            "[::ffff:192.0.2.1]:1".parse().unwrap(),
            "[::ffff:127.0.0.1]:2".parse().unwrap(),
        );
        assert_eq!(h, b"PROXY TCP4 192.0.2.1 127.0.0.1 1 2\r\n");
    }

    #[test]
    fn v2_binary() {
        let h = header(
            ProxyProtocol::V2,
            "192.0.2.1:5000".parse().unwrap(),
            "127.0.0.1:80".parse().unwrap(),
        );
        assert_eq!(h.len(), 16 + 12);
        assert_eq!(&h[..12], &V2_SIGNATURE);
        assert_eq!(h[12], 0x21);
        assert_eq!(h[13], 0x11);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]), 12);
        assert_eq!(&h[16..20], &[192, 0, 2, 1]);
        assert_eq!(u16::from_be_bytes([h[24], h[25]]), 5000);
        let h = header(
            ProxyProtocol::V2,
            "[2001:db8::1]:5000".parse().unwrap(),
            "[::1]:80".parse().unwrap(),
        );
        assert_eq!(h.len(), 16 + 36);
        assert_eq!(h[13], 0x21);
    }
}

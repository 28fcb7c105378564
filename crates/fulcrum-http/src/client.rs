//! The client side of a connection as every part of an exchange sees it.

use std::net::{IpAddr, SocketAddr};

/// The scheme a client connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// Plain TCP: HTTP/2 is recognised by its connection preface (prior knowledge, h2c).
    Unknown,
    /// TLS negotiated `http/1.1` (or no ALPN).
    Http1,
    /// TLS negotiated `h2`.
    H2,
}

/// What is known about a client connection when it is handed to the HTTP data plane. A TLS
/// acceptor in front (https) fills `alpn` and `sni` from the handshake.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub alpn: Alpn,
    /// The server name the client asked for in its TLS handshake.
    pub sni: Option<std::sync::Arc<str>>,
}

/// The client of a connection, with the text forms forwarding headers need (made once).
#[derive(Debug, Clone)]
pub struct Client {
    pub info: ConnInfo,
    /// The client address; an IPv4-mapped IPv6 address as IPv4.
    pub ip: IpAddr,
    pub ip_text: String,
}

impl Client {
    pub fn new(info: ConnInfo) -> Client {
        let ip = match info.peer.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(info.peer.ip(), IpAddr::V4),
            v4 => v4,
        };
        Client {
            info,
            ip,
            ip_text: ip.to_string(),
        }
    }
}

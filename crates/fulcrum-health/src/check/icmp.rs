//! icmp: one echo request (ping) to the member's address, IPv4 or IPv6; the member passes when
//! the matching echo reply arrives within the timeout. The port is not used.
//!
//! A raw ICMP socket needs CAP_NET_RAW; without it, Linux's unprivileged ping sockets
//! (`SOCK_DGRAM`, allowed by `net.ipv4.ping_group_range`) are used instead. Either socket is
//! connected to the member, so the kernel hands it only that address's ICMP, and a reply is
//! matched by its sequence number and a random token in its payload (an unprivileged socket has
//! its identifier rewritten by the kernel, so the identifier alone cannot match it).

use std::io;
use std::net::{IpAddr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;

use super::{Probe, Verdict};
use crate::text;

const ECHO_REQUEST_V4: u8 = 8;
const ECHO_REPLY_V4: u8 = 0;
const ECHO_REQUEST_V6: u8 = 128;
const ECHO_REPLY_V6: u8 = 129;
const TOKEN_LEN: usize = 16;

#[derive(Debug)]
pub(crate) struct IcmpCheck;

/// An ICMP socket connected to `ip`: raw when allowed, else an unprivileged ping socket.
/// Returned as a tokio `UdpSocket`, whose send/recv are plain calls on the descriptor, which is
/// all a connected ICMP socket needs.
fn icmp_socket(ip: IpAddr, via: Option<&super::Via>) -> io::Result<(UdpSocket, bool)> {
    let (domain, proto) = match ip {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6),
    };
    let (socket, raw) = match Socket::new(domain, Type::RAW, Some(proto)) {
        Ok(s) => (s, true),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            (Socket::new(domain, Type::DGRAM, Some(proto))?, false)
        }
        Err(e) => return Err(e),
    };
    socket.set_nonblocking(true)?;
    if let Some(via) = via {
        via.apply(&socket, true)?;
    }
    socket.connect(&SocketAddr::new(ip, 0).into())?;
    let std: std::net::UdpSocket = socket.into();
    Ok((UdpSocket::from_std(std)?, raw))
}

/// The Internet checksum (RFC 1071) of `data`.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Whether `packet` (as a socket of this kind reads it) is the echo reply to ours.
fn is_our_reply(packet: &[u8], v4: bool, raw: bool, seq: u16, token: &[u8]) -> bool {
    // A raw IPv4 socket reads the IP header too; IPv6 and ping sockets start at ICMP.
    let icmp = if v4 && raw {
        let ihl = usize::from(packet.first().map_or(0, |b| b & 0x0f)) * 4;
        match packet.get(ihl..) {
            Some(rest) if ihl >= 20 => rest,
            _ => return false,
        }
    } else {
        packet
    };
    let reply = if v4 { ECHO_REPLY_V4 } else { ECHO_REPLY_V6 };
    icmp.len() >= 8 + TOKEN_LEN
        && icmp[0] == reply
        && icmp[1] == 0
        && u16::from_be_bytes([icmp[6], icmp[7]]) == seq
        && &icmp[8..8 + TOKEN_LEN] == token
}

impl IcmpCheck {
    pub async fn run(&self, probe: &Probe) -> Verdict {
        let ip = probe.addr.ip();
        let v4 = ip.is_ipv4();
        let (socket, raw) = match icmp_socket(ip, probe.via.as_ref()) {
            Ok(s) => s,
            Err(e) => return Verdict::fail(format!("icmp socket: {}", text::io_error(&e))),
        };
        let id = fastrand::u16(..);
        let seq = fastrand::u16(..);
        let mut token = [0u8; TOKEN_LEN];
        token.iter_mut().for_each(|b| *b = fastrand::u8(..));
        let mut request = vec![if v4 { ECHO_REQUEST_V4 } else { ECHO_REQUEST_V6 }, 0, 0, 0];
        request.extend_from_slice(&id.to_be_bytes());
        request.extend_from_slice(&seq.to_be_bytes());
        request.extend_from_slice(&token);
        if v4 {
            // ICMPv6's checksum covers a pseudo-header the kernel fills in for raw and ping
            // sockets; ICMPv4's is ours to compute.
            let sum = checksum(&request);
            request[2..4].copy_from_slice(&sum.to_be_bytes());
        }
        let started = tokio::time::Instant::now();
        if let Err(e) = socket.send(&request).await {
            return Verdict::fail(format!("echo request: {}", text::io_error(&e)));
        }
        let mut buf = [0u8; 1500];
        loop {
            match tokio::time::timeout_at(probe.deadline, socket.recv(&mut buf)).await {
                Err(_) => return Verdict::fail(format!("{}: no echo reply", probe.timed_out())),
                Ok(Err(e)) => {
                    return Verdict::fail(format!("echo: {}", text::io_error(&e)));
                }
                Ok(Ok(n)) if is_our_reply(&buf[..n], v4, raw, seq, &token) => {
                    let ms = started.elapsed().as_secs_f64() * 1000.0;
                    return Verdict::pass(format!("echo reply in {ms:.2}ms"));
                }
                // Our own request (looped back), other ICMP from the member: keep waiting.
                Ok(Ok(_)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2, checksum 220d.
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0x220d
        );
        // A packet with its checksum in place sums to zero.
        let mut p = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1, 1, 2, 3];
        let c = checksum(&p);
        p[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum(&p), 0);
    }

    #[test]
    fn replies_are_matched_by_sequence_and_token() {
        let token = [9u8; TOKEN_LEN];
        let mut reply = vec![ECHO_REPLY_V6, 0, 0, 0, 0, 1, 0x01, 0x02];
        reply.extend_from_slice(&token);
        assert!(is_our_reply(&reply, false, true, 0x0102, &token));
        assert!(!is_our_reply(&reply, false, true, 0x0103, &token));
        assert!(!is_our_reply(&reply, false, true, 0x0102, &[0; TOKEN_LEN]));
        reply[0] = ECHO_REQUEST_V6;
        assert!(
            !is_our_reply(&reply, false, true, 0x0102, &token),
            "our own request"
        );
        // IPv4 raw: behind a 20-byte header.
        let mut v4 = vec![0x45; 1];
        v4.extend_from_slice(&[0; 19]);
        v4.extend_from_slice(&[ECHO_REPLY_V4, 0, 0, 0, 0, 1, 0x01, 0x02]);
        v4.extend_from_slice(&token);
        assert!(is_our_reply(&v4, true, true, 0x0102, &token));
        assert!(!is_our_reply(&v4[..10], true, true, 0x0102, &token));
        assert!(!is_our_reply(&[], true, true, 0x0102, &token));
    }
}

//! The UDP side of an RTSP session: for each stream a SETUP asks over unicast UDP, one pair of
//! sockets faces the member (its `client_port` in the rewritten request) and one faces the
//! client (the `server_port` of the rewritten reply); RTP and RTCP datagrams are relayed
//! between them. Only the session's member (its address, or the `source` its reply names) and
//! its client may send into a pair (as FTP's data listeners admit only their session's peers);
//! a relay ends at its session's TEARDOWN (on any connection) or after the service's idle
//! timeout without a datagram; one that has no session ends with its control connection.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_net::stats::ServiceStats;
use tokio::net::UdpSocket;

use super::transport::PortPair;

/// Datagrams read from one socket before the others get their turn.
const BATCH: usize = 64;

/// Two UDP sockets on consecutive ports: RTP on the first, RTCP on the next.
#[derive(Debug)]
pub struct SocketPair {
    pub rtp: UdpSocket,
    pub rtcp: UdpSocket,
}

fn bind_one(ip: IpAddr, port: u16) -> io::Result<UdpSocket> {
    let socket = std::net::UdpSocket::bind(SocketAddr::new(ip, port))?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
}

impl SocketPair {
    /// Binds a pair on `ip`: an even port and the next (RFC 3550 §11), from `range` when
    /// given (tried from a point that varies per call, as FTP's passive ports are), else
    /// wherever the host has one free. Bounded in attempts either way.
    pub fn bind(ip: IpAddr, range: Option<&RangeInclusive<u16>>) -> io::Result<SocketPair> {
        let pair = |rtp: u16| -> io::Result<SocketPair> {
            let first = bind_one(ip, rtp)?;
            let port = first.local_addr()?.port();
            let next = port
                .checked_add(1)
                .ok_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, "no next port"))?;
            Ok(SocketPair {
                rtp: first,
                rtcp: bind_one(ip, next)?,
            })
        };
        let mut last = io::Error::new(io::ErrorKind::AddrInUse, "no UDP port pair free");
        let Some(range) = range else {
            // Ports the host picks: keep the first even one whose successor is free too.
            for _ in 0..64 {
                let probe = bind_one(ip, 0)?;
                let port = probe.local_addr()?.port();
                if port % 2 == 1 || port == u16::MAX {
                    continue;
                }
                drop(probe);
                match pair(port) {
                    Ok(p) => return Ok(p),
                    Err(e) => last = e,
                }
            }
            return Err(last);
        };
        let low = range.start() + range.start() % 2;
        // Even ports p in low..=end with p + 1 in range too.
        let pairs = u32::from(*range.end())
            .saturating_sub(u32::from(low))
            .div_ceil(2);
        if pairs == 0 {
            return Err(last);
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let start = (NEXT.fetch_add(1, Ordering::Relaxed) % u64::from(pairs)) as u32;
        for i in 0..pairs {
            // Within low..=end, both u16.
            let port = (u32::from(low) + 2 * ((start + i) % pairs)) as u16;
            match pair(port) {
                Ok(p) => return Ok(p),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    pub fn ports(&self) -> io::Result<PortPair> {
        Ok(PortPair {
            rtp: self.rtp.local_addr()?.port(),
            rtcp: self.rtcp.local_addr()?.port(),
        })
    }
}

/// One relayed stream: the sockets and where each side's datagrams go.
#[derive(Debug)]
pub struct MediaRelay {
    pub member_side: SocketPair,
    pub client_side: SocketPair,
    pub client_ip: IpAddr,
    pub client_ports: PortPair,
    pub member_ip: IpAddr,
    pub member_ports: PortPair,
    /// The `source` the member's reply named, when it differs from `member_ip`: datagrams
    /// from it are the member's too.
    pub member_source: Option<IpAddr>,
}

/// The counters a relay adds to, and the time of its last datagram (whole seconds since the
/// connection started, plus one; 0: none yet) that keeps a quiet control connection open.
#[derive(Debug, Clone)]
pub struct RelayCounters {
    pub stats: Arc<ServiceStats>,
    pub last_datagram: Arc<AtomicU64>,
    pub started: tokio::time::Instant,
}

fn same_host(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

impl MediaRelay {
    /// Relays until `idle` passes without a datagram (or the task is aborted).
    pub async fn run(self, idle: Duration, counters: RelayCounters) {
        let mut buf = vec![0u8; 65_536];
        let routes = [
            (
                &self.member_side.rtp,
                self.member_ip,
                &self.client_side.rtp,
                SocketAddr::new(self.client_ip, self.client_ports.rtp),
            ),
            (
                &self.member_side.rtcp,
                self.member_ip,
                &self.client_side.rtcp,
                SocketAddr::new(self.client_ip, self.client_ports.rtcp),
            ),
            (
                &self.client_side.rtp,
                self.client_ip,
                &self.member_side.rtp,
                SocketAddr::new(self.member_ip, self.member_ports.rtp),
            ),
            (
                &self.client_side.rtcp,
                self.client_ip,
                &self.member_side.rtcp,
                SocketAddr::new(self.member_ip, self.member_ports.rtcp),
            ),
        ];
        loop {
            let ready = tokio::time::timeout(idle, async {
                tokio::select! {
                    r = routes[0].0.readable() => r.map(|_| 0),
                    r = routes[1].0.readable() => r.map(|_| 1),
                    r = routes[2].0.readable() => r.map(|_| 2),
                    r = routes[3].0.readable() => r.map(|_| 3),
                }
            })
            .await;
            let Ok(Ok(i)) = ready else {
                return;
            };
            let (from_socket, allowed, to_socket, to) = routes[i];
            let mut relayed_any = false;
            for _ in 0..BATCH {
                let (n, from) = match from_socket.try_recv_from(&mut buf) {
                    Ok(r) => r,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // ICMP errors (the other side's port closed) surface here: not ours.
                    Err(_) => continue,
                };
                // Routes 0 and 1 read the member side.
                let from_member_source =
                    i < 2 && self.member_source.is_some_and(|s| same_host(from.ip(), s));
                let relayed = (same_host(from.ip(), allowed) || from_member_source)
                    && to_socket.try_send_to(&buf[..n], to).is_ok();
                let counter = if relayed {
                    &counters.stats.rtsp_datagrams
                } else {
                    &counters.stats.rtsp_datagrams_dropped
                };
                counter.fetch_add(1, Ordering::Relaxed);
                relayed_any |= relayed;
            }
            // One clock read per batch: the mark is in whole seconds.
            if relayed_any {
                counters
                    .last_datagram
                    .store(counters.started.elapsed().as_secs() + 1, Ordering::Relaxed);
            }
        }
    }
}

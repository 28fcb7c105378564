//! The request and answer over UDP that the dns and radius checks share: a connected socket,
//! the request sent again while no answer comes, and the wait bounded by the probe's deadline.

use tokio::net::UdpSocket;

use super::{Probe, Verdict};
use crate::text;

/// How an exchange over UDP ended, short of a verdict of its own.
pub(super) enum UdpExchange<T> {
    /// What `take` made of the datagram that ended the wait.
    Answer(T),
    /// The socket failed: the check fails with this.
    Failed(Verdict),
    /// No datagram that `take` accepted came before the deadline.
    TimedOut,
}

/// Connects `socket` to the member, so that only its datagrams are read and its ICMP errors
/// surface, and sends `request`, again every third of the timeout (50 ms at least) since UDP
/// may lose it, until the deadline. Each datagram that comes back goes to `take`, which ends the
/// wait with what it makes of it (`Some`), or passes over it (`None`: not an answer to this
/// request). `proto` names the protocol in a receive error.
pub(super) async fn udp_exchange<T>(
    socket: UdpSocket,
    request: &[u8],
    probe: &Probe,
    proto: &str,
    mut take: impl FnMut(&[u8]) -> Option<T>,
) -> UdpExchange<T> {
    let io = |what: &str, e: std::io::Error| {
        UdpExchange::Failed(Verdict::fail(format!("{what}: {}", text::io_error(&e))))
    };
    if let Err(e) = socket.connect(probe.addr).await {
        return io("connect", e);
    }
    let resend = (probe.timeout / 3).max(std::time::Duration::from_millis(50));
    let mut buf = vec![0u8; 4096];
    loop {
        if let Err(e) = socket.send(request).await {
            return io("send", e);
        }
        let wait = (tokio::time::Instant::now() + resend).min(probe.deadline);
        loop {
            match tokio::time::timeout_at(wait, socket.recv(&mut buf)).await {
                Err(_) if wait >= probe.deadline => return UdpExchange::TimedOut,
                Err(_) => break,
                Ok(Err(e)) => return io(proto, e),
                Ok(Ok(n)) => {
                    if let Some(answer) = take(&buf[..n]) {
                        return UdpExchange::Answer(answer);
                    }
                }
            }
        }
    }
}

/// The unspecified address of `addr`'s family, port 0: where a socket to `addr` binds.
pub(super) fn any_local(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    if addr.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        ([0, 0, 0, 0], 0).into()
    }
}

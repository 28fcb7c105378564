//! Servers and clients that Fulcrum's tests and benchmarks run against: small, observable, and
//! controllable (a backend can be made unhealthy, an agent can change its reply). A
//! dev-dependency only: `fulcrum demo` has its own backends in the binary.

pub mod browser;
pub mod client;
pub mod delay;
pub mod dialogue;
pub mod echo;
pub mod h2abuse;
pub mod message;
pub mod mmdb;
pub mod netns;
pub mod origin;
pub mod pki;
pub mod process;
pub mod servers;
pub mod udp;

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

pub use client::{http_get, http_request, HttpResponse};
pub use delay::DelayedResolver;
pub use dialogue::DialogueServer;
pub use echo::EchoMember;
pub use message::{MessageClient, MessageSwitch, SwitchOptions, WireFraming};
pub use origin::{Origin, Reply, Seen};
pub use process::Fulcrum;
pub use servers::{AgentServer, Blackhole, HttpBackend, RawBackend, RawBehaviour, TcpIdServer};
pub use udp::{RadiusServer, UdpEchoServer};

/// Where `free_port` looks: below Linux's ephemeral range (32768–60999 by default), so the
/// source port of some other test's outgoing connection can never take a port between the
/// moment it is found free and the moment the test binds it (the race that picking port 0 and
/// closing it had, which made tests fail with "address already in use" on a busy machine).
const TEST_PORTS: std::ops::Range<u16> = 12_000..32_000;

/// A random number for spreading the ports that tests of concurrent processes pick.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish()
}

/// Whether no earlier call in this process handed out `port`, remembering it from now on.
/// A port found free may belong to a concurrent test of this process whose Fulcrum has not
/// bound it yet; without this, a second test could take it and one of the two fail with
/// "address already in use".
fn never_handed_out(port: u16) -> bool {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let mut seen = HANDED_OUT
        .get_or_init(|| Mutex::new(HashSet::new()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    seen.insert(port)
}

/// A port on 127.0.0.1 that was free for TCP and UDP a moment ago, outside the ephemeral range.
pub fn free_port() -> u16 {
    free_addr_on([127, 0, 0, 1]).port()
}

/// A free address (TCP and UDP) on a loopback address `127.0.0.ip`, outside the ephemeral
/// port range (see `TEST_PORTS`).
pub fn free_addr_on(ip: [u8; 4]) -> SocketAddr {
    let span = u64::from(TEST_PORTS.end - TEST_PORTS.start);
    for _ in 0..200 {
        let port = TEST_PORTS.start + (random_u64() % span) as u16;
        let addr = SocketAddr::from((ip, port));
        if TcpListener::bind(addr).is_ok()
            && std::net::UdpSocket::bind(addr).is_ok()
            && never_handed_out(port)
        {
            return addr;
        }
    }
    // Nearly every test port taken: fall back to the kernel's choice.
    TcpListener::bind(SocketAddr::from((ip, 0)))
        .and_then(|l| l.local_addr())
        .unwrap_or(SocketAddr::from((ip, 0)))
}

pub fn free_addr() -> SocketAddr {
    free_addr_on([127, 0, 0, 1])
}

/// Binds a TCP listener on `addr` for a test's server. A port from `free_addr` is free when
/// found, not reserved: if something binds it before the server does (seen in CI as
/// "address already in use" on a test port), the server takes another test port on the same
/// address instead of failing the test. Callers read the bound address from the listener.
/// A port outside the test range (a fixed port, or 0) is bound as asked, once.
pub async fn bind_tcp(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    bind_retrying(addr, tokio::net::TcpListener::bind).await
}

/// `bind_tcp` for a UDP server.
pub async fn bind_udp(addr: SocketAddr) -> std::io::Result<tokio::net::UdpSocket> {
    bind_retrying(addr, tokio::net::UdpSocket::bind).await
}

async fn bind_retrying<T, F, Fut>(addr: SocketAddr, bind: F) -> std::io::Result<T>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: Future<Output = std::io::Result<T>>,
{
    let mut addr = addr;
    for _ in 0..5 {
        match bind(addr).await {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && TEST_PORTS.contains(&addr.port()) =>
            {
                addr = free_addr_on_ip(addr.ip());
            }
            r => return r,
        }
    }
    bind(addr).await
}

/// `free_addr_on` for any address: a test port on an IPv4 address, or one free on 127.0.0.1
/// for an IPv6 one (test ports are handed out per port number, whatever the address).
pub fn free_addr_on_ip(ip: std::net::IpAddr) -> SocketAddr {
    match ip {
        std::net::IpAddr::V4(v4) => free_addr_on(v4.octets()),
        std::net::IpAddr::V6(_) => SocketAddr::new(ip, free_addr_on([127, 0, 0, 1]).port()),
    }
}

/// Polls `cond` every 20 ms until it holds or `deadline` passes; returns whether it held.
pub async fn wait_until<F, Fut>(deadline: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + deadline;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_test_port_taken_before_the_bind_is_replaced_and_a_fixed_one_is_not() {
        let addr = free_addr();
        let taker = TcpListener::bind(addr).unwrap();
        let listener = bind_tcp(addr).await.unwrap();
        let bound = listener.local_addr().unwrap();
        assert_eq!(bound.ip(), addr.ip());
        assert_ne!(bound.port(), addr.port());
        assert!(TEST_PORTS.contains(&bound.port()));

        let udp_taker = std::net::UdpSocket::bind(addr).unwrap();
        let socket = bind_udp(addr).await.unwrap();
        assert_ne!(socket.local_addr().unwrap().port(), addr.port());

        // Outside the test range the caller meant that port: the error is theirs to see.
        let fixed = TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = fixed.local_addr().unwrap();
        let err = bind_tcp(taken).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        drop((taker, udp_taker));
    }
}

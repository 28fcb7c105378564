//! Servers and clients that Fulcrum's tests, benchmarks and demo mode run against: small,
//! observable, and controllable (a backend can be made unhealthy, an agent can change its reply).

pub mod browser;
pub mod client;
pub mod dialogue;
pub mod h2abuse;
pub mod message;
pub mod mmdb;
pub mod netns;
pub mod origin;
pub mod process;
pub mod servers;
pub mod udp;

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

pub use client::{http_get, http_request, HttpResponse};
pub use dialogue::DialogueServer;
pub use message::{MessageClient, MessageSwitch, SwitchOptions, WireFraming};
pub use origin::{Origin, Reply, Seen};
pub use process::Fulcrum;
pub use servers::{AgentServer, Blackhole, HttpBackend, RawBackend, RawBehaviour, TcpIdServer};
pub use udp::{RadiusServer, UdpEchoServer};

/// A port on 127.0.0.1 that was free a moment ago (the usual race: another process may take it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A free address on a loopback address `127.0.0.ip`.
pub fn free_addr_on(ip: [u8; 4]) -> SocketAddr {
    let l = TcpListener::bind(SocketAddr::from((ip, 0)));
    l.and_then(|l| l.local_addr())
        .unwrap_or_else(|_| SocketAddr::from((ip, free_port())))
}

pub fn free_addr() -> SocketAddr {
    free_addr_on([127, 0, 0, 1])
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

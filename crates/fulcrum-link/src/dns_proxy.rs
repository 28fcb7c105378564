//! Transparent DNS proxy of an outbound: LAN queries to any resolver are redirected (nftables
//! DNAT) to Fulcrum at `dns_proxy`, and each is sent out through a link to *that link's*
//! `resolver`, so the answers (CDN addresses above all) match the line the client's traffic will
//! leave by. The query and answer bytes are relayed as they are; only the answer's ID is checked
//! against the query's, so nothing here parses DNS.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::Pool;
use tokio::net::UdpSocket;

use crate::plan::LinkPlan;

/// Largest query or answer relayed (EDNS0 payloads are at most this in practice).
const MAX_MESSAGE: usize = 4096;
/// How long the link's resolver has to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);
/// Queries in flight at once; more are dropped (the client retries).
const MAX_IN_FLIGHT: usize = 1024;

/// Binds the proxy's socket (an error names the address).
/// SO_REUSEPORT lets a reload bind the new socket before the old one closes.
pub fn bind(addr: SocketAddr) -> Result<std::net::UdpSocket, String> {
    let open = || -> std::io::Result<std::net::UdpSocket> {
        let s = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::DGRAM,
            None,
        )?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        Ok(s.into())
    };
    open().map_err(|e| format!("dns_proxy {addr}: {e}"))
}

/// Serves queries until aborted. Each query goes to a link the pool's own scheduler picks
/// (its algorithm and weights, links that are up), or, if that link has no resolver, to the
/// next link that is up and has one.
pub async fn serve(socket: std::net::UdpSocket, links: Vec<LinkPlan>, pool: Arc<Pool>) {
    let Ok(socket) = UdpSocket::from_std(socket) else {
        return;
    };
    let socket = Arc::new(socket);
    let next = AtomicUsize::new(0);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let Ok((n, client)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        // A DNS message has a 12-byte header; anything shorter is not worth a packet out.
        if n < 12 || in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            continue;
        }
        let picked = pool
            .pick(&fulcrum_balance::PickContext::default(), &[])
            .and_then(|p| links.get(p.index))
            .filter(|l| l.config.resolver.is_some());
        let link = match picked {
            Some(l) => l.clone(),
            None => {
                let usable: Vec<&LinkPlan> = links
                    .iter()
                    .zip(pool.members())
                    .filter(|(l, m)| l.config.resolver.is_some() && m.accepts_new(0))
                    .map(|(l, _)| l)
                    .collect();
                if usable.is_empty() {
                    continue;
                }
                usable[next.fetch_add(1, Ordering::Relaxed) % usable.len()].clone()
            }
        };
        let query = buf[..n].to_vec();
        let socket = socket.clone();
        let in_flight = in_flight.clone();
        in_flight.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            if let Some(answer) = ask(&link, &query).await {
                let _ = socket.send_to(&answer, client).await;
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Sends `query` to the link's resolver out of the link (bound to its interface, source and
/// mark) and returns the answer with the same ID.
async fn ask(link: &LinkPlan, query: &[u8]) -> Option<Vec<u8>> {
    let resolver = link.config.resolver?;
    let s = socket2::Socket::new(
        socket2::Domain::for_address(resolver),
        socket2::Type::DGRAM,
        None,
    )
    .ok()?;
    s.set_nonblocking(true).ok()?;
    s.bind_device(Some(link.interface.as_bytes())).ok()?;
    s.set_mark(link.mark).ok()?;
    let source = SocketAddr::new(
        link.snat
            .map(std::net::IpAddr::V4)
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()),
        0,
    );
    s.bind(&source.into()).ok()?;
    let socket = UdpSocket::from_std(s.into()).ok()?;
    socket.connect(resolver).await.ok()?;
    socket.send(query).await.ok()?;
    let mut buf = vec![0u8; MAX_MESSAGE];
    let wait = async {
        loop {
            let n = socket.recv(&mut buf).await.ok()?;
            if n >= 12 && buf[..2] == query[..2] {
                return Some(buf[..n].to_vec());
            }
        }
    };
    tokio::time::timeout(ANSWER_TIMEOUT, wait).await.ok()?
}

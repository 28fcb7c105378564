//! Transparent DNS proxy of an outbound: LAN queries to any resolver are redirected (nftables
//! DNAT) to Fulcrum at `dns_proxy`, and each is sent out through a link to *that link's*
//! `resolver`, so the answers (CDN addresses above all) match the line the client's traffic will
//! leave by. The query and answer bytes are relayed as they are; only the answer's ID is checked
//! against the query's, so nothing here parses DNS. Over UDP and over TCP (RFC 7766: a client
//! sent to TCP by a truncated answer, or one that always uses it): a TCP query is relayed over
//! TCP to the chosen link's resolver, each on a connection of its own.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::Pool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::plan::LinkPlan;

/// Largest query or answer relayed (EDNS0 payloads are at most this in practice).
const MAX_MESSAGE: usize = 4096;
/// How long the link's resolver has to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);
/// Queries in flight at once; more are dropped (the client retries).
const MAX_IN_FLIGHT: usize = 1024;
/// TCP clients at once; more are closed at accept.
const MAX_TCP_CLIENTS: usize = 512;
/// A TCP client that sends nothing for this long is closed (RFC 7766 §6.2.3 suggests seconds).
const TCP_IDLE: Duration = Duration::from_secs(10);

/// The proxy's sockets: UDP and TCP on the same address.
pub struct Sockets {
    udp: std::net::UdpSocket,
    tcp: std::net::TcpListener,
}

/// Binds the proxy's UDP socket and TCP listener (an error names the address).
/// SO_REUSEPORT lets a reload bind the new sockets before the old ones close.
pub fn bind(addr: SocketAddr) -> Result<Sockets, String> {
    let open = |kind: socket2::Type| -> std::io::Result<socket2::Socket> {
        let s = socket2::Socket::new(socket2::Domain::for_address(addr), kind, None)?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        Ok(s)
    };
    let udp = open(socket2::Type::DGRAM).map_err(|e| format!("dns_proxy {addr} (udp): {e}"))?;
    let tcp = open(socket2::Type::STREAM)
        .and_then(|s| s.listen(1024).map(|()| s))
        .map_err(|e| format!("dns_proxy {addr} (tcp): {e}"))?;
    Ok(Sockets {
        udp: udp.into(),
        tcp: tcp.into(),
    })
}

/// The link a query goes out by: the one the pool's own scheduler picks (its algorithm and
/// weights, links that are up), or, if that link has no resolver, the next link that is up and
/// has one.
fn pick(links: &[LinkPlan], pool: &Pool, next: &AtomicUsize) -> Option<LinkPlan> {
    let picked = pool
        .pick(&fulcrum_balance::PickContext::default(), &[])
        .and_then(|p| links.get(p.index))
        .filter(|l| l.config.resolver.is_some());
    if let Some(l) = picked {
        return Some(l.clone());
    }
    let usable: Vec<&LinkPlan> = links
        .iter()
        .zip(pool.members())
        .filter(|(l, m)| l.config.resolver.is_some() && m.accepts_new(0))
        .map(|(l, _)| l)
        .collect();
    if usable.is_empty() {
        return None;
    }
    Some(usable[next.fetch_add(1, Ordering::Relaxed) % usable.len()].clone())
}

/// Serves queries over UDP and TCP until aborted (the TCP clients' tasks end with it).
pub async fn serve(sockets: Sockets, links: Vec<LinkPlan>, pool: Arc<Pool>) {
    let links = Arc::new(links);
    let next = Arc::new(AtomicUsize::new(0));
    tokio::join!(
        serve_udp(sockets.udp, links.clone(), pool.clone(), next.clone()),
        serve_tcp(sockets.tcp, links, pool, next),
    );
}

async fn serve_udp(
    socket: std::net::UdpSocket,
    links: Arc<Vec<LinkPlan>>,
    pool: Arc<Pool>,
    next: Arc<AtomicUsize>,
) {
    let Ok(socket) = UdpSocket::from_std(socket) else {
        return;
    };
    let socket = Arc::new(socket);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        while tasks.try_join_next().is_some() {}
        let Ok((n, client)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        // A DNS message has a 12-byte header; anything shorter is not worth a packet out.
        if n < 12 || in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            continue;
        }
        let Some(link) = pick(&links, &pool, &next) else {
            continue;
        };
        let query = buf[..n].to_vec();
        let socket = socket.clone();
        let in_flight = in_flight.clone();
        in_flight.fetch_add(1, Ordering::Relaxed);
        tasks.spawn(async move {
            if let Some(answer) = ask(&link, &query).await {
                let _ = socket.send_to(&answer, client).await;
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

async fn serve_tcp(
    listener: std::net::TcpListener,
    links: Arc<Vec<LinkPlan>>,
    pool: Arc<Pool>,
    next: Arc<AtomicUsize>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let mut clients = tokio::task::JoinSet::new();
    loop {
        while clients.try_join_next().is_some() {}
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        if clients.len() >= MAX_TCP_CLIENTS {
            continue;
        }
        let (links, pool, next) = (links.clone(), pool.clone(), next.clone());
        clients.spawn(async move { tcp_client(stream, &links, &pool, &next).await });
    }
}

/// Reads two-byte-length-prefixed queries (RFC 1035 §4.2.2) one after the other and writes each
/// answer back, until the client closes, idles past TCP_IDLE or sends something that is not a
/// query.
async fn tcp_client(mut stream: TcpStream, links: &[LinkPlan], pool: &Pool, next: &AtomicUsize) {
    loop {
        let Some(query) = tokio::time::timeout(TCP_IDLE, read_framed(&mut stream))
            .await
            .ok()
            .flatten()
        else {
            return;
        };
        let Some(link) = pick(links, pool, next) else {
            return;
        };
        let Some(answer) = ask_tcp(&link, &query).await else {
            return;
        };
        if write_framed(&mut stream, &answer).await.is_err() {
            return;
        }
    }
}

/// One length-prefixed DNS message (at least a header), or None at the end or on garbage.
async fn read_framed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let len = usize::from(stream.read_u16().await.ok()?);
    if len < 12 {
        return None;
    }
    let mut msg = vec![0u8; len];
    stream.read_exact(&mut msg).await.ok()?;
    Some(msg)
}

async fn write_framed(stream: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| std::io::ErrorKind::InvalidData)?;
    let mut out = Vec::with_capacity(msg.len() + 2);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(msg);
    stream.write_all(&out).await
}

/// A socket out of the link: bound to its interface and source (its SNAT address, or any),
/// with its mark, so policy routing sends it through that link.
fn link_socket(link: &LinkPlan, kind: socket2::Type) -> Option<socket2::Socket> {
    let resolver = link.config.resolver?;
    let s = socket2::Socket::new(socket2::Domain::for_address(resolver), kind, None).ok()?;
    s.set_nonblocking(true).ok()?;
    s.bind_device(Some(link.interface.as_bytes())).ok()?;
    s.set_mark(link.mark).ok()?;
    // The query leaves in the resolver's family, from the link's source of that family.
    let source = match resolver {
        SocketAddr::V4(_) => link.snat.map_or(Ipv4Addr::UNSPECIFIED.into(), IpAddr::V4),
        SocketAddr::V6(_) => link
            .nat6
            .address()
            .map_or(Ipv6Addr::UNSPECIFIED.into(), IpAddr::V6),
    };
    let source = SocketAddr::new(source, 0);
    s.bind(&source.into()).ok()?;
    Some(s)
}

/// Sends `query` over TCP to the link's resolver out of the link and returns the answer with
/// the same ID.
async fn ask_tcp(link: &LinkPlan, query: &[u8]) -> Option<Vec<u8>> {
    let resolver = link.config.resolver?;
    let s = link_socket(link, socket2::Type::STREAM)?;
    let exchange = async {
        let mut stream = tokio::net::TcpSocket::from_std_stream(s.into())
            .connect(resolver)
            .await
            .ok()?;
        write_framed(&mut stream, query).await.ok()?;
        let answer = read_framed(&mut stream).await?;
        (answer[..2] == query[..2]).then_some(answer)
    };
    tokio::time::timeout(ANSWER_TIMEOUT, exchange).await.ok()?
}

/// Sends `query` to the link's resolver out of the link (bound to its interface, source and
/// mark) and returns the answer with the same ID.
async fn ask(link: &LinkPlan, query: &[u8]) -> Option<Vec<u8>> {
    let resolver = link.config.resolver?;
    let s = link_socket(link, socket2::Type::DGRAM)?;
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

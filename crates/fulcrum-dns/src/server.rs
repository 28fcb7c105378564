//! The DNS listeners: UDP and TCP on every `[dns] listen` address, kept across reloads.
//!
//! UDP runs on dedicated threads, one per `SO_REUSEPORT` socket, each blocking in
//! `recvmmsg(2)` and answering the whole batch with one `sendmmsg(2)`: two system calls for up
//! to `BATCH` queries, where a tokio socket would spend two per query plus the wake-ups. The
//! threads read the current `Engine` through an `ArcSwap`, so a reload swaps what they answer
//! with and never stops them. TCP (large answers, truncated retries) runs on the tokio runtime.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use fulcrum_net::datagram::{send_each, RecvBatch, BATCH};
use fulcrum_net::listener::{bind_datagram, bind_new, bind_stream, BindError};
use parking_lot::Mutex;
use socket2::SockAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::engine::{Action, Counters, Engine, Transport};

/// Largest query read; longer datagrams are dropped (a query is a few dozen bytes).
const MAX_QUERY: usize = 4096;
/// Concurrent DNS-over-TCP connections; more are closed at once.
const MAX_TCP: usize = 1024;
/// Concurrent DNS-over-TCP connections from one source address, so one client cannot take
/// every slot (RFC 7766 §6.2.2 asks servers to limit them; resolvers reuse a few).
const MAX_TCP_PER_SOURCE: u32 = 16;

/// Counters of every worker, summed for metrics.
#[derive(Default)]
pub struct Registry {
    list: Mutex<Vec<Arc<Counters>>>,
    pub tcp_connections: AtomicUsize,
    /// Connections closed at accept: over `MAX_TCP`, or over `MAX_TCP_PER_SOURCE` for their
    /// source.
    pub tcp_refused: AtomicU64,
    tcp_per_source: Mutex<std::collections::HashMap<IpAddr, u32>>,
}

/// One open DNS-over-TCP connection, counted for its source until dropped.
struct SourceSlot {
    registry: Arc<Registry>,
    source: IpAddr,
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut m = self.registry.tcp_per_source.lock();
        if let Some(n) = m.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.source);
            }
        }
    }
}

impl Registry {
    /// A slot for one more connection from `source`, unless it has its share already.
    fn source_slot(self: &Arc<Self>, source: IpAddr) -> Option<SourceSlot> {
        let source = source.to_canonical();
        let mut m = self.tcp_per_source.lock();
        let n = m.entry(source).or_insert(0);
        if *n >= MAX_TCP_PER_SOURCE {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            registry: self.clone(),
            source,
        })
    }
}

impl Registry {
    fn add(&self) -> Arc<Counters> {
        let c = Arc::new(Counters::default());
        self.list.lock().push(c.clone());
        c
    }

    /// Sums a field over every worker.
    pub fn sum(&self, f: impl Fn(&Counters) -> u64) -> u64 {
        self.list.lock().iter().map(|c| f(c)).sum()
    }
}

/// A UDP worker thread as its listener holds it. The socket is shared with the thread: the
/// descriptor is closed when the last of the two lets go, so the shutdown below always reaches
/// this socket. (It used to keep the raw descriptor number while the thread owned the socket:
/// a thread that saw `stop` and closed its socket between the store and the shutdown left the
/// number free for the next socket or file the process opened — and the shutdown hit that.)
struct UdpWorker {
    stop: Arc<AtomicBool>,
    sock: Arc<std::net::UdpSocket>,
}

impl Drop for UdpWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the thread blocked in recvmmsg, so it sees `stop` now rather than at its read
        // timeout. An error (the socket was never connected) changes nothing.
        let _ = socket2::SockRef::from(&*self.sock).shutdown(std::net::Shutdown::Both);
    }
}

struct Listener {
    _udp: Vec<UdpWorker>,
    tcp: Vec<JoinHandle<()>>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        for t in &self.tcp {
            t.abort();
        }
    }
}

/// Sockets bound for new addresses, not yet serving.
pub struct Prepared {
    sockets: HashMap<SocketAddr, (Vec<std::net::UdpSocket>, Vec<std::net::TcpListener>)>,
}

/// Every DNS listener of the process.
pub struct DnsServer {
    engine: Arc<ArcSwap<Engine>>,
    listeners: HashMap<SocketAddr, Listener>,
    pub registry: Arc<Registry>,
    tcp_counters: Arc<Counters>,
    tcp_idle_ms: Arc<AtomicU64>,
    handle: Handle,
}

/// A UDP socket as the other data planes bind it, but blocking with a read timeout: the UDP
/// threads block in `recvmmsg` and wake up now and then to see whether they should stop.
fn bind_udp(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let s = bind_datagram(addr)?;
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    Ok(s)
}

impl DnsServer {
    /// A server with no listeners answering with `engine`; must be called in a tokio runtime.
    pub fn new(engine: Engine) -> DnsServer {
        let registry = Arc::new(Registry::default());
        let tcp_counters = registry.add();
        DnsServer {
            engine: Arc::new(ArcSwap::from_pointee(engine)),
            listeners: HashMap::new(),
            registry,
            tcp_counters,
            tcp_idle_ms: Arc::new(AtomicU64::new(10_000)),
            handle: Handle::current(),
        }
    }

    pub fn engine(&self) -> Arc<Engine> {
        self.engine.load_full()
    }

    /// Binds UDP and TCP sockets for the addresses in `wanted` that are not served yet. Nothing
    /// changes if any bind fails; every failure is returned.
    pub fn prepare(
        &self,
        wanted: &[SocketAddr],
        per_address: usize,
    ) -> Result<Prepared, Vec<String>> {
        let listening = |a: &SocketAddr| self.listeners.contains_key(a);
        fn named(proto: &'static str) -> impl Fn(Vec<BindError>) -> Vec<String> {
            move |errs| errs.iter().map(|e| format!("{e} (dns, {proto})")).collect()
        }
        let n = per_address.max(1);
        let udp = bind_new(wanted, listening, n, |a| bind_udp(*a)).map_err(named("udp"));
        // TCP carries only truncated retries and large answers: two sockets are plenty.
        let tcp = bind_new(wanted, listening, n.min(2), |a| bind_stream(*a)).map_err(named("tcp"));
        match (udp, tcp) {
            (Ok(mut udp), Ok(mut tcp)) => Ok(Prepared {
                sockets: wanted
                    .iter()
                    .filter_map(|a| Some((*a, (udp.remove(a)?, tcp.remove(a)?))))
                    .collect(),
            }),
            (udp, tcp) => Err(udp.err().into_iter().chain(tcp.err()).flatten().collect()),
        }
    }

    /// Installs `engine`, starts the prepared sockets and closes listeners not in `wanted`.
    pub fn commit(
        &mut self,
        prepared: Prepared,
        wanted: &[SocketAddr],
        engine: Engine,
        tcp_idle: Duration,
    ) {
        self.engine.store(Arc::new(engine));
        self.tcp_idle_ms
            .store(tcp_idle.as_millis() as u64, Ordering::Relaxed);
        self.listeners.retain(|a, _| wanted.contains(a));
        for (addr, (udp, tcp)) in prepared.sockets {
            let mut workers = Vec::new();
            for (i, sock) in udp.into_iter().enumerate() {
                let stop = Arc::new(AtomicBool::new(false));
                let sock = Arc::new(sock);
                let theirs = sock.clone();
                let engine = self.engine.clone();
                let counters = self.registry.add();
                let st = stop.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("fulcrum-dns-{i}"))
                    .spawn(move || udp_loop(&theirs, engine, counters, st));
                match spawned {
                    Ok(_) => workers.push(UdpWorker { stop, sock }),
                    Err(e) => {
                        tracing::error!(%addr, error = %e, "cannot start a DNS worker thread")
                    }
                }
            }
            let mut tasks = Vec::new();
            for l in tcp {
                let _guard = self.handle.enter();
                match tokio::net::TcpListener::from_std(l) {
                    Ok(l) => tasks.push(self.handle.spawn(tcp_accept(
                        l,
                        self.engine.clone(),
                        self.tcp_counters.clone(),
                        self.registry.clone(),
                        self.tcp_idle_ms.clone(),
                    ))),
                    Err(e) => tracing::error!(%addr, error = %e, "cannot serve DNS over TCP"),
                }
            }
            tracing::info!(%addr, udp_sockets = workers.len(), "dns listening (udp and tcp)");
            self.listeners.insert(
                addr,
                Listener {
                    _udp: workers,
                    tcp: tasks,
                },
            );
        }
    }

    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.listeners.keys().copied().collect()
    }

    /// Stops every listener (shutdown).
    pub fn close_all(&mut self) {
        self.listeners.clear();
    }
}

fn udp_loop(
    sock: &std::net::UdpSocket,
    engine: Arc<ArcSwap<Engine>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let fd = sock.as_raw_fd();
    let mut batch = RecvBatch::with_slot(MAX_QUERY);
    let mut outbufs: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(4096)).collect();
    let mut dest: Vec<SockAddr> = Vec::with_capacity(BATCH);
    let unspecified = SockAddr::from(SocketAddr::from(([0u8; 4], 0)));
    while !stop.load(Ordering::Acquire) {
        let n = match batch.recv_wait(fd) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR | libc::ETIMEDOUT) => continue,
                _ if stop.load(Ordering::Acquire) => continue,
                _ => {
                    tracing::warn!(error = %e, "recvmmsg failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        let eng = engine.load();
        dest.clear();
        for i in 0..n {
            if batch.truncated(i) {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Some((packet, peer)) = batch.get(i) else {
                continue;
            };
            let buf = &mut outbufs[dest.len()];
            if eng.answer(packet, peer.ip(), Transport::Udp, buf, &counters) == Action::Send {
                dest.push(batch.reply_address(i));
            }
        }
        // On the stack: no allocation per batch.
        let mut items: [(&[u8], &SockAddr); BATCH] = [(&[], &unspecified); BATCH];
        for (item, (b, to)) in items.iter_mut().zip(outbufs.iter().zip(&dest)) {
            *item = (&b[..], to);
        }
        let refused = send_each(fd, &items[..dest.len()]);
        counters
            .dropped
            .fetch_add(refused as u64, Ordering::Relaxed);
    }
}

async fn tcp_accept(
    l: tokio::net::TcpListener,
    engine: Arc<ArcSwap<Engine>>,
    counters: Arc<Counters>,
    registry: Arc<Registry>,
    idle_ms: Arc<AtomicU64>,
) {
    loop {
        let (s, peer) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "dns tcp accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = registry.source_slot(peer.ip()) else {
            registry.tcp_refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if registry.tcp_connections.fetch_add(1, Ordering::AcqRel) >= MAX_TCP {
            registry.tcp_connections.fetch_sub(1, Ordering::AcqRel);
            registry.tcp_refused.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let (engine, counters, registry) = (engine.clone(), counters.clone(), registry.clone());
        let idle = Duration::from_millis(idle_ms.load(Ordering::Relaxed).max(1));
        tokio::spawn(async move {
            let _ = tcp_conn(s, peer.ip(), &engine, &counters, idle).await;
            registry.tcp_connections.fetch_sub(1, Ordering::AcqRel);
            drop(slot);
        });
    }
}

async fn tcp_conn(
    mut s: tokio::net::TcpStream,
    peer: IpAddr,
    engine: &ArcSwap<Engine>,
    counters: &Counters,
    idle: Duration,
) -> io::Result<()> {
    let _ = s.set_nodelay(true);
    // Sized by the queries that actually come (a few dozen bytes), not 64 KiB per connection.
    let mut query = Vec::new();
    let mut out = Vec::with_capacity(4096);
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(idle, s.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        let n = u16::from_be_bytes(len) as usize;
        query.resize(n, 0);
        match tokio::time::timeout(idle, s.read_exact(&mut query[..n])).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        let eng = engine.load();
        if eng.answer(&query[..n], peer, Transport::Tcp, &mut out, counters) == Action::Drop {
            // Nothing worth answering on this stream: close it.
            return Ok(());
        }
        let mut framed = Vec::with_capacity(out.len() + 2);
        framed.extend_from_slice(&(out.len().min(65535) as u16).to_be_bytes());
        framed.extend_from_slice(&out[..out.len().min(65535)]);
        tokio::time::timeout(idle, s.write_all(&framed))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    }
}

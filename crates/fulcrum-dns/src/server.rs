//! The DNS listeners: UDP and TCP on every `[dns] listen` address, kept across reloads.
//!
//! UDP runs on dedicated threads, one per `SO_REUSEPORT` socket, each blocking in
//! `recvmmsg(2)` and answering the whole batch with one `sendmmsg(2)`: two system calls for up
//! to `BATCH` queries, where a tokio socket would spend two per query plus the wake-ups. The
//! threads read the current `Engine` through an `ArcSwap`, so a reload swaps what they answer
//! with and never stops them. TCP (large answers, truncated retries) runs on the tokio runtime.

use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use fulcrum_proxy::listener::{bind_datagram, bind_new, bind_stream, BindError};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::engine::{Action, Counters, Engine, Transport};

/// Datagrams per recvmmsg / sendmmsg call.
const BATCH: usize = 32;
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

struct UdpWorker {
    stop: Arc<AtomicBool>,
    fd: RawFd,
}

impl Drop for UdpWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // SAFETY: shutdown(2) on a descriptor the worker thread still owns (it closes it only
        // after seeing `stop`): at worst EBADF/ENOTCONN, no memory is touched. It wakes the
        // thread blocked in recvmmsg so it sees `stop` now rather than at its read timeout.
        unsafe {
            libc::shutdown(self.fd, libc::SHUT_RDWR);
        }
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
        let udp = bind_new(wanted, listening, n, bind_udp).map_err(named("udp"));
        // TCP carries only truncated retries and large answers: two sockets are plenty.
        let tcp = bind_new(wanted, listening, n.min(2), bind_stream).map_err(named("tcp"));
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
                let fd = sock.as_raw_fd();
                let engine = self.engine.clone();
                let counters = self.registry.add();
                let st = stop.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("fulcrum-dns-{i}"))
                    .spawn(move || udp_loop(sock, engine, counters, st));
                match spawned {
                    Ok(_) => workers.push(UdpWorker { stop, fd }),
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

fn sockaddr_to_ip(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in for AF_INET; sockaddr_storage is larger and
            // suitably aligned for every sockaddr type.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for AF_INET6 and sockaddr_in6.
            let a = unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn udp_loop(
    sock: std::net::UdpSocket,
    engine: Arc<ArcSwap<Engine>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    let fd = sock.as_raw_fd();
    let mut inbuf = vec![0u8; BATCH * MAX_QUERY];
    let mut outbufs: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(4096)).collect();
    // SAFETY: all-zero is a valid value for these plain C structs.
    let mut addrs: [libc::sockaddr_storage; BATCH] = unsafe { MaybeUninit::zeroed().assume_init() };
    let mut iov_in: [libc::iovec; BATCH] = unsafe { MaybeUninit::zeroed().assume_init() };
    let mut msgs_in: [libc::mmsghdr; BATCH] = unsafe { MaybeUninit::zeroed().assume_init() };
    let mut iov_out: [libc::iovec; BATCH] = unsafe { MaybeUninit::zeroed().assume_init() };
    let mut msgs_out: [libc::mmsghdr; BATCH] = unsafe { MaybeUninit::zeroed().assume_init() };
    let mut dest: [usize; BATCH] = [0; BATCH];
    while !stop.load(Ordering::Acquire) {
        for i in 0..BATCH {
            iov_in[i] = libc::iovec {
                iov_base: inbuf[i * MAX_QUERY..].as_mut_ptr().cast(),
                iov_len: MAX_QUERY,
            };
            let h = &mut msgs_in[i].msg_hdr;
            h.msg_name = (&mut addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut iov_in[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
            msgs_in[i].msg_len = 0;
        }
        // SAFETY: `msgs_in` holds BATCH headers whose name and iovec pointers point into
        // `addrs`, `iov_in` and `inbuf`, all alive and unmoved for the call; the kernel writes at
        // most msg_namelen / iov_len bytes into each.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                msgs_in.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n <= 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR | libc::ETIMEDOUT) => continue,
                _ if n == 0 || stop.load(Ordering::Acquire) => continue,
                _ => {
                    tracing::warn!(error = %e, "recvmmsg failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
        }
        let eng = engine.load();
        let mut out = 0;
        for i in 0..n as usize {
            let len = msgs_in[i].msg_len as usize;
            if msgs_in[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let Some(peer) = sockaddr_to_ip(&addrs[i]) else {
                continue;
            };
            let packet = &inbuf[i * MAX_QUERY..i * MAX_QUERY + len];
            let buf = &mut outbufs[out];
            if eng.answer(packet, peer.ip(), Transport::Udp, buf, &counters) == Action::Send {
                dest[out] = i;
                out += 1;
            }
        }
        for j in 0..out {
            iov_out[j] = libc::iovec {
                iov_base: outbufs[j].as_mut_ptr().cast(),
                iov_len: outbufs[j].len(),
            };
            let h = &mut msgs_out[j].msg_hdr;
            h.msg_name = (&mut addrs[dest[j]] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = msgs_in[dest[j]].msg_hdr.msg_namelen;
            h.msg_iov = &mut iov_out[j];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
        }
        let mut sent = 0;
        while sent < out {
            // SAFETY: headers `sent..out` point into `addrs`, `iov_out` and `outbufs`, alive and
            // unchanged for the call; the kernel only reads them.
            let r = unsafe {
                libc::sendmmsg(
                    fd,
                    msgs_out[sent..].as_mut_ptr(),
                    (out - sent) as libc::c_uint,
                    0,
                )
            };
            if r <= 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                // One bad destination (e.g. unreachable): skip it, send the rest.
                tracing::debug!(error = %e, "sendmmsg failed");
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                sent += 1;
            } else {
                sent += r as usize;
            }
        }
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

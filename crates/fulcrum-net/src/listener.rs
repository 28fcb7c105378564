//! Listening sockets that outlive reloads.
//!
//! A reload must not close a listening socket whose address stays (clients would see refused
//! connections in the gap), so each socket is owned here, keyed by address, and its accept loops
//! hand connections to whatever handler the current configuration installed. Handlers are swapped
//! atomically; connections already accepted keep the handler they started with.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A data plane's entry point for accepted connections.
pub trait StreamHandler: Send + Sync + 'static {
    /// Takes over an accepted connection; must not block (spawn the work). `local` is the
    /// address the client connected to.
    fn handle(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, local: SocketAddr);
}

/// The handler installed on a listener, swapped on reload.
pub type HandlerSlot = ArcSwap<Arc<dyn StreamHandler>>;

/// Where a virtual service listens: an address in the main routing domain or inside a VRF.
/// The same address and port in two VRFs are two listeners.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListenAddr {
    pub addr: SocketAddr,
    /// The VRF device the sockets are bound to (SO_BINDTODEVICE on the l3mdev, as `ip vrf exec`
    /// does); `None`: the main routing domain.
    pub vrf: Option<Arc<str>>,
}

impl ListenAddr {
    pub fn new(addr: SocketAddr, vrf: Option<&str>) -> ListenAddr {
        ListenAddr {
            addr,
            vrf: vrf.map(Arc::from),
        }
    }
}

impl From<SocketAddr> for ListenAddr {
    fn from(addr: SocketAddr) -> ListenAddr {
        ListenAddr { addr, vrf: None }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.vrf {
            Some(vrf) => write!(f, "{} in vrf {vrf}", self.addr),
            None => write!(f, "{}", self.addr),
        }
    }
}

/// Binds the socket to `at`'s VRF device, if it has one, before it binds its address.
fn enter_vrf(socket: &Socket, at: &ListenAddr) -> io::Result<()> {
    match &at.vrf {
        Some(vrf) => socket.bind_device(Some(vrf.as_bytes())),
        None => Ok(()),
    }
}

/// How many sockets (SO_REUSEPORT) each address gets: the kernel spreads new connections over
/// them, so several accept loops run in parallel without sharing one accept queue.
pub fn default_sockets_per_address(workers: usize) -> usize {
    workers.clamp(1, 8)
}

/// Binds a TCP listening socket the way a load balancer wants it: SO_REUSEADDR and SO_REUSEPORT
/// (restarts and parallel accept loops), IPv6 sockets IPv6-only (so `[::]:80` and `0.0.0.0:80`
/// can both be configured), non-blocking, a deep backlog, and TCP_NODELAY, which accepted
/// connections inherit (a proxy forwards what it has at once; `tcp.nodelay = false` undoes it).
pub fn bind_stream(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    bind_stream_at(&addr.into())
}

/// `bind_stream` inside `at`'s VRF.
pub fn bind_stream_at(at: &ListenAddr) -> io::Result<std::net::TcpListener> {
    let addr = at.addr;
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    enter_vrf(&socket, at)?;
    socket.set_reuse_address(true)?;
    socket.set_tcp_nodelay(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Binds `per_address` sockets with `bind` for every address of `wanted` not yet `listening`:
/// the first step of a reload, before anything running changes. On any failure every error is
/// returned, and the sockets bound so far are closed again when the map is dropped.
pub fn bind_new<K: Clone + Eq + Hash + fmt::Display, T>(
    wanted: &[K],
    listening: impl Fn(&K) -> bool,
    per_address: usize,
    bind: impl Fn(&K) -> io::Result<T>,
) -> Result<HashMap<K, Vec<T>>, Vec<BindError>> {
    let mut sockets = HashMap::new();
    let mut errors = Vec::new();
    for at in wanted {
        if listening(at) || sockets.contains_key(at) {
            continue;
        }
        match (0..per_address.max(1))
            .map(|_| bind(at))
            .collect::<io::Result<Vec<T>>>()
        {
            Ok(s) => {
                sockets.insert(at.clone(), s);
            }
            Err(error) => errors.push(BindError {
                at: at.to_string(),
                error,
            }),
        }
    }
    if errors.is_empty() {
        Ok(sockets)
    } else {
        Err(errors)
    }
}

/// One listening address: its sockets, their accept loops and the current handler.
pub struct Listener {
    pub at: ListenAddr,
    slot: Arc<HandlerSlot>,
    tasks: Vec<JoinHandle<()>>,
    /// The sockets, shared with their accept loops (for TCP tuning on reload).
    sockets: Vec<Arc<TcpListener>>,
    /// The `tcp` tuning last applied to them.
    tuned: Option<fulcrum_config::TcpTuning>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Dropping the accept loops closes the sockets; accepted connections run on.
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Listener {
    /// Binds `sockets` sockets on `addr` and starts accepting into `handler`.
    pub fn bind(
        at: ListenAddr,
        sockets: usize,
        handler: Arc<dyn StreamHandler>,
    ) -> io::Result<Listener> {
        let bound: Vec<std::net::TcpListener> = (0..sockets.max(1))
            .map(|_| bind_stream_at(&at))
            .collect::<io::Result<_>>()?;
        Self::from_sockets(at, bound, handler)
    }

    fn from_sockets(
        at: ListenAddr,
        bound: Vec<std::net::TcpListener>,
        handler: Arc<dyn StreamHandler>,
    ) -> io::Result<Listener> {
        let slot = Arc::new(ArcSwap::from_pointee(handler));
        let mut tasks = Vec::with_capacity(bound.len());
        let mut sockets = Vec::with_capacity(bound.len());
        for std_listener in bound {
            let listener = Arc::new(TcpListener::from_std(std_listener)?);
            sockets.push(listener.clone());
            tasks.push(tokio::spawn(accept_loop(listener, slot.clone())));
        }
        Ok(Listener {
            at,
            slot,
            tasks,
            sockets,
            tuned: None,
        })
    }

    pub fn set_handler(&self, handler: Arc<dyn StreamHandler>) {
        self.slot.store(Arc::new(handler));
    }
}

async fn accept_loop(listener: Arc<TcpListener>, slot: Arc<HandlerSlot>) {
    // A listener bound to one address knows every connection's local address; asking the
    // kernel (getsockname) is only needed behind a wildcard, and would be a tenth of the
    // system calls of a one-request connection.
    let bound = listener
        .local_addr()
        .ok()
        .filter(|a| !a.ip().is_unspecified());
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let local = match bound {
                    Some(addr) => addr,
                    None => stream.local_addr().unwrap_or(peer),
                };
                let handler: Arc<dyn StreamHandler> = Arc::clone(&slot.load());
                handler.handle(stream, peer, local);
            }
            Err(e) => {
                // Out of file descriptors or memory: back off instead of spinning on the error;
                // the kernel keeps the connection queued meanwhile.
                let transient = matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                );
                if transient {
                    tracing::error!(error = %e, "accept failed; pausing accepts for 100ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                } else {
                    // ECONNABORTED and friends concern one connection only.
                    tracing::debug!(error = %e, "accept failed");
                }
            }
        }
    }
}

/// Every stream listener of the process, by address.
#[derive(Default)]
pub struct Listeners {
    by_addr: HashMap<ListenAddr, Listener>,
}

/// An address that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {at}: {error}")]
pub struct BindError {
    /// The address (and VRF) as the operator wrote it.
    pub at: String,
    #[source]
    pub error: io::Error,
}

/// Sockets bound for addresses a new configuration adds, not yet accepting.
pub struct Prepared {
    sockets: HashMap<ListenAddr, Vec<std::net::TcpListener>>,
}

impl Listeners {
    /// Binds the addresses of `wanted` that are not listening yet. Nothing running changes: if
    /// any address fails, every failure is returned and the new sockets are closed again.
    pub fn prepare(
        &self,
        wanted: &[ListenAddr],
        sockets_per_address: usize,
    ) -> Result<Prepared, Vec<BindError>> {
        bind_new(
            wanted,
            |a| self.by_addr.contains_key(a),
            sockets_per_address,
            bind_stream_at,
        )
        .map(|sockets| Prepared { sockets })
    }

    /// Makes the listening set exactly `wanted`: addresses that stay keep their sockets and get
    /// the new handler, prepared ones start accepting, the rest stop (their accepted connections
    /// run on).
    pub fn commit(
        &mut self,
        prepared: Prepared,
        wanted: Vec<(ListenAddr, Arc<dyn StreamHandler>)>,
    ) -> io::Result<()> {
        let keep: HashMap<ListenAddr, Arc<dyn StreamHandler>> = wanted.into_iter().collect();
        self.by_addr.retain(|addr, _| keep.contains_key(addr));
        for (addr, l) in &self.by_addr {
            if let Some(h) = keep.get(addr) {
                l.set_handler(h.clone());
            }
        }
        for (at, sockets) in prepared.sockets {
            if let Some(h) = keep.get(&at) {
                let listener = Listener::from_sockets(at.clone(), sockets, h.clone())?;
                self.by_addr.insert(at, listener);
            }
        }
        Ok(())
    }

    pub fn addresses(&self) -> Vec<ListenAddr> {
        self.by_addr.keys().cloned().collect()
    }

    /// Sets the client-side TCP options of `addr`'s sockets (`tcp` on its virtual service; the
    /// default when `None`), which connections accepted from now on inherit. Options applied
    /// before and now unset go back to the system's defaults.
    pub fn tune(
        &mut self,
        at: &ListenAddr,
        tuning: Option<&fulcrum_config::TcpTuning>,
    ) -> io::Result<()> {
        let Some(l) = self.by_addr.get_mut(at) else {
            return Ok(());
        };
        if tuning == l.tuned.as_ref() {
            return Ok(());
        }
        let want = tuning.cloned().unwrap_or_default();
        for s in &l.sockets {
            crate::tuning::apply(&socket2::SockRef::from(&**s), &want, l.tuned.as_ref())?;
        }
        l.tuned = tuning.cloned();
        Ok(())
    }

    /// Stops accepting everywhere (shutdown); accepted connections run on.
    pub fn close_all(&mut self) {
        self.by_addr.clear();
    }
}

/// A datagram data plane: runs the receive loop of one bound socket, reading the service the
/// current configuration installed from `current` for every batch. The loop owns whatever
/// per-client state it keeps (flows), so that state survives handler swaps on reload.
pub trait DatagramService: Send + Sync + Sized + 'static {
    fn run(
        socket: std::net::UdpSocket,
        current: Arc<ArcSwap<Self>>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static;
}

/// Binds a UDP socket for a virtual service: SO_REUSEADDR and SO_REUSEPORT (one socket per
/// worker; the kernel keeps each client on one of them by hashing its address), IPv6 sockets
/// IPv6-only, non-blocking, and receive/send buffers as large as the system allows so bursts
/// are not dropped while a worker is busy.
pub fn bind_datagram(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    bind_datagram_at(&addr.into())
}

/// `bind_datagram` inside `at`'s VRF.
pub fn bind_datagram_at(at: &ListenAddr) -> io::Result<std::net::UdpSocket> {
    let addr = at.addr;
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    enter_vrf(&socket, at)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    let _ = socket.set_recv_buffer_size(4 << 20);
    let _ = socket.set_send_buffer_size(4 << 20);
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// One datagram listening address: its sockets' receive loops and the current service.
struct DatagramListener<S> {
    slot: Arc<ArcSwap<S>>,
    tasks: Vec<JoinHandle<()>>,
}

impl<S> Drop for DatagramListener<S> {
    fn drop(&mut self) {
        // Ends the receive loops, which closes the sockets and drops their flows.
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Every datagram listener of one kind of service, by address, with the same prepare/commit
/// steps as `Listeners`: a reload binds new addresses before anything changes, kept sockets
/// (and the flows their loops hold) get the new service, removed ones close.
pub struct DatagramListeners<S> {
    by_addr: HashMap<ListenAddr, DatagramListener<S>>,
}

impl<S> Default for DatagramListeners<S> {
    fn default() -> Self {
        DatagramListeners {
            by_addr: HashMap::new(),
        }
    }
}

/// Datagram sockets bound for addresses a new configuration adds, not yet receiving.
pub struct PreparedDatagram {
    sockets: HashMap<ListenAddr, Vec<std::net::UdpSocket>>,
}

impl<S: DatagramService> DatagramListeners<S> {
    /// Binds the addresses of `wanted` that are not listening yet; on any failure, every error
    /// is returned and the new sockets are closed again.
    pub fn prepare(
        &self,
        wanted: &[ListenAddr],
        sockets_per_address: usize,
    ) -> Result<PreparedDatagram, Vec<BindError>> {
        bind_new(
            wanted,
            |a| self.by_addr.contains_key(a),
            sockets_per_address,
            bind_datagram_at,
        )
        .map(|sockets| PreparedDatagram { sockets })
    }

    /// Makes the listening set exactly `wanted`.
    pub fn commit(&mut self, prepared: PreparedDatagram, wanted: Vec<(ListenAddr, Arc<S>)>) {
        let keep: HashMap<ListenAddr, Arc<S>> = wanted.into_iter().collect();
        self.by_addr.retain(|addr, _| keep.contains_key(addr));
        for (addr, l) in &self.by_addr {
            if let Some(s) = keep.get(addr) {
                l.slot.store(s.clone());
            }
        }
        for (at, sockets) in prepared.sockets {
            if let Some(s) = keep.get(&at) {
                let slot = Arc::new(ArcSwap::new(s.clone()));
                let tasks = sockets
                    .into_iter()
                    .map(|sock| tokio::spawn(S::run(sock, slot.clone())))
                    .collect();
                self.by_addr.insert(at, DatagramListener { slot, tasks });
            }
        }
    }

    pub fn addresses(&self) -> Vec<ListenAddr> {
        self.by_addr.keys().cloned().collect()
    }

    /// Stops receiving everywhere (shutdown).
    pub fn close_all(&mut self) {
        self.by_addr.clear();
    }
}

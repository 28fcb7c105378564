//! Member connections and their reuse (HTTP/2 members: one shared `H2Member` connection each): one store of idle connections per member, shared by every
//! worker thread (Pingora measured 87% → 99.9% reuse from sharing instead of per-thread pools).
//!
//! A store is a short stack behind a mutex of its own: the most recently used connection is taken
//! first (its member has surely not timed it out), and the lock is held for a push or a pop only.
//! A connection is checked before reuse without a system call: tokio knows from the reactor
//! whether the member closed or wrote to it while it sat idle (`try_read` returns `WouldBlock`
//! at once when no readiness was reported). A sweeper closes connections idle longer than the
//! pool's `idle_timeout` and those the member closed.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use fulcrum_balance::{clock, ConnectionGuard, Member, Pool};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::{BoxError, FramePoll};
use parking_lot::Mutex;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

#[cfg(any(test, feature = "memory-members"))]
pub mod memory;

/// Initial read buffer of a member connection.
const READ_BUFFER: usize = 8 * 1024;
/// How often idle connections are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Under `reuse = "safe"`, a request that cannot be retried may reuse a connection only if it
/// completed an exchange this recently: members close idle connections after seconds
/// (Apache 5 s, nginx 75 s), so one that answered within the last second is proven alive.
pub const PROVEN_ALIVE_MS: u64 = 1000;

/// The byte stream to a member: plain TCP, or TLS over it (pool `tls`).
#[derive(Debug)]
pub enum MemberIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// An in-memory member (`memory`, fuzz and test builds only). It behaves as a plain
    /// stream without what only a socket has: readiness is a poll of the stream (as for TLS),
    /// and there is no receive window to watch or socket to split, so a request body goes out
    /// whole before the answer is read (as for TLS, see `h1::pump_body`).
    #[cfg(any(test, feature = "memory-members"))]
    Memory(tokio::io::DuplexStream),
}

impl MemberIo {
    /// The TCP socket under the stream (none for an in-memory member).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            MemberIo::Plain(s) => Some(s),
            MemberIo::Tls(s) => Some(s.get_ref().0),
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(_) => None,
        }
    }

    /// Reads into the spare capacity of `buf`; `Ok(0)` at the end of the stream.
    pub fn poll_read_buf(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut Vec<u8>,
    ) -> Poll<io::Result<usize>> {
        match self {
            MemberIo::Plain(s) => loop {
                // Readiness first: `try_read_buf` costs no system call when nothing came.
                if let Err(e) = std::task::ready!(s.poll_read_ready(cx)) {
                    return Poll::Ready(Err(e));
                }
                match s.try_read_buf(buf) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    r => return Poll::Ready(r),
                }
            },
            MemberIo::Tls(s) => poll_read_spare(&mut **s, cx, buf),
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(s) => poll_read_spare(s, cx, buf),
        }
    }

    /// Reads what is there now without waiting: `WouldBlock` when nothing is. For a plain socket
    /// this is one `try_read_buf`; for TLS, one poll of the TLS stream (which may find a record
    /// already buffered). The no-op waker is sound here: the caller awaits a real read after a
    /// `WouldBlock`, which registers its own waker.
    pub fn try_read_buf(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            MemberIo::Plain(s) => s.try_read_buf(buf),
            MemberIo::Tls(_) => self.poll_read_now(buf),
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(_) => self.poll_read_now(buf),
        }
    }

    /// One poll of the stream with a no-op waker (see `try_read_buf`).
    fn poll_read_now(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.poll_read_buf(&mut cx, buf) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Whether the member left the connection as it was: not closed, nothing unsolicited sent.
    fn is_idle_alive(&mut self) -> bool {
        match self {
            MemberIo::Plain(s) => {
                let mut probe = [0u8; 1];
                matches!(s.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            MemberIo::Tls(s) => {
                // One non-blocking poll: TLS records that carry no data (TLS 1.3 session
                // tickets) are consumed by rustls and leave it pending; data, close_notify, an
                // end of stream or an error mean the connection cannot be reused.
                let mut probe = [0u8; 1];
                let mut rb = ReadBuf::new(&mut probe);
                let mut cx = Context::from_waker(std::task::Waker::noop());
                Pin::new(&mut **s).poll_read(&mut cx, &mut rb).is_pending()
            }
            // As for TLS: pending means nothing came and the member did not close.
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(s) => {
                let mut probe = [0u8; 1];
                let mut rb = ReadBuf::new(&mut probe);
                let mut cx = Context::from_waker(std::task::Waker::noop());
                Pin::new(s).poll_read(&mut cx, &mut rb).is_pending()
            }
        }
    }
}

/// Reads from `r` into the spare capacity of `buf` (growing it when full); `Ok(0)` at the end
/// of the stream.
fn poll_read_spare<R: AsyncRead + Unpin>(
    r: &mut R,
    cx: &mut Context<'_>,
    buf: &mut Vec<u8>,
) -> Poll<io::Result<usize>> {
    if buf.len() == buf.capacity() {
        // No room would read as the end of the stream.
        buf.reserve(READ_BUFFER);
    }
    let mut rb = ReadBuf::uninit(buf.spare_capacity_mut());
    std::task::ready!(Pin::new(r).poll_read(cx, &mut rb))?;
    let n = rb.filled().len();
    // SAFETY: `ReadBuf` counts as filled only bytes that were written, and they lie right
    // after `buf.len()` in `buf`'s allocation (its spare capacity).
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}

impl AsyncRead for MemberIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MemberIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MemberIo::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for MemberIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MemberIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MemberIo::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MemberIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MemberIo::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MemberIo::Plain(s) => s.is_write_vectored(),
            MemberIo::Tls(s) => s.is_write_vectored(),
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MemberIo::Plain(s) => Pin::new(s).poll_flush(cx),
            MemberIo::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MemberIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MemberIo::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
            #[cfg(any(test, feature = "memory-members"))]
            MemberIo::Memory(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// One connection to a member.
#[derive(Debug)]
pub struct UpstreamConn {
    pub io: MemberIo,
    /// Bytes read from the member not yet consumed (a response head, then its body).
    pub buf: Vec<u8>,
    /// Requests sent over this connection so far.
    pub used: u32,
    /// When its last exchange completed (clock::now_ms).
    pub last_ok_ms: u64,
    /// Counts the connection as in use on the member while it carries a request.
    pub guard: Option<ConnectionGuard>,
}

impl UpstreamConn {
    pub fn new(io: MemberIo) -> UpstreamConn {
        UpstreamConn {
            io,
            buf: Vec::with_capacity(READ_BUFFER),
            used: 0,
            last_ok_ms: 0,
            guard: None,
        }
    }

    /// Whether the member left the connection as it was: not closed, nothing unsolicited sent.
    /// Costs no system call unless the reactor reported the socket readable.
    pub fn is_idle_alive(&mut self) -> bool {
        self.io.is_idle_alive()
    }
}

struct Idle {
    conn: UpstreamConn,
    since_ms: u64,
}

/// Idle connections to one member.
pub struct MemberConns {
    pub member: Arc<Member>,
    /// Oldest first: reuse takes the newest (the least likely to have been closed by the
    /// member), a full pool drops the oldest, both O(1).
    idle: Mutex<VecDeque<Idle>>,
    max_idle: AtomicU32,
    idle_timeout_ms: AtomicU64,
}

impl std::fmt::Debug for MemberConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberConns")
            .field("member", &self.member.address)
            .field("idle", &self.idle.lock().len())
            .finish()
    }
}

impl MemberConns {
    fn new(member: Arc<Member>, opts: &fulcrum_config::HttpPoolOptions) -> MemberConns {
        MemberConns {
            member,
            idle: Mutex::new(VecDeque::new()),
            max_idle: AtomicU32::new(opts.max_idle),
            idle_timeout_ms: AtomicU64::new(opts.idle_timeout.as_millis() as u64),
        }
    }

    fn configure(&self, opts: &fulcrum_config::HttpPoolOptions) {
        self.max_idle.store(opts.max_idle, Ordering::Relaxed);
        self.idle_timeout_ms
            .store(opts.idle_timeout.as_millis() as u64, Ordering::Relaxed);
    }

    fn set_gauge(&self, n: usize) {
        self.member
            .stats
            .connections_idle
            .store(n as u64, Ordering::Relaxed);
    }

    /// Takes the most recently used live idle connection; `proven` restricts it to one that
    /// completed an exchange within `PROVEN_ALIVE_MS`.
    pub fn take(&self, proven: bool) -> Option<UpstreamConn> {
        let now = clock::now_ms();
        let timeout = self.idle_timeout_ms.load(Ordering::Relaxed);
        let mut idle = self.idle.lock();
        loop {
            let top = idle.back()?;
            if now.saturating_sub(top.since_ms) >= timeout {
                // The stack is ordered by age: everything below is older still.
                idle.clear();
                self.set_gauge(0);
                return None;
            }
            if proven && now.saturating_sub(top.conn.last_ok_ms) >= PROVEN_ALIVE_MS {
                return None;
            }
            let Idle { mut conn, .. } = idle.pop_back()?;
            self.set_gauge(idle.len());
            if conn.is_idle_alive() {
                return Some(conn);
            }
        }
    }

    /// Puts a connection back for reuse after a complete exchange.
    pub fn put(&self, mut conn: UpstreamConn) {
        conn.guard = None;
        conn.buf.clear();
        let now = clock::now_ms();
        conn.last_ok_ms = now;
        let max = self.max_idle.load(Ordering::Relaxed) as usize;
        if max == 0 || !self.member.health.is_up() {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() >= max {
            // Keep the fresh one: the oldest is the likeliest to be closed by the member.
            idle.pop_front();
        }
        idle.push_back(Idle {
            conn,
            since_ms: now,
        });
        self.set_gauge(idle.len());
    }

    /// Closes idle connections past the idle timeout and those the member closed.
    fn sweep(&self, now: u64) {
        let timeout = self.idle_timeout_ms.load(Ordering::Relaxed);
        let mut idle = self.idle.lock();
        idle.retain_mut(|i| now.saturating_sub(i.since_ms) < timeout && i.conn.is_idle_alive());
        self.set_gauge(idle.len());
    }

    pub fn idle_len(&self) -> usize {
        self.idle.lock().len()
    }
}

/// The HTTP/2 connection to one member.
pub struct H2Member {
    pub member: Arc<Member>,
    sender: parking_lot::Mutex<Option<SendRequest<UpBody>>>,
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for H2Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Member")
            .field("member", &self.member.address)
            .finish()
    }
}

impl H2Member {
    pub fn new(member: Arc<Member>) -> H2Member {
        H2Member {
            member,
            sender: parking_lot::Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> Option<SendRequest<UpBody>> {
        let s = self.sender.lock();
        s.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    /// Forgets the shared connection (it failed); the next request opens another.
    pub fn reset(&self) {
        *self.sender.lock() = None;
    }

    /// A handle on the member's connection; `true` when it was opened for this request.
    pub async fn sender(
        &self,
        connect_timeout: Duration,
        tls: Option<&crate::tls::client::MemberTls>,
        snat: Option<&fulcrum_net::Snat>,
        vrf: Option<&str>,
    ) -> io::Result<(SendRequest<UpBody>, bool)> {
        if let Some(s) = self.current() {
            return Ok((s, false));
        }
        let _one = self.connecting.lock().await;
        if let Some(s) = self.current() {
            return Ok((s, false));
        }
        let started = Instant::now();
        let io = open(snat, vrf, self.member.address, connect_timeout, tls).await?;
        let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(io));
        let (sender, conn) = tokio::time::timeout(connect_timeout, handshake)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "HTTP/2 handshake timed out"))?
            .map_err(io::Error::other)?;
        self.member.record_connect_success(started.elapsed());
        let label = self.member.label.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(member = %label, error = %e, "HTTP/2 member connection ended");
            }
        });
        *self.sender.lock() = Some(sender.clone());
        Ok((sender, true))
    }
}

/// A request body for an HTTP/2 member.
pub enum UpBody {
    Empty,
    Full(Option<Bytes>),
    /// Fed by the task reading an HTTP/1.1 client's body.
    Channel(mpsc::Receiver<Result<Bytes, BoxError>>),
    /// An HTTP/2 client's body, passed through.
    Incoming(Incoming),
    /// An HTTP/2 client's body under `max_body_size` and `min_body_rate`.
    Limited(Box<crate::body_limit::Limited>),
    /// Another body, its data bytes added to the counter as they go out (the member's and the
    /// service's byte counters, when the response ends).
    Counted(Box<UpBody>, Arc<AtomicU64>),
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        match self.get_mut() {
            UpBody::Empty => Poll::Ready(None),
            UpBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            UpBody::Channel(rx) => match ready!(rx.poll_recv(cx)) {
                Some(Ok(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
                Some(Err(e)) => Poll::Ready(Some(Err(e))),
                None => Poll::Ready(None),
            },
            UpBody::Incoming(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpBody::Limited(b) => Pin::new(b.as_mut()).poll_frame(cx),
            UpBody::Counted(b, sent) => {
                let frame = ready!(Pin::new(b.as_mut()).poll_frame(cx));
                let data = frame.as_ref().and_then(|f| f.as_ref().ok());
                if let Some(data) = data.and_then(Frame::data_ref) {
                    sent.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Empty => true,
            UpBody::Full(b) => b.is_none(),
            UpBody::Channel(_) => false,
            UpBody::Incoming(b) => b.is_end_stream(),
            UpBody::Limited(b) => b.is_end_stream(),
            UpBody::Counted(b, _) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Empty => SizeHint::with_exact(0),
            UpBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            UpBody::Channel(_) => SizeHint::default(),
            UpBody::Incoming(b) => b.size_hint(),
            UpBody::Limited(b) => b.size_hint(),
            UpBody::Counted(b, _) => b.size_hint(),
        }
    }
}

/// Every member's idle connections, by (pool, member address); kept across reloads.
#[derive(Default)]
pub struct Upstreams {
    stores: Mutex<HashMap<MemberKey, Arc<MemberConns>>>,
    h2: Mutex<HashMap<MemberKey, Arc<H2Member>>>,
}

/// A member's identity across reloads: pool name and address.
type MemberKey = (Arc<str>, SocketAddr);

impl Upstreams {
    /// A registry with its sweeper task (on the current tokio runtime, if there is one).
    pub fn new() -> Arc<Upstreams> {
        let u = Arc::new(Upstreams::default());
        let weak: Weak<Upstreams> = Arc::downgrade(&u);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return u;
        };
        rt.spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(u) = weak.upgrade() else { return };
                let stores: Vec<Arc<MemberConns>> = u.stores.lock().values().cloned().collect();
                let now = clock::now_ms();
                for s in stores {
                    s.sweep(now);
                }
            }
        });
        u
    }

    /// The stores of a pool's members, in member order; existing ones are kept (with their idle
    /// connections) when the member is the same.
    pub fn for_pool(&self, pool: &Pool) -> Vec<Arc<MemberConns>> {
        let opts = &pool.config.http;
        let mut stores = self.stores.lock();
        pool.members()
            .iter()
            .map(|m| {
                let key = (pool.name.clone(), m.address);
                match stores.get(&key) {
                    Some(s) if Arc::ptr_eq(&s.member, m) => {
                        s.configure(opts);
                        s.clone()
                    }
                    _ => {
                        let s = Arc::new(MemberConns::new(m.clone(), opts));
                        stores.insert(key, s.clone());
                        s
                    }
                }
            })
            .collect()
    }

    /// The HTTP/2 connections of a pool's members (pools with `http2 = true`), in member order.
    pub fn h2_for_pool(&self, pool: &Pool) -> Vec<Arc<H2Member>> {
        let mut h2 = self.h2.lock();
        pool.members()
            .iter()
            .map(|m| {
                let key = (pool.name.clone(), m.address);
                match h2.get(&key) {
                    Some(s) if Arc::ptr_eq(&s.member, m) => s.clone(),
                    _ => {
                        let s = Arc::new(H2Member::new(m.clone()));
                        h2.insert(key, s.clone());
                        s
                    }
                }
            })
            .collect()
    }

    /// Drops the stores (and idle connections) of members no longer in `pools`.
    pub fn retain(&self, pools: &[Arc<Pool>]) {
        self.h2.lock().retain(|(pool, addr), s| {
            pools.iter().any(|p| {
                p.name == *pool
                    && p.config.http.http2
                    && p.member_by_addr(*addr)
                        .is_some_and(|(_, m)| Arc::ptr_eq(m, &s.member))
            })
        });
        let mut stores = self.stores.lock();
        stores.retain(|(pool, addr), s| {
            pools.iter().any(|p| {
                p.name == *pool
                    && p.member_by_addr(*addr)
                        .is_some_and(|(_, m)| Arc::ptr_eq(m, &s.member))
            }) || {
                s.set_gauge(0);
                false
            }
        });
    }
}

/// Connects to a member within `timeout`, with TCP_NODELAY, from the service's source address
/// pool (`snat`) when it has one. An exhausted pool is `AddrNotAvailable`
/// (`fulcrum_net::snat::is_snat_exhaustion`), not the member's fault.
pub async fn connect(
    snat: Option<&fulcrum_net::Snat>,
    vrf: Option<&str>,
    addr: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    fulcrum_net::snat::connect(snat, vrf, addr, timeout).await
}

/// A new connection to the HTTP/2 member at `addr`: TCP, then TLS when the pool has it (an
/// in-memory member instead in fuzz and test builds, when one listens at `addr`).
async fn open(
    snat: Option<&fulcrum_net::Snat>,
    vrf: Option<&str>,
    addr: SocketAddr,
    timeout: Duration,
    tls: Option<&crate::tls::client::MemberTls>,
) -> io::Result<MemberIo> {
    #[cfg(any(test, feature = "memory-members"))]
    if let Some(io) = memory_member(addr, tls.is_some()) {
        return io;
    }
    let io = connect(snat, vrf, addr, timeout).await?;
    secure(io, tls, addr, timeout).await
}

/// The connection to an in-memory member at `addr` (fuzz and test builds), if one listens
/// there: `None` sends the caller to TCP. TLS is not spoken over memory: a pool with `tls`
/// gets an error rather than a plain connection it did not ask for.
#[cfg(any(test, feature = "memory-members"))]
pub(crate) fn memory_member(addr: SocketAddr, tls: bool) -> Option<io::Result<MemberIo>> {
    let io = memory::connect(addr)?;
    Some(match io {
        Ok(_) if tls => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "TLS to an in-memory member",
        )),
        r => r.map(MemberIo::Memory),
    })
}

/// A connected member socket as the pool speaks to it: as is, or after a TLS handshake (pool
/// `tls`) finished within `timeout`.
pub async fn secure(
    io: TcpStream,
    tls: Option<&crate::tls::client::MemberTls>,
    addr: SocketAddr,
    timeout: Duration,
) -> io::Result<MemberIo> {
    let Some(tls) = tls else {
        return Ok(MemberIo::Plain(io));
    };
    match tokio::time::timeout(timeout, tls.connect(io, addr)).await {
        Ok(Ok(s)) => Ok(MemberIo::Tls(Box::new(s))),
        Ok(Err(e)) => Err(io::Error::new(e.kind(), format!("TLS handshake: {e}"))),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("TLS handshake not finished within {timeout:?}"),
        )),
    }
}

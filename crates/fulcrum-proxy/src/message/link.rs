//! One long-lived connection from Fulcrum to a member, carrying the messages of many clients.
//!
//! The task connects (with back-off while the member refuses), then takes messages from the
//! member's queue while it has room — one at a time in sync mode, up to `max_pending` in async
//! mode — writes them, and pairs each answer with its message: by the sequence id when the
//! service has one, otherwise by order. When the connection dies, the messages it carried go back
//! to the dispatcher to be sent elsewhere (or failed), and the member's state machine hears of it.
//!
//! With a pool `tls`, the connection is re-encrypted: after the handshake the rustls session is
//! driven by hand over the same readiness loop (records read and written with the socket's
//! non-blocking `try_read`/`try_write`), so plain links keep their unboxed, copy-free path and a
//! TLS link differs only where bytes enter and leave the socket.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rustls::ClientConnection;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use crate::message::framing::field_in_body;
use crate::message::hub::{Client, Hub, MemberLinks, Message, Reply};
use crate::message::stats::FailReason;
use fulcrum_config::Simplex;
use fulcrum_net::forward::write_all;

/// First wait before reconnecting after a failure; it doubles up to `BACKOFF_MAX`.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A link in back-off that is wanted (a message was scheduled on its member) reconnects early,
/// but never sooner than this after its last attempt.
const MIN_RECONNECT_GAP: Duration = Duration::from_millis(50);
/// A connection that lasted this long before the member closed it cleanly is reopened at once.
const STABLE_SESSION: Duration = Duration::from_secs(1);
/// How long a simplex member has to open its receive connection to `simplex.receive_listen`
/// after Fulcrum connected its send connection (at least the pool's `connect_timeout`).
const RECEIVE_WAIT: Duration = Duration::from_secs(3);
/// Reads per wake-up before other work gets a turn.
const READS_PER_WAKE: usize = 16;
/// Read buffer growth step.
const READ_CHUNK: usize = 16 * 1024;
/// Byte counts go to the member's counters at least this often.
const REPORT_BYTES: u64 = 64 * 1024;

/// Starts the task of one member connection (`Hub`'s `LinkTask`).
pub(crate) fn spawn(links: Arc<MemberLinks>, hub: Arc<Hub>, keep: bool) {
    tokio::spawn(run(links, hub, keep));
}

/// Runs one member connection until its set is retired or the service has shut down (or, for a
/// link opened on demand, until its connection ends).
pub(crate) async fn run(links: Arc<MemberLinks>, hub: Arc<Hub>, keep: bool) {
    let member = links.member.clone();
    let mut backoff = BACKOFF_MIN;
    loop {
        if links.closing_for(&hub) {
            break;
        }
        let started = Instant::now();
        let failure = match connect_both(&links, &hub, member.address, started).await {
            Ok((stream, tls, receive)) => {
                member.record_connect_success(started.elapsed());
                let guard = member.open_connection();
                let halves = if receive.is_some() { 2 } else { 1 };
                links.stats.connections.fetch_add(halves, Ordering::Relaxed);
                let mut session = Session::new(&links, &hub, tls);
                let end = session.run(&stream, receive.as_ref()).await;
                links.stats.connections.fetch_sub(halves, Ordering::Relaxed);
                drop(guard);
                let failed = session.finish();
                match end {
                    End::Closing => break,
                    // A member closing a connection it had kept for a while (an idle timeout):
                    // reconnect at once. One that closes every connection at once gets the
                    // back-off, so a broken member cannot make us spin.
                    End::Closed if keep && started.elapsed() >= STABLE_SESSION => {
                        backoff = BACKOFF_MIN;
                        continue;
                    }
                    End::Closed if keep => "the member closed the connection at once".to_string(),
                    End::Closed => break,
                    End::Failed(reason) => {
                        if failed > 0 {
                            member.record_passive_failure(&reason);
                        }
                        tracing::debug!(service = %hub.name, member = %member.label, %reason, unanswered = failed, "member connection ended");
                        reason
                    }
                }
            }
            // No source port left (`snat`): counted by the pool, not the member's fault.
            Err(ConnectError::NoSourcePort(reason)) => reason,
            // Refused, timed out, or a failed TLS handshake (a certificate that does not
            // verify): the member cannot be reached, as for a refused connect.
            Err(ConnectError::Member(reason)) => {
                member.record_connect_failure(&reason);
                reason
            }
            // As before TLS: a PROXY header that could not be written ends the attempt without
            // blaming the member (the connect itself worked).
            Err(ConnectError::Header(reason)) => reason,
            Err(ConnectError::Closing) => "closing".to_string(),
        };
        // Messages queued for this member would wait for a connection that is not there: while
        // no sibling link is connected, they go to other members.
        if links.ready() == 0 {
            links.drain(&hub);
        }
        if !keep {
            break;
        }
        tracing::debug!(service = %hub.name, member = %member.label, reason = %failure, retry_in = ?backoff, "member connection down");
        wait_backoff(&links, &hub, started, backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
    links.task_ended();
}

/// Why a member connection could not be made ready.
enum ConnectError {
    /// No source port left (`snat`).
    NoSourcePort(String),
    /// The member refused, did not answer in time, or failed the TLS handshake.
    Member(String),
    /// The PROXY header could not be written.
    Header(String),
    /// The set closed while waiting for the member's receive connection.
    Closing,
}

/// Connects to the member; with `simplex`, then opens the receive-only connection to the
/// member's address at `receive_port`: a simplex member is up only with both.
async fn connect_both(
    links: &MemberLinks,
    hub: &Hub,
    address: SocketAddr,
    started: Instant,
) -> Result<(TcpStream, Option<Box<ClientConnection>>, Option<TcpStream>), ConnectError> {
    let (stream, tls) = connect(hub, address, started).await?;
    let port = match &hub.settings.simplex {
        None => return Ok((stream, tls, None)),
        Some(Simplex::ReceivePort(port)) => *port,
        Some(Simplex::ReceiveListen(listen)) => {
            let receive = wait_inbound(links, hub, *listen).await?;
            return Ok((stream, tls, Some(receive)));
        }
    };
    let at = SocketAddr::new(address.ip(), port);
    // `fulcrum check` refuses a re-encrypting simplex pool: the receive half is plain.
    let (receive, _) = connect(hub, at, Instant::now())
        .await
        .map_err(|e| match e {
            ConnectError::Member(reason) => {
                ConnectError::Member(format!("receive connection to {at}: {reason}"))
            }
            other => other,
        })?;
    Ok((stream, tls, Some(receive)))
}

/// `simplex.receive_listen`: the receive connection the member opens to Fulcrum. One it opened
/// before is taken at once; otherwise it has `RECEIVE_WAIT` (at least the pool's
/// `connect_timeout`) to open one.
async fn wait_inbound(
    links: &MemberLinks,
    hub: &Hub,
    listen: SocketAddr,
) -> Result<TcpStream, ConnectError> {
    let wait = RECEIVE_WAIT.max(hub.connect_timeout());
    let deadline = Instant::now() + wait;
    loop {
        if let Some(s) = links.take_inbound() {
            return Ok(s);
        }
        if links.closing_for(hub) {
            return Err(ConnectError::Closing);
        }
        tokio::select! {
            _ = links.arrived.notified() => {}
            _ = links.closing.notified() => {}
            _ = tokio::time::sleep_until(deadline) => {
                return Err(ConnectError::Member(format!(
                    "no receive connection from the member to {listen} within {wait:?}"
                )));
            }
        }
    }
}

/// Connects to the member, writes the PROXY header the member expects (before TLS, as it
/// describes the TCP connection), and with a pool `tls` completes the handshake: connect and
/// handshake together within the pool's `connect_timeout`.
async fn connect(
    hub: &Hub,
    address: SocketAddr,
    started: Instant,
) -> Result<(TcpStream, Option<Box<ClientConnection>>), ConnectError> {
    let timeout = hub.connect_timeout();
    let vrf = hub.vrf();
    let stream = fulcrum_net::snat::connect(
        hub.settings.snat.as_deref(),
        vrf.as_deref(),
        address,
        timeout,
    )
    .await
    .map_err(|e| {
        let reason = format!("connect: {e}");
        if fulcrum_net::snat::is_snat_exhaustion(&e) {
            ConnectError::NoSourcePort(reason)
        } else {
            ConnectError::Member(reason)
        }
    })?;
    if let Some(version) = hub.settings.proxy_protocol {
        // A member connection carries many clients' messages, so no single client address
        // can be announced: the header says the connection is Fulcrum's own (v2 LOCAL,
        // v1 UNKNOWN), for members that require one.
        let header = fulcrum_net::proxy_protocol::local_header(version);
        write_all(&stream, &header)
            .await
            .map_err(|e| ConnectError::Header(format!("writing PROXY header: {e}")))?;
    }
    let Some(member_tls) = &hub.settings.member_tls else {
        return Ok((stream, None));
    };
    match tokio::time::timeout_at(started + timeout, member_tls.connect(stream, address)).await {
        Ok(Ok(tls)) => {
            let (stream, session) = tls.into_inner();
            Ok((stream, Some(Box::new(session))))
        }
        Ok(Err(e)) => Err(ConnectError::Member(format!("TLS handshake: {e}"))),
        Err(_) => Err(ConnectError::Member(format!(
            "connect and TLS handshake not finished within {timeout:?}"
        ))),
    }
}

/// The socket as `std::io` sees it, for rustls: non-blocking reads and writes that report
/// `WouldBlock` (which also clears tokio's readiness, so the next `readable`/`writable` waits).
struct TryIo<'a>(&'a TcpStream);

impl Read for TryIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for TryIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes the TLS records rustls has sealed, until none is left or the socket is full.
fn flush_tls(stream: &TcpStream, tls: &mut ClientConnection) -> io::Result<()> {
    while tls.wants_write() {
        match tls.write_tls(&mut TryIo(stream)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Encrypts what `wbuf` holds and writes it, as far as the socket takes it. rustls buffers at
/// most its limit of sealed records; the rest stays in `wbuf` until the socket drains.
fn write_tls(stream: &TcpStream, tls: &mut ClientConnection, wbuf: &mut SendBuf) -> io::Result<()> {
    loop {
        flush_tls(stream, tls)?;
        if wbuf.is_empty() || tls.wants_write() {
            return Ok(());
        }
        let n = tls.writer().write(wbuf.pending())?;
        if n == 0 {
            return Ok(());
        }
        wbuf.consume(n);
    }
}

/// Reads decrypted bytes into `buf` (whose spare capacity the caller reserved): what rustls
/// already holds first, else records from the socket. `Ok(0)` is the end of the connection
/// (close_notify, or the socket closed); `WouldBlock` when nothing more has arrived.
fn read_tls(
    stream: &TcpStream,
    tls: &mut ClientConnection,
    buf: &mut BytesMut,
) -> io::Result<usize> {
    loop {
        let start = buf.len();
        // rustls reads into initialised memory: the spare capacity is zeroed first (a TLS
        // link's extra cost next to the decryption, which costs far more).
        buf.resize(buf.capacity(), 0);
        let plain = tls.reader().read(&mut buf[start..]);
        buf.truncate(start + *plain.as_ref().unwrap_or(&0));
        match plain {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // Closed without close_notify: an end like any other (the framing decides whether
            // an answer was cut short).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
            Err(e) => return Err(e),
        }
        if tls.read_tls(&mut TryIo(stream))? == 0 {
            return Ok(0);
        }
        if let Err(e) = tls.process_new_packets() {
            // The alert rustls queued tells the member why, when the socket takes it.
            let _ = flush_tls(stream, tls);
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
    }
}

/// Sleeps `backoff`, or less when a message is scheduled on the member (a member that recovered
/// gets work at once), or until the set closes.
async fn wait_backoff(links: &MemberLinks, hub: &Hub, attempt: Instant, backoff: Duration) {
    let deadline = attempt + backoff;
    let earliest = attempt + MIN_RECONNECT_GAP;
    loop {
        if links.closing_for(hub) {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return,
            _ = links.wanted.notified() => {
                tokio::time::sleep_until(earliest).await;
                return;
            }
            _ = links.closing.notified() => {}
            // Closing is also noticed without a wake-up, at worst a second late.
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Bytes waiting to be written to the member. A partial write advances an offset instead of
/// moving the rest of the buffer.
#[derive(Default)]
struct SendBuf {
    buf: Vec<u8>,
    pos: usize,
}

impl SendBuf {
    fn is_empty(&self) -> bool {
        self.pos == self.buf.len()
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
        if self.pos == self.buf.len() {
            self.pos = 0;
            self.buf.clear();
            // A burst's buffer is not kept for ever.
            if self.buf.capacity() > 256 * 1024 {
                self.buf = Vec::new();
            }
        }
    }
}

/// How a connected session ended.
enum End {
    /// The set is retired or the service shut down, and nothing was left to answer.
    Closing,
    /// The member closed the connection with nothing outstanding.
    Closed,
    /// An error, a close with messages outstanding, a bad frame, or an answer overdue.
    Failed(String),
}

/// Hashes sequence ids for the pending tables. SipHash (std's default) costs more than the
/// rest of pairing an answer; ids are short (at most 64 bytes) and a table holds at most
/// `max_pending` of them, so a multiply-rotate hash over 8-byte words, keyed per process so
/// clients cannot aim at collisions ahead of time, does the job.
#[derive(Clone)]
struct IdHashBuilder(u64);

impl Default for IdHashBuilder {
    fn default() -> Self {
        use std::hash::{BuildHasher, Hasher};
        static KEY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        IdHashBuilder(*KEY.get_or_init(|| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x9e37_79b9_7f4a_7c15);
            h.finish() | 1
        }))
    }
}

impl std::hash::BuildHasher for IdHashBuilder {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(self.0)
    }
}

struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0 ^ u64::from_le_bytes(w))
                .wrapping_mul(K)
                .rotate_left(29);
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.0 = (self.0 ^ u64::from_le_bytes(w))
                .wrapping_mul(K)
                .rotate_left(29);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        // Final avalanche (from splitmix64), so the table's low bits depend on every byte.
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A sequence id as a table key: copied inline when short (the common case: no reference count
/// on the message's buffer to take and drop), shared with the message's bytes when long.
#[derive(Clone, Eq)]
enum IdKey {
    Inline { len: u8, bytes: [u8; 24] },
    Shared(Bytes),
}

impl IdKey {
    fn new(message: &Bytes, range: std::ops::Range<usize>) -> IdKey {
        let id = &message[range.clone()];
        if id.len() <= 24 {
            let mut bytes = [0u8; 24];
            bytes[..id.len()].copy_from_slice(id);
            IdKey::Inline {
                len: id.len() as u8,
                bytes,
            }
        } else {
            IdKey::Shared(message.slice(range))
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            IdKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            IdKey::Shared(b) => b,
        }
    }
}

impl PartialEq for IdKey {
    fn eq(&self, other: &IdKey) -> bool {
        self.as_slice() == other.as_slice()
    }
}

// Hashes exactly as the `[u8]` it holds, so answers can look keys up by a plain slice.
impl std::hash::Hash for IdKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_slice().hash(h)
    }
}

impl std::borrow::Borrow<[u8]> for IdKey {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

/// Messages sent on this connection and not answered yet.
enum Pending {
    /// Paired by order: the member answers in the order it received.
    Fifo(VecDeque<(Message, Instant)>),
    /// Paired by sequence id; messages whose id is already outstanding here wait in `blocked`
    /// until that one is answered, so an id is never outstanding twice on one connection.
    ById {
        sent: HashMap<IdKey, (Message, Instant), IdHashBuilder>,
        blocked: HashMap<IdKey, VecDeque<Message>, IdHashBuilder>,
        blocked_count: usize,
    },
}

struct Session<'a> {
    links: &'a Arc<MemberLinks>,
    hub: &'a Arc<Hub>,
    pending: Pending,
    window: usize,
    wbuf: SendBuf,
    rbuf: BytesMut,
    /// Reused for the messages taken from the queue in one go.
    batch: Vec<Message>,
    scanned: usize,
    idle: bool,
    ready: bool,
    unreported_sent: u64,
    unreported_received: u64,
    id_in_body: Option<(usize, usize)>,
    /// The TLS session over the socket (pool `tls`); None for a plain link.
    tls: Option<Box<ClientConnection>>,
    /// `member_requests`: this connection as the client of the member's own requests, and
    /// where their answers come back (from a client connection or the fallback pool).
    origin: Option<(Arc<Client>, mpsc::UnboundedReceiver<Reply>)>,
}

impl<'a> Session<'a> {
    fn new(
        links: &'a Arc<MemberLinks>,
        hub: &'a Arc<Hub>,
        tls: Option<Box<ClientConnection>>,
    ) -> Session<'a> {
        let by_id = hub.settings.by_id();
        Session {
            links,
            hub,
            pending: if by_id {
                Pending::ById {
                    sent: HashMap::default(),
                    blocked: HashMap::default(),
                    blocked_count: 0,
                }
            } else {
                Pending::Fifo(VecDeque::new())
            },
            window: hub.settings.window(),
            wbuf: SendBuf::default(),
            rbuf: BytesMut::new(),
            batch: Vec::new(),
            scanned: 0,
            idle: false,
            ready: false,
            unreported_sent: 0,
            unreported_received: 0,
            id_in_body: hub
                .settings
                .sequence
                .as_ref()
                .filter(|_| by_id)
                .map(|s| (s.offset, s.length)),
            tls,
            origin: hub.settings.member_requests.as_ref().map(|_| {
                let (tx, rx) = mpsc::unbounded_channel();
                (Client::new(tx, links.member.address), rx)
            }),
        }
    }

    fn outstanding(&self) -> usize {
        match &self.pending {
            Pending::Fifo(q) => q.len(),
            Pending::ById {
                sent,
                blocked_count,
                ..
            } => sent.len() + blocked_count,
        }
    }

    fn set_idle(&mut self, idle: bool) {
        if idle != self.idle {
            self.idle = idle;
            if idle {
                self.links.idle.fetch_add(1, Ordering::AcqRel);
            } else {
                self.links.idle.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Bytes not on the wire yet: in the send buffer, or sealed by TLS and not written.
    fn unsent(&self) -> bool {
        !self.wbuf.is_empty() || self.tls.as_ref().is_some_and(|t| t.wants_write())
    }

    /// Decrypted bytes (or records not decrypted yet) that rustls holds: the socket may not
    /// become readable again, so they are read without waiting for it.
    fn tls_buffered(&mut self) -> bool {
        self.tls.as_mut().is_some_and(|t| {
            t.process_new_packets()
                .map_or(true, |s| s.plaintext_bytes_to_read() > 0)
        })
    }

    /// Runs the connected session: messages are written to `stream`, and read from `receive`
    /// (`simplex`) or from `stream` itself.
    async fn run(&mut self, stream: &TcpStream, receive: Option<&TcpStream>) -> End {
        let send = stream;
        let stream = receive.unwrap_or(send);
        let simplex = receive.is_some();
        self.ready = true;
        self.links.set_ready(true);
        let period = (self.hub.settings.options.message_timeout / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let closing = self.links.closing_for(self.hub);
            let busy = self.outstanding() > 0;
            if !closing {
                self.pull();
            }
            if closing && self.outstanding() == 0 && !self.unsent() {
                if let Some(tls) = self.tls.as_mut() {
                    // Best effort: the member learns the close was intended.
                    tls.send_close_notify();
                    let _ = flush_tls(stream, tls);
                }
                return End::Closing;
            }
            if busy && !self.wbuf.is_empty() && !closing {
                // Under load (messages already outstanding here), let the other client
                // connections that are readable now queue their messages too, and write them
                // all at once, as for client answers. A lone message goes out at once: the yield
                // would cost it an extra poll of the runtime.
                tokio::task::yield_now().await;
                self.pull();
            }
            if self.unsent() {
                if let Err(e) = self.try_write(send) {
                    return End::Failed(format!("write: {e}"));
                }
            }
            let room = self.outstanding() < self.window;
            self.set_idle(room && !closing);
            let buffered = self.tls_buffered();
            let unsent = self.unsent();
            tokio::select! {
                biased;
                _ = std::future::ready(()), if buffered => {
                    if let Some(end) = self.read(stream) {
                        return end;
                    }
                }
                r = stream.readable() => {
                    if let Err(e) = r {
                        return End::Failed(format!("read: {e}"));
                    }
                    if let Some(end) = self.read(stream) {
                        return end;
                    }
                }
                r = send.writable(), if unsent => {
                    if let Err(e) = r.and_then(|_| self.try_write(send)) {
                        return End::Failed(format!("write: {e}"));
                    }
                }
                r = send.readable(), if simplex => {
                    let dropped = &self.hub.messages.simplex_send_dropped_bytes;
                    if let Some(end) = r.map_err(|e| e.to_string()).and_then(|_| discard(send, dropped)).err() {
                        return End::Failed(format!("send connection: {end}"));
                    }
                }
                reply = recv_origin(&mut self.origin) => {
                    if let Some(reply) = reply {
                        self.answer_member_request(reply);
                    }
                }
                _ = self.links.work.notified(), if room && !closing => {}
                _ = tick.tick() => {
                    if let Some(end) = self.expire() {
                        return end;
                    }
                }
                _ = self.links.closing.notified() => {}
            }
        }
    }

    /// Takes queued messages while there is room, and writes them into the send buffer.
    fn pull(&mut self) {
        let room = self.window.saturating_sub(self.outstanding());
        if room == 0 {
            return;
        }
        let mut batch = std::mem::take(&mut self.batch);
        let more = self.links.take(room, &mut batch, self.hub);
        if !batch.is_empty() {
            let now = Instant::now();
            // Messages accepted before this instant are overdue (a comparison per message, not
            // a subtraction).
            let overdue_before = now.checked_sub(self.hub.settings.options.message_timeout);
            for msg in batch.drain(..) {
                if overdue_before.is_some_and(|t| msg.accepted <= t) {
                    self.hub.fail(msg, FailReason::Timeout);
                } else {
                    self.send(msg, now);
                }
            }
        }
        self.batch = batch;
        // Full (or ids blocked), with messages still queued: another link with room should
        // take them. (A message released from `blocked` may leave room; the next turn sees it.)
        if more {
            self.links.work.notify_one();
        }
    }

    fn send(&mut self, mut msg: Message, now: Instant) {
        let mut key = None;
        if let Pending::ById {
            sent,
            blocked,
            blocked_count,
        } = &mut self.pending
        {
            let Some(id) = msg.id().map(|r| IdKey::new(&msg.bytes, r)) else {
                // The client connection checked that every message carries its id.
                self.hub.fail(msg, FailReason::MemberFailed);
                return;
            };
            if sent.contains_key(&id) {
                blocked.entry(id).or_default().push_back(msg);
                *blocked_count += 1;
                return;
            }
            key = Some(id);
        }
        self.wbuf.push(&msg.bytes);
        self.count_send(&mut msg);
        match (&mut self.pending, key) {
            (Pending::Fifo(q), _) => q.push_back((msg, now)),
            (Pending::ById { sent, .. }, Some(id)) => {
                sent.insert(id, (msg, now));
            }
            (Pending::ById { .. }, None) => {}
        }
    }

    fn count_send(&mut self, msg: &mut Message) {
        msg.attempts += 1;
        let m = &self.links.member.stats;
        m.requests_total.fetch_add(1, Ordering::Relaxed);
        m.active_requests.fetch_add(1, Ordering::Relaxed);
        self.links.stats.sent.fetch_add(1, Ordering::Relaxed);
        self.links.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        self.unreported_sent += msg.bytes.len() as u64;
    }

    /// Counts `n` messages that are no longer outstanding on the member.
    fn count_done(&self, n: u64) {
        if n > 0 {
            self.links
                .member
                .stats
                .active_requests
                .fetch_sub(n, Ordering::Relaxed);
            self.links.stats.in_flight.fetch_sub(n, Ordering::Relaxed);
        }
    }

    fn try_write(&mut self, stream: &TcpStream) -> io::Result<()> {
        if let Some(tls) = self.tls.as_mut() {
            write_tls(stream, tls, &mut self.wbuf)?;
            self.report(false);
            return Ok(());
        }
        while !self.wbuf.is_empty() {
            match stream.try_write(self.wbuf.pending()) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.wbuf.consume(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        self.report(false);
        Ok(())
    }

    fn report(&mut self, all: bool) {
        if all || self.unreported_sent + self.unreported_received >= REPORT_BYTES {
            self.links
                .member
                .stats
                .add_bytes(self.unreported_sent, self.unreported_received);
            self.unreported_sent = 0;
            self.unreported_received = 0;
        }
    }

    /// Reads what the member sent and hands out the answers; `Some` when the connection ended.
    fn read(&mut self, stream: &TcpStream) -> Option<End> {
        let framer = &self.hub.framer;
        let mut now = None;
        for _ in 0..READS_PER_WAKE {
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                self.rbuf.reserve(READ_CHUNK);
            }
            let got = match self.tls.as_mut() {
                None => stream.try_read_buf(&mut self.rbuf),
                Some(tls) => read_tls(stream, tls, &mut self.rbuf),
            };
            match got {
                Ok(0) => {
                    let n = self.outstanding();
                    return Some(if n == 0 {
                        End::Closed
                    } else {
                        End::Failed(format!(
                            "the member closed the connection with {n} messages unanswered"
                        ))
                    });
                }
                Ok(n) => self.unreported_received += n as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Some(End::Failed(format!("read: {e}"))),
            }
            loop {
                match framer.parse(&self.rbuf, &mut self.scanned) {
                    Ok(Some(frame)) => {
                        let bytes = self.rbuf.split_to(frame.len).freeze();
                        let now = *now.get_or_insert_with(Instant::now);
                        self.on_answer(bytes, frame.body, frame.key, now);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.hub
                            .messages
                            .member_bad_frames
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(service = %self.hub.name, member = %self.links.member.label, error = %e, "closing member connection: bad frame from the member");
                        return Some(End::Failed(format!("bad frame from the member: {e}")));
                    }
                }
            }
        }
        self.report(false);
        None
    }

    fn on_answer(
        &mut self,
        bytes: Bytes,
        body: std::ops::Range<usize>,
        key: Option<std::ops::Range<usize>>,
        now: Instant,
    ) {
        let mut released = None;
        let id = match key {
            // A framing hook's range, checked as any bytes from outside.
            Some(k) => (k.start <= k.end && k.end <= bytes.len()).then_some(k),
            None => self
                .id_in_body
                .and_then(|(off, len)| field_in_body(&body, off, len)),
        };
        // `member_requests.marker`: a request of the member's own, whatever its id.
        let marked = self
            .hub
            .settings
            .member_requests
            .as_ref()
            .and_then(|r| r.marker.as_ref())
            .is_some_and(|m| {
                field_in_body(&body, m.offset, m.value.len())
                    .and_then(|r| bytes.get(r))
                    .is_some_and(|v| v == m.value.as_slice())
            });
        let matched = match &mut self.pending {
            Pending::Fifo(q) => q.pop_front(),
            Pending::ById { .. } if marked => None,
            Pending::ById {
                sent,
                blocked,
                blocked_count,
            } => {
                let found = id.clone().and_then(|id| sent.remove_entry(&bytes[id]));
                if let Some((id, _)) = &found {
                    // The id is free on this connection again: a message waiting for it goes.
                    if let Entry::Occupied(mut waiting) = blocked.entry(id.clone()) {
                        released = waiting.get_mut().pop_front();
                        if waiting.get().is_empty() {
                            waiting.remove();
                        }
                        if released.is_some() {
                            *blocked_count -= 1;
                        }
                    }
                }
                found.map(|(_, entry)| entry)
            }
        };
        if let Some(next) = released {
            self.send(next, now);
        }
        match matched {
            Some((msg, sent_at)) => {
                self.count_done(1);
                let member = &self.links.member;
                member
                    .stats
                    .observe_response_time(now.saturating_duration_since(sent_at));
                member.record_exchange_success();
                self.links.stats.responses.fetch_add(1, Ordering::Relaxed);
                self.hub.deliver(msg, bytes, now);
            }
            None => {
                if let (Some((asker, _)), Some(id)) = (&self.origin, id) {
                    self.hub.member_request(bytes, id, body, asker, now);
                    return;
                }
                self.links.stats.orphans.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(service = %self.hub.name, member = %self.links.member.label, "dropped an answer that matches no waiting message");
            }
        }
    }

    /// The answer to a member's own request (from a client connection or the fallback pool):
    /// written to the member on this connection (the send half for `simplex`).
    fn answer_member_request(&mut self, reply: Reply) {
        match reply {
            Reply::Response { bytes, .. } => {
                self.wbuf.push(&bytes);
                self.unreported_sent += bytes.len() as u64;
                self.hub
                    .messages
                    .originated_answered
                    .fetch_add(1, Ordering::Relaxed);
            }
            // Not answered (the fallback pool failed it): the member's own timeout covers it.
            Reply::Failed { .. } | Reply::Request { .. } => {}
        }
    }

    /// Fails messages whose time is up. With order pairing a missing answer desynchronises the
    /// connection, so it is closed (`Some`), and the others it carried are re-sent.
    fn expire(&mut self) -> Option<End> {
        let timeout = self.hub.settings.options.message_timeout;
        let now = Instant::now();
        let overdue = |m: &Message| now.duration_since(m.accepted) >= timeout;
        let mut expired: Vec<Message> = Vec::new();
        let mut sent_expired = 0u64;
        let mut desync = false;
        match &mut self.pending {
            Pending::Fifo(q) => {
                while q.front().is_some_and(|(m, _)| overdue(m)) {
                    if let Some((m, _)) = q.pop_front() {
                        expired.push(m);
                        sent_expired += 1;
                        desync = true;
                    }
                }
            }
            Pending::ById {
                sent,
                blocked,
                blocked_count,
            } => {
                let ids: Vec<IdKey> = sent
                    .iter()
                    .filter(|(_, (m, _))| overdue(m))
                    .map(|(k, _)| k.clone())
                    .collect();
                for id in ids {
                    if let Some((m, _)) = sent.remove(&id) {
                        expired.push(m);
                        sent_expired += 1;
                    }
                }
                for waiting in blocked.values_mut() {
                    while let Some(pos) = waiting.iter().position(overdue) {
                        if let Some(m) = waiting.remove(pos) {
                            *blocked_count -= 1;
                            expired.push(m);
                        }
                    }
                }
                blocked.retain(|_, w| !w.is_empty());
            }
        }
        if expired.is_empty() {
            return None;
        }
        self.count_done(sent_expired);
        self.links
            .stats
            .timeouts
            .fetch_add(sent_expired, Ordering::Relaxed);
        let reason = format!("no answer within {timeout:?}");
        if sent_expired > 0 {
            self.links.member.record_passive_failure(&reason);
        }
        for m in expired {
            self.hub.fail(m, FailReason::Timeout);
        }
        // Bytes still unwritten after a whole message_timeout: the member stopped reading. The
        // connection is closed rather than letting further messages pile up behind them.
        let stuck = sent_expired > 0 && !self.wbuf.is_empty();
        (desync || stuck).then(|| {
            End::Failed(if stuck {
                format!("the member read nothing for {timeout:?}")
            } else {
                reason
            })
        })
    }

    /// After the connection ended: the messages it carried go back to the dispatcher. Returns how
    /// many had been sent and were not answered.
    fn finish(&mut self) -> u64 {
        self.set_idle(false);
        if self.ready {
            self.links.set_ready(false);
            self.ready = false;
        }
        self.report(true);
        let mut unsent: Vec<Message> = Vec::new();
        let sent: Vec<Message> =
            match std::mem::replace(&mut self.pending, Pending::Fifo(VecDeque::new())) {
                Pending::Fifo(q) => q.into_iter().map(|(m, _)| m).collect(),
                Pending::ById { sent, blocked, .. } => {
                    unsent.extend(blocked.into_values().flatten());
                    let mut v: Vec<(Message, Instant)> = sent.into_values().collect();
                    // Re-send in the order they were first sent.
                    v.sort_by_key(|(_, at)| *at);
                    v.into_iter().map(|(m, _)| m).collect()
                }
            };
        let n = sent.len() as u64;
        self.count_done(n);
        let address = self.links.member.address;
        if self.hub.is_shut() {
            // Nobody is left to answer: these messages' clients are gone.
            let gone = n + unsent.len() as u64;
            self.hub
                .messages
                .client_gone
                .fetch_add(gone, Ordering::Relaxed);
            return n;
        }
        for m in sent {
            self.hub.member_failed(m, address);
        }
        for m in unsent {
            self.hub.bounce(m, address);
        }
        n
    }
}

/// The next answer to a member's own request, when the service takes them (`member_requests`);
/// never ready otherwise.
async fn recv_origin(
    origin: &mut Option<(Arc<Client>, mpsc::UnboundedReceiver<Reply>)>,
) -> Option<Reply> {
    match origin {
        // This session holds a sender (its own `Client`), so the channel stays open.
        Some((_, rx)) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Reads and drops (counting the bytes in `dropped`) what a simplex member sent on its send-only
/// connection; an error when that connection ended (the member is up only with both halves).
fn discard(send: &TcpStream, dropped: &std::sync::atomic::AtomicU64) -> Result<(), String> {
    let mut scratch = [0u8; 4096];
    for _ in 0..READS_PER_WAKE {
        match send.try_read(&mut scratch) {
            Ok(0) => return Err("closed by the member".to_string()),
            Ok(n) => {
                dropped.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    Ok(())
}

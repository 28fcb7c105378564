//! One client connection of a message service: cut its bytes into messages, schedule each on its
//! own, and write the answers back as they come.
//!
//! Without a `sequence` the client has no way to tell answers apart, so they are written in the
//! order of its requests (answers from faster members wait for the slower ones before them). With
//! a sequence id they are written as they arrive. A message that fails leaves no answer, but no
//! gap either: the answers after it flow on.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fulcrum_config::Sequence;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::message::framing::{field_in_body, Frame};
use crate::message::hub::{Client, Hub, Message, Reply};
use crate::message::MessageService;

/// Read buffer growth step.
const READ_CHUNK: usize = 16 * 1024;

/// Keeps the dispatcher's client count while the connection lives.
struct ClientGuard<'a>(&'a Hub);

impl Drop for ClientGuard<'_> {
    fn drop(&mut self) {
        self.0.client_left();
    }
}

/// Answers waiting for earlier ones, for clients that need them in request order.
struct InOrder {
    /// Index of the first slot.
    base: u64,
    /// `None`: not answered yet; `Some(None)`: failed; `Some(Some(bytes))`: answered.
    slots: VecDeque<Option<Option<Bytes>>>,
}

/// One client connection, carried by `hub` (the dispatcher of the pool the service's rules
/// chose for it).
pub(crate) async fn serve(
    service: Arc<MessageService>,
    hub: Arc<Hub>,
    stream: TcpStream,
    peer: SocketAddr,
) {
    match service.tls.clone() {
        None => serve_io(&service, &hub, stream, peer).await,
        // Boxed: the handshake state would otherwise enlarge every plain connection's task.
        Some(tls) => {
            Box::pin(async {
                if let Some((s, _)) = tls.accept(stream, &hub.name, peer).await {
                    serve_io(&service, &hub, s, peer).await;
                }
            })
            .await
        }
    }
}

/// One client connection over a plain socket or a TLS stream (`tls` on the service).
async fn serve_io<S: AsyncRead + AsyncWrite + Unpin>(
    service: &MessageService,
    hub: &Arc<Hub>,
    mut stream: S,
    peer: SocketAddr,
) {
    let Some(_conn) = hub.stats.admit(service.max_connections) else {
        return;
    };
    hub.client_joined();
    let _client = ClientGuard(hub);
    // TCP_NODELAY comes from the listener (inherited; `tcp.nodelay` may turn it off).

    let (tx, mut rx) = mpsc::unbounded_channel::<Reply>();
    let mut c = Conn::new(service, hub, Client::new(tx, peer), peer);
    let idle = tokio::time::sleep(c.idle_timeout);
    tokio::pin!(idle);
    let mut flow = hub.flow();

    loop {
        // Back-pressure: while a member queue is full, stop reading (the client's socket buffer
        // fills and its sends block) instead of queueing more. At shutdown, stop reading for
        // good: the answers to what is in flight are written, then the connection closes.
        let now = *flow.borrow_and_update();
        if now.stopping && !c.eof {
            c.eof = true;
            tracing::debug!(service = %hub.name, client = %peer, in_flight = c.in_flight, "shutting down: reading no new message");
        }
        if !now.stopping && c.take_messages().is_err() {
            return;
        }
        // Done when the client sent its last message (or shutdown stopped reading) and every
        // answer is written; messages still waiting in the buffer are taken first.
        if c.eof && c.in_flight == 0 && (!c.parse || now.stopping) {
            break;
        }
        if c.rbuf.capacity() - c.rbuf.len() < READ_CHUNK / 4 {
            c.rbuf.reserve(READ_CHUNK);
        }
        tokio::select! {
            biased;
            reply = rx.recv() => {
                // This task holds a sender, so the channel stays open.
                let Some(reply) = reply else { break };
                if c.write_replies(reply, &mut rx, &mut stream).await.is_err() {
                    return;
                }
            }
            _ = flow.changed() => {}
            r = stream.read_buf(&mut c.rbuf), if !c.eof && !c.parse && c.in_flight < c.limit && !now.congested => {
                if c.took_read(r).is_err() {
                    return;
                }
            }
            _ = &mut idle => {
                let deadline = c.last_activity + c.idle_timeout;
                if Instant::now() >= deadline {
                    tracing::debug!(service = %hub.name, client = %peer, in_flight = c.in_flight, "idle timeout");
                    return;
                }
                idle.as_mut().reset(deadline);
            }
        }
    }
    // Every answer is written: end the connection cleanly (FIN; close_notify first over TLS).
    let _ = stream.shutdown().await;
}

/// The connection is to close at once (the reason is counted or logged where it was found).
struct Close;

/// One client connection's messages between its socket and the dispatcher.
struct Conn<'a> {
    hub: &'a Arc<Hub>,
    peer: SocketAddr,
    me: Arc<Client>,
    /// Where a message's sequence id sits, for a client whose answers are written as they
    /// arrive (async mode).
    sequence: Option<Sequence>,
    by_id: bool,
    in_order: Option<InOrder>,
    /// Messages the client may have in flight (`client_max_pending`).
    limit: usize,
    idle_timeout: Duration,
    rbuf: BytesMut,
    /// How far the framer has looked into `rbuf` for the end of the next message.
    scanned: usize,
    wbuf: Vec<u8>,
    next_index: u64,
    in_flight: usize,
    eof: bool,
    last_activity: Instant,
    /// Bytes were read that may hold messages not yet taken.
    parse: bool,
    /// `member_requests`: members' requests written to this client and not answered yet, by
    /// sequence id: the member connection that asked, and when.
    asked: HashMap<Vec<u8>, (Arc<Client>, Instant)>,
    /// `member_requests.client_field`: where this connection's name sits in its messages, and
    /// the name it gave last.
    client_field: Option<Sequence>,
    name: Option<Vec<u8>>,
}

impl<'a> Conn<'a> {
    fn new(service: &MessageService, hub: &'a Arc<Hub>, me: Arc<Client>, peer: SocketAddr) -> Self {
        let sequence = hub
            .settings
            .sequence
            .clone()
            .filter(|_| hub.settings.mode == fulcrum_config::MessageMode::Async);
        let by_id = hub.settings.by_id();
        Conn {
            hub,
            peer,
            me,
            sequence,
            by_id,
            in_order: (!by_id).then(|| InOrder {
                base: 0,
                slots: VecDeque::new(),
            }),
            limit: hub.settings.options.client_max_pending as usize,
            idle_timeout: service.idle_timeout,
            rbuf: BytesMut::new(),
            scanned: 0,
            wbuf: Vec::new(),
            next_index: 0,
            in_flight: 0,
            eof: false,
            last_activity: Instant::now(),
            parse: false,
            asked: HashMap::new(),
            client_field: hub
                .settings
                .member_requests
                .as_ref()
                .and_then(|r| r.client_field.clone()),
            name: None,
        }
    }

    /// Dispatches the messages read so far, one by one while no member queue is full and the
    /// client's own limit allows: what stays in the buffer waits (back-pressure).
    fn take_messages(&mut self) -> Result<(), Close> {
        let hub = self.hub;
        while self.parse {
            if self.in_flight >= self.limit || hub.is_congested() {
                break;
            }
            let frame = match hub.framer.parse(&self.rbuf, &mut self.scanned) {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    self.parse = false;
                    break;
                }
                Err(e) => {
                    bad_frame(hub, self.peer, e.kind(), &e.to_string());
                    return Err(Close);
                }
            };
            let id = self.message_id(&frame)?;
            let bytes = self.rbuf.split_to(frame.len).freeze();
            self.learn_name(&bytes, &frame.body);
            if let Some(asker) = self.asker_of(&bytes, id.clone()) {
                // The answer to a member's request: back to the member connection that asked.
                if asker.send(Reply::Response { index: 0, bytes }).is_err() {
                    hub.messages.originated_lost.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(service = %hub.name, client = %self.peer, "dropped an answer to a member's request: that member connection has closed");
                }
                continue;
            }
            let msg = Message::new(
                bytes,
                id,
                self.me.clone(),
                self.next_index,
                self.last_activity,
                frame.member,
            );
            if let Some(o) = &mut self.in_order {
                o.slots.push_back(None);
            }
            self.next_index += 1;
            self.in_flight += 1;
            hub.stats.requests_total.fetch_add(1, Ordering::Relaxed);
            hub.messages.requests.fetch_add(1, Ordering::Relaxed);
            hub.dispatch(msg);
        }
        Ok(())
    }

    /// Where the message's sequence id lies in it (`None` when answers go in request order).
    fn message_id(&self, frame: &Frame) -> Result<Option<Range<usize>>, Close> {
        match (&self.sequence, frame.key.clone()) {
            (_, Some(key)) if self.by_id => Ok(Some(key)),
            (None, _) if self.by_id => {
                bad_frame(
                    self.hub,
                    self.peer,
                    "malformed",
                    "the framing hook gave the message no sequence key",
                );
                Err(Close)
            }
            (Some(seq), _) => match field_in_body(&frame.body, seq.offset, seq.length) {
                Some(id) => Ok(Some(id)),
                None => {
                    bad_frame(self.hub, self.peer, "malformed", &format!(
                        "a message of {} bytes is too short for its sequence id at bytes {}..{} of the body",
                        frame.body.len(), seq.offset, seq.offset + seq.length
                    ));
                    Err(Close)
                }
            },
            (None, _) => Ok(None),
        }
    }

    /// `member_requests.client_field`: member requests naming what this connection's messages
    /// carry there come to this connection.
    fn learn_name(&mut self, bytes: &Bytes, body: &Range<usize>) {
        let Some(f) = &self.client_field else {
            return;
        };
        let Some(name) = field_in_body(body, f.offset, f.length).and_then(|r| bytes.get(r)) else {
            return;
        };
        if self.name.as_deref() != Some(name) {
            self.hub.name_client(name, &self.me);
            self.name = Some(name.to_vec());
        }
    }

    /// The member connection whose request this message answers (same sequence id), if any.
    fn asker_of(&mut self, bytes: &Bytes, id: Option<Range<usize>>) -> Option<Arc<Client>> {
        if self.asked.is_empty() {
            return None;
        }
        let id = bytes.get(id?)?;
        self.asked.remove(id).map(|(asker, _)| asker)
    }

    /// A member's request for this client: written to it as it is, and remembered so that the
    /// client's answer goes back to the member. Requests never answered are forgotten after
    /// `message_timeout`; the table holds at most `client_max_pending` of them.
    fn take_member_request(&mut self, bytes: Bytes, id: Range<usize>, asker: Arc<Client>) {
        self.wbuf.extend_from_slice(&bytes);
        let Some(key) = bytes.get(id) else {
            return;
        };
        if self.asked.len() >= self.limit {
            let timeout = self.hub.settings.options.message_timeout;
            self.asked.retain(|_, (_, at)| at.elapsed() < timeout);
            if self.asked.len() >= self.limit {
                let oldest = self
                    .asked
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.asked.remove(&k);
                }
            }
        }
        self.asked.insert(key.to_vec(), (asker, Instant::now()));
    }

    /// Takes one member's answer: written now, or held until the ones before it (in order).
    fn take_answer(&mut self, reply: Reply) {
        let reply = match reply {
            Reply::Request { bytes, id, asker } => {
                return self.take_member_request(bytes, id, asker);
            }
            other => other,
        };
        take_reply(
            reply,
            &mut self.in_order,
            &mut self.wbuf,
            &mut self.in_flight,
        );
    }

    /// Takes every answer already in the channel.
    fn take_ready(&mut self, rx: &mut mpsc::UnboundedReceiver<Reply>) {
        while let Ok(reply) = rx.try_recv() {
            self.take_answer(reply);
        }
    }

    /// Takes `first` and every other answer at hand, and writes those the client may have.
    async fn write_replies<S: AsyncWrite + Unpin>(
        &mut self,
        first: Reply,
        rx: &mut mpsc::UnboundedReceiver<Reply>,
        stream: &mut S,
    ) -> Result<(), Close> {
        self.take_answer(first);
        self.take_ready(rx);
        if self.in_flight > 0 {
            // More answers are on their way, often already readable on other member
            // connections. Yielding lets the runtime poll for them (a yielded task runs after
            // the next I/O poll), so one write carries them all: an event loop's
            // gather-then-flush, instead of one write per member connection.
            tokio::task::yield_now().await;
            self.take_ready(rx);
        }
        if !self.wbuf.is_empty() {
            self.flush_answers(stream).await?;
        }
        self.last_activity = Instant::now();
        Ok(())
    }

    async fn flush_answers<S: AsyncWrite + Unpin>(&mut self, stream: &mut S) -> Result<(), Close> {
        let (hub, peer) = (self.hub, self.peer);
        // A client that stops reading its answers is closed after idle_timeout, as HAProxy's
        // `timeout client` would: it must not hold its answers for ever. The flush matters for
        // TLS: tokio-rustls keeps sealed records it could not write at once until flushed (a
        // no-op on a plain socket).
        let write = async {
            stream.write_all(&self.wbuf).await?;
            stream.flush().await
        };
        match tokio::time::timeout(self.idle_timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(service = %hub.name, client = %peer, error = %e, "client connection failed while writing answers");
                return Err(Close);
            }
            Err(_) => {
                tracing::debug!(service = %hub.name, client = %peer, "client does not read its answers; closing");
                return Err(Close);
            }
        }
        hub.stats
            .bytes_out
            .fetch_add(self.wbuf.len() as u64, Ordering::Relaxed);
        self.wbuf.clear();
        if self.wbuf.capacity() > 256 * 1024 {
            self.wbuf = Vec::new();
        }
        Ok(())
    }

    /// Accounts for a read from the client (`r`: its outcome).
    fn took_read(&mut self, r: std::io::Result<usize>) -> Result<(), Close> {
        let (hub, peer) = (self.hub, self.peer);
        let n = match r {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(service = %hub.name, client = %peer, error = %e, "client connection failed");
                return Err(Close);
            }
        };
        if n == 0 {
            self.eof = true;
            if !self.rbuf.is_empty() {
                tracing::debug!(service = %hub.name, client = %peer, bytes = self.rbuf.len(), "client closed in the middle of a message");
            }
            return Ok(());
        }
        self.last_activity = Instant::now();
        hub.stats.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
        self.parse = true;
        Ok(())
    }
}

fn bad_frame(hub: &Hub, peer: SocketAddr, kind: &str, detail: &str) {
    let counter = if kind == "oversize" {
        &hub.messages.client_oversize
    } else {
        &hub.messages.client_malformed
    };
    counter.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(service = %hub.name, client = %peer, error = %detail, "closing client connection: bad frame");
}

fn take_reply(
    reply: Reply,
    in_order: &mut Option<InOrder>,
    wbuf: &mut Vec<u8>,
    in_flight: &mut usize,
) {
    *in_flight = in_flight.saturating_sub(1);
    let Some(o) = in_order else {
        if let Reply::Response { bytes, .. } = reply {
            wbuf.extend_from_slice(&bytes);
        }
        return;
    };
    let (index, answer) = match reply {
        Reply::Response { index, bytes } => (index, Some(bytes)),
        Reply::Failed { index } => (index, None),
        // Taken by `Conn::take_answer` before.
        Reply::Request { .. } => return,
    };
    if let Some(slot) = index
        .checked_sub(o.base)
        .and_then(|i| o.slots.get_mut(i as usize))
    {
        *slot = Some(answer);
    }
    while let Some(Some(_)) = o.slots.front() {
        if let Some(Some(Some(bytes))) = o.slots.pop_front() {
            wbuf.extend_from_slice(&bytes);
        }
        o.base += 1;
    }
}

//! The streams of one HTTP/2 client connection, driven by the connection's own task (`h2`):
//! each stream is a `StreamTask` in the connection's `FuturesUnordered`, not a task of its own.
//! A stream first runs its handler (the request through the rules to a member or a local
//! answer), then sends the response head and pipes the body into h2's send stream within the
//! client's flow-control window.
//!
//! What a task per stream (hyper's server) cost and this does not: a spawn and a teardown per
//! stream, a waker and a scheduler round per wake, and a cross-task body pipe. A client
//! holding its window at zero is found by the connection's sweep (`sweep`), which looks at the
//! streams in place: no shared slot, lock or timer per stream.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use fulcrum_balance::clock;
use h2::server::SendResponse;
use h2::{Reason, SendStream};
use http::header::{self, HeaderMap, HeaderValue};
use http::Response;
use http_body::Body;

use crate::body::DownBody;

/// A `drop = true` rule on an HTTP/2 stream: the stream is reset, the connection goes on.
#[derive(Debug)]
pub(crate) struct Dropped;

/// A stream's handler: the response, or `Dropped`. It borrows the connection's state, which
/// outlives every stream.
pub(crate) type Handler<'a> =
    Pin<Box<dyn Future<Output = Result<Response<DownBody>, Dropped>> + Send + 'a>>;

/// How a stream ended, for the connection's accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamEnd {
    /// Answered (or reset by Fulcrum, or by the client once the answer was under way).
    Answered,
    /// Reset by the client before its response head: the handler, and the member exchange
    /// with it, was dropped. These count against the connection's reset budget.
    Cancelled,
}

/// One stream of a client connection.
pub(crate) struct StreamTask<'a> {
    respond: SendResponse<Bytes>,
    phase: Phase<'a>,
}

enum Phase<'a> {
    Handling(Handler<'a>),
    Body(Pipe),
    Done,
}

/// A stream's handler future, built in its heap slot: `Box::pin(make())` builds it on the
/// stack and then copies it (a few KiB: the size of its largest state, not of what it holds
/// when created) into the allocation, once per stream. Writing into an allocation that
/// already exists lets the compiler construct it there.
pub(crate) fn boxed_in_place<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let mut slot = Box::<F>::new_uninit();
    slot.write(make());
    // SAFETY: `write` initialised the whole slot just above; nothing reads it before.
    Box::into_pin(unsafe { slot.assume_init() })
}

impl<'a> StreamTask<'a> {
    pub(crate) fn new(respond: SendResponse<Bytes>, handler: Handler<'a>) -> StreamTask<'a> {
        StreamTask {
            respond,
            phase: Phase::Handling(handler),
        }
    }

    /// When its response body is in flight: since when it has yielded nothing (clock::now_ms),
    /// as far as the sweeps saw. A body that yielded since the last sweep starts afresh now.
    fn progress(&mut self, now: u64) -> Option<u64> {
        match &mut self.phase {
            Phase::Body(p) if p.body.is_some() => {
                if p.progress == MOVED {
                    p.progress = now;
                }
                Some(p.progress)
            }
            _ => None,
        }
    }

    /// Drops the response body (and the member connection it holds), resets the stream and
    /// wakes the task so that it ends.
    fn stall(&mut self) {
        if let Phase::Body(p) = &mut self.phase {
            p.body = None;
            p.tx.send_reset(Reason::INTERNAL_ERROR);
            if let Some(w) = p.waker.take() {
                w.wake();
            }
        }
    }
}

impl Future for StreamTask<'_> {
    type Output = StreamEnd;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<StreamEnd> {
        let this = self.get_mut();
        loop {
            match &mut this.phase {
                Phase::Handling(handler) => {
                    let response = match handler.as_mut().poll(cx) {
                        Poll::Ready(Ok(r)) => r,
                        Poll::Ready(Err(Dropped)) => {
                            this.respond.send_reset(Reason::INTERNAL_ERROR);
                            this.phase = Phase::Done;
                            return Poll::Ready(StreamEnd::Answered);
                        }
                        Poll::Pending => {
                            // A RST_STREAM from the client while the answer is prepared: the
                            // handler is dropped, and the member exchange with it.
                            if this.respond.poll_reset(cx).is_ready() {
                                this.phase = Phase::Done;
                                return Poll::Ready(StreamEnd::Cancelled);
                            }
                            return Poll::Pending;
                        }
                    };
                    let (parts, body) = response.into_parts();
                    let eos = body.is_end_stream();
                    let head = response_head(parts, &body, eos);
                    match this.respond.send_response(head, eos) {
                        Ok(tx) if !eos => this.phase = Phase::Body(Pipe::new(tx, body)),
                        Ok(_) => {
                            this.phase = Phase::Done;
                            return Poll::Ready(StreamEnd::Answered);
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "HTTP/2 response head not sent");
                            this.respond.send_reset(Reason::INTERNAL_ERROR);
                            this.phase = Phase::Done;
                            return Poll::Ready(StreamEnd::Answered);
                        }
                    }
                }
                Phase::Body(pipe) => {
                    std::task::ready!(pipe.poll(cx));
                    this.phase = Phase::Done;
                    return Poll::Ready(StreamEnd::Answered);
                }
                Phase::Done => return Poll::Ready(StreamEnd::Answered),
            }
        }
    }
}

/// The response head as h2 sends it: the fields HTTP/2 forbids removed, `date` when the
/// answer has none, and `content-length` when the body knows its length (as hyper's server
/// did).
fn response_head(parts: http::response::Parts, body: &DownBody, eos: bool) -> http::Response<()> {
    let mut head = Response::from_parts(parts, ());
    let fields = head.headers_mut();
    // One pass over the names; the plan never writes these, so removing is the rare case.
    if fields.keys().any(is_connection_field) {
        strip_connection_fields(fields);
    }
    if !fields.contains_key(header::DATE) {
        fields.insert(header::DATE, crate::date::http_date_value());
    }
    if !eos && !fields.contains_key(header::CONTENT_LENGTH) {
        if let Some(n) = body.size_hint().exact() {
            fields.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
    head
}

fn is_connection_field(name: &header::HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::TE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Connection-specific fields are malformed in HTTP/2 (RFC 9113 §8.2.2); h2 would refuse the
/// whole head.
fn strip_connection_fields(fields: &mut HeaderMap) {
    if let Some(listed) = fields.remove(header::CONNECTION) {
        if let Ok(listed) = listed.to_str() {
            for name in listed.split(',') {
                fields.remove(name.trim());
            }
        }
    }
    for name in [
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TE,
        header::HeaderName::from_static("keep-alive"),
        header::HeaderName::from_static("proxy-connection"),
    ] {
        fields.remove(name);
    }
}

/// `Pipe::progress` when the body yielded since the last sweep: the clock is read by the
/// sweeps, not per stream or per frame (`clock::now_ms` is never 0).
const MOVED: u64 = 0;

/// A response body on its way into h2's send stream, within the client's window.
struct Pipe {
    tx: SendStream<Bytes>,
    /// `None`: taken away by the sweep.
    body: Option<DownBody>,
    /// A chunk taken from the body, waiting for window; the body is not polled meanwhile.
    buffered: Option<(Bytes, bool)>,
    /// Since when the body has yielded nothing (clock::now_ms, set by the sweeps), or `MOVED`.
    progress: u64,
    /// The task to wake when the sweep takes the body away.
    waker: Option<Waker>,
}

impl Pipe {
    fn new(tx: SendStream<Bytes>, body: DownBody) -> Pipe {
        Pipe {
            tx,
            body: Some(body),
            buffered: None,
            progress: MOVED,
            waker: None,
        }
    }

    /// Waits: for a reset by the client too, and where the sweep can wake it.
    fn park(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.tx.poll_reset(cx).is_ready() {
            return Poll::Ready(());
        }
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// `Ready` when the stream is done with: the body sent whole, or the stream reset.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let Some(body) = self.body.as_mut() else {
                return Poll::Ready(());
            };
            if let Some((_, eos)) = self.buffered {
                // Any window at all takes the whole chunk: h2 frames it as the window opens
                // (hyper's pipe does the same; claiming it all up front pins window other
                // streams could use).
                while self.tx.capacity() == 0 {
                    match self.tx.poll_capacity(cx) {
                        Poll::Pending => return self.park(cx),
                        Poll::Ready(Some(Ok(0))) => {}
                        Poll::Ready(Some(Ok(_))) => break,
                        Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                    }
                }
                let Some((data, _)) = self.buffered.take() else {
                    continue;
                };
                if self.tx.send_data(data, eos).is_err() || eos {
                    return Poll::Ready(());
                }
                continue;
            }
            match Pin::new(body).poll_frame(cx) {
                Poll::Pending => return self.park(cx),
                Poll::Ready(Some(Ok(frame))) => {
                    self.progress = MOVED;
                    match frame.into_data() {
                        Ok(data) => {
                            let eos = self.body.as_ref().is_none_or(|b| b.is_end_stream());
                            // The last chunk goes to h2 at once, which sends it as the window
                            // opens: the body is done (its member connection released), so
                            // nothing is held for a slow reader but this chunk, as when it
                            // waited here. Most responses are one chunk.
                            if data.is_empty() || eos {
                                if self.tx.send_data(data, eos).is_err() || eos {
                                    return Poll::Ready(());
                                }
                                continue;
                            }
                            self.tx.reserve_capacity(1);
                            self.buffered = Some((data, eos));
                        }
                        Err(frame) => {
                            if let Ok(trailers) = frame.into_trailers() {
                                self.tx.reserve_capacity(0);
                                let _ = self.tx.send_trailers(trailers);
                                return Poll::Ready(());
                            }
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!(error = %e, "HTTP/2 response body failed; stream reset");
                    self.tx.send_reset(Reason::INTERNAL_ERROR);
                    return Poll::Ready(());
                }
                Poll::Ready(None) => {
                    let _ = self.tx.send_data(Bytes::new(), true);
                    return Poll::Ready(());
                }
            }
        }
    }
}

/// What one sweep of a connection's streams found.
pub(crate) struct Sweep {
    /// Response bodies taken away now for making no progress within the timeout.
    pub stalled: usize,
}

/// Takes away every response body that yielded nothing for `limit_ms`: a client holding its
/// window at zero is never sent more, so the body is never polled again and its own idle
/// timer (the member connection's) never runs; the member connection would stay taken for
/// as long as the client likes.
pub(crate) fn sweep<'s, 'a: 's>(
    streams: impl Iterator<Item = &'s mut StreamTask<'a>>,
    limit_ms: u64,
) -> Sweep {
    let now = clock::now_ms();
    let mut out = Sweep { stalled: 0 };
    for s in streams {
        if s.progress(now)
            .is_some_and(|p| now.saturating_sub(p) >= limit_ms)
        {
            s.stall();
            out.stalled += 1;
        }
    }
    out
}

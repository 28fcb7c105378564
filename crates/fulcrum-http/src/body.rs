//! Bodies that cross HTTP/2 (Fulcrum's h2 server for clients, hyper's client for members with
//! `http2 = true`): a request body sent to an HTTP/2 member, and a response body streamed from a
//! member to an HTTP/2 client.
//! HTTP/1.1 to HTTP/1.1 never goes through these: it moves bytes between sockets directly.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use fulcrum_balance::{clock, Member, RequestGuard};
use fulcrum_net::ServiceStats;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use parking_lot::Mutex;
use tokio::time::Sleep;

use crate::chunked::Decoder;
use crate::upstream::{MemberConns, UpstreamConn};

pub use crate::{BoxError, FramePoll};

/// How a member frames its response body.
#[derive(Debug)]
pub enum InFraming {
    None,
    Length(u64),
    Chunked(Decoder),
    Close,
}

/// Member connections private to one HTTP/2 client connection (`reuse = "never"`).
pub type PrivateConns = Arc<Mutex<Vec<(Arc<Member>, UpstreamConn)>>>;

/// Where a member connection goes when its response is complete.
pub struct Release {
    /// The service's counters.
    pub stats: Arc<ServiceStats>,
    /// The member's shared idle store (when the connection is not private).
    pub store: Option<Arc<MemberConns>>,
    pub member: Arc<Member>,
    pub private: Option<PrivateConns>,
    /// The response allows the connection to be reused.
    pub reusable: bool,
    /// Bytes of the request sent to the member.
    pub sent: u64,
}

/// A response body streamed from an HTTP/1.1 member connection to an HTTP/2 client.
pub struct MemberBody {
    conn: Option<UpstreamConn>,
    framing: InFraming,
    release: Release,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    /// Bytes from the member not yet added to its counters (they are added in batches while
    /// the body flows, and the rest at the end).
    received: u64,
    delivered: u64,
    _request: RequestGuard,
}

impl MemberBody {
    pub fn new(
        conn: UpstreamConn,
        framing: InFraming,
        release: Release,
        idle: Duration,
        request: RequestGuard,
    ) -> MemberBody {
        let received = conn.buf.len() as u64;
        MemberBody {
            conn: Some(conn),
            framing,
            release,
            idle,
            timer: None,
            received,
            delivered: 0,
            _request: request,
        }
    }

    fn finish(&mut self, clean: bool) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let r = &self.release;
        r.member.stats.add_bytes(r.sent, self.received);
        r.stats.bytes_in.fetch_add(r.sent, Ordering::Relaxed);
        r.stats
            .bytes_out
            .fetch_add(self.delivered, Ordering::Relaxed);
        if !clean {
            r.member
                .record_passive_failure("the response body was cut short");
            return;
        }
        if !(r.reusable && conn.buf.is_empty()) {
            return;
        }
        conn.guard = None;
        conn.last_ok_ms = clock::now_ms();
        match &r.private {
            Some(p) => p.lock().push((r.member.clone(), conn)),
            None => {
                if let Some(store) = &r.store {
                    store.put(conn);
                }
            }
        }
    }

    /// Takes what the buffer holds as the next data frame, if any; `done` when the body ended.
    fn take_buffered(&mut self) -> Result<(Option<Bytes>, bool), io::Error> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok((None, true));
        };
        let buf = &mut conn.buf;
        let (data, consumed, done) = match &mut self.framing {
            InFraming::None => (None, 0, true),
            InFraming::Length(rem) => {
                let n = (buf.len() as u64).min(*rem) as usize;
                *rem -= n as u64;
                let data = (n > 0).then(|| Bytes::copy_from_slice(&buf[..n]));
                (data, n, *rem == 0)
            }
            InFraming::Chunked(d) => {
                let mut out = Vec::new();
                let used = d
                    .feed(buf, |data| out.extend_from_slice(data))
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                let data = (!out.is_empty()).then(|| Bytes::from(out));
                (data, used, d.is_done())
            }
            InFraming::Close => {
                let n = buf.len();
                ((n > 0).then(|| Bytes::copy_from_slice(buf)), n, false)
            }
        };
        if consumed == buf.len() {
            buf.clear();
        } else {
            buf.drain(..consumed);
        }
        Ok((data, done))
    }
}

impl Drop for MemberBody {
    fn drop(&mut self) {
        // A client that reset its stream: the member connection is not in a known state.
        if self.conn.is_some() {
            let r = &self.release;
            r.member.stats.add_bytes(r.sent, self.received);
            r.stats
                .bytes_out
                .fetch_add(self.delivered, Ordering::Relaxed);
        }
    }
}

impl Body for MemberBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        loop {
            let (data, done) = match this.take_buffered() {
                Ok(x) => x,
                Err(e) => {
                    this.finish(false);
                    return Poll::Ready(Some(Err(e)));
                }
            };
            if done {
                this.finish(true);
            }
            if let Some(d) = data {
                this.delivered += d.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(d))));
            }
            if done {
                return Poll::Ready(None);
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            conn.buf.reserve(32 * 1024);
            match conn.io.poll_read_buf(cx, &mut conn.buf) {
                Poll::Pending => {
                    let idle = this.idle;
                    let timer = this
                        .timer
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                    if timer.as_mut().poll(cx).is_ready() {
                        this.finish(false);
                        return Poll::Ready(Some(Err(io::ErrorKind::TimedOut.into())));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Ok(0)) => {
                    let clean = matches!(this.framing, InFraming::Close);
                    this.finish(clean);
                    if clean {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(io::ErrorKind::UnexpectedEof.into())));
                }
                Poll::Ready(Ok(n)) => {
                    this.received += n as u64;
                    this.release
                        .member
                        .stats
                        .add_live(&mut 0, &mut this.received);
                    if let Some(t) = this.timer.as_mut() {
                        t.as_mut().reset(tokio::time::Instant::now() + this.idle);
                    }
                }
                Poll::Ready(Err(e)) => {
                    this.finish(false);
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || matches!(self.framing, InFraming::None | InFraming::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.framing {
            InFraming::Length(n) => SizeHint::with_exact(*n),
            InFraming::None => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// A response body from an HTTP/2 member, passed through with its accounting.
pub struct Relay {
    pub inner: Incoming,
    pub member: Arc<Member>,
    pub stats: Arc<ServiceStats>,
    /// Request body bytes sent (counted as the body goes out, `UpBody::Counted`).
    pub sent: Arc<AtomicU64>,
    pub received: u64,
    /// Of `received`, the bytes already added to the member's counters while the body flowed.
    pub reported: u64,
    pub finished: bool,
    pub _request: RequestGuard,
    pub _connection: fulcrum_balance::ConnectionGuard,
}

impl Relay {
    fn account(&mut self) {
        if !self.finished {
            self.finished = true;
            let sent = self.sent.load(Ordering::Relaxed);
            self.member
                .stats
                .add_bytes(sent, self.received - self.reported);
            self.stats.bytes_in.fetch_add(sent, Ordering::Relaxed);
            self.stats
                .bytes_out
                .fetch_add(self.received, Ordering::Relaxed);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.account();
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let this = self.get_mut();
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    this.received += d.len() as u64;
                    let mut pending = this.received - this.reported;
                    this.member.stats.add_live(&mut 0, &mut pending);
                    this.reported = this.received - pending;
                }
                Poll::Ready(Some(Ok(f)))
            }
            Some(Err(e)) => {
                this.member
                    .record_passive_failure(&format!("HTTP/2 response body: {e}"));
                this.account();
                Poll::Ready(Some(Err(e.into())))
            }
            None => {
                this.account();
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body for an HTTP/2 client.
pub enum DownBody {
    Full(Option<Bytes>),
    Member(Box<MemberBody>),
    Relay(Box<Relay>),
    /// Any of the above through a body filter: the cache (a stored body, or a member's while
    /// it is stored), compression (both written once for both client protocols).
    Filtered(UnsyncBoxBody<Bytes, BoxError>),
}

impl DownBody {
    /// `body` as a response body (a filter's output).
    pub fn filtered<B>(body: B) -> DownBody
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + 'static,
    {
        DownBody::Filtered(UnsyncBoxBody::new(body))
    }
}

impl Body for DownBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        match self.get_mut() {
            DownBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            DownBody::Member(m) => Pin::new(m.as_mut()).poll_frame(cx).map_err(Into::into),
            DownBody::Relay(r) => Pin::new(r.as_mut()).poll_frame(cx),
            DownBody::Filtered(f) => Pin::new(f).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            DownBody::Full(b) => b.is_none(),
            DownBody::Member(m) => m.is_end_stream(),
            DownBody::Relay(r) => r.is_end_stream(),
            DownBody::Filtered(f) => f.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            DownBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            DownBody::Member(m) => m.size_hint(),
            DownBody::Relay(r) => r.size_hint(),
            DownBody::Filtered(f) => f.size_hint(),
        }
    }
}

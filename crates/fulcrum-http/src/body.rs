//! Bodies that cross hyper's HTTP/2 (client side, or members with `http2 = true`): a request body
//! sent to an HTTP/2 member, and a response body streamed from a member to an HTTP/2 client.
//! HTTP/1.1 to HTTP/1.1 never goes through these: it moves bytes between sockets directly.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use fulcrum_balance::{clock, Member, RequestGuard};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Sleep;

use crate::chunked::Decoder;
use crate::service::{HttpService, Target};
use crate::upstream::UpstreamConn;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a member frames its response body.
#[derive(Debug)]
pub enum InFraming {
    None,
    Length(u64),
    Chunked(Decoder),
    Close,
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
    Limited(Box<crate::h2guard::Limited>),
}

impl Body for UpBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Empty => true,
            UpBody::Full(b) => b.is_none(),
            UpBody::Channel(_) => false,
            UpBody::Incoming(b) => b.is_end_stream(),
            UpBody::Limited(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpBody::Empty => SizeHint::with_exact(0),
            UpBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            UpBody::Channel(_) => SizeHint::default(),
            UpBody::Incoming(b) => b.size_hint(),
            UpBody::Limited(b) => b.size_hint(),
        }
    }
}

/// Member connections private to one HTTP/2 client connection (`reuse = "never"`).
pub type PrivateConns = Arc<Mutex<Vec<(Arc<Member>, UpstreamConn)>>>;

/// Where a member connection goes when its response is complete.
pub struct Release {
    pub svc: Arc<HttpService>,
    pub target: Arc<Target>,
    pub member_index: usize,
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
        r.svc.stats.bytes_in.fetch_add(r.sent, Ordering::Relaxed);
        r.svc
            .stats
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
                if let Some(store) = r.target.conns.get(r.member_index) {
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
            r.svc
                .stats
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
    pub svc: Arc<HttpService>,
    pub sent: u64,
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
            self.member
                .stats
                .add_bytes(self.sent, self.received - self.reported);
            self.svc
                .stats
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

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
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
    /// From the cache, or from a member while being stored.
    Cache(Box<crate::cache::CacheBody>),
    /// Either of the above, compressed on the way (`compression`).
    Compressed(Box<crate::compress::CompressBody>),
    /// Any of the above under the HTTP/2 progress watchdog.
    Watched(Box<crate::h2guard::Watched>),
}

impl Body for DownBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            DownBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            DownBody::Member(m) => Pin::new(m.as_mut()).poll_frame(cx).map_err(Into::into),
            DownBody::Relay(r) => Pin::new(r.as_mut()).poll_frame(cx),
            DownBody::Cache(c) => Pin::new(c.as_mut()).poll_frame(cx),
            DownBody::Compressed(c) => Pin::new(c.as_mut()).poll_frame(cx),
            DownBody::Watched(w) => Pin::new(w.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            DownBody::Full(b) => b.is_none(),
            DownBody::Member(m) => m.is_end_stream(),
            DownBody::Relay(r) => r.is_end_stream(),
            DownBody::Cache(c) => c.is_end_stream(),
            DownBody::Compressed(c) => c.is_end_stream(),
            DownBody::Watched(w) => w.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            DownBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            DownBody::Member(m) => m.size_hint(),
            DownBody::Relay(r) => r.size_hint(),
            DownBody::Cache(c) => c.size_hint(),
            DownBody::Compressed(c) => c.size_hint(),
            DownBody::Watched(w) => w.size_hint(),
        }
    }
}

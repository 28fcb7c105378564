//! The `max_body_size` / `min_body_rate` limits on the request bodies of HTTP/2 clients.
//!
//! The HTTP/1 path counts body bytes as it relays them; an HTTP/2 request body without
//! `content-length` (or one arriving slowly) arrives as h2's DATA frames (`RecvBody`), which
//! have no size or rate limit of their own.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, SizeHint};
use http_body_util::Full;
use tokio::time::{Instant, Sleep};

use crate::{BoxError, FramePoll};

/// An HTTP/2 client's request body: streamed as it arrives, or whole (read before the rules
/// when a filter reads request bodies, and what the filters left of it).
pub enum ClientBody {
    Streamed(RecvBody),
    Whole(Full<Bytes>),
}

/// A request body as h2 receives it: DATA frames, then trailers. Each frame's bytes are given
/// back to the client's flow-control window as they are taken, as hyper's `Incoming` did.
pub struct RecvBody {
    recv: h2::RecvStream,
    /// What `content-length` announced and is still to come (h2 itself refuses a body that
    /// differs from it).
    remaining: Option<u64>,
    data_done: bool,
}

impl RecvBody {
    pub(crate) fn new(recv: h2::RecvStream) -> RecvBody {
        RecvBody {
            recv,
            remaining: None,
            data_done: false,
        }
    }

    /// Sets the length the request head announced.
    pub(crate) fn announce(&mut self, length: Option<u64>) {
        self.remaining = length;
    }
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let this = self.get_mut();
        if !this.data_done {
            match std::task::ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    if let Some(r) = this.remaining.as_mut() {
                        *r = r.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
                }
                // RST_STREAM(NO_ERROR) is the client taking an early response (RFC 9113
                // §8.1): the body ends, it did not fail.
                Some(Err(e)) if e.reason() == Some(h2::Reason::NO_ERROR) => {
                    return Poll::Ready(None)
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => this.data_done = true,
            }
        }
        match std::task::ready!(this.recv.poll_trailers(cx)) {
            Ok(t) => Poll::Ready(t.map(|t| Ok(http_body::Frame::trailers(t)))),
            Err(e) if e.reason() == Some(h2::Reason::NO_ERROR) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.remaining
            .map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        match self.get_mut() {
            ClientBody::Streamed(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            ClientBody::Whole(b) => Pin::new(b).poll_frame(cx).map_err(|e| match e {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Streamed(b) => b.is_end_stream(),
            ClientBody::Whole(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Streamed(b) => b.size_hint(),
            ClientBody::Whole(b) => b.size_hint(),
        }
    }
}

/// Why a request body was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ok,
    /// Past `max_body_size`.
    TooLarge,
    /// Slower than `min_body_rate`.
    TooSlow,
}

/// An HTTP/2 client's request body under the service's `max_body_size` and `min_body_rate`,
/// measured the way the HTTP/1 path measures them: the time spent waiting for the client may
/// not exceed a grace (`header_timeout`) plus what the bytes received buy at `min_body_rate`.
pub struct Limited {
    inner: ClientBody,
    max: Option<u64>,
    rate: u64,
    grace: Duration,
    received: u64,
    waited: Duration,
    /// Since when the body has been waited for (set while the client owes bytes).
    asked: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
    verdict: Arc<AtomicU8>,
}

impl Limited {
    pub(crate) fn new(inner: ClientBody, max: Option<u64>, rate: u64, grace: Duration) -> Limited {
        Limited {
            inner,
            max,
            rate,
            grace,
            received: 0,
            waited: Duration::ZERO,
            asked: None,
            timer: None,
            verdict: Arc::new(AtomicU8::new(0)),
        }
    }

    /// Reads the verdict once the body was consumed (the body may be gone by then).
    pub(crate) fn verdict_handle(&self) -> VerdictHandle {
        VerdictHandle(self.verdict.clone())
    }

    fn cut(&mut self, v: Verdict) -> BoxError {
        self.verdict.store(v as u8, Ordering::Relaxed);
        Box::new(BodyCut(v))
    }
}

/// Shared view of a `Limited` body's verdict.
#[derive(Clone)]
pub(crate) struct VerdictHandle(Arc<AtomicU8>);

impl VerdictHandle {
    pub(crate) fn get(&self) -> Verdict {
        match self.0.load(Ordering::Relaxed) {
            1 => Verdict::TooLarge,
            2 => Verdict::TooSlow,
            _ => Verdict::Ok,
        }
    }
}

#[derive(Debug)]
struct BodyCut(Verdict);

impl std::fmt::Display for BodyCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Verdict::TooLarge => f.write_str("request body larger than max_body_size"),
            Verdict::TooSlow => f.write_str("request body slower than min_body_rate"),
            Verdict::Ok => f.write_str("request body cut"),
        }
    }
}

impl std::error::Error for BodyCut {}

impl Body for Limited {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let this = self.get_mut();
        let asked = *this.asked.get_or_insert_with(Instant::now);
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this.rate == 0 {
                    return Poll::Pending;
                }
                let earned =
                    this.grace + Duration::from_secs_f64(this.received as f64 / this.rate as f64);
                let deadline = asked + earned.saturating_sub(this.waited);
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(this.cut(Verdict::TooSlow))));
                }
                Poll::Pending
            }
            Poll::Ready(r) => {
                this.waited += asked.elapsed();
                this.asked = None;
                match r {
                    Some(Ok(f)) => {
                        if let Some(d) = f.data_ref() {
                            this.received += d.len() as u64;
                            if this.max.is_some_and(|m| this.received > m) {
                                return Poll::Ready(Some(Err(this.cut(Verdict::TooLarge))));
                            }
                        }
                        Poll::Ready(Some(Ok(f)))
                    }
                    Some(Err(e)) => Poll::Ready(Some(Err(e))),
                    None => Poll::Ready(None),
                }
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

//! Guards on HTTP/2 streams that hyper cannot give: an I/O-progress watchdog on response bodies
//! and the `max_body_size` / `min_body_rate` limits on request bodies.
//!
//! Why a watchdog: hyper polls a response body only while the client's flow-control window has
//! room. A client that holds its window at zero (never sends WINDOW_UPDATE) therefore stops the
//! body from being polled at all, so the body's own idle timer (the member connection's) never
//! runs, and the member connection stays taken for as long as the client likes. The watchdog
//! looks from outside: a response body that yielded nothing for `idle_timeout` is dropped (the
//! member connection with it) and counted; the stream fails with an error when hyper next polls
//! it (a RST_STREAM), and the connection is sent a GOAWAY.
//!
//! Why body limits here: the HTTP/1 path counts body bytes as it relays them; an HTTP/2 request
//! body without `content-length` (or one arriving slowly) goes through hyper's `Incoming`, which
//! has no size or rate limit of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use fulcrum_balance::clock;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use parking_lot::Mutex;
use tokio::time::{Instant, Sleep};

use crate::body::{BoxError, DownBody};

/// A response body the watchdog may take away.
struct Slot {
    body: Mutex<Option<DownBody>>,
    /// When the body last yielded a frame (clock::now_ms).
    progress: AtomicU64,
}

/// The response bodies in flight on one HTTP/2 client connection.
#[derive(Default)]
pub(crate) struct Watchdog {
    slots: Mutex<Vec<Weak<Slot>>>,
}

/// What one sweep found.
pub(crate) struct Sweep {
    /// Bodies still in flight that made progress within the timeout.
    pub live: usize,
    /// Bodies taken away now for making no progress within the timeout.
    pub stalled: usize,
    /// The latest progress of any body in flight (clock::now_ms), 0 when none.
    pub newest: u64,
}

impl Watchdog {
    /// Wraps a response body so the watchdog can see its progress and take it away.
    pub(crate) fn watch(&self, body: DownBody) -> DownBody {
        if matches!(body, DownBody::Full(_)) {
            // Bytes already in memory: nothing upstream to hold.
            return body;
        }
        let slot = Arc::new(Slot {
            body: Mutex::new(Some(body)),
            progress: AtomicU64::new(clock::now_ms()),
        });
        let mut slots = self.slots.lock();
        // A finished body's `Weak` still holds its slot's allocation until a sweep forgets it,
        // and sweeps come every few seconds: on a busy connection (thousands of streams a
        // second) that was hundreds of MiB (the chaos bench). Forgetting finished ones before
        // the list would grow keeps it within twice the bodies in flight, at O(1) amortised.
        if slots.len() == slots.capacity() {
            slots.retain(|w| w.strong_count() > 0);
        }
        slots.push(Arc::downgrade(&slot));
        drop(slots);
        DownBody::Watched(Box::new(Watched(slot)))
    }

    /// Drops every body that yielded nothing for `timeout`, forgetting finished ones.
    pub(crate) fn sweep(&self, timeout: Duration) -> Sweep {
        let now = clock::now_ms();
        let limit = timeout.as_millis() as u64;
        let mut out = Sweep {
            live: 0,
            stalled: 0,
            newest: 0,
        };
        let mut dropped = Vec::new();
        self.slots.lock().retain(|w| {
            let Some(slot) = w.upgrade() else {
                return false;
            };
            // Being polled right now is progress.
            let Some(mut body) = slot.body.try_lock() else {
                out.live += 1;
                out.newest = now;
                return true;
            };
            if body.is_none() {
                return false;
            }
            let last = slot.progress.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= limit {
                dropped.extend(body.take());
                out.stalled += 1;
                return false;
            }
            out.live += 1;
            out.newest = out.newest.max(last);
            true
        });
        // Dropped outside the locks: a member connection closes, counters are updated.
        drop(dropped);
        out
    }
}

/// A response body watched for progress.
pub struct Watched(Arc<Slot>);

impl Body for Watched {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let slot = &self.get_mut().0;
        let mut guard = slot.body.lock();
        let Some(body) = guard.as_mut() else {
            return Poll::Ready(Some(Err(Stalled.into())));
        };
        let r = Pin::new(body).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(_))) => slot.progress.store(clock::now_ms(), Ordering::Relaxed),
            // Finished or failed: the member connection is released by the body itself.
            Poll::Ready(_) => *guard = None,
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.0
            .body
            .lock()
            .as_ref()
            .is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.0
            .body
            .lock()
            .as_ref()
            .map_or_else(SizeHint::default, |b| b.size_hint())
    }
}

/// The error of a stream whose response made no progress within the idle timeout.
#[derive(Debug)]
struct Stalled;

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no progress on the stream within idle_timeout")
    }
}

impl std::error::Error for Stalled {}

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
    inner: Incoming,
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
    pub(crate) fn new(inner: Incoming, max: Option<u64>, rate: u64, grace: Duration) -> Limited {
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

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
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
                    Some(Err(e)) => Poll::Ready(Some(Err(e.into()))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty};

    /// Finished bodies are forgotten as new ones come, not only at the next sweep: the list
    /// stays within twice the bodies in flight (it grew by one entry per stream before).
    #[test]
    fn finished_bodies_do_not_pile_up_between_sweeps() {
        let dog = Watchdog::default();
        let held: Vec<DownBody> = (0..10)
            .map(|_| {
                dog.watch(DownBody::filtered(
                    Empty::<Bytes>::new().map_err(|e| match e {}),
                ))
            })
            .collect();
        for _ in 0..100_000 {
            drop(dog.watch(DownBody::filtered(
                Empty::<Bytes>::new().map_err(|e| match e {}),
            )));
        }
        let listed = dog.slots.lock().len();
        assert!(
            listed <= 2 * held.len() + 8,
            "{listed} entries for 10 bodies in flight"
        );
        assert_eq!(dog.sweep(Duration::from_secs(60)).live, 10);
    }
}

//! An I/O-progress watchdog on the response bodies of HTTP/2 streams, which hyper cannot give.
//!
//! Why: hyper polls a response body only while the client's flow-control window has room. A
//! client that holds its window at zero (never sends WINDOW_UPDATE) therefore stops the body from
//! being polled at all, so the body's own idle timer (the member connection's) never runs, and
//! the member connection stays taken for as long as the client likes. The watchdog looks from
//! outside: a response body that yielded nothing for `idle_timeout` is dropped (the member
//! connection with it) and counted; the stream fails with an error when hyper next polls it (a
//! RST_STREAM), and the connection is sent a GOAWAY.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use fulcrum_balance::clock;
use http_body::{Body, SizeHint};
use parking_lot::Mutex;

use crate::body::DownBody;
use crate::{BoxError, FramePoll};

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
        DownBody::filtered(Watched(slot))
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

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
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

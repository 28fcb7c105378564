//! Counters of message services: per service (kept across reloads by name) and per member
//! connection set. All atomics; the metrics endpoint reads them live.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the latency histogram's buckets; the last bucket is +Inf.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A cumulative latency histogram in Prometheus' shape, lock-free.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl LatencyHistogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// (upper bound, count in that bucket alone) per bucket, ending with +Inf: the encoder
    /// of `/metrics` accumulates them.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let bound = LATENCY_BUCKETS.get(i).copied().unwrap_or(f64::INFINITY);
                (bound, b.load(Ordering::Relaxed))
            })
            .collect()
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// Why a message failed without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// No member could take it.
    NoMember,
    /// No answer within `message_timeout`.
    Timeout,
    /// Its member connection died and it may not be sent again (at_most_once, or max_attempts).
    MemberFailed,
}

impl FailReason {
    pub const ALL: [FailReason; 3] = [
        FailReason::NoMember,
        FailReason::Timeout,
        FailReason::MemberFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::NoMember => "no_member",
            FailReason::Timeout => "timeout",
            FailReason::MemberFailed => "member_failed",
        }
    }
}

/// Message counters of one virtual service.
#[derive(Debug, Default)]
pub struct MessageStats {
    /// Messages received from clients.
    pub requests: AtomicU64,
    /// Answers delivered to the client that asked.
    pub responses: AtomicU64,
    /// Sends to another member after a member connection died with the message unanswered.
    pub redispatched: AtomicU64,
    failed: [AtomicU64; 3],
    /// Answers whose client connection had closed before they came back.
    pub client_gone: AtomicU64,
    /// Times client connections were paused because a member queue reached `member_queue`
    /// (back-pressure).
    pub paused: AtomicU64,
    /// Client connections closed for a frame beyond max_message / with a malformed length.
    pub client_oversize: AtomicU64,
    pub client_malformed: AtomicU64,
    /// Member connections closed for a bad frame from the member.
    pub member_bad_frames: AtomicU64,
    /// Requests members sent of their own (`member_requests`).
    pub originated: AtomicU64,
    /// Of those, handed to a named client connection or to the fallback pool.
    pub originated_delivered: AtomicU64,
    /// Of those, dropped: no client connection of that name and no fallback pool.
    pub originated_undeliverable: AtomicU64,
    /// Answers to members' requests written back to the member that asked.
    pub originated_answered: AtomicU64,
    /// Connections to `simplex.receive_listen` from an IP that is no member's (closed).
    pub receive_refused: AtomicU64,
    /// Answers of clients to members' requests whose member connection had closed (dropped).
    pub originated_lost: AtomicU64,
    /// Bytes simplex members sent on their send-only connections (read and dropped).
    pub simplex_send_dropped_bytes: AtomicU64,
    /// From a message's arrival to its answer being handed to the client connection.
    pub latency: LatencyHistogram,
}

impl MessageStats {
    pub fn count_failure(&self, reason: FailReason) {
        self.failed[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn failed(&self, reason: FailReason) -> u64 {
        self.failed[reason as usize].load(Ordering::Relaxed)
    }

    /// Messages received and not answered, failed or abandoned yet. Derived from the totals, so
    /// the hot path updates no shared gauge.
    pub fn in_flight(&self) -> u64 {
        let done = self.responses.load(Ordering::Relaxed)
            + self.client_gone.load(Ordering::Relaxed)
            + FailReason::ALL.iter().map(|r| self.failed(*r)).sum::<u64>();
        self.requests.load(Ordering::Relaxed).saturating_sub(done)
    }
}

/// Message counters of one member, as one service uses it.
#[derive(Debug, Default)]
pub struct MemberMessageStats {
    /// Messages written to the member (re-sends included).
    pub sent: AtomicU64,
    /// Answers from the member matched to a waiting message.
    pub responses: AtomicU64,
    /// Messages sent and not answered yet.
    pub in_flight: AtomicU64,
    /// Answers that matched no waiting message (dropped).
    pub orphans: AtomicU64,
    /// Messages that waited longer than message_timeout for this member.
    pub timeouts: AtomicU64,
    /// Member connections open now.
    pub connections: AtomicU64,
}

//! Schedulers: pure choices over member views. No I/O and no lock on the pick path; derived
//! state (interleaved sequences, Maglev tables) is rebuilt off the hot path and swapped in whole.

mod least;
mod maglev;
mod sequence;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use fulcrum_config::Algorithm;

pub use least::{FirstAvailable, LeastLoad};
pub use maglev::{Maglev, MaglevTable, MAGLEV_TABLE_SIZE};
pub use sequence::{interleave, PriorityGroups, Sequence};

use crate::member::Member;

/// What a data plane knows about the client when it asks for a member.
#[derive(Debug, Clone, Copy, Default)]
pub struct PickContext {
    /// The key for `algorithm = "hash"`, computed by the data plane from the pool's `hash_key`
    /// (see `crate::hash`). `None` when the request lacks it: the pool then round-robins.
    pub hash: Option<u64>,
}

/// Member data a scheduler rebuilds its derived state from.
#[derive(Debug, Clone, Default)]
pub struct RebuildInput {
    /// Effective weights in 1/`WEIGHT_SCALE` units (weight × agent % × slow-start ramp, or the
    /// algorithm's own dynamic weight), one per member, in pool order.
    pub weights: Vec<u32>,
    /// Priorities, for the priority algorithm.
    pub priorities: Vec<i32>,
    /// Stable member names (addresses), for consistent hashing.
    pub names: Vec<String>,
    /// Weights without the slow-start ramp, for consistent hashing (a warming member must not
    /// move keys back and forth).
    pub stable_weights: Vec<u32>,
}

/// One scheduling algorithm. `ok(i)` tells whether member `i` may take a new client now (health,
/// admin state, connection limit, slow-start recovery, and not already tried by this request).
pub trait Scheduler: Send + Sync {
    /// Rebuilds derived state after weights or membership changed.
    fn rebuild(&self, input: &RebuildInput);
    fn pick(
        &self,
        members: &[Arc<Member>],
        ctx: &PickContext,
        ok: &dyn Fn(usize) -> bool,
    ) -> Option<usize>;
    /// Whether the algorithm needs effective weights refreshed often (dynamic weights).
    fn dynamic(&self) -> bool {
        false
    }
}

/// The scheduler for a pool's algorithm.
pub fn for_algorithm(algorithm: Algorithm, min_active: u32) -> Box<dyn Scheduler> {
    match algorithm {
        Algorithm::RoundRobin | Algorithm::WeightedRoundRobin
        // Link algorithms place flows through `shares`; a pick (the API, tests) is weighted.
        | Algorithm::BandwidthRatio
        | Algorithm::Proximity
        | Algorithm::Rtt
        | Algorithm::Spillover => Box::new(Sequence::default()),
        Algorithm::DynamicFeedback | Algorithm::FastestResponse => Box::new(Sequence::dynamic()),
        Algorithm::LeastConnections | Algorithm::WeightedLeastConnections => {
            Box::new(LeastLoad::connections())
        }
        Algorithm::WeightedLeastTraffic => Box::new(LeastLoad::traffic()),
        Algorithm::Hash => Box::new(Maglev::default()),
        Algorithm::Priority => Box::new(PriorityGroups::new(min_active)),
        Algorithm::FirstAvailable => Box::new(FirstAvailable),
        Algorithm::LeastRequest => Box::new(LeastLoad::requests()),
    }
}

/// Whether the algorithm ignores configured weights (every member counts as weight 1).
pub fn unweighted(algorithm: Algorithm) -> bool {
    // One list, shared with `fulcrum check`'s refusal of weight readings such a pool ignores.
    algorithm.ignores_weights()
}

/// Round robin over the `n` members `usable` accepts. A member passed over uses up a turn of the
/// shared cursor, so one that is out hands its turns to all the others alike; scanning from a
/// rotating start instead would hand every one of them to its neighbour.
#[inline]
pub(crate) fn rotate(
    cursor: &AtomicUsize,
    n: usize,
    usable: impl Fn(usize) -> bool,
) -> Option<usize> {
    (0..n)
        .map(|_| cursor.fetch_add(1, Ordering::Relaxed) % n)
        .find(|&i| usable(i))
}

/// Walks from `start` over `n` slots and returns the first index for which `f` gives a member.
#[inline]
pub(crate) fn scan_from<T>(
    start: usize,
    n: usize,
    mut f: impl FnMut(usize) -> Option<T>,
) -> Option<T> {
    (0..n).find_map(|k| f((start + k) % n))
}

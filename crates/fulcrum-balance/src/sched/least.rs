//! Load-aware choices read live from the members' atomic counters: least connections (weighted
//! or not), least traffic, least request (power of two choices), and first available.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::{rotate, PickContext, RebuildInput, Scheduler};
use crate::member::Member;

/// What each least-load scheduler keeps between picks: the weights of the last rebuild, and the
/// round-robin cursor its scan starts from.
#[derive(Default)]
struct WeightsAndCursor {
    weights: ArcSwap<Vec<u32>>,
    cursor: AtomicUsize,
}

impl WeightsAndCursor {
    fn rebuild(&self, input: &RebuildInput) {
        self.weights.store(Arc::new(input.weights.clone()));
    }

    /// Picks the member with the lowest `load / weight` among those `ok` accepts. The scan starts
    /// at the next usable member in round robin, which wins ties: all-idle members take turns,
    /// and the turns of a member that is out spread over all the others rather than onto its
    /// neighbour.
    fn lowest_ratio(
        &self,
        n: usize,
        ok: &dyn Fn(usize) -> bool,
        load: impl Fn(usize) -> f64,
    ) -> Option<usize> {
        let weights = self.weights.load();
        let usable = |i: usize| weights.get(i).is_some_and(|&w| w > 0) && ok(i);
        let ratio = |i: usize| load(i) / f64::from(weights[i]);
        let start = rotate(&self.cursor, n, usable)?;
        let mut best = (start, ratio(start));
        for k in 1..n {
            let i = (start + k) % n;
            if usable(i) {
                let score = ratio(i);
                if score < best.1 {
                    best = (i, score);
                }
            }
        }
        Some(best.0)
    }
}

/// The lowest load per unit of weight, by one of three measures.
pub struct LeastLoad {
    state: WeightsAndCursor,
    measure: LoadMeasure,
}

enum LoadMeasure {
    /// (Weighted) least connections: the fewest active connections per unit of weight.
    /// Counting the new connection itself (`active + 1`) makes a heavier idle member win over a
    /// lighter one.
    Connections,
    /// Weighted least traffic: the lowest bytes/s EWMA per unit of weight. The EWMA lags by up
    /// to a refresh period, so each active connection also counts as the pool's average traffic
    /// per connection — otherwise every new client in a burst would pile onto the member that
    /// looked idlest at the last sample.
    Traffic,
    /// Least request by the power of two choices: two random available members, the one with
    /// fewer requests in flight per unit of weight wins. O(1) per pick at any pool size, and no
    /// herd onto one member when many proxies (or threads) decide at once.
    Requests,
}

impl LeastLoad {
    pub fn connections() -> Self {
        Self::by(LoadMeasure::Connections)
    }

    pub fn traffic() -> Self {
        Self::by(LoadMeasure::Traffic)
    }

    pub fn requests() -> Self {
        Self::by(LoadMeasure::Requests)
    }

    fn by(measure: LoadMeasure) -> Self {
        Self {
            state: WeightsAndCursor::default(),
            measure,
        }
    }

    fn least_traffic(&self, members: &[Arc<Member>], ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        let (traffic, active) = members.iter().fold((0.0, 0u64), |(t, a), m| {
            (t + m.stats.traffic_bps(), a + active_connections(m))
        });
        let per_conn = if active > 0 {
            traffic / active as f64
        } else {
            0.0
        }
        .max(1.0);
        self.state.lowest_ratio(members.len(), ok, |i| {
            let m = &members[i];
            m.stats.traffic_bps() + (active_connections(m) + 1) as f64 * per_conn
        })
    }

    fn least_request(&self, members: &[Arc<Member>], ok: &dyn Fn(usize) -> bool) -> Option<usize> {
        let n = members.len();
        let weights = self.state.weights.load();
        let usable = |i: usize| weights.get(i).copied().unwrap_or(0) > 0 && ok(i);
        let score = |i: usize| {
            (members[i].stats.active_requests.load(Ordering::Relaxed) as f64 + 1.0)
                / f64::from(weights[i])
        };
        let mut chosen: [Option<usize>; 2] = [None, None];
        for _ in 0..8 {
            let i = fastrand::usize(..n.max(1));
            if usable(i) && chosen[0] != Some(i) {
                if chosen[0].is_none() {
                    chosen[0] = Some(i);
                } else {
                    chosen[1] = Some(i);
                    break;
                }
            }
        }
        match chosen {
            [Some(a), Some(b)] => Some(if score(b) < score(a) { b } else { a }),
            [Some(a), None] => Some(a),
            // Few members are usable: fall back to round robin over them.
            _ => rotate(&self.state.cursor, n, usable),
        }
    }
}

fn active_connections(m: &Member) -> u64 {
    m.stats.active_connections.load(Ordering::Relaxed)
}

impl Scheduler for LeastLoad {
    fn rebuild(&self, input: &RebuildInput) {
        self.state.rebuild(input);
    }

    fn pick(
        &self,
        members: &[Arc<Member>],
        _: &PickContext,
        ok: &dyn Fn(usize) -> bool,
    ) -> Option<usize> {
        match self.measure {
            LoadMeasure::Connections => self.state.lowest_ratio(members.len(), ok, |i| {
                active_connections(&members[i]) as f64 + 1.0
            }),
            LoadMeasure::Traffic => self.least_traffic(members, ok),
            LoadMeasure::Requests => self.least_request(members, ok),
        }
    }
}

/// The first member, in configuration order, that can take the client.
pub struct FirstAvailable;

impl Scheduler for FirstAvailable {
    fn rebuild(&self, _: &RebuildInput) {}

    fn pick(
        &self,
        members: &[Arc<Member>],
        _: &PickContext,
        ok: &dyn Fn(usize) -> bool,
    ) -> Option<usize> {
        (0..members.len()).find(|&i| ok(i))
    }
}

//! (Weighted) round robin as a precomputed, smoothly interleaved sequence walked by one atomic
//! cursor; also the base of dynamic-weight algorithms and of priority groups.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::{PickContext, RebuildInput, Scheduler};
use crate::member::Member;

/// Longest sequence built; larger weight sums are scaled down proportionally.
const MAX_SEQUENCE: u64 = 16384;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Orders member slots so that each member's turns are spread evenly: member `i` with weight `w`
/// takes its `k`-th turn at virtual time `(k + ½) / w` (the "smooth" order nginx produces, e.g.
/// a b a c b a for 3:2:1, never a a a b b c). Zero weights get no turn.
pub fn interleave(weights: &[u32]) -> Vec<u32> {
    let g = weights.iter().fold(0u64, |g, &w| gcd(g, u64::from(w)));
    if g == 0 {
        return Vec::new();
    }
    let mut w: Vec<u64> = weights.iter().map(|&x| u64::from(x) / g).collect();
    let total: u64 = w.iter().sum();
    if total > MAX_SEQUENCE {
        for x in w.iter_mut().filter(|x| **x > 0) {
            *x = (*x * MAX_SEQUENCE / total).max(1);
        }
    }
    let mut slots: Vec<(u64, u64, u32)> = Vec::with_capacity(w.iter().sum::<u64>() as usize);
    for (i, &wi) in w.iter().enumerate() {
        for k in 0..wi {
            // Time (2k+1)/(2w) as a fraction (numerator, denominator).
            slots.push((2 * k + 1, 2 * wi, i as u32));
        }
    }
    slots.sort_by(|a, b| (a.0 * b.1).cmp(&(b.0 * a.1)).then(a.2.cmp(&b.2)));
    slots.into_iter().map(|s| s.2).collect()
}

/// Walks `seq` from the shared cursor to the first member `ok` accepts. A skipped slot consumes
/// its turn, so a member that is out spreads its share over all the others, not the next one.
#[inline]
fn walk(seq: &[u32], cursor: &AtomicUsize, ok: &dyn Fn(usize) -> bool) -> Option<usize> {
    let n = seq.len();
    for _ in 0..n {
        let c = cursor.fetch_add(1, Ordering::Relaxed);
        let i = seq[c % n] as usize;
        if ok(i) {
            return Some(i);
        }
    }
    None
}

#[derive(Default)]
pub struct Sequence {
    seq: ArcSwap<Vec<u32>>,
    cursor: AtomicUsize,
    dynamic: bool,
}

impl Sequence {
    pub fn dynamic() -> Self {
        Sequence {
            dynamic: true,
            ..Default::default()
        }
    }
}

impl Scheduler for Sequence {
    fn rebuild(&self, input: &RebuildInput) {
        self.seq.store(Arc::new(interleave(&input.weights)));
    }

    fn pick(
        &self,
        _: &[Arc<Member>],
        _: &PickContext,
        ok: &dyn Fn(usize) -> bool,
    ) -> Option<usize> {
        walk(&self.seq.load(), &self.cursor, ok)
    }

    fn dynamic(&self) -> bool {
        self.dynamic
    }
}

/// Members grouped by priority, highest first. Traffic goes to the highest group; when fewer
/// than `min_active` of its members are available, the next group joins, and so on (F5's
/// priority group activation). Within the active groups, weighted round robin.
pub struct PriorityGroups {
    min_active: usize,
    state: ArcSwap<Groups>,
    cursor: AtomicUsize,
}

#[derive(Default)]
struct Groups {
    /// Member indices per group, highest priority first.
    groups: Vec<Vec<usize>>,
    /// The weights the sequences were built from.
    weights: Vec<u32>,
    /// `prefix[k]`: the interleaved sequence over groups `0..=k`.
    prefix: Vec<Vec<u32>>,
}

impl PriorityGroups {
    pub fn new(min_active: u32) -> Self {
        PriorityGroups {
            min_active: min_active.max(1) as usize,
            state: ArcSwap::default(),
            cursor: AtomicUsize::new(0),
        }
    }
}

impl Scheduler for PriorityGroups {
    fn rebuild(&self, input: &RebuildInput) {
        let mut prios: Vec<i32> = input.priorities.clone();
        prios.sort_unstable_by(|a, b| b.cmp(a));
        prios.dedup();
        let groups: Vec<Vec<usize>> = prios
            .iter()
            .map(|p| {
                (0..input.priorities.len())
                    .filter(|&i| input.priorities[i] == *p)
                    .collect()
            })
            .collect();
        let mut prefix = Vec::with_capacity(groups.len());
        let mut weights = vec![0u32; input.weights.len()];
        for g in &groups {
            for &i in g {
                weights[i] = input.weights[i];
            }
            prefix.push(interleave(&weights));
        }
        self.state.store(Arc::new(Groups {
            groups,
            weights: input.weights.clone(),
            prefix,
        }));
    }

    fn pick(
        &self,
        _: &[Arc<Member>],
        _: &PickContext,
        ok: &dyn Fn(usize) -> bool,
    ) -> Option<usize> {
        let st = self.state.load();
        let mut available = 0;
        let mut last = None;
        for (k, g) in st.groups.iter().enumerate() {
            // A member without turns in the sequences (weight 0 at the last rebuild, e.g. still
            // in slow-start recovery then) cannot take traffic from them, so it must not keep
            // lower groups out: the pool would find no member at all.
            available += g
                .iter()
                .filter(|&&i| st.weights.get(i).is_some_and(|&w| w > 0) && ok(i))
                .count();
            if available > 0 {
                last = Some(k);
            }
            if available >= self.min_active {
                break;
            }
        }
        walk(&st.prefix[last?], &self.cursor, ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaves_smoothly() {
        assert_eq!(interleave(&[3, 2, 1]), vec![0, 1, 0, 2, 1, 0]);
        assert_eq!(interleave(&[1, 1, 1]), vec![0, 1, 2]);
        assert_eq!(
            interleave(&[256, 256]),
            vec![0, 1],
            "common factors are removed"
        );
        assert_eq!(interleave(&[0, 2]), vec![1]);
        assert!(interleave(&[0, 0]).is_empty());
        // 5:1 never gives the heavy member more than its share in a row.
        let s = interleave(&[5, 1]);
        assert_eq!(s.len(), 6);
        assert_eq!(s.iter().filter(|&&i| i == 1).count(), 1);
    }

    #[test]
    fn large_sums_are_capped_but_keep_ratios() {
        let s = interleave(&[65535, 32767, 1]);
        assert!(s.len() as u64 <= MAX_SEQUENCE + 3);
        let a = s.iter().filter(|&&i| i == 0).count() as f64;
        let b = s.iter().filter(|&&i| i == 1).count() as f64;
        assert!((a / b - 2.0).abs() < 0.01);
        assert!(s.contains(&2), "a small weight keeps at least one turn");
    }

    #[test]
    fn skipped_slots_spread_evenly() {
        let seq = Sequence::default();
        seq.rebuild(&RebuildInput {
            weights: vec![1, 1, 1],
            ..Default::default()
        });
        let mut counts = [0; 3];
        for _ in 0..3000 {
            let i = seq.pick(&[], &PickContext::default(), &|i| i != 0).unwrap();
            counts[i] += 1;
        }
        assert_eq!(counts, [0, 1500, 1500]);
    }
}

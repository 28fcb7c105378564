//! Shares of new flows for members whose flows the kernel places (links, gateways).
//!
//! A link pool's flows are not picked one by one in userspace: nftables hashes each new flow
//! into one of N slots and the slot names the link. What the pool's algorithm decides is how
//! many slots each link owns, so the algorithms are written here as *shares*, and the slot
//! table is the same weighted Maglev table `algorithm = "hash"` uses (removing a link moves only
//! its slots). The control plane recomputes shares from measured rates and health every
//! second and rewrites the kernel's map when the table changes.

use std::sync::Arc;

use fulcrum_config::Algorithm;

use crate::member::Member;
use crate::sched::MaglevTable;

/// What the control plane measured about a link.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinkLoad {
    /// Measured rates, bits per second.
    pub up_bps: f64,
    pub down_bps: f64,
    /// Configured bandwidth, bits per second (0 = unknown).
    pub capacity_up: u64,
    pub capacity_down: u64,
    /// Flows the link carries now.
    pub flows: u64,
    /// Mean probe round-trip time, if measured.
    pub rtt_us: Option<f64>,
}

impl LinkLoad {
    /// The larger of the up and down utilisation (0 when the bandwidth is unknown).
    pub fn utilisation(&self) -> f64 {
        let u = |rate: f64, cap: u64| if cap == 0 { 0.0 } else { rate / cap as f64 };
        u(self.up_bps, self.capacity_up).max(u(self.down_bps, self.capacity_down))
    }
}

/// Spillover's threshold when the pool sets no `busy`.
pub const DEFAULT_SPILLOVER_BUSY: f64 = 0.8;

/// A share never drops below this fraction of the member's weight under weighted least
/// traffic, so a loaded link keeps a trickle of new flows and its rate keeps being measured.
const TRAFFIC_FLOOR: f64 = 0.05;

/// The largest share: the slot table only needs ratios.
const SHARE_MAX: f64 = 1_000_000.0;

fn clamp_share(v: f64) -> u32 {
    if v.is_finite() && v > 0.0 {
        (v.min(SHARE_MAX) as u32).max(1)
    } else {
        0
    }
}

/// Each member's share of new flows (0 = none), in pool order. `busy` is the pool's threshold;
/// a member above it takes no new flows unless every usable member is busy (then they all keep
/// taking them: a saturated line is better than none).
pub fn link_shares(
    algorithm: Algorithm,
    members: &[Arc<Member>],
    loads: &[LinkLoad],
    busy: Option<f64>,
) -> Vec<u32> {
    shares_with(algorithm, members, loads, busy, false)
}

/// The shares members would have if every one with a weight were healthy and enabled, under
/// the loads measured now: where their slots sit while they are out, so that their slots alone
/// move. (The loads stay in: built from idle loads, this table would pin every slot of a member
/// that is in, and least connections, least traffic and rtt would never move a flow.)
fn potential_shares(algorithm: Algorithm, members: &[Arc<Member>], loads: &[LinkLoad]) -> Vec<u32> {
    shares_with(algorithm, members, loads, None, true)
}

fn shares_with(
    algorithm: Algorithm,
    members: &[Arc<Member>],
    loads: &[LinkLoad],
    busy: Option<f64>,
    ignore_health: bool,
) -> Vec<u32> {
    let n = members.len();
    let load = |i: usize| loads.get(i).copied().unwrap_or_default();
    let usable: Vec<bool> = members
        .iter()
        .map(|m| {
            if ignore_health {
                m.weight() > 0
            } else {
                m.accepts_new(0)
            }
        })
        .collect();
    let busy = match algorithm {
        Algorithm::Spillover => Some(busy.unwrap_or(DEFAULT_SPILLOVER_BUSY)),
        _ => busy,
    };
    let is_busy = |i: usize| busy.is_some_and(|b| load(i).utilisation() >= b);
    let mut candidate: Vec<bool> = (0..n).map(|i| usable[i] && !is_busy(i)).collect();
    if !candidate.iter().any(|&c| c) {
        candidate = usable.clone();
    }
    let weight = |i: usize| f64::from(members[i].weight());
    let mut shares = vec![0u32; n];
    match algorithm {
        Algorithm::FirstAvailable | Algorithm::Spillover => {
            if let Some(i) = (0..n).find(|&i| candidate[i]) {
                shares[i] = 1;
            }
        }
        Algorithm::Priority => {
            let top = (0..n)
                .filter(|&i| candidate[i])
                .map(|i| members[i].priority())
                .max();
            for i in 0..n {
                if candidate[i] && Some(members[i].priority()) == top {
                    shares[i] = clamp_share(weight(i));
                }
            }
        }
        _ => {
            for i in 0..n {
                if !candidate[i] {
                    continue;
                }
                let l = load(i);
                let v = match algorithm {
                    Algorithm::RoundRobin => 1.0,
                    // Fewer flows, more slots: inverse to the flows carried now.
                    Algorithm::LeastConnections => 1000.0 / (l.flows as f64 + 1.0),
                    Algorithm::WeightedLeastConnections => {
                        weight(i) * 1000.0 / (l.flows as f64 + 1.0)
                    }
                    Algorithm::WeightedLeastTraffic => {
                        weight(i) * 1000.0 * (1.0 - l.utilisation()).max(TRAFFIC_FLOOR)
                    }
                    // kbit/s of both directions: a 100/100 line gets twice a 50/50 one.
                    Algorithm::BandwidthRatio => (l.capacity_up + l.capacity_down) as f64 / 1000.0,
                    Algorithm::Rtt => match l.rtt_us {
                        Some(rtt) if rtt > 0.0 => weight(i) * 1e6 / rtt,
                        _ => weight(i) * 1000.0,
                    },
                    _ => weight(i),
                };
                shares[i] = clamp_share(v);
            }
        }
    }
    shares
}

/// The slot table for `shares`: slot `k` names the member that new flows hashing to `k` take.
/// Empty when no member has a share.
pub fn slot_table(names: &[String], shares: &[u32]) -> MaglevTable {
    MaglevTable::build(names, shares)
}

/// The slot table of a pool whose flows the kernel places, and each member's share. A member
/// that is out (down, busy, disabled) keeps its place in a table built as if it were in, and
/// only its own slots are handed to the others (by the table of the members that are in), so
/// taking a member out moves no other member's slots; they come back to it when it returns.
pub fn kernel_slots(
    algorithm: Algorithm,
    members: &[Arc<Member>],
    loads: &[LinkLoad],
    busy: Option<f64>,
    names: &[String],
) -> (Vec<u32>, Vec<u32>) {
    let shares = link_shares(algorithm, members, loads, busy);
    let live = MaglevTable::build(names, &shares);
    if live.slots.is_empty() {
        return (Vec::new(), shares);
    }
    let base = MaglevTable::build(names, &potential_shares(algorithm, members, loads));
    if base.slots.len() != live.slots.len() {
        return (live.slots, shares);
    }
    let slots = base
        .slots
        .iter()
        .zip(&live.slots)
        .map(|(&b, &l)| {
            if shares.get(b as usize).is_some_and(|&s| s > 0) {
                b
            } else {
                l
            }
        })
        .collect();
    (slots, shares)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_config::{AdminState, Member as MemberConfig};
    use std::net::SocketAddr;

    fn members(weights: &[u32]) -> Vec<Arc<Member>> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                Arc::new(Member::new(
                    Arc::from("links"),
                    &MemberConfig {
                        address: SocketAddr::from(([198, 18, 0, i as u8 + 1], 0)),
                        weight: w,
                        priority: if i == 0 { 10 } else { 0 },
                        max_connections: 0,
                        standby: false,
                        state: AdminState::Enabled,
                    },
                ))
            })
            .collect()
    }

    fn bw(up_bps: f64, cap: u64) -> LinkLoad {
        LinkLoad {
            up_bps,
            capacity_up: cap,
            capacity_down: cap,
            ..LinkLoad::default()
        }
    }

    #[test]
    fn weights_and_bandwidth() {
        let m = members(&[3, 1]);
        assert_eq!(
            link_shares(Algorithm::WeightedRoundRobin, &m, &[], None),
            vec![3, 1]
        );
        assert_eq!(
            link_shares(Algorithm::RoundRobin, &m, &[], None),
            vec![1, 1]
        );
        let loads = [bw(0.0, 100_000_000), bw(0.0, 20_000_000)];
        let s = link_shares(Algorithm::BandwidthRatio, &m, &loads, None);
        assert_eq!(s[0] / s[1], 5);
    }

    #[test]
    fn busy_links_take_no_new_flows_unless_all_are_busy() {
        let m = members(&[1, 1]);
        let loads = [bw(90e6, 100_000_000), bw(10e6, 100_000_000)];
        assert_eq!(
            link_shares(Algorithm::WeightedRoundRobin, &m, &loads, Some(0.8)),
            vec![0, 1]
        );
        let all = [bw(90e6, 100_000_000), bw(95e6, 100_000_000)];
        assert_eq!(
            link_shares(Algorithm::WeightedRoundRobin, &m, &all, Some(0.8)),
            vec![1, 1]
        );
    }

    #[test]
    fn spillover_fills_the_first_link_first() {
        let m = members(&[1, 1, 1]);
        let idle = [bw(0.0, 10_000_000); 3];
        assert_eq!(
            link_shares(Algorithm::Spillover, &m, &idle, None),
            vec![1, 0, 0]
        );
        let first_full = [
            bw(9e6, 10_000_000),
            bw(0.0, 10_000_000),
            bw(0.0, 10_000_000),
        ];
        assert_eq!(
            link_shares(Algorithm::Spillover, &m, &first_full, None),
            vec![0, 1, 0]
        );
    }

    #[test]
    fn the_slot_table_follows_the_flows_each_link_carries() {
        let m = members(&[1, 1]);
        let names = vec!["a".to_string(), "b".to_string()];
        let loaded = [
            LinkLoad {
                flows: 20,
                ..LinkLoad::default()
            },
            LinkLoad::default(),
        ];
        let (slots, _) = kernel_slots(Algorithm::LeastConnections, &m, &loaded, None, &names);
        let on_b = slots.iter().filter(|&&s| s == 1).count();
        assert!(on_b * 10 >= slots.len() * 9, "{on_b} of {}", slots.len());
    }

    #[test]
    fn down_links_lose_their_share_and_priority_falls_back() {
        let m = members(&[1, 2, 2]);
        assert_eq!(
            link_shares(Algorithm::Priority, &m, &[], None),
            vec![1, 0, 0]
        );
        m[0].record_probe(false, "test");
        m[0].set_state(AdminState::Disabled);
        assert_eq!(
            link_shares(Algorithm::Priority, &m, &[], None),
            vec![0, 2, 2]
        );
        assert_eq!(
            link_shares(Algorithm::WeightedRoundRobin, &m, &[], None),
            vec![0, 2, 2]
        );
    }

    #[test]
    fn least_traffic_prefers_the_idle_link() {
        let m = members(&[1, 1]);
        let loads = [bw(50e6, 100_000_000), bw(0.0, 100_000_000)];
        let s = link_shares(Algorithm::WeightedLeastTraffic, &m, &loads, None);
        assert_eq!(s, vec![500, 1000]);
    }

    #[test]
    fn a_member_out_moves_only_its_own_slots_and_gets_them_back() {
        let m = members(&[1, 1, 1, 1]);
        let names: Vec<String> = ["g0", "g1", "g2", "g3"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let alg = Algorithm::WeightedRoundRobin;
        let (before, _) = kernel_slots(alg, &m, &[], None, &names);
        m[2].set_state(AdminState::Disabled);
        let (during, shares) = kernel_slots(alg, &m, &[], None, &names);
        assert_eq!(shares, vec![1, 1, 0, 1]);
        for (b, d) in before.iter().zip(&during) {
            assert_ne!(*d, 2);
            if *b != 2 {
                assert_eq!(b, d, "a slot of a member that stayed moved");
            }
        }
        let moved_to: Vec<usize> = (0..4)
            .map(|k| {
                before
                    .iter()
                    .zip(&during)
                    .filter(|(b, d)| **b == 2 && **d == k)
                    .count()
            })
            .collect();
        assert!(
            moved_to[0] > 0 && moved_to[1] > 0 && moved_to[3] > 0,
            "{moved_to:?}"
        );
        m[2].set_state(AdminState::Enabled);
        assert_eq!(kernel_slots(alg, &m, &[], None, &names).0, before);
    }

    #[test]
    fn slot_table_follows_shares_and_moves_only_a_removed_links_slots() {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let t = slot_table(&names, &[3, 1, 0]);
        let count = |t: &MaglevTable, k: u32| t.slots.iter().filter(|&&s| s == k).count();
        let (a, b) = (count(&t, 0), count(&t, 1));
        assert_eq!(count(&t, 2), 0);
        let ratio = a as f64 / b as f64;
        assert!((ratio - 3.0).abs() < 0.05, "{a}:{b}");
        let t3 = slot_table(&names, &[1, 1, 1]);
        let t2 = slot_table(&names, &[1, 1, 0]);
        let moved = t3
            .slots
            .iter()
            .zip(&t2.slots)
            .filter(|(x, y)| x != y && **x != 2)
            .count();
        assert!(moved * 20 < t3.slots.len(), "moved {moved}");
    }
}

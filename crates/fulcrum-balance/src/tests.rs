//! Pool-level proofs that every scheduling algorithm and member state behaves as
//! docs/configuration.md specifies: exact counts where the scheduler is deterministic, tolerances
//! of a percent or two where it is random (and then with a seeded generator, so a run is reproducible).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_config::{AdminState, Algorithm, HashKey, Reuse, SlowStart};

use crate::clock::now_ms;
use crate::hash::hash_bytes;
use crate::{AgentState, CheckSpec, Member, PickContext, Pool, WEIGHT_SCALE};

/// A clock reading far beyond the real one (about 35 years of process uptime), so hand-driven
/// times never collide with what `Pool::new` read from the real clock.
const T0: u64 = 1 << 40;

const ALL: [Algorithm; 11] = [
    Algorithm::RoundRobin,
    Algorithm::WeightedRoundRobin,
    Algorithm::LeastConnections,
    Algorithm::WeightedLeastConnections,
    Algorithm::WeightedLeastTraffic,
    Algorithm::FastestResponse,
    Algorithm::DynamicFeedback,
    Algorithm::Hash,
    Algorithm::Priority,
    Algorithm::FirstAvailable,
    Algorithm::LeastRequest,
];

/// Every algorithm that spreads clients over all members (first_available, by design, does not).
const SPREADING: [Algorithm; 10] = [
    Algorithm::RoundRobin,
    Algorithm::WeightedRoundRobin,
    Algorithm::LeastConnections,
    Algorithm::WeightedLeastConnections,
    Algorithm::WeightedLeastTraffic,
    Algorithm::FastestResponse,
    Algorithm::DynamicFeedback,
    Algorithm::Hash,
    Algorithm::Priority,
    Algorithm::LeastRequest,
];

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 80))
}

fn member_cfg(i: usize, weight: u32) -> fulcrum_config::Member {
    fulcrum_config::Member {
        address: addr(i),
        weight,
        priority: 0,
        max_connections: 0,
        standby: false,
        state: AdminState::Enabled,
    }
}

fn config(algorithm: Algorithm, weights: &[u32]) -> fulcrum_config::Pool {
    fulcrum_config::Pool {
        name: "p".into(),
        algorithm,
        hash_key: HashKey::SourceIp,
        monitors: vec!["m".into()],
        slow_start: None,
        min_active: 1,
        retries: 2,
        connect_timeout: Duration::from_secs(3),
        zero_window_timeout: None,
        members: weights
            .iter()
            .enumerate()
            .map(|(i, &w)| member_cfg(i, w))
            .collect(),
        reuse: Reuse::Safe,
        http: Default::default(),
        kind: fulcrum_config::PoolKind::Server,
        links: vec![],
        gateways: vec![],
        busy: None,
        elastic: None,
        vrf: None,
        tls: None,
    }
}

/// The pool's one monitor: up after 2 passes, down after 3 failures.
fn checks() -> Vec<CheckSpec> {
    vec![CheckSpec {
        monitor: "m".into(),
        rise: 2,
        fall: 3,
    }]
}

fn new_pool(algorithm: Algorithm, weights: &[u32]) -> Pool {
    Pool::new(&config(algorithm, weights), &checks(), None)
}

fn fail_checks(m: &Member) {
    for _ in 0..3 {
        m.record_check("m", false, "connection refused");
    }
    assert!(!m.health.is_up());
}

fn pass_checks(m: &Member) {
    for _ in 0..2 {
        m.record_check("m", true, "HTTP 200");
    }
    assert!(m.health.is_up());
}

/// A well-spread hash key for client number `k`.
fn key(k: usize) -> u64 {
    hash_bytes(&(k as u64).to_le_bytes())
}

/// The context of client `k`: hash pools get a key, the others ignore it.
fn keyed(k: usize) -> PickContext {
    PickContext { hash: Some(key(k)) }
}

/// Picks `n` times and counts the picks per member.
fn count(pool: &Pool, n: usize) -> Vec<usize> {
    count_with(pool, n, |_| pool.pick(&PickContext::default(), &[]))
}

/// Like `count` for clients 0..n, each with its own hash key.
fn count_keyed(pool: &Pool, n: usize) -> Vec<usize> {
    count_with(pool, n, |k| pool.pick(&keyed(k), &[]))
}

/// Like `count`, at a hand-driven clock reading.
fn count_at(pool: &Pool, n: usize, now: u64) -> Vec<usize> {
    count_with(pool, n, |_| pool.pick_at(&PickContext::default(), &[], now))
}

/// Like `count_keyed`, but each pick opens a connection and a request that stay open until all
/// `n` picks are done, as under sustained load.
fn count_loaded(pool: &Pool, n: usize) -> Vec<usize> {
    let mut held = Vec::with_capacity(n);
    let counts = count_with(pool, n, |k| {
        let p = pool.pick(&keyed(k), &[])?;
        held.push((p.member.open_connection(), p.member.open_request()));
        Some(p)
    });
    drop(held);
    counts
}

fn count_with(
    pool: &Pool,
    n: usize,
    mut pick: impl FnMut(usize) -> Option<crate::Picked>,
) -> Vec<usize> {
    let mut counts = vec![0; pool.members().len()];
    for k in 0..n {
        let p = pick(k).expect("a member is available");
        assert!(Arc::ptr_eq(&p.member, &pool.members()[p.index]));
        counts[p.index] += 1;
    }
    counts
}

/// Asserts that each member's share of `counts` is within `tol` of `expected` (relative weights,
/// normalised here).
#[track_caller]
fn assert_shares(counts: &[usize], expected: &[f64], tol: f64) {
    let total = counts.iter().sum::<usize>() as f64;
    let wsum: f64 = expected.iter().sum();
    for (i, (&c, &e)) in counts.iter().zip(expected).enumerate() {
        let share = c as f64 / total;
        let want = e / wsum;
        assert!(
            (share - want).abs() <= tol,
            "member {i}: share {share:.4}, expected {want:.4} ± {tol} (counts {counts:?})"
        );
    }
}

/// Longest run of consecutive picks of `member` in `seq`, counting the wrap-around (the
/// sequence repeats).
fn longest_run(seq: &[usize], member: usize) -> usize {
    let doubled: Vec<usize> = seq.iter().chain(seq).copied().collect();
    let mut best = 0;
    let mut run = 0;
    for &i in &doubled {
        run = if i == member { run + 1 } else { 0 };
        best = best.max(run);
    }
    best.min(seq.len())
}

/// For every spreading algorithm: builds four equal members (after `edit` of the config), takes
/// member 1 out with `take_out` (which returns what must stay alive to keep it out, e.g.
/// connection guards), and checks that member 1 gets no picks while the other three share its
/// traffic evenly — both at once and after the control plane's refresh.
fn assert_taken_out_spreads_evenly<T>(
    edit: impl Fn(&mut fulcrum_config::Pool),
    take_out: impl Fn(&Pool) -> T,
) {
    for algorithm in SPREADING {
        let mut cfg = config(algorithm, &[1, 1, 1, 1]);
        edit(&mut cfg);
        let pool = Pool::new(&cfg, &checks(), None);
        fastrand::seed(7);
        let _keep = take_out(&pool);
        for phase in ["before refresh", "after refresh"] {
            let counts = if algorithm == Algorithm::Hash {
                count_keyed(&pool, 30_000)
            } else {
                count(&pool, 6000)
            };
            assert_eq!(counts[1], 0, "{algorithm} {phase}: {counts:?}");
            match algorithm {
                Algorithm::Hash | Algorithm::LeastRequest => {
                    assert_shares(&counts, &[1.0, 0.0, 1.0, 1.0], 0.02)
                }
                _ => assert_eq!(
                    counts,
                    [2000, 0, 2000, 2000],
                    "{algorithm} {phase}: the share must spread evenly, not onto a neighbour"
                ),
            }
            pool.refresh();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Round robin and weighted round robin
// ---------------------------------------------------------------------------------------------

#[test]
fn round_robin_gives_equal_shares_and_ignores_weights() {
    let pool = new_pool(Algorithm::RoundRobin, &[5, 1, 2]);
    assert_eq!(count(&pool, 6000), [2000, 2000, 2000]);
}

#[test]
fn round_robin_visits_members_in_turn() {
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1, 1]);
    let seq: Vec<usize> = (0..9)
        .map(|_| pool.pick(&PickContext::default(), &[]).unwrap().index)
        .collect();
    for w in seq.windows(3) {
        let mut w = w.to_vec();
        w.sort_unstable();
        assert_eq!(w, [0, 1, 2], "every 3 consecutive picks visit all: {seq:?}");
    }
}

#[test]
fn weighted_round_robin_gives_exact_shares() {
    let pool = new_pool(Algorithm::WeightedRoundRobin, &[3, 2, 1]);
    assert_eq!(count(&pool, 6000), [3000, 2000, 1000]);
}

#[test]
fn weighted_round_robin_is_interleaved() {
    let pool = new_pool(Algorithm::WeightedRoundRobin, &[3, 2, 1]);
    let seq: Vec<usize> = (0..600)
        .map(|_| pool.pick(&PickContext::default(), &[]).unwrap().index)
        .collect();
    // Every window of one full cycle holds exactly the 3:2:1 shares...
    for w in seq.windows(6) {
        let c = (0..3)
            .map(|m| w.iter().filter(|&&i| i == m).count())
            .collect::<Vec<_>>();
        assert_eq!(c, [3, 2, 1], "window {w:?}");
    }
    // ...and no member gets more than its fair run in a row: the heavy member (half the
    // turns) at most 2, the others never twice.
    assert!(longest_run(&seq, 0) <= 2, "{seq:?}");
    assert_eq!(longest_run(&seq, 1), 1, "{seq:?}");
    assert_eq!(longest_run(&seq, 2), 1, "{seq:?}");
}

// ---------------------------------------------------------------------------------------------
// Members out of rotation: down, disabled, drained, weight 0, full
// ---------------------------------------------------------------------------------------------

#[test]
fn down_member_gets_no_picks_and_its_share_spreads_evenly() {
    assert_taken_out_spreads_evenly(|_| {}, |p| fail_checks(&p.members()[1]));
}

#[test]
fn passively_failed_member_gets_no_picks_and_its_share_spreads_evenly() {
    assert_taken_out_spreads_evenly(
        |_| {},
        |p| {
            let m = &p.members()[1];
            m.record_connect_failure("refused");
            m.record_connect_failure("refused");
            assert!(m.health.is_up(), "fall is 3");
            m.record_connect_failure("refused");
            assert!(!m.health.is_up());
        },
    );
}

#[test]
fn disabled_member_gets_no_picks_and_its_share_spreads_evenly() {
    assert_taken_out_spreads_evenly(|_| {}, |p| p.members()[1].set_state(AdminState::Disabled));
    assert_taken_out_spreads_evenly(|c| c.members[1].state = AdminState::Disabled, |_| ());
    assert_taken_out_spreads_evenly(
        |_| {},
        |p| p.members()[1].set_agent_state(AgentState::Maint),
    );
}

#[test]
fn drained_member_gets_no_picks_and_its_share_spreads_evenly() {
    assert_taken_out_spreads_evenly(|_| {}, |p| p.members()[1].set_state(AdminState::Drain));
    assert_taken_out_spreads_evenly(|c| c.members[1].state = AdminState::Drain, |_| ());
    assert_taken_out_spreads_evenly(
        |_| {},
        |p| p.members()[1].set_agent_state(AgentState::Drain),
    );
}

#[test]
fn weight_zero_member_gets_no_picks_and_its_share_spreads_evenly() {
    assert_taken_out_spreads_evenly(|_| {}, |p| p.members()[1].set_weight(0));
    assert_taken_out_spreads_evenly(|c| c.members[1].weight = 0, |_| ());
    // An agent reporting 0% is weight 0 too.
    assert_taken_out_spreads_evenly(|_| {}, |p| p.members()[1].set_agent_weight_pct(0));
}

#[test]
fn full_member_gets_no_picks_and_its_share_spreads_evenly() {
    assert_taken_out_spreads_evenly(
        |c| c.members[1].max_connections = 2,
        |p| {
            let m = &p.members()[1];
            vec![m.open_connection(), m.open_connection()]
        },
    );
}

#[test]
fn full_member_comes_back_when_a_connection_closes() {
    let mut cfg = config(Algorithm::RoundRobin, &[1, 1]);
    cfg.members[0].max_connections = 1;
    let pool = Pool::new(&cfg, &[], None);
    let guard = pool.members()[0].open_connection();
    assert_eq!(count(&pool, 100), [0, 100]);
    drop(guard);
    assert_eq!(count(&pool, 100), [50, 50]);
}

#[test]
fn recovered_member_gets_its_share_back() {
    let pool = new_pool(Algorithm::WeightedRoundRobin, &[3, 2, 1]);
    fail_checks(&pool.members()[0]);
    assert_eq!(count(&pool, 6000), [0, 4000, 2000]);
    pass_checks(&pool.members()[0]);
    assert_eq!(count(&pool, 6000), [3000, 2000, 1000]);
}

#[test]
fn weighted_round_robin_spreads_a_heavy_members_share_by_weight() {
    // Member 1 (weight 2) out: 3:1 over the rest; member 0 (weight 3) out: 2:1.
    let pool = new_pool(Algorithm::WeightedRoundRobin, &[3, 2, 1]);
    pool.members()[1].set_state(AdminState::Disabled);
    assert_eq!(count(&pool, 6000), [4500, 0, 1500]);
    pool.members()[1].set_state(AdminState::Enabled);
    pool.members()[0].set_state(AdminState::Disabled);
    assert_eq!(count(&pool, 6000), [0, 4000, 2000]);
}

#[test]
fn no_member_available_counts_and_returns_none() {
    for algorithm in ALL {
        let pool = new_pool(algorithm, &[1, 1]);
        for m in pool.members() {
            fail_checks(m);
        }
        assert!(pool.pick(&keyed(1), &[]).is_none(), "{algorithm}");
        assert!(
            pool.pick(&PickContext::default(), &[]).is_none(),
            "{algorithm}"
        );
        assert_eq!(pool.no_member.load(Ordering::Relaxed), 2, "{algorithm}");
        assert_eq!(pool.available(), 0);
    }
}

fn fail_passively(m: &Member) {
    for _ in 0..3 {
        m.record_passive_failure("HTTP 503");
    }
    assert!(!m.health.is_up());
    assert!(m.health.down_only_passively());
}

/// Panic mode: when every member is down and some only by passive observation, those keep
/// taking clients (spread by the pool's own algorithm), counted, rather than nobody.
#[test]
fn every_member_down_passively_is_panic_mode_and_still_serves() {
    for algorithm in ALL {
        let pool = new_pool(algorithm, &[1, 1, 1]);
        for m in pool.members() {
            fail_passively(m);
        }
        assert!(pool.in_panic(), "{algorithm}");
        assert_eq!(pool.available(), 0, "{algorithm}: none is up");
        let counts = count_keyed(&pool, 300);
        assert_eq!(counts.iter().sum::<usize>(), 300, "{algorithm}: {counts:?}");
        if algorithm != Algorithm::FirstAvailable {
            assert!(counts.iter().all(|&c| c > 0), "{algorithm}: {counts:?}");
        }
        assert_eq!(pool.panic_picks.load(Ordering::Relaxed), 300, "{algorithm}");
        assert_eq!(pool.no_member.load(Ordering::Relaxed), 0, "{algorithm}");
        // A retry still goes to a member the client has not failed on, then there is none.
        let first = pool.pick(&keyed(7), &[]).expect("a member").index;
        assert!(pool.pick(&keyed(7), &[first]).is_some(), "{algorithm}");
        assert!(pool.pick(&keyed(7), &[0, 1, 2]).is_none(), "{algorithm}");
        // One member back up ends panic mode: it alone takes the clients.
        pass_checks(&pool.members()[2]);
        assert!(!pool.in_panic(), "{algorithm}");
        assert_eq!(count(&pool, 30), [0, 0, 30], "{algorithm}");
    }
}

/// A member an active monitor says is down never takes clients, panic or not; a member taken
/// out by the operator neither.
#[test]
fn panic_mode_skips_members_a_monitor_or_the_operator_took_out() {
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1, 1]);
    fail_checks(&pool.members()[0]);
    fail_passively(&pool.members()[1]);
    fail_passively(&pool.members()[2]);
    pool.members()[2].set_state(AdminState::Disabled);
    assert!(pool.in_panic());
    assert_eq!(count(&pool, 30), [0, 30, 0]);
    // Every member down by its monitor: no panic, no member.
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1]);
    for m in pool.members() {
        fail_passively(m);
        fail_checks(m);
        assert!(!m.health.down_only_passively());
    }
    assert!(!pool.in_panic());
    assert!(pool.pick(&PickContext::default(), &[]).is_none());
    assert_eq!(pool.panic_picks.load(Ordering::Relaxed), 0);
    assert_eq!(pool.no_member.load(Ordering::Relaxed), 1);
}

/// While one member is up, passively failed members get nothing: panic mode is only for a
/// pool with nothing up.
#[test]
fn one_member_up_means_no_panic() {
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1]);
    fail_passively(&pool.members()[0]);
    assert!(!pool.in_panic());
    assert_eq!(count(&pool, 20), [0, 20]);
    assert!(
        pool.pick(&PickContext::default(), &[1]).is_none(),
        "the up member failed this client"
    );
    assert_eq!(pool.panic_picks.load(Ordering::Relaxed), 0);
}

// ---------------------------------------------------------------------------------------------
// Persistence
// ---------------------------------------------------------------------------------------------

#[test]
fn persistence_honours_drain_and_weight_zero_but_not_disabled_down_or_removed() {
    let mut cfg = config(Algorithm::WeightedRoundRobin, &[1; 9]);
    cfg.members[7].max_connections = 1;
    let pool = Pool::new(&cfg, &checks(), None);
    let m = pool.members();
    m[1].set_state(AdminState::Drain);
    m[2].set_weight(0);
    m[3].set_state(AdminState::Disabled);
    fail_checks(&m[4]);
    m[5].set_agent_state(AgentState::Drain);
    m[6].set_agent_state(AgentState::Maint);
    let _full = m[7].open_connection();
    m[8].set_agent_weight_pct(0);
    pool.refresh();

    let sticks = |i: usize| pool.persistent(addr(i), &[]).map(|p| p.index);
    assert_eq!(sticks(0), Some(0), "enabled");
    assert_eq!(sticks(1), Some(1), "drain honours existing clients");
    assert_eq!(sticks(2), Some(2), "weight 0 honours existing clients");
    assert_eq!(sticks(3), None, "disabled takes nothing new");
    assert_eq!(sticks(4), None, "down");
    assert_eq!(sticks(5), Some(5), "agent drain");
    assert_eq!(sticks(6), None, "agent maint");
    assert_eq!(sticks(7), None, "at max_connections");
    assert_eq!(sticks(8), Some(8), "an agent at 0% is weight 0");
    assert_eq!(sticks(9), None, "not (or no longer) in the pool");
    assert!(
        pool.persistent(addr(1), &[1]).is_none(),
        "a retry excludes it"
    );

    // The scheduler, in contrast, gives none of them a new client.
    let counts = count(&pool, 1000);
    assert_eq!(counts, [1000, 0, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn persistence_to_a_removed_member_is_refused_after_reload() {
    let cfg = config(Algorithm::RoundRobin, &[1, 1, 1]);
    let old = Pool::new(&cfg, &[], None);
    let mut cfg2 = cfg.clone();
    cfg2.members.remove(1);
    let new = Pool::new(&cfg2, &[], Some(&old));
    assert!(old.persistent(addr(1), &[]).is_some());
    assert!(new.persistent(addr(1), &[]).is_none());
    assert_eq!(new.persistent(addr(2), &[]).map(|p| p.index), Some(1));
}

// ---------------------------------------------------------------------------------------------
// Least connections
// ---------------------------------------------------------------------------------------------

#[test]
fn least_connections_sends_new_clients_to_the_least_loaded() {
    // Weights are ignored by least_connections.
    let pool = new_pool(Algorithm::LeastConnections, &[5, 1, 1]);
    let m = pool.members();
    let _load: Vec<_> = (0..4)
        .map(|_| m[0].open_connection())
        .chain((0..2).map(|_| m[1].open_connection()))
        .collect();
    // Without the new connections held, every client goes to the idle member.
    assert_eq!(count(&pool, 100), [0, 0, 100]);
    // Held: two clients bring member 2 level with member 1, four more bring both level with
    // member 0; from then on all three take turns.
    let mut held = Vec::new();
    let mut seq = Vec::new();
    for _ in 0..6 {
        let p = pool.pick(&PickContext::default(), &[]).unwrap();
        seq.push(p.index);
        held.push(p.member.open_connection());
    }
    assert_eq!(&seq[..2], [2, 2]);
    assert_eq!(seq.iter().filter(|&&i| i == 1).count(), 2, "{seq:?}");
    assert_eq!(count_loaded(&pool, 3000), [1000, 1000, 1000]);
}

#[test]
fn least_connections_ties_spread_when_idle() {
    for algorithm in [
        Algorithm::LeastConnections,
        Algorithm::WeightedLeastConnections,
    ] {
        let pool = new_pool(algorithm, &[1, 1, 1, 1]);
        assert_eq!(count(&pool, 4000), [1000, 1000, 1000, 1000], "{algorithm}");
    }
}

#[test]
fn weighted_least_connections_balances_connections_per_weight() {
    let pool = new_pool(Algorithm::WeightedLeastConnections, &[3, 1]);
    let m = pool.members();
    {
        // (3 + 1) / 3 connections per weight on member 0 against (0 + 1) / 1 on member 1.
        let _load: Vec<_> = (0..3).map(|_| m[0].open_connection()).collect();
        assert_eq!(count(&pool, 10), [0, 10]);
    }
    {
        // (1 + 1) / 3 against (0 + 1) / 1: member 0 is less loaded per unit of weight.
        let _load = m[0].open_connection();
        assert_eq!(count(&pool, 10), [10, 0]);
    }
    let counts = count_loaded(&pool, 4000);
    assert!(
        counts[0].abs_diff(3000) <= 2 && counts[1].abs_diff(1000) <= 2,
        "{counts:?}"
    );
    assert_shares(&count_loaded(&pool, 6000), &[3.0, 1.0], 0.001);
}

#[test]
fn weighted_least_connections_three_weights_under_load() {
    let pool = new_pool(Algorithm::WeightedLeastConnections, &[3, 2, 1]);
    assert_shares(&count_loaded(&pool, 6000), &[3.0, 2.0, 1.0], 0.001);
}

// ---------------------------------------------------------------------------------------------
// Weighted least traffic
// ---------------------------------------------------------------------------------------------

/// Gives the members of `pool` traffic EWMAs from `bytes_per_s` (one second of traffic between
/// two samples), returning the EWMAs. Rates are in real-world ranges (MB/s): the scheduler
/// floors the traffic an open connection stands for at 1 B/s.
fn set_traffic(pool: &Pool, bytes_per_s: &[u64]) -> Vec<f64> {
    pool.refresh_at(T0);
    for (m, &b) in pool.members().iter().zip(bytes_per_s) {
        m.stats.add_bytes(b / 2, b - b / 2);
    }
    pool.refresh_at(T0 + 1000);
    pool.members()
        .iter()
        .map(|m| m.stats.traffic_bps())
        .collect()
}

#[test]
fn weighted_least_traffic_sends_less_to_the_busy_member() {
    let pool = new_pool(Algorithm::WeightedLeastTraffic, &[1, 1]);
    let bps = set_traffic(&pool, &[3_000_000, 1_000_000]);
    assert!(
        bps[0] > 0.0 && (bps[0] / bps[1] - 3.0).abs() < 1e-9,
        "{bps:?}"
    );
    // Short clients all go to the quieter member.
    assert_eq!(count(&pool, 100), [0, 100]);
    // Under load each open connection counts as the pool's average traffic per connection, so
    // shares settle inverse to traffic: 1:3.
    assert_shares(&count_loaded(&pool, 4000), &[1.0, 3.0], 0.005);
}

#[test]
fn weighted_least_traffic_respects_weights() {
    // Traffic in proportion to weight: both are equally loaded, and new clients follow weight.
    let pool = new_pool(Algorithm::WeightedLeastTraffic, &[3, 1]);
    set_traffic(&pool, &[3_000_000, 1_000_000]);
    assert_shares(&count_loaded(&pool, 4000), &[3.0, 1.0], 0.005);
    // Equal traffic and equal weights: equal shares, idle or loaded.
    let pool = new_pool(Algorithm::WeightedLeastTraffic, &[1, 1, 1]);
    set_traffic(&pool, &[2_000_000; 3]);
    assert_eq!(count(&pool, 3000), [1000, 1000, 1000]);
    assert_eq!(count_loaded(&pool, 3000), [1000, 1000, 1000]);
}

#[test]
fn traffic_ewma_ignores_out_of_order_samples() {
    let pool = new_pool(Algorithm::WeightedLeastTraffic, &[1]);
    let m = &pool.members()[0];
    let alpha = 1.0 - (-0.5f64).exp();
    pool.refresh_at(T0);
    m.stats.add_bytes(1000, 0);
    pool.refresh_at(T0 + 1000);
    let first = alpha * 1000.0;
    assert!((m.stats.traffic_bps() - first).abs() < 1e-6);
    // A refresh that read the clock before the last one (two refreshes racing) changes nothing.
    pool.refresh_at(T0 + 500);
    assert!((m.stats.traffic_bps() - first).abs() < 1e-6);
    m.stats.add_bytes(0, 1000);
    pool.refresh_at(T0 + 2000);
    let second = first + alpha * (1000.0 - first);
    assert!(
        (m.stats.traffic_bps() - second).abs() < 1e-6,
        "{} != {second}",
        m.stats.traffic_bps()
    );
}

// ---------------------------------------------------------------------------------------------
// Fastest response
// ---------------------------------------------------------------------------------------------

fn observe(m: &Member, ms: u64, times: usize) {
    for _ in 0..times {
        m.stats.observe_response_time(Duration::from_millis(ms));
    }
}

#[test]
fn fastest_response_shares_are_inverse_to_response_time() {
    let pool = new_pool(Algorithm::FastestResponse, &[1, 1]);
    assert_eq!(count(&pool, 6000), [3000, 3000], "no samples yet");
    observe(&pool.members()[0], 1, 20);
    observe(&pool.members()[1], 4, 20);
    pool.refresh();
    assert_eq!(count(&pool, 6000), [4800, 1200]);
    // And weights still count: 1ms at weight 1 against 4ms at weight 8 is 1:2.
    pool.members()[1].set_weight(8);
    pool.refresh();
    assert_eq!(count(&pool, 6000), [2000, 4000]);
}

#[test]
fn fastest_response_never_starves_a_slow_member() {
    let pool = new_pool(Algorithm::FastestResponse, &[1, 1]);
    observe(&pool.members()[0], 1, 20);
    observe(&pool.members()[1], 1000, 20);
    pool.refresh();
    // 1000× slower, but its weight stays at the 5% floor of its full weight, so it keeps a
    // trickle of traffic and keeps being measured.
    let slow = pool.members()[1].effective_weight();
    assert!(
        slow as f64 >= 0.05 * WEIGHT_SCALE as f64 - 0.5,
        "effective weight {slow}"
    );
    let fast = pool.members()[0].effective_weight();
    assert_eq!(fast, WEIGHT_SCALE);
    let cycle = (fast + slow) as usize;
    let counts = count(&pool, cycle * 20);
    assert_eq!(counts, [fast as usize * 20, slow as usize * 20]);
    let share = counts[1] as f64 / (cycle * 20) as f64;
    assert!(share > 0.045, "slow member's share {share}");
}

#[test]
fn fastest_response_sends_traffic_to_members_without_samples() {
    let pool = new_pool(Algorithm::FastestResponse, &[1, 1, 1]);
    observe(&pool.members()[0], 1, 20);
    observe(&pool.members()[1], 4, 20);
    pool.refresh();
    // The unmeasured member counts as the mean of the measured ones (2.5ms): factor 0.4.
    let w: Vec<u32> = pool
        .members()
        .iter()
        .map(|m| m.effective_weight())
        .collect();
    assert_eq!(w, [256, 64, 102]);
    assert_eq!(count(&pool, 422 * 10), [2560, 640, 1020]);
}

// ---------------------------------------------------------------------------------------------
// Dynamic feedback
// ---------------------------------------------------------------------------------------------

#[test]
fn weight_readings_combine_by_share_and_a_dropped_monitor_stops_counting() {
    let pool = new_pool(Algorithm::DynamicFeedback, &[1]);
    let m = &pool.members()[0];
    m.set_weight_reading("cpu", 75, 1);
    m.set_weight_reading("mem", 25, 3);
    assert_eq!(m.agent_weight_pct(), 37);
    // A new reading replaces that monitor's, not the other's.
    m.set_weight_reading("mem", 100, 3);
    assert_eq!(m.agent_weight_pct(), 93);
    assert!(!m.retain_weight_readings(&["cpu", "mem"]));
    assert!(m.retain_weight_readings(&["mem"]));
    assert_eq!(m.agent_weight_pct(), 100);
    m.set_weight_reading("mem", 40, 3);
    assert!(m.retain_weight_readings(&[]));
    assert_eq!(m.agent_weight_pct(), 100);
}

#[test]
fn dynamic_feedback_follows_agent_weights() {
    let pool = new_pool(Algorithm::DynamicFeedback, &[1, 1]);
    assert!(pool.wants_refresh());
    pool.members()[1].set_agent_weight_pct(25);
    pool.refresh();
    assert_eq!(count(&pool, 6000), [4800, 1200]);
    // Agents may report more than 100%: 200% against 25% is 8:1.
    pool.members()[0].set_agent_weight_pct(200);
    pool.refresh();
    assert_eq!(count(&pool, 9000), [8000, 1000]);
    pool.members()[0].set_agent_weight_pct(100);
    pool.members()[1].set_agent_weight_pct(100);
    pool.refresh();
    assert_eq!(count(&pool, 6000), [3000, 3000]);
}

// ---------------------------------------------------------------------------------------------
// Consistent hash
// ---------------------------------------------------------------------------------------------

fn mapping(pool: &Pool, keys: usize) -> Vec<SocketAddr> {
    (0..keys)
        .map(|k| pool.pick(&keyed(k), &[]).unwrap().member.address)
        .collect()
}

#[test]
fn hash_sends_the_same_key_to_the_same_member() {
    let pool = new_pool(Algorithm::Hash, &[1, 1, 1, 1, 1]);
    let first = mapping(&pool, 5000);
    // Interleaved with other clients and with no-key clients, nothing changes.
    count(&pool, 777);
    assert_eq!(mapping(&pool, 5000), first);
    // A pool built from the same config (another process, an active-active peer) agrees.
    let peer = Pool::new(&config(Algorithm::Hash, &[1, 1, 1, 1, 1]), &[], None);
    assert_eq!(mapping(&peer, 5000), first);
}

#[test]
fn hash_spreads_keys_by_weight() {
    let pool = new_pool(Algorithm::Hash, &[1, 1, 1, 1]);
    assert_shares(&count_keyed(&pool, 60_000), &[1.0; 4], 0.01);
    let pool = new_pool(Algorithm::Hash, &[1, 2, 3]);
    assert_shares(&count_keyed(&pool, 60_000), &[1.0, 2.0, 3.0], 0.01);
}

#[test]
fn hash_moves_only_a_down_members_keys_and_brings_them_back() {
    let pool = new_pool(Algorithm::Hash, &[1, 1, 1, 1]);
    let keys = 40_000;
    let before = mapping(&pool, keys);
    fail_checks(&pool.members()[1]);
    pool.refresh();
    let during = mapping(&pool, keys);
    let mut moved_to = [0usize; 4];
    for k in 0..keys {
        if before[k] == addr(1) {
            assert_ne!(during[k], addr(1));
            moved_to[pool.member_by_addr(during[k]).unwrap().0] += 1;
        } else {
            assert_eq!(during[k], before[k], "key {k} of a healthy member moved");
        }
    }
    // The down member's keys spread over all the others, not onto one neighbour.
    assert_shares(&moved_to, &[1.0, 0.0, 1.0, 1.0], 0.03);
    pass_checks(&pool.members()[1]);
    pool.refresh();
    assert_eq!(mapping(&pool, keys), before, "every key comes back");
}

#[test]
fn hash_removing_one_of_n_members_moves_about_one_nth_of_keys() {
    let n = 10;
    let cfg = config(Algorithm::Hash, &vec![1; n]);
    let old = Pool::new(&cfg, &[], None);
    let mut cfg2 = cfg.clone();
    cfg2.members.remove(3);
    let new = Pool::new(&cfg2, &[], Some(&old));
    let keys = 100_000;
    let before = mapping(&old, keys);
    let after = mapping(&new, keys);
    let mut moved = 0;
    for k in 0..keys {
        if before[k] == addr(3) {
            assert_ne!(after[k], addr(3));
        }
        if before[k] != after[k] {
            moved += 1;
        }
    }
    let frac = moved as f64 / keys as f64;
    // The removed member's 1/N must move; Maglev adds a few percent of disruption.
    assert!((0.095..0.13).contains(&frac), "moved {frac}");
    // Adding it back restores the original mapping exactly.
    let back = Pool::new(&cfg, &[], Some(&new));
    assert_eq!(mapping(&back, keys), before);
}

#[test]
fn hash_without_a_key_falls_back_to_round_robin() {
    let pool = new_pool(Algorithm::Hash, &[1, 1, 1, 1]);
    assert_eq!(count(&pool, 4000), [1000, 1000, 1000, 1000]);
    fail_checks(&pool.members()[1]);
    assert_eq!(
        count(&pool, 6000),
        [2000, 0, 2000, 2000],
        "a down member's turn spreads evenly, not onto its neighbour"
    );
}

#[test]
fn hash_keeps_keys_still_while_a_member_warms_up() {
    let mut cfg = config(Algorithm::Hash, &[1, 1, 1]);
    cfg.slow_start = Some(SlowStart {
        recovery: Duration::ZERO,
        warm: Duration::from_secs(10),
    });
    let pool = Pool::new(&cfg, &[], None);
    let keys = 20_000;
    let before = mapping(&pool, keys);
    pool.members()[0].begin_slow_start_at(T0);
    pool.refresh_at(T0 + 1000);
    let during: Vec<SocketAddr> = (0..keys)
        .map(|k| {
            pool.pick_at(&keyed(k), &[], T0 + 1000)
                .unwrap()
                .member
                .address
        })
        .collect();
    assert_eq!(during, before, "the ramp must not reshuffle keys");
}

// ---------------------------------------------------------------------------------------------
// Priority groups
// ---------------------------------------------------------------------------------------------

/// Group 2: members 0 (weight 2) and 1; group 1: members 2 and 3; group 0: member 4.
fn priority_pool(min_active: u32) -> Pool {
    let mut cfg = config(Algorithm::Priority, &[2, 1, 1, 1, 1]);
    cfg.min_active = min_active;
    for (m, prio) in cfg.members.iter_mut().zip([2, 2, 1, 1, 0]) {
        m.priority = prio;
    }
    Pool::new(&cfg, &checks(), None)
}

#[test]
fn priority_sends_everything_to_the_highest_group_by_weight() {
    let pool = priority_pool(1);
    assert_eq!(count(&pool, 6000), [4000, 2000, 0, 0, 0]);
    // Config order does not matter: the highest priority wins wherever it is listed.
    let mut cfg = config(Algorithm::Priority, &[1, 1, 1]);
    cfg.members[2].priority = 5;
    let pool = Pool::new(&cfg, &[], None);
    assert_eq!(count(&pool, 100), [0, 0, 100]);
}

#[test]
fn priority_next_group_joins_when_too_few_are_available() {
    let pool = priority_pool(2);
    let m = pool.members();
    assert_eq!(count(&pool, 6000), [4000, 2000, 0, 0, 0]);
    // One of group 2 down: 1 < min_active, so group 1 joins, weights kept (2:1:1).
    fail_checks(&m[1]);
    assert_eq!(count(&pool, 6000), [3000, 0, 1500, 1500, 0]);
    // Both of group 2 out: group 1 alone has 2 available, enough.
    m[0].set_state(AdminState::Disabled);
    assert_eq!(count(&pool, 6000), [0, 0, 3000, 3000, 0]);
    // One of group 1 out as well: group 0 joins.
    m[2].set_state(AdminState::Drain);
    assert_eq!(count(&pool, 6000), [0, 0, 0, 3000, 3000]);
    // Everything back: only the highest group again.
    pass_checks(&m[1]);
    m[0].set_state(AdminState::Enabled);
    m[2].set_state(AdminState::Enabled);
    assert_eq!(count(&pool, 6000), [4000, 2000, 0, 0, 0]);
}

#[test]
fn priority_with_min_active_one_falls_back_only_when_a_group_is_empty() {
    let pool = priority_pool(1);
    let m = pool.members();
    fail_checks(&m[1]);
    assert_eq!(count(&pool, 6000), [6000, 0, 0, 0, 0]);
    fail_checks(&m[0]);
    assert_eq!(count(&pool, 6000), [0, 0, 3000, 3000, 0]);
    // A retry that already failed on both of group 1 goes to group 0.
    let p = pool.pick(&PickContext::default(), &[2, 3]).unwrap();
    assert_eq!(p.index, 4);
}

#[test]
fn priority_member_without_weight_does_not_hold_its_group_open() {
    let pool = priority_pool(1);
    let m = pool.members();
    // An agent at 0% in group 2 and the other member out: group 2 has no one to take
    // traffic, so group 1 must.
    m[1].set_agent_weight_pct(0);
    m[0].set_state(AdminState::Disabled);
    pool.refresh();
    assert_eq!(count(&pool, 6000), [0, 0, 3000, 3000, 0]);
}

#[test]
fn priority_never_black_holes_between_refreshes() {
    // Group 1: member 0 alone; group 0: member 1. Member 0 is in slow start; the last refresh
    // was during its recovery (so the scheduler holds no turns for it), and recovery has since
    // ended. Until the next refresh the pool must still answer, from group 0.
    let mut cfg = config(Algorithm::Priority, &[1, 1]);
    cfg.members[0].priority = 1;
    cfg.slow_start = Some(SlowStart {
        recovery: Duration::from_secs(10),
        warm: Duration::from_secs(10),
    });
    let pool = Pool::new(&cfg, &[], None);
    pool.members()[0].begin_slow_start_at(T0);
    pool.refresh_at(T0 + 5_000);
    assert_eq!(pool.members()[0].effective_weight(), 0);
    let after_recovery = T0 + 11_000;
    assert_eq!(count_at(&pool, 100, after_recovery), [0, 100]);
    pool.refresh_at(after_recovery);
    assert_eq!(count_at(&pool, 100, after_recovery), [100, 0]);
}

// ---------------------------------------------------------------------------------------------
// First available
// ---------------------------------------------------------------------------------------------

#[test]
fn first_available_follows_config_order_and_skips_unavailable_or_full() {
    let mut cfg = config(Algorithm::FirstAvailable, &[1, 5, 1, 1]);
    cfg.members[1].max_connections = 2;
    let pool = Pool::new(&cfg, &checks(), None);
    let m = pool.members();
    assert_eq!(count(&pool, 100), [100, 0, 0, 0]);
    fail_checks(&m[0]);
    assert_eq!(count(&pool, 100), [0, 100, 0, 0]);
    {
        let _full = [m[1].open_connection(), m[1].open_connection()];
        assert_eq!(count(&pool, 100), [0, 0, 100, 0]);
        m[2].set_state(AdminState::Drain);
        assert_eq!(count(&pool, 100), [0, 0, 0, 100]);
        m[2].set_state(AdminState::Enabled);
    }
    assert_eq!(count(&pool, 100), [0, 100, 0, 0]);
    m[1].set_weight(0);
    assert_eq!(count(&pool, 100), [0, 0, 100, 0]);
    m[2].set_agent_weight_pct(0);
    assert_eq!(count(&pool, 100), [0, 0, 0, 100]);
    pass_checks(&m[0]);
    assert_eq!(count(&pool, 100), [100, 0, 0, 0]);
    assert_eq!(
        pool.pick(&PickContext::default(), &[0]).unwrap().index,
        3,
        "a retry skips the member that failed"
    );
}

// ---------------------------------------------------------------------------------------------
// Least request (power of two choices)
// ---------------------------------------------------------------------------------------------

#[test]
fn least_request_avoids_the_loaded_member() {
    fastrand::seed(1);
    let pool = new_pool(Algorithm::LeastRequest, &[1, 1, 1]);
    assert_shares(&count(&pool, 6000), &[1.0, 1.0, 1.0], 0.02);
    let _busy: Vec<_> = (0..10).map(|_| pool.members()[0].open_request()).collect();
    let counts = count(&pool, 6000);
    assert!(counts[0] < 60, "the loaded member got {counts:?}");
    assert_shares(&counts, &[0.0, 1.0, 1.0], 0.02);
}

#[test]
fn least_request_respects_weights_under_load() {
    fastrand::seed(2);
    let pool = new_pool(Algorithm::LeastRequest, &[3, 1]);
    assert_shares(&count_loaded(&pool, 4000), &[3.0, 1.0], 0.01);
    let pool = new_pool(Algorithm::LeastRequest, &[3, 2, 1]);
    assert_shares(&count_loaded(&pool, 6000), &[3.0, 2.0, 1.0], 0.02);
}

#[test]
fn least_request_balances_requests_in_flight() {
    // Requests held open across many members: in-flight counts stay level.
    fastrand::seed(3);
    let pool = new_pool(Algorithm::LeastRequest, &[1; 8]);
    let mut held = Vec::new();
    for _ in 0..800 {
        let p = pool.pick(&PickContext::default(), &[]).unwrap();
        held.push(p.member.open_request());
    }
    for m in pool.members() {
        let n = m.stats.active_requests.load(Ordering::Relaxed);
        assert!((95..=105).contains(&n), "{n} requests in flight");
    }
}

// ---------------------------------------------------------------------------------------------
// Slow start
// ---------------------------------------------------------------------------------------------

const RECOVERY_MS: u64 = 10_000;
const WARM_MS: u64 = 40_000;

fn slow_start_pool() -> Pool {
    let mut cfg = config(Algorithm::WeightedRoundRobin, &[1, 1]);
    cfg.slow_start = Some(SlowStart {
        recovery: Duration::from_millis(RECOVERY_MS),
        warm: Duration::from_millis(WARM_MS),
    });
    Pool::new(&cfg, &checks(), None)
}

#[test]
fn slow_start_recovery_gets_no_picks() {
    let pool = slow_start_pool();
    let m0 = &pool.members()[0];
    assert!(!m0.in_slow_start(), "a member starts at full weight");
    m0.begin_slow_start_at(T0);
    let now = T0 + RECOVERY_MS / 2;
    assert_eq!(m0.ramp(now), 0);
    assert_eq!(m0.slow_start_phase(now), "recovery");
    // Out at once, before any refresh...
    assert_eq!(count_at(&pool, 1000, now), [0, 1000]);
    // ...and after one.
    pool.refresh_at(now);
    assert_eq!(m0.effective_weight(), 0);
    assert_eq!(count_at(&pool, 1000, now), [0, 1000]);
    assert!(pool.wants_refresh());
    // The last millisecond of recovery is still recovery.
    assert_eq!(count_at(&pool, 10, T0 + RECOVERY_MS - 1), [0, 10]);
}

#[test]
fn slow_start_warm_ramps_weight_linearly() {
    let pool = slow_start_pool();
    let m0 = &pool.members()[0];
    m0.begin_slow_start_at(T0);
    // At the start of warm-up the member gets a sliver, never nothing.
    assert_eq!(m0.ramp(T0 + RECOVERY_MS), 1);
    for (pct, ramp, picks) in [(25, 64, 1260), (50, 128, 2100), (75, 192, 2700)] {
        let now = T0 + RECOVERY_MS + WARM_MS * pct / 100;
        assert_eq!(m0.ramp(now), ramp, "{pct}% of warm");
        assert_eq!(m0.slow_start_phase(now), "warm");
        pool.refresh_at(now);
        assert_eq!(m0.effective_weight(), ramp, "weight 1 × ramp");
        // Share ramp / (ramp + 256) of 6300 picks (a whole number of cycles for each).
        assert_eq!(
            count_at(&pool, 6300, now),
            [picks, 6300 - picks],
            "{pct}% of warm"
        );
    }
    // Linear in between, too.
    let mut last = 0;
    for ms in (0..=WARM_MS).step_by(1000) {
        let r = m0.ramp(T0 + RECOVERY_MS + ms.min(WARM_MS - 1));
        let want = (ms.min(WARM_MS - 1) * 256 / WARM_MS).max(1) as u32;
        assert_eq!(r, want);
        assert!(r >= last);
        last = r;
    }
    let done = T0 + RECOVERY_MS + WARM_MS;
    pool.refresh_at(done);
    assert_eq!(m0.effective_weight(), WEIGHT_SCALE);
    assert!(!m0.in_slow_start());
    assert_eq!(m0.slow_start_phase(done), "none");
    assert_eq!(count_at(&pool, 6300, done), [3150, 3150]);
}

#[test]
fn slow_start_scales_the_configured_weight() {
    let mut cfg = config(Algorithm::WeightedRoundRobin, &[4, 1]);
    cfg.slow_start = Some(SlowStart {
        recovery: Duration::ZERO,
        warm: Duration::from_millis(WARM_MS),
    });
    let pool = Pool::new(&cfg, &[], None);
    pool.members()[0].begin_slow_start_at(T0);
    // Half-way through warm-up weight 4 counts as 2.
    let now = T0 + WARM_MS / 2;
    pool.refresh_at(now);
    assert_eq!(pool.members()[0].effective_weight(), 2 * WEIGHT_SCALE);
    assert_eq!(count_at(&pool, 6000, now), [4000, 2000]);
}

#[test]
fn member_coming_back_up_begins_slow_start() {
    let pool = slow_start_pool();
    let m0 = &pool.members()[0];
    fail_checks(m0);
    pass_checks(m0);
    assert!(m0.in_slow_start());
    assert_eq!(m0.slow_start_phase(now_ms()), "recovery");
    assert!(pool.wants_refresh());
    // `pick` reads the real clock: 10s of recovery have not passed.
    assert_eq!(count(&pool, 100), [0, 100]);
    // Re-enabling a disabled member does the same.
    let m1 = &pool.members()[1];
    m1.set_state(AdminState::Disabled);
    m1.set_state(AdminState::Enabled);
    assert_eq!(m1.slow_start_phase(now_ms()), "recovery");
}

#[test]
fn without_slow_start_a_member_coming_back_is_at_full_weight_at_once() {
    let pool = new_pool(Algorithm::WeightedRoundRobin, &[1, 1]);
    fail_checks(&pool.members()[0]);
    pass_checks(&pool.members()[0]);
    assert!(!pool.members()[0].in_slow_start());
    assert_eq!(count(&pool, 100), [50, 50]);
}

// ---------------------------------------------------------------------------------------------
// Reload
// ---------------------------------------------------------------------------------------------

#[test]
fn reload_keeps_members_with_their_counters_and_health() {
    let cfg = config(Algorithm::RoundRobin, &[1, 1, 1]);
    let old = Pool::new(&cfg, &checks(), None);
    let o = old.members();
    let guard = o[1].open_connection();
    o[1].stats.add_bytes(100, 200);
    fail_checks(&o[2]);

    // Member 0 removed, a new member 9 added at the end.
    let mut cfg2 = cfg.clone();
    cfg2.members.remove(0);
    cfg2.members.push(member_cfg(9, 1));
    let new = Pool::new(&cfg2, &checks(), Some(&old));
    let n = new.members();
    assert!(Arc::ptr_eq(&n[0], &o[1]), "the same member, not a copy");
    assert!(Arc::ptr_eq(&n[1], &o[2]));
    assert!(o.iter().all(|m| !Arc::ptr_eq(&n[2], m)), "a new member");
    assert_eq!(n[0].stats.active_connections.load(Ordering::Relaxed), 1);
    assert_eq!(n[0].stats.connections_total.load(Ordering::Relaxed), 1);
    assert_eq!(n[0].stats.bytes_received.load(Ordering::Relaxed), 200);
    assert!(
        !n[1].health.is_up(),
        "a reload keeps the health a member had"
    );
    assert!(n[2].health.is_up(), "a new member starts up");
    assert_eq!(n[2].stats.connections_total.load(Ordering::Relaxed), 0);
    drop(guard);
    assert_eq!(n[0].stats.active_connections.load(Ordering::Relaxed), 0);
    assert_eq!(new.member_by_addr(addr(9)).map(|(i, _)| i), Some(2));
    assert!(new.member_by_addr(addr(0)).is_none());
    assert_eq!(count(&new, 1000), [500, 0, 500]);
    // Health keeps being fed through the new pool.
    pass_checks(&n[1]);
    assert_eq!(count(&new, 999), [333, 333, 333]);
}

#[test]
fn reload_keeps_api_weight_and_state_unless_the_config_changes_them() {
    let cfg = config(Algorithm::WeightedRoundRobin, &[1, 1, 1]);
    let old = Pool::new(&cfg, &[], None);
    old.members()[0].set_weight(3);
    old.members()[1].set_state(AdminState::Drain);
    old.refresh();
    assert_eq!(count(&old, 4000), [3000, 0, 1000]);

    // Same config: the operator's changes stay.
    let new = Pool::new(&cfg, &[], Some(&old));
    assert_eq!(new.members()[0].weight(), 3);
    assert_eq!(new.members()[1].state(), AdminState::Drain);
    assert_eq!(count(&new, 4000), [3000, 0, 1000]);

    // A config that changes only member 2 leaves members 0 and 1 as the operator set them.
    let mut cfg2 = cfg.clone();
    cfg2.members[2].weight = 2;
    let new2 = Pool::new(&cfg2, &[], Some(&new));
    assert_eq!(new2.members()[0].weight(), 3);
    assert_eq!(new2.members()[1].state(), AdminState::Drain);
    assert_eq!(count(&new2, 5000), [3000, 0, 2000]);

    // A config that changes their own values wins.
    let mut cfg3 = cfg2.clone();
    cfg3.members[0].weight = 2;
    cfg3.members[1].state = AdminState::Disabled;
    let new3 = Pool::new(&cfg3, &[], Some(&new2));
    assert_eq!(new3.members()[0].weight(), 2);
    assert_eq!(new3.members()[1].state(), AdminState::Disabled);
    assert_eq!(count(&new3, 4000), [2000, 0, 2000]);
}

#[test]
fn reload_keeps_a_slow_start_under_way() {
    let cfg = {
        let mut c = config(Algorithm::WeightedRoundRobin, &[1, 1]);
        c.slow_start = Some(SlowStart {
            recovery: Duration::ZERO,
            warm: Duration::from_millis(WARM_MS),
        });
        c
    };
    let old = Pool::new(&cfg, &[], None);
    old.members()[0].begin_slow_start_at(T0);
    let new = Pool::new(&cfg, &[], Some(&old));
    assert!(new.members()[0].in_slow_start());
    assert_eq!(new.members()[0].ramp(T0 + WARM_MS / 2), 128);
}

#[test]
fn a_member_added_by_reload_starts_a_slow_start_but_first_members_and_new_pools_do_not() {
    let slow = SlowStart {
        recovery: Duration::from_secs(5),
        warm: Duration::from_secs(5),
    };
    let mut one = config(Algorithm::WeightedRoundRobin, &[1]);
    one.slow_start = Some(slow);
    let mut two = config(Algorithm::WeightedRoundRobin, &[1, 1]);
    two.slow_start = Some(slow);
    // The first configuration (no previous pool): everyone at full weight.
    let first = Pool::new(&two, &[], None);
    assert!(first.members().iter().all(|m| !m.in_slow_start()));
    // A reload that adds a member: the new one warms up, the one that stayed does not.
    let old = Pool::new(&one, &[], None);
    let new = Pool::new(&two, &[], Some(&old));
    assert!(!new.members()[0].in_slow_start());
    assert!(new.members()[1].in_slow_start());
    assert_eq!(
        new.members()[1].slow_start_phase(crate::clock::now_ms()),
        "recovery"
    );
    assert_eq!(new.pick(&PickContext::default(), &[]).unwrap().index, 0);
    // Without slow_start on the pool, an added member is at full weight at once.
    let plain_old = Pool::new(&config(Algorithm::WeightedRoundRobin, &[1]), &[], None);
    let plain = Pool::new(
        &config(Algorithm::WeightedRoundRobin, &[1, 1]),
        &[],
        Some(&plain_old),
    );
    assert!(!plain.members()[1].in_slow_start());
}

// ---------------------------------------------------------------------------------------------
// Retries: the exclude list
// ---------------------------------------------------------------------------------------------

#[test]
fn exclude_list_is_honoured_by_every_algorithm() {
    for algorithm in ALL {
        fastrand::seed(4);
        let pool = new_pool(algorithm, &[1, 2, 3]);
        for k in 0..600 {
            for ctx in [keyed(k), PickContext::default()] {
                let p = pool.pick(&ctx, &[0]).unwrap();
                assert_ne!(p.index, 0, "{algorithm}");
                let p = pool.pick(&ctx, &[2, 0]).unwrap();
                assert_eq!(p.index, 1, "{algorithm}");
            }
        }
        // A hash client whose member failed retries elsewhere, but always on the same one.
        let home = pool.pick(&keyed(42), &[]).unwrap().index;
        let retry = pool.pick(&keyed(42), &[home]).unwrap().index;
        assert_ne!(retry, home);
        if algorithm == Algorithm::Hash {
            assert_eq!(pool.pick(&keyed(42), &[home]).unwrap().index, retry);
        }
        assert!(
            pool.pick(&keyed(1), &[0, 1, 2]).is_none(),
            "{algorithm}: all excluded"
        );
        assert_eq!(pool.no_member.load(Ordering::Relaxed), 1, "{algorithm}");
    }
}

// ---------------------------------------------------------------------------------------------
// Robustness
// ---------------------------------------------------------------------------------------------

#[test]
fn huge_weights_saturate_instead_of_wrapping() {
    // Beyond the config's range (the config allows up to 65535), as an API or agent could set.
    let pool = Pool::new(
        &config(Algorithm::WeightedRoundRobin, &[1 << 24, 1]),
        &[],
        None,
    );
    let counts = count(&pool, 6000);
    assert!(counts[0] > 5990, "{counts:?}");
    let pool = new_pool(Algorithm::DynamicFeedback, &[65535, 1]);
    pool.members()[0].set_weight(u32::MAX);
    pool.members()[0].set_agent_weight_pct(100_000);
    pool.refresh();
    let counts = count(&pool, 6000);
    assert!(counts[0] > 5990, "{counts:?}");
}

#[test]
fn empty_pool_picks_nothing() {
    for algorithm in ALL {
        let pool = new_pool(algorithm, &[]);
        assert!(pool.pick(&keyed(1), &[]).is_none(), "{algorithm}");
        assert!(pool.pick(&PickContext::default(), &[]).is_none());
        assert!(pool.persistent(addr(0), &[]).is_none());
    }
}

#[test]
fn removing_the_failing_monitor_brings_the_member_up_through_slow_start() {
    let m = Member::new("p".into(), &member_cfg(0, 1));
    m.set_slow_start(Duration::from_secs(5), Duration::from_secs(10));
    assert_eq!(
        m.configure_checks(&checks()),
        None,
        "a new monitor starts up"
    );
    fail_checks(&m);
    assert!(!m.health.is_up());
    // A reload drops the monitor: the member comes up, and like any member that comes back it
    // starts in slow start's recovery phase rather than at full weight at once.
    assert_eq!(m.configure_checks(&[]), Some(true));
    assert!(m.health.is_up());
    assert_eq!(m.slow_start_phase(crate::clock::now_ms()), "recovery");
}

// ---------------------------------------------------------------------------------------------
// Attempts: one client's tries at a pool
// ---------------------------------------------------------------------------------------------

#[test]
fn attempts_try_each_member_once_within_the_retry_budget() {
    // retries = 2: the first member and two more, never one twice.
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1, 1, 1]);
    let mut a = pool.attempts(PickContext::default(), None);
    let mut seen = Vec::new();
    loop {
        let p = a.next_member().expect("a member");
        assert!(!seen.contains(&p.index), "member {} tried twice", p.index);
        seen.push(p.index);
        assert!(!a.persisted());
        if !a.failed(&p) {
            break;
        }
    }
    assert_eq!(seen.len(), 3);
    assert_eq!(a.tried(), 3);
}

#[test]
fn attempts_start_with_the_remembered_member_and_leave_it_once_it_failed() {
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1, 1]);
    let mut a = pool.attempts(PickContext::default(), Some(addr(2)));
    let first = a.next_member().expect("a member");
    assert_eq!(first.index, 2);
    assert!(a.persisted());
    assert!(a.may_retry());
    assert!(a.failed(&first));
    let second = a.next_member().expect("a member");
    assert_ne!(second.index, 2);
    assert!(!a.persisted());
}

#[test]
fn attempts_skip_a_remembered_member_that_is_down() {
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1]);
    fail_checks(&pool.members()[1]);
    let mut a = pool.attempts(PickContext::default(), Some(addr(1)));
    let p = a.next_member().expect("a member");
    assert_eq!(p.index, 0);
    assert!(!a.persisted());
}

#[test]
fn attempts_same_again_goes_back_to_the_member_without_counting_a_try() {
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1, 1]);
    let mut a = pool.attempts(PickContext::default(), None);
    let p = a.next_member().expect("a member");
    a.same_again(&p);
    let q = a.next_member().expect("a member");
    assert_eq!(p.index, q.index);
    assert_eq!(a.tried(), 0);
    // Only once: the attempt after goes where the scheduler says.
    let r = a.next_member().expect("a member");
    assert_ne!(r.index, q.index, "round robin moves on");
}

#[test]
fn attempts_with_no_member_available_say_so_before_any_try() {
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1]);
    for m in pool.members() {
        fail_checks(m);
    }
    let mut a = pool.attempts(PickContext::default(), Some(addr(0)));
    assert!(a.next_member().is_none());
    assert_eq!(a.tried(), 0);
}

#[test]
fn attempts_stop_when_every_member_failed_even_within_the_budget() {
    let mut cfg = config(Algorithm::RoundRobin, &[1, 1]);
    cfg.retries = 5;
    let pool = Pool::new(&cfg, &checks(), None);
    let mut a = pool.attempts(PickContext::default(), None);
    let p = a.next_member().expect("a member");
    assert!(a.failed(&p));
    let q = a.next_member().expect("a member");
    assert!(a.failed(&q));
    assert!(a.next_member().is_none());
    assert_eq!(a.tried(), 2);
}

#[test]
fn attempts_after_earlier_failures_avoid_those_members_and_count_them() {
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1, 1]);
    // addr(7) is no longer in the pool (a reload removed it): ignored.
    let mut a = pool
        .attempts(PickContext::default(), Some(addr(1)))
        .after(&[addr(1), addr(7), addr(1)]);
    assert_eq!(a.tried(), 1);
    for _ in 0..6 {
        let p = a.next_member().expect("a member");
        assert_ne!(
            p.index, 1,
            "the member the client failed on is not given again"
        );
        assert!(!a.persisted());
    }
    // retries = 2: one failure before, two more allowed.
    let p = a.next_member().expect("a member");
    assert!(a.failed(&p));
    let q = a.next_member().expect("a member");
    assert!(!a.failed(&q));
    assert!(a.all_out());
}

#[test]
fn attempts_pass_over_leaves_a_member_out_without_counting_a_try() {
    let pool = new_pool(Algorithm::RoundRobin, &[1, 1, 1]);
    let mut a = pool.attempts(PickContext::default(), Some(addr(0)));
    let first = a.next_member().expect("a member");
    assert_eq!(first.index, 0);
    assert!(a.persisted());
    a.pass_over(&first);
    a.pass_over(&first);
    assert_eq!(a.tried(), 0, "passed over is not a try");
    assert!(a.may_retry());
    let second = a.next_member().expect("a member");
    assert_ne!(
        second.index, 0,
        "a passed-over remembered member is not given again"
    );
    assert!(!a.persisted());
    a.pass_over(&second);
    let third = a.next_member().expect("a member");
    assert!(![0, second.index].contains(&third.index));
    assert!(!a.all_out());
    // Failing a passed-over member counts it once; failing it again does not.
    assert!(a.failed(&second));
    assert!(a.failed(&second));
    assert_eq!(a.tried(), 1);
    a.pass_over(&third);
    assert!(a.all_out());
    assert!(a.next_member().is_none());
    assert_eq!(a.tried(), 1);
}

#[test]
fn attempts_any_member_asks_the_scheduler_with_nothing_excluded() {
    // A lone member that failed the client: the walk is over, but it may serve once more.
    let pool = new_pool(Algorithm::RoundRobin, &[1]);
    let mut a = pool
        .attempts(PickContext::default(), None)
        .after(&[addr(0)]);
    assert!(a.all_out());
    assert!(a.next_member().is_none());
    assert_eq!(a.any_member().expect("the member").index, 0);
    assert_eq!(a.tried(), 1, "any_member leaves the attempts as they are");
    fail_checks(&pool.members()[0]);
    assert!(
        a.any_member().is_none(),
        "a member that is down is not given"
    );
}

// ---------------------------------------------------------------------------------------------
// Elastic pools
// ---------------------------------------------------------------------------------------------

/// Two serving members of 10 connections each and two standby members; joins at 80 %, leaves
/// below 40 % held for 5 s.
fn elastic_pool() -> Pool {
    let mut cfg = config(Algorithm::LeastConnections, &[1, 1, 1, 1]);
    for (i, m) in cfg.members.iter_mut().enumerate() {
        m.max_connections = 10;
        m.standby = i >= 2;
    }
    cfg.elastic = Some(fulcrum_config::Elastic {
        on: fulcrum_config::ElasticOn::Connections,
        join: 0.8,
        leave: 0.4,
        join_after: Duration::ZERO,
        leave_after: Duration::from_secs(5),
        target: None,
        hook: vec![],
        hook_timeout: Duration::from_secs(1),
    });
    Pool::new(&cfg, &checks(), None)
}

#[test]
fn standby_members_get_no_clients_until_they_join() {
    let pool = elastic_pool();
    let ctx = PickContext::default();
    for _ in 0..100 {
        let p = pool.pick(&ctx, &[]).expect("a member");
        assert!(p.index < 2, "standby member {} picked", p.index);
    }
    assert_eq!(pool.available(), 2);
    // Below the threshold nothing happens.
    assert!(pool.elastic_tick(T0).is_none());
}

#[test]
fn elastic_joins_above_threshold_and_leaves_after_hysteresis() {
    let pool = elastic_pool();
    let ctx = PickContext::default();
    // 16 of 20 connections: 80 %.
    let mut held: Vec<_> = (0..16)
        .map(|_| {
            pool.pick(&ctx, &[])
                .expect("member")
                .member
                .open_connection()
        })
        .collect();
    let ev = pool.elastic_tick(T0).expect("a join");
    assert_eq!(ev.action, crate::ElasticAction::Join);
    assert_eq!(&*ev.member, "10.0.0.3:80");
    assert!((ev.utilisation - 0.8).abs() < 1e-9);
    assert_eq!((ev.joined, ev.standby), (1, 2));
    // 16 of 30: below join, above leave: nothing moves.
    assert!(pool.elastic_tick(T0 + 200).is_none());
    // The new member takes the next clients (least connections).
    let p = pool.pick(&ctx, &[]).expect("member");
    assert_eq!(p.index, 2);
    held.push(p.member.open_connection());
    // Load falls to 3 of 30 (10 %): the member leaves only after 5 s below 40 %.
    held.truncate(3);
    assert!(pool.elastic_tick(T0 + 1_000).is_none());
    assert!(pool.elastic_tick(T0 + 5_000).is_none());
    // A bounce above `leave` restarts the hold.
    let bounce: Vec<_> = (0..10)
        .map(|_| {
            pool.pick(&ctx, &[])
                .expect("member")
                .member
                .open_connection()
        })
        .collect();
    assert!(pool.elastic_tick(T0 + 5_500).is_none());
    drop(bounce);
    assert!(pool.elastic_tick(T0 + 6_000).is_none());
    assert!(pool.elastic_tick(T0 + 10_999).is_none());
    let ev = pool.elastic_tick(T0 + 11_000).expect("a leave");
    assert_eq!(ev.action, crate::ElasticAction::Leave);
    assert_eq!(&*ev.member, "10.0.0.3:80");
    assert_eq!(ev.joined, 0);
    for _ in 0..50 {
        assert!(pool.pick(&ctx, &[]).expect("member").index < 2);
    }
    let e = pool.elastic.as_ref().expect("elastic");
    assert_eq!(e.joins.load(Ordering::Relaxed), 1);
    assert_eq!(e.leaves.load(Ordering::Relaxed), 1);
}

#[test]
fn elastic_joins_one_at_a_time_and_skips_down_standby_members() {
    let pool = elastic_pool();
    fail_checks(&pool.members()[2]);
    let ctx = PickContext::default();
    let _held: Vec<_> = (0..20)
        .map(|_| {
            pool.pick(&ctx, &[])
                .expect("member")
                .member
                .open_connection()
        })
        .collect();
    let ev = pool.elastic_tick(T0).expect("a join");
    assert_eq!(
        &*ev.member, "10.0.0.4:80",
        "the down standby member is skipped"
    );
    // 20 of 20 still (the joined member has none yet) but nothing is left to join.
    assert!(pool.elastic_tick(T0 + 200).is_none());
}

#[test]
fn elastic_does_not_leave_when_the_rest_would_cross_join_again() {
    let mut pool = elastic_pool();
    // Join at 50 %, leave below 40 %.
    let mut cfg = pool.config.clone();
    if let Some(e) = cfg.elastic.as_mut() {
        e.join = 0.5;
    }
    pool = Pool::new(&cfg, &checks(), Some(&pool));
    let ctx = PickContext::default();
    let mut held: Vec<_> = (0..10)
        .map(|_| {
            pool.pick(&ctx, &[])
                .expect("member")
                .member
                .open_connection()
        })
        .collect();
    assert!(pool.elastic_tick(T0).is_some());
    held.extend((0..1).map(|_| {
        pool.pick(&ctx, &[])
            .expect("member")
            .member
            .open_connection()
    }));
    // 11 of 30 = 37 % is below `leave`, but without the joined member 11 of 20 = 55 % would
    // be above `join` again: it stays.
    assert!(pool.elastic_tick(T0 + 1).is_none());
    assert!(pool.elastic_tick(T0 + 60_000).is_none());
    // At 7 of 30 (7 of 20 = 35 % without it) it goes: the pool has been below `leave` since
    // T0 + 1, longer than `leave_after`.
    held.truncate(7);
    let ev = pool.elastic_tick(T0 + 60_001).expect("a leave");
    assert_eq!(ev.action, crate::ElasticAction::Leave);
}

#[test]
fn elastic_on_response_time_joins_when_slow_and_counts_an_idle_pool_as_zero() {
    let mut cfg = config(Algorithm::RoundRobin, &[1, 1, 1]);
    cfg.members[2].standby = true;
    cfg.elastic = Some(fulcrum_config::Elastic {
        on: fulcrum_config::ElasticOn::ResponseTime,
        join: 1.0,
        leave: 0.5,
        join_after: Duration::from_millis(400),
        leave_after: Duration::from_secs(1),
        target: Some(Duration::from_millis(100)),
        hook: vec![],
        hook_timeout: Duration::from_secs(1),
    });
    let pool = Pool::new(&cfg, &checks(), None);
    let ctx = PickContext::default();
    let traffic = |ms: u64| {
        for _ in 0..4 {
            let p = pool.pick(&ctx, &[]).expect("member");
            drop(p.member.open_request());
            p.member
                .stats
                .observe_response_time(Duration::from_millis(ms));
        }
    };
    // 150 ms against a 100 ms target: 1.5, held for join_after before the join.
    traffic(150);
    assert!(pool.elastic_tick(T0).is_none());
    traffic(150);
    assert!(pool.elastic_tick(T0 + 200).is_none());
    traffic(150);
    let ev = pool.elastic_tick(T0 + 400).expect("a join");
    assert!(ev.utilisation > 1.0, "{ev:?}");
    assert_eq!(ev.on, "response_time");
    // No traffic at all: the stale averages do not keep it in; it leaves after leave_after.
    // The first idle tick still sees the last requests; the next ones see none.
    let _ = pool.elastic_tick(T0 + 600);
    assert!(pool.elastic_tick(T0 + 800).is_none());
    let ev = pool.elastic_tick(T0 + 1_700).expect("a leave");
    assert_eq!(ev.action, crate::ElasticAction::Leave);
}

//! Elastic pools: standby members join when the pool's utilisation crosses `join` and leave,
//! last joined first, once it has stayed below `leave` for `leave_after`.
//!
//! A standby member is an ordinary member that `Member::benched` keeps out of the scheduling
//! until it joins, so every algorithm, persistence and health rule applies to it unchanged.
//! The control plane calls `Pool::elastic_tick` periodically and acts on the events (log, hook,
//! metrics); this module only decides, over the pool's members (it does not know the pool, so
//! the pool can own its state without the two modules needing each other).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use fulcrum_config::{AdminState, Elastic, ElasticOn};
use parking_lot::Mutex;
use serde::Serialize;

use crate::member::Member;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ElasticAction {
    Join,
    Leave,
}

/// One join or leave, as the hook receives it (JSON on stdin) and the log shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ElasticEvent {
    pub pool: String,
    pub member: String,
    pub action: ElasticAction,
    /// "connections" or "response_time".
    pub on: &'static str,
    /// The utilisation that caused it, as a fraction (1.0 = the limits or the target).
    pub utilisation: f64,
    /// The threshold it crossed (`join` or `leave`).
    pub threshold: f64,
    /// Standby members serving after the event, and standby members in the pool.
    pub joined: usize,
    pub standby: usize,
}

#[derive(Debug, Default)]
struct Timers {
    /// When the utilisation was first seen at or above `join` (0 = it is not).
    above_since: u64,
    /// When it was first seen below `leave` (0 = it is not).
    below_since: u64,
    /// The serving members' connections + requests at the last tick (response_time mode: a
    /// pool that saw no traffic is idle whatever its last response time said).
    activity: u64,
}

/// An elastic pool's settings and running state.
#[derive(Debug)]
pub struct ElasticState {
    pub config: Elastic,
    timers: Mutex<Timers>,
    /// Last utilisation, f64 bits.
    utilisation: AtomicU64,
    pub joins: AtomicU64,
    pub leaves: AtomicU64,
    /// Hook runs that failed (exit status, timeout, could not start); kept by the caller.
    pub hook_runs: AtomicU64,
    pub hook_failures: AtomicU64,
}

impl ElasticState {
    /// Counters carry over from the pool before a reload; the timers start again.
    pub fn new(config: Elastic, previous: Option<&ElasticState>) -> Self {
        let carry = |f: fn(&ElasticState) -> &AtomicU64| {
            AtomicU64::new(previous.map_or(0, |p| f(p).load(Ordering::Relaxed)))
        };
        ElasticState {
            config,
            timers: Mutex::new(Timers::default()),
            utilisation: AtomicU64::new(0f64.to_bits()),
            joins: carry(|p| &p.joins),
            leaves: carry(|p| &p.leaves),
            hook_runs: carry(|p| &p.hook_runs),
            hook_failures: carry(|p| &p.hook_failures),
        }
    }

    /// The utilisation at the last tick (a fraction).
    pub fn utilisation(&self) -> f64 {
        f64::from_bits(self.utilisation.load(Ordering::Relaxed))
    }

    pub fn on(&self) -> &'static str {
        match self.config.on {
            ElasticOn::Connections => "connections",
            ElasticOn::ResponseTime => "response_time",
        }
    }
}

/// A member that serves new clients in principle (what the operator and health allow),
/// whatever its momentary connection limit says.
fn serving(m: &Member) -> bool {
    m.health.is_up() && m.effective_state() == AdminState::Enabled && !m.benched()
}

/// A standby member that could join now.
fn can_join(m: &Member) -> bool {
    m.benched() && m.health.is_up() && m.effective_state() == AdminState::Enabled
}

impl ElasticState {
    /// The pool's utilisation now, over the members serving it (`serving`). `without` leaves
    /// one member out, to ask whether the pool could do without it.
    fn utilisation_of(
        &self,
        members: &[Arc<Member>],
        without: Option<&Member>,
        timers: &Timers,
    ) -> f64 {
        let serving_now = members
            .iter()
            .filter(|m| serving(m) && without.is_none_or(|w| !std::ptr::eq(w, m.as_ref())));
        match self.config.on {
            ElasticOn::Connections => {
                let (mut active, mut limit) = (0u64, 0u64);
                for m in serving_now {
                    active += m.stats.active_connections.load(Ordering::Relaxed);
                    limit += u64::from(m.max_connections());
                }
                if limit == 0 {
                    // Nothing serves: as loaded as a pool can be.
                    return self.config.join.max(1.0);
                }
                active as f64 / limit as f64
            }
            ElasticOn::ResponseTime => {
                if activity(members) == timers.activity {
                    return 0.0;
                }
                let target = self.config.target.map_or(1.0, |t| t.as_secs_f64() * 1e6);
                let times: Vec<f64> = serving_now
                    .map(|m| m.stats.response_time_us())
                    .filter(|t| *t > 0.0)
                    .collect();
                if times.is_empty() {
                    return 0.0;
                }
                times.iter().sum::<f64>() / times.len() as f64 / target
            }
        }
    }

    /// One evaluation at `now` (`clock::now_ms()`) over the members of pool `pool`: joins the
    /// first standby member that can join (config order) when the utilisation has been at or
    /// above `join` for `join_after`, or lets the last joined member leave when it has been below
    /// `leave` for `leave_after` and the others could carry the load without climbing back to
    /// `join`. At most one event per tick, so each change is measured before the next.
    pub fn tick(&self, pool: &str, members: &[Arc<Member>], now: u64) -> Option<ElasticEvent> {
        let mut timers = self.timers.lock();
        let u = self.utilisation_of(members, None, &timers);
        timers.activity = activity(members);
        self.utilisation.store(u.to_bits(), Ordering::Relaxed);
        let cfg = &self.config;
        let mut event = None;
        if u >= cfg.join {
            timers.below_since = 0;
            let since = *nonzero(&mut timers.above_since, now);
            if now.saturating_sub(since) >= cfg.join_after.as_millis() as u64 {
                if let Some(m) = members.iter().find(|m| can_join(m)) {
                    m.set_joined(now);
                    m.begin_slow_start();
                    self.joins.fetch_add(1, Ordering::Relaxed);
                    // The next join needs `join_after` of its own.
                    timers.above_since = now;
                    event = Some((m.clone(), ElasticAction::Join, cfg.join));
                }
            }
        } else if u < cfg.leave {
            timers.above_since = 0;
            let since = *nonzero(&mut timers.below_since, now);
            let last = members
                .iter()
                .filter(|m| m.is_joined())
                .max_by_key(|m| m.joined_ms());
            if let Some(m) = last {
                let held = now.saturating_sub(since) >= cfg.leave_after.as_millis() as u64;
                if held && self.utilisation_of(members, Some(m), &timers) < cfg.join {
                    m.set_joined(0);
                    self.leaves.fetch_add(1, Ordering::Relaxed);
                    timers.below_since = now;
                    event = Some((m.clone(), ElasticAction::Leave, cfg.leave));
                }
            }
        } else {
            timers.above_since = 0;
            timers.below_since = 0;
        }
        drop(timers);
        let (m, action, threshold) = event?;
        let standby = members.iter().filter(|m| m.is_standby()).count();
        let joined = members.iter().filter(|m| m.is_joined()).count();
        Some(ElasticEvent {
            pool: pool.to_string(),
            member: m.label.to_string(),
            action,
            on: self.on(),
            utilisation: u,
            threshold,
            joined,
            standby,
        })
    }
}

/// Connections and requests over the serving members so far.
fn activity(members: &[Arc<Member>]) -> u64 {
    members
        .iter()
        .filter(|m| serving(m))
        .map(|m| {
            m.stats.connections_total.load(Ordering::Relaxed)
                + m.stats.requests_total.load(Ordering::Relaxed)
        })
        .sum()
}

fn nonzero(v: &mut u64, now: u64) -> &mut u64 {
    if *v == 0 {
        *v = now;
    }
    v
}

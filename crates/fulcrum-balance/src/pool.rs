//! A pool: members, one scheduler, and the options every data plane reads.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_config::{Algorithm, HashKey, SlowStart};
use parking_lot::Mutex;

use crate::clock::now_ms;
use crate::health::CheckSpec;
use crate::member::{Member, WEIGHT_SCALE};
use crate::sched::{self, PickContext, RebuildInput, Scheduler};

/// Fastest-response weights never drop below this fraction of the member's weight, so a slow
/// member keeps a trickle of traffic and its response time keeps being measured.
const FASTEST_FLOOR: f64 = 0.05;

pub struct Pool {
    pub name: Arc<str>,
    pub config: fulcrum_config::Pool,
    pub algorithm: Algorithm,
    pub hash_key: HashKey,
    pub retries: u32,
    pub connect_timeout: Duration,
    pub slow_start: Option<SlowStart>,
    members: Vec<Arc<Member>>,
    by_addr: HashMap<SocketAddr, usize>,
    scheduler: Box<dyn Scheduler>,
    /// The input the scheduler was last rebuilt from, to skip identical rebuilds.
    last_input: Mutex<Option<RebuildInput>>,
    /// Requests that found no member, for the API and metrics.
    pub no_member: AtomicU64,
    /// Picks made in panic mode (every member down, some only by passive observation: those
    /// are used rather than refusing the client), for the API and metrics.
    pub panic_picks: AtomicU64,
    /// Standby members joining on utilisation (`elastic` table), if configured.
    pub elastic: Option<crate::elastic::ElasticState>,
    /// Whether only datagram (UDP) services use the pool, so reachability probes must not be
    /// TCP connects.
    datagram: AtomicBool,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name)
            .field("algorithm", &self.algorithm)
            .field("members", &self.members.len())
            .finish()
    }
}

/// A member chosen for a client.
#[derive(Debug, Clone)]
pub struct Picked {
    pub index: usize,
    pub member: Arc<Member>,
}

impl Pool {
    /// Builds a pool from its config. Members of `previous` (the same pool before a reload) with
    /// the same address are kept, with their health, counters and slow-start phase; members new
    /// to a pool that had a `previous` start a slow start (if the pool has one), so a server
    /// added by a reload warms up.
    pub fn new(cfg: &fulcrum_config::Pool, checks: &[CheckSpec], previous: Option<&Pool>) -> Pool {
        Self::new_labeled(cfg, checks, previous, &[])
    }

    /// As `new`, with new members shown under `labels[i]` (member `i` in config order) instead
    /// of their address: sites and links have names.
    pub fn new_labeled(
        cfg: &fulcrum_config::Pool,
        checks: &[CheckSpec],
        previous: Option<&Pool>,
        labels: &[Arc<str>],
    ) -> Pool {
        let name: Arc<str> = Arc::from(cfg.name.as_str());
        let slow = cfg.slow_start.unwrap_or_default();
        let members: Vec<Arc<Member>> = cfg
            .members
            .iter()
            .enumerate()
            .map(|(i, mc)| {
                let (member, added) = match previous.and_then(|p| p.member_by_addr(mc.address)) {
                    Some((_, old)) if labels.get(i).is_none_or(|l| *l == old.label) => {
                        old.reconfigure(mc);
                        (old.clone(), false)
                    }
                    _ => {
                        let m = match labels.get(i) {
                            Some(label) => Member::new_labeled(name.clone(), mc, label.clone()),
                            None => Member::new(name.clone(), mc),
                        };
                        (Arc::new(m), true)
                    }
                };
                member.set_slow_start(slow.recovery, slow.warm);
                member.configure_checks(checks);
                // A server added to a running pool warms up like one that comes back (the
                // case Sangfor's warm-up and HAProxy's slowstart exist for). Members of the
                // first config and of a pool that is new as a whole start at full weight, as
                // HAProxy's do at start: holding every member of a pool in recovery would
                // black-hole it, and throttling all of them after a restart helps nobody.
                if added && previous.is_some() {
                    member.begin_slow_start();
                }
                member
            })
            .collect();
        let by_addr = members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.address, i))
            .collect();
        let pool = Pool {
            scheduler: sched::for_algorithm(cfg.algorithm, cfg.min_active),
            name,
            config: cfg.clone(),
            algorithm: cfg.algorithm,
            hash_key: cfg.hash_key.clone(),
            retries: cfg.retries,
            connect_timeout: cfg.connect_timeout,
            slow_start: cfg
                .slow_start
                .filter(|s| !(s.recovery.is_zero() && s.warm.is_zero())),
            members,
            by_addr,
            last_input: Mutex::new(None),
            no_member: AtomicU64::new(0),
            panic_picks: AtomicU64::new(0),
            elastic: cfg.elastic.clone().map(|e| {
                crate::elastic::ElasticState::new(e, previous.and_then(|p| p.elastic.as_ref()))
            }),
            datagram: AtomicBool::new(false),
        };
        pool.refresh_at(now_ms());
        pool
    }

    /// Marks the pool as served only by datagram (UDP) services.
    pub fn set_datagram(&self, datagram: bool) {
        self.datagram.store(datagram, Ordering::Relaxed);
    }

    /// Whether only datagram (UDP) services use the pool.
    pub fn is_datagram(&self) -> bool {
        self.datagram.load(Ordering::Relaxed)
    }

    pub fn members(&self) -> &[Arc<Member>] {
        &self.members
    }

    pub fn member_by_addr(&self, addr: SocketAddr) -> Option<(usize, &Arc<Member>)> {
        self.by_addr.get(&addr).map(|&i| (i, &self.members[i]))
    }

    /// The clock reading picks need: 0 (no read) when the pool has no slow start.
    #[inline]
    fn pick_clock(&self) -> u64 {
        if self.slow_start.is_some() {
            now_ms()
        } else {
            0
        }
    }

    /// Chooses a member for a new client, skipping the indices in `exclude` (members this client
    /// already failed on).
    #[inline]
    pub fn pick(&self, ctx: &PickContext, exclude: &[usize]) -> Option<Picked> {
        self.pick_at(ctx, exclude, self.pick_clock())
    }

    /// `pick` at a given clock reading (`clock::now_ms()`; 0 skips the slow-start recovery
    /// check), so slow start can be driven by hand.
    pub fn pick_at(&self, ctx: &PickContext, exclude: &[usize], now: u64) -> Option<Picked> {
        let ok = |i: usize| !exclude.contains(&i) && self.members[i].accepts_new(now);
        let mut found = self.scheduler.pick(&self.members, ctx, &ok);
        if found.is_none() && self.in_panic() {
            // Panic mode: nothing in the pool is up, and passive observation alone (failed
            // connections, counted statuses) holds some members down. Refusing every client
            // until a probe brings one back turns one member's bad minute into an outage;
            // nginx never marks an upstream's only server down and Envoy routes to all
            // members below its panic threshold. Members a monitor says are down stay out.
            let panic = |i: usize| !exclude.contains(&i) && self.members[i].accepts_in_panic(now);
            found = self.scheduler.pick(&self.members, ctx, &panic);
            if found.is_some() {
                self.panic_picks.fetch_add(1, Ordering::Relaxed);
            }
        }
        match found {
            Some(index) => Some(Picked {
                index,
                member: self.members[index].clone(),
            }),
            None => {
                self.no_member.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Whether the pool is in panic mode: no member is serving (up and enabled), and at least
    /// one is down by passive observation alone, so picks use those.
    pub fn in_panic(&self) -> bool {
        !self.members.iter().any(|m| m.serving())
            && self.members.iter().any(|m| m.health.down_only_passively())
    }

    /// The member persistence points at, if it may still take this client (drain does; down,
    /// disabled and removed members do not).
    pub fn persistent(&self, addr: SocketAddr, exclude: &[usize]) -> Option<Picked> {
        let (index, member) = self.member_by_addr(addr)?;
        (!exclude.contains(&index) && member.accepts_persistent(self.pick_clock())).then(|| {
            Picked {
                index,
                member: member.clone(),
            }
        })
    }

    /// Members that can take a new client now.
    pub fn available(&self) -> usize {
        let now = self.pick_clock();
        self.members.iter().filter(|m| m.accepts_new(now)).count()
    }

    /// One evaluation of the pool's elastic settings at `now` (`clock::now_ms()`); see
    /// `ElasticState::tick`. After a join or leave the scheduler is rebuilt at once.
    pub fn elastic_tick(&self, now: u64) -> Option<crate::elastic::ElasticEvent> {
        let event = self
            .elastic
            .as_ref()?
            .tick(&self.name, self.members(), now)?;
        self.refresh_at(now);
        Some(event)
    }

    /// Recomputes effective weights (slow-start ramps, agent weights, measured speed) and rebuilds
    /// the scheduler when they changed. The control plane calls this periodically and after an
    /// operator changes a member.
    pub fn refresh(&self) {
        self.refresh_at(now_ms());
    }

    pub fn refresh_at(&self, now: u64) {
        for m in &self.members {
            m.stats.sample_traffic(now);
        }
        let unweighted = sched::unweighted(self.algorithm);
        let stable: Vec<u32> = self
            .members
            .iter()
            .map(|m| {
                let w = if unweighted { 1 } else { m.weight() };
                let scaled =
                    u64::from(w) * u64::from(WEIGHT_SCALE) * u64::from(m.agent_weight_pct()) / 100;
                // An agent at 1% of weight 1 still leaves the member one unit; an API weight or an
                // agent percentage far beyond the config's range saturates instead of wrapping.
                // A standby member out of the pool has no share (hash tables, weighted rings).
                if w > 0 && m.agent_weight_pct() > 0 && !m.benched() {
                    u32::try_from(scaled).unwrap_or(u32::MAX).max(1)
                } else {
                    0
                }
            })
            .collect();
        let speed = (self.algorithm == Algorithm::FastestResponse).then(|| self.speed_factors());
        let weights: Vec<u32> = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut w = u64::from(stable[i]) * u64::from(m.ramp(now)) / u64::from(WEIGHT_SCALE);
                if let Some(f) = &speed {
                    w = ((w as f64) * f[i]).round() as u64;
                }
                let w = if stable[i] > 0 && m.ramp(now) > 0 {
                    w.max(1)
                } else {
                    w
                };
                m.store_effective_weight(w as u32);
                w as u32
            })
            .collect();
        let input = RebuildInput {
            weights,
            priorities: self.members.iter().map(|m| m.priority()).collect(),
            names: self.members.iter().map(|m| m.label.to_string()).collect(),
            stable_weights: stable,
        };
        let mut last = self.last_input.lock();
        let same = last.as_ref().is_some_and(|l| {
            l.weights == input.weights
                && l.priorities == input.priorities
                && l.stable_weights == input.stable_weights
        });
        if !same {
            self.scheduler.rebuild(&input);
            *last = Some(input);
        }
    }

    /// Per-member multipliers for fastest_response: inversely proportional to the response time
    /// EWMA, relative to the fastest member, floored at `FASTEST_FLOOR`. Members without a sample
    /// yet are treated as average, so they get traffic and get measured.
    fn speed_factors(&self) -> Vec<f64> {
        let times: Vec<f64> = self
            .members
            .iter()
            .map(|m| m.stats.response_time_us())
            .collect();
        let measured: Vec<f64> = times.iter().copied().filter(|t| *t > 0.0).collect();
        if measured.is_empty() {
            return vec![1.0; times.len()];
        }
        let mean = measured.iter().sum::<f64>() / measured.len() as f64;
        let best = measured.iter().copied().fold(f64::INFINITY, f64::min);
        times
            .iter()
            .map(|&t| {
                let t = if t > 0.0 { t } else { mean };
                (best / t).clamp(FASTEST_FLOOR, 1.0)
            })
            .collect()
    }

    /// Whether this pool needs periodic refreshes (dynamic weights, slow starts under way).
    pub fn wants_refresh(&self) -> bool {
        self.scheduler.dynamic()
            || self.algorithm == Algorithm::WeightedLeastTraffic
            || self.members.iter().any(|m| m.in_slow_start())
    }
}

//! The service: one task per (pool, member, monitor), kept across reloads, plus the back-off
//! probe supervisor.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use fulcrum_balance::{AgentState, Member, Pool};
use fulcrum_config::Monitor;
use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::check::{Check, Probe, Verdict, MAX_WAIT};
use crate::probe::{self, ProbeTiming};
use crate::task::Task;

/// Shortest interval: a zero one that slipped past validation would spin a task.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// Runs the active health monitors of pool members and the back-off probe of members that
/// passive observation took down in pools without monitors.
///
/// Every result goes to the member's state machine (`Member::record_check`,
/// `Member::record_probe`); the data planes read it from there.
#[derive(Debug)]
pub struct HealthService {
    handle: Handle,
    state: Mutex<State>,
    /// The pools of the last `apply`, which the probe supervisor scans.
    pools: Arc<ArcSwap<Vec<Arc<Pool>>>>,
}

#[derive(Debug, Default)]
struct State {
    shut_down: bool,
    checks: HashMap<CheckKey, Running>,
    supervisor: Option<Task>,
}

/// What identifies a check across reloads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CheckKey {
    pool: Arc<str>,
    member: SocketAddr,
    monitor: String,
}

#[derive(Debug)]
struct Running {
    monitor: Arc<Monitor>,
    /// Swapped on reload when the check is kept: the pool is rebuilt (and, should the binary
    /// build it afresh, the member too) while the schedule goes on.
    target: Arc<ArcSwap<Target>>,
    task: Task,
}

#[derive(Debug)]
struct Target {
    pool: Arc<Pool>,
    member: Arc<Member>,
}

impl Default for HealthService {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthService {
    /// Starts the service with no checks; `apply` gives it pools to check.
    ///
    /// # Panics
    ///
    /// When called outside a tokio runtime: the checks run on the runtime it is called in.
    pub fn new() -> Self {
        Self::with_timing(ProbeTiming::default())
    }

    pub(crate) fn with_timing(timing: ProbeTiming) -> Self {
        let handle = Handle::current();
        let pools: Arc<ArcSwap<Vec<Arc<Pool>>>> = Arc::default();
        let supervisor = Task::spawn_on(&handle, probe::supervise(pools.clone(), timing));
        HealthService {
            handle,
            state: Mutex::new(State {
                supervisor: Some(supervisor),
                ..State::default()
            }),
            pools,
        }
    }

    /// Starts and stops checks so that every (pool, member, monitor) in `pools` is checked with
    /// the monitor named in the pool's `config.monitors`; called at start and after every
    /// reload.
    ///
    /// A check whose pool name, member address and monitor name stay, with the monitor's config
    /// unchanged, keeps running on its schedule: a reload causes no burst of checks. Checks no
    /// longer wanted stop; new ones (and ones whose monitor changed) start after a random delay
    /// within one interval, so the checks of many members spread over the interval.
    ///
    /// A member that loses its last agent check has the
    /// agent's state and weight overrides lifted, since nothing would ever lift them otherwise.
    pub fn apply(&self, pools: &[Arc<Pool>], monitors: &[Monitor]) {
        let by_name: HashMap<&str, &Monitor> =
            monitors.iter().map(|m| (m.name.as_str(), m)).collect();
        let mut wanted: HashMap<CheckKey, (&Monitor, Target)> = HashMap::new();
        for pool in pools {
            for name in &pool.config.monitors {
                let Some(&monitor) = by_name.get(name.as_str()) else {
                    tracing::warn!(pool = %pool.name, monitor = %name, "the pool names a monitor that does not exist; it is not checked");
                    continue;
                };
                for member in pool.members() {
                    let key = CheckKey {
                        pool: pool.name.clone(),
                        member: member.address,
                        monitor: monitor.name.clone(),
                    };
                    let target = Target {
                        pool: pool.clone(),
                        member: member.clone(),
                    };
                    wanted.insert(key, (monitor, target));
                }
            }
        }

        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.shut_down {
            return;
        }
        let agents_before = agent_members(&state.checks);
        // Dropping a Running aborts its task.
        state.checks.retain(|key, _| wanted.contains_key(key));
        let (mut kept, mut started) = (0, 0);
        for (key, (monitor, target)) in wanted {
            match state.checks.get(&key) {
                Some(r) if same_monitor(&r.monitor, monitor) && !r.task.is_finished() => {
                    r.target.store(Arc::new(target));
                    kept += 1;
                }
                _ => {
                    state.checks.insert(key, self.start(monitor, target));
                    started += 1;
                }
            }
        }
        let agents_after = agent_members(&state.checks);
        self.pools.store(Arc::new(pools.to_vec()));
        drop(state);

        for (pool_name, addr) in agents_before.keys() {
            if !agents_after.contains_key(&(pool_name.clone(), *addr)) {
                lift_agent_overrides(pools, pool_name, *addr);
            }
        }
        for ((pool_name, addr), readers) in &agents_after {
            forget_readings_but(pools, pool_name, *addr, readers);
        }
        tracing::debug!(kept, started, "health checks applied");
    }

    /// Stops every check and probe. Later `apply` calls do nothing.
    pub fn shutdown(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.shut_down = true;
        state.checks.clear();
        state.supervisor = None;
        self.pools.store(Arc::default());
    }

    fn start(&self, monitor: &Monitor, target: Target) -> Running {
        let monitor = Arc::new(monitor.clone());
        let target = Arc::new(ArcSwap::from_pointee(target));
        let interval = monitor.interval.clamp(MIN_INTERVAL, MAX_WAIT);
        // Uniform over one interval: members added together (at start, or a new pool) are
        // checked spread out rather than in one burst.
        let first = interval.mul_f64(fastrand::f64());
        let task = Task::spawn_on(
            &self.handle,
            run_check(Check::new(&monitor), monitor.clone(), target.clone(), first),
        );
        Running {
            monitor,
            target,
            task,
        }
    }

    /// Whether every check task is still running (a panic would have ended one).
    #[cfg(test)]
    pub(crate) fn all_running(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.checks.values().all(|r| !r.task.is_finished())
    }

    /// The task ids of the running checks, to tell a kept check from a restarted one.
    #[cfg(test)]
    pub(crate) fn task_ids(&self) -> HashMap<CheckKey, tokio::task::Id> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .checks
            .iter()
            .map(|(k, r)| (k.clone(), r.task.id()))
            .collect()
    }
}

impl Drop for HealthService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether two monitor configs would check the same way. Destructured so that a field added to
/// `Monitor` cannot be forgotten here.
fn same_monitor(a: &Monitor, b: &Monitor) -> bool {
    let Monitor {
        name,
        kind,
        interval,
        timeout,
        rise,
        fall,
        port,
        path,
        method,
        host,
        expect_status,
        expect_body,
        send,
        expect,
        query,
        query_type,
        expect_rcode,
        expect_answer,
        secret,
        username,
        password,
        newsgroup,
        snmp,
        link,
        weight_share,
    } = a;
    *name == b.name
        && *kind == b.kind
        && *interval == b.interval
        && *timeout == b.timeout
        && *rise == b.rise
        && *fall == b.fall
        && *port == b.port
        && *path == b.path
        && *method == b.method
        && *host == b.host
        && *expect_status == b.expect_status
        && *expect_body == b.expect_body
        && *send == b.send
        && *expect == b.expect
        && *query == b.query
        && *query_type == b.query_type
        && *expect_rcode == b.expect_rcode
        && *expect_answer == b.expect_answer
        && *secret == b.secret
        && *weight_share == b.weight_share
        && *username == b.username
        && *password == b.password
        && *newsgroup == b.newsgroup
        && *snmp == b.snmp
        && *link == b.link
}

/// Members with a check that sets agent overrides (an agent, or an snmp monitor with `max`,
/// whose value sets the weight percentage), with the names of those monitors.
fn agent_members(
    checks: &HashMap<CheckKey, Running>,
) -> HashMap<(Arc<str>, SocketAddr), Vec<String>> {
    let mut members: HashMap<(Arc<str>, SocketAddr), Vec<String>> = HashMap::new();
    for (k, r) in checks {
        if r.monitor.reports_weight() {
            members
                .entry((k.pool.clone(), k.member))
                .or_default()
                .push(r.monitor.name.clone());
        }
    }
    members
}

/// A member keeps weight monitors, but a reload dropped one of them (or its `max`): its last
/// reading goes, or it would count in the member's weight for ever.
fn forget_readings_but(pools: &[Arc<Pool>], pool_name: &str, addr: SocketAddr, keep: &[String]) {
    let Some(pool) = pools.iter().find(|p| &*p.name == pool_name) else {
        return;
    };
    let Some((_, member)) = pool.member_by_addr(addr) else {
        return;
    };
    let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
    if member.retain_weight_readings(&keep) {
        tracing::info!(pool = %pool.name, member = %member.label, weight_percent = member.agent_weight_pct(), "a weight monitor was removed; its reading no longer counts");
        pool.refresh();
    }
}

fn lift_agent_overrides(pools: &[Arc<Pool>], pool_name: &str, addr: SocketAddr) {
    let Some(pool) = pools.iter().find(|p| &*p.name == pool_name) else {
        return;
    };
    let Some((_, member)) = pool.member_by_addr(addr) else {
        return;
    };
    if member.agent_state() != AgentState::None || member.agent_weight_pct() != 100 {
        tracing::info!(pool = %pool.name, member = %member.label, "agent check removed; lifting its overrides");
        member.set_agent_state(AgentState::None);
        member.clear_weight_readings();
        pool.refresh();
    }
}

/// ±10%: checks started together drift apart instead of hitting members in lockstep.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.9 + 0.2 * fastrand::f64())
}

async fn run_check(
    check: Check,
    monitor: Arc<Monitor>,
    target: Arc<ArcSwap<Target>>,
    first: Duration,
) {
    let interval = monitor.interval.clamp(MIN_INTERVAL, MAX_WAIT);
    let mut next = Instant::now() + first;
    loop {
        tokio::time::sleep_until(next).await;
        let started = Instant::now();
        let (address, vrf) = {
            let t = target.load();
            (t.member.address, t.pool.config.vrf.clone())
        };
        let probe = Probe::new(address, monitor.port, monitor.timeout).in_vrf(vrf.as_deref());
        let verdict = check.run(&probe).await;
        if let Verdict::Health { ok: true, .. } = verdict {
            target
                .load()
                .member
                .stats
                .observe_check_time(started.elapsed());
        }
        record(&monitor.name, monitor.weight_share, verdict, &target.load());
        next = started + jittered(interval);
    }
}

fn record(monitor: &str, share: u32, verdict: Verdict, target: &Target) {
    let member = &target.member;
    match verdict {
        Verdict::Health { ok, detail } => {
            if !ok {
                tracing::debug!(pool = %member.pool, member = %member.label, monitor, %detail, "check failed");
            }
            member.record_check(monitor, ok, &detail);
        }
        Verdict::Agent { reply, detail } => {
            if !reply.unknown.is_empty() {
                tracing::debug!(pool = %member.pool, member = %member.label, monitor, unknown = ?reply.unknown, "agent sent words it does not know; ignored");
            }
            let before = (member.agent_state(), member.agent_weight_pct());
            if let Some(state) = reply.state {
                member.set_agent_state(state);
            }
            if let Some(pct) = reply.weight_pct {
                // Several monitors may report a weight (CPU and memory, say): the member's is
                // their average weighted by `weight_share`, not whichever answered last.
                member.set_weight_reading(monitor, pct, share);
            }
            if before != (member.agent_state(), member.agent_weight_pct()) {
                // The scheduler works from effective weights computed at refresh.
                target.pool.refresh();
            }
            // Agents often report only a weight; no health word is no news, which is good news.
            member.record_check(monitor, reply.health.unwrap_or(true), &detail);
        }
        Verdict::Nothing { why } => {
            tracing::debug!(pool = %member.pool, member = %member.label, monitor, %why, "agent unreachable; nothing recorded");
        }
    }
}

#[cfg(test)]
mod tests;

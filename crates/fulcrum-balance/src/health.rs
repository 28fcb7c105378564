//! The one rise/fall state machine of a member, fed by active checks and passive observation.
//!
//! It lives here rather than in `fulcrum-health` because the data planes report their passive
//! observations straight to the member they used, and the schedulers read its result: keeping it
//! next to `Member` lets both do so without depending on the crate that runs the active probes.
//!
//! A member is up when every monitor of its pool is up and passive observation has not marked it
//! down. Passive observation counts consecutive failed connections (refused, reset, timed out);
//! `fall` of them mark the member down, and it stays down until the active checks have passed
//! `rise` times in a row — or, for a pool without monitors, until a back-off probe succeeds.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::SystemTime;

use parking_lot::Mutex;
use serde::Serialize;

/// How many transitions each member remembers for the API.
const HISTORY: usize = 16;

/// Rise and fall used by passive observation when the pool has no monitors.
pub const DEFAULT_RISE: u32 = 2;
pub const DEFAULT_FALL: u32 = 3;

#[derive(Debug, Clone, Serialize)]
pub struct Transition {
    #[serde(serialize_with = "ser_time")]
    pub at: SystemTime,
    pub up: bool,
    pub reason: String,
}

fn ser_time<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    s.serialize_f64((secs * 1000.0).round() / 1000.0)
}

/// State of one monitor on one member.
#[derive(Debug, Clone, Serialize)]
pub struct CheckState {
    pub monitor: String,
    pub up: bool,
    #[serde(skip)]
    successes: u32,
    #[serde(skip)]
    failures: u32,
    #[serde(skip)]
    rise: u32,
    #[serde(skip)]
    fall: u32,
    /// What the last check saw, e.g. "HTTP 200" or "connect: connection refused".
    pub last: String,
}

#[derive(Debug)]
struct Inner {
    checks: Vec<CheckState>,
    passive_down: bool,
    passive_reason: String,
    passive_fall: u32,
    passive_rise: u32,
    successes_since_passive: u32,
    history: VecDeque<Transition>,
}

/// What the API shows of a member's health.
#[derive(Debug, Clone, Serialize)]
pub struct HealthReport {
    pub up: bool,
    pub checks: Vec<CheckState>,
    pub passive_down: bool,
    pub consecutive_failures: u32,
    pub transitions: Vec<Transition>,
}

/// A monitor as the state machine needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckSpec {
    pub monitor: String,
    pub rise: u32,
    pub fall: u32,
}

#[derive(Debug)]
pub struct HealthMachine {
    up: AtomicBool,
    /// Down by passive observation alone: every monitor (if any) says up. Such a member may
    /// still be used when nothing else in its pool is up (panic mode, `Pool::pick`).
    passive_only: AtomicBool,
    /// Consecutive passive failures; a separate atomic so a successful connection can clear it
    /// without taking the lock (the common case on the hot path).
    passive_failures: AtomicU32,
    inner: Mutex<Inner>,
}

/// The result of feeding the machine: `Some(up)` when the member changed state.
pub type Changed = Option<bool>;

impl Default for HealthMachine {
    fn default() -> Self {
        HealthMachine {
            up: AtomicBool::new(true),
            passive_only: AtomicBool::new(false),
            passive_failures: AtomicU32::new(0),
            inner: Mutex::new(Inner {
                checks: Vec::new(),
                passive_down: false,
                passive_reason: String::new(),
                passive_fall: DEFAULT_FALL,
                passive_rise: DEFAULT_RISE,
                successes_since_passive: 0,
                history: VecDeque::new(),
            }),
        }
    }
}

impl HealthMachine {
    #[inline]
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Sets the monitors (on start and on reload). States of monitors that stay are kept; a new
    /// monitor starts up, so adding a check never takes traffic away before it has failed.
    /// Removing the only failing monitor can bring the member up: that is returned like any
    /// other change.
    pub fn configure(&self, specs: &[CheckSpec]) -> Changed {
        let mut inner = self.inner.lock();
        let old = std::mem::take(&mut inner.checks);
        inner.checks = specs
            .iter()
            .map(|s| {
                let mut st = old
                    .iter()
                    .find(|c| c.monitor == s.monitor)
                    .cloned()
                    .unwrap_or(CheckState {
                        monitor: s.monitor.clone(),
                        up: true,
                        successes: 0,
                        failures: 0,
                        rise: s.rise,
                        fall: s.fall,
                        last: "not checked yet".into(),
                    });
                st.rise = s.rise;
                st.fall = s.fall;
                st
            })
            .collect();
        inner.passive_fall = specs.iter().map(|s| s.fall).max().unwrap_or(DEFAULT_FALL);
        inner.passive_rise = specs.iter().map(|s| s.rise).max().unwrap_or(DEFAULT_RISE);
        self.settle(&mut inner, "monitors reconfigured")
    }

    /// Whether the member is down by passive observation alone (connection failures, counted
    /// statuses) while no monitor says it is down.
    #[inline]
    pub fn down_only_passively(&self) -> bool {
        self.passive_only.load(Ordering::Acquire)
    }

    pub fn has_monitors(&self) -> bool {
        !self.inner.lock().checks.is_empty()
    }

    /// Whether the member is held down by passive observation alone, with no monitor that could
    /// bring it back: the caller should probe it with back-off.
    pub fn needs_probe(&self) -> bool {
        let inner = self.inner.lock();
        inner.passive_down && inner.checks.is_empty()
    }

    /// The result of one active check by `monitor`; ignored if the pool no longer uses it.
    pub fn record_check(&self, monitor: &str, ok: bool, detail: &str) -> Changed {
        let mut inner = self.inner.lock();
        let passive_rise = inner.passive_rise;
        let index = inner.checks.iter().position(|c| c.monitor == monitor)?;
        let check = &mut inner.checks[index];
        check.last = detail.to_string();
        if ok {
            check.failures = 0;
            check.successes = check.successes.saturating_add(1);
            if !check.up && check.successes >= check.rise {
                check.up = true;
            }
            inner.successes_since_passive += 1;
            if inner.passive_down && inner.successes_since_passive >= passive_rise {
                inner.passive_down = false;
                self.passive_failures.store(0, Ordering::Relaxed);
            }
        } else {
            check.successes = 0;
            check.failures = check.failures.saturating_add(1);
            if check.up && check.failures >= check.fall {
                check.up = false;
            }
            inner.successes_since_passive = 0;
        }
        self.settle(&mut inner, &format!("monitor {monitor}: {detail}"))
    }

    /// A connection to the member failed (refused, reset, timed out).
    pub fn record_passive_failure(&self, detail: &str) -> Changed {
        let n = self.passive_failures.fetch_add(1, Ordering::AcqRel) + 1;
        let mut inner = self.inner.lock();
        if !inner.passive_down && n >= inner.passive_fall {
            inner.passive_down = true;
            inner.successes_since_passive = 0;
            inner.passive_reason = format!("{n} consecutive failed connections, last: {detail}");
        }
        let reason = inner.passive_reason.clone();
        self.settle(&mut inner, &reason)
    }

    /// A connection to the member worked: clears the run of passive failures.
    #[inline]
    pub fn record_passive_success(&self) {
        if self.passive_failures.load(Ordering::Relaxed) != 0 {
            self.passive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// The result of a back-off probe of a member held down passively in a pool without monitors.
    pub fn record_probe(&self, ok: bool, detail: &str) -> Changed {
        let mut inner = self.inner.lock();
        if ok && inner.passive_down && inner.checks.is_empty() {
            inner.passive_down = false;
            self.passive_failures.store(0, Ordering::Relaxed);
            return self.settle(&mut inner, &format!("probe: {detail}"));
        }
        None
    }

    fn settle(&self, inner: &mut Inner, reason: &str) -> Changed {
        let checks_up = inner.checks.iter().all(|c| c.up);
        let up = !inner.passive_down && checks_up;
        self.passive_only
            .store(inner.passive_down && checks_up, Ordering::Release);
        if up == self.up.load(Ordering::Acquire) {
            return None;
        }
        self.up.store(up, Ordering::Release);
        if inner.history.len() == HISTORY {
            inner.history.pop_front();
        }
        inner.history.push_back(Transition {
            at: SystemTime::now(),
            up,
            reason: reason.to_string(),
        });
        Some(up)
    }

    pub fn report(&self) -> HealthReport {
        let inner = self.inner.lock();
        HealthReport {
            up: self.is_up(),
            checks: inner.checks.clone(),
            passive_down: inner.passive_down,
            consecutive_failures: self.passive_failures.load(Ordering::Relaxed),
            transitions: inner.history.iter().cloned().collect(),
        }
    }

    pub fn last_transition(&self) -> Option<Transition> {
        self.inner.lock().history.back().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rise: u32, fall: u32) -> Vec<CheckSpec> {
        vec![CheckSpec {
            monitor: "m".into(),
            rise,
            fall,
        }]
    }

    #[test]
    fn starts_up_and_falls_after_fall_failures() {
        let h = HealthMachine::default();
        h.configure(&spec(2, 3));
        assert!(h.is_up());
        assert_eq!(h.record_check("m", false, "refused"), None);
        assert_eq!(h.record_check("m", false, "refused"), None);
        assert_eq!(h.record_check("m", false, "refused"), Some(false));
        assert!(!h.is_up());
        assert_eq!(h.record_check("m", true, "ok"), None);
        assert_eq!(
            h.record_check("m", false, "refused"),
            None,
            "a failure resets the rise count"
        );
        assert_eq!(h.record_check("m", true, "ok"), None);
        assert_eq!(h.record_check("m", true, "ok"), Some(true));
        let r = h.report();
        assert_eq!(r.transitions.len(), 2);
        assert!(r.transitions[0].reason.contains("refused"));
    }

    #[test]
    fn a_success_between_failures_resets_fall() {
        let h = HealthMachine::default();
        h.configure(&spec(1, 2));
        h.record_check("m", false, "x");
        h.record_check("m", true, "ok");
        h.record_check("m", false, "x");
        assert!(h.is_up());
    }

    #[test]
    fn every_monitor_must_pass() {
        let h = HealthMachine::default();
        h.configure(&[
            CheckSpec {
                monitor: "a".into(),
                rise: 1,
                fall: 1,
            },
            CheckSpec {
                monitor: "b".into(),
                rise: 1,
                fall: 1,
            },
        ]);
        assert_eq!(h.record_check("b", false, "b failed"), Some(false));
        assert_eq!(h.record_check("a", true, "a ok"), None);
        assert_eq!(h.record_check("b", true, "b ok"), Some(true));
    }

    #[test]
    fn passive_failures_mark_down_until_checks_rise() {
        let h = HealthMachine::default();
        h.configure(&spec(2, 3));
        h.record_passive_failure("reset");
        h.record_passive_success();
        h.record_passive_failure("reset");
        h.record_passive_failure("reset");
        assert!(h.is_up(), "the success broke the run");
        assert_eq!(h.record_passive_failure("refused"), Some(false));
        assert!(h.report().passive_down);
        assert_eq!(h.record_check("m", true, "ok"), None);
        assert_eq!(h.record_check("m", true, "ok"), Some(true));
    }

    #[test]
    fn without_monitors_a_probe_brings_it_back() {
        let h = HealthMachine::default();
        h.configure(&[]);
        for _ in 0..DEFAULT_FALL {
            h.record_passive_failure("refused");
        }
        assert!(!h.is_up());
        assert!(h.needs_probe());
        assert_eq!(h.record_probe(true, "connected"), Some(true));
        assert!(!h.needs_probe());
    }

    #[test]
    fn down_only_passively_is_told_apart_from_a_monitor_saying_down() {
        let h = HealthMachine::default();
        h.configure(&spec(1, 1));
        for _ in 0..3 {
            h.record_passive_failure("HTTP 503");
        }
        assert!(!h.is_up());
        assert!(h.down_only_passively(), "every monitor still says up");
        h.record_check("m", false, "refused");
        assert!(
            !h.down_only_passively(),
            "a monitor saying down is not passive alone"
        );
        h.record_check("m", true, "ok");
        assert!(h.is_up(), "rise 1: the check brings it back");
        assert!(!h.down_only_passively());
        let none = HealthMachine::default();
        none.configure(&[]);
        for _ in 0..DEFAULT_FALL {
            none.record_passive_failure("refused");
        }
        assert!(none.down_only_passively(), "no monitors: passive alone");
        none.record_probe(true, "connected");
        assert!(!none.down_only_passively());
    }

    #[test]
    fn reconfigure_keeps_states_of_monitors_that_stay() {
        let h = HealthMachine::default();
        h.configure(&spec(1, 1));
        h.record_check("m", false, "x");
        assert!(!h.is_up());
        h.configure(&[
            CheckSpec {
                monitor: "m".into(),
                rise: 1,
                fall: 1,
            },
            CheckSpec {
                monitor: "new".into(),
                rise: 1,
                fall: 1,
            },
        ]);
        assert!(
            !h.is_up(),
            "the failing monitor keeps the member down across a reload"
        );
        h.configure(&[CheckSpec {
            monitor: "new".into(),
            rise: 1,
            fall: 1,
        }]);
        assert!(h.is_up(), "removing the failing monitor brings it up");
    }
}

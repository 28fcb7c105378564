//! What the operator console needs beyond the live counters: a ring of one-second samples (so a
//! dashboard opened late still draws the last minutes) and the audit log of mutating API calls.
//!
//! The sampler reads the same atomics `/metrics` reads, once a second, on the admin runtime; the
//! data plane never waits for it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::Control;

/// Samples kept: ten minutes at one a second.
pub const HISTORY_LEN: usize = 600;
/// Audit entries kept in memory (every one is also logged).
pub const AUDIT_LEN: usize = 500;
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Alert conditions are looked at more often than samples are taken: a member's fall is seen
/// within a quarter second, not up to a second later.
const ALERT_EVERY: Duration = Duration::from_millis(250);

/// One virtual service at one instant: rates per second over the last interval.
#[derive(Clone, Serialize)]
pub struct ServiceSample {
    pub name: String,
    pub requests_per_s: f64,
    pub connections_per_s: f64,
    /// Clients turned away or failed (no member, over limit, upstream failures) per second.
    pub errors_per_s: f64,
    pub connections_active: u64,
    /// Cache hits ÷ (hits + misses) over the interval, for HTTP services with a cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_hit_ratio: Option<f64>,
}

/// One pool member at one instant.
#[derive(Clone, Serialize)]
pub struct MemberSample {
    pub pool: String,
    pub address: String,
    pub up: bool,
    pub requests_per_s: f64,
    pub connections_per_s: f64,
    pub active_connections: u64,
    pub response_time_ms: f64,
}

#[derive(Clone, Serialize)]
pub struct Sample {
    /// Unix time in seconds.
    pub t: f64,
    pub services: Vec<ServiceSample>,
    pub members: Vec<MemberSample>,
}

/// One mutating API call: what, when, from where, and how it ended.
#[derive(Clone, Serialize)]
pub struct AuditEntry {
    /// Unix time in seconds.
    pub at: f64,
    pub from: String,
    pub method: String,
    pub path: String,
    /// The request body (JSON as sent), cut at 512 bytes.
    pub body: String,
    pub status: u16,
    pub user_agent: String,
}

/// Counter values at the previous sample, to turn totals into rates.
#[derive(Default)]
struct Totals {
    at: Option<std::time::Instant>,
    services: HashMap<String, [u64; 5]>,
    members: HashMap<(String, String), [u64; 2]>,
}

#[derive(Default)]
pub struct Console {
    pub alerts: crate::alerts::Alerts,
    history: Mutex<VecDeque<Sample>>,
    audit: Mutex<VecDeque<AuditEntry>>,
    totals: Mutex<Totals>,
}

/// `t` (seconds) rounded to whole milliseconds.
fn whole_millis(t: f64) -> f64 {
    (t * 1000.0).round() / 1000.0
}

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn rate(now: u64, before: Option<u64>, secs: f64) -> f64 {
    match before {
        // A reload makes new counters: a smaller value is a restart, not a negative rate.
        Some(b) if now >= b && secs > 0.0 => ((now - b) as f64 / secs * 100.0).round() / 100.0,
        _ => 0.0,
    }
}

impl Console {
    /// Samples every second and evaluates alerts every quarter second while the console is
    /// alive (the task holds only a weak reference).
    pub fn spawn_sampler(self: &Arc<Self>, control: Arc<dyn Control>) {
        let weak: Weak<Console> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(ALERT_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_sample: Option<std::time::Instant> = None;
            loop {
                every.tick().await;
                let Some(console) = weak.upgrade() else {
                    return;
                };
                // A few milliseconds early still counts: ticks are not exact.
                if last_sample
                    .is_none_or(|t| t.elapsed() + Duration::from_millis(20) >= SAMPLE_EVERY)
                {
                    last_sample = Some(std::time::Instant::now());
                    console.sample(control.as_ref());
                }
                console.alerts.tick(control.as_ref());
            }
        });
    }

    /// Takes one sample now.
    pub fn sample(&self, control: &dyn Control) {
        let now = std::time::Instant::now();
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        let secs = totals
            .at
            .map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        let mut services = Vec::new();
        let mut service_totals = HashMap::new();
        for s in control.services() {
            let st = &s.stats;
            let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            let errors = load(&st.no_member) + load(&st.over_limit) + load(&st.upstream_failures);
            let (hits, misses) = if s.protocol.is_http() {
                // `counters`: hits and misses only; the full answer walks the whole cache.
                let (code, v) =
                    control.plane_get(&["cache", &s.name], &[("counters".into(), String::new())]);
                if code == 200 {
                    (v["hits"].as_u64(), v["misses"].as_u64())
                } else {
                    (None, None)
                }
            } else {
                (None, None)
            };
            let cur = [
                load(&st.requests_total),
                load(&st.connections_total),
                errors,
                hits.unwrap_or(0),
                misses.unwrap_or(0),
            ];
            let before = totals.services.get(&s.name);
            let delta = |i: usize| before.map(|b| cur[i].saturating_sub(b[i]));
            let cache_hit_ratio = hits.map(|_| match (delta(3), delta(4)) {
                (Some(h), Some(m)) if h + m > 0 => {
                    (h as f64 / (h + m) as f64 * 1000.0).round() / 1000.0
                }
                // No lookups in the interval: the ratio since start says more than nothing.
                _ => {
                    let (h, m) = (cur[3], cur[4]);
                    if h + m > 0 {
                        (h as f64 / (h + m) as f64 * 1000.0).round() / 1000.0
                    } else {
                        0.0
                    }
                }
            });
            services.push(ServiceSample {
                requests_per_s: rate(cur[0], before.map(|b| b[0]), secs),
                connections_per_s: rate(cur[1], before.map(|b| b[1]), secs),
                errors_per_s: rate(cur[2], before.map(|b| b[2]), secs),
                connections_active: load(&st.connections_active),
                cache_hit_ratio,
                name: s.name.clone(),
            });
            service_totals.insert(s.name.clone(), cur);
        }
        let mut members = Vec::new();
        let mut member_totals = HashMap::new();
        for p in control.pools() {
            for m in p.members().iter() {
                let st = &m.stats;
                let key = (p.name.to_string(), m.label.to_string());
                let cur = [
                    st.requests_total.load(Ordering::Relaxed),
                    st.connections_total.load(Ordering::Relaxed),
                ];
                let before = totals.members.get(&key);
                members.push(MemberSample {
                    pool: key.0.clone(),
                    address: key.1.clone(),
                    up: m.health.is_up(),
                    requests_per_s: rate(cur[0], before.map(|b| b[0]), secs),
                    connections_per_s: rate(cur[1], before.map(|b| b[1]), secs),
                    active_connections: st.active_connections.load(Ordering::Relaxed),
                    response_time_ms: (st.response_time_us() / 10.0).round() / 100.0,
                });
                member_totals.insert(key, cur);
            }
        }
        totals.at = Some(now);
        totals.services = service_totals;
        totals.members = member_totals;
        drop(totals);
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        if h.len() == HISTORY_LEN {
            h.pop_front();
        }
        h.push_back(Sample {
            // Whole milliseconds: the value then reads back exactly from its JSON text with
            // any parser (a client's `since` is the `t` it was given; a value one unit of
            // precision off would return that sample again).
            t: whole_millis(unix_now()),
            services,
            members,
        });
    }

    /// Samples taken after `since` (Unix seconds), oldest first; with `member_window`, the
    /// per-member figures only of the samples of the last `member_window` seconds (a page with
    /// hundreds of members wants ten minutes of services but only its sparklines' members).
    pub fn history_since(&self, since: f64, member_window: Option<f64>) -> Vec<Sample> {
        let h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        let cut = member_window.map(|w| unix_now() - w);
        h.iter()
            .filter(|s| s.t > since)
            .map(|s| match cut {
                Some(c) if s.t < c => Sample {
                    t: s.t,
                    services: s.services.clone(),
                    members: Vec::new(),
                },
                _ => s.clone(),
            })
            .collect()
    }

    pub fn record(&self, entry: AuditEntry) {
        tracing::info!(
            target: "fulcrum::audit",
            from = %entry.from,
            method = %entry.method,
            path = %entry.path,
            body = %entry.body,
            status = entry.status,
            user_agent = %entry.user_agent,
            "admin API call"
        );
        let mut a = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        if a.len() == AUDIT_LEN {
            a.pop_front();
        }
        a.push_back(entry);
    }

    /// The audit log, newest first.
    pub fn audit(&self) -> Vec<AuditEntry> {
        let a = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        a.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    /// A sample's `t` read back from its JSON by serde_json (whose default float parser is not
    /// exact for every input) is the same value, so `?since=t` never returns that sample again.
    #[test]
    fn sample_times_read_back_exactly_from_json() {
        let mut t = 1_764_633_271.0_f64;
        for i in 0..100_000u32 {
            t += 0.999_877 + f64::from(i % 7) * 1.3e-7;
            let v = super::whole_millis(t);
            let text = serde_json::to_string(&v).expect("serialize");
            let back: f64 = serde_json::from_str(&text).expect("parse");
            assert_eq!(back.to_bits(), v.to_bits(), "{text}");
        }
    }
}

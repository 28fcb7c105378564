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

use crate::escape::log_escape;
use crate::Control;

/// Samples kept: ten minutes at one a second.
pub const HISTORY_LEN: usize = 600;
/// Audit entries of accepted calls kept in memory (every one is also logged).
pub const AUDIT_LEN: usize = 500;
/// Refused calls (no or wrong token, foreign Host, not JSON, body too large) are kept apart,
/// so calls anyone can make never push an accepted change out of the log: this many overall…
pub const REFUSED_LEN: usize = 100;
/// …and this many per source (an IPv4 address or an IPv6 /64), so one source cannot push out
/// the refused calls of others either.
pub const REFUSED_PER_SOURCE: usize = 10;
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
    /// Refused before any handler ran (authentication, Host, Content-Type, size).
    pub refused: bool,
}

/// Accepted and refused calls, each in its own bound.
#[derive(Default)]
struct AuditLog {
    accepted: VecDeque<AuditEntry>,
    /// Refused calls with the source each is counted against.
    refused: VecDeque<(String, AuditEntry)>,
    refused_per_source: HashMap<String, usize>,
    /// Refused calls no longer in memory (they stay in the process's log).
    refused_dropped: u64,
}

impl AuditLog {
    fn push(&mut self, entry: AuditEntry) {
        if !entry.refused {
            if self.accepted.len() == AUDIT_LEN {
                self.accepted.pop_front();
            }
            self.accepted.push_back(entry);
            return;
        }
        let source = source_of(&entry.from);
        let held = self.refused_per_source.get(&source).copied().unwrap_or(0);
        let evict = if held >= REFUSED_PER_SOURCE {
            self.refused.iter().position(|(s, _)| *s == source)
        } else if self.refused.len() >= REFUSED_LEN {
            Some(0)
        } else {
            None
        };
        if let Some(i) = evict {
            if let Some((gone, _)) = self.refused.remove(i) {
                self.forget_one(&gone);
                self.refused_dropped += 1;
            }
        }
        *self.refused_per_source.entry(source.clone()).or_insert(0) += 1;
        self.refused.push_back((source, entry));
    }

    fn forget_one(&mut self, source: &str) {
        if let Some(n) = self.refused_per_source.get_mut(source) {
            *n -= 1;
            if *n == 0 {
                self.refused_per_source.remove(source);
            }
        }
    }

    /// Both kinds, newest first.
    fn newest_first(&self) -> Vec<AuditEntry> {
        let mut all: Vec<AuditEntry> = self
            .accepted
            .iter()
            .chain(self.refused.iter().map(|(_, e)| e))
            .cloned()
            .collect();
        all.sort_by(|a, b| b.at.total_cmp(&a.at));
        all
    }
}

/// The source a refused call is counted against: the peer's IPv4 address or IPv6 /64 (one
/// host usually holds a whole /64), or the text itself ("unix socket", "unknown").
fn source_of(from: &str) -> String {
    match from.parse::<std::net::SocketAddr>().map(|a| a.ip()) {
        Ok(std::net::IpAddr::V4(ip)) => ip.to_string(),
        Ok(std::net::IpAddr::V6(ip)) => {
            let s = ip.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        Err(_) => from.to_string(),
    }
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
    audit: Mutex<AuditLog>,
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
        // Every text field is the caller's: escaped, a newline in a path or body cannot
        // start a line of its own in the journal.
        tracing::info!(
            target: "fulcrum::audit",
            from = %log_escape(&entry.from),
            method = %log_escape(&entry.method),
            path = %log_escape(&entry.path),
            body = %log_escape(&entry.body),
            status = entry.status,
            user_agent = %log_escape(&entry.user_agent),
            refused = entry.refused,
            "admin API call"
        );
        let mut a = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        a.push(entry);
    }

    /// The audit log (accepted and refused calls), newest first, and how many refused calls
    /// were dropped from memory.
    pub fn audit(&self) -> (Vec<AuditEntry>, u64) {
        let a = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        (a.newest_first(), a.refused_dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(from: &str, status: u16, refused: bool, at: f64) -> AuditEntry {
        AuditEntry {
            at,
            from: from.into(),
            method: "PUT".into(),
            path: "/api/v1/reload".into(),
            body: String::new(),
            status,
            user_agent: String::new(),
            refused,
        }
    }

    /// One source's flood evicts only its own refused calls; many sources together evict
    /// only refused calls; accepted changes stay.
    #[test]
    fn refused_calls_are_bounded_per_source_and_overall() {
        let mut log = AuditLog::default();
        log.push(entry("127.0.0.1:1000", 200, false, 1.0));
        log.push(entry("192.0.2.7:1", 401, true, 2.0));
        for i in 0..1000 {
            log.push(entry(
                &format!("198.51.100.9:{}", i % 60000),
                401,
                true,
                3.0 + f64::from(i),
            ));
        }
        assert_eq!(log.accepted.len(), 1);
        assert_eq!(log.refused.len(), 1 + REFUSED_PER_SOURCE);
        assert!(log.refused.iter().any(|(_, e)| e.from == "192.0.2.7:1"));
        assert_eq!(log.refused_dropped, 1000 - REFUSED_PER_SOURCE as u64);
        // Addresses of one IPv6 /64 count as one source.
        for i in 0..100u16 {
            log.push(entry(
                &format!("[2001:db8:0:1::{i:x}]:80"),
                403,
                true,
                2000.0,
            ));
        }
        let per_64 = log
            .refused
            .iter()
            .filter(|(s, _)| s == "2001:db8:0:1::/64")
            .count();
        assert_eq!(per_64, REFUSED_PER_SOURCE);
        for i in 0..1000u32 {
            let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
            log.push(entry(&format!("{ip}:5"), 401, true, 3000.0));
        }
        assert_eq!(log.refused.len(), REFUSED_LEN);
        assert_eq!(log.refused_per_source.values().sum::<usize>(), REFUSED_LEN);
        let all = log.newest_first();
        assert_eq!(all.len(), 1 + REFUSED_LEN);
        assert_eq!(all.last().map(|e| e.status), Some(200));
    }

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

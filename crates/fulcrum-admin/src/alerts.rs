//! `[[alert]]` rules: conditions are evaluated once a second on the admin runtime (member down,
//! pool below `min_active`, GSLB site down, certificate expiry), damped (`hold`), repeated
//! (`repeat`), and handed to a bounded per-rule queue; delivery (webhook, Alertmanager API,
//! syslog, SMTP) retries with back-off in its own tasks. Nothing here is on the data plane's path:
//! a full queue drops the notification and counts it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use fulcrum_balance::Pool;
use fulcrum_config::{AlertEvent, AlertRule, Config};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use crate::Control;

const QUEUE: usize = 256;
const IN_FLIGHT: usize = 32;
const ATTEMPTS: u32 = 4;
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// The Alertmanager API forgets an alert whose `endsAt` passed: firing ones are re-posted this
/// often with `endsAt` [`AM_LEASE`] ahead (as Prometheus does).
const AM_REFRESH: Duration = Duration::from_secs(60);
const AM_LEASE: Duration = Duration::from_secs(300);
/// Certificates are re-read at most this often.
const CERT_EVERY: Duration = Duration::from_secs(60);

/// A condition that holds now.
#[derive(Clone)]
struct Condition {
    event: AlertEvent,
    labels: BTreeMap<String, String>,
    summary: String,
}

impl Condition {
    /// A condition of `event`: the `alertname`, `event` and `severity` labels every alert
    /// carries, and those of what it is `about` (the pool and member, the site, the link...).
    fn new(event: AlertEvent, severity: &str, about: &[(&str, &str)], summary: String) -> Self {
        let mut labels = labels(about);
        for (k, v) in [
            ("alertname", alertname(event)),
            ("event", event.as_str()),
            ("severity", severity),
        ] {
            labels.insert(k.to_string(), v.to_string());
        }
        Condition {
            event,
            labels,
            summary,
        }
    }
}

struct Tracked {
    cond: Condition,
    seen_since: Instant,
    /// Set once it fired (after `hold`).
    firing_since: Option<SystemTime>,
    last_sent: Option<Instant>,
    last_refresh: Option<Instant>,
    gone_since: Option<Instant>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Status {
    Firing,
    Resolved,
}

#[derive(Clone)]
struct Notification {
    status: Status,
    /// Only keeps an Alertmanager API lease alive; other sinks skip it.
    refresh_only: bool,
    labels: BTreeMap<String, String>,
    summary: String,
    starts_at: SystemTime,
    ends_at: Option<SystemTime>,
    created: Instant,
}

/// Delivery counters of one sink of one rule.
#[derive(Default)]
pub struct SinkStats {
    pub sent: AtomicU64,
    pub failed: AtomicU64,
    pub retries: AtomicU64,
    /// Time from the condition being decided (fired/resolved) to the sink's acknowledgement, of
    /// the last successful delivery, in microseconds.
    pub last_latency_us: AtomicU64,
}

#[derive(Default)]
pub struct RuleStats {
    pub dropped: AtomicU64,
    pub sinks: BTreeMap<&'static str, SinkStats>,
}

struct RuleRuntime {
    rule: AlertRule,
    queue: mpsc::Sender<Notification>,
    stats: Arc<RuleStats>,
    tracked: HashMap<String, Tracked>,
}

#[derive(Default)]
pub struct Alerts {
    rules: Mutex<Vec<RuleRuntime>>,
    certs: Mutex<CertCache>,
}

#[derive(Default)]
struct CertCache {
    read_at: Option<Instant>,
    /// (service, certificate file, notAfter)
    certs: Vec<(String, String, SystemTime)>,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// How long a `failover` alert stays firing after the role change that raised it.
const FAILOVER_SHOWN: Duration = Duration::from_secs(300);

fn alertname(e: AlertEvent) -> &'static str {
    match e {
        AlertEvent::MemberDown => "FulcrumMemberDown",
        AlertEvent::PoolBelowMin => "FulcrumPoolBelowMinActive",
        AlertEvent::SiteDown => "FulcrumSiteDown",
        AlertEvent::LinkDown => "FulcrumLinkDown",
        AlertEvent::Failover => "FulcrumFailover",
        AlertEvent::CertExpiry => "FulcrumCertificateExpiry",
        AlertEvent::ElasticJoined => "FulcrumElasticMemberJoined",
    }
}

fn key(c: &Condition) -> String {
    c.labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// FNV-1a over the sorted labels: a stable alert fingerprint, as Alertmanager shows one.
fn fingerprint(labels: &BTreeMap<String, String>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, v) in labels {
        for b in k.bytes().chain([0xff]).chain(v.bytes()).chain([0xfe]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

impl Alerts {
    /// One evaluation: compares what holds now with what was tracked and queues notifications.
    pub fn tick(&self, control: &dyn Control) {
        let Some(config) = control.config() else {
            return;
        };
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        self.sync_rules(&mut rules, &config);
        if rules.is_empty() {
            return;
        }
        let conditions = self.conditions(control, &config, &rules);
        let now = Instant::now();
        for r in rules.iter_mut() {
            let mut present: HashMap<String, Condition> = HashMap::new();
            for c in conditions.iter().filter(|c| r.rule.on.contains(&c.event)) {
                present.insert(key(c), c.clone());
            }
            let hold = r.rule.hold;
            let am_v2 = r
                .rule
                .webhook
                .as_deref()
                .is_some_and(|w| w.trim_end_matches('/').ends_with("/api/v2/alerts"));
            for (k, c) in &present {
                let t = r.tracked.entry(k.clone()).or_insert_with(|| Tracked {
                    cond: c.clone(),
                    seen_since: now,
                    firing_since: None,
                    last_sent: None,
                    last_refresh: None,
                    gone_since: None,
                });
                t.cond = c.clone();
                t.gone_since = None;
                let mut send = None;
                match t.firing_since {
                    None if now.duration_since(t.seen_since) >= hold => {
                        t.firing_since = Some(SystemTime::now());
                        send = Some(false);
                    }
                    Some(_) => {
                        let since = t.last_sent.map_or(Duration::MAX, |s| now.duration_since(s));
                        if !r.rule.repeat.is_zero() && since >= r.rule.repeat {
                            send = Some(false);
                        } else if am_v2
                            && t.last_refresh
                                .is_none_or(|s| now.duration_since(s) >= AM_REFRESH)
                        {
                            send = Some(true);
                        }
                    }
                    None => {}
                }
                if let Some(refresh_only) = send {
                    t.last_refresh = Some(now);
                    if !refresh_only {
                        t.last_sent = Some(now);
                    }
                    let n = Notification {
                        status: Status::Firing,
                        refresh_only,
                        labels: t.cond.labels.clone(),
                        summary: t.cond.summary.clone(),
                        starts_at: t.firing_since.unwrap_or_else(SystemTime::now),
                        ends_at: None,
                        created: now,
                    };
                    enqueue(r, n);
                }
            }
            let mut done = Vec::new();
            for (k, t) in r.tracked.iter_mut() {
                if present.contains_key(k) {
                    continue;
                }
                let gone = *t.gone_since.get_or_insert(now);
                if t.firing_since.is_none() {
                    // It never fired: a flap shorter than `hold`, forgotten.
                    done.push(k.clone());
                } else if now.duration_since(gone) >= hold {
                    done.push(k.clone());
                    let n = Notification {
                        status: Status::Resolved,
                        refresh_only: false,
                        labels: t.cond.labels.clone(),
                        summary: t.cond.summary.clone(),
                        starts_at: t.firing_since.unwrap_or_else(SystemTime::now),
                        ends_at: Some(SystemTime::now()),
                        created: now,
                    };
                    let (q, stats) = (r.queue.clone(), r.stats.clone());
                    if q.try_send(n).is_err() {
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            for k in done {
                r.tracked.remove(&k);
            }
        }
    }

    /// Keeps one runtime per rule; a changed rule restarts its delivery (and its state).
    fn sync_rules(&self, rules: &mut Vec<RuleRuntime>, config: &Config) {
        rules.retain(|r| config.alerts.contains(&r.rule));
        for a in &config.alerts {
            if rules.iter().any(|r| r.rule == *a) {
                continue;
            }
            let mut stats = RuleStats::default();
            if a.webhook.is_some() {
                stats.sinks.insert("webhook", SinkStats::default());
            }
            if a.syslog.is_some() {
                stats.sinks.insert("syslog", SinkStats::default());
            }
            if a.smtp.is_some() {
                stats.sinks.insert("smtp", SinkStats::default());
            }
            let stats = Arc::new(stats);
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(deliver(a.clone(), rx, stats.clone()));
            rules.push(RuleRuntime {
                rule: a.clone(),
                queue: tx,
                stats,
                tracked: HashMap::new(),
            });
        }
    }

    fn conditions(
        &self,
        control: &dyn Control,
        config: &Config,
        rules: &[RuleRuntime],
    ) -> Vec<Condition> {
        let wants = |e: AlertEvent| rules.iter().any(|r| r.rule.on.contains(&e));
        let mut out = Vec::new();
        let pools = control.pools();
        if wants(AlertEvent::MemberDown) {
            members_down(&pools, &mut out);
        }
        if wants(AlertEvent::ElasticJoined) {
            elastic_members_joined(&pools, &mut out);
        }
        if wants(AlertEvent::PoolBelowMin) {
            pools_below_min(&pools, &mut out);
        }
        if wants(AlertEvent::SiteDown) {
            sites_down(control, &mut out);
        }
        if wants(AlertEvent::LinkDown) {
            links_down(control, &mut out);
        }
        if wants(AlertEvent::Failover) {
            recent_failover(control, &mut out);
        }
        if wants(AlertEvent::CertExpiry) {
            self.certs_expiring(config, rules, &mut out);
        }
        out
    }

    /// Certificates that expire within the longest `cert_expiry` of the rules that want them.
    fn certs_expiring(&self, config: &Config, rules: &[RuleRuntime], out: &mut Vec<Condition>) {
        let threshold = rules
            .iter()
            .filter(|r| r.rule.on.contains(&AlertEvent::CertExpiry))
            .map(|r| r.rule.cert_expiry)
            .max()
            .unwrap_or_default();
        let now = SystemTime::now();
        for (service, file, not_after) in self.certs(config) {
            let left = not_after.duration_since(now).unwrap_or_default();
            if left <= threshold {
                let days = left.as_secs() / 86400;
                out.push(Condition::new(
                    AlertEvent::CertExpiry,
                    if days < 7 { "critical" } else { "warning" },
                    &[("service", &service), ("certificate", &file)],
                    format!(
                        "certificate {file} of service {service} expires in {days} days ({})",
                        humantime::format_rfc3339_seconds(not_after)
                    ),
                ));
            }
        }
    }

    fn certs(&self, config: &Config) -> Vec<(String, String, SystemTime)> {
        let mut cache = self.certs.lock().unwrap_or_else(|e| e.into_inner());
        if cache.read_at.is_none_or(|t| t.elapsed() >= CERT_EVERY) {
            cache.read_at = Some(Instant::now());
            cache.certs.clear();
            for vs in &config.virtual_services {
                for c in vs.tls().map_or(&[][..], |t| &t.certs) {
                    let file = c.cert.display().to_string();
                    match std::fs::read(&c.cert)
                        .map_err(|e| e.to_string())
                        .and_then(|pem| crate::cert::not_after(&pem))
                    {
                        Ok(t) => cache.certs.push((vs.name.clone(), file, t)),
                        Err(e) => {
                            tracing::warn!(service = %vs.name, certificate = %file, error = %e, "cannot read the certificate's expiry")
                        }
                    }
                }
            }
        }
        cache.certs.clone()
    }

    /// `GET /api/v1/certificates`: every https certificate with its notAfter and days left.
    pub fn certificates(&self, control: &dyn Control) -> Value {
        let Some(config) = control.config() else {
            return json!({ "certificates": [] });
        };
        let now = SystemTime::now();
        let certs: Vec<Value> = self
            .certs(&config)
            .into_iter()
            .map(|(service, file, not_after)| {
                let left = not_after.duration_since(now).unwrap_or_default().as_secs();
                json!({
                    "service": service,
                    "file": file,
                    "not_after": humantime::format_rfc3339_seconds(not_after).to_string(),
                    "days_left": left / 86400,
                    "expired": not_after <= now,
                })
            })
            .collect();
        json!({ "certificates": certs })
    }

    /// `GET /api/v1/alerts`: what fires now, per rule, and the delivery counters.
    pub fn json(&self) -> Value {
        let rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let mut firing = Vec::new();
        let mut pending = Vec::new();
        let mut delivery = serde_json::Map::new();
        for r in rules.iter() {
            for t in r.tracked.values() {
                let v = json!({
                    "rule": r.rule.name,
                    "event": t.cond.event.to_string(),
                    "labels": t.cond.labels,
                    "summary": t.cond.summary,
                    "since": t.firing_since.map(|s| humantime::format_rfc3339_millis(s).to_string()),
                    "resolving": t.gone_since.is_some(),
                });
                if t.firing_since.is_some() {
                    firing.push(v);
                } else {
                    pending.push(v);
                }
            }
            let sinks: serde_json::Map<String, Value> = r
                .stats
                .sinks
                .iter()
                .map(|(name, s)| {
                    (
                        name.to_string(),
                        json!({
                            "sent": s.sent.load(Ordering::Relaxed),
                            "failed": s.failed.load(Ordering::Relaxed),
                            "retries": s.retries.load(Ordering::Relaxed),
                            "last_latency_ms": s.last_latency_us.load(Ordering::Relaxed) as f64 / 1000.0,
                        }),
                    )
                })
                .collect();
            delivery.insert(
                r.rule.name.clone(),
                json!({ "dropped": r.stats.dropped.load(Ordering::Relaxed), "sinks": sinks }),
            );
        }
        json!({ "firing": firing, "pending": pending, "delivery": delivery })
    }

    /// `fulcrum_alert_*` metric families.
    pub fn metrics(&self, out: &mut crate::MetricFamilies) {
        let rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let mut firing = out.gauge("fulcrum_alerts_firing", "Alerts firing now, per rule.");
        for r in rules.iter() {
            let n = r
                .tracked
                .values()
                .filter(|t| t.firing_since.is_some())
                .count();
            firing.sample(&[("rule", &r.rule.name)], n);
        }
        let mut notifications = out.counter(
            "fulcrum_alert_notifications_total",
            "Alert notifications per rule, sink and result (sent, failed after retries, retried, dropped on a full queue).",
        );
        for r in rules.iter() {
            for (sink, s) in &r.stats.sinks {
                for (result, v) in [
                    ("sent", &s.sent),
                    ("failed", &s.failed),
                    ("retried", &s.retries),
                ] {
                    notifications.sample(
                        &[("rule", &r.rule.name), ("sink", sink), ("result", result)],
                        v.load(Ordering::Relaxed),
                    );
                }
            }
            notifications.sample(
                &[
                    ("rule", &r.rule.name),
                    ("sink", "queue"),
                    ("result", "dropped"),
                ],
                r.stats.dropped.load(Ordering::Relaxed),
            );
        }
    }
}

fn members_down(pools: &[Arc<Pool>], out: &mut Vec<Condition>) {
    for p in pools {
        for m in p.members().iter() {
            if m.health.is_up() {
                continue;
            }
            let reason = m
                .health
                .last_transition()
                .map(|t| t.reason)
                .unwrap_or_default();
            let addr = m.label.to_string();
            out.push(Condition::new(
                AlertEvent::MemberDown,
                "warning",
                &[("pool", &p.name), ("member", &addr)],
                format!("member {addr} of pool {} is down: {reason}", p.name),
            ));
        }
    }
}

fn elastic_members_joined(pools: &[Arc<Pool>], out: &mut Vec<Condition>) {
    for p in pools.iter().filter(|p| p.elastic.is_some()) {
        for m in p.members().iter().filter(|m| m.is_joined()) {
            let addr = m.label.to_string();
            out.push(Condition::new(
                AlertEvent::ElasticJoined,
                "info",
                &[("pool", &p.name), ("member", &addr)],
                format!(
                    "standby member {addr} joined pool {}: utilisation reached its `join` threshold",
                    p.name
                ),
            ));
        }
    }
}

fn pools_below_min(pools: &[Arc<Pool>], out: &mut Vec<Condition>) {
    for p in pools {
        let (available, min) = (p.available(), p.config.min_active as usize);
        if available < min {
            out.push(Condition::new(
                AlertEvent::PoolBelowMin,
                "critical",
                &[("pool", &p.name)],
                format!(
                    "pool {} has {available} available members, below min_active {min}",
                    p.name
                ),
            ));
        }
    }
}

fn sites_down(control: &dyn Control, out: &mut Vec<Condition>) {
    let (code, v) = control.plane_get(&["gslb", "sites"], &[]);
    if code != 200 {
        return;
    }
    for s in v["sites"].as_array().into_iter().flatten() {
        if s["health"] == "down" {
            let name = s["name"].as_str().unwrap_or("?");
            out.push(Condition::new(
                AlertEvent::SiteDown,
                "critical",
                &[("site", name)],
                format!("GSLB site {name} is down"),
            ));
        }
    }
}

fn links_down(control: &dyn Control, out: &mut Vec<Condition>) {
    let (code, v) = control.plane_get(&["links"], &[]);
    if code != 200 {
        return;
    }
    for l in v["links"].as_array().into_iter().flatten() {
        if l["health"] == "down" {
            let name = l["name"].as_str().unwrap_or("?");
            let kind = l["kind"].as_str().unwrap_or("link");
            out.push(Condition::new(
                AlertEvent::LinkDown,
                "critical",
                &[("link", name), ("kind", kind)],
                format!("{kind} {name} is down: its new flows go elsewhere"),
            ));
        }
    }
}

/// A failover is an event, not a state: the alert fires when this node gains or loses
/// mastership (or goes to fault) and resolves FAILOVER_SHOWN later.
fn recent_failover(control: &dyn Control, out: &mut Vec<Condition>) {
    let (code, v) = control.plane_get(&["ha"], &[]);
    let t = &v["last_transition"];
    let (from, to) = (
        t["from"].as_str().unwrap_or(""),
        t["to"].as_str().unwrap_or(""),
    );
    let at = t["at"].as_f64().unwrap_or(0.0);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let role_change =
        from != to && (from == "master" || to == "master" || to == "fault") && from != "init";
    if code == 200 && role_change && now - at < FAILOVER_SHOWN.as_secs_f64() {
        let node = v["node"].as_str().unwrap_or("");
        let reason = t["reason"].as_str().unwrap_or("");
        out.push(Condition::new(
            AlertEvent::Failover,
            "critical",
            &[("node", node), ("from", from), ("to", to)],
            format!("HA node {node} went from {from} to {to}: {reason}"),
        ));
    }
}

fn enqueue(r: &RuleRuntime, n: Notification) {
    if r.queue.try_send(n).is_err() {
        r.stats.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

async fn deliver(rule: AlertRule, mut rx: mpsc::Receiver<Notification>, stats: Arc<RuleStats>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let host = hostname();
    while let Some(n) = rx.recv().await {
        for sink in stats.sinks.keys().copied() {
            if n.refresh_only && sink != "webhook" {
                continue;
            }
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let (rule, n, stats, host) = (rule.clone(), n.clone(), stats.clone(), host.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let s = &stats.sinks[sink];
                let mut backoff = FIRST_BACKOFF;
                for attempt in 1..=ATTEMPTS {
                    let r = tokio::time::timeout(SEND_TIMEOUT, send(sink, &rule, &n, &host))
                        .await
                        .unwrap_or_else(|_| Err("timed out".into()));
                    match r {
                        Ok(()) => {
                            s.sent.fetch_add(1, Ordering::Relaxed);
                            s.last_latency_us
                                .store(n.created.elapsed().as_micros() as u64, Ordering::Relaxed);
                            return;
                        }
                        Err(e) if attempt == ATTEMPTS => {
                            s.failed.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(rule = %rule.name, sink, error = %e, "alert not delivered after {ATTEMPTS} attempts");
                        }
                        Err(e) => {
                            s.retries.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(rule = %rule.name, sink, error = %e, "alert delivery failed; retrying");
                            tokio::time::sleep(backoff).await;
                            backoff *= 2;
                        }
                    }
                }
            });
        }
    }
}

async fn send(sink: &str, rule: &AlertRule, n: &Notification, host: &str) -> Result<(), String> {
    match sink {
        "webhook" => {
            let url = rule.webhook.as_deref().unwrap_or_default();
            let body = if url.trim_end_matches('/').ends_with("/api/v2/alerts") {
                alertmanager_v2(n)
            } else if n.refresh_only {
                return Ok(());
            } else {
                webhook_v4(rule, n, host)
            };
            let tls = crate::deliver::WebhookTls {
                verify: rule.webhook_verify,
                ca: rule.webhook_ca.as_deref(),
            };
            crate::deliver::http_post(url, &body, &tls).await
        }
        "syslog" => match rule.syslog {
            Some(addr) => crate::deliver::syslog(addr, &rfc5424(rule, n, host)).await,
            None => Ok(()),
        },
        "smtp" => match &rule.smtp {
            Some(s) => {
                let subject = format!(
                    "[{}] {}: {}",
                    if n.status == Status::Firing {
                        "FIRING"
                    } else {
                        "RESOLVED"
                    },
                    n.labels.get("alertname").map_or("alert", String::as_str),
                    n.summary
                );
                let body = mail_body(rule, n, host);
                crate::deliver::smtp(s, host, &subject, &body).await
            }
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

fn annotations(n: &Notification) -> Value {
    json!({ "summary": n.summary })
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Alertmanager API v2: `POST /api/v2/alerts` with a list of postable alerts.
fn alertmanager_v2(n: &Notification) -> Value {
    let ends = match n.status {
        Status::Resolved => n.ends_at.unwrap_or_else(SystemTime::now),
        Status::Firing => SystemTime::now() + AM_LEASE,
    };
    json!([{
        "labels": n.labels,
        "annotations": annotations(n),
        "startsAt": rfc3339(n.starts_at),
        "endsAt": rfc3339(ends),
        "generatorURL": "",
    }])
}

/// The JSON Alertmanager's webhook receiver sends (version 4), for anything that takes it.
fn webhook_v4(rule: &AlertRule, n: &Notification, host: &str) -> Value {
    let status = if n.status == Status::Firing {
        "firing"
    } else {
        "resolved"
    };
    let alertname = n.labels.get("alertname").cloned().unwrap_or_default();
    json!({
        "version": "4",
        "groupKey": format!("{{}}:{{alertname=\"{alertname}\"}}"),
        "truncatedAlerts": 0,
        "status": status,
        "receiver": rule.name,
        "groupLabels": { "alertname": alertname },
        "commonLabels": n.labels,
        "commonAnnotations": annotations(n),
        "externalURL": format!("http://{host}/ui/"),
        "alerts": [{
            "status": status,
            "labels": n.labels,
            "annotations": annotations(n),
            "startsAt": rfc3339(n.starts_at),
            "endsAt": n.ends_at.map_or("0001-01-01T00:00:00Z".to_string(), rfc3339),
            "generatorURL": "",
            "fingerprint": fingerprint(&n.labels),
        }],
    })
}

fn sd_escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace(']', "\\]")
}

/// One RFC 5424 message: facility daemon, severity warning (firing) or notice (resolved);
/// the labels as structured data under the documentation enterprise number (RFC 5612).
fn rfc5424(rule: &AlertRule, n: &Notification, host: &str) -> String {
    let pri = 3 * 8 + if n.status == Status::Firing { 4 } else { 5 };
    let event = n.labels.get("event").map_or("alert", String::as_str);
    let mut sd = format!(
        "[fulcrum@32473 rule=\"{}\" status=\"{}\"",
        sd_escape(&rule.name),
        if n.status == Status::Firing {
            "firing"
        } else {
            "resolved"
        }
    );
    for (k, v) in &n.labels {
        // SD-NAMEs are printable ASCII without '=', ' ', ']', '"', at most 32 characters.
        let name: String = k
            .chars()
            .filter(|c| c.is_ascii_graphic() && !matches!(c, '=' | ']' | '"'))
            .take(32)
            .collect();
        sd.push_str(&format!(" {name}=\"{}\"", sd_escape(v)));
    }
    sd.push(']');
    format!(
        "<{pri}>1 {} {host} fulcrum {} {event} {sd} {} {}",
        rfc3339(SystemTime::now()),
        std::process::id(),
        if n.status == Status::Firing {
            "FIRING"
        } else {
            "RESOLVED"
        },
        n.summary
    )
}

fn mail_body(rule: &AlertRule, n: &Notification, host: &str) -> String {
    let mut b = format!(
        "{}\n\nStatus:  {}\nRule:    {}\nHost:    {host}\nSince:   {}\n",
        n.summary,
        if n.status == Status::Firing {
            "firing"
        } else {
            "resolved"
        },
        rule.name,
        rfc3339(n.starts_at),
    );
    if let Some(e) = n.ends_at {
        b.push_str(&format!("Ended:   {}\n", rfc3339(e)));
    }
    b.push_str("\nLabels:\n");
    for (k, v) in &n.labels {
        b.push_str(&format!("  {k} = {v}\n"));
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process with one link down and an HA node that became master `ago` seconds ago.
    struct Planes {
        ago: f64,
    }

    impl Control for Planes {
        fn generation(&self) -> u64 {
            1
        }
        fn services(&self) -> Vec<crate::ServiceInfo> {
            Vec::new()
        }
        fn pools(&self) -> Vec<Arc<fulcrum_balance::Pool>> {
            Vec::new()
        }
        fn reload(&self) -> Result<u64, Vec<String>> {
            Ok(1)
        }
        fn admin_access(&self) -> crate::Access {
            crate::Access {
                token: Arc::from("t"),
                reads_need_token: false,
                metrics_need_token: false,
            }
        }
        fn plane_api(&self, r: &crate::ApiRequest) -> Option<(u16, serde_json::Value)> {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("clock")
                .as_secs_f64();
            match r.path {
                ["links"] => Some((
                    200,
                    serde_json::json!({"links": [
                        {"name": "telecom", "kind": "link", "health": "down"},
                        {"name": "unicom", "kind": "link", "health": "up"},
                    ]}),
                )),
                ["ha"] => Some((
                    200,
                    serde_json::json!({"node": "lb2", "last_transition":
                        {"from": "backup", "to": "master", "reason": "master down timer expired",
                         "at": now - self.ago}}),
                )),
                _ => None,
            }
        }
    }

    fn watching(on: Vec<AlertEvent>) -> Vec<RuleRuntime> {
        vec![RuleRuntime {
            rule: AlertRule {
                name: "ops".into(),
                on,
                webhook: None,
                webhook_ca: None,
                webhook_verify: true,
                syslog: None,
                smtp: None,
                repeat: Duration::ZERO,
                hold: Duration::ZERO,
                cert_expiry: Duration::ZERO,
            },
            queue: mpsc::channel(1).0,
            stats: Arc::default(),
            tracked: HashMap::new(),
        }]
    }

    #[test]
    fn down_links_and_recent_failovers_raise_their_alerts() {
        let alerts = Alerts::default();
        let config = Config::default();
        let rules = watching(vec![AlertEvent::LinkDown, AlertEvent::Failover]);
        let now = alerts.conditions(&Planes { ago: 2.0 }, &config, &rules);
        let names: Vec<(&str, Option<&String>)> = now
            .iter()
            .map(|c| {
                (
                    alertname(c.event),
                    c.labels.get("link").or(c.labels.get("to")),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("FulcrumLinkDown", Some(&"telecom".to_string())),
                ("FulcrumFailover", Some(&"master".to_string()))
            ]
        );
        // A role change long ago no longer fires; rules that do not watch an event raise none.
        let later = alerts.conditions(&Planes { ago: 3600.0 }, &config, &rules);
        assert_eq!(later.len(), 1, "only the link");
        let none = alerts.conditions(
            &Planes { ago: 2.0 },
            &config,
            &watching(vec![AlertEvent::CertExpiry]),
        );
        assert!(none.is_empty());
    }

    fn note(status: Status) -> Notification {
        Notification {
            status,
            refresh_only: false,
            labels: labels(&[
                ("alertname", "FulcrumMemberDown"),
                ("event", "member_down"),
                ("member", "a\"]b"),
            ]),
            summary: "member a of pool p is down".into(),
            starts_at: SystemTime::UNIX_EPOCH,
            ends_at: None,
            created: Instant::now(),
        }
    }

    #[test]
    fn syslog_message_is_rfc5424_with_escaped_structured_data() {
        let rule = AlertRule {
            name: "ops".into(),
            on: vec![AlertEvent::MemberDown],
            webhook: None,
            webhook_ca: None,
            webhook_verify: true,
            syslog: None,
            smtp: None,
            repeat: Duration::ZERO,
            hold: Duration::ZERO,
            cert_expiry: Duration::ZERO,
        };
        let m = rfc5424(&rule, &note(Status::Firing), "lb1");
        assert!(m.starts_with("<28>1 "), "{m}");
        assert!(m.contains(" lb1 fulcrum "), "{m}");
        assert!(
            m.contains(" member_down [fulcrum@32473 rule=\"ops\" status=\"firing\""),
            "{m}"
        );
        assert!(m.contains("member=\"a\\\"\\]b\""), "{m}");
        assert!(m.ends_with("FIRING member a of pool p is down"), "{m}");
        let r = rfc5424(&rule, &note(Status::Resolved), "lb1");
        assert!(r.starts_with("<29>1 "), "{r}");
    }

    #[test]
    fn fingerprint_is_stable_and_label_sensitive() {
        let a = labels(&[("a", "1")]);
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(fingerprint(&a), fingerprint(&labels(&[("a", "2")])));
    }
}

//! `/metrics`: one `prometheus-client` registry that every part of the process registers its
//! collectors with, encoded per scrape as the Prometheus text format (0.0.4) or OpenMetrics.
//!
//! The figures already live in the members', services' and planes' atomics, and a reload swaps
//! the objects that hold them. So nothing is copied into registry-owned metrics: each collector
//! builds its families from the atomics at scrape time, and registering happens once, when the
//! API starts; what a collector reads after a reload is simply the new state.
//!
//! A collector writes through `MetricFamilies`, which keeps the project's conventions in one
//! place: counters are named with their exposed `_total` suffix, whole numbers are written
//! without a decimal point, and an encoding error ends the scrape instead of panicking.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_balance::{clock, WEIGHT_SCALE};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
pub use prometheus_client::registry::Registry;

use crate::Control;

/// What a family's samples mean to a scraper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// A sample's value as the atomics hold it: counts stay exact past 2^53.
#[derive(Debug, Clone, Copy)]
pub enum Value {
    Count(u64),
    Signed(i64),
    Real(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Count(v)
    }
}
impl From<usize> for Value {
    fn from(v: usize) -> Value {
        Value::Count(v as u64)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Count(u64::from(v))
    }
}
impl From<u8> for Value {
    fn from(v: u8) -> Value {
        Value::Count(u64::from(v))
    }
}
impl From<u16> for Value {
    fn from(v: u16) -> Value {
        Value::Count(u64::from(v))
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::Signed(i64::from(v))
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Count(u64::from(v))
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Signed(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Real(v)
    }
}

/// Below 2^53 every whole f64 is exact as an integer.
const EXACT_WHOLE: f64 = 9_007_199_254_740_992.0;

impl Value {
    /// Whole figures computed as f64 (a weight, a flag) are written as integers, as the hand
    /// written exposition did: `1`, not `1.0`, so existing queries and greps keep matching.
    fn normalised(self) -> Value {
        match self {
            Value::Real(v) if v.fract() == 0.0 && v.abs() < EXACT_WHOLE => {
                if v >= 0.0 {
                    Value::Count(v as u64)
                } else {
                    Value::Signed(v as i64)
                }
            }
            v => v,
        }
    }

    fn encode(self, kind: MetricKind, encoder: MetricEncoder) -> fmt::Result {
        match (kind, self.normalised()) {
            (MetricKind::Counter, Value::Count(v)) => ConstCounter::new(v).encode(encoder),
            (MetricKind::Counter, Value::Signed(v)) => {
                ConstCounter::new(v.max(0) as u64).encode(encoder)
            }
            (MetricKind::Counter, Value::Real(v)) => ConstCounter::new(v).encode(encoder),
            (_, Value::Count(v)) => ConstGauge::new(v).encode(encoder),
            (_, Value::Signed(v)) => ConstGauge::new(v).encode(encoder),
            (_, Value::Real(v)) => ConstGauge::new(v).encode(encoder),
        }
    }
}

/// A counter family read from each of many `S`: its name, its help, and how to read it.
pub type CounterFamily<S> = (&'static str, &'static str, fn(&S) -> u64);

/// The families one collector writes in one scrape.
pub struct MetricFamilies<'a> {
    encoder: DescriptorEncoder<'a>,
    outcome: fmt::Result,
}

impl MetricFamilies<'_> {
    /// A counter family; `name` is the exposed sample name and ends in `_total` (the encoder
    /// adds the suffix, so it is taken off the descriptor).
    pub fn counter<'s>(&'s mut self, name: &'s str, help: &str) -> Family<'s> {
        self.family(name, MetricKind::Counter, help)
    }

    /// Counter families, one per `(name, help, read)` of `families`, each with a sample per
    /// virtual service of `services` (its name and its counters): `read` of the counters,
    /// labelled `vs`.
    pub fn counters_per_vs<'a, S: 'a>(
        &mut self,
        families: &[CounterFamily<S>],
        services: impl Iterator<Item = (&'a str, &'a S)> + Clone,
    ) {
        for (name, help, read) in families {
            let mut samples = self.counter(name, help);
            for (vs, counters) in services.clone() {
                samples.sample(&[("vs", vs)], read(counters));
            }
        }
    }

    pub fn gauge<'s>(&'s mut self, name: &'s str, help: &str) -> Family<'s> {
        self.family(name, MetricKind::Gauge, help)
    }

    /// A histogram family; its samples are written with `Family::histogram`.
    pub fn histogram<'s>(&'s mut self, name: &'s str, help: &str) -> Family<'s> {
        self.family(name, MetricKind::Histogram, help)
    }

    /// A family of `kind`; its samples must be written before the next family starts.
    pub fn family<'s>(&'s mut self, name: &'s str, kind: MetricKind, help: &str) -> Family<'s> {
        let (base, metric_type) = match kind {
            MetricKind::Counter => {
                debug_assert!(name.ends_with("_total"), "counter {name} lacks _total");
                (
                    name.strip_suffix("_total").unwrap_or(name),
                    MetricType::Counter,
                )
            }
            MetricKind::Gauge => (name, MetricType::Gauge),
            MetricKind::Histogram => (name, MetricType::Histogram),
        };
        if self.outcome.is_err() {
            return Family {
                encoder: None,
                kind,
                outcome: &mut self.outcome,
            };
        }
        match self
            .encoder
            .encode_descriptor(base, help, None, metric_type)
        {
            Ok(encoder) => Family {
                encoder: Some(encoder),
                kind,
                outcome: &mut self.outcome,
            },
            Err(e) => {
                self.outcome = Err(e);
                Family {
                    encoder: None,
                    kind,
                    outcome: &mut self.outcome,
                }
            }
        }
    }
}

/// One family being written: its samples, each with its own label values.
pub struct Family<'s> {
    encoder: Option<MetricEncoder<'s>>,
    kind: MetricKind,
    outcome: &'s mut fmt::Result,
}

impl Family<'_> {
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Into<Value>) {
        let value = value.into();
        let kind = self.kind;
        self.write(|encoder| value.encode(kind, encoder.encode_family(&labels)?));
    }

    /// One labelled histogram: `buckets` are (upper bound, count in that bucket alone), the
    /// last bound `f64::INFINITY`.
    pub fn histogram(
        &mut self,
        labels: &[(&str, &str)],
        sum: f64,
        count: u64,
        buckets: &[(f64, u64)],
    ) {
        self.write(|encoder| {
            encoder
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(sum, count, buckets, None)
        });
    }

    fn write(&mut self, encode: impl FnOnce(&mut MetricEncoder) -> fmt::Result) {
        let Some(encoder) = self.encoder.as_mut() else {
            return;
        };
        if let Err(e) = encode(encoder) {
            *self.outcome = Err(e);
            self.encoder = None;
        }
    }
}

/// A collector from a function that writes families, for what already reads its own state
/// (a plane, the alert rules): registered once, it is called at every scrape.
pub fn collector<F>(write: F) -> Box<dyn Collector>
where
    F: Fn(&mut MetricFamilies) + Send + Sync + 'static,
{
    Box::new(FamilyCollector(write))
}

struct FamilyCollector<F>(F);

impl<F> fmt::Debug for FamilyCollector<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FamilyCollector")
    }
}

impl<F> Collector for FamilyCollector<F>
where
    F: Fn(&mut MetricFamilies) + Send + Sync + 'static,
{
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let mut families = MetricFamilies {
            encoder,
            outcome: Ok(()),
        };
        (self.0)(&mut families);
        families.outcome
    }
}

/// The exposition formats `/metrics` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4: what a plain `curl` or an older scraper gets.
    Text,
    /// OpenMetrics 1.0, for a scraper that asks for it in `Accept` (Prometheus does).
    OpenMetrics,
}

impl Format {
    /// Prometheus lists OpenMetrics first in its `Accept`; anything else gets the classic
    /// text format, which is what every version of Prometheus reads.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The registry's families, as one exposition.
pub fn encode(registry: &Registry, format: Format) -> Result<String, fmt::Error> {
    let mut text = String::new();
    match format {
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut text, registry)?,
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, registry)?,
    }
    Ok(text)
}

/// The registry `/metrics` serves: the process's own families (services, pools, members),
/// what the binary registers through `Control::register_metrics` (planes, limits), and
/// `extra` (the alert rules), in that order.
pub fn registry(control: Arc<dyn Control>, extra: Box<dyn Collector>) -> Registry {
    let mut registry = Registry::default();
    let core = control.clone();
    registry.register_collector(collector(move |out| {
        process_families(core.as_ref(), out);
        service_families(core.as_ref(), out);
        // One snapshot of the pools for both, so a reload between them cannot show a member
        // under a pool that is gone.
        let pools = core.pools();
        pool_families(&pools, out);
        member_families(&pools, out);
    }));
    control.register_metrics(&mut registry);
    registry.register_collector(extra);
    registry
}

fn process_families(control: &dyn Control, out: &mut MetricFamilies) {
    out.gauge("fulcrum_build_info", "Fulcrum version.")
        .sample(&[("version", env!("CARGO_PKG_VERSION"))], 1u64);
    out.gauge(
        "fulcrum_config_generation",
        "Configuration generation (1 at start, +1 per reload).",
    )
    .sample(&[], control.generation());
}

fn service_families(control: &dyn Control, out: &mut MetricFamilies) {
    let services = control.services();
    type ServiceField = fn(&fulcrum_net::ServiceStats) -> u64;
    let vs_families: [(&str, MetricKind, &str, ServiceField); 15] = [
        (
            "fulcrum_vs_connections_active",
            MetricKind::Gauge,
            "Client connections open now.",
            |s| s.connections_active.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_connections_total",
            MetricKind::Counter,
            "Client connections accepted.",
            |s| s.connections_total.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_requests_total",
            MetricKind::Counter,
            "Requests (L4: connections) handled.",
            |s| s.requests_total.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_bytes_in_total",
            MetricKind::Counter,
            "Bytes received from clients.",
            |s| s.bytes_in.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_bytes_out_total",
            MetricKind::Counter,
            "Bytes sent to clients.",
            |s| s.bytes_out.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_no_member_total",
            MetricKind::Counter,
            "Clients turned away because no member was available.",
            |s| s.no_member.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_over_limit_total",
            MetricKind::Counter,
            "Clients turned away by the service's connection limit.",
            |s| s.over_limit.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_upstream_failures_total",
            MetricKind::Counter,
            "Clients for whom every member connection attempt failed.",
            |s| s.upstream_failures.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_denied_total",
            MetricKind::Counter,
            "Connections (udp: datagrams) refused by the service's allow/deny lists.",
            |s| s.denied.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_ftp_data_connections_total",
            MetricKind::Counter,
            "FTP data connections relayed (protocol ftp).",
            |s| s.ftp_data_connections.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_ftp_refused_total",
            MetricKind::Counter,
            "FTP control lines and data connections refused or passed unchanged (protocol ftp).",
            |s| s.ftp_refused.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_rtsp_sessions_total",
            MetricKind::Counter,
            "RTSP sessions opened by members' SETUP replies (protocol rtsp).",
            |s| s.rtsp_sessions.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_rtsp_datagrams_total",
            MetricKind::Counter,
            "RTP and RTCP datagrams relayed for UDP transports (protocol rtsp).",
            |s| s.rtsp_datagrams.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_rtsp_datagrams_dropped_total",
            MetricKind::Counter,
            "RTP and RTCP datagrams dropped: from a host other than the session's client or member (protocol rtsp).",
            |s| s.rtsp_datagrams_dropped.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_rtsp_malformed_total",
            MetricKind::Counter,
            "RTSP messages that could not be framed: clients answered 400, members' connections closed (protocol rtsp).",
            |s| s.rtsp_malformed.load(Ordering::Relaxed),
        ),
    ];
    for (name, kind, help, get) in vs_families {
        let mut family = out.family(name, kind, help);
        for s in &services {
            family.sample(
                &[("vs", &s.name), ("protocol", s.protocol.as_str())],
                get(&s.stats),
            );
        }
    }
    let mut hits = out.counter(
        "fulcrum_vs_rule_hits_total",
        "Connections (udp: new flows; drop rules: datagrams) decided by each rule of a tcp, udp or message service.",
    );
    for s in &services {
        for h in s.stats.rules.load().iter() {
            hits.sample(
                &[("vs", &s.name), ("rule", &h.label), ("action", &h.action)],
                h.hits.load(Ordering::Relaxed),
            );
        }
    }
}

fn pool_families(pools: &[Arc<fulcrum_balance::Pool>], out: &mut MetricFamilies) {
    type PoolField = fn(&fulcrum_balance::Pool) -> u64;
    let pool_families: [(&str, MetricKind, &str, PoolField); 4] = [
        (
            "fulcrum_pool_members_available",
            MetricKind::Gauge,
            "Members that can take a new client now.",
            |p| p.available() as u64,
        ),
        (
            "fulcrum_pool_no_member_total",
            MetricKind::Counter,
            "Picks that found no available member.",
            |p| p.no_member.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_pool_panic",
            MetricKind::Gauge,
            "1 while the pool is in panic mode: no member up, passively failed members still used.",
            |p| u64::from(p.in_panic()),
        ),
        (
            "fulcrum_pool_panic_picks_total",
            MetricKind::Counter,
            "Picks made in panic mode.",
            |p| p.panic_picks.load(Ordering::Relaxed),
        ),
    ];
    for (name, kind, help, get) in pool_families {
        let mut family = out.family(name, kind, help);
        for p in pools {
            family.sample(&[("pool", &p.name)], get(p));
        }
    }

    let elastic: Vec<_> = pools
        .iter()
        .filter_map(|p| p.elastic.as_ref().map(|e| (p, e)))
        .collect();
    if elastic.is_empty() {
        return;
    }
    type ElasticField = fn(&fulcrum_balance::ElasticState) -> f64;
    let families: [(&str, MetricKind, &str, ElasticField); 5] = [
        (
            "fulcrum_pool_utilisation",
            MetricKind::Gauge,
            "Elastic pool utilisation (1 = the members' limits or the response-time target).",
            |e| e.utilisation(),
        ),
        (
            "fulcrum_pool_elastic_joins_total",
            MetricKind::Counter,
            "Standby members that joined an elastic pool.",
            |e| e.joins.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_pool_elastic_leaves_total",
            MetricKind::Counter,
            "Standby members that left an elastic pool.",
            |e| e.leaves.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_pool_elastic_hook_runs_total",
            MetricKind::Counter,
            "Elastic hook commands run.",
            |e| e.hook_runs.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_pool_elastic_hook_failures_total",
            MetricKind::Counter,
            "Elastic hook commands that failed (exit status, timeout, could not start).",
            |e| e.hook_failures.load(Ordering::Relaxed) as f64,
        ),
    ];
    for (name, kind, help, get) in families {
        let mut family = out.family(name, kind, help);
        for (p, e) in &elastic {
            family.sample(&[("pool", &p.name)], get(e));
        }
    }
    let mut joined = out.gauge(
        "fulcrum_member_standby_joined",
        "Standby members of elastic pools: 1 while joined.",
    );
    for (p, _) in &elastic {
        for m in p.members().iter().filter(|m| m.is_standby()) {
            joined.sample(&[("pool", &p.name), ("member", &m.label)], m.is_joined());
        }
    }
}

fn member_families(pools: &[Arc<fulcrum_balance::Pool>], out: &mut MetricFamilies) {
    type MemberField = fn(&fulcrum_balance::Member) -> f64;
    let member_families: [(&str, MetricKind, &str, MemberField); 14] = [
        (
            "fulcrum_member_up",
            MetricKind::Gauge,
            "1 when the member's health is up.",
            |m| f64::from(u8::from(m.health.is_up())),
        ),
        (
            "fulcrum_member_weight",
            MetricKind::Gauge,
            "Configured (or API-set) weight.",
            |m| f64::from(m.weight()),
        ),
        (
            "fulcrum_member_effective_weight",
            MetricKind::Gauge,
            "Weight the scheduler uses now (slow start, agent, speed).",
            |m| f64::from(m.effective_weight()) / f64::from(WEIGHT_SCALE),
        ),
        (
            "fulcrum_member_connections_active",
            MetricKind::Gauge,
            "Connections to the member open now.",
            |m| m.stats.active_connections.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_connections_total",
            MetricKind::Counter,
            "Connections made to the member.",
            |m| m.stats.connections_total.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_requests_active",
            MetricKind::Gauge,
            "Requests in flight on the member.",
            |m| m.stats.active_requests.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_requests_total",
            MetricKind::Counter,
            "Requests sent to the member.",
            |m| m.stats.requests_total.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_connections_reused_total",
            MetricKind::Counter,
            "Requests that went over an already open member connection (HTTP reuse).",
            |m| m.stats.connections_reused.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_connections_idle",
            MetricKind::Gauge,
            "Open member connections waiting idle for reuse (HTTP).",
            |m| m.stats.connections_idle.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_connect_failures_total",
            MetricKind::Counter,
            "Failed connection attempts.",
            |m| m.stats.connect_failures.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_bytes_sent_total",
            MetricKind::Counter,
            "Bytes sent to the member.",
            |m| m.stats.bytes_sent.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_bytes_received_total",
            MetricKind::Counter,
            "Bytes received from the member.",
            |m| m.stats.bytes_received.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_response_time_seconds",
            MetricKind::Gauge,
            "Response (L4: connect) time, moving average.",
            |m| m.stats.response_time_us() / 1e6,
        ),
        (
            "fulcrum_member_traffic_bytes_per_second",
            MetricKind::Gauge,
            "Traffic, moving average.",
            |m| m.stats.traffic_bps(),
        ),
    ];
    for (name, kind, help, get) in member_families {
        let mut family = out.family(name, kind, help);
        for p in pools {
            for m in p.members() {
                family.sample(&[("pool", &p.name), ("member", &m.label)], get(m));
            }
        }
    }
    let mut state = out.gauge(
        "fulcrum_member_state",
        "1 for the member's effective admin state.",
    );
    for p in pools {
        for m in p.members() {
            let current = m.effective_state();
            for s in fulcrum_config::AdminState::ALL {
                state.sample(
                    &[("pool", &p.name), ("member", &m.label), ("state", s)],
                    current.as_str() == *s,
                );
            }
        }
    }
    let mut slow_start = out.gauge(
        "fulcrum_member_slow_start",
        "1 while the member is in a slow-start phase.",
    );
    let now = clock::now_ms();
    for p in pools {
        for m in p.members() {
            slow_start.sample(
                &[("pool", &p.name), ("member", &m.label)],
                m.slow_start_phase(now) != "none",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(format: Format, write: fn(&mut MetricFamilies)) -> String {
        let mut registry = Registry::default();
        registry.register_collector(collector(write));
        encode(&registry, format).unwrap()
    }

    #[test]
    fn escapes_label_values() {
        let text = scrape(Format::Text, |out| {
            out.gauge("x", "h").sample(&[("a", "q\"b\\c\nd")], 1.0);
        });
        assert_eq!(
            text,
            "# HELP x h\n# TYPE x gauge\nx{a=\"q\\\"b\\\\c\\nd\"} 1\n"
        );
    }

    #[test]
    fn counters_keep_their_total_name_in_both_formats() {
        let write = |out: &mut MetricFamilies| {
            out.counter("x_total", "h").sample(&[("vs", "web")], 3u64);
        };
        assert_eq!(
            scrape(Format::Text, write),
            "# HELP x_total h\n# TYPE x_total counter\nx_total{vs=\"web\"} 3\n"
        );
        assert_eq!(
            scrape(Format::OpenMetrics, write),
            "# HELP x h\n# TYPE x counter\nx_total{vs=\"web\"} 3\n# EOF\n"
        );
    }

    #[test]
    fn whole_values_are_written_as_integers() {
        let text = scrape(Format::Text, |out| {
            let mut g = out.gauge("g", "h");
            g.sample(&[("k", "whole")], 2.0);
            g.sample(&[("k", "half")], 0.5);
            g.sample(&[("k", "negative")], -3.0);
            g.sample(&[("k", "big")], u64::MAX);
        });
        assert!(text.contains("g{k=\"whole\"} 2\n"), "{text}");
        assert!(text.contains("g{k=\"half\"} 0.5\n"), "{text}");
        assert!(text.contains("g{k=\"negative\"} -3\n"), "{text}");
        assert!(
            text.contains("g{k=\"big\"} 18446744073709551615\n"),
            "{text}"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_an_infinite_bucket() {
        let text = scrape(Format::Text, |out| {
            out.histogram("lat_seconds", "h").histogram(
                &[("vs", "a")],
                1.5,
                3,
                &[(0.5, 1), (1.0, 2), (f64::INFINITY, 0)],
            );
        });
        for line in [
            "# TYPE lat_seconds histogram\n",
            "lat_seconds_bucket{vs=\"a\",le=\"0.5\"} 1\n",
            "lat_seconds_bucket{vs=\"a\",le=\"1\"} 3\n",
            "lat_seconds_bucket{vs=\"a\",le=\"+Inf\"} 3\n",
            "lat_seconds_sum{vs=\"a\"} 1.5\n",
            "lat_seconds_count{vs=\"a\"} 3\n",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
    }

    #[test]
    fn openmetrics_only_when_asked_for() {
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::from_accept(Some("*/*")), Format::Text);
        assert_eq!(Format::from_accept(None), Format::Text);
    }
}

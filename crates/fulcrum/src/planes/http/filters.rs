//! The proxy-wasm filters of http services (`[[virtual_service.filter]]`): their metric
//! families, the metrics the filters define themselves, and their rows in the API.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_admin::MetricFamilies;
use fulcrum_http::HttpStats;
use fulcrum_wasm::FilterStats;

type Field = fn(&FilterStats) -> u64;

/// What each filter counts, as (family, help, reading).
const FAMILIES: [(&str, &str, Field); 5] = [
    (
        "fulcrum_filter_calls_total",
        "Calls into proxy-wasm filters (each callback of each request).",
        |s| s.calls.load(Ordering::Relaxed),
    ),
    (
        "fulcrum_filter_local_replies_total",
        "Requests a filter answered itself (proxy_send_local_response).",
        |s| s.local_replies.load(Ordering::Relaxed),
    ),
    (
        "fulcrum_filter_http_calls_total",
        "HTTP calls filters made to pools (proxy_http_call).",
        |s| s.http_calls.load(Ordering::Relaxed),
    ),
    (
        "fulcrum_filter_restarts_total",
        "Filter instances replaced after a failure (their memory may have been half-updated).",
        |s| s.instance_restarts.load(Ordering::Relaxed),
    ),
    (
        "fulcrum_filter_disabled",
        "1 while a filter is disabled after consecutive failures (a reload enables it again).",
        |s| u64::from(s.disabled.load(Ordering::Relaxed)),
    ),
];

fn rows(stats: &[(String, Arc<HttpStats>)]) -> Vec<(&str, Arc<str>, Arc<FilterStats>)> {
    stats
        .iter()
        .flat_map(|(vs, s)| {
            s.filters
                .all()
                .into_iter()
                .map(move |(f, st)| (vs.as_str(), f, st))
        })
        .collect()
}

pub fn metrics(w: &mut MetricFamilies, stats: &[(String, Arc<HttpStats>)]) {
    let rows = rows(stats);
    if !rows.is_empty() {
        let mut samples = w.counter(
            "fulcrum_filter_failures_total",
            "Filter calls that failed (kind: budget = ran past time_budget, memory = would pass max_memory, trap); each fails its request as on_error says.",
        );
        for (vs, f, s) in &rows {
            for (kind, v) in [
                ("budget", &s.budget_exceeded),
                ("memory", &s.memory_exceeded),
                ("trap", &s.traps),
            ] {
                samples.sample(
                    &[("vs", vs), ("filter", f), ("kind", kind)],
                    v.load(Ordering::Relaxed),
                );
            }
        }
        for (family, help, get) in FAMILIES {
            let mut samples = if family.ends_with("_total") {
                w.counter(family, help)
            } else {
                w.gauge(family, help)
            };
            for (vs, f, s) in &rows {
                samples.sample(&[("vs", vs), ("filter", f)], get(s));
            }
        }
    }
    defined_metrics(w);
}

/// The metrics filters define (`proxy_define_metric`), by the name they gave.
fn defined_metrics(w: &mut MetricFamilies) {
    let defined = fulcrum_wasm::metrics().lock().clone();
    if defined.is_empty() {
        return;
    }
    use fulcrum_wasm::abi::metric::{COUNTER, GAUGE, HISTOGRAM};
    let mut counters = w.counter(
        "fulcrum_filter_defined_counter_total",
        "Counters proxy-wasm filters defined, by the name they gave.",
    );
    for m in defined.iter().filter(|m| m.kind == COUNTER) {
        let v = m.value.load(Ordering::Relaxed);
        counters.sample(&[("name", &m.name)], u64::try_from(v).unwrap_or(0));
    }
    let mut gauges = w.gauge(
        "fulcrum_filter_defined_gauge",
        "Gauges proxy-wasm filters defined, by the name they gave.",
    );
    for m in defined.iter().filter(|m| m.kind == GAUGE) {
        gauges.sample(&[("name", &m.name)], m.value.load(Ordering::Relaxed));
    }
    let mut sums = w.counter(
        "fulcrum_filter_defined_histogram_sum_total",
        "Sums of the values recorded in histograms proxy-wasm filters defined.",
    );
    for m in defined.iter().filter(|m| m.kind == HISTOGRAM) {
        let v = m.value.load(Ordering::Relaxed);
        sums.sample(&[("name", &m.name)], u64::try_from(v).unwrap_or(0));
    }
    let mut counts = w.counter(
        "fulcrum_filter_defined_histogram_count_total",
        "Values recorded in histograms proxy-wasm filters defined.",
    );
    for m in defined.iter().filter(|m| m.kind == HISTOGRAM) {
        counts.sample(&[("name", &m.name)], m.count.load(Ordering::Relaxed));
    }
}

/// `/api/v1/http/filters`: every loaded filter of every http service with its counters (the
/// console's filter table).
pub fn api(stats: &[(String, Arc<HttpStats>)]) -> serde_json::Value {
    let list: Vec<serde_json::Value> = rows(stats)
        .into_iter()
        .map(|(vs, f, s)| {
            serde_json::json!({
                "service": vs,
                "filter": &*f,
                "calls": s.calls.load(Ordering::Relaxed),
                "local_replies": s.local_replies.load(Ordering::Relaxed),
                "http_calls": s.http_calls.load(Ordering::Relaxed),
                "budget_exceeded": s.budget_exceeded.load(Ordering::Relaxed),
                "memory_exceeded": s.memory_exceeded.load(Ordering::Relaxed),
                "traps": s.traps.load(Ordering::Relaxed),
                "restarts": s.instance_restarts.load(Ordering::Relaxed),
                "disabled": s.disabled.load(Ordering::Relaxed),
            })
        })
        .collect();
    serde_json::json!({ "filters": list })
}

/// `fulcrum check` (and every reload): each filter's module (and each message service's
/// framing hook) is read, compiled, linked against the host calls and started with its
/// configuration, as the service would start it.
pub fn checks(config: &fulcrum_config::Config) -> Vec<fulcrum_config::ConfigError> {
    let mut errors = Vec::new();
    for (i, vs) in config.virtual_services.iter().enumerate() {
        if let Some(path) = vs.as_message().and_then(|m| m.framing.wasm.as_ref()) {
            let checked = std::fs::read(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|bytes| fulcrum_wasm::check(&bytes, "", b""))
                .and_then(|info| {
                    info.callbacks
                        .iter()
                        .any(|c| c == "fulcrum_on_message_frame")
                        .then_some(())
                        .ok_or_else(|| "the module exports no fulcrum_on_message_frame".to_string())
                });
            if let Err(e) = checked {
                let at = format!("virtual_service[{i}].framing.wasm");
                errors.push(config.locations.error(&at, e));
            }
        }
        let Some(http) = vs.as_http() else {
            continue;
        };
        for (j, f) in http.filters.iter().enumerate() {
            let at = format!("virtual_service[{i}].filter[{j}].module");
            let checked = std::fs::read(&f.module)
                .map_err(|e| format!("cannot read {}: {e}", f.module.display()))
                .and_then(|bytes| fulcrum_wasm::check(&bytes, &f.root_id, f.config.as_bytes()));
            if let Err(e) = checked {
                errors.push(config.locations.error(&at, e));
            }
        }
    }
    errors
}

//! Prometheus text exposition (format 0.0.4).
//!
//! The figures already live in the members' and services' atomics; a metrics library would add
//! a second registry to keep in sync on every reload. The text format is a few lines of rules
//! (HELP/TYPE once per family, grouped samples, escaped label values), so it is written here.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use fulcrum_balance::{clock, WEIGHT_SCALE};

use crate::Control;

/// Writes metric families; each family's samples must be written together after `family`.
#[derive(Default)]
pub struct MetricsWriter {
    out: String,
}

impl MetricsWriter {
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.out.push_str("\\\\"),
                        '"' => self.out.push_str("\\\""),
                        '\n' => self.out.push_str("\\n"),
                        c => self.out.push(c),
                    }
                }
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    pub fn finish(self) -> String {
        self.out
    }
}

pub fn render(control: &dyn Control) -> String {
    let mut w = MetricsWriter::default();
    w.family("fulcrum_build_info", "gauge", "Fulcrum version.");
    w.sample(
        "fulcrum_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    w.family(
        "fulcrum_config_generation",
        "gauge",
        "Configuration generation (1 at start, +1 per reload).",
    );
    w.sample(
        "fulcrum_config_generation",
        &[],
        control.generation() as f64,
    );

    let services = control.services();
    type ServiceField = fn(&fulcrum_net::ServiceStats) -> u64;
    let vs_families: [(&str, &str, &str, ServiceField); 11] = [
        (
            "fulcrum_vs_connections_active",
            "gauge",
            "Client connections open now.",
            |s| s.connections_active.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_connections_total",
            "counter",
            "Client connections accepted.",
            |s| s.connections_total.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_requests_total",
            "counter",
            "Requests (L4: connections) handled.",
            |s| s.requests_total.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_bytes_in_total",
            "counter",
            "Bytes received from clients.",
            |s| s.bytes_in.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_bytes_out_total",
            "counter",
            "Bytes sent to clients.",
            |s| s.bytes_out.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_no_member_total",
            "counter",
            "Clients turned away because no member was available.",
            |s| s.no_member.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_over_limit_total",
            "counter",
            "Clients turned away by the service's connection limit.",
            |s| s.over_limit.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_upstream_failures_total",
            "counter",
            "Clients for whom every member connection attempt failed.",
            |s| s.upstream_failures.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_denied_total",
            "counter",
            "Connections (udp: datagrams) refused by the service's allow/deny lists.",
            |s| s.denied.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_ftp_data_connections_total",
            "counter",
            "FTP data connections relayed (protocol ftp).",
            |s| s.ftp_data_connections.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_vs_ftp_refused_total",
            "counter",
            "FTP control lines and data connections refused or passed unchanged (protocol ftp).",
            |s| s.ftp_refused.load(Ordering::Relaxed),
        ),
    ];
    for (name, kind, help, get) in vs_families {
        w.family(name, kind, help);
        for s in &services {
            w.sample(
                name,
                &[("vs", &s.name), ("protocol", s.protocol.as_str())],
                get(&s.stats) as f64,
            );
        }
    }

    w.family(
        "fulcrum_vs_rule_hits_total",
        "counter",
        "Connections (udp: new flows; drop rules: datagrams) decided by each rule of a tcp, udp or message service.",
    );
    for s in &services {
        for h in s.stats.rules.load().iter() {
            w.sample(
                "fulcrum_vs_rule_hits_total",
                &[("vs", &s.name), ("rule", &h.label), ("action", &h.action)],
                h.hits.load(Ordering::Relaxed) as f64,
            );
        }
    }

    let pools = control.pools();
    w.family(
        "fulcrum_pool_members_available",
        "gauge",
        "Members that can take a new client now.",
    );
    for p in &pools {
        w.sample(
            "fulcrum_pool_members_available",
            &[("pool", &p.name)],
            p.available() as f64,
        );
    }
    w.family(
        "fulcrum_pool_no_member_total",
        "counter",
        "Picks that found no available member.",
    );
    for p in &pools {
        w.sample(
            "fulcrum_pool_no_member_total",
            &[("pool", &p.name)],
            p.no_member.load(Ordering::Relaxed) as f64,
        );
    }
    w.family(
        "fulcrum_pool_panic",
        "gauge",
        "1 while the pool is in panic mode: no member up, passively failed members still used.",
    );
    for p in &pools {
        w.sample(
            "fulcrum_pool_panic",
            &[("pool", &p.name)],
            if p.in_panic() { 1.0 } else { 0.0 },
        );
    }
    w.family(
        "fulcrum_pool_panic_picks_total",
        "counter",
        "Picks made in panic mode.",
    );
    for p in &pools {
        w.sample(
            "fulcrum_pool_panic_picks_total",
            &[("pool", &p.name)],
            p.panic_picks.load(Ordering::Relaxed) as f64,
        );
    }

    let elastic: Vec<_> = pools
        .iter()
        .filter_map(|p| p.elastic.as_ref().map(|e| (p, e)))
        .collect();
    if !elastic.is_empty() {
        type ElasticField = fn(&fulcrum_balance::ElasticState) -> f64;
        let families: [(&str, &str, &str, ElasticField); 5] = [
            (
                "fulcrum_pool_utilisation",
                "gauge",
                "Elastic pool utilisation (1 = the members' limits or the response-time target).",
                |e| e.utilisation(),
            ),
            (
                "fulcrum_pool_elastic_joins_total",
                "counter",
                "Standby members that joined an elastic pool.",
                |e| e.joins.load(Ordering::Relaxed) as f64,
            ),
            (
                "fulcrum_pool_elastic_leaves_total",
                "counter",
                "Standby members that left an elastic pool.",
                |e| e.leaves.load(Ordering::Relaxed) as f64,
            ),
            (
                "fulcrum_pool_elastic_hook_runs_total",
                "counter",
                "Elastic hook commands run.",
                |e| e.hook_runs.load(Ordering::Relaxed) as f64,
            ),
            (
                "fulcrum_pool_elastic_hook_failures_total",
                "counter",
                "Elastic hook commands that failed (exit status, timeout, could not start).",
                |e| e.hook_failures.load(Ordering::Relaxed) as f64,
            ),
        ];
        for (name, kind, help, get) in families {
            w.family(name, kind, help);
            for (p, e) in &elastic {
                w.sample(name, &[("pool", &p.name)], get(e));
            }
        }
        w.family(
            "fulcrum_member_standby_joined",
            "gauge",
            "Standby members of elastic pools: 1 while joined.",
        );
        for (p, _) in &elastic {
            for m in p.members().iter().filter(|m| m.is_standby()) {
                w.sample(
                    "fulcrum_member_standby_joined",
                    &[("pool", &p.name), ("member", &m.label)],
                    f64::from(u8::from(m.is_joined())),
                );
            }
        }
    }

    type MemberField = fn(&fulcrum_balance::Member) -> f64;
    let member_families: [(&str, &str, &str, MemberField); 14] = [
        (
            "fulcrum_member_up",
            "gauge",
            "1 when the member's health is up.",
            |m| f64::from(u8::from(m.health.is_up())),
        ),
        (
            "fulcrum_member_weight",
            "gauge",
            "Configured (or API-set) weight.",
            |m| f64::from(m.weight()),
        ),
        (
            "fulcrum_member_effective_weight",
            "gauge",
            "Weight the scheduler uses now (slow start, agent, speed).",
            |m| f64::from(m.effective_weight()) / f64::from(WEIGHT_SCALE),
        ),
        (
            "fulcrum_member_connections_active",
            "gauge",
            "Connections to the member open now.",
            |m| m.stats.active_connections.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_connections_total",
            "counter",
            "Connections made to the member.",
            |m| m.stats.connections_total.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_requests_active",
            "gauge",
            "Requests in flight on the member.",
            |m| m.stats.active_requests.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_requests_total",
            "counter",
            "Requests sent to the member.",
            |m| m.stats.requests_total.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_connections_reused_total",
            "counter",
            "Requests that went over an already open member connection (HTTP reuse).",
            |m| m.stats.connections_reused.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_connections_idle",
            "gauge",
            "Open member connections waiting idle for reuse (HTTP).",
            |m| m.stats.connections_idle.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_connect_failures_total",
            "counter",
            "Failed connection attempts.",
            |m| m.stats.connect_failures.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_bytes_sent_total",
            "counter",
            "Bytes sent to the member.",
            |m| m.stats.bytes_sent.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_bytes_received_total",
            "counter",
            "Bytes received from the member.",
            |m| m.stats.bytes_received.load(Ordering::Relaxed) as f64,
        ),
        (
            "fulcrum_member_response_time_seconds",
            "gauge",
            "Response (L4: connect) time, moving average.",
            |m| m.stats.response_time_us() / 1e6,
        ),
        (
            "fulcrum_member_traffic_bytes_per_second",
            "gauge",
            "Traffic, moving average.",
            |m| m.stats.traffic_bps(),
        ),
    ];
    for (name, kind, help, get) in member_families {
        w.family(name, kind, help);
        for p in &pools {
            for m in p.members() {
                w.sample(name, &[("pool", &p.name), ("member", &m.label)], get(m));
            }
        }
    }
    w.family(
        "fulcrum_member_state",
        "gauge",
        "1 for the member's effective admin state.",
    );
    for p in &pools {
        for m in p.members() {
            let current = m.effective_state();
            for s in fulcrum_config::AdminState::ALL {
                let v = f64::from(u8::from(current.as_str() == *s));
                w.sample(
                    "fulcrum_member_state",
                    &[("pool", &p.name), ("member", &m.label), ("state", s)],
                    v,
                );
            }
        }
    }
    w.family(
        "fulcrum_member_slow_start",
        "gauge",
        "1 while the member is in a slow-start phase.",
    );
    let now = clock::now_ms();
    for p in &pools {
        for m in p.members() {
            let v = f64::from(u8::from(m.slow_start_phase(now) != "none"));
            w.sample(
                "fulcrum_member_slow_start",
                &[("pool", &p.name), ("member", &m.label)],
                v,
            );
        }
    }
    control.extra_metrics(&mut w);
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_label_values() {
        let mut w = MetricsWriter::default();
        w.family("x", "gauge", "h");
        w.sample("x", &[("a", "q\"b\\c\nd")], 1.0);
        assert_eq!(
            w.finish(),
            "# HELP x h\n# TYPE x gauge\nx{a=\"q\\\"b\\\\c\\nd\"} 1\n"
        );
    }
}

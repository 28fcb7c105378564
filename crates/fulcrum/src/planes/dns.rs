//! Assembly of DNS and GSLB: the `[dns]` listeners, zones, IP tables, GSLB sites and names, and
//! the site state exchange, applied with the rest of a configuration; their API and metrics.

use std::sync::atomic::Ordering;

use fulcrum_admin::{ApiRequest, MetricFamilies};
use fulcrum_config::{AdminState, Config, ConfigError};
use fulcrum_dns::iptable::GeoCache;
use fulcrum_dns::DnsRuntime;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::planes::{CommitCx, DataPlane};

/// Config problems only loading the zones and tables shows (bad zone files, prefix files,
/// GeoIP databases), for `fulcrum check` and reloads.
pub fn checks(config: &Config) -> Vec<ConfigError> {
    if !fulcrum_dns::configured(config) && config.ip_tables.is_empty() {
        return Vec::new();
    }
    match fulcrum_dns::compile(config, &mut GeoCache::new()) {
        Ok(_) => Vec::new(),
        Err(e) => e,
    }
}

/// `, 1 dns zones, 2 gslb sites, 1 gslb names` for `fulcrum check` (empty without DNS/GSLB).
pub fn summary(config: &Config) -> String {
    if !fulcrum_dns::configured(config) {
        return String::new();
    }
    format!(
        ", {} dns zones, {} gslb sites, {} gslb names",
        config.dns.as_ref().map_or(0, |d| d.zones.len()),
        config.gslb.sites.len(),
        config.gslb.names.len()
    )
}

/// `fulcrum check`: which ip_tables the address table Fulcrum ships places clients in, and
/// that table's date and sources.
pub fn notes(config: &Config) -> Vec<String> {
    let shipped: Vec<String> = config
        .ip_tables
        .iter()
        .filter(|t| !t.asns.is_empty() || (t.geoip.is_none() && !t.countries.is_empty()))
        .map(|t| format!("{:?}", t.name))
        .collect();
    if shipped.is_empty() {
        return Vec::new();
    }
    let about = fulcrum_ipdata::about();
    vec![format!(
        "note: ip_table {} placed by the address table Fulcrum ships, data of {} ({})",
        shipped.join(", "),
        about.date,
        about.source
    )]
}

/// DNS and GSLB of the running process.
pub struct DnsPlane {
    runtime: DnsRuntime,
    /// The configuration being applied, compiled and bound, not yet serving.
    pending: Mutex<Option<fulcrum_dns::Prepared>>,
}

impl DataPlane for DnsPlane {
    /// Compiles and binds the new addresses; on error nothing running changed.
    fn prepare(&self, config: &Config) -> Result<(), Vec<String>> {
        let mut pending = self.pending.lock();
        *pending = None;
        *pending = Some(self.runtime.prepare(config)?);
        Ok(())
    }

    /// Swaps the prepared configuration in; the pools of GSLB site addresses are health-checked
    /// with the others.
    fn commit(&self, cx: &mut CommitCx) {
        if let Some(p) = self.pending.lock().take() {
            let sites = self.runtime.commit(p, cx.config, cx.pools.to_vec());
            cx.checked_pools.extend(sites);
        }
    }

    fn abort(&self) {
        *self.pending.lock() = None;
    }

    fn shutdown(&self) {
        self.runtime.shutdown();
    }

    fn metrics(&self, w: &mut MetricFamilies) {
        self.write_metrics(w);
    }

    fn api(&self, request: &ApiRequest) -> Option<(u16, Value)> {
        match request.path {
            ["gslb", rest @ ..] => Some(self.gslb_api(request.method, rest, request.body)),
            _ => None,
        }
    }
}

impl DnsPlane {
    pub fn new(sockets_per_address: usize) -> DnsPlane {
        DnsPlane {
            runtime: DnsRuntime::new(sockets_per_address),
            pending: Mutex::new(None),
        }
    }

    /// The address an HTTP service redirects a client to when it cannot serve it: the best site
    /// of GSLB name `fqdn` for `client` other than this instance's own (see `gslb_redirect`).
    pub fn best_other_site(
        &self,
        fqdn: &str,
        client: std::net::IpAddr,
    ) -> Option<fulcrum_dns::RedirectTarget> {
        self.runtime.gslb().best_other_site(fqdn, client)
    }

    /// Inbound link load balancing: whether the link GSLB site `site` is tied to can take it.
    pub fn set_site_link_ok(&self, site: &str, ok: bool) {
        self.runtime.gslb().set_site_link_ok(site, ok);
    }

    /// `/api/v1/gslb/...`.
    fn gslb_api(&self, method: &str, path: &[&str], body: &[u8]) -> (u16, Value) {
        let g = self.runtime.gslb();
        let not_found = || (404, json!({ "error": "no such endpoint" }));
        match (method, path) {
            ("GET", []) => {
                let mut v = g.sites_json(&member_json);
                v["names"] = g.names_json()["names"].take();
                v["peers"] = json!(g.peers());
                (200, v)
            }
            ("GET", ["sites"]) => (200, g.sites_json(&member_json)),
            ("GET", ["sites", site]) => {
                let all = g.sites_json(&member_json);
                match all["sites"]
                    .as_array()
                    .and_then(|s| s.iter().find(|x| x["name"] == *site))
                {
                    Some(s) => (200, s.clone()),
                    None => (
                        404,
                        json!({ "error": format!("no gslb site named {site:?}") }),
                    ),
                }
            }
            ("PUT", ["sites", site, "state"]) => {
                let state = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
                    v.get("state")
                        .and_then(Value::as_str)
                        .and_then(AdminState::parse)
                });
                let Some(state) = state else {
                    return (
                        400,
                        json!({ "error": format!("the body must be {{\"state\": one of {}}}", AdminState::ALL.join(", ")) }),
                    );
                };
                if g.set_site_state(site, state) {
                    self.gslb_api("GET", &["sites", site], &[])
                } else {
                    (
                        404,
                        json!({ "error": format!("no gslb site named {site:?}") }),
                    )
                }
            }
            ("GET", ["names"]) => (200, g.names_json()),
            ("GET", ["names", fqdn]) => {
                let want = if fqdn.ends_with('.') {
                    fqdn.to_string()
                } else {
                    format!("{fqdn}.")
                };
                let all = g.names_json();
                match all["names"].as_array().and_then(|n| {
                    n.iter().find(|x| {
                        x["fqdn"]
                            .as_str()
                            .is_some_and(|f| f.eq_ignore_ascii_case(&want))
                    })
                }) {
                    Some(n) => (200, n.clone()),
                    None => (404, json!({ "error": format!("no gslb name {want:?}") })),
                }
            }
            ("GET", ["peers"]) => (
                200,
                json!({ "peers": g.peers(), "auth_failures": g.auth_failures(), "unauthenticated_refused": g.unauthenticated_refused() }),
            ),
            ("GET", ["table"]) => (200, g.table_json()),
            ("GET", ["proximity"]) => (200, g.proximity_json()),
            (
                _,
                []
                | ["sites"]
                | ["sites", _]
                | ["names"]
                | ["names", _]
                | ["peers"]
                | ["table"]
                | ["proximity"]
                | ["sites", _, "state"],
            ) => (
                405,
                json!({ "error": format!("{method} is not allowed here") }),
            ),
            _ => not_found(),
        }
    }

    /// DNS and GSLB metric families.
    fn write_metrics(&self, w: &mut MetricFamilies) {
        self.dns_metrics(w);
        self.gslb_metrics(w);
    }

    fn dns_metrics(&self, w: &mut MetricFamilies) {
        let reg = self.runtime.registry();
        let engine = self.runtime.engine();
        let mut samples = w.counter(
            "fulcrum_dns_queries_total",
            "DNS queries received, by transport.",
        );
        samples.sample(
            &[("transport", "udp")],
            reg.sum(|c| c.udp_queries.load(Ordering::Relaxed)),
        );
        samples.sample(
            &[("transport", "tcp")],
            reg.sum(|c| c.tcp_queries.load(Ordering::Relaxed)),
        );
        let mut samples = w.counter(
            "fulcrum_dns_responses_total",
            "DNS responses, by response code.",
        );
        for (rc, name) in [
            (0, "NOERROR"),
            (1, "FORMERR"),
            (2, "SERVFAIL"),
            (3, "NXDOMAIN"),
            (4, "NOTIMP"),
            (5, "REFUSED"),
            (16, "BADVERS"),
        ] {
            let v = reg.sum(|c| c.rcodes[rc].load(Ordering::Relaxed));
            samples.sample(&[("rcode", name)], v);
        }
        single_counter(
            w,
            "fulcrum_dns_dropped_total",
            "Packets dropped unanswered: too short or too long to be a query, or a response.",
            reg.sum(|c| c.dropped.load(Ordering::Relaxed)),
        );
        single_counter(
            w,
            "fulcrum_dns_truncated_total",
            "UDP responses sent empty with TC set because they did not fit.",
            reg.sum(|c| c.truncated.load(Ordering::Relaxed)),
        );
        let mut samples = w.counter(
            "fulcrum_dns_rate_limited_total",
            "Responses held back by response rate limiting: dropped, or sent truncated (slip).",
        );
        samples.sample(
            &[("action", "drop")],
            reg.sum(|c| c.rrl_dropped.load(Ordering::Relaxed)),
        );
        samples.sample(
            &[("action", "slip")],
            reg.sum(|c| c.rrl_slipped.load(Ordering::Relaxed)),
        );
        let mut samples = w.gauge(
            "fulcrum_dns_tcp_connections",
            "DNS-over-TCP connections open now.",
        );
        samples.sample(&[], reg.tcp_connections.load(Ordering::Relaxed));
        let mut samples = w.counter(
            "fulcrum_dns_tcp_refused_total",
            "DNS-over-TCP connections closed at accept: 1024 open, or 16 from the same source.",
        );
        samples.sample(&[], reg.tcp_refused.load(Ordering::Relaxed));
        let mut samples = w.gauge("fulcrum_dns_zone_records", "Records loaded, by zone.");
        for z in &engine.catalog.zones {
            samples.sample(&[("zone", &z.origin_text)], z.records);
        }
    }

    fn gslb_metrics(&self, w: &mut MetricFamilies) {
        let st = self.runtime.gslb().state();
        let mut samples = w.counter(
            "fulcrum_gslb_queries_total",
            "Address queries for a GSLB name.",
        );
        for n in &st.names {
            samples.sample(&[("name", &n.text)], n.queries.load(Ordering::Relaxed));
        }
        let mut samples = w.counter(
            "fulcrum_gslb_fallbacks_total",
            "GSLB answers chosen by the fallback algorithm.",
        );
        for n in &st.names {
            samples.sample(&[("name", &n.text)], n.fallbacks.load(Ordering::Relaxed));
        }
        let mut samples = w.counter(
            "fulcrum_gslb_answers_total",
            "GSLB answers, by name, site and client region (\"*\": in no ip_table).",
        );
        for (name, site, region, v) in st.answer_counts() {
            samples.sample(&[("name", &name), ("site", &site), ("region", &region)], v);
        }
        let mut samples = w.gauge(
            "fulcrum_gslb_site_up",
            "1 while one of the site's addresses (its own or learnt) is up.",
        );
        for (i, s) in st.sites.iter().enumerate() {
            samples.sample(&[("site", &s.name)], st.site_up(i));
        }
        let mut samples = w.gauge(
            "fulcrum_gslb_site_addresses_up",
            "Addresses of the site that are up.",
        );
        for s in &st.sites {
            samples.sample(&[("site", &s.name)], s.addresses_up());
        }
        let mut samples = w.gauge(
            "fulcrum_gslb_learnt_addresses",
            "Addresses learnt from virtual services with `gslb` (this instance's and its peers'), by site and health.",
        );
        for (i, s) in st.sites.iter().enumerate() {
            let learnt = st.learnt_of_site(i);
            let up = learnt.iter().filter(|(_, a)| a.up).count();
            samples.sample(&[("site", &s.name), ("health", "up")], up);
            samples.sample(&[("site", &s.name), ("health", "down")], learnt.len() - up);
        }
        let mut samples = w.gauge(
            "fulcrum_gslb_share",
            "Share of answers the distribution table gives a site, by name and client region.",
        );
        let table = st.table.load();
        for (name, regions) in &table.shares {
            for (region, sites) in regions {
                for (site, share) in sites {
                    samples.sample(
                        &[("name", name), ("region", region), ("site", site)],
                        *share,
                    );
                }
            }
        }
        let peers = self.runtime.gslb().peers();
        let mut samples = w.gauge(
            "fulcrum_gslb_peer_connected",
            "1 while this instance's connection to the peer is up.",
        );
        for p in &peers {
            samples.sample(&[("peer", &p.site)], p.connected);
        }
        let mut samples = w.gauge(
            "fulcrum_gslb_peer_stale",
            "1 while the peer's last report is older than stale_after (or none came).",
        );
        for p in &peers {
            samples.sample(&[("peer", &p.site)], p.stale);
        }
        let px = self.runtime.gslb().proximity_json();
        let count = |k: &str| px[k].as_u64().unwrap_or(0);
        let mut samples = w.counter(
            "fulcrum_gslb_proximity_probes_total",
            "Proximity RTT probes: sent (a reply or the timeout came), unreachable (no reply), dropped (queue full: tried again at a later query).",
        );
        for (result, key) in [
            ("sent", "probes_sent"),
            ("unreachable", "probes_unreachable"),
            ("dropped", "probes_dropped"),
        ] {
            samples.sample(&[("result", result)], count(key));
        }
        let mut samples = w.counter(
            "fulcrum_gslb_proximity_answers_total",
            "Answers of proximity names: warm (by measured RTTs), cold (by the fallback while a prefix is not measured everywhere).",
        );
        samples.sample(&[("cache", "warm")], count("warm_answers"));
        samples.sample(&[("cache", "cold")], count("cold_answers"));
        let mut samples = w.gauge(
            "fulcrum_gslb_proximity_prefixes",
            "Resolver prefixes (/24, /48) whose RTT this instance keeps.",
        );
        samples.sample(&[], count("prefixes"));
        single_counter(
            w,
            "fulcrum_gslb_proximity_evictions_total",
            "Prefixes dropped from the RTT cache to stay within max_prefixes.",
            count("evictions"),
        );
        single_counter(
            w,
            "fulcrum_gslb_reports_received_total",
            "Site state reports accepted from peers.",
            self.runtime.gslb().reports_received(),
        );
        single_counter(
            w,
            "fulcrum_gslb_auth_failures_total",
            "Exchange connections refused because a frame failed authentication.",
            self.runtime.gslb().auth_failures(),
        );
        single_counter(
            w,
            "fulcrum_gslb_unauthenticated_refused_total",
            "Exchange connections closed at accept: 16 were already waiting to authenticate.",
            self.runtime.gslb().unauthenticated_refused(),
        );
    }
}

/// A counter family of one unlabelled sample.
fn single_counter(w: &mut MetricFamilies, name: &str, help: &str, value: u64) {
    w.counter(name, help).sample(&[], value);
}

fn member_json(m: &fulcrum_balance::Member) -> Value {
    let s = fulcrum_admin::member_status(m);
    json!({ "state": s.state, "checks": s.checks, "transitions": s.transitions })
}

//! The link plane's assembly: outbound link load balancing (`fulcrum-link`), started on the
//! first configuration that has an `[[outbound]]`.

use std::sync::{Arc, OnceLock};

use fulcrum_admin::ApiRequest;
use fulcrum_config::{Config, ConfigError};

use crate::planes::{BuildCx, DataPlane};

pub struct LinkPlane {
    links: OnceLock<fulcrum_link::Links>,
    /// The configuration whose links run (committed); a configuration `complete` installed
    /// but a later step refused is undone by re-installing this one.
    committed: parking_lot::Mutex<Option<Config>>,
    uncommitted: std::sync::atomic::AtomicBool,
    /// Inbound link load balancing sets GSLB sites tied to a link in or out of the answers.
    dns: Arc<crate::planes::dns::DnsPlane>,
}

/// What `fulcrum check` and a reload refuse before anything is installed: what the config's
/// own text cannot show (an ip_table file), and the parts of the contract this build does not
/// run yet.
pub fn checks(config: &Config) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    let at = |path: &str, message: String| config.locations.error(path, message);
    if let Err(es) = fulcrum_link::build_plan(config) {
        errors.extend(es.into_iter().map(|e| at("outbound", e)));
    }
    errors
}

/// `fulcrum check`'s words for the link plane: ", 1 outbound (3 links)".
pub fn summary(config: &Config) -> String {
    let mut out = String::new();
    let links = |pool: &str| {
        config
            .pool(pool)
            .map_or(0, |p| p.links.len() + p.gateways.len())
    };
    if !config.outbound.is_empty() {
        let n: usize = config.outbound.iter().map(|o| links(&o.pool)).sum();
        out.push_str(&format!(", {} outbound ({n} links)", config.outbound.len()));
    }
    if !config.gateway_services.is_empty() {
        let n: usize = config.gateway_services.iter().map(|g| links(&g.pool)).sum();
        out.push_str(&format!(
            ", {} gateway service ({n} gateways)",
            config.gateway_services.len()
        ));
    }
    out
}

impl LinkPlane {
    pub fn new(dns: Arc<crate::planes::dns::DnsPlane>) -> LinkPlane {
        LinkPlane {
            links: OnceLock::new(),
            committed: parking_lot::Mutex::new(None),
            uncommitted: std::sync::atomic::AtomicBool::new(false),
            dns,
        }
    }

    /// Installs or replaces the outbound link balancing of `config` (nothing when it has no
    /// `[[outbound]]` and none ran before).
    pub fn apply(&self, config: &Config) -> Result<(), Vec<String>> {
        if config.outbound.is_empty()
            && config.gateway_services.is_empty()
            && self.links.get().is_none()
        {
            return Ok(());
        }
        self.links
            .get_or_init(fulcrum_link::Links::start)
            .apply(config)
    }

    /// Removes what the link plane installed.
    pub async fn shutdown(&self) {
        if let Some(l) = self.links.get() {
            l.shutdown().await;
        }
    }

    /// Inbound link load balancing: GSLB sites tied to a link (`gslb.site.link`) drop out of
    /// the answers while the link is down, disabled or busy.
    pub fn sync_gslb(&self, config: &Config, dns: &crate::planes::dns::DnsPlane) {
        let Some(links) = self.links.get() else {
            return;
        };
        for site in &config.gslb.sites {
            if let Some(link) = &site.link {
                let ok = links.link_available(link).unwrap_or(true);
                dns.set_site_link_ok(&site.name, ok);
            }
        }
    }

    /// `GET /api/v1/links`.
    pub fn api(&self) -> serde_json::Value {
        match self.links.get() {
            Some(l) => l.view(),
            None => serde_json::json!({ "links": [] }),
        }
    }

    pub fn metrics(&self, out: &mut fulcrum_admin::MetricFamilies) {
        let Some(l) = self.links.get() else { return };
        let view = l.view();
        let Some(links) = view["links"].as_array().filter(|l| !l.is_empty()) else {
            return;
        };
        // Links carry their outbound's name, gateways their gateway service's.
        let label = |l: &serde_json::Value, k: &str| {
            let v = if k == "outbound" && l[k].is_null() {
                &l["gateway_service"]
            } else {
                &l[k]
            };
            v.as_str().unwrap_or("").to_string()
        };
        let mut samples = out.gauge(
            "fulcrum_link_up",
            "Whether the link's monitors pass (1) or not (0).",
        );
        for l in links {
            let (o, n) = (label(l, "outbound"), label(l, "name"));
            let up = l["health"] == "up";
            samples.sample(&[("outbound", &o), ("link", &n)], up);
        }
        let mut samples = out.gauge(
            "fulcrum_link_rate_bits_per_second",
            "Link rate measured on the interface counters.",
        );
        for l in links {
            let (o, n) = (label(l, "outbound"), label(l, "name"));
            for (dir, key) in [("up", "rate_up_bps"), ("down", "rate_down_bps")] {
                let v = l[key].as_f64().unwrap_or(0.0);
                samples.sample(&[("outbound", &o), ("link", &n), ("direction", dir)], v);
            }
        }
        let mut samples = out.counter("fulcrum_link_flows_total", "New flows placed on the link.");
        for l in links {
            let (o, n) = (label(l, "outbound"), label(l, "name"));
            let v = l["flows_total"].as_f64().unwrap_or(0.0);
            samples.sample(&[("outbound", &o), ("link", &n)], v);
        }
        let mut samples = out.gauge(
            "fulcrum_link_slots",
            "Slots of the flow table the link owns (its share of new flows).",
        );
        for l in links {
            let (o, n) = (label(l, "outbound"), label(l, "name"));
            let v = l["slots"].as_f64().unwrap_or(0.0);
            samples.sample(&[("outbound", &o), ("link", &n)], v);
        }
        let mut samples = out.gauge(
            "fulcrum_link_family",
            "1 for each address family the link has a next hop of (its flows of that family can take it).",
        );
        for l in links {
            let (o, n) = (label(l, "outbound"), label(l, "name"));
            for (family, key) in [("ipv4", "gateway"), ("ipv6", "gateway6")] {
                if !l[key].is_null() {
                    samples.sample(&[("outbound", &o), ("link", &n), ("family", family)], true);
                }
            }
        }
        if let Some(proxies) = view["dns_proxies"].as_array().filter(|p| !p.is_empty()) {
            let mut samples = out.counter(
                "fulcrum_link_dns_proxy_refused_total",
                "DNS queries to the transparent DNS proxy from outside its LAN, dropped.",
            );
            for p in proxies {
                let o = p["outbound"].as_str().unwrap_or("");
                let v = p["refused"].as_f64().unwrap_or(0.0);
                samples.sample(&[("outbound", o)], v);
            }
        }
    }
}

/// Links serve no virtual service: the plane programs the kernel for `[[outbound]]` and
/// `[[gateway_service]]` once the rest of a configuration is built (a refused apply restores
/// what ran), follows link state for GSLB every refresh, and answers `GET /api/v1/links`.
/// Its async shutdown (removing what it installed) is called by `App`.
impl DataPlane for LinkPlane {
    fn complete(&self, cx: &BuildCx) -> Result<(), Vec<String>> {
        self.apply(cx.config)?;
        self.uncommitted
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    fn commit(&self, cx: &mut crate::planes::CommitCx) {
        self.uncommitted
            .store(false, std::sync::atomic::Ordering::Release);
        let links = !cx.config.outbound.is_empty() || !cx.config.gateway_services.is_empty();
        *self.committed.lock() = links.then(|| cx.config.clone());
    }

    /// A step after this plane's refused the configuration: the links that ran come back.
    fn abort(&self) {
        if !self
            .uncommitted
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let previous = self.committed.lock().clone().unwrap_or_default();
        if let Err(e) = self.apply(&previous) {
            tracing::error!(errors = %e.join("; "), "link plane: cannot restore the links of the running configuration");
        }
    }

    fn refresh(&self, config: &Config) {
        self.sync_gslb(config, &self.dns);
    }

    fn metrics(&self, out: &mut fulcrum_admin::MetricFamilies) {
        LinkPlane::metrics(self, out);
    }

    fn api(&self, request: &ApiRequest) -> Option<(u16, serde_json::Value)> {
        match (request.method, request.path) {
            ("GET", ["links"]) => Some((200, LinkPlane::api(self))),
            _ => None,
        }
    }
}

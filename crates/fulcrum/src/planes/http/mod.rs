//! Assembly of `protocol = "http"` virtual services (the L7 data plane, `fulcrum-http`): the
//! shared member connection stores, the per-service HTTP counters kept across reloads, and the
//! HTTP metric families. `tls` is the https side, `compression` the compression families.

pub mod compression;
pub mod filters;
pub mod tls;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_admin::{ApiRequest, CounterFamily, MetricFamilies};
use fulcrum_config::{Config, PersistenceKind, VirtualService};
use fulcrum_dns::RedirectTarget;
use fulcrum_http::{
    HttpCache, HttpService, HttpStats, NoMemberHook, Parts, RequestInfo, Upstreams,
};
use fulcrum_net::StreamHandler;
use parking_lot::Mutex;

use crate::planes::{BuildCx, CommitCx, DataPlane};

/// What the HTTP data plane keeps across reloads.
pub struct HttpPlane {
    upstreams: Arc<Upstreams>,
    stats: Mutex<HashMap<String, Arc<HttpStats>>>,
    services: Mutex<Vec<Arc<HttpService>>>,
    /// TLS state of every service with TLS, shared with the tcp and message planes.
    tls: Arc<crate::planes::http::tls::TlsAssembly>,
    /// Caches of the services with a `cache` table, by service name.
    caches: Mutex<HashMap<String, Arc<HttpCache>>>,
    /// The services of the configuration being applied.
    pending: Mutex<HttpBuild>,
    /// For the GSLB redirect fallback (`gslb_redirect`).
    dns: Arc<crate::planes::dns::DnsPlane>,
}

/// The http services of a configuration being applied.
#[derive(Default)]
struct HttpBuild {
    stats: HashMap<String, Arc<HttpStats>>,
    services: Vec<Arc<HttpService>>,
    caches: HashMap<String, Arc<HttpCache>>,
}

impl HttpPlane {
    /// Every service's HTTP counters, by service name.
    fn sorted_stats(&self) -> Vec<(String, Arc<HttpStats>)> {
        let mut v: Vec<_> = self
            .stats
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// `/api/v1/http/responses`: responses sent to clients per http(s) service by status class
    /// (the counters behind `fulcrum_http_responses_total`); `/api/v1/status` merges them into
    /// its entries as `responses`.
    fn responses(&self) -> serde_json::Value {
        let services: serde_json::Map<String, serde_json::Value> = self
            .stats
            .lock()
            .iter()
            .map(|(name, s)| {
                let classes: serde_json::Map<String, serde_json::Value> =
                    ["1xx", "2xx", "3xx", "4xx", "5xx"]
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            (
                                c.to_string(),
                                s.responses[i + 1].load(Ordering::Relaxed).into(),
                            )
                        })
                        .collect();
                (name.clone(), classes.into())
            })
            .collect();
        serde_json::json!({ "services": services })
    }

    /// Needs a tokio runtime (the idle-connection sweeper starts here).
    pub fn new(
        dns: Arc<crate::planes::dns::DnsPlane>,
        tls: Arc<crate::planes::http::tls::TlsAssembly>,
    ) -> HttpPlane {
        HttpPlane {
            upstreams: Upstreams::new(),
            stats: Mutex::new(HashMap::new()),
            services: Mutex::new(Vec::new()),
            tls,
            caches: Mutex::new(HashMap::new()),
            pending: Mutex::default(),
            dns,
        }
    }
}

impl DataPlane for HttpPlane {
    fn prepare(&self, _config: &Config) -> Result<(), Vec<String>> {
        *self.pending.lock() = HttpBuild::default();
        Ok(())
    }

    fn serves(&self, vs: &VirtualService) -> bool {
        vs.as_http().is_some()
    }

    /// Builds the handler of an http or https virtual service.
    fn build(
        &self,
        vs: &VirtualService,
        cx: &mut BuildCx,
    ) -> Result<Option<Arc<dyn StreamHandler>>, String> {
        let config = cx.config;
        let section = vs
            .as_http()
            .ok_or_else(|| format!("virtual service {:?} is not http", vs.name))?;
        let table = cx
            .table(
                vs,
                &[
                    PersistenceKind::SourceIp,
                    PersistenceKind::CookiePassive,
                    PersistenceKind::Header,
                ],
            )
            .map(|(table, _)| table);
        let stats = cx.stats(vs);
        let mut build = self.pending.lock();
        let cache = section.cache.as_ref().map(|c| {
            let cache = match self.caches.lock().get(&vs.name) {
                Some(old) => old.with_config(c.size, c.max_object),
                None => HttpCache::new(c.size, c.max_object),
            };
            build.caches.insert(vs.name.clone(), cache.clone());
            cache
        });
        let hs = self.stats.lock().get(&vs.name).cloned().unwrap_or_default();
        build.stats.insert(vs.name.clone(), hs.clone());
        let mut svc = HttpService::build(
            vs,
            Parts {
                config,
                pools: cx.pools,
                upstreams: &self.upstreams,
                table,
                stats,
                http_stats: hs,
                tracker: cx.tracker.clone(),
                no_member_hook: section.gslb_redirect.as_ref().map(|r| {
                    Arc::new(GslbRedirect {
                        dns: self.dns.clone(),
                        fqdn: r.name.clone(),
                    }) as Arc<dyn NoMemberHook>
                }),
                cache,
                snat: cx.snat(vs)?,
                transparent: cx.transparent(vs),
            },
        )
        .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?;
        if section.tls.is_some() {
            svc.tls = cx.stream_tls(vs)?;
        }
        if let Some(previous) = self.services.lock().iter().find(|s| *s.name == *vs.name) {
            svc.follows(previous);
        }
        let svc = Arc::new(svc);
        build.services.push(svc.clone());
        Ok(Some(svc))
    }

    /// Keeps the counters of the services that run now, drops the idle connections of members
    /// that left, and retires the services of the previous configuration: their client
    /// connections serve their next requests with the new version, and announce their close
    /// (`Connection: close`, GOAWAY) only when the service's own configuration changed; those of
    /// a service that left close when idle. (The TLS state of services that left is dropped by
    /// `App` for every plane.)
    fn commit(&self, cx: &mut CommitCx) {
        let build = std::mem::take(&mut *self.pending.lock());
        *self.stats.lock() = build.stats;
        *self.caches.lock() = build.caches;
        self.upstreams.retain(cx.pools);
        for s in &build.services {
            s.take_over();
        }
        let old = std::mem::replace(&mut *self.services.lock(), build.services);
        for s in old {
            s.retire();
        }
    }

    fn abort(&self) {
        *self.pending.lock() = HttpBuild::default();
    }

    /// At shutdown: idle keep-alive connections close now, busy ones after their response.
    fn shutdown(&self) {
        for s in self.services.lock().iter() {
            s.retire();
        }
    }

    fn metrics(&self, w: &mut MetricFamilies) {
        self.write_metrics(w);
    }

    fn api(&self, request: &ApiRequest) -> Option<(u16, serde_json::Value)> {
        match request.path {
            ["cache", service] => Some(self.cache_api(request.method, service, request.query)),
            ["http", "responses"] if request.method == "GET" => Some((200, self.responses())),
            ["http", "filters"] if request.method == "GET" => {
                Some((200, filters::api(&self.sorted_stats())))
            }
            _ => None,
        }
    }
}

impl HttpPlane {
    /// `/api/v1/cache/{service}`: GET shows usage and counters; DELETE purges `url` (every
    /// variant, on `host` or every host) or everything under `prefix`, or the whole cache.
    fn cache_api(
        &self,
        method: &str,
        service: &str,
        query: &[(String, String)],
    ) -> (u16, serde_json::Value) {
        let Some(cache) = self.caches.lock().get(service).cloned() else {
            return (
                404,
                serde_json::json!({ "error": format!("no http service {service:?} with a cache") }),
            );
        };
        let param = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        match method {
            // `?counters`: the counters only, without walking the cache for its usage (the
            // console samples this every second).
            "GET" if param("counters").is_some() => {
                let s = &cache.stats;
                (
                    200,
                    serde_json::json!({
                        "service": service,
                        "hits": s.hits.load(Ordering::Relaxed),
                        "misses": s.misses.load(Ordering::Relaxed),
                    }),
                )
            }
            "GET" => {
                let (urls, variants, bytes) = cache.usage();
                let s = &cache.stats;
                (
                    200,
                    serde_json::json!({
                        "service": service,
                        "urls": urls,
                        "entries": variants,
                        "bytes": bytes,
                        "hits": s.hits.load(Ordering::Relaxed),
                        "misses": s.misses.load(Ordering::Relaxed),
                        "stale": s.stale.load(Ordering::Relaxed),
                        "revalidated": s.revalidated.load(Ordering::Relaxed),
                        "stored": s.stored.load(Ordering::Relaxed),
                        "evicted": s.evicted.load(Ordering::Relaxed),
                        "abandoned": s.abandoned.load(Ordering::Relaxed),
                        "filling": cache.filling(),
                    }),
                )
            }
            "DELETE" => {
                // `url` may be absolute (`http://host/path`): its host is used then.
                let (url_host, url) = match param("url") {
                    Some(u) => match u.split_once("://") {
                        Some((_, rest)) => {
                            let i = rest.find('/').unwrap_or(rest.len());
                            let host = &rest[..i];
                            let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
                            let path = if i == rest.len() { "/" } else { &rest[i..] };
                            (Some(host.to_ascii_lowercase()), Some(path.to_string()))
                        }
                        None => (None, Some(u.to_string())),
                    },
                    None => (None, None),
                };
                let host = param("host")
                    .map(|h| {
                        h.rsplit_once(':')
                            .map_or(h, |(h, _)| h)
                            .to_ascii_lowercase()
                    })
                    .or(url_host);
                let prefix = param("prefix").map(str::to_string);
                if url.is_some() && prefix.is_some() {
                    return (
                        400,
                        serde_json::json!({ "error": "give url or prefix, not both" }),
                    );
                }
                let purged = cache.purge(|h, target| {
                    host.as_deref().is_none_or(|want| want == h)
                        && match (&url, &prefix) {
                            (Some(u), _) => target == u,
                            (None, Some(p)) => target.starts_with(p.as_str()),
                            (None, None) => true,
                        }
                });
                tracing::info!(service, purged, url = ?url, prefix = ?prefix, host = ?host, "cache purge");
                (200, serde_json::json!({ "purged": purged }))
            }
            _ => (405, serde_json::json!({ "error": "use GET or DELETE" })),
        }
    }

    /// The `fulcrum_http_cache_*` metric families.
    fn cache_metrics(&self, w: &mut MetricFamilies) {
        let mut caches: Vec<(String, Arc<HttpCache>)> = self
            .caches
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if caches.is_empty() {
            return;
        }
        caches.sort_by(|a, b| a.0.cmp(&b.0));
        let families: [CounterFamily<fulcrum_http::cache::CacheStats>; 7] = [
            (
                "fulcrum_http_cache_hits_total",
                "Requests answered from the cache with a fresh stored response.",
                |s| s.hits.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_cache_misses_total",
                "Requests the cache had no stored response for (sent to a member).",
                |s| s.misses.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_cache_stale_total",
                "Stale stored responses served (max-stale, stale-if-error).",
                |s| s.stale.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_cache_revalidated_total",
                "Stored responses validated by a member (304) and served.",
                |s| s.revalidated.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_cache_stored_total",
                "Responses stored.",
                |s| s.stored.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_cache_evicted_total",
                "Stored URLs evicted to stay within size.",
                |s| s.evicted.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_cache_abandoned_total",
                "Responses not stored after all: larger than max_object, or no room among the fills in progress (together at most size).",
                |s| s.abandoned.load(Ordering::Relaxed),
            ),
        ];
        w.counters_per_vs(
            &families,
            caches.iter().map(|(name, c)| (name.as_str(), &*c.stats)),
        );
        let usage: Vec<(u64, u64, u64)> = caches.iter().map(|(_, c)| c.usage()).collect();
        let mut samples = w.gauge(
            "fulcrum_http_cache_entries",
            "Stored responses (Vary variants counted apart).",
        );
        for ((name, _), u) in caches.iter().zip(&usage) {
            samples.sample(&[("vs", name)], u.1);
        }
        let mut samples = w.gauge(
            "fulcrum_http_cache_bytes",
            "Bytes the stored responses account for against size.",
        );
        for ((name, _), u) in caches.iter().zip(&usage) {
            samples.sample(&[("vs", name)], u.2);
        }
    }

    /// The `fulcrum_http_*` metric families.
    fn write_metrics(&self, w: &mut MetricFamilies) {
        self.cache_metrics(w);
        let stats = self.sorted_stats();
        self.tls.metrics(w);
        if stats.is_empty() {
            return;
        }
        let mut samples = w.counter(
            "fulcrum_http_responses_total",
            "Responses sent to clients of http services, by status class.",
        );
        for (name, s) in &stats {
            for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
                samples.sample(
                    &[("vs", name), ("code", class)],
                    s.responses[i + 1].load(Ordering::Relaxed),
                );
            }
        }
        let families: [CounterFamily<HttpStats>; 10] = [
            (
                "fulcrum_http_bad_requests_total",
                "Requests refused as malformed or ambiguous (400, 414, 431, 505), connection closed.",
                |s| s.bad_requests.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_header_timeouts_total",
                "Clients that did not complete a request head within header_timeout.",
                |s| s.header_timeouts.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_retries_total",
                "Requests sent again to another member after a connect failure or a reset.",
                |s| s.retries.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_response_timeouts_total",
                "Requests answered 504: the member did not answer within response_timeout (or request_timeout passed).",
                |s| s.response_timeouts.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_dropped_total",
                "Requests closed without an answer by a drop rule.",
                |s| s.dropped.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_slow_bodies_total",
                "Request bodies slower than min_body_rate (408, connection closed).",
                |s| s.slow_bodies.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_bodies_too_large_total",
                "Request bodies larger than max_body_size (413, connection closed).",
                |s| s.bodies_too_large.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_h2_reset_floods_total",
                "HTTP/2 connections closed for resetting more streams than their budget (rapid reset).",
                |s| s.h2_reset_floods.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_h2_stalled_total",
                "HTTP/2 connections closed: no preface within header_timeout, or no drain after GOAWAY.",
                |s| s.h2_stalled.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_http_h2_stalled_streams_total",
                "HTTP/2 response bodies dropped with their member connection for making no progress within idle_timeout (a client holding its window at zero).",
                |s| s.h2_stalled_streams.load(Ordering::Relaxed),
            ),
        ];
        w.counters_per_vs(
            &families,
            stats.iter().map(|(name, s)| (name.as_str(), &**s)),
        );
        crate::planes::http::compression::metrics(w, &stats);
        crate::planes::http::filters::metrics(w, &stats);
    }
}

/// GSLB's HTTP redirect fallback (`gslb_redirect`): a client this site cannot serve (no member
/// available, or the service over `gslb_redirect_threshold`) is sent to the best other site of
/// the GSLB name for that client, as the DNS would answer it without this site.
struct GslbRedirect {
    dns: Arc<crate::planes::dns::DnsPlane>,
    fqdn: String,
}

impl NoMemberHook for GslbRedirect {
    fn redirect(&self, service: &str, _pool: &str, req: &RequestInfo<'_>) -> Option<String> {
        let site = self.dns.best_other_site(&self.fqdn, req.client)?;
        tracing::debug!(service, client = %req.client, ?site, "redirected to another GSLB site");
        Some(redirect_location(req, &site))
    }
}

/// `scheme://authority/path?query`: the same request at another site. The authority is the
/// site's `redirect_host` (so the name the client's certificate check and the site's virtual
/// hosts need is kept), else its address. Without a port in `redirect_host`, the port the client
/// connected to is kept (left out when it is the scheme's default). The path and query were
/// checked by the request parser; bytes outside visible ASCII are percent-encoded anyway,
/// because this text becomes a header value.
fn redirect_location(req: &RequestInfo<'_>, site: &RedirectTarget) -> String {
    use std::fmt::Write;
    let mut out = format!("{}://", req.scheme);
    let mut explicit_port = false;
    match site {
        RedirectTarget::Host(h) => {
            // Checked by the config reader: a host name, optionally `:port`.
            explicit_port = h.contains(':');
            out.push_str(h);
        }
        RedirectTarget::Address(std::net::IpAddr::V4(a)) => {
            let _ = write!(out, "{a}");
        }
        RedirectTarget::Address(std::net::IpAddr::V6(a)) => {
            let _ = write!(out, "[{a}]");
        }
    }
    let default_port = if req.scheme == "https" { 443 } else { 80 };
    if !explicit_port && req.local_port != default_port {
        let _ = write!(out, ":{}", req.local_port);
    }
    let push = |out: &mut String, bytes: &[u8]| {
        for &b in bytes {
            if b.is_ascii_graphic() {
                out.push(b as char);
            } else {
                let _ = write!(out, "%{b:02X}");
            }
        }
    };
    if req.path.is_empty() {
        out.push('/');
    }
    push(&mut out, req.path);
    if let Some(q) = req.query {
        out.push('?');
        push(&mut out, q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info<'a>(
        scheme: &'static str,
        path: &'a [u8],
        query: Option<&'a [u8]>,
        port: u16,
    ) -> RequestInfo<'a> {
        RequestInfo {
            scheme,
            host: Some(b"app.example.com"),
            path,
            query,
            client: "192.0.2.1".parse().unwrap(),
            local_port: port,
        }
    }

    #[test]
    fn redirect_keeps_path_query_and_a_non_default_port() {
        let v4 = RedirectTarget::Address("198.51.100.7".parse().unwrap());
        let v6 = RedirectTarget::Address("2001:db8::7".parse().unwrap());
        let v4 = &v4;
        let v6 = &v6;
        let host = &RedirectTarget::Host("eu.app.example.com".into());
        let host_port = &RedirectTarget::Host("eu.app.example.com:8443".into());
        assert_eq!(
            redirect_location(&info("https", b"/a", Some(b"q=2"), 443), host),
            "https://eu.app.example.com/a?q=2"
        );
        assert_eq!(
            redirect_location(&info("http", b"/a", None, 8080), host),
            "http://eu.app.example.com:8080/a"
        );
        assert_eq!(
            redirect_location(&info("https", b"/a", None, 9443), host_port),
            "https://eu.app.example.com:8443/a"
        );
        assert_eq!(
            redirect_location(&info("http", b"/a/b", Some(b"x=1"), 80), v4),
            "http://198.51.100.7/a/b?x=1"
        );
        assert_eq!(
            redirect_location(&info("http", b"/", None, 8080), v6),
            "http://[2001:db8::7]:8080/"
        );
        assert_eq!(
            redirect_location(&info("https", b"/\xff", None, 443), v4),
            "https://198.51.100.7/%FF"
        );
    }
}

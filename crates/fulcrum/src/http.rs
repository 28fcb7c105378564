//! Assembly of `protocol = "http"` virtual services (the L7 data plane, `fulcrum-http`): the
//! shared member connection stores, the per-service HTTP counters kept across reloads, and the
//! HTTP metric families.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_admin::MetricsWriter;
use fulcrum_balance::{PersistTable, Pool, TableSpec};
use fulcrum_config::{Config, PersistenceKind, VirtualService};
use fulcrum_http::{
    HttpCache, HttpService, HttpStats, NoMemberHook, Parts, RequestInfo, Upstreams,
};
use fulcrum_proxy::{ServiceStats, StreamHandler, Tracker};
use parking_lot::Mutex;

/// What the HTTP data plane keeps across reloads.
pub struct HttpAssembly {
    upstreams: Arc<Upstreams>,
    stats: Mutex<HashMap<String, Arc<HttpStats>>>,
    services: Mutex<Vec<Arc<HttpService>>>,
    tls: crate::https::TlsAssembly,
    /// Caches of the services with a `cache` table, by service name.
    caches: Mutex<HashMap<String, Arc<HttpCache>>>,
}

/// The http services of a configuration being applied.
#[derive(Default)]
pub struct HttpBuild {
    stats: HashMap<String, Arc<HttpStats>>,
    services: Vec<Arc<HttpService>>,
    caches: HashMap<String, Arc<HttpCache>>,
}

impl HttpAssembly {
    /// Needs a tokio runtime (the idle-connection sweeper starts here).
    pub fn new() -> HttpAssembly {
        HttpAssembly {
            upstreams: Upstreams::new(),
            stats: Mutex::new(HashMap::new()),
            services: Mutex::new(Vec::new()),
            tls: crate::https::TlsAssembly::default(),
            caches: Mutex::new(HashMap::new()),
        }
    }

    /// Builds the handler of an http virtual service. `old_tables` are the persistence tables of
    /// the running configuration, `tables` those of the one being built (by service name).
    #[allow(clippy::too_many_arguments)]
    pub fn service(
        &self,
        vs: &VirtualService,
        config: &Config,
        pools: &[Arc<Pool>],
        stats: Arc<ServiceStats>,
        old_tables: &HashMap<String, Arc<PersistTable>>,
        tables: &mut HashMap<String, Arc<PersistTable>>,
        tracker: &Arc<Tracker>,
        dns: &Arc<crate::dns::Dns>,
        build: &mut HttpBuild,
    ) -> Result<Arc<dyn StreamHandler>, String> {
        let profile = vs.persistence.as_ref().and_then(|n| config.persistence(n));
        let table = profile
            .filter(|p| {
                matches!(
                    p.kind,
                    PersistenceKind::SourceIp
                        | PersistenceKind::CookiePassive
                        | PersistenceKind::Header
                )
            })
            .map(|p| {
                let spec = TableSpec {
                    idle_timeout: p.table_timeout(),
                    max_entries: p.max_entries,
                };
                let table = match tables.get(&vs.name).or_else(|| old_tables.get(&vs.name)) {
                    Some(t) => t.respec(spec),
                    None => Arc::new(PersistTable::new(spec)),
                };
                tables.insert(vs.name.clone(), table.clone());
                table
            });
        let cache = vs.cache.as_ref().map(|c| {
            let cache = match self.caches.lock().get(&vs.name) {
                Some(old) => old.with_config(c.size, c.max_object),
                None => HttpCache::new(c.size, c.max_object),
            };
            build.caches.insert(vs.name.clone(), cache.clone());
            cache
        });
        let hs = self.stats.lock().get(&vs.name).cloned().unwrap_or_default();
        build.stats.insert(vs.name.clone(), hs.clone());
        let svc = HttpService::build(
            vs,
            Parts {
                config,
                pools,
                upstreams: &self.upstreams,
                table,
                stats,
                http_stats: hs,
                tracker: tracker.clone(),
                no_member_hook: vs.gslb_redirect.as_ref().map(|fqdn| {
                    Arc::new(GslbRedirect {
                        dns: dns.clone(),
                        fqdn: fqdn.clone(),
                    }) as Arc<dyn NoMemberHook>
                }),
                cache,
            },
        )
        .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?;
        let mut svc = svc;
        if vs.protocol == fulcrum_config::Protocol::Https {
            svc.tls = Some(
                self.tls
                    .server(vs, config)
                    .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?,
            );
        }
        let svc = Arc::new(svc);
        build.services.push(svc.clone());
        Ok(svc)
    }

    /// After a successful apply: keeps the counters of the services that run now, drops the
    /// idle connections of members that left, and retires the services of the previous
    /// configuration (their keep-alive connections close after the request in progress, so
    /// clients reconnect to the new one).
    pub fn commit(&self, pools: &[Arc<Pool>], build: HttpBuild) {
        self.tls.retain(&|name| build.stats.contains_key(name));
        *self.stats.lock() = build.stats;
        *self.caches.lock() = build.caches;
        self.upstreams.retain(pools);
        let old = std::mem::replace(&mut *self.services.lock(), build.services);
        for s in old {
            s.retire();
        }
    }

    /// At shutdown: idle keep-alive connections close now, busy ones after their response.
    pub fn retire_all(&self) {
        for s in self.services.lock().iter() {
            s.retire();
        }
    }

    /// `/api/v1/cache/{service}`: GET shows usage and counters; DELETE purges `url` (every
    /// variant, on `host` or every host) or everything under `prefix`, or the whole cache.
    pub fn cache_api(
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
    fn cache_metrics(&self, w: &mut MetricsWriter) {
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
        type Field = fn(&fulcrum_http::cache::CacheStats) -> u64;
        let families: [(&str, &str, Field); 6] = [
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
        ];
        for (family, help, get) in families {
            w.family(family, "counter", help);
            for (name, c) in &caches {
                w.sample(family, &[("vs", name)], get(&c.stats) as f64);
            }
        }
        let usage: Vec<(u64, u64, u64)> = caches.iter().map(|(_, c)| c.usage()).collect();
        w.family(
            "fulcrum_http_cache_entries",
            "gauge",
            "Stored responses (Vary variants counted apart).",
        );
        for ((name, _), u) in caches.iter().zip(&usage) {
            w.sample("fulcrum_http_cache_entries", &[("vs", name)], u.1 as f64);
        }
        w.family(
            "fulcrum_http_cache_bytes",
            "gauge",
            "Bytes the stored responses account for against size.",
        );
        for ((name, _), u) in caches.iter().zip(&usage) {
            w.sample("fulcrum_http_cache_bytes", &[("vs", name)], u.2 as f64);
        }
    }

    /// The `fulcrum_http_*` metric families.
    pub fn metrics(&self, w: &mut MetricsWriter) {
        self.cache_metrics(w);
        let stats: Vec<(String, Arc<HttpStats>)> = {
            let mut v: Vec<_> = self
                .stats
                .lock()
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        self.tls.metrics(w);
        if stats.is_empty() {
            return;
        }
        w.family(
            "fulcrum_http_responses_total",
            "counter",
            "Responses sent to clients of http services, by status class.",
        );
        for (name, s) in &stats {
            for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
                w.sample(
                    "fulcrum_http_responses_total",
                    &[("vs", name), ("code", class)],
                    s.responses[i + 1].load(Ordering::Relaxed) as f64,
                );
            }
        }
        type Field = fn(&HttpStats) -> u64;
        let families: [(&str, &str, Field); 5] = [
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
        ];
        for (family, help, get) in families {
            w.family(family, "counter", help);
            for (name, s) in &stats {
                w.sample(family, &[("vs", name)], get(s) as f64);
            }
        }
        crate::compression::metrics(w, &stats);
    }
}

/// GSLB's HTTP redirect fallback (`gslb_redirect`): a client this site cannot serve (no member
/// available, or the service over `gslb_redirect_threshold`) is sent to the best other site of
/// the GSLB name for that client, as the DNS would answer it without this site.
struct GslbRedirect {
    dns: Arc<crate::dns::Dns>,
    fqdn: String,
}

impl NoMemberHook for GslbRedirect {
    fn redirect(&self, service: &str, _pool: &str, req: &RequestInfo<'_>) -> Option<String> {
        let site = self.dns.best_other_site(&self.fqdn, req.client)?;
        tracing::debug!(service, client = %req.client, %site, "redirected to another GSLB site");
        Some(redirect_location(req, site))
    }
}

/// `scheme://address[:port]/path?query`: the same request at another site's address. The port
/// the client connected to is kept (left out when it is the scheme's default). The path and
/// query were checked by the request parser; bytes outside visible ASCII are percent-encoded
/// anyway, because this text becomes a header value.
fn redirect_location(req: &RequestInfo<'_>, site: std::net::IpAddr) -> String {
    use std::fmt::Write;
    let mut out = format!("{}://", req.scheme);
    match site {
        std::net::IpAddr::V4(a) => {
            let _ = write!(out, "{a}");
        }
        std::net::IpAddr::V6(a) => {
            let _ = write!(out, "[{a}]");
        }
    }
    let default_port = if req.scheme == "https" { 443 } else { 80 };
    if req.local_port != default_port {
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
        let v4 = "198.51.100.7".parse().unwrap();
        let v6 = "2001:db8::7".parse().unwrap();
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

//! An `http` virtual service as compiled from the configuration: its targets (pools with their
//! member connection stores), rules, persistence, limits and counters, and what it decides for
//! each request before anything is forwarded.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fulcrum_balance::hash::{hash_bytes, hash_ip, hash_socket_addr};
use fulcrum_balance::{PersistTable, Pool};
use fulcrum_config::{ForwardHeaders, HashKey, ProxyProtocol, Reuse, VirtualService};
use fulcrum_health::StatusObserver;
use fulcrum_net::{ServiceStats, Tracker};

use crate::access_log::AccessLog;
use crate::head::{Limits, RequestHead};
use crate::rules::{Action, CompiledRule, RuleSet};
use crate::sticky::Sticky;
use crate::upstream::{MemberConns, Upstreams};

pub use crate::client::{Alpn, Client, ConnInfo};
pub use crate::local::Local;

/// Consulted when a request finds no available member in its pool, before answering 503.
///
/// This is the hook for GSLB's HTTP redirect fallback (the site's own pool is empty: send the
/// client to the best other site). The data plane calls it with the request; a returned location
/// is answered with `302 Found`, `None` with `503` and `Retry-After`.
pub trait NoMemberHook: Send + Sync + 'static {
    fn redirect(&self, service: &str, pool: &str, request: &RequestInfo<'_>) -> Option<String>;
}

/// What a `NoMemberHook` sees of a request.
#[derive(Debug)]
pub struct RequestInfo<'a> {
    pub scheme: &'static str,
    /// Host without port, as the client sent it.
    pub host: Option<&'a [u8]>,
    pub path: &'a [u8],
    pub query: Option<&'a [u8]>,
    pub client: IpAddr,
    /// The port the client connected to.
    pub local_port: u16,
}

/// HTTP counters of a virtual service, kept across reloads by service name.
#[derive(Debug, Default)]
pub struct HttpStats {
    /// Responses sent, by class: index 1 = 1xx (interim responses are not counted) … 5 = 5xx.
    pub responses: [AtomicU64; 6],
    /// Requests refused as malformed or ambiguous (400, 414, 431, 505).
    pub bad_requests: AtomicU64,
    /// Clients that did not send a complete request head in time (408 or close).
    pub header_timeouts: AtomicU64,
    /// Requests sent again to another member after a connect failure or a reset.
    pub retries: AtomicU64,
    /// Members that did not answer within `response_timeout` (504).
    pub response_timeouts: AtomicU64,
    /// Requests dropped by a `drop` rule.
    pub dropped: AtomicU64,
    /// Request bodies slower than `min_body_rate` (408, connection closed).
    pub slow_bodies: AtomicU64,
    /// Request bodies larger than `max_body_size` (413, connection closed).
    pub bodies_too_large: AtomicU64,
    /// HTTP/2 connections closed for resetting more streams than their budget (rapid reset).
    pub h2_reset_floods: AtomicU64,
    /// HTTP/2 connections closed because the preface (TLS with ALPN h2) did not come within
    /// `header_timeout`, or because a client did not let a GOAWAY drain finish in time.
    pub h2_stalled: AtomicU64,
    /// HTTP/2 response bodies dropped (with their member connection) for making no progress
    /// within `idle_timeout`, typically a client holding its flow-control window at zero.
    pub h2_stalled_streams: AtomicU64,
    /// Response compression (`compression`).
    pub compression: Arc<crate::compress::CompressStats>,
    /// The proxy-wasm filters' counters, by module.
    pub filters: crate::wasm_filters::FilterCounters,
}

impl HttpStats {
    pub fn count_status(&self, status: u16) {
        if let Some(c) = self.responses.get(usize::from(status / 100)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A pool as an HTTP service uses it.
pub struct Target {
    pub pool: Arc<Pool>,
    /// Idle-connection stores, by member index.
    pub conns: Vec<Arc<MemberConns>>,
    pub reuse: Reuse,
    pub response_timeout: Duration,
    pub http2: bool,
    pub observer: StatusObserver,
    /// `ip:port` of each member, and `ip` alone for members on port 80, as they appear in
    /// absolute Location URLs.
    authorities: Vec<Vec<u8>>,
    /// HTTP/2 member connections (when `http2`), by member index.
    pub h2: Vec<Arc<crate::upstream::H2Member>>,
    /// TLS to the members (pool `tls`), set by `HttpService::build`.
    pub tls: Option<Arc<crate::tls::client::MemberTls>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("pool", &self.pool.name)
            .finish()
    }
}

impl Target {
    pub fn new(pool: Arc<Pool>, upstreams: &Upstreams) -> Target {
        let mut authorities = Vec::new();
        for m in pool.members() {
            let a = m.address;
            let host = match a.ip() {
                IpAddr::V6(v6) => format!("[{v6}]"),
                v4 => v4.to_string(),
            };
            authorities.push(format!("{host}:{}", a.port()).into_bytes());
            if a.port() == 80 {
                authorities.push(host.into_bytes());
            }
        }
        let opts = &pool.config.http;
        Target {
            conns: upstreams.for_pool(&pool),
            reuse: pool.config.reuse,
            response_timeout: opts.response_timeout,
            http2: opts.http2,
            observer: StatusObserver::new(&opts.passive_statuses),
            h2: if opts.http2 {
                upstreams.h2_for_pool(&pool)
            } else {
                Vec::new()
            },
            authorities,
            pool,
            tls: None,
        }
    }

    /// The authorities the members answer as (`host:port`, and `host` alone for the scheme's
    /// default port), for `Location` rewriting.
    pub fn authorities(&self) -> &[Vec<u8>] {
        &self.authorities
    }
}

/// What the service does with a request.
pub enum Plan<'s> {
    Local(Local, Option<&'s CompiledRule>),
    Drop,
    Forward {
        target: usize,
        rule: Option<&'s CompiledRule>,
    },
}

/// A compiled `protocol = "http"` virtual service.
pub struct HttpService {
    pub name: Arc<str>,
    pub targets: Vec<Arc<Target>>,
    pub default_target: Option<usize>,
    pub rules: RuleSet,
    pub sticky: Option<Sticky>,
    pub limits: Limits,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub request_timeout: Option<Duration>,
    /// Largest request body (413 beyond it).
    pub max_body_size: Option<u64>,
    /// Slowest request body, bytes per second, after `header_timeout` of grace; 0: none.
    pub min_body_rate: u64,
    pub forward: ForwardHeaders,
    pub proxy_protocol: Option<ProxyProtocol>,
    pub max_connections: u32,
    /// The service is reached over TLS (protocol https): scheme, Secure cookies.
    pub https: bool,
    /// TLS termination (protocol https), set by the assembly after `build`.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    pub stats: Arc<ServiceStats>,
    pub http_stats: Arc<HttpStats>,
    pub tracker: Arc<Tracker>,
    pub access_log: Option<AccessLog>,
    pub no_member_hook: Option<Arc<dyn NoMemberHook>>,
    /// `gslb_redirect_threshold`: above this many active client connections, requests are sent
    /// to the hook's redirect too (when it gives one), before any member is chosen.
    pub redirect_threshold: Option<u64>,
    /// The service's HTTP cache (`cache`), kept across reloads by service name.
    pub cache: Option<Arc<crate::cache::HttpCache>>,
    /// Response compression (`compression`); `None`: responses pass untouched.
    pub compress: Option<crate::compress::Compressor>,
    /// `[[virtual_service.filter]]`: proxy-wasm filters around the rules.
    pub filters: Option<Arc<fulcrum_wasm::Chain>>,
    /// Source addresses for member connections (`snat`). HTTP/2 member connections are shared
    /// by the services of a pool: they come from the pool of the service that opened them.
    pub snat: Option<Arc<fulcrum_net::Snat>>,
    /// `source = "client"`: member connections from the client's own address; they are then
    /// private to the client connection (never pooled for another client).
    pub transparent: Option<Arc<fulcrum_net::Transparent>>,
    /// Set when a reload replaced this service, or at shutdown: its client connections move to
    /// the version in force (`successor`), or announce their close.
    retired: std::sync::atomic::AtomicBool,
    retire: tokio::sync::Notify,
    /// Every version of this service (by name) across reloads, and the one in force.
    lineage: Arc<Lineage>,
    /// The service's own configuration as text (`Debug` of its `[[virtual_service]]`): two
    /// versions with the same text accept and keep client connections the same way.
    shape: String,
}

/// The versions of one virtual service across reloads: the one in force, for the client
/// connections an older version accepted. Weak: the assembly and the listeners own services.
#[derive(Default)]
struct Lineage {
    current: parking_lot::Mutex<std::sync::Weak<HttpService>>,
}

/// What a client connection of a retired service does next.
pub enum Successor {
    /// The service in force has the same configuration: the connection serves its next
    /// requests with it, announcing nothing (pools and members may have changed: they are
    /// per request).
    Same(Arc<HttpService>),
    /// The service changed: the connection serves its next request with the new version and
    /// announces its close (`Connection: close`, GOAWAY), so no request is lost to a close the
    /// client did not expect.
    Changed(Arc<HttpService>),
    /// The service is gone (removed, or shutdown): close when idle, after the current response.
    Gone,
}

impl std::fmt::Debug for HttpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpService")
            .field("name", &self.name)
            .field("targets", &self.targets)
            .field("rules", &self.rules.len())
            .finish()
    }
}

/// What a service is built from besides its configuration.
pub struct Parts<'a> {
    pub config: &'a fulcrum_config::Config,
    pub pools: &'a [Arc<Pool>],
    pub upstreams: &'a Upstreams,
    /// The service's persistence table (kept across reloads) for the kinds that need one.
    pub table: Option<Arc<PersistTable>>,
    pub stats: Arc<ServiceStats>,
    pub http_stats: Arc<HttpStats>,
    pub tracker: Arc<Tracker>,
    pub no_member_hook: Option<Arc<dyn NoMemberHook>>,
    /// The service's cache when it has a `cache` table.
    pub cache: Option<Arc<crate::cache::HttpCache>>,
    /// Source addresses for member connections (`snat`).
    pub snat: Option<Arc<fulcrum_net::Snat>>,
    /// `source = "client"`: the service's transparency counters.
    pub transparent: Option<Arc<fulcrum_net::Transparent>>,
}

impl HttpService {
    /// Compiles a virtual service: its pools become targets, its rules are indexed, its
    /// persistence profile gets its member ids.
    pub fn build(vs: &VirtualService, parts: Parts<'_>) -> Result<HttpService, String> {
        let http = vs
            .as_http()
            .ok_or_else(|| format!("{:?} is a {} service, not http", vs.name, vs.protocol()))?;
        let find = |name: &str| -> Result<Arc<Pool>, String> {
            parts
                .pools
                .iter()
                .find(|p| &*p.name == name)
                .cloned()
                .ok_or_else(|| format!("no pool named {name:?}"))
        };
        let mut names: Vec<&str> = Vec::new();
        if let Some(p) = &vs.pool {
            names.push(p);
        }
        for r in &http.rules {
            if let fulcrum_config::RuleAction::Pool(p) = &r.action {
                if !names.contains(&p.as_str()) {
                    names.push(p);
                }
            }
        }
        let pools: Vec<Arc<Pool>> = names.iter().map(|n| find(n)).collect::<Result<_, _>>()?;
        let targets: Vec<Arc<Target>> = pools
            .iter()
            .map(|p| {
                let mut t = Target::new(p.clone(), parts.upstreams);
                if let Some(tls) = &p.config.tls {
                    let m = crate::tls::client::MemberTls::load(tls, t.http2, "pool")
                        .map_err(|(k, m)| format!("{k}: {m}"))?;
                    t.tls = Some(Arc::new(m));
                }
                Ok(Arc::new(t))
            })
            .collect::<Result<_, String>>()?;
        let rules = RuleSet::compile(&http.rules, &|name| names.iter().position(|n| *n == name))?;
        let https = http.tls.is_some();
        let sticky = match vs
            .persistence
            .as_ref()
            .and_then(|n| parts.config.persistence(n))
        {
            Some(profile) => Some(Sticky::new(profile, &pools, parts.table, https)?),
            None => None,
        };
        let filters = crate::wasm_filters::build_chain(
            &http.filters,
            &parts.http_stats.filters,
            parts.pools,
        )?;
        let access_log = match &http.options.access_log {
            Some(cfg) => Some(
                AccessLog::open(cfg, &vs.name)
                    .map_err(|e| format!("access_log {}: {e}", cfg.path.display()))?,
            ),
            None => None,
        };
        Ok(HttpService {
            name: Arc::from(vs.name.as_str()),
            default_target: vs.pool.as_ref().map(|_| 0),
            targets,
            rules,
            sticky,
            limits: Limits {
                max_header_size: http.options.max_header_size as usize,
                max_headers: http.options.max_headers as usize,
                max_uri: http.options.max_uri_length as usize,
            },
            header_timeout: http.options.header_timeout,
            idle_timeout: vs.idle_timeout,
            request_timeout: http.options.request_timeout,
            max_body_size: http.options.max_body_size,
            min_body_rate: http.options.min_body_rate,
            forward: http.options.forward_headers,
            proxy_protocol: http.stream.proxy_protocol,
            max_connections: vs.max_connections,
            https,
            tls: None,
            stats: parts.stats,
            http_stats: parts.http_stats,
            tracker: parts.tracker,
            access_log,
            redirect_threshold: parts
                .no_member_hook
                .as_ref()
                .and(http.gslb_redirect.as_ref().and_then(|r| r.threshold)),
            no_member_hook: parts.no_member_hook,
            cache: parts.cache,
            snat: parts.snat,
            transparent: parts.transparent,
            compress: http
                .compression
                .as_ref()
                .map(crate::compress::Compressor::new),
            filters,
            retired: std::sync::atomic::AtomicBool::new(false),
            retire: tokio::sync::Notify::new(),
            lineage: Arc::default(),
            shape: format!("{vs:?}"),
        })
    }

    /// Makes this (not yet running) service the next version of `previous`, the service of the
    /// same name in the configuration in force.
    pub fn follows(&mut self, previous: &HttpService) {
        self.lineage = previous.lineage.clone();
    }

    /// Makes this service the version in force of its lineage (at commit, before the previous
    /// version is retired).
    pub fn take_over(self: &Arc<Self>) {
        *self.lineage.current.lock() = Arc::downgrade(self);
    }

    /// Takes the service out of service. Its client connections move to the version in force
    /// (see `Successor`); when there is none (the service left the configuration, or the
    /// process stops), idle connections close now and busy ones after their current response
    /// (HTTP/1.1 `Connection: close`, HTTP/2 GOAWAY).
    pub fn retire(self: &Arc<Self>) {
        {
            let mut current = self.lineage.current.lock();
            if std::ptr::eq(current.as_ptr(), Arc::as_ptr(self)) {
                *current = std::sync::Weak::new();
            }
        }
        self.retired.store(true, Ordering::Release);
        self.retire.notify_waiters();
    }

    /// For a connection of a retired service: the version to go on with.
    pub fn successor(&self) -> Successor {
        match self.lineage.current.lock().upgrade() {
            Some(next) if next.shape == self.shape => Successor::Same(next),
            Some(next) => Successor::Changed(next),
            None => Successor::Gone,
        }
    }

    /// Whether a response written now must announce the connection's close: the service was
    /// retired and the version in force (if any) accepts connections differently.
    pub fn must_close(&self) -> bool {
        self.is_retired() && !matches!(self.successor(), Successor::Same(_))
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Completes when the service is retired.
    pub async fn retired(&self) {
        loop {
            let notified = self.retire.notified();
            if self.is_retired() {
                return;
            }
            notified.await;
        }
    }

    /// What the field writers (`fields`) need of this service.
    pub fn field_settings(&self) -> crate::fields::Settings<'_> {
        crate::fields::Settings {
            forward: self.forward,
            sticky: self.sticky.as_ref(),
            https: self.https,
        }
    }

    pub fn scheme(&self) -> &'static str {
        if self.https {
            "https"
        } else {
            "http"
        }
    }

    /// Decides what to do with a request: a rule's action, or the default pool; a request bound
    /// for a pool while the service is over `gslb_redirect_threshold` is redirected to another
    /// site instead, when there is one.
    pub fn plan(&self, req: &RequestHead, client: &Client) -> Plan<'_> {
        let plan = self.route(req, client);
        if let (Plan::Forward { target, rule }, Some(limit)) = (&plan, self.redirect_threshold) {
            if self.stats.connections_active.load(Ordering::Relaxed) > limit {
                if let Some(l) = self.hook_redirect(&self.targets[*target], req, client) {
                    return Plan::Local(l, *rule);
                }
            }
        }
        plan
    }

    fn route(&self, req: &RequestHead, client: &Client) -> Plan<'_> {
        let rule = self
            .rules
            .find(req, client.ip)
            .and_then(|i| self.rules.get(i));
        match rule {
            Some(r) => match &r.action {
                Action::Pool(t) => Plan::Forward {
                    target: *t,
                    rule: Some(r),
                },
                Action::Redirect { location, status } => Plan::Local(
                    Local {
                        status: *status,
                        location: Some(location.expand(self.scheme(), req)),
                        body: Bytes::new(),
                        retry_after: false,
                        close: false,
                        fields: Vec::new(),
                    },
                    Some(r),
                ),
                Action::Respond { status, body } => Plan::Local(
                    Local {
                        status: *status,
                        location: None,
                        body: body.clone(),
                        retry_after: false,
                        close: false,
                        fields: Vec::new(),
                    },
                    Some(r),
                ),
                Action::Drop => Plan::Drop,
            },
            None => match self.default_target {
                Some(t) => Plan::Forward {
                    target: t,
                    rule: None,
                },
                None => Plan::Local(
                    Local::error(404, "no rule matches and the service has no default pool"),
                    None,
                ),
            },
        }
    }

    /// The answer when a pool has no member to take the request: the GSLB hook's redirect, or
    /// 503 with Retry-After.
    pub fn no_member(&self, target: &Target, req: &RequestHead, client: &Client) -> Local {
        self.stats.no_member.fetch_add(1, Ordering::Relaxed);
        if let Some(l) = self.hook_redirect(target, req, client) {
            return l;
        }
        let mut l = Local::error(503, "no member available");
        l.retry_after = true;
        l
    }

    /// The `302 Found` the no-member hook (GSLB) gives for a request, if any.
    fn hook_redirect(&self, target: &Target, req: &RequestHead, client: &Client) -> Option<Local> {
        let hook = self.no_member_hook.as_ref()?;
        let info = RequestInfo {
            scheme: self.scheme(),
            host: req.host_name(),
            path: req.path(),
            query: req.query(),
            client: client.ip,
            local_port: client.info.local.port(),
        };
        let location = hook.redirect(&self.name, &target.pool.name, &info)?;
        Some(Local {
            status: 302,
            location: Some(location.into_bytes()),
            body: Bytes::new(),
            retry_after: false,
            close: false,
            fields: Vec::new(),
        })
    }
}

/// The hash `algorithm = "hash"` uses for a request (none for the other algorithms).
pub fn request_hash(pool: &Pool, req: &RequestHead, client: &Client) -> Option<u64> {
    if pool.algorithm != fulcrum_config::Algorithm::Hash {
        return None;
    }
    match &pool.hash_key {
        HashKey::SourceIp => Some(hash_ip(client.ip)),
        HashKey::SourceIpPort => Some(hash_socket_addr(client.info.peer)),
        HashKey::Uri => Some(hash_bytes(req.target())),
        HashKey::Host => req.host_name().map(|h| {
            let mut lower = [0u8; 256];
            let n = h.len().min(256);
            for (d, s) in lower.iter_mut().zip(&h[..n]) {
                *d = s.to_ascii_lowercase();
            }
            hash_bytes(&lower[..n])
        }),
        HashKey::Header(name) => req.first_value_named(name.as_bytes()).map(hash_bytes),
        HashKey::Cookie(name) => req.cookie(name.as_bytes()).map(hash_bytes),
    }
}

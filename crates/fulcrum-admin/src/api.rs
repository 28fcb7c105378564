use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use fulcrum_balance::{clock, CheckState, Member, Pool, Transition};
use fulcrum_config::{AdminState, MAX_WEIGHT};
use serde::Serialize;
use serde_json::{json, Value};

use crate::console::{unix_now, AuditEntry, Console};
pub(crate) use crate::state::{error, ApiError, App};
use crate::{Control, ServiceInfo};

#[derive(Serialize)]
pub struct Status {
    pub version: &'static str,
    /// The address table shipped for `[[ip_table]]` `asns` and `countries`: its date and sources.
    pub ip_data: IpData,
    pub generation: u64,
    pub virtual_services: Vec<ServiceStatus>,
    /// Which optional planes the configuration uses, so a client (the dashboard) asks
    /// `/api/v1/ha`, `/api/v1/links` and `/api/v1/http/filters` only when they have something
    /// to say.
    pub configured: Configured,
}

#[derive(Serialize)]
pub struct IpData {
    pub date: &'static str,
    pub source: &'static str,
}

#[derive(Serialize, Default)]
pub struct Configured {
    /// `[ha]` is present.
    pub ha: bool,
    /// `[[outbound]]` or `[[gateway_service]]` (link or gateway pools) are present.
    pub links: bool,
    /// An http service lists proxy-wasm filters (`/api/v1/http/filters` has rows).
    pub filters: bool,
}

/// The counters only rtsp services have.
#[derive(Serialize)]
pub struct RtspStatus {
    pub sessions: u64,
    pub datagrams: u64,
    pub datagrams_dropped: u64,
    pub malformed: u64,
}

#[derive(Serialize)]
pub struct ServiceStatus {
    pub name: String,
    pub protocol: String,
    pub listen: Vec<String>,
    pub connections_active: u64,
    pub connections_total: u64,
    pub requests_total: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub no_member: u64,
    pub over_limit: u64,
    pub upstream_failures: u64,
    /// Connections (udp: datagrams) refused by `allow` / `deny`.
    pub denied: u64,
    /// ftp services: data connections relayed, and control lines or data connections refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ftp_data_connections: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ftp_refused: Option<u64>,
    /// rtsp services: sessions opened, RTP / RTCP datagrams relayed and dropped, messages
    /// that could not be framed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rtsp: Option<RtspStatus>,
    /// http and https services: responses sent to clients by status class, `{"1xx": n, …,
    /// "5xx": n}` (from the http plane, `GET /api/v1/http/responses`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responses: Option<Value>,
    /// Services with `source = "client"`: member connections from the clients' addresses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transparent: Option<TransparentStatus>,
    /// tcp, udp and message services with rules: each rule's hits, in file order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleStatus>,
}

/// One rule of a tcp, udp or message service.
#[derive(Serialize)]
pub struct RuleStatus {
    /// The rule's `name`, or `rule[i]` (its position).
    pub rule: String,
    /// `pool:<name>` or `drop`.
    pub action: String,
    /// Connections (udp: new flows; drop rules: datagrams) the rule decided.
    pub hits: u64,
}

/// The counters of a service with `source = "client"`.
#[derive(Serialize)]
pub struct TransparentStatus {
    /// Member connections made from the client's address.
    pub connections: u64,
    /// Of those, the ones whose client port was taken towards the member (made with another
    /// port).
    pub port_fallbacks: u64,
    /// Member connections that could not come from the client's address.
    pub failures: u64,
}

#[derive(Serialize)]
pub struct PoolStatus {
    pub name: String,
    pub algorithm: String,
    /// Members that can take a new client now.
    pub available: usize,
    pub no_member: u64,
    /// Panic mode: no member is up and some are down by passive observation alone, so they
    /// keep taking clients (`panic_picks` counts them) instead of nobody.
    pub panic: bool,
    pub panic_picks: u64,
    /// HTTP connection reuse (`never`, `safe`, `always`).
    pub reuse: String,
    /// Over the members: connections opened, requests sent, and requests that reused an open
    /// connection. Requests ÷ connections is the reuse factor (short client connections
    /// carried over long member connections).
    pub connections_total: u64,
    pub requests_total: u64,
    pub connections_reused: u64,
    /// Elastic pools only: utilisation, thresholds and joins/leaves so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticStatus>,
    pub members: Vec<MemberStatus>,
}

#[derive(Serialize)]
pub struct ElasticStatus {
    pub on: &'static str,
    pub utilisation: f64,
    pub join: f64,
    pub leave: f64,
    pub standby: usize,
    pub joined: usize,
    pub joins: u64,
    pub leaves: u64,
    pub hook_runs: u64,
    pub hook_failures: u64,
}

fn elastic_status(p: &Pool) -> Option<ElasticStatus> {
    let e = p.elastic.as_ref()?;
    let members = p.members();
    Some(ElasticStatus {
        on: e.on(),
        utilisation: (e.utilisation() * 1000.0).round() / 1000.0,
        join: e.config.join,
        leave: e.config.leave,
        standby: members.iter().filter(|m| m.is_standby()).count(),
        joined: members.iter().filter(|m| m.is_joined()).count(),
        joins: e.joins.load(Ordering::Relaxed),
        leaves: e.leaves.load(Ordering::Relaxed),
        hook_runs: e.hook_runs.load(Ordering::Relaxed),
        hook_failures: e.hook_failures.load(Ordering::Relaxed),
    })
}

#[derive(Serialize)]
pub struct AgentStatus {
    pub state: fulcrum_balance::AgentState,
    pub weight_percent: u32,
}

#[derive(Serialize)]
pub struct MemberStatus {
    pub address: String,
    pub weight: u32,
    pub priority: i32,
    /// The operator's state (config or API).
    pub state: String,
    /// `up` or `down`.
    pub health: &'static str,
    pub active_connections: u64,
    pub connections_total: u64,
    pub requests_total: u64,
    /// The state traffic decisions use: the stricter of the operator's and an agent's.
    pub effective_state: String,
    /// The weight the scheduler uses now (slow start, agent, measured speed), in weight units.
    pub effective_weight: f64,
    pub slow_start: &'static str,
    pub max_connections: u32,
    pub active_requests: u64,
    pub connect_failures: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Requests that went over an already open connection (HTTP reuse).
    pub connections_reused: u64,
    /// Open connections waiting idle for reuse (HTTP).
    pub connections_idle: u64,
    pub response_time_ms: f64,
    /// An elastic pool's standby member (absent otherwise), and whether it has joined:
    /// `"elastic": "joined"` or `"standby"`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elastic: Option<&'static str>,
    pub agent: AgentStatus,
    pub checks: Vec<CheckState>,
    pub transitions: Vec<Transition>,
}

pub fn member_status(m: &Member) -> MemberStatus {
    let s = &m.stats;
    let report = m.health.report();
    MemberStatus {
        address: m.label.to_string(),
        weight: m.weight(),
        priority: m.priority(),
        state: m.state().to_string(),
        health: if report.up { "up" } else { "down" },
        active_connections: s.active_connections.load(Ordering::Relaxed),
        connections_total: s.connections_total.load(Ordering::Relaxed),
        requests_total: s.requests_total.load(Ordering::Relaxed),
        effective_state: m.effective_state().to_string(),
        effective_weight: f64::from(m.effective_weight())
            / f64::from(fulcrum_balance::WEIGHT_SCALE),
        slow_start: m.slow_start_phase(clock::now_ms()),
        max_connections: m.max_connections(),
        active_requests: s.active_requests.load(Ordering::Relaxed),
        connect_failures: s.connect_failures.load(Ordering::Relaxed),
        bytes_sent: s.bytes_sent.load(Ordering::Relaxed),
        bytes_received: s.bytes_received.load(Ordering::Relaxed),
        connections_reused: s.connections_reused.load(Ordering::Relaxed),
        connections_idle: s.connections_idle.load(Ordering::Relaxed),
        response_time_ms: (s.response_time_us() / 10.0).round() / 100.0,
        standby: m.is_standby(),
        elastic: m
            .is_standby()
            .then_some(if m.is_joined() { "joined" } else { "standby" }),
        agent: AgentStatus {
            state: m.agent_state(),
            weight_percent: m.agent_weight_pct(),
        },
        checks: report.checks,
        transitions: report.transitions,
    }
}

pub fn pool_status(p: &Pool) -> PoolStatus {
    let sum = |f: fn(&fulcrum_balance::MemberStats) -> &std::sync::atomic::AtomicU64| {
        p.members()
            .iter()
            .map(|m| f(&m.stats).load(Ordering::Relaxed))
            .sum()
    };
    PoolStatus {
        name: p.name.to_string(),
        algorithm: p.algorithm.to_string(),
        available: p.available(),
        no_member: p.no_member.load(Ordering::Relaxed),
        panic: p.in_panic(),
        panic_picks: p.panic_picks.load(Ordering::Relaxed),
        reuse: p.config.reuse.to_string(),
        connections_total: sum(|s| &s.connections_total),
        requests_total: sum(|s| &s.requests_total),
        connections_reused: sum(|s| &s.connections_reused),
        elastic: elastic_status(p),
        members: p.members().iter().map(|m| member_status(m)).collect(),
    }
}

fn service_status(s: &ServiceInfo) -> ServiceStatus {
    let st = &s.stats;
    ServiceStatus {
        name: s.name.clone(),
        protocol: s.protocol.to_string(),
        listen: s.listen.iter().map(ToString::to_string).collect(),
        connections_active: st.connections_active.load(Ordering::Relaxed),
        connections_total: st.connections_total.load(Ordering::Relaxed),
        requests_total: st.requests_total.load(Ordering::Relaxed),
        bytes_in: st.bytes_in.load(Ordering::Relaxed),
        bytes_out: st.bytes_out.load(Ordering::Relaxed),
        no_member: st.no_member.load(Ordering::Relaxed),
        over_limit: st.over_limit.load(Ordering::Relaxed),
        upstream_failures: st.upstream_failures.load(Ordering::Relaxed),
        denied: st.denied.load(Ordering::Relaxed),
        ftp_data_connections: (s.protocol == fulcrum_config::Protocol::Ftp)
            .then(|| st.ftp_data_connections.load(Ordering::Relaxed)),
        ftp_refused: (s.protocol == fulcrum_config::Protocol::Ftp)
            .then(|| st.ftp_refused.load(Ordering::Relaxed)),
        rtsp: (s.protocol == fulcrum_config::Protocol::Rtsp).then(|| RtspStatus {
            sessions: st.rtsp_sessions.load(Ordering::Relaxed),
            datagrams: st.rtsp_datagrams.load(Ordering::Relaxed),
            datagrams_dropped: st.rtsp_datagrams_dropped.load(Ordering::Relaxed),
            malformed: st.rtsp_malformed.load(Ordering::Relaxed),
        }),
        responses: None,
        transparent: s.transparent.as_ref().map(|t| TransparentStatus {
            connections: t.connections.load(Ordering::Relaxed),
            port_fallbacks: t.port_fallbacks.load(Ordering::Relaxed),
            failures: t.failures.load(Ordering::Relaxed),
        }),
        rules: st
            .rules
            .load()
            .iter()
            .map(|h| RuleStatus {
                rule: h.label.clone(),
                action: h.action.clone(),
                hits: h.hits.load(Ordering::Relaxed),
            })
            .collect(),
    }
}

/// Builds the API router for a listener bound to `bound`. Every request passes `guard`: the
/// Host check (loopback listeners), the bearer token and, on mutating calls, the JSON
/// Content-Type. Every mutating call under `/api/v1/`, refused ones included, is audited.
/// Inside a Tokio runtime it also starts the console's sampler (which ends with the router).
pub fn router(control: Arc<dyn Control>, bound: SocketAddr) -> Router {
    let console = Arc::new(Console::default());
    if tokio::runtime::Handle::try_current().is_ok() {
        console.spawn_sampler(control.clone());
    }
    build(App {
        metrics: metrics_registry(&control, &console),
        control,
        bound,
        console,
        local_socket: false,
    })
}

/// The routers of the API's listeners: TCP (plain or TLS) and the Unix socket share one
/// console (history, audit, alerts).
pub struct Routers {
    pub tcp: Router,
    pub socket: Router,
}

/// As `router`, with the router of the Unix socket (`admin.socket`) beside it.
pub fn routers(control: Arc<dyn Control>, bound: SocketAddr) -> Routers {
    let console = Arc::new(Console::default());
    if tokio::runtime::Handle::try_current().is_ok() {
        console.spawn_sampler(control.clone());
    }
    let app = App {
        metrics: metrics_registry(&control, &console),
        control,
        bound,
        console,
        local_socket: false,
    };
    Routers {
        tcp: build(app.clone()),
        socket: build(App {
            local_socket: true,
            ..app
        }),
    }
}

/// One registry for every listener: the alert rules' families come last, after the planes'.
fn metrics_registry(
    control: &Arc<dyn Control>,
    console: &Arc<Console>,
) -> Arc<crate::metrics::Registry> {
    let console = console.clone();
    let alerts = crate::metrics::collector(move |out| console.alerts.metrics(out));
    Arc::new(crate::metrics::registry(control.clone(), alerts))
}

fn build(app: App) -> Router {
    let api = Router::new()
        .route("/status", get(status))
        .route("/pools", get(pools))
        .route("/pools/{pool}", get(pool))
        .route("/pools/{pool}/members/{address}", get(member))
        .route("/pools/{pool}/members/{address}/state", put(set_state))
        .route("/pools/{pool}/members/{address}/weight", put(set_weight))
        .route("/reload", post(reload))
        .route("/history", get(history))
        .route("/audit", get(audit))
        .route("/alerts", get(alerts))
        .route("/certificates", get(certificates))
        .merge(crate::config_api::routes())
        .route("/{*path}", axum::routing::any(plane))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") });
    Router::new()
        .nest("/api/v1", api)
        .merge(crate::ui::routes())
        .route("/metrics", get(metrics))
        .route("/", get(index))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .layer(middleware::from_fn_with_state(app.clone(), audit_layer))
        .with_state(app)
}

/// Records every call that may change something (anything but GET/HEAD/OPTIONS), refused ones
/// included, with the peer's address: the console's "who drained this member at 3 a.m.".
async fn audit_layer(State(app): State<App>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    if matches!(
        method,
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    ) || !req.uri().path().starts_with("/api/v1/")
    {
        return next.run(req).await;
    }
    let from = match req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        Some(c) => c.0.to_string(),
        None if app.local_socket => "unix socket".to_string(),
        None => "unknown".to_string(),
    };
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .chars()
        .take(128)
        .collect();
    // Inside `nest` the URI lost its `/api/v1` prefix; the audit names the path as called.
    let path = req
        .extensions()
        .get::<axum::extract::OriginalUri>()
        .map_or_else(|| req.uri().path().to_string(), |u| u.0.path().to_string());
    let path = percent_decode(&path);
    let (parts, body) = req.into_parts();
    // Admin request bodies are small JSON objects, but for whole configurations; a larger one
    // is refused rather than buffered.
    let limit = if path.starts_with("/api/v1/config") {
        crate::config_api::MAX_BODY
    } else {
        64 * 1024
    };
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(_) => {
            let r = error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body over {} KiB", limit / 1024),
            )
            .into_response();
            app.console.record(AuditEntry {
                at: unix_now(),
                from,
                method: method.to_string(),
                path,
                body: String::new(),
                status: r.status().as_u16(),
                user_agent,
                // Read before the token is looked at: anyone can draw this answer.
                refused: true,
            });
            return r;
        }
    };
    let shown: String = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned();
    let response = next
        .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await;
    app.console.record(AuditEntry {
        at: unix_now(),
        from,
        method: method.to_string(),
        path,
        body: shown,
        status: response.status().as_u16(),
        user_agent,
        refused: response.extensions().get::<Refused>().is_some(),
    });
    response
}

/// `%3A` → `:` and so on, so the audit shows `127.0.0.1:80` as the handlers saw it; invalid
/// escapes stay as they were.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(serde::Deserialize)]
struct HistoryQuery {
    #[serde(default)]
    since: f64,
    /// Seconds of per-member figures wanted (all kept samples when absent).
    member_window: Option<f64>,
}

/// `GET /api/v1/history?since=T[&member_window=S]`: the sampler's one-second samples after Unix
/// time `T`, members' figures only for the last `S` seconds when given.
async fn history(
    State(app): State<App>,
    axum::extract::Query(q): axum::extract::Query<HistoryQuery>,
) -> Json<Value> {
    Json(json!({
        "interval_s": 1,
        "samples": app.console.history_since(q.since, q.member_window),
    }))
}

/// `GET /api/v1/alerts`: firing (and pending) alerts and delivery counters per rule.
async fn alerts(State(app): State<App>) -> Json<Value> {
    Json(app.console.alerts.json())
}

/// `GET /api/v1/certificates`: https certificates and their expiry.
async fn certificates(State(app): State<App>) -> Json<Value> {
    let (console, control) = (app.console.clone(), app.control.clone());
    // Reading certificate files (at most once a minute) is blocking file I/O.
    let v = tokio::task::spawn_blocking(move || console.alerts.certificates(control.as_ref()))
        .await
        .unwrap_or_else(|_| json!({ "certificates": [] }));
    Json(v)
}

/// `GET /api/v1/audit`: the mutating API calls, newest first.
async fn audit(State(app): State<App>) -> Json<Value> {
    let (entries, refused_dropped) = app.console.audit();
    Json(json!({ "entries": entries, "refused_dropped": refused_dropped }))
}

/// Compares in time independent of where the first difference is, so the token cannot be
/// guessed byte by byte from response times.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `host` (a Host header or :authority, port optional) may reach a listener bound to
/// `bound`. Off loopback every name is allowed (the token guards everything there). On
/// loopback only loopback addresses, `localhost` and the bound address are: a browser page
/// whose name an attacker re-points at 127.0.0.1 (DNS rebinding) still sends its own name.
pub fn host_allowed(host: &str, bound: SocketAddr) -> bool {
    if !bound.ip().is_loopback() {
        return true;
    }
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, tail)) if tail.is_empty() || tail.starts_with(':') => ip,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback() || ip == bound.ip(),
        Err(_) => name.eq_ignore_ascii_case("localhost"),
    }
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// JSON, or TOML where a whole configuration is written. A browser cannot send either to
/// another origin without asking first (CORS), unlike a form or text/plain.
fn body_type_allowed(req: &Request) -> bool {
    is_json(req)
        || (crate::config_api::takes_toml(req.uri().path())
            && req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/toml")))
}

/// Marks a response `guard` gave instead of a handler: the audit keeps such calls apart.
#[derive(Clone, Copy)]
struct Refused;

fn refused(mut r: Response) -> Response {
    r.extensions_mut().insert(Refused);
    r
}

/// The refusal of a mutating call whose body is not JSON.
fn not_json(read_only: bool, req: &Request) -> Option<Response> {
    if read_only || body_type_allowed(req) {
        return None;
    }
    Some(refused(
        error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "mutating calls need Content-Type: application/json",
        )
        .into_response(),
    ))
}

async fn guard(State(app): State<App>, req: Request, next: Next) -> Response {
    if app.local_socket {
        // Only who may open the socket file gets here (0600/0660): the caller is authenticated.
        // Mutating calls still need JSON, as everywhere.
        let read_only = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
        if let Some(refusal) = not_json(read_only, &req) {
            return refusal;
        }
        return next.run(req).await;
    }
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("(not text)"))
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    if let Some(host) = host {
        if !host_allowed(host, app.bound) {
            return refused(
                error(
                    StatusCode::MISDIRECTED_REQUEST,
                    format!(
                        "Host {host:?} is not this API's address; use {} or localhost",
                        app.bound
                    ),
                )
                .into_response(),
            );
        }
    }
    let access = app.control.admin_access();
    let read_only = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let path = req.uri().path();
    let needs_token = if !read_only {
        true
    } else if path == "/ui" || path.starts_with("/ui/") {
        // The dashboard's static files hold no data: the page takes the token from its URL
        // fragment and sends it with every API call it makes.
        false
    } else if path == "/metrics" {
        access.metrics_need_token
    } else {
        access.reads_need_token
    };
    if needs_token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same(g.as_bytes(), access.token.as_bytes())) {
            let mut r =
                error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return refused(r);
        }
    }
    // A page on any site can POST a form or text/plain to localhost without a preflight; it
    // cannot send application/json without the browser asking this API first (CORS).
    if let Some(refusal) = not_json(read_only, &req) {
        return refusal;
    }
    next.run(req).await
}

async fn index() -> Json<Value> {
    Json(json!({
        "name": "fulcrum",
        "version": env!("CARGO_PKG_VERSION"),
        "endpoints": ["/api/v1/status", "/api/v1/pools", "/api/v1/pools/{pool}",
                      "/api/v1/pools/{pool}/members/{address}/state", "/api/v1/pools/{pool}/members/{address}/weight",
                      "/api/v1/reload", "/api/v1/config", "/api/v1/config/history", "/api/v1/config/rollback",
                      "/api/v1/config/virtual_services/{name}", "/api/v1/config/pools/{name}",
                      "/api/v1/config/pools/{pool}/members/{address}", "/api/v1/config/monitors/{name}", "/api/v1/gslb", "/api/v1/gslb/sites", "/api/v1/gslb/names",
                      "/api/v1/gslb/peers", "/api/v1/gslb/table", "/api/v1/cache/{service}", "/api/v1/http/responses", "/api/v1/ha", "/api/v1/ha/maintenance", "/api/v1/links",
                      "/api/v1/history", "/api/v1/audit", "/api/v1/alerts", "/api/v1/certificates", "/metrics", "/ui/"],
    }))
}

async fn status(State(app): State<App>) -> Json<Status> {
    Json(Status {
        version: env!("CARGO_PKG_VERSION"),
        ip_data: {
            let about = fulcrum_ipdata::about();
            IpData {
                date: about.date,
                source: about.source,
            }
        },
        generation: app.control.generation(),
        configured: app
            .control
            .config()
            .map(|c| Configured {
                ha: c.ha.is_some(),
                links: !c.outbound.is_empty() || !c.gateway_services.is_empty(),
                filters: c
                    .virtual_services
                    .iter()
                    .any(|v| v.as_http().is_some_and(|h| !h.filters.is_empty())),
            })
            .unwrap_or_default(),
        virtual_services: {
            let mut list: Vec<ServiceStatus> =
                app.control.services().iter().map(service_status).collect();
            // Only an http plane answers this; without http services it is a 404 and skipped.
            let (code, by_class) = app.control.plane_get(&["http", "responses"], &[]);
            if code == 200 {
                for s in &mut list {
                    s.responses = by_class["services"].get(&s.name).cloned();
                }
            }
            list
        },
    })
}

async fn pools(State(app): State<App>) -> Json<Value> {
    let pools: Vec<PoolStatus> = app.control.pools().iter().map(|p| pool_status(p)).collect();
    Json(json!({ "pools": pools }))
}

fn find_pool(app: &App, name: &str) -> Result<Arc<Pool>, ApiError> {
    app.control
        .pools()
        .into_iter()
        .find(|p| &*p.name == name)
        .ok_or_else(|| error(StatusCode::NOT_FOUND, format!("no pool named {name:?}")))
}

/// Accepts `127.0.0.1:80`, `[::1]:80` and, for convenience in URLs, `::1:80`-less forms are not
/// guessed: an address must name its port.
fn parse_member_addr(s: &str) -> Option<SocketAddr> {
    s.parse().ok()
}

fn find_member(app: &App, pool: &str, address: &str) -> Result<(Arc<Pool>, Arc<Member>), ApiError> {
    let p = find_pool(app, pool)?;
    let addr = parse_member_addr(address).ok_or_else(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!("{address:?} is not a member address (ip:port, or [ipv6]:port)"),
        )
    })?;
    let m = p
        .member_by_addr(addr)
        .map(|(_, m)| m.clone())
        .ok_or_else(|| {
            error(
                StatusCode::NOT_FOUND,
                format!("pool {pool:?} has no member {addr}"),
            )
        })?;
    Ok((p, m))
}

async fn pool(
    State(app): State<App>,
    Path(name): Path<String>,
) -> Result<Json<PoolStatus>, ApiError> {
    let pool = find_pool(&app, &name)?;
    Ok(Json(pool_status(&pool)))
}

async fn member(
    State(app): State<App>,
    Path((pool, address)): Path<(String, String)>,
) -> Result<Json<MemberStatus>, ApiError> {
    Ok(Json(member_status(&find_member(&app, &pool, &address)?.1)))
}

/// The JSON body's `field` (`guard` has checked the Content-Type).
fn body_field(body: &[u8], field: &str) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body must be JSON: {e}"),
        )
    })?;
    v.get(field).cloned().ok_or_else(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body needs a \"{field}\" field"),
        )
    })
}

/// Sets what `read` takes from the request on the member the path names (found first: a
/// wrong member is a 404 before a wrong body is a 400); then its pool picks up the change, the
/// control plane hears of it, and the answer is the member's new status.
fn change_member<T>(
    app: &App,
    pool: &str,
    address: &str,
    read: impl FnOnce() -> Result<T, ApiError>,
    set: impl FnOnce(&Member, T),
) -> Result<Json<MemberStatus>, ApiError> {
    let (p, m) = find_member(app, pool, address)?;
    set(&m, read()?);
    p.refresh();
    app.control.api_state_changed();
    Ok(Json(member_status(&m)))
}

async fn set_state(
    State(app): State<App>,
    Path((pool, address)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<MemberStatus>, ApiError> {
    let read = || {
        body_field(&body, "state")?
            .as_str()
            .and_then(AdminState::parse)
            .ok_or_else(|| {
                error(
                    StatusCode::BAD_REQUEST,
                    format!("\"state\" must be one of: {}", AdminState::ALL.join(", ")),
                )
            })
    };
    change_member(&app, &pool, &address, read, Member::set_state)
}

async fn set_weight(
    State(app): State<App>,
    Path((pool, address)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<MemberStatus>, ApiError> {
    let read = || {
        body_field(&body, "weight")?
            .as_u64()
            .filter(|w| *w <= u64::from(MAX_WEIGHT))
            .ok_or_else(|| {
                error(
                    StatusCode::BAD_REQUEST,
                    format!("\"weight\" must be an integer from 0 to {MAX_WEIGHT}"),
                )
            })
    };
    change_member(&app, &pool, &address, read, |m, weight| {
        m.set_weight(weight as u32)
    })
}

/// Everything under `/api/v1/` the core routes do not have goes to the data planes.
async fn plane(
    State(app): State<App>,
    method: axum::http::Method,
    Path(path): Path<String>,
    axum::extract::Query(query): axum::extract::Query<Vec<(String, String)>>,
    body: axum::body::Bytes,
) -> Response {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let request = crate::ApiRequest {
        method: method.as_str(),
        path: &parts,
        query: &query,
        body: &body,
    };
    match app.control.plane_api(&request) {
        Some((status, value)) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (status, Json(value)).into_response()
        }
        None => error(StatusCode::NOT_FOUND, "no such endpoint").into_response(),
    }
}

async fn reload(State(app): State<App>) -> Response {
    let control = app.control.clone();
    // Reading and compiling a config is short but blocking work; keep it off the I/O threads.
    let result = tokio::task::spawn_blocking(move || control.reload()).await;
    match result {
        Ok(Ok(generation)) => Json(json!({ "generation": generation })).into_response(),
        Ok(Err(errors)) => {
            (StatusCode::BAD_REQUEST, Json(json!({ "errors": errors }))).into_response()
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reload failed: {e}"),
        )
        .into_response(),
    }
}

async fn metrics(State(app): State<App>, headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = crate::metrics::Format::from_accept(accept);
    match crate::metrics::encode(&app.metrics, format) {
        Ok(text) => ([(header::CONTENT_TYPE, format.content_type())], text).into_response(),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the metrics could not be encoded",
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn loopback_listeners_accept_only_local_names() {
        let bound = "127.0.0.1:9900".parse().unwrap();
        for ok in [
            "127.0.0.1:9900",
            "127.0.0.1",
            "127.1.2.3:80",
            "localhost",
            "LOCALHOST:9900",
            "localhost.",
            "[::1]:9900",
            "[::1]",
        ] {
            assert!(host_allowed(ok, bound), "{ok} refused");
        }
        for bad in [
            "evil.example:9900",
            "evil.example",
            "localhost.evil.example",
            "192.0.2.1:9900",
            "[::1",
            "[::1]x",
            "",
            "(not text)",
        ] {
            assert!(!host_allowed(bad, bound), "{bad} allowed");
        }
        let v6 = "[::1]:9900".parse().unwrap();
        assert!(host_allowed("[::1]:9900", v6));
        assert!(!host_allowed("attacker.example", v6));
        let any = "0.0.0.0:9900".parse().unwrap();
        assert!(host_allowed("adc.example.net", any));
    }

    #[test]
    fn percent_decode_keeps_what_is_not_an_escape() {
        assert_eq!(
            super::percent_decode("/m/127.0.0.1%3A80/x%5B%5d"),
            "/m/127.0.0.1:80/x[]"
        );
        assert_eq!(super::percent_decode("100%"), "100%");
        assert_eq!(super::percent_decode("%zz%4"), "%zz%4");
    }
}

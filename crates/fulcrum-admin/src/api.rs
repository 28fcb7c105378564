use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use fulcrum_balance::{clock, CheckState, Member, Pool, Transition};
use fulcrum_config::{AdminState, MAX_WEIGHT};
use serde::Serialize;
use serde_json::{json, Value};

use crate::{Control, ServiceInfo};

#[derive(Clone)]
struct App {
    control: Arc<dyn Control>,
}

#[derive(Serialize)]
pub struct Status {
    pub version: &'static str,
    pub generation: u64,
    pub virtual_services: Vec<ServiceStatus>,
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
}

#[derive(Serialize)]
pub struct PoolStatus {
    pub name: String,
    pub algorithm: String,
    /// Members that can take a new client now.
    pub available: usize,
    pub no_member: u64,
    /// HTTP connection reuse (`never`, `safe`, `always`).
    pub reuse: String,
    /// Over the members: connections opened, requests sent, and requests that reused an open
    /// connection. Requests ÷ connections is the reuse factor (short client connections
    /// carried over long member connections).
    pub connections_total: u64,
    pub requests_total: u64,
    pub connections_reused: u64,
    pub members: Vec<MemberStatus>,
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
        reuse: p.config.reuse.to_string(),
        connections_total: sum(|s| &s.connections_total),
        requests_total: sum(|s| &s.requests_total),
        connections_reused: sum(|s| &s.connections_reused),
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
    }
}

/// An API error: a status and a message, sent as `{"error": "..."}`.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError(status, message.into())
}

/// Builds the API router; `Control::admin_token` protects `/api/v1/*` with a bearer token.
pub fn router(control: Arc<dyn Control>) -> Router {
    let app = App { control };
    let api = Router::new()
        .route("/status", get(status))
        .route("/pools", get(pools))
        .route("/pools/{pool}", get(pool))
        .route("/pools/{pool}/members/{address}", get(member))
        .route("/pools/{pool}/members/{address}/state", put(set_state))
        .route("/pools/{pool}/members/{address}/weight", put(set_weight))
        .route("/reload", post(reload))
        .route("/gslb", axum::routing::any(gslb))
        .route("/gslb/{*path}", axum::routing::any(gslb))
        .route("/cache/{service}", get(cache).delete(cache))
        .route("/links", get(links))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .route_layer(middleware::from_fn_with_state(app.clone(), auth));
    Router::new()
        .nest("/api/v1", api)
        .route("/metrics", get(metrics))
        .route("/", get(index))
        .with_state(app)
}

/// Compares in time independent of where the first difference is, so the token cannot be
/// guessed byte by byte from response times.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn auth(State(app): State<App>, req: Request, next: Next) -> Response {
    if let Some(token) = app.control.admin_token() {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| same(g.as_bytes(), token.as_bytes())) {
            let mut r =
                error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

async fn index() -> Json<Value> {
    Json(json!({
        "name": "fulcrum",
        "version": env!("CARGO_PKG_VERSION"),
        "endpoints": ["/api/v1/status", "/api/v1/pools", "/api/v1/pools/{pool}",
                      "/api/v1/pools/{pool}/members/{address}/state", "/api/v1/pools/{pool}/members/{address}/weight",
                      "/api/v1/reload", "/api/v1/gslb", "/api/v1/gslb/sites", "/api/v1/gslb/names",
                      "/api/v1/gslb/peers", "/api/v1/gslb/table", "/api/v1/cache/{service}", "/api/v1/links", "/metrics"],
    }))
}

async fn status(State(app): State<App>) -> Json<Status> {
    Json(Status {
        version: env!("CARGO_PKG_VERSION"),
        generation: app.control.generation(),
        virtual_services: app.control.services().iter().map(service_status).collect(),
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

/// The JSON body's `field`. The body is parsed whatever its Content-Type, so that
/// `curl -d '{"state":"drain"}'` (sent as a form) works as typed.
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

async fn set_state(
    State(app): State<App>,
    Path((pool, address)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<MemberStatus>, ApiError> {
    let (p, m) = find_member(&app, &pool, &address)?;
    let state = body_field(&body, "state")?
        .as_str()
        .and_then(AdminState::parse)
        .ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                format!("\"state\" must be one of: {}", AdminState::ALL.join(", ")),
            )
        })?;
    m.set_state(state);
    p.refresh();
    Ok(Json(member_status(&m)))
}

async fn set_weight(
    State(app): State<App>,
    Path((pool, address)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<MemberStatus>, ApiError> {
    let (p, m) = find_member(&app, &pool, &address)?;
    let weight = body_field(&body, "weight")?
        .as_u64()
        .filter(|w| *w <= u64::from(MAX_WEIGHT))
        .ok_or_else(|| {
            error(
                StatusCode::BAD_REQUEST,
                format!("\"weight\" must be an integer from 0 to {MAX_WEIGHT}"),
            )
        })?;
    m.set_weight(weight as u32);
    p.refresh();
    Ok(Json(member_status(&m)))
}

async fn links(State(app): State<App>) -> Response {
    Json(app.control.links_api()).into_response()
}

async fn gslb(
    State(app): State<App>,
    method: axum::http::Method,
    path: Option<Path<String>>,
    body: axum::body::Bytes,
) -> Response {
    let path = path.map(|p| p.0).unwrap_or_default();
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (status, value) = app.control.gslb_api(method.as_str(), &parts, &body);
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(value)).into_response()
}

async fn cache(
    State(app): State<App>,
    method: axum::http::Method,
    Path(service): Path<String>,
    axum::extract::Query(query): axum::extract::Query<Vec<(String, String)>>,
) -> Response {
    let (status, value) = app.control.cache_api(method.as_str(), &service, &query);
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(value)).into_response()
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

async fn metrics(State(app): State<App>) -> Response {
    let text = crate::metrics::render(app.control.as_ref());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

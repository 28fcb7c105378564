//! The admin REST API (docs/operations.md) and the Prometheus `/metrics` endpoint.
//!
//! The API reads live state through the `Control` trait, which the binary implements over its
//! current configuration snapshot, so this crate knows nothing of how data planes are assembled.

pub mod alerts;
mod api;
mod cert;
mod config_api;
pub mod console;
mod deliver;
mod escape;
mod metrics;
mod state;
mod ui;

use std::net::SocketAddr;
use std::sync::Arc;

use fulcrum_balance::Pool;
use fulcrum_config::Protocol;
use fulcrum_net::ServiceStats;

pub use api::{
    host_allowed, member_status, pool_status, router, MemberStatus, PoolStatus, ServiceStatus,
    Status,
};
pub use deliver::http1_client;
pub use metrics::{
    collector, CounterFamily, Family, MetricFamilies, MetricKind, Registry, Value as MetricValue,
};

/// How the API is locked. Mutating calls always need the bearer token.
#[derive(Clone)]
pub struct Access {
    /// The bearer token: configured, or generated into a root-only file at first start.
    pub token: Arc<str>,
    /// Read-only `GET`s of `/api/v1/*` need the token too (`admin.token` is set, or the API
    /// listens off loopback); otherwise they stay open on the loopback listener.
    pub reads_need_token: bool,
    /// `/metrics` needs the token (`admin.metrics_auth`).
    pub metrics_need_token: bool,
}

/// A virtual service as the API shows it.
#[derive(Clone)]
pub struct ServiceInfo {
    pub name: String,
    pub protocol: Protocol,
    pub listen: Vec<SocketAddr>,
    pub stats: Arc<ServiceStats>,
    /// `source = "client"`: the service's transparency counters.
    pub transparent: Option<Arc<fulcrum_net::Transparent>>,
}

/// A request under `/api/v1/` that the core routes (status, pools, members, reload) do not
/// answer, handed to the data planes.
pub struct ApiRequest<'a> {
    pub method: &'a str,
    /// The path after `/api/v1/`, split at `/`, without empty segments.
    pub path: &'a [&'a str],
    /// Decoded query parameters.
    pub query: &'a [(String, String)],
    pub body: &'a [u8],
}

/// Who changed the configuration through the API, for its history: `who` ("api", or the
/// operator the CLI names), `from` (the client's address, or "unix socket").
#[derive(Debug, Clone)]
pub struct Author {
    pub who: String,
    pub from: String,
}

/// A configuration write that was applied (`generation`) or, for a dry run, only validated.
#[derive(Debug, Clone, Copy)]
pub struct ConfigWrite {
    pub generation: Option<u64>,
    pub version: u64,
}

/// Why a configuration write changed nothing.
#[derive(Debug)]
pub enum ConfigRefusal {
    /// `If-Match` named another version than the current one.
    Stale { current: u64 },
    /// What `fulcrum check` (or a later step of the apply) says.
    Invalid(Vec<String>),
    /// No configuration file to write (an inline configuration), or it cannot be written.
    Unavailable(String),
}

/// What the admin API needs from the running process.
pub trait Control: Send + Sync + 'static {
    /// Configuration generation: 1 at start, +1 per successful reload.
    fn generation(&self) -> u64;
    fn services(&self) -> Vec<ServiceInfo>;
    fn pools(&self) -> Vec<Arc<Pool>>;
    /// Re-reads and applies the configuration file; on failure the running one stays and the
    /// errors are returned.
    fn reload(&self) -> Result<u64, Vec<String>>;
    /// The running configuration file's text and its version (`/api/v1/config`); `None`
    /// when the process runs without a file.
    fn config_text(&self) -> Option<(String, u64)> {
        None
    }
    /// Replaces the configuration file with `text`: validated as `fulcrum check` does,
    /// written and applied as a reload, all or nothing. `if_match`: the version the writer
    /// read; `dry_run`: validate only.
    fn config_write(
        &self,
        _text: &str,
        _if_match: Option<u64>,
        _dry_run: bool,
        _author: Author,
    ) -> Result<ConfigWrite, ConfigRefusal> {
        Err(ConfigRefusal::Unavailable(
            "this process runs without a configuration file".into(),
        ))
    }
    /// The kept versions, newest first (`GET /api/v1/config/history`).
    fn config_history(&self) -> serde_json::Value {
        serde_json::json!({ "versions": [] })
    }
    /// The text of a kept version, for a rollback.
    fn config_version(&self, _version: u64) -> Option<String> {
        None
    }
    /// Who may do what; read per request so a reload can change the token.
    fn admin_access(&self) -> Access;
    /// The configuration in force, for what reads it directly (alert rules, certificate files).
    fn config(&self) -> Option<Arc<fulcrum_config::Config>> {
        None
    }
    /// Registers the collectors of what the binary assembles (planes, limits) with the
    /// registry `/metrics` serves; called once when the API starts, so a collector must read
    /// its state at every scrape rather than hold what a reload replaces.
    fn register_metrics(self: Arc<Self>, _registry: &mut Registry) {}
    /// Called after the API changed a member's state or weight (or a plane's mutating route
    /// succeeded), so the binary can keep `admin.state_file` current. The default keeps nothing.
    fn api_state_changed(&self) {}
    /// Serves the routes the data planes add under `/api/v1/` (`gslb/…`, `cache/{service}`, …):
    /// a status and a JSON body, or `None` when no plane has the route.
    fn plane_api(&self, _request: &ApiRequest) -> Option<(u16, serde_json::Value)> {
        None
    }
    /// `GET /api/v1/{path}?{query}` of a plane, as the console and alerts read it: 404 when no
    /// plane has the route.
    fn plane_get(&self, path: &[&str], query: &[(String, String)]) -> (u16, serde_json::Value) {
        let request = ApiRequest {
            method: "GET",
            path,
            query,
            body: &[],
        };
        self.plane_api(&request)
            .unwrap_or((404, serde_json::Value::Null))
    }
}

/// Where the API listens: `admin.listen` (plain, or TLS with `admin.tls`) and the Unix socket
/// of `admin.socket`.
pub struct Listeners {
    pub tcp: tokio::net::TcpListener,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub socket: Option<tokio::net::UnixListener>,
}

/// How long a client of the TLS listener has for its handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the API on every listener until the process ends. Calls over the Unix socket are
/// authenticated by its file permissions (no token); the TCP listener keeps its lock.
pub async fn serve_all(listeners: Listeners, control: Arc<dyn Control>) {
    let bound = match listeners.tcp.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "admin API: no local address");
            return;
        }
    };
    let routers = api::routers(control, bound);
    if let Some(socket) = listeners.socket {
        let router = routers.socket;
        tokio::spawn(async move {
            if let Err(e) = axum::serve(socket, router).await {
                tracing::error!(error = %e, "admin API (unix socket) stopped");
            }
        });
    }
    match listeners.tls {
        None => {
            let app = routers
                .tcp
                .into_make_service_with_connect_info::<SocketAddr>();
            if let Err(e) = axum::serve(listeners.tcp, app).await {
                tracing::error!(error = %e, "admin API stopped");
            }
        }
        Some(acceptor) => serve_tls(listeners.tcp, acceptor, routers.tcp).await,
    }
}

/// The API over TLS: each connection's handshake runs in its own task (a client that never
/// finishes it holds nobody else up), then hyper serves the router on the TLS stream with the
/// peer's address for the audit.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "admin API: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
            {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(client = %peer, error = %e, "admin API: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(client = %peer, "admin API: TLS handshake timed out");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(
                router.layer(axum::Extension(axum::extract::ConnectInfo(peer))),
            );
            let served = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(client = %peer, error = %e, "admin API connection ended");
            }
        });
    }
}

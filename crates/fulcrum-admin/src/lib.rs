//! The admin REST API of DESIGN §5 and the Prometheus `/metrics` endpoint.
//!
//! The API reads live state through the `Control` trait, which the binary implements over its
//! current configuration snapshot, so this crate knows nothing of how data planes are assembled.

pub mod alerts;
mod api;
mod cert;
pub mod console;
mod deliver;
mod metrics;
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
pub use metrics::{render as render_metrics, MetricsWriter};

/// How the API is locked (DESIGN §5). Mutating calls always need the bearer token.
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

/// What the admin API needs from the running process.
pub trait Control: Send + Sync + 'static {
    /// Configuration generation: 1 at start, +1 per successful reload.
    fn generation(&self) -> u64;
    fn services(&self) -> Vec<ServiceInfo>;
    fn pools(&self) -> Vec<Arc<Pool>>;
    /// Re-reads and applies the configuration file; on failure the running one stays and the
    /// errors are returned.
    fn reload(&self) -> Result<u64, Vec<String>>;
    /// Who may do what; read per request so a reload can change the token.
    fn admin_access(&self) -> Access;
    /// The configuration in force, for what reads it directly (alert rules, certificate files).
    fn config(&self) -> Option<Arc<fulcrum_config::Config>> {
        None
    }
    /// Appends data-plane specific metric families (caches, DNS, …) to `/metrics`.
    fn extra_metrics(&self, _out: &mut MetricsWriter) {}
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

/// Serves the API on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, control: Arc<dyn Control>) {
    let bound = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "admin API: no local address");
            return;
        }
    };
    let app = router(control, bound).into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "admin API stopped");
    }
}

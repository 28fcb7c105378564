//! The admin REST API of DESIGN §5 and the Prometheus `/metrics` endpoint.
//!
//! The API reads live state through the `Control` trait, which the binary implements over its
//! current configuration snapshot, so this crate knows nothing of how data planes are assembled.

mod api;
mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;

use fulcrum_balance::Pool;
use fulcrum_config::Protocol;
use fulcrum_net::ServiceStats;

pub use api::{
    member_status, pool_status, router, MemberStatus, PoolStatus, ServiceStatus, Status,
};
pub use metrics::{render as render_metrics, MetricsWriter};

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
    /// The bearer token `/api/v1/*` requires, if any; read per request so a reload can change it.
    fn admin_token(&self) -> Option<Arc<str>>;
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
}

/// Serves the API on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, control: Arc<dyn Control>) {
    let app = router(control);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "admin API stopped");
    }
}

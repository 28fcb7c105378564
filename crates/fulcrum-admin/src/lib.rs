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
use fulcrum_proxy::ServiceStats;

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
    /// Serves `/api/v1/gslb` and `/api/v1/gslb/{*path}` (`path` split at `/`): a status code and
    /// a JSON body. The default has no GSLB.
    fn gslb_api(&self, _method: &str, _path: &[&str], _body: &[u8]) -> (u16, serde_json::Value) {
        (404, serde_json::json!({ "error": "no such endpoint" }))
    }
    /// `GET /api/v1/links`: every link of the outbound link pools (state, rates, probe RTT and
    /// loss per target, flows). The default has no links.
    fn links_api(&self) -> serde_json::Value {
        serde_json::json!({ "links": [] })
    }
    /// Serves `/api/v1/cache/{service}`: `GET` (usage and counters) and `DELETE` (purge;
    /// `query` holds the decoded `url`, `host` and `prefix` parameters). The default has no
    /// caches.
    fn cache_api(
        &self,
        _method: &str,
        _service: &str,
        _query: &[(String, String)],
    ) -> (u16, serde_json::Value) {
        (404, serde_json::json!({ "error": "no such cache" }))
    }
}

/// Serves the API on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, control: Arc<dyn Control>) {
    let app = router(control);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "admin API stopped");
    }
}

//! What every route of the admin API shares: the state handed to the handlers and the error
//! answer. Apart from the routes so the route modules (`api`, `config_api`) depend on it and
//! not on each other.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::console::Console;
use crate::Control;

#[derive(Clone)]
pub(crate) struct App {
    pub(crate) control: Arc<dyn Control>,
    /// The address the API is bound to (it changes only at restart).
    pub(crate) bound: SocketAddr,
    pub(crate) console: Arc<Console>,
    /// What `/metrics` serves, registered once at start.
    pub(crate) metrics: Arc<crate::metrics::Registry>,
    /// Requests come over the Unix socket (`admin.socket`): its file permissions authenticated
    /// the caller, so no token or Host check applies.
    pub(crate) local_socket: bool,
}

/// An API error: a status and a message, sent as `{"error": "..."}`.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError(status, message.into())
}

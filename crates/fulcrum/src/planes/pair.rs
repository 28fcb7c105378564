//! What the two nodes of an HA pair share beside VRRP, used by several planes: the keys derived
//! from the sync key for each purpose, the wall clock their timestamps are compared on, and the
//! maintenance switch that the `ha` and `bgp` endpoints both take. Apart from the ha plane so
//! that the planes using it do not depend on that plane (nor it on them).

use fulcrum_config::Config;
use serde_json::{json, Value};

/// What `ha.sync` derives from its key (`fulcrum_ha::sync::derive_secret`) so that both nodes
/// hold the same secret without sending it.
pub mod purpose {
    /// The keyed hash of persistence tables' byte keys (header, cookie_passive, RADIUS).
    pub const TABLE_HASH: &str = "persistence-table-hash";
    /// The persistence-cookie secret of profiles that set none (cookie_insert, cookie_rewrite).
    pub const COOKIE: &str = "persistence-cookie-secret";
    /// TLS session-ticket keys (`fulcrum_tls::ticket`).
    pub const TICKETS: &str = "tls-session-tickets";
}

/// The secret for `purpose` shared by the HA pair, when the config has `ha.sync`.
pub fn shared_secret(config: &Config, purpose: &str) -> Option<[u8; 32]> {
    let key = &config.ha.as_ref()?.sync.as_ref()?.key;
    Some(fulcrum_ha::sync::derive_secret(key, purpose))
}

/// Milliseconds of wall-clock time: timestamps the peer compares with its own clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The body of `PUT /api/v1/ha/maintenance`, or the 400 answer to a body that is not one.
pub(crate) fn maintenance_body(body: &[u8]) -> Result<bool, (u16, Value)> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("maintenance").and_then(Value::as_bool))
        .ok_or_else(|| {
            (
                400,
                json!({ "error": "the body must be {\"maintenance\": true | false}" }),
            )
        })
}

/// The answer under `/api/v1/ha` to a method or path that is not a route.
pub(crate) fn other_route(method: &str, path: &[&str]) -> (u16, Value) {
    match path {
        [] | ["maintenance"] => (
            405,
            json!({ "error": format!("{method} is not allowed here") }),
        ),
        _ => (404, json!({ "error": "no such endpoint" })),
    }
}

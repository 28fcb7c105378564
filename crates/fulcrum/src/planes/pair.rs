//! What the two nodes of an HA pair share beside VRRP, used by several planes: the secrets
//! derived from `ha.sync.key` (the derivation, its purposes and the wall clock their timestamps
//! are compared on are fulcrum_ha::sync's: `derive_secret`, `purpose`, `now_ms`), and the
//! maintenance switch that the `ha` and `bgp` endpoints both take. Apart from the ha plane so
//! that the planes using it do not depend on that plane (nor it on them).

use fulcrum_config::Config;
use serde_json::{json, Value};

/// The secret for `purpose` (one of fulcrum_ha::sync::purpose) shared by the HA pair, when the
/// config has `ha.sync`.
pub fn shared_secret(config: &Config, purpose: &str) -> Option<[u8; 32]> {
    let key = &config.ha.as_ref()?.sync.as_ref()?.key;
    Some(fulcrum_ha::sync::derive_secret(key, purpose))
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

//! `/api/v1/config…`: the running configuration read and written through the API (HAProxy's
//! Data Plane API and F5's iControl REST are the models). Every write becomes a new text of the
//! configuration file and takes the one path `Control::config_write` offers: the version the
//! writer read, the checks of `fulcrum check`, an atomic write and a reload, all or nothing.
//! Object writes change only that object's keys in the text (`fulcrum_config::edit`), so the
//! operator's comments and layout stay everywhere else.

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fulcrum_config::edit;
use serde_json::{json, Value};

use crate::state::{error, ApiError, App};
use crate::{Author, ConfigRefusal, ConfigWrite};

/// Whole configurations may be large (thousands of members); other calls stay at 64 KiB.
pub const MAX_BODY: usize = 8 << 20;

pub fn routes() -> Router<App> {
    Router::new()
        .route("/config", get(get_config).put(put_config))
        .route("/config/history", get(history))
        .route("/config/rollback", post(rollback))
        .route(
            "/config/pools/{pool}/members/{address}",
            get(get_member).put(write_member).delete(write_member),
        )
        .route(
            "/config/{kind}/{name}",
            get(get_object).put(write_object).delete(write_object),
        )
}

/// The request's parts the handlers need: who, from where, the headers and the body.
struct Call {
    author: Author,
    headers: HeaderMap,
    dry_run: bool,
    body: axum::body::Bytes,
}

async fn call(app: &App, req: Request) -> Result<Call, Response> {
    let from = match req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
    {
        Some(c) => c.0.to_string(),
        None if app.local_socket => "unix socket".to_string(),
        None => "unknown".to_string(),
    };
    // The CLI names the operator who ran it; anything else is "api".
    let who = req
        .headers()
        .get("x-fulcrum-operator")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.chars()
                .filter(|c| c.is_ascii_alphanumeric() || "._-@".contains(*c))
                .take(64)
                .collect::<String>()
        })
        .filter(|v| !v.is_empty())
        .map_or_else(|| "api".to_string(), |v| format!("api ({v})"));
    let dry_run = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "dry_run=true" || p == "dry_run=1")
    });
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| {
        error(StatusCode::PAYLOAD_TOO_LARGE, "request body over 8 MiB").into_response()
    })?;
    Ok(Call {
        author: Author { who, from },
        headers: parts.headers,
        dry_run,
        body,
    })
}

fn etag(version: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{version}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

/// `If-Match: "7"` (a weak `W/"7"` too): the version the writer read. `*` is any version.
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(v) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let v = v.to_str().unwrap_or("").trim();
    if v == "*" {
        return Ok(None);
    }
    v.trim_start_matches("W/")
        .trim_matches('"')
        .parse()
        .map(Some)
        .map_err(|_| {
            error(
                StatusCode::BAD_REQUEST,
                format!("If-Match: expected the ETag of GET /api/v1/config (\"N\"), got {v:?}"),
            )
        })
}

fn current(app: &App) -> Result<(String, u64), ApiError> {
    app.control.config_text().ok_or_else(|| {
        error(
            StatusCode::NOT_FOUND,
            "this process keeps no configuration versions: it runs without a file (fulcrum demo), or the history beside its file could not be created (see the log)",
        )
    })
}

fn answer(result: Result<ConfigWrite, ConfigRefusal>) -> Response {
    match result {
        Ok(w) => {
            let mut r = match w.generation {
                Some(g) => Json(json!({ "generation": g, "version": w.version })),
                None => Json(json!({ "valid": true, "version": w.version })),
            }
            .into_response();
            r.headers_mut().insert(header::ETAG, etag(w.version));
            r
        }
        Err(ConfigRefusal::Stale { current }) => {
            let mut r = (
                StatusCode::PRECONDITION_FAILED,
                Json(json!({
                    "error": format!("the configuration changed since it was read: it is at version {current}; read it again"),
                    "version": current,
                })),
            )
                .into_response();
            r.headers_mut().insert(header::ETAG, etag(current));
            r
        }
        Err(ConfigRefusal::Invalid(errors)) => {
            (StatusCode::BAD_REQUEST, Json(json!({ "errors": errors }))).into_response()
        }
        Err(ConfigRefusal::Unavailable(e)) => error(StatusCode::CONFLICT, e).into_response(),
    }
}

/// Writes `text` on a blocking thread (validation and reload block).
async fn write(app: &App, text: String, if_match: Option<u64>, c: Call) -> Response {
    let control = app.control.clone();
    let r = tokio::task::spawn_blocking(move || {
        control.config_write(&text, if_match, c.dry_run, c.author)
    })
    .await;
    match r {
        Ok(r) => answer(r),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("write failed: {e}"),
        )
        .into_response(),
    }
}

fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/json"))
}

fn is_toml(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/toml"))
}

/// `GET /api/v1/config`: the file's text (TOML) or, with `Accept: application/json`, its JSON.
async fn get_config(State(app): State<App>, headers: HeaderMap) -> Response {
    let (text, version) = match current(&app) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let mut r = if wants_json(&headers) {
        match edit::parse(&text) {
            Ok(doc) => Json(edit::document_json(&doc)).into_response(),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
        }
    } else {
        (
            [(header::CONTENT_TYPE, "application/toml; charset=utf-8")],
            text,
        )
            .into_response()
    };
    r.headers_mut().insert(header::ETAG, etag(version));
    r
}

/// `PUT /api/v1/config`: the whole configuration, TOML or JSON; `If-Match` required.
async fn put_config(State(app): State<App>, req: Request) -> Response {
    let c = match call(&app, req).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let m = match if_match(&c.headers) {
        Ok(Some(m)) => Some(m),
        Ok(None) if c.headers.contains_key(header::IF_MATCH) => None,
        Ok(None) => {
            return error(
                StatusCode::PRECONDITION_REQUIRED,
                "a whole-configuration write needs If-Match: the ETag of the GET it was based on (or * to overwrite whatever runs)",
            )
            .into_response()
        }
        Err(r) => return r.into_response(),
    };
    let text = if is_toml(&c.headers) {
        match std::str::from_utf8(&c.body) {
            Ok(t) => t.to_string(),
            Err(_) => {
                return error(StatusCode::BAD_REQUEST, "the body is not UTF-8").into_response()
            }
        }
    } else {
        let json: Value = match serde_json::from_slice(&c.body) {
            Ok(j) => j,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("the body is not JSON: {e}"),
                )
                .into_response()
            }
        };
        let (now, _) = match current(&app) {
            Ok(c) => c,
            Err(r) => return r.into_response(),
        };
        match edit::apply_json(&now, &json) {
            Ok(t) => t,
            Err(e) => {
                return (StatusCode::BAD_REQUEST, Json(json!({ "errors": [e] }))).into_response()
            }
        }
    };
    write(&app, text, m, c).await
}

async fn history(State(app): State<App>) -> Json<Value> {
    Json(app.control.config_history())
}

/// `POST /api/v1/config/rollback {"version": N}`: version N becomes the newest.
async fn rollback(State(app): State<App>, req: Request) -> Response {
    let c = match call(&app, req).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let Some(version) = serde_json::from_slice::<Value>(&c.body)
        .ok()
        .and_then(|v| v["version"].as_u64())
    else {
        return error(StatusCode::BAD_REQUEST, "expected {\"version\": N}").into_response();
    };
    let Some(text) = app.control.config_version(version) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("version {version} is not kept (GET /api/v1/config/history lists them)"),
        )
        .into_response();
    };
    let m = match if_match(&c.headers) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    write(&app, text, m, c).await
}

/// An object edit: the new text from the current one, then the write path.
async fn edit_object(
    app: &App,
    req: Request,
    change: impl FnOnce(&str, Option<&Value>) -> Result<(String, bool), String>,
    deleting: bool,
) -> Response {
    let c = match call(app, req).await {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let m = match if_match(&c.headers) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    let (now, _) = match current(app) {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let body: Option<Value> = if deleting {
        None
    } else {
        match serde_json::from_slice(&c.body) {
            Ok(j) => Some(j),
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("the body is not JSON: {e}"),
                )
                .into_response()
            }
        }
    };
    let text = match change(&now, body.as_ref()) {
        Ok((_, false)) if deleting => {
            return error(StatusCode::NOT_FOUND, "no such object").into_response()
        }
        Ok((t, _)) => t,
        Err(e) => return (StatusCode::BAD_REQUEST, Json(json!({ "errors": [e] }))).into_response(),
    };
    write(app, text, m, c).await
}

fn found(v: Result<Option<Value>, String>, version: u64) -> Response {
    match v {
        Ok(Some(v)) => {
            let mut r = Json(v).into_response();
            r.headers_mut().insert(header::ETAG, etag(version));
            r
        }
        Ok(None) => error(StatusCode::NOT_FOUND, "no such object").into_response(),
        Err(e) => error(StatusCode::NOT_FOUND, e).into_response(),
    }
}

async fn get_object(
    State(app): State<App>,
    Path((kind, name)): Path<(String, String)>,
) -> Response {
    match current(&app) {
        Ok((text, version)) => found(edit::get_object(&text, &kind, &name), version),
        Err(r) => r.into_response(),
    }
}

/// `PUT` (create or replace) and `DELETE` of a named object.
async fn write_object(
    State(app): State<App>,
    Path((kind, name)): Path<(String, String)>,
    req: Request,
) -> Response {
    if edit::table_key(&kind).is_none() {
        return error(StatusCode::NOT_FOUND, "no such endpoint").into_response();
    }
    let deleting = req.method() == axum::http::Method::DELETE;
    edit_object(
        &app,
        req,
        |t, j| edit::put_object(t, &kind, &name, j),
        deleting,
    )
    .await
}

async fn get_member(
    State(app): State<App>,
    Path((pool, address)): Path<(String, String)>,
) -> Response {
    match current(&app) {
        Ok((text, version)) => found(edit::get_member(&text, &pool, &address), version),
        Err(r) => r.into_response(),
    }
}

/// `PUT` (create or replace) and `DELETE` of a pool member.
async fn write_member(
    State(app): State<App>,
    Path((pool, address)): Path<(String, String)>,
    req: Request,
) -> Response {
    let deleting = req.method() == axum::http::Method::DELETE;
    edit_object(
        &app,
        req,
        |t, j| edit::put_member(t, &pool, &address, j),
        deleting,
    )
    .await
}

/// Whether a mutating call may carry TOML instead of JSON: the whole-configuration write.
pub fn takes_toml(path: &str) -> bool {
    path == "/api/v1/config"
}

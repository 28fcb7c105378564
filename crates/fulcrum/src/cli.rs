//! The operator's command line over the admin API: `fulcrum status`, `pools`, `member`,
//! `reload` and `top`. Every verb is one or two API calls; nothing here reaches into a running
//! process any other way, so what the CLI shows is what a script or the dashboard sees.

use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

/// How to reach the admin API; shared by every client verb.
#[derive(Args, Clone, Debug)]
pub struct Target {
    /// Admin API address (host:port or http://host:port). Without it (and without --socket)
    /// the CLI uses the admin socket /run/fulcrum/admin.sock when it exists, else
    /// 127.0.0.1:9900.
    #[arg(long, global = true, env = "FULCRUM_ADMIN")]
    pub admin: Option<String>,
    /// The admin API's Unix socket (`admin.socket`): no token needed, its file permissions
    /// decide who may use it.
    #[arg(
        long,
        global = true,
        env = "FULCRUM_SOCKET",
        value_name = "PATH",
        conflicts_with = "admin"
    )]
    pub socket: Option<std::path::PathBuf>,
    /// Bearer token for the API. On the command line it is visible in the process list: prefer
    /// FULCRUM_TOKEN or --token-file.
    #[arg(long, global = true, env = "FULCRUM_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Reads the bearer token from FILE (first line).
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "token")]
    pub token_file: Option<std::path::PathBuf>,
    /// Prints the API's JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum MemberCommand {
    /// No new clients; open and persistent sessions finish.
    Drain { pool: String, address: String },
    /// Takes new clients again.
    Enable { pool: String, address: String },
    /// No new clients at all, persistent ones included.
    Disable { pool: String, address: String },
    /// Sets the member's weight (0–65535).
    Weight {
        pool: String,
        address: String,
        weight: u32,
    },
}

/// Exit statuses a script can tell apart.
pub mod exit {
    /// The API refused the call (unknown pool or member, invalid value, reload errors).
    pub const REFUSED: u8 = 1;
    /// The API could not be reached.
    pub const UNREACHABLE: u8 = 3;
    /// The API wants a (different) token.
    pub const UNAUTHORIZED: u8 = 4;
}

pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

pub fn report(r: Result<(), Failure>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("fulcrum: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Where the CLI finds the admin socket when neither --admin nor --socket is given (the
/// packaged configuration's `admin.socket`).
pub const DEFAULT_SOCKET: &str = "/run/fulcrum/admin.sock";

/// The API address when there is no socket.
const DEFAULT_ADMIN: &str = "127.0.0.1:9900";

/// How the CLI reaches the API.
enum Endpoint {
    Tcp(SocketAddr),
    Socket(std::path::PathBuf),
}

/// Whether the token was given as `--token` on the command line (argv is world-readable in
/// /proc) rather than through FULCRUM_TOKEN or a file.
fn token_in_argv() -> bool {
    std::env::args_os()
        .skip(1)
        .any(|a| a == "--token" || a.to_str().is_some_and(|a| a.starts_with("--token=")))
}

/// A connection to the admin API: address, Host header and token, resolved once.
pub struct Client {
    endpoint: Endpoint,
    /// The address or socket, as shown to the operator.
    shown: String,
    host: String,
    token: Option<String>,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    pub fn new(t: &Target) -> Result<Client, Failure> {
        let socket = match (&t.socket, &t.admin) {
            (Some(path), _) => Some(path.clone()),
            (None, None) if Path::new(DEFAULT_SOCKET).exists() => Some(DEFAULT_SOCKET.into()),
            _ => None,
        };
        let admin = t.admin.as_deref().unwrap_or(DEFAULT_ADMIN);
        let hostport = admin
            .strip_prefix("http://")
            .unwrap_or(admin)
            .trim_end_matches('/');
        let endpoint = match socket {
            Some(path) => Endpoint::Socket(path),
            None => {
                if admin.starts_with("https://") {
                    return Err(Failure::new(
                        exit::UNREACHABLE,
                        "the CLI speaks plain HTTP: use the admin socket (--socket), or curl --cacert for admin.tls",
                    ));
                }
                Endpoint::Tcp(
                    hostport
                        .to_socket_addrs()
                        .ok()
                        .and_then(|mut a| a.next())
                        .ok_or_else(|| {
                            Failure::new(
                                exit::UNREACHABLE,
                                format!("--admin {admin:?} is not a host:port"),
                            )
                        })?,
                )
            }
        };
        let (shown, host) = match &endpoint {
            Endpoint::Tcp(addr) => (addr.to_string(), hostport.to_string()),
            Endpoint::Socket(path) => (path.display().to_string(), "localhost".to_string()),
        };
        if t.token.is_some() && token_in_argv() {
            eprintln!(
                "fulcrum: warning: --token puts the token in the process list, where any user of \
                 this host can read it; use --token-file FILE or FULCRUM_TOKEN instead"
            );
        }
        let token = match (&t.token, &t.token_file) {
            (Some(tok), _) => Some(tok.trim().to_string()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    Failure::new(
                        exit::UNAUTHORIZED,
                        format!("cannot read the token file {}: {e}", path.display()),
                    )
                })?;
                Some(text.lines().next().unwrap_or("").trim().to_string())
            }
            (None, None) => None,
        }
        .filter(|t| !t.is_empty());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure::new(exit::UNREACHABLE, format!("runtime: {e}")))?;
        Ok(Client {
            endpoint,
            shown,
            host,
            token,
            runtime,
        })
    }

    /// The API's address or socket path, as shown to the operator.
    pub fn addr(&self) -> &str {
        &self.shown
    }

    /// One API call; a 2xx answer's JSON, or a failure with the API's own error message.
    pub fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, Failure> {
        let (status, value) = self
            .runtime
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(10), self.send(method, path, body)).await
            })
            .map_err(|_| {
                Failure::new(
                    exit::UNREACHABLE,
                    format!("the admin API at {} did not answer in 10 s", self.shown),
                )
            })??;
        if (200..300).contains(&status) {
            return Ok(value);
        }
        let said = value["error"]
            .as_str()
            .map(String::from)
            .or_else(|| {
                value["errors"].as_array().map(|e| {
                    e.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join("\n  ")
                })
            })
            .unwrap_or_else(|| value.to_string());
        if status == 401 || status == 403 {
            let hint = if self.token.is_some() {
                "the token was refused"
            } else {
                "give a token with --token, FULCRUM_TOKEN or --token-file"
            };
            return Err(Failure::new(
                exit::UNAUTHORIZED,
                format!("{method} {path}: HTTP {status}: {said} ({hint})"),
            ));
        }
        Err(Failure::new(
            exit::REFUSED,
            format!("{method} {path}: HTTP {status}: {said}"),
        ))
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), Failure> {
        let (content_type, bytes) = match body {
            Some(b) => (Some("application/json"), Bytes::from(b.to_string())),
            None => (None, Bytes::new()),
        };
        let r = self
            .exchange(method, path, content_type, &[], bytes)
            .await?;
        let value = serde_json::from_slice(&r.body)
            .unwrap_or_else(|_| json!({ "error": String::from_utf8_lossy(&r.body).trim() }));
        Ok((r.status, value))
    }

    /// One request with the body and headers given; the raw answer. Mutating calls name the
    /// operator who ran the CLI (`X-Fulcrum-Operator`: `SUDO_USER` or `USER`) for the
    /// configuration history.
    pub async fn exchange(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Result<RawAnswer, Failure> {
        let unreachable = |e: String| {
            Failure::new(
                exit::UNREACHABLE,
                format!(
                    "cannot reach the admin API at {}: {e} (is fulcrum running? see --admin)",
                    self.shown
                ),
            )
        };
        let mut sender = match &self.endpoint {
            Endpoint::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                fulcrum_admin::http1_client(stream)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?
            }
            Endpoint::Socket(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                fulcrum_admin::http1_client(stream)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?
            }
        };
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &self.host)
            .header(
                http::header::USER_AGENT,
                concat!("fulcrum-cli/", env!("CARGO_PKG_VERSION")),
            );
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("accept"))
        {
            req = req.header(http::header::ACCEPT, "application/json");
        }
        if let Some(t) = &self.token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if let Some(ct) = content_type {
            req = req.header(http::header::CONTENT_TYPE, ct);
        }
        if let Some(op) = std::env::var("SUDO_USER")
            .ok()
            .or_else(|| std::env::var("USER").ok())
            .filter(|u| !u.is_empty())
        {
            if let Ok(v) = http::HeaderValue::from_str(&op) {
                req = req.header("x-fulcrum-operator", v);
            }
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| unreachable(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        let etag = resp
            .headers()
            .get(http::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .to_bytes();
        Ok(RawAnswer { status, etag, body })
    }

    /// Runs `f` on the CLI's runtime, bounded like every call.
    pub fn block_on<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        self.runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), f).await })
            .map_err(|_| {
                Failure::new(
                    exit::UNREACHABLE,
                    format!("the admin API at {} did not answer in 30 s", self.shown),
                )
            })?
    }
}

/// An answer as it came: status, `ETag` and body.
pub struct RawAnswer {
    pub status: u16,
    pub etag: Option<String>,
    pub body: Bytes,
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// A text table: columns as wide as their widest cell, numbers right-aligned.
pub struct Table {
    header: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&'static str, bool)]) -> Table {
        Table {
            header: columns.iter().map(|c| c.0).collect(),
            right: columns.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut width: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate() {
                if let Some(w) = width.get_mut(i) {
                    *w = (*w).max(c.chars().count());
                }
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        for r in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                let w = width.get(i).copied().unwrap_or(0);
                if i > 0 {
                    line.push_str("  ");
                }
                if self.right.get(i).copied().unwrap_or(false) {
                    let _ = write!(line, "{c:>w$}");
                } else {
                    let _ = write!(line, "{c:<w$}");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

fn num(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::Null => "-".into(),
        other => other.as_str().unwrap_or("-").to_string(),
    }
}

fn last_check(m: &Value) -> String {
    let checks = m["checks"].as_array().cloned().unwrap_or_default();
    if checks.is_empty() {
        return "-".into();
    }
    checks
        .iter()
        .map(|c| {
            format!(
                "{}: {}",
                c["monitor"].as_str().unwrap_or("?"),
                c["last"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .unwrap_or("pending")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

pub fn members_table(pool: &Value) -> String {
    let mut t = Table::new(&[
        ("MEMBER", false),
        ("HEALTH", false),
        ("STATE", false),
        ("WEIGHT", true),
        ("EFFECTIVE", true),
        ("ACTIVE", true),
        ("CONNS", true),
        ("REQUESTS", true),
        ("FAILS", true),
        ("RESP_MS", true),
        ("LAST CHECK", false),
    ]);
    for m in pool["members"].as_array().into_iter().flatten() {
        let state = m["state"].as_str().unwrap_or("?");
        let effective = m["effective_state"].as_str().unwrap_or(state);
        t.row(vec![
            num(&m["address"]),
            num(&m["health"]),
            match (effective != state, m["elastic"].as_str()) {
                // An elastic pool's standby member: out until it joins.
                (_, Some(e)) if effective == state => format!("{state} (standby, {e})"),
                (true, _) => format!("{state} ({effective})"),
                _ => state.to_string(),
            },
            num(&m["weight"]),
            m["effective_weight"]
                .as_f64()
                .map_or("-".into(), |w| format!("{w:.2}")),
            num(&m["active_connections"]),
            num(&m["connections_total"]),
            num(&m["requests_total"]),
            num(&m["connect_failures"]),
            m["response_time_ms"]
                .as_f64()
                .map_or("-".into(), |w| format!("{w:.2}")),
            last_check(m),
        ]);
    }
    t.render()
}

fn pool_heading(p: &Value) -> String {
    let members = p["members"].as_array().map_or(0, Vec::len);
    let up = p["members"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["health"] == "up").count());
    format!(
        "pool {}  ({}, {} of {} up, {} available, {} turned away)",
        p["name"].as_str().unwrap_or("?"),
        p["algorithm"].as_str().unwrap_or("?"),
        up,
        members,
        num(&p["available"]),
        num(&p["no_member"]),
    ) + &p["elastic"]
        .as_object()
        .map(|e| {
            format!(
                "  elastic {}: {:.0}% (join {:.0}%, leave {:.0}%), {} of {} standby joined",
                e.get("on").and_then(Value::as_str).unwrap_or("?"),
                e.get("utilisation").and_then(Value::as_f64).unwrap_or(0.0) * 100.0,
                e.get("join").and_then(Value::as_f64).unwrap_or(0.0) * 100.0,
                e.get("leave").and_then(Value::as_f64).unwrap_or(0.0) * 100.0,
                e.get("joined").and_then(Value::as_u64).unwrap_or(0),
                e.get("standby").and_then(Value::as_u64).unwrap_or(0),
            )
        })
        .unwrap_or_default()
}

pub fn status(t: &Target) -> Result<(), Failure> {
    let c = Client::new(t)?;
    let status = c.call("GET", "/api/v1/status", None)?;
    let pools = c.call("GET", "/api/v1/pools", None)?;
    if t.json {
        print_json(&json!({ "status": status, "pools": pools["pools"] }));
        return Ok(());
    }
    println!(
        "fulcrum {} at {}  config generation {}\n",
        status["version"].as_str().unwrap_or("?"),
        c.addr(),
        num(&status["generation"])
    );
    let mut s = Table::new(&[
        ("SERVICE", false),
        ("PROTO", false),
        ("LISTEN", false),
        ("ACTIVE", true),
        ("CONNS", true),
        ("REQUESTS", true),
        ("NO_MEMBER", true),
        ("OVER_LIMIT", true),
        ("UPSTREAM_FAIL", true),
    ]);
    for v in status["virtual_services"].as_array().into_iter().flatten() {
        s.row(vec![
            num(&v["name"]),
            num(&v["protocol"]),
            v["listen"]
                .as_array()
                .map(|l| {
                    l.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default(),
            num(&v["connections_active"]),
            num(&v["connections_total"]),
            num(&v["requests_total"]),
            num(&v["no_member"]),
            num(&v["over_limit"]),
            num(&v["upstream_failures"]),
        ]);
    }
    print!("{}", s.render());
    let mut p = Table::new(&[
        ("POOL", false),
        ("ALGORITHM", false),
        ("UP", true),
        ("MEMBERS", true),
        ("AVAILABLE", true),
        ("DOWN", false),
    ]);
    for pool in pools["pools"].as_array().into_iter().flatten() {
        let members = pool["members"].as_array().cloned().unwrap_or_default();
        let down: Vec<&str> = members
            .iter()
            .filter(|m| m["health"] != "up")
            .filter_map(|m| m["address"].as_str())
            .collect();
        p.row(vec![
            num(&pool["name"]),
            num(&pool["algorithm"]),
            (members.len() - down.len()).to_string(),
            members.len().to_string(),
            num(&pool["available"]),
            if down.is_empty() {
                "-".into()
            } else {
                down.join(",")
            },
        ]);
    }
    println!();
    print!("{}", p.render());
    Ok(())
}

pub fn pools(t: &Target, name: Option<&str>) -> Result<(), Failure> {
    let c = Client::new(t)?;
    let pools: Vec<Value> = match name {
        Some(n) => vec![c.call("GET", &format!("/api/v1/pools/{}", escape(n)), None)?],
        None => c.call("GET", "/api/v1/pools", None)?["pools"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
    };
    if t.json {
        match name {
            Some(_) => print_json(&pools[0]),
            None => print_json(&json!({ "pools": pools })),
        }
        return Ok(());
    }
    for (i, p) in pools.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("{}", pool_heading(p));
        print!("{}", members_table(p));
    }
    Ok(())
}

/// Percent-encodes what may not stand in a path segment (`[`, `]`, `/`, `%`, spaces, …).
fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

pub fn member(t: &Target, cmd: &MemberCommand) -> Result<(), Failure> {
    let c = Client::new(t)?;
    let (pool, address, what, body) = match cmd {
        MemberCommand::Drain { pool, address } => {
            (pool, address, "state", json!({ "state": "drain" }))
        }
        MemberCommand::Enable { pool, address } => {
            (pool, address, "state", json!({ "state": "enabled" }))
        }
        MemberCommand::Disable { pool, address } => {
            (pool, address, "state", json!({ "state": "disabled" }))
        }
        MemberCommand::Weight {
            pool,
            address,
            weight,
        } => (pool, address, "weight", json!({ "weight": weight })),
    };
    let base = format!("/api/v1/pools/{}/members/{}", escape(pool), escape(address));
    let before = c.call("GET", &base, None)?;
    let after = c.call("PUT", &format!("{base}/{what}"), Some(body))?;
    if t.json {
        print_json(&after);
        return Ok(());
    }
    let field = if what == "state" { "state" } else { "weight" };
    println!(
        "pool {pool} member {}: {field} {} -> {}  (health {}, {} active connections)",
        num(&after["address"]),
        num(&before[field]),
        num(&after[field]),
        num(&after["health"]),
        num(&after["active_connections"]),
    );
    Ok(())
}

pub fn reload(t: &Target) -> Result<(), Failure> {
    let c = Client::new(t)?;
    let r = c.call("POST", "/api/v1/reload", Some(json!({})))?;
    if t.json {
        print_json(&r);
    } else {
        println!("reloaded: config generation {}", num(&r["generation"]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_and_numbers_right() {
        let mut t = Table::new(&[("NAME", false), ("N", true)]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec!["longer".into(), "100".into()]);
        assert_eq!(t.render(), "NAME      N\na         1\nlonger  100\n");
    }

    #[test]
    fn escape_keeps_addresses_readable() {
        assert_eq!(escape("127.0.0.1:80"), "127.0.0.1:80");
        assert_eq!(escape("[::1]:80"), "%5B::1%5D:80");
        assert_eq!(escape("a/b c"), "a%2Fb%20c");
    }
}

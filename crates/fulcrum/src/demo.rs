//! `fulcrum demo`: three built-in HTTP backends behind a weighted HTTP virtual service (L7:
//! forwarding headers, member connection reuse, a content-switching rule), with an HTTP health
//! monitor and slow start — Fulcrum's main job on a built-in config, no file needed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use crate::app::{self, Source};

fn config_text(
    listen: SocketAddr,
    admin: SocketAddr,
    token_file: &Path,
    backends: &[(SocketAddr, u32)],
) -> String {
    let mut members = String::new();
    for (addr, weight) in backends {
        members.push_str(&format!(
            "\n[[pool.member]]\naddress = \"{addr}\"\nweight = {weight}\n"
        ));
    }
    let token_file = token_file.display();
    format!(
        r#"# The demo configuration (fulcrum demo). Save it to a file to run it with `fulcrum run -c`.
[admin]
listen = "{admin}"
# Mutating calls need this file's bearer token (generated on first use, mode 0600).
token_file = "{token_file}"

[[virtual_service]]
name = "demo"
listen = ["{listen}"]
protocol = "http"
pool = "demo"

# Content switching: this path is answered by Fulcrum itself; everything else goes to the pool.
[[virtual_service.rule]]
name = "about"
path_prefix = "/fulcrum"
respond = 200
body = "answered by Fulcrum's content-switching rule \"about\"\n"

[[pool]]
name = "demo"
algorithm = "weighted_round_robin"
monitors = ["demo-http"]
slow_start = {{ recovery = "2s", warm = "10s" }}
{members}
[[monitor]]
name = "demo-http"
type = "http"
path = "/health"
interval = "1s"
timeout = "500ms"
rise = 2
fall = 2
"#
    )
}

pub fn run(listen: SocketAddr, admin: SocketAddr) -> ExitCode {
    // The backends' sockets are bound (port 0: the kernel's choice) and kept before the
    // configuration is written, so no other process can take an address between the two.
    let mut listeners = Vec::new();
    for _ in 0..3 {
        match bind_backend() {
            Ok(l) => listeners.push(l),
            Err(e) => {
                eprintln!("cannot start a demo backend on 127.0.0.1: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let backends: Vec<(SocketAddr, u32)> = listeners.iter().map(|l| l.1).zip([3, 2, 1]).collect();
    // The demo's token lives in a per-user temporary directory, not in /var/lib/fulcrum, so the
    // demo runs without root; it is read here first to show it in the banner.
    let token_dir =
        TokenDir(std::env::temp_dir().join(format!("fulcrum-demo-{}", std::process::id())));
    let token_file = token_dir.0.join("admin.token");
    let token = match crate::admin::secret_file(&token_file, "admin.token_file") {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let text = config_text(listen, admin, &token_file, &backends);
    let source = Source::Inline {
        name: "<demo>".into(),
        text: text.clone(),
    };
    let config = match source.load() {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                eprintln!("{e}");
            }
            return ExitCode::FAILURE;
        }
    };
    let first = backends[0].0;
    let setup = move || async move {
        for (i, (listener, addr)) in listeners.into_iter().enumerate() {
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|e| format!("cannot start demo backend on {addr}: {e}"))?;
            tokio::spawn(serve_backend(
                listener,
                Arc::from(format!("backend-{}", i + 1)),
            ));
        }
        println!("{}", banner(listen, admin, first, &token, &text));
        Ok(())
    };
    app::run_blocking(source, config, setup)
}

/// The demo's token directory, removed when the demo ends (it is only valid for this process).
struct TokenDir(std::path::PathBuf);

impl Drop for TokenDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn banner(
    listen: SocketAddr,
    admin: SocketAddr,
    first: SocketAddr,
    token: &str,
    text: &str,
) -> String {
    format!(
        r#"
Fulcrum demo: three HTTP backends (weights 3:2:1) behind the HTTP virtual service {listen}.

Try:
  for i in $(seq 6); do curl -s http://{listen}/; done     # backend-1 three times, backend-2 twice, backend-3 once
  curl -s http://{listen}/fulcrum                          # a rule answers this path itself
  curl -s http://{admin}/api/v1/pools/demo | grep -o '"connections_total":[0-9]*'   # few member connections: reuse
  curl -s http://{admin}/api/v1/status
  curl -s http://{admin}/api/v1/pools/demo
  TOKEN={token}     # mutating calls need it
  curl -s -X PUT -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' -d '{{"state":"drain"}}' http://{admin}/api/v1/pools/demo/members/{first}/state
  curl -s -X PUT -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' -d '{{"weight":5}}' http://{admin}/api/v1/pools/demo/members/{first}/weight
  curl -s http://{admin}/metrics | grep fulcrum_member_requests_total

Ctrl-C stops. The configuration in use:

{text}"#
    )
}

// The demo's backends live here rather than in fulcrum-testkit: the test kit is a
// dev-dependency only (it brings test servers, namespace labs and fixtures a product build must
// not carry), and the demo needs no more of a backend than the few lines below.

/// A listening socket for one demo backend on a free loopback port, and its address.
fn bind_backend() -> std::io::Result<(std::net::TcpListener, SocketAddr)> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}

/// One demo backend, until the runtime ends: HTTP/1.1 with keep-alive. `/health` (the demo's
/// monitor) answers 200 "OK"; every other request 200 with the backend's name as the body and
/// in `X-Server`, so the client sees which member answered.
async fn serve_backend(listener: tokio::net::TcpListener, name: Arc<str>) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of file descriptors or the like: try again shortly rather than spin.
                tracing::warn!(backend = %name, error = %e, "demo backend cannot accept");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let name = name.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let name = name.clone();
                async move { Ok::<_, Infallible>(backend_answer(&req, &name)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn backend_answer(req: &Request<Incoming>, name: &str) -> Response<Full<Bytes>> {
    let mut response = if req.uri().path() == "/health" {
        Response::new(Full::new(Bytes::from_static(b"OK\n")))
    } else {
        let mut r = Response::new(Full::new(Bytes::from(format!("{name}\n"))));
        if let Ok(v) = hyper::header::HeaderValue::from_str(name) {
            r.headers_mut().insert("x-server", v);
        }
        r
    };
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    response
}

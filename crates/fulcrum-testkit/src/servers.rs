//! Backends: a TCP server that says who it is, an HTTP backend, an agent-check server.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Live connection tasks of a server, aborted together when it stops (a killed member).
#[derive(Default, Clone)]
struct Tasks(Arc<Mutex<Vec<JoinHandle<()>>>>);

impl Tasks {
    fn push(&self, t: JoinHandle<()>) {
        if let Ok(mut v) = self.0.lock() {
            v.retain(|t| !t.is_finished());
            v.push(t);
        }
    }
    fn abort_all(&self) {
        if let Ok(mut v) = self.0.lock() {
            for t in v.drain(..) {
                t.abort();
            }
        }
    }
}

/// A TCP server that writes its name and a newline on every connection, then echoes what it
/// receives until the client ends. A PROXY protocol header (v1 or v2) at the start of a
/// connection is recorded and not echoed.
pub struct TcpIdServer {
    pub addr: SocketAddr,
    pub name: String,
    connections: Arc<AtomicU64>,
    active: Arc<AtomicU64>,
    proxy_headers: Arc<Mutex<Vec<Vec<u8>>>>,
    accept: JoinHandle<()>,
    tasks: Tasks,
}

impl Drop for TcpIdServer {
    fn drop(&mut self) {
        self.accept.abort();
        self.tasks.abort_all();
    }
}

struct ActiveGuard(Arc<AtomicU64>);
impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Splits a PROXY protocol header off the start of `buf`, if there is a complete one.
pub(crate) fn split_proxy_header(buf: &[u8]) -> Option<usize> {
    const V2: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";
    if buf.starts_with(b"PROXY ") {
        return buf.windows(2).position(|w| w == b"\r\n").map(|p| p + 2);
    }
    if buf.len() >= 16 && buf.starts_with(V2) {
        let len = u16::from_be_bytes([buf[14], buf[15]]) as usize;
        return (buf.len() >= 16 + len).then_some(16 + len);
    }
    None
}

impl TcpIdServer {
    pub async fn start(addr: SocketAddr, name: &str) -> io::Result<TcpIdServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let connections = Arc::new(AtomicU64::new(0));
        let active = Arc::new(AtomicU64::new(0));
        let proxy_headers = Arc::new(Mutex::new(Vec::new()));
        let tasks = Tasks::default();
        let (c, a, ph, t, n) = (
            connections.clone(),
            active.clone(),
            proxy_headers.clone(),
            tasks.clone(),
            name.to_string(),
        );
        let accept = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::Relaxed);
                a.fetch_add(1, Ordering::Relaxed);
                let guard = ActiveGuard(a.clone());
                let (ph, n) = (ph.clone(), n.clone());
                t.push(tokio::spawn(async move {
                    let _guard = guard;
                    let _ = serve_id(&mut s, &n, &ph).await;
                }));
            }
        });
        Ok(TcpIdServer {
            addr,
            name: name.to_string(),
            connections,
            active,
            proxy_headers,
            accept,
            tasks,
        })
    }

    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// PROXY protocol headers received so far, raw.
    pub fn proxy_headers(&self) -> Vec<Vec<u8>> {
        self.proxy_headers
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// Stops listening and cuts every open connection, like a crashed server.
    pub fn kill(&self) {
        self.accept.abort();
        self.tasks.abort_all();
    }
}

async fn serve_id(s: &mut TcpStream, name: &str, headers: &Mutex<Vec<Vec<u8>>>) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.write_all(format!("{name}\n").as_bytes()).await?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut first = true;
    let mut pending = Vec::new();
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            s.shutdown().await?;
            return Ok(());
        }
        if first {
            pending.extend_from_slice(&buf[..n]);
            let could_be_header =
                pending.starts_with(b"PROXY ") || pending.starts_with(b"\r\n\r\n");
            if could_be_header && pending.len() < 256 {
                if let Some(end) = split_proxy_header(&pending) {
                    if let Ok(mut h) = headers.lock() {
                        h.push(pending[..end].to_vec());
                    }
                    pending.drain(..end);
                } else {
                    continue;
                }
            }
            first = false;
            s.write_all(&pending).await?;
            pending = Vec::new();
            continue;
        }
        s.write_all(&buf[..n]).await?;
    }
}

/// An HTTP/1.1 backend. `GET /health` answers 200 "OK" while healthy and 503 otherwise; every
/// other request answers 200 with the backend's name as body and an `X-Server` header.
pub struct HttpBackend {
    pub addr: SocketAddr,
    pub name: String,
    healthy: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    accept: JoinHandle<()>,
    tasks: Tasks,
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.accept.abort();
        self.tasks.abort_all();
    }
}

impl HttpBackend {
    pub async fn start(addr: SocketAddr, name: &str) -> io::Result<HttpBackend> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let healthy = Arc::new(AtomicBool::new(true));
        let requests = Arc::new(AtomicU64::new(0));
        let tasks = Tasks::default();
        let (h, r, t, n) = (
            healthy.clone(),
            requests.clone(),
            tasks.clone(),
            Arc::<str>::from(name),
        );
        let accept = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let (h, r, n) = (h.clone(), r.clone(), n.clone());
                t.push(tokio::spawn(async move {
                    let _ = s.set_nodelay(true);
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (h, r, n) = (h.clone(), r.clone(), n.clone());
                        async move { Ok::<_, Infallible>(respond(req, &n, &h, &r).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .with_upgrades()
                        .await;
                }));
            }
        });
        Ok(HttpBackend {
            addr,
            name: name.to_string(),
            healthy,
            requests,
            accept,
            tasks,
        })
    }

    pub fn set_healthy(&self, up: bool) {
        self.healthy.store(up, Ordering::Relaxed);
    }

    /// Requests served, `/health` excluded.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub fn kill(&self) {
        self.accept.abort();
        self.tasks.abort_all();
    }
}

async fn respond(
    req: Request<Incoming>,
    name: &str,
    healthy: &AtomicBool,
    requests: &AtomicU64,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    if path == "/health" {
        let up = healthy.load(Ordering::Relaxed);
        return Response::builder()
            .status(if up { 200 } else { 503 })
            .body(Full::new(Bytes::from_static(if up {
                b"OK\n"
            } else {
                b"DOWN\n"
            })))
            .unwrap_or_default();
    }
    requests.fetch_add(1, Ordering::Relaxed);
    let body = if path == "/echo" {
        let mut text = format!("{} {} {:?}\n", req.method(), req.uri(), req.version());
        for (k, v) in req.headers() {
            text.push_str(&format!(
                "{}: {}\n",
                k,
                String::from_utf8_lossy(v.as_bytes())
            ));
        }
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        text.push('\n');
        text.push_str(&String::from_utf8_lossy(&body));
        text
    } else {
        format!("{name}\n")
    };
    Response::builder()
        .header("X-Server", name)
        .header("Content-Type", "text/plain")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

/// An agent-check server (HAProxy's agent protocol): answers every connection with its current
/// reply line and closes.
pub struct AgentServer {
    pub addr: SocketAddr,
    reply: Arc<Mutex<String>>,
    accept: JoinHandle<()>,
}

impl Drop for AgentServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl AgentServer {
    pub async fn start(addr: SocketAddr, reply: &str) -> io::Result<AgentServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let reply = Arc::new(Mutex::new(reply.to_string()));
        let r = reply.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let line = r.lock().map(|r| format!("{r}\n")).unwrap_or_default();
                tokio::spawn(async move {
                    let _ = s.write_all(line.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Ok(AgentServer {
            addr,
            reply,
            accept,
        })
    }

    pub fn set_reply(&self, reply: &str) {
        if let Ok(mut r) = self.reply.lock() {
            *r = reply.to_string();
        }
    }
}

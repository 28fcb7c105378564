//! Backends: a TCP server that says who it is, an HTTP backend, an agent-check server.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
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
        let listener = crate::bind_tcp(addr).await?;
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

/// An HTTP/1.1 backend (hyper, keep-alive). `GET /health` answers 200 "OK" while healthy and 503
/// otherwise; other paths:
///
/// | path | answer |
/// |---|---|
/// | `/echo` | the request line, fields and body as text |
/// | `/conn` | `NAME conn=N`: N numbers the backend's connections from 1 |
/// | `/status/NNN` | status NNN |
/// | `/delay/MS` | waits MS milliseconds first |
/// | `/set-cookie/NAME/VALUE` | `Set-Cookie: NAME=VALUE; Path=/` |
/// | `/redirect/PATH` | 302 to `http://ADDR/PATH`, the backend's own address |
/// | `/chunked/N` | N lines sent as separate chunks |
/// | `/bytes/N` | N bytes |
/// | `/slow/N/MS` | N lines, one every MS milliseconds |
/// | any, with `Connection: upgrade` and `Upgrade: P` | 101, then echoes the bytes it receives |
///
/// and anything else answers 200 with the backend's name as body. Every answer carries
/// `X-Server: NAME`; `set_status` forces a status for all but `/health`.
pub struct HttpBackend {
    pub addr: SocketAddr,
    pub name: String,
    healthy: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
    status: Arc<std::sync::atomic::AtomicU16>,
    accept: JoinHandle<()>,
    tasks: Tasks,
}

impl Drop for HttpBackend {
    fn drop(&mut self) {
        self.accept.abort();
        self.tasks.abort_all();
    }
}

#[derive(Clone)]
struct BackendState {
    name: Arc<str>,
    addr: SocketAddr,
    healthy: Arc<AtomicBool>,
    requests: Arc<AtomicU64>,
    status: Arc<std::sync::atomic::AtomicU16>,
}

type BackendBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

impl HttpBackend {
    pub async fn start(addr: SocketAddr, name: &str) -> io::Result<HttpBackend> {
        let listener = crate::bind_tcp(addr).await?;
        let addr = listener.local_addr()?;
        let state = BackendState {
            name: Arc::from(name),
            addr,
            healthy: Arc::new(AtomicBool::new(true)),
            requests: Arc::new(AtomicU64::new(0)),
            status: Arc::new(std::sync::atomic::AtomicU16::new(0)),
        };
        let connections = Arc::new(AtomicU64::new(0));
        let tasks = Tasks::default();
        let (st, t, c) = (state.clone(), tasks.clone(), connections.clone());
        let accept = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let conn = c.fetch_add(1, Ordering::Relaxed) + 1;
                let st = st.clone();
                t.push(tokio::spawn(async move {
                    let _ = s.set_nodelay(true);
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(respond(req, &st, conn).await) }
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
            healthy: state.healthy,
            requests: state.requests,
            connections,
            status: state.status,
            accept,
            tasks,
        })
    }

    pub fn set_healthy(&self, up: bool) {
        self.healthy.store(up, Ordering::Relaxed);
    }

    /// Answers every request but `/health` with `status` (0 restores normal answers).
    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::Relaxed);
    }

    /// Requests served, `/health` excluded.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn kill(&self) {
        self.accept.abort();
        self.tasks.abort_all();
    }
}

fn full(b: impl Into<Bytes>) -> BackendBody {
    use http_body_util::BodyExt;
    Full::new(b.into()).boxed()
}

async fn respond(req: Request<Incoming>, st: &BackendState, conn: u64) -> Response<BackendBody> {
    use http_body_util::BodyExt;
    let name = &*st.name;
    let path = req.uri().path().to_string();
    if path == "/health" {
        let up = st.healthy.load(Ordering::Relaxed);
        return Response::builder()
            .status(if up { 200 } else { 503 })
            .body(full(if up { &b"OK\n"[..] } else { &b"DOWN\n"[..] }))
            .unwrap_or_default();
    }
    st.requests.fetch_add(1, Ordering::Relaxed);
    let forced = st.status.load(Ordering::Relaxed);
    let builder = Response::builder()
        .header("X-Server", name)
        .header("Content-Type", "text/plain");
    if forced != 0 {
        return builder
            .status(forced)
            .body(full(format!("{name}\n")))
            .unwrap_or_default();
    }
    let upgrade = req
        .headers()
        .get("connection")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("upgrade"));
    if upgrade {
        let proto = req
            .headers()
            .get("upgrade")
            .cloned()
            .unwrap_or(hyper::header::HeaderValue::from_static("echo"));
        tokio::spawn(async move {
            if let Ok(up) = hyper::upgrade::on(req).await {
                let mut io = TokioIo::new(up);
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        return Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", proto)
            .body(full(Bytes::new()))
            .unwrap_or_default();
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["echo", ..] => {
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
            builder.body(full(text)).unwrap_or_default()
        }
        ["conn"] => builder
            .body(full(format!("{name} conn={conn}\n")))
            .unwrap_or_default(),
        ["status", code] => builder
            .status(code.parse::<u16>().unwrap_or(500))
            .body(full(format!("{name}\n")))
            .unwrap_or_default(),
        ["delay", ms] => {
            tokio::time::sleep(std::time::Duration::from_millis(ms.parse().unwrap_or(0))).await;
            builder.body(full(format!("{name}\n"))).unwrap_or_default()
        }
        ["set-cookie", cookie, value] => builder
            .header("Set-Cookie", format!("{cookie}={value}; Path=/"))
            .body(full(format!("{name}\n")))
            .unwrap_or_default(),
        ["redirect", rest @ ..] => builder
            .status(302)
            .header("Location", format!("http://{}/{}", st.addr, rest.join("/")))
            .body(full(Bytes::new()))
            .unwrap_or_default(),
        ["bytes", n] => builder
            .body(full(vec![b'x'; n.parse().unwrap_or(0)]))
            .unwrap_or_default(),
        ["chunked", n] | ["slow", n, ..] => {
            let n: usize = n.parse().unwrap_or(0);
            let every = match parts.as_slice() {
                ["slow", _, ms] => std::time::Duration::from_millis(ms.parse().unwrap_or(0)),
                _ => std::time::Duration::ZERO,
            };
            let (mut tx, body) = http_body_util::channel::Channel::<Bytes, Infallible>::new(4);
            let name = name.to_string();
            tokio::spawn(async move {
                for i in 0..n {
                    if !every.is_zero() {
                        tokio::time::sleep(every).await;
                    }
                    if tx
                        .send_data(Bytes::from(format!("{name} chunk {i}\n")))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
            builder.body(body.boxed()).unwrap_or_default()
        }
        _ => builder.body(full(format!("{name}\n"))).unwrap_or_default(),
    }
}

/// A member that speaks raw bytes: it records what each connection sent and answers as told.
/// For checking exactly what the proxy forwards (smuggling tests) and for misbehaving members.
pub struct RawBackend {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Vec<u8>>>>,
    connections: Arc<AtomicU64>,
    accept: JoinHandle<()>,
    tasks: Tasks,
}

/// What a `RawBackend` does once a request head (up to an empty line) has arrived.
#[derive(Debug, Clone)]
pub enum RawBehaviour {
    /// Writes these bytes after each request head, keeping the connection.
    Reply(Vec<u8>),
    /// Writes `reply` each time `marker` has arrived (e.g. the last chunk of a chunked body),
    /// instead of after each head: a member that answers only once it has the whole body.
    ReplyOn { marker: Vec<u8>, reply: Vec<u8> },
    /// Resets the connection (RST) without a byte.
    Reset,
    /// Never answers.
    Silent,
}

impl Drop for RawBackend {
    fn drop(&mut self) {
        self.accept.abort();
        self.tasks.abort_all();
    }
}

impl RawBackend {
    pub async fn start(addr: SocketAddr, behaviour: RawBehaviour) -> io::Result<RawBackend> {
        let listener = crate::bind_tcp(addr).await?;
        let addr = listener.local_addr()?;
        let received = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicU64::new(0));
        let tasks = Tasks::default();
        let (r, c, t) = (received.clone(), connections.clone(), tasks.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let idx = c.fetch_add(1, Ordering::Relaxed) as usize;
                if let Ok(mut v) = r.lock() {
                    v.push(Vec::new());
                }
                let (r, b) = (r.clone(), behaviour.clone());
                t.push(tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut pending = Vec::new();
                    loop {
                        let n = match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if let Ok(mut v) = r.lock() {
                            if let Some(c) = v.get_mut(idx) {
                                c.extend_from_slice(&buf[..n]);
                            }
                        }
                        pending.extend_from_slice(&buf[..n]);
                        let marker: &[u8] = match &b {
                            RawBehaviour::ReplyOn { marker, .. } => marker,
                            _ => b"\r\n\r\n",
                        };
                        while let Some(end) =
                            pending.windows(marker.len()).position(|w| w == marker)
                        {
                            pending.drain(..end + marker.len());
                            match &b {
                                RawBehaviour::Reply(bytes)
                                | RawBehaviour::ReplyOn { reply: bytes, .. } => {
                                    if s.write_all(bytes).await.is_err() {
                                        return;
                                    }
                                }
                                RawBehaviour::Reset => {
                                    let _ = s.set_zero_linger();
                                    return;
                                }
                                RawBehaviour::Silent => {}
                            }
                        }
                    }
                }));
            }
        });
        Ok(RawBackend {
            addr,
            received,
            connections,
            accept,
            tasks,
        })
    }

    /// The bytes each connection sent, in accept order.
    pub fn received(&self) -> Vec<Vec<u8>> {
        self.received.lock().map(|v| v.clone()).unwrap_or_default()
    }

    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
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
        let listener = crate::bind_tcp(addr).await?;
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

/// An address whose connects hang: a listening socket with a backlog of 0, its queue filled by
/// one connection nobody accepts, so the kernel drops further SYNs. For connect timeouts.
pub struct Blackhole {
    pub addr: SocketAddr,
    _listener: std::net::TcpListener,
    _filler: std::net::TcpStream,
}

impl Blackhole {
    pub fn start() -> io::Result<Blackhole> {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())?;
        sock.listen(0)?;
        let listener: std::net::TcpListener = sock.into();
        let addr = listener.local_addr()?;
        let filler =
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1))?;
        Ok(Blackhole {
            addr,
            _listener: listener,
            _filler: filler,
        })
    }
}

//! Servers and helpers for the tests: real sockets on 127.0.0.1, ephemeral ports.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fulcrum_config::{Monitor, MonitorKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::task::Task;

/// A monitor of `kind` with short test timings; rise and fall 1.
pub(crate) fn monitor(name: &str, kind: MonitorKind) -> Monitor {
    Monitor {
        name: name.into(),
        kind,
        interval: Duration::from_millis(200),
        timeout: Duration::from_millis(200),
        rise: 1,
        fall: 1,
        port: None,
        path: "/".into(),
        method: "GET".into(),
        host: None,
        expect_status: Vec::new(),
        expect_body: None,
        send: None,
        expect: None,
        query: None,
        query_type: "A".into(),
        expect_rcode: "NOERROR".into(),
        expect_answer: None,
        secret: None,
        username: None,
        password: None,
        newsgroup: None,
        snmp: Default::default(),
        weight_share: 1,
        link: Default::default(),
    }
}

/// A listener that hands each connection to `handler`, counting and timing the accepts. Dropping
/// it closes the listener.
pub(crate) struct Server {
    pub addr: SocketAddr,
    accepted: Arc<Mutex<Vec<Instant>>>,
    _task: Task,
}

impl Server {
    pub async fn start<F, Fut>(handler: F) -> Server
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::on(listener, handler)
    }

    pub fn on<F, Fut>(listener: TcpListener, handler: F) -> Server
    where
        F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let addr = listener.local_addr().unwrap();
        let accepted: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let log = accepted.clone();
        let task = Task::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                log.lock().unwrap().push(Instant::now());
                tokio::spawn(handler(stream));
            }
        });
        Server {
            addr,
            accepted,
            _task: task,
        }
    }

    /// Accepts only; the connection is dropped.
    pub async fn accept_only() -> Server {
        Self::start(|_s| async {}).await
    }

    /// Answers every request with `response`, read from the returned closure per connection.
    pub async fn http(response: impl Fn() -> Vec<u8> + Send + Sync + 'static) -> Server {
        let response = Arc::new(response);
        Self::start(move |mut s| {
            let response = response.clone();
            async move {
                read_head(&mut s).await;
                let _ = s.write_all(&response()).await;
            }
        })
        .await
    }

    pub fn count(&self) -> usize {
        self.accepted.lock().unwrap().len()
    }

    pub fn accept_times(&self) -> Vec<Instant> {
        self.accepted.lock().unwrap().clone()
    }
}

/// Reads a request head (up to the blank line, EOF or 16 KiB).
pub(crate) async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") && buf.len() < 16384 {
        match s.read(&mut byte).await {
            Ok(1) => buf.push(byte[0]),
            _ => break,
        }
    }
    buf
}

/// Writes `parts` one by one with a pause between, so the reader sees them in separate reads.
pub(crate) async fn write_slowly<S: AsyncWrite + Unpin>(s: &mut S, parts: &[&[u8]]) {
    for p in parts {
        if s.write_all(p).await.is_err() || s.flush().await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An address nothing listens on (a free port, never bound by the test).
pub(crate) fn refused_addr() -> SocketAddr {
    // Below the ephemeral range: a port the kernel handed out and took back could become the
    // source port of a concurrent test's connect, and a check to it a self-connection.
    fulcrum_testkit::free_addr()
}

/// Polls `cond` every 10 ms until it holds; panics with `what` after `within`.
pub(crate) async fn wait_until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A self-signed certificate for "localhost", made at test time, as a TLS acceptor.
pub(crate) fn tls_acceptor() -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let key = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = CertificateDer::from(key.cert.der().to_vec());
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.key_pair.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], private)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// An HTTPS server answering `response`; records the SNI each client sent.
pub(crate) async fn https_server(
    response: &'static [u8],
) -> (Server, Arc<Mutex<Vec<Option<String>>>>) {
    let acceptor = tls_acceptor();
    let sni: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let seen = sni.clone();
    let server = Server::start(move |s| {
        let acceptor = acceptor.clone();
        let seen = seen.clone();
        async move {
            let Ok(mut tls) = acceptor.accept(s).await else {
                return;
            };
            let name = tls.get_ref().1.server_name().map(str::to_string);
            seen.lock().unwrap().push(name);
            read_head(&mut tls).await;
            let _ = tls.write_all(response).await;
            let _ = tls.shutdown().await;
        }
    })
    .await;
    (server, sni)
}

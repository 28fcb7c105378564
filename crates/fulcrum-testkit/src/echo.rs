//! A member that speaks HTTP/1.1 and HTTP/2 (prior knowledge) on one port and answers each
//! request with what it received: protocol, method, path, the body's length and a checksum of
//! it. Tests that must hold for every client × member protocol pair compare these answers.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::task::JoinHandle;

/// The echo member; stops when dropped.
pub struct EchoMember {
    pub addr: SocketAddr,
    requests: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Drop for EchoMember {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The answer an echo member gives to a request: `"<protocol> <method> <path> <length>
/// <checksum>"`, e.g. `HTTP/2.0 POST /up 70000 2f6c3a11`.
pub fn echo_line(protocol: &str, method: &str, path: &str, body: &[u8]) -> String {
    format!(
        "{protocol} {method} {path} {} {:08x}",
        body.len(),
        checksum(body)
    )
}

/// FNV-1a over the body: enough to see that every byte arrived, in order.
pub fn checksum(body: &[u8]) -> u32 {
    body.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

impl EchoMember {
    pub async fn start(addr: SocketAddr) -> io::Result<EchoMember> {
        let listener = crate::bind_tcp(addr).await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let counted = requests.clone();
        let accept = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let counted = counted.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let counted = counted.clone();
                        async move {
                            counted.fetch_add(1, Ordering::Relaxed);
                            let (parts, body) = req.into_parts();
                            let body = match body.collect().await {
                                Ok(b) => b.to_bytes(),
                                Err(_) => Bytes::from_static(b"(body cut)"),
                            };
                            let line = echo_line(
                                &format!("{:?}", parts.version),
                                parts.method.as_str(),
                                parts.uri.path(),
                                &body,
                            );
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(line))))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(EchoMember {
            addr,
            requests,
            accept,
        })
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

//! A member whose every answer the test decides: status, header fields, body and delay, per
//! request, and which records the requests it gets (for cache tests: how many reached it, with
//! which conditional fields).

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;

/// A request as the origin saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An answer the test scripts.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Wait this long between the head and the body (the head goes out at once).
    pub body_delay: Duration,
    /// Send the body chunked (no Content-Length), in pieces of 1000 bytes.
    pub chunked: bool,
}

impl Reply {
    /// A 200 with `body` and the given fields.
    pub fn ok(body: &str, headers: &[(&str, &str)]) -> Reply {
        Reply::status(200, body, headers)
    }

    pub fn status(status: u16, body: &str, headers: &[(&str, &str)]) -> Reply {
        Reply {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.as_bytes().to_vec(),
            delay: Duration::ZERO,
            body_delay: Duration::ZERO,
            chunked: false,
        }
    }
}

type Handler = Arc<dyn Fn(&Seen, usize) -> Reply + Send + Sync>;

/// The scripted origin server (HTTP/1.1, keep-alive).
pub struct Origin {
    pub addr: SocketAddr,
    seen: Arc<parking_lot_free::Mutex<Vec<Seen>>>,
    handler: Arc<parking_lot_free::Mutex<Handler>>,
    accept: JoinHandle<()>,
}

/// std's mutex under a short name (the testkit has no parking_lot).
mod parking_lot_free {
    pub struct Mutex<T>(std::sync::Mutex<T>);
    impl<T> Mutex<T> {
        pub fn new(v: T) -> Self {
            Mutex(std::sync::Mutex::new(v))
        }
        pub fn lock(&self) -> std::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Origin {
    /// Starts on `addr`; `handler` gets each request and its index (0 for the first).
    pub async fn start(
        addr: SocketAddr,
        handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static,
    ) -> io::Result<Origin> {
        let listener = crate::bind_tcp(addr).await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(parking_lot_free::Mutex::new(Vec::new()));
        let handler: Arc<parking_lot_free::Mutex<Handler>> =
            Arc::new(parking_lot_free::Mutex::new(Arc::new(handler)));
        let (s, h) = (seen.clone(), handler.clone());
        let accept = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let (s, h) = (s.clone(), h.clone());
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (s, h) = (s.clone(), h.clone());
                        async move {
                            let seen = Seen {
                                method: req.method().to_string(),
                                path: req
                                    .uri()
                                    .path_and_query()
                                    .map_or("/".into(), |p| p.to_string()),
                                headers: req
                                    .headers()
                                    .iter()
                                    .map(|(k, v)| {
                                        (
                                            k.to_string(),
                                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                                        )
                                    })
                                    .collect(),
                            };
                            let n = {
                                let mut v = s.lock();
                                v.push(seen.clone());
                                v.len() - 1
                            };
                            let handler = h.lock().clone();
                            let reply = handler(&seen, n);
                            if !reply.delay.is_zero() {
                                tokio::time::sleep(reply.delay).await;
                            }
                            let body = if reply.chunked {
                                Pieces(
                                    reply
                                        .body
                                        .chunks(1000)
                                        .map(Bytes::copy_from_slice)
                                        .collect(),
                                )
                            } else {
                                Pieces(std::iter::once(Bytes::from(reply.body)).collect())
                            };
                            let chunked = reply.chunked;
                            let wait = (!reply.body_delay.is_zero())
                                .then(|| Box::pin(tokio::time::sleep(reply.body_delay)));
                            let mut r = Response::new(OriginBody {
                                body,
                                chunked,
                                wait,
                            });
                            *r.status_mut() = hyper::StatusCode::from_u16(reply.status)
                                .unwrap_or(hyper::StatusCode::OK);
                            for (k, v) in &reply.headers {
                                if let (Ok(k), Ok(v)) = (
                                    hyper::header::HeaderName::from_bytes(k.as_bytes()),
                                    hyper::header::HeaderValue::from_str(v),
                                ) {
                                    r.headers_mut().append(k, v);
                                }
                            }
                            Ok::<_, Infallible>(r)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Origin {
            addr,
            seen,
            handler,
            accept,
        })
    }

    /// Replaces the handler.
    pub fn set(&self, handler: impl Fn(&Seen, usize) -> Reply + Send + Sync + 'static) {
        *self.handler.lock() = Arc::new(handler);
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }

    /// How many requests were received.
    pub fn count(&self) -> usize {
        self.seen.lock().len()
    }

    /// How many requests for `path` (path and query) were received.
    pub fn count_path(&self, path: &str) -> usize {
        self.seen.lock().iter().filter(|s| s.path == path).count()
    }
}

/// Body pieces, sent one per frame.
struct Pieces(std::collections::VecDeque<Bytes>);

struct OriginBody {
    body: Pieces,
    chunked: bool,
    /// `Reply::body_delay` still to wait before the first piece.
    wait: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Body for OriginBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(wait) = self.wait.as_mut() {
            std::task::ready!(std::future::Future::poll(wait.as_mut(), cx));
            self.wait = None;
        }
        std::task::Poll::Ready(self.body.0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        if self.chunked {
            SizeHint::default()
        } else {
            SizeHint::with_exact(self.body.0.iter().map(|b| b.len() as u64).sum())
        }
    }
}

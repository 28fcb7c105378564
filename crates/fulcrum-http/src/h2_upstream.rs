//! The HTTP/2 member session of an exchange (`http2 = true` on a pool): a request sent as a
//! stream on the member's shared connection (`upstream::H2Member`), through the same attempts
//! as every other request.

use bytes::Bytes;
use fulcrum_balance::{ConnectionGuard, Picked, RequestGuard};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::client::Client;
use crate::exchange::{Attempts, Failure, Route};
use crate::fields::{self, MapSink, ReqFraming, RequestCtx};
use crate::head::RequestHead;
use crate::local::Local;
use crate::upstream::UpBody;

/// A response from an HTTP/2 member, with what must live as long as its body.
pub struct H2Response {
    pub picked: Picked,
    pub response: http::Response<Incoming>,
    pub request_guard: RequestGuard,
    pub connection_guard: ConnectionGuard,
    pub sent: u64,
}

impl H2Response {
    /// The answer's head, and its body as a `Relay`: the request's bytes and the body's are
    /// added to the member's and the service's (`stats`) counters as it flows and at its end.
    pub fn into_relay(
        self,
        stats: std::sync::Arc<fulcrum_net::ServiceStats>,
    ) -> (http::response::Parts, crate::body::Relay) {
        let (parts, inner) = self.response.into_parts();
        let relay = crate::body::Relay {
            inner,
            member: self.picked.member.clone(),
            stats,
            sent: self.sent,
            received: 0,
            reported: 0,
            finished: false,
            _request: self.request_guard,
            _connection: self.connection_guard,
        };
        (parts, relay)
    }
}

/// A request body for an HTTP/2 member: `body` to send, `replay` a copy of it when it may be
/// sent again (no body or a buffered one), and its framing.
pub struct Outgoing {
    pub body: Option<UpBody>,
    pub replay: Option<Bytes>,
    pub framing: ReqFraming,
}

/// Sends a request to an HTTP/2 member of the route's pool through `attempts`: retries on
/// connect failures, and on refused streams for requests that can be sent again.
pub(crate) async fn exchange(
    route: Route<'_>,
    attempts: &mut Attempts<'_>,
    req: &RequestHead,
    client: &Client,
    out: Outgoing,
) -> Result<H2Response, Local> {
    let (svc, t, rule) = (&**route.svc, &**route.target, route.rule);
    let Outgoing {
        mut body,
        replay,
        framing,
    } = out;
    loop {
        let picked = attempts.next(req, client)?;
        let member = picked.member.clone();
        let Some(h2) = t.h2.get(picked.index) else {
            return Err(Local::error(502, "no HTTP/2 connection for the member"));
        };
        if attempts.fresh_only() {
            h2.reset();
        }
        let (mut sender, fresh) = match h2
            .sender(
                t.pool.connect_timeout,
                t.tls.as_deref(),
                svc.snat.as_deref(),
            )
            .await
        {
            Ok(s) => s,
            Err(e) => {
                attempts.failed(&picked, Failure::Connect(e))?;
                continue;
            }
        };
        let request_guard = member.open_request();
        let connection_guard = member.use_connection(fresh);

        let mut sink = MapSink::default();
        fields::write_request_fields(
            &mut sink,
            req,
            &RequestCtx {
                settings: svc.field_settings(),
                client,
                rule,
                framing,
                h2: true,
            },
        );
        let authority = sink
            .map
            .remove(http::header::HOST)
            .map(|h| h.as_bytes().to_vec())
            .unwrap_or_else(|| member.address.to_string().into_bytes());
        let mut target = Vec::with_capacity(64);
        fields::write_target(&mut target, req, rule);
        let uri = http::Uri::builder()
            .scheme("http")
            .authority(authority.as_slice())
            .path_and_query(target.as_slice())
            .build();
        let method = http::Method::from_bytes(req.method_bytes());
        let (Ok(uri), Ok(method)) = (uri, method) else {
            return Err(Local::error(
                400,
                "the request cannot be expressed in HTTP/2",
            ));
        };
        let this_body = match body.take() {
            Some(b) => b,
            None => match &replay {
                Some(b) if b.is_empty() => UpBody::Empty,
                Some(b) => UpBody::Full(Some(b.clone())),
                None => UpBody::Empty,
            },
        };
        let sent = replay.as_ref().map_or(0, |b| b.len() as u64);
        let mut request = http::Request::new(this_body);
        *request.method_mut() = method;
        *request.uri_mut() = uri;
        *request.headers_mut() = sink.map;
        let sent_at = Instant::now();
        let result = async {
            sender.ready().await?;
            sender.send_request(request).await
        };
        let failure = match tokio::time::timeout(t.response_timeout, result).await {
            Ok(Ok(response)) => {
                attempts.answered(&picked, response.status().as_u16(), sent_at.elapsed());
                return Ok(H2Response {
                    picked,
                    response,
                    request_guard,
                    connection_guard,
                    sent,
                });
            }
            Ok(Err(e)) => {
                // The shared connection is gone or refused the stream: the next request opens
                // another.
                h2.reset();
                Failure::Broken {
                    why: format!("HTTP/2 request: {e}"),
                    answered: false,
                    reused: !fresh,
                }
            }
            Err(_) => Failure::Timeout,
        };
        attempts.failed(&picked, failure)?;
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use parking_lot::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::client::{Alpn, ConnInfo};
    use crate::testing::service_to;

    /// A loopback HTTP/2 member (hyper's server): answers each request with its path, method
    /// and body read back, in three DATA frames; keeps what it saw.
    async fn h2_member() -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a member");
        let addr = l.local_addr().expect("its address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            while let Ok((io, _)) = l.accept().await {
                let s = s.clone();
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let s = s.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            s.lock().push(format!(
                                "{} {} {:?} {}",
                                parts.method,
                                parts.uri.path(),
                                parts.version,
                                String::from_utf8_lossy(&body)
                            ));
                            let text = format!(
                                "{} {} [{}]",
                                parts.method,
                                parts.uri.path(),
                                String::from_utf8_lossy(&body)
                            );
                            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from(text))))
                        }
                    });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(io), service),
                );
            }
        });
        (addr, seen)
    }

    /// HTTP/1.1 clients of a pool with `http2 = true`: their requests (and bodies) go to the
    /// member as HTTP/2 streams; the answers come back re-framed for HTTP/1.1 (chunked: an
    /// HTTP/2 response has no Content-Length here), on a keep-alive connection.
    #[tokio::test]
    async fn http1_clients_reach_an_http2_member() {
        let (addr, seen) = h2_member().await;
        let svc = service_to(&[addr], "", "", "http2 = true");
        let (mut client, server) = tokio::io::duplex(256 * 1024);
        let info = ConnInfo {
            peer: "127.0.0.9:5000".parse().expect("address"),
            local: "127.0.0.1:80".parse().expect("address"),
            alpn: Alpn::Http1,
            sni: None,
        };
        tokio::spawn(crate::serve_connection(svc, server, info));
        client
            .write_all(b"POST /in HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\nbodyGET /next HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("requests written");
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut out))
            .await
            .expect("closed after the last request")
            .expect("read");
        let out = String::from_utf8_lossy(&out);
        assert_eq!(out.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{out}");
        assert!(out.contains("POST /in [body]"), "{out}");
        assert!(out.contains("GET /next []"), "{out}");
        let seen = seen.lock();
        assert_eq!(
            seen.as_slice(),
            ["POST /in HTTP/2.0 body", "GET /next HTTP/2.0 "]
        );
    }
}

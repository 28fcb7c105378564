//! The HTTP/2 member session of an exchange (`http2 = true` on a pool): a request sent as a
//! stream on the member's shared connection (`upstream::H2Member`), one attempt of the
//! request loop (`request_loop`).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::{ConnectionGuard, Member, Picked, RequestGuard};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;

use crate::client::Client;
use crate::exchange::{Failure, Route};
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
    /// Request body bytes sent so far (the body may still be going out).
    pub sent: Arc<AtomicU64>,
}

impl H2Response {
    /// The answer's head, and its body as a `Relay`: the request's bytes and the body's are
    /// added to the member's and the service's (`stats`) counters as it flows and at its end.
    pub fn into_relay(
        self,
        stats: Arc<fulcrum_net::ServiceStats>,
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

/// The request head for a stream to `member`: the fields as an HTTP/2 member gets them, the
/// authority from the Host field (or the member's address), the target as the rule rewrote it.
pub(crate) fn request_head(
    route: Route<'_>,
    req: &RequestHead,
    client: &Client,
    member: &Member,
) -> Result<http::Request<()>, Local> {
    let rule = route.rule;
    // The framing of a body to HTTP/2 is the stream's own: only its length is told.
    let framing = match req.content_length {
        Some(n) if n > 0 => ReqFraming::Length(n),
        _ => ReqFraming::None,
    };
    let mut sink = MapSink::default();
    fields::write_request_fields(
        &mut sink,
        req,
        &RequestCtx {
            settings: route.svc.field_settings(),
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
    let mut request = http::Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = sink.map;
    Ok(request)
}

/// What a client session sent as a stream on an HTTP/2 member connection: the member's answer
/// or why the attempt failed, and the count of request body bytes sent, which goes on while
/// the body does.
pub(crate) type SentH2 = (Result<http::Response<Incoming>, Failure>, Arc<AtomicU64>);

/// Sends `request` on the member's connection and waits `timeout` for its response head. A
/// stream refused or a connection gone is a `Failure::Broken` (`reused` unless `fresh`). With
/// the answer comes the count of body bytes sent, which goes on while the body does.
pub(crate) async fn send(
    sender: &mut SendRequest<UpBody>,
    request: http::Request<UpBody>,
    timeout: Duration,
    fresh: bool,
) -> SentH2 {
    let sent = Arc::new(AtomicU64::new(0));
    let request = request.map(|b| UpBody::Counted(Box::new(b), sent.clone()));
    let result = async {
        sender.ready().await?;
        sender.send_request(request).await
    };
    let r = match tokio::time::timeout(timeout, result).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(e)) => Err(Failure::Broken {
            why: format!("HTTP/2 request: {e}"),
            answered: false,
            reused: !fresh,
        }),
        Err(_) => Err(Failure::Timeout),
    };
    (r, sent)
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

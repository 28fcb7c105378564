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

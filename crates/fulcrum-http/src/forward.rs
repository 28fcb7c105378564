//! Forwarding a request whose response streams as a body (`http::Response<DownBody>`): the
//! HTTP/2 client adapter's streams, and the cache's member fetches for both client protocols.
//! The member is HTTP/1.1 (its connection moves into the response body and goes back to its
//! store when the body ends) or HTTP/2 (`h2_upstream`).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::Body as _;
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use crate::body::{DownBody, InFraming, MemberBody, PrivateConns, Release};
use crate::body_limit::{ClientBody, Limited, Verdict, VerdictHandle};
use crate::chunked;
use crate::client::Client;
use crate::exchange::{self, Attempts, RespError, Route};
use crate::fields::{self, MapSink, ReqFraming, RequestCtx};
use crate::h2_upstream::SentH2;
use crate::head::{RequestHead, ResponseHead, Version};
use crate::local::Local;
use crate::plan::ResponsePlan;
use crate::request_loop::{self, Ended, Http1Answer, MemberAnswer, SendError, Sent};
use crate::service::HttpService;
use crate::upstream::{UpBody, UpstreamConn};
use fulcrum_balance::Member;
use hyper::client::conn::http2::SendRequest;
use parking_lot::Mutex;

/// What forwarding needs of the client connection: the client, the member connections
/// private to it (`reuse = "never"`, PROXY protocol), and where interim (1xx) responses go.
pub(crate) struct Downstream<'a> {
    pub client: &'a Client,
    pub private: &'a PrivateConns,
    pub interim: Option<&'a Interim>,
    /// The request's way through the service's filters (HTTP/2 clients): its response phase
    /// runs here, and the body filters go with the response body.
    pub filters: Option<&'a Mutex<Option<Box<fulcrum_wasm::Stream>>>>,
}

/// Runs the response-header callbacks of the request's filters, and hands over the filters
/// that read the body.
async fn response_filters(
    down: &Downstream<'_>,
    resp: &mut ResponseHead,
    route: Route<'_>,
    member: std::net::SocketAddr,
) -> Result<Option<crate::wasm_filters::FilterBody>, Local> {
    let Some(slot) = down.filters else {
        return Ok(None);
    };
    let Some(mut stream) = slot.lock().take() else {
        return Ok(None);
    };
    // Boxed: only services with filters come here, and the filters' state would otherwise
    // size every stream's future.
    Box::pin(crate::wasm_filters::on_response(
        &mut stream,
        resp,
        &route.target.pool.name,
        member,
    ))
    .await?;
    if stream.wants_response_transform() {
        return Ok(Some(crate::wasm_filters::FilterBody::new(stream)));
    }
    *slot.lock() = Some(stream);
    Ok(None)
}

/// Interim response heads (103 Early Hints, 102, 100) from an HTTP/1.1 member, sent on as they
/// come while the final response is awaited: the HTTP/1.1 client adapter writes them to its
/// client when it fetches for the cache. Bounded: a member flooding 1xx heads faster than the
/// client reads them loses the excess (it is bounded in time by `response_timeout` as well).
pub(crate) type Interim = tokio::sync::mpsc::Sender<Bytes>;

/// How many interim heads may wait for the client.
pub(crate) const INTERIM_QUEUE: usize = 16;

/// `read_response_head`'s writer for interim heads: into the `Interim` queue, or nowhere.
struct InterimWriter<'a>(Option<&'a Interim>);

impl tokio::io::AsyncWrite for InterimWriter<'_> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        if let Some(tx) = self.0 {
            let _ = tx.try_send(Bytes::copy_from_slice(buf));
        }
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Forwards one stream to a member of the route's pool.
pub(crate) async fn forward(
    down: &Downstream<'_>,
    route: Route<'_>,
    head: &RequestHead,
    body: Option<ClientBody>,
) -> Result<(Response<DownBody>, std::net::SocketAddr), Local> {
    let svc = route.svc;
    // Bodies with or without a length are held to max_body_size and min_body_rate; a request
    // without one (most) costs no limiter.
    let body = body
        .filter(|b| !b.is_end_stream())
        .map(|b| Limited::new(b, svc.max_body_size, svc.min_body_rate, svc.header_timeout));
    let verdict = body.as_ref().map(Limited::verdict_handle);
    let has_body = body.is_some();
    let framing = match head.content_length {
        Some(n) if n > 0 => ReqFraming::Length(n),
        _ if has_body => ReqFraming::Chunked,
        _ => ReqFraming::None,
    };
    let retryable = head.method.is_idempotent() && !has_body;
    let mut attempts = Attempts::new(route, head, down.client, retryable);
    let mut session = StreamSession {
        svc,
        down,
        head,
        body,
        framing,
        verdict,
        private: route.private_conns(),
    };
    let answer = match request_loop::run(route, &mut attempts, &mut session).await {
        Ok(a) => a,
        Err(Ended::Answer(l)) => return Err(session.body_cut().unwrap_or(l)),
        Err(Ended::ClientGone) => return Err(Local::error(502, "interrupted")),
        Err(Ended::Stop(l)) => return Err(l),
    };
    match answer {
        MemberAnswer::Http2(r) => {
            let (member, index) = (r.picked.member.clone(), r.picked.index);
            let (parts, relay) = r.into_relay(svc.stats.clone());
            let mut resp = ResponseHead::from_h2(&parts);
            let body_filter = response_filters(down, &mut resp, route, member.address).await?;
            let mut plan =
                ResponsePlan::new(route, head, index, attempts.lookup(), &resp, body_filter);
            let mut sink = MapSink::default();
            plan.write_fields(&mut sink, route, head, &resp, false);
            let mut out = Response::new(plan.filter(DownBody::Relay(Box::new(relay))));
            *out.status_mut() = parts.status;
            *out.headers_mut() = sink.map;
            Ok((out, member.address))
        }
        MemberAnswer::Http1(a) => {
            let lookup = attempts.lookup();
            respond_h1(down, route, head, lookup, a).await
        }
    }
}

/// A member's HTTP/1.1 answer as a response whose body streams from the member connection
/// (which goes back to its store when the body ends).
async fn respond_h1(
    down: &Downstream<'_>,
    route: Route<'_>,
    head: &RequestHead,
    lookup: &crate::sticky::Lookup,
    a: Http1Answer,
) -> Result<(Response<DownBody>, std::net::SocketAddr), Local> {
    let (svc, t) = (route.svc, route.target);
    let Http1Answer {
        picked,
        mut conn,
        mut resp,
        sent,
        request,
        ..
    } = a;
    let member = picked.member.clone();
    if resp.status == 101 {
        member.record_passive_failure("101 Switching Protocols without an upgrade request");
        return Err(Local::error(502, "unexpected 101 from the member"));
    }
    let body_filter = response_filters(down, &mut resp, route, member.address).await?;
    let mut plan = ResponsePlan::new(route, head, picked.index, lookup, &resp, body_filter);
    let in_framing = plan.member_framing(&resp);
    let mut sink = MapSink::default();
    plan.write_fields(&mut sink, route, head, &resp, false);
    let status = http::StatusCode::from_u16(resp.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let reusable = !resp.close && !matches!(in_framing, InFraming::Close);
    // The body bytes that came with the head are the member body's first.
    let mut body_start = resp.buf;
    body_start.drain(..resp.head_len);
    conn.buf = body_start;
    let private = route.private_conns();
    let body = MemberBody::new(
        conn,
        in_framing,
        Release {
            stats: svc.stats.clone(),
            store: (!private)
                .then(|| t.conns.get(picked.index).cloned())
                .flatten(),
            member: member.clone(),
            private: private.then(|| down.private.clone()),
            reusable,
            sent,
        },
        svc.idle_timeout,
        request,
    );
    let mut out = Response::new(plan.filter(DownBody::Member(Box::new(body))));
    *out.status_mut() = status;
    *out.headers_mut() = sink.map;
    Ok((out, member.address))
}

/// A stream's request as the request loop sends it: an HTTP/2 client's (its body under the
/// service's limits), or the cache's bodiless fetch.
struct StreamSession<'a, 'd> {
    svc: &'a HttpService,
    down: &'a Downstream<'d>,
    head: &'a RequestHead,
    /// The body still to send (taken by the one attempt that sends it: a request with a body
    /// is not tried again once it went out).
    body: Option<Limited>,
    framing: ReqFraming,
    verdict: Option<VerdictHandle>,
    /// The route keeps member connections private to the client connection.
    private: bool,
}

impl StreamSession<'_, '_> {
    /// The answer to a body its limits cut, counted; `None` when they did not.
    fn body_cut(&self) -> Option<Local> {
        body_cut(self.svc, self.verdict.as_ref())
    }
}

impl request_loop::ClientSession for StreamSession<'_, '_> {
    type Stop = Local;

    fn request(&self) -> (&RequestHead, &Client) {
        (self.head, self.down.client)
    }

    fn take_private(&mut self, member: &Arc<Member>) -> Option<UpstreamConn> {
        if !self.private {
            return None;
        }
        let mut p = self.down.private.lock();
        p.iter_mut()
            .position(|(m, c)| Arc::ptr_eq(m, member) && c.is_idle_alive())
            .map(|i| p.swap_remove(i).1)
    }

    async fn send_h1(
        &mut self,
        route: Route<'_>,
        _member: &Member,
        conn: &mut UpstreamConn,
    ) -> Result<Sent, SendError<Local>> {
        let svc = route.svc;
        let mut out = Vec::with_capacity(1024);
        fields::write_request_line(&mut out, self.head, route.rule);
        fields::write_request_fields(
            &mut out,
            self.head,
            &RequestCtx {
                settings: svc.field_settings(),
                client: self.down.client,
                rule: route.rule,
                framing: self.framing,
                h2: false,
            },
        );
        out.extend_from_slice(b"\r\n");
        let mut sent = out.len() as u64;
        conn.io.write_all(&out).await.map_err(SendError::Member)?;
        if let Some(mut b) = self.body.take() {
            match send_body(&mut b, conn, self.framing, svc.idle_timeout).await {
                Ok(n) => sent += n,
                Err(BodyError::Client) => {
                    let cut = body_cut(svc, self.verdict.as_ref())
                        .unwrap_or_else(|| Local::error(400, "the request body was cut short"));
                    return Err(SendError::Stop(cut));
                }
                Err(BodyError::Member(e)) => return Err(SendError::Member(e)),
            }
        }
        Ok(Sent {
            bytes: sent,
            early: false,
        })
    }

    async fn read_h1_head(
        &mut self,
        conn: &mut UpstreamConn,
        deadline: Instant,
    ) -> Result<ResponseHead, RespError> {
        let mut timer = crate::timer::Timer::new();
        timer.set(deadline);
        // Interim heads reach an HTTP/1.1 client only (HTTP/2 clients: Fulcrum's h2 server
        // sends none; HTTP/1.0 has none).
        let interim = self.down.interim;
        let version = if interim.is_some() {
            Version::Http11
        } else {
            Version::Http2
        };
        exchange::read_response_head(conn, &mut timer, &mut InterimWriter(interim), version).await
    }

    fn rewind(&mut self) {
        // Only a request without a body is tried again: nothing to rewind.
    }

    async fn send_h2(
        &mut self,
        sender: &mut SendRequest<UpBody>,
        head: http::Request<()>,
        timeout: Duration,
        fresh: bool,
    ) -> Result<SentH2, Local> {
        let body = match self.body.take() {
            Some(b) => UpBody::Limited(Box::new(b)),
            None => UpBody::Empty,
        };
        Ok(crate::h2_upstream::send(sender, head.map(|()| body), timeout, fresh).await)
    }
}

/// A bodiless request fetched from a member of `t` for the cache (HTTP/1 and HTTP/2 clients
/// alike): the response with a streaming body; interim heads go to `interim`.
pub(crate) async fn fetch(
    route: Route<'_>,
    client: &Client,
    head: &RequestHead,
    interim: Option<&Interim>,
) -> Result<(Response<DownBody>, std::net::SocketAddr), Local> {
    let private = PrivateConns::default();
    let down = Downstream {
        client,
        private: &private,
        interim,
        filters: None,
    };
    forward_in_time(&down, route, head, None).await
}

/// `forward` within the service's `request_timeout` (504 past it).
pub(crate) async fn forward_in_time(
    down: &Downstream<'_>,
    route: Route<'_>,
    head: &RequestHead,
    body: Option<ClientBody>,
) -> Result<(Response<DownBody>, std::net::SocketAddr), Local> {
    let svc = route.svc;
    let fwd = forward(down, route, head, body);
    match svc.request_timeout {
        Some(limit) => match tokio::time::timeout(limit, fwd).await {
            Ok(r) => r,
            Err(_) => {
                svc.http_stats
                    .response_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                Err(Local::error(504, "request_timeout"))
            }
        },
        None => fwd.await,
    }
}

/// The answer to a request body cut by its limits, counted; `None` when the body was not cut.
fn body_cut(svc: &HttpService, verdict: Option<&VerdictHandle>) -> Option<Local> {
    match verdict?.get() {
        Verdict::TooLarge => {
            svc.http_stats
                .bodies_too_large
                .fetch_add(1, Ordering::Relaxed);
            Some(Local::error(413, "request body larger than max_body_size"))
        }
        Verdict::TooSlow => {
            svc.http_stats.slow_bodies.fetch_add(1, Ordering::Relaxed);
            Some(Local::error(408, "request body slower than min_body_rate"))
        }
        Verdict::Ok => None,
    }
}

enum BodyError {
    Client,
    Member(io::Error),
}

/// Streams an HTTP/2 client's request body to an HTTP/1.1 member connection.
async fn send_body(
    body: &mut Limited,
    conn: &mut UpstreamConn,
    framing: ReqFraming,
    idle: Duration,
) -> Result<u64, BodyError> {
    let mut sent = 0u64;
    let mut out = Vec::with_capacity(16 * 1024);
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(Ok(f))) => f,
            Ok(None) => break,
            Ok(Some(Err(_))) | Err(_) => return Err(BodyError::Client),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        out.clear();
        if framing == ReqFraming::Chunked {
            chunked::encode_chunk(&mut out, &data);
            conn.io.write_all(&out).await.map_err(BodyError::Member)?;
            sent += out.len() as u64;
        } else {
            conn.io.write_all(&data).await.map_err(BodyError::Member)?;
            sent += data.len() as u64;
        }
    }
    if framing == ReqFraming::Chunked {
        conn.io
            .write_all(chunked::END)
            .await
            .map_err(BodyError::Member)?;
        sent += chunked::END.len() as u64;
    }
    Ok(sent)
}

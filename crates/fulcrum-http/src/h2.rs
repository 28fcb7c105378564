//! HTTP/2 client connections (h2c by prior knowledge here; ALPN `h2` once TLS is in front), on
//! the `h2` crate with every stream driven from the connection's own task (`h2_streams`): the
//! task polls `accept` together with the streams in flight, the keep-alive PING and its timers.
//! Each stream is turned into the same request head the HTTP/1 path uses, planned by the same
//! rules, and forwarded over HTTP/1.1 (or HTTP/2) member connections from the same shared
//! stores.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::h2::server::{Connection, SendResponse};
use ::h2::{Ping, PingPong, RecvStream};
use bytes::Bytes;
use fulcrum_balance::clock;
use futures_util::stream::{FuturesUnordered, StreamExt};
use http::{HeaderValue, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::body::{DownBody, PrivateConns};
use crate::body_limit::{ClientBody, Limited, RecvBody, Verdict};
use crate::client::{Client, ConnInfo};
use crate::exchange::Route;
use crate::forward::{forward, forward_in_time, Downstream};
use crate::h2_streams::{Dropped, StreamEnd, StreamTask};
use crate::head::{FieldKind, Method, RequestHead};
use crate::local::Local;
use crate::rules::CompiledRule;
use crate::service::{HttpService, Plan, Successor};

/// The HTTP/2 connection preface a client speaking h2c by prior knowledge starts with.
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Streams a client may have open at once. Each may hold a member connection, so this bounds
/// what one client connection can make Fulcrum hold (a stream flood held +8 MiB at 256); nginx
/// allows 128 and HAProxy 100.
const MAX_STREAMS: u32 = 128;

/// Streams a client may cancel (RST_STREAM before the response head) on one connection before
/// it is closed, while they are also at least half of the streams it opened. A browser cancels
/// a few when the user navigates away; a rapid-reset attacker (CVE-2023-44487) cancels every
/// one, each after Fulcrum may already have picked a member for it. nginx and HAProxy close
/// such connections the same way.
const RESET_BUDGET: u64 = 100;

/// Streams reset by the client before they were accepted (h2's own counter; its default).
const PENDING_ACCEPT_RESETS: usize = 20;

/// After GOAWAY with no stream left, how long the client has to finish the close (the PING
/// round trip of a graceful shutdown) before the connection is dropped.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Keep-alive PINGs on a connection with no traffic, and how long an answer may take: a peer
/// that vanished without a FIN is found within interval + timeout.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// The windows and buffers hyper's server gave h2 (and clients were measured with): 1 MiB
/// windows rather than the protocol's 64 KiB, 16 KiB frames, 400 KiB buffered per stream.
const WINDOW: u32 = 1 << 20;
const MAX_FRAME: u32 = 16 << 10;
const SEND_BUFFER: usize = 400 << 10;
/// Streams h2 may reset for the client's errors before it closes the connection.
const LOCAL_ERROR_RESETS: usize = 1024;

/// What the streams of one connection share. Borrowed by every stream: it lives in the
/// connection's task, which outlives them.
struct State {
    client: Client,
    private: PrivateConns,
}

/// Bytes read ahead (the connection preface, when it was sniffed), then the stream; counts
/// what the client sent, for the preface timeout and the keep-alive PING.
struct Rewind<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
    read: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            if self.pos == self.prefix.len() {
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// What woke the connection's task. Lives for one turn of its loop, on its stack: boxing the
/// new stream's request would cost an allocation per stream.
#[allow(clippy::large_enum_variant)]
enum Event {
    Stream(Result<(http::Request<RecvStream>, SendResponse<Bytes>), ::h2::Error>),
    /// The connection is closed (after a GOAWAY, with no stream left) or failed.
    Closed(Option<::h2::Error>),
    Ended(StreamEnd),
    Retired,
    Tick,
    Pong,
}

/// The keep-alive PING: sent when the client has sent nothing for `PING_INTERVAL`, answered
/// within `PING_TIMEOUT` or the connection is dropped.
struct KeepAlive {
    pings: Option<PingPong>,
    /// Bytes read from the client at the last look, and since when that has not changed.
    seen: u64,
    quiet_since: Instant,
    sent: Option<Instant>,
}

impl KeepAlive {
    /// Sends a PING when due; `false` when one went unanswered past its timeout.
    fn check(&mut self, read: u64) -> bool {
        let now = Instant::now();
        if read != self.seen {
            self.seen = read;
            self.quiet_since = now;
        }
        match self.sent {
            Some(at) => now.duration_since(at) < PING_TIMEOUT,
            None => {
                if now.duration_since(self.quiet_since) >= PING_INTERVAL {
                    if let Some(p) = self.pings.as_mut() {
                        if p.send_ping(Ping::opaque()).is_ok() {
                            self.sent = Some(now);
                        }
                    }
                }
                true
            }
        }
    }

    fn poll_pong(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match (self.sent, self.pings.as_mut()) {
            (Some(_), Some(p)) => p.poll_pong(cx).map(|_| ()),
            _ => Poll::Pending,
        }
    }
}

/// Serves one HTTP/2 client connection; `prefix` holds bytes already read from it.
pub(crate) async fn serve<S>(svc: Arc<HttpService>, io: S, info: ConnInfo, prefix: Vec<u8>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let read = Arc::new(AtomicU64::new(prefix.len() as u64));
    let io = Rewind {
        prefix,
        pos: 0,
        inner: io,
        read: read.clone(),
    };
    let mut builder = ::h2::server::Builder::new();
    builder
        .initial_window_size(WINDOW)
        .initial_connection_window_size(WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_send_buffer_size(SEND_BUFFER)
        .max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS))
        .max_concurrent_streams(MAX_STREAMS)
        .max_pending_accept_reset_streams(PENDING_ACCEPT_RESETS)
        .max_header_list_size((svc.limits.max_header_size + 4096) as u32);
    // A client that negotiated h2 (ALPN) must send its preface like a request head.
    let preface_by = Instant::now() + svc.header_timeout;
    let conn = match tokio::time::timeout_at(preface_by, builder.handshake(io)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            tracing::debug!(service = %svc.name, client = %info.peer, error = %e, "HTTP/2 handshake failed");
            return;
        }
        Err(_) => {
            if read.load(Ordering::Relaxed) < PREFACE.len() as u64 {
                svc.http_stats.h2_stalled.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
    };
    let state = State {
        client: Client::new(info.clone()),
        private: Arc::new(Mutex::new(Vec::new())),
    };
    run(svc, conn, &state, &read).await;
}

/// The connection's task: accepts streams, drives them, and watches the connection.
async fn run<T>(
    mut svc: Arc<HttpService>,
    mut conn: Connection<T, Bytes>,
    st: &State,
    read: &AtomicU64,
) where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let idle = svc.idle_timeout;
    let mut streams: FuturesUnordered<StreamTask<'_>> = FuturesUnordered::new();
    let mut keepalive = KeepAlive {
        pings: conn.ping_pong(),
        seen: read.load(Ordering::Relaxed),
        quiet_since: Instant::now(),
        sent: None,
    };
    // Close the connection gracefully once no stream has been open for `idle`.
    let check = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let mut tick: Pin<Box<Sleep>> = Box::pin(tokio::time::sleep(check));
    let mut retired: Pin<Box<dyn Future<Output = ()> + Send>> = retirement(&svc);
    let (mut opened, mut cancelled) = (0u64, 0u64);
    // When the last stream ended (clock::now_ms).
    let mut last = clock::now_ms();
    let mut closing: Option<Instant> = None;
    loop {
        let event = poll_fn(|cx| {
            if let Poll::Ready(Some(end)) = streams.poll_next_unpin(cx) {
                return Poll::Ready(Event::Ended(end));
            }
            match conn.poll_accept(cx) {
                Poll::Ready(Some(r)) => return Poll::Ready(Event::Stream(r)),
                Poll::Ready(None) => return Poll::Ready(Event::Closed(None)),
                Poll::Pending => {}
            }
            if keepalive.poll_pong(cx).is_ready() {
                return Poll::Ready(Event::Pong);
            }
            if closing.is_none() && retired.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Retired);
            }
            if tick.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Event::Tick);
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::Stream(Ok((req, respond))) => {
                opened += 1;
                let (parts, recv) = req.into_parts();
                let handler =
                    crate::h2_streams::boxed_in_place(|| handle(st, svc.clone(), parts, recv));
                streams.push(StreamTask::new(respond, handler));
            }
            Event::Stream(Err(e)) => return ended(&svc, st, Some(e)),
            Event::Closed(e) => return ended(&svc, st, e),
            Event::Ended(end) => {
                last = clock::now_ms();
                if end == StreamEnd::Cancelled {
                    cancelled += 1;
                    if cancelled > RESET_BUDGET && cancelled * 2 >= opened {
                        svc.http_stats
                            .h2_reset_floods
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::info!(service = %svc.name, client = %st.client.info.peer,
                            opened, reset = cancelled,
                            "HTTP/2 client reset more streams than its budget; connection closed");
                        return;
                    }
                }
            }
            Event::Pong => keepalive.sent = None,
            // A reload moves the connection to the service in force; one that changed (or
            // left) sends GOAWAY: streams in flight finish, the client opens a new connection.
            Event::Retired => {
                let changed = match svc.successor() {
                    Successor::Same(next) => {
                        svc = next;
                        false
                    }
                    Successor::Changed(next) => {
                        svc = next;
                        true
                    }
                    Successor::Gone => true,
                };
                retired = retirement(&svc);
                if changed {
                    conn.graceful_shutdown();
                    closing = Some(Instant::now());
                }
            }
            Event::Tick => {
                let now = Instant::now();
                tick.as_mut().reset(now + check);
                if !keepalive.check(read.load(Ordering::Relaxed)) {
                    tracing::debug!(service = %svc.name, client = %st.client.info.peer,
                        "HTTP/2 keep-alive PING unanswered; connection dropped");
                    return;
                }
                // A response body that made no progress for `idle` (a client holding its
                // window at zero is never sent more) gives its member connection back; the
                // client is told to go away.
                let sweep = crate::h2_streams::sweep(streams.iter_mut(), idle.as_millis() as u64);
                if sweep.stalled > 0 {
                    svc.http_stats
                        .h2_stalled_streams
                        .fetch_add(sweep.stalled as u64, Ordering::Relaxed);
                    tracing::info!(service = %svc.name, client = %st.client.info.peer, streams = sweep.stalled,
                        "HTTP/2 response made no progress within idle_timeout; member connection released");
                    if closing.is_none() {
                        conn.graceful_shutdown();
                        closing = Some(now);
                    }
                }
                if !streams.is_empty() {
                    continue;
                }
                match closing {
                    // GOAWAY sent and no stream left: a client that does not finish the close
                    // (it never acknowledges the PING) is not waited for.
                    Some(since) => {
                        if since.elapsed() >= DRAIN_GRACE {
                            svc.http_stats.h2_stalled.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                    None => {
                        if clock::now_ms().saturating_sub(last) >= idle.as_millis() as u64 {
                            conn.graceful_shutdown();
                            closing = Some(now);
                        }
                    }
                }
            }
        }
    }
}

/// The service's retirement as a future the connection's loop can poll again and again.
fn retirement(svc: &Arc<HttpService>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let svc = svc.clone();
    Box::pin(async move { svc.retired().await })
}

fn ended(svc: &HttpService, st: &State, e: Option<::h2::Error>) {
    if let Some(e) = e {
        tracing::debug!(service = %svc.name, client = %st.client.info.peer, error = %e, "HTTP/2 connection ended");
    }
}

fn local_response(l: &Local, rule: Option<&CompiledRule>, method: Method) -> Response<DownBody> {
    let mut r = Response::new(DownBody::Full(
        (method != Method::Head && !l.body.is_empty()).then(|| l.body.clone()),
    ));
    *r.status_mut() = http::StatusCode::from_u16(l.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let h = r.headers_mut();
    let mut date = Vec::with_capacity(32);
    crate::date::append_http_date(&mut date);
    if let Ok(v) = HeaderValue::from_bytes(&date) {
        h.insert(http::header::DATE, v);
    }
    if let Some(loc) = l
        .location
        .as_ref()
        .and_then(|l| HeaderValue::from_bytes(l).ok())
    {
        h.insert(http::header::LOCATION, loc);
    }
    if l.retry_after {
        h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("5"));
    }
    if !l.body.is_empty() {
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    for (n, v) in &l.fields {
        if FieldKind::of(n).is_hop_by_hop() || n.eq_ignore_ascii_case(b"date") {
            continue;
        }
        if let (Ok(n), Ok(v)) = (http::HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
            if n == http::header::CONTENT_TYPE {
                h.insert(n, v);
            } else {
                h.append(n, v);
            }
        }
    }
    h.insert(
        http::header::CONTENT_LENGTH,
        HeaderValue::from(l.body.len()),
    );
    if let Some(e) = rule.and_then(|r| r.response_headers.as_ref()) {
        for (n, v) in &e.set {
            h.insert(n.clone(), v.clone());
        }
        for (n, v) in &e.add {
            h.append(n.clone(), v.clone());
        }
    }
    r
}

/// The most of a refused request body read (and dropped) before the refusal is sent, and for
/// how long at most.
const DISCARD_MAX: u64 = 64 << 10;
const DISCARD_TIME: Duration = Duration::from_secs(1);

/// Before refusing a body by its announced `length`: when it is small enough, reads and drops
/// it first (for at most `DISCARD_TIME`), so that a client still uploading gets the refusal
/// rather than a stream reset it may report instead of the answer (curl does, when the reset
/// overtakes its upload). Larger bodies are refused at once, as HTTP/1 servers stop lingering
/// past a bound.
async fn discard_briefly<B: Body + Unpin>(body: &mut B, length: u64) {
    if length > DISCARD_MAX {
        return;
    }
    let until = tokio::time::sleep(DISCARD_TIME);
    tokio::pin!(until);
    loop {
        tokio::select! {
            f = body.frame() => match f {
                Some(Ok(_)) => {}
                _ => return,
            },
            _ = &mut until => return,
        }
    }
}

/// Reads the request body whole (up to `limit` and `max_body_size`) for the filters that read
/// request bodies, runs their body callbacks and gives what they leave as the body to forward,
/// its length in `head`. `Err`: the answer instead (413, 408, a filter's own reply).
async fn whole_body(
    svc: &HttpService,
    stream: &mut fulcrum_wasm::Stream,
    head: &mut RequestHead,
    mut body: ClientBody,
    limit: usize,
) -> Result<ClientBody, Local> {
    if body.is_end_stream() {
        return Ok(body);
    }
    let limit = limit as u64;
    if let Some(n) = head.content_length.filter(|n| *n > limit) {
        discard_briefly(&mut body, n).await;
        return Err(crate::wasm_filters::body_over_limit());
    }
    let max = svc.max_body_size.map_or(limit, |m| m.min(limit));
    let limited = Limited::new(body, Some(max), svc.min_body_rate, svc.header_timeout);
    let verdict = limited.verdict_handle();
    let bytes = match limited.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            return Err(match verdict.get() {
                Verdict::TooLarge if max == limit => crate::wasm_filters::body_over_limit(),
                Verdict::TooLarge => Local::error(413, "request body larger than max_body_size"),
                Verdict::TooSlow => Local::error(408, "request body slower than min_body_rate"),
                Verdict::Ok => Local::error(400, "the request body was cut short"),
            })
        }
    };
    let kept = crate::wasm_filters::on_request_body(stream, bytes.into()).await?;
    head.content_length = Some(kept.len() as u64);
    Ok(ClientBody::Whole(Full::new(Bytes::from(kept))))
}

/// Takes the request's parts rather than the request: the future would otherwise keep both
/// the request and its parts (240 and 224 bytes) in every stream's box.
async fn handle(
    st: &State,
    svc: Arc<HttpService>,
    parts: http::request::Parts,
    recv: RecvStream,
) -> Result<Response<DownBody>, Dropped> {
    svc.stats.requests_total.fetch_add(1, Ordering::Relaxed);
    // The clock is read for the access log only.
    let started = svc.access_log.is_some().then(Instant::now);
    let mut body = RecvBody::new(recv);
    let mut head = match checked_head(&svc, &parts, &mut body).await {
        Ok(h) => h,
        Err(refused) => return Ok(refused),
    };
    body.announce(head.content_length);
    let mut body = ClientBody::Streamed(body);
    // Filters see the request before the rules, and may answer it themselves.
    let filters = Mutex::new(None);
    let refused = match &svc.filters {
        // Boxed, like the cache's way below: these rarer paths would otherwise size the
        // future of every stream (it is moved into its box at each accept).
        Some(chain) => {
            Box::pin(request_filters(
                st, &svc, chain, &mut head, &mut body, &filters,
            ))
            .await
        }
        None => None,
    };
    let down = Downstream {
        client: &st.client,
        private: &st.private,
        interim: None,
        filters: Some(&filters),
    };
    let plan = match refused {
        Some(l) => Plan::Local(l, None),
        None => svc.plan(&head, &st.client),
    };
    let (rule, answer) = match plan {
        Plan::Drop => {
            svc.http_stats.dropped.fetch_add(1, Ordering::Relaxed);
            let nothing = Outcome {
                status: 0,
                bytes: 0,
                member: None,
            };
            log(st, &svc, &head, nothing, started, None);
            return Err(Dropped);
        }
        Plan::Local(l, rule) => (rule, Err(l)),
        Plan::Forward { target, rule } => {
            let t = svc.targets[target].clone();
            let mut route = Route::new(&svc, &t, target, rule);
            route.member = filters
                .lock()
                .as_deref()
                .and_then(fulcrum_wasm::Stream::chosen_member);
            let answer = if svc.cache.as_ref().is_some_and(|c| c.applies(&head)) {
                Box::pin(through_cache(st, &down, route, &head, body, &filters)).await
            } else {
                to_member(&svc, &down, route, &head, body).await
            };
            (rule, answer)
        }
    };
    let (response, status, member) = match answer {
        Ok((r, member)) => {
            let status = r.status().as_u16();
            svc.http_stats.count_status(status);
            (r, status, member)
        }
        Err(l) => {
            svc.http_stats.count_status(l.status);
            (local_response(&l, rule, head.method), l.status, None)
        }
    };
    if svc.access_log.is_some() {
        let bytes = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let outcome = Outcome {
            status,
            bytes,
            member,
        };
        log(st, &svc, &head, outcome, started, rule);
    }
    Ok(response)
}

/// The request head from the stream's fields, checked: a head that cannot be forwarded, a
/// declared body past `max_body_size` and CONNECT are answered here.
async fn checked_head(
    svc: &HttpService,
    parts: &http::request::Parts,
    body: &mut RecvBody,
) -> Result<RequestHead, Response<DownBody>> {
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .as_bytes();
    let authority = parts.uri.authority().map(|a| a.as_str().as_bytes());
    let method = parts.method.as_str().as_bytes();
    let head = match RequestHead::from_h2(method, pq, authority, &parts.headers, &svc.limits) {
        Ok(h) => h,
        Err(e) => {
            svc.http_stats.bad_requests.fetch_add(1, Ordering::Relaxed);
            svc.http_stats.count_status(e.status);
            let l = Local::error(e.status, e.reason);
            return Err(local_response(&l, None, Method::Get));
        }
    };
    if let (Some(max), Some(n)) = (svc.max_body_size, head.content_length) {
        if n > max {
            svc.http_stats
                .bodies_too_large
                .fetch_add(1, Ordering::Relaxed);
            svc.http_stats.count_status(413);
            Box::pin(discard_briefly(body, n)).await;
            let l = Local::error(413, "request body larger than max_body_size");
            return Err(local_response(&l, None, head.method));
        }
    }
    if head.method == Method::Connect {
        svc.http_stats.count_status(405);
        let l = Local::error(405, "CONNECT is not served here");
        return Err(local_response(&l, None, head.method));
    }
    Ok(head)
}

/// Runs the request callbacks of the service's filters (the head, and the body read whole
/// when a filter reads bodies); the filters' stream goes in `filters` for the response.
/// `Some`: the answer to give instead of going on.
async fn request_filters(
    st: &State,
    svc: &HttpService,
    chain: &Arc<fulcrum_wasm::Chain>,
    head: &mut RequestHead,
    body: &mut ClientBody,
    filters: &Mutex<Option<Box<fulcrum_wasm::Stream>>>,
) -> Option<Local> {
    let r =
        crate::wasm_filters::on_request(chain, &svc.name, head, &st.client, svc.https, &svc.limits)
            .await;
    let mut stream = match r {
        Ok(stream) => stream,
        Err(l) => return Some(l),
    };
    let mut refused = None;
    if let Some(limit) = stream.request_body_limit() {
        let whole = std::mem::replace(body, ClientBody::Whole(Full::default()));
        match whole_body(svc, &mut stream, head, whole, limit).await {
            Ok(b) => *body = b,
            Err(l) => refused = Some(l),
        }
    }
    *filters.lock() = Some(stream);
    refused
}

/// The answer to a request to members: a member's response, and its address.
type Answer = Result<(Response<DownBody>, Option<std::net::SocketAddr>), Local>;

/// A GET or HEAD through the service's cache: a stored answer (through the response filters),
/// or the member's, which the cache may keep.
async fn through_cache(
    st: &State,
    down: &Downstream<'_>,
    route: Route<'_>,
    head: &RequestHead,
    body: ClientBody,
    filters: &Mutex<Option<Box<fulcrum_wasm::Stream>>>,
) -> Answer {
    match crate::cached::serve(route, &st.client, head, None).await {
        crate::cache::Reply::Bypass => forward(down, route, head, Some(body))
            .await
            .map(|(r, m)| (r, Some(m))),
        crate::cache::Reply::Local(l) => Err(l),
        r => {
            let stream = filters.lock().take();
            let r = match stream {
                Some(s) => {
                    let pool = &route.target.pool.name;
                    crate::cached::filtered(s, r, head.method, pool).await?
                }
                None => r,
            };
            crate::cache::h2_response(r, head.method).ok_or_else(|| Local::error(502, ""))
        }
    }
}

/// The request to a member within `request_timeout`; an unsafe method's answer invalidates
/// what the cache holds for its target.
async fn to_member(
    svc: &HttpService,
    down: &Downstream<'_>,
    route: Route<'_>,
    head: &RequestHead,
    body: ClientBody,
) -> Answer {
    let (r, member) = forward_in_time(down, route, head, Some(body)).await?;
    if let Some(c) = &svc.cache {
        let h = r.headers();
        c.after_unsafe(
            svc.scheme(),
            head,
            r.status().as_u16(),
            h.get(http::header::LOCATION).map(|v| v.as_bytes()),
            h.get(http::header::CONTENT_LOCATION).map(|v| v.as_bytes()),
        );
    }
    Ok((r, Some(member)))
}

/// How a stream ended, for the access log.
struct Outcome {
    status: u16,
    bytes: u64,
    member: Option<std::net::SocketAddr>,
}

fn log(
    st: &State,
    svc: &HttpService,
    req: &RequestHead,
    outcome: Outcome,
    started: Option<Instant>,
    rule: Option<&CompiledRule>,
) {
    if let Some(l) = &svc.access_log {
        l.record(&crate::access_log::Entry {
            client: &st.client,
            req,
            status: outcome.status,
            bytes: outcome.bytes,
            duration: started.map_or(Duration::ZERO, |s| s.elapsed()),
            member: outcome.member,
            rule: rule.and_then(|r| r.name.as_deref()),
        });
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};

    use crate::client::{Alpn, ConnInfo};
    use crate::testing::{member, service, service_to};

    /// An HTTP/2 client of the adapter over an in-memory stream.
    async fn h2_client(
        svc: std::sync::Arc<crate::HttpService>,
    ) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
        let (client, server) = tokio::io::duplex(256 * 1024);
        let info = ConnInfo {
            peer: "127.0.0.9:5000".parse().expect("address"),
            local: "127.0.0.1:80".parse().expect("address"),
            alpn: Alpn::H2,
            sni: None,
        };
        tokio::spawn(crate::serve_connection(svc, server, info));
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(client))
                .await
                .expect("HTTP/2 handshake");
        tokio::spawn(conn);
        send
    }

    async fn get(
        send: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
        path: &str,
    ) -> (u16, String) {
        let req = http::Request::get(format!("http://x{path}"))
            .body(Empty::new())
            .expect("request");
        let resp = send.send_request(req).await.expect("a response");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("a body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn concurrent_streams_become_http11_requests_to_the_member() {
        let (addr, seen, conns) = member("hello").await;
        let svc = service_to(&[addr], "", "", "");
        let send = h2_client(svc).await;
        let mut streams = Vec::new();
        for i in 0..3 {
            let mut s = send.clone();
            streams.push(tokio::spawn(
                async move { get(&mut s, &format!("/s{i}")).await },
            ));
        }
        for s in streams {
            assert_eq!(s.await.expect("stream"), (200, "hello".to_string()));
        }
        let seen = seen.lock();
        assert_eq!(seen.len(), 3);
        for head in seen.iter() {
            assert!(head.starts_with("GET /s"), "{head}");
            assert!(head.contains(" HTTP/1.1\r\n"), "{head}");
            assert!(head.contains("host: x\r\n"), "{head}");
            assert!(head.contains("x-forwarded-for: 127.0.0.9\r\n"), "{head}");
            assert!(head.contains("x-forwarded-proto: http\r\n"), "{head}");
        }
        assert!(*conns.lock() <= 3);
    }

    #[tokio::test]
    async fn a_stream_without_a_member_gets_502_and_the_connection_goes_on() {
        let mut send = h2_client(service(2, "", "")).await;
        assert_eq!(get(&mut send, "/").await.0, 502);
        assert_eq!(get(&mut send, "/again").await.0, 502);
    }
}

//! HTTP/2 client connections (h2c by prior knowledge here; ALPN `h2` once TLS is in front), on
//! hyper's HTTP/2 server. Each stream is turned into the same request head the HTTP/1 path uses,
//! planned by the same rules, and forwarded over HTTP/1.1 (or HTTP/2) member connections from
//! the same shared stores.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use fulcrum_balance::{clock, PickContext};
use fulcrum_config::Reuse;
use http::{HeaderValue, Response};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use crate::body::{DownBody, InFraming, MemberBody, PrivateConns, Relay, Release};
use crate::chunked::{self, Decoder};
use crate::fields::{self, MapSink, ReqFraming, RequestCtx, RespFraming, ResponseCtx};
use crate::h2guard::{Limited, Verdict, VerdictHandle, Watchdog};
use crate::head::{Method, RequestHead, ResponseHead, Version};
use crate::rules::CompiledRule;
use crate::service::{request_hash, Client, ConnInfo, HttpService, Local, Plan, Target};
use crate::sticky::Lookup;
use crate::upstream::{self, UpstreamConn};

/// Streams a client may have open at once.
const MAX_STREAMS: u32 = 256;

/// Streams a client may cancel (RST_STREAM before the response head) on one connection before
/// it is closed, while they are also at least half of the streams it opened. A browser cancels
/// a few when the user navigates away; a rapid-reset attacker (CVE-2023-44487) cancels every
/// one, each after Fulcrum may already have picked a member for it. nginx and HAProxy close
/// such connections the same way.
const RESET_BUDGET: u64 = 100;

/// Streams reset by the client before hyper accepted them (h2's own counter; its default).
const PENDING_ACCEPT_RESETS: usize = 20;

/// After GOAWAY with no stream left, how long the client has to finish the close (the PING
/// round trip of a graceful shutdown) before the connection is dropped.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Keep-alive PINGs on a connection with no traffic, and how long an answer may take: a peer
/// that vanished without a FIN is found within interval + timeout.
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(20);

struct State {
    svc: Arc<HttpService>,
    client: Client,
    private: PrivateConns,
    active: AtomicUsize,
    /// When the last stream ended (clock::now_ms).
    last: AtomicU64,
    /// Streams the client opened, and those it reset before their response head.
    opened: AtomicU64,
    cancelled: AtomicU64,
    /// Raised once the client spent its reset budget.
    flood: tokio::sync::Notify,
    /// Bytes read from the client (the sniffed preface included).
    read: Arc<AtomicU64>,
    /// Response bodies in flight, watched for progress.
    watchdog: Watchdog,
}

/// Counts a stream whose handler was dropped before it returned: hyper drops it when the
/// client resets the stream.
struct Cancellable<'a> {
    st: &'a State,
    done: bool,
}

impl Drop for Cancellable<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let cancelled = self.st.cancelled.fetch_add(1, Ordering::Relaxed) + 1;
        if cancelled > RESET_BUDGET && cancelled * 2 >= self.st.opened.load(Ordering::Relaxed) {
            self.st.flood.notify_one();
        }
    }
}

struct Active<'a>(&'a State);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.last.store(clock::now_ms(), Ordering::Relaxed);
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Bytes read ahead (the connection preface, when it was sniffed), then the stream; counts
/// what the client sent, for the preface timeout.
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

/// Serves one HTTP/2 client connection; `prefix` holds bytes already read from it.
pub(crate) async fn serve<S>(svc: Arc<HttpService>, io: S, info: ConnInfo, prefix: Vec<u8>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let idle = svc.idle_timeout;
    let read = Arc::new(AtomicU64::new(prefix.len() as u64));
    let state = Arc::new(State {
        client: Client::new(info),
        private: Arc::new(Mutex::new(Vec::new())),
        active: AtomicUsize::new(0),
        last: AtomicU64::new(clock::now_ms()),
        svc: svc.clone(),
        opened: AtomicU64::new(0),
        cancelled: AtomicU64::new(0),
        flood: tokio::sync::Notify::new(),
        read: read.clone(),
        watchdog: Watchdog::default(),
    });
    let st = state.clone();
    let service = hyper::service::service_fn(move |req| {
        let st = st.clone();
        async move {
            st.opened.fetch_add(1, Ordering::Relaxed);
            let mut guard = Cancellable {
                st: &st,
                done: false,
            };
            let r = handle(st.clone(), req).await;
            guard.done = true;
            r
        }
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS)
        .max_pending_accept_reset_streams(PENDING_ACCEPT_RESETS)
        .keep_alive_interval(PING_INTERVAL)
        .keep_alive_timeout(PING_TIMEOUT)
        .max_header_list_size((svc.limits.max_header_size + 4096) as u32);
    let conn = builder.serve_connection(
        TokioIo::new(Rewind {
            prefix,
            pos: 0,
            inner: io,
            read,
        }),
        service,
    );
    tokio::pin!(conn);
    // Close the connection gracefully once no stream has been open for `idle`.
    let check = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    // A client that negotiated h2 (ALPN) must send its preface like a request head.
    let preface_by = Instant::now() + svc.header_timeout;
    let mut closing: Option<Instant> = None;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(service = %svc.name, client = %info.peer, error = %e, "HTTP/2 connection ended");
                }
                return;
            }
            _ = state.flood.notified() => {
                svc.http_stats.h2_reset_floods.fetch_add(1, Ordering::Relaxed);
                tracing::info!(service = %svc.name, client = %info.peer,
                    opened = state.opened.load(Ordering::Relaxed),
                    reset = state.cancelled.load(Ordering::Relaxed),
                    "HTTP/2 client reset more streams than its budget; connection closed");
                return;
            }
            _ = tokio::time::sleep_until(preface_by), if closing.is_none()
                && state.read.load(Ordering::Relaxed) < crate::service::PREFACE.len() as u64 => {
                svc.http_stats.h2_stalled.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ = svc.retired(), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some(Instant::now());
            }
            _ = tokio::time::sleep(check) => {
                // A response body that made no progress for `idle` (a client holding its
                // window at zero is never polled for more) gives its member connection back;
                // the client is told to go away.
                let sweep = state.watchdog.sweep(idle);
                if sweep.stalled > 0 {
                    svc.http_stats.h2_stalled_streams.fetch_add(sweep.stalled as u64, Ordering::Relaxed);
                    tracing::info!(service = %svc.name, client = %info.peer, streams = sweep.stalled,
                        "HTTP/2 response made no progress within idle_timeout; member connection released");
                    if closing.is_none() {
                        conn.as_mut().graceful_shutdown();
                        closing = Some(Instant::now());
                    }
                }
                // Bodies still flowing keep the connection busy: neither idle nor drained.
                if sweep.live > 0 {
                    state.last.fetch_max(sweep.newest, Ordering::Relaxed);
                    continue;
                }
                if state.active.load(Ordering::Relaxed) > 0 {
                    continue;
                }
                match closing {
                    // GOAWAY sent and no stream left: a client that does not finish the close
                    // (it never acknowledges the PING) is not waited for.
                    Some(since) => if since.elapsed() >= DRAIN_GRACE {
                        svc.http_stats.h2_stalled.fetch_add(1, Ordering::Relaxed);
                        return;
                    },
                    None => {
                        let quiet = clock::now_ms().saturating_sub(state.last.load(Ordering::Relaxed));
                        if quiet >= idle.as_millis() as u64 {
                            conn.as_mut().graceful_shutdown();
                            closing = Some(Instant::now());
                        }
                    }
                }
            }
        }
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

/// A `drop = true` rule on an HTTP/2 stream: the stream is reset, the connection goes on.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dropped by rule")
    }
}

impl std::error::Error for Dropped {}

async fn handle(
    st: Arc<State>,
    req: http::Request<Incoming>,
) -> Result<Response<DownBody>, Dropped> {
    let svc = st.svc.clone();
    st.active.fetch_add(1, Ordering::Relaxed);
    let _active = Active(&st);
    svc.stats.requests_total.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .as_bytes();
    let authority = parts.uri.authority().map(|a| a.as_str().as_bytes());
    let head = match RequestHead::from_h2(
        parts.method.as_str().as_bytes(),
        pq,
        authority,
        &parts.headers,
        &svc.limits,
    ) {
        Ok(h) => h,
        Err(e) => {
            svc.http_stats.bad_requests.fetch_add(1, Ordering::Relaxed);
            svc.http_stats.count_status(e.status);
            return Ok(local_response(
                &Local::error(e.status, e.reason),
                None,
                Method::Get,
            ));
        }
    };
    if let (Some(max), Some(n)) = (svc.max_body_size, head.content_length) {
        if n > max {
            svc.http_stats
                .bodies_too_large
                .fetch_add(1, Ordering::Relaxed);
            svc.http_stats.count_status(413);
            return Ok(local_response(
                &Local::error(413, "request body larger than max_body_size"),
                None,
                head.method,
            ));
        }
    }
    if head.method == Method::Connect {
        svc.http_stats.count_status(405);
        return Ok(local_response(
            &Local::error(405, "CONNECT is not served here"),
            None,
            head.method,
        ));
    }
    let (response, status, member, rule) = match svc.plan(&head, &st.client) {
        Plan::Drop => {
            svc.http_stats.dropped.fetch_add(1, Ordering::Relaxed);
            log(&svc, &st.client, &head, 0, 0, started, None, None);
            return Err(Dropped);
        }
        Plan::Local(l, rule) => {
            svc.http_stats.count_status(l.status);
            let r = local_response(&l, rule, head.method);
            let status = l.status;
            (r, status, None, rule)
        }
        Plan::Forward { target, rule } if svc.cache.as_ref().is_some_and(|c| c.applies(&head)) => {
            let t = svc.targets[target].clone();
            let reply = crate::cache::serve(&svc, &st.client, &t, target, rule, &head).await;
            let answer = match reply {
                crate::cache::Reply::Bypass => forward(&st, &t, target, rule, &head, Some(body))
                    .await
                    .map(|(r, m)| (r, Some(m))),
                crate::cache::Reply::Local(l) => Err(l),
                r => crate::cache::h2_response(r, head.method).ok_or_else(|| Local::error(502, "")),
            };
            match answer {
                Ok((r, member)) => {
                    let status = r.status().as_u16();
                    svc.http_stats.count_status(status);
                    (r, status, member, rule)
                }
                Err(l) => {
                    svc.http_stats.count_status(l.status);
                    (local_response(&l, rule, head.method), l.status, None, rule)
                }
            }
        }
        Plan::Forward { target, rule } => {
            let t = svc.targets[target].clone();
            let fwd = forward(&st, &t, target, rule, &head, Some(body));
            let result = match svc.request_timeout {
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
            };
            match result {
                Ok((r, member)) => {
                    let status = r.status().as_u16();
                    svc.http_stats.count_status(status);
                    if let Some(c) = &svc.cache {
                        let h = r.headers();
                        c.after_unsafe(
                            svc.scheme(),
                            &head,
                            status,
                            h.get(http::header::LOCATION).map(|v| v.as_bytes()),
                            h.get(http::header::CONTENT_LOCATION).map(|v| v.as_bytes()),
                        );
                    }
                    (r, status, Some(member), rule)
                }
                Err(l) => {
                    svc.http_stats.count_status(l.status);
                    (local_response(&l, rule, head.method), l.status, None, rule)
                }
            }
        }
    };
    let response = response.map(|b| st.watchdog.watch(b));
    let bytes = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    log(
        &svc, &st.client, &head, status, bytes, started, member, rule,
    );
    Ok(response)
}

#[allow(clippy::too_many_arguments)]
fn log(
    svc: &HttpService,
    client: &Client,
    req: &RequestHead,
    status: u16,
    bytes: u64,
    started: Instant,
    member: Option<std::net::SocketAddr>,
    rule: Option<&CompiledRule>,
) {
    if let Some(l) = &svc.access_log {
        l.record(&crate::access_log::Entry {
            client,
            req,
            status,
            bytes,
            duration: started.elapsed(),
            member,
            rule: rule.and_then(|r| r.name.as_deref()),
        });
    }
}

/// Forwards one stream to a member of `t`.
async fn forward(
    st: &State,
    t: &Arc<Target>,
    ti: usize,
    rule: Option<&CompiledRule>,
    head: &RequestHead,
    body: Option<Incoming>,
) -> Result<(Response<DownBody>, std::net::SocketAddr), Local> {
    let svc = &st.svc;
    let mut lookup = match &svc.sticky {
        Some(s) => s.lookup(head, st.client.ip, ti, &t.pool),
        None => Lookup::default(),
    };
    let ctx = PickContext {
        hash: request_hash(&t.pool, head, &st.client),
    };
    let body =
        body.map(|b| Limited::new(b, svc.max_body_size, svc.min_body_rate, svc.header_timeout));
    let verdict = body.as_ref().map(Limited::verdict_handle);
    let has_body = body.as_ref().is_some_and(|b| !b.is_end_stream());
    let framing = match head.content_length {
        Some(n) if n > 0 => ReqFraming::Length(n),
        _ if has_body => ReqFraming::Chunked,
        _ => ReqFraming::None,
    };
    if t.http2 {
        let replay = (!has_body).then(Bytes::new);
        let r = crate::h2_upstream::exchange(
            svc,
            t,
            rule,
            head,
            &st.client,
            &mut lookup,
            ctx,
            body.filter(|_| has_body)
                .map(|b| crate::body::UpBody::Limited(Box::new(b))),
            replay,
            framing,
        )
        .await
        .map_err(|l| body_cut(svc, verdict.as_ref()).unwrap_or(l))?;
        let member = r.picked.member.clone();
        let (parts, inner) = r.response.into_parts();
        let resp = ResponseHead::from_h2(&parts);
        t.observer.observe(&member, resp.status);
        if let Some(s) = &svc.sticky {
            s.remember(&mut lookup, member.address);
        }
        let (plan, encoder) =
            crate::compress::prepare(svc, head, &resp, resp.bodiless(head.method));
        let (insert_cookie, rewrite_id) =
            crate::sticky::response_ids(svc, ti, r.picked.index, &lookup);
        let mut sink = MapSink::default();
        fields::write_response_fields(
            &mut sink,
            &resp,
            &ResponseCtx {
                svc,
                target: t,
                member: r.picked.index,
                req: head,
                rule,
                insert_cookie,
                rewrite_id,
                framing: resp
                    .content_length
                    .filter(|_| encoder.is_none())
                    .map_or(RespFraming::Chunked, RespFraming::Length),
                close: false,
                h2: true,
                plan,
            },
        );
        let mut out = Response::new(DownBody::Relay(Box::new(Relay {
            inner,
            member: member.clone(),
            svc: svc.clone(),
            sent: r.sent,
            received: 0,
            reported: 0,
            finished: false,
            _request: r.request_guard,
            _connection: r.connection_guard,
        })));
        if let Some(s) = encoder {
            let inner = std::mem::replace(out.body_mut(), DownBody::Full(None));
            *out.body_mut() =
                DownBody::Compressed(Box::new(crate::compress::CompressBody::new(inner, s)));
        }
        *out.status_mut() = parts.status;
        *out.headers_mut() = sink.map;
        return Ok((out, member.address));
    }

    let retryable = head.method.is_idempotent() && !has_body;
    let mut body = body;
    let mut tried: Vec<usize> = Vec::new();
    let mut force_fresh = false;
    let private = svc.proxy_protocol.is_some() || t.reuse == Reuse::Never;
    loop {
        let remembered = lookup
            .member
            .and_then(|addr| t.pool.persistent(addr, &tried));
        let Some(picked) = remembered.or_else(|| t.pool.pick(&ctx, &tried)) else {
            return Err(if tried.is_empty() {
                svc.no_member(t, head, &st.client)
            } else {
                svc.stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
                Local::error(502, "no member could be reached")
            });
        };
        let member = picked.member.clone();
        let reused = if force_fresh {
            None
        } else if private {
            let mut p = st.private.lock();
            p.iter_mut()
                .position(|(m, c)| std::sync::Arc::ptr_eq(m, &member) && c.is_idle_alive())
                .map(|i| p.swap_remove(i).1)
        } else {
            t.conns
                .get(picked.index)
                .and_then(|s| s.take(t.reuse == Reuse::Safe && !retryable))
        };
        force_fresh = false;
        let fresh = reused.is_none();
        let mut conn = match reused {
            Some(c) => c,
            None => {
                let started = Instant::now();
                match upstream::connect(svc.snat.as_deref(), member.address, t.pool.connect_timeout)
                    .await
                {
                    Ok(mut io) => {
                        member.record_connect_success(started.elapsed());
                        if let Some(v) = svc.proxy_protocol {
                            let h = fulcrum_net::proxy_protocol::header(
                                v,
                                st.client.info.peer,
                                st.client.info.local,
                            );
                            if let Err(e) = io.write_all(&h).await {
                                member
                                    .record_passive_failure(&format!("writing PROXY header: {e}"));
                                return Err(Local::error(502, "the member broke the connection"));
                            }
                        }
                        match upstream::secure(
                            io,
                            t.tls.as_deref(),
                            member.address,
                            t.pool.connect_timeout,
                        )
                        .await
                        {
                            Ok(io) => UpstreamConn::new(io),
                            Err(e) => {
                                member.record_connect_failure(&format!("connect: {e}"));
                                svc.stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
                                return Err(Local::error(502, "no member could be reached"));
                            }
                        }
                    }
                    Err(e) if fulcrum_net::snat::is_snat_exhaustion(&e) => {
                        svc.stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
                        return Err(crate::h1::snat_exhausted());
                    }
                    Err(e) => {
                        member.record_connect_failure(&format!("connect: {e}"));
                        tried.push(picked.index);
                        if tried.len() > t.pool.retries as usize {
                            svc.stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
                            return Err(Local::error(502, "no member could be reached"));
                        }
                        svc.http_stats.retries.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
            }
        };
        let request_guard = member.open_request();
        conn.guard = Some(member.use_connection(fresh));
        conn.used += 1;
        let mut out = Vec::with_capacity(1024);
        fields::write_request_line(&mut out, head, rule);
        fields::write_request_fields(
            &mut out,
            head,
            &RequestCtx {
                svc,
                client: &st.client,
                rule,
                framing,
                h2: false,
            },
        );
        out.extend_from_slice(b"\r\n");
        let mut sent = out.len() as u64;
        let mut written = conn.io.write_all(&out).await;
        if written.is_ok() {
            if let Some(mut b) = body.take().filter(|_| has_body) {
                match send_body(&mut b, &mut conn, framing, svc.idle_timeout).await {
                    Ok(n) => sent += n,
                    Err(BodyError::Client) => {
                        return Err(body_cut(svc, verdict.as_ref()).unwrap_or_else(|| {
                            Local::error(400, "the request body was cut short")
                        }));
                    }
                    Err(BodyError::Member(e)) => written = Err(e),
                }
            }
        }
        let sent_at = Instant::now();
        let head_result = match written {
            Ok(()) => {
                let mut timer = crate::timer::Timer::new();
                timer.set(sent_at + t.response_timeout);
                crate::h1::read_response_head(
                    &mut conn,
                    &mut timer,
                    &mut tokio::io::sink(),
                    Version::Http2,
                )
                .await
            }
            Err(e) => Err(crate::h1::RespError::Io(e, false)),
        };
        let resp = match head_result {
            Ok(r) => r,
            Err(crate::h1::RespError::Timeout) => {
                svc.http_stats
                    .response_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                member.record_passive_failure(&format!(
                    "no response within {:?}",
                    t.response_timeout
                ));
                return Err(Local::error(504, "the member did not answer in time"));
            }
            Err(crate::h1::RespError::Bad(e)) => {
                member.record_passive_failure(e.reason);
                return Err(Local::error(502, e.reason));
            }
            Err(crate::h1::RespError::Client) => {
                return Err(Local::error(502, "interrupted"));
            }
            Err(crate::h1::RespError::Io(e, got_bytes)) => {
                if !fresh && !got_bytes && retryable {
                    force_fresh = true;
                    lookup.member = Some(member.address);
                    continue;
                }
                member.record_passive_failure(&format!("reset before any response: {e}"));
                if retryable && !got_bytes && tried.len() < t.pool.retries as usize {
                    tried.push(picked.index);
                    svc.http_stats.retries.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                svc.stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
                return Err(Local::error(502, "the member broke the connection"));
            }
        };
        member.stats.observe_response_time(sent_at.elapsed());
        t.observer.observe(&member, resp.status);
        if let Some(s) = &svc.sticky {
            s.remember(&mut lookup, member.address);
        }
        if resp.status == 101 {
            member.record_passive_failure("101 Switching Protocols without an upgrade request");
            return Err(Local::error(502, "unexpected 101 from the member"));
        }
        let bodiless = resp.bodiless(head.method);
        let (plan, encoder) = crate::compress::prepare(svc, head, &resp, bodiless);
        let in_framing = if bodiless {
            InFraming::None
        } else if resp.chunked {
            InFraming::Chunked(Decoder::default())
        } else if let Some(n) = resp.content_length {
            InFraming::Length(n)
        } else {
            InFraming::Close
        };
        let out_framing = match in_framing {
            InFraming::None => RespFraming::None,
            InFraming::Length(n) if encoder.is_none() => RespFraming::Length(n),
            _ => RespFraming::Chunked,
        };
        let (insert_cookie, rewrite_id) =
            crate::sticky::response_ids(svc, ti, picked.index, &lookup);
        let mut sink = MapSink::default();
        fields::write_response_fields(
            &mut sink,
            &resp,
            &ResponseCtx {
                svc,
                target: t,
                member: picked.index,
                req: head,
                rule,
                insert_cookie,
                rewrite_id,
                framing: out_framing,
                close: false,
                h2: true,
                plan,
            },
        );
        let status =
            http::StatusCode::from_u16(resp.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
        let reusable = !resp.close && !matches!(in_framing, InFraming::Close);
        let mut buf = std::mem::take(&mut conn.buf);
        let mut rb = resp.buf;
        rb.drain(..resp.head_len);
        buf.clear();
        conn.buf = rb;
        drop(buf);
        let body = MemberBody::new(
            conn,
            in_framing,
            Release {
                svc: svc.clone(),
                target: t.clone(),
                member_index: picked.index,
                member: member.clone(),
                private: private.then(|| st.private.clone()),
                reusable,
                sent,
            },
            svc.idle_timeout,
            request_guard,
        );
        let mut out = Response::new(match encoder {
            Some(s) => DownBody::Compressed(Box::new(crate::compress::CompressBody::new(
                DownBody::Member(Box::new(body)),
                s,
            ))),
            None => DownBody::Member(Box::new(body)),
        });
        *out.status_mut() = status;
        *out.headers_mut() = sink.map;
        return Ok((out, member.address));
    }
}

/// A bodiless request fetched from a member of `t` for the cache (HTTP/1 and HTTP/2 clients
/// alike): the response with a streaming body.
pub(crate) async fn fetch(
    svc: &Arc<HttpService>,
    client: &Client,
    t: &Arc<Target>,
    ti: usize,
    rule: Option<&CompiledRule>,
    head: &RequestHead,
) -> Result<(Response<DownBody>, std::net::SocketAddr), Local> {
    let st = State {
        svc: svc.clone(),
        client: client.clone(),
        private: PrivateConns::default(),
        active: AtomicUsize::new(0),
        last: AtomicU64::new(0),
        opened: AtomicU64::new(0),
        cancelled: AtomicU64::new(0),
        flood: tokio::sync::Notify::new(),
        read: Arc::new(AtomicU64::new(0)),
        watchdog: Watchdog::default(),
    };
    let fwd = forward(&st, t, ti, rule, head, None);
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

enum BodyError {
    Client,
    Member(io::Error),
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

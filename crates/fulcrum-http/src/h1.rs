//! HTTP/1.x client connections: keep-alive, pipelining (requests answered in order), bodies
//! streamed both ways, Upgrade tunnels, and every timeout of the exchange.
//!
//! One task per client connection runs this loop:
//!
//! ```text
//!   read head (header_timeout; idle_timeout between requests) ─▶ parse + validate (400/414/431)
//!   ─▶ plan (rules) ─▶ local answer | drop | forward:
//!        persistence / scheduler ─▶ member connection (idle store or connect, retries)
//!        ─▶ head (+ buffered body) in one write ─▶ body pump (early answers noticed)
//!        ─▶ response head (response_timeout) ─▶ client head (+ body) in one write ─▶ body relay
//!        ─▶ member connection back to its store
//! ```
//!
//! The request head stays in the connection's read buffer while it is served; the bytes after
//! it are the body and, with pipelining, the next requests. Nothing about a request is copied
//! out of that buffer, and the same write buffer is reused for every response.

mod filters;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::{clock, Member, MemberStats, Picked};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::body::{DownBody, InFraming};
use crate::chunked::{self, Decoder};
use crate::client::{Client, ConnInfo};
use crate::exchange::{self, read_response_head, Attempts, Failure, RespError, Route};
use crate::fields::{self, ReqFraming, RequestCtx, RespFraming};
use crate::h1_out::{write_timed, BODY_CHUNK};
use crate::h2_upstream::Outgoing;
use crate::head::{FieldKind, Parse, RequestHead, ResponseHead, Version};
use crate::local::Local;
use crate::plan::ResponsePlan;
use crate::rules::CompiledRule;
use crate::service::{HttpService, Plan, Successor};
use crate::sticky::Lookup;
use crate::timer::Timer;
use crate::upstream::{self, UpstreamConn};

/// Write buffers larger than this are shrunk between requests, so idle connections stay small.
const KEEP_BUFFER: usize = 16 * 1024;

/// A member connection bound to this client connection (`reuse = "never"`, or PROXY protocol,
/// whose header describes one client).
struct Private {
    member: Arc<Member>,
    conn: UpstreamConn,
}

struct Conn<S> {
    io: S,
    svc: Arc<HttpService>,
    client: Client,
    head: RequestHead,
    /// Where the unread part of the read buffer starts (past the current request's body).
    pos: usize,
    out: Vec<u8>,
    private: Option<Private>,
    served: u64,
    /// The current request's body has been read to its end (or it has none): the connection
    /// can carry another request.
    body_read: bool,
    timer: Timer,
    /// A reload changed the service while this connection was idle: its next response
    /// announces the close.
    announce_close: bool,
    /// The current request's way through the service's filters (dropped with the request,
    /// which ends the filters' contexts).
    filters: Option<Box<fulcrum_wasm::Stream>>,
}

/// A member's response head in hand, with the connection it came on.
struct Answer {
    picked: Picked,
    conn: UpstreamConn,
    resp: ResponseHead,
    /// Request bytes sent to the member.
    sent: u64,
    /// The member began to answer before the request body was complete.
    early: bool,
}

/// How an exchange ended, for the access log and the keep-alive decision.
#[derive(Debug, Default)]
struct Done {
    status: u16,
    bytes: u64,
    member: Option<SocketAddr>,
    keep: bool,
}

enum ReadHead {
    Request,
    Closed,
    Error(crate::head::HeadError),
    Timeout { partial: bool },
}

/// Serves one HTTP/1.x client connection; `buf` holds bytes already read from it.
pub(crate) async fn serve<S>(svc: Arc<HttpService>, io: S, info: ConnInfo, buf: Vec<u8>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut c = Conn {
        io,
        client: Client::new(info),
        head: RequestHead::with_buffer(buf),
        pos: 0,
        out: Vec::new(),
        private: None,
        served: 0,
        body_read: true,
        timer: Timer::new(),
        announce_close: false,
        filters: None,
        svc,
    };
    c.run().await;
}

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    async fn run(&mut self) {
        loop {
            match self.read_head().await {
                ReadHead::Request => {}
                ReadHead::Closed => return,
                ReadHead::Timeout { partial } => {
                    if partial {
                        self.svc
                            .http_stats
                            .header_timeouts
                            .fetch_add(1, Ordering::Relaxed);
                        let mut l = Local::error(408, "");
                        l.close = true;
                        let _ = self.answer(&l, None).await;
                    }
                    return;
                }
                ReadHead::Error(e) => {
                    self.svc
                        .http_stats
                        .bad_requests
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(service = %self.svc.name, client = %self.client.info.peer, status = e.status, reason = e.reason, "refused request");
                    let mut l = Local::error(e.status, e.reason);
                    l.close = true;
                    let _ = self.answer(&l, None).await;
                    return;
                }
            }
            self.served += 1;
            // A reload retired the service after this request began: it is served by the
            // version in force, closing after it if that one changed.
            if self.svc.is_retired() {
                self.follow_successor();
            }
            if std::mem::take(&mut self.announce_close) {
                self.head.close = true;
            }
            self.svc
                .stats
                .requests_total
                .fetch_add(1, Ordering::Relaxed);
            // Only the access log needs the request's start time.
            let started = self.svc.access_log.is_some().then(Instant::now);
            let svc = self.svc.clone();
            // Filters see the request before the rules, and may answer it themselves.
            let refused = match &svc.filters {
                // Boxed: the filters' states would otherwise enlarge every connection's future.
                Some(chain) => Box::pin(self.request_filters(chain)).await,
                None => None,
            };
            self.pos = self.head.head_len;
            self.body_read = !self.head.has_body();
            let plan = match refused {
                Some(local) => Plan::Local(local, None),
                None => svc.plan(&self.head, &self.client),
            };
            let done = match plan {
                Plan::Drop => {
                    svc.http_stats.dropped.fetch_add(1, Ordering::Relaxed);
                    self.log(&Done::default(), started, None);
                    return;
                }
                Plan::Local(local, rule) => {
                    let mut local = local;
                    // A body the client may still be sending is not read: close after.
                    self.skip_buffered_body();
                    local.close |= !self.body_read;
                    let mut d = self.answer(&local, rule).await;
                    d.keep &= !local.close;
                    self.log(&d, started, rule);
                    d
                }
                Plan::Forward { target, rule }
                    if svc.cache.as_ref().is_some_and(|c| c.applies(&self.head)) =>
                {
                    let t = svc.targets[target].clone();
                    let mut route = Route::new(&svc, &t, target, rule);
                    route.member = self
                        .filters
                        .as_deref()
                        .and_then(fulcrum_wasm::Stream::chosen_member);
                    // Boxed: the cache's states would otherwise enlarge every connection's
                    // future, idle keep-alive ones included, on services without a cache too.
                    let d = Box::pin(self.cached(route)).await;
                    self.log(&d, started, rule);
                    d
                }
                Plan::Forward { target, rule } => {
                    let t = svc.targets[target].clone();
                    let mut route = Route::new(&svc, &t, target, rule);
                    route.member = self
                        .filters
                        .as_deref()
                        .and_then(fulcrum_wasm::Stream::chosen_member);
                    // Boxed: an exchange's states (member connect, TLS, retries) are about 5 KiB;
                    // held inline they would make every connection's task that large, idle
                    // keep-alive ones included. One allocation per request costs far less than
                    // the copy of a 6 KiB task at every accept.
                    let exchange = Box::pin(self.forward(route));
                    let d = match svc.request_timeout {
                        Some(limit) => {
                            match tokio::time::timeout(limit, exchange).await {
                                Ok(d) => d,
                                Err(_) => {
                                    svc.http_stats
                                        .response_timeouts
                                        .fetch_add(1, Ordering::Relaxed);
                                    // Nothing may have reached the client yet; if something
                                    // did, the 504 is cut short by the close, which is what
                                    // the client must see anyway.
                                    let mut l = Local::error(504, "request_timeout");
                                    l.close = true;
                                    let mut d = self.answer(&l, rule).await;
                                    d.keep = false;
                                    d
                                }
                            }
                        }
                        None => exchange.await,
                    };
                    self.log(&d, started, rule);
                    d
                }
            };
            if !done.keep || self.head.close {
                self.close().await;
                return;
            }
            self.next_request();
        }
    }

    /// Ends the connection after its last response. A plain TCP socket gets no shutdown(2): the
    /// close(2) when it is dropped sends the same FIN, and on a connection per request the
    /// extra system call is a tenth of them. Layered streams (TLS) still get theirs, which
    /// sends close_notify.
    async fn close(&mut self) {
        if (&self.io as &dyn std::any::Any).is::<tokio::net::TcpStream>() {
            return;
        }
        let _ = self.io.shutdown().await;
    }

    /// Drops the served request from the buffer, keeping pipelined bytes after it.
    fn next_request(&mut self) {
        let buf = &mut self.head.buf;
        let pos = self.pos.min(buf.len());
        if pos == buf.len() {
            buf.clear();
        } else {
            buf.copy_within(pos.., 0);
            buf.truncate(buf.len() - pos);
        }
        self.head.reset();
        self.filters = None;
        self.pos = 0;
        if self.out.capacity() > KEEP_BUFFER {
            self.out = Vec::new();
        }
        if self.head.buf.capacity() > KEEP_BUFFER && self.head.buf.len() < 4096 {
            self.head.buf.shrink_to(4096);
        }
    }

    async fn read_head(&mut self) -> ReadHead {
        let limits = self.svc.limits;
        let first_wait = if self.served == 0 {
            self.svc.header_timeout
        } else {
            self.svc.idle_timeout
        };
        self.timer.set_after(first_wait);
        let mut started = false;
        // How far the buffer was searched for the end of the head. A head is parsed only once
        // its end may be there (or a limit is passed), so a client dripping a long head byte by
        // byte costs linear time, not a re-parse per byte.
        let mut scanned = 0usize;
        loop {
            if !self.head.buf.is_empty() {
                let buf = &self.head.buf;
                let from = scanned.saturating_sub(2);
                let may_end = memchr::memchr_iter(b'\n', &buf[from..]).any(|i| {
                    let rest = &buf[from + i + 1..];
                    rest.starts_with(b"\n") || rest.starts_with(b"\r\n")
                });
                let too_long = buf.len() >= limits.max_header_size
                    || (buf.len() > limits.max_uri + 32 && memchr::memchr(b'\n', buf).is_none());
                scanned = buf.len();
                if may_end || too_long {
                    match self.head.parse(&limits) {
                        Ok(Parse::Complete) => return ReadHead::Request,
                        Ok(Parse::Partial) => {}
                        Err(e) => return ReadHead::Error(e),
                    }
                }
                if !started {
                    started = true;
                    self.timer.set_after(self.svc.header_timeout);
                }
            }
            let buf = &mut self.head.buf;
            if buf.capacity() - buf.len() < 256 {
                // Double, up to the limit (plus one byte to notice it was passed).
                let want = buf.capacity().max(1024);
                let room = (limits.max_header_size + 1).saturating_sub(buf.len());
                buf.reserve(want.min(room).max(1));
            }
            let idle = self.head.buf.is_empty();
            let read = self.timer.run(self.io.read_buf(&mut self.head.buf));
            let result = if idle && self.served > 0 {
                // Between requests, a reload moves the connection to the service in force;
                // only a service that left the configuration closes it at once.
                tokio::select! {
                    biased;
                    r = read => r,
                    _ = self.svc.retired() => {
                        if self.follow_successor() {
                            continue;
                        }
                        return ReadHead::Closed;
                    }
                }
            } else {
                read.await
            };
            match result {
                Some(Ok(0)) | Some(Err(_)) => return ReadHead::Closed,
                Some(Ok(_)) => {}
                None => {
                    return ReadHead::Timeout {
                        partial: !self.head.buf.is_empty(),
                    }
                }
            }
        }
    }

    /// The service was retired by a reload: goes on with the version in force, announcing the
    /// close on the next response if it changed. False when the service is gone (the next
    /// response announces the close, an idle connection closes now).
    fn follow_successor(&mut self) -> bool {
        match self.svc.successor() {
            Successor::Same(next) => {
                self.svc = next;
                true
            }
            Successor::Changed(next) => {
                self.svc = next;
                self.announce_close = true;
                true
            }
            Successor::Gone => {
                self.announce_close = true;
                false
            }
        }
    }

    /// Before a response head: a reload that changed or removed the service during the
    /// exchange makes this response announce the close.
    fn announce_retirement(&mut self) {
        if self.svc.must_close() {
            self.head.close = true;
        }
    }

    fn body_buffered(&self) -> bool {
        !self.head.chunked
            && self
                .head
                .content_length
                .is_none_or(|n| n <= self.head.after_head().len() as u64)
    }

    /// Marks a fully buffered Content-Length body as read (a local answer did not need it).
    fn skip_buffered_body(&mut self) {
        if !self.body_buffered() {
            return;
        }
        if let Some(n) = self.head.content_length {
            self.pos = (self.head.head_len + n as usize).min(self.head.buf.len());
        }
        self.body_read = true;
    }

    fn log(&self, d: &Done, started: Option<Instant>, rule: Option<&CompiledRule>) {
        if let (Some(log), Some(started)) = (&self.svc.access_log, started) {
            log.record(&crate::access_log::Entry {
                client: &self.client,
                req: &self.head,
                status: d.status,
                bytes: d.bytes,
                duration: started.elapsed(),
                member: d.member,
                rule: rule.and_then(|r| r.name.as_deref()),
            });
        }
    }

    /// Writes a local answer (rule redirect/respond, or an error).
    async fn answer(&mut self, l: &Local, rule: Option<&CompiledRule>) -> Done {
        self.announce_retirement();
        self.out.clear();
        write_local(&mut self.out, l, &self.head, rule, &self.svc);
        self.svc.http_stats.count_status(l.status);
        let ok = self.io.write_all(&self.out).await.is_ok();
        Done {
            status: l.status,
            bytes: l.body.len() as u64,
            member: None,
            keep: ok && !l.close,
        }
    }

    /// 413: the body is larger than `max_body_size`; the connection closes (the rest of the
    /// body is not read).
    async fn too_large(&mut self, rule: Option<&CompiledRule>) -> Done {
        self.svc
            .http_stats
            .bodies_too_large
            .fetch_add(1, Ordering::Relaxed);
        let mut l = Local::error(413, "request body larger than max_body_size");
        l.close = true;
        self.fail(l, rule).await
    }

    /// Forwards the request to a member of the route's pool and its response to the client.
    async fn forward(&mut self, route: Route<'_>) -> Done {
        let svc = route.svc;
        let rule = route.rule;
        if self.head.chunked {
            // Chunked framing that arrived with the head is checked before any member sees the
            // request: a malformed body is refused whole, not forwarded in part.
            let mut d = Decoder::default();
            if let Err(e) = d.feed(self.head.after_head(), |_| {}) {
                svc.http_stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                let mut l = Local::error(400, e.0);
                l.close = true;
                return self.fail(l, rule).await;
            }
        }
        if let (Some(max), Some(n)) = (svc.max_body_size, self.head.content_length) {
            if n > max {
                return self.too_large(rule).await;
            }
        }
        let body_buffered = self.body_buffered();
        let replayable = !self.head.has_body() || body_buffered;
        let retryable = self.head.method.is_idempotent() && replayable;
        let mut attempts = Attempts::new(route, &self.head, &self.client, retryable);
        if route.target.http2 {
            return self.forward_h2(route, attempts).await;
        }
        let t = route.target;
        let framing = if self.head.chunked {
            ReqFraming::Chunked
        } else {
            match self.head.content_length {
                Some(n) if n > 0 => ReqFraming::Length(n),
                _ => ReqFraming::None,
            }
        };
        loop {
            let picked = match attempts.next(&self.head, &self.client) {
                Ok(p) => p,
                Err(l) => return self.fail(l, rule).await,
            };
            let member = picked.member.clone();
            let private = self
                .private
                .take()
                .filter(|p| Arc::ptr_eq(&p.member, &member))
                .and_then(|p| {
                    let mut c = p.conn;
                    c.is_idle_alive().then_some(c)
                });
            let fresh_only = attempts.fresh_only();
            let acquired = exchange::acquire(
                route,
                &picked,
                &self.client.info,
                private,
                fresh_only,
                retryable,
            )
            .await;
            let (mut conn, fresh) = match acquired {
                Ok(c) => c,
                Err(e) => match attempts.failed(&picked, Failure::Connect(e)) {
                    Ok(()) => continue,
                    Err(l) => return self.fail(l, rule).await,
                },
            };
            let _request = member.open_request();

            // The head, and the body bytes that came with it, in one write.
            self.out.clear();
            fields::write_request_line(&mut self.out, &self.head, rule);
            fields::write_request_fields(
                &mut self.out,
                &self.head,
                &RequestCtx {
                    settings: svc.field_settings(),
                    client: &self.client,
                    rule,
                    framing,
                    h2: false,
                },
            );
            self.out.extend_from_slice(b"\r\n");
            let head_len = self.out.len();
            let mut sent = head_len as u64;
            if body_buffered {
                if let ReqFraming::Length(n) = framing {
                    let body = &self.head.buf[self.head.head_len..self.head.head_len + n as usize];
                    self.out.extend_from_slice(body);
                    sent += n;
                    self.pos = self.head.head_len + n as usize;
                    self.body_read = true;
                }
            }
            // A streamed body: the head goes out with its first bytes (in `pump_body`), unless
            // the client waits for 100 Continue, which it gets once the member has the head.
            let wants_continue = self.head.expect_continue && self.head.version == Version::Http11;
            let carry = !body_buffered && !wants_continue;
            let written = if carry {
                Ok(())
            } else {
                conn.io.write_all(&self.out).await
            };
            let mut early = false;
            if written.is_ok() && !body_buffered {
                if wants_continue {
                    // The member never saw the Expect: the proxy asks for the body itself.
                    if self
                        .io
                        .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                        .await
                        .is_err()
                    {
                        return Done::default();
                    }
                }
                let carried = if carry { head_len } else { 0 };
                match self
                    .pump_body(&mut conn, t.pool.config.zero_window_timeout, carried)
                    .await
                {
                    Ok((n, e)) => {
                        sent += n.saturating_sub(carried as u64);
                        early = e;
                        self.body_read = !e;
                    }
                    Err(e) => return self.pump_failed(e, &member, rule).await,
                }
            }
            let sent_at = Instant::now();
            let head = match written {
                Ok(()) => {
                    self.timer.set(sent_at + t.response_timeout);
                    read_response_head(&mut conn, &mut self.timer, &mut self.io, self.head.version)
                        .await
                }
                Err(e) => Err(RespError::Io(e, false)),
            };
            let resp = match head {
                Ok(r) => r,
                Err(RespError::Client) => return Done::default(),
                Err(e) => match attempts.failed(&picked, Failure::of_response(e, fresh)) {
                    Ok(()) => {
                        // Sent again: the body is replayed from the buffer.
                        self.pos = self.head.head_len;
                        self.body_read = !self.head.has_body();
                        continue;
                    }
                    Err(mut l) => {
                        l.close = !self.body_done(early);
                        return self.fail(l, rule).await;
                    }
                },
            };
            attempts.answered(&picked, resp.status, sent_at.elapsed());
            let answer = Answer {
                picked,
                conn,
                resp,
                sent,
                early,
            };
            return self.respond(route, attempts.lookup(), answer).await;
        }
    }

    /// The answer when moving the request body to the member failed.
    async fn pump_failed(
        &mut self,
        e: PumpError,
        member: &Member,
        rule: Option<&CompiledRule>,
    ) -> Done {
        let l = match e {
            PumpError::Client => return Done::default(),
            PumpError::BadChunk(e) => {
                // What went to the member is well-formed but incomplete; the member connection
                // is dropped with it.
                self.svc
                    .http_stats
                    .bad_requests
                    .fetch_add(1, Ordering::Relaxed);
                let mut l = Local::error(400, e.0);
                l.close = true;
                l
            }
            PumpError::Member(e) => {
                // Body bytes already went out: never sent again.
                member.record_passive_failure(&format!("sending the request body: {e}"));
                Local::error(502, "the member broke the connection")
            }
            PumpError::Timeout => {
                let mut l = Local::error(408, "request body timeout");
                l.close = true;
                l
            }
            PumpError::TooSlow => {
                self.svc
                    .http_stats
                    .slow_bodies
                    .fetch_add(1, Ordering::Relaxed);
                let mut l = Local::error(408, "request body slower than min_body_rate");
                l.close = true;
                l
            }
            PumpError::TooLarge => return self.too_large(rule).await,
        };
        self.fail(l, rule).await
    }

    /// Answers a GET/HEAD through the service's cache (`crate::cache`).
    async fn cached(&mut self, route: Route<'_>) -> Done {
        let (svc, rule) = (route.svc, route.rule);
        let reply = if self.head.version == Version::Http11 {
            // The member's interim responses (103 Early Hints, …) reach the client as they
            // come, before the final answer; none is stored.
            let (tx, mut rx) = tokio::sync::mpsc::channel(crate::forward::INTERIM_QUEUE);
            let serve = crate::cached::serve(route, &self.client, &self.head, Some(&tx));
            tokio::pin!(serve);
            let mut client_ok = true;
            let reply = loop {
                tokio::select! {
                    r = &mut serve => break r,
                    Some(b) = rx.recv() => {
                        client_ok = client_ok && write_timed(&mut self.io, &mut self.timer, &b, svc.idle_timeout).await.is_ok();
                    }
                }
            };
            while let Ok(b) = rx.try_recv() {
                client_ok = client_ok
                    && write_timed(&mut self.io, &mut self.timer, &b, svc.idle_timeout)
                        .await
                        .is_ok();
            }
            reply
        } else {
            crate::cached::serve(route, &self.client, &self.head, None).await
        };
        match reply {
            crate::cache::Reply::Bypass => self.forward(route).await,
            crate::cache::Reply::Local(l) => self.fail(l, rule).await,
            r => {
                let r = match self.filters.take() {
                    Some(stream) => {
                        let pool = &route.target.pool.name;
                        let method = self.head.method;
                        match crate::cached::filtered(stream, r, method, pool).await {
                            Ok(r) => r,
                            Err(l) => return self.fail(l, rule).await,
                        }
                    }
                    None => r,
                };
                let client = crate::h1_out::Client {
                    io: &mut self.io,
                    timer: &mut self.timer,
                    out: &mut self.out,
                    idle: svc.idle_timeout,
                };
                let w = crate::cache::write_h1(client, &self.head, r).await;
                svc.http_stats.count_status(w.status);
                svc.stats.bytes_out.fetch_add(w.bytes, Ordering::Relaxed);
                Done {
                    status: w.status,
                    bytes: w.bytes,
                    member: w.member,
                    keep: w.keep,
                }
            }
        }
    }

    /// Whether the request body has been read completely (so the client connection can go on).
    fn body_done(&self, early: bool) -> bool {
        !early && self.body_read
    }

    async fn fail(&mut self, mut l: Local, rule: Option<&CompiledRule>) -> Done {
        // A body not read to its end leaves the connection out of step: close after answering.
        self.skip_buffered_body();
        l.close |= !self.body_read;
        let mut d = self.answer(&l, rule).await;
        d.keep &= !l.close;
        d
    }

    /// Moves the request body from the client to the member, re-framed. Returns the bytes sent
    /// (the `carried` ones included) and whether the member began to answer before the body was complete. With
    /// `zero_window` (the pool's `zero_window_timeout`), a plain-TCP member that takes none of
    /// the body for that long while its receive window is 0 fails the request (a passive
    /// failure, 502) instead of the client getting a 408 at the idle timeout.
    async fn pump_body(
        &mut self,
        conn: &mut UpstreamConn,
        zero_window: Option<Duration>,
        carried: usize,
    ) -> Result<(u64, bool), PumpError> {
        let idle = self.svc.idle_timeout;
        let mut remaining = if self.head.chunked {
            u64::MAX
        } else {
            self.head.content_length.unwrap_or(0)
        };
        let mut decoder = self.head.chunked.then(Decoder::default);
        let mut sent = 0u64;
        // The slow-body guard: time spent waiting for the client, against what its bytes buy
        // at `min_body_rate` on top of a grace of `header_timeout`.
        let (mut decoded, mut received, mut waited) = (0u64, 0u64, Duration::ZERO);
        let max_body = self.svc.max_body_size;
        let UpstreamConn {
            io: up,
            buf: up_buf,
            ..
        } = conn;
        // Plain TCP: the member's socket is watched for an early answer while the body goes
        // out. TLS: the stream cannot be read and written at once here, so the body is sent
        // whole (the member's answer waits in the socket buffer). An in-memory member (fuzz
        // and test builds) is no socket to split or watch: as TLS.
        let mut tcp_w;
        let (up_r, up_w): (
            Option<tokio::net::tcp::ReadHalf<'_>>,
            &mut (dyn AsyncWrite + Unpin + Send),
        ) = match up {
            upstream::MemberIo::Plain(tcp) => {
                let (r, w) = tcp.split();
                tcp_w = w;
                (Some(r), &mut tcp_w)
            }
            upstream::MemberIo::Tls(tls) => (None, &mut **tls),
            #[cfg(any(test, feature = "memory-members"))]
            upstream::MemberIo::Memory(m) => (None, m),
        };
        // `self.out` holds `carried` bytes (the request head) to go out with the first body
        // bytes: one write for a small chunked upload, as for a Content-Length one.
        let mut keep = carried;
        loop {
            // Encode what the buffer holds.
            self.out.truncate(keep);
            keep = 0;
            let avail = &self.head.buf[self.pos..];
            let mut finished = false;
            match &mut decoder {
                Some(d) => {
                    let out = &mut self.out;
                    let used = d
                        .feed(avail, |data| {
                            decoded += data.len() as u64;
                            chunked::encode_chunk(out, data)
                        })
                        .map_err(PumpError::BadChunk)?;
                    self.pos += used;
                    if max_body.is_some_and(|max| decoded > max) {
                        return Err(PumpError::TooLarge);
                    }
                    if d.is_done() {
                        self.out.extend_from_slice(chunked::END);
                        finished = true;
                    }
                }
                None => {
                    let n = (avail.len() as u64).min(remaining) as usize;
                    self.out.extend_from_slice(&avail[..n]);
                    self.pos += n;
                    remaining -= n as u64;
                    finished = remaining == 0;
                }
            }
            // Write it, watching for an early answer.
            self.timer.set_after(idle);
            let mut w = 0;
            while w < self.out.len() {
                tokio::select! {
                    biased;
                    r = readable(up_r.as_ref()) => {
                        if r.is_ok() && early_answer(up_r.as_ref(), up_buf)? {
                            return Ok((sent, true));
                        }
                    }
                    r = up_w.write(&self.out[w..]) => match r {
                        Ok(0) => return Err(PumpError::Member(io::ErrorKind::WriteZero.into())),
                        Ok(n) => { w += n; sent += n as u64; }
                        Err(e) => return Err(PumpError::Member(e)),
                    },
                    // A timer per blocked write, only with `zero_window_timeout` set.
                    _ = stalled_for(zero_window, up_r.as_ref()) => {
                        let d = zero_window.unwrap_or_default();
                        return Err(PumpError::Member(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("zero receive window for {:.1}s with data to send", d.as_secs_f64()),
                        )));
                    }
                    _ = self.timer.expired() => return Err(PumpError::Timeout),
                }
            }
            if finished {
                return Ok((sent, false));
            }
            // Read more from the client.
            if self.pos >= self.head.buf.len() {
                self.head.buf.truncate(self.head.head_len);
                self.pos = self.head.head_len;
            }
            self.head.buf.reserve(BODY_CHUNK);
            let (wait, slow) = self.body_wait(received, waited);
            self.timer.set_after(wait);
            let asked = Instant::now();
            tokio::select! {
                biased;
                r = readable(up_r.as_ref()) => {
                    if r.is_ok() && early_answer(up_r.as_ref(), up_buf)? {
                        return Ok((sent, true));
                    }
                }
                r = self.io.read_buf(&mut self.head.buf) => match r {
                    Ok(0) | Err(_) => return Err(PumpError::Client),
                    Ok(n) => received += n as u64,
                },
                _ = self.timer.expired() => {
                    return Err(if slow { PumpError::TooSlow } else { PumpError::Timeout })
                }
            }
            waited += asked.elapsed();
        }
    }

    /// How long to wait for more of the request body: `idle_timeout`, or less when the
    /// slow-body guard (a grace of `header_timeout` plus what the `received` bytes buy at
    /// `min_body_rate`, against the time already `waited`) runs out first, which `true` says.
    fn body_wait(&self, received: u64, waited: Duration) -> (Duration, bool) {
        let (idle, rate) = (self.svc.idle_timeout, self.svc.min_body_rate);
        if rate == 0 {
            return (idle, false);
        }
        let earned =
            self.svc.header_timeout + Duration::from_secs_f64(received as f64 / rate as f64);
        let left = earned.saturating_sub(waited);
        if left < idle {
            (left, true)
        } else {
            (idle, false)
        }
    }

    /// Sends the response head and body to the client, then puts the member connection back.
    async fn respond(&mut self, route: Route<'_>, lookup: &Lookup, a: Answer) -> Done {
        let Answer {
            picked,
            mut conn,
            mut resp,
            sent,
            early,
        } = a;
        let (svc, rule) = (route.svc, route.rule);
        let picked = &picked;
        let member = &picked.member;
        if let Err(l) = self
            .response_filters(&mut resp, route, member.address)
            .await
        {
            // The member's answer is replaced: its connection, mid-response, is not reused.
            drop(conn);
            return self.fail(l, rule).await;
        }
        let status = resp.status;
        svc.http_stats.count_status(status);
        if let Some(c) = &svc.cache {
            invalidate(c, svc, &self.head, &resp);
        }
        let upgrade = status == 101;
        if upgrade && self.head.upgrade().is_none() {
            member.record_passive_failure("101 Switching Protocols without an upgrade request");
            return self
                .fail(Local::error(502, "unexpected 101 from the member"), rule)
                .await;
        }
        let body_filter = self.body_filter();
        let mut plan =
            ResponsePlan::new(route, &self.head, picked.index, lookup, &resp, body_filter);
        let in_framing = plan.member_framing(&resp);
        let out_framing = plan.framing;
        let mut encoder = plan.encoder.take();
        let body_complete = self.body_done(early);
        self.announce_retirement();
        let close = self.head.close || !body_complete || out_framing == RespFraming::Close;
        self.out.clear();
        plan.write_h1_head(&mut self.out, route, &self.head, &resp, close && !upgrade);
        let head_bytes = self.out.len() as u64;
        // The body bytes that came with the head follow in the same write.
        let mut body = std::mem::take(&mut resp.buf);
        body.drain(..resp.head_len);
        conn.buf = body;
        let member_close = resp.close;
        drop(resp);

        if upgrade {
            let sent_head = self.io.write_all(&self.out).await;
            if sent_head.is_err() {
                return Done::default();
            }
            let leftover_client = self.head.buf.split_off(self.pos.min(self.head.buf.len()));
            let mut live = member.stats.live();
            let (up, down) = fulcrum_net::relay::run(
                &mut self.io,
                &leftover_client,
                &mut conn.io,
                &conn.buf,
                svc.idle_timeout,
                &mut |sent, received| live.add(sent, received),
            )
            .await;
            drop(live);
            member.stats.add_bytes(sent, 0);
            svc.stats.bytes_in.fetch_add(up, Ordering::Relaxed);
            svc.stats
                .bytes_out
                .fetch_add(head_bytes + down, Ordering::Relaxed);
            member.record_exchange_success();
            return Done {
                status,
                bytes: down,
                member: Some(member.address),
                keep: false,
            };
        }

        let relayed = match &mut encoder {
            // Boxed for the same reason as the cache path: only compressed answers pay for it.
            Some(s) => {
                let mut w = crate::h1_out::Client {
                    io: &mut self.io,
                    timer: &mut self.timer,
                    out: &mut self.out,
                    idle: svc.idle_timeout,
                };
                let chunked_out = out_framing == RespFraming::Chunked;
                Box::pin(crate::transform::relay_h1(
                    &mut w,
                    &mut conn,
                    in_framing,
                    chunked_out,
                    s,
                    &member.stats,
                ))
                .await
            }
            .map_err(|(sent, received, member_fault)| Cut {
                sent,
                received,
                member_fault,
            }),
            None => {
                self.relay_body(
                    &mut conn,
                    in_framing,
                    out_framing,
                    svc.idle_timeout,
                    &member.stats,
                )
                .await
            }
        };
        let (body_bytes, received, reusable) = match relayed {
            Ok(r) => r,
            Err(r) => {
                member.stats.add_bytes(sent, r.received);
                svc.stats
                    .bytes_out
                    .fetch_add(head_bytes + r.sent, Ordering::Relaxed);
                if r.member_fault {
                    member.record_passive_failure("the response body was cut short");
                }
                return Done {
                    status,
                    bytes: r.sent,
                    member: Some(member.address),
                    keep: false,
                };
            }
        };
        member.stats.add_bytes(sent, received);
        svc.stats.bytes_in.fetch_add(sent, Ordering::Relaxed);
        svc.stats
            .bytes_out
            .fetch_add(head_bytes + body_bytes, Ordering::Relaxed);
        if reusable && !member_close && !early && body_complete {
            self.release(route, picked, conn);
        }
        Done {
            status,
            bytes: body_bytes,
            member: Some(member.address),
            keep: !close,
        }
    }

    fn release(&mut self, route: Route<'_>, picked: &Picked, mut conn: UpstreamConn) {
        conn.guard = None;
        if route.private_conns() {
            conn.last_ok_ms = clock::now_ms();
            conn.buf.clear();
            self.private = Some(Private {
                member: picked.member.clone(),
                conn,
            });
        } else if let Some(store) = route.target.conns.get(picked.index) {
            store.put(conn);
        }
    }

    /// Moves the response body from the member to the client. `self.out` holds the response
    /// head, which goes out with the first body bytes. Bytes from the member reach `member`'s
    /// counters in batches while they flow (a long download counts for weighted least traffic
    /// while it lasts). Returns (body bytes to the client, bytes from the member not yet added to
    /// `member`, whether the member connection ended cleanly and may be reused).
    async fn relay_body(
        &mut self,
        conn: &mut UpstreamConn,
        mut framing: InFraming,
        out_framing: RespFraming,
        idle: Duration,
        member: &MemberStats,
    ) -> Result<(u64, u64, bool), Cut> {
        let mut to_client = 0u64;
        let mut received = conn.buf.len() as u64;
        let mut first = true;
        loop {
            let (consumed, finished) = match &mut framing {
                InFraming::None => (0, true),
                InFraming::Length(remaining) => {
                    let n = (conn.buf.len() as u64).min(*remaining) as usize;
                    *remaining -= n as u64;
                    if first || self.out.len() + n <= BODY_CHUNK {
                        self.out.extend_from_slice(&conn.buf[..n]);
                    } else {
                        // Large bodies go out from the read buffer without a copy.
                        write_timed(&mut self.io, &mut self.timer, &self.out, idle)
                            .await
                            .map_err(|_| Cut::client(to_client, received))?;
                        self.out.clear();
                        write_timed(&mut self.io, &mut self.timer, &conn.buf[..n], idle)
                            .await
                            .map_err(|_| Cut::client(to_client, received))?;
                    }
                    to_client += n as u64;
                    (n, *remaining == 0)
                }
                InFraming::Chunked(d) => {
                    let out = &mut self.out;
                    let before = out.len();
                    let chunked_out = out_framing == RespFraming::Chunked;
                    let used = d
                        .feed(&conn.buf, |data| {
                            if chunked_out {
                                chunked::encode_chunk(out, data);
                            } else {
                                out.extend_from_slice(data);
                            }
                        })
                        .map_err(|_| Cut::member(to_client, received))?;
                    to_client += (self.out.len() - before) as u64;
                    let done = d.is_done();
                    if done && chunked_out {
                        self.out.extend_from_slice(chunked::END);
                    }
                    (used, done)
                }
                InFraming::Close => {
                    let before = self.out.len();
                    if out_framing == RespFraming::Chunked {
                        chunked::encode_chunk(&mut self.out, &conn.buf);
                    } else {
                        self.out.extend_from_slice(&conn.buf);
                    }
                    to_client += (self.out.len() - before) as u64;
                    (conn.buf.len(), false)
                }
            };
            first = false;
            if consumed == conn.buf.len() {
                conn.buf.clear();
            } else {
                conn.buf.drain(..consumed);
            }
            if finished || self.out.len() >= BODY_CHUNK {
                write_timed(&mut self.io, &mut self.timer, &self.out, idle)
                    .await
                    .map_err(|_| Cut::client(to_client, received))?;
                self.out.clear();
            }
            if finished {
                // Bytes after the response: the member is out of step, do not reuse.
                return Ok((to_client, received, conn.buf.is_empty()));
            }
            if !self.out.is_empty() {
                write_timed(&mut self.io, &mut self.timer, &self.out, idle)
                    .await
                    .map_err(|_| Cut::client(to_client, received))?;
                self.out.clear();
            }
            conn.buf.reserve(BODY_CHUNK);
            self.timer.set_after(idle);
            match self.timer.run(conn.io.read_buf(&mut conn.buf)).await {
                Some(Ok(0)) => {
                    if let InFraming::Close = framing {
                        if out_framing == RespFraming::Chunked {
                            write_timed(&mut self.io, &mut self.timer, chunked::END, idle)
                                .await
                                .map_err(|_| Cut::client(to_client, received))?;
                        }
                        return Ok((to_client, received, false));
                    }
                    return Err(Cut::member(to_client, received));
                }
                Some(Ok(n)) => {
                    received += n as u64;
                    member.add_live(&mut 0, &mut received);
                }
                Some(Err(_)) | None => return Err(Cut::member(to_client, received)),
            }
        }
    }
}

/// A response body that could not be relayed completely.
struct Cut {
    sent: u64,
    received: u64,
    member_fault: bool,
}

impl Cut {
    fn client(sent: u64, received: u64) -> Cut {
        Cut {
            sent,
            received,
            member_fault: false,
        }
    }
    fn member(sent: u64, received: u64) -> Cut {
        Cut {
            sent,
            received,
            member_fault: true,
        }
    }
}

#[derive(Debug)]
enum PumpError {
    Client,
    /// The client's chunked framing is invalid.
    BadChunk(crate::chunked::ChunkError),
    Member(io::Error),
    Timeout,
    /// The body came slower than `min_body_rate`.
    TooSlow,
    /// The (chunked) body grew past `max_body_size`.
    TooLarge,
}

/// The member's socket reported readable while the body was being sent: either a spurious
/// readiness (nothing to read; cleared), or the start of an answer.
fn early_answer(
    io: Option<&tokio::net::tcp::ReadHalf<'_>>,
    buf: &mut Vec<u8>,
) -> Result<bool, PumpError> {
    let Some(io) = io else { return Ok(false) };
    let io: &tokio::net::TcpStream = io.as_ref();
    buf.reserve(4096);
    match io.try_read_buf(buf) {
        Ok(0) => Err(PumpError::Member(io::ErrorKind::UnexpectedEof.into())),
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        Err(e) => Err(PumpError::Member(e)),
    }
}

/// Readiness of a plain member socket; never, for TLS (see `pump_body`).
/// Resolves once `after` has passed and the member's advertised receive window is 0 (checked
/// again every quarter period while it is not); never without `after` or a plain socket.
async fn stalled_for(after: Option<Duration>, io: Option<&tokio::net::tcp::ReadHalf<'_>>) {
    let (Some(after), Some(io)) = (after, io) else {
        return std::future::pending().await;
    };
    tokio::time::sleep(after).await;
    while fulcrum_net::forward::receive_window(io.as_ref()) != Some(0) {
        tokio::time::sleep(after / 4).await;
    }
}

async fn readable(io: Option<&tokio::net::tcp::ReadHalf<'_>>) -> io::Result<()> {
    match io {
        Some(r) => r.as_ref().readable().await,
        None => std::future::pending().await,
    }
}

/// Writes `buf` to the client within `idle`; false when it could not.
/// Cache invalidation after an unsafe request (`crate::cache`, RFC 9111 §4.4).
fn invalidate(
    cache: &crate::cache::HttpCache,
    svc: &HttpService,
    req: &RequestHead,
    resp: &ResponseHead,
) {
    let field = |kind| {
        resp.fields
            .iter()
            .find(|f| f.kind == kind)
            .map(|f| resp.value(f))
    };
    cache.after_unsafe(
        svc.scheme(),
        req,
        resp.status,
        field(crate::head::FieldKind::Location),
        resp.fields
            .iter()
            .find(|f| resp.name(f).eq_ignore_ascii_case(b"content-location"))
            .map(|f| resp.value(f)),
    );
}

/// Writes a local answer for an HTTP/1.x client.
pub(crate) fn write_local(
    out: &mut Vec<u8>,
    l: &Local,
    req: &RequestHead,
    rule: Option<&CompiledRule>,
    svc: &HttpService,
) {
    fields::write_status_line(out, l.status, b"");
    out.extend_from_slice(b"date: ");
    crate::date::append_http_date(out);
    out.extend_from_slice(b"\r\n");
    if let Some(loc) = &l.location {
        out.extend_from_slice(b"location: ");
        out.extend_from_slice(loc);
        out.extend_from_slice(b"\r\n");
    }
    if l.retry_after {
        out.extend_from_slice(b"retry-after: 5\r\n");
    }
    if !l.body.is_empty() && !l.fields.iter().any(|(n, _)| n == b"content-type") {
        out.extend_from_slice(b"content-type: text/plain; charset=utf-8\r\n");
    }
    for (n, v) in &l.fields {
        if FieldKind::of(n).is_hop_by_hop() || n.eq_ignore_ascii_case(b"date") {
            continue;
        }
        out.extend_from_slice(n);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    if let Some(e) = rule.and_then(|r| r.response_headers.as_ref()) {
        for (n, v) in e.set.iter().chain(&e.add) {
            out.extend_from_slice(n.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    let _ = svc;
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(l.body.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    if l.close || req.close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if req.version == Version::Http10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if req.method != crate::head::Method::Head {
        out.extend_from_slice(&l.body);
    }
}

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Forwards to a pool that speaks HTTP/2 to its members.
    async fn forward_h2(&mut self, route: Route<'_>, mut attempts: Attempts<'_>) -> Done {
        let (svc, rule) = (route.svc, route.rule);
        let body_buffered = self.body_buffered();
        let framing = match self.head.content_length {
            Some(n) if n > 0 => ReqFraming::Length(n),
            _ => ReqFraming::None,
        };
        let exchange = if !self.head.has_body() || body_buffered {
            let replay = match self.head.content_length {
                Some(n) if n > 0 => {
                    let start = self.head.head_len;
                    self.pos = start + n as usize;
                    self.body_read = true;
                    bytes::Bytes::copy_from_slice(&self.head.buf[start..start + n as usize])
                }
                _ => bytes::Bytes::new(),
            };
            let out = Outgoing {
                body: None,
                replay: Some(replay),
                framing,
            };
            crate::h2_upstream::exchange(route, &mut attempts, &self.head, &self.client, out).await
        } else {
            // Stream the body through a channel while the request is under way.
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            if self.head.expect_continue
                && self.head.version == Version::Http11
                && self
                    .io
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await
                    .is_err()
            {
                return Done::default();
            }
            let Conn {
                io, head, client, ..
            } = self;
            let initial = bytes::Bytes::copy_from_slice(head.after_head());
            let pump = pump_to_channel(
                io,
                initial,
                head.chunked,
                head.content_length,
                tx,
                svc.idle_timeout,
            );
            let out = Outgoing {
                body: Some(crate::body::UpBody::Channel(rx)),
                replay: None,
                framing: if head.chunked {
                    ReqFraming::Chunked
                } else {
                    framing
                },
            };
            let send = crate::h2_upstream::exchange(route, &mut attempts, head, client, out);
            let (r, pumped) = tokio::join!(send, pump);
            match pumped {
                Ok(leftover) => {
                    // Pipelined bytes after the body stay for the next request.
                    let hl = self.head.head_len;
                    self.head.buf.truncate(hl);
                    self.head.buf.extend_from_slice(&leftover);
                    self.pos = hl;
                    self.body_read = true;
                }
                Err(()) => {
                    self.head.close = true;
                }
            }
            r
        };
        let r = match exchange {
            Ok(r) => r,
            Err(l) => return self.fail(l, rule).await,
        };
        let (member, index) = (r.picked.member.clone(), r.picked.index);
        // The body counts the member's bytes and the service's as it flows (`Relay`).
        let (parts, relay) = r.into_relay(svc.stats.clone());
        let mut resp = ResponseHead::from_h2(&parts);
        if let Err(l) = self
            .response_filters(&mut resp, route, member.address)
            .await
        {
            drop(relay);
            return self.fail(l, rule).await;
        }
        let status = resp.status;
        svc.http_stats.count_status(status);
        if let Some(c) = &svc.cache {
            invalidate(c, svc, &self.head, &resp);
        }
        let body_filter = self.body_filter();
        let mut plan = ResponsePlan::new(
            route,
            &self.head,
            index,
            attempts.lookup(),
            &resp,
            body_filter,
        );
        let out_framing = plan.framing;
        let mut body = plan.filter(DownBody::Relay(Box::new(relay)));
        self.announce_retirement();
        let close = self.head.close || out_framing == RespFraming::Close;
        self.out.clear();
        plan.write_h1_head(&mut self.out, route, &self.head, &resp, close);
        svc.stats
            .bytes_out
            .fetch_add(self.out.len() as u64, Ordering::Relaxed);
        let idle = svc.idle_timeout;
        let mut delivered = 0u64;
        let client = crate::h1_out::Client {
            io: &mut self.io,
            timer: &mut self.timer,
            out: &mut self.out,
            idle,
        };
        let ok = if out_framing == RespFraming::None {
            write_timed(client.io, client.timer, client.out, idle)
                .await
                .is_ok()
        } else {
            let chunked = out_framing == RespFraming::Chunked;
            crate::h1_out::relay_body(client, &mut body, chunked, |n| delivered += n as u64).await
        };
        Done {
            status,
            bytes: delivered,
            member: Some(member.address),
            keep: ok && !close,
        }
    }
}

/// Reads an HTTP/1.1 client's request body and sends it, de-framed, into a channel (the body of
/// a request to an HTTP/2 member). Returns the bytes read past the body's end (pipelining).
async fn pump_to_channel<R: AsyncRead + Unpin>(
    io: &mut R,
    initial: bytes::Bytes,
    chunked: bool,
    length: Option<u64>,
    tx: tokio::sync::mpsc::Sender<Result<bytes::Bytes, crate::body::BoxError>>,
    idle: Duration,
) -> Result<Vec<u8>, ()> {
    let mut decoder = chunked.then(Decoder::default);
    let mut remaining = length.unwrap_or(0);
    let mut buf: Vec<u8> = initial.to_vec();
    loop {
        let mut data = Vec::new();
        let used = match &mut decoder {
            Some(d) => d
                .feed(&buf, |b| data.extend_from_slice(b))
                .map_err(|_| ())?,
            None => {
                let n = (buf.len() as u64).min(remaining) as usize;
                data.extend_from_slice(&buf[..n]);
                remaining -= n as u64;
                n
            }
        };
        buf.drain(..used);
        if !data.is_empty() && tx.send(Ok(bytes::Bytes::from(data))).await.is_err() {
            return Err(());
        }
        let finished = match &decoder {
            Some(d) => d.is_done(),
            None => remaining == 0,
        };
        if finished {
            return Ok(buf);
        }
        buf.reserve(BODY_CHUNK);
        match tokio::time::timeout(idle, io.read_buf(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => {
                let _ = tx
                    .send(Err("the client stopped sending the request body".into()))
                    .await;
                return Err(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::client::{Alpn, ConnInfo};
    use crate::testing::{member, service, service_to};

    /// Sends `requests` (the last asks for the close) to the HTTP/1 adapter over an in-memory
    /// stream; returns all the adapter wrote back.
    async fn exchange(svc: std::sync::Arc<crate::HttpService>, requests: &[u8]) -> String {
        let (mut client, server) = tokio::io::duplex(256 * 1024);
        let info = ConnInfo {
            peer: "127.0.0.9:5000".parse().expect("address"),
            local: "127.0.0.1:80".parse().expect("address"),
            alpn: Alpn::Http1,
            sni: None,
        };
        let conn = tokio::spawn(crate::serve_connection(svc, server, info));
        client.write_all(requests).await.expect("requests written");
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut out))
            .await
            .expect("the adapter closes after the last request")
            .expect("read");
        conn.await.expect("the connection task ends");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order_over_one_member_connection() {
        let (addr, seen, conns) = member("hello").await;
        let svc = service_to(&[addr], "", "", "");
        let out = exchange(
            svc,
            b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b?q=1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        let answers: Vec<&str> = out.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
        assert_eq!(answers.len(), 2, "{out}");
        assert!(
            answers.iter().all(|a| a.ends_with("\r\n\r\nhello")),
            "{out}"
        );
        assert!(!answers[0].contains("connection: close"), "{out}");
        assert!(answers[1].contains("connection: close"), "{out}");
        let seen = seen.lock();
        assert!(seen[0].starts_with("GET /a HTTP/1.1\r\n"), "{seen:?}");
        assert!(seen[1].starts_with("GET /b?q=1 HTTP/1.1\r\n"), "{seen:?}");
        for head in seen.iter() {
            assert!(head.contains("host: x\r\n"), "{head}");
            assert!(head.contains("x-forwarded-for: 127.0.0.9\r\n"), "{head}");
            assert!(!head.contains("connection: close"), "hop-by-hop: {head}");
        }
        assert_eq!(*conns.lock(), 1, "the member connection was reused");
    }

    #[tokio::test]
    async fn a_request_body_goes_to_the_member_and_the_connection_goes_on() {
        let (addr, seen, _) = member("ok").await;
        let svc = service_to(&[addr], "", "", "");
        let out = exchange(
            svc,
            b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhelloGET /after HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
        let seen = seen.lock();
        assert!(seen[0].starts_with("POST /up HTTP/1.1\r\n"), "{seen:?}");
        assert!(seen[0].contains("content-length: 5\r\n"), "{seen:?}");
        assert!(seen[0].ends_with("\r\n\r\nhello"), "{seen:?}");
        assert!(
            seen[1].starts_with("GET /after HTTP/1.1\r\n"),
            "the bytes after the body are the next request: {seen:?}"
        );
    }

    #[tokio::test]
    async fn without_a_member_the_client_gets_502_and_keeps_its_connection() {
        // Members nobody listens on: every connect is refused at once.
        let svc = service(2, "", "");
        let out = exchange(
            svc.clone(),
            b"GET / HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(out.matches("HTTP/1.1 502 ").count(), 2, "{out}");
    }

    #[tokio::test]
    async fn a_bad_request_is_answered_and_the_connection_closed() {
        let svc = service(1, "", "");
        // Two Content-Length values: ambiguous framing (RFC 9112 §6.3), never forwarded.
        let out = exchange(
            svc,
            b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
        assert!(out.contains("connection: close\r\n"), "{out}");
        let big = format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "a".repeat(70_000)
        );
        let out = exchange(service(1, "", ""), big.as_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
    }
}

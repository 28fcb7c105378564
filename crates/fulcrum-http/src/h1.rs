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

mod body;
mod filters;
mod forward;
mod respond;
mod session;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_balance::Member;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::client::{Client, ConnInfo};
use crate::exchange::Route;
use crate::fields;
use crate::head::{FieldKind, Parse, RequestHead, Version};
use crate::local::Local;
use crate::rules::CompiledRule;
use crate::service::{HttpService, Plan, Successor};
use crate::timer::Timer;
use crate::upstream::UpstreamConn;

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
                        let l = Local::closing_error(408, "");
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
                    let l = Local::closing_error(e.status, e.reason);
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
                    route.member = self.filter_member();
                    // Boxed: the cache's states would otherwise enlarge every connection's
                    // future, idle keep-alive ones included, on services without a cache too.
                    let d = Box::pin(self.cached(route)).await;
                    self.log(&d, started, rule);
                    d
                }
                Plan::Forward { target, rule } => {
                    let t = svc.targets[target].clone();
                    let mut route = Route::new(&svc, &t, target, rule);
                    route.member = self.filter_member();
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
                                    let l = Local::closing_error(504, "request_timeout");
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
        let l = Local::closing_error(413, "request body larger than max_body_size");
        self.fail(l, rule).await
    }

    /// The member a request filter chose (`fulcrum.member`), if any.
    #[inline]
    fn filter_member(&self) -> Option<std::net::SocketAddr> {
        self.filters
            .as_deref()
            .and_then(fulcrum_wasm::Stream::chosen_member)
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

#[cfg(test)]
mod tests;

//! Forwarding a request to a member: the attempts over HTTP/1 members, the way through the
//! cache, and the pools that speak HTTP/2 to their members.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::Member;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::body::PumpError;
use super::respond::invalidate;
use super::{Answer, Conn, Done};
use crate::body::DownBody;
use crate::chunked::Decoder;
use crate::exchange::{self, read_response_head, Attempts, Failure, RespError, Route};
use crate::fields::{self, ReqFraming, RequestCtx, RespFraming};
use crate::h1_out::{write_timed, BODY_CHUNK};
use crate::h2_upstream::Outgoing;
use crate::head::{ResponseHead, Version};
use crate::local::Local;
use crate::plan::ResponsePlan;
use crate::rules::CompiledRule;

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Forwards the request to a member of the route's pool and its response to the client.
    pub(super) async fn forward(&mut self, route: Route<'_>) -> Done {
        let rule = route.rule;
        if let Some(refused) = self.refuse_body_early(route).await {
            return refused;
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

            let (head_len, mut sent) = self.write_member_head(route, framing, body_buffered);
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

    /// A body the request cannot have is refused before any member sees it: chunked framing
    /// that arrived malformed with the head (refused whole, not forwarded in part), or a
    /// Content-Length past `max_body_size`.
    async fn refuse_body_early(&mut self, route: Route<'_>) -> Option<Done> {
        let (svc, rule) = (route.svc, route.rule);
        if self.head.chunked {
            let mut d = Decoder::default();
            if let Err(e) = d.feed(self.head.after_head(), |_| {}) {
                svc.http_stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                let mut l = Local::error(400, e.0);
                l.close = true;
                return Some(self.fail(l, rule).await);
            }
        }
        if let (Some(max), Some(n)) = (svc.max_body_size, self.head.content_length) {
            if n > max {
                return Some(self.too_large(rule).await);
            }
        }
        None
    }

    /// Puts the request head for the member in `self.out`, and the body after it when the head
    /// brought all of it (one write). Returns the head's length and the bytes to send.
    fn write_member_head(
        &mut self,
        route: Route<'_>,
        framing: ReqFraming,
        body_buffered: bool,
    ) -> (usize, u64) {
        let rule = route.rule;
        self.out.clear();
        fields::write_request_line(&mut self.out, &self.head, rule);
        fields::write_request_fields(
            &mut self.out,
            &self.head,
            &RequestCtx {
                settings: route.svc.field_settings(),
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
        (head_len, sent)
    }

    /// The answer when moving the request body to the member failed.
    pub(super) async fn pump_failed(
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
    pub(super) async fn cached(&mut self, route: Route<'_>) -> Done {
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

    /// Forwards to a pool that speaks HTTP/2 to its members.
    pub(super) async fn forward_h2(
        &mut self,
        route: Route<'_>,
        mut attempts: Attempts<'_>,
    ) -> Done {
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
pub(super) async fn pump_to_channel<R: AsyncRead + Unpin>(
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

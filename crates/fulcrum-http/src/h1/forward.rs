//! Forwarding a request to a member: the attempts over HTTP/1 members, the way through the
//! cache, and the pools that speak HTTP/2 to their members.

use std::sync::atomic::Ordering;

use tokio::io::{AsyncRead, AsyncWrite};

use super::body::PumpError;
use super::respond::invalidate;
use super::{Conn, Done};
use crate::body::DownBody;
use crate::chunked::Decoder;
use crate::exchange::{Attempts, Route};
use crate::fields::RespFraming;
use crate::h1_out::write_timed;
use crate::h2_upstream::H2Response;
use crate::head::{ResponseHead, Version};
use crate::local::Local;
use crate::plan::ResponsePlan;
use crate::request_loop::{self, Ended, MemberAnswer};
use crate::rules::CompiledRule;
use crate::sticky::Lookup;

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
        let replayable = !self.head.has_body() || self.body_buffered();
        let retryable = self.head.method.is_idempotent() && replayable;
        let mut attempts = Attempts::new(route, &self.head, &self.client, retryable);
        match request_loop::run(route, &mut attempts, self).await {
            Ok(MemberAnswer::Http1(a)) => self.respond(route, attempts.lookup(), a).await,
            Ok(MemberAnswer::Http2(r)) => self.respond_h2(route, attempts.lookup(), r).await,
            Err(Ended::Answer(l)) => self.fail(l, rule).await,
            Err(Ended::ClientGone) => Done::default(),
            Err(Ended::Stop(e)) => self.pump_failed(e, rule).await,
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
                let l = Local::closing_error(400, e.0);
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

    /// The answer when moving the request body to the member failed.
    pub(super) async fn pump_failed(&mut self, e: PumpError, rule: Option<&CompiledRule>) -> Done {
        let l = match e {
            PumpError::Client => return Done::default(),
            PumpError::BadChunk(e) => {
                // What went to the member is well-formed but incomplete; the member connection
                // is dropped with it.
                self.svc
                    .http_stats
                    .bad_requests
                    .fetch_add(1, Ordering::Relaxed);
                Local::closing_error(400, e.0)
            }
            // Body bytes already went out: never sent again (the member was told, in
            // `send_h1`).
            PumpError::Member(_) => Local::error(502, "the member broke the connection"),
            PumpError::Timeout => Local::closing_error(408, "request body timeout"),
            PumpError::TooSlow => {
                self.svc
                    .http_stats
                    .slow_bodies
                    .fetch_add(1, Ordering::Relaxed);
                Local::closing_error(408, "request body slower than min_body_rate")
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

    /// Relays an HTTP/2 member's answer to the HTTP/1 client.
    async fn respond_h2(&mut self, route: Route<'_>, lookup: &Lookup, r: H2Response) -> Done {
        let (svc, rule) = (route.svc, route.rule);
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
        let mut plan = ResponsePlan::new(route, &self.head, index, lookup, &resp, body_filter);
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

//! A member's HTTP/1 answer on its way to the client: response filters, the plan of its head,
//! its body relayed (or compressed), Upgrade tunnels, and the member connection put back.

use std::sync::atomic::Ordering;
use std::time::Duration;

use fulcrum_balance::{clock, Member, MemberStats, Picked};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Conn, Done, Private};
use crate::body::InFraming;
use crate::chunked;
use crate::exchange::Route;
use crate::fields::RespFraming;
use crate::h1_out::{write_timed, BODY_CHUNK};
use crate::head::{RequestHead, ResponseHead};
use crate::local::Local;
use crate::plan::ResponsePlan;
use crate::request_loop::Http1Answer;
use crate::service::HttpService;
use crate::sticky::Lookup;
use crate::upstream::UpstreamConn;

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Sends the response head and body to the client, then puts the member connection back.
    pub(super) async fn respond(
        &mut self,
        route: Route<'_>,
        lookup: &Lookup,
        a: Http1Answer,
    ) -> Done {
        // `_request` keeps the request open on its member until the body has been relayed.
        let Http1Answer {
            picked,
            mut conn,
            mut resp,
            sent,
            early,
            request: _request,
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
            return self.tunnel(route, member, conn, sent, head_bytes).await;
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

    /// After a 101 the connection is a tunnel: the response head (in `self.out`) goes out, then
    /// bytes both ways until either side closes.
    async fn tunnel(
        &mut self,
        route: Route<'_>,
        member: &Member,
        mut conn: UpstreamConn,
        sent: u64,
        head_bytes: u64,
    ) -> Done {
        let svc = route.svc;
        if self.io.write_all(&self.out).await.is_err() {
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
        Done {
            status: 101,
            bytes: down,
            member: Some(member.address),
            keep: false,
        }
    }

    pub(super) fn release(&mut self, route: Route<'_>, picked: &Picked, mut conn: UpstreamConn) {
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
    pub(super) async fn relay_body(
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
pub(super) struct Cut {
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

/// Cache invalidation after an unsafe request (`crate::cache`, RFC 9111 §4.4).
pub(super) fn invalidate(
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

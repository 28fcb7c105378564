//! An HTTP/1 client connection as the request loop's client session: how its request head and
//! body go to an HTTP/1.1 member (with the body bytes that came with the head, or pumped from
//! the client while the member is watched for an early answer) or as a stream to an HTTP/2
//! member, and where interim responses go.

use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::Member;
use hyper::client::conn::http2::SendRequest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::body::PumpError;
use super::Conn;
use crate::chunked::Decoder;
use crate::client::Client;
use crate::exchange::{read_response_head, RespError, Route};
use crate::fields::{self, ReqFraming, RequestCtx};
use crate::h1_out::BODY_CHUNK;
use crate::h2_upstream::SentH2;
use crate::head::{RequestHead, ResponseHead, Version};
use crate::request_loop::{ClientSession, SendError, Sent};
use crate::upstream::{UpBody, UpstreamConn};

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

impl<S> ClientSession for Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stop = PumpError;

    fn request(&self) -> (&RequestHead, &Client) {
        (&self.head, &self.client)
    }

    fn take_private(&mut self, member: &Arc<Member>) -> Option<UpstreamConn> {
        self.private
            .take()
            .filter(|p| Arc::ptr_eq(&p.member, member))
            .and_then(|p| {
                let mut c = p.conn;
                c.is_idle_alive().then_some(c)
            })
    }

    /// The head, and the body bytes that came with it, in one write; a streamed body goes out
    /// with the head in `pump_body`, unless the client waits for 100 Continue, which it gets
    /// once the member has the head.
    async fn send_h1(
        &mut self,
        route: Route<'_>,
        member: &Member,
        conn: &mut UpstreamConn,
    ) -> Result<Sent, SendError<PumpError>> {
        let framing = self.member_framing();
        let body_buffered = self.body_buffered();
        let (head_len, mut bytes) = self.write_member_head(route, framing, body_buffered);
        let wants_continue = self.wants_continue();
        let carry = !body_buffered && !wants_continue;
        if !carry {
            conn.io
                .write_all(&self.out)
                .await
                .map_err(SendError::Member)?;
        }
        if body_buffered {
            return Ok(Sent {
                bytes,
                early: false,
            });
        }
        // The member never saw the Expect: the proxy asks for the body itself.
        if wants_continue && self.io.write_all(CONTINUE).await.is_err() {
            return Err(SendError::Stop(PumpError::Client));
        }
        let carried = if carry { head_len } else { 0 };
        let zero_window = route.target.pool.config.zero_window_timeout;
        match self.pump_body(conn, zero_window, carried).await {
            Ok((n, early)) => {
                bytes += n.saturating_sub(carried as u64);
                self.body_read = !early;
                Ok(Sent { bytes, early })
            }
            Err(e) => {
                if let PumpError::Member(e) = &e {
                    member.record_passive_failure(&format!("sending the request body: {e}"));
                }
                Err(SendError::Stop(e))
            }
        }
    }

    async fn read_h1_head(
        &mut self,
        conn: &mut UpstreamConn,
        deadline: Instant,
    ) -> Result<ResponseHead, RespError> {
        self.timer.set(deadline);
        read_response_head(conn, &mut self.timer, &mut self.io, self.head.version).await
    }

    /// The body is sent again from the read buffer.
    fn rewind(&mut self) {
        self.pos = self.head.head_len;
        self.body_read = !self.head.has_body();
    }

    /// A body that came whole with the head is sent (and sent again) from the read buffer; any
    /// other streams through a channel from the client while the stream is under way.
    async fn send_h2(
        &mut self,
        sender: &mut SendRequest<UpBody>,
        head: http::Request<()>,
        timeout: Duration,
        fresh: bool,
    ) -> Result<SentH2, PumpError> {
        if !self.head.has_body() || self.body_buffered() {
            let body = match self.head.content_length {
                Some(n) if n > 0 => {
                    let body = self.take_buffered_body(n);
                    UpBody::Full(Some(bytes::Bytes::copy_from_slice(&self.head.buf[body])))
                }
                _ => UpBody::Empty,
            };
            return Ok(crate::h2_upstream::send(sender, head.map(|()| body), timeout, fresh).await);
        }
        if self.wants_continue() && self.io.write_all(CONTINUE).await.is_err() {
            return Err(PumpError::Client);
        }
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let initial = bytes::Bytes::copy_from_slice(self.head.after_head());
        let idle = self.svc.idle_timeout;
        let pump = pump_to_channel(
            &mut self.io,
            initial,
            self.head.chunked,
            self.head.content_length,
            tx,
            idle,
        );
        let request = head.map(|()| UpBody::Channel(rx));
        let send = crate::h2_upstream::send(sender, request, timeout, fresh);
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
            Err(()) => self.head.close = true,
        }
        Ok(r)
    }
}

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// The client waits for 100 Continue before it sends its body (HTTP/1.1 `Expect`).
    fn wants_continue(&self) -> bool {
        self.head.expect_continue && self.head.version == Version::Http11
    }

    /// The Content-Length body of `n` bytes that came whole with the head, marked read (the
    /// connection goes on after it): its place in the read buffer.
    fn take_buffered_body(&mut self, n: u64) -> std::ops::Range<usize> {
        let start = self.head.head_len;
        let end = start + n as usize;
        self.pos = end;
        self.body_read = true;
        start..end
    }

    /// How the request body is framed towards an HTTP/1.1 member.
    fn member_framing(&self) -> ReqFraming {
        if self.head.chunked {
            return ReqFraming::Chunked;
        }
        match self.head.content_length {
            Some(n) if n > 0 => ReqFraming::Length(n),
            _ => ReqFraming::None,
        }
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
                let body = self.take_buffered_body(n);
                self.out.extend_from_slice(&self.head.buf[body]);
                sent += n;
            }
        }
        (head_len, sent)
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

//! The request body on its way from the client to an HTTP/1 member: re-framed, watched for
//! an early answer, a stalled member and a client slower than `min_body_rate`.

use std::io;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::Conn;
use crate::chunked::{self, Decoder};
use crate::h1_out::BODY_CHUNK;
use crate::upstream::{self, UpstreamConn};

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Moves the request body from the client to the member, re-framed. Returns the bytes sent
    /// (the `carried` ones included) and whether the member began to answer before the body was complete. With
    /// `zero_window` (the pool's `zero_window_timeout`), a plain-TCP member that takes none of
    /// the body for that long while its receive window is 0 fails the request (a passive
    /// failure, 502) instead of the client getting a 408 at the idle timeout.
    pub(super) async fn pump_body(
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
    pub(super) fn body_wait(&self, received: u64, waited: Duration) -> (Duration, bool) {
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
}

#[derive(Debug)]
pub(super) enum PumpError {
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
pub(super) fn early_answer(
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

/// Resolves once `after` has passed and the member's advertised receive window is 0 (checked
/// again every quarter period while it is not); never without `after` or a plain socket.
pub(super) async fn stalled_for(
    after: Option<Duration>,
    io: Option<&tokio::net::tcp::ReadHalf<'_>>,
) {
    let (Some(after), Some(io)) = (after, io) else {
        return std::future::pending().await;
    };
    tokio::time::sleep(after).await;
    while fulcrum_net::forward::receive_window(io.as_ref()) != Some(0) {
        tokio::time::sleep(after / 4).await;
    }
}

/// Readiness of a plain member socket; never, for TLS (see `pump_body`).
pub(super) async fn readable(io: Option<&tokio::net::tcp::ReadHalf<'_>>) -> io::Result<()> {
    match io {
        Some(r) => r.as_ref().readable().await,
        None => std::future::pending().await,
    }
}

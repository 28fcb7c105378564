//! The response body's way through what changes it on the way to the client: the filters that
//! read bodies (`wasm_filters`) first, so they see the body as the member sent it, then
//! compression. One transform for both client protocols: `relay_h1` for HTTP/1 clients,
//! `TransformBody` for HTTP/2 clients (and cache fills).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWrite};

use crate::body::{BoxError, DownBody, FramePoll, InFraming};
use crate::chunked;
use crate::compress::Stream;
use crate::upstream::UpstreamConn;
use crate::wasm_filters::FilterBody;

/// Output is sent on once it reaches this much.
const OUT_CHUNK: usize = 32 * 1024;

/// What changes a response body.
pub enum Transform {
    Compress(Stream),
    Filter(FilterBody),
    /// The filters, then compression of what they let through.
    Both(FilterBody, Stream),
}

impl Transform {
    /// `filter` then `compress`, whichever are there.
    pub fn of(filter: Option<FilterBody>, compress: Option<Stream>) -> Option<Transform> {
        match (filter, compress) {
            (None, None) => None,
            (None, Some(s)) => Some(Transform::Compress(s)),
            (Some(f), None) => Some(Transform::Filter(f)),
            (Some(f), Some(s)) => Some(Transform::Both(f, s)),
        }
    }

    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Transform::Compress(s) => s.write(data),
            Transform::Filter(f) => f.write(data),
            Transform::Both(f, s) => {
                f.write(data)?;
                pass(f, s)
            }
        }
    }

    /// Pushes out what the member's bytes so far make (a compressor's sync flush).
    pub fn flush(&mut self) -> io::Result<()> {
        match self {
            Transform::Compress(s) | Transform::Both(_, s) => s.flush(),
            Transform::Filter(_) => Ok(()),
        }
    }

    pub fn finish(&mut self) -> io::Result<()> {
        match self {
            Transform::Compress(s) => s.finish(),
            Transform::Filter(f) => f.finish(),
            Transform::Both(f, s) => {
                f.finish()?;
                pass(f, s)?;
                s.finish()
            }
        }
    }

    /// Runs the filters' trailer callbacks over an HTTP/2 member's trailers.
    pub fn trailers(&mut self, t: &mut http::HeaderMap) -> io::Result<()> {
        match self {
            Transform::Compress(_) => Ok(()),
            Transform::Filter(f) | Transform::Both(f, _) => f.trailers(t),
        }
    }

    /// Bytes of output waiting.
    pub fn pending(&mut self) -> usize {
        match self {
            Transform::Compress(s) | Transform::Both(_, s) => s.pending(),
            Transform::Filter(f) => f.output().len(),
        }
    }

    /// Moves the waiting output to `out` (as one chunk when `chunked_out`); returns the bytes
    /// added to `out`.
    pub fn drain_into(&mut self, out: &mut Vec<u8>, chunked_out: bool) -> usize {
        match self {
            Transform::Compress(s) | Transform::Both(_, s) => s.drain_into(out, chunked_out),
            Transform::Filter(f) => chunked::drain_body(out, f.output(), chunked_out),
        }
    }

    /// Takes the waiting output as a frame's bytes.
    pub fn take(&mut self) -> Option<Bytes> {
        match self {
            Transform::Compress(s) | Transform::Both(_, s) => s.take(),
            Transform::Filter(f) => {
                let o = std::mem::take(f.output());
                (!o.is_empty()).then(|| Bytes::from(o))
            }
        }
    }
}

/// What the filters let through goes on to the compressor.
fn pass(f: &mut FilterBody, s: &mut Stream) -> io::Result<()> {
    let o = f.output();
    let r = s.write(o);
    o.clear();
    r
}

/// A response body that could not be relayed completely: (body bytes sent to the client,
/// bytes received from the member, whether the member is at fault).
pub(crate) type Cut = (u64, u64, bool);

/// The HTTP/1 client path's body relay for a transformed response: reads the member's body
/// (framed by `framing`), transforms it, and writes it to the client chunked (or, for HTTP/1.0
/// clients, until the connection closes). `out` holds the response head on entry. Bytes from
/// the member reach `member`'s counters in batches while they flow. Returns (body bytes to the
/// client, bytes from the member not yet added to `member`, whether the member connection
/// ended cleanly and may be reused).
pub(crate) async fn relay_h1<W: AsyncWrite + Unpin>(
    w: &mut crate::h1_out::Client<'_, W>,
    conn: &mut UpstreamConn,
    mut framing: InFraming,
    chunked_out: bool,
    s: &mut Transform,
    member: &fulcrum_balance::MemberStats,
) -> Result<(u64, u64, bool), Cut> {
    let mut to_client = 0u64;
    let mut received = conn.buf.len() as u64;
    // Reads that found data at once, in a row: a fast member with a very compressible body
    // could otherwise keep this task busy without an await for as long as the body lasts.
    let mut eager = 0u32;
    loop {
        let mut fed: io::Result<()> = Ok(());
        let (consumed, finished) = match &mut framing {
            InFraming::None => (0, true),
            InFraming::Length(remaining) => {
                let n = (conn.buf.len() as u64).min(*remaining) as usize;
                *remaining -= n as u64;
                fed = s.write(&conn.buf[..n]);
                (n, *remaining == 0)
            }
            InFraming::Chunked(d) => {
                let used = d
                    .feed(&conn.buf, |data| {
                        if fed.is_ok() {
                            fed = s.write(data);
                        }
                    })
                    .map_err(|_| (to_client, received, true))?;
                (used, d.is_done())
            }
            InFraming::Close => {
                fed = s.write(&conn.buf);
                (conn.buf.len(), false)
            }
        };
        fed.map_err(|_| (to_client, received, false))?;
        if consumed == conn.buf.len() {
            conn.buf.clear();
        } else {
            conn.buf.drain(..consumed);
        }
        if finished {
            return finish_h1(w, s, chunked_out, to_client, received)
                .await
                // Bytes after the response: the member is out of step, do not reuse.
                .map(|sent| (sent, received, conn.buf.is_empty()));
        }
        if s.pending() >= OUT_CHUNK {
            to_client += s.drain_into(w.out, chunked_out) as u64;
            w.write_out()
                .await
                .map_err(|_| (to_client, received, false))?;
        }
        conn.buf.reserve(OUT_CHUNK);
        let read = match conn.io.try_read_buf(&mut conn.buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The member has nothing more for now: what was encoded goes to the client.
                s.flush().map_err(|_| (to_client, received, false))?;
                to_client += s.drain_into(w.out, chunked_out) as u64;
                w.write_out()
                    .await
                    .map_err(|_| (to_client, received, false))?;
                w.timer.set_after(w.idle);
                w.timer.run(conn.io.read_buf(&mut conn.buf)).await
            }
            r => {
                eager += 1;
                if eager.is_multiple_of(16) {
                    tokio::task::yield_now().await;
                }
                Some(r)
            }
        };
        match read {
            Some(Ok(0)) => {
                if let InFraming::Close = framing {
                    let sent = finish_h1(w, s, chunked_out, to_client, received).await?;
                    return Ok((sent, received, false));
                }
                return Err((to_client, received, true));
            }
            Some(Ok(n)) => {
                received += n as u64;
                member.add_live(&mut 0, &mut received);
            }
            Some(Err(_)) | None => return Err((to_client, received, true)),
        }
    }
}

async fn finish_h1<W: AsyncWrite + Unpin>(
    w: &mut crate::h1_out::Client<'_, W>,
    s: &mut Transform,
    chunked_out: bool,
    mut to_client: u64,
    received: u64,
) -> Result<u64, Cut> {
    s.finish().map_err(|_| (to_client, received, false))?;
    to_client += s.drain_into(w.out, chunked_out) as u64;
    if chunked_out {
        w.out.extend_from_slice(chunked::END);
    }
    w.write_out()
        .await
        .map_err(|_| (to_client, received, false))?;
    Ok(to_client)
}

/// A response body for an HTTP/2 client, transformed as it streams. What the inner body yields
/// is fed to the transform; output goes out as a data frame once it reaches a chunk, or
/// whenever the inner body has nothing ready (after a flush), so streaming responses stay live.
pub struct TransformBody {
    inner: DownBody,
    s: Transform,
    inner_done: bool,
    finished: bool,
    trailers: Option<http::HeaderMap>,
}

impl TransformBody {
    pub fn new(inner: DownBody, s: Transform) -> TransformBody {
        TransformBody {
            inner,
            s,
            inner_done: false,
            finished: false,
            trailers: None,
        }
    }
}

impl Body for TransformBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
        let this = self.get_mut();
        loop {
            if this.inner_done {
                if !this.finished {
                    this.finished = true;
                    this.s.finish()?;
                }
                if let Some(b) = this.s.take() {
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            if this.s.pending() >= OUT_CHUNK {
                if let Some(b) = this.s.take() {
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    this.s.flush()?;
                    if let Some(b) = this.s.take() {
                        return Poll::Ready(Some(Ok(Frame::data(b))));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(None) => this.inner_done = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(d) => this.s.write(&d)?,
                    Err(f) => {
                        if let Ok(mut t) = f.into_trailers() {
                            this.s.trailers(&mut t)?;
                            this.trailers = Some(t);
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.finished && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::sync::Arc;

    use fulcrum_config::CompressionAlgorithm as Algo;

    use super::*;
    use crate::compress::{Coding, CompressStats};
    use crate::h1_out::tests::{body, data, relay};

    #[tokio::test]
    async fn compressed_bodies_come_through_the_filter_into_chunks() {
        let stats = Arc::new(CompressStats::default());
        let coding = Coding {
            algo: Algo::Gzip,
            level: 1,
        };
        let enc = Stream::start(coding, None, stats).expect("gzip");
        let frames = vec![data(b"hello "), data(b"world")];
        let filtered =
            TransformBody::new(DownBody::filtered(body(frames)), Transform::Compress(enc));
        let (got, ok, _) = relay(filtered, true).await;
        assert!(ok);
        let mut rest = &got[3..];
        let mut gz = Vec::new();
        while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
            let len = usize::from_str_radix(std::str::from_utf8(&rest[..i]).expect("hex"), 16)
                .expect("a chunk size");
            if len == 0 {
                break;
            }
            gz.extend_from_slice(&rest[i + 2..i + 2 + len]);
            rest = &rest[i + 2 + len + 2..];
        }
        let mut plain = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut plain)
            .expect("whole gzip stream");
        assert_eq!(plain, "hello world");
    }
}

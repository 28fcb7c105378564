//! Writing to an HTTP/1.x client: bounded writes on the connection's timer, and the relay of a
//! response body that arrives as `http_body` frames (from an HTTP/2 member, or through the cache
//! on a miss), re-framed for the client and compressed when the plan says so. One writer for both
//! paths, so chunking, flushing and the end of the body are decided in one place.

use std::io;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::body::BoxError;
use crate::timer::Timer;

/// Write buffers are sent once they hold this much body.
pub(crate) const BODY_CHUNK: usize = 32 * 1024;

/// Writes `buf` whole, within `idle` (the connection's timer, moved to the new deadline).
pub(crate) async fn write_timed<W: AsyncWrite + Unpin>(
    io: &mut W,
    timer: &mut Timer,
    buf: &[u8],
    idle: Duration,
) -> io::Result<()> {
    timer.set_after(idle);
    match timer.run(io.write_all(buf)).await {
        Some(r) => r,
        None => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// Where a relayed body goes: the client connection, its timer and write buffer.
pub(crate) struct Client<'a, W> {
    pub io: &'a mut W,
    pub timer: &'a mut Timer,
    /// Holds the response head on entry; used as the write buffer.
    pub out: &'a mut Vec<u8>,
    pub idle: Duration,
}

impl<W: AsyncWrite + Unpin> Client<'_, W> {
    /// Writes what the buffer holds (within `idle`) and empties it.
    pub(crate) async fn write_out(&mut self) -> io::Result<()> {
        if self.out.is_empty() {
            return Ok(());
        }
        let r = write_timed(&mut *self.io, &mut *self.timer, self.out, self.idle).await;
        self.out.clear();
        r
    }
}

/// Sends the head in `client.out`, then `body` to its end, chunk-encoded when `chunked` (a
/// compressed answer's body comes through the compression filter, `ResponsePlan::filter`).
/// Frames that are ready one after another go out together (up to `BODY_CHUNK`); whenever the
/// body has nothing ready, what is buffered goes to the client first, so a member that sends in
/// bursts (server-sent events, long polls) is relayed at its own pace. Each frame's size goes to
/// `taken` as it arrives. `false` when the body or the client failed or stalled past the idle
/// timeout; what was sent then is not a whole response.
pub(crate) async fn relay_body<B, W>(
    client: Client<'_, W>,
    body: &mut B,
    chunked: bool,
    mut taken: impl FnMut(usize),
) -> bool
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    W: AsyncWrite + Unpin,
{
    let Client {
        io,
        timer,
        out,
        idle,
    } = client;
    let mut ok = true;
    loop {
        // One poll first: a frame that is already there costs no write of its own.
        let polled = std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx)));
        let next = match polled.await {
            Poll::Ready(next) => Some(next),
            Poll::Pending => {
                // Nothing more for now: the client gets what there is before the wait.
                if !out.is_empty() {
                    if write_timed(io, timer, out, idle).await.is_err() {
                        ok = false;
                        break;
                    }
                    out.clear();
                }
                timer.set_after(idle);
                timer.run(body.frame()).await
            }
        };
        let frame = match next {
            Some(Some(Ok(f))) => f,
            Some(None) => break,
            Some(Some(Err(_))) | None => {
                ok = false;
                break;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        taken(data.len());
        if chunked {
            crate::chunked::encode_chunk(out, &data);
        } else {
            out.extend_from_slice(&data);
        }
        if out.len() >= BODY_CHUNK {
            if write_timed(io, timer, out, idle).await.is_err() {
                ok = false;
                break;
            }
            out.clear();
        }
    }
    if ok && chunked {
        out.extend_from_slice(crate::chunked::END);
    }
    if !out.is_empty() && write_timed(io, timer, out, idle).await.is_err() {
        ok = false;
    }
    ok
}

#[cfg(test)]
pub(crate) mod tests {

    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http_body::Frame;

    use super::*;
    use crate::body::FramePoll;

    type Frames = Vec<Result<Frame<Bytes>, BoxError>>;

    /// A member's body: these frames, then the end (or nothing more, ever, when `stall`).
    pub(crate) struct Script {
        frames: VecDeque<Result<Frame<Bytes>, BoxError>>,
        stall: bool,
    }

    impl Body for Script {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> FramePoll {
            let this = self.get_mut();
            match this.frames.pop_front() {
                Some(f) => Poll::Ready(Some(f)),
                None if this.stall => Poll::Pending,
                None => Poll::Ready(None),
            }
        }
    }

    pub(crate) fn body(frames: Frames) -> Script {
        Script {
            frames: frames.into(),
            stall: false,
        }
    }

    pub(crate) fn data(b: &'static [u8]) -> Result<Frame<Bytes>, BoxError> {
        Ok(Frame::data(Bytes::from_static(b)))
    }

    /// Relays `frames` behind a head `H\r\n`; returns what the client got, the result and the
    /// bytes `taken` counted.
    pub(crate) async fn relay<B>(body: B, chunked: bool) -> (Vec<u8>, bool, usize)
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let mut body = body;
        let (mut io, mut timer, mut out) = (Vec::new(), Timer::new(), b"H\r\n".to_vec());
        let mut taken = 0;
        let client = Client {
            io: &mut io,
            timer: &mut timer,
            out: &mut out,
            idle: Duration::from_secs(5),
        };
        let ok = relay_body(client, &mut body, chunked, |n| taken += n).await;
        (io, ok, taken)
    }

    #[tokio::test]
    async fn relays_chunked_and_length_framed_bodies() {
        let frames = || vec![data(b"hello"), data(b""), data(b"world")];
        let (got, ok, taken) = relay(body(frames()), true).await;
        assert!(ok);
        assert_eq!(taken, 10);
        // The empty frame is no chunk: an empty chunk would end the body.
        assert_eq!(got, b"H\r\n5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n");
        let (got, ok, _) = relay(body(frames()), false).await;
        assert!(ok);
        assert_eq!(got, b"H\r\nhelloworld");
    }

    #[tokio::test]
    async fn a_failed_body_sends_what_came_and_no_end_chunk() {
        let frames = vec![data(b"part"), Err("member reset".into())];
        let (got, ok, taken) = relay(body(frames), true).await;
        assert!(!ok);
        assert_eq!(taken, 4);
        assert_eq!(
            got, b"H\r\n4\r\npart\r\n",
            "no last chunk: the client sees a cut body"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_at_the_idle_timeout() {
        let (mut io, mut timer, mut out) = (Vec::new(), Timer::new(), b"H\r\n".to_vec());
        let client = Client {
            io: &mut io,
            timer: &mut timer,
            out: &mut out,
            idle: Duration::from_secs(30),
        };
        let mut stalled = Script {
            frames: VecDeque::new(),
            stall: true,
        };
        let started = tokio::time::Instant::now();
        assert!(!relay_body(client, &mut stalled, true, |_| {}).await);
        assert!(started.elapsed() >= Duration::from_secs(30));
        assert_eq!(
            io, b"H\r\n",
            "the head went; no end chunk for a body that never ended"
        );
    }

    /// A member body that comes in bursts: what is there reaches the client before the body
    /// waits for more (it used to wait in the buffer until 32 KiB or the end).
    #[tokio::test]
    async fn a_burst_reaches_the_client_before_the_body_waits() {
        struct Channel(tokio::sync::mpsc::Receiver<&'static [u8]>);
        impl Body for Channel {
            type Data = Bytes;
            type Error = BoxError;
            fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> FramePoll {
                self.get_mut()
                    .0
                    .poll_recv(cx)
                    .map(|b| b.map(|b| Ok(Frame::data(Bytes::from_static(b)))))
            }
        }
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let (mut reader, writer) = tokio::io::duplex(64 * 1024);
        let relay = tokio::spawn(async move {
            let (mut io, mut timer, mut out) = (writer, Timer::new(), b"H\r\n".to_vec());
            let client = Client {
                io: &mut io,
                timer: &mut timer,
                out: &mut out,
                idle: Duration::from_secs(30),
            };
            relay_body(client, &mut Channel(rx), true, |_| {}).await
        });
        tx.send(b"event 1").await.expect("send");
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        let first = async {
            while !got.ends_with(b"event 1\r\n") {
                let n = tokio::io::AsyncReadExt::read(&mut reader, &mut buf)
                    .await
                    .expect("read");
                assert!(n > 0, "closed early");
                got.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(5), first)
            .await
            .expect("the first burst arrives while the body waits");
        tx.send(b"event 2").await.expect("send");
        drop(tx);
        assert!(relay.await.expect("relay"));
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut rest)
            .await
            .expect("read");
        got.extend_from_slice(&rest);
        assert_eq!(got, b"H\r\n7\r\nevent 1\r\n7\r\nevent 2\r\n0\r\n\r\n");
    }
}

//! A byte relay between any two streams (TLS or not): both directions copied until both ends
//! are done, or nothing moved for `idle`. The tunnel after an HTTP `101 Switching Protocols`
//! (WebSocket and other upgrades), and tcp services with TLS on either side (`forward` is the
//! plain-socket path, with splice).

use std::future::poll_fn;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

const BUFFER: usize = 16 * 1024;

struct Half {
    buf: Box<[u8]>,
    pos: usize,
    len: usize,
    eof: bool,
    shut: bool,
    total: u64,
}

impl Half {
    fn new(initial: &[u8]) -> Half {
        let mut buf = vec![0u8; BUFFER.max(initial.len())].into_boxed_slice();
        buf[..initial.len()].copy_from_slice(initial);
        Half {
            buf,
            pos: 0,
            len: initial.len(),
            eof: false,
            shut: false,
            total: 0,
        }
    }

    /// Moves bytes from `r` to `w`; Ready(Ok) when this direction is finished.
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        r: &mut R,
        w: &mut W,
        moved: &mut bool,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        loop {
            if self.pos < self.len {
                match Pin::new(&mut *w).poll_write(cx, &self.buf[self.pos..self.len]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => {
                        self.pos += n;
                        self.total += n as u64;
                        *moved = true;
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if self.eof {
                if !self.shut {
                    match Pin::new(&mut *w).poll_shutdown(cx) {
                        Poll::Ready(_) => self.shut = true,
                        Poll::Pending => return Poll::Pending,
                    }
                }
                return Poll::Ready(Ok(()));
            }
            self.pos = 0;
            self.len = 0;
            let mut rb = ReadBuf::new(&mut self.buf);
            match Pin::new(&mut *r).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if n == 0 {
                        self.eof = true;
                    } else {
                        self.len = n;
                        *moved = true;
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Tunnels `client` ↔ `member`; `to_member` and `to_client` are bytes already read from the other
/// side. `report` gets the bytes moved (client → member, member → client) since its last call
/// while the tunnel lasts, and the rest at the end, so a WebSocket counts for weighted least
/// traffic before it closes. Returns the bytes moved each way.
pub async fn run<C, M>(
    client: &mut C,
    to_member: &[u8],
    member: &mut M,
    to_client: &[u8],
    idle: Duration,
    report: &mut (dyn FnMut(u64, u64) + Send),
) -> (u64, u64)
where
    C: AsyncRead + AsyncWrite + Unpin + ?Sized,
    M: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    run_timed(client, to_member, member, to_client, idle, report, None).await
}

/// As `run`, timing the member's first reply for `fastest_response` as the tcp plane's
/// `forward_watched` does: `first_reply` gets the time from the first client byte given to the
/// member (or from the start, when the member speaks first) to its first byte; a member given
/// bytes that never answered gets, at the end, the time it was waited for. At most once.
pub async fn run_timed<C, M>(
    client: &mut C,
    to_member: &[u8],
    member: &mut M,
    to_client: &[u8],
    idle: Duration,
    report: &mut (dyn FnMut(u64, u64) + Send),
    mut first_reply: Option<&mut (dyn FnMut(Duration) + Send)>,
) -> (u64, u64)
where
    C: AsyncRead + AsyncWrite + Unpin + ?Sized,
    M: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    // Since when the member owes a reply; None once it replied (or when not timing).
    let mut waiting_since = first_reply.as_ref().map(|_| Instant::now());
    let mut asked = false;
    let mut up = Half::new(to_member);
    let mut down = Half::new(to_client);
    let mut up_done = false;
    let mut down_done = false;
    let mut last = Instant::now();
    // Bytes already given to `report`, each way.
    let mut reported = (0u64, 0u64);
    let mut timer = Box::pin(tokio::time::sleep(idle));
    let _ = poll_fn(|cx| {
        let mut moved = false;
        if !up_done {
            match up.poll(cx, client, member, &mut moved) {
                Poll::Ready(Ok(())) => up_done = true,
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => {}
            }
        }
        if !down_done {
            match down.poll(cx, member, client, &mut moved) {
                Poll::Ready(Ok(())) => down_done = true,
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => {}
            }
        }
        if up_done && down_done {
            return Poll::Ready(());
        }
        if moved {
            last = Instant::now();
            if let Some(since) = waiting_since {
                // `down.len`: bytes read from the member, whether or not written on yet.
                if down.total > 0 || down.len > 0 {
                    if let Some(f) = first_reply.as_mut() {
                        f(last.saturating_duration_since(since));
                    }
                    waiting_since = None;
                } else if !asked && up.total > 0 {
                    asked = true;
                    waiting_since = Some(last);
                }
            }
            report(up.total - reported.0, down.total - reported.1);
            reported = (up.total, down.total);
        }
        // The idle timer is re-armed only when it fires, to the last activity + idle.
        while timer.as_mut().poll(cx).is_ready() {
            let due = last + idle;
            if Instant::now() >= due {
                return Poll::Ready(());
            }
            timer.as_mut().reset(due);
        }
        Poll::Pending
    })
    .await;
    if let (Some(since), true, Some(f)) = (waiting_since, asked, first_reply.as_mut()) {
        f(since.elapsed());
    }
    if (up.total, down.total) != reported {
        report(up.total - reported.0, down.total - reported.1);
    }
    (up.total, down.total)
}

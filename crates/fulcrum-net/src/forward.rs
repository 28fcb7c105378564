//! Moves bytes both ways between a client and a member until both sides are done.
//!
//! Each direction copies through a 16 KiB per-thread scratch buffer (bytes the other side cannot
//! take yet are kept per connection); once a direction reads full buffers in a row
//! (a bulk transfer), it switches to splice(2) through a pipe so the bytes never enter user
//! space. Small request/response exchanges stay on the buffer path, where one read and one write
//! cost less than two splices. An end of stream on one side is passed on as a half-close
//! (shutdown of writes) on the other, so protocols that half-close keep working. The connection
//! ends when both directions are done, on an error, or after `idle_timeout` without a byte.

use std::future::{poll_fn, Future};
use std::io;
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::splice::{Pipe, PIPE_CAPACITY};

const BUFFER: usize = 16 * 1024;

thread_local! {
    /// Where the copy path reads; see `Direction::poll_copy`.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> = std::cell::RefCell::new(vec![0; BUFFER].into_boxed_slice());
}
/// Full-buffer reads in a row that switch a direction to splice.
const SPLICE_AFTER: u8 = 2;
/// Byte counts are reported at least every this many bytes (and at the end), so live traffic
/// figures stay current without an atomic update per chunk.
const REPORT_EVERY: u64 = 256 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct ForwardOptions {
    pub idle_timeout: Duration,
    pub splice: bool,
}

/// How forwarding ended.
#[derive(Debug)]
pub enum End {
    /// Both directions finished with an end of stream.
    Closed,
    IdleTimeout,
    Client(io::Error),
    Member(io::Error),
}

#[derive(Debug)]
pub struct Outcome {
    /// Bytes client → member and member → client.
    pub upstream: u64,
    /// Bytes taken from the client, whether or not they reached the member. While this and
    /// `downstream` are 0, nothing was exchanged and the client can be given another member.
    pub upstream_taken: u64,
    pub downstream: u64,
    /// Of those, bytes moved by splice(2) without entering user space.
    pub spliced: u64,
    pub end: End,
}

#[derive(Default)]
struct Direction {
    buf: Vec<u8>,
    pos: usize,
    cap: usize,
    full_reads: u8,
    pipe: Option<Pipe>,
    in_pipe: usize,
    eof: bool,
    done: bool,
    total: u64,
    /// Bytes read from `src` (some may not have been written on).
    taken: u64,
    spliced: u64,
    unreported: u64,
}

/// Which side an I/O error came from.
enum Fault {
    Src(io::Error),
    Dst(io::Error),
}

impl Direction {
    /// Moves what it can from `src` to `dst`; `Ready(Ok)` once `src` ended, everything was
    /// written, and `dst` was shut for writing (or is about to be closed: `other_done`).
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut ReadHalf<'_>,
        dst: &mut WriteHalf<'_>,
        splice: bool,
        other_done: bool,
    ) -> Poll<Result<(), Fault>> {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            if self.pipe.is_some() {
                ready!(self.poll_splice(cx, src.as_ref(), dst.as_ref()))?;
            } else {
                ready!(self.poll_copy(cx, src, dst, splice))?;
            }
            if self.eof && self.cap == self.pos && self.in_pipe == 0 {
                // When the other direction already ended, both sockets are closed next, and
                // close sends the FIN: a shutdown would only be an extra syscall. The peer may
                // already be gone; a failed shutdown changes nothing for us.
                if !other_done {
                    let _ = socket2::SockRef::from(dst.as_ref()).shutdown(Shutdown::Write);
                }
                self.done = true;
                return Poll::Ready(Ok(()));
            }
        }
    }

    /// One round of the buffer path: write out what is buffered, else read more.
    ///
    /// Reads land in a per-thread scratch buffer and are written on at once; only bytes the
    /// destination cannot take right now are kept in a buffer of this connection. An idle
    /// connection therefore holds no buffer memory (HAProxy's behaviour too), which is what
    /// decides memory per connection at scale. tokio's `poll_read` clears readiness after a
    /// short read, which saves the EAGAIN read that `try_read` would need per exchange.
    fn poll_copy(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut ReadHalf<'_>,
        dst: &mut WriteHalf<'_>,
        splice: bool,
    ) -> Poll<Result<(), Fault>> {
        if self.pos < self.cap {
            let n = ready!(Pin::new(&mut *dst).poll_write(cx, &self.buf[self.pos..self.cap]))
                .map_err(Fault::Dst)?;
            if n == 0 {
                return Poll::Ready(Err(Fault::Dst(io::ErrorKind::WriteZero.into())));
            }
            self.pos += n;
            self.count(n);
            if self.pos == self.cap {
                self.buf = Vec::new();
                self.pos = 0;
                self.cap = 0;
            }
            return Poll::Ready(Ok(()));
        }
        if self.eof {
            return Poll::Ready(Ok(()));
        }
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let mut rb = ReadBuf::new(&mut scratch[..]);
            ready!(Pin::new(&mut *src).poll_read(cx, &mut rb)).map_err(Fault::Src)?;
            let n = rb.filled().len();
            if n == 0 {
                self.eof = true;
                return Poll::Ready(Ok(()));
            }
            self.taken += n as u64;
            if n == BUFFER && splice {
                self.full_reads += 1;
                if self.full_reads >= SPLICE_AFTER {
                    // A bulk transfer: switch to splice once these bytes are written out. If no
                    // pipe can be had (descriptor limit), keep copying.
                    self.pipe = Pipe::new().ok();
                }
            } else {
                self.full_reads = 0;
            }
            let written = match Pin::new(&mut *dst).poll_write(cx, &scratch[..n]) {
                Poll::Ready(Ok(w)) => w,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Fault::Dst(e))),
                // Registered for writability; the bytes wait in this connection's buffer.
                Poll::Pending => 0,
            };
            self.count(written);
            if written < n {
                self.buf = scratch[written..n].to_vec();
                self.pos = 0;
                self.cap = self.buf.len();
            }
            Poll::Ready(Ok(()))
        })
    }

    /// One round of the splice path. The buffer is drained first so bytes keep their order.
    fn poll_splice(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &TcpStream,
    ) -> Poll<Result<(), Fault>> {
        if self.pos < self.cap {
            let n = loop {
                ready!(dst.poll_write_ready(cx)).map_err(Fault::Dst)?;
                match dst.try_write(&self.buf[self.pos..self.cap]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Poll::Ready(Err(Fault::Dst(e))),
                }
            };
            self.pos += n;
            self.count(n);
            if self.pos == self.cap {
                self.buf = Vec::new();
            }
            return Poll::Ready(Ok(()));
        }
        let Some(pipe) = &self.pipe else {
            return Poll::Ready(Ok(()));
        };
        if self.in_pipe > 0 {
            let n = loop {
                ready!(dst.poll_write_ready(cx)).map_err(Fault::Dst)?;
                match dst.try_io(Interest::WRITABLE, || {
                    pipe.drain_to(dst.as_raw_fd(), self.in_pipe)
                }) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Poll::Ready(Err(Fault::Dst(e))),
                }
            };
            self.in_pipe -= n;
            self.spliced += n as u64;
            self.count(n);
            return Poll::Ready(Ok(()));
        }
        if self.eof {
            return Poll::Ready(Ok(()));
        }
        // The pipe is empty here, so EAGAIN can only mean the socket has nothing to read.
        let n = loop {
            ready!(src.poll_read_ready(cx)).map_err(Fault::Src)?;
            match src.try_io(Interest::READABLE, || {
                pipe.fill_from(src.as_raw_fd(), PIPE_CAPACITY)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    // This socket pair cannot splice: nothing was moved, go back to copying.
                    self.pipe = None;
                    return Poll::Ready(Ok(()));
                }
                Err(e) => return Poll::Ready(Err(Fault::Src(e))),
            }
        };
        if n == 0 {
            self.eof = true;
        }
        self.taken += n as u64;
        self.in_pipe = n;
        Poll::Ready(Ok(()))
    }

    fn count(&mut self, n: usize) {
        self.total += n as u64;
        self.unreported += n as u64;
    }
}

/// Forwards until both directions ended, an error, or the idle timeout. `report(up, down)`
/// receives byte counts as they accumulate (batched) and the remainder at the end.
pub async fn forward(
    client: &mut TcpStream,
    member: &mut TcpStream,
    opts: ForwardOptions,
    report: impl FnMut(u64, u64),
) -> Outcome {
    forward_watched(client, member, opts, report, |_| {}, None).await
}

/// Zero-window watch of a member connection: after `after` with bytes for the member that it
/// does not take while its receive window is 0, `report` gets how long it has been so.
pub struct ZeroWindowWatch<'a> {
    pub after: Duration,
    pub report: &'a mut (dyn FnMut(Duration) + Send),
}

/// As `forward`, also timing the member's first reply for `fastest_response`: `first_reply`
/// gets how long the member took to send its first byte, counted from the first client byte
/// it was given (a request's round trip) or, when the member speaks first (a banner), from the
/// start. A member that was given bytes and never answered gets, at the end, the time it was
/// waited for. Called at most once; not at all when neither side sent anything.
///
/// With `zero_window`, a member that keeps its receive window at zero while bytes for it wait
/// (Fulcrum's writes to it are blocked and nothing it was sent is taken) is reported once per
/// connection: the first sign of a server that stopped reading, long before an idle timeout.
pub async fn forward_watched(
    client: &mut TcpStream,
    member: &mut TcpStream,
    opts: ForwardOptions,
    mut report: impl FnMut(u64, u64),
    mut first_reply: impl FnMut(Duration),
    mut zero_window: Option<ZeroWindowWatch<'_>>,
) -> Outcome {
    let (mut client_rd, mut client_wr) = client.split();
    let (mut member_rd, mut member_wr) = member.split();
    let mut up = Direction::default();
    let mut down = Direction::default();
    let mut idle: Pin<Box<Sleep>> = Box::pin(tokio::time::sleep(opts.idle_timeout));
    let mut last_total = 0u64;
    let mut last_activity = Instant::now();
    // Since when the member owes a reply: the start (it may speak first), then the first client
    // byte it was given. None once it replied.
    let mut waiting_since = Some(last_activity);
    let mut asked = false;
    // Zero-window watch: since when bytes for the member wait with no progress, and the
    // upstream total then; the timer that looks again.
    let mut stalled: Option<(Instant, u64)> = None;
    let mut stall_timer: Option<Pin<Box<Sleep>>> = None;

    let end = poll_fn(|cx| {
        let r_up = up.poll(cx, &mut client_rd, &mut member_wr, opts.splice, down.done);
        let r_down = down.poll(cx, &mut member_rd, &mut client_wr, opts.splice, up.done);

        let total = up.total + down.total;
        if total != last_total {
            last_total = total;
            last_activity = Instant::now();
            // Two branches per change of the byte count, only until the first reply.
            if let Some(since) = waiting_since {
                if down.taken > 0 {
                    first_reply(last_activity.saturating_duration_since(since));
                    waiting_since = None;
                } else if !asked && up.total > 0 {
                    asked = true;
                    waiting_since = Some(last_activity);
                }
            }
        }
        if up.unreported + down.unreported >= REPORT_EVERY {
            report(up.unreported, down.unreported);
            up.unreported = 0;
            down.unreported = 0;
        }

        // Upstream reads the client and writes the member; downstream the other way round.
        match (r_up, r_down) {
            (Poll::Ready(Err(Fault::Src(e))), _) | (_, Poll::Ready(Err(Fault::Dst(e)))) => {
                return Poll::Ready(End::Client(e))
            }
            (Poll::Ready(Err(Fault::Dst(e))), _) | (_, Poll::Ready(Err(Fault::Src(e)))) => {
                return Poll::Ready(End::Member(e))
            }
            _ => {}
        }
        if up.done && down.done {
            return Poll::Ready(End::Closed);
        }
        let mut zero_window_seen = false;
        if let Some(watch) = zero_window.as_ref() {
            // Only while writes to the member are blocked: one branch per wake-up otherwise. The
            // timer is re-armed when it fires, not on every bit of progress.
            if up.pos < up.cap || up.in_pipe > 0 {
                let now = Instant::now();
                match stalled {
                    Some((_, mark)) if mark == up.total => {}
                    _ => stalled = Some((now, up.total)),
                }
                let since = stalled.map_or(now, |(since, _)| since);
                let timer = stall_timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(since + watch.after)));
                while timer.as_mut().poll(cx).is_ready() {
                    let waited = Instant::now().saturating_duration_since(since);
                    if waited >= watch.after && receive_window(member_wr.as_ref()) == Some(0) {
                        zero_window_seen = true;
                        break;
                    }
                    // Progress since, or a slow but open window: look again later.
                    let next = (since + watch.after).max(Instant::now() + watch.after / 4);
                    timer.as_mut().reset(next);
                }
            } else {
                stalled = None;
            }
        }
        if zero_window_seen {
            if let (Some(watch), Some((since, _))) = (zero_window.take(), stalled) {
                (watch.report)(since.elapsed());
            }
            stall_timer = None;
        }
        // Re-arm the idle timer only when it fires: resetting it on every chunk would cost a
        // timer-wheel update per read.
        while idle.as_mut().poll(cx).is_ready() {
            let deadline = last_activity + opts.idle_timeout;
            if Instant::now() >= deadline {
                return Poll::Ready(End::IdleTimeout);
            }
            idle.as_mut().reset(deadline);
        }
        Poll::Pending
    })
    .await;

    if let (Some(since), true) = (waiting_since, asked) {
        first_reply(since.elapsed());
    }
    report(up.unreported, down.unreported);
    Outcome {
        upstream: up.total,
        upstream_taken: up.taken,
        downstream: down.total,
        spliced: up.spliced + down.spliced,
        end,
    }
}

/// The receive window the peer of `stream` last advertised (`tcpi_snd_wnd`), None when the
/// kernel does not say. The zero-window watches of the tcp and http planes read it.
pub fn receive_window(stream: &TcpStream) -> Option<u32> {
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is a live socket borrowed for the call; `info` is a zeroed
    // tcp_info of `len` bytes the kernel writes at most `len` bytes into, and `len` is updated
    // with what it wrote.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    // tcpi_snd_wnd came with Linux 5.4; an older kernel returns a shorter struct.
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_snd_wnd) + 4;
    if rc != 0 || (len as usize) < needed {
        return None;
    }
    // SAFETY: the struct was zeroed and the kernel filled at least up to tcpi_snd_wnd.
    Some(unsafe { info.assume_init() }.tcpi_snd_wnd)
}

/// Writes all of `buf` to a stream shared by reference (as `forward` holds them).
pub async fn write_all(stream: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        stream.writable().await?;
        match stream.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

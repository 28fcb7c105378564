//! Moves bytes both ways between a client and a member until both sides are done.
//!
//! Each direction copies through a 16 KiB buffer; once a direction reads full buffers in a row
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

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::splice::{Pipe, PIPE_CAPACITY};

const BUFFER: usize = 16 * 1024;
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
    spliced: u64,
    unreported: u64,
}

/// Which side an I/O error came from.
enum Fault {
    Src(io::Error),
    Dst(io::Error),
}

impl Direction {
    /// Moves what it can from `src` to `dst`; `Ready(Ok)` once `src` ended and everything was
    /// written and `dst` shut for writing.
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &TcpStream,
        splice: bool,
    ) -> Poll<Result<(), Fault>> {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            if self.pipe.is_some() {
                ready!(self.poll_splice(cx, src, dst))?;
            } else {
                ready!(self.poll_copy(cx, src, dst, splice))?;
            }
            if self.eof && self.cap == self.pos && self.in_pipe == 0 {
                // The peer may already be gone; a failed shutdown changes nothing for us.
                let _ = socket2::SockRef::from(dst).shutdown(Shutdown::Write);
                self.done = true;
                return Poll::Ready(Ok(()));
            }
        }
    }

    /// One round of the buffer path: write out what is buffered, else read more.
    fn poll_copy(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &TcpStream,
        splice: bool,
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
            return Poll::Ready(Ok(()));
        }
        if self.eof {
            return Poll::Ready(Ok(()));
        }
        if self.buf.is_empty() {
            self.buf = vec![0; BUFFER];
        }
        let n = loop {
            ready!(src.poll_read_ready(cx)).map_err(Fault::Src)?;
            match src.try_read(&mut self.buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(Fault::Src(e))),
            }
        };
        self.pos = 0;
        self.cap = n;
        if n == 0 {
            self.eof = true;
        } else if n == self.buf.len() && splice {
            self.full_reads += 1;
            if self.full_reads >= SPLICE_AFTER {
                // A bulk transfer: switch to splice once this buffer is written out. If no pipe
                // can be had (descriptor limit), keep copying.
                self.pipe = Pipe::new().ok();
            }
        } else {
            self.full_reads = 0;
        }
        Poll::Ready(Ok(()))
    }

    /// One round of the splice path. The buffer is drained first so bytes keep their order.
    fn poll_splice(
        &mut self,
        cx: &mut Context<'_>,
        src: &TcpStream,
        dst: &TcpStream,
    ) -> Poll<Result<(), Fault>> {
        if self.pos < self.cap {
            return self.poll_copy(cx, src, dst, false);
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
    client: &TcpStream,
    member: &TcpStream,
    opts: ForwardOptions,
    mut report: impl FnMut(u64, u64),
) -> Outcome {
    let mut up = Direction::default();
    let mut down = Direction::default();
    let mut idle: Pin<Box<Sleep>> = Box::pin(tokio::time::sleep(opts.idle_timeout));
    let mut last_total = 0u64;
    let mut last_activity = Instant::now();

    let end = poll_fn(|cx| {
        let r_up = up.poll(cx, client, member, opts.splice);
        let r_down = down.poll(cx, member, client, opts.splice);

        let total = up.total + down.total;
        if total != last_total {
            last_total = total;
            last_activity = Instant::now();
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

    report(up.unreported, down.unreported);
    Outcome {
        upstream: up.total,
        downstream: down.total,
        spliced: up.spliced + down.spliced,
        end,
    }
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

//! Zero-copy forwarding through a kernel pipe with splice(2).
//!
//! tokio has no splice, and no maintained crate wraps it for tokio sockets with the readiness
//! handling a proxy needs, so the two syscalls are wrapped here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Bytes moved per splice call; the default pipe capacity (16 pages).
pub const PIPE_CAPACITY: usize = 64 * 1024;

/// A non-blocking pipe: bytes spliced in from one socket wait here to be spliced out to the other.
#[derive(Debug)]
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    pub fn new() -> io::Result<Pipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a valid, writable array of two c_ints as pipe2 requires; on success
        // both entries are fresh descriptors that nothing else owns, so wrapping them in
        // OwnedFd (closed exactly once, on drop) is sound.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: see above; the descriptors are valid and exclusively ours.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok(Pipe { read, write })
    }

    /// Moves up to `len` bytes from socket `from` into the pipe.
    pub fn fill_from(&self, from: RawFd, len: usize) -> io::Result<usize> {
        splice(from, self.write.as_raw_fd(), len)
    }

    /// Moves up to `len` bytes from the pipe into socket `to`.
    pub fn drain_to(&self, to: RawFd, len: usize) -> io::Result<usize> {
        splice(self.read.as_raw_fd(), to, len)
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: splice only reads and writes the kernel objects behind the two descriptors, which
    // the caller keeps open for the duration of the call (they are borrowed from live sockets and
    // this pipe); null offsets are required for pipes and sockets. No user memory is touched.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

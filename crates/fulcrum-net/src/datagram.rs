//! Batched datagram I/O: `recvmmsg(2)` and `sendmmsg(2)`, so one system call moves up to
//! `BATCH` datagrams, and reading ICMP errors from a socket's error queue (`IP_RECVERR`).
//!
//! std and tokio only offer one datagram per call; at the rates a UDP balancer sees, the system
//! call is most of the cost of a datagram, so these few wrappers over libc are worth their
//! `unsafe`. Buffers are per thread and reused: no allocation per datagram.

use std::cell::RefCell;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::null_mut;

use socket2::{SockAddr, SockAddrStorage};

/// Datagrams per system call.
pub const BATCH: usize = 32;
/// Room per datagram: the largest UDP payload, so nothing is ever cut.
pub const SLOT: usize = 65536;

/// Receive buffers for one batch: in a thread-local between two awaits (the proxies), or owned
/// by a dedicated thread (the DNS server).
pub struct RecvBatch {
    slot: usize,
    buf: Vec<u8>,
    iov: Vec<libc::iovec>,
    hdr: Vec<libc::mmsghdr>,
    addr: Vec<libc::sockaddr_storage>,
}

impl Default for RecvBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl RecvBatch {
    /// Buffers for `BATCH` datagrams of up to `SLOT` bytes.
    pub fn new() -> RecvBatch {
        RecvBatch::with_slot(SLOT)
    }

    /// Buffers for `BATCH` datagrams of up to `slot` bytes each; longer ones are cut and
    /// reported by `truncated` (a DNS server reads queries into small slots).
    pub fn with_slot(slot: usize) -> RecvBatch {
        RecvBatch {
            slot,
            // Zeroed pages are mapped lazily: only the slots datagrams fill take memory.
            buf: vec![0u8; BATCH * slot],
            iov: (0..BATCH)
                .map(|_| libc::iovec {
                    iov_base: null_mut(),
                    iov_len: 0,
                })
                .collect(),
            // SAFETY: mmsghdr and sockaddr_storage are plain C structs for which all-zero bytes
            // are a valid value (null pointers, zero lengths).
            hdr: (0..BATCH).map(|_| unsafe { zeroed() }).collect(),
            addr: (0..BATCH).map(|_| unsafe { zeroed() }).collect(),
        }
    }

    /// Receives up to `BATCH` datagrams from `fd` without waiting.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.recv_flags(fd, libc::MSG_DONTWAIT)
    }

    /// Waits for at least one datagram on the blocking socket `fd` (up to its receive timeout),
    /// then takes what else is queued, up to `BATCH`, in the same call.
    pub fn recv_wait(&mut self, fd: RawFd) -> io::Result<usize> {
        self.recv_flags(fd, libc::MSG_WAITFORONE)
    }

    fn recv_flags(&mut self, fd: RawFd, flags: libc::c_int) -> io::Result<usize> {
        let slot = self.slot;
        for i in 0..BATCH {
            self.iov[i] = libc::iovec {
                iov_base: self.buf[i * slot..].as_mut_ptr().cast(),
                iov_len: slot,
            };
            // SAFETY: all-zero is a valid msghdr (see `new`).
            let mut h: libc::msghdr = unsafe { zeroed() };
            h.msg_name = (&mut self.addr[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.iov[i];
            h.msg_iovlen = 1;
            self.hdr[i].msg_hdr = h;
            self.hdr[i].msg_len = 0;
        }
        // SAFETY: `hdr` holds BATCH headers, each pointing at its own iovec (`slot` bytes inside
        // `buf`, which is BATCH * slot long) and its own sockaddr_storage, all owned by `self`
        // and alive for the call; the kernel writes only within those lengths.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.hdr.as_mut_ptr(),
                BATCH as libc::c_uint,
                flags,
                null_mut(),
            )
        };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Datagram `i` of the last `recv`: its bytes and sender (IPv4-mapped senders as IPv4);
    /// `None` if it was cut (see `truncated`) or has no IPv4/IPv6 sender.
    pub fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
        if self.truncated(i) {
            return None;
        }
        let h = &self.hdr[i];
        let len = (h.msg_len as usize).min(self.slot);
        let from = normalize(socket_addr(&self.addr[i], h.msg_hdr.msg_namelen)?);
        Some((&self.buf[i * self.slot..i * self.slot + len], from))
    }

    /// Whether datagram `i` was longer than a slot (never with the default `SLOT`).
    pub fn truncated(&self, i: usize) -> bool {
        self.hdr[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0
    }

    /// The sender of datagram `i` exactly as the kernel gave it, to answer it from the same
    /// socket (a dual-stack socket must answer an IPv4 client at its IPv4-mapped address).
    pub fn reply_address(&self, i: usize) -> SockAddr {
        let mut s = SockAddrStorage::zeroed();
        // SAFETY: SockAddrStorage is a transparent wrapper of sockaddr_storage.
        unsafe { *s.view_as::<libc::sockaddr_storage>() = self.addr[i] };
        // SAFETY: the kernel wrote a valid address of msg_namelen bytes into the storage.
        unsafe { SockAddr::new(s, self.hdr[i].msg_hdr.msg_namelen) }
    }
}

thread_local! {
    static CLIENT_SIDE: RefCell<RecvBatch> = RefCell::new(RecvBatch::new());
    static MEMBER_SIDE: RefCell<RecvBatch> = RefCell::new(RecvBatch::new());
}

/// Runs `f` with this thread's batch for datagrams from clients.
pub fn with_client_batch<R>(f: impl FnOnce(&mut RecvBatch) -> R) -> R {
    CLIENT_SIDE.with(|b| f(&mut b.borrow_mut()))
}

/// Runs `f` with this thread's batch for datagrams from members.
pub fn with_member_batch<R>(f: impl FnOnce(&mut RecvBatch) -> R) -> R {
    MEMBER_SIDE.with(|b| f(&mut b.borrow_mut()))
}

/// The address the kernel wrote into `storage` (`len` bytes), if it is IPv4 or IPv6.
fn socket_addr(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let mut s = SockAddrStorage::zeroed();
    // SAFETY: sockaddr_storage is one of this platform's sockaddr types, and SockAddrStorage
    // is a transparent wrapper of exactly that type.
    unsafe { *s.view_as::<libc::sockaddr_storage>() = *storage };
    // SAFETY: the kernel wrote a valid address of `len` bytes (at most the storage's size).
    unsafe { SockAddr::new(s, len) }.as_socket()
}

/// IPv4-mapped IPv6 senders (a dual-stack socket talking to an IPv4 member) as IPv4.
pub fn normalize(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => addr,
        },
        v4 => v4,
    }
}

/// Sends every datagram of `items` (bytes, destination) on `fd` with as few `sendmmsg` calls as
/// it takes; returns how many went out. A full send buffer (`EAGAIN`) drops the rest: UDP has
/// no back-pressure, and a balancer that waited would only delay every other flow.
pub fn send_all(fd: RawFd, items: &[(&[u8], &SockAddr)]) -> (usize, Option<io::Error>) {
    let mut sent = 0;
    while sent < items.len() {
        match send_chunk(fd, &items[sent..], libc::MSG_DONTWAIT) {
            Ok(0) => break,
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (sent, Some(e)),
        }
    }
    (sent, None)
}

/// Sends every datagram of `items` on the blocking socket `fd`, waiting for room in the send
/// buffer; a datagram the kernel refuses (an unreachable destination) is skipped so the rest of
/// the batch still goes out. Returns how many were skipped.
pub fn send_each(fd: RawFd, items: &[(&[u8], &SockAddr)]) -> usize {
    let (mut sent, mut skipped) = (0, 0);
    while sent < items.len() {
        match send_chunk(fd, &items[sent..], 0) {
            Ok(0) => break,
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::debug!(error = %e, "sendmmsg refused a datagram");
                sent += 1;
                skipped += 1;
            }
        }
    }
    skipped
}

/// One `sendmmsg` call for up to `BATCH` datagrams of `items`.
fn send_chunk(fd: RawFd, items: &[(&[u8], &SockAddr)], flags: libc::c_int) -> io::Result<usize> {
    let chunk = &items[..items.len().min(BATCH)];
    // SAFETY: all-zero iovec/mmsghdr values are valid (null pointers, zero lengths).
    let mut iov: [libc::iovec; BATCH] = unsafe { zeroed() };
    let mut hdr: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
    for (i, (data, to)) in chunk.iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        hdr[i].msg_hdr.msg_name = to.as_ptr() as *mut libc::c_void;
        hdr[i].msg_hdr.msg_namelen = to.len();
        hdr[i].msg_hdr.msg_iov = &mut iov[i];
        hdr[i].msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: the first `chunk.len()` headers point at iovecs on this stack frame, which
    // point at the callers' byte slices, and at socket addresses the caller keeps alive for
    // the call. The kernel only reads them (and writes `msg_len`).
    let n = unsafe { libc::sendmmsg(fd, hdr.as_mut_ptr(), chunk.len() as libc::c_uint, flags) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// An ICMP error the kernel queued for a datagram this socket sent (`IP_RECVERR`).
#[derive(Debug)]
pub struct IcmpError {
    /// Where the datagram that caused the error was going.
    pub destination: SocketAddr,
    pub error: io::Error,
}

/// Asks the kernel to queue ICMP errors (port unreachable, host unreachable …) of every
/// datagram the socket sends, with the destination, instead of dropping them for an
/// unconnected socket.
pub fn enable_recverr(fd: RawFd, ipv6: bool) -> io::Result<()> {
    let on: libc::c_int = 1;
    let set = |level, name| {
        // SAFETY: setsockopt reads one c_int from a live local for the given length.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&on as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    if ipv6 {
        set(libc::SOL_IPV6, libc::IPV6_RECVERR)?;
        // A dual-stack socket's IPv4 traffic reports through the IPv4 option.
        let _ = set(libc::SOL_IP, libc::IP_RECVERR);
        Ok(())
    } else {
        set(libc::SOL_IP, libc::IP_RECVERR)
    }
}

/// Drains up to `max` entries of the socket's error queue.
pub fn read_errors(fd: RawFd, max: usize, mut f: impl FnMut(IcmpError)) {
    for _ in 0..max {
        // SAFETY: all-zero sockaddr_storage / msghdr are valid values.
        let mut name: libc::sockaddr_storage = unsafe { zeroed() };
        let mut control = [0u64; 64];
        let mut data = [0u8; 64];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        let mut h: libc::msghdr = unsafe { zeroed() };
        h.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = &mut iov;
        h.msg_iovlen = 1;
        h.msg_control = control.as_mut_ptr().cast();
        h.msg_controllen = size_of::<[u64; 64]>() as _;
        // SAFETY: every pointer in `h` refers to a live local of the stated length.
        let n = unsafe { libc::recvmsg(fd, &mut h, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if n < 0 {
            return;
        }
        let Some(destination) = socket_addr(&name, h.msg_namelen).map(normalize) else {
            continue;
        };
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR walk the control buffer within msg_controllen as
        // the kernel filled it; each header is read only after the macros returned it non-null.
        let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&h) };
        while !cmsg.is_null() {
            // SAFETY: non-null headers from CMSG_FIRSTHDR/CMSG_NXTHDR lie within `control`.
            let c = unsafe { &*cmsg };
            let recverr = (c.cmsg_level == libc::SOL_IP && c.cmsg_type == libc::IP_RECVERR)
                || (c.cmsg_level == libc::SOL_IPV6 && c.cmsg_type == libc::IPV6_RECVERR);
            // SAFETY: CMSG_LEN is arithmetic on a length.
            let needed =
                unsafe { libc::CMSG_LEN(size_of::<libc::sock_extended_err>() as u32) } as usize;
            if recverr && c.cmsg_len as usize >= needed {
                // SAFETY: the length check above guarantees a whole sock_extended_err follows
                // the header; read_unaligned because the control buffer gives no alignment
                // promise for the payload type.
                let ee: libc::sock_extended_err = unsafe {
                    std::ptr::read_unaligned(
                        libc::CMSG_DATA(cmsg).cast::<libc::sock_extended_err>(),
                    )
                };
                if ee.ee_errno != 0 {
                    f(IcmpError {
                        destination,
                        error: io::Error::from_raw_os_error(ee.ee_errno as i32),
                    });
                }
            }
            // SAFETY: `cmsg` is a valid header of `h`'s control buffer (see above).
            cmsg = unsafe { libc::CMSG_NXTHDR(&h, cmsg) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant};

    use super::*;

    fn bound(addr: &str) -> std::net::UdpSocket {
        let s = std::net::UdpSocket::bind(addr).unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    /// Receives until `want` datagrams arrived or a second passed.
    fn receive(
        b: &mut RecvBatch,
        s: &std::net::UdpSocket,
        want: usize,
    ) -> Vec<(Vec<u8>, SocketAddr)> {
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(1);
        while got.len() < want && Instant::now() < end {
            match b.recv(s.as_raw_fd()) {
                Ok(n) => {
                    assert!(n <= BATCH);
                    got.extend(
                        (0..n)
                            .filter_map(|i| b.get(i))
                            .map(|(d, a)| (d.to_vec(), a)),
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        }
        got
    }

    #[test]
    fn batches_go_out_and_come_back_in_order_with_senders() {
        let (a, b) = (bound("127.0.0.1:0"), bound("127.0.0.1:0"));
        let to = SockAddr::from(b.local_addr().unwrap());
        let payloads: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; usize::from(i) + 1]).collect();
        let items: Vec<(&[u8], &SockAddr)> = payloads.iter().map(|p| (&p[..], &to)).collect();
        let (sent, err) = send_all(a.as_raw_fd(), &items);
        assert_eq!((sent, err.is_none()), (40, true), "two sendmmsg calls");
        let mut batch = RecvBatch::new();
        let got = receive(&mut batch, &b, 40);
        assert_eq!(got.len(), 40);
        for (i, (data, from)) in got.iter().enumerate() {
            assert_eq!(data, &payloads[i]);
            assert_eq!(*from, a.local_addr().unwrap());
        }
    }

    #[test]
    fn a_whole_64k_datagram_fits_a_slot() {
        let (a, b) = (bound("[::1]:0"), bound("[::1]:0"));
        let big = vec![7u8; 65507 - 40];
        a.send_to(&big, b.local_addr().unwrap()).unwrap();
        let mut batch = RecvBatch::new();
        let got = receive(&mut batch, &b, 1);
        assert_eq!(got[0].0.len(), big.len());
    }

    #[test]
    fn ipv4_mapped_senders_read_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:192.0.2.1]:53".parse().unwrap();
        assert_eq!(
            normalize(mapped),
            "192.0.2.1:53".parse::<SocketAddr>().unwrap()
        );
        let v6: SocketAddr = "[2001:db8::1]:53".parse().unwrap();
        assert_eq!(normalize(v6), v6);
    }

    #[test]
    fn icmp_port_unreachable_names_the_destination() {
        let s = bound("127.0.0.1:0");
        enable_recverr(s.as_raw_fd(), false).unwrap();
        let closed = bound("127.0.0.1:0").local_addr().unwrap(); // dropped: the port is closed
        let to = SockAddr::from(closed);
        assert_eq!(send_all(s.as_raw_fd(), &[(b"x", &to)]).0, 1);
        let end = Instant::now() + Duration::from_secs(1);
        let mut errors = Vec::new();
        while errors.is_empty() && Instant::now() < end {
            read_errors(s.as_raw_fd(), 8, |e| errors.push(e));
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].destination, closed);
        assert_eq!(errors[0].error.kind(), io::ErrorKind::ConnectionRefused);
    }
}

//! Client-side TCP tuning of a virtual service (`tcp = { … }`), set on its listening sockets.
//!
//! Linux copies a listener's options to every connection it accepts (the child socket is a clone
//! of the listener): congestion control, TCP_NODELAY, TCP_NOTSENT_LOWAT, SO_KEEPALIVE with its
//! timings, and the buffer sizes. Setting them once on the listener costs nothing per connection
//! (no system call after accept), and the receive buffer is in place before the SYN-ACK, where
//! the window scale is chosen. TCP Fast Open is a listener option by nature.

use std::io;
use std::os::fd::AsRawFd;

use fulcrum_config::TcpTuning;
use socket2::{SockRef, TcpKeepalive};

/// The system's default congestion control (what a socket gets without TCP_CONGESTION).
pub fn default_congestion() -> Option<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The congestion control algorithms the kernel offers (loaded modules, and those a socket may
/// load on demand when the process has CAP_NET_ADMIN are tried with setsockopt by
/// [`congestion_available`]).
pub fn available_congestion() -> Vec<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Whether the kernel accepts `name` as a congestion control: listed as available, or set
/// successfully on a scratch socket (which loads its module when allowed).
pub fn congestion_available(name: &str) -> bool {
    if available_congestion().iter().any(|a| a == name) {
        return true;
    }
    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .and_then(|s| s.set_tcp_congestion(name.as_bytes()))
        .is_ok()
}

/// A socket's congestion control, by name.
pub fn congestion_of(s: &SockRef<'_>) -> io::Result<String> {
    let name = s.tcp_congestion()?;
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// Sets TCP_FASTOPEN (the queue of pending Fast Open requests; 0 = off) on a listener.
fn set_fast_open(s: &SockRef<'_>, queue: u32) -> io::Result<()> {
    let v: libc::c_int = queue.min(i32::MAX as u32) as libc::c_int;
    // SAFETY: the descriptor is a live socket borrowed through `s`; the option value is a
    // c_int on our stack whose size is passed as the option length.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_FASTOPEN,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Applies `t` to a listening socket. `before` is what was applied to it last (None: never
/// tuned): options set then and unset now go back to the system's defaults, so a reload that
/// removes a key takes it away from new connections. Buffer sizes are the exception: once set,
/// Linux has no way back to autotuning for that socket (documented).
pub fn apply(s: &SockRef<'_>, t: &TcpTuning, before: Option<&TcpTuning>) -> io::Result<()> {
    let was = before.cloned().unwrap_or_default();
    match (&t.congestion, &was.congestion) {
        (Some(c), _) => s
            .set_tcp_congestion(c.as_bytes())
            .map_err(|e| io::Error::new(e.kind(), format!("congestion {c:?}: {e}")))?,
        (None, Some(_)) => {
            if let Some(d) = default_congestion() {
                s.set_tcp_congestion(d.as_bytes())?;
            }
        }
        (None, None) => {}
    }
    // Fulcrum's listeners have TCP_NODELAY on by default (`bind_stream`).
    if let Some(n) = t.nodelay.or(was.nodelay.map(|_| true)) {
        s.set_tcp_nodelay(n)?;
    }
    // 0 = the system's net.ipv4.tcp_notsent_lowat.
    if let Some(v) = t.notsent_lowat.or(was.notsent_lowat.map(|_| 0)) {
        s.set_tcp_notsent_lowat(v)?;
    }
    match (t.keepalive, was.keepalive) {
        (Some(Some(k)), _) => {
            s.set_keepalive(true)?;
            s.set_tcp_keepalive(
                &TcpKeepalive::new()
                    .with_time(k.idle)
                    .with_interval(k.interval)
                    .with_retries(k.count),
            )?;
        }
        (Some(None), _) | (None, Some(_)) => s.set_keepalive(false)?,
        (None, None) => {}
    }
    if let Some(q) = t.fast_open.or(was.fast_open.map(|_| 0)) {
        set_fast_open(s, q)?;
    }
    if let Some(b) = t.send_buffer {
        s.set_send_buffer_size(b as usize)?;
    }
    if let Some(b) = t.recv_buffer {
        s.set_recv_buffer_size(b as usize)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_config::Keepalive;
    use std::time::Duration;

    fn get_int(fd: i32, level: i32, opt: i32) -> i32 {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a live descriptor; v and len are valid for writes of their sizes.
        let r = unsafe { libc::getsockopt(fd, level, opt, (&mut v as *mut i32).cast(), &mut len) };
        assert_eq!(r, 0);
        v
    }

    #[test]
    fn accepted_sockets_inherit_the_listener_options_and_unset_ones_go_back() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let t = TcpTuning {
            congestion: Some("reno".into()),
            nodelay: Some(true),
            notsent_lowat: Some(16384),
            keepalive: Some(Some(Keepalive {
                idle: Duration::from_secs(61),
                interval: Duration::from_secs(11),
                count: 7,
            })),
            fast_open: Some(16),
            send_buffer: Some(65536),
            recv_buffer: Some(131072),
        };
        apply(&SockRef::from(&l), &t, None).unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        let s = SockRef::from(&a);
        assert_eq!(congestion_of(&s).unwrap(), "reno");
        assert!(s.tcp_nodelay().unwrap());
        assert_eq!(s.tcp_notsent_lowat().unwrap(), 16384);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(61));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(11));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 7);
        // Linux doubles the value for its bookkeeping.
        assert_eq!(s.send_buffer_size().unwrap(), 2 * 65536);
        assert_eq!(s.recv_buffer_size().unwrap(), 2 * 131072);
        assert_eq!(
            get_int(l.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_FASTOPEN),
            16
        );
        // A reload without the keys: new connections get the defaults again.
        let none = TcpTuning::default();
        apply(&SockRef::from(&l), &none, Some(&t)).unwrap();
        let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        let s = SockRef::from(&a);
        if let Some(d) = default_congestion() {
            assert_eq!(congestion_of(&s).unwrap(), d);
        }
        assert!(s.tcp_nodelay().unwrap(), "Fulcrum's default");
        assert_eq!(s.tcp_notsent_lowat().unwrap(), 0);
        assert!(!s.keepalive().unwrap());
        assert_eq!(
            get_int(l.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_FASTOPEN),
            0
        );
    }

    #[test]
    fn congestion_names_are_checked_against_the_kernel() {
        assert!(congestion_available("reno"), "reno is built into Linux");
        assert!(!congestion_available("no_such_cc"));
    }
}

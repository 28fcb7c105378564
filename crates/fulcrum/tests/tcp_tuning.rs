//! Client-side TCP tuning (`tcp = { … }` on a virtual service) through the binary: each option is
//! read back with getsockopt from the very socket Fulcrum accepted for the test's connection
//! (duplicated out of the process with pidfd_getfd), and `ss -ti` shows the congestion control.
//! A reload changes the options of a listener that stays; a kernel without the algorithm is a
//! config error naming the key.

mod common;

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use common::*;
use socket2::SockRef;
use tokio::net::TcpStream;

/// The fd, in the Fulcrum process, of the socket it accepted for `client` (ss -tnp).
fn server_fd(pid: i32, vs: SocketAddr, client: SocketAddr) -> Option<(i32, String)> {
    let out = std::process::Command::new("ss")
        .args([
            "-H",
            "-tinp",
            "state",
            "established",
            "src",
            &vs.to_string(),
            "dst",
            &client.to_string(),
        ])
        .output()
        .expect("ss (iproute2) is installed by scripts/test.sh");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let key = format!("pid={pid},fd=");
    let i = text.find(&key)? + key.len();
    let fd: i32 = text[i..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()?;
    Some((fd, text))
}

/// A duplicate, in this process, of `fd` of process `pid` (pidfd_getfd, Linux 5.6+).
fn steal(pid: i32, fd: i32) -> OwnedFd {
    // SAFETY: plain system calls with integer arguments; each result is checked, and a
    // non-negative one is a new descriptor this process owns.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let pidfd = OwnedFd::from_raw_fd(pidfd);
        let got = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) as i32;
        assert!(got >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
        OwnedFd::from_raw_fd(got)
    }
}

/// Connects to `vs` and returns the client stream with the server side's socket.
async fn accepted(f: &Fulcrum, vs: SocketAddr) -> (TcpStream, OwnedFd, String) {
    let c = TcpStream::connect(vs).await.unwrap();
    let local = c.local_addr().unwrap();
    let mut found = None;
    let ok = wait_until(Duration::from_secs(5), || {
        let r = server_fd(f.pid(), vs, local);
        let hit = r.is_some();
        if hit {
            found = r;
        }
        async move { hit }
    })
    .await;
    assert!(ok, "the accepted socket of {local} in ss");
    let (fd, ss) = found.unwrap();
    (c, steal(f.pid(), fd), ss)
}

fn congestion(s: &SockRef<'_>) -> String {
    let name = s.tcp_congestion().unwrap();
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

fn fast_open_queue(fd: &OwnedFd) -> i32 {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a live descriptor; v and len are valid for writes of their sizes.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_FASTOPEN,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(r, 0);
    v
}

fn services(tcp_vs: SocketAddr, http_vs: SocketAddr, member: SocketAddr, tcp: &str) -> String {
    format!(
        "[[virtual_service]]\nname = \"t\"\nlisten = [\"{tcp_vs}\"]\nprotocol = \"tcp\"\npool = \"p\"\n{tcp}\n\n\
         [[virtual_service]]\nname = \"h\"\nlisten = [\"{http_vs}\"]\nprotocol = \"http\"\npool = \"p\"\n{tcp}\n\n\
         [[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"{member}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_option_reaches_the_accepted_socket_and_reload_changes_them() {
    let m = TcpIdServer::start(free_addr(), "m0").await.unwrap();
    let (tv, hv) = (free_addr(), free_addr());
    let tuned = "tcp = { congestion = \"bbr\", nodelay = true, notsent_lowat = \"16KiB\", keepalive = { idle = \"45s\", interval = \"7s\", count = 4 }, fast_open = 128, send_buffer = \"256KiB\", recv_buffer = \"512KiB\" }";
    let cfg = services(tv, hv, m.addr, tuned);
    let f = start(&cfg).await;
    for vs in [tv, hv] {
        let (_c, fd, ss) = accepted(&f, vs).await;
        assert!(ss.contains("bbr"), "ss -ti shows the algorithm: {ss}");
        let s = SockRef::from(&fd);
        assert_eq!(congestion(&s), "bbr", "{vs}");
        assert!(s.tcp_nodelay().unwrap(), "{vs}");
        assert_eq!(s.tcp_notsent_lowat().unwrap(), 16384, "{vs}");
        assert!(s.keepalive().unwrap(), "{vs}");
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(45));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(7));
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 4);
        // Linux reports twice the size asked (its bookkeeping share).
        assert_eq!(s.send_buffer_size().unwrap(), 2 * 256 * 1024, "{vs}");
        assert_eq!(s.recv_buffer_size().unwrap(), 2 * 512 * 1024, "{vs}");
    }
    // Fast Open is the listener's: read it from a listening socket of the process.
    let out = std::process::Command::new("ss")
        .args(["-H", "-tlnp", "src", &tv.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let key = format!("pid={},fd=", f.pid());
    let i = text.find(&key).expect("listener in ss") + key.len();
    let fd: i32 = text[i..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap();
    assert_eq!(fast_open_queue(&steal(f.pid(), fd)), 128);

    // Reload: cubic, Nagle on, keepalive off, default low-water mark; the listeners stay and
    // change.
    f.write_config(&services(
        tv,
        hv,
        m.addr,
        "tcp = { congestion = \"cubic\", nodelay = false, keepalive = false }",
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert!(r.status < 300, "{}", r.text());
    for vs in [tv, hv] {
        let (_c, fd, _) = accepted(&f, vs).await;
        let s = SockRef::from(&fd);
        assert_eq!(congestion(&s), "cubic", "{vs}");
        assert!(!s.tcp_nodelay().unwrap(), "{vs}");
        assert_eq!(s.tcp_notsent_lowat().unwrap(), 0, "{vs}");
        assert!(!s.keepalive().unwrap(), "{vs}");
    }
    // Without `tcp`: the system's default congestion control again.
    f.write_config(&services(tv, hv, m.addr, ""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert!(r.status < 300, "{}", r.text());
    let default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap();
    for vs in [tv, hv] {
        let (_c, fd, _) = accepted(&f, vs).await;
        let s = SockRef::from(&fd);
        assert_eq!(congestion(&s), default.trim());
        assert!(
            s.tcp_nodelay().unwrap(),
            "Fulcrum's default: no Nagle delay"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_algorithm_the_kernel_lacks_is_a_config_error() {
    let m = free_addr();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cc.toml");
    std::fs::write(
        &path,
        services(
            free_addr(),
            free_addr(),
            m,
            "tcp = { congestion = \"warpdrive\" }",
        ),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(err.contains("virtual_service[0].tcp.congestion"), "{err}");
    assert!(err.contains("\"warpdrive\" is not available"), "{err}");
    assert!(err.contains("cc.toml:"), "{err}");
}

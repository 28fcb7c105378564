//! A batched UDP echo server for benchmarks: every datagram goes back to its sender unchanged,
//! read and written 32 at a time (recvmmsg/sendmmsg) on one thread, so the backend costs far
//! less per datagram than the proxy under test.
//!
//! Usage: fulcrum-udpecho ADDR [ADDR...]   (one thread per address; runs until killed)

use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use fulcrum_net::datagram::{send_all, RecvBatch};
use socket2::SockAddr;

fn serve(addr: SocketAddr) -> std::io::Result<()> {
    let socket = std::net::UdpSocket::bind(addr)?;
    let s2 = socket2::SockRef::from(&socket);
    let _ = s2.set_recv_buffer_size(4 << 20);
    let _ = s2.set_send_buffer_size(4 << 20);
    socket.set_nonblocking(true)?;
    let fd = socket.as_raw_fd();
    let mut batch = RecvBatch::new();
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        match batch.recv(fd) {
            Ok(n) => {
                let dests: Vec<(usize, SockAddr)> = (0..n)
                    .filter_map(|i| batch.get(i).map(|(_, from)| (i, SockAddr::from(from))))
                    .collect();
                let items: Vec<(&[u8], &SockAddr)> = dests
                    .iter()
                    .filter_map(|(i, to)| batch.get(*i).map(|(data, _)| (data, to)))
                    .collect();
                let _ = send_all(fd, &items);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // SAFETY: one valid pollfd on this stack frame.
                unsafe { libc::poll(&mut pfd, 1, 1000) };
            }
            Err(e) => return Err(e),
        }
    }
}

fn main() {
    let addrs: Vec<SocketAddr> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if addrs.is_empty() {
        eprintln!("usage: fulcrum-udpecho ADDR [ADDR...]");
        std::process::exit(2);
    }
    let threads: Vec<_> = addrs
        .into_iter()
        .map(|a| {
            std::thread::spawn(move || {
                if let Err(e) = serve(a) {
                    eprintln!("{a}: {e}");
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

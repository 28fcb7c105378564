//! A closed-loop UDP load generator for benchmarks: FLOWS client sockets, each keeping WINDOW
//! requests in flight against TARGET (a new request for every reply), for SECS seconds, on one
//! thread with recvmmsg/sendmmsg so that it keeps up with the proxy under test. Each request
//! carries its send time, so every reply gives a round-trip time. A flow whose replies stop for
//! 200 ms counts its in-flight requests as lost and starts a new window.
//!
//! Usage: fulcrum-udpload TARGET [FLOWS=64] [WINDOW=16] [SECS=5] [SIZE=64]
//! Prints: sent=… received=… lost=… secs=… rate=… p50_us=… p99_us=…

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use fulcrum_net::datagram::{send_all, RecvBatch, BATCH};
use socket2::SockAddr;

struct Flow {
    socket: std::net::UdpSocket,
    in_flight: usize,
    last_reply: Instant,
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(target) = args.first().and_then(|a| a.parse::<SocketAddr>().ok()) else {
        eprintln!("usage: fulcrum-udpload TARGET [FLOWS] [WINDOW] [SECS] [SIZE]");
        std::process::exit(2);
    };
    let flows_n: usize = arg(&args, 1, 64);
    let window: usize = arg(&args, 2, 16);
    let secs: f64 = arg(&args, 3, 5.0);
    let size: usize = arg::<usize>(&args, 4, 64).max(16);
    let local = if target.is_ipv6() {
        "[::1]:0"
    } else {
        "127.0.0.1:0"
    };
    let mut flows: Vec<Flow> = (0..flows_n)
        .map(|_| {
            let socket = std::net::UdpSocket::bind(local).expect("bind");
            socket.connect(target).expect("connect");
            socket.set_nonblocking(true).expect("nonblocking");
            let s2 = socket2::SockRef::from(&socket);
            let _ = s2.set_recv_buffer_size(1 << 20);
            Flow {
                socket,
                in_flight: 0,
                last_reply: Instant::now(),
            }
        })
        .collect();
    let to = SockAddr::from(target);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut payload = vec![0u8; size];
    let (mut sent, mut received, mut lost) = (0u64, 0u64, 0u64);
    let mut rtts_us: Vec<u32> = Vec::with_capacity(1 << 20);
    let mut batch = RecvBatch::new();

    // Sends `n` requests on `flow`, stamped with the time since `start`.
    let mut send = |flow: &mut Flow, n: usize, sent: &mut u64| {
        let mut left = n;
        while left > 0 {
            let k = left.min(BATCH);
            let stamp = start.elapsed().as_nanos() as u64;
            payload[..8].copy_from_slice(&stamp.to_le_bytes());
            let items: Vec<(&[u8], &SockAddr)> = (0..k).map(|_| (&payload[..], &to)).collect();
            let (ok, _) = send_all(flow.socket.as_raw_fd(), &items);
            flow.in_flight += ok;
            *sent += ok as u64;
            left -= k;
            if ok < k {
                break;
            }
        }
    };
    for f in flows.iter_mut() {
        send(f, window, &mut sent);
    }
    let mut pfds: Vec<libc::pollfd> = flows
        .iter()
        .map(|f| libc::pollfd {
            fd: f.socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut last_check = Instant::now();
    while Instant::now() < end {
        // SAFETY: `pfds` holds one valid pollfd per flow, alive for the call.
        let ready = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 20) };
        if ready > 0 {
            for (i, p) in pfds.iter_mut().enumerate() {
                if p.revents == 0 {
                    continue;
                }
                p.revents = 0;
                let f = &mut flows[i];
                while let Ok(n) = batch.recv(f.socket.as_raw_fd()) {
                    let now = start.elapsed().as_nanos() as u64;
                    let mut got = 0;
                    for j in 0..n {
                        if let Some((data, _)) = batch.get(j) {
                            // Replies may carry a prefix ("name:"): the stamp is at the end of
                            // the request, `size` bytes from the end of the reply.
                            if data.len() >= size {
                                let at = data.len() - size;
                                let mut stamp = [0u8; 8];
                                stamp.copy_from_slice(&data[at..at + 8]);
                                let rtt = now.saturating_sub(u64::from_le_bytes(stamp)) / 1000;
                                rtts_us.push(rtt.min(u64::from(u32::MAX)) as u32);
                            }
                            got += 1;
                        }
                    }
                    received += got as u64;
                    f.in_flight = f.in_flight.saturating_sub(got);
                    f.last_reply = Instant::now();
                    send(f, got, &mut sent);
                    if n < BATCH {
                        break;
                    }
                }
            }
        }
        if last_check.elapsed() >= Duration::from_millis(50) {
            last_check = Instant::now();
            for f in flows.iter_mut() {
                if f.in_flight > 0 && f.last_reply.elapsed() >= Duration::from_millis(200) {
                    lost += f.in_flight as u64;
                    f.in_flight = 0;
                    f.last_reply = Instant::now();
                    send(f, window, &mut sent);
                }
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    rtts_us.sort_unstable();
    let pct = |p: f64| -> u32 {
        if rtts_us.is_empty() {
            return 0;
        }
        rtts_us[((rtts_us.len() - 1) as f64 * p) as usize]
    };
    println!(
        "sent={sent} received={received} lost={lost} secs={elapsed:.3} rate={:.0} p50_us={} p99_us={}",
        received as f64 / elapsed,
        pct(0.50),
        pct(0.99)
    );
}

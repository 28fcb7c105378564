//! An HTTP/1.1 keep-alive member for bench/chaos.sh that resets a share of its connections:
//! each accepted connection is, with probability PCT %, closed with a TCP reset (SO_LINGER 0)
//! right after its first request is read, before any response. The others answer every request
//! with `200 ok`.
//!
//!   chaos-member ADDR [PCT=10]

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let Some(addr) = args.next().and_then(|a| a.parse::<SocketAddr>().ok()) else {
        eprintln!("usage: chaos-member ADDR [PCT]");
        std::process::exit(2);
    };
    let pct: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| {
            eprintln!("bind {addr}: {e}");
            std::process::exit(1)
        });
    let mut n: u64 = 0;
    while let Ok((mut s, _)) = l.accept().await {
        n += 1;
        // Every (100/PCT)th connection, spread evenly (deterministic, so runs compare).
        let reset = pct > 0 && (n * pct) % 100 < pct;
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(4096);
            let mut chunk = [0u8; 4096];
            loop {
                let Ok(k) = s.read(&mut chunk).await else {
                    return;
                };
                if k == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..k]);
                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    buf.drain(..end + 4);
                    if reset {
                        let _ = s.set_zero_linger();
                        return;
                    }
                    if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        });
    }
}

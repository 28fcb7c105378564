//! A minimal framed-message host for benchmarks: on every connection, reads messages with a
//! 2-byte big-endian body length and writes each one straight back (same bytes, same id), in
//! batches. Runs on one thread until killed.
//!
//! Usage: msgswitch ADDR [ADDR...]

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn serve(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        // Echo every complete frame; keep a partial one for the next read.
        let mut at = 0;
        while buf.len() - at >= 2 {
            let len = 2 + usize::from(u16::from_be_bytes([buf[at], buf[at + 1]]));
            if buf.len() - at < len {
                break;
            }
            at += len;
        }
        if at > 0 {
            if s.write_all(&buf[..at]).await.is_err() {
                return;
            }
            buf.drain(..at);
        }
    }
}

fn main() {
    let addrs: Vec<SocketAddr> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if addrs.is_empty() {
        eprintln!("usage: msgswitch ADDR [ADDR...]");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async move {
        for addr in addrs {
            let l = TcpListener::bind(addr).await.expect("bind");
            tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    tokio::spawn(serve(s));
                }
            });
        }
        std::future::pending::<()>().await;
    });
}

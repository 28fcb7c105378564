//! A framed-message load generator for benchmarks: CONNS long-lived connections, each keeping
//! WINDOW messages outstanding (2-byte big-endian body length, a 12-byte id, the send time, then
//! padding up to SIZE body bytes) for SECS seconds. Every answer must carry the id of a message
//! sent on that connection. Prints one line: `messages messages_per_s p50_ms p99_ms errors
//! all_messages` (the first four over the measured window, after one second of warm-up; the last
//! over the whole run, for CPU accounting).
//!
//! Usage: msgload ADDR CONNS WINDOW SECS [SIZE]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Counts an error and says what it was (once per kind is enough to diagnose).
fn error(totals: &Totals, conn: u32, what: &str) {
    if totals.errors.fetch_add(1, Ordering::Relaxed) < 3 {
        eprintln!("msgload: connection {conn}: {what}");
    }
}

struct Totals {
    /// Answers within the measured window, and over the whole run (warm-up and drain included).
    answers: AtomicU64,
    all: AtomicU64,
    errors: AtomicU64,
}

fn frame(out: &mut Vec<u8>, conn: u32, seq: u64, sent_ns: u64, size: usize) {
    out.extend_from_slice(&(size as u16).to_be_bytes());
    out.extend_from_slice(&conn.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&sent_ns.to_be_bytes());
    out.resize(out.len() + size - 20, b'x');
}

#[allow(clippy::too_many_arguments)]
async fn client(
    addr: SocketAddr,
    conn: u32,
    window: usize,
    size: usize,
    start: Instant,
    measure_from: Instant,
    end: Instant,
    totals: Arc<Totals>,
) -> Vec<u32> {
    let mut lat_us = Vec::new();
    let mut s = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => {
            error(&totals, conn, &format!("connect: {e}"));
            return lat_us;
        }
    };
    let _ = s.set_nodelay(true);
    let mut seq = 0u64;
    let mut out = Vec::with_capacity(window * (size + 2));
    for _ in 0..window {
        frame(&mut out, conn, seq, start.elapsed().as_nanos() as u64, size);
        seq += 1;
    }
    if let Err(e) = s.write_all(&out).await {
        error(&totals, conn, &format!("write: {e}"));
        return lat_us;
    }
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut outstanding = window;
    while outstanding > 0 {
        let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk)).await;
        let n = match read {
            Ok(Ok(0)) => {
                error(
                    &totals,
                    conn,
                    &format!("closed with {outstanding} outstanding"),
                );
                return lat_us;
            }
            Ok(Err(e)) => {
                error(&totals, conn, &format!("read: {e}"));
                return lat_us;
            }
            Err(_) => {
                error(
                    &totals,
                    conn,
                    &format!("no answer for 10s, {outstanding} outstanding"),
                );
                return lat_us;
            }
            Ok(Ok(n)) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let now = Instant::now();
        let now_ns = now.duration_since(start).as_nanos() as u64;
        let mut at = 0;
        out.clear();
        while buf.len() - at >= 2 {
            let len = 2 + usize::from(u16::from_be_bytes([buf[at], buf[at + 1]]));
            if buf.len() - at < len {
                break;
            }
            let body = &buf[at + 2..at + len];
            if body.len() < 20 || u32::from_be_bytes([body[0], body[1], body[2], body[3]]) != conn {
                error(&totals, conn, "an answer to another connection's message");
            } else {
                let sent = u64::from_be_bytes(body[12..20].try_into().unwrap_or([0; 8]));
                totals.all.fetch_add(1, Ordering::Relaxed);
                if now >= measure_from && now < end {
                    lat_us.push(((now_ns.saturating_sub(sent)) / 1000) as u32);
                    totals.answers.fetch_add(1, Ordering::Relaxed);
                }
            }
            at += len;
            outstanding -= 1;
            if now < end {
                frame(&mut out, conn, seq, now_ns, size);
                seq += 1;
                outstanding += 1;
            }
        }
        buf.drain(..at);
        if !out.is_empty() {
            if let Err(e) = s.write_all(&out).await {
                error(&totals, conn, &format!("write: {e}"));
                return lat_us;
            }
        }
    }
    lat_us
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: msgload ADDR CONNS WINDOW SECS [SIZE]");
        std::process::exit(2);
    }
    let parse = |i: usize| -> u64 {
        args[i].parse().unwrap_or_else(|_| {
            eprintln!("bad argument {}", args[i]);
            std::process::exit(2)
        })
    };
    let addr: SocketAddr = args[1].parse().unwrap_or_else(|_| {
        eprintln!("bad address {}", args[1]);
        std::process::exit(2)
    });
    let (conns, window, secs) = (parse(2) as u32, parse(3) as usize, parse(4));
    let size = if args.len() > 5 {
        parse(5) as usize
    } else {
        200
    }
    .clamp(20, 65535);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let totals = Arc::new(Totals {
        answers: AtomicU64::new(0),
        all: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let start = Instant::now();
    // One second of warm-up is not counted.
    let measure_from = start + Duration::from_secs(1);
    let end = measure_from + Duration::from_secs(secs);
    let mut lat: Vec<u32> = rt.block_on(async {
        let tasks: Vec<_> = (0..conns)
            .map(|c| {
                tokio::spawn(client(
                    addr,
                    c,
                    window,
                    size,
                    start,
                    measure_from,
                    end,
                    totals.clone(),
                ))
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            if let Ok(v) = t.await {
                all.extend(v);
            }
        }
        all
    });
    let elapsed = Instant::now()
        .min(end)
        .duration_since(measure_from)
        .as_secs_f64();
    lat.sort_unstable();
    let q = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(f64::NAN, |v| f64::from(*v) / 1000.0)
    };
    let answers = totals.answers.load(Ordering::Relaxed);
    println!(
        "{} {:.0} {:.3} {:.3} {} {}",
        answers,
        answers as f64 / elapsed.max(1e-9),
        q(0.50),
        q(0.99),
        totals.errors.load(Ordering::Relaxed),
        totals.all.load(Ordering::Relaxed)
    );
}

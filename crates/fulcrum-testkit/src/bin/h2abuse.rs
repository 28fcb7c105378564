//! HTTP/2 attack clients for bench/abuse.sh (h2c, prior knowledge), bounded in time:
//!
//!   h2abuse rapid ADDR SECS [CONNS=4]        rapid reset (CVE-2023-44487): each connection
//!                                            writes HEADERS + RST_STREAM pairs (raw frames)
//!                                            as fast as it can, and
//!                                            a new connection replaces one the server closed
//!   h2abuse flood ADDR SECS [CONNS=4]        stream flood: streams opened past the server's
//!                                            concurrency limit through the h2 crate, whose
//!                                            resets of unflushed streams never leave the
//!                                            client (what `rapid` measured before it wrote
//!                                            raw frames): the server serves its limit of
//!                                            streams and refuses the rest
//!   h2abuse hold ADDR PATH CONNS SECS        zero-window holders: CONNS connections each ask
//!                                            for PATH with SETTINGS_INITIAL_WINDOW_SIZE 0 and
//!                                            never open the window, keeping the connection
//!                                            busy with a HEAD every 500 ms
//!
//! Prints one line of `key=value` figures.

use std::net::SocketAddr;
use std::time::Duration;

use fulcrum_testkit::h2abuse::{rapid_reset, rapid_reset_raw, zero_window_holder};

fn usage() -> ! {
    eprintln!("usage: h2abuse rapid|flood ADDR SECS [CONNS] | h2abuse hold ADDR PATH CONNS SECS");
    std::process::exit(2)
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| usage())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(mode @ ("rapid" | "flood")) => {
            let raw = mode == "rapid";
            let addr: SocketAddr = arg(&args, 2);
            let secs: u64 = arg(&args, 3);
            let conns: usize = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(4);
            let until = tokio::time::Instant::now() + Duration::from_secs(secs);
            let mut tasks = Vec::new();
            for _ in 0..conns {
                tasks.push(tokio::spawn(async move {
                    let (mut streams, mut closed, mut connections, mut failed) = (0, 0, 0, 0);
                    while tokio::time::Instant::now() < until {
                        connections += 1;
                        let run = if raw {
                            rapid_reset_raw(addr, 10_000).await
                        } else {
                            rapid_reset(addr, 10_000, None).await
                        };
                        match run {
                            Ok(r) => {
                                streams += r.streams;
                                closed += usize::from(r.closed_by_server);
                            }
                            Err(_) => {
                                failed += 1;
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                    (streams, closed, connections, failed)
                }));
            }
            let (mut s, mut c, mut n, mut f) = (0, 0, 0, 0);
            for t in tasks {
                if let Ok((a, b, d, e)) = t.await {
                    s += a;
                    c += b;
                    n += d;
                    f += e;
                }
            }
            println!("streams_reset={s} connections={n} closed_by_server={c} connect_failures={f}");
        }
        Some("hold") => {
            let addr: SocketAddr = arg(&args, 2);
            let path: String = arg(&args, 3);
            let conns: usize = arg(&args, 4);
            let secs: u64 = arg(&args, 5);
            let mut tasks = Vec::new();
            for i in 0..conns {
                let path = path.clone();
                tasks.push(tokio::spawn(async move {
                    // Spread the connects a little.
                    tokio::time::sleep(Duration::from_millis((i % 100) as u64 * 5)).await;
                    zero_window_holder(
                        addr,
                        &path,
                        Duration::from_secs(secs),
                        Some(Duration::from_millis(500)),
                    )
                    .await
                }));
            }
            let (mut held, mut released, mut failed) = (0, 0, 0);
            let mut first_release: Option<Duration> = None;
            for t in tasks {
                match t.await {
                    Ok(Ok(h)) => {
                        held += 1;
                        if let Some(d) = h.released_after {
                            released += 1;
                            first_release = Some(first_release.map_or(d, |f| f.min(d)));
                        }
                    }
                    _ => failed += 1,
                }
            }
            println!(
                "holders={held} released_by_server={released} first_release_ms={} failed={failed}",
                first_release.map_or(-1, |d| d.as_millis() as i64)
            );
        }
        _ => usage(),
    }
}

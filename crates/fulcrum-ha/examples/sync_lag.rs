//! Sync lag of `ha.sync`'s persistence stream: two sync endpoints on 127.0.0.1, one sending new
//! entries at RATE per second (in the batches the binary makes: whatever accumulated, up to
//! 1000), the other timing each entry from its creation to its arrival. Prints p50, p99 and max.
//! With `flows`, the entries are connections of XDP services (`FlowEntry`, nat: with the hop
//! back to the client), encoded and decoded as the binary does (`encode_entries` /
//! `decode_entries`); the kernel's side (ring buffer, table writes) is not part of it.
//!
//! `cargo run --release -p fulcrum-ha --example sync_lag -- [RATE] [SECONDS] [persistence|flows]`

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fulcrum_ha::sync::{Entry, FlowEntry, FlowHop, FullDump, Kind, OnReceive, StateSync};
use parking_lot::Mutex;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let rate: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let secs: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let flows = args.next().as_deref() == Some("flows");
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
    };
    let (a, b) = (free(), free());
    let key = vec!["a-benchmark-key-0123456789".to_string()];
    let lags = Arc::new(Mutex::new(Vec::<u64>::with_capacity(
        (rate * secs) as usize,
    )));
    let l = lags.clone();
    // Each entry is the JSON the binary sends, with its creation time in place of the key.
    let on_b: OnReceive = Arc::new(move |kind, _, bytes| {
        if kind != Kind::Entries {
            return Ok(());
        }
        let now = now_us();
        let (entries, _) = fulcrum_ha::sync::decode_entries(bytes)?;
        let mut l = l.lock();
        for e in entries {
            // The creation time rides in the key (persistence) or the service name (flows).
            let t = match &e {
                Entry::Persistence { key, .. } => key.trim_start_matches('i').parse::<u64>().ok(),
                Entry::Flow(f) => f.vs.parse::<u64>().ok(),
            };
            if let Some(t) = t {
                l.push(now.saturating_sub(t));
            }
        }
        Ok(())
    });
    let none: OnReceive = Arc::new(|_, _, _| Ok(()));
    let dump: FullDump = Arc::new(Vec::new);
    let _b = StateSync::start(b, &[], &key, on_b, dump.clone())
        .await
        .expect("b");
    let sender = StateSync::start(a, &[b], &key, none, dump)
        .await
        .expect("a");
    sender.publish(b"{}".to_vec());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The binary's path: a bounded queue, drained by one task in batches of up to 1000.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(65_536);
    tokio::spawn(async move {
        let mut buf = Vec::with_capacity(1000);
        while rx.recv_many(&mut buf, 1000).await > 0 {
            let v: Vec<Entry> = buf
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if flows {
                        Entry::Flow(FlowEntry {
                            vs: t.to_string(),
                            client: std::net::SocketAddr::from(([198, 18, 0, 2], 1024 + i as u16)),
                            vip: std::net::SocketAddr::from(([198, 18, 10, 1], 80)),
                            proto: 6,
                            member: std::net::SocketAddr::from(([198, 18, 1, 21], 8080)),
                            hop: Some(FlowHop {
                                mac: [2, 0, 0, 0, 0, 0xaa],
                                interface: "eth0".into(),
                            }),
                            idle_ms: 0,
                        })
                    } else {
                        Entry::Persistence {
                            table: "web".into(),
                            key: format!("i{t}"),
                            member: std::net::SocketAddr::from(([198, 18, 0, 21], 8080)),
                        }
                    }
                })
                .collect();
            sender.send_batch(fulcrum_ha::sync::encode_entries(&v));
            buf.clear();
        }
    });
    let mut dropped = 0u64;
    let tick = Duration::from_millis(1);
    let per_tick = (rate / 1000).max(1);
    let mut every = tokio::time::interval(tick);
    for _ in 0..secs * 1000 {
        every.tick().await;
        for _ in 0..per_tick {
            if tx.try_send(now_us()).is_err() {
                dropped += 1;
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut l = lags.lock().clone();
    l.sort_unstable();
    let q = |p: f64| {
        l.get(((l.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    println!(
        "{} at {rate}/s for {secs} s: sent {}, received {}, dropped {dropped}; lag ms p50 {:.2} p99 {:.2} max {:.2}",
        if flows { "flows" } else { "persistence entries" },
        secs * 1000 * per_tick,
        l.len(),
        q(0.5),
        q(0.99),
        q(1.0)
    );
}

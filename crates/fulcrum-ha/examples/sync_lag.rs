//! Sync lag of `ha.sync`'s persistence stream: two sync endpoints on 127.0.0.1, one sending new
//! entries at RATE per second (in the batches the binary makes: whatever accumulated, up to
//! 1000), the other timing each entry from its creation to its arrival. Prints p50, p99 and max.
//!
//! `cargo run --release -p fulcrum-ha --example sync_lag -- [RATE] [SECONDS]`

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fulcrum_ha::sync::{FullDump, Kind, OnReceive, StateSync};
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
        let v: Vec<serde_json::Value> = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        let mut l = l.lock();
        for e in v {
            if let Some(t) = e["k"]
                .as_str()
                .and_then(|k| k.trim_start_matches('i').parse::<u64>().ok())
            {
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
            let v: Vec<serde_json::Value> = buf
                .iter()
                .map(|t| serde_json::json!({"t": "web", "k": format!("i{t}"), "m": "198.18.0.21:8080"}))
                .collect();
            sender.send_batch(serde_json::to_vec(&v).unwrap_or_default());
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
        "rate {rate}/s for {secs} s: sent {}, received {}, dropped {dropped}; lag ms p50 {:.2} p99 {:.2} max {:.2}",
        secs * 1000 * per_tick,
        l.len(),
        q(0.5),
        q(0.99),
        q(1.0)
    );
}

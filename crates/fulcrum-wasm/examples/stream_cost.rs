//! What a filter costs per request in the host alone (no proxy around it): the time to open a
//! stream, run its request and response header callbacks and close it, for the committed C
//! filter (which reads a header, removes one and adds one) against a filter that exports only
//! the required callbacks. Run by bench/wasm-filter.sh; medians of rounds.

use std::sync::Arc;
use std::time::Instant;

use fulcrum_wasm::{Chain, Filter, HeadPairs, Props, Spec};

const NOOP: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32) (i32.const 0)))"#;

fn chain(name: &str, bytes: Vec<u8>) -> (Arc<Chain>, std::time::Duration) {
    let started = Instant::now();
    let f = Filter::new(Spec {
        config: b"bench".to_vec(),
        ..Spec::of(name, bytes)
    })
    .expect("filter loads");
    let took = started.elapsed();
    (
        Arc::new(Chain {
            filters: vec![Arc::new(f)],
            calls: None,
        }),
        took,
    )
}

fn headers() -> Vec<fulcrum_wasm::Pair> {
    [
        (":method", "GET"),
        (":path", "/index.html"),
        (":authority", "example.com"),
        (":scheme", "http"),
        ("user-agent", "bench/1.0"),
        ("accept", "*/*"),
        ("x-internal", "1"),
    ]
    .iter()
    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let c_filter = include_bytes!("../filters/add_header.wasm").to_vec();
    let (noop, noop_compile) = chain("noop", NOOP.as_bytes().to_vec());
    let (c, c_compile) = chain("add_header", c_filter);
    println!("compile+start noop {noop_compile:?}  add_header {c_compile:?}");
    for (name, chain) in [("noop", &noop), ("add_header", &c)] {
        let mut rounds = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            rt.block_on(async {
                for _ in 0..n {
                    let mut s = chain.stream(Props::default());
                    let mut h = HeadPairs::from_pairs(headers());
                    s.request_headers(&mut h, true).await;
                    let mut r = HeadPairs::from_pairs(vec![(b":status".to_vec(), b"200".to_vec())]);
                    s.response_headers(&mut r, false).await;
                }
            });
            rounds.push(started.elapsed().as_nanos() as f64 / n as f64);
        }
        // The header list is built per request here (the proxy builds it only when a filter looks):
        // measured apart.
        let started = Instant::now();
        for _ in 0..n {
            std::hint::black_box(headers());
        }
        let base = started.elapsed().as_nanos() as f64 / n as f64;
        rounds.sort_by(f64::total_cmp);
        println!(
            "{name}: median {:.0} ns per request (rounds {:?}), building the header list alone {base:.0} ns",
            rounds[2],
            rounds.iter().map(|r| r.round()).collect::<Vec<_>>()
        );
    }
}

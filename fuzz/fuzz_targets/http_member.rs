//! The member side of the HTTP proxy: whatever a member answers (response heads, 1xx interim
//! responses, content-length / chunked / close-delimited bodies, garbage), relayed through the
//! whole HTTP/1 handler to a client, with the response cache in front (so fills and stored
//! responses are built from it), and to an HTTP/2 client (the HTTP/2 response body path). The
//! member is an in-memory listener inside the process (`fulcrum_http::upstream::memory`: the
//! proxy's member connection is one end of a duplex stream, no socket) that sends the fuzz
//! input and closes.
//! The first input byte picks the client's request.
#![no_main]

#[path = "common/h2_client.rs"]
mod h2_client;
#[path = "common/settle.rs"]
mod settle;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fulcrum_http::{Alpn, ConnInfo, HttpCache, HttpService, Parts, Upstreams};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct World {
    rt: tokio::runtime::Runtime,
    svc: Arc<HttpService>,
    reply: Arc<Mutex<Vec<u8>>>,
    /// The cache's `stored` counter when it was last emptied.
    stored: AtomicU64,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        // Timers only, no I/O driver: nothing here is a socket, and parking the runtime (each
        // step of the paused clock) then costs no epoll_wait and no eventfd write.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            // Paused clock: the member's and the proxy's timeouts fire as soon as the runtime is
            // idle (the member's bytes are already delivered by then) instead of after real
            // milliseconds, which is most of an input's time otherwise.
            .start_paused(true)
            .build()
            .expect("runtime");
        let reply = Arc::new(Mutex::new(Vec::new()));
        let svc = rt.block_on(async {
            // Any address: nothing listens on it, the proxy's connections to it stay in memory.
            let mut l = fulcrum_http::upstream::memory::listen(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                9,
            ));
            let member = l.addr();
            let r = reply.clone();
            // The member: reads what the proxy sends (a moment), answers with the input, closes.
            tokio::spawn(async move {
                while let Some(mut s) = l.accept().await {
                    let bytes = r.lock().expect("reply").clone();
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4096];
                        let _ =
                            tokio::time::timeout(Duration::from_millis(5), s.read(&mut buf)).await;
                        let _ = s.write_all(&bytes).await;
                        let _ = s.shutdown().await;
                    });
                }
            });
            let config = format!(
                r#"
[[virtual_service]]
name = "f"
listen = "127.0.0.1:1"
protocol = "http"
pool = "p"
header_timeout = "100ms"
idle_timeout = "100ms"
compression = {{ types = ["text/plain"], min_size = "1B" }}
cache = {{ size = "1MiB", max_object = "64KiB" }}
[[pool]]
name = "p"
monitors = []
retries = 0
response_timeout = "100ms"
[[pool.member]]
address = "{member}"
"#
            );
            let cfg = fulcrum_config::parse(&config, "fuzz.toml", std::path::Path::new("."))
                .expect("the fuzz config is valid");
            let pool = Arc::new(fulcrum_balance::Pool::new(&cfg.pools[0], &[], None));
            let upstreams = Upstreams::new();
            Arc::new(
                HttpService::build(
                    &cfg.virtual_services[0],
                    Parts {
                        config: &cfg,
                        pools: &[pool],
                        upstreams: &upstreams,
                        table: None,
                        stats: Default::default(),
                        http_stats: Default::default(),
                        tracker: Default::default(),
                        no_member_hook: None,
                        cache: Some(HttpCache::new(1 << 20, 64 << 10)),
                        snat: None,
                        transparent: None,
                    },
                )
                .expect("the fuzz service builds"),
            )
        });
        World {
            rt,
            svc,
            reply,
            stored: AtomicU64::new(0),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, reply)) = data.split_first() else {
        return;
    };
    let w = world();
    *w.reply.lock().expect("reply") = reply.to_vec();
    let request: Vec<u8> = match sel % 4 {
        // Cacheable: the cache fills from the member's response, then serves it (stored).
        // The last request of each asks for the close, so the handler ends with the response.
        0 => b"GET /c HTTP/1.1\r\nHost: f\r\n\r\nGET /c HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n"
            .to_vec(),
        1 => b"HEAD /h HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n".to_vec(),
        2 => b"POST /p HTTP/1.1\r\nHost: f\r\nAccept-Encoding: gzip\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc"
            .to_vec(),
        _ => h2_client::h2_request(),
    };
    w.rt.block_on(async {
        let before = settle::alive();
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let info = ConnInfo {
            peer: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 5000),
            local: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 80),
            alpn: Alpn::Unknown,
            sni: None,
        };
        let handler = tokio::spawn(fulcrum_http::serve_connection(w.svc.clone(), server, info));
        let _ = client.write_all(&request).await;
        let h2 = sel % 4 == 3;
        let _ = tokio::time::timeout(
            Duration::from_millis(500),
            h2_client::read_response(&mut client, h2),
        )
        .await;
        drop(client);
        let _ = tokio::time::timeout(Duration::from_secs(2), handler).await;
        settle::settle(before).await;
    });
    // Keep the cache from carrying one input's entry into the next. Emptying walks the whole
    // store (a fifth of the target's time when done after every input): only when the input
    // stored something.
    if let Some(c) = &w.svc.cache {
        let stored = c.stats.stored.load(Ordering::Relaxed);
        if w.stored.swap(stored, Ordering::Relaxed) != stored {
            c.purge(|_, _| true);
        }
    }
});

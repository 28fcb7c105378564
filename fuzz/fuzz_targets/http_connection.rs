//! Arbitrary bytes on an HTTP client connection, driven through the whole HTTP/1 (and HTTP/2,
//! when they start with its preface) connection handler: parsing, limits, rules, local answers,
//! body framing, pipelining. The pool has no reachable member, so nothing leaves the process;
//! whatever comes in, the handler answers or closes, and never panics.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fulcrum_http::{Alpn, ConnInfo, HttpService, Parts, Upstreams};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONFIG: &str = r#"
[[virtual_service]]
name = "f"
listen = "127.0.0.1:1"
protocol = "http"
pool = "p"
header_timeout = "50ms"
idle_timeout = "50ms"
max_header_size = "4KiB"
max_headers = 32
max_uri_length = 512
[[virtual_service.rule]]
path_prefix = "/r/"
redirect = "https://$host$path$query"
[[virtual_service.rule]]
path = "/deny"
respond = 403
body = "no\n"
[[virtual_service.rule]]
path = "/drop"
drop = true
[[pool]]
name = "p"
[[pool.member]]
address = "127.0.0.1:9"
state = "disabled"
"#;

struct World {
    rt: tokio::runtime::Runtime,
    svc: Arc<HttpService>,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let svc = rt.block_on(async {
            let cfg = fulcrum_config::parse(CONFIG, "fuzz.toml", std::path::Path::new("."))
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
                        cache: None,
                        snat: None,
                        transparent: None,
                    },
                )
                .expect("the fuzz service builds"),
            )
        });
        World { rt, svc }
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    w.rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let info = ConnInfo {
            peer: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 5000),
            local: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 80),
            alpn: Alpn::Unknown,
            sni: None,
        };
        let handler = tokio::spawn(fulcrum_http::serve_connection(w.svc.clone(), server, info));
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), client.read_to_end(&mut out)).await;
        drop(client);
        let _ = tokio::time::timeout(Duration::from_secs(2), handler).await;
    });
});

//! The straightforward hyper proxy the project measured first (hyper 1.x server, hyper-util's pooled
//! client shared by all threads, mimalloc, `Connection` stripped), kept as the baseline that
//! `bench/http.sh` compares Fulcrum's own HTTP/1 path with.
//!
//! `cargo run --release -p fulcrum-http --example hyper_baseline -- LISTEN MEMBER [MEMBER...]`

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Body = BoxBody<bytes::Bytes, hyper::Error>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(listen), members) = (args.first(), &args[1.min(args.len())..]) else {
        eprintln!("usage: hyper_baseline LISTEN MEMBER [MEMBER...]");
        std::process::exit(2);
    };
    let listen: SocketAddr = listen.parse().expect("listen address");
    let members: Arc<Vec<String>> = Arc::new(members.to_vec());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let client: Client<_, Incoming> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build_http();
        let next = Arc::new(AtomicUsize::new(0));
        let listener = tokio::net::TcpListener::bind(listen).await.expect("bind");
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            let (client, members, next) = (client.clone(), members.clone(), next.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                    let (client, members, next) = (client.clone(), members.clone(), next.clone());
                    async move {
                        let m = &members[next.fetch_add(1, Ordering::Relaxed) % members.len()];
                        let pq = req.uri().path_and_query().map_or("/", |p| p.as_str());
                        let uri = format!("http://{m}{pq}").parse().expect("uri");
                        *req.uri_mut() = uri;
                        req.headers_mut().remove(hyper::header::CONNECTION);
                        let resp: hyper::Response<Body> = match client.request(req).await {
                            Ok(r) => r.map(|b| b.boxed()),
                            Err(_) => hyper::Response::builder()
                                .status(502)
                                .body(http_body_util::Empty::new().map_err(|e| match e {}).boxed())
                                .expect("response"),
                        };
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
}

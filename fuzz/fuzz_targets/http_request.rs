//! Any bytes a client sends as an HTTP/1 request head (and what follows it) are parsed into a
//! head or refused with a status, never a panic: the parser and RFC 9112 checks, the rule
//! indexes and regexes, path normalisation, cookies, the hash keys, the forwarded head, and the
//! strict chunked decoder over the rest.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock};

use fulcrum_http::head::{Limits, Parse, RequestHead};
use fulcrum_http::{Alpn, ConnInfo, HttpService, Parts, Upstreams};
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"
[[virtual_service]]
name = "f"
listen = "127.0.0.1:1"
protocol = "http"
pool = "p"
persistence = "s"
forward_headers = { forwarded = true, x_real_ip = true }
[[virtual_service.rule]]
host = "*.example.com"
path_prefix = "/a/"
pool = "p"
rewrite_path = { regex = "^/a/(.*)$", replace = "/$1" }
request_headers = { set = { "X-A" = "1" }, remove = ["Cookie"] }
[[virtual_service.rule]]
path_regex = "^/r/[0-9]+$"
header = { "X-Env" = "^c" }
cookie = { "beta" = "^1$" }
query = { "v" = "^2$" }
redirect = "https://$host$path$query"
[[virtual_service.rule]]
user_agent = "(?i)mobile"
method = ["POST"]
respond = 403
[[pool]]
name = "p"
algorithm = "hash"
hash_key = "cookie:uid"
[[pool.member]]
address = "127.0.0.1:2"
[[persistence]]
name = "s"
type = "cookie_rewrite"
cookie = "SID"
"#;

fn service() -> &'static Arc<HttpService> {
    static S: OnceLock<Arc<HttpService>> = OnceLock::new();
    S.get_or_init(|| {
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
    })
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_header_size: 4096,
        max_headers: 32,
        max_uri: 1024,
    };
    let mut head = RequestHead::with_buffer(data.to_vec());
    match head.parse(&limits) {
        Ok(Parse::Complete) => {}
        Ok(Parse::Partial) | Err(_) => return,
    }
    let svc = service();
    let client = fulcrum_http::service::Client::new(ConnInfo {
        peer: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 5000),
        local: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 80),
        alpn: Alpn::Unknown,
        sni: None,
    });
    let _ = fulcrum_http::rules::normalize_path(head.path());
    let _ = head.host_name();
    let _ = head.cookie(b"SID");
    if let Some(q) = head.query() {
        let _ = fulcrum_http::rules::query_param(q, b"v");
    }
    let plan = svc.plan(&head, &client);
    let rule = match plan {
        fulcrum_http::service::Plan::Forward { rule, .. } => rule,
        fulcrum_http::service::Plan::Local(_, rule) => rule,
        fulcrum_http::service::Plan::Drop => None,
    };
    let _ = fulcrum_http::service::request_hash(&svc.targets[0].pool, &head, &client);
    let mut out = Vec::new();
    fulcrum_http::fields::write_request_line(&mut out, &head, rule);
    fulcrum_http::fields::write_request_fields(
        &mut out,
        &head,
        &fulcrum_http::fields::RequestCtx {
            settings: svc.field_settings(),
            client: &client,
            rule,
            framing: if head.chunked {
                fulcrum_http::fields::ReqFraming::Chunked
            } else {
                fulcrum_http::fields::ReqFraming::None
            },
            h2: false,
        },
    );
    if head.chunked {
        let mut d = fulcrum_http::chunked::Decoder::default();
        let mut body = Vec::new();
        if let Ok(n) = d.feed(head.after_head(), |b| body.extend_from_slice(b)) {
            assert!(n <= head.after_head().len());
            assert!(body.len() <= head.after_head().len());
        }
    }
});

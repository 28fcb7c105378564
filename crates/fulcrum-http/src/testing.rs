//! Fixtures for the crate's unit tests: a service built from configuration text, parsed
//! requests and responses, a client.

use std::sync::Arc;
use std::time::Duration;

use crate::client::{Alpn, Client, ConnInfo};
use crate::head::{Limits, Parse, RequestHead, ResponseHead};
use crate::service::{HttpService, Parts};

/// A service `w` with `vs_extra` lines, on a round-robin pool of `members` loopback addresses
/// nobody listens on (`retries` = 2); with a persistence profile `s` of `profile` lines when
/// they are not empty.
pub(crate) fn service(members: usize, vs_extra: &str, profile: &str) -> Arc<HttpService> {
    let mut text = format!(
        "[[virtual_service]]\nname = \"w\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"http\"\npool = \"p\"\n{vs_extra}\n"
    );
    if !profile.is_empty() {
        text.push_str(&format!("[[persistence]]\nname = \"s\"\n{profile}\n"));
    }
    text.push_str("[[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\nretries = 2\n");
    for i in 0..members {
        text.push_str(&format!(
            "[[pool.member]]\naddress = \"127.0.0.1:{}\"\n",
            2000 + i
        ));
    }
    let cfg = fulcrum_config::parse(&text, "t", std::path::Path::new(".")).expect("config");
    let pool = Arc::new(fulcrum_balance::Pool::new(&cfg.pools[0], &[], None));
    let up = crate::Upstreams::new();
    let table = Arc::new(fulcrum_balance::PersistTable::new(
        fulcrum_balance::TableSpec {
            idle_timeout: Duration::from_secs(60),
            max_entries: 100,
        },
    ));
    let parts = Parts {
        config: &cfg,
        pools: &[pool],
        upstreams: &up,
        table: Some(table),
        stats: Default::default(),
        http_stats: Default::default(),
        tracker: Default::default(),
        no_member_hook: None,
        cache: None,
        snat: None,
    };
    Arc::new(HttpService::build(&cfg.virtual_services[0], parts).expect("service"))
}

pub(crate) fn request(text: &str) -> RequestHead {
    let mut h = RequestHead::with_buffer(text.as_bytes().to_vec());
    assert!(matches!(h.parse(&Limits::default()), Ok(Parse::Complete)));
    h
}

pub(crate) fn response(text: &str) -> ResponseHead {
    let mut r = ResponseHead::with_buffer(text.as_bytes().to_vec());
    assert!(matches!(r.parse(), Ok(Parse::Complete)));
    r
}

pub(crate) fn client() -> Client {
    Client::new(ConnInfo {
        peer: "127.0.0.9:5000".parse().expect("address"),
        local: "127.0.0.1:80".parse().expect("address"),
        alpn: Alpn::Unknown,
    })
}

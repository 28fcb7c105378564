//! Fixtures for the crate's unit tests: a service built from configuration text, parsed
//! requests and responses, a client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{Alpn, Client, ConnInfo};
use crate::head::{Limits, Parse, RequestHead, ResponseHead};
use crate::service::{HttpService, Parts};

/// A service `w` with `vs_extra` lines, on a round-robin pool of `members` loopback addresses
/// nobody listens on (`retries` = 2); with a persistence profile `s` of `profile` lines when
/// they are not empty.
pub(crate) fn service(members: usize, vs_extra: &str, profile: &str) -> Arc<HttpService> {
    let addrs: Vec<SocketAddr> = (0..members)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], 2000 + i as u16)))
        .collect();
    service_to(&addrs, vs_extra, profile, "retries = 2")
}

/// A service `w` with `vs_extra` lines on a round-robin pool (with `pool_extra` lines) of these
/// members.
pub(crate) fn service_to(
    members: &[SocketAddr],
    vs_extra: &str,
    profile: &str,
    pool_extra: &str,
) -> Arc<HttpService> {
    let mut text = format!(
        "[[virtual_service]]\nname = \"w\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"http\"\npool = \"p\"\n{vs_extra}\n"
    );
    if !profile.is_empty() {
        text.push_str(&format!("[[persistence]]\nname = \"s\"\n{profile}\n"));
    }
    text.push_str("[[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n");
    text.push_str(pool_extra);
    text.push('\n');
    for m in members {
        text.push_str(&format!("[[pool.member]]\naddress = \"{m}\"\n"));
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
        transparent: None,
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
        sni: None,
    })
}

/// A loopback HTTP/1.1 member: answers every request with `200` and `body` (keep-alive), and
/// keeps the heads it received. Returns its address, the heads, and how many connections it
/// accepted.
pub(crate) async fn member(
    body: &'static str,
) -> (SocketAddr, Arc<Mutex<Vec<String>>>, Arc<Mutex<usize>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a member");
    let addr = l.local_addr().expect("its address");
    let (seen, conns) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(0)));
    let (s, c) = (seen.clone(), conns.clone());
    tokio::spawn(async move {
        while let Ok((mut io, _)) = l.accept().await {
            *c.lock() += 1;
            let s = s.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // One request: its head, then a body of its Content-Length.
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match io.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
                    let len: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    while buf.len() < end + 4 + len {
                        match io.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body_in =
                        String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned();
                    buf.drain(..end + 4 + len);
                    s.lock().push(head + &body_in);
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if io.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen, conns)
}

//! Site state exchange between two Fulcrum processes on loopback (127.0.0.2 and 127.0.0.3).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use fulcrum_testkit::free_addr_on;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP server on `addr` answering "OK\n" (a site's health endpoint).
async fn ok_server(addr: SocketAddr) -> tokio::task::JoinHandle<()> {
    let l = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(b"OK\n").await;
                let mut b = [0u8; 16];
                let _ = s.read(&mut b).await;
            });
        }
    })
}

fn port_on_both() -> u16 {
    loop {
        let a = free_addr_on([127, 0, 0, 11]);
        if std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 12], a.port()))).is_ok() {
            return a.port();
        }
    }
}

struct Setup {
    east_peer: SocketAddr,
    west_peer: SocketAddr,
    port: u16,
}

/// The config of the instance at `local`. `east_monitor_port` lets one instance probe east
/// somewhere else (its own view of the site).
fn config(s: &Setup, local: &str, key: &str, east_monitor_port: u16, algorithm: &str) -> String {
    format!(
        r#"
[dns]
listen = "{dns}"

[[dns.zone]]
origin = "example.com."

[[monitor]]
name = "site"
type = "send_expect"
expect = "OK"
port = {port}
interval = "200ms"
timeout = "150ms"
rise = 1
fall = 2

[[monitor]]
name = "east-view"
type = "send_expect"
expect = "OK"
port = {east_monitor_port}
interval = "200ms"
timeout = "150ms"
rise = 1
fall = 2

[gslb]
local_site = "{local}"
key = "{key}"
interval = "4s"
stale_after = "5s"

[[gslb.site]]
name = "east"
addresses = ["127.0.0.11"]
monitor = "east-view"
peer = "{east_peer}"

[[gslb.site]]
name = "west"
addresses = ["127.0.0.12"]
monitor = "site"
peer = "{west_peer}"

[[gslb.name]]
fqdn = "app.example.com."
sites = ["east", "west"]
algorithm = "{algorithm}"
"#,
        dns = free_addr(),
        port = s.port,
        east_peer = s.east_peer,
        west_peer = s.west_peer,
    )
}

async fn peer(f: &Fulcrum, site: &str) -> Value {
    let p = f.get_json("/api/v1/gslb/peers").await;
    p["peers"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["site"] == site).cloned())
        .unwrap_or_default()
}

async fn share(f: &Fulcrum, site: &str) -> f64 {
    let t = f.get_json("/api/v1/gslb/table").await;
    t["shares"]["app.example.com."]["*"][site]
        .as_f64()
        .unwrap_or(-1.0)
}

async fn tables_agree(a: &Fulcrum, b: &Fulcrum) -> bool {
    let ta = a.get_json("/api/v1/gslb/table").await;
    let tb = b.get_json("/api/v1/gslb/table").await;
    ta["shares"] == tb["shares"]
        && ta["reporters"].as_array().is_some_and(|r| r.len() == 2)
        && tb["reporters"] == ta["reporters"]
}

fn setup() -> Setup {
    Setup {
        east_peer: free_addr_on([127, 0, 0, 2]),
        west_peer: free_addr_on([127, 0, 0, 3]),
        port: port_on_both(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_exchange_state_and_compute_the_same_table() {
    let s = setup();
    let key = "a-shared-secret-for-tests";
    let _east_srv = ok_server(SocketAddr::from(([127, 0, 0, 11], s.port))).await;
    let _west_srv = ok_server(SocketAddr::from(([127, 0, 0, 12], s.port))).await;
    // East's instance probes east where it answers; west's instance probes a port where
    // nothing listens, so it sees east down: the two views differ.
    let dead = free_addr_on([127, 0, 0, 11]).port();
    let a = Fulcrum::start(
        BIN,
        free_addr(),
        &config(&s, "east", key, s.port, "weighted"),
    )
    .await
    .unwrap();
    let b = Fulcrum::start(BIN, free_addr(), &config(&s, "west", key, dead, "weighted"))
        .await
        .unwrap();

    assert!(
        wait_until(Duration::from_secs(10), || async {
            let (pa, pb) = (peer(&a, "west").await, peer(&b, "east").await);
            pa["connected"] == true
                && pb["connected"] == true
                && pa["stale"] == false
                && pb["stale"] == false
        })
        .await,
        "peers did not connect:\n{}\n{}\n{}",
        a.get_json("/api/v1/gslb/peers").await,
        b.get_json("/api/v1/gslb/peers").await,
        b.logs()
    );
    // One of two reporters sees east down: east gets half its weight, 1/3 of the answers, in
    // both tables.
    assert!(
        wait_until(Duration::from_secs(10), || async {
            tables_agree(&a, &b).await && (share(&a, "east").await - 1.0 / 3.0).abs() < 0.001
        })
        .await,
        "{}\n{}",
        a.get_json("/api/v1/gslb/table").await,
        b.get_json("/api/v1/gslb/table").await
    );
    let sites = a.get_json("/api/v1/gslb/sites").await;
    assert_eq!(sites["sites"][0]["factors"]["seen_up"], 1, "{sites}");
    assert_eq!(sites["sites"][0]["factors"]["seen_by"], 2, "{sites}");

    // East goes down for east's instance too: every reporter sees it down, and both tables
    // give it little (5% of its weight) — event-triggered: well before the next periodic report (4 s).
    _east_srv.abort();
    let t0 = Instant::now();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            tables_agree(&a, &b).await && share(&a, "east").await < 0.05
        })
        .await,
        "{}",
        a.get_json("/api/v1/gslb/table").await
    );
    assert!(
        t0.elapsed() < Duration::from_millis(2500),
        "took {:?}",
        t0.elapsed()
    );
    assert!(share(&b, "east").await > 0.0, "little, not nothing");

    // West's instance stops: east's instance marks it stale after stale_after (5 s), computes
    // its table from its own report alone, and keeps answering from its own monitors.
    drop(b);
    assert!(
        wait_until(Duration::from_secs(10), || async {
            peer(&a, "west").await["stale"] == true
        })
        .await,
        "{}",
        a.get_json("/api/v1/gslb/peers").await
    );
    assert!(
        wait_until(Duration::from_secs(5), || async {
            a.get_json("/api/v1/gslb/table").await["reporters"] == serde_json::json!(["east"])
        })
        .await
    );
    let p = peer(&a, "west").await;
    assert_eq!(p["connected"], false, "{p}");
    let m = a.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        m.contains("fulcrum_gslb_peer_stale{peer=\"west\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("fulcrum_gslb_peer_connected{peer=\"west\"} 0"),
        "{m}"
    );

    // West comes back: it reconnects and its reports count again.
    let b = Fulcrum::start(BIN, free_addr(), &config(&s, "west", key, dead, "weighted"))
        .await
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            peer(&a, "west").await["stale"] == false && tables_agree(&a, &b).await
        })
        .await,
        "{}",
        a.get_json("/api/v1/gslb/peers").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_another_key_is_refused() {
    let s = setup();
    let _east_srv = ok_server(SocketAddr::from(([127, 0, 0, 11], s.port))).await;
    let _west_srv = ok_server(SocketAddr::from(([127, 0, 0, 12], s.port))).await;
    let a = Fulcrum::start(
        BIN,
        free_addr(),
        &config(&s, "east", "the-right-secret-0123", s.port, "least_load"),
    )
    .await
    .unwrap();
    let b = Fulcrum::start(
        BIN,
        free_addr(),
        &config(&s, "west", "another-secret-456789", s.port, "least_load"),
    )
    .await
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            a.get_json("/api/v1/gslb/peers").await["auth_failures"]
                .as_u64()
                .unwrap_or(0)
                >= 2
                && b.get_json("/api/v1/gslb/peers").await["auth_failures"]
                    .as_u64()
                    .unwrap_or(0)
                    >= 2
        })
        .await,
        "{}",
        a.get_json("/api/v1/gslb/peers").await
    );
    for (f, other) in [(&a, "west"), (&b, "east")] {
        let p = peer(f, other).await;
        assert_eq!(p["reports_received"], 0, "{p}");
        assert_eq!(p["stale"], true, "{p}");
        assert_eq!(
            f.get_json("/api/v1/gslb/table").await["reporters"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }
    assert!(a.logs().contains("authentication failed"), "{}", a.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connections_are_bounded_and_timed_out() {
    let s = setup();
    let _east_srv = ok_server(SocketAddr::from(([127, 0, 0, 11], s.port))).await;
    let a = Fulcrum::start(
        BIN,
        free_addr(),
        &config(&s, "east", "the-right-secret-0123", s.port, "least_load"),
    )
    .await
    .unwrap();
    // 40 strangers connect and send nothing (stale_after is 5 s: before, each was held for
    // 10 s with a task and, once it sent a header, a 64 KiB buffer).
    let mut conns = Vec::new();
    for _ in 0..40 {
        conns.push(tokio::net::TcpStream::connect(s.east_peer).await.unwrap());
    }
    let started = Instant::now();
    let mut closed_at_once = 0;
    let mut held = Vec::new();
    for mut c in conns {
        let mut hello = [0u8; 20];
        match tokio::time::timeout(Duration::from_millis(1500), c.read_exact(&mut hello)).await {
            Ok(Ok(_)) => held.push(c),
            _ => closed_at_once += 1,
        }
    }
    // All from one source: 4 of them may wait to authenticate (16 from all sources).
    assert_eq!(closed_at_once, 36, "4 per source may wait to authenticate");
    // The 4 that got a challenge must answer within 5 s.
    for mut c in held {
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_secs(8), c.read(&mut b))
            .await
            .expect("still open after the first-frame deadline");
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(9));
    let p = a.get_json("/api/v1/gslb/peers").await;
    assert_eq!(p["unauthenticated_refused"], 36, "{p}");
}

/// The addresses `server` answers for `name` (A), by dig.
fn dig_a(server: SocketAddr, name: &str) -> Vec<String> {
    let out = std::process::Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string()])
        .args(["+norec", "+time=2", "+tries=2", "+short", name, "A"])
        .output()
        .expect("dig (dnsutils) is installed by scripts/test-packages");
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(';'))
        .map(String::from)
        .collect();
    v.sort();
    v
}

/// The config of an instance for learnt addresses: east has no address of its own (its
/// instance's virtual service `vip` adds one with `gslb`), west has a fixed one. `vip` is
/// the virtual service block (empty on west's instance).
fn learnt_config(s: &Setup, local: &str, dns: SocketAddr, vip: &str) -> String {
    format!(
        r#"
[dns]
listen = "{dns}"

[[dns.zone]]
origin = "example.com."

[gslb]
local_site = "{local}"
key = "a-shared-secret-for-tests"
interval = "4s"
stale_after = "5s"

[[gslb.site]]
name = "east"
peer = "{east_peer}"

[[gslb.site]]
name = "west"
addresses = ["127.0.0.12"]
peer = "{west_peer}"

[[gslb.name]]
fqdn = "app.example.com."
sites = ["east", "west"]
algorithm = "round_robin"
answers = 4
{vip}
"#,
        east_peer = s.east_peer,
        west_peer = s.west_peer,
    )
}

fn vip_block(vip: SocketAddr, member: SocketAddr, gslb: &str) -> String {
    format!(
        r#"
[[monitor]]
name = "member-check"
type = "tcp"
interval = "200ms"
timeout = "150ms"
rise = 1
fall = 1

[[virtual_service]]
name = "vip"
listen = "{vip}"
protocol = "tcp"
pool = "web"
{gslb}

[[pool]]
name = "web"
monitors = ["member-check"]
[[pool.member]]
address = "{member}"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vip_with_gslb_on_one_site_is_answered_by_every_instance() {
    let s = setup();
    let vip = free_addr_on([127, 0, 0, 21]);
    let member_addr = free_addr();
    let member = TcpIdServer::start(member_addr, "m0").await.unwrap();
    let (dns_a, dns_b) = (free_addr(), free_addr());
    let with_gslb = vip_block(vip, member_addr, "gslb = \"app.example.com\"");
    let a = Fulcrum::start(
        BIN,
        free_addr(),
        &learnt_config(&s, "east", dns_a, &with_gslb),
    )
    .await
    .unwrap();
    let b = Fulcrum::start(BIN, free_addr(), &learnt_config(&s, "west", dns_b, ""))
        .await
        .unwrap();
    let both = vec!["127.0.0.12".to_string(), vip.ip().to_string()];
    let west_only = vec!["127.0.0.12".to_string()];

    // The VIP is configured only on east's instance; west's answers it for east too.
    for (f, dns) in [(&a, dns_a), (&b, dns_b)] {
        assert!(
            wait_until(Duration::from_secs(10), || async {
                dig_a(dns, "app.example.com") == both
            })
            .await,
            "{:?}\n{}\n{}",
            dig_a(dns, "app.example.com"),
            f.get_json("/api/v1/gslb/sites").await,
            f.logs()
        );
    }
    let sites = b.get_json("/api/v1/gslb/sites").await;
    let learnt = &sites["sites"][0]["learnt"][0];
    assert_eq!(learnt["address"], vip.ip().to_string(), "{sites}");
    assert_eq!(learnt["service"], "vip", "{sites}");
    assert_eq!(learnt["health"], "up", "{sites}");
    assert_eq!(
        sites["sites"][0]["health"], "up",
        "a site with learnt addresses only is up while one is: {sites}"
    );

    // Its member goes down: the VIP leaves the answers of both instances (west stays up, so
    // no fail-open).
    member.kill();
    for (f, dns) in [(&a, dns_a), (&b, dns_b)] {
        assert!(
            wait_until(Duration::from_secs(10), || async {
                dig_a(dns, "app.example.com") == west_only
            })
            .await,
            "{:?}\n{}",
            dig_a(dns, "app.example.com"),
            f.get_json("/api/v1/gslb/sites").await
        );
    }
    let m = b.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        m.contains("fulcrum_gslb_learnt_addresses{site=\"east\",health=\"down\"} 1"),
        "{m}"
    );

    // It comes back.
    let _member = TcpIdServer::start(member_addr, "m0").await.unwrap();
    for dns in [dns_a, dns_b] {
        assert!(
            wait_until(Duration::from_secs(10), || async {
                dig_a(dns, "app.example.com") == both
            })
            .await,
            "{:?}",
            dig_a(dns, "app.example.com")
        );
    }

    // A reload of east's instance without the key takes the VIP out everywhere.
    a.write_config(&learnt_config(
        &s,
        "east",
        dns_a,
        &vip_block(vip, member_addr, ""),
    ));
    let r = a.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    for (f, dns) in [(&a, dns_a), (&b, dns_b)] {
        assert!(
            wait_until(Duration::from_secs(10), || async {
                dig_a(dns, "app.example.com") == west_only
            })
            .await,
            "{:?}\n{}",
            dig_a(dns, "app.example.com"),
            f.get_json("/api/v1/gslb/sites").await
        );
    }
}

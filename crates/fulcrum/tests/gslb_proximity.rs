//! `algorithm = "proximity"`: two instances on loopback (127.0.0.2 and 127.0.0.3) each measure
//! their RTT to the client's resolver, a stand-in answering each instance's probes after its own
//! delay (the two sites' paths), share the RTTs over the exchange and answer the nearer site.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::*;
use fulcrum_testkit::{free_addr_on, DelayedResolver};
use serde_json::Value;

const RESOLVER: [u8; 4] = [127, 0, 0, 50];
const EAST: [u8; 4] = [127, 0, 0, 2];
const WEST: [u8; 4] = [127, 0, 0, 3];

/// The address `dns` answers for app.example.com to a resolver at 127.0.0.50 (dig's source).
fn ask(dns: SocketAddr) -> Vec<String> {
    let out = std::process::Command::new("dig")
        .arg(format!("@{}", dns.ip()))
        .args(["-p", &dns.port().to_string(), "-b", "127.0.0.50"])
        .args(["+norec", "+time=2", "+tries=1", "+short"])
        .args(["app.example.com", "A"])
        .output()
        .expect("dig (dnsutils) is installed by scripts/test-packages");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(';'))
        .map(String::from)
        .collect()
}

struct Setup {
    east_peer: SocketAddr,
    west_peer: SocketAddr,
    resolver_port: u16,
}

fn config(s: &Setup, local: &str, source: [u8; 4], dns: SocketAddr) -> String {
    format!(
        r#"
[dns]
listen = "{dns}"

[[dns.zone]]
origin = "example.com."

[gslb]
local_site = "{local}"
key = "a-shared-secret-for-tests"
interval = "1s"
stale_after = "4s"
proximity = {{ port = {port}, source = "{source}", timeout = "500ms", max_age = "1s" }}

[[gslb.site]]
name = "east"
addresses = ["127.0.0.11"]
peer = "{east_peer}"

[[gslb.site]]
name = "west"
addresses = ["127.0.0.12"]
peer = "{west_peer}"

[[gslb.name]]
fqdn = "app.example.com."
sites = ["east", "west"]
algorithm = "proximity"
fallback = "round_robin"
"#,
        port = s.resolver_port,
        source = IpAddr::from(source),
        east_peer = s.east_peer,
        west_peer = s.west_peer,
    )
}

async fn proximity(f: &Fulcrum) -> Value {
    f.get_json("/api/v1/gslb/proximity").await
}

/// Asks (at most for `within`) until `dns` answers `want` four times in a row: the fallback
/// (round robin) alternates, so only the RTTs answer one site four times running.
async fn answers(dns: SocketAddr, want: &str, within: Duration) -> bool {
    let want = want.to_string();
    wait_until(within, || async {
        let want = want.clone();
        tokio::task::spawn_blocking(move || (0..4).all(|_| ask(dns) == [want.clone()]))
            .await
            .unwrap_or(false)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_follow_the_nearer_site_and_move_when_the_delays_swap() {
    let resolver = DelayedResolver::start(free_addr_on(RESOLVER))
        .await
        .unwrap();
    resolver.set_delay(IpAddr::from(EAST), Duration::from_millis(5));
    resolver.set_delay(IpAddr::from(WEST), Duration::from_millis(120));
    let s = Setup {
        east_peer: free_addr_on(EAST),
        west_peer: free_addr_on(WEST),
        resolver_port: resolver.addr.port(),
    };
    let (dns_a, dns_b) = (free_addr(), free_addr());
    let a = Fulcrum::start(BIN, free_addr(), &config(&s, "east", EAST, dns_a))
        .await
        .unwrap();
    let b = Fulcrum::start(BIN, free_addr(), &config(&s, "west", WEST, dns_b))
        .await
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            let t = a.get_json("/api/v1/gslb/table").await;
            let u = b.get_json("/api/v1/gslb/table").await;
            t["reporters"].as_array().map(Vec::len) == Some(2)
                && u["reporters"].as_array().map(Vec::len) == Some(2)
        })
        .await,
        "the instances did not exchange reports:\n{}\n{}",
        a.logs(),
        b.logs()
    );

    // The first query from the resolver's prefix is answered by the fallback while both sites
    // probe it; then both instances answer east, 5 ms away against 120.
    let first = tokio::task::spawn_blocking(move || ask(dns_a))
        .await
        .unwrap();
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(
        proximity(&a).await["cold_answers"].as_u64() >= Some(1),
        "{}",
        proximity(&a).await
    );
    for (f, dns) in [(&a, dns_a), (&b, dns_b)] {
        assert!(
            answers(dns, "127.0.0.11", Duration::from_secs(10)).await,
            "{}\n{}",
            proximity(f).await,
            f.logs()
        );
    }
    // Each instance probed from its own address; west did without a query of its own (east's
    // report asked it).
    assert!(resolver.queries_from(IpAddr::from(EAST)) >= 1);
    assert!(resolver.queries_from(IpAddr::from(WEST)) >= 1);
    let px = proximity(&a).await;
    assert!(px["warm_answers"].as_u64().unwrap_or(0) >= 1, "{px}");
    assert!(px["probes_sent"].as_u64().unwrap_or(0) >= 1, "{px}");
    assert_eq!(px["prefixes"], 1, "one /24: {px}");

    // The paths swap: once the measurements are older than max_age (1 s) the next queries
    // measure again, and the answer moves to west.
    resolver.set_delay(IpAddr::from(EAST), Duration::from_millis(120));
    resolver.set_delay(IpAddr::from(WEST), Duration::from_millis(5));
    for (f, dns) in [(&a, dns_a), (&b, dns_b)] {
        assert!(
            answers(dns, "127.0.0.12", Duration::from_secs(15)).await,
            "{}",
            proximity(f).await
        );
    }
    // And back.
    resolver.set_delay(IpAddr::from(EAST), Duration::from_millis(5));
    resolver.set_delay(IpAddr::from(WEST), Duration::from_millis(120));
    for dns in [dns_a, dns_b] {
        assert!(answers(dns, "127.0.0.11", Duration::from_secs(15)).await);
    }
    // Probes are paced by the measurements' age, not by the queries: a few per site per
    // second of the test, not one per query.
    let queries_answered = proximity(&a).await["warm_answers"].as_u64().unwrap_or(0);
    let probes = resolver.queries();
    assert!(
        probes < 200,
        "{probes} probes for {queries_answered} warm answers"
    );
    let m = a.api("GET", "/metrics", None).await.unwrap().text();
    let cold = m
        .lines()
        .find_map(|l| l.strip_prefix("fulcrum_gslb_proximity_answers_total{cache=\"cold\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(cold.is_some_and(|c| c >= 1), "{m}");
    assert!(m.contains("fulcrum_gslb_proximity_prefixes 1"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rtt_cache_is_bounded_and_its_evictions_and_probes_counted() {
    // One instance; west's is not running, so only east measures. 300 resolver /24s in
    // 127.0.0.0/8 ask once each (Client Subnet); their probes go to a port where nothing
    // listens (the ICMP port unreachable is the reply), and the cache keeps 50.
    let closed = free_addr();
    let s = Setup {
        east_peer: free_addr_on(EAST),
        west_peer: free_addr_on(WEST),
        resolver_port: closed.port(),
    };
    let dns = free_addr();
    let cfg = config(&s, "east", EAST, dns).replace(
        "max_age = \"1s\" }",
        "max_age = \"1s\", max_prefixes = 50, probes_per_second = 1000 }",
    );
    let a = Fulcrum::start(BIN, free_addr(), &cfg).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("queries");
    let lines: String = (0..300)
        .map(|k| {
            format!(
                "app.example.com A +subnet=127.{}.{}.1/24 +short\n",
                1 + k / 250,
                k % 250
            )
        })
        .collect();
    std::fs::write(&file, lines).unwrap();
    let out = std::process::Command::new("dig")
        .arg(format!("@{}", dns.ip()))
        .args([
            "-p",
            &dns.port().to_string(),
            "+norec",
            "+time=2",
            "+tries=1",
            "-f",
        ])
        .arg(&file)
        .output()
        .unwrap();
    let answered = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("127.0.0.1"))
        .count();
    assert_eq!(
        answered, 300,
        "every query answered (by the fallback, cold)"
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            proximity(&a).await["probes_in_flight"] == 0
        })
        .await,
        "{}",
        proximity(&a).await
    );
    let px = proximity(&a).await;
    let n = |k: &str| px[k].as_u64().unwrap_or(u64::MAX);
    assert!(n("prefixes") <= 50, "{px}");
    assert_eq!(n("evictions"), 250, "{px}");
    // A probe may finish (the refusal comes back in microseconds) before its own query
    // ranks: that one is warm.
    assert_eq!(n("cold_answers") + n("warm_answers"), 300, "{px}");
    assert!(n("cold_answers") >= 250, "{px}");
    assert!(
        n("probes_sent") + n("probes_dropped") <= 300,
        "one probe per new prefix at most: {px}"
    );
    assert!(n("probes_sent") >= 1, "{px}");
    let m = a.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        m.contains("fulcrum_gslb_proximity_evictions_total 250"),
        "{m}"
    );
}

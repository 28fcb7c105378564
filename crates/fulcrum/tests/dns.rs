//! Authoritative DNS and GSLB, end to end through the binary, asked by a real client (dig).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Runs dig against `server` (no recursion, one try); returns its whole output.
fn dig(server: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args([
            "-p",
            &server.port().to_string(),
            "+norec",
            "+time=2",
            "+tries=2",
        ])
        .args(args)
        .output()
        .expect("dig (dnsutils) is installed by scripts/test.sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn short(server: SocketAddr, args: &[&str]) -> Vec<String> {
    let mut a = args.to_vec();
    a.push("+short");
    dig(server, &a)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(';'))
        .map(String::from)
        .collect()
}

fn status(out: &str) -> String {
    out.split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("none")
        .to_string()
}

fn flags(out: &str) -> Vec<String> {
    out.lines()
        .find(|l| l.starts_with(";; flags:"))
        .and_then(|l| l.strip_prefix(";; flags:"))
        .and_then(|l| l.split(';').next())
        .map(|f| f.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// The records of one section (";; ANSWER SECTION:" etc.), as lines.
fn section(out: &str, name: &str) -> Vec<String> {
    let header = format!(";; {name} SECTION:");
    let mut lines = out.lines().skip_while(|l| *l != header);
    lines.next();
    lines
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Asks `n` times in one dig process (batch mode) and counts the first address of each answer.
fn tally(
    server: SocketAddr,
    name: &str,
    qtype: &str,
    extra: &str,
    n: usize,
) -> BTreeMap<String, usize> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("queries");
    let line = format!("{name} {qtype} {extra} +short\n");
    std::fs::write(&file, line.repeat(n)).unwrap();
    let out = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args([
            "-p",
            &server.port().to_string(),
            "+norec",
            "+time=2",
            "+tries=2",
            "-f",
        ])
        .arg(&file)
        .output()
        .unwrap();
    let mut counts = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let l = l.trim();
        if !l.is_empty() && !l.starts_with(';') {
            *counts.entry(l.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

const ZONE: &str = r#"$TTL 300
@       IN SOA ns1 hostmaster ( 2024010101 3600 600 86400 60 )
        IN NS  ns1
ns1     IN A   192.0.2.1
www     IN CNAME app
alias   IN CNAME www
ext     IN CNAME elsewhere.example.net.
mail    IN MX  10 mx1
mx1     IN A   192.0.2.25
mx1     IN AAAA 2001:db8::25
_sip._udp IN SRV 10 60 5060 sip
sip     IN A   192.0.2.26
@       IN CAA 0 issue "letsencrypt.org"
deep.a.b IN A 192.0.2.99
7       IN PTR host.example.com.
*.wild  IN A   192.0.2.77
sub     IN NS  ns.sub
ns.sub  IN A   192.0.2.53
long    IN TXT "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
long    IN TXT "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc" "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
long    IN TXT "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee" "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"
"#;

/// A zone file in the test's own directory and the `[dns]` part naming it.
fn dns_section(dir: &std::path::Path, listen: &[SocketAddr], extra: &str) -> String {
    std::fs::write(dir.join("example.com.zone"), ZONE).unwrap();
    let listen: Vec<String> = listen.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[dns]\nlisten = [{}]\n{extra}\n[[dns.zone]]\norigin = \"example.com.\"\nfile = \"{}\"\nrecords = [\"inline 120 IN TXT \\\"from the config\\\"\"]\n",
        listen.join(", "),
        dir.join("example.com.zone").display()
    )
}

/// `[[ip_table]]`s "tel" (198.51.100.0/24) and "uni" (203.0.113.0/24) and sites east/west.
fn two_sites(extra_east: &str, extra_west: &str) -> String {
    format!(
        r#"
[[ip_table]]
name = "tel"
cidrs = ["198.51.100.0/24", "2001:db8:100::/48"]

[[ip_table]]
name = "uni"
cidrs = ["203.0.113.0/24"]

[[gslb.site]]
name = "east"
addresses = ["192.0.2.10", "2001:db8::10"]
regions = ["tel"]
{extra_east}

[[gslb.site]]
name = "west"
addresses = ["192.0.2.20"]
regions = ["uni"]
{extra_west}
"#
    )
}

fn gslb_name(fqdn: &str, algorithm: &str, extra: &str) -> String {
    format!("[[gslb.name]]\nfqdn = \"{fqdn}\"\nsites = [\"east\", \"west\"]\nalgorithm = \"{algorithm}\"\n{extra}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authoritative_answers_negative_answers_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let v6: SocketAddr = format!("[::1]:{}", dns.port()).parse().unwrap();
    let f = start(&format!(
        "{}{}{}",
        dns_section(dir.path(), &[dns, v6], ""),
        two_sites("", ""),
        gslb_name("app.example.com.", "topology", "ttl = 20")
    ))
    .await;

    let out = dig(dns, &["www.example.com", "A"]);
    assert_eq!(status(&out), "NOERROR", "{out}");
    assert!(flags(&out).contains(&"aa".to_string()), "{out}");
    let answer = section(&out, "ANSWER");
    assert_eq!(
        answer[0], "www.example.com. 300 IN CNAME app.example.com.",
        "{out}"
    );
    assert!(
        answer[1].starts_with("app.example.com. 20 IN A 192.0.2."),
        "CNAME into a GSLB name: {out}"
    );

    // A chain of two CNAMEs inside the zone, then the GSLB name; case does not matter and the
    // question comes back as it was asked.
    let out = dig(dns, &["AlIaS.ExAmPlE.CoM", "A"]);
    assert_eq!(section(&out, "ANSWER").len(), 3, "{out}");
    assert!(
        out.contains(";AlIaS.ExAmPlE.CoM."),
        "question echoed as sent: {out}"
    );

    // A CNAME out of our zones: given as is, the resolver follows it.
    assert_eq!(
        short(dns, &["ext.example.com", "A"]),
        ["elsewhere.example.net."]
    );

    assert_eq!(
        short(dns, &["mail.example.com", "MX"]),
        ["10 mx1.example.com."]
    );
    assert_eq!(short(dns, &["mx1.example.com", "AAAA"]), ["2001:db8::25"]);
    assert_eq!(
        short(dns, &["_sip._udp.example.com", "SRV"]),
        ["10 60 5060 sip.example.com."]
    );
    assert_eq!(
        short(dns, &["example.com", "CAA"]),
        ["0 issue \"letsencrypt.org\""]
    );
    assert_eq!(short(dns, &["7.example.com", "PTR"]), ["host.example.com."]);
    assert_eq!(short(dns, &["example.com", "NS"]), ["ns1.example.com."]);
    assert_eq!(
        short(dns, &["inline.example.com", "TXT"]),
        ["\"from the config\""]
    );
    assert_eq!(short(dns, &["app.example.com", "AAAA"]), ["2001:db8::10"]);
    assert_eq!(
        short(v6, &["mx1.example.com", "A"]),
        ["192.0.2.25"],
        "IPv6 listener"
    );

    // NXDOMAIN and NODATA carry the SOA, with the negative TTL (min of TTL and MINIMUM).
    let out = dig(dns, &["nope.example.com", "A"]);
    assert_eq!(status(&out), "NXDOMAIN", "{out}");
    assert!(section(&out, "ANSWER").is_empty());
    assert_eq!(
        section(&out, "AUTHORITY"),
        ["example.com. 60 IN SOA ns1.example.com. hostmaster.example.com. 2024010101 3600 600 86400 60"]
    );
    let out = dig(dns, &["mail.example.com", "AAAA"]);
    assert_eq!(status(&out), "NOERROR", "NODATA: {out}");
    assert!(section(&out, "ANSWER").is_empty());
    assert_eq!(section(&out, "AUTHORITY").len(), 1, "{out}");
    // An empty non-terminal exists: NODATA, not NXDOMAIN.
    let out = dig(dns, &["a.b.example.com", "A"]);
    assert_eq!(status(&out), "NOERROR", "{out}");
    assert_eq!(section(&out, "AUTHORITY").len(), 1, "{out}");
    // A GSLB name answers NODATA for other types.
    let out = dig(dns, &["app.example.com", "MX"]);
    assert_eq!(status(&out), "NOERROR", "{out}");
    assert!(section(&out, "ANSWER").is_empty(), "{out}");
    // Outside our zones: REFUSED, not authoritative.
    let out = dig(dns, &["www.example.org", "A"]);
    assert_eq!(status(&out), "REFUSED", "{out}");
    assert!(!flags(&out).contains(&"aa".to_string()), "{out}");

    // Wildcards answer under the asked name, for one label or several.
    let out = dig(dns, &["anything.wild.example.com", "A"]);
    assert_eq!(
        section(&out, "ANSWER"),
        ["anything.wild.example.com. 300 IN A 192.0.2.77"],
        "{out}"
    );
    assert_eq!(short(dns, &["a.b.wild.example.com", "A"]), ["192.0.2.77"]);
    assert_eq!(
        status(&dig(dns, &["wild.example.com", "A"])),
        "NOERROR",
        "the wildcard's parent exists"
    );
    // A delegation: a referral with glue, not authoritative.
    let out = dig(dns, &["host.sub.example.com", "A"]);
    assert_eq!(status(&out), "NOERROR", "{out}");
    assert!(!flags(&out).contains(&"aa".to_string()), "{out}");
    assert!(section(&out, "ANSWER").is_empty(), "{out}");
    assert_eq!(
        section(&out, "AUTHORITY"),
        ["sub.example.com. 300 IN NS ns.sub.example.com."],
        "{out}"
    );
    assert_eq!(
        section(&out, "ADDITIONAL"),
        ["ns.sub.example.com. 300 IN A 192.0.2.53"],
        "{out}"
    );

    // Minimal responses: no additional records beyond the OPT.
    let out = dig(dns, &["mail.example.com", "MX"]);
    assert!(out.contains("ADDITIONAL: 1"), "{out}");

    // TCP answers the same.
    assert_eq!(
        short(dns, &["mx1.example.com", "A", "+tcp"]),
        ["192.0.2.25"]
    );

    let m = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        m.contains("fulcrum_dns_responses_total{rcode=\"NXDOMAIN\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("fulcrum_dns_responses_total{rcode=\"REFUSED\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("fulcrum_dns_queries_total{transport=\"tcp\"}"),
        "{m}"
    );
    assert!(
        m.contains("fulcrum_dns_zone_records{zone=\"example.com.\"}"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_are_truncated_over_udp_and_complete_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let f = start(&dns_section(dir.path(), &[dns], "udp_payload = 1232")).await;
    // Without EDNS the limit is 512 bytes: TC set, nothing in the answer.
    let out = dig(dns, &["long.example.com", "TXT", "+noedns", "+ignore"]);
    assert!(flags(&out).contains(&"tc".to_string()), "{out}");
    assert!(section(&out, "ANSWER").is_empty(), "{out}");
    // With an EDNS buffer of 512 too.
    let out = dig(dns, &["long.example.com", "TXT", "+bufsize=512", "+ignore"]);
    assert!(flags(&out).contains(&"tc".to_string()), "{out}");
    assert!(
        out.contains("udp: 1232"),
        "our payload size is advertised: {out}"
    );
    // A large enough EDNS buffer gets it all over UDP.
    let out = dig(dns, &["long.example.com", "TXT", "+bufsize=4096"]);
    assert!(!flags(&out).contains(&"tc".to_string()), "{out}");
    assert_eq!(section(&out, "ANSWER").len(), 3, "{out}");
    // dig retries a truncated answer over TCP by itself: the client gets everything.
    let out = dig(dns, &["long.example.com", "TXT", "+noedns"]);
    assert_eq!(section(&out, "ANSWER").len(), 3, "{out}");
    assert!(out.contains("(TCP)"), "{out}");
    let m = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(!m.contains("fulcrum_dns_truncated_total 0\n"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_subnet_topology_fallback_and_scope() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let f = start(&format!(
        "{}{}{}",
        dns_section(dir.path(), &[dns], ""),
        two_sites("", ""),
        gslb_name(
            "app.example.com.",
            "topology",
            "fallback = \"first_available\""
        )
    ))
    .await;
    // ECS from a "tel" client: east; from "uni": west; the option is echoed with the scope
    // of the table prefix that decided (here /24, the source being /24 too).
    let out = dig(dns, &["app.example.com", "A", "+subnet=198.51.100.77/24"]);
    assert_eq!(
        section(&out, "ANSWER"),
        ["app.example.com. 30 IN A 192.0.2.10"],
        "{out}"
    );
    assert!(out.contains("CLIENT-SUBNET: 198.51.100.0/24/24"), "{out}");
    let out = dig(dns, &["app.example.com", "A", "+subnet=203.0.113.5/32"]);
    assert_eq!(
        section(&out, "ANSWER"),
        ["app.example.com. 30 IN A 192.0.2.20"],
        "{out}"
    );
    assert!(
        out.contains("CLIENT-SUBNET: 203.0.113.5/32/24"),
        "scope of the deciding prefix: {out}"
    );
    // IPv6 client subnet in "tel".
    assert_eq!(
        short(
            dns,
            &["app.example.com", "A", "+subnet=2001:db8:100:1::/56"]
        ),
        ["192.0.2.10"]
    );
    // A client in no table: the fallback (first available: east, every time).
    let t = tally(dns, "app.example.com", "A", "+subnet=192.0.2.55/24", 10);
    assert_eq!(t, BTreeMap::from([("192.0.2.10".to_string(), 10)]));
    // Without ECS the resolver's address decides: 127.0.0.1 is in no table.
    assert_eq!(short(dns, &["app.example.com", "A"]), ["192.0.2.10"]);
    // A subnet for which west is preferred, but west disabled by the operator: the fallback.
    let r = f
        .api(
            "PUT",
            "/api/v1/gslb/sites/west/state",
            Some(serde_json::json!({"state": "disabled"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        short(dns, &["app.example.com", "A", "+subnet=203.0.113.5/32"]),
        ["192.0.2.10"]
    );
    let names = f.get_json("/api/v1/gslb/names/app.example.com").await;
    assert_eq!(names["algorithm"], "topology");
    assert!(names["fallbacks"].as_u64().unwrap() >= 11, "{names}");
    let m = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        m.contains(
            "fulcrum_gslb_answers_total{name=\"app.example.com.\",site=\"west\",region=\"uni\"} 1"
        ),
        "{m}"
    );
    assert!(
        m.contains(
            "fulcrum_gslb_answers_total{name=\"app.example.com.\",site=\"east\",region=\"tel\"} 2"
        ),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_static_policy_shares_answers_as_configured() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let _f = start(&format!(
        "{}{}{}{}{}{}{}",
        dns_section(dir.path(), &[dns], ""),
        two_sites("weight = 3", "weight = 1"),
        gslb_name("rr.example.com.", "round_robin", ""),
        gslb_name("w.example.com.", "weighted", ""),
        gslb_name("first.example.com.", "first_available", ""),
        gslb_name("hash.example.com.", "hash", ""),
        gslb_name("two.example.com.", "round_robin", "answers = 2"),
    ))
    .await;
    let rr = tally(dns, "rr.example.com", "A", "", 40);
    assert_eq!(
        rr,
        BTreeMap::from([("192.0.2.10".into(), 20), ("192.0.2.20".into(), 20)])
    );
    let w = tally(dns, "w.example.com", "A", "", 40);
    assert_eq!(
        w,
        BTreeMap::from([("192.0.2.10".into(), 30), ("192.0.2.20".into(), 10)])
    );
    let first = tally(dns, "first.example.com", "A", "", 10);
    assert_eq!(first, BTreeMap::from([("192.0.2.10".into(), 10)]));
    // Hash: one client always gets the same site; many clients spread over both.
    let mut seen = BTreeMap::new();
    for i in 0..40 {
        let subnet = format!("+subnet=10.{i}.0.0/16");
        let t = tally(dns, "hash.example.com", "A", &subnet, 3);
        assert_eq!(t.len(), 1, "stable per client: {t:?}");
        *seen.entry(t.into_keys().next().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.values().all(|v| *v >= 5), "{seen:?}");
    // answers = 2: both sites in one answer.
    let mut two = short(dns, &["two.example.com", "A"]);
    two.sort();
    assert_eq!(two, ["192.0.2.10", "192.0.2.20"]);
}

/// A TCP server on `addr` that answers "OK\n" after `delay` (a site's health endpoint).
async fn slow_ok(addr: SocketAddr, delay: Duration) -> tokio::task::JoinHandle<()> {
    let l = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = s.write_all(b"OK\n").await;
                let mut b = [0u8; 64];
                let _ = s.read(&mut b).await;
            });
        }
    })
}

/// A port free on both 127.0.0.11 and 127.0.0.12.
fn port_on_both() -> u16 {
    loop {
        let a = fulcrum_testkit::free_addr_on([127, 0, 0, 11]);
        if std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 12], a.port()))).is_ok() {
            return a.port();
        }
    }
}

fn loopback_sites(port: u16, monitor_extra: &str, east: &str, west: &str) -> String {
    format!(
        r#"
[[monitor]]
name = "site"
type = "send_expect"
expect = "OK"
port = {port}
interval = "200ms"
timeout = "150ms"
rise = 1
fall = 2
{monitor_extra}

[[gslb.site]]
name = "east"
addresses = ["127.0.0.11"]
monitor = "site"
{east}

[[gslb.site]]
name = "west"
addresses = ["127.0.0.12"]
monitor = "site"
{west}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_transitions_move_answers_within_the_check_period() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let port = port_on_both();
    let east = slow_ok(SocketAddr::from(([127, 0, 0, 11], port)), Duration::ZERO).await;
    let _west = slow_ok(SocketAddr::from(([127, 0, 0, 12], port)), Duration::ZERO).await;
    let f = start(&format!(
        "{}{}{}",
        dns_section(dir.path(), &[dns], ""),
        loopback_sites(port, "", "", ""),
        gslb_name("app.example.com.", "first_available", "")
    ))
    .await;
    assert_eq!(short(dns, &["app.example.com", "A"]), ["127.0.0.11"]);
    east.abort();
    // fall = 2 checks every 200 ms (±10%): down within about half a second; the bound leaves
    // room for a loaded machine.
    let started = std::time::Instant::now();
    assert!(
        wait_until(Duration::from_secs(5), || async {
            short(dns, &["app.example.com", "A"]) == ["127.0.0.12"]
        })
        .await,
        "answers did not move off the failed site"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    let sites = f.get_json("/api/v1/gslb/sites").await;
    assert_eq!(sites["sites"][0]["health"], "down", "{sites}");
    assert_eq!(
        sites["sites"][0]["addresses"][0]["health"], "down",
        "{sites}"
    );
    // Back up: answers return (rise = 1).
    let _east = slow_ok(SocketAddr::from(([127, 0, 0, 11], port)), Duration::ZERO).await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            short(dns, &["app.example.com", "A"]) == ["127.0.0.11"]
        })
        .await,
        "answers did not come back"
    );
    let m = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(m.contains("fulcrum_gslb_site_up{site=\"east\"} 1"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_site_down_answers_all_rather_than_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let port = port_on_both();
    let f = start(&format!(
        "{}{}{}",
        dns_section(dir.path(), &[dns], ""),
        loopback_sites(port, "", "", ""),
        gslb_name("app.example.com.", "round_robin", "")
    ))
    .await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            f.get_json("/api/v1/gslb/sites").await["sites"]
                .as_array()
                .is_some_and(|s| s.iter().all(|x| x["health"] == "down"))
        })
        .await
    );
    let t = tally(dns, "app.example.com", "A", "", 10);
    assert_eq!(
        t,
        BTreeMap::from([("127.0.0.11".into(), 5), ("127.0.0.12".into(), 5)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastest_response_favours_the_quicker_site_but_not_exclusively() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let port = port_on_both();
    let _east = slow_ok(
        SocketAddr::from(([127, 0, 0, 11], port)),
        Duration::from_millis(2),
    )
    .await;
    let _west = slow_ok(
        SocketAddr::from(([127, 0, 0, 12], port)),
        Duration::from_millis(60),
    )
    .await;
    let f = start(&format!(
        "{}{}{}",
        dns_section(dir.path(), &[dns], ""),
        loopback_sites(port, "", "", ""),
        gslb_name("app.example.com.", "fastest_response", "")
    ))
    .await;
    // Once both sites have been measured, east (~2 ms) gets most but not all answers.
    assert!(
        wait_until(Duration::from_secs(10), || async {
            let n = f.get_json("/api/v1/gslb/names/app.example.com").await;
            n["shares"]["*"]["east"].as_f64().unwrap_or(0.0) > 0.8
        })
        .await,
        "{}",
        f.get_json("/api/v1/gslb").await
    );
    let t = tally(dns, "app.example.com", "A", "", 60);
    let east = *t.get("127.0.0.11").unwrap_or(&0);
    let west = *t.get("127.0.0.12").unwrap_or(&0);
    assert!(east > 45 && west >= 1, "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_load_uses_the_sites_own_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let servers = id_servers(1).await;
    let vs = free_addr();
    // This instance runs at east; its tcp service's member takes at most 4 connections.
    let f = start(&format!(
        "{}{}{}[gslb]\nlocal_site = \"east\"\n\n[[virtual_service]]\nname = \"app\"\nlisten = \"{vs}\"\nprotocol = \"tcp\"\npool = \"p\"\n[[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"{}\"\nmax_connections = 4\n",
        dns_section(dir.path(), &[dns], ""),
        two_sites("", ""),
        gslb_name("app.example.com.", "least_load", ""),
        servers[0].addr
    ))
    .await;
    let even = tally(dns, "app.example.com", "A", "", 20);
    assert_eq!(
        even.values().copied().collect::<Vec<_>>(),
        [10, 10],
        "{even:?}"
    );
    // Three of four connections in use: 25% capacity left at east.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from(vs, None).await.unwrap();
        let mut b = [0u8; 3];
        s.read_exact(&mut b).await.unwrap();
        held.push(s);
    }
    assert!(
        wait_until(Duration::from_secs(5), || async {
            let n = f.get_json("/api/v1/gslb/names/app.example.com").await;
            (n["shares"]["*"]["east"].as_f64().unwrap_or(1.0) - 0.2).abs() < 0.01
        })
        .await,
        "{}",
        f.get_json("/api/v1/gslb/table").await
    );
    let t = tally(dns, "app.example.com", "A", "", 50);
    assert_eq!(t.get("192.0.2.10"), Some(&10), "{t:?}");
    assert_eq!(t.get("192.0.2.20"), Some(&40), "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_packets_are_answered_formerr_or_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let f = start(&dns_section(dir.path(), &[dns], "")).await;
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.connect(dns).await.unwrap();
    let mut buf = [0u8; 512];
    // Too short to be a query: dropped.
    sock.send(&[1, 2, 3]).await.unwrap();
    // A header claiming one question and no question: FORMERR echoing the id.
    sock.send(&[0xAB, 0xCD, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf[..2], &[0xAB, 0xCD]);
    assert_eq!(buf[3] & 0x0F, 1, "FORMERR");
    assert!(buf[2] & 0x80 != 0 && n == 12);
    // A status opcode: NOTIMP.
    let mut q = vec![0x12, 0x34, 0x10, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    q.extend_from_slice(b"\x07example\x03com\x00\x00\x01\x00\x01");
    sock.send(&q).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(buf[3] & 0x0F, 4, "NOTIMP");
    assert_eq!(n, q.len());
    // Random garbage keeps the server answering.
    let mut rng = 0x1234_5678u32;
    for _ in 0..2000 {
        let len = (rng % 80) as usize;
        let mut p = vec![0u8; len];
        for b in &mut p {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            *b = rng as u8;
        }
        sock.send(&p).await.unwrap();
    }
    assert_eq!(short(dns, &["mx1.example.com", "A"]), ["192.0.2.25"]);
    let m = f.api("GET", "/metrics", None).await.unwrap().text();
    let value = |name: &str| {
        m.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(value("fulcrum_dns_dropped_total") >= 1.0, "{m}");
    assert!(
        value("fulcrum_dns_responses_total{rcode=\"FORMERR\"}") >= 1.0,
        "{m}"
    );
    assert!(
        value("fulcrum_dns_responses_total{rcode=\"NOTIMP\"}") >= 1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_rate_limiting_drops_and_slips_past_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let f = start(&dns_section(
        dir.path(),
        &[dns],
        "rate_limit = { responses_per_second = 10, slip = 2 }",
    ))
    .await;
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.connect(dns).await.unwrap();
    let mut q = vec![0x00, 0x00, 0x00, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    q.extend_from_slice(b"\x03mx1\x07example\x03com\x00\x00\x01\x00\x01");
    for i in 0..60u16 {
        q[..2].copy_from_slice(&i.to_be_bytes());
        sock.send(&q).await.unwrap();
    }
    let mut full = 0;
    let mut tc = 0;
    let mut buf = [0u8; 512];
    while let Ok(Ok(_)) =
        tokio::time::timeout(Duration::from_millis(300), sock.recv(&mut buf)).await
    {
        if buf[2] & 0x02 != 0 {
            tc += 1;
        } else {
            full += 1;
        }
    }
    // The 60 queries may straddle a second boundary: at most two seconds' worth get through.
    assert!((10..=20).contains(&full), "full answers {full}");
    assert!(tc >= 15, "truncated (slipped) answers {tc}");
    let m = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        m.contains("fulcrum_dns_rate_limited_total{action=\"drop\"}"),
        "{m}"
    );
    // TCP is never limited.
    assert_eq!(
        short(dns, &["mx1.example.com", "A", "+tcp"]),
        ["192.0.2.25"]
    );
}

#[test]
fn zone_errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let zone = dir.path().join("bad.zone");
    std::fs::write(
        &zone,
        "$TTL 60\n@ IN SOA ns hm 1 2 3 4 5\nwww IN A 192.0.2.1\nbad IN A 999.0.0.1\n",
    )
    .unwrap();
    let (ok, text) = check(&format!(
        "[dns]\nlisten = \"127.0.0.1:5353\"\n[[dns.zone]]\norigin = \"example.com.\"\nfile = \"{}\"\nrecords = [\"ok IN A 192.0.2.2\", \"broken IN MX ten mail\"]\n",
        zone.display()
    ));
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!("{}:4:1: dns.zone[0].file:", zone.display())),
        "{text}"
    );
    assert!(text.contains("dns.zone[0].records[1]: MX record"), "{text}");
    assert!(text.contains("bad.toml:6:"), "{text}");
    // Prefix files name their line too.
    let list = dir.path().join("isp.txt");
    std::fs::write(&list, "# telecom\n1.0.1.0/24\n1.0.2.0/33\n").unwrap();
    let (ok, text) = check(&format!(
        "[[ip_table]]\nname = \"tel\"\nfile = \"{}\"\n[[gslb.site]]\nname = \"a\"\naddresses = [\"192.0.2.1\"]\nregions = [\"tel\"]\n",
        list.display()
    ));
    assert!(!ok);
    assert!(
        text.contains("ip_table[0].file") && text.contains("isp.txt:3:"),
        "{text}"
    );
    // Unknown tables are reported at the reference.
    let (ok, text) = check(
        "[[ip_table]]\nname = \"tel\"\ncidrs = [\"192.0.2.0/24\"]\n[[gslb.site]]\nname = \"a\"\naddresses = [\"192.0.2.1\"]\nregions = [\"tele\"]\n",
    );
    assert!(!ok);
    assert!(
        text.contains(
            "gslb.site[0].regions[0]: no ip_table named \"tele\" (did you mean \"tel\"?)"
        ),
        "{text}"
    );
}

#[test]
fn example_gslb_config_passes_check() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/gslb.toml");
    let out = Command::new(BIN)
        .args(["check", "-c", path])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_the_dns_sockets_and_applies_new_records() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let cfg = dns_section(dir.path(), &[dns], "");
    let f = start(&cfg).await;
    assert!(short(dns, &["added.example.com", "A"]).is_empty());
    // Queries keep being answered while the reload happens.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let asker = tokio::task::spawn_blocking(move || {
        let mut failures = 0;
        let mut n = 0;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) && n < 500 {
            if short(dns, &["mx1.example.com", "A"]) != ["192.0.2.25"] {
                failures += 1;
            }
            n += 1;
        }
        (n, failures)
    });
    f.write_config(&cfg.replace("records = [", "records = [\"added 60 IN A 192.0.2.77\", "));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(short(dns, &["added.example.com", "A"]), ["192.0.2.77"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (n, failures) = asker.await.unwrap();
    assert!(n > 0);
    assert_eq!(failures, 0, "queries failed around the reload");
    // A reload with a broken zone is refused and the old zone keeps answering.
    f.write_config(&cfg.replace("records = [", "records = [\"x IN A nope\", "));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("dns.zone[0].records[0]"), "{}", r.text());
    assert_eq!(short(dns, &["mx1.example.com", "A"]), ["192.0.2.25"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn geoip_regions_from_a_maxmind_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("country.mmdb");
    std::fs::write(
        &db,
        fulcrum_testkit::mmdb::build(&[
            fulcrum_testkit::mmdb::entry("198.18.0.0/16", "CN", "AS"),
            fulcrum_testkit::mmdb::entry("198.19.0.0/16", "DE", "EU"),
            fulcrum_testkit::mmdb::entry("2001:db8:cafe::/48", "CN", "AS"),
        ]),
    )
    .unwrap();
    let dns = free_addr();
    let _f = start(&format!(
        r#"{}
[[ip_table]]
name = "china"
geoip = "{}"
countries = ["CN"]

[[ip_table]]
name = "europe"
geoip = "{}"
continents = ["EU"]

[[gslb.site]]
name = "east"
addresses = ["192.0.2.10"]
regions = ["china"]

[[gslb.site]]
name = "west"
addresses = ["192.0.2.20"]
regions = ["europe"]
{}"#,
        dns_section(dir.path(), &[dns], ""),
        db.display(),
        db.display(),
        gslb_name(
            "app.example.com.",
            "topology",
            "fallback = \"first_available\""
        )
    ))
    .await;
    assert_eq!(
        short(dns, &["app.example.com", "A", "+subnet=198.19.4.0/24"]),
        ["192.0.2.20"]
    );
    assert_eq!(
        short(dns, &["app.example.com", "A", "+subnet=198.18.4.0/24"]),
        ["192.0.2.10"]
    );
    assert_eq!(
        short(dns, &["app.example.com", "A", "+subnet=2001:db8:cafe::/56"]),
        ["192.0.2.10"]
    );
    let out = dig(dns, &["app.example.com", "A", "+subnet=198.19.4.0/24"]);
    assert!(
        out.contains("CLIENT-SUBNET: 198.19.4.0/24/16"),
        "scope: the database's network: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_address_of_an_up_site_is_not_answered() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let port = loop {
        let p = port_on_both();
        if std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 13], p))).is_ok() {
            break p;
        }
    };
    let _e = slow_ok(SocketAddr::from(([127, 0, 0, 11], port)), Duration::ZERO).await;
    let _w = slow_ok(SocketAddr::from(([127, 0, 0, 12], port)), Duration::ZERO).await;
    // 127.0.0.13 (east's second address) has nothing listening.
    let f = start(&format!(
        "{}{}{}",
        dns_section(dir.path(), &[dns], ""),
        loopback_sites(port, "", "", "").replace(
            "addresses = [\"127.0.0.11\"]",
            "addresses = [\"127.0.0.11\", \"127.0.0.13\"]"
        ),
        gslb_name("app.example.com.", "first_available", "answers = 3")
    ))
    .await;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            f.get_json("/api/v1/gslb/sites/east").await["addresses"][1]["health"] == "down"
        })
        .await
    );
    for _ in 0..5 {
        let mut a = short(dns, &["app.example.com", "A"]);
        a.sort();
        assert_eq!(
            a,
            ["127.0.0.11", "127.0.0.12"],
            "east's up address, then west"
        );
    }
}

/// Sends one HTTP/1.1 request and returns the response head.
async fn http_head(vs: SocketAddr, target: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(vs).await.unwrap();
    s.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("answer within 5 s")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    text.split("\r\n\r\n").next().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_services_redirect_to_the_best_other_site_when_they_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let backend = fulcrum_testkit::HttpBackend::start("127.0.0.1:0".parse().unwrap(), "m1")
        .await
        .unwrap();
    let (empty, busy) = (free_addr(), free_addr());
    // This instance is east. "empty" has no member to offer; "busy" has one, but a threshold
    // of 0 active connections, so every client is one too many.
    let f = start(&format!(
        "{}{}{}[gslb]\nlocal_site = \"east\"\n\n\
         [[virtual_service]]\nname = \"empty\"\nlisten = \"{empty}\"\nprotocol = \"http\"\npool = \"down\"\ngslb_redirect = \"app.example.com.\"\n\
         [[virtual_service]]\nname = \"busy\"\nlisten = \"{busy}\"\nprotocol = \"http\"\npool = \"up\"\ngslb_redirect = \"app.example.com.\"\ngslb_redirect_threshold = 0\n\
         [[pool]]\nname = \"down\"\n[[pool.member]]\naddress = \"{}\"\nstate = \"disabled\"\n\
         [[pool]]\nname = \"up\"\n[[pool.member]]\naddress = \"{}\"\n",
        dns_section(dir.path(), &[dns], ""),
        two_sites("", ""),
        gslb_name("app.example.com.", "first_available", ""),
        backend.addr,
        backend.addr,
    ))
    .await;
    let head = http_head(empty, "/cart/view?item=7").await;
    assert!(head.starts_with("HTTP/1.1 302"), "{head}");
    assert!(
        head.contains(&format!(
            "\r\nlocation: http://192.0.2.20:{}/cart/view?item=7",
            empty.port()
        )) || head.contains(&format!(
            "\r\nLocation: http://192.0.2.20:{}/cart/view?item=7",
            empty.port()
        )),
        "{head}"
    );
    let head = http_head(busy, "/").await;
    assert!(head.starts_with("HTTP/1.1 302"), "{head}");
    assert!(head.contains("192.0.2.20"), "{head}");
    // With the other site down too, there is nowhere to send the client: 503 as without GSLB.
    let r = f
        .api(
            "PUT",
            "/api/v1/gslb/sites/west/state",
            Some(serde_json::json!({"state": "disabled"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let head = http_head(empty, "/").await;
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
}

/// With `redirect_host` on the other site, the redirect keeps a name (so the certificate and the
/// virtual host still match there), with the path, the query and the client's port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_redirect_to_another_site_uses_its_redirect_host() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let backend = fulcrum_testkit::HttpBackend::start("127.0.0.1:0".parse().unwrap(), "m1")
        .await
        .unwrap();
    let named = free_addr();
    let f = start(&format!(
        "{}{}{}[gslb]\nlocal_site = \"east\"\n\n\
         [[virtual_service]]\nname = \"named\"\nlisten = \"{named}\"\nprotocol = \"http\"\npool = \"down\"\ngslb_redirect = \"app.example.com.\"\n\
         [[pool]]\nname = \"down\"\n[[pool.member]]\naddress = \"{}\"\nstate = \"disabled\"\n",
        dns_section(dir.path(), &[dns], ""),
        two_sites("", "redirect_host = \"west.app.example.com\""),
        gslb_name("app.example.com.", "first_available", ""),
        backend.addr,
    ))
    .await;
    let head = http_head(named, "/cart/view?item=7&x=%2F")
        .await
        .to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 302"), "{head}");
    assert!(
        head.contains(&format!(
            "\r\nlocation: http://west.app.example.com:{}/cart/view?item=7&x=%2f",
            named.port()
        )),
        "{head}"
    );
    assert!(!head.contains("192.0.2.20"), "{head}");

    // A port in `redirect_host` replaces the client's; a reload applies the key.
    f.write_config(&format!(
        "{}{}{}[gslb]\nlocal_site = \"east\"\n\n\
         [[virtual_service]]\nname = \"named\"\nlisten = \"{named}\"\nprotocol = \"http\"\npool = \"down\"\ngslb_redirect = \"app.example.com.\"\n\
         [[pool]]\nname = \"down\"\n[[pool.member]]\naddress = \"{}\"\nstate = \"disabled\"\n",
        dns_section(dir.path(), &[dns], ""),
        two_sites("", "redirect_host = \"west.app.example.com:8443\""),
        gslb_name("app.example.com.", "first_available", ""),
        backend.addr,
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let head = http_head(named, "/a").await.to_ascii_lowercase();
    assert!(
        head.contains("\r\nlocation: http://west.app.example.com:8443/a"),
        "{head}"
    );

    // Anything but a host name (and port) is refused with the key's place.
    let (ok, out) = check(&format!(
        "{}{}",
        two_sites("", "redirect_host = \"http://west/x\""),
        gslb_name("app.example.com.", "first_available", ""),
    ));
    assert!(!ok, "{out}");
    assert!(out.contains("gslb.site[1].redirect_host"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_cannot_take_every_tcp_slot() {
    let dir = tempfile::tempdir().unwrap();
    let dns = free_addr();
    let f = start(&dns_section(dir.path(), &[dns], "")).await;
    // 20 idle connections from one source: 16 are kept, the rest closed at once.
    let mut conns = Vec::new();
    for _ in 0..20 {
        conns.push(connect_from(dns, Some([127, 0, 0, 5])).await);
    }
    // Read all at once (one second), well within the DNS-over-TCP idle timeout.
    let mut waits = Vec::new();
    for c in conns {
        waits.push(tokio::spawn(async move {
            let Ok(mut c) = c else { return (true, None) };
            let mut b = [0u8; 1];
            match tokio::time::timeout(Duration::from_secs(1), c.read(&mut b)).await {
                Ok(Ok(0)) | Ok(Err(_)) => (true, None),
                _ => (false, Some(c)),
            }
        }));
    }
    let mut closed = 0;
    let mut conns = Vec::new();
    for w in waits {
        let (was_closed, c) = w.await.unwrap();
        closed += usize::from(was_closed);
        conns.extend(c);
    }
    assert_eq!(closed, 4);
    // Another client is still answered over TCP.
    let out = dig(dns, &["www.example.com", "A", "+tcp"]);
    assert!(
        out.contains(";; Got answer") && out.contains("(TCP)"),
        "{out}"
    );
    let m = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(m.contains("fulcrum_dns_tcp_refused_total 4\n"), "{m}");
    drop(conns);
}

//! Rules on tcp, udp and message services (issue 23), end to end through the binary: the pool
//! of a new connection (udp: a new flow) chosen by the client's source prefix, the port it
//! connected to, or the local time of day; first match wins, no match goes to the service's
//! pool; `drop` rules; hits in the API and in /metrics; a reload changes the rules for new
//! connections and keeps the open ones; `fulcrum check` refuses HTTP conditions on an L4 rule.
//! Clients use sources on 127.0.0.0/8 (127.0.0.2 and 127.0.0.3 on loopback).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use fulcrum_testkit::message::id;
use fulcrum_testkit::{MessageClient, MessageSwitch, SwitchOptions, UdpEchoServer, WireFraming};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UdpSocket;

const IN: [u8; 4] = [127, 0, 0, 2];
const OUT: [u8; 4] = [127, 0, 0, 3];

/// Pools `a` (member m0) and `dflt` (member m1), and `b` (member m2) when three servers are given.
fn pools(servers: &[TcpIdServer]) -> String {
    ["a", "dflt", "b"]
        .iter()
        .zip(servers)
        .map(|(name, s)| {
            format!(
                "[[pool]]\nname = \"{name}\"\nmonitors = []\n[[pool.member]]\naddress = \"{}\"\n",
                s.addr
            )
        })
        .collect()
}

fn tcp_service(listen: &[SocketAddr], rules: &str) -> String {
    let listen: Vec<String> = listen.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        "[[virtual_service]]\nname = \"svc\"\nlisten = [{}]\nprotocol = \"tcp\"\npool = \"dflt\"\n{rules}\n",
        listen.join(", ")
    )
}

/// A connection from `source` that is refused: reset or closed before any byte comes back.
async fn refused_from(vs: SocketAddr, source: [u8; 4]) -> bool {
    let Ok(mut s) = connect_from(vs, Some(source)).await else {
        return true;
    };
    let _ = s.write_all(b"ping\n").await;
    let mut buf = [0u8; 16];
    match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => false,
        Err(_) => panic!("a connection from {source:?} was neither served nor closed"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_source_rule_chooses_the_pool_and_counts_hits() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let rules = "[[virtual_service.rule]]\nname = \"branch\"\nsource = [\"127.0.0.2/32\", \"10.0.0.0/8\"]\npool = \"a\"\n\
                 [[virtual_service.rule]]\nsource = \"127.0.0.4\"\ndrop = true\n";
    let f = start(&format!("{}{}", tcp_service(&[vs], rules), pools(&servers))).await;
    for _ in 0..5 {
        assert_eq!(exchange_from(vs, Some(IN)).await.unwrap(), "m0");
        assert_eq!(exchange_from(vs, Some(OUT)).await.unwrap(), "m1");
    }
    // A drop rule: reset, not served.
    assert!(refused_from(vs, [127, 0, 0, 4]).await);

    let status = f.get_json("/api/v1/status").await;
    let svc = &status["virtual_services"][0];
    assert_eq!(svc["rules"][0]["rule"], "branch", "{svc}");
    assert_eq!(svc["rules"][0]["action"], "pool:a");
    assert_eq!(svc["rules"][0]["hits"], 5);
    assert_eq!(svc["rules"][1]["rule"], "rule[1]");
    assert_eq!(svc["rules"][1]["action"], "drop");
    assert_eq!(svc["rules"][1]["hits"], 1);
    // Dropped connections are not counted as served ones.
    assert_eq!(svc["connections_total"], 10);
    let metrics = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        metrics
            .contains("fulcrum_vs_rule_hits_total{vs=\"svc\",rule=\"branch\",action=\"pool:a\"} 5"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_destination_port_rule_on_a_service_with_two_ports() {
    let servers = id_servers(2).await;
    let (plain, special) = (free_addr(), free_addr());
    let rules = format!(
        "[[virtual_service.rule]]\ndestination_port = [{}, \"1-2\"]\npool = \"a\"\n",
        special.port()
    );
    let _f = start(&format!(
        "{}{}",
        tcp_service(&[plain, special], &rules),
        pools(&servers)
    ))
    .await;
    for _ in 0..3 {
        assert_eq!(exchange_from(special, Some(OUT)).await.unwrap(), "m0");
        assert_eq!(exchange_from(plain, Some(OUT)).await.unwrap(), "m1");
    }
}

/// The local time now as minutes since midnight, as the child process sees it (same TZ).
fn minute_now() -> u32 {
    let out = std::process::Command::new("date")
        .arg("+%H:%M")
        .output()
        .expect("date");
    let text = String::from_utf8_lossy(&out.stdout);
    let (h, m) = text.trim().split_once(':').expect("HH:MM");
    h.parse::<u32>().unwrap() * 60 + m.parse::<u32>().unwrap()
}

fn hhmm(minute: u32) -> String {
    let m = minute % 1440;
    format!("{:02}:{:02}", m / 60, m % 60)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_time_rule_covering_now_wins_over_one_that_does_not() {
    let servers = id_servers(3).await;
    let vs = free_addr();
    let now = minute_now();
    // Two hours ahead for an hour: not now. An hour either side of now: now (crossing midnight
    // when the test runs near it, which the rules handle).
    let later = format!("{}-{}", hhmm(now + 120), hhmm(now + 180));
    let around = format!("{}-{}", hhmm(now + 1440 - 60), hhmm(now + 60));
    let rules = format!(
        "[[virtual_service.rule]]\nname = \"later\"\ntime = \"{later}\"\npool = \"b\"\n\
         [[virtual_service.rule]]\nname = \"now\"\ntime = [\"{later}\", \"{around}\"]\npool = \"a\"\n"
    );
    let f = start(&format!(
        "{}{}",
        tcp_service(&[vs], &rules),
        pools(&servers)
    ))
    .await;
    for _ in 0..3 {
        assert_eq!(exchange_from(vs, Some(OUT)).await.unwrap(), "m0");
    }
    let status = f.get_json("/api/v1/status").await;
    let rules = &status["virtual_services"][0]["rules"];
    assert_eq!(rules[0]["hits"], 0, "{rules}");
    assert_eq!(rules[1]["hits"], 3, "{rules}");
}

/// A reload that changes the rules: new connections follow the new rules, an open connection
/// stays with the member it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_reload_applies_new_rules_to_new_connections_only() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let rule = "[[virtual_service.rule]]\nsource = \"127.0.0.2\"\npool = \"a\"\n";
    let f = start(&format!("{}{}", tcp_service(&[vs], rule), pools(&servers))).await;

    let s = connect_from(vs, Some(IN)).await.unwrap();
    let mut open = BufReader::new(s);
    let mut name = String::new();
    open.read_line(&mut name).await.unwrap();
    assert_eq!(name.trim(), "m0");

    // The rule now sends 127.0.0.3 to a, and no longer 127.0.0.2.
    f.write_config(&format!(
        "{}{}",
        tcp_service(&[vs], &rule.replace("127.0.0.2", "127.0.0.3")),
        pools(&servers)
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(exchange_from(vs, Some(IN)).await.unwrap(), "m1");
    assert_eq!(exchange_from(vs, Some(OUT)).await.unwrap(), "m0");

    // The connection opened before the reload still talks to m0.
    let mut s = open.into_inner();
    s.write_all(b"ping\n").await.unwrap();
    let mut back = [0u8; 5];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
        .await
        .expect("the open connection answers")
        .unwrap();
    assert_eq!(&back, b"ping\n");
}

async fn udp_ask(source: &str, vs: SocketAddr, payload: &[u8]) -> Option<String> {
    let sock = UdpSocket::bind(format!("{source}:0")).await.unwrap();
    sock.send_to(payload, vs).await.ok()?;
    let mut buf = [0u8; 2048];
    let (n, _) = tokio::time::timeout(Duration::from_secs(2), sock.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_source_rule_chooses_the_pool_of_new_flows() {
    let (u0, u1) = (
        UdpEchoServer::start("127.0.0.1:0".parse().unwrap(), "u0")
            .await
            .unwrap(),
        UdpEchoServer::start("127.0.0.1:0".parse().unwrap(), "u1")
            .await
            .unwrap(),
    );
    let vs = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let f = start(&format!(
        "[[virtual_service]]\nname = \"dns\"\nlisten = \"{vs}\"\nprotocol = \"udp\"\npool = \"dflt\"\n\
         [[virtual_service.rule]]\nname = \"lab\"\nsource = \"127.0.0.2/32\"\npool = \"a\"\n\
         [[pool]]\nname = \"a\"\nmonitors = []\n[[pool.member]]\naddress = \"{}\"\n\
         [[pool]]\nname = \"dflt\"\nmonitors = []\n[[pool.member]]\naddress = \"{}\"\n",
        u0.addr, u1.addr
    ))
    .await;
    for i in 0..3 {
        let q = format!("q{i}");
        assert_eq!(
            udp_ask("127.0.0.2", vs, q.as_bytes()).await.as_deref(),
            Some(format!("u0:{q}").as_str())
        );
        assert_eq!(
            udp_ask("127.0.0.3", vs, q.as_bytes()).await.as_deref(),
            Some(format!("u1:{q}").as_str())
        );
    }
    // Each ask was a new flow (a new source port): three hits.
    let status = f.get_json("/api/v1/status").await;
    assert_eq!(status["virtual_services"][0]["rules"][0]["hits"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_source_rule_chooses_the_pool_of_a_client_connection() {
    let framing = WireFraming::two_byte();
    let s0 = MessageSwitch::start(free_addr(), "s0", framing.clone(), SwitchOptions::default())
        .await
        .unwrap();
    let s1 = MessageSwitch::start(free_addr(), "s1", framing.clone(), SwitchOptions::default())
        .await
        .unwrap();
    let vs = free_addr();
    let _f = start(&format!(
        "[[virtual_service]]\nname = \"msg\"\nlisten = \"{vs}\"\nprotocol = \"message\"\npool = \"dflt\"\n\
         framing = {{ length_bytes = 2 }}\nmessage_mode = \"async\"\nsequence = {{ offset = 0, length = 12 }}\n\
         [[virtual_service.rule]]\nsource = \"127.0.0.2\"\npool = \"a\"\n\
         [[pool]]\nname = \"a\"\nmonitors = []\n[[pool.member]]\naddress = \"{}\"\n\
         [[pool]]\nname = \"dflt\"\nmonitors = []\n[[pool.member]]\naddress = \"{}\"\n",
        s0.addr, s1.addr
    ))
    .await;
    for (source, want) in [([127, 0, 0, 2], "s0"), ([127, 0, 0, 3], "s1")] {
        let mut client =
            MessageClient::connect_from(vs, Some(std::net::IpAddr::from(source)), framing.clone())
                .await
                .unwrap();
        for n in 0..4 {
            client.send(&id(n), b"hello").await.unwrap();
            let answer = client
                .recv(Duration::from_secs(5))
                .await
                .unwrap()
                .expect("an answer");
            assert_eq!(answer.server, want, "from {source:?}");
        }
    }
}

/// `fulcrum check` refuses HTTP conditions on a tcp rule and bad time ranges, with file, line
/// and key.
#[test]
fn check_refuses_http_conditions_and_bad_ranges_on_l4_rules() {
    let config = "[[virtual_service]]\nname = \"svc\"\nlisten = \"127.0.0.1:7000\"\nprotocol = \"tcp\"\npool = \"p\"\n\
                  [[virtual_service.rule]]\npath_prefix = \"/api\"\npool = \"p\"\n\
                  [[virtual_service.rule]]\ntime = \"08:00-25:00\"\npool = \"q\"\n\
                  [[pool]]\nname = \"p\"\n";
    let (ok, out) = check(config);
    assert!(!ok, "{out}");
    assert!(
        out.contains("bad.toml:7:1: virtual_service[0].rule[0].path_prefix: `path_prefix` matches HTTP requests; rules of tcp services take the conditions `source`, `destination_port` and `time`"),
        "{out}"
    );
    assert!(
        out.contains(
            "bad.toml:10:1: virtual_service[0].rule[1].time: \"08:00-25:00\" is not a time range"
        ),
        "{out}"
    );
    assert!(
        out.contains("virtual_service[0].rule[1].pool: no pool named \"q\""),
        "{out}"
    );
}

/// Persistence comes before the rules (H3C order): a client remembered on a member keeps it
/// after a reload whose rules would send it to another pool, while a client without an entry
/// follows the new rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_persistence_is_consulted_before_the_rules() {
    let servers = id_servers(3).await;
    let vs = free_addr();
    let service = |rules: &str| {
        format!(
            "{}persistence = \"src\"\n{rules}[[persistence]]\nname = \"src\"\ntype = \"source_ip\"\ntimeout = \"10m\"\n{}",
            tcp_service(&[vs], ""),
            pools(&servers)
        )
    };
    let first = "[[virtual_service.rule]]\nsource = \"127.0.0.2\"\npool = \"a\"\n";
    let f = start(&service(first)).await;
    assert_eq!(exchange_from(vs, Some(IN)).await.unwrap(), "m0");

    // Now 127.0.0.2 and 127.0.0.3 should go to b, and a stays a pool of the service.
    let second =
        "[[virtual_service.rule]]\nsource = [\"127.0.0.2\", \"127.0.0.3\"]\npool = \"b\"\n\
                  [[virtual_service.rule]]\nsource = \"127.0.0.9\"\npool = \"a\"\n";
    f.write_config(&service(second));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    for _ in 0..3 {
        assert_eq!(exchange_from(vs, Some(IN)).await.unwrap(), "m0");
        assert_eq!(exchange_from(vs, Some(OUT)).await.unwrap(), "m2");
    }
    // The persisted client did not count for the rule it bypassed.
    let status = f.get_json("/api/v1/status").await;
    assert_eq!(status["virtual_services"][0]["rules"][0]["hits"], 3);
}

//! L4 TCP server load balancing, end to end through the binary.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn tcp_service(listen: std::net::SocketAddr, extra: &str) -> String {
    format!(
        "[[virtual_service]]\nname = \"svc\"\nlisten = [\"{listen}\"]\nprotocol = \"tcp\"\npool = \"p\"\n{extra}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_round_robin_gives_exact_3_2_1_shares() {
    let servers = id_servers(3).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"weighted_round_robin\"\n{}",
        tcp_service(vs, ""),
        members(&servers, &[3, 2, 1])
    ))
    .await;
    let counts = shares(vs, 600).await;
    assert_eq!(
        counts,
        BTreeMap::from([("m0".into(), 300), ("m1".into(), 200), ("m2".into(), 100)])
    );
    let status = f.get_json("/api/v1/status").await;
    assert_eq!(status["virtual_services"][0]["connections_total"], 600);
    assert_eq!(status["generation"], 1);
    let p = f.get_json("/api/v1/pools/p").await;
    assert_eq!(p["members"][0]["connections_total"], 300);
    assert_eq!(p["members"][0]["health"], "up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_listener_and_member() {
    let server = TcpIdServer::start("[::1]:0".parse().unwrap(), "v6")
        .await
        .unwrap();
    let vs: std::net::SocketAddr = format!("[::1]:{}", fulcrum_testkit::free_port())
        .parse()
        .unwrap();
    let _f = start(&format!(
        "{}[[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"{}\"\n",
        tcp_service(vs, ""),
        server.addr
    ))
    .await;
    assert_eq!(exchange(vs).await.unwrap(), "v6");
}

/// Clients keep connecting while one member is killed: none of them fails to reach a member
/// (connect failures are retried on the others, the dead member is marked down passively and by
/// its monitor). Connections the killed member was serving at that instant break, as with any
/// full proxy; they are counted apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_loses_no_client_when_a_member_is_killed() {
    let servers = id_servers(3).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\nmonitors = [\"t\"]\nretries = 2\nconnect_timeout = \"500ms\"\n{}\n\
         [[monitor]]\nname = \"t\"\ntype = \"tcp\"\ninterval = \"200ms\"\ntimeout = \"100ms\"\nfall = 2\nrise = 2\n",
        tcp_service(vs, ""),
        members(&servers, &[1, 1, 1])
    ))
    .await;
    let servers = Arc::new(servers);
    let failed = Arc::new(AtomicUsize::new(0));
    let cut = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (failed, cut, done, killed) =
            (failed.clone(), cut.clone(), done.clone(), killed.clone());
        clients.push(tokio::spawn(async move {
            for _ in 0..150 {
                let was_killed = killed.load(Ordering::SeqCst);
                match exchange(vs).await {
                    Ok(name) => {
                        assert!(
                            !(was_killed && name == "m1"),
                            "a client reached the killed member"
                        );
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    // Broken after the member's name arrived: served by the killed member.
                    Err(e) if !was_killed && (e.starts_with("echo") || e.starts_with("write")) => {
                        cut.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("client failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    assert!(
        wait_until(Duration::from_secs(10), || async {
            done.load(Ordering::Relaxed) >= 100
        })
        .await
    );
    servers[1].kill();
    killed.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "clients failed to reach a member"
    );
    assert!(
        cut.load(Ordering::Relaxed) <= 4,
        "at most the in-flight exchanges break"
    );
    let m1 = servers[1].addr.to_string();
    assert!(
        wait_until(Duration::from_secs(3), || async {
            f.member("p", &m1).await["health"] == "down"
        })
        .await,
        "the killed member is shown down"
    );
    let member = f.member("p", &m1).await;
    assert!(!member["transitions"].as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_member_is_retried_and_marked_down_passively_then_probed_back() {
    let servers = id_servers(2).await;
    let dead = free_addr();
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\nretries = 1\n{}\n[[pool.member]]\naddress = \"{dead}\"\n",
        tcp_service(vs, ""),
        members(&servers, &[1, 1])
    ))
    .await;
    for _ in 0..30 {
        let name = exchange(vs)
            .await
            .expect("every client is served by a live member");
        assert!(name == "m0" || name == "m1");
    }
    let m = f.member("p", &dead.to_string()).await;
    assert_eq!(m["health"], "down", "{m}");
    assert!(m["connect_failures"].as_u64().unwrap() >= 3);
    // Nothing monitors this pool: a back-off probe brings the member back once it listens.
    let revived = TcpIdServer::start(dead, "m2").await.unwrap();
    assert!(
        wait_until(Duration::from_secs(8), || async {
            f.member("p", &dead.to_string()).await["health"] == "up"
        })
        .await,
        "probe did not bring the member back"
    );
    let counts = shares(vs, 30).await;
    assert_eq!(counts.get("m2"), Some(&10));
    drop(revived);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_member_costs_at_most_the_connect_timeout() {
    // A listener whose accept queue is full and never accepted: further SYNs are dropped, so a
    // connect to it hangs like one to a dead host.
    let stalled_sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let stalled = free_addr();
    stalled_sock.bind(&stalled.into()).unwrap();
    stalled_sock.listen(0).unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&stalled.into());
        fillers.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let good = id_servers(1).await;
    let vs = free_addr();
    let _f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"first_available\"\nconnect_timeout = \"300ms\"\n\
         [[pool.member]]\naddress = \"{stalled}\"\n{}",
        tcp_service(vs, ""),
        members(&good, &[1])
    ))
    .await;
    let t = std::time::Instant::now();
    assert_eq!(exchange(vs).await.unwrap(), "m0");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_ip_persistence_keeps_each_client_on_its_member() {
    let servers = id_servers(3).await;
    let vs = free_addr();
    let _f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n{}\n[[persistence]]\nname = \"src\"\ntype = \"source_ip\"\n",
        tcp_service(vs, "persistence = \"src\""),
        members(&servers, &[1, 1, 1])
    ))
    .await;
    let mut per_member: BTreeMap<String, usize> = BTreeMap::new();
    for host in 2..=13u8 {
        let first = exchange_from(vs, Some([127, 0, 0, host])).await.unwrap();
        for _ in 0..5 {
            assert_eq!(
                exchange_from(vs, Some([127, 0, 0, host])).await.unwrap(),
                first,
                "client 127.0.0.{host} moved"
            );
        }
        *per_member.entry(first).or_default() += 1;
    }
    // New clients are still spread by the scheduler.
    assert_eq!(
        per_member.values().copied().collect::<Vec<_>>(),
        vec![4, 4, 4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_keeps_persistent_clients_and_disabled_moves_them() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n{}\n[[persistence]]\nname = \"src\"\ntype = \"source_ip\"\n",
        tcp_service(vs, "persistence = \"src\""),
        members(&servers, &[1, 1])
    ))
    .await;
    let sticky = [127, 0, 0, 2];
    let first = exchange_from(vs, Some(sticky)).await.unwrap();
    let (i, other) = if first == "m0" { (0, "m1") } else { (1, "m0") };
    let path = format!("/api/v1/pools/p/members/{}/state", servers[i].addr);
    let r = f
        .api("PUT", &path, Some(json!({"state": "drain"})))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["state"], "drain");
    for host in 3..10u8 {
        assert_eq!(
            exchange_from(vs, Some([127, 0, 0, host])).await.unwrap(),
            other,
            "a new client reached a draining member"
        );
    }
    for _ in 0..5 {
        assert_eq!(
            exchange_from(vs, Some(sticky)).await.unwrap(),
            first,
            "drain must honour persistence"
        );
    }
    let r = f
        .api("PUT", &path, Some(json!({"state": "disabled"})))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        exchange_from(vs, Some(sticky)).await.unwrap(),
        other,
        "disabled must not honour persistence"
    );
    // Bad requests are refused with a reason.
    let r = f
        .api("PUT", &path, Some(json!({"state": "sleeping"})))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("enabled, disabled, drain"));
    let r = f
        .api(
            "PUT",
            "/api/v1/pools/nope/members/127.0.0.1:1/state",
            Some(json!({"state": "drain"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_member_keeps_its_established_connections() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\n{}",
        tcp_service(vs, ""),
        members(&servers, &[1])
    ))
    .await;
    let mut s = connect_from(vs, None).await.unwrap();
    let mut name = [0u8; 3];
    s.read_exact(&mut name).await.unwrap();
    let path = format!("/api/v1/pools/p/members/{}/state", servers[0].addr);
    f.api("PUT", &path, Some(json!({"state": "disabled"})))
        .await
        .unwrap();
    // New clients find no member and are closed promptly...
    let mut n = connect_from(vs, None).await.unwrap();
    let mut buf = [0u8; 8];
    let got = tokio::time::timeout(Duration::from_secs(2), n.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, 0);
    // ...while the established connection runs to its end.
    s.write_all(b"still here\n").await.unwrap();
    let mut back = [0u8; 11];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still here\n");
    let status = f.get_json("/api/v1/status").await;
    assert_eq!(status["virtual_services"][0]["no_member"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weight_set_through_the_api_changes_shares() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"weighted_round_robin\"\n{}",
        tcp_service(vs, ""),
        members(&servers, &[1, 1])
    ))
    .await;
    let path = format!("/api/v1/pools/p/members/{}/weight", servers[0].addr);
    let r = f
        .api("PUT", &path, Some(json!({"weight": 3})))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let counts = shares(vs, 400).await;
    assert_eq!(counts["m0"], 300);
    assert_eq!(counts["m1"], 100);
    let r = f
        .api("PUT", &path, Some(json!({"weight": -1})))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_connection_limit_sends_clients_elsewhere() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let _f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"first_available\"\n\
         [[pool.member]]\naddress = \"{}\"\nmax_connections = 2\n[[pool.member]]\naddress = \"{}\"\n",
        tcp_service(vs, ""),
        servers[0].addr,
        servers[1].addr
    ))
    .await;
    let mut held = Vec::new();
    for expect in ["m0", "m0", "m1", "m1"] {
        let mut s = connect_from(vs, None).await.unwrap();
        let mut name = [0u8; 3];
        s.read_exact(&mut name).await.unwrap();
        assert_eq!(&name[..2], expect.as_bytes());
        held.push(s);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_start_holds_then_ramps_a_returning_member() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"weighted_round_robin\"\nslow_start = {{ recovery = \"1s\", warm = \"3s\" }}\n{}",
        tcp_service(vs, ""),
        members(&servers, &[1, 1])
    ))
    .await;
    let path = format!("/api/v1/pools/p/members/{}/state", servers[1].addr);
    f.api("PUT", &path, Some(json!({"state": "disabled"})))
        .await
        .unwrap();
    f.api("PUT", &path, Some(json!({"state": "enabled"})))
        .await
        .unwrap();
    let m1 = servers[1].addr.to_string();
    assert_eq!(f.member("p", &m1).await["slow_start"], "recovery");
    // Recovery: no traffic at all.
    let early = shares(vs, 40).await;
    assert_eq!(early.get("m1"), None, "{early:?}");
    assert!(
        wait_until(Duration::from_secs(3), || async {
            f.member("p", &m1).await["slow_start"] == "warm"
        })
        .await
    );
    // Warm-up: a growing share, below the full one.
    let mut warm_shares = Vec::new();
    while f.member("p", &m1).await["slow_start"] == "warm" && warm_shares.len() < 20 {
        let c = shares(vs, 40).await;
        warm_shares.push(c.get("m1").copied().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(warm_shares.len() >= 3, "{warm_shares:?}");
    let first_half: usize = warm_shares[..warm_shares.len() / 2].iter().sum();
    let second_half: usize = warm_shares[warm_shares.len() / 2..].iter().sum();
    assert!(
        first_half < second_half,
        "share did not grow: {warm_shares:?}"
    );
    assert!(
        warm_shares[0] < 20,
        "started at a full share: {warm_shares:?}"
    );
    assert!(
        wait_until(Duration::from_secs(4), || async {
            f.member("p", &m1).await["slow_start"] == "none"
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = shares(vs, 40).await;
    assert_eq!(after["m1"], 20, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_headers_reach_the_member() {
    for (version, prefix) in [
        ("v1", &b"PROXY TCP4 127.0.0.7 "[..]),
        ("v2", &b"\r\n\r\n\0\r\nQUIT\n"[..]),
    ] {
        let servers = id_servers(1).await;
        let vs = free_addr();
        let _f = start(&format!(
            "{}[[pool]]\nname = \"p\"\n{}",
            tcp_service(vs, &format!("proxy_protocol = \"{version}\"")),
            members(&servers, &[1])
        ))
        .await;
        assert_eq!(exchange_from(vs, Some([127, 0, 0, 7])).await.unwrap(), "m0");
        let headers = servers[0].proxy_headers();
        assert_eq!(headers.len(), 1);
        assert!(
            headers[0].starts_with(prefix),
            "{version}: {:?}",
            String::from_utf8_lossy(&headers[0])
        );
        if version == "v1" {
            let text = String::from_utf8_lossy(&headers[0]).to_string();
            assert!(text.ends_with(&format!(" {}\r\n", vs.port())), "{text}");
        } else {
            assert_eq!(&headers[0][16..20], &[127, 0, 0, 7]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let _f = start(&format!(
        "{}[[pool]]\nname = \"p\"\n{}",
        tcp_service(vs, "idle_timeout = \"300ms\""),
        members(&servers, &[1])
    ))
    .await;
    let mut s = connect_from(vs, None).await.unwrap();
    let mut buf = [0u8; 16];
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"m0\n");
    let t = std::time::Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(t.elapsed() >= Duration::from_millis(250));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_connection_limit() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\n{}",
        tcp_service(vs, "max_connections = 1"),
        members(&servers, &[1])
    ))
    .await;
    let mut first = connect_from(vs, None).await.unwrap();
    let mut name = [0u8; 3];
    first.read_exact(&mut name).await.unwrap();
    let mut second = connect_from(vs, None).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(2), second.read(&mut name))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "the second client should be closed");
    assert_eq!(
        f.get_json("/api/v1/status").await["virtual_services"][0]["over_limit"],
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_accepts_and_resets_is_taken_down_and_its_clients_served_elsewhere() {
    // Accepts every connection and resets it at once, without a byte of reply.
    let resetter = fulcrum_testkit::bind_tcp(free_addr()).await.unwrap();
    let bad = resetter.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = resetter.accept().await {
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            drop(s);
        }
    });
    let good = id_servers(1).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n[[pool.member]]\naddress = \"{bad}\"\n{}",
        tcp_service(vs, ""),
        members(&good, &[1])
    ))
    .await;
    let mut broken = 0;
    for _ in 0..12 {
        if exchange(vs).await.is_err() {
            broken += 1;
        }
    }
    // Whether the reset comes during the connect or right after it, no byte was exchanged, so
    // every client is handed to the good member: none of them sees the resets.
    assert_eq!(broken, 0, "{broken} clients broke");
    let m = f.member("p", &bad.to_string()).await;
    assert_eq!(m["health"], "down", "{m}");
    assert!(
        m["transitions"][0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("3 consecutive failed connections"),
        "{m}"
    );
    for _ in 0..6 {
        assert_eq!(exchange(vs).await.unwrap(), "m0");
    }
    task.abort();
}

/// A member for fastest_response: with `banner`, it sends "NAME\n" `delay` after accepting;
/// otherwise it answers each line it reads with "NAME\n" after `delay`.
async fn delayed_member(
    name: &'static str,
    delay: Duration,
    banner: bool,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (rd, mut wr) = s.into_split();
                let mut lines = tokio::io::BufReader::new(rd);
                if banner {
                    tokio::time::sleep(delay).await;
                    let _ = wr.write_all(format!("{name}\n").as_bytes()).await;
                }
                let mut line = String::new();
                while matches!(
                    tokio::io::AsyncBufReadExt::read_line(&mut lines, &mut line).await,
                    Ok(n) if n > 0
                ) {
                    line.clear();
                    if !banner {
                        tokio::time::sleep(delay).await;
                    }
                    if wr.write_all(format!("{name}\n").as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, task)
}

/// One request line through the service; the name of the member that answered.
async fn ask(vs: std::net::SocketAddr) -> String {
    let s = connect_from(vs, None).await.unwrap();
    let mut r = tokio::io::BufReader::new(s);
    r.get_mut().write_all(b"hello\n").await.unwrap();
    let mut name = String::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncBufReadExt::read_line(&mut r, &mut name),
    )
    .await
    .expect("an answer within 5 s")
    .unwrap();
    name.trim().to_string()
}

/// fastest_response on tcp measures the member's time to its first byte (after the client's
/// request, or of its banner), not only the connect time, which is the same for every member
/// on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastest_response_measures_the_time_to_the_members_first_byte() {
    let (fast, _f) = delayed_member("fast", Duration::ZERO, false).await;
    let (slow, _s) = delayed_member("slow", Duration::from_millis(120), false).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"fastest_response\"\nmonitors = []\n\
         [[pool.member]]\naddress = \"{fast}\"\n[[pool.member]]\naddress = \"{slow}\"\n",
        tcp_service(vs, ""),
    ))
    .await;
    // Both get measured (an unmeasured member counts as the mean).
    let mut seen = BTreeMap::new();
    for _ in 0..20 {
        *seen.entry(ask(vs).await).or_insert(0) += 1;
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    let slow_ms = f.member("p", &slow.to_string()).await["response_time_ms"]
        .as_f64()
        .unwrap();
    assert!(slow_ms >= 100.0, "slow member measured at {slow_ms} ms");
    let fast_ms = f.member("p", &fast.to_string()).await["response_time_ms"]
        .as_f64()
        .unwrap();
    assert!(fast_ms < 60.0, "fast member measured at {fast_ms} ms");
    // The weights follow (recomputed every 200 ms): the slow member keeps a trickle.
    assert!(
        wait_until(Duration::from_secs(3), || async {
            f.member("p", &slow.to_string()).await["effective_weight"]
                .as_f64()
                .unwrap_or(1.0)
                < 0.5
        })
        .await
    );
    let mut shares = BTreeMap::new();
    for _ in 0..30 {
        *shares.entry(ask(vs).await).or_insert(0) += 1;
    }
    assert!(shares.get("slow").copied().unwrap_or(0) <= 8, "{shares:?}");

    // A member that speaks first is measured to its banner.
    let (late, _l) = delayed_member("late", Duration::from_millis(150), true).await;
    f.write_config(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"fastest_response\"\nmonitors = []\n\
         [[pool.member]]\naddress = \"{late}\"\n",
        tcp_service(vs, ""),
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let s = connect_from(vs, None).await.unwrap();
    let mut r = tokio::io::BufReader::new(s);
    let mut banner = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut r, &mut banner)
        .await
        .unwrap();
    assert_eq!(banner, "late\n");
    let late_ms = f.member("p", &late.to_string()).await["response_time_ms"]
        .as_f64()
        .unwrap();
    assert!(late_ms >= 130.0, "banner member measured at {late_ms} ms");
}

/// A member that accepts and then never reads: its receive window closes while the client keeps
/// sending. With `zero_window_timeout`, each such connection is a passive failure, and after
/// `fall` (3) of them the member is down, with the reason in its transitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_reading_fails_passively_after_zero_window_timeout() {
    let listener = {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        // A small receive buffer (inherited by accepted sockets) closes the window sooner.
        s.set_recv_buffer_size(4096).unwrap();
        s.set_nonblocking(true).unwrap();
        s.bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        s.listen(16).unwrap();
        tokio::net::TcpListener::from_std(s.into()).unwrap()
    };
    let member = listener.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nmonitors = []\nzero_window_timeout = \"1s\"\n\
         [[pool.member]]\naddress = \"{member}\"\n",
        tcp_service(vs, ""),
    ))
    .await;
    let mut pushers = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from(vs, None).await.unwrap();
        pushers.push(tokio::spawn(async move {
            let chunk = vec![b'z'; 64 * 1024];
            // Bounded: 64 MiB or 20 s, whichever first; the writes block once buffers are full.
            let until = tokio::time::Instant::now() + Duration::from_secs(20);
            for _ in 0..1024 {
                match tokio::time::timeout_at(until, s.write_all(&chunk)).await {
                    Ok(Ok(())) => {}
                    _ => break,
                }
            }
        }));
    }
    let m = member.to_string();
    assert!(
        wait_until(Duration::from_secs(15), || async {
            f.member("p", &m).await["health"] == "down"
        })
        .await,
        "{}",
        f.member("p", &m).await
    );
    let transitions = f.member("p", &m).await["transitions"].to_string();
    assert!(transitions.contains("zero receive window"), "{transitions}");
    for p in pushers {
        p.abort();
    }
    holder.abort();

    let (ok, out) = check(&format!(
        "{}[[pool]]\nname = \"p\"\nzero_window_timeout = \"0s\"\n[[pool.member]]\naddress = \"{member}\"\n",
        tcp_service(vs, ""),
    ));
    assert!(!ok, "{out}");
    assert!(out.contains("pool[0].zero_window_timeout"), "{out}");
}

/// Opens `n` connections through `vs` and keeps them: the member each reached, in order.
async fn hold(vs: std::net::SocketAddr, n: usize) -> (Vec<tokio::net::TcpStream>, Vec<String>) {
    let mut held = Vec::new();
    let mut who = Vec::new();
    for _ in 0..n {
        let mut s = connect_from(vs, None).await.unwrap();
        let mut name = [0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut name))
            .await
            .expect("the member's name within 5s")
            .unwrap();
        who.push(String::from_utf8_lossy(&name[..2]).into_owned());
        held.push(s);
    }
    (held, who)
}

fn count(who: &[String], name: &str) -> usize {
    who.iter().filter(|w| *w == name).count()
}

/// Connection-counting schedulers through the binary, with connections held open: ten held
/// on m1 while m0 is disabled; once m0 is back, new connections go where the count (per weight)
/// is lowest, which a rotation would not do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_schedulers_send_new_connections_to_the_least_loaded_member() {
    for (algorithm, weights, expect_on_m0) in [
        // 10 on m1 (weight 1) = 10 per weight; m0 (weight 3) takes 30 before it reaches that.
        ("weighted_least_connections", [3, 1], 28),
        ("least_connections", [1, 1], 9),
        // Power of two choices between two members compares both every time.
        ("least_request", [1, 1], 9),
    ] {
        let servers = id_servers(2).await;
        let vs = free_addr();
        let f = start(&format!(
            "{}[[pool]]\nname = \"p\"\nalgorithm = \"{algorithm}\"\n{}",
            tcp_service(vs, ""),
            members(&servers, &weights)
        ))
        .await;
        let m0 = format!("/api/v1/pools/p/members/{}/state", servers[0].addr);
        let r = f
            .api("PUT", &m0, Some(json!({"state": "disabled"})))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let (_on_m1, who) = hold(vs, 10).await;
        assert_eq!(count(&who, "m1"), 10, "{algorithm}: {who:?}");
        let r = f
            .api("PUT", &m0, Some(json!({"state": "enabled"})))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let new = if weights[0] == 3 { 30 } else { 10 };
        let (_more, who) = hold(vs, new).await;
        assert!(
            count(&who, "m0") >= expect_on_m0,
            "{algorithm}: of {new} new connections, {} went to m0: {who:?}",
            count(&who, "m0")
        );
    }
}

/// Least request (power of two choices) among three members: a member carrying twenty held
/// connections loses every draw it is in while the other two carry fewer, so it takes none of
/// the next twenty (round robin would give it seven, a random pick about as many), and the two
/// others share them (each at least 5: a simulation of the draws puts the chance of fewer at
/// 2 in 100,000).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_request_never_gives_a_new_connection_to_the_busiest_of_three() {
    let servers = id_servers(3).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"least_request\"\n{}",
        tcp_service(vs, ""),
        members(&servers, &[1, 1, 1])
    ))
    .await;
    let state = |i: usize, state: &'static str| {
        let path = format!("/api/v1/pools/p/members/{}/state", servers[i].addr);
        let f = &f;
        async move {
            let r = f
                .api("PUT", &path, Some(json!({ "state": state })))
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        }
    };
    state(1, "disabled").await;
    state(2, "disabled").await;
    let (_on_m0, who) = hold(vs, 20).await;
    assert_eq!(count(&who, "m0"), 20, "{who:?}");
    state(1, "enabled").await;
    state(2, "enabled").await;
    let (_more, who) = hold(vs, 20).await;
    assert_eq!(
        count(&who, "m0"),
        0,
        "the busiest member was picked: {who:?}"
    );
    assert!(
        count(&who, "m1") >= 5 && count(&who, "m2") >= 5,
        "the two idle members did not share: {who:?}"
    );
}

/// Priority groups: only the highest-priority members serve while at least `min_active` of
/// them are up; below that, the next group joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_groups_bring_in_the_next_group_below_min_active() {
    let servers = id_servers(3).await;
    let vs = free_addr();
    let f = start(&format!(
        "{}[[pool]]\nname = \"p\"\nalgorithm = \"priority\"\nmin_active = 2\nmonitors = [\"tcp\"]\n\
         [[pool.member]]\naddress = \"{}\"\npriority = 10\n\
         [[pool.member]]\naddress = \"{}\"\npriority = 10\n\
         [[pool.member]]\naddress = \"{}\"\n\
         [[monitor]]\nname = \"tcp\"\ntype = \"tcp\"\ninterval = \"100ms\"\ntimeout = \"100ms\"\nfall = 1\nrise = 1\n",
        tcp_service(vs, ""),
        servers[0].addr,
        servers[1].addr,
        servers[2].addr
    ))
    .await;
    let (_held, who) = hold(vs, 20).await;
    assert_eq!(count(&who, "m2"), 0, "the lower group served: {who:?}");
    assert_eq!(count(&who, "m0"), 10, "{who:?}");
    // m0 fails: one member of the top group left, under min_active = 2: m2 joins.
    servers[0].kill();
    let down = wait_until(Duration::from_secs(5), || async {
        f.member("p", &servers[0].addr.to_string()).await["health"] == "down"
    })
    .await;
    assert!(down, "m0 was not taken down:\n{}", f.logs());
    let (_more, who) = hold(vs, 20).await;
    assert_eq!(count(&who, "m0"), 0, "{who:?}");
    assert!(
        count(&who, "m2") >= 5 && count(&who, "m1") >= 5,
        "the next group did not join: {who:?}"
    );
    // m0 comes back: the top group has min_active members again and the lower group leaves
    // (its held connections stay).
    let mut back = None;
    for _ in 0..50 {
        match fulcrum_testkit::TcpIdServer::start(servers[0].addr, "m0").await {
            Ok(s) => {
                back = Some(s);
                break;
            }
            // The killed listener's task may not have dropped its socket yet.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let _back = back.expect("m0's address could be bound again");
    let up = wait_until(Duration::from_secs(5), || async {
        f.member("p", &servers[0].addr.to_string()).await["health"] == "up"
    })
    .await;
    assert!(up, "m0 did not come back:\n{}", f.logs());
    let (_last, who) = hold(vs, 20).await;
    assert_eq!(count(&who, "m2"), 0, "the lower group stayed: {who:?}");
    assert_eq!(count(&who, "m0"), 10, "{who:?}");
}

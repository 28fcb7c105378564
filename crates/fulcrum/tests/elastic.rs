//! Elastic pools through the binary: a standby member takes no clients while the pool is quiet,
//! joins when held connections push utilisation over `join`, takes the next clients, and
//! leaves once the load is gone for `leave_after`; the hook gets both events as JSON, the API,
//! the metrics and an `elastic_joined` alert show them.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::io::AsyncBufReadExt;

/// Opens a connection through `vs` and keeps it open; returns it with the member's name.
async fn hold(vs: std::net::SocketAddr) -> (tokio::io::BufReader<tokio::net::TcpStream>, String) {
    let s = connect_from(vs, None).await.expect("connect");
    let mut r = tokio::io::BufReader::new(s);
    let mut name = String::new();
    tokio::time::timeout(Duration::from_secs(5), r.read_line(&mut name))
        .await
        .expect("member name in time")
        .expect("read");
    (r, name.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_member_joins_under_load_and_leaves_after_hysteresis() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let servers = id_servers(2).await;
    let syslog = std::net::UdpSocket::bind(free_addr()).unwrap();
    syslog
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let vs = free_addr();
    let f = start(&format!(
        r#"[[virtual_service]]
name = "app"
listen = ["{vs}"]
protocol = "tcp"
pool = "app"

[[pool]]
name = "app"
algorithm = "least_connections"
elastic = {{ on = "connections", join = 0.75, leave = 0.25, leave_after = "1s", hook = ["/bin/sh", "-c", "cat >> {events}"] }}
[[pool.member]]
address = "{}"
max_connections = 4
[[pool.member]]
address = "{}"
max_connections = 4
standby = true

[[alert]]
name = "scale"
on = ["elastic_joined"]
hold = "0s"
syslog = "{}"
"#,
        servers[0].addr,
        servers[1].addr,
        syslog.local_addr().unwrap(),
        events = events.display(),
    ))
    .await;
    let (a0, a1) = (servers[0].addr.to_string(), servers[1].addr.to_string());
    let standby = f.member("app", &a1).await;
    assert_eq!(standby["standby"], true, "{standby}");
    assert_eq!(standby["elastic"], "standby", "{standby}");
    // Quiet pool: every client goes to m0, the standby member gets none.
    let counts = shares(vs, 20).await;
    assert_eq!(counts.get("m0"), Some(&20), "{counts:?}");

    // Load: three held connections take three of m0's four slots (75 % ≥ `join`).
    let mut load = vec![hold(vs).await, hold(vs).await, hold(vs).await];
    assert!(
        load.iter().all(|(_, n)| n == "m0"),
        "standby member served early"
    );
    let joined = wait_until(Duration::from_secs(10), || async {
        f.member("app", &a1).await["elastic"] == "joined"
    })
    .await;
    let pool = f.get_json("/api/v1/pools/app").await;
    assert!(joined, "{pool}\n{}", f.logs());
    assert_eq!(pool["elastic"]["joins"], 1, "{pool}");
    assert_eq!(pool["elastic"]["joined"], 1, "{pool}");
    // The CLI shows it too.
    let out = std::process::Command::new(BIN)
        .args([
            "pools",
            "app",
            "--admin",
            &f.admin.to_string(),
            "--token-file",
        ])
        .arg(f.token_file())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("elastic connections: ")
            && text.contains("% (join 75%, leave 25%), 1 of 1 standby joined")
            && text.contains("enabled (standby, joined)"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The next client goes to the member that joined.
    load.push(hold(vs).await);
    assert_eq!(load[3].1, "m1");
    let ok = wait_until(Duration::from_secs(5), || async {
        let u = f.get_json("/api/v1/pools/app").await["elastic"]["utilisation"]
            .as_f64()
            .unwrap_or_default();
        (u - 0.5).abs() < 1e-9
    })
    .await;
    assert!(
        ok,
        "4 of 8 slots: {}",
        f.get_json("/api/v1/pools/app").await
    );
    // The alert fires (RFC 5424 over UDP).
    let alert = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 4096];
        let n = syslog
            .recv(&mut buf)
            .expect("an elastic_joined syslog message");
        String::from_utf8_lossy(&buf[..n]).to_string()
    })
    .await
    .unwrap();
    assert!(
        alert.contains("FulcrumElasticMemberJoined") && alert.contains(&a1),
        "{alert}"
    );

    // The load stops: the member leaves, but not before `leave_after` (1 s) below 25 %.
    drop(load);
    let stopped = Instant::now();
    let left = wait_until(Duration::from_secs(10), || async {
        f.member("app", &a1).await["elastic"] == "standby"
    })
    .await;
    let after = stopped.elapsed();
    assert!(
        left,
        "{}\n{}",
        f.get_json("/api/v1/pools/app").await,
        f.logs()
    );
    assert!(
        after >= Duration::from_millis(900),
        "left {after:?} after the load stopped: no hysteresis"
    );
    let counts = shares(vs, 10).await;
    assert_eq!(counts.get("m0"), Some(&10), "{counts:?}");

    // The hook got both events, one JSON object per line.
    let ok = wait_until(Duration::from_secs(5), || async {
        std::fs::read_to_string(&events).is_ok_and(|t| t.lines().count() == 2)
    })
    .await;
    let text = std::fs::read_to_string(&events).unwrap_or_default();
    assert!(ok, "hook output: {text:?}\n{}", f.logs());
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(lines[0]["action"], "join");
    assert_eq!(lines[0]["pool"], "app");
    assert_eq!(lines[0]["member"], a1);
    assert_eq!(lines[0]["on"], "connections");
    assert!(lines[0]["utilisation"].as_f64().unwrap() >= 0.75);
    assert_eq!(lines[1]["action"], "leave");
    assert_eq!(lines[1]["joined"], 0);

    let metrics = f
        .api("GET", "/metrics", None)
        .await
        .map(|r| String::from_utf8_lossy(&r.body).to_string())
        .unwrap_or_default();
    for line in [
        "fulcrum_pool_elastic_joins_total{pool=\"app\"} 1",
        "fulcrum_pool_elastic_leaves_total{pool=\"app\"} 1",
        "fulcrum_pool_elastic_hook_runs_total{pool=\"app\"} 2",
        "fulcrum_pool_elastic_hook_failures_total{pool=\"app\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    let _ = a0;
}

#[test]
fn elastic_config_errors_are_located() {
    let (ok, text) = check(
        r#"[[virtual_service]]
name = "app"
listen = ["127.0.0.1:1"]
protocol = "tcp"
pool = "app"

[[pool]]
name = "app"
elastic = { join = 0.5, leave = 0.6 }
[[pool.member]]
address = "127.0.0.1:2"
[[pool.member]]
address = "127.0.0.1:3"
max_connections = 5
standby = true

[[pool]]
name = "plain"
[[pool.member]]
address = "127.0.0.1:4"
standby = true
"#,
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains("pool[0].elastic.leave") && text.contains("below `join`"),
        "{text}"
    );
    assert!(
        text.contains("member 127.0.0.1:2 has none"),
        "max_connections missing: {text}"
    );
    assert!(text.contains("need the pool's `elastic` table"), "{text}");
}

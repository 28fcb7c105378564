//! Reload, graceful shutdown, the command line and the admin API's contract.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config(
    vs: std::net::SocketAddr,
    servers: &[TcpIdServer],
    weights: &[u32],
    extra_pool: &str,
) -> String {
    format!(
        "[[virtual_service]]\nname = \"svc\"\nlisten = [\"{vs}\"]\nprotocol = \"tcp\"\npool = \"p\"\n\n\
         [[pool]]\nname = \"p\"\nalgorithm = \"weighted_round_robin\"\n{extra_pool}\n{}",
        members(servers, weights)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_loses_no_connection() {
    let servers = id_servers(3).await;
    let vs = free_addr();
    let f = start(&config(vs, &servers[..2], &[1, 1], "")).await;
    // An established connection that must survive every reload.
    let mut long = connect_from(vs, None).await.unwrap();
    let mut name = [0u8; 3];
    long.read_exact(&mut name).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..3 {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        clients.push(tokio::spawn(async move {
            // Bounded: stops when told to, or after 3000 exchanges.
            for _ in 0..3000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match exchange(vs).await {
                    Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!("client failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    let before = servers[0].connections();
    for round in 0..6u32 {
        let weights = [1 + round % 3, 2, 1];
        let n = if round % 2 == 0 { 3 } else { 2 };
        f.write_config(&config(vs, &servers[..n], &weights[..n], "monitors = []"));
        let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["generation"], 2 + round as u64);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(ok.load(Ordering::Relaxed) > 100);
    // Counters survived: the member that stayed kept counting from where it was.
    let m0 = f.member("p", &servers[0].addr.to_string()).await;
    assert!(m0["connections_total"].as_u64().unwrap() >= servers[0].connections() - before);
    long.write_all(b"alive\n").await.unwrap();
    let mut back = [0u8; 6];
    long.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"alive\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_reload_is_refused_and_the_old_config_keeps_running() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let f = start(&config(vs, &servers, &[1, 1], "")).await;
    f.write_config(&config(
        vs,
        &servers,
        &[1, 1],
        "algoritm = \"x\"\nretries = \"two\"",
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 400);
    let errors = r.json()["errors"].as_array().unwrap().clone();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].as_str().unwrap().contains("algoritm"),
        "{errors:?}"
    );
    assert!(
        errors[0].as_str().unwrap().contains("fulcrum.toml:"),
        "errors name the file: {errors:?}"
    );
    assert_eq!(f.get_json("/api/v1/status").await["generation"], 1);
    exchange(vs).await.unwrap();

    // A listen address that cannot be bound is refused too, before anything changes.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap();
    let mut two = config(vs, &servers, &[1, 1], "");
    two.push_str(&format!(
        "\n[[virtual_service]]\nname = \"other\"\nlisten = [\"{busy_addr}\"]\nprotocol = \"tcp\"\npool = \"p\"\n"
    ));
    // Occupy it without SO_REUSEPORT so our bind fails.
    f.write_config(&two);
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains(&busy_addr.to_string()));
    assert_eq!(f.get_json("/api/v1/status").await["generation"], 1);
    exchange(vs).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_keeps_health_and_api_state() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let f = start(&config(vs, &servers, &[1, 1], "")).await;
    let m0 = servers[0].addr.to_string();
    let r = f
        .api(
            "PUT",
            &format!("/api/v1/pools/p/members/{m0}/state"),
            Some(json!({"state": "drain"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    exchange(vs).await.unwrap();
    // Same members, another service added: the drain set through the API stays.
    let extra = free_addr();
    let mut next = config(vs, &servers, &[1, 1], "");
    next.push_str(&format!(
        "\n[[virtual_service]]\nname = \"second\"\nlisten = [\"{extra}\"]\nprotocol = \"tcp\"\npool = \"p\"\n"
    ));
    f.write_config(&next);
    f.signal(libc::SIGHUP);
    assert!(
        wait_until(Duration::from_secs(5), || async {
            f.get_json("/api/v1/status").await["generation"] == 2
        })
        .await
    );
    assert_eq!(f.member("p", &m0).await["state"], "drain");
    assert_eq!(exchange(extra).await.unwrap(), "m1");
    assert_eq!(
        f.get_json("/api/v1/status").await["virtual_services"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// A server added to a running pool by a reload goes through the pool's slow start; the members
/// of the first config do not (a start or restart must not throttle or black-hole a pool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_added_by_reload_warms_up_but_members_at_start_do_not() {
    let servers = id_servers(3).await;
    let vs = free_addr();
    let slow = "slow_start = { recovery = \"3s\", warm = \"1s\" }\nmonitors = []";
    let f = start(&config(vs, &servers[..2], &[1, 1], slow)).await;
    // At start both members take clients at once, in turn.
    let first = shares(vs, 4).await;
    assert_eq!(first.get("m0"), Some(&2), "{first:?}");
    assert_eq!(first.get("m1"), Some(&2), "{first:?}");
    for s in &servers[..2] {
        assert_eq!(
            f.member("p", &s.addr.to_string()).await["slow_start"],
            "none"
        );
    }

    f.write_config(&config(vs, &servers, &[1, 1, 1], slow));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let added = servers[2].addr.to_string();
    assert_eq!(f.member("p", &added).await["slow_start"], "recovery");
    // In recovery the new member gets no client; the members that stayed are not reset.
    let during = shares(vs, 6).await;
    assert_eq!(during.get("m2"), None, "{during:?}");
    assert_eq!(servers[2].connections(), 0);
    for s in &servers[..2] {
        assert_eq!(
            f.member("p", &s.addr.to_string()).await["slow_start"],
            "none"
        );
    }
    // Then it warms up and takes its share.
    assert!(
        wait_until(Duration::from_secs(15), || async {
            let _ = exchange(vs).await;
            servers[2].connections() > 0
        })
        .await,
        "the added member never got traffic"
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            f.member("p", &added).await["slow_start"] == "none"
        })
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_listener_stops_accepting_but_its_connections_finish() {
    let servers = id_servers(1).await;
    let (a, b) = (free_addr(), free_addr());
    let two = format!(
        "{}\n[[virtual_service]]\nname = \"b\"\nlisten = [\"{b}\"]\nprotocol = \"tcp\"\npool = \"p\"\n",
        config(a, &servers, &[1], "")
    );
    let f = start(&two).await;
    let mut held = connect_from(b, None).await.unwrap();
    let mut name = [0u8; 3];
    held.read_exact(&mut name).await.unwrap();
    f.write_config(&config(a, &servers, &[1], ""));
    assert_eq!(
        f.api("POST", "/api/v1/reload", None).await.unwrap().status,
        200
    );
    assert!(
        connect_from(b, None).await.is_err(),
        "the removed address still accepts"
    );
    held.write_all(b"bye\n").await.unwrap();
    let mut back = [0u8; 4];
    held.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"bye\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_accepting_and_waits_for_connections() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let mut f = start(&format!(
        "[global]\nshutdown_timeout = \"10s\"\n{}",
        config(vs, &servers, &[1], "")
    ))
    .await;
    let mut held = connect_from(vs, None).await.unwrap();
    let mut name = [0u8; 3];
    held.read_exact(&mut name).await.unwrap();
    f.signal(libc::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(3), || async {
            connect_from(vs, None).await.is_err()
        })
        .await,
        "still accepting after SIGTERM"
    );
    assert!(
        f.wait_exit(Duration::from_millis(300)).await.is_none(),
        "exited with a connection open"
    );
    held.write_all(b"last\n").await.unwrap();
    let mut back = [0u8; 5];
    held.read_exact(&mut back).await.unwrap();
    drop(held);
    let status = f
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("did not exit after the last connection");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_token_and_metrics() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let f = Fulcrum::start_with_token(
        BIN,
        free_addr(),
        Some("s3cret-s3cret-s3cret"),
        &config(vs, &servers, &[1], ""),
    )
    .await
    .unwrap();
    exchange(vs).await.unwrap();
    let anon = fulcrum_testkit::http_get(f.admin, "/api/v1/status")
        .await
        .unwrap();
    assert_eq!(anon.status, 401);
    let wrong = fulcrum_testkit::http_request(
        f.admin,
        "GET",
        "/api/v1/pools",
        &[("Authorization", "Bearer nope")],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(wrong.status, 401);
    let ok = f.api("GET", "/api/v1/pools", None).await.unwrap();
    assert_eq!(ok.status, 200);
    let pools = ok.json();
    assert_eq!(pools["pools"][0]["name"], "p");
    assert_eq!(pools["pools"][0]["algorithm"], "weighted_round_robin");
    let m = &pools["pools"][0]["members"][0];
    for key in [
        "address",
        "weight",
        "priority",
        "state",
        "health",
        "active_connections",
        "connections_total",
        "requests_total",
    ] {
        assert!(!m[key].is_null(), "member field {key} missing: {m}");
    }
    let status = f.get_json("/api/v1/status").await;
    for key in ["version", "generation", "virtual_services"] {
        assert!(!status[key].is_null(), "{key} missing");
    }
    let vs0 = &status["virtual_services"][0];
    for key in [
        "name",
        "protocol",
        "listen",
        "connections_active",
        "connections_total",
        "requests_total",
    ] {
        assert!(!vs0[key].is_null(), "service field {key} missing: {vs0}");
    }
    assert_eq!(
        f.api("GET", "/api/v1/pools/nope", None)
            .await
            .unwrap()
            .status,
        404
    );
    let metrics = fulcrum_testkit::http_get(f.admin, "/metrics")
        .await
        .unwrap();
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    assert!(
        text.contains("fulcrum_vs_connections_total{vs=\"svc\",protocol=\"tcp\"} 1"),
        "{text}"
    );
    let member_line = format!(
        "fulcrum_member_connections_total{{pool=\"p\",member=\"{}\"}} 1",
        servers[0].addr
    );
    assert!(text.contains(&member_line), "{text}");
    assert!(text.contains("# TYPE fulcrum_member_up gauge"));
    let content_type = |r: &fulcrum_testkit::HttpResponse| {
        r.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        content_type(&metrics),
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert!(text.contains("# TYPE fulcrum_vs_connections_total counter"));
    assert!(!text.contains("# EOF"));

    // What Prometheus asks for: the same series in OpenMetrics.
    let open = fulcrum_testkit::http_request(
        f.admin,
        "GET",
        "/metrics",
        &[(
            "Accept",
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3",
        )],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(open.status, 200);
    assert_eq!(
        content_type(&open),
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let open_text = open.text();
    assert!(
        open_text.contains("# TYPE fulcrum_vs_connections counter"),
        "{open_text}"
    );
    assert!(open_text.contains(&member_line), "{open_text}");
    assert!(open_text.ends_with("# EOF\n"), "{open_text}");
}

#[test]
fn version_flag() {
    let out = std::process::Command::new(BIN)
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("fulcrum "));
}

#[test]
fn check_accepts_a_valid_file_and_every_example() {
    let (ok, text) = check(
        "[[virtual_service]]\nname = \"a\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"tcp\"\npool = \"p\"\n[[pool]]\nname = \"p\"\n",
    );
    assert!(ok, "{text}");
    assert!(text.contains("OK"));
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let out = std::process::Command::new(BIN)
                .args(["check", "-c"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn check_reports_every_class_of_error_with_file_line_column_and_key() {
    let base = "[[virtual_service]]\nname = \"a\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"tcp\"\npool = \"p\"\n\n[[pool]]\nname = \"p\"\n";
    let cases: &[(&str, &str)] = &[
        // unknown key with a suggestion
        ("[[pool]]\nname = \"q\"\nalgoritm = \"round_robin\"\n", "bad.toml:12:1: pool[1].algoritm: unknown key `algoritm` (did you mean `algorithm`?)"),
        // wrong type
        ("[[pool]]\nname = \"q\"\nretries = \"two\"\n", "bad.toml:12:1: pool[1].retries: expected an integer, found a string"),
        // missing reference
        ("[[virtual_service]]\nname = \"b\"\nlisten = \"127.0.0.1:2\"\nprotocol = \"tcp\"\npool = \"nope\"\n", "bad.toml:14:1: virtual_service[1].pool: no pool named \"nope\""),
        // duplicate name
        ("[[pool]]\nname = \"p\"\n", "bad.toml:11:1: pool[1].name: duplicate name \"p\": already used by pool[0]"),
        // bad address
        ("[[pool]]\nname = \"q\"\n[[pool.member]]\naddress = \"10.0.0.1\"\n", "bad.toml:13:1: pool[1].member[0].address: invalid address \"10.0.0.1\": a port is required"),
        // bad duration
        ("[[pool]]\nname = \"q\"\nconnect_timeout = \"3\"\n", "bad.toml:12:1: pool[1].connect_timeout: invalid duration \"3\": a unit is required"),
        // bad enum value
        ("[[pool]]\nname = \"q\"\nalgorithm = \"fastest\"\n", "pool[1].algorithm: unknown value \"fastest\"; expected one of:"),
        // missing required key
        ("[[monitor]]\ntype = \"tcp\"\n", "bad.toml:10:1: monitor[0]: missing required key `name`"),
        // TOML syntax
        ("[[pool]\n", "bad.toml:10:"),
    ];
    for (extra, expected) in cases {
        let (ok, text) = check(&format!("{base}\n{extra}"));
        assert!(!ok, "accepted:\n{extra}");
        assert!(
            text.contains(expected),
            "for\n{extra}\nexpected {expected:?} in:\n{text}"
        );
    }
    // All errors at once.
    let (ok, text) = check(&format!(
        "{base}algoritm = 1\nretries = \"x\"\n[[pool.member]]\naddress = \"y\"\n"
    ));
    assert!(!ok);
    assert_eq!(text.lines().count(), 3, "{text}");
}

#[test]
fn run_with_a_bad_file_exits_1_with_the_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.toml");
    std::fs::write(&path, "[[pool]]\nname = 3\n").unwrap();
    let out = std::process::Command::new(BIN)
        .args(["run", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("x.toml:2:1: pool[0].name: expected a string"));
    let out = std::process::Command::new(BIN)
        .args(["run", "-c", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent.toml: cannot read the file")
    );
}

//! The admin plane's lock (issue #11) through the real binary: a generated root-only
//! token for mutating calls, the Host check against DNS rebinding, the JSON Content-Type
//! against cross-site form posts, token length at `fulcrum check`, `/metrics` behind the token
//! on request, and reloads checked against the address actually bound.

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use common::*;
use fulcrum_testkit::http_request;
use serde_json::json;

fn config(vs: std::net::SocketAddr, servers: &[TcpIdServer]) -> String {
    format!(
        "[[virtual_service]]\nname = \"svc\"\nlisten = [\"{vs}\"]\nprotocol = \"tcp\"\npool = \"p\"\n\n\
         [[pool]]\nname = \"p\"\nalgorithm = \"round_robin\"\n{}",
        members(servers, &[1])
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutating_calls_need_the_generated_token_and_json() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let f = start(&config(vs, &servers)).await;
    let member = servers[0].addr.to_string();
    let path = format!("/api/v1/pools/p/members/{member}/state");

    // No token configured: one was generated, root-only, and is kept across restarts.
    let meta = std::fs::metadata(f.token_file()).expect("no generated token file");
    assert_eq!(meta.mode() & 0o777, 0o600);
    let token = f.token.clone().expect("testkit did not read the token");
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    let bearer = format!("Bearer {token}");
    let body = json!({"state": "disabled"}).to_string();
    let body = body.as_bytes();

    // Read-only calls on the loopback listener stay open.
    let r = http_request(f.admin, "GET", "/api/v1/status", &[], b"")
        .await
        .unwrap();
    assert_eq!(r.status, 200);

    // Mutating calls without the token, or with a wrong one, are refused and change nothing.
    let json_ct = ("Content-Type", "application/json");
    for headers in [
        vec![json_ct],
        vec![json_ct, ("Authorization", "Bearer 0123456789abcdef0123")],
        vec![json_ct, ("Authorization", token.as_str())],
    ] {
        let r = http_request(f.admin, "PUT", &path, &headers, body)
            .await
            .unwrap();
        assert_eq!(r.status, 401, "{headers:?}: {}", r.text());
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    for (method, p) in [
        ("POST", "/api/v1/reload"),
        ("DELETE", "/api/v1/cache/svc?url=/x"),
        ("PUT", "/api/v1/pools/p/members/127.0.0.1:1/weight"),
        ("POST", "/api/v1/gslb/sites"),
    ] {
        let r = http_request(f.admin, method, p, &[json_ct], b"{}")
            .await
            .unwrap();
        assert_eq!(r.status, 401, "{method} {p}");
    }
    assert_eq!(f.member("p", &member).await["state"], "enabled");

    // With the token, a body that is not declared JSON is refused: a page on any site can send
    // a form or text/plain to localhost without asking first.
    for ct in [
        None,
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
        Some("multipart/form-data; boundary=x"),
    ] {
        let mut headers = vec![("Authorization", bearer.as_str())];
        if let Some(ct) = ct {
            headers.push(("Content-Type", ct));
        }
        let r = http_request(f.admin, "PUT", &path, &headers, body)
            .await
            .unwrap();
        assert_eq!(r.status, 415, "{ct:?}: {}", r.text());
    }
    assert_eq!(f.member("p", &member).await["state"], "enabled");

    // Token and JSON: done.
    let r = http_request(
        f.admin,
        "PUT",
        &path,
        &[
            ("Authorization", bearer.as_str()),
            ("Content-Type", "application/json; charset=utf-8"),
        ],
        body,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(f.member("p", &member).await["state"], "disabled");

    // A second start on the same token file reuses the token.
    let admin2 = free_addr();
    let second = Fulcrum::start_with_admin_table(
        BIN,
        admin2,
        &format!(
            "listen = \"{admin2}\"\ntoken_file = \"{}\"\n",
            f.token_file().display()
        ),
        Some(&token),
        &config(free_addr(), &servers),
    )
    .await
    .unwrap();
    let r = second.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "the second start did not reuse the token");
    assert_eq!(
        std::fs::read_to_string(f.token_file()).unwrap().trim(),
        token
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_host_names_are_refused_on_loopback() {
    let servers = id_servers(1).await;
    let f = start(&config(free_addr(), &servers)).await;
    let token = format!("Bearer {}", f.token.clone().unwrap());
    let port = f.admin.port();
    // A page at http://rebound.example:PORT/ whose name now resolves to 127.0.0.1.
    let evil = format!("rebound.example:{port}");
    for (method, path, body) in [
        ("GET", "/api/v1/pools", ""),
        ("GET", "/metrics", ""),
        ("POST", "/api/v1/reload", "{}"),
    ] {
        let r = http_request(
            f.admin,
            method,
            path,
            &[
                ("Host", evil.as_str()),
                ("Authorization", token.as_str()),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 421, "{method} {path}: {}", r.text());
    }
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "[::1]".to_string(),
    ] {
        let r = http_request(f.admin, "GET", "/api/v1/status", &[("Host", &host)], b"")
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{host}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_require_the_token() {
    let servers = id_servers(1).await;
    let admin = free_addr();
    let f = Fulcrum::start_with_admin_table(
        BIN,
        admin,
        &format!("listen = \"{admin}\"\ntoken_file = \"admin.token\"\nmetrics_auth = true\n"),
        None,
        &config(free_addr(), &servers),
    )
    .await
    .unwrap();
    let r = http_request(f.admin, "GET", "/metrics", &[], b"")
        .await
        .unwrap();
    assert_eq!(r.status, 401);
    let r = f.api("GET", "/metrics", None).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("fulcrum_build_info"));
}

fn check(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(BIN)
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_refuses_short_tokens_and_open_remote_listeners() {
    let servers = id_servers(1).await;
    let body = config(free_addr(), &servers);
    // A short token is refused on loopback too (anything on this host can try tokens), with
    // the same message as off loopback.
    let (ok, err) = check(&format!(
        "[admin]\nlisten = \"127.0.0.1:9900\"\ntoken = \"s3cret\"\n{body}"
    ));
    assert!(!ok, "a 6-character token passed on loopback");
    assert!(
        err.contains("f.toml:3:1: admin.token: the token is 6 characters long; use at least 16"),
        "{err}"
    );
    let (ok, err) = check(&format!("[admin]\ntoken = \"s3cret\"\n{body}"));
    assert!(!ok);
    assert!(err.contains("f.toml:2:1: admin.token:"), "{err}");
    let (ok, err) = check(&format!(
        "[admin]\nlisten = \"0.0.0.0:9900\"\ntoken = \"s3cret\"\n{body}"
    ));
    assert!(!ok);
    assert!(
        err.contains("f.toml:3:1: admin.token: the token is 6 characters long; use at least 16"),
        "{err}"
    );
    let (ok, err) = check(&format!("[admin]\nlisten = \"0.0.0.0:9900\"\n{body}"));
    assert!(!ok);
    assert!(err.contains("admin.listen"), "{err}");
    assert!(err.contains("not a loopback address"), "{err}");
    let (ok, err) = check(&format!(
        "[admin]\nlisten = \"0.0.0.0:9900\"\ntoken = \"0123456789abcdef\"\n{body}"
    ));
    assert!(ok, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_the_lock_of_the_bound_address() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let connect = free_addr();
    let port = connect.port();
    // Bound to every address (reached here through 127.0.0.1), so a token is required.
    let token = "first-token-0123456789";
    let f = Fulcrum::start_with_admin_table(
        BIN,
        connect,
        &format!("listen = \"0.0.0.0:{port}\"\ntoken = \"{token}\"\n"),
        Some(token),
        &config(vs, &servers),
    )
    .await
    .unwrap();
    let anon = http_request(f.admin, "GET", "/api/v1/status", &[], b"")
        .await
        .unwrap();
    assert_eq!(anon.status, 401, "reads off loopback need the token");

    // The new file names a loopback address and drops the token. The listener stays where it
    // is until a restart, so the reload must be refused, not leave 0.0.0.0 open.
    f.write_raw_config(&format!(
        "[admin]\nlisten = \"127.0.0.1:{port}\"\n\n{}",
        config(vs, &servers)
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("0.0.0.0"), "{}", r.text());
    let anon = http_request(f.admin, "GET", "/api/v1/status", &[], b"")
        .await
        .unwrap();
    assert_eq!(anon.status, 401, "the reload opened the API");

    // A new token does take effect at reload.
    let new = "second-token-0123456789";
    f.write_raw_config(&format!(
        "[admin]\nlisten = \"0.0.0.0:{port}\"\ntoken = \"{new}\"\n\n{}",
        config(vs, &servers)
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        f.api("GET", "/api/v1/status", None).await.unwrap().status,
        401
    );
    let r = http_request(
        f.admin,
        "GET",
        "/api/v1/status",
        &[("Authorization", &format!("Bearer {new}"))],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
}

/// curl with `args`; (status, stdout, stderr).
fn curl(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `admin.socket`: the API on a Unix socket, mode 0600, where mutating calls need no token (the
/// file's permissions decided who may connect), while the TCP listener keeps its lock; the CLI
/// uses it with --socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_is_authenticated_by_its_file_permissions() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let admin = free_addr();
    let f = fulcrum_testkit::Fulcrum::start_with_admin_table(
        BIN,
        admin,
        &format!("listen = \"{admin}\"\ntoken_file = \"admin.token\"\nsocket = \"run/admin.sock\""),
        None,
        &config(vs, &servers),
    )
    .await
    .unwrap();
    let socket = f.token_file().with_file_name("run").join("admin.sock");
    let meta = std::fs::metadata(&socket).expect("no admin socket");
    assert_eq!(meta.mode() & 0o777, 0o600);
    let socket = socket.to_str().unwrap();
    let member = servers[0].addr.to_string();
    let url = format!("http://localhost/api/v1/pools/p/members/{member}/state");
    // Over TCP without the token: refused.
    let tcp = format!("http://{admin}/api/v1/pools/p/members/{member}/state");
    let (_, out, _) = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "PUT",
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"state":"drain"}"#,
        &tcp,
    ]);
    assert_eq!(out, "401");
    // Over the socket without a token: done.
    let (ok, out, err) = curl(&[
        "--unix-socket",
        socket,
        "-w",
        "\n%{http_code}",
        "-X",
        "PUT",
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"state":"drain"}"#,
        &url,
    ]);
    assert!(ok, "{err}");
    assert!(out.ends_with("\n200"), "{out}");
    let m = f
        .get_json(&format!("/api/v1/pools/p/members/{member}"))
        .await;
    assert_eq!(m["state"], "drain", "{m}");
    // Still JSON only.
    let (_, out, _) = curl(&[
        "--unix-socket",
        socket,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "PUT",
        "-d",
        r#"{"state":"enabled"}"#,
        &url,
    ]);
    assert_eq!(out, "415");
    // The audit names the socket.
    let audit = f.get_json("/api/v1/audit").await;
    assert!(audit.to_string().contains("unix socket"), "{audit}");
    // The CLI over the socket, without a token.
    let out = Command::new(BIN)
        .args(["member", "enable", "p", &member, "--socket", socket])
        .env_remove("FULCRUM_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = f
        .get_json(&format!("/api/v1/pools/p/members/{member}"))
        .await;
    assert_eq!(m["state"], "enabled", "{m}");
}

/// `admin.tls`: the API listener speaks TLS with the configured certificate (curl --cacert
/// verifies it), and no plain HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_listener_speaks_tls() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let admin = free_addr();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = fulcrum_testkit::pki::self_signed(
        dir.path(),
        "admin",
        "127.0.0.1",
        30,
        Some("IP:127.0.0.1"),
    );
    let token = "0123456789abcdef-admin-tls";
    let conf = dir.path().join("fulcrum.toml");
    std::fs::write(
        &conf,
        format!(
            "[admin]\nlisten = \"{admin}\"\ntoken = \"{token}\"\ntls = {{ cert = \"{cert}\", key = \"{key}\" }}\n\n{}",
            config(vs, &servers)
        ),
    )
    .unwrap();
    let check = Command::new(BIN)
        .args(["check", "-c"])
        .arg(&conf)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    // A certificate that does not load is reported by `fulcrum check`, with its key.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        format!(
            "[admin]\nlisten = \"{admin}\"\ntoken = \"{token}\"\ntls = {{ cert = \"missing.crt\", key = \"{key}\" }}\n\n{}",
            config(vs, &servers)
        ),
    )
    .unwrap();
    let check = Command::new(BIN)
        .args(["check", "-c"])
        .arg(&bad)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stderr).into_owned()
        + &String::from_utf8_lossy(&check.stdout);
    assert!(
        !check.status.success() && said.contains("admin.tls.cert"),
        "{said}"
    );
    let mut child = Command::new(BIN)
        .args(["run", "-c"])
        .arg(&conf)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("https://127.0.0.1:{}/api/v1/status", admin.port());
    let bearer = format!("Authorization: Bearer {token}");
    let up = wait_until(std::time::Duration::from_secs(20), || async {
        curl(&["--cacert", &cert, "-H", &bearer, &url]).0
    })
    .await;
    let (ok, out, err) = curl(&["--cacert", &cert, "-H", &bearer, &url]);
    let plain = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://127.0.0.1:{}/api/v1/status", admin.port()),
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(up && ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["virtual_services"][0]["name"], "svc");
    assert_ne!(
        plain.1, "200",
        "plain HTTP is not answered on the TLS listener"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_cannot_evict_accepted_changes() {
    let servers = id_servers(1).await;
    let f = start(&config(free_addr(), &servers)).await;
    let member = servers[0].addr.to_string();
    let path = format!("/api/v1/pools/p/members/{member}/state");
    let r = f
        .api("PUT", &path, Some(json!({"state": "drain"})))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    // Anyone who can reach the listener can draw refusals: more of them than the log keeps.
    let json_ct = ("Content-Type", "application/json");
    for i in 0..600 {
        let r = http_request(
            f.admin,
            "PUT",
            &path,
            &[json_ct],
            b"{\"state\":\"disabled\"}",
        )
        .await
        .unwrap();
        assert_eq!(r.status, 401, "refused call {i}");
    }
    let audit = f.get_json("/api/v1/audit").await;
    let entries = audit["entries"].as_array().cloned().unwrap_or_default();
    let accepted: Vec<_> = entries.iter().filter(|e| e["status"] == 200).collect();
    assert_eq!(
        accepted.len(),
        1,
        "the accepted change was evicted ({} entries kept)",
        entries.len()
    );
    assert_eq!(accepted[0]["body"], r#"{"state":"drain"}"#);
    assert_eq!(accepted[0]["refused"], false);
    let refused = entries.iter().filter(|e| e["refused"] == true).count();
    assert!(
        (1..=10).contains(&refused),
        "one source keeps at most 10 refused calls, kept {refused}"
    );
    assert_eq!(audit["refused_dropped"], 600 - refused as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newlines_in_audited_paths_and_bodies_stay_on_one_log_line() {
    let servers = id_servers(1).await;
    let f = start(&config(free_addr(), &servers)).await;
    let json_ct = ("Content-Type", "application/json");
    // A newline in the path (%0a) or the body cannot start a line of its own in the log.
    let forged_path = "/api/v1/pools/p/members/x%0aFORGED-PATH%0d%1b%5b31m/state";
    let r = http_request(
        f.admin,
        "PUT",
        forged_path,
        &[json_ct],
        b"{\"state\":\"drain\"}\nFORGED-BODY status=200",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 401);
    let logged = wait_until(std::time::Duration::from_secs(5), || async {
        f.logs().contains("FORGED-BODY")
    })
    .await;
    let logs = f.logs();
    assert!(logged, "the call was not logged:\n{logs}");
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains("FORGED")).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains(r"/x\nFORGED-PATH\r\x1b[31m/state")
            && lines[0].contains(r#"{"state":"drain"}\nFORGED-BODY status=200"#),
        "{}",
        lines[0]
    );
}

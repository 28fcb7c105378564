//! The configuration API (`/api/v1/config…`) through the binary: objects created, changed and
//! deleted one at a time with the file's keys, the file on disk afterwards (the operator's
//! comments kept, `fulcrum check` passing), stale versions refused, dry runs that answer as
//! `fulcrum check`, refused writes that change nothing, history and rollback, and the CLI.

mod common;

use std::collections::BTreeSet;

use common::*;
use fulcrum_testkit::client::{http_request, HttpResponse};
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

fn config(vs: std::net::SocketAddr, m0: std::net::SocketAddr) -> String {
    format!(
        r#"# The shop's balancer. Owned by the platform team.

[[virtual_service]]
name = "svc"          # the public entry
listen = ["{vs}"]
protocol = "tcp"
pool = "p"

# Application servers: add them through the API or here.
[[pool]]
name = "p"
algorithm = "round_robin"   # equal turns
[[pool.member]]
address = "{m0}"    # the first one
"#
    )
}

async fn call(
    f: &Fulcrum,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpResponse {
    let auth = format!("Bearer {}", f.token().unwrap_or(""));
    let mut h: Vec<(&str, &str)> = vec![("Authorization", auth.as_str())];
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        h.push(("Content-Type", "application/json"));
    }
    h.extend_from_slice(headers);
    http_request(f.admin, method, path, &h, body.as_bytes())
        .await
        .unwrap()
}

/// Who answers `n` connections through `vs`.
async fn reached(vs: std::net::SocketAddr, n: usize) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        if let Ok(w) = exchange(vs).await {
            seen.insert(w);
        }
    }
    seen
}

fn check(file: &std::path::Path) -> (bool, Vec<String>) {
    let o = std::process::Command::new(BIN)
        .args(["check", "-c"])
        .arg(file)
        .output()
        .unwrap();
    let errors = String::from_utf8_lossy(&o.stderr)
        .lines()
        .map(str::to_string)
        .collect();
    (o.status.success(), errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_through_the_api_change_the_running_config_and_the_file_all_or_nothing() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let f = start(&config(vs, servers[0].addr)).await;
    let file = f.config_path().to_path_buf();

    // The running configuration, as TOML and as JSON, with its version.
    let r = call(&f, "GET", "/api/v1/config", &[], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("etag"), Some("\"1\""));
    assert!(r.text().contains("# Application servers"), "{}", r.text());
    let r = call(
        &f,
        "GET",
        "/api/v1/config",
        &[("Accept", "application/json")],
        "",
    )
    .await;
    assert_eq!(
        r.json()["pool"][0]["member"][0]["address"],
        servers[0].addr.to_string()
    );

    // A member added through the API serves at once and is in the file, comments kept.
    let m1 = servers[1].addr.to_string();
    let path = format!("/api/v1/config/pools/p/members/{m1}");
    let r = call(&f, "PUT", &path, &[], r#"{"weight": 1}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["version"], 2);
    assert_eq!(
        reached(vs, 6).await,
        BTreeSet::from(["m0".into(), "m1".into()])
    );
    let text = std::fs::read_to_string(&file).unwrap();
    for kept in [
        "# The shop's balancer",
        "# the public entry",
        "# equal turns",
        "# the first one",
    ] {
        assert!(text.contains(kept), "{kept:?} lost:\n{text}");
    }
    assert!(text.contains(&format!("address = \"{m1}\"")), "{text}");
    assert!(
        check(&file).0,
        "fulcrum check refuses the written file:\n{text}"
    );
    let r = call(&f, "GET", &path, &[], "").await;
    assert_eq!(r.json(), json!({"address": m1, "weight": 1}));

    // A write based on an old version changes nothing (412); a whole write needs If-Match.
    let r = call(
        &f,
        "PUT",
        "/api/v1/config",
        &[("If-Match", "\"1\""), ("Content-Type", "application/toml")],
        "",
    )
    .await;
    assert_eq!(r.status, 412, "{}", r.text());
    assert_eq!(r.header("etag"), Some("\"2\""));
    let r = call(
        &f,
        "PUT",
        "/api/v1/config",
        &[("Content-Type", "application/toml")],
        &text,
    )
    .await;
    assert_eq!(r.status, 428, "{}", r.text());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);

    // A dry run answers exactly what `fulcrum check` says of the same file, and applies nothing.
    let bad = text.replace("pool = \"p\"", "pool = \"nope\"")
        + "\n[[monitor]]\nname = \"m\"\ntype = \"tcp\"\nintervall = \"1s\"\n";
    let r = call(
        &f,
        "PUT",
        "/api/v1/config?dry_run=true",
        &[("If-Match", "\"2\""), ("Content-Type", "application/toml")],
        &bad,
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let api_errors: Vec<String> = r.json()["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    std::fs::write(&file, &bad).unwrap();
    let (ok, check_errors) = check(&file);
    std::fs::write(&file, &text).unwrap();
    assert!(!ok);
    assert_eq!(api_errors, check_errors);
    assert!(api_errors.len() >= 2, "{api_errors:?}");
    let r = call(
        &f,
        "PUT",
        "/api/v1/config?dry_run=true",
        &[("If-Match", "\"2\""), ("Content-Type", "application/toml")],
        &text,
    )
    .await;
    assert_eq!(
        (r.status, r.json()["valid"].clone()),
        (200, json!(true)),
        "{}",
        r.text()
    );

    // A write that passes the checks but fails a later step (a port in use) changes nothing.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let body =
        json!({"listen": [busy.local_addr().unwrap().to_string()], "protocol": "tcp", "pool": "p"});
    let r = call(
        &f,
        "PUT",
        "/api/v1/config/virtual_services/other",
        &[],
        &body.to_string(),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("Address already in use"), "{}", r.text());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    assert_eq!(
        call(&f, "GET", "/api/v1/config", &[], "")
            .await
            .header("etag"),
        Some("\"2\"")
    );
    drop(busy);

    // A pool still used cannot go; a monitor can come; unauthenticated writes are refused.
    let r = call(&f, "DELETE", "/api/v1/config/pools/p", &[], "").await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("virtual_service[0].pool: no pool named"),
        "{}",
        r.text()
    );
    let r = call(
        &f,
        "PUT",
        "/api/v1/config/monitors/alive",
        &[],
        r#"{"type": "tcp", "interval": "1s"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = http_request(
        f.admin,
        "PUT",
        &path,
        &[("Content-Type", "application/json")],
        b"{}",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 401);

    // History: who, from where, what changed; a rollback is a new version.
    let h = call(&f, "GET", "/api/v1/config/history", &[], "")
        .await
        .json();
    let newest = &h["versions"][0];
    assert_eq!(newest["version"], 3, "{h}");
    assert_eq!(newest["changes"][0], "monitor \"alive\" added", "{h}");
    assert_eq!(h["versions"][1]["changes"][0], "pool \"p\" changed", "{h}");
    assert_eq!(h["versions"][1]["who"], "api");
    assert!(
        h["versions"][1]["from"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{h}"
    );
    let r = call(
        &f,
        "POST",
        "/api/v1/config/rollback",
        &[],
        r#"{"version": 1}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.json()["version"].clone()),
        (200, json!(4)),
        "{}",
        r.text()
    );
    assert_eq!(reached(vs, 4).await, BTreeSet::from(["m0".into()]));
    assert!(!std::fs::read_to_string(&file).unwrap().contains(&m1));

    // Deleting the member through the API after adding it again.
    call(&f, "PUT", &path, &[], "{}").await;
    let r = call(&f, "DELETE", &path, &[], "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(call(&f, "DELETE", &path, &[], "").await.status, 404);
}

fn cli(f: &Fulcrum, args: &[&str]) -> (bool, String, String) {
    let o = std::process::Command::new(BIN)
        .args(args)
        .args(["--admin", &f.admin.to_string(), "--token-file"])
        .arg(f.token_file())
        .env("USER", "alice")
        .env_remove("SUDO_USER")
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_gets_diffs_applies_and_rolls_back_the_running_config() {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let f = start(&config(vs, servers[0].addr)).await;
    let (ok, text, err) = tokio::task::block_in_place(|| cli(&f, &["config", "get"]));
    assert!(ok, "{err}");
    assert_eq!(err.trim(), "version 1");
    assert!(text.contains("# Application servers"), "{text}");

    let edited = text.replace(
        "# the first one\n",
        &format!(
            "# the first one\n[[pool.member]]\naddress = \"{}\"   # a second\n",
            servers[1].addr
        ),
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("edited.toml");
    std::fs::write(&file, &edited).unwrap();
    let file_arg = file.to_str().unwrap();
    let (ok, diff, err) = tokio::task::block_in_place(|| cli(&f, &["config", "diff", file_arg]));
    assert!(ok, "{err}");
    assert!(diff.contains("pool \"p\" changed"), "{diff}");
    assert!(
        diff.contains(&format!("+ address = \"{}\"   # a second", servers[1].addr)),
        "{diff}"
    );

    let (ok, out, err) = tokio::task::block_in_place(|| cli(&f, &["config", "apply", file_arg]));
    assert!(ok, "{err}");
    assert!(out.contains("version 2"), "{out}");
    assert_eq!(
        reached(vs, 6).await,
        BTreeSet::from(["m0".into(), "m1".into()])
    );
    assert_eq!(std::fs::read_to_string(f.config_path()).unwrap(), edited);

    // Based on version 1, which is no longer running: refused, nothing changes.
    std::fs::write(&file, &text).unwrap();
    let (ok, _, err) =
        tokio::task::block_in_place(|| cli(&f, &["config", "apply", file_arg, "--if-match", "1"]));
    assert!(!ok && err.contains("412"), "{err}");
    assert_eq!(std::fs::read_to_string(f.config_path()).unwrap(), edited);

    let (ok, out, err) = tokio::task::block_in_place(|| cli(&f, &["config", "history"]));
    assert!(ok, "{err}");
    assert!(
        out.contains("api (alice) from 127.0.0.1:") && out.contains("pool \"p\" changed"),
        "{out}"
    );

    let (ok, out, err) = tokio::task::block_in_place(|| cli(&f, &["config", "rollback", "1"]));
    assert!(ok, "{err}");
    assert!(out.contains("now version 3"), "{out}");
    assert_eq!(reached(vs, 4).await, BTreeSet::from(["m0".into()]));
}

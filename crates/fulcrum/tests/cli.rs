//! The operator CLI (`fulcrum status|pools|member|reload|top`) against a running Fulcrum: every
//! verb through the real binary and the admin API, errors and exit statuses included; `top`
//! through a pseudo-terminal (tmux).

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const TOKEN: &str = "cli-test-token-0123456789";

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn cli(args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = tokio::process::Command::new(BIN);
    c.args(args)
        .env_remove("FULCRUM_TOKEN")
        .env_remove("FULCRUM_ADMIN")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let o = tokio::time::timeout(Duration::from_secs(20), c.output())
        .await
        .expect("the CLI finishes")
        .expect("the CLI runs");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn config(vs: std::net::SocketAddr, servers: &[TcpIdServer]) -> String {
    format!(
        "[[virtual_service]]\nname = \"edge\"\nlisten = [\"{vs}\"]\nprotocol = \"tcp\"\npool = \"app\"\n\n\
         [[pool]]\nname = \"app\"\nalgorithm = \"round_robin\"\n{}",
        members(servers, &vec![5; servers.len()])
    )
}

async fn setup() -> (Vec<TcpIdServer>, std::net::SocketAddr, Fulcrum, String) {
    let servers = id_servers(2).await;
    let vs = free_addr();
    let f = Fulcrum::start_with_token(BIN, free_addr(), Some(TOKEN), &config(vs, &servers))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let admin = f.admin.to_string();
    (servers, vs, f, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_pools_print_aligned_tables_and_json() {
    let (servers, vs, f, admin) = setup().await;
    for _ in 0..4 {
        exchange(vs).await.unwrap();
    }
    let env = [("FULCRUM_TOKEN", TOKEN)];
    let o = cli(&["status", "--admin", &admin], &env).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(
        lines[0].starts_with("fulcrum ") && lines[0].contains("config generation 1"),
        "{}",
        o.stdout
    );
    let header = lines.iter().find(|l| l.starts_with("SERVICE")).unwrap();
    let row = lines.iter().find(|l| l.starts_with("edge")).unwrap();
    // Aligned: the CONNS column's right edge is the same in the header and the row.
    let end = header.find("CONNS").unwrap() + "CONNS".len();
    assert_eq!(&row[end - 1..end], "4", "{header}\n{row}");
    assert!(o.stdout.contains(&vs.to_string()));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("app") && l.contains("round_robin")),
        "{}",
        o.stdout
    );

    let o = cli(&["pools", "app", "--admin", &admin, "--token", TOKEN], &[]).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.starts_with("pool app  (round_robin, 2 of 2 up"),
        "{}",
        o.stdout
    );
    for s in &servers {
        let line = o
            .stdout
            .lines()
            .find(|l| l.starts_with(&s.addr.to_string()))
            .unwrap_or_else(|| panic!("no row for {}:\n{}", s.addr, o.stdout));
        assert!(line.contains(" up ") && line.contains("enabled"), "{line}");
    }

    let o = cli(&["pools", "--json", "--admin", &admin], &env).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["pools"][0]["name"], "app");
    assert_eq!(v["pools"][0]["members"].as_array().unwrap().len(), 2);
    let o = cli(&["status", "--json", "--admin", &admin], &env).await;
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["status"]["virtual_services"][0]["connections_total"], 4);
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_verbs_change_the_member_through_the_api() {
    let (servers, _vs, f, admin) = setup().await;
    let m = servers[0].addr.to_string();
    let token_file = f.dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let tf = token_file.to_str().unwrap();
    for (verb, state) in [
        ("drain", "drain"),
        ("disable", "disabled"),
        ("enable", "enabled"),
    ] {
        let o = cli(
            &[
                "member",
                verb,
                "app",
                &m,
                "--admin",
                &admin,
                "--token-file",
                tf,
            ],
            &[],
        )
        .await;
        assert_eq!(o.code, 0, "{verb}: {}", o.stderr);
        assert!(o.stdout.contains(&format!("-> {state}")), "{}", o.stdout);
        assert_eq!(f.member("app", &m).await["state"], state);
    }
    let o = cli(
        &["member", "weight", "app", &m, "17", "--admin", &admin],
        &[("FULCRUM_TOKEN", TOKEN)],
    )
    .await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("weight 5 -> 17"), "{}", o.stdout);
    assert_eq!(f.member("app", &m).await["weight"], 17);
    // Each change is in the audit log with the CLI as the user agent.
    let audit = f.get_json("/api/v1/audit").await;
    let e = &audit["entries"][0];
    assert_eq!(e["path"], format!("/api/v1/pools/app/members/{m}/weight"));
    assert!(
        e["user_agent"]
            .as_str()
            .unwrap()
            .starts_with("fulcrum-cli/"),
        "{e}"
    );
    assert_eq!(audit["entries"].as_array().unwrap().len(), 4);
    // --json prints the API's member object.
    let o = cli(
        &["member", "drain", "app", &m, "--json", "--admin", &admin],
        &[("FULCRUM_TOKEN", TOKEN)],
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["state"], "drain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_clear_with_distinct_exit_statuses() {
    let (servers, _vs, f, admin) = setup().await;
    let env = [("FULCRUM_TOKEN", TOKEN)];
    // Unknown pool, unknown member, bad weight: the API's message, status 1.
    let o = cli(&["pools", "nope", "--admin", &admin], &env).await;
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("no pool named \"nope\""), "{}", o.stderr);
    let o = cli(
        &["member", "drain", "app", "127.0.0.1:1", "--admin", &admin],
        &env,
    )
    .await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("has no member 127.0.0.1:1"),
        "{}",
        o.stderr
    );
    let o = cli(
        &[
            "member",
            "weight",
            "app",
            &servers[0].addr.to_string(),
            "70000",
            "--admin",
            &admin,
        ],
        &env,
    )
    .await;
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("weight"), "{}", o.stderr);
    // No token, wrong token: 4, with a hint.
    let o = cli(&["status", "--admin", &admin], &[]).await;
    assert_eq!(o.code, 4);
    assert!(
        o.stderr.contains("HTTP 401") && o.stderr.contains("--token"),
        "{}",
        o.stderr
    );
    let o = cli(&["status", "--admin", &admin, "--token", "wrong"], &[]).await;
    assert_eq!(o.code, 4);
    assert!(o.stderr.contains("the token was refused"), "{}", o.stderr);
    // Nothing listening: 3.
    let dead = free_addr().to_string();
    let o = cli(&["status", "--admin", &dead], &env).await;
    assert_eq!(o.code, 3);
    assert!(
        o.stderr.contains("cannot reach the admin API"),
        "{}",
        o.stderr
    );
    // Usage errors are clap's: 2.
    let o = cli(&["member", "drain", "app"], &env).await;
    assert_eq!(o.code, 2);
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_the_file_and_reports_its_errors() {
    let (mut servers, vs, f, admin) = setup().await;
    let env = [("FULCRUM_TOKEN", TOKEN)];
    servers.push(TcpIdServer::start(free_addr(), "m2").await.unwrap());
    f.write_config(&config(vs, &servers));
    let o = cli(&["reload", "--admin", &admin], &env).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout.trim(), "reloaded: config generation 2");
    let o = cli(&["pools", "app", "--admin", &admin], &env).await;
    assert!(
        o.stdout.contains(&servers[2].addr.to_string()),
        "{}",
        o.stdout
    );
    f.write_config("[[pool]]\nname = \"app\"\nalgoritm = \"round_robin\"\n");
    let o = cli(&["reload", "--admin", &admin], &env).await;
    assert_eq!(o.code, 1);
    assert!(o.stderr.contains("algoritm"), "{}", o.stderr);
    assert_eq!(f.get_json("/api/v1/status").await["generation"], 2);
}

fn tmux(socket: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("tmux")
        .args(["-L", socket])
        .args(args)
        .output()
        .expect("tmux runs")
}

/// Kills the private tmux server (and `top` in it) also when the test fails.
struct TmuxServer(String);

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let _ = tmux(&self.0, &["kill-server"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_services_and_members_live_and_quits_on_q() {
    let (servers, vs, f, admin) = setup().await;
    let socket = format!("fulcrum-top-{}", std::process::id());
    let server = TmuxServer(socket.clone());
    let marker = f.dir.path().join("top-exit");
    let cmd = format!(
        "FULCRUM_TOKEN={TOKEN} {BIN} top --admin {admin}; echo $? > {}; sleep 30",
        marker.display()
    );
    let o = tmux(
        &socket,
        &["new-session", "-d", "-x", "160", "-y", "30", &cmd],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let capture =
        || String::from_utf8_lossy(&tmux(&socket, &["capture-pane", "-p"]).stdout).into_owned();
    let m0 = servers[0].addr.to_string();
    let ok = wait_until(Duration::from_secs(10), || {
        let screen = capture();
        let found =
            screen.contains("fulcrum top") && screen.contains(&m0) && screen.contains("edge");
        async move { found }
    })
    .await;
    assert!(ok, "top never showed the members:\n{}", capture());
    // Live: a drain through the API shows within a few refreshes, traffic shows as a rate.
    f.api(
        "PUT",
        &format!("/api/v1/pools/app/members/{m0}/state"),
        Some(serde_json::json!({"state": "drain"})),
    )
    .await
    .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let mut seen = false;
    while Instant::now() < end && !seen {
        for _ in 0..5 {
            let _ = exchange(vs).await;
        }
        let screen = capture();
        seen = screen
            .lines()
            .any(|l| l.contains(&m0) && l.contains("drain"))
            && screen
                .lines()
                .any(|l| l.contains("edge") && l.contains(" tcp "));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(seen, "the drain never showed:\n{}", capture());
    let screen = capture();
    println!("{screen}");
    let o = tmux(&socket, &["send-keys", "q"]);
    assert!(o.status.success());
    let ok = wait_until(Duration::from_secs(5), || {
        let m = marker.clone();
        async move { std::fs::read_to_string(&m).is_ok_and(|s| s.trim() == "0") }
    })
    .await;
    assert!(ok, "top did not exit 0 on q:\n{}", capture());
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_on_the_command_line_draws_a_warning_the_file_and_environment_do_not() {
    let (_servers, _vs, _f, admin) = setup().await;
    let warning = "--token puts the token in the process list";
    for args in [
        vec!["status", "--admin", &admin, "--token", TOKEN],
        vec!["status", "--admin", &admin, &format!("--token={TOKEN}")],
    ] {
        let o = cli(&args, &[]).await;
        assert_eq!(o.code, 0, "{}", o.stderr);
        assert!(o.stderr.contains(warning), "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains("--token-file"), "{}", o.stderr);
    }
    let o = cli(&["status", "--admin", &admin], &[("FULCRUM_TOKEN", TOKEN)]).await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains(warning), "{}", o.stderr);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let o = cli(
        &[
            "status",
            "--admin",
            &admin,
            "--token-file",
            file.to_str().unwrap(),
        ],
        &[],
    )
    .await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains(warning), "{}", o.stderr);
}

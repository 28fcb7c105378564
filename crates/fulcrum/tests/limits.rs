//! Process-wide bounds through the real binary (issue #11): the open-file limit raised at
//! start, and the global connection cap that refuses clients past it while the API keeps
//! answering.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use tokio::io::AsyncReadExt;

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tcp_config(vs: std::net::SocketAddr, servers: &[TcpIdServer], global: &str) -> String {
    format!(
        "{global}\n[[virtual_service]]\nname = \"svc\"\nlisten = [\"{vs}\"]\nprotocol = \"tcp\"\npool = \"p\"\n\n\
         [[pool]]\nname = \"p\"\n{}",
        members(servers, &[1])
    )
}

async fn metric(f: &Fulcrum, name: &str) -> f64 {
    let text = f.api("GET", "/metrics", None).await.unwrap().text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(f64::NAN)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_file_limit_is_raised_to_the_hard_limit_at_start() {
    let servers = id_servers(1).await;
    let dir = tempfile::tempdir().unwrap();
    let admin = free_addr();
    let path = dir.path().join("f.toml");
    std::fs::write(
        &path,
        format!(
            "[admin]\nlisten = \"{admin}\"\ntoken_file = \"admin.token\"\n{}",
            tcp_config(free_addr(), &servers, "")
        ),
    )
    .unwrap();
    // prlimit (util-linux) execs the binary with a soft limit of 512 under a hard one of 4096.
    let child = Command::new("prlimit")
        .arg("--nofile=512:4096")
        .arg(BIN)
        .args(["run", "-c"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prlimit is part of util-linux");
    let pid = child.id();
    let _guard = Kill(child);
    assert!(
        wait_until(Duration::from_secs(20), || async {
            fulcrum_testkit::http_get(admin, "/api/v1/status")
                .await
                .is_ok_and(|r| r.status == 200)
        })
        .await,
        "fulcrum did not come up"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&fields[3..5], &["4096", "4096"], "{line}");
    // The derived cap: two descriptors per connection after a reserve of 1024.
    let text = fulcrum_testkit::http_get(admin, "/metrics")
        .await
        .unwrap()
        .text();
    assert!(text.contains("fulcrum_connections_limit 1536"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_cap_refuses_clients_past_it_and_the_api_still_answers() {
    let servers = id_servers(1).await;
    let vs = free_addr();
    let f = start(&tcp_config(vs, &servers, "[global]\nmax_connections = 3\n")).await;
    assert_eq!(metric(&f, "fulcrum_connections_limit").await, 3.0);
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut s = connect_from(vs, None).await.unwrap();
        let mut name = [0u8; 3];
        s.read_exact(&mut name).await.unwrap();
        held.push(s);
    }
    // The fourth is reset before it reaches a member.
    // (The reset can come back before connect() returns.)
    if let Ok(mut fourth) = connect_from(vs, None).await {
        let mut buf = [0u8; 8];
        let r = tokio::time::timeout(Duration::from_secs(5), fourth.read(&mut buf))
            .await
            .expect("neither served nor closed");
        assert!(matches!(r, Ok(0) | Err(_)), "served past the cap: {r:?}");
    }
    assert_eq!(servers[0].connections(), 3);
    // The API (not a client connection) still answers, and counts the refusal.
    let status = f.get_json("/api/v1/status").await;
    assert_eq!(status["virtual_services"][0]["over_limit"], 1);
    assert_eq!(metric(&f, "fulcrum_connections_refused_total").await, 1.0);
    assert_eq!(metric(&f, "fulcrum_connections_active").await, 3.0);
    // One leaves: a new client gets in.
    drop(held.pop());
    assert!(
        wait_until(Duration::from_secs(5), || async {
            metric(&f, "fulcrum_connections_active").await < 3.0
        })
        .await
    );
    assert_eq!(exchange(vs).await.unwrap(), "m0");
}

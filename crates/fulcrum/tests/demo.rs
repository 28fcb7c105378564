//! `fulcrum demo` works with no file: backends, service, API, metrics.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_serves_weighted_traffic_and_the_api() {
    let (listen, admin) = (free_addr(), free_addr());
    let child = Command::new(BIN)
        .args([
            "demo",
            "--listen",
            &listen.to_string(),
            "--admin",
            &admin.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let token_dir = std::env::temp_dir().join(format!("fulcrum-demo-{}", child.id()));
    let mut guard = Kill(child);
    assert!(
        wait_until(Duration::from_secs(20), || async {
            fulcrum_testkit::http_get(admin, "/api/v1/status")
                .await
                .is_ok_and(|r| r.status == 200)
        })
        .await,
        "demo did not come up"
    );
    let mut counts = BTreeMap::new();
    for _ in 0..60 {
        let r = fulcrum_testkit::http_get(listen, "/").await.unwrap();
        assert_eq!(r.status, 200);
        *counts.entry(r.text().trim().to_string()).or_insert(0) += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([
            ("backend-1".into(), 30),
            ("backend-2".into(), 20),
            ("backend-3".into(), 10)
        ])
    );
    // The content-switching rule answers its path without a member.
    let about = fulcrum_testkit::http_get(listen, "/fulcrum/")
        .await
        .unwrap();
    assert_eq!(about.status, 200);
    assert!(
        about.text().contains("content-switching rule"),
        "{}",
        about.text()
    );
    let pools = fulcrum_testkit::http_get(admin, "/api/v1/pools")
        .await
        .unwrap()
        .json();
    assert_eq!(pools["pools"][0]["members"].as_array().unwrap().len(), 3);
    let metrics = fulcrum_testkit::http_get(admin, "/metrics")
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("fulcrum_vs_requests_total{vs=\"demo\",protocol=\"http\"} 61"),
        "{metrics}"
    );

    // The demo's token is only good for this process: its directory goes when the demo ends.
    assert!(token_dir.join("admin.token").exists());
    let pid = guard.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = guard.0.wait().unwrap();
    assert!(status.success(), "demo exited with {status}");
    assert!(!token_dir.exists(), "{} left behind", token_dir.display());
}

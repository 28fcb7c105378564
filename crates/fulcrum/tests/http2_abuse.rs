//! HTTP/2 under abuse through the real binary (issue #11): rapid reset (CVE-2023-44487), a
//! client that never answers after GOAWAY, and a TLS client that negotiates h2 and never sends
//! the preface. Each connection must end within a bound while other clients are served.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fulcrum_testkit::h2abuse::{rapid_reset, silent_after_preface};
use fulcrum_testkit::{HttpBackend, Origin, Reply};

fn http_config(vs: std::net::SocketAddr, member: std::net::SocketAddr, extra: &str) -> String {
    format!(
        "[[virtual_service]]\nname = \"web\"\nlisten = \"{vs}\"\nprotocol = \"http\"\npool = \"p\"\n{extra}\n\n\
         [[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"{member}\"\n"
    )
}

async fn metric(f: &Fulcrum, sample: &str) -> f64 {
    let text = f.api("GET", "/metrics", None).await.unwrap().text();
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_closes_the_connection_within_its_budget() {
    // A member that takes its time: a reset stream's request is still in flight there.
    let member = Origin::start(free_addr(), |_, _| {
        let mut r = Reply::ok("slow", &[]);
        r.delay = Duration::from_millis(300);
        r
    })
    .await
    .unwrap();
    let vs = free_addr();
    let f = start(&http_config(vs, member.addr, "")).await;
    // Each stream is reset a moment after its HEADERS, once Fulcrum has taken it and started
    // on it (picked a member, maybe connected): h2's own counter of streams reset before they
    // were accepted never sees these.
    let run = rapid_reset(vs, 1000, Some(Duration::from_millis(2)))
        .await
        .unwrap();
    eprintln!(
        "rapid reset: {run:?}; requests that reached the member: {}",
        member.count()
    );
    assert!(
        run.closed_by_server && run.streams < 1000,
        "the server took {run:?}"
    );
    assert!(
        member.count() <= 300,
        "{} requests reached the member",
        member.count()
    );
    assert_eq!(
        metric(&f, "fulcrum_http_h2_reset_floods_total{vs=\"web\"}").await,
        1.0
    );
    // Resets in one burst, before the server took the streams: h2 closes the connection.
    let burst = rapid_reset(vs, 5000, None).await.unwrap();
    assert!(burst.closed_by_server, "{burst:?}");
    // Others are served.
    let r = fulcrum_testkit::http_get(vs, "/").await.unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_answers_is_closed_after_goaway() {
    let member = HttpBackend::start(free_addr(), "m0").await.unwrap();
    let vs = free_addr();
    let _f = start(&http_config(vs, member.addr, "idle_timeout = \"1s\"")).await;
    // Idle after 1 s: GOAWAY and a PING it never acknowledges; then the drain deadline.
    let closed = silent_after_preface(vs, Duration::from_secs(15)).await;
    assert!(
        closed.is_some_and(|d| d < Duration::from_secs(10)),
        "still open: {closed:?}"
    );
}

fn self_signed(dir: &Path) {
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "vs.key",
            "-out",
            "vs.crt",
            "-days",
            "2",
            "-subj",
            "/CN=vs.test",
        ])
        .current_dir(dir)
        .output()
        .expect("openssl is installed by scripts/test.sh");
    assert!(out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_h2_without_a_preface_is_closed_at_the_header_timeout() {
    let pki = tempfile::tempdir().unwrap();
    self_signed(pki.path());
    let member = HttpBackend::start(free_addr(), "m0").await.unwrap();
    let vs = free_addr();
    let _f = start(&format!(
        "[[virtual_service]]\nname = \"web\"\nlisten = \"{vs}\"\nprotocol = \"https\"\npool = \"p\"\n\
         header_timeout = \"1s\"\ntls = [{{ cert = \"{}\", key = \"{}\" }}]\n\n\
         [[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"{}\"\n",
        pki.path().join("vs.crt").display(),
        pki.path().join("vs.key").display(),
        member.addr
    ))
    .await;
    // s_client negotiates h2 by ALPN, then sends nothing (its stdin stays open).
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-quiet",
            "-alpn",
            "h2",
            "-connect",
            &vs.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut exited = false;
    while started.elapsed() < Duration::from_secs(10) {
        if child.try_wait().unwrap().is_some() {
            exited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        exited,
        "the connection without a preface was still open after 10 s"
    );
}

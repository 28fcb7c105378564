//! HTTP/2 under abuse through the real binary (issue #11): rapid reset (CVE-2023-44487), a
//! client that never answers after GOAWAY, and a TLS client that negotiates h2 and never sends
//! the preface. Each connection must end within a bound while other clients are served.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fulcrum_testkit::h2abuse::{rapid_reset, silent_after_preface};
use fulcrum_testkit::{HttpBackend, Origin, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_h2_without_a_preface_is_closed_at_the_header_timeout() {
    let pki = tempfile::tempdir().unwrap();
    fulcrum_testkit::pki::self_signed(pki.path(), "vs", "vs.test", 2, None);
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

/// A member that reads each request's whole body (Content-Length or chunked) before it
/// answers 200 "ok", counting the requests it answered.
async fn body_reader() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let c = c.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
                    let Some(end) = text.find("\r\n\r\n") else {
                        continue;
                    };
                    let done = match text.lines().find_map(|l| l.strip_prefix("content-length:")) {
                        Some(n) => buf.len() >= end + 4 + n.trim().parse::<usize>().unwrap_or(0),
                        None => !text.contains("chunked") || text.ends_with("0\r\n\r\n"),
                    };
                    if done {
                        c.fetch_add(1, Ordering::Relaxed);
                        let _ = s
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await;
                        buf.clear();
                    }
                }
            });
        }
    });
    (addr, count)
}

/// Sends `head` then `body` from a raw socket; returns the response text (until close).
async fn raw_exchange(vs: std::net::SocketAddr, head: &str, body: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(vs).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let _ = s.write_all(body).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_max_body_size_get_413_before_any_member() {
    let (member, answered) = body_reader().await;
    let vs = free_addr();
    let f = start(&http_config(vs, member, "max_body_size = \"1KiB\"")).await;
    let big = vec![b'x'; 2000];
    let r = raw_exchange(
        vs,
        "POST /up HTTP/1.1\r\nHost: vs\r\nContent-Length: 2000\r\n\r\n",
        &big,
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
    assert_eq!(answered.load(std::sync::atomic::Ordering::Relaxed), 0);
    // Chunked: counted as it is relayed, refused once past the limit.
    let mut chunked = Vec::new();
    for _ in 0..4 {
        chunked.extend_from_slice(b"1f4\r\n");
        chunked.extend_from_slice(&[b'y'; 500]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let r = raw_exchange(
        vs,
        "POST /up HTTP/1.1\r\nHost: vs\r\nTransfer-Encoding: chunked\r\n\r\n",
        &chunked,
    )
    .await;
    assert!(r.contains("413"), "{r}");
    // Within the limit: served.
    let r = fulcrum_testkit::http_request(vs, "POST", "/up", &[], &[b'z'; 1000])
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // HTTP/2: by content-length, before any member.
    let status = fulcrum_testkit::h2abuse::h2c_status(
        vs,
        "POST",
        "/up",
        &[("content-length", "2000")],
        &big,
    )
    .await
    .unwrap();
    assert_eq!(status, 413);
    assert_eq!(answered.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(
        metric(&f, "fulcrum_http_bodies_too_large_total{vs=\"web\"}").await,
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_is_cut_at_min_body_rate() {
    let (member, _) = body_reader().await;
    let vs = free_addr();
    // Default min_body_rate (64 B/s) after header_timeout (1 s) of grace; idle_timeout 60 s.
    let f = start(&http_config(vs, member, "header_timeout = \"1s\"")).await;
    let mut s = tokio::net::TcpStream::connect(vs).await.unwrap();
    s.write_all(b"POST /up HTTP/1.1\r\nHost: vs\r\nContent-Length: 100000\r\n\r\n")
        .await
        .unwrap();
    // One byte every 300 ms (3 B/s): slowloris on the body. Bounded: 30 bytes, 9 s.
    let started = Instant::now();
    for _ in 0..30 {
        if s.write_all(b"x").await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text:?}");
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(
        metric(&f, "fulcrum_http_slow_bodies_total{vs=\"web\"}").await,
        1.0
    );
}

/// A member answering every request with a 4 MiB body, counting the connections it has open
/// (a connection counts until Fulcrum closes it).
async fn big_body_member() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let open = std::sync::Arc::new(AtomicUsize::new(0));
    let o = open.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let o = o.clone();
            o.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let body = vec![b'b'; 4 << 20];
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                'conn: while let Ok(n) = s.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_string();
                        buf.drain(..end + 4);
                        let is_head = head.starts_with("HEAD ");
                        let resp =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                        if s.write_all(resp.as_bytes()).await.is_err() {
                            break 'conn;
                        }
                        if !is_head && s.write_all(&body).await.is_err() {
                            break 'conn;
                        }
                    }
                }
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, open)
}

/// A client holding its HTTP/2 window at zero is never polled for more of its response body,
/// so the body's own idle timer never runs: without the progress watchdog, the member
/// connection stays taken for as long as the client keeps its connection busy (here with a
/// HEAD every 300 ms). With `max_connections = 1` on the member, everyone else gets 503 all
/// that time. The watchdog drops the body after `idle_timeout` without progress, the member
/// connection is closed, and others are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_window_holder_loses_its_member_connection_at_the_idle_timeout() {
    use std::sync::atomic::Ordering;
    let (member, open) = big_body_member().await;
    let vs = free_addr();
    let f = start(&format!(
        "[[virtual_service]]\nname = \"web\"\nlisten = \"{vs}\"\nprotocol = \"http\"\npool = \"p\"\n\
         idle_timeout = \"1s\"\n\n\
         [[pool]]\nname = \"p\"\nmonitors = []\nretries = 0\n\
         [[pool.member]]\naddress = \"{member}\"\nmax_connections = 1\n"
    ))
    .await;
    let holder = tokio::spawn(fulcrum_testkit::h2abuse::zero_window_holder(
        vs,
        "/big",
        Duration::from_secs(12),
        Some(Duration::from_millis(300)),
    ));
    // The holder has the member's only connection.
    let deadline = Instant::now() + Duration::from_secs(5);
    while open.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        open.load(Ordering::SeqCst),
        1,
        "the holder never got a response"
    );
    let held_at = Instant::now();
    let r = fulcrum_testkit::http_get(vs, "/other").await.unwrap();
    assert_eq!(r.status, 503, "the member's only connection is held");
    // Released within idle_timeout (1 s) plus the sweep interval, well before the 12 s hold.
    let deadline = held_at + Duration::from_secs(6);
    while open.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let released = held_at.elapsed();
    assert_eq!(
        open.load(Ordering::SeqCst),
        0,
        "the member connection is still held after {released:?}"
    );
    eprintln!("member connection released {released:?} after the holder took it");
    // Others are served (a member connection of their own, the body read whole).
    let r = fulcrum_testkit::http_get(vs, "/other").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        metric(&f, "fulcrum_http_h2_stalled_streams_total{vs=\"web\"}").await,
        1.0
    );
    // The holder's connection is told to go away and closed.
    let run = holder.await.unwrap().unwrap();
    eprintln!("holder: {run:?}");
    assert_eq!(run.status, 200);
    assert!(
        run.released_after
            .is_some_and(|d| d < Duration::from_secs(10)),
        "{run:?}"
    );
}

/// Request bodies without content-length (HTTP/2 DATA, HTTP/1 chunked) are held to
/// `max_body_size` and `min_body_rate` like bodies that declare their length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_without_a_length_are_held_to_the_size_and_rate_limits() {
    use fulcrum_testkit::h2abuse::h2c_upload;
    let (member, answered) = body_reader().await;
    let vs = free_addr();
    let f = start(&http_config(
        vs,
        member,
        "max_body_size = \"1KiB\"\nheader_timeout = \"1s\"\nmin_body_rate = \"64B\"",
    ))
    .await;
    // HTTP/2, no content-length, 2000 bytes in 4 pieces: 413.
    let status = h2c_upload(vs, "/up", 500, 4, Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(status, 413);
    // Within the limit: served.
    let status = h2c_upload(vs, "/up", 200, 4, Duration::from_millis(20))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(answered.load(std::sync::atomic::Ordering::Relaxed), 1);
    // HTTP/2, 1 byte every 300 ms (3 B/s against 64 B/s after 1 s of grace): 408, long
    // before the 30 pieces (9 s) are sent.
    let started = Instant::now();
    let status = h2c_upload(vs, "/up", 1, 30, Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(status, 408);
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    // HTTP/1 chunked, one 1-byte chunk every 300 ms: 408 too.
    let mut s = tokio::net::TcpStream::connect(vs).await.unwrap();
    s.write_all(b"POST /up HTTP/1.1\r\nHost: vs\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    for _ in 0..30 {
        if s.write_all(b"1\r\nx\r\n").await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        metric(&f, "fulcrum_http_bodies_too_large_total{vs=\"web\"}").await,
        1.0
    );
    assert_eq!(
        metric(&f, "fulcrum_http_slow_bodies_total{vs=\"web\"}").await,
        2.0
    );
}

//! Each kind against good and bad servers on 127.0.0.1.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fulcrum_balance::AgentState;
use fulcrum_config::{Monitor, MonitorKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::testutil::{https_server, monitor, read_head, refused_addr, write_slowly, Server};

async fn run(m: &Monitor, addr: SocketAddr) -> Verdict {
    Check::new(m)
        .run(&Probe::new(addr, m.port, m.timeout))
        .await
}

#[track_caller]
fn passed(v: &Verdict, detail: &str) {
    match v {
        Verdict::Health {
            ok: true,
            detail: d,
        } if d.contains(detail) => {}
        other => panic!("expected a pass with {detail:?}, got {other:?}"),
    }
}

#[track_caller]
fn failed(v: &Verdict, detail: &str) {
    match v {
        Verdict::Health {
            ok: false,
            detail: d,
        } if d.contains(detail) => {}
        other => panic!("expected a failure with {detail:?}, got {other:?}"),
    }
}

fn http(kind: MonitorKind) -> Monitor {
    monitor("web", kind)
}

fn body(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[tokio::test]
async fn tcp_connects_or_reports_refusal() {
    let server = Server::accept_only().await;
    passed(
        &run(&monitor("t", MonitorKind::Tcp), server.addr).await,
        "connected",
    );
    failed(
        &run(&monitor("t", MonitorKind::Tcp), refused_addr()).await,
        "connect: connection refused",
    );
}

#[tokio::test]
async fn monitor_port_overrides_the_members() {
    let server = Server::accept_only().await;
    let mut m = monitor("t", MonitorKind::Tcp);
    m.port = Some(server.addr.port());
    passed(&run(&m, refused_addr()).await, "connected");
}

#[tokio::test]
async fn http_status_decides() {
    let ok = Server::http(|| body("200 OK", "fine")).await;
    let redirect = Server::http(|| body("302 Found", "")).await;
    let broken = Server::http(|| body("503 Service Unavailable", "busy")).await;
    let missing = Server::http(|| body("404 Not Found", "")).await;
    let m = http(MonitorKind::Http);
    passed(&run(&m, ok.addr).await, "HTTP 200");
    passed(&run(&m, redirect.addr).await, "HTTP 302");
    failed(&run(&m, broken.addr).await, "HTTP 503");
    failed(&run(&m, missing.addr).await, "HTTP 404");
    failed(
        &run(&m, refused_addr()).await,
        "connect: connection refused",
    );

    let mut only_404 = http(MonitorKind::Http);
    only_404.expect_status = vec![404];
    passed(&run(&only_404, missing.addr).await, "HTTP 404");
    failed(&run(&only_404, ok.addr).await, "HTTP 200");
}

#[tokio::test]
async fn http_sends_a_well_formed_request() {
    let seen: Arc<Mutex<Vec<u8>>> = Arc::default();
    let log = seen.clone();
    let server = Server::start(move |mut s| {
        let log = log.clone();
        async move {
            *log.lock().unwrap() = read_head(&mut s).await;
            let _ = s.write_all(&body("200 OK", "")).await;
        }
    })
    .await;
    let mut m = http(MonitorKind::Http);
    m.path = "/health?full=1".into();
    m.method = "HEAD".into();
    passed(&run(&m, server.addr).await, "HTTP 200");
    let request = String::from_utf8(seen.lock().unwrap().clone()).unwrap();
    assert_eq!(
        request,
        format!(
            "HEAD /health?full=1 HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nUser-Agent: fulcrum-health\r\n\r\n",
            server.addr
        )
    );
}

#[tokio::test]
async fn http_body_must_contain_the_text() {
    let mut m = http(MonitorKind::Http);
    m.expect_body = Some("ALIVE".into());

    let good = Server::http(|| body("200 OK", "status: ALIVE\n")).await;
    passed(&run(&m, good.addr).await, "HTTP 200");
    let bad = Server::http(|| body("200 OK", "status: dead\n")).await;
    failed(&run(&m, bad.addr).await, "HTTP 200, body lacks \"ALIVE\"");
    // The status is judged before the body.
    let error = Server::http(|| body("500 Internal Server Error", "ALIVE")).await;
    failed(&run(&m, error.addr).await, "HTTP 500");
    // HEAD responses have no body whatever Content-Length says.
    let mut head = m.clone();
    head.method = "HEAD".into();
    let head_server =
        Server::http(|| b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n".to_vec()).await;
    failed(&run(&head, head_server.addr).await, "body lacks");
}

#[tokio::test]
async fn http_body_framings() {
    let mut m = http(MonitorKind::Http);
    m.expect_body = Some("ALIVE".into());

    // Chunked, the text split across chunks and writes; the server keeps the connection open,
    // so only the decoder can tell the body is complete.
    let chunked = |text: &'static [u8]| {
        Server::start(move |mut s| async move {
            read_head(&mut s).await;
            write_slowly(
                &mut s,
                &[
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n",
                    &text[..3],
                    b"\r\n",
                    format!("{:x}\r\n", text.len() - 3).as_bytes(),
                    &text[3..],
                    b"\r\n0\r\n\r\n",
                ],
            )
            .await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        })
    };
    let good = chunked(b"xxALIVExx").await;
    passed(&run(&m, good.addr).await, "HTTP 200");
    let bad = chunked(b"xxDEADxx").await;
    failed(&run(&m, bad.addr).await, "body lacks \"ALIVE\"");

    // Content-Length with the connection left open: the length ends the body.
    let open = Server::start(|mut s| async move {
        read_head(&mut s).await;
        let _ = s.write_all(&body("200 OK", "nope")).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    failed(&run(&m, open.addr).await, "body lacks \"ALIVE\"");

    // No length: the body runs to the close.
    let to_close = |text: &'static [u8]| {
        Server::start(move |mut s| async move {
            read_head(&mut s).await;
            write_slowly(&mut s, &[b"HTTP/1.0 200 OK\r\n\r\nstatus: ", text, b"\n"]).await;
        })
    };
    let good = to_close(b"ALIVE").await;
    passed(&run(&m, good.addr).await, "HTTP 200");
    let bad = to_close(b"DEAD").await;
    failed(&run(&m, bad.addr).await, "body lacks \"ALIVE\"");

    // Interim responses are skipped.
    let interim = Server::http(|| {
        [
            &b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"[..],
            &body("200 OK", "ALIVE"),
        ]
        .concat()
    })
    .await;
    passed(&run(&m, interim.addr).await, "HTTP 200");
}

#[tokio::test]
async fn http_size_limit_and_broken_responses() {
    let mut m = http(MonitorKind::Http);
    m.expect_body = Some("ALIVE".into());
    let huge = Server::http(|| {
        let mut r = b"HTTP/1.0 200 OK\r\n\r\n".to_vec();
        r.extend(std::iter::repeat_n(b'x', 200 * 1024));
        r.extend_from_slice(b"ALIVE");
        r
    })
    .await;
    failed(&run(&m, huge.addr).await, "not in the first 64 KiB");

    let m = http(MonitorKind::Http);
    let huge_head = Server::http(|| {
        let mut r = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        r.extend(std::iter::repeat_n(b'x', 100 * 1024));
        r
    })
    .await;
    failed(&run(&m, huge_head.addr).await, "larger than 64 KiB");

    let garbage = Server::http(|| b"SSH-2.0-OpenSSH_9.2\r\n\r\n".to_vec()).await;
    failed(&run(&m, garbage.addr).await, "bad response");

    let closes = Server::start(|mut s| async move {
        read_head(&mut s).await;
    })
    .await;
    failed(
        &run(&m, closes.addr).await,
        "connection closed without a response",
    );

    let cut = Server::http(|| b"HTTP/1.1 200 OK\r\nContent-".to_vec()).await;
    failed(&run(&m, cut.addr).await, "connection closed mid-response");

    let silent = Server::start(|mut s| async move {
        read_head(&mut s).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    failed(
        &run(&m, silent.addr).await,
        "timeout after 200ms waiting for the response",
    );

    let mut invalid = http(MonitorKind::Http);
    invalid.path = "/a b".into();
    failed(&run(&invalid, silent.addr).await, "invalid path");
}

#[tokio::test]
async fn https_over_a_self_signed_certificate() {
    let (good, sni) = https_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK").await;
    let mut m = http(MonitorKind::Https);
    m.timeout = Duration::from_secs(1);
    m.expect_body = Some("OK".into());
    passed(&run(&m, good.addr).await, "HTTP 200");
    m.host = Some("localhost:8443".into());
    passed(&run(&m, good.addr).await, "HTTP 200");
    assert_eq!(
        *sni.lock().unwrap(),
        [None, Some("localhost".to_string())],
        "SNI only for a DNS name"
    );

    let (bad, _) = https_server(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n").await;
    failed(&run(&m, bad.addr).await, "HTTP 500");

    // A member answering plain HTTP on the https port fails the handshake.
    let plain = Server::start(|mut s| async move {
        let _ = s.write_all(&body("200 OK", "OK")).await;
    })
    .await;
    failed(&run(&m, plain.addr).await, "TLS handshake: ");
    failed(
        &run(&m, refused_addr()).await,
        "connect: connection refused",
    );
}

fn ping() -> Monitor {
    let mut m = monitor("ping", MonitorKind::SendExpect);
    m.send = Some("PING\r\n".into());
    m.expect = Some("PONG".into());
    m
}

/// Replies `reply` once it has received `PING\r\n`.
async fn ping_server(reply: &'static [&'static [u8]]) -> Server {
    Server::start(move |mut s| async move {
        let mut got = [0u8; 6];
        if s.read_exact(&mut got).await.is_err() || &got != b"PING\r\n" {
            return;
        }
        write_slowly(&mut s, reply).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await
}

#[tokio::test]
async fn send_expect_matches_the_reply() {
    let good = ping_server(&[b"+PO", b"NG\r\n"]).await;
    passed(&run(&ping(), good.addr).await, "got \"PONG\"");

    let wrong = Server::start(|mut s| async move {
        let mut got = [0u8; 6];
        let _ = s.read_exact(&mut got).await;
        let _ = s.write_all(b"ERR\r\n").await;
    })
    .await;
    failed(
        &run(&ping(), wrong.addr).await,
        r#"expected "PONG", got "ERR\r\n""#,
    );

    let slow_wrong = ping_server(&[b"ERR"]).await;
    failed(
        &run(&ping(), slow_wrong.addr).await,
        r#"timeout after 200ms: expected "PONG", got "ERR""#,
    );

    let silent = Server::start(|s| async move {
        let _open = s;
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    let silent_result = run(&ping(), silent.addr).await;
    failed(&silent_result, "timeout after 200ms");
    failed(&silent_result, "expected \"PONG\", got nothing");

    let closes = Server::start(|mut s| async move {
        let mut got = [0u8; 6];
        let _ = s.read_exact(&mut got).await;
    })
    .await;
    failed(
        &run(&ping(), closes.addr).await,
        "connection closed without a reply",
    );
    failed(
        &run(&ping(), refused_addr()).await,
        "connect: connection refused",
    );
}

fn agent() -> Monitor {
    monitor("agent", MonitorKind::Agent)
}

async fn agent_server(reply: &'static [u8]) -> Server {
    Server::start(move |mut s| async move {
        let _ = s.write_all(reply).await;
    })
    .await
}

#[tokio::test]
async fn agent_replies_are_parsed() {
    let server = agent_server(b"drain 50% # going away\nignored\n").await;
    match run(&agent(), server.addr).await {
        Verdict::Agent { reply, detail } => {
            assert_eq!(reply.state, Some(AgentState::Drain));
            assert_eq!(reply.weight_pct, Some(50));
            assert_eq!(reply.health, None);
            assert_eq!(detail, "agent: drain 50% # going away");
        }
        other => panic!("{other:?}"),
    }
    // A reply ended by the close rather than a newline counts.
    let server = agent_server(b"down").await;
    match run(&agent(), server.addr).await {
        Verdict::Agent { reply, .. } => assert_eq!(reply.health, Some(false)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn agent_sends_its_request_first() {
    let server = Server::start(|mut s| async move {
        let mut got = [0u8; 6];
        if s.read_exact(&mut got).await.is_ok() && &got == b"stat\r\n" {
            let _ = s.write_all(b"up\n").await;
        }
    })
    .await;
    let mut m = agent();
    m.send = Some("stat\r\n".into());
    match run(&m, server.addr).await {
        Verdict::Agent { reply, .. } => assert_eq!(reply.health, Some(true)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_unreachable_agent_says_nothing() {
    assert!(matches!(
        run(&agent(), refused_addr()).await,
        Verdict::Nothing { .. }
    ));
    let silent = Server::start(|s| async move {
        let _open = s;
        tokio::time::sleep(Duration::from_secs(5)).await;
    })
    .await;
    match run(&agent(), silent.addr).await {
        Verdict::Nothing { why } => assert!(why.contains("timeout after 200ms"), "{why}"),
        other => panic!("{other:?}"),
    }
}

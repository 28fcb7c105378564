use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{Alpn, ConnInfo};
use crate::testing::{member, service, service_to};

/// Sends `requests` (the last asks for the close) to the HTTP/1 adapter over an in-memory
/// stream; returns all the adapter wrote back.
async fn exchange(svc: std::sync::Arc<crate::HttpService>, requests: &[u8]) -> String {
    let (mut client, server) = tokio::io::duplex(256 * 1024);
    let info = ConnInfo {
        peer: "127.0.0.9:5000".parse().expect("address"),
        local: "127.0.0.1:80".parse().expect("address"),
        alpn: Alpn::Http1,
        sni: None,
    };
    let conn = tokio::spawn(crate::serve_connection(svc, server, info));
    client.write_all(requests).await.expect("requests written");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut out))
        .await
        .expect("the adapter closes after the last request")
        .expect("read");
    conn.await.expect("the connection task ends");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_over_one_member_connection() {
    let (addr, seen, conns) = member("hello").await;
    let svc = service_to(&[addr], "", "", "");
    let out = exchange(
        svc,
        b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b?q=1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    let answers: Vec<&str> = out.split("HTTP/1.1 200 OK\r\n").skip(1).collect();
    assert_eq!(answers.len(), 2, "{out}");
    assert!(
        answers.iter().all(|a| a.ends_with("\r\n\r\nhello")),
        "{out}"
    );
    assert!(!answers[0].contains("connection: close"), "{out}");
    assert!(answers[1].contains("connection: close"), "{out}");
    let seen = seen.lock();
    assert!(seen[0].starts_with("GET /a HTTP/1.1\r\n"), "{seen:?}");
    assert!(seen[1].starts_with("GET /b?q=1 HTTP/1.1\r\n"), "{seen:?}");
    for head in seen.iter() {
        assert!(head.contains("host: x\r\n"), "{head}");
        assert!(head.contains("x-forwarded-for: 127.0.0.9\r\n"), "{head}");
        assert!(!head.contains("connection: close"), "hop-by-hop: {head}");
    }
    assert_eq!(*conns.lock(), 1, "the member connection was reused");
}

#[tokio::test]
async fn a_request_body_goes_to_the_member_and_the_connection_goes_on() {
    let (addr, seen, _) = member("ok").await;
    let svc = service_to(&[addr], "", "", "");
    let out = exchange(
        svc,
        b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhelloGET /after HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
    let seen = seen.lock();
    assert!(seen[0].starts_with("POST /up HTTP/1.1\r\n"), "{seen:?}");
    assert!(seen[0].contains("content-length: 5\r\n"), "{seen:?}");
    assert!(seen[0].ends_with("\r\n\r\nhello"), "{seen:?}");
    assert!(
        seen[1].starts_with("GET /after HTTP/1.1\r\n"),
        "the bytes after the body are the next request: {seen:?}"
    );
}

#[tokio::test]
async fn without_a_member_the_client_gets_502_and_keeps_its_connection() {
    // Members nobody listens on: every connect is refused at once.
    let svc = service(2, "", "");
    let out = exchange(
        svc.clone(),
        b"GET / HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(out.matches("HTTP/1.1 502 ").count(), 2, "{out}");
}

#[tokio::test]
async fn a_bad_request_is_answered_and_the_connection_closed() {
    let svc = service(1, "", "");
    // Two Content-Length values: ambiguous framing (RFC 9112 §6.3), never forwarded.
    let out = exchange(
        svc,
        b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400 "), "{out}");
    assert!(out.contains("connection: close\r\n"), "{out}");
    let big = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(70_000)
    );
    let out = exchange(service(1, "", ""), big.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
}

//! Request smuggling and malformed requests: every ambiguous message is answered 400 (or the
//! status RFC 9112 gives) and the connection closed, and the member never sees a byte of it.

mod http_common;

use std::time::Duration;

use http_common::*;

async fn setup() -> (RawBackend, std::net::SocketAddr, Fulcrum) {
    let member = RawBackend::start(
        free_addr(),
        RawBehaviour::Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n".to_vec()),
    )
    .await
    .unwrap();
    let vs = free_addr();
    let f = start(&format!(
        "{}{}",
        service(vs, ""),
        pool("p", &[member.addr], "")
    ))
    .await;
    (member, vs, f)
}

/// Sends `request`, expects `status` and a closed connection.
async fn refused(vs: std::net::SocketAddr, request: &[u8], status: u16) {
    let (bytes, closed) = raw(vs, request, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(
        status_of(&bytes),
        status,
        "request {:?} got {text:?}",
        String::from_utf8_lossy(request)
    );
    assert!(
        closed,
        "the connection stays open after {:?}",
        String::from_utf8_lossy(request)
    );
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_framing_is_refused_and_never_forwarded() {
    let (member, vs, f) = setup().await;
    let cases: &[(&[u8], u16)] = &[
        // Content-Length and Transfer-Encoding together (CL.TE / TE.CL).
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n", 400),
        // Repeated or non-numeric Content-Length.
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3a\r\n\r\nabc", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2\r\n\r\n", 400),
        // Transfer-Encoding other than a final chunked.
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\nabc", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunkedx\r\n\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \x0bchunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        // obs-fold, bare CR, invalid field names, control bytes.
        (b"GET / HTTP/1.1\r\nHost: a\r\nX-Folded: 1\r\n 2\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\n Transfer-Encoding: chunked\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\rX-B: 2\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX A: 1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX-A\x7f: 1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\n: empty\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX-Nul: a\x00b\r\n\r\n", 400),
        // Host: missing in HTTP/1.1, repeated, invalid; userinfo in an absolute target.
        (b"GET / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
        (b"GET http://user@evil/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        // Request line.
        (b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET relative HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"G\x01T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
        (b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505),
        (b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 405),
        // Chunked framing that arrives with the head.
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;x\nz\r\nabc\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n 3\r\nabc\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n", 400),
    ];
    for (request, status) in cases {
        refused(vs, request, *status).await;
    }
    assert!(
        member.received().iter().all(|c| c.is_empty()),
        "the member received {:?}",
        member
            .received()
            .iter()
            .map(|c| String::from_utf8_lossy(c).to_string())
            .collect::<Vec<_>>()
    );
    let metrics = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        metrics.contains(&format!(
            "fulcrum_http_bad_requests_total{{vs=\"web\"}} {}",
            cases.len()
        )),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smuggled_request_never_reaches_the_member() {
    // This member answers only once the whole chunked body has arrived: Fulcrum stops sending
    // a body when the member answers early, and this test is about how the body is reframed.
    let member = RawBackend::start(
        free_addr(),
        RawBehaviour::ReplyOn {
            marker: b"0\r\n\r\n".to_vec(),
            reply: b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n".to_vec(),
        },
    )
    .await
    .unwrap();
    let vs = free_addr();
    let _f = start(&format!(
        "{}{}",
        service(vs, ""),
        pool("p", &[member.addr], "")
    ))
    .await;
    // The classic CL.TE probe: a front end using Content-Length would forward "0\r\n\r\nGET
    // /admin..." as the body; one using Transfer-Encoding would see a second request.
    let probe =
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n\
                  0\r\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n";
    refused(vs, probe, 400).await;
    // Valid messages around it go through unchanged and reframed.
    let (bytes, _) = raw(
        vs,
        b"POST /ok HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3;ext=1\r\nabc\r\n0\r\nTrailer: x\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(status_of(&bytes), 200);
    let all = member
        .received()
        .iter()
        .map(|c| String::from_utf8_lossy(c).to_string())
        .collect::<Vec<_>>()
        .join("");
    assert!(!all.contains("/admin"), "{all}");
    assert!(all.contains("POST /ok HTTP/1.1\r\n"), "{all}");
    assert!(
        all.ends_with("\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
        "reframed without extensions or trailers: {all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_chunked_framing_mid_body_is_answered_400() {
    // A member that waits for the whole body (and so never answers this one).
    let member = RawBackend::start(free_addr(), RawBehaviour::Silent)
        .await
        .unwrap();
    let vs = free_addr();
    let _f = start(&format!(
        "{}{}",
        service(vs, ""),
        pool("p", &[member.addr], "")
    ))
    .await;
    let mut s = tokio::net::TcpStream::connect(vs).await.unwrap();
    use tokio::io::AsyncWriteExt;
    s.write_all(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b"zz\r\n").await.unwrap();
    let (bytes, closed) = read_until_close(&mut s, Duration::from_secs(5)).await;
    assert_eq!(
        status_of(&bytes),
        400,
        "{:?}",
        String::from_utf8_lossy(&bytes)
    );
    assert!(closed);
    // The member got a well-formed start and then its connection closed: never "zz".
    let all: Vec<u8> = member.received().concat();
    assert!(!all.windows(2).any(|w| w == b"zz"));
}

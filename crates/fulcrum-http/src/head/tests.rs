use super::*;

fn parse(raw: &[u8]) -> Result<RequestHead, HeadError> {
    let mut h = RequestHead::with_buffer(raw.to_vec());
    match h.parse(&Limits::default())? {
        Parse::Complete => Ok(h),
        Parse::Partial => Err(HeadError {
            status: 0,
            reason: "partial",
        }),
    }
}

fn status(raw: &[u8]) -> u16 {
    match parse(raw) {
        Ok(_) => 200,
        Err(e) => e.status,
    }
}

#[test]
fn parses_a_simple_request() {
    let h = parse(b"GET /a/b?x=1&y=2 HTTP/1.1\r\nHost: Example.COM:8080\r\nCookie: a=1; b=2\r\nCookie: c=3\r\n\r\nBODY").unwrap();
    assert_eq!(h.method, Method::Get);
    assert_eq!(h.path(), b"/a/b");
    assert_eq!(h.query(), Some(&b"x=1&y=2"[..]));
    assert_eq!(h.host_name(), Some(&b"Example.COM"[..]));
    assert_eq!(h.after_head(), b"BODY");
    assert_eq!(h.cookie(b"c"), Some(&b"3"[..]));
    assert_eq!(h.cookie(b"b"), Some(&b"2"[..]));
    assert!(!h.close);
}

#[test]
fn smuggling_is_refused() {
    // Both framings.
    assert_eq!(status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
    // Repeated or odd Content-Length.
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n"),
        400
    );
    // Transfer-Encoding other than a final chunked.
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
        400
    );
    assert_eq!(status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
        200
    );
    // obs-fold, bare CR, bad names, space before the colon.
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n 2\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\rX-B: 2\r\n\r\n"),
        400
    );
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nX A: 1\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nX-A : 1\r\n\r\n"), 400);
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n"),
        400
    );
    assert_eq!(
        status(b"GET / HTTP/1.1\r\nHost: a\r\n\x00X: 1\r\n\r\n"),
        400
    );
    // Host rules.
    assert_eq!(status(b"GET / HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), 400);
    assert_eq!(status(b"GET / HTTP/1.0\r\n\r\n"), 200);
    // Targets.
    assert_eq!(status(b"GET x HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n"), 405);
    assert_eq!(status(b"GET * HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
    assert_eq!(status(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"), 200);
    assert_eq!(status(b"GET / HTTP/1.2\r\nHost: a\r\n\r\n"), 505);
}

#[test]
fn absolute_form_overrides_host() {
    let h = parse(b"GET http://b.example:81/x?y HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    assert_eq!(h.authority(), Some(&b"b.example:81"[..]));
    assert_eq!(h.path(), b"/x");
    assert!(h.host_from_target);
}

#[test]
fn limits() {
    let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(9000));
    assert_eq!(status(long.as_bytes()), 414);
    let mut h = RequestHead::with_buffer(format!("GET /{}", "a".repeat(40000)).into_bytes());
    assert_eq!(h.parse(&Limits::default()).unwrap_err().status, 414);
    let big = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n", "a".repeat(40000));
    let mut h = RequestHead::with_buffer(big.into_bytes());
    assert_eq!(h.parse(&Limits::default()).unwrap_err().status, 431);
    let many: String = (0..101).map(|i| format!("X-{i}: 1\r\n")).collect();
    assert_eq!(
        status(format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n").as_bytes()),
        431
    );
}

#[test]
fn connection_tokens() {
    let h = parse(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\nUpgrade: websocket\r\n\r\n").unwrap();
    assert!(h.close);
    assert!(h.fields.iter().any(|f| f.hop && h.name(f) == b"X-Secret"));
    assert_eq!(h.upgrade(), None, "Upgrade without the upgrade token");
    let h =
        parse(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
            .unwrap();
    assert_eq!(h.upgrade(), Some(&b"websocket"[..]));
    let h = parse(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").unwrap();
    assert!(!h.close);
    let h = parse(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    assert!(h.close);
}

#[test]
fn responses() {
    let mut r = ResponseHead {
        buf: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
        ..Default::default()
    };
    assert_eq!(r.parse().unwrap(), Parse::Complete);
    assert_eq!(r.content_length, Some(5));
    assert_eq!(r.after_head(), b"hello");
    let mut r = ResponseHead {
        buf: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n".to_vec(),
        ..Default::default()
    };
    assert_eq!(r.parse().unwrap_err().status, 502);
    let mut r = ResponseHead {
        buf: b"HTTP/1.0 200 OK\r\n\r\n".to_vec(),
        ..Default::default()
    };
    r.parse().unwrap();
    assert!(r.close && r.content_length.is_none() && !r.chunked);
}

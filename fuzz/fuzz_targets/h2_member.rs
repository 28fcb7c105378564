//! The HTTP/2 member side (`http2 = true` on a pool): Fulcrum as an HTTP/2 client of a member
//! that answers with fuzz-driven frames. An in-memory member inside the process
//! (`fulcrum_http::upstream::memory`: the member connection is a duplex stream) reads the
//! proxy's preface and requests (to learn their stream ids), sends its SETTINGS, then frames
//! built from the input: SETTINGS, response HEADERS (any status, content-length, split over
//! CONTINUATION), DATA (padded or not, END_STREAM or not), RST_STREAM, GOAWAY, WINDOW_UPDATE,
//! PING, and raw frames of any type, flags and length, on the request's stream, stream 0, or
//! another one. Requests come from HTTP/1 clients (GET, a POST with a body the member's flow
//! control must let through) and from an HTTP/2 client, with compression and the response
//! cache in front (fills from HTTP/2 member bodies). Each input gets a new pool, service and
//! member connection, so one input's connection state does not leak into the next; the cache
//! is shared (a new one costs more than all the rest of a service) and emptied after an input
//! that stored something.
#![no_main]

#[path = "common/h2_client.rs"]
mod h2_client;
#[path = "common/settle.rs"]
mod settle;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use fulcrum_http::{Alpn, ConnInfo, HttpCache, HttpService, Parts, Upstreams};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::time::{timeout, Instant};

struct World {
    rt: tokio::runtime::Runtime,
    cfg: fulcrum_config::Config,
    /// The member's frames for the next member connection (the first one of an input).
    script: Arc<Mutex<Option<Vec<u8>>>>,
    cache: Arc<HttpCache>,
    /// The cache's `stored` counter when it was last emptied.
    stored: AtomicU64,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        // Timers only, no I/O driver: nothing here is a socket, and parking the runtime (each
        // step of the paused clock) then costs no epoll_wait and no eventfd write.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            // Paused clock: the member's and the proxy's timeouts fire as soon as the runtime is
            // idle (the member's bytes are already delivered by then) instead of after real
            // milliseconds, which is most of an input's time otherwise.
            .start_paused(true)
            .build()
            .expect("runtime");
        let script = Arc::new(Mutex::new(None));
        let member = rt.block_on(async {
            // Any address: nothing listens on it, the proxy's connections to it stay in memory.
            let mut l = fulcrum_http::upstream::memory::listen(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                9,
            ));
            let member = l.addr();
            let s = script.clone();
            tokio::spawn(async move {
                while let Some(c) = l.accept().await {
                    let script = s.lock().expect("script").take().unwrap_or_default();
                    tokio::spawn(member_connection(c, script));
                }
            });
            member
        });
        let config = format!(
            r#"
[[virtual_service]]
name = "f"
listen = "127.0.0.1:1"
protocol = "http"
pool = "p"
header_timeout = "100ms"
idle_timeout = "100ms"
compression = {{ types = ["text/plain"], min_size = "1B" }}
cache = {{ size = "1MiB", max_object = "64KiB" }}
[[pool]]
name = "p"
monitors = []
retries = 1
http2 = true
connect_timeout = "100ms"
response_timeout = "100ms"
[[pool.member]]
address = "{member}"
"#
        );
        let cfg = fulcrum_config::parse(&config, "fuzz.toml", std::path::Path::new("."))
            .expect("the fuzz config is valid");
        World {
            rt,
            cfg,
            script,
            cache: HttpCache::new(1 << 20, 64 << 10),
            stored: AtomicU64::new(0),
        }
    })
}

/// One frame: 24-bit length, type, flags, stream id.
fn put_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// An HPACK field as a literal without indexing, with a new name (lengths under 127).
fn put_field(block: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    block.push(0);
    block.push(name.len() as u8);
    block.extend_from_slice(name);
    block.push(value.len() as u8);
    block.extend_from_slice(value);
}

/// The stream ids of the HEADERS frames the proxy sent so far, read from `buf` (the client
/// preface first). Keeps what it could not parse yet.
fn scan(buf: &mut Vec<u8>, streams: &mut Vec<u32>, preface_seen: &mut bool) {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    if !*preface_seen {
        if buf.len() < PREFACE.len() {
            return;
        }
        buf.drain(..PREFACE.len());
        *preface_seen = true;
    }
    while buf.len() >= 9 {
        let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
        if buf.len() < 9 + len {
            return;
        }
        let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
        if buf[3] == 1 && !streams.contains(&stream) {
            streams.push(stream);
        }
        buf.drain(..9 + len);
    }
}

/// One member connection: reads a moment (the preface, SETTINGS, the first HEADERS), sends
/// its SETTINGS and an ACK, then the frames the input describes, then lingers a moment and
/// closes. A connection after the first of an input gets an empty script.
async fn member_connection(mut c: DuplexStream, script: Vec<u8>) {
    let mut inbuf = Vec::new();
    let mut streams: Vec<u32> = Vec::new();
    let mut preface_seen = false;
    let mut chunk = vec![0u8; 16 * 1024];
    // Reads what the proxy sent within `wait`; false once the connection is over.
    macro_rules! take {
        ($wait:expr) => {
            match timeout($wait, c.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => false,
                Ok(Ok(n)) => {
                    inbuf.extend_from_slice(&chunk[..n]);
                    scan(&mut inbuf, &mut streams, &mut preface_seen);
                    true
                }
                Err(_) => true,
            }
        };
    }
    let deadline = Instant::now() + Duration::from_millis(20);
    while streams.is_empty() && Instant::now() < deadline {
        if !take!(Duration::from_millis(5)) {
            return;
        }
    }
    let mut out = Vec::new();
    put_frame(&mut out, 4, 0, 0, &[]);
    put_frame(&mut out, 4, 1, 0, &[]);
    if c.write_all(&out).await.is_err() {
        return;
    }
    let mut ops = script.into_iter();
    let mut next = move || ops.next().unwrap_or(0);
    let mut left = 64;
    loop {
        left -= 1;
        let op = next();
        if op == 0 && left < 60 || left == 0 {
            break;
        }
        let current = streams.last().copied().unwrap_or(1);
        let stream = match next() % 8 {
            0..=4 => current,
            5 => 0,
            6 => current + 2,
            _ => u32::from(next()),
        };
        let mut out = Vec::new();
        match op % 11 {
            // SETTINGS: entries of any id and value; ACK with a payload is an error.
            0 => {
                let mut p = Vec::new();
                for _ in 0..next() % 4 {
                    p.extend_from_slice(&[0, next() % 8]);
                    p.extend_from_slice(&[next(), next(), next(), next()]);
                }
                put_frame(&mut out, 4, next() & 1, 0, &p);
            }
            // Response HEADERS: status, fields, END_STREAM, sometimes without END_HEADERS
            // (a CONTINUATION op may follow).
            1 => {
                let statuses: [&[u8]; 12] = [
                    b"200", b"200", b"204", b"206", b"304", b"404", b"500", b"100", b"103", b"101",
                    b"999", b"2x0",
                ];
                let mut block = Vec::new();
                let flags = next();
                if flags & 0x40 == 0 {
                    put_field(&mut block, b":status", statuses[usize::from(next()) % 12]);
                }
                let fields = next();
                if fields & 1 != 0 {
                    let v = next();
                    let cl = if v == 255 {
                        "x".to_string()
                    } else {
                        (v % 40).to_string()
                    };
                    put_field(&mut block, b"content-length", cl.as_bytes());
                }
                if fields & 2 != 0 {
                    put_field(&mut block, b"content-type", b"text/plain");
                }
                if fields & 4 != 0 {
                    put_field(&mut block, b"cache-control", b"max-age=60");
                }
                if fields & 8 != 0 {
                    put_field(&mut block, b"connection", b"close");
                }
                if fields & 16 != 0 {
                    put_field(&mut block, b"vary", b"accept-encoding");
                }
                if fields & 32 != 0 {
                    put_field(&mut block, b"content-encoding", b"gzip");
                }
                if fields & 64 != 0 {
                    put_field(&mut block, b"Upper", b"case");
                }
                if fields & 128 != 0 {
                    // Raw HPACK bytes: indexed fields, table size updates, garbage.
                    for _ in 0..next() % 6 {
                        block.push(next());
                    }
                }
                let end_headers = if flags & 2 == 0 { 4 } else { 0 };
                put_frame(&mut out, 1, (flags & 1) | end_headers, stream, &block);
            }
            // DATA, padded or not.
            2 => {
                let flags = next() & 0x9;
                let n = usize::from(next() % 48);
                let mut p = Vec::new();
                let pad = next() % 8;
                if flags & 8 != 0 {
                    p.push(pad);
                }
                p.extend((0..n).map(|i| b'a' + (i % 26) as u8));
                if flags & 8 != 0 {
                    p.extend(std::iter::repeat(0).take(usize::from(pad)));
                }
                put_frame(&mut out, 0, flags, stream, &p);
            }
            3 => put_frame(&mut out, 3, 0, stream, &[0, 0, 0, next() % 14]),
            4 => {
                let mut p = stream.to_be_bytes().to_vec();
                p.extend_from_slice(&[0, 0, 0, next() % 14]);
                put_frame(&mut out, 7, 0, 0, &p);
            }
            5 => {
                let inc = [next() & 0x7f, next(), next(), next()];
                put_frame(&mut out, 8, 0, stream, &inc);
            }
            6 => put_frame(&mut out, 6, next() & 1, 0, &[next(); 8]),
            // CONTINUATION with one field.
            7 => {
                let mut block = Vec::new();
                put_field(&mut block, b"x-more", &[b'a' + next() % 26]);
                put_frame(&mut out, 9, next() & 4, stream, &block);
            }
            // A raw frame: any type, flags and payload.
            8 => {
                let (kind, flags) = (next(), next());
                let p: Vec<u8> = (0..next() % 24).map(|_| next()).collect();
                put_frame(&mut out, kind, flags, stream, &p);
            }
            // A frame header that lies about its length, then whatever follows.
            9 => {
                out.extend_from_slice(&[0, next(), next(), next() % 10, next()]);
                out.extend_from_slice(&stream.to_be_bytes());
            }
            // Wait for the proxy: more requests (a retry, the HTTP/1 client's second request),
            // its window updates and ACKs.
            _ => {
                if !take!(Duration::from_millis(u64::from(next() % 8))) {
                    return;
                }
                continue;
            }
        }
        if c.write_all(&out).await.is_err() {
            return;
        }
    }
    // Linger: the proxy reads what was sent before the connection goes.
    let until = Instant::now() + Duration::from_millis(50);
    while Instant::now() < until {
        if !take!(Duration::from_millis(10)) {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, script)) = data.split_first() else {
        return;
    };
    let w = world();
    *w.script.lock().expect("script") = Some(script.to_vec());
    let request: Vec<u8> = match sel % 4 {
        // Cacheable: the cache fills from the member's response, then serves it (stored).
        0 => b"GET /c HTTP/1.1\r\nHost: f\r\n\r\nGET /c HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n"
            .to_vec(),
        1 => b"HEAD /h HTTP/1.1\r\nHost: f\r\nConnection: close\r\n\r\n".to_vec(),
        2 => {
            let mut r = b"POST /p HTTP/1.1\r\nHost: f\r\nAccept-Encoding: gzip\r\nConnection: close\r\nContent-Length: 70000\r\n\r\n".to_vec();
            // Past the default 65,535-byte stream window: the member's WINDOW_UPDATE and
            // SETTINGS decide whether the body gets through.
            r.extend(std::iter::repeat(b'b').take(70_000));
            r
        }
        _ => h2_client::h2_request(),
    };
    w.rt.block_on(async {
        let before = settle::alive();
        // Built inside the runtime: the service may spawn.
        let pool = Arc::new(fulcrum_balance::Pool::new(&w.cfg.pools[0], &[], None));
        let upstreams = Upstreams::new();
        let svc = Arc::new(
            HttpService::build(
                &w.cfg.virtual_services[0],
                Parts {
                    config: &w.cfg,
                    pools: &[pool],
                    upstreams: &upstreams,
                    table: None,
                    stats: Default::default(),
                    http_stats: Default::default(),
                    tracker: Default::default(),
                    no_member_hook: None,
                    cache: Some(w.cache.clone()),
                    snat: None,
                    transparent: None,
                },
            )
            .expect("the fuzz service builds"),
        );
        let (mut client, server) = tokio::io::duplex(128 * 1024);
        let info = ConnInfo {
            peer: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 5000),
            local: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 80),
            alpn: Alpn::Unknown,
            sni: None,
        };
        let handler = tokio::spawn(fulcrum_http::serve_connection(svc.clone(), server, info));
        let h2 = sel % 4 == 3;
        let write = client.write_all(&request);
        let _ = timeout(Duration::from_millis(500), write).await;
        let _ = timeout(
            Duration::from_millis(500),
            h2_client::read_response(&mut client, h2),
        )
        .await;
        drop(client);
        let _ = timeout(Duration::from_secs(2), handler).await;
        // The input's pool, service and member connection go with it: the HTTP/2 connection
        // task, the member's end, the sweeper of `upstreams` end before the next input.
        drop((svc, upstreams));
        settle::settle(before).await;
    });
    // A script no member connection took would be freed by the next input.
    w.script.lock().expect("script").take();
    let stored = w.cache.stats.stored.load(Ordering::Relaxed);
    if w.stored.swap(stored, Ordering::Relaxed) != stored {
        w.cache.purge(|_, _| true);
        // moka frees what `purge` removed in its housekeeping, not at once: run it now
        // (`usage` does), so the entry goes within the input that stored it. Otherwise the
        // input ends with more mallocs than frees, and libFuzzer re-runs it and then scans the
        // whole heap for a leak; after 1,000 such scans it stops checking inputs for leaks.
        w.cache.usage();
    }
});

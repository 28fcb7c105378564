//! Helpers for the HTTP black-box tests: members, configs, a raw HTTP/1.1 client, curl.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;
use std::time::Duration;

pub use fulcrum_testkit::{
    free_addr, http_request, wait_until, Blackhole, Fulcrum, HttpBackend, HttpResponse, RawBackend,
    RawBehaviour,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

pub async fn start(config: &str) -> Fulcrum {
    match Fulcrum::start(BIN, free_addr(), config).await {
        Ok(f) => f,
        Err(e) => panic!("{e}"),
    }
}

/// `n` HTTP backends named m0, m1, …
pub async fn backends(n: usize) -> Vec<HttpBackend> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(
            HttpBackend::start(free_addr(), &format!("m{i}"))
                .await
                .unwrap(),
        );
    }
    v
}

/// An http virtual service `web` on `vs` with default pool `p` and extra keys/rules.
pub fn service(vs: SocketAddr, extra: &str) -> String {
    format!(
        "[[virtual_service]]\nname = \"web\"\nlisten = [\"{vs}\"]\nprotocol = \"http\"\npool = \"p\"\n{extra}\n"
    )
}

/// A pool named `name` over `addrs`, with extra keys.
pub fn pool(name: &str, addrs: &[SocketAddr], extra: &str) -> String {
    let mut s = format!("[[pool]]\nname = \"{name}\"\n{extra}\n");
    for a in addrs {
        s.push_str(&format!("[[pool.member]]\naddress = \"{a}\"\n"));
    }
    s
}

pub fn addrs(b: &[HttpBackend]) -> Vec<SocketAddr> {
    b.iter().map(|b| b.addr).collect()
}

/// One request on a new connection (hyper client: HTTP/1.1, Host = vs).
pub async fn get(vs: SocketAddr, path: &str) -> HttpResponse {
    http_request(vs, "GET", path, &[], b"")
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

pub async fn get_with(vs: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    http_request(vs, "GET", path, headers, b"")
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// Which backend answered (its name from the body's first word).
pub fn who(r: &HttpResponse) -> String {
    r.text().split_whitespace().next().unwrap_or("").to_string()
}

/// Sends raw bytes on a new connection and reads until the server closes or `wait` passes.
/// Returns what came back and whether the server closed the connection.
pub async fn raw(vs: SocketAddr, bytes: &[u8], wait: Duration) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(vs).await.unwrap();
    s.write_all(bytes).await.unwrap();
    read_until_close(&mut s, wait).await
}

pub async fn read_until_close(s: &mut TcpStream, wait: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    let end = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(end, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, false),
        }
    }
}

/// Reads one HTTP/1.1 response (head and Content-Length body) from `s`, never past its end
/// (pipelined responses that follow stay in the socket).
pub async fn read_response(s: &mut TcpStream) -> Result<(u16, String, Vec<u8>), String> {
    let work = async {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = s.read(&mut byte).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!(
                    "closed before a response: {:?}",
                    String::from_utf8_lossy(&head)
                ));
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_string();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).await.map_err(|e| e.to_string())?;
        Ok((status, head, body))
    };
    tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .map_err(|_| "no response within 10s".to_string())?
}

/// The status of the first response in raw bytes.
pub fn status_of(bytes: &[u8]) -> u16 {
    String::from_utf8_lossy(bytes)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Runs curl with `args` (plus -s); returns (exit success, stdout, stderr).
pub async fn curl(args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new("curl")
        .arg("-s")
        .arg("--max-time")
        .arg("10")
        .args(args)
        .output()
        .await
        .expect("curl is installed by scripts/test.sh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A header value from a `curl -i` style head.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// All values of a header in a head.
pub fn headers<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
        .collect()
}

/// The member object of pool `p` for `addr`.
pub async fn member(f: &Fulcrum, pool: &str, addr: SocketAddr) -> serde_json::Value {
    f.member(pool, &addr.to_string()).await
}

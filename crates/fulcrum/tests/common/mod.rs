//! Shared helpers for the black-box tests: they drive Fulcrum only through the contract
//! (config file, CLI, admin API) and real sockets on 127.0.0.0/8.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;
use std::time::Duration;

pub use fulcrum_testkit::{free_addr, wait_until, Fulcrum, TcpIdServer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};

pub const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");

pub async fn start(config: &str) -> Fulcrum {
    match Fulcrum::start(BIN, free_addr(), config).await {
        Ok(f) => f,
        Err(e) => panic!("{e}"),
    }
}

/// Starts `n` id servers named m0, m1, …
pub async fn id_servers(n: usize) -> Vec<TcpIdServer> {
    let mut v = Vec::new();
    for i in 0..n {
        // A test port taken before the bind is replaced by the test kit (`bind_tcp`).
        let server = TcpIdServer::start(free_addr(), &format!("m{i}"))
            .await
            .unwrap_or_else(|e| panic!("id server m{i}: {e}"));
        v.push(server);
    }
    v
}

/// `[[pool.member]]` tables for `servers` with `weights`.
pub fn members(servers: &[TcpIdServer], weights: &[u32]) -> String {
    servers
        .iter()
        .zip(weights)
        .map(|(s, w)| format!("[[pool.member]]\naddress = \"{}\"\nweight = {w}\n", s.addr))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Connects (optionally from a given loopback source address).
pub async fn connect_from(vs: SocketAddr, source: Option<[u8; 4]>) -> std::io::Result<TcpStream> {
    let sock = if vs.is_ipv6() {
        TcpSocket::new_v6()?
    } else {
        TcpSocket::new_v4()?
    };
    if let Some(ip) = source {
        sock.bind(SocketAddr::from((ip, 0)))?;
    }
    tokio::time::timeout(Duration::from_secs(5), sock.connect(vs))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
}

/// One client exchange through the service: connect, read the member's name, send a line and
/// check it comes back. Returns the member's name.
pub async fn exchange_from(vs: SocketAddr, source: Option<[u8; 4]>) -> Result<String, String> {
    let work = async {
        let s = connect_from(vs, source)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut r = BufReader::new(s);
        let mut name = String::new();
        r.read_line(&mut name)
            .await
            .map_err(|e| format!("read name: {e}"))?;
        if name.is_empty() {
            return Err("closed before the member's name".to_string());
        }
        let mut s = r.into_inner();
        s.write_all(b"ping\n")
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut back = [0u8; 5];
        s.read_exact(&mut back)
            .await
            .map_err(|e| format!("echo: {e}"))?;
        if &back != b"ping\n" {
            return Err(format!("bad echo {back:?}"));
        }
        Ok(name.trim().to_string())
    };
    tokio::time::timeout(Duration::from_secs(10), work)
        .await
        .map_err(|_| "exchange timed out".to_string())?
}

pub async fn exchange(vs: SocketAddr) -> Result<String, String> {
    exchange_from(vs, None).await
}

/// Counts how many of `n` sequential exchanges each member name served.
pub async fn shares(vs: SocketAddr, n: usize) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..n {
        let name = exchange(vs)
            .await
            .unwrap_or_else(|e| panic!("exchange failed: {e}"));
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

/// Runs `fulcrum check` on `config` text; returns (exit success, stdout + stderr).
pub fn check(config: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, config).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.success(),
        text.replace(&path.display().to_string(), "bad.toml"),
    )
}

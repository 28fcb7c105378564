//! Strangers on the HA segment: a host that forges VRRP adverts, and a host that floods the
//! state sync port. Two Fulcrum nodes and the stranger share one Ethernet segment (a bridge)
//! inside namespaces the tests create (198.18.0.0/24).

#[path = "common/lab.rs"]
mod lab;

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_ha::packet::Advert;
use fulcrum_testkit::netns::{Lab, Ns};
use lab::ha_node_config as node_config;
use lab::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const VIP: &str = "198.18.0.100";
const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const STRANGER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
const SYNC_KEY: &str = "a-sync-key-for-the-test-0123";

struct Segment {
    lab: Lab,
    a: Ns,
    b: Ns,
    stranger: Ns,
    _backends: (Backend, Backend),
}

fn segment_of_three(tag: &str) -> Segment {
    let mut lab = Lab::new(tag);
    let a = lab.ns("a").expect("ns a");
    let b = lab.ns("b").expect("ns b");
    let stranger = lab.ns("x").expect("ns x");
    segment(
        &mut lab,
        &[
            (&a, "198.18.0.1/24"),
            (&b, "198.18.0.2/24"),
            (&stranger, "198.18.0.10/24"),
        ],
    );
    let local = SocketAddr::from(([127, 0, 0, 1], 8080));
    let backends = (
        Backend::start(&a, local, "a"),
        Backend::start(&b, local, "b"),
    );
    Segment {
        lab,
        a,
        b,
        stranger,
        _backends: backends,
    }
}

fn expect_role(f: &NsFulcrum, role: &str, within: Duration) {
    assert!(
        wait_for(within, || f.role() == role),
        "{} is {} rather than {role}: {}\n{}",
        f.ns.name,
        f.role(),
        f.ha(),
        f.logs()
    );
}

/// Sends `count` forged priority-255 adverts for VRID 51 from inside `ns`, one every `gap`, to
/// each of `targets` (unicast, TTL 255, a valid checksum: only the source gives them away).
fn forge_adverts(
    ns: &Ns,
    targets: Vec<Ipv4Addr>,
    count: usize,
    gap: Duration,
) -> std::thread::JoinHandle<usize> {
    let path = format!("/var/run/netns/{}", ns.name);
    std::thread::spawn(move || {
        enter(&path);
        let sock = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::RAW,
            Some(socket2::Protocol::from(112)),
        )
        .expect("raw socket for protocol 112");
        sock.set_ttl_v4(255).expect("TTL 255");
        let advert = Advert {
            version: 3,
            vrid: 51,
            priority: 255,
            interval_cs: 10,
            addresses: vec![VIP.parse().expect("vip")],
        };
        let mut sent = 0;
        for _ in 0..count {
            for t in &targets {
                let bytes = advert.encode(IpAddr::V4(STRANGER), IpAddr::V4(*t));
                let to = SocketAddr::from((*t, 0));
                if sock.send_to(&bytes, &to.into()).is_ok() {
                    sent += 1;
                }
            }
            std::thread::sleep(gap);
        }
        sent
    })
}

#[test]
fn a_stranger_advertising_priority_255_does_not_unseat_unicast_peers() {
    let mut s = segment_of_three("hav");
    let fa = NsFulcrum::start(
        &mut s.lab,
        &s.a,
        BIN,
        &node_config("a", 150, "peers = [\"198.18.0.2\"]"),
    );
    let fb = NsFulcrum::start(
        &mut s.lab,
        &s.b,
        BIN,
        &node_config("b", 100, "peers = [\"198.18.0.1\"]"),
    );
    expect_role(&fa, "master", Duration::from_secs(5));
    expect_role(&fb, "backup", Duration::from_secs(5));
    assert!(holds(&s.a, VIP));

    // Three seconds of forged adverts, ten a second, at both nodes: a master that believed them
    // would step down at the first, and nobody would hold the VIP.
    let spoofer = forge_adverts(&s.stranger, vec![A, B], 30, Duration::from_millis(100));
    let mut unseated = Vec::new();
    let end = Instant::now() + Duration::from_secs(4);
    while !spoofer.is_finished() && Instant::now() < end {
        let role = fa.role();
        if role != "master" || !holds(&s.a, VIP) {
            unseated.push(role);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = spoofer.join().expect("spoofer");
    assert_eq!(sent, 60, "every forged advert left the stranger");
    assert!(
        unseated.is_empty(),
        "the forged adverts unseated the master: {unseated:?}\n{}",
        fa.ha()
    );
    expect_role(&fa, "master", Duration::from_secs(1));
    expect_role(&fb, "backup", Duration::from_secs(1));
    assert!(holds(&s.a, VIP) && !holds(&s.b, VIP));
    for f in [&fa, &fb] {
        let ha = f.ha();
        assert!(
            ha["dropped"]["not_a_peer"].as_u64().unwrap_or(0) >= 25,
            "{ha}"
        );
        // The stranger is not taken for the master anywhere.
        assert_ne!(ha["peer"]["address"], "198.18.0.10", "{ha}");
    }
    let (_, metrics) = api_raw(&s.a, "GET", "/metrics", "");
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("fulcrum_ha_adverts_dropped_total{vrid=\"51\",reason=\"not_a_peer\"}")
        })
        .unwrap_or_default();
    assert!(
        line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(25.0),
        "{line:?}"
    );
}

/// The resident memory of process `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Keeps up to `width` idle connections to `to` open from inside `ns` (opening a new one as
/// soon as the node closes one) until `stop`, for at most `limit`; returns how many it opened.
fn idle_flood(
    ns: &Ns,
    to: SocketAddr,
    width: usize,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> std::thread::JoinHandle<usize> {
    let path = format!("/var/run/netns/{}", ns.name);
    std::thread::spawn(move || {
        enter(&path);
        let end = Instant::now() + limit;
        let mut open: Vec<TcpStream> = Vec::new();
        let mut opened = 0;
        while !stop.load(Ordering::Relaxed) && Instant::now() < end {
            // A closed connection reads end of file (or a reset); a held one has nothing more
            // to say than its challenge.
            open.retain_mut(|c| {
                let mut b = [0u8; 64];
                match c.read(&mut b) {
                    Ok(0) => false,
                    Ok(_) => true,
                    Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                }
            });
            while open.len() < width {
                let Ok(c) = TcpStream::connect_timeout(&to, Duration::from_millis(500)) else {
                    break;
                };
                opened += 1;
                let _ = c.set_nonblocking(true);
                open.push(c);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        opened
    })
}

#[test]
fn a_sync_flood_is_bounded_and_the_peer_still_syncs() {
    let mut s = segment_of_three("hsf");
    let cfg = |name: &str, prio: u8, me: Ipv4Addr, peer: Ipv4Addr| {
        node_config(
            name,
            prio,
            &format!(
                "sync = {{ listen = \"{me}:7500\", peers = [\"{peer}:7500\"], key = \"{SYNC_KEY}\" }}"
            ),
        )
    };
    let fa = NsFulcrum::start(&mut s.lab, &s.a, BIN, &cfg("a", 150, A, B));
    let fb = NsFulcrum::start(&mut s.lab, &s.b, BIN, &cfg("b", 100, B, A));
    assert!(
        wait_for(Duration::from_secs(5), || fa.ha()["sync"]
            ["frames_received"]
            .as_u64()
            .unwrap_or(0)
            >= 1),
        "{}",
        fa.ha()
    );
    let pid = s.lab.pid(fa.index).expect("pid of a");
    let sync_at = SocketAddr::from((A, 7500));

    // Phase 1: 100 connections each announce the largest frame (4 MiB) and send 1 MiB of it.
    // Before, each bought a 4 MiB buffer at the header and filled a quarter: about 100 MiB.
    let before = rss_kib(pid);
    let path = format!("/var/run/netns/{}", s.stranger.name);
    let flood = std::thread::spawn(move || {
        enter(&path);
        let mut held = Vec::new();
        let chunk = vec![0u8; 64 * 1024];
        for _ in 0..100 {
            let Ok(mut c) = TcpStream::connect_timeout(&sync_at, Duration::from_millis(500)) else {
                continue;
            };
            let _ = c.set_write_timeout(Some(Duration::from_millis(500)));
            let mut ok = c.write_all(&(4u32 * 1024 * 1024).to_be_bytes()).is_ok();
            for _ in 0..16 {
                ok = ok && c.write_all(&chunk).is_ok();
            }
            let _ = ok;
            held.push(c);
        }
        held
    });
    let held = flood.join().expect("flood");
    // What the node holds now is what the flood cost it (its first-frame deadline is 5 s).
    let mut peak = rss_kib(pid);
    let settle = Instant::now() + Duration::from_millis(500);
    while Instant::now() < settle {
        peak = peak.max(rss_kib(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
    let grown_mib = peak.saturating_sub(before) / 1024;
    eprintln!("sync flood: RSS {before} KiB before, {peak} KiB at the peak (+{grown_mib} MiB)");
    assert!(
        grown_mib < 48,
        "100 unauthenticated connections grew the node by {grown_mib} MiB"
    );

    // Phase 2: the stranger keeps connections open that never send a frame, while b restarts
    // and must reconnect to a: b's connection gets in, its state reaches a.
    let stop = Arc::new(AtomicBool::new(false));
    let idle = idle_flood(
        &s.stranger,
        sync_at,
        12,
        stop.clone(),
        Duration::from_secs(25),
    );
    s.lab.kill(fb.index);
    let fb = NsFulcrum::start(&mut s.lab, &s.b, BIN, &cfg("b", 100, B, A));
    let path = "/api/v1/pools/local/members/127.0.0.1:8080/state";
    assert_eq!(api_with(&s.b, "PUT", path, r#"{"state": "drain"}"#).0, 200);
    let member = |ns: &Ns| api(ns, "GET", "/api/v1/pools/local/members/127.0.0.1:8080").1;
    let synced = wait_for(Duration::from_secs(8), || member(&s.a)["state"] == "drain");
    // The held connections reach their first-frame deadline (5 s) and are counted.
    let timed_out = wait_for(Duration::from_secs(8), || {
        fa.ha()["sync"]["first_frame_timeouts"]
            .as_u64()
            .unwrap_or(0)
            >= 1
    });
    stop.store(true, Ordering::Relaxed);
    let opened = idle.join().expect("idle flood");
    let ha = fa.ha();
    assert!(
        synced,
        "b's state did not reach a during the flood: {ha}\n{}",
        fb.logs()
    );
    assert!(timed_out, "{ha}");
    assert!(opened > 12, "the stranger opened {opened}");
    assert!(
        ha["sync"]["unauthenticated_refused"].as_u64().unwrap_or(0) >= 1,
        "{ha}"
    );
    let (_, metrics) = api_raw(&s.a, "GET", "/metrics", "");
    assert!(
        metrics.contains("fulcrum_ha_sync_unauthenticated_refused_total{vrid=\"51\"}")
            && metrics.contains("fulcrum_ha_sync_first_frame_timeouts_total{vrid=\"51\"}"),
        "{metrics}"
    );
}

//! Outbound link load balancing in network namespaces: a LAN client, Fulcrum's namespace (the
//! router), two ISP namespaces and an "internet" namespace whose servers report the source
//! address they see. Traffic stays inside the namespaces this test creates.
//!
//!   lan (198.18.100.2) — lan0 [fl] wan0 — isp0 — inet (198.19.0.10, .11; 198.19.1.10)
//!                                   wan1 — isp1 —/
//!
//! Link a: wan0 198.18.1.2 via 198.18.1.1; link b: wan1 198.18.2.2 via 198.18.2.1. The
//! Fulcrum namespace has no default route: a flow Fulcrum did not mark goes nowhere.
//!
//! Every network is dual-stack: the LAN fd00:100::/64 (client ::2), wan K fd00:K+1::/64 (the
//! ISP ::1, Fulcrum ::2), servers fd00:19::10, ::11 and fd00:19:1::10. The internet routes the
//! LAN prefix back through isp1, so a flow link b leaves un-NATed (`snat6 = "none"`) still
//! gets its answers.

mod common;
#[path = "common/lab.rs"]
mod lab;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::check;
use fulcrum_testkit::netns::{Lab, Ns};
use fulcrum_testkit::Fulcrum;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const ADMIN: &str = "127.0.0.1:9400";
const SERVER: &str = "198.19.0.10:7000";
const NEAR_SERVER: &str = "198.19.1.10:7000";
const SNAT_A: &str = "198.18.1.2";
const SNAT_B: &str = "198.18.2.2";
const SINK: &str = "198.19.0.10:7001";
/// A whoami server on a port an outbound rule names.
const RULED_SERVER: &str = "198.19.0.10:7002";
const FAR_SINK: &str = "198.19.1.10:7001";
const SERVER6: &str = "[fd00:19::10]:7000";
const SNAT6_A: &str = "fd00:1::2";
/// The LAN client's own IPv6 address: what the far side sees of a link without IPv6 NAT.
const CLIENT6: &str = "fd00:100::2";

struct Net {
    _lab: Lab,
    lan: Ns,
    fl: Ns,
    inet: Ns,
    isps: Vec<Ns>,
    stop: Arc<AtomicBool>,
}

impl Drop for Net {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A server in `ns` that answers every line with the peer's address ("198.18.1.2\n"), so a
/// client sees which SNAT address (which link) its flow left by, as often as it asks.
fn whoami(ns: &Ns, addr: &str, stop: Arc<AtomicBool>) {
    let addr: SocketAddr = addr.parse().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    ns.thread(move || {
        let listener = match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) => {
                let _ = ready_tx.send(Err(e.to_string()));
                return;
            }
        };
        listener.set_nonblocking(true).unwrap();
        let _ = ready_tx.send(Ok(()));
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, peer)) => {
                    let stop = stop.clone();
                    std::thread::spawn(move || serve(stream, peer, stop));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("whoami server thread")
        .expect("whoami server bind");
}

fn serve(stream: TcpStream, peer: SocketAddr, stop: Arc<AtomicBool>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut w = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                if writeln!(w, "{}", peer.ip()).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// A server that reads and discards, for bulk uploads.
fn sink(ns: &Ns, addr: &'static str, stop: Arc<AtomicBool>) {
    let (tx, rx) = std::sync::mpsc::channel();
    ns.thread(move || {
        let listener = TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut s, &mut std::io::sink());
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
}

/// One flow from the LAN: the address the server saw it come from.
fn ask(stream: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    stream.get_mut().write_all(b"?\n")?;
    let mut line = String::new();
    stream.read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim().to_string())
}

fn open(server: &str, timeout: Duration) -> std::io::Result<BufReader<TcpStream>> {
    let s = TcpStream::connect_timeout(&server.parse().unwrap(), timeout)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    Ok(BufReader::new(s))
}

/// `n` short flows from the LAN client: how many left by each SNAT address ("fail" for none).
fn flows(lan: &Ns, server: &'static str, n: usize) -> BTreeMap<String, usize> {
    lan.thread(move || {
        let mut seen = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        for _ in 0..n {
            if Instant::now() > deadline {
                break;
            }
            let who = open(server, Duration::from_millis(500))
                .and_then(|mut s| ask(&mut s))
                .unwrap_or_else(|_| "fail".into());
            *seen.entry(who).or_insert(0) += 1;
        }
        seen
    })
    .join()
    .unwrap()
    .unwrap()
}

fn net(tag: &str) -> Net {
    let mut lab = Lab::new(tag);
    let lan = lab.ns("lan").unwrap();
    let fl = lab.ns("fl").unwrap();
    let inet = lab.ns("inet").unwrap();
    let isps: Vec<Ns> = (0..2)
        .map(|k| lab.ns(&format!("isp{k}")).unwrap())
        .collect();
    for ns in [&lan, &fl, &inet].into_iter().chain(&isps) {
        lab::no_dad(ns);
    }
    lab.veth(&lan, "eth0", &fl, "lan0").unwrap();
    lan.addr("eth0", "198.18.100.2/24").unwrap();
    fl.addr("lan0", "198.18.100.1/24").unwrap();
    lan.route(&["default", "via", "198.18.100.1"]).unwrap();
    for key in [
        "net.ipv4.ip_forward",
        "net.ipv4.conf.all.rp_filter",
        "net.ipv4.conf.default.rp_filter",
    ] {
        let v = if key.ends_with("forward") { "1" } else { "0" };
        fl.sysctl(key, v).unwrap();
    }
    fl.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
    lan.addr("eth0", &format!("{CLIENT6}/64")).unwrap();
    fl.addr("lan0", "fd00:100::1/64").unwrap();
    lan.route(&["::/0", "via", "fd00:100::1"]).unwrap();
    for a in [
        "198.19.0.10/32",
        "198.19.0.11/32",
        "198.19.1.10/32",
        "fd00:19::10/128",
        "fd00:19::11/128",
        "fd00:19:1::10/128",
    ] {
        inet.addr("lo", a).unwrap();
    }
    for (k, isp) in (0..2u8).zip(&isps) {
        let wan = format!("wan{k}");
        lab.veth(&fl, &wan, isp, "eth0").unwrap();
        lab.veth(isp, "eth1", &inet, &format!("isp{k}")).unwrap();
        fl.addr(&wan, &format!("198.18.{}.2/24", k + 1)).unwrap();
        isp.addr("eth0", &format!("198.18.{}.1/24", k + 1)).unwrap();
        isp.addr("eth1", &format!("198.18.{}.1/24", k + 11))
            .unwrap();
        inet.addr(&format!("isp{k}"), &format!("198.18.{}.2/24", k + 11))
            .unwrap();
        isp.sysctl("net.ipv4.ip_forward", "1").unwrap();
        isp.route(&["198.19.0.0/16", "via", &format!("198.18.{}.2", k + 11)])
            .unwrap();
        inet.route(&[
            &format!("198.18.{}.0/24", k + 1),
            "via",
            &format!("198.18.{}.1", k + 11),
        ])
        .unwrap();
        fl.addr(&wan, &format!("fd00:{}::2/64", k + 1)).unwrap();
        isp.addr("eth0", &format!("fd00:{}::1/64", k + 1)).unwrap();
        isp.addr("eth1", &format!("fd00:{}::1/64", k + 11)).unwrap();
        inet.addr(&format!("isp{k}"), &format!("fd00:{}::2/64", k + 11))
            .unwrap();
        isp.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
        isp.route(&["fd00:19::/32", "via", &format!("fd00:{}::2", k + 11)])
            .unwrap();
        inet.route(&[
            &format!("fd00:{}::/64", k + 1),
            "via",
            &format!("fd00:{}::1", k + 11),
        ])
        .unwrap();
    }
    // The LAN's own IPv6 prefix is routed (no NAT) through isp1.
    isps[1]
        .route(&["fd00:100::/64", "via", "fd00:2::2"])
        .unwrap();
    inet.route(&["fd00:100::/64", "via", "fd00:12::1"]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    for s in [SERVER, NEAR_SERVER, SERVER6] {
        whoami(&inet, s, stop.clone());
    }
    sink(&inet, SINK, stop.clone());
    sink(&inet, FAR_SINK, stop.clone());
    Net {
        _lab: lab,
        lan,
        fl,
        inet,
        isps,
        stop,
    }
}

fn config(algorithm: &str, weights: [u32; 2], extra: &str) -> String {
    format!(
        r#"
[[monitor]]
name = "through"
type = "icmp"
targets = ["198.19.0.10", "198.19.0.11"]
up_when = 1
interval = "1s"
timeout = "500ms"
rise = 1
fall = 2

[[ip_table]]
name = "isp-b"
cidrs = ["198.19.1.0/24"]

[[pool]]
name = "uplinks"
kind = "link"
algorithm = "{algorithm}"
[[pool.member]]
name = "a"
interface = "wan0"
gateway = "198.18.1.1"
snat = "{SNAT_A}"
weight = {wa}
monitors = ["through"]
bandwidth = {{ up = "100Mbit", down = "100Mbit" }}
[[pool.member]]
name = "b"
interface = "wan1"
gateway = "198.18.2.1"
snat = "{SNAT_B}"
weight = {wb}
isp = "isp-b"
monitors = ["through"]
bandwidth = {{ up = "100Mbit", down = "100Mbit" }}

[[outbound]]
name = "lan"
sources = ["198.18.100.0/24"]
pool = "uplinks"
{extra}
"#,
        wa = weights[0],
        wb = weights[1],
    )
}

async fn start(net: &Net, config: &str) -> Fulcrum {
    match Fulcrum::start_in(&net.fl.name, BIN, ADMIN.parse().unwrap(), config).await {
        Ok(f) => f,
        Err(e) => panic!("{e}"),
    }
}

async fn link(f: &Fulcrum, name: &str) -> serde_json::Value {
    let v = f.get_json("/api/v1/links").await;
    v["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == name).cloned())
        .unwrap_or_default()
}

fn kernel_state(fl: &Ns) -> (usize, usize, bool) {
    let rules = fl.exec("ip", &["rule", "show"]).unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout)
        .lines()
        .filter(|l| l.contains("fwmark 0x464c"))
        .count();
    let tables = fl.exec("nft", &["list", "tables"]).unwrap();
    let tables = String::from_utf8_lossy(&tables.stdout)
        .lines()
        .filter(|l| l.contains("fulcrum_link"))
        .count();
    let route = fl
        .exec(
            "ip",
            &["route", "show", "table", &0x464c_0001u32.to_string()],
        )
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("198.18.1.1"))
        .unwrap_or(false);
    (rules, tables, route)
}

fn share(seen: &BTreeMap<String, usize>, who: &str) -> f64 {
    let total: usize = seen.values().sum();
    *seen.get(who).unwrap_or(&0) as f64 / total.max(1) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_snat_stickiness_failover_proximity_and_cleanup() {
    let net = net("link");
    let mut f = start(&net, &config("weighted_round_robin", [3, 1], "")).await;
    assert_eq!(kernel_state(&net.fl), (2, 1, true), "{}", f.logs());

    // Weights: 10,000 short flows split 3:1 within 2 percentage points, and the servers see
    // each link's SNAT address (nothing else, nothing failed).
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 10_000)
    })
    .await
    .unwrap();
    eprintln!("3:1 over 10000 flows: {seen:?}");
    assert_eq!(
        seen.values().sum::<usize>(),
        10_000,
        "the run hit its time bound"
    );
    assert_eq!(
        seen.keys().cloned().collect::<Vec<_>>(),
        vec![SNAT_A, SNAT_B],
        "{seen:?}"
    );
    let a = share(&seen, SNAT_A);
    assert!(
        (a - 0.75).abs() <= 0.02,
        "link a carried {a:.3} of the flows, want 0.75 ± 0.02"
    );

    // The API counts the flows (sampled every second) and shows the links up with probe RTTs.
    let end = Instant::now() + Duration::from_secs(5);
    let la = loop {
        let la = link(&f, "a").await;
        if la["flows_total"].as_u64() == seen.get(SNAT_A).map(|n| *n as u64) || Instant::now() > end
        {
            break la;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        la["flows_total"].as_u64(),
        seen.get(SNAT_A).map(|n| *n as u64),
        "{la}"
    );
    assert_eq!(la["health"], "up", "{la}");
    assert!(la["targets"][0]["rtt_ms"].as_f64().is_some(), "{la}");

    // Long-lived flows on both links, then a reload that gives link b every new flow: the
    // running flows keep their link (a flow never changes link).
    let long: Vec<BufReader<TcpStream>> = net
        .lan
        .thread(|| {
            (0..8)
                .map(|_| open(SERVER, Duration::from_secs(1)).unwrap())
                .collect()
        })
        .join()
        .unwrap()
        .unwrap();
    let mut long: Vec<(String, BufReader<TcpStream>)> = long
        .into_iter()
        .map(|mut s| (ask(&mut s).unwrap(), s))
        .collect();
    let on_a = long.iter().filter(|(w, _)| w == SNAT_A).count();
    assert!(on_a > 0 && on_a < long.len(), "8 flows all on one link");
    f.write_config(&config("weighted_round_robin", [0, 1], ""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        kernel_state(&net.fl),
        (2, 1, true),
        "reload duplicated state"
    );
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 50)
    })
    .await
    .unwrap();
    assert_eq!(seen.get(SNAT_B), Some(&50), "after the reload: {seen:?}");
    for (who, s) in &mut long {
        for _ in 0..3 {
            assert_eq!(&ask(s).unwrap(), who, "a running flow changed link");
        }
    }

    // Pull link a while flows run: its ISP stops forwarding. New flows leave it once the probes
    // (1 s, fall 2) take it down, and the flows on link b keep running. How fast that is (the
    // issue's "within 3 s") is measured by bench/link.sh, not asserted here: a wall-clock bound
    // in a test fails on a loaded machine (it measured 4.7 s once while a build ran beside it).
    f.write_config(&config("weighted_round_robin", [1, 1], ""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    net.isps[0].sysctl("net.ipv4.ip_forward", "0").unwrap();
    let pulled = Instant::now();
    let moved = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || {
            lan.thread(move || {
                // When the run of 20 new flows in a row that all left by link b began.
                let mut streak = 0;
                let mut began = Instant::now();
                let end = Instant::now() + Duration::from_secs(10);
                while Instant::now() < end {
                    let who = open(SERVER, Duration::from_millis(200))
                        .and_then(|mut s| ask(&mut s))
                        .unwrap_or_else(|_| "fail".into());
                    if who == SNAT_B {
                        if streak == 0 {
                            began = Instant::now();
                        }
                        streak += 1;
                        if streak == 20 {
                            return Some(began);
                        }
                    } else {
                        streak = 0;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                None
            })
            .join()
            .unwrap()
            .unwrap()
        }
    })
    .await
    .unwrap()
    .expect("new flows never settled on link b");
    let took = moved.duration_since(pulled);
    eprintln!("new flows moved off the pulled link after {took:?}");
    assert_eq!(link(&f, "a").await["health"], "down");
    for (who, s) in long.iter_mut().filter(|(w, _)| w == SNAT_B) {
        assert_eq!(&ask(s).unwrap(), who, "a flow on the healthy link broke");
    }
    net.isps[0].sysctl("net.ipv4.ip_forward", "1").unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while link(&f, "a").await["health"] != "up" {
        assert!(Instant::now() < end, "link a did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(long);

    // Proximity: destinations in link b's ip_table leave by b, the rest by the weights (all
    // on a here).
    f.write_config(&config("proximity", [1, 0], ""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let (near, far) = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || (flows(&lan, NEAR_SERVER, 50), flows(&lan, SERVER, 50))
    })
    .await
    .unwrap();
    assert_eq!(near.get(SNAT_B), Some(&50), "{near:?}");
    assert_eq!(far.get(SNAT_A), Some(&50), "{far:?}");

    // Source persistence: one client stays on one link whatever the weights say.
    f.write_config(&config(
        "weighted_round_robin",
        [1, 1],
        "persistence = \"by-source\"",
    ));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 100)
    })
    .await
    .unwrap();
    assert_eq!(seen.len(), 1, "one source, one link: {seen:?}");

    // Metrics name the links.
    let m = f.api("GET", "/metrics", None).await.unwrap().text();
    assert!(
        m.contains("fulcrum_link_up{outbound=\"lan\",link=\"a\"} 1"),
        "{m}"
    );

    // Shutdown removes every rule, route and the table.
    f.signal(libc::SIGTERM);
    assert!(f.wait_exit(Duration::from_secs(10)).await.is_some());
    assert_eq!(kernel_state(&net.fl), (0, 0, false), "{}", f.logs());
}

/// Until `deadline`, the first moment `n` new flows in a row all leave by `who`.
fn settles_on(lan: &Ns, who: &'static str, n: usize, within: Duration) -> Option<Duration> {
    settles_on_server(lan, SERVER, who, n, within)
}

/// As `settles_on`, for new flows to `server`.
fn settles_on_server(
    lan: &Ns,
    server: &'static str,
    who: &'static str,
    n: usize,
    within: Duration,
) -> Option<Duration> {
    lan.thread(move || {
        let start = Instant::now();
        let mut streak = 0;
        while start.elapsed() < within {
            let got = open(server, Duration::from_millis(300))
                .and_then(|mut s| ask(&mut s))
                .unwrap_or_else(|_| "fail".into());
            streak = if got == who { streak + 1 } else { 0 };
            if streak == n {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    })
    .join()
    .unwrap()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bandwidth_ratio_spillover_and_busy_control_follow_measured_rates() {
    let net = net("busy");
    // Link a is a 10 Mbit/s line (tbf on its egress), link b a 30 Mbit/s one.
    net.fl
        .exec(
            "tc",
            &[
                "qdisc", "add", "dev", "wan0", "root", "tbf", "rate", "10mbit", "burst", "32kbit",
                "latency", "50ms",
            ],
        )
        .unwrap();
    let shaped = |alg: &str, pool_extra: &str| {
        config(alg, [1, 1], "")
            .replace(
                &format!("algorithm = \"{alg}\""),
                &format!("algorithm = \"{alg}\"\n{pool_extra}"),
            )
            .replacen(
                "bandwidth = { up = \"100Mbit\", down = \"100Mbit\" }",
                "bandwidth = { up = \"10Mbit\", down = \"10Mbit\" }",
                1,
            )
            .replacen(
                "bandwidth = { up = \"100Mbit\", down = \"100Mbit\" }",
                "bandwidth = { up = \"30Mbit\", down = \"30Mbit\" }",
                1,
            )
    };
    let f = start(&net, &shaped("bandwidth_ratio", "")).await;
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 400)
    })
    .await
    .unwrap();
    eprintln!("bandwidth_ratio 10:30 over 400 flows: {seen:?}");
    let a = share(&seen, SNAT_A);
    assert!(
        (a - 0.25).abs() <= 0.02,
        "link a carried {a:.3}, want 0.25 ± 0.02"
    );

    // Spillover with busy = 0.5: everything on link a while it is idle ...
    f.write_config(&shaped("spillover", "busy = 0.5"));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let t = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || settles_on(&lan, SNAT_A, 20, Duration::from_secs(5))
    });
    assert!(
        t.await.unwrap().is_some(),
        "idle spillover did not use link a"
    );

    // ... an upload fills it (an existing flow, which stays on a), so it is above its busy
    // share and new flows spill to b ...
    let stop = Arc::new(AtomicBool::new(false));
    let upload = net.lan.thread({
        let stop = stop.clone();
        move || {
            let mut s =
                TcpStream::connect_timeout(&SINK.parse().unwrap(), Duration::from_secs(1)).unwrap();
            let chunk = vec![0u8; 64 * 1024];
            let end = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                if s.write_all(&chunk).is_err() {
                    break;
                }
            }
        }
    });
    let t = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || settles_on(&lan, SNAT_B, 20, Duration::from_secs(10))
    });
    let took = t.await.unwrap().expect("new flows did not spill to link b");
    eprintln!("busy: new flows spilled to b {took:?} after the upload began");
    let la = link(&f, "a").await;
    let rate = la["rate_up_bps"].as_f64().unwrap_or(0.0);
    assert!(rate > 5e6, "link a measured at {rate} bit/s: {la}");
    assert_eq!(la["slots"], 0, "{la}");

    // Weighted least traffic, same upload: a's share is its unused bandwidth (at least 5 %), so
    // nearly every new flow takes b.
    f.write_config(&shaped("weighted_least_traffic", ""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let shifted = common::wait_until(Duration::from_secs(10), || async {
        let slots = |l: serde_json::Value| l["slots"].as_u64().unwrap_or(0);
        slots(link(&f, "b").await) > 5 * slots(link(&f, "a").await)
    })
    .await;
    assert!(
        shifted,
        "least traffic did not move the slots: {}",
        link(&f, "a").await
    );
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 40)
    })
    .await
    .unwrap();
    assert!(
        seen.get(SNAT_B).is_some_and(|&n| n >= 32),
        "weighted_least_traffic with a full: {seen:?}"
    );
    f.write_config(&shaped("spillover", "busy = 0.5"));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    // ... and come back when it is idle again.
    stop.store(true, Ordering::Relaxed);
    upload.join().unwrap().unwrap();
    let t = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || settles_on(&lan, SNAT_A, 20, Duration::from_secs(10))
    });
    assert!(
        t.await.unwrap().is_some(),
        "new flows did not return to link a"
    );
    drop(f);
}

/// A resolver in `ns` at `addr` (UDP and TCP) that answers every A query with the address the
/// query came from, with TTL `ttl` (which says which resolver answered).
fn resolver(ns: &Ns, addr: &'static str, ttl: u32, stop: Arc<AtomicBool>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let tcp_stop = stop.clone();
    ns.thread(move || {
        let s = std::net::UdpSocket::bind(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let l = TcpListener::bind(addr).unwrap();
        l.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        std::thread::spawn(move || {
            while !tcp_stop.load(Ordering::Relaxed) {
                let Ok((mut c, from)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
                let mut len = [0u8; 2];
                let mut query = Vec::new();
                let read = std::io::Read::read_exact(&mut c, &mut len).and_then(|()| {
                    query.resize(usize::from(u16::from_be_bytes(len)), 0);
                    std::io::Read::read_exact(&mut c, &mut query)
                });
                if let (Ok(()), Some(out)) = (read, dns_answer(&query, from.ip(), ttl)) {
                    let mut framed = (out.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&out);
                    let _ = c.write_all(&framed);
                }
            }
        });
        let mut buf = [0u8; 512];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = s.recv_from(&mut buf) else {
                continue;
            };
            if let Some(out) = dns_answer(&buf[..n], from.ip(), ttl) {
                let _ = s.send_to(&out, from);
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
}

/// The test resolver's answer to `query`: the asker's address (an A record for an IPv4 asker,
/// AAAA for IPv6) with TTL `ttl`.
fn dns_answer(query: &[u8], from: std::net::IpAddr, ttl: u32) -> Option<Vec<u8>> {
    let n = query.len();
    if n < 12 {
        return None;
    }
    // Header: same ID, QR + RD + RA, one question, one answer; then the question as asked (up
    // to the end of its name, type and class: no EDNS OPT kept).
    let mut q_end = 12;
    while q_end < n && query[q_end] != 0 {
        q_end += usize::from(query[q_end]) + 1;
    }
    q_end += 5;
    let mut out = vec![query[0], query[1], 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0];
    out.extend_from_slice(&query[12..q_end.min(n)]);
    let rtype = if from.is_ipv4() { 1 } else { 28 };
    out.extend_from_slice(&[0xc0, 0x0c, 0, rtype, 0, 1]);
    out.extend_from_slice(&ttl.to_be_bytes());
    match from {
        std::net::IpAddr::V4(a) => {
            out.extend_from_slice(&[0, 4]);
            out.extend_from_slice(&a.octets());
        }
        std::net::IpAddr::V6(a) => {
            out.extend_from_slice(&[0, 16]);
            out.extend_from_slice(&a.octets());
        }
    }
    Some(out)
}

/// `dig` from the LAN to a resolver address that exists nowhere: (ttl, address) of the answer.
fn dig(lan: &Ns) -> (String, String) {
    dig_at(lan, "198.19.9.9").expect("dig got no answer")
}

/// `dig` from the LAN to `resolver`: (ttl, address) of the answer, `None` without one.
fn dig_at(lan: &Ns, resolver: &str) -> Option<(String, String)> {
    dig_with(lan, resolver, "+notcp")
}

/// As `dig_at`, with one more dig option (`+tcp`: the query over TCP).
fn dig_with(lan: &Ns, resolver: &str, option: &str) -> Option<(String, String)> {
    let out = lan
        .exec(
            "dig",
            &[
                "+noall",
                "+answer",
                "+tries=1",
                "+time=1",
                "+noedns",
                option,
                &format!("@{resolver}"),
                "www.example.test",
                "A",
            ],
        )
        // dig exits 9 when no answer came.
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let f: Vec<&str> = text.split_whitespace().collect();
    (f.len() >= 5).then(|| (f[1].to_string(), f[4].to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_proxy_uses_the_chosen_links_resolver_and_a_restart_replaces_what_a_killed_run_left() {
    let net = net("dns");
    let inet = net.inet.clone();
    inet.addr("lo", "198.19.0.53/32").unwrap();
    inet.addr("lo", "198.19.0.54/32").unwrap();
    resolver(&inet, "198.19.0.53:53", 53, net.stop.clone());
    resolver(&inet, "198.19.0.54:53", 54, net.stop.clone());
    let with_resolvers = |weights: [u32; 2]| {
        config(
            "weighted_round_robin",
            weights,
            "dns_proxy = \"198.18.100.1:53\"",
        )
        .replacen(
            "monitors = [\"through\"]",
            "monitors = [\"through\"]\nresolver = \"198.19.0.53\"",
            1,
        )
        .replacen(
            "isp = \"isp-b\"",
            "isp = \"isp-b\"\nresolver = \"198.19.0.54\"",
            1,
        )
    };
    let f = start(&net, &with_resolvers([1, 0])).await;
    // Every query leaves by link a to a's resolver, which sees a's SNAT address; over TCP too.
    for _ in 0..5 {
        assert_eq!(dig(&net.lan), ("53".to_string(), SNAT_A.to_string()));
    }
    for _ in 0..3 {
        assert_eq!(
            dig_with(&net.lan, "198.19.9.9", "+tcp"),
            Some(("53".to_string(), SNAT_A.to_string())),
            "a TCP query through the proxy"
        );
    }
    // The proxy serves its LAN only: the same query from the WAN side (isp0, routed to the
    // proxy's address) gets no answer, and is counted; the LAN's still does.
    net.isps[0]
        .route(&["198.18.100.0/24", "via", "198.18.1.2"])
        .unwrap();
    assert_eq!(
        dig_at(&net.isps[0], "198.18.100.1"),
        None,
        "answered the WAN"
    );
    assert_eq!(
        dig_at(&net.lan, "198.18.100.1"),
        Some(("53".to_string(), SNAT_A.to_string()))
    );
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let v = f.get_json("/api/v1/links").await;
        if v["dns_proxies"][0]["refused"].as_u64() >= Some(1) {
            assert_eq!(v["dns_proxies"][0]["outbound"], "lan", "{v}");
            break;
        }
        assert!(Instant::now() < end, "refusal not counted: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    f.write_config(&with_resolvers([0, 1]));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    for _ in 0..5 {
        assert_eq!(dig(&net.lan), ("54".to_string(), SNAT_B.to_string()));
    }
    assert_eq!(
        dig_with(&net.lan, "198.19.9.9", "+tcp"),
        Some(("54".to_string(), SNAT_B.to_string()))
    );

    // Killed without a chance to clean up: the nftables table dies with the process (its
    // netlink socket owned it), so the LAN's DNS is no longer redirected to a proxy that is
    // gone. With a plain route out (what the router would fall back to), a query to a real
    // resolver is answered by it directly: it sees the client's own address, no link's.
    let mut f = f;
    f.signal(libc::SIGKILL);
    assert!(f.wait_exit(Duration::from_secs(5)).await.is_some());
    net.fl.route(&["default", "via", "198.18.1.1"]).unwrap();
    inet.route(&["198.18.100.0/24", "via", "198.18.11.1"])
        .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    let direct = ("53".to_string(), "198.18.100.2".to_string());
    while dig_at(&net.lan, "198.19.0.53").as_ref() != Some(&direct) {
        assert!(
            Instant::now() < end,
            "LAN DNS still not answered by its resolver after the kill: {:?}; tables {:?}",
            dig_at(&net.lan, "198.19.0.53"),
            kernel_state(&net.fl)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Rules and routes stay (inert without the table's marks); a restart replaces them.
    assert_eq!(kernel_state(&net.fl), (2, 0, true), "left behind");
    drop(f);
    let f = start(&net, &with_resolvers([1, 0])).await;
    assert_eq!(kernel_state(&net.fl), (2, 1, true), "{}", f.logs());
    assert_eq!(dig(&net.lan), ("53".to_string(), SNAT_A.to_string()));
}

/// The addresses Fulcrum's DNS server in the router namespace answers for the GSLB name.
fn gslb_answer(lan: &Ns) -> Vec<String> {
    let out = lan
        .exec(
            "dig",
            &[
                "+short",
                "+tries=1",
                "+time=2",
                "-p",
                "5353",
                "@198.18.100.1",
                "www.example.test",
                "A",
            ],
        )
        .unwrap();
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gslb_sites_tied_to_a_link_leave_the_answers_while_it_is_down_and_a_refused_reload_keeps_what_runs(
) {
    let net = net("gslb");
    let gslb = format!(
        r#"
[dns]
listen = ["198.18.100.1:5353"]

[[dns.zone]]
origin = "example.test."
records = ["status 60 IN TXT \"ok\""]

[[gslb.site]]
name = "via-a"
addresses = ["{SNAT_A}"]
link = "a"

[[gslb.site]]
name = "via-b"
addresses = ["{SNAT_B}"]
link = "b"

[[gslb.name]]
fqdn = "www.example.test."
sites = ["via-a", "via-b"]
algorithm = "round_robin"
answers = 2
ttl = 1
"#
    );
    let f = start(&net, &(config("weighted_round_robin", [1, 1], "") + &gslb)).await;
    assert_eq!(gslb_answer(&net.lan), vec![SNAT_A, SNAT_B], "{}", f.logs());
    // Link a dies: its site leaves the answers; back when the link is.
    net.isps[0].sysctl("net.ipv4.ip_forward", "0").unwrap();
    let end = Instant::now() + Duration::from_secs(6);
    while gslb_answer(&net.lan) != vec![SNAT_B] {
        assert!(
            Instant::now() < end,
            "site via-a still answered:\n{}",
            f.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    net.isps[0].sysctl("net.ipv4.ip_forward", "1").unwrap();
    let end = Instant::now() + Duration::from_secs(6);
    while gslb_answer(&net.lan) != vec![SNAT_A, SNAT_B] {
        assert!(Instant::now() < end, "site via-a did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A reload naming an interface that does not exist is refused, and what runs stays.
    f.write_config(
        &(config("weighted_round_robin", [1, 1], "")
            .replace("interface = \"wan1\"", "interface = \"wan9\"")
            + &gslb),
    );
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("wan9"), "{}", r.text());
    assert_eq!(kernel_state(&net.fl), (2, 1, true));
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 40)
    })
    .await
    .unwrap();
    assert_eq!(
        seen.get(SNAT_A).copied().unwrap_or(0) + seen.get(SNAT_B).copied().unwrap_or(0),
        40,
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtt_sends_a_destination_prefix_to_the_link_that_answers_it_fastest() {
    // (This kernel has no netem.) Line b is a 2 Mbit/s line with a deep queue that an upload
    // keeps full: its round trips take hundreds of milliseconds, line a's a fraction of one.
    let net = net("rtt");
    net.fl
        .exec(
            "tc",
            &[
                "qdisc", "add", "dev", "wan1", "root", "tbf", "rate", "2mbit", "burst", "16kbit",
                "latency", "500ms",
            ],
        )
        .unwrap();
    // Weights send every flow Fulcrum has not measured to b.
    let f = start(&net, &config("rtt", [0, 1], "")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let upload = net.lan.thread({
        let stop = stop.clone();
        move || {
            let mut s =
                TcpStream::connect_timeout(&FAR_SINK.parse().unwrap(), Duration::from_secs(1))
                    .unwrap();
            let chunk = vec![0u8; 64 * 1024];
            let end = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                if s.write_all(&chunk).is_err() {
                    break;
                }
            }
        }
    });
    // Flows to 198.19.0.10 start on b by weight; once Fulcrum has learned 198.19.0.0/24 and
    // pinged it through both lines, its new flows take a.
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 5)
    })
    .await
    .unwrap();
    // (The first of them already teach Fulcrum the prefix: not all need to be on b.)
    assert!(seen.get(SNAT_B).is_some_and(|&n| n >= 1), "{seen:?}");
    let t = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || settles_on(&lan, SNAT_A, 20, Duration::from_secs(15))
    });
    let took = t.await.unwrap();
    stop.store(true, Ordering::Relaxed);
    upload.join().unwrap().unwrap();
    let took = took
        .unwrap_or_else(|| panic!("198.19.0.0/24 did not move to the fast line:\n{}", f.logs()));
    eprintln!("rtt: the prefix settled on the fast line after {took:?}");
}

/// The same for IPv6: the destination /48 is learned and measured through both lines, and its
/// new flows move to the fast one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rtt_sends_an_ipv6_destination_prefix_to_the_link_that_answers_it_fastest() {
    let net = net("rtt6");
    net.fl
        .exec(
            "tc",
            &[
                "qdisc", "add", "dev", "wan1", "root", "tbf", "rate", "2mbit", "burst", "16kbit",
                "latency", "500ms",
            ],
        )
        .unwrap();
    let f = start(
        &net,
        &config6([0, 1], "").replace("\"weighted_round_robin\"", "\"rtt\""),
    )
    .await;
    links_answered(&f).await;
    let stop = Arc::new(AtomicBool::new(false));
    // The upload keeps line b's queue full (IPv4: the queue is the line's, whatever the
    // family).
    let upload = net.lan.thread({
        let stop = stop.clone();
        move || {
            let mut s =
                TcpStream::connect_timeout(&FAR_SINK.parse().unwrap(), Duration::from_secs(1))
                    .unwrap();
            let chunk = vec![0u8; 64 * 1024];
            let end = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                if s.write_all(&chunk).is_err() {
                    break;
                }
            }
        }
    });
    // Flows to fd00:19::10 start on b (no IPv6 NAT: the client's own address) by weight; once
    // fd00:19::/48 is learned and pinged through both lines, they take a.
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER6, 5)
    })
    .await
    .unwrap();
    assert!(seen.get(CLIENT6).is_some_and(|&n| n >= 1), "{seen:?}");
    let took = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || settles_on_server(&lan, SERVER6, SNAT6_A, 20, Duration::from_secs(15))
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    upload.join().unwrap().unwrap();
    let took =
        took.unwrap_or_else(|| panic!("fd00:19::/48 did not move to the fast line:\n{}", f.logs()));
    eprintln!("rtt: the IPv6 prefix settled on the fast line after {took:?}");
    let table = net
        .fl
        .exec("nft", &["list", "map", "inet", "fulcrum_link", "prox6_0"])
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.contains("fd00:19::/48 : 0x464c0001"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_connections_sends_new_flows_to_the_link_carrying_fewer() {
    let net = net("lc");
    // Twenty held flows, all on a (b takes none at weight 0)...
    let f = start(&net, &config("weighted_round_robin", [1, 0], "")).await;
    let held = net
        .lan
        .thread(|| {
            (0..20)
                .filter_map(|_| {
                    let mut s = open(SERVER, Duration::from_secs(1)).ok()?;
                    (ask(&mut s).ok()? == SNAT_A).then_some(s)
                })
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(held.len(), 20, "the held flows did not all leave by a");
    // ...then least connections: Fulcrum counts them from the connection table and sends the
    // new flows to b, whatever the hash of each.
    f.write_config(&config("least_connections", [1, 1], ""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let counted = common::wait_until(Duration::from_secs(10), || async {
        link(&f, "a").await["flows_active"].as_u64() >= Some(20)
    })
    .await;
    assert!(
        counted,
        "a's flows were not counted: {}",
        link(&f, "a").await
    );
    // (The shares follow in the same refresh, just before the kernel's slot maps.)
    let shifted = common::wait_until(Duration::from_secs(5), || async {
        let slots = |l: serde_json::Value| l["slots"].as_u64().unwrap_or(0);
        slots(link(&f, "b").await) > 10 * slots(link(&f, "a").await)
    })
    .await;
    assert!(
        shifted,
        "the slots did not move to b: {}",
        link(&f, "b").await
    );
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 20)
    })
    .await
    .unwrap();
    assert!(
        seen.get(SNAT_B).is_some_and(|&n| n >= 16),
        "new flows did not prefer the link with fewer: {seen:?}\n{}\n{}",
        link(&f, "a").await,
        link(&f, "b").await
    );
    // The new flows are counted as they come (conntrack's events), not only at a resync.
    let counted = common::wait_until(Duration::from_secs(5), || async {
        link(&f, "b").await["flows_active"].as_u64() >= Some(16)
    })
    .await;
    assert!(
        counted,
        "b's new flows were not counted: {}",
        link(&f, "b").await
    );
    drop(held);
}

/// `priority` and `first_available` link pools: every new flow on one link while it is up; the
/// next one takes them when its ISP stops forwarding, and they come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_and_first_available_use_one_link_until_it_fails() {
    let net = net("prio");
    // b outranks a.
    let prio =
        config("priority", [1, 1], "").replace("name = \"b\"\n", "name = \"b\"\npriority = 10\n");
    let f = start(&net, &prio).await;
    for (algorithm, first, second, isp) in [
        ("priority", SNAT_B, SNAT_A, 1),
        ("first_available", SNAT_A, SNAT_B, 0),
    ] {
        if algorithm == "first_available" {
            f.write_config(&config(algorithm, [1, 1], ""));
            let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        }
        let seen = tokio::task::spawn_blocking({
            let lan = net.lan.clone();
            move || flows(&lan, SERVER, 20)
        })
        .await
        .unwrap();
        assert_eq!(seen.get(first), Some(&20), "{algorithm}: {seen:?}");
        net.isps[isp].sysctl("net.ipv4.ip_forward", "0").unwrap();
        let t = tokio::task::spawn_blocking({
            let lan = net.lan.clone();
            move || settles_on(&lan, second, 20, Duration::from_secs(10))
        });
        assert!(
            t.await.unwrap().is_some(),
            "{algorithm}: flows did not move to {second}"
        );
        net.isps[isp].sysctl("net.ipv4.ip_forward", "1").unwrap();
        let t = tokio::task::spawn_blocking({
            let lan = net.lan.clone();
            move || settles_on(&lan, first, 20, Duration::from_secs(10))
        });
        assert!(
            t.await.unwrap().is_some(),
            "{algorithm}: flows did not return to {first}"
        );
    }
}

#[test]
fn check_refuses_interface_names_that_would_change_the_nft_ruleset() {
    const GATEWAYS: &str = r#"
[[pool]]
name = "firewalls"
kind = "gateway"
[[pool.member]]
address = "198.18.10.2"
interface = "fw0"

[[gateway_service]]
name = "fw"
interfaces = ["inside0"]
pool = "firewalls"
"#;
    let good = config("weighted_round_robin", [1, 1], "") + GATEWAYS;
    let (ok, text) = check(&good);
    assert!(ok, "{text}");
    // Names with what Linux allows in an interface name but nft would read as syntax, and one
    // longer than IFNAMSIZ: each refused with the file, its line, the key and what is expected.
    let expected = "expected 1 to 15 characters of letters, digits, '.', '_' and '-'";
    for (from, to, key) in [
        (
            "interface = \"wan0\"",
            r#"interface = "wan0\"; drop""#,
            "pool[0].member[0].interface",
        ),
        (
            "interface = \"wan1\"",
            "interface = \"wan1}{\"",
            "pool[0].member[1].interface",
        ),
        (
            "interface = \"fw0\"",
            "interface = \"fw0\\nx\"",
            "pool[1].member[0].interface",
        ),
        (
            "interfaces = [\"inside0\"]",
            "interfaces = [\"inside0.with.16ch\"]",
            "gateway_service[0].interfaces[0]",
        ),
    ] {
        let bad = good.replace(from, to);
        assert_ne!(bad, good, "{from}");
        let line = bad.lines().position(|l| l == to).map_or(0, |n| n + 1);
        let (ok, text) = check(&bad);
        assert!(!ok, "{to} passed: {text}");
        assert!(
            text.contains(&format!("bad.toml:{line}")) && text.contains(key),
            "{to}: {text}"
        );
        assert!(text.contains(expected), "{to}: {text}");
    }
}

/// `fulcrum check` on dual-stack configurations: the test's own is accepted; each thing that
/// cannot work is refused with the file, its line, the key and what is expected.
#[test]
fn check_refuses_ipv6_settings_that_cannot_work() {
    let good = config6([1, 1], "dns_proxy6 = \"[fd00:100::1]:53\"");
    let (ok, text) = check(&good);
    assert!(ok, "{text}");
    for (from, to, key, expected) in [
        (
            "gateway6 = \"fd00:1::1\"",
            "gateway6 = \"198.18.1.9\"",
            "pool[0].member[0].gateway6",
            "expected an IPv6 address",
        ),
        (
            "snat6 = \"fd00:1::2\"",
            "snat6 = \"198.18.1.2\"",
            "pool[0].member[0].snat6",
            "expected an IPv6 address or \"none\"",
        ),
        (
            "dns_proxy6 = \"[fd00:100::1]:53\"",
            "dns_proxy6 = \"198.18.100.1:53\"",
            "outbound[0].dns_proxy6",
            "expected an IPv6 socket address",
        ),
    ] {
        let bad = good.replace(from, to);
        assert_ne!(bad, good, "{from}");
        let line = bad.lines().position(|l| l == to).map_or(0, |n| n + 1);
        let (ok, text) = check(&bad);
        assert!(!ok, "{to} passed: {text}");
        assert!(
            text.contains(&format!("bad.toml:{line}")) && text.contains(key),
            "{to}: {text}"
        );
        assert!(text.contains(expected), "{to}: {text}");
    }
    // IPv6 sources when no line has an IPv6 next hop: the source is named.
    let v4_lines = good
        .replace("gateway6 = \"fd00:1::1\"\n", "")
        .replace("gateway6 = \"fd00:2::1\"\n", "")
        .replace("snat6 = \"fd00:1::2\"\n", "")
        .replace("snat6 = \"none\"\n", "")
        .replace("\"fd00:19::10\", \"fd00:19::11\"", "\"198.19.0.10\"");
    let (ok, text) = check(&v4_lines);
    assert!(!ok, "{text}");
    assert!(
        text.contains("outbound[0].sources[1]")
            && text.contains("no link of pool \"uplinks\" has an IPv6 next hop"),
        "{text}"
    );
}

/// The link plane's kernel state with the counters taken out (they move with traffic).
fn link_kernel_text(fl: &Ns) -> String {
    let mut out = String::new();
    for args in [
        &["nft", "list", "table", "inet", "fulcrum_link"][..],
        // IPv4 only (the link plane's family): IPv6 link-local routes appear on their own
        // once duplicate address detection ends.
        &["ip", "-4", "rule", "show"][..],
        &["ip", "-4", "route", "show", "table", "all"][..],
    ] {
        let o = fl.exec(args[0], &args[1..]).unwrap();
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let line = match line.find("counter packets") {
                Some(i) => &line[..i],
                None => line,
            };
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refused_after_the_links_were_applied_puts_them_back() {
    let net = net("lrefuse");
    let f = start(&net, &config("weighted_round_robin", [3, 1], "")).await;
    let before = link_kernel_text(&net.fl);
    assert!(before.contains("fulcrum_link"), "{before}");

    // Another process owns the nftables table the transparency return path needs, so that
    // step — after the link plane has applied the new weights and a new link policy — refuses.
    let mut holder = net
        .fl
        .command("nft", &["-i"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut holder_in = holder.stdin.take().unwrap();
    holder_in
        .write_all(b"add table inet fulcrum_transparent { flags owner; }\n")
        .unwrap();
    holder_in.flush().unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let t = net.fl.exec("nft", &["list", "tables"]).unwrap();
        if String::from_utf8_lossy(&t.stdout).contains("fulcrum_transparent") {
            break;
        }
        assert!(Instant::now() < end, "the holder did not create its table");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let member = fulcrum_testkit::free_addr();
    let vs = fulcrum_testkit::free_addr();
    let transparent = format!(
        "\n[[virtual_service]]\nname = \"seen-from-client\"\nlisten = [\"{vs}\"]\nprotocol = \"tcp\"\nsource = \"client\"\npool = \"app\"\n\n[[pool]]\nname = \"app\"\n[[pool.member]]\naddress = \"{member}\"\n"
    );
    f.write_config(&(config("weighted_least_connections", [1, 3], "") + &transparent));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("return path"), "{}", r.text());

    // The ruleset, the rules and the routes are what ran, and so is the API's view.
    let after = link_kernel_text(&net.fl);
    let changed = before
        .lines()
        .zip(after.lines())
        .find(|(b, a)| b != a)
        .map(|(b, a)| format!("was: {b}\nnow: {a}"));
    assert!(
        after == before,
        "the refused reload changed the links' kernel state; first change:\n{}",
        changed.unwrap_or_else(|| "(a line added or removed)".into())
    );
    assert_eq!(link(&f, "a").await["weight"], 3);
    assert_eq!(link(&f, "b").await["weight"], 1);
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 40)
    })
    .await
    .unwrap();
    assert_eq!(
        seen.get(SNAT_A).copied().unwrap_or(0) + seen.get(SNAT_B).copied().unwrap_or(0),
        40,
        "{seen:?}"
    );
    drop(holder_in);
    let _ = holder.kill();
    let _ = holder.wait();
}

/// `[[outbound.rule]]`: new tcp flows to one destination port leave by the rule's link, while
/// the others follow the pool's algorithm (here every flow on a, b at weight 0); a udp rule on
/// the same port does not catch tcp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_rule_sends_a_destination_port_to_its_link() {
    let net = net("orule");
    whoami(&net.inet, RULED_SERVER, net.stop.clone());
    let rules = "[[outbound.rule]]\nprotocol = \"udp\"\ndestination_port = 7000\nlink = \"b\"\n\
                 [[outbound.rule]]\nname = \"to-7002\"\nprotocol = \"tcp\"\ndestination_port = \"7002-7003\"\nlink = \"b\"\n";
    let _f = start(&net, &config("weighted_round_robin", [1, 0], rules)).await;
    let (plain, ruled) = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || (flows(&lan, SERVER, 10), flows(&lan, RULED_SERVER, 10))
    })
    .await
    .unwrap();
    assert_eq!(
        plain,
        BTreeMap::from([(SNAT_A.to_string(), 10)]),
        "{plain:?}"
    );
    assert_eq!(
        ruled,
        BTreeMap::from([(SNAT_B.to_string(), 10)]),
        "{ruled:?}"
    );

    // b stops forwarding: once its monitor takes it down, the rule is skipped and its flows
    // are balanced as the others (a); when b comes back, the rule holds again.
    for (forward, via) in [("0", SNAT_A), ("1", SNAT_B)] {
        net.isps[1].sysctl("net.ipv4.ip_forward", forward).unwrap();
        let lan = net.lan.clone();
        let settled = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if flows(&lan, RULED_SERVER, 5).get(via) == Some(&5) {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            false
        })
        .await
        .unwrap();
        assert!(settled, "flows to the rule's port did not settle on {via}");
    }
}

/// Waits until every link's monitor has had its targets answer: the first IPv6 probes can go
/// unanswered while the namespaces' neighbour discovery settles, and a link down until then
/// would take flows out of the count.
async fn links_answered(f: &Fulcrum) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let v = f.get_json("/api/v1/links").await;
        let links = v["links"].as_array().cloned().unwrap_or_default();
        // Up, answered, and (for a link with weight) its slots in the kernel's table: the API
        // counts them once the map is written.
        let answered = |l: &serde_json::Value| {
            l["health"] == "up"
                && l["targets"][0]["rtt_ms"].as_f64().is_some()
                && (l["weight"] == 0 || l["slots"].as_u64() > Some(0))
        };
        if !links.is_empty() && links.iter().all(answered) {
            return;
        }
        assert!(
            Instant::now() < end,
            "links not answering: {v}\n{}",
            f.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A dual-stack configuration: both links carry IPv6 (a: `snat6` to its wan address, b: no
/// IPv6 NAT, the LAN prefix is routed), watched by a monitor with IPv6 targets only.
fn config6(weights: [u32; 2], extra: &str) -> String {
    config("weighted_round_robin", weights, extra)
        .replace(
            "targets = [\"198.19.0.10\", \"198.19.0.11\"]",
            "targets = [\"fd00:19::10\", \"fd00:19::11\"]",
        )
        .replacen(
            "snat = \"198.18.1.2\"",
            &format!("snat = \"198.18.1.2\"\ngateway6 = \"fd00:1::1\"\nsnat6 = \"{SNAT6_A}\""),
            1,
        )
        .replacen(
            "snat = \"198.18.2.2\"",
            "snat = \"198.18.2.2\"\ngateway6 = \"fd00:2::1\"\nsnat6 = \"none\"",
            1,
        )
        .replace(
            "sources = [\"198.18.100.0/24\"]",
            "sources = [\"198.18.100.0/24\", \"fd00:100::/64\"]",
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_flows_spread_by_weight_keep_their_link_and_leave_a_pulled_line() {
    let net = net("link6");
    let mut f = start(&net, &config6([3, 1], "")).await;
    links_answered(&f).await;
    let rules6 = net.fl.exec("ip", &["-6", "rule", "show"]).unwrap();
    let rules6 = String::from_utf8_lossy(&rules6.stdout).to_string();
    assert_eq!(rules6.matches("fwmark 0x464c").count(), 2, "{rules6}");

    // 4,000 IPv6 flows split 3:1: link a's seen from its snat6 address, link b's (no IPv6 NAT)
    // from the client's own.
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER6, 4_000)
    })
    .await
    .unwrap();
    eprintln!("3:1 over 4000 IPv6 flows: {seen:?}");
    assert_eq!(
        seen.keys().cloned().collect::<Vec<_>>(),
        vec![CLIENT6, SNAT6_A],
        "{seen:?}\n{}",
        f.logs()
    );
    let a = share(&seen, SNAT6_A);
    assert!(
        (a - 0.75).abs() <= 0.02,
        "link a carried {a:.3} of the IPv6 flows, want 0.75 ± 0.02"
    );
    // IPv4 flows of the same LAN still leave by the links.
    let v4 = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER, 40)
    })
    .await
    .unwrap();
    assert_eq!(v4.get("fail"), None, "{v4:?}");
    let la = link(&f, "a").await;
    assert_eq!(la["gateway6"], "fd00:1::1", "{la}");
    assert_eq!(la["snat6"], SNAT6_A, "{la}");
    assert_eq!(link(&f, "b").await["nat6"], "none");
    let m = f.api("GET", "/metrics", None).await.unwrap().text();
    for family in ["ipv4", "ipv6"] {
        let line =
            format!("fulcrum_link_family{{outbound=\"lan\",link=\"b\",family=\"{family}\"}} 1");
        assert!(m.contains(&line), "{line}\n{m}");
    }

    // Long-lived IPv6 flows, then every new flow to b: the running ones keep their link.
    let long: Vec<BufReader<TcpStream>> = net
        .lan
        .thread(|| {
            (0..8)
                .map(|_| open(SERVER6, Duration::from_secs(1)).unwrap())
                .collect()
        })
        .join()
        .unwrap()
        .unwrap();
    let mut long: Vec<(String, BufReader<TcpStream>)> = long
        .into_iter()
        .map(|mut s| (ask(&mut s).unwrap(), s))
        .collect();
    let on_a = long.iter().filter(|(w, _)| w == SNAT6_A).count();
    assert!(on_a > 0 && on_a < long.len(), "8 flows all on one link");
    f.write_config(&config6([0, 1], ""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER6, 50)
    })
    .await
    .unwrap();
    assert_eq!(seen.get(CLIENT6), Some(&50), "after the reload: {seen:?}");
    for (who, s) in &mut long {
        for _ in 0..3 {
            assert_eq!(&ask(s).unwrap(), who, "a running IPv6 flow changed link");
        }
    }

    // Pull link a's IPv6: its ISP stops forwarding IPv6, the IPv6 monitor takes it down, and
    // new IPv6 flows all leave by b while b's running flows go on.
    f.write_config(&config6([1, 1], ""));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    net.isps[0]
        .sysctl("net.ipv6.conf.all.forwarding", "0")
        .unwrap();
    // Health turns down first and the kernel maps are rewritten just after; `slots` is
    // published once they are, so a flow opened before that could still take link a.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let a = link(&f, "a").await;
        if a["health"] == "down" && a["slots"] == 0 {
            break;
        }
        assert!(Instant::now() < end, "link a not seen down:\n{}", f.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = tokio::task::spawn_blocking({
        let lan = net.lan.clone();
        move || flows(&lan, SERVER6, 40)
    })
    .await
    .unwrap();
    assert_eq!(seen.get(CLIENT6), Some(&40), "with a pulled: {seen:?}");
    for (who, s) in long.iter_mut().filter(|(w, _)| w == CLIENT6) {
        assert_eq!(&ask(s).unwrap(), who, "a flow on the healthy link broke");
    }
    net.isps[0]
        .sysctl("net.ipv6.conf.all.forwarding", "1")
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while link(&f, "a").await["health"] != "up" {
        assert!(Instant::now() < end, "link a did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(long);

    // Shutdown removes the IPv6 rules too.
    f.signal(libc::SIGTERM);
    assert!(f.wait_exit(Duration::from_secs(10)).await.is_some());
    let rules6 = net.fl.exec("ip", &["-6", "rule", "show"]).unwrap();
    assert!(
        !String::from_utf8_lossy(&rules6.stdout).contains("0x464c"),
        "IPv6 rules left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_proxy_takes_ipv6_queries_and_asks_the_chosen_links_ipv6_resolver() {
    let net = net("dns6");
    let inet = net.inet.clone();
    inet.addr("lo", "fd00:19::53/128").unwrap();
    inet.addr("lo", "fd00:19::54/128").unwrap();
    resolver(&inet, "[fd00:19::53]:53", 53, net.stop.clone());
    resolver(&inet, "[fd00:19::54]:53", 54, net.stop.clone());
    let with_resolvers = |weights: [u32; 2]| {
        config6(
            weights,
            "dns_proxy = \"198.18.100.1:53\"\ndns_proxy6 = \"[fd00:100::1]:53\"",
        )
        .replacen(
            "monitors = [\"through\"]",
            "monitors = [\"through\"]\nresolver = \"fd00:19::53\"",
            1,
        )
        .replacen(
            "isp = \"isp-b\"",
            "isp = \"isp-b\"\nresolver = \"[fd00:19::54]:53\"",
            1,
        )
    };
    let f = start(&net, &with_resolvers([1, 0])).await;
    links_answered(&f).await;
    // A query of the LAN's IPv6 client to any resolver, over UDP and TCP, leaves by link a
    // to a's resolver, which sees a's snat6 address.
    let want_a = Some(("53".to_string(), SNAT6_A.to_string()));
    for option in ["+notcp", "+tcp", "+notcp", "+tcp"] {
        assert_eq!(
            dig_with(&net.lan, "fd00:19::99", option),
            want_a,
            "{option}\n{}",
            f.logs()
        );
    }
    // The LAN's IPv4 queries go to the same IPv6 resolver through the same link.
    assert_eq!(dig_with(&net.lan, "198.19.9.9", "+notcp"), want_a);
    // From the WAN side the IPv6 proxy answers nothing and counts the query.
    net.isps[0]
        .route(&["fd00:100::/64", "via", "fd00:1::2"])
        .unwrap();
    assert_eq!(
        dig_at(&net.isps[0], "fd00:100::1"),
        None,
        "answered the WAN"
    );
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let v = f.get_json("/api/v1/links").await;
        if v["dns_proxies"][0]["refused"].as_u64() >= Some(1) {
            assert_eq!(v["dns_proxies"][0]["address6"], "[fd00:100::1]:53", "{v}");
            break;
        }
        assert!(Instant::now() < end, "refusal not counted: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // All to link b: its resolver sees the wan address (b has no IPv6 NAT, so the proxy's
    // query leaves from the interface's own address).
    f.write_config(&with_resolvers([0, 1]));
    let r = f.api("POST", "/api/v1/reload", None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let want_b = Some(("54".to_string(), "fd00:2::2".to_string()));
    for option in ["+notcp", "+tcp"] {
        assert_eq!(
            dig_with(&net.lan, "fd00:19::99", option),
            want_b,
            "{option}"
        );
    }
}

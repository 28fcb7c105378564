//! A Fulcrum pair as the LAN's gateway with two uplinks (outbound link load balancing with
//! SNAT), `[ha] conntrack_sync` copying the routed flows' state to the standby through
//! conntrackd: when the master machine dies, a long download and idle held connections that
//! it was routing continue through the new master — same link, same SNAT address, no reset.
//!
//!   lan (198.18.100.2) —brl— gwa eth0 .11 / gwb eth0 .12   (VIP 198.18.100.1: the LAN's gateway)
//!                     —bra— gwa wan0 198.18.1.11 / gwb .12 — isp0 198.18.1.1   (VIP .2: SNAT a)
//!                     —brb— gwa wan1 198.18.2.11 / gwb .12 — isp1 198.18.2.1   (VIP .2: SNAT b)
//!   gwa sync0 198.18.254.1 — gwb sync0 198.18.254.2 (the dedicated sync link)
//!   isp0, isp1 — inet (198.19.0.10: the servers)
//!
//! Everything lives in namespaces this test creates.

#[path = "common/lab.rs"]
mod lab;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_testkit::netns::{Lab, Ns};
use lab::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const ASK: &str = "198.19.0.10:7000";
const DOWNLOAD: &str = "198.19.0.10:7001";
const SNAT: [&str; 2] = ["198.18.1.2", "198.18.2.2"];
/// 64 KiB every 20 ms: about 3.2 MB/s, so the download spans the failover.
const CHUNK: usize = 64 * 1024;
const TOTAL: usize = 160 * CHUNK;

struct Net {
    lab: Lab,
    lan: Ns,
    gw: [Ns; 2],
    stop: Arc<AtomicBool>,
    /// Set: every held connection of the ask server gets one line from the server first.
    push: Arc<AtomicBool>,
}

impl Drop for Net {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn net() -> Net {
    let mut lab = Lab::new("gwpair");
    let lan = lab.ns("lan").unwrap();
    let gwa = lab.ns("gwa").unwrap();
    let gwb = lab.ns("gwb").unwrap();
    let inet = lab.ns("inet").unwrap();
    let sw = lab.ns("sw").unwrap();
    for br in ["brl", "bra", "brb"] {
        sw.ip(&["link", "add", br, "type", "bridge"]).unwrap();
        sw.ip(&["link", "set", br, "up"]).unwrap();
    }
    let mut port = 0;
    let mut plug = |lab: &Lab, ns: &Ns, ifname: &str, br: &str, cidr: &str| {
        let p = format!("p{port}");
        port += 1;
        lab.veth(ns, ifname, &sw, &p).unwrap();
        sw.ip(&["link", "set", &p, "master", br]).unwrap();
        ns.addr(ifname, cidr).unwrap();
    };
    plug(&lab, &lan, "eth0", "brl", "198.18.100.2/24");
    lan.route(&["default", "via", "198.18.100.1"]).unwrap();
    for (i, gw) in [&gwa, &gwb].into_iter().enumerate() {
        let host = 11 + i;
        plug(&lab, gw, "eth0", "brl", &format!("198.18.100.{host}/24"));
        plug(&lab, gw, "wan0", "bra", &format!("198.18.1.{host}/24"));
        plug(&lab, gw, "wan1", "brb", &format!("198.18.2.{host}/24"));
        for (key, v) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ] {
            gw.sysctl(key, v).unwrap();
        }
    }
    lab.veth(&gwa, "sync0", &gwb, "sync0").unwrap();
    gwa.addr("sync0", "198.18.254.1/30").unwrap();
    gwb.addr("sync0", "198.18.254.2/30").unwrap();
    inet.addr("lo", "198.19.0.10/32").unwrap();
    for (k, br) in ["bra", "brb"].into_iter().enumerate() {
        let isp = lab.ns(&format!("isp{k}")).unwrap();
        plug(&lab, &isp, "eth0", br, &format!("198.18.{}.1/24", k + 1));
        lab.veth(&isp, "eth1", &inet, &format!("isp{k}")).unwrap();
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
    }
    let stop = Arc::new(AtomicBool::new(false));
    let push = Arc::new(AtomicBool::new(false));
    serve(&inet, ASK, stop.clone(), {
        let push = push.clone();
        move |s, peer, stop| ask_server(s, peer, stop, push.clone())
    });
    serve(&inet, DOWNLOAD, stop.clone(), |s, _, stop| {
        download_server(s, stop)
    });
    Net {
        lab,
        lan,
        gw: [gwa, gwb],
        stop,
        push,
    }
}

/// Accepts on `addr` inside `ns` until `stop`, a thread per connection.
fn serve(
    ns: &Ns,
    addr: &str,
    stop: Arc<AtomicBool>,
    handler: impl Fn(TcpStream, SocketAddr, Arc<AtomicBool>) + Send + Sync + Clone + 'static,
) {
    let addr: SocketAddr = addr.parse().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    ns.thread(move || {
        let listener = match TcpListener::bind(addr) {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(Err(e.to_string()));
                return;
            }
        };
        listener.set_nonblocking(true).unwrap();
        let _ = tx.send(Ok(()));
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((s, peer)) => {
                    let _ = s.set_nonblocking(false);
                    let (h, stop) = (handler.clone(), stop.clone());
                    std::thread::spawn(move || h(s, peer, stop));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("server thread")
        .expect("server bind");
}

/// Answers every line with the peer's address; once `push` is set, sends "push <peer>" first
/// (the server speaks before the client after the failover).
fn ask_server(s: TcpStream, peer: SocketAddr, stop: Arc<AtomicBool>, push: Arc<AtomicBool>) {
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let Ok(mut w) = s.try_clone() else { return };
    let mut r = BufReader::new(s);
    let mut pushed = false;
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        if push.load(Ordering::Relaxed) && !pushed {
            pushed = true;
            if writeln!(w, "push {}", peer.ip()).is_err() {
                return;
            }
        }
        match r.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                line.clear();
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

/// Sends TOTAL bytes, CHUNK every 20 ms, then closes.
fn download_server(mut s: TcpStream, stop: Arc<AtomicBool>) {
    let chunk = vec![b'x'; CHUNK];
    let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
    for _ in 0..TOTAL / CHUNK {
        if stop.load(Ordering::Relaxed) || s.write_all(&chunk).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn config(node: &str, priority: u8, peer: &str) -> String {
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token = "lab-admin-token-0123456789"

[ha]
node = "{node}"
interface = "eth0"
vrid = 61
priority = {priority}
advert_interval = "100ms"
vips = ["198.18.100.1/24", "198.18.1.2/24 dev wan0", "198.18.2.2/24 dev wan1"]
conntrack_sync = {{ interface = "sync0", peer = "{peer}" }}

[[monitor]]
name = "through"
type = "icmp"
targets = ["198.19.0.10"]
interval = "300ms"
timeout = "300ms"
rise = 1
fall = 3

[[pool]]
name = "uplinks"
kind = "link"
algorithm = "round_robin"
[[pool.member]]
name = "a"
interface = "wan0"
gateway = "198.18.1.1"
snat = "{a}"
monitors = ["through"]
[[pool.member]]
name = "b"
interface = "wan1"
gateway = "198.18.2.1"
snat = "{b}"
monitors = ["through"]

[[outbound]]
name = "lan"
sources = ["198.18.100.0/24"]
pool = "uplinks"
"#,
        a = SNAT[0],
        b = SNAT[1],
    )
}

fn links_up(f: &NsFulcrum) -> usize {
    let (_, v) = api(&f.ns, "GET", "/api/v1/links");
    v["links"]
        .as_array()
        .map(|l| l.iter().filter(|l| l["health"] == "up").count())
        .unwrap_or(0)
}

fn ask(s: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    s.get_mut().write_all(b"?\n")?;
    read_line(s)
}

fn read_line(s: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    s.read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim().to_string())
}

#[test]
fn routed_flows_continue_through_the_new_master_when_the_master_machine_dies() {
    let mut n = net();
    let fa = NsFulcrum::start(
        &mut n.lab,
        &n.gw[0].clone(),
        BIN,
        &config("a", 200, "198.18.254.2"),
    );
    let fb = NsFulcrum::start(
        &mut n.lab,
        &n.gw[1].clone(),
        BIN,
        &config("b", 100, "198.18.254.1"),
    );
    assert!(
        wait_for(Duration::from_secs(10), || fa.role() == "master"
            && fb.role() == "backup"),
        "roles: a {} b {}\n{}\n{}",
        fa.role(),
        fb.role(),
        fa.logs(),
        fb.logs()
    );
    for f in [&fa, &fb] {
        assert!(
            wait_for(Duration::from_secs(10), || f.ha()["conntrack_sync"]
                ["running"]
                == true),
            "conntrackd not running: {}\n{}",
            f.ha(),
            f.logs()
        );
        // The backup's probes leave from its own uplink addresses (the SNAT addresses are
        // VIPs the master holds), so it knows its links are up before it needs them.
        assert!(
            wait_for(Duration::from_secs(10), || links_up(f) == 2),
            "links on {}: {}\n{}",
            f.ns.name,
            api(&f.ns, "GET", "/api/v1/links").1,
            f.logs()
        );
    }

    // Two idle connections (round robin: one per link) and a long download, routed by a.
    let held: Vec<(BufReader<TcpStream>, String)> = n
        .lan
        .thread(|| {
            (0..2)
                .map(|_| {
                    let s =
                        TcpStream::connect_timeout(&ASK.parse().unwrap(), Duration::from_secs(2))
                            .expect("connect through the pair");
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut s = BufReader::new(s);
                    let who = ask(&mut s).expect("first answer");
                    (s, who)
                })
                .collect()
        })
        .join()
        .unwrap()
        .unwrap();
    let mut seen: Vec<&str> = held.iter().map(|(_, w)| w.as_str()).collect();
    seen.sort_unstable();
    assert_eq!(
        seen, SNAT,
        "one held connection per link, each behind its SNAT address"
    );

    let received = Arc::new(AtomicU64::new(0));
    let download = n.lan.thread({
        let received = received.clone();
        move || -> Result<(), String> {
            let mut s =
                TcpStream::connect_timeout(&DOWNLOAD.parse().unwrap(), Duration::from_secs(2))
                    .map_err(|e| format!("connect: {e}"))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; 64 * 1024];
            let end = Instant::now() + Duration::from_secs(60);
            loop {
                if Instant::now() > end {
                    return Err("download did not end within 60 s".into());
                }
                match s.read(&mut buf) {
                    Ok(0) => return Ok(()),
                    Ok(k) => {
                        received.fetch_add(k as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        return Err(format!(
                            "after {} bytes: {e}",
                            received.load(Ordering::Relaxed)
                        ))
                    }
                }
            }
        }
    });
    assert!(
        wait_for(Duration::from_secs(10), || received.load(Ordering::Relaxed)
            >= (TOTAL / 5) as u64),
        "the download does not flow"
    );

    // The master machine dies: the process killed and its links gone.
    let killed_at = received.load(Ordering::Relaxed);
    n.lab.kill(fa.index);
    for ifname in ["eth0", "wan0", "wan1", "sync0"] {
        n.gw[0].ip(&["link", "set", ifname, "down"]).unwrap();
    }
    assert!(
        wait_for(Duration::from_secs(5), || fb.role() == "master"),
        "b did not take over: {}",
        fb.ha()
    );
    let ct = fb.ha()["conntrack_sync"].clone();
    assert_eq!(ct["commits"], 1, "{ct}");
    assert_eq!(ct["commit_failures"], 0, "{ct}");

    // The download goes on to its end through b, without a reset.
    let outcome = download.join().unwrap().unwrap();
    assert_eq!(
        outcome,
        Ok(()),
        "download broke (killed at {killed_at} bytes)\n{}",
        fb.logs()
    );
    assert_eq!(received.load(Ordering::Relaxed), TOTAL as u64);

    // The idle connections: the server speaks first (its packets to the SNAT address must
    // find b's copy of the NAT binding), then the client; same link and address as before.
    n.push.store(true, Ordering::Relaxed);
    let after: Vec<Result<(String, String), String>> = n
        .lan
        .thread(move || {
            held.into_iter()
                .map(|(mut s, before)| {
                    let pushed = read_line(&mut s).map_err(|e| format!("push: {e}"))?;
                    let again = ask(&mut s).map_err(|e| format!("ask: {e}"))?;
                    Ok((format!("{pushed} / {again}"), before))
                })
                .collect()
        })
        .join()
        .unwrap()
        .unwrap();
    for r in after {
        let (got, before) =
            r.unwrap_or_else(|e| panic!("held connection broke: {e}\n{}", fb.logs()));
        assert_eq!(got, format!("push {before} / {before}"));
    }

    // New flows go through b too.
    n.push.store(false, Ordering::Relaxed);
    let fresh = n
        .lan
        .thread(|| {
            let s = TcpStream::connect_timeout(&ASK.parse().unwrap(), Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            ask(&mut BufReader::new(s))
        })
        .join()
        .unwrap()
        .unwrap()
        .expect("a new flow through b");
    assert!(SNAT.contains(&fresh.as_str()), "{fresh}");
    let (_, metrics) = api_raw(&fb.ns, "GET", "/metrics", "");
    assert!(
        metrics.contains("fulcrum_ha_conntrack_commits_total{vrid=\"61\"} 1"),
        "{metrics}"
    );
}

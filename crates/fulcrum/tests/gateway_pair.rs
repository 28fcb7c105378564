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

/// Starts a pair (priority 200 and 100) and waits until it is ready to carry flows: roles
/// settled, conntrackd running on both, every member up on both (the backup probes too).
fn start_pair(
    lab: &mut Lab,
    nodes: [&Ns; 2],
    configs: [String; 2],
    members: usize,
) -> [NsFulcrum; 2] {
    let a = NsFulcrum::start(lab, nodes[0], BIN, &configs[0]);
    let b = NsFulcrum::start(lab, nodes[1], BIN, &configs[1]);
    assert!(
        wait_for(Duration::from_secs(10), || a.role() == "master"
            && b.role() == "backup"),
        "roles: {} {}\n{}\n{}",
        a.role(),
        b.role(),
        a.logs(),
        b.logs()
    );
    for f in [&a, &b] {
        assert!(
            wait_for(Duration::from_secs(10), || f.ha()["conntrack_sync"]
                ["running"]
                == true),
            "conntrackd not running: {}\n{}",
            f.ha(),
            f.logs()
        );
        // The backup's probes leave from its own addresses (a link's SNAT address is a VIP
        // the master holds), so it knows its members are up before it needs them.
        assert!(
            wait_for(Duration::from_secs(10), || links_up(f) == members),
            "members on {}: {}\n{}",
            f.ns.name,
            api(&f.ns, "GET", "/api/v1/links").1,
            f.logs()
        );
    }
    [a, b]
}

/// `n` idle connections to the ask server from `lan`, each with the address the server saw.
fn hold(lan: &Ns, n: usize) -> Vec<(BufReader<TcpStream>, String)> {
    lan.thread(move || {
        (0..n)
            .map(|_| {
                let s = TcpStream::connect_timeout(&ASK.parse().unwrap(), Duration::from_secs(2))
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
    .unwrap()
}

/// How a download thread ended (the outer error: the namespace could not be entered).
type Outcome = std::thread::JoinHandle<Result<Result<(), String>, String>>;

/// A download from `lan` in a thread: its outcome, and the bytes received so far.
fn download(lan: &Ns) -> (Outcome, Arc<AtomicU64>) {
    let received = Arc::new(AtomicU64::new(0));
    let handle = lan.thread({
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
    (handle, received)
}

fn wait_received(received: &AtomicU64, bytes: usize) {
    assert!(
        wait_for(Duration::from_secs(20), || received.load(Ordering::Relaxed)
            >= bytes as u64),
        "the download does not flow ({} bytes)",
        received.load(Ordering::Relaxed)
    );
}

/// The master machine dies: its process killed and its links gone; the backup takes over and
/// commits the routed flows it was given.
fn machine_dies(lab: &mut Lab, master: &NsFulcrum, backup: &NsFulcrum, ifnames: &[&str]) {
    lab.kill(master.index);
    for ifname in ifnames {
        master.ns.ip(&["link", "set", ifname, "down"]).unwrap();
    }
    assert!(
        wait_for(Duration::from_secs(5), || backup.role() == "master"),
        "{} did not take over: {}",
        backup.ns.name,
        backup.ha()
    );
    let ct = backup.ha()["conntrack_sync"].clone();
    assert_eq!(ct["commits"], 1, "{ct}");
    assert_eq!(ct["commit_failures"], 0, "{ct}");
}

/// On each held connection the server speaks first (its packets must find the new master's
/// copy of the flow), then the client; both see the address they saw before.
fn held_connections_go_on(lan: &Ns, push: &AtomicBool, held: Vec<(BufReader<TcpStream>, String)>) {
    push.store(true, Ordering::Relaxed);
    let after: Vec<Result<(String, String), String>> = lan
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
    push.store(false, Ordering::Relaxed);
    for r in after {
        let (got, before) = r.unwrap_or_else(|e| panic!("held connection broke: {e}"));
        assert_eq!(got, format!("push {before} / {before}"));
    }
}

fn fresh_flow(lan: &Ns) -> String {
    lan.thread(|| {
        let s = TcpStream::connect_timeout(&ASK.parse().unwrap(), Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        ask(&mut BufReader::new(s))
    })
    .join()
    .unwrap()
    .unwrap()
    .expect("a new flow through the new master")
}

#[test]
fn routed_flows_continue_through_the_new_master_when_the_master_machine_dies() {
    let mut n = net();
    let gw = n.gw.clone();
    let [fa, fb] = start_pair(
        &mut n.lab,
        [&gw[0], &gw[1]],
        [
            config("a", 200, "198.18.254.2"),
            config("b", 100, "198.18.254.1"),
        ],
        2,
    );
    // Two idle connections (round robin: one per link) and a long download, routed by a.
    let held = hold(&n.lan, 2);
    let mut seen: Vec<&str> = held.iter().map(|(_, w)| w.as_str()).collect();
    seen.sort_unstable();
    assert_eq!(
        seen, SNAT,
        "one held connection per link, each behind its SNAT address"
    );
    let (download, received) = download(&n.lan);
    wait_received(&received, TOTAL / 5);

    let killed_at = received.load(Ordering::Relaxed);
    machine_dies(&mut n.lab, &fa, &fb, &["eth0", "wan0", "wan1", "sync0"]);
    // The download goes on to its end through b, without a reset.
    let outcome = download.join().unwrap().unwrap();
    assert_eq!(
        outcome,
        Ok(()),
        "download broke (killed at {killed_at} bytes)\n{}",
        fb.logs()
    );
    assert_eq!(received.load(Ordering::Relaxed), TOTAL as u64);
    held_connections_go_on(&n.lan, &n.push, held);
    assert!(SNAT.contains(&fresh_flow(&n.lan).as_str()));
    let (_, metrics) = api_raw(&fb.ns, "GET", "/metrics", "");
    assert!(
        metrics.contains("fulcrum_ha_conntrack_commits_total{vrid=\"61\"} 1"),
        "{metrics}"
    );
}

/// The firewall sandwich as two pairs (inside and outside) around two stateful firewalls,
/// which drop a flow whose first packet they see is not a SYN. Each pair has a VIP on every
/// firewall's segment (the firewalls route through the pairs' VIPs) and its own sync link.
/// Unlike the gateway test, this one passes without `conntrack_sync` too (checked): every
/// namespace shares one kernel, hence one `symhash` seed, so a new master that knows nothing of
/// a flow hashes it to the same firewall. Two machines seed it differently at boot; there the
/// copied connection mark is what keeps the flow on its firewall.
///
///   cl 198.18.200.2 —brl— ia/ib (VIP .1) —bi0— fw0 —bo0— oa/ob (VIP 198.19.0.1) —brs— srv .10
///                                        —bi1— fw1 —bo1—
struct Sandwich {
    lab: Lab,
    cl: Ns,
    inside: [Ns; 2],
    outside: [Ns; 2],
    stop: Arc<AtomicBool>,
    push: Arc<AtomicBool>,
}

impl Drop for Sandwich {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

const STATEFUL_FIREWALL: &str = "table inet fw {
  chain forward {
    type filter hook forward priority 0; policy accept;
    ct state invalid counter drop
    ct state new tcp flags & (syn | ack) != syn counter drop
  }
}
";

fn sandwich_net() -> Sandwich {
    let mut lab = Lab::new("gwsand");
    let names = ["cl", "ia", "ib", "oa", "ob", "fw0", "fw1", "srv", "sw"];
    let ns: Vec<Ns> = names.iter().map(|n| lab.ns(n).unwrap()).collect();
    let [cl, ia, ib, oa, ob, fw0, fw1, srv, sw] = <[Ns; 9]>::try_from(ns).unwrap();
    for br in ["brl", "bi0", "bi1", "bo0", "bo1", "brs"] {
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
    plug(&lab, &cl, "eth0", "brl", "198.18.200.2/24");
    cl.route(&["default", "via", "198.18.200.1"]).unwrap();
    plug(&lab, &srv, "eth0", "brs", "198.19.0.10/24");
    srv.route(&["default", "via", "198.19.0.1"]).unwrap();
    for (i, node) in [&ia, &ib, &oa, &ob].into_iter().enumerate() {
        let host = 11 + i % 2;
        let inside = i < 2;
        let (main_br, main_net) = if inside {
            ("brl", "198.18.200")
        } else {
            ("brs", "198.19.0")
        };
        plug(
            &lab,
            node,
            "eth0",
            main_br,
            &format!("{main_net}.{host}/24"),
        );
        for k in 0..2 {
            let (br, third) = if inside {
                (format!("bi{k}"), 20 + k)
            } else {
                (format!("bo{k}"), 30 + k)
            };
            plug(
                &lab,
                node,
                &format!("fw{k}"),
                &br,
                &format!("198.18.{third}.{host}/24"),
            );
        }
        for (key, v) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ] {
            node.sysctl(key, v).unwrap();
        }
    }
    lab.veth(&ia, "sync0", &ib, "sync0").unwrap();
    ia.addr("sync0", "198.18.254.1/30").unwrap();
    ib.addr("sync0", "198.18.254.2/30").unwrap();
    lab.veth(&oa, "sync0", &ob, "sync0").unwrap();
    oa.addr("sync0", "198.18.254.5/30").unwrap();
    ob.addr("sync0", "198.18.254.6/30").unwrap();
    for (k, fw) in [&fw0, &fw1].into_iter().enumerate() {
        plug(
            &lab,
            fw,
            "in",
            &format!("bi{k}"),
            &format!("198.18.{}.2/24", 20 + k),
        );
        plug(
            &lab,
            fw,
            "out",
            &format!("bo{k}"),
            &format!("198.18.{}.2/24", 30 + k),
        );
        fw.route(&["198.18.200.0/24", "via", &format!("198.18.{}.1", 20 + k)])
            .unwrap();
        fw.route(&["198.19.0.0/24", "via", &format!("198.18.{}.1", 30 + k)])
            .unwrap();
        fw.sysctl("net.ipv4.ip_forward", "1").unwrap();
        let out = fw
            .command("nft", &["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                c.stdin
                    .take()
                    .unwrap()
                    .write_all(STATEFUL_FIREWALL.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        assert!(out.status.success(), "firewall rules");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let push = Arc::new(AtomicBool::new(false));
    serve(&srv, ASK, stop.clone(), {
        let push = push.clone();
        move |s, peer, stop| ask_server(s, peer, stop, push.clone())
    });
    serve(&srv, DOWNLOAD, stop.clone(), |s, _, stop| {
        download_server(s, stop)
    });
    Sandwich {
        lab,
        cl,
        inside: [ia, ib],
        outside: [oa, ob],
        stop,
        push,
    }
}

/// One side of the sandwich: `main` is the side's own segment ("198.18.200" or "198.19.0"),
/// `third` the first firewall segment's third octet (20 inside, 30 outside).
fn sandwich_config(
    node: &str,
    vrid: u8,
    priority: u8,
    peer: &str,
    main: &str,
    third: u8,
    target: &str,
) -> String {
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token = "lab-admin-token-0123456789"

[ha]
node = "{node}"
interface = "eth0"
vrid = {vrid}
priority = {priority}
advert_interval = "100ms"
vips = ["{main}.1/24", "198.18.{t0}.1/24 dev fw0", "198.18.{t1}.1/24 dev fw1"]
conntrack_sync = {{ interface = "sync0", peer = "{peer}" }}

[[monitor]]
name = "through"
type = "icmp"
targets = ["{target}"]
interval = "300ms"
timeout = "300ms"
rise = 1
fall = 3

[[pool]]
name = "firewalls"
kind = "gateway"
[[pool.member]]
name = "fw0"
address = "198.18.{t0}.2"
interface = "fw0"
monitors = ["through"]
[[pool.member]]
name = "fw1"
address = "198.18.{t1}.2"
interface = "fw1"
monitors = ["through"]

[[gateway_service]]
name = "fw"
interfaces = ["eth0"]
pool = "firewalls"
hash = "symmetric"
"#,
        t0 = third,
        t1 = third + 1,
    )
}

#[test]
fn flows_through_a_firewall_sandwich_of_two_pairs_survive_each_side_failing() {
    let mut n = sandwich_net();
    let (inside, outside) = (n.inside.clone(), n.outside.clone());
    let [ia, ib] = start_pair(
        &mut n.lab,
        [&inside[0], &inside[1]],
        [
            sandwich_config(
                "ia",
                71,
                200,
                "198.18.254.2",
                "198.18.200",
                20,
                "198.19.0.10",
            ),
            sandwich_config(
                "ib",
                71,
                100,
                "198.18.254.1",
                "198.18.200",
                20,
                "198.19.0.10",
            ),
        ],
        2,
    );
    let [oa, ob] = start_pair(
        &mut n.lab,
        [&outside[0], &outside[1]],
        [
            sandwich_config(
                "oa",
                72,
                200,
                "198.18.254.6",
                "198.19.0",
                30,
                "198.18.200.2",
            ),
            sandwich_config(
                "ob",
                72,
                100,
                "198.18.254.5",
                "198.19.0",
                30,
                "198.18.200.2",
            ),
        ],
        2,
    );
    // Members start up, but the inside pair's probes cross the firewalls to the server, which
    // needs the outside pair's VIPs: they may go down, then come back once the outside pair
    // holds them. Hold connections once a flow gets through.
    let through = || {
        n.cl.thread(|| {
            let s = TcpStream::connect_timeout(&ASK.parse().unwrap(), Duration::from_secs(1))?;
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            ask(&mut BufReader::new(s))
        })
        .join()
        .ok()
        .and_then(|r| r.ok())
        .is_some_and(|r| r.is_ok())
    };
    assert!(
        wait_for(Duration::from_secs(20), through),
        "no flow through the sandwich\n{}\n{}",
        ia.logs(),
        oa.logs()
    );
    let held = hold(&n.cl, 4);
    for (_, who) in &held {
        assert_eq!(who, "198.18.200.2", "the server sees the client itself");
    }
    let (download, received) = download(&n.cl);
    wait_received(&received, TOTAL / 5);
    // The inside master dies, then (once the download moves again) the outside one.
    machine_dies(&mut n.lab, &ia, &ib, &["eth0", "fw0", "fw1", "sync0"]);
    let moved = received.load(Ordering::Relaxed) as usize;
    wait_received(&received, moved + TOTAL / 5);
    machine_dies(&mut n.lab, &oa, &ob, &["eth0", "fw0", "fw1", "sync0"]);
    let outcome = download.join().unwrap().unwrap();
    assert_eq!(
        outcome,
        Ok(()),
        "download broke\n{}\n{}",
        ib.logs(),
        ob.logs()
    );
    assert_eq!(received.load(Ordering::Relaxed), TOTAL as u64);
    held_connections_go_on(&n.cl, &n.push, held);
    assert_eq!(fresh_flow(&n.cl), "198.18.200.2");
}

//! Scale-out (active-active): two Fulcrum nodes each drive their own BGP speaker (BIRD, or
//! gobgpd through its gRPC API), which peers over eBGP with a router namespace running BIRD
//! with ECMP (`merge paths`) into its kernel table; a client sits behind the router. The VIPs
//! (an IPv4 /32 and an IPv6 /128) are on each node's loopback. Everything runs inside
//! namespaces the tests create (198.18.0.0/15, 2001:db8::/32).
//!
//!   c (198.18.3.2, 2001:db8:3::2) ── r ──┬── a (198.18.1.2, 2001:db8:1::2, VIPs on lo, speaker AS 65001 + Fulcrum)
//!                                        └── b (198.18.2.2, 2001:db8:2::2, VIPs on lo, speaker AS 65001 + Fulcrum)

#[path = "common/lab.rs"]
mod lab;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_testkit::netns::{Lab, Ns};
use lab::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const VIP: &str = "198.18.100.1";
const VIP6: &str = "2001:db8:100::1";

fn web() -> SocketAddr {
    SocketAddr::from(([198, 18, 100, 1], 80))
}

fn echo_addr() -> SocketAddr {
    SocketAddr::from(([198, 18, 100, 1], 7000))
}

fn web6() -> SocketAddr {
    SocketAddr::new(VIP6.parse().expect("VIP6"), 80)
}

fn echo6() -> SocketAddr {
    SocketAddr::new(VIP6.parse().expect("VIP6"), 7000)
}

/// Which daemon each node's Fulcrum drives.
#[derive(Clone, Copy, PartialEq)]
enum Speaker {
    /// BIRD, IPv4 only.
    Bird,
    /// BIRD with an IPv4 and an IPv6 session and VIP.
    BirdDual,
    /// gobgpd with an IPv4 and an IPv6 session and VIP.
    Gobgp,
}

/// A node's Fulcrum with both VIPs, each with an HTTP and a TCP service, announced through
/// gobgpd or (`bird`) BIRD.
fn dual_node_config(name: &str, dir: &Path, bird: bool) -> String {
    let d = dir.display();
    let speaker = if bird {
        format!("speaker = \"bird\"\ncontrol = \"{d}/bird.ctl\"\ninclude = \"{d}/announce.conf\"")
    } else {
        "speaker = \"gobgp\"\ncontrol = \"127.0.0.1:50051\"".to_string()
    };
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token = "{ADMIN_TOKEN}"
state_file = "{d}/state.json"

[ha]
mode = "active_active"
node = "{name}"

[bgp]
{speaker}
announce = ["{VIP}/32", "{VIP6}/128"]

[[virtual_service]]
name = "web"
listen = ["{VIP}:80", "[{VIP6}]:80"]
protocol = "http"
pool = "local"

[[virtual_service]]
name = "echo"
listen = ["{VIP}:7000", "[{VIP6}]:7000"]
protocol = "tcp"
pool = "echo"

[[pool]]
name = "local"
monitors = ["up"]
reuse = "never"
[[pool.member]]
address = "127.0.0.1:8080"

[[pool]]
name = "echo"
monitors = ["up"]
[[pool.member]]
address = "127.0.0.1:7001"

[[monitor]]
name = "up"
type = "tcp"
interval = "100ms"
timeout = "100ms"
fall = 2
rise = 2
"#
    )
}

/// gobgpd on a node: eBGP to the router over IPv4 (IPv4 unicast) and over IPv6 (IPv6
/// unicast); Fulcrum adds the paths through the API, gobgpd's default export sends them.
fn node_gobgp(router_id: &str, net: u8) -> String {
    format!(
        r#"[global.config]
  as = 65001
  router-id = "{router_id}"

[[neighbors]]
  [neighbors.config]
    neighbor-address = "198.18.{net}.1"
    peer-as = 65000
  [neighbors.timers.config]
    connect-retry = 1
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "ipv4-unicast"

[[neighbors]]
  [neighbors.config]
    neighbor-address = "2001:db8:{net}::1"
    peer-as = 65000
  [neighbors.timers.config]
    connect-retry = 1
  [[neighbors.afi-safis]]
    [neighbors.afi-safis.config]
      afi-safi-name = "ipv6-unicast"
"#
    )
}

/// A node's Fulcrum: an HTTP service and a TCP service on the VIP, each in front of a local
/// backend checked every 100 ms.
fn node_config(name: &str, dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token = "{ADMIN_TOKEN}"
state_file = "{d}/state.json"

[ha]
mode = "active_active"
node = "{name}"

[bgp]
speaker = "bird"
control = "{d}/bird.ctl"
include = "{d}/announce.conf"
announce = ["{VIP}/32"]

[[virtual_service]]
name = "web"
listen = ["{VIP}:80"]
protocol = "http"
pool = "local"

[[virtual_service]]
name = "echo"
listen = ["{VIP}:7000"]
protocol = "tcp"
pool = "echo"

[[pool]]
name = "local"
monitors = ["up"]
reuse = "never"
[[pool.member]]
address = "127.0.0.1:8080"

[[pool]]
name = "echo"
monitors = ["up"]
[[pool.member]]
address = "127.0.0.1:7001"

[[monitor]]
name = "up"
type = "tcp"
interval = "100ms"
timeout = "100ms"
fall = 2
rise = 2
"#
    )
}

/// BIRD on a node: a BGP session to the router exporting only Fulcrum's static protocol.
fn node_bird(router_id: &str, router: &str, include: &Path, router6: Option<&str>) -> String {
    let v6 = router6.map_or(String::new(), |r6| {
        format!(
            r#"protocol bgp uplink6 {{
  local as 65001;
  neighbor {r6} as 65000;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 5;
  ipv6 {{ import none; export where proto = "fulcrum6"; next hop self; }};
}}
"#
        )
    });
    let v4 = format!(
        r#"router id {router_id};
protocol device {{ scan time 10; }}
include "{}";
protocol bgp uplink {{
  local as 65001;
  neighbor {router} as 65000;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 5;
  ipv4 {{ import none; export where proto = "fulcrum4"; next hop self; }};
}}
"#,
        include.display()
    );
    v4 + &v6
}

/// BIRD on the router: sessions to both nodes (IPv4; and IPv6 for dual-stack nodes),
/// equal-cost paths merged into one kernel route per family.
fn router_bird(v6: bool) -> String {
    let mut conf = String::from(
        r#"router id 198.18.3.1;
protocol device { scan time 10; }
protocol kernel {
  merge paths yes;
  ipv4 { import none; export all; };
}
protocol kernel {
  merge paths yes;
  ipv6 { import none; export all; };
}
template bgp node {
  local as 65000;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 5;
  ipv4 { import all; export none; };
}
template bgp node6 {
  local as 65000;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 5;
  ipv6 { import all; export none; };
}
protocol bgp a from node { neighbor 198.18.1.2 as 65001; }
protocol bgp b from node { neighbor 198.18.2.2 as 65001; }
"#,
    );
    if v6 {
        conf.push_str(
            "protocol bgp a6 from node6 { neighbor 2001:db8:1::2 as 65001; }\nprotocol bgp b6 from node6 { neighbor 2001:db8:2::2 as 65001; }\n",
        );
    }
    conf
}

/// A TCP server on 127.0.0.1:7001 inside a namespace: says its name, then echoes lines.
struct Echo {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Echo {
    fn start(ns: &Ns, name: &str) -> Echo {
        let stop = Arc::new(AtomicBool::new(false));
        let path = format!("/var/run/netns/{}", ns.name);
        let (s, name) = (stop.clone(), name.to_string());
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            enter(&path);
            let l = TcpListener::bind("127.0.0.1:7001").expect("echo bind");
            l.set_nonblocking(true).expect("nonblocking");
            let _ = tx.send(());
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        let name = name.clone();
                        std::thread::spawn(move || {
                            let _ = c.set_nonblocking(false);
                            let _ = writeln!(c, "{name}");
                            let mut r = BufReader::new(c.try_clone().expect("clone"));
                            let mut line = String::new();
                            while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                                if c.write_all(line.as_bytes()).is_err() {
                                    return;
                                }
                                line.clear();
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(5)).expect("echo ready");
        Echo {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A long-lived TCP connection from the client namespace through the VIP's TCP service.
struct Flow {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    /// The node whose backend answered.
    node: String,
}

impl Flow {
    fn open(c: &Ns) -> Result<Flow, String> {
        Flow::open_to(c, echo_addr())
    }

    fn open_to(c: &Ns, to: SocketAddr) -> Result<Flow, String> {
        let stream = in_ns(c, move || {
            TcpStream::connect_timeout(&to, Duration::from_millis(500))
        })
        .map_err(|e| format!("connect: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
        let mut node = String::new();
        reader
            .read_line(&mut node)
            .map_err(|e| format!("greeting: {e}"))?;
        Ok(Flow {
            stream,
            reader,
            node: node.trim().to_string(),
        })
    }

    /// One echoed line.
    fn ping(&mut self, text: &str) -> Result<(), String> {
        writeln!(self.stream, "{text}").map_err(|e| format!("write: {e}"))?;
        let mut line = String::new();
        self.reader
            .read_line(&mut line)
            .map_err(|e| format!("read: {e}"))?;
        if line.trim() == text {
            Ok(())
        } else {
            Err(format!("echoed {line:?}"))
        }
    }
}

struct Node {
    ns: Ns,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
    speaker: Speaker,
    /// The speaker daemon's process in the lab.
    daemon: usize,
    backend: Option<Backend>,
    echo: Option<Echo>,
}

impl Node {
    fn config(&self, name: &str) -> String {
        match self.speaker {
            Speaker::Bird => node_config(name, &self.dir),
            Speaker::BirdDual => dual_node_config(name, &self.dir, true),
            Speaker::Gobgp => dual_node_config(name, &self.dir, false),
        }
    }

    /// `gobgp global rib -a FAMILY` in the node (gobgpd's own CLI, through the same API).
    fn gobgp_rib(&self, family: &str) -> String {
        let out = self
            .ns
            .exec(
                "gobgp",
                &[
                    "-u",
                    "127.0.0.1",
                    "-p",
                    "50051",
                    "global",
                    "rib",
                    "-a",
                    family,
                ],
            )
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        out
    }

    fn start_gobgp(&mut self, lab: &mut Lab, router_id: &str, net: u8) {
        let conf = self.dir.join("gobgpd.toml");
        std::fs::write(&conf, node_gobgp(router_id, net)).expect("gobgpd.toml");
        self.daemon = lab
            .spawn(
                &self.ns,
                "gobgpd",
                &[
                    "-f",
                    &conf.display().to_string(),
                    "--api-hosts",
                    "127.0.0.1:50051",
                    "--pprof-disable",
                    "-p",
                    "-l",
                    "warn",
                ],
            )
            .expect("gobgpd");
        let ns = self.ns.clone();
        assert!(
            wait_for(Duration::from_secs(10), || ns
                .exec("gobgp", &["-u", "127.0.0.1", "-p", "50051", "global"])
                .is_ok_and(|o| o.status.success())),
            "gobgpd in {} did not start",
            self.ns.name
        );
    }

    fn start_daemon(&mut self, lab: &mut Lab, net: u8) {
        let (id, router) = (format!("198.18.{net}.2"), format!("198.18.{net}.1"));
        match self.speaker {
            Speaker::Bird | Speaker::BirdDual => self.start_bird(lab, &id, &router),
            Speaker::Gobgp => self.start_gobgp(lab, &id, net),
        }
    }

    fn birdc(&self, cmd: &str) -> String {
        let sock = self.dir.join("bird.ctl");
        let out = std::process::Command::new("birdc")
            .args(["-s", &sock.display().to_string(), cmd])
            .output()
            .expect("birdc");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn start_bird(&mut self, lab: &mut Lab, router_id: &str, router: &str) {
        let conf = self.dir.join("bird.conf");
        std::fs::write(
            &conf,
            node_bird(
                router_id,
                router,
                &self.dir.join("announce.conf"),
                // 198.18.N.1 → 2001:db8:N::1
                (self.speaker == Speaker::BirdDual)
                    .then(|| format!("2001:db8:{}::1", router.split('.').nth(2).unwrap_or("0")))
                    .as_deref(),
            ),
        )
        .expect("bird.conf");
        let sock = self.dir.join("bird.ctl");
        let _ = std::fs::remove_file(&sock);
        self.daemon = lab
            .spawn(
                &self.ns,
                "bird",
                &[
                    "-f",
                    "-c",
                    &conf.display().to_string(),
                    "-s",
                    &sock.display().to_string(),
                    "-P",
                    &self.dir.join("bird.pid").display().to_string(),
                ],
            )
            .expect("bird");
        assert!(
            wait_for(Duration::from_secs(5), || sock.exists()),
            "BIRD in {} did not start",
            self.ns.name
        );
    }
}

struct Net {
    lab: Lab,
    r: Ns,
    c: Ns,
    a: Node,
    b: Node,
}

fn net(tag: &str, speaker: Speaker) -> Net {
    let mut lab = Lab::new(tag);
    let r = lab.ns("r").expect("ns r");
    let c = lab.ns("c").expect("ns c");
    r.sysctl("net.ipv4.ip_forward", "1").expect("forwarding");
    r.sysctl("net.ipv6.conf.all.forwarding", "1")
        .expect("forwarding");
    // Spread flows by ports too (not only addresses): one client, many flows.
    r.sysctl("net.ipv4.fib_multipath_hash_policy", "1")
        .expect("hash policy");
    r.sysctl("net.ipv6.fib_multipath_hash_policy", "1")
        .expect("hash policy");
    lab.veth(&r, "ethc", &c, "eth0").expect("veth c");
    r.addr("ethc", "198.18.3.1/24").expect("addr");
    c.addr("eth0", "198.18.3.2/24").expect("addr");
    c.route(&["default", "via", "198.18.3.1"]).expect("route");
    r.addr("ethc", "2001:db8:3::1/64").expect("addr");
    c.addr("eth0", "2001:db8:3::2/64").expect("addr");
    c.ip(&["-6", "route", "add", "default", "via", "2001:db8:3::1"])
        .expect("route");
    let mut nodes = Vec::new();
    for (name, net) in [("a", 1), ("b", 2)] {
        let ns = lab.ns(name).expect("ns");
        let rif = format!("eth{name}");
        lab.veth(&r, &rif, &ns, "eth0").expect("veth");
        r.addr(&rif, &format!("198.18.{net}.1/24")).expect("addr");
        ns.addr("eth0", &format!("198.18.{net}.2/24"))
            .expect("addr");
        ns.route(&["default", "via", &format!("198.18.{net}.1")])
            .expect("route");
        ns.addr("lo", &format!("{VIP}/32")).expect("vip");
        r.addr(&rif, &format!("2001:db8:{net}::1/64"))
            .expect("addr");
        ns.addr("eth0", &format!("2001:db8:{net}::2/64"))
            .expect("addr");
        ns.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &format!("2001:db8:{net}::1"),
        ])
        .expect("route");
        ns.addr("lo", &format!("{VIP6}/128")).expect("vip6");
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        // BIRD includes the fragment at start: Fulcrum has not written it yet.
        std::fs::write(dir.join("announce.conf"), "").expect("fragment");
        let local = SocketAddr::from(([127, 0, 0, 1], 8080));
        let mut node = Node {
            backend: Some(Backend::start(&ns, local, name)),
            echo: Some(Echo::start(&ns, name)),
            ns,
            dir,
            _tmp: tmp,
            speaker,
            daemon: 0,
        };
        node.start_daemon(&mut lab, net);
        nodes.push(node);
    }
    let conf = tempfile::NamedTempFile::new().expect("router conf");
    std::fs::write(conf.path(), router_bird(speaker != Speaker::Bird)).expect("router conf");
    let rdir = tempfile::tempdir().expect("router dir");
    let sock = router_ctl(&r);
    lab.spawn(
        &r,
        "bird",
        &[
            "-f",
            "-c",
            &conf.path().display().to_string(),
            "-s",
            &sock.display().to_string(),
            "-P",
            &rdir.path().join("pid").display().to_string(),
        ],
    )
    .expect("router bird");
    assert!(wait_for(Duration::from_secs(5), || sock.exists()));
    // BIRD read its config at start; the files can go with the test.
    std::mem::forget(rdir);
    drop(conf);
    let b = nodes.pop().expect("b");
    let a = nodes.pop().expect("a");
    Net { lab, r, c, a, b }
}

/// The router's BIRD control socket (named after its namespace, which is unique per run).
fn router_ctl(r: &Ns) -> PathBuf {
    std::env::temp_dir().join(format!("{}-bird.ctl", r.name))
}

/// What the router's BIRD says about its sessions and routes (for failure messages).
fn router_state(r: &Ns) -> String {
    ["show protocols", "show route"]
        .iter()
        .map(|cmd| {
            std::process::Command::new("birdc")
                .args(["-s", &router_ctl(r).display().to_string(), cmd])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                .unwrap_or_else(|e| e.to_string())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The router's next hops for the VIP.
fn next_hops(r: &Ns) -> Vec<String> {
    next_hops_of(r, &format!("{VIP}/32"))
}

/// The router's next hops for `prefix` (either family).
fn next_hops_of(r: &Ns, prefix: &str) -> Vec<String> {
    let family = if prefix.contains(':') { "-6" } else { "-4" };
    let out = r
        .ip(&[family, "route", "show", "exact", prefix])
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    let words: Vec<&str> = out.split_whitespace().collect();
    let mut hops: Vec<String> = words
        .windows(2)
        .filter(|w| w[0] == "via")
        .map(|w| w[1].to_string())
        .collect();
    hops.sort();
    hops
}

fn expect_hops(r: &Ns, want: &[&str], within: Duration, why: &str) -> Duration {
    expect_hops_of(r, &format!("{VIP}/32"), want, within, why)
}

fn expect_hops_of(r: &Ns, prefix: &str, want: &[&str], within: Duration, why: &str) -> Duration {
    let start = Instant::now();
    let ok = wait_for(within, || next_hops_of(r, prefix) == want);
    assert!(
        ok,
        "{why}: the router's route to {prefix} has next hops {:?}, expected {want:?}; router's BIRD:\n{}",
        next_hops_of(r, prefix),
        router_state(r)
    );
    start.elapsed()
}

const A: &str = "198.18.1.2";
const B: &str = "198.18.2.2";

/// Who answers `n` new connections from the client (each its own source port).
fn answers(c: &Ns, n: usize) -> Vec<Result<String, String>> {
    in_ns(c, move || {
        (0..n)
            .map(|_| http_get(web(), Duration::from_millis(500)))
            .collect()
    })
}

fn ha(f: &NsFulcrum) -> serde_json::Value {
    f.ha()
}

fn signal(lab: &Lab, index: usize, sig: i32) {
    let pid = lab.pid(index).expect("pid") as i32;
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    unsafe {
        libc::kill(pid, sig);
    }
}

#[test]
fn ecmp_over_two_nodes_loses_a_node_that_stops_or_dies_and_flows_on_the_survivor_continue() {
    let mut n = net("bgpe", Speaker::Bird);
    let fa = NsFulcrum::start(&mut n.lab, &n.a.ns, BIN, &n.a.config("a"));
    let fb = NsFulcrum::start(&mut n.lab, &n.b.ns, BIN, &n.b.config("b"));
    let t = expect_hops(&n.r, &[A, B], Duration::from_secs(20), "both nodes up");
    eprintln!("ECMP route with both next hops after {t:?}");
    let h = ha(&fa);
    assert_eq!(h["mode"], "active_active", "{h}");
    assert_eq!(h["bgp"]["reachable"], true, "{h}");
    assert_eq!(
        h["bgp"]["announced"],
        serde_json::json!([format!("{VIP}/32")])
    );
    assert_eq!(h["bgp"]["liveness_interface"], "fulcrum-bgp");
    assert!(
        wait_for(Duration::from_secs(5), || ha(&fa)["bgp"]["sessions"][0]
            ["info"]
            == "Established"),
        "{}",
        ha(&fa)
    );
    let (_, metrics) = api_raw(&n.a.ns, "GET", "/metrics", "");
    assert!(metrics.contains("fulcrum_bgp_speaker_up 1"), "{metrics}");
    assert!(
        metrics.contains(&format!(
            "fulcrum_bgp_prefix_announced{{prefix=\"{VIP}/32\"}} 1"
        )),
        "{metrics}"
    );
    assert!(metrics.contains("fulcrum_bgp_sessions_established 1"));
    // BIRD on the node holds the route through Fulcrum's liveness interface.
    assert!(n.a.birdc("show route").contains("fulcrum-bgp"));

    // New connections spread over both nodes.
    let seen = answers(&n.c, 40);
    let (on_a, on_b) = (
        seen.iter().filter(|r| r.as_deref() == Ok("a")).count(),
        seen.iter().filter(|r| r.as_deref() == Ok("b")).count(),
    );
    assert_eq!(on_a + on_b, 40, "failures: {seen:?}");
    assert!(on_a > 0 && on_b > 0, "a {on_a}, b {on_b}");

    // Long-lived flows through the VIP: keep one that hashes to b.
    let mut flows = Vec::new();
    for _ in 0..40 {
        let f = Flow::open(&n.c).expect("flow");
        let on_b = f.node == "b";
        flows.push(f);
        if on_b {
            break;
        }
    }
    let mut survivor = flows.pop().expect("a flow");
    assert_eq!(survivor.node, "b", "no flow hashed to b in 40 tries");
    survivor.ping("before").expect("echo before");

    // SIGTERM: a withdraws first, then drains.
    signal(&n.lab, fa.index, libc::SIGTERM);
    let t = expect_hops(&n.r, &[B], Duration::from_secs(10), "after SIGTERM of a");
    eprintln!("SIGTERM of a: next hop withdrawn on the router after {t:?}");
    // For bench/bgp.sh.
    eprintln!("bench: sigterm_withdrawn_ms={:.1}", t.as_secs_f64() * 1e3);
    survivor
        .ping("after-sigterm")
        .expect("the flow on b continues");
    let seen = answers(&n.c, 20);
    assert!(seen.iter().all(|r| r.as_deref() == Ok("b")), "{seen:?}");
    assert!(
        !n.a.birdc("show route").contains(VIP),
        "{}",
        n.a.birdc("show route")
    );
    // Its drain would wait for the flows still open to it: cut it short.
    n.lab.kill(fa.index);

    // a comes back: both next hops again.
    let fa = NsFulcrum::start(&mut n.lab, &n.a.ns, BIN, &n.a.config("a"));
    expect_hops(&n.r, &[A, B], Duration::from_secs(10), "a restarted");
    survivor.ping("a-back").expect("the flow on b continues");

    // kill -9: Fulcrum cannot withdraw, but its liveness interface dies with it and BIRD
    // withdraws the route by itself.
    // A client opens a new connection every 5 ms meanwhile: those that hash to a fail (a's
    // kernel resets them) until the router drops a's next hop, then b serves them all.
    let stop = Arc::new(AtomicBool::new(false));
    let client = client_loop(&n.c, web(), Duration::from_millis(5), 3000, stop.clone());
    assert!(
        wait_for(Duration::from_secs(2), || n
            .a
            .birdc("show route")
            .contains(VIP)),
        "a's BIRD lost the route before the kill"
    );
    let killed = Instant::now();
    n.lab.kill(fa.index);
    let t = expect_hops(&n.r, &[B], Duration::from_secs(10), "after kill -9 of a");
    let withdrawn = Instant::now();
    let settle = Duration::from_millis(300);
    wait_for(settle * 2, || withdrawn.elapsed() >= settle);
    stop.store(true, Ordering::Relaxed);
    let log = client.join().expect("client");
    let after: Vec<_> = log.results.iter().filter(|(at, _)| *at >= killed).collect();
    let failed: Vec<Duration> = after
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(at, _)| *at - killed)
        .collect();
    eprintln!(
        "kill -9 of a: next hop withdrawn on the router {:?} after the kill ({t:?} after the process was reaped); {} of {} new connections failed, the last {:?} after the kill",
        withdrawn - killed,
        failed.len(),
        after.len(),
        failed.iter().max()
    );
    eprintln!(
        "bench: kill9_withdrawn_ms={:.1} kill9_failed={} kill9_requests={} kill9_last_failure_ms={:.1}",
        (withdrawn - killed).as_secs_f64() * 1e3,
        failed.len(),
        after.len(),
        failed.iter().max().map_or(0.0, |d| d.as_secs_f64() * 1e3)
    );
    // Once the route has lost a (plus one client timeout), every new connection is served by b.
    let late: Vec<_> = after
        .iter()
        .filter(|(at, _)| *at > withdrawn + Duration::from_millis(250))
        .collect();
    assert!(!late.is_empty(), "the client stopped too early");
    assert!(
        late.iter().all(|(_, r)| r.as_deref() == Ok("b")),
        "{:?}",
        late.iter()
            .filter(|(_, r)| r.as_deref() != Ok("b"))
            .collect::<Vec<_>>()
    );
    survivor
        .ping("after-kill")
        .expect("the flow on b continues");
    let seen = answers(&n.c, 20);
    assert!(seen.iter().all(|r| r.as_deref() == Ok("b")), "{seen:?}");
    // BIRD in a still has the static protocol, with the route unreachable (not announced).
    assert!(n.a.birdc("show route").lines().all(|l| !l.contains(VIP)));
    drop(fb);
}

#[test]
fn a_node_withdraws_without_healthy_members_in_maintenance_and_reports_a_lost_bird() {
    let mut n = net("bgpw", Speaker::Bird);
    let fa = NsFulcrum::start(&mut n.lab, &n.a.ns, BIN, &n.a.config("a"));
    let fb = NsFulcrum::start(&mut n.lab, &n.b.ns, BIN, &n.b.config("b"));
    expect_hops(&n.r, &[A, B], Duration::from_secs(20), "both nodes up");

    // a's HTTP backend stops: the TCP service on the VIP still has a member, so a stays.
    if let Some(mut b) = n.a.backend.take() {
        b.stop();
    }
    assert!(
        wait_for(Duration::from_secs(5), || api(
            &n.a.ns,
            "GET",
            "/api/v1/pools/local"
        )
        .1["members"][0]["health"]
            == "down"),
        "the HTTP member of a never went down"
    );
    let h = ha(&fa);
    assert_eq!(h["bgp"]["prefixes"][0]["healthy"], true, "{h}");
    assert_eq!(next_hops(&n.r), [A, B]);
    // Its TCP backend stops too: no service of the VIP has a healthy member, so a withdraws.
    if let Some(mut e) = n.a.echo.take() {
        e.stop();
    }
    let t = expect_hops(&n.r, &[B], Duration::from_secs(10), "a without members");
    eprintln!("a's members down: next hop withdrawn after {t:?} (checks every 100 ms, fall 2)");
    let h = ha(&fa);
    assert_eq!(h["bgp"]["announced"], serde_json::json!([]), "{h}");
    assert_eq!(h["bgp"]["prefixes"][0]["healthy"], false);
    let seen = answers(&n.c, 10);
    assert!(seen.iter().all(|r| r.as_deref() == Ok("b")), "{seen:?}");
    // Members back: announced again.
    n.a.backend = Some(Backend::start(
        &n.a.ns,
        SocketAddr::from(([127, 0, 0, 1], 8080)),
        "a",
    ));
    expect_hops(&n.r, &[A, B], Duration::from_secs(10), "a's members back");

    // Maintenance withdraws b; ending it announces again (and it is saved through the API).
    let (st, body) = api_with(
        &n.b.ns,
        "PUT",
        "/api/v1/ha/maintenance",
        r#"{"maintenance":true}"#,
    );
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["maintenance"], true);
    expect_hops(&n.r, &[A], Duration::from_secs(10), "b in maintenance");
    let (_, metrics) = api_raw(&n.b.ns, "GET", "/metrics", "");
    assert!(metrics.contains("fulcrum_bgp_maintenance 1"), "{metrics}");
    let seen = answers(&n.c, 10);
    assert!(seen.iter().all(|r| r.as_deref() == Ok("a")), "{seen:?}");
    // Maintenance is kept in admin.state_file: b killed and restarted stays out.
    n.lab.kill(fb.index);
    let fb = NsFulcrum::start(&mut n.lab, &n.b.ns, BIN, &n.b.config("b"));
    assert!(
        wait_for(Duration::from_secs(5), || ha(&fb)["bgp"]["reachable"]
            == true),
        "{}",
        ha(&fb)
    );
    let h = ha(&fb);
    assert_eq!(h["maintenance"], true, "{h}");
    assert_eq!(h["bgp"]["announced"], serde_json::json!([]), "{h}");
    assert_eq!(next_hops(&n.r), [A]);
    let (st, _) = api_with(
        &n.b.ns,
        "PUT",
        "/api/v1/ha/maintenance",
        r#"{"maintenance":false}"#,
    );
    assert_eq!(st, 200);
    expect_hops(
        &n.r,
        &[A, B],
        Duration::from_secs(10),
        "b out of maintenance",
    );
    let (st, _) = api_with(&n.b.ns, "PUT", "/api/v1/ha/maintenance", r#"{"on":1}"#);
    assert_eq!(st, 400);

    // A reload that would announce a second prefix but is refused at a later step (a
    // listener on a port that is taken) announces nothing new.
    let taken = in_ns(&n.b.ns, || {
        std::net::TcpListener::bind("0.0.0.0:8099").unwrap()
    });
    let refused = n.b.config("b").replace(
        &format!("announce = [\"{VIP}/32\"]"),
        &format!("announce = [\"{VIP}/32\", \"198.18.99.1/32\"]"),
    ) + "\n[[virtual_service]]\nname = \"more\"\nlisten = [\"198.18.99.1:80\"]\nprotocol = \"tcp\"\npool = \"echo\"\n\n[[virtual_service]]\nname = \"taken\"\nlisten = [\"0.0.0.0:8099\"]\nprotocol = \"tcp\"\npool = \"echo\"\n";
    assert!(refused.contains("198.18.99.1/32"));
    std::fs::write(fb.dir.path().join("fulcrum.toml"), &refused).unwrap();
    let (st, body) = api_with(&n.b.ns, "POST", "/api/v1/reload", "");
    assert_eq!(st, 400, "{body}");
    std::thread::sleep(Duration::from_millis(500)); // the announcer's next rounds
    let h = ha(&fb);
    assert_eq!(
        h["bgp"]["prefixes"].as_array().map(Vec::len),
        Some(1),
        "a refused reload changed the announced prefixes: {h}"
    );
    assert!(next_hops_of(&n.r, "198.18.99.1").is_empty());
    assert_eq!(next_hops(&n.r), [A, B]);
    std::fs::write(fb.dir.path().join("fulcrum.toml"), n.b.config("b")).unwrap();
    drop(taken);

    // BIRD on b dies: Fulcrum reports it, keeps serving, and when BIRD is back (reading the
    // fragment Fulcrum keeps) the prefix is announced again and Fulcrum reconnects.
    n.lab.kill(n.b.daemon);
    assert!(
        wait_for(Duration::from_secs(5), || ha(&fb)["bgp"]["reachable"]
            == false),
        "{}",
        ha(&fb)
    );
    // The broken connection first, then the failed reconnections name the socket.
    assert!(
        wait_for(Duration::from_secs(5), || ha(&fb)["bgp"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("bird.ctl"))),
        "{}",
        ha(&fb)
    );
    assert_eq!(ha(&fb)["bgp"]["sessions"], serde_json::json!([]));
    let (_, metrics) = api_raw(&n.b.ns, "GET", "/metrics", "");
    assert!(metrics.contains("fulcrum_bgp_speaker_up 0"), "{metrics}");
    assert_eq!(api(&n.b.ns, "GET", "/api/v1/status").0, 200);
    n.b.start_bird(&mut n.lab, B, "198.18.2.1");
    expect_hops(&n.r, &[A, B], Duration::from_secs(15), "b's BIRD restarted");
    assert!(
        wait_for(Duration::from_secs(5), || ha(&fb)["bgp"]["reachable"]
            == true),
        "{}",
        ha(&fb)
    );
}

/// Whether process `pid` exists and is not a zombie.
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

const A6: &str = "2001:db8:1::2";
const B6: &str = "2001:db8:2::2";

fn expect_both(r: &Ns, v4: &[&str], v6: &[&str], within: Duration, why: &str) -> Duration {
    let start = Instant::now();
    expect_hops(r, v4, within, why);
    expect_hops_of(r, &format!("{VIP6}/128"), v6, within, why);
    start.elapsed()
}

/// Who answers `n` new connections from the client to the IPv6 VIP.
fn answers6(c: &Ns, n: usize) -> Vec<Result<String, String>> {
    in_ns(c, move || {
        (0..n)
            .map(|_| http_get(web6(), Duration::from_millis(500)))
            .collect()
    })
}

#[test]
fn gobgp_announces_both_families_withdraws_on_maintenance_and_kill_and_re_adds_after_a_gobgpd_restart(
) {
    let mut n = net("bgpg", Speaker::Gobgp);
    let fa = NsFulcrum::start(&mut n.lab, &n.a.ns, BIN, &n.a.config("a"));
    let fb = NsFulcrum::start(&mut n.lab, &n.b.ns, BIN, &n.b.config("b"));
    let t = expect_both(
        &n.r,
        &[A, B],
        &[A6, B6],
        Duration::from_secs(30),
        "both nodes up",
    );
    eprintln!("ECMP routes (IPv4 and IPv6) with both next hops after {t:?}");
    let h = ha(&fa);
    assert_eq!(h["bgp"]["speaker"], "gobgp", "{h}");
    assert_eq!(h["bgp"]["control"], "127.0.0.1:50051", "{h}");
    assert_eq!(h["bgp"]["reachable"], true, "{h}");
    assert_eq!(
        h["bgp"]["announced"],
        serde_json::json!([format!("{VIP}/32"), format!("{VIP6}/128")]),
        "{h}"
    );
    assert!(h["bgp"]["watchdog_pid"].as_u64().is_some(), "{h}");
    // Both sessions (IPv4 and IPv6 neighbours) come from ListPeer.
    assert!(
        wait_for(Duration::from_secs(10), || {
            let s = &ha(&fa)["bgp"]["sessions"];
            s.as_array().is_some_and(|s| {
                s.len() == 2
                    && s.iter()
                        .all(|x| x["info"] == "Established" && x["state"] == "up")
            })
        }),
        "{}",
        ha(&fa)
    );
    let (_, metrics) = api_raw(&n.a.ns, "GET", "/metrics", "");
    assert!(metrics.contains("fulcrum_bgp_speaker_up 1"), "{metrics}");
    assert!(
        metrics.contains("fulcrum_bgp_sessions_established 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "fulcrum_bgp_prefix_announced{{prefix=\"{VIP6}/128\"}} 1"
        )),
        "{metrics}"
    );
    // gobgpd's own CLI sees the paths Fulcrum added.
    assert!(n.a.gobgp_rib("ipv4").contains(&format!("{VIP}/32")));
    assert!(n.a.gobgp_rib("ipv6").contains(&format!("{VIP6}/128")));

    // New connections spread over both nodes, in both families.
    for (family, seen) in [("IPv4", answers(&n.c, 40)), ("IPv6", answers6(&n.c, 40))] {
        let on_a = seen.iter().filter(|r| r.as_deref() == Ok("a")).count();
        let on_b = seen.iter().filter(|r| r.as_deref() == Ok("b")).count();
        assert_eq!(on_a + on_b, 40, "{family} failures: {seen:?}");
        assert!(on_a > 0 && on_b > 0, "{family}: a {on_a}, b {on_b}");
    }

    // Maintenance withdraws a's paths from gobgpd (DeletePath), ending it adds them again.
    let (st, _) = api_with(
        &n.a.ns,
        "PUT",
        "/api/v1/ha/maintenance",
        r#"{"maintenance":true}"#,
    );
    assert_eq!(st, 200);
    expect_both(
        &n.r,
        &[B],
        &[B6],
        Duration::from_secs(10),
        "a in maintenance",
    );
    assert!(
        !n.a.gobgp_rib("ipv4").contains(VIP),
        "{}",
        n.a.gobgp_rib("ipv4")
    );
    // Fulcrum owns its announce prefixes in gobgpd: a path of one that it did not add (left by
    // an earlier instance whose watchdog died with it; here added by hand) is deleted.
    let added =
        n.a.ns
            .exec(
                "gobgp",
                &[
                    "-u",
                    "127.0.0.1",
                    "-p",
                    "50051",
                    "global",
                    "rib",
                    "add",
                    "-a",
                    "ipv4",
                    &format!("{VIP}/32"),
                ],
            )
            .expect("gobgp rib add");
    assert!(added.status.success(), "{added:?}");
    assert!(
        wait_for(Duration::from_secs(6), || !n
            .a
            .gobgp_rib("ipv4")
            .contains(VIP)),
        "the stray path stayed: {}",
        n.a.gobgp_rib("ipv4")
    );
    expect_both(
        &n.r,
        &[B],
        &[B6],
        Duration::from_secs(5),
        "stray path deleted",
    );
    let (st, _) = api_with(
        &n.a.ns,
        "PUT",
        "/api/v1/ha/maintenance",
        r#"{"maintenance":false}"#,
    );
    assert_eq!(st, 200);
    expect_both(
        &n.r,
        &[A, B],
        &[A6, B6],
        Duration::from_secs(10),
        "a out of maintenance",
    );

    // A long-lived IPv6 flow that hashes to b.
    let mut flows = Vec::new();
    for _ in 0..40 {
        let f = Flow::open_to(&n.c, echo6()).expect("flow");
        let on_b = f.node == "b";
        flows.push(f);
        if on_b {
            break;
        }
    }
    let mut survivor = flows.pop().expect("a flow");
    assert_eq!(survivor.node, "b", "no IPv6 flow hashed to b in 40 tries");
    survivor.ping("before").expect("echo before");

    // kill -9 of a: gobgpd keeps API paths after the client is gone; a's watchdog sees its
    // pipe close and deletes them. Meanwhile a client opens a new IPv6 connection every 5 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let client = client_loop(&n.c, web6(), Duration::from_millis(5), 3000, stop.clone());
    let watchdog = ha(&fa)["bgp"]["watchdog_pid"]
        .as_u64()
        .expect("watchdog pid") as i32;
    // As systemd does when the main process of a unit dies, SIGTERM reaches the rest of the
    // cgroup (here even first): the watchdog ignores it and withdraws anyway.
    // SAFETY: kill(2) on the watchdog this test's Fulcrum started (its pid from the API).
    unsafe {
        libc::kill(watchdog, libc::SIGTERM);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(running(watchdog), "SIGTERM ended the watchdog");
    let killed = Instant::now();
    n.lab.kill(fa.index);
    let t = expect_both(
        &n.r,
        &[B],
        &[B6],
        Duration::from_secs(10),
        "after kill -9 of a",
    );
    let withdrawn = Instant::now();
    let settle = Duration::from_millis(300);
    wait_for(settle * 2, || withdrawn.elapsed() >= settle);
    stop.store(true, Ordering::Relaxed);
    let log = client.join().expect("client");
    let after: Vec<_> = log.results.iter().filter(|(at, _)| *at >= killed).collect();
    let failed: Vec<Duration> = after
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(at, _)| *at - killed)
        .collect();
    eprintln!(
        "gobgp: kill -9 of a: next hops withdrawn on the router {:?} after the kill ({t:?} after the process was reaped); {} of {} new IPv6 connections failed",
        withdrawn - killed,
        failed.len(),
        after.len(),
    );
    eprintln!(
        "bench: gobgp_kill9_withdrawn_ms={:.1} gobgp_kill9_failed={} gobgp_kill9_requests={}",
        (withdrawn - killed).as_secs_f64() * 1e3,
        failed.len(),
        after.len()
    );
    let late: Vec<_> = after
        .iter()
        .filter(|(at, _)| *at > withdrawn + Duration::from_millis(250))
        .collect();
    assert!(!late.is_empty(), "the client stopped too early");
    assert!(
        late.iter().all(|(_, r)| r.as_deref() == Ok("b")),
        "{:?}",
        late.iter()
            .filter(|(_, r)| r.as_deref() != Ok("b"))
            .collect::<Vec<_>>()
    );
    survivor
        .ping("after-kill")
        .expect("the IPv6 flow on b continues");
    let seen = answers(&n.c, 10);
    assert!(seen.iter().all(|r| r.as_deref() == Ok("b")), "{seen:?}");
    assert!(
        !n.a.gobgp_rib("ipv6").contains(VIP6),
        "{}",
        n.a.gobgp_rib("ipv6")
    );
    // Its work done, the watchdog has exited (a zombie at most: it was Fulcrum's child).
    assert!(
        wait_for(Duration::from_secs(5), || !running(watchdog)),
        "the watchdog {watchdog} is still running"
    );

    // a comes back.
    let fa = NsFulcrum::start(&mut n.lab, &n.a.ns, BIN, &n.a.config("a"));
    expect_both(
        &n.r,
        &[A, B],
        &[A6, B6],
        Duration::from_secs(15),
        "a restarted",
    );
    survivor.ping("a-back").expect("the flow on b continues");

    // gobgpd on b restarts and forgets the API's paths: Fulcrum notices (ListPath) and adds
    // them again.
    n.lab.kill(n.b.daemon);
    expect_both(
        &n.r,
        &[A],
        &[A6],
        Duration::from_secs(15),
        "b's gobgpd killed",
    );
    assert!(
        wait_for(Duration::from_secs(5), || ha(&fb)["bgp"]["reachable"]
            == false),
        "{}",
        ha(&fb)
    );
    let (_, metrics) = api_raw(&n.b.ns, "GET", "/metrics", "");
    assert!(metrics.contains("fulcrum_bgp_speaker_up 0"), "{metrics}");
    n.b.start_daemon(&mut n.lab, 2);
    let t = expect_both(
        &n.r,
        &[A, B],
        &[A6, B6],
        Duration::from_secs(20),
        "b's gobgpd restarted",
    );
    eprintln!("b's gobgpd restarted: paths back on the router after {t:?}");
    assert_eq!(ha(&fb)["bgp"]["reachable"], true);

    // SIGTERM: a withdraws itself, then its watchdog finds nothing left to delete.
    signal(&n.lab, fa.index, libc::SIGTERM);
    let t = expect_both(
        &n.r,
        &[B],
        &[B6],
        Duration::from_secs(10),
        "after SIGTERM of a",
    );
    eprintln!("gobgp: SIGTERM of a: withdrawn after {t:?}");
    eprintln!(
        "bench: gobgp_sigterm_withdrawn_ms={:.1}",
        t.as_secs_f64() * 1e3
    );
    n.lab.kill(fa.index);

    // b's watchdog dies: b starts another and tells it its paths, which it then withdraws when
    // b is killed.
    let first = ha(&fb)["bgp"]["watchdog_pid"]
        .as_u64()
        .expect("watchdog pid") as i32;
    // SAFETY: kill(2) on the watchdog b's Fulcrum started (its pid from the API).
    unsafe {
        libc::kill(first, libc::SIGKILL);
    }
    assert!(
        wait_for(Duration::from_secs(5), || ha(&fb)["bgp"]["watchdog_pid"]
            .as_u64()
            .is_some_and(|p| p as i32 != first)),
        "{}",
        ha(&fb)
    );
    assert_eq!(next_hops(&n.r), [B]);
    // The API shows the new pid only after the announcer's round that started it, which also
    // wrote it the UUID line.
    n.lab.kill(fb.index);
    expect_both(
        &n.r,
        &[],
        &[],
        Duration::from_secs(10),
        "b killed after a new watchdog",
    );
}

#[test]
fn bird_announces_an_ipv6_vip_and_a_killed_node_is_withdrawn_while_ipv6_flows_on_the_survivor_continue(
) {
    let mut n = net("bgp6", Speaker::BirdDual);
    let fa = NsFulcrum::start(&mut n.lab, &n.a.ns, BIN, &n.a.config("a"));
    let _fb = NsFulcrum::start(&mut n.lab, &n.b.ns, BIN, &n.b.config("b"));
    let t = expect_both(
        &n.r,
        &[A, B],
        &[A6, B6],
        Duration::from_secs(30),
        "both nodes up",
    );
    eprintln!("BIRD: ECMP routes (IPv4 and IPv6) with both next hops after {t:?}");
    let h = ha(&fa);
    assert_eq!(
        h["bgp"]["announced"],
        serde_json::json!([format!("{VIP}/32"), format!("{VIP6}/128")]),
        "{h}"
    );
    // BIRD holds the IPv6 route in Fulcrum's fulcrum6 protocol, through the liveness interface.
    let routes = n.a.birdc("show route protocol fulcrum6");
    assert!(
        routes.contains(&format!("{VIP6}/128")) && routes.contains("fulcrum-bgp"),
        "{routes}"
    );
    let seen = answers6(&n.c, 40);
    let on_a = seen.iter().filter(|r| r.as_deref() == Ok("a")).count();
    let on_b = seen.iter().filter(|r| r.as_deref() == Ok("b")).count();
    assert_eq!(on_a + on_b, 40, "failures: {seen:?}");
    assert!(on_a > 0 && on_b > 0, "a {on_a}, b {on_b}");
    let mut flows = Vec::new();
    for _ in 0..40 {
        let f = Flow::open_to(&n.c, echo6()).expect("flow");
        let on_b = f.node == "b";
        flows.push(f);
        if on_b {
            break;
        }
    }
    let mut survivor = flows.pop().expect("a flow");
    assert_eq!(survivor.node, "b", "no IPv6 flow hashed to b in 40 tries");
    survivor.ping("before").expect("echo before");
    // kill -9: the TUN interface goes with the process, BIRD withdraws both families.
    n.lab.kill(fa.index);
    let t = expect_both(
        &n.r,
        &[B],
        &[B6],
        Duration::from_secs(10),
        "after kill -9 of a",
    );
    eprintln!(
        "BIRD: kill -9 of a: IPv4 and IPv6 next hops withdrawn {t:?} after the process was reaped"
    );
    survivor
        .ping("after-kill")
        .expect("the IPv6 flow on b continues");
    let seen = answers6(&n.c, 20);
    assert!(seen.iter().all(|r| r.as_deref() == Ok("b")), "{seen:?}");
}

/// A BIRD control socket that greets, then answers the first command with `limit` bytes of
/// one line that never ends: how many of them it could write before Fulcrum hung up.
fn endless_bird(listener: std::os::unix::net::UnixListener, limit: usize) -> usize {
    use std::io::Read;
    listener.set_nonblocking(true).unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let mut s = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("Fulcrum never connected to the control socket: {e}"),
        }
    };
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"0001 BIRD fake ready.\n").unwrap();
    let mut byte = [0u8; 1];
    while s.read(&mut byte).is_ok_and(|n| n == 1) && byte[0] != b'\n' {}
    let chunk = vec![b'x'; 64 * 1024];
    let mut written = 0;
    s.write_all(b"0002-").unwrap();
    while written < limit {
        match s.write(&chunk) {
            Ok(n) => written += n,
            Err(_) => break,
        }
    }
    written
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bird_mode_bounds_control_replies_and_writes_its_fragment_through_a_file_of_its_own() {
    let mut lab = Lab::new("birdfake");
    let ns = lab.ns("n").unwrap();
    ns.addr("lo", &format!("{VIP}/32")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // The temporary name an earlier build always used, planted as a symlink to a file that
    // is not Fulcrum's.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep\n").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join(".announce.conf.tmp")).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(dir.path().join("bird.ctl")).unwrap();
    const LIMIT: usize = 64 * 1024 * 1024;
    let server = std::thread::spawn(move || endless_bird(listener, LIMIT));
    let config = format!(
        r#"[bgp]
speaker = "bird"
control = "{d}/bird.ctl"
include = "{d}/announce.conf"
interface = "fl-fake"
announce = ["{VIP}/32"]

[[virtual_service]]
name = "echo"
listen = ["{VIP}:7000"]
protocol = "tcp"
pool = "echo"

[[pool]]
name = "echo"
[[pool.member]]
address = "127.0.0.1:7001"
"#
    );
    let f = fulcrum_testkit::Fulcrum::start_in(
        &ns.name,
        BIN,
        "127.0.0.1:9400".parse().unwrap(),
        &config,
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let written = tokio::task::spawn_blocking(move || server.join().unwrap())
        .await
        .unwrap();
    // Fulcrum hung up after a bounded line (plus what the socket buffers held), rather than
    // reading a never-ending line until its exchange timed out.
    assert!(
        written < 4 * 1024 * 1024,
        "Fulcrum read {written} bytes of one reply line:\n{}",
        f.logs()
    );
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let v = f.get_json("/api/v1/ha").await;
        let e = v["bgp"]["last_error"].as_str().unwrap_or("").to_string();
        if e.contains("too long") {
            break;
        }
        assert!(Instant::now() < end, "no bound reported: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fragment = std::fs::read_to_string(dir.path().join("announce.conf")).unwrap();
    assert!(fragment.contains("protocol static fulcrum4"), "{fragment}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
}

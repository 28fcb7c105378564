//! Firewall sandwich: two Fulcrums (inside and outside) around four stateful gateways, all in
//! network namespaces this test creates.
//!
//!   cl 198.18.200.2 — inside0 [lbin] gwK — gwK (in 198.18.2K.2, out 198.18.3K.2) — gwK [lbout]
//!                                                                   outside0 — srv 198.19.0.10
//!
//! The gateways are stateful firewalls: they drop a new flow that does not start with a SYN
//! (what an asymmetric path looks like to them) and record, per client port, which direction
//! of each flow crossed them. Every flow must return through the gateway it went out through,
//! and taking one gateway out must move only its flows.
//!
//! Every network is dual-stack: the client fd00:200::2, gateway K fd00:20:K::2 inside and
//! fd00:30:K::2 outside, the server fd00:19::10; the gateways are dual-stack members
//! (`address6`) watched by one monitor with an IPv4 and an IPv6 target (`up_when = 2`, so
//! stopping either family's forwarding takes a gateway out).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_testkit::netns::{Lab, Ns};
use fulcrum_testkit::Fulcrum;
use lab::no_dad;

#[path = "common/lab.rs"]
mod lab;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const ADMIN: &str = "127.0.0.1:9400";
const SERVER: &str = "198.19.0.10:7000";
const SERVER6: &str = "[fd00:19::10]:7000";
const CLIENT: &str = "198.18.200.2";
const CLIENT6: &str = "fd00:200::2";
const GATEWAYS: usize = 4;
const FLOWS: u16 = 10_000;
/// IPv6 rounds are shorter: the hashing and pinning are the same code, the family is what is
/// new.
const FLOWS6: u16 = 2_000;
const FIRST_PORT: u16 = 20000;

const FIREWALL: &str = r#"
table inet fw {
  set orig { type inet_service; flags dynamic; size 65536; }
  set reply { type inet_service; flags dynamic; size 65536; }
  chain forward {
    type filter hook forward priority 0; policy accept;
    ct state invalid drop
    ct state new tcp flags & (syn | ack) != syn drop
    ip saddr 198.18.200.2 tcp dport 7000 ct direction original add @orig { tcp sport }
    ip daddr 198.18.200.2 tcp sport 7000 ct direction reply add @reply { tcp dport }
    ip6 saddr fd00:200::2 tcp dport 7000 ct direction original add @orig { tcp sport }
    ip6 daddr fd00:200::2 tcp sport 7000 ct direction reply add @reply { tcp dport }
  }
}
"#;

fn side(interface: &str, octet: u8) -> String {
    let members: String = (0..GATEWAYS)
        .map(|k| {
            format!(
                "[[pool.member]]\naddress = \"198.18.{}.2\"\naddress6 = \"fd00:{octet}:{k}::2\"\ninterface = \"gw{k}\"\nmonitors = [\"through\"]\n",
                octet as usize + k
            )
        })
        .collect();
    format!(
        r#"
[[monitor]]
name = "through"
type = "icmp"
targets = {targets}
up_when = 2
interval = "1s"
timeout = "500ms"
rise = 1
fall = 2

[[pool]]
name = "firewalls"
kind = "gateway"
{members}
[[gateway_service]]
name = "fw"
interfaces = ["{interface}"]
pool = "firewalls"
hash = "symmetric"
"#,
        targets = if interface == "inside0" {
            r#"["198.19.0.10", "fd00:19::10"]"#
        } else {
            r#"["198.18.200.2", "fd00:200::2"]"#
        }
    )
}

fn whoami(ns: &Ns, server: &'static str, stop: Arc<AtomicBool>) {
    let (tx, rx) = std::sync::mpsc::channel();
    ns.thread(move || {
        let listener = TcpListener::bind(server).unwrap();
        listener.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((s, peer)) => {
                    std::thread::spawn(move || {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                        let mut w = s.try_clone().unwrap();
                        let mut line = String::new();
                        if BufReader::new(s).read_line(&mut line).is_ok() {
                            let _ = writeln!(w, "{}", peer.port());
                        }
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
}

/// The client's address and the server of one family's flows.
#[derive(Clone, Copy)]
struct Family {
    client: &'static str,
    server: &'static str,
    flows: u16,
}

const V4: Family = Family {
    client: CLIENT,
    server: SERVER,
    flows: FLOWS,
};
const V6: Family = Family {
    client: CLIENT6,
    server: SERVER6,
    flows: FLOWS6,
};

/// One flow from `port`: whether it got its answer. Closed with a reset, so the port can be
/// used again at once.
fn flow(family: Family, port: u16) -> bool {
    let run = || -> std::io::Result<bool> {
        let client: IpAddr = family.client.parse().unwrap();
        let server: SocketAddr = family.server.parse().unwrap();
        let s = socket2::Socket::new(
            socket2::Domain::for_address(server),
            socket2::Type::STREAM,
            None,
        )?;
        s.set_reuse_address(true)?;
        s.bind(&SocketAddr::new(client, port).into())?;
        s.connect_timeout(&server.into(), Duration::from_secs(1))?;
        s.set_linger(Some(Duration::ZERO))?;
        let stream: TcpStream = s.into();
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        (&stream).write_all(b"?\n")?;
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line)?;
        Ok(line.trim() == port.to_string())
    };
    run().unwrap_or(false)
}

/// The ports in set `set` of each gateway's firewall.
fn recorded(gws: &[Ns], set: &str) -> Vec<HashSet<u16>> {
    gws.iter()
        .map(|g| {
            let out = g
                .exec("nft", &["-j", "list", "set", "inet", "fw", set])
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            v["nftables"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|i| i.get("set"))
                .flat_map(|s| s["elem"].as_array().cloned().unwrap_or_default())
                .filter_map(|e| e.as_u64().map(|p| p as u16))
                .collect()
        })
        .collect()
}

/// Runs every flow of `family` and returns, per port, the gateway it crossed; asserts that each
/// flow answered and crossed one gateway both ways.
fn round(family: Family, cl: &Ns, gws: &[Ns], lbs: &[&Ns]) -> HashMap<u16, usize> {
    let last = FIRST_PORT + family.flows;
    for ns in lbs.iter().copied().chain(gws) {
        let _ = ns.exec("conntrack", &["-F"]);
    }
    for g in gws {
        g.exec("nft", &["flush", "set", "inet", "fw", "orig"])
            .unwrap();
        g.exec("nft", &["flush", "set", "inet", "fw", "reply"])
            .unwrap();
    }
    let failed = cl
        .thread(move || {
            (FIRST_PORT..last)
                .filter(|&p| !flow(family, p))
                .collect::<Vec<u16>>()
        })
        .join()
        .unwrap()
        .unwrap();
    assert!(
        failed.is_empty(),
        "{} flows failed, e.g. port {:?}",
        failed.len(),
        failed.first()
    );
    let orig = recorded(gws, "orig");
    let reply = recorded(gws, "reply");
    let mut via = HashMap::new();
    for p in FIRST_PORT..last {
        let out: Vec<usize> = (0..gws.len()).filter(|&g| orig[g].contains(&p)).collect();
        let back: Vec<usize> = (0..gws.len()).filter(|&g| reply[g].contains(&p)).collect();
        assert_eq!(out.len(), 1, "port {p} went out through {out:?}");
        assert_eq!(
            out, back,
            "port {p} went out through {out:?} and came back through {back:?}"
        );
        via.insert(p, out[0]);
    }
    via
}

/// Whether every gateway is up and owns slots of the kernel's table.
async fn all_gateways_placing(f: &Fulcrum) -> bool {
    let v = f.get_json("/api/v1/links").await;
    let gateways = v["links"].as_array().cloned().unwrap_or_default();
    gateways.len() == GATEWAYS
        && gateways
            .iter()
            .all(|g| g["health"] == "up" && g["slots"].as_u64() > Some(0))
}

async fn gateway_health(f: &Fulcrum, name: &str) -> String {
    let v = f.get_json("/api/v1/links").await;
    v["links"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == name))
        .map(|l| l["health"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// The two Fulcrums, the client, the server and the four firewalls, dual-stack.
struct Sandwich {
    _lab: Lab,
    cl: Ns,
    lbin: Ns,
    lbout: Ns,
    gws: Vec<Ns>,
    fin: Fulcrum,
    fout: Fulcrum,
    stop: Arc<AtomicBool>,
}

impl Drop for Sandwich {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

async fn sandwich(tag: &str) -> Sandwich {
    let mut lab = Lab::new(tag);
    let cl = lab.ns("cl").unwrap();
    let lbin = lab.ns("lbin").unwrap();
    let lbout = lab.ns("lbout").unwrap();
    let srv = lab.ns("srv").unwrap();
    let gws: Vec<Ns> = (0..GATEWAYS)
        .map(|k| lab.ns(&format!("gw{k}")).unwrap())
        .collect();
    // No duplicate address detection on the link-local addresses the veths get: while it
    // runs (a second or two) the first flows through a fresh gateway wait for a SYN
    // retransmission.
    for ns in [&cl, &lbin, &lbout, &srv].into_iter().chain(&gws) {
        no_dad(ns);
    }
    lab.veth(&cl, "eth0", &lbin, "inside0").unwrap();
    cl.addr("eth0", "198.18.200.2/24").unwrap();
    cl.addr("eth0", &format!("{CLIENT6}/64")).unwrap();
    lbin.addr("inside0", "198.18.200.1/24").unwrap();
    lbin.addr("inside0", "fd00:200::1/64").unwrap();
    cl.route(&["default", "via", "198.18.200.1"]).unwrap();
    cl.route(&["::/0", "via", "fd00:200::1"]).unwrap();
    lab.veth(&srv, "eth0", &lbout, "outside0").unwrap();
    srv.addr("eth0", "198.18.250.2/24").unwrap();
    srv.addr("eth0", "fd00:250::2/64").unwrap();
    srv.addr("lo", "198.19.0.10/32").unwrap();
    srv.addr("lo", "fd00:19::10/128").unwrap();
    lbout.addr("outside0", "198.18.250.1/24").unwrap();
    lbout.addr("outside0", "fd00:250::1/64").unwrap();
    srv.route(&["default", "via", "198.18.250.1"]).unwrap();
    srv.route(&["::/0", "via", "fd00:250::1"]).unwrap();
    lbout
        .route(&["198.19.0.0/16", "via", "198.18.250.2"])
        .unwrap();
    lbout
        .route(&["fd00:19::/32", "via", "fd00:250::2"])
        .unwrap();
    for lb in [&lbin, &lbout] {
        lb.sysctl("net.ipv4.ip_forward", "1").unwrap();
        lb.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
        lb.sysctl("net.ipv4.conf.all.rp_filter", "0").unwrap();
        lb.sysctl("net.ipv4.conf.default.rp_filter", "0").unwrap();
    }
    for (k, g) in gws.iter().enumerate() {
        let gi = format!("gw{k}");
        lab.veth(&lbin, &gi, g, "in").unwrap();
        lab.veth(g, "out", &lbout, &gi).unwrap();
        lbin.addr(&gi, &format!("198.18.{}.1/24", 20 + k)).unwrap();
        g.addr("in", &format!("198.18.{}.2/24", 20 + k)).unwrap();
        g.addr("out", &format!("198.18.{}.2/24", 30 + k)).unwrap();
        lbout.addr(&gi, &format!("198.18.{}.1/24", 30 + k)).unwrap();
        lbin.addr(&gi, &format!("fd00:20:{k}::1/64")).unwrap();
        g.addr("in", &format!("fd00:20:{k}::2/64")).unwrap();
        g.addr("out", &format!("fd00:30:{k}::2/64")).unwrap();
        lbout.addr(&gi, &format!("fd00:30:{k}::1/64")).unwrap();
        g.sysctl("net.ipv4.ip_forward", "1").unwrap();
        g.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
        g.route(&["198.18.200.0/24", "via", &format!("198.18.{}.1", 20 + k)])
            .unwrap();
        g.route(&["198.19.0.0/16", "via", &format!("198.18.{}.1", 30 + k)])
            .unwrap();
        g.route(&["198.18.250.0/24", "via", &format!("198.18.{}.1", 30 + k)])
            .unwrap();
        g.route(&["fd00:200::/64", "via", &format!("fd00:20:{k}::1")])
            .unwrap();
        g.route(&["fd00:19::/32", "via", &format!("fd00:30:{k}::1")])
            .unwrap();
        g.route(&["fd00:250::/64", "via", &format!("fd00:30:{k}::1")])
            .unwrap();
        let mut nft = g.command("nft", &["-f", "-"]);
        let mut child = nft.stdin(std::process::Stdio::piped()).spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(FIREWALL.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success());
    }
    let stop = Arc::new(AtomicBool::new(false));
    whoami(&srv, SERVER, stop.clone());
    whoami(&srv, SERVER6, stop.clone());

    let admin: SocketAddr = ADMIN.parse().unwrap();
    let fin = Fulcrum::start_in(&lbin.name, BIN, admin, &side("inside0", 20))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let fout = Fulcrum::start_in(&lbout.name, BIN, admin, &side("outside0", 30))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    // The first IPv6 probes may go unanswered while neighbour discovery settles: start the
    // rounds once every gateway is up on both sides and owns slots in the kernel's table (the
    // API counts them only once the map is written).
    let end = Instant::now() + Duration::from_secs(15);
    for f in [&fin, &fout] {
        while !all_gateways_placing(f).await {
            assert!(Instant::now() < end, "gateways not up:\n{}", f.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Sandwich {
        _lab: lab,
        cl,
        lbin,
        lbout,
        gws,
        fin,
        fout,
        stop,
    }
}

/// A round of `family`'s flows through the sandwich (see `round`).
async fn run_round(s: &Sandwich, family: Family) -> HashMap<u16, usize> {
    let (cl, gws, lbin, lbout) = (s.cl.clone(), s.gws.clone(), s.lbin.clone(), s.lbout.clone());
    tokio::task::spawn_blocking(move || round(family, &cl, &gws, &[&lbin, &lbout]))
        .await
        .unwrap()
}

/// Every flow of `family` crosses one gateway both ways, the four share them, and a gateway
/// that stops forwarding that family (`forwarding`, the sysctl) moves exactly its flows.
async fn symmetric_and_only_the_removed_gateways_flows_move(
    s: &Sandwich,
    family: Family,
    forwarding: &str,
) {
    let before = run_round(s, family).await;
    let mut per_gateway = BTreeMap::new();
    for g in before.values() {
        *per_gateway.entry(*g).or_insert(0usize) += 1;
    }
    eprintln!("{} flows per gateway: {per_gateway:?}", family.flows);
    for k in 0..GATEWAYS {
        let n = per_gateway.get(&k).copied().unwrap_or(0);
        let share = n as f64 / f64::from(family.flows);
        assert!(
            (share - 0.25).abs() < 0.05,
            "gateway {k} carried {share:.3}"
        );
    }

    // Gateway 3 (#3, index 2) stops forwarding: both sides see it down through their probes.
    s.gws[2].sysctl(forwarding, "0").unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while gateway_health(&s.fin, "#3").await != "down"
        || gateway_health(&s.fout, "#3").await != "down"
    {
        assert!(
            Instant::now() < end,
            "gateway #3 not seen down:\n{}",
            s.fin.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = run_round(s, family).await;
    let mut moved = 0;
    for (p, g) in &before {
        if *g == 2 {
            assert_ne!(after[p], 2);
            moved += 1;
        } else {
            assert_eq!(after[p], *g, "port {p} moved off a healthy gateway");
        }
    }
    eprintln!("{moved} flows of the removed gateway moved; no other flow moved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_flow_returns_through_its_gateway_and_a_removed_gateway_moves_only_its_flows() {
    let s = sandwich("sand").await;
    symmetric_and_only_the_removed_gateways_flows_move(&s, V4, "net.ipv4.ip_forward").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_flows_return_through_their_gateway_and_a_removed_gateway_moves_only_theirs() {
    let s = sandwich("sand6").await;
    symmetric_and_only_the_removed_gateways_flows_move(&s, V6, "net.ipv6.conf.all.forwarding")
        .await;
}

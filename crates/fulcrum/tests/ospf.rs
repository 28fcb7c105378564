//! `[bgp] ospf`: Fulcrum's local BIRD also exports the VIP into OSPF, to a BIRD OSPF neighbour
//! (the router) in namespaces this test creates:
//!
//!   node (Fulcrum + BIRD, VIP 198.18.99.10 on lo) eth0 198.18.5.2 — eth0 198.18.5.1 router
//!
//! The router learns the VIP while its service has a healthy member, loses it when the member
//! goes down, learns it again when it returns, and sees its cost raised (not withdrawn) while
//! the node is in maintenance.

#[path = "common/lab.rs"]
mod lab;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_testkit::netns::{Lab, Ns};
use lab::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const VIP: &str = "198.18.99.10";
/// What the router sees for an external type-1 route: the configured metric plus its own cost
/// to the node (BIRD's default interface cost, 10).
const SERVED: u64 = 10 + 10;
const DRAINED: u64 = 60000 + 10;

fn node_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token = "lab-admin-token-0123456789"
state_file = "{d}/state.json"

[ha]
mode = "active_active"
node = "n"

[bgp]
speaker = "bird"
control = "{d}/bird.ctl"
include = "{d}/announce.conf"
announce = ["{VIP}/32"]
ospf = {{ area = "0.0.0.0", interfaces = ["eth0"], network = "ptp", hello = "1s", dead = "3s", cost = 10, drain_cost = 60000 }}

[[virtual_service]]
name = "echo"
listen = ["{VIP}:7000"]
protocol = "tcp"
pool = "echo"

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

const ROUTER_BIRD: &str = r#"router id 198.18.5.1;
protocol device { scan time 10; }
protocol kernel { ipv4 { export all; }; }
protocol ospf v2 uplink {
  ipv4 { import all; export none; };
  area 0.0.0.0 {
    interface "eth0" { type ptp; hello 1; dead 3; };
  };
}
"#;

fn bird(lab: &mut Lab, ns: &Ns, dir: &Path, conf: &str) -> PathBuf {
    let path = dir.join("bird.conf");
    std::fs::write(&path, conf).expect("bird.conf");
    let sock = dir.join("bird.ctl");
    let _ = std::fs::remove_file(&sock);
    lab.spawn(
        ns,
        "bird",
        &[
            "-f",
            "-c",
            &path.display().to_string(),
            "-s",
            &sock.display().to_string(),
            "-P",
            &dir.join("bird.pid").display().to_string(),
        ],
    )
    .expect("bird");
    assert!(
        wait_for(Duration::from_secs(5), || sock.exists()),
        "BIRD in {} did not start",
        ns.name
    );
    sock
}

fn birdc(sock: &Path, cmd: &str) -> String {
    std::process::Command::new("birdc")
        .args(["-s", &sock.display().to_string(), cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_else(|e| e.to_string())
}

/// The router's OSPF route to the VIP: its type-1 metric (BIRD prints `OSPF.metric1`), or
/// None without one.
fn vip_metric(router: &Path) -> Option<u64> {
    let out = birdc(router, &format!("show route {VIP}/32 all"));
    out.lines()
        .find_map(|l| l.trim().strip_prefix("OSPF.metric1:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A TCP member on 127.0.0.1:7001 in `ns` until `stop`.
fn member(ns: &Ns, stop: Arc<AtomicBool>) {
    let (tx, rx) = std::sync::mpsc::channel();
    ns.thread(move || {
        let l = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 7001))).expect("member");
        l.set_nonblocking(true).expect("nonblocking");
        let _ = tx.send(());
        while !stop.load(Ordering::Relaxed) {
            let _ = l.accept();
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    rx.recv_timeout(Duration::from_secs(5)).expect("member up");
}

#[test]
fn the_vip_goes_into_ospf_while_served_leaves_when_down_and_costs_more_in_maintenance() {
    let mut lab = Lab::new("ospf");
    let node = lab.ns("node").expect("node");
    let router = lab.ns("router").expect("router");
    lab.veth(&node, "eth0", &router, "eth0").expect("veth");
    node.addr("eth0", "198.18.5.2/24").expect("addr");
    router.addr("eth0", "198.18.5.1/24").expect("addr");
    node.addr("lo", &format!("{VIP}/32")).expect("vip");
    let dir = tempfile::tempdir().expect("dir");
    let rdir = tempfile::tempdir().expect("router dir");
    let rsock = bird(&mut lab, &router, rdir.path(), ROUTER_BIRD);
    // The node's BIRD reads the fragment Fulcrum writes.
    let include = dir.path().join("announce.conf");
    std::fs::write(&include, "").expect("empty fragment");
    bird(
        &mut lab,
        &node,
        dir.path(),
        &format!(
            "router id 198.18.5.2;\nprotocol device {{ scan time 10; }}\ninclude \"{}\";\n",
            include.display()
        ),
    );
    let stop = Arc::new(AtomicBool::new(false));
    member(&node, stop.clone());
    let f = NsFulcrum::start(&mut lab, &node, BIN, &node_config(dir.path()));
    let state = || {
        format!(
            "{}\n{}\n{}",
            birdc(&rsock, "show protocols all uplink"),
            birdc(&rsock, "show route all"),
            f.logs()
        )
    };

    // Served: the router learns the VIP as an external type-1 route at the configured cost,
    // and its kernel routes it to the node.
    assert!(
        wait_for(Duration::from_secs(20), || vip_metric(&rsock)
            == Some(SERVED)),
        "no OSPF route to the VIP:\n{}",
        state()
    );
    let kernel = router
        .exec("ip", &["route", "show", VIP])
        .expect("ip route");
    assert!(
        String::from_utf8_lossy(&kernel.stdout).contains("via 198.18.5.2"),
        "{}",
        String::from_utf8_lossy(&kernel.stdout)
    );

    // Maintenance: BGP would withdraw; OSPF keeps the route at the drain cost.
    let (code, _) = api_with(
        &node,
        "PUT",
        "/api/v1/ha/maintenance",
        r#"{"maintenance": true}"#,
    );
    assert_eq!(code, 200);
    assert!(
        wait_for(Duration::from_secs(10), || vip_metric(&rsock)
            == Some(DRAINED)),
        "the cost was not raised:\n{}",
        state()
    );
    let (code, _) = api_with(
        &node,
        "PUT",
        "/api/v1/ha/maintenance",
        r#"{"maintenance": false}"#,
    );
    assert_eq!(code, 200);
    assert!(
        wait_for(Duration::from_secs(10), || vip_metric(&rsock)
            == Some(SERVED)),
        "the cost did not come back:\n{}",
        state()
    );

    // The member goes down: the VIP leaves OSPF; it comes back with the member.
    stop.store(true, Ordering::Relaxed);
    assert!(
        wait_for(Duration::from_secs(10), || vip_metric(&rsock).is_none()),
        "the VIP stayed in OSPF without a healthy member:\n{}",
        state()
    );
    std::thread::sleep(Duration::from_millis(100));
    member(&node, Arc::new(AtomicBool::new(false)));
    assert!(
        wait_for(Duration::from_secs(10), || vip_metric(&rsock)
            == Some(SERVED)),
        "the VIP did not come back:\n{}",
        state()
    );

    // How fast the router loses the VIP when the node stops (SIGTERM: Fulcrum withdraws through
    // BIRD) and when it dies (kill -9: the liveness interface goes with the process and BIRD
    // flushes the route by itself), beside BGP's figures (bench/bgp.sh prints both). OSPF
    // re-originates an LSA at most every MinLSInterval (5 s): a route announced less than that
    // ago is flushed only then, so bench/bgp.sh lets it settle first (BENCH_OSPF_SETTLE_MS);
    // the test does not wait.
    let settle = std::env::var("BENCH_OSPF_SETTLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    std::thread::sleep(settle);
    let sigterm = withdrawn_after(&rsock, || signal(&lab, f.index, libc::SIGTERM));
    eprintln!(
        "bench: ospf_sigterm_withdrawn_ms={:.1}",
        sigterm.as_secs_f64() * 1e3
    );
    lab.kill(f.index);
    let f = NsFulcrum::start(&mut lab, &node, BIN, &node_config(dir.path()));
    assert!(
        wait_for(Duration::from_secs(20), || vip_metric(&rsock)
            == Some(SERVED)),
        "the VIP did not come back after a restart:\n{}",
        f.logs()
    );
    std::thread::sleep(settle);
    let kill9 = withdrawn_after(&rsock, || lab.kill(f.index));
    eprintln!(
        "bench: ospf_kill9_withdrawn_ms={:.1}",
        kill9.as_secs_f64() * 1e3
    );
}

fn signal(lab: &Lab, index: usize, sig: i32) {
    let pid = lab.pid(index).expect("pid") as i32;
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// How long after `act` the router has no route to the VIP left (polled every 10 ms).
fn withdrawn_after(router_sock: &Path, act: impl FnOnce()) -> Duration {
    let start = std::time::Instant::now();
    act();
    assert!(
        wait_for(Duration::from_secs(10), || vip_metric(router_sock)
            .is_none()),
        "the VIP stayed on the router"
    );
    start.elapsed()
}

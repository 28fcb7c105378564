//! `ha.sync` carries the connection tables of in-kernel (XDP) services: two Fulcrum nodes in
//! VRRP forward a `nat` (one-armed) or a `dr` service on a shared segment; a client holds long TCP
//! connections through the master; the backup's own configuration drains two of the three
//! members, so its Maglev ring would send every flow to the third. The master is killed with
//! SIGKILL: each connection goes on, on the same TCP connection, with the member it had.

#[path = "common/lab.rs"]
mod lab;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use fulcrum_testkit::netns::{Lab, Ns};
use lab::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
/// The service address, routed by the client through the VRRP address 198.18.0.1.
const VIP: &str = "198.18.10.1";
const FLOWS: usize = 12;

/// Members: one echo server per `name=address` on port 80, answering each line with its name.
const MEMBERS_PY: &str = r#"
import socketserver, sys, threading
class H(socketserver.StreamRequestHandler):
    def handle(self):
        for _ in self.rfile:
            self.wfile.write(self.server.name + b"\n")
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
for arg in sys.argv[1:]:
    name, addr = arg.split("=")
    s = S((addr, 80), H)
    s.name = name.encode()
    threading.Thread(target=s.serve_forever, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"#;

/// The client: N connections held open; for each line on stdin, one line on each and a line
/// out with who answered on each connection (or why not).
const CLIENT_PY: &str = r#"
import socket, sys
conns = [socket.create_connection((sys.argv[1], 80), timeout=10) for _ in range(int(sys.argv[2]))]
files = [c.makefile("rb") for c in conns]
for _ in sys.stdin:
    names = []
    for c, f in zip(conns, files):
        try:
            c.sendall(b"ping\n")
            names.append(f.readline().decode().strip() or "EOF")
        except Exception as e:
            names.append("ERR:" + type(e).__name__)
    print(" ".join(names), flush=True)
"#;

/// One new connection, one line: who answered.
const ONE_PY: &str = r#"
import socket, sys
c = socket.create_connection((sys.argv[1], 80), timeout=5)
c.sendall(b"ping\n")
print(c.makefile("rb").readline().decode().strip())
"#;

fn node_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin.token");
    std::fs::write(&token, format!("{ADMIN_TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    dir
}

/// Member `i`'s address: nat members sit behind the pair (198.18.1.0/24), dr members beside
/// the client (they answer it directly, from the VIP they hold on lo).
fn member(mode: &str, i: u8) -> String {
    if mode == "nat" {
        format!("198.18.1.2{i}")
    } else {
        format!("198.18.0.2{i}")
    }
}

/// A node of the pair; `drained`: members this node's own configuration drains.
fn config(
    dir: &std::path::Path,
    mode: &str,
    name: &str,
    prio: u8,
    me: &str,
    peer: &str,
    drained: &[u8],
) -> String {
    let members: String = (1..=3u8)
        .map(|i| {
            let state = if drained.contains(&i) {
                "state = \"drain\"\n"
            } else {
                ""
            };
            let addr = member(mode, i);
            format!("[[pool.member]]\naddress = \"{addr}:80\"\n{state}")
        })
        .collect();
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token_file = "{dir}/admin.token"

[ha]
node = "{name}"
interface = "eth0"
vrid = 52
priority = {prio}
advert_interval = "100ms"
vips = ["198.18.0.1/24", "198.18.1.1/24"]
sync = {{ listen = "{me}:7500", peers = ["{peer}:7500"], key = "a-sync-key-for-the-flow-test" }}

[[virtual_service]]
name = "long"
listen = "{VIP}:80"
protocol = "tcp"
pool = "p"
forwarding = "{mode}"
interfaces = ["eth0"]
xdp_mode = "generic"

[[pool]]
name = "p"
algorithm = "hash"
{members}"#,
        dir = dir.display()
    )
}

fn expect_role(f: &NsFulcrum, role: &str) {
    assert!(
        wait_for(Duration::from_secs(5), || f.role() == role),
        "{} is {} rather than {role}: {}\n{}",
        f.ns.name,
        f.role(),
        f.ha(),
        f.logs()
    );
}

fn resolved(f: &NsFulcrum, n: usize) {
    assert!(
        wait_for(Duration::from_secs(20), || f
            .logs()
            .matches("next hop resolved")
            .count()
            >= n),
        "{} did not resolve its members:\n{}",
        f.ns.name,
        f.logs()
    );
}

/// The client's connections: a round is one line on each.
struct Client {
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Client {
    fn start(lab: &mut Lab, ns: &Ns) -> Client {
        let n = FLOWS.to_string();
        let mut child = ns
            .command("python3", &["-c", CLIENT_PY, VIP, &n])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("client");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        lab.adopt(child);
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Client { stdin, lines }
    }

    /// Who answered on each connection (bounded: every read has a 10 s timeout).
    fn round(&mut self) -> Vec<String> {
        self.stdin.write_all(b"\n").expect("client stdin");
        self.stdin.flush().expect("client stdin");
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a round of the client");
        line.split(' ').map(str::to_string).collect()
    }
}

/// Starts the members' echo servers (`name=address` pairs) in `ns`; waits until they listen.
fn serve(lab: &mut Lab, ns: &Ns, members: &[&str]) {
    let mut args = vec!["-c", MEMBERS_PY];
    args.extend_from_slice(members);
    let mut child = ns
        .command("python3", &args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("members");
    let out = child.stdout.take().expect("members' stdout");
    lab.adopt(child);
    let mut ready = String::new();
    BufReader::new(out).read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");
}

#[test]
fn nat_flows_keep_their_member_on_the_new_master() {
    flows_keep_their_member("nat");
}

#[test]
fn dr_flows_keep_their_member_on_the_new_master() {
    flows_keep_their_member("dr");
}

fn flows_keep_their_member(mode: &str) {
    let mut lab = Lab::new(if mode == "nat" { "hafn" } else { "hafd" });
    let a = lab.ns("a").unwrap();
    let b = lab.ns("b").unwrap();
    let c = lab.ns("c").unwrap();
    // nat: one host with the three members' addresses behind the pair; dr: three hosts (the
    // balancer tells members apart by MAC), each holding the VIP on lo.
    let hosts: Vec<Ns> = if mode == "nat" {
        vec![lab.ns("s").unwrap()]
    } else {
        (1..=3).map(|i| lab.ns(&format!("m{i}")).unwrap()).collect()
    };
    let mut plugged = vec![
        (&a, "198.18.0.11/24".to_string()),
        (&b, "198.18.0.12/24".to_string()),
        (&c, "198.18.0.2/24".to_string()),
    ];
    for (i, h) in hosts.iter().enumerate() {
        plugged.push((h, format!("{}/24", member(mode, i as u8 + 1))));
    }
    let plugged: Vec<(&Ns, &str)> = plugged.iter().map(|(n, a)| (*n, a.as_str())).collect();
    segment(&mut lab, &plugged);
    a.addr("eth0", "198.18.1.2/24").unwrap();
    b.addr("eth0", "198.18.1.3/24").unwrap();
    // The client reaches the service through the pair's address.
    c.route(&[&format!("{VIP}/32"), "via", "198.18.0.1"])
        .unwrap();
    // Full checksums, as frames on a wire carry (veth would leave them to offload).
    for ns in hosts.iter().chain([&c]) {
        ns.exec("ethtool", &["-K", "eth0", "tx", "off"]).unwrap();
    }
    if mode == "nat" {
        let s = &hosts[0];
        s.addr("eth0", &format!("{}/24", member(mode, 2))).unwrap();
        s.addr("eth0", &format!("{}/24", member(mode, 3))).unwrap();
        // nat: replies must come back through the balancer, the pair's address on this side.
        s.route(&["198.18.0.0/24", "via", "198.18.1.1"]).unwrap();
        let names: Vec<String> = (1..=3u8)
            .map(|i| format!("m{i}={}", member(mode, i)))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        serve(&mut lab, s, &names);
    } else {
        for (i, h) in hosts.iter().enumerate() {
            h.addr("lo", &format!("{VIP}/32")).unwrap();
            // Not answering ARP for the VIP on lo, nor using it as an ARP source.
            h.sysctl("net.ipv4.conf.all.arp_ignore", "1").unwrap();
            h.sysctl("net.ipv4.conf.all.arp_announce", "2").unwrap();
            let name = format!("m{}=0.0.0.0", i + 1);
            serve(&mut lab, h, &[&name]);
        }
    }

    let (dir_a, dir_b) = (node_dir(), node_dir());
    let config_a = config(
        dir_a.path(),
        mode,
        "a",
        150,
        "198.18.0.11",
        "198.18.0.12",
        &[],
    );
    // The backup's own pool drains m1 and m2: its ring sends every new flow to m3, so without
    // the synced connection table the flows on m1 and m2 would be reset by m3.
    let config_b = config(
        dir_b.path(),
        mode,
        "b",
        100,
        "198.18.0.12",
        "198.18.0.11",
        &[1, 2],
    );
    let fa = NsFulcrum::start_in(&mut lab, &a, BIN, &config_a, dir_a);
    let fb = NsFulcrum::start_in(&mut lab, &b, BIN, &config_b, dir_b);
    expect_role(&fa, "master");
    expect_role(&fb, "backup");
    resolved(&fa, 3);
    resolved(&fb, 3);

    let mut client = Client::start(&mut lab, &c);
    let before = client.round();
    assert_eq!(before.len(), FLOWS, "{before:?}");
    assert!(
        before
            .iter()
            .all(|m| ["m1", "m2", "m3"].contains(&m.as_str())),
        "{before:?}\n{}",
        fa.logs()
    );
    assert!(
        before.iter().any(|m| m != "m3"),
        "every flow on m3: nothing to test {before:?}"
    );

    // Every flow reached the backup's tables before the master dies.
    let applied = |f: &NsFulcrum| f.ha()["sync"]["flows"]["applied"].as_u64().unwrap_or(0);
    assert!(
        wait_for(Duration::from_secs(5), || applied(&fb) >= FLOWS as u64),
        "{}\n{}",
        fb.ha(),
        fb.logs()
    );
    let flows_a = fa.ha()["sync"]["flows"].clone();
    assert!(flows_a["sent"].as_u64() >= Some(FLOWS as u64), "{flows_a}");
    assert_eq!(flows_a["lost"], 0, "{flows_a}");
    assert_eq!(fb.ha()["sync"]["flows"]["dropped"], 0, "{}", fb.ha());

    lab.kill(fa.index);
    a.ip(&["link", "set", "eth0", "down"]).unwrap();
    expect_role(&fb, "master");

    // The same connections, each still with its member.
    let after = client.round();
    assert_eq!(
        after,
        before,
        "connections after the failover (before: {before:?})\n{}",
        fb.logs()
    );
    let again = client.round();
    assert_eq!(again, before);
    // New connections on b follow b's own ring (m3 only): the members above were the synced
    // table's doing, not b's ring.
    let fresh = c
        .exec("python3", &["-c", ONE_PY, VIP])
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    assert_eq!(fresh, "m3");
    let metrics = api_raw(&b, "GET", "/metrics", "").1;
    assert!(
        metrics.contains("fulcrum_ha_sync_flows_total{vrid=\"52\",event=\"applied\"}"),
        "{metrics}"
    );
}

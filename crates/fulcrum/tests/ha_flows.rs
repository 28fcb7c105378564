//! `ha.sync` carries the connection tables of in-kernel (XDP) services: two Fulcrum nodes in
//! VRRP forward a `nat` service one-armed on a shared segment; a client holds long TCP
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

/// A node of the pair; `drained`: members this node's own configuration drains.
fn config(
    dir: &std::path::Path,
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
            format!("[[pool.member]]\naddress = \"198.18.1.2{i}:80\"\n{state}")
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
forwarding = "nat"
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

#[test]
fn nat_flows_keep_their_member_on_the_new_master() {
    let mut lab = Lab::new("haf");
    let a = lab.ns("a").unwrap();
    let b = lab.ns("b").unwrap();
    let c = lab.ns("c").unwrap();
    let srv = lab.ns("s").unwrap();
    segment(
        &mut lab,
        &[
            (&a, "198.18.0.11/24"),
            (&b, "198.18.0.12/24"),
            (&c, "198.18.0.2/24"),
            (&srv, "198.18.1.21/24"),
        ],
    );
    a.addr("eth0", "198.18.1.2/24").unwrap();
    b.addr("eth0", "198.18.1.3/24").unwrap();
    srv.addr("eth0", "198.18.1.22/24").unwrap();
    srv.addr("eth0", "198.18.1.23/24").unwrap();
    // The client reaches the service through the pair's address; the members answer through
    // the pair's address on their side (nat: replies must come back through the balancer).
    c.route(&[&format!("{VIP}/32"), "via", "198.18.0.1"])
        .unwrap();
    srv.route(&["198.18.0.0/24", "via", "198.18.1.1"]).unwrap();
    // Full checksums, as frames on a wire carry (veth would leave them to offload).
    for ns in [&c, &srv] {
        ns.exec("ethtool", &["-K", "eth0", "tx", "off"]).unwrap();
    }
    let mut members = srv
        .command(
            "python3",
            &[
                "-c",
                MEMBERS_PY,
                "m1=198.18.1.21",
                "m2=198.18.1.22",
                "m3=198.18.1.23",
            ],
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("members");
    let out = members.stdout.take().expect("members' stdout");
    lab.adopt(members);
    let mut ready = String::new();
    BufReader::new(out).read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");

    let (dir_a, dir_b) = (node_dir(), node_dir());
    let config_a = config(dir_a.path(), "a", 150, "198.18.0.11", "198.18.0.12", &[]);
    // The backup's own pool drains m1 and m2: its ring sends every new flow to m3, so without
    // the synced connection table the flows on m1 and m2 would be reset by m3.
    let config_b = config(
        dir_b.path(),
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

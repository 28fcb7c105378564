//! End to end: the in-kernel forwarder (forwarding = "dr" | "tunnel" | "nat") in network
//! namespaces the test creates — a client, Fulcrum and three members — with real TCP (curl)
//! and UDP traffic through the real binary. Needs root (CI runs as root).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use fulcrum_testkit::netns::{Lab, Ns};

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const TOKEN: &str = "xdp-test-token-0123456789";

/// A member: HTTP on :80 (threads, keep-alive) answering "NAME CLIENT_ADDRESS", and UDP on the
/// VIP's port 53 answering the same. Bound to the VIP for UDP so replies leave from it.
const MEMBER_PY: &str = r#"
import http.server, socket, sys, threading
name, vips = sys.argv[1], sys.argv[2:]
def peer(a):
    return a[0].removeprefix("::ffff:")
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        b = f"{name} {peer(self.client_address)}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
def udp(vip):
    fam = socket.AF_INET6 if ":" in vip else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.bind((vip, 53))
    while True:
        d, a = s.recvfrom(2048)
        s.sendto(f"{name} {peer(a)}".encode(), a)
for v in vips:
    threading.Thread(target=udp, args=(v,), daemon=True).start()
class S(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
S(("::", 80), H).serve_forever()
"#;

/// A client holding one keep-alive connection: a request, then another after a line on stdin.
const HOLD_PY: &str = r#"
import http.client, sys
c = http.client.HTTPConnection(sys.argv[1], 80, timeout=5)
for _ in range(2):
    c.request("GET", "/")
    print(c.getresponse().read().decode().strip(), flush=True)
    sys.stdin.readline()
"#;

const UDP_PY: &str = r#"
import socket, sys
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(fam, socket.SOCK_DGRAM)
s.settimeout(2)
s.sendto(b"q", (sys.argv[1], 53))
print(s.recvfrom(2048)[0].decode())
"#;

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn curl(ns: &Ns, url: &str) -> Option<String> {
    let out = ns
        .exec("curl", &["-s", "--max-time", "2", "-g", url])
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn udp_query(ns: &Ns, vip: &str) -> Option<String> {
    let out = ns.exec("python3", &["-c", UDP_PY, vip]).ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn admin(ns: &Ns, method: &str, path: &str, body: Option<&str>) -> String {
    let url = format!("http://127.0.0.1:9900{path}");
    let auth = format!("Authorization: Bearer {TOKEN}");
    let mut args = vec!["-s", "--max-time", "3", "-X", method, "-H", &auth, &url];
    if let Some(b) = body {
        args.extend(["-H", "Content-Type: application/json", "-d", b]);
    }
    let out = ns.exec("curl", &args).expect("admin API");
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Setup {
    lab: Lab,
    client: Ns,
    lb: Ns,
    members: Vec<Ns>,
    /// Lab process indices of the members' servers (segment labs).
    servers: Vec<usize>,
    fulcrum: usize,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Setup {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until Fulcrum knows the next hop of `n` members (until then they get no slots).
    fn wait_resolved(&self, n: usize) {
        wait_for("member next hops", Duration::from_secs(20), || {
            (self.log().matches("next hop resolved").count() >= n).then_some(())
        });
    }
}

/// One L2 segment (a bridge) holding the client, Fulcrum and the members: the DR topology.
/// The VIP is routed to Fulcrum by the client; members hold it on lo and answer directly.
/// `tunnel`: members also decapsulate IPIP (tunl0) and accept what comes out of it.
fn dr_lab(tag: &str, config_tail: &str) -> Setup {
    segment_lab(tag, config_tail, false)
}

fn segment_lab(tag: &str, config_tail: &str, tunnel: bool) -> Setup {
    let mut lab = Lab::new(tag);
    let sw = lab.ns("sw").expect("ns");
    sw.ip(&["link", "add", "br0", "type", "bridge"])
        .expect("bridge");
    sw.ip(&["link", "set", "br0", "up"]).expect("bridge up");
    let client = lab.ns("cl").expect("ns");
    let lb = lab.ns("lb").expect("ns");
    let members: Vec<Ns> = (1..=3)
        .map(|i| lab.ns(&format!("m{i}")).expect("ns"))
        .collect();
    let plug = |ns: &Ns, port: &str| {
        lab.veth(ns, "eth0", &sw, port).expect("veth");
        sw.ip(&["link", "set", port, "master", "br0"])
            .expect("enslave");
        // The lab runs XDP in generic mode. Native XDP_TX on a veth delivers only when the
        // peer has a native XDP program too (GRO alone counts the frame as sent and drops it;
        // see docs/xdp.md); GRO stays on for the generic path's receive batching.
        sw.exec("ethtool", &["-K", port, "gro", "on"])
            .expect("gro on");
    };
    plug(&client, "p-cl");
    plug(&lb, "p-lb");
    // Full checksums, as frames on a wire carry: veth would otherwise leave them to "offload".
    client
        .exec("ethtool", &["-K", "eth0", "tx", "off"])
        .expect("ethtool");
    client.addr("eth0", "198.18.0.2/24").expect("addr");
    client.addr("eth0", "2001:db8::2/64").expect("addr");
    lb.addr("eth0", "198.18.0.1/24").expect("addr");
    lb.addr("eth0", "2001:db8::1/64").expect("addr");
    client
        .route(&["198.18.10.1/32", "via", "198.18.0.1"])
        .expect("route");
    client
        .route(&["2001:db8:10::1/128", "via", "2001:db8::1"])
        .expect("route");
    for (i, m) in members.iter().enumerate() {
        let i = i + 1;
        plug(m, &format!("p-m{i}"));
        m.addr("eth0", &format!("198.18.0.1{i}/24")).expect("addr");
        m.addr("eth0", &format!("2001:db8::1{i}/64")).expect("addr");
        m.addr("lo", "198.18.10.1/32").expect("vip on lo");
        m.addr("lo", "2001:db8:10::1/128").expect("vip on lo");
        // Do not answer ARP for the VIP (it is on lo), do not use it as ARP source.
        m.sysctl("net.ipv4.conf.all.arp_ignore", "1")
            .expect("sysctl");
        m.sysctl("net.ipv4.conf.all.arp_announce", "2")
            .expect("sysctl");
        if tunnel {
            // The CI kernel has no IPIP / IP6IP6 (CONFIG_NET_IPIP, CONFIG_IPV6_TUNNEL unset),
            // so members strip the outer header with `fulcrum decap` (XDP); with those
            // modules, tunl0 / ip6tnl0 up and rp_filter off do the same (docs/xdp.md).
            m.exec("ethtool", &["-K", "eth0", "tx", "off"])
                .expect("ethtool");
        }
    }
    let mut servers = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let name = format!("m{}", i + 1);
        let server = lab
            .spawn(
                m,
                "python3",
                &["-c", MEMBER_PY, &name, "198.18.10.1", "2001:db8:10::1"],
            )
            .expect("member");
        servers.push(server);
        if tunnel {
            lab.spawn(m, BIN, &["decap", "-i", "eth0", "--mode", "generic"])
                .expect("decap");
        }
    }
    start_fulcrum(lab, client, lb, members, servers, config_tail)
}

fn start_fulcrum(
    mut lab: Lab,
    client: Ns,
    lb: Ns,
    members: Vec<Ns>,
    servers: Vec<usize>,
    body: &str,
) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("fulcrum.toml");
    let text = format!("[admin]\nlisten = \"127.0.0.1:9900\"\ntoken = \"{TOKEN}\"\n\n{body}");
    std::fs::write(&config, text).expect("config");
    let log = dir.path().join("fulcrum.log");
    let child: Child = lb
        .command(BIN, &["run", "-c", config.to_str().expect("path")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start fulcrum");
    let fulcrum = lab.adopt(child);
    let s = Setup {
        lab,
        client,
        lb,
        members,
        servers,
        fulcrum,
        log,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let up =
            s.lb.exec(
                "curl",
                &[
                    "-sf",
                    "-H",
                    &format!("Authorization: Bearer {TOKEN}"),
                    "http://127.0.0.1:9900/api/v1/status",
                ],
            )
            .is_ok_and(|o| !o.stdout.is_empty());
        if up {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "Fulcrum did not come up; its log:\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn dr_config(algorithm_extra: &str) -> String {
    service_config("dr", &[1, 2, 3], algorithm_extra)
}

/// tcp/80 "web", udp/53 "dns" (session timeout 6s) on 198.18.10.1 and tcp/80 "web6" on
/// 2001:db8:10::1, forwarded with `mode` to members 198.18.0.1N for N in `members`.
fn service_config(mode: &str, members: &[u32], pool_extra: &str) -> String {
    let m4: String = members
        .iter()
        .map(|i| format!("[[pool.member]]\naddress = \"198.18.0.1{i}:80\"\n"))
        .collect();
    let m6: String = members
        .iter()
        .map(|i| format!("[[pool.member]]\naddress = \"[2001:db8::1{i}]:80\"\n"))
        .collect();
    format!(
        r#"
[[virtual_service]]
name = "web"
listen = "198.18.10.1:80"
protocol = "tcp"
pool = "web"
forwarding = "{mode}"
interfaces = ["eth0"]
xdp_mode = "generic"

[[virtual_service]]
name = "dns"
listen = "198.18.10.1:53"
protocol = "udp"
pool = "web"
session_timeout = "6s"
forwarding = "{mode}"
interfaces = ["eth0"]
xdp_mode = "generic"

[[virtual_service]]
name = "web6"
listen = "[2001:db8:10::1]:80"
protocol = "tcp"
pool = "web6"
forwarding = "{mode}"
interfaces = ["eth0"]
xdp_mode = "generic"

[[pool]]
name = "web"
algorithm = "hash"
{pool_extra}
{m4}
[[pool]]
name = "web6"
algorithm = "hash"
{m6}"#
    )
}

/// UDP queries from fixed source ports: "port member" for each.
const UDP_PORTS_PY: &str = r#"
import socket, sys
vip, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for p in range(first, first + n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", p))
    s.settimeout(2)
    s.sendto(b"q", (vip, 53))
    try:
        print(p, s.recvfrom(2048)[0].decode().split(" ")[0])
    except socket.timeout:
        print(p, "timeout")
    s.close()
"#;

fn udp_ports(ns: &Ns, first: u16, n: u16) -> std::collections::BTreeMap<u16, String> {
    let out = ns
        .exec(
            "python3",
            &[
                "-c",
                UDP_PORTS_PY,
                "198.18.10.1",
                &first.to_string(),
                &n.to_string(),
            ],
        )
        .expect("udp client");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (p, m) = l.split_once(' ')?;
            Some((p.parse().ok()?, m.to_string()))
        })
        .collect()
}

/// Shared checks of a DSR mode (dr, tunnel): the member sees the client, flows spread, and
/// the replies never cross Fulcrum.
fn dsr_traffic(s: &Setup) {
    s.wait_resolved(6);
    let first = wait_for(
        "a response through the VIP",
        Duration::from_secs(20),
        || curl(&s.client, "http://198.18.10.1/").filter(|b| !b.is_empty()),
    );
    assert!(
        first.ends_with(" 198.18.0.2"),
        "member sees the client: {first:?}\n{}",
        s.log()
    );
    let (lb_rx0, lb_tx0) = s.lb.link_packets("eth0").expect("counters");
    let (cl_rx0, cl_tx0) = s.client.link_packets("eth0").expect("counters");
    let mut seen = std::collections::HashMap::new();
    for _ in 0..30 {
        let body = curl(&s.client, "http://198.18.10.1/").expect("curl");
        assert!(body.ends_with(" 198.18.0.2"), "{body:?}");
        let name = body.split(' ').next().unwrap_or("").to_string();
        *seen.entry(name).or_insert(0) += 1;
    }
    let (lb_rx1, lb_tx1) = s.lb.link_packets("eth0").expect("counters");
    let (cl_rx1, cl_tx1) = s.client.link_packets("eth0").expect("counters");
    assert_eq!(seen.len(), 3, "all members used: {seen:?}");
    let client_sent = cl_tx1 - cl_tx0;
    let client_got = cl_rx1 - cl_rx0;
    let lb_got = lb_rx1 - lb_rx0;
    assert!(
        client_got >= 30 * 3,
        "client received the replies ({client_got})"
    );
    assert!(
        lb_got <= client_sent + 10,
        "Fulcrum received {lb_got} packets for {client_sent} client packets and {client_got} \
         replies: replies must go member -> client directly"
    );
    assert!(
        lb_tx1 - lb_tx0 + 10 >= client_sent,
        "XDP_TX forwarded the client's packets"
    );
    let answer = wait_for("a UDP answer", Duration::from_secs(10), || {
        udp_query(&s.client, "198.18.10.1").filter(|a| !a.is_empty())
    });
    assert!(answer.ends_with(" 198.18.0.2"), "{answer:?}");
}

#[test]
fn tunnel_mode_end_to_end() {
    let s = segment_lab("xdptun", &service_config("tunnel", &[1, 2, 3], ""), true);
    dsr_traffic(&s);
    // IP6IP6 to the IPv6 members.
    let six = wait_for(
        "a response through the IPv6 VIP",
        Duration::from_secs(20),
        || curl(&s.client, "http://[2001:db8:10::1]/").filter(|b| !b.is_empty()),
    );
    assert!(six.ends_with(" 2001:db8::2"), "{six:?}\n{}", s.log());
    let m = admin(&s.lb, "GET", "/metrics", None);
    assert!(
        metric(&m, "fulcrum_xdp_vs_new_flows_total", "service=\"web\"") >= 31.0,
        "{m}"
    );
}

/// Removing one of three members (reload): established flows stay where they are (the
/// connection table), and once they expire about 1/3 of the choices move — the removed
/// member's — while the other members keep theirs (Maglev).
#[test]
fn removing_a_member_moves_only_its_share() {
    let mut s = dr_lab("xdprm", &service_config("dr", &[1, 2, 3], ""));
    s.wait_resolved(6);
    wait_for("a UDP answer", Duration::from_secs(20), || {
        udp_query(&s.client, "198.18.10.1").filter(|a| !a.is_empty())
    });
    let before = udp_ports(&s.client, 20000, 90);
    assert!(before.values().all(|m| m.starts_with('m')), "{before:?}");
    let on_m3 = before.values().filter(|m| *m == "m3").count();
    assert!((15..=45).contains(&on_m3), "m3 has about a third: {on_m3}");
    std::fs::write(
        s._dir.path().join("fulcrum.toml"),
        format!(
            "[admin]\nlisten = \"127.0.0.1:9900\"\ntoken = \"{TOKEN}\"\n\n{}",
            service_config("dr", &[1, 2], "")
        ),
    )
    .expect("config");
    let r = admin(&s.lb, "POST", "/api/v1/reload", Some("{}"));
    assert!(r.contains("generation"), "reload: {r}");
    std::thread::sleep(Duration::from_millis(500));
    // Within the session timeout every flow stays where it was, m3's included.
    let kept = udp_ports(&s.client, 20000, 90);
    assert_eq!(kept, before, "established flows kept across the reload");
    // After it, the flows are new: only m3's move.
    std::thread::sleep(Duration::from_millis(6500));
    let after = udp_ports(&s.client, 20000, 90);
    let mut moved_others = 0;
    for (p, m) in &before {
        let now = &after[p];
        assert_ne!(now, "m3", "removed member still chosen for {p}");
        assert_ne!(now, "timeout");
        if m != "m3" && now != m {
            moved_others += 1;
        }
    }
    assert!(
        moved_others <= 5,
        "{moved_others} flows of the remaining members moved"
    );
    s.lab.kill(s.fulcrum);
}

#[test]
fn dr_mode_end_to_end() {
    let s = dr_lab("xdpdr", &dr_config(""));
    dsr_traffic(&s);

    // IPv6 VIP.
    let six = wait_for(
        "a response through the IPv6 VIP",
        Duration::from_secs(20),
        || curl(&s.client, "http://[2001:db8:10::1]/").filter(|b| !b.is_empty()),
    );
    assert!(six.ends_with(" 2001:db8::2"), "{six:?}");

    // Counters in /metrics.
    let m = admin(&s.lb, "GET", "/metrics", None);
    assert!(
        metric(&m, "fulcrum_xdp_vs_new_flows_total", "service=\"web\"") >= 31.0,
        "{m}"
    );
    assert!(metric(&m, "fulcrum_xdp_vs_packets_total", "service=\"dns\"") >= 1.0);
    assert!(
        metric(
            &m,
            "fulcrum_xdp_member_new_flows_total",
            "member=\"198.18.0.11:80\""
        ) >= 1.0
    );
    let api = admin(&s.lb, "GET", "/api/v1/xdp", None);
    let v: serde_json::Value = serde_json::from_str(&api).expect("JSON");
    let web = v["services"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == "web"))
        .expect("web in /api/v1/xdp");
    assert!(web["new_flows"].as_u64().unwrap_or(0) >= 31, "{api}");
    assert_eq!(web["members"].as_array().map(Vec::len), Some(3), "{api}");
    assert_eq!(v["interfaces"][0], "eth0");

    // Drain: the established connection stays on its member, new flows avoid it.
    let mut hold = s
        .client
        .command("python3", &["-c", HOLD_PY, "198.18.10.1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("client");
    let mut out = BufReader::new(hold.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("first response");
    let held = line.split(' ').next().unwrap_or("").to_string();
    let idx: usize = held.trim_start_matches('m').parse().expect("member name");
    let addr = format!("198.18.0.1{idx}:80");
    let r = admin(
        &s.lb,
        "PUT",
        &format!("/api/v1/pools/web/members/{addr}/state"),
        Some(r#"{"state":"drain"}"#),
    );
    assert!(r.contains("drain"), "drain answered {r}");
    std::thread::sleep(Duration::from_millis(600)); // two refresh periods: the ring is rebuilt
    for _ in 0..20 {
        let body = curl(&s.client, "http://198.18.10.1/").expect("curl");
        assert!(
            !body.starts_with(&format!("{held} ")),
            "new flow went to the drained member"
        );
    }
    hold.stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"\n")
        .expect("go on");
    line.clear();
    out.read_line(&mut line)
        .expect("second response on the held connection");
    assert!(
        line.starts_with(&format!("{held} ")),
        "held connection moved: {line:?}"
    );
    let _ = hold.wait();

    // Weights reach the ring: the drained member back, another one at weight 0.
    admin(
        &s.lb,
        "PUT",
        &format!("/api/v1/pools/web/members/{addr}/state"),
        Some(r#"{"state":"enabled"}"#),
    );
    let other = if idx == 1 { 2 } else { 1 };
    let r = admin(
        &s.lb,
        "PUT",
        &format!("/api/v1/pools/web/members/198.18.0.1{other}:80/weight"),
        Some(r#"{"weight":0}"#),
    );
    assert!(r.contains("weight"), "weight answered {r}");
    std::thread::sleep(Duration::from_millis(600));
    let mut names = std::collections::HashSet::new();
    for _ in 0..24 {
        let body = curl(&s.client, "http://198.18.10.1/").expect("curl");
        names.insert(body.split(' ').next().unwrap_or("").to_string());
    }
    assert!(
        !names.contains(&format!("m{other}")),
        "weight 0 member got new flows: {names:?}"
    );
    assert!(
        names.contains(&held),
        "the drained member is back: {names:?}"
    );
    let _ = &s.members;
    let _ = s.fulcrum;
    drop(s.lab);
}

/// Routed NAT: client — Fulcrum (eth0 | eth1) — members on their own segment, whose default
/// route is Fulcrum. Checksum offload is off on the hosts, so every checksum the receivers
/// verify is one the data plane wrote.
fn nat_lab(tag: &str) -> Setup {
    nat_lab_with(tag, "")
}

/// The nat lab with `web_extra` added to the "web" service (tcp/80 on 198.18.10.1).
fn nat_lab_with(tag: &str, web_extra: &str) -> Setup {
    let mut lab = Lab::new(tag);
    let sw = lab.ns("sw").expect("ns");
    sw.ip(&["link", "add", "br0", "type", "bridge"])
        .expect("bridge");
    sw.ip(&["link", "set", "br0", "up"]).expect("bridge up");
    let client = lab.ns("cl").expect("ns");
    let lb = lab.ns("lb").expect("ns");
    let members: Vec<Ns> = (1..=3)
        .map(|i| lab.ns(&format!("m{i}")).expect("ns"))
        .collect();
    lab.veth(&client, "eth0", &lb, "eth0").expect("veth");
    lab.veth(&lb, "eth1", &sw, "p-lb").expect("veth");
    sw.ip(&["link", "set", "p-lb", "master", "br0"])
        .expect("enslave");
    client.addr("eth0", "198.18.0.2/24").expect("addr");
    client.addr("eth0", "2001:db8::2/64").expect("addr");
    lb.addr("eth0", "198.18.0.1/24").expect("addr");
    lb.addr("eth0", "2001:db8::1/64").expect("addr");
    lb.addr("eth1", "198.18.1.1/24").expect("addr");
    lb.addr("eth1", "2001:db8:1::1/64").expect("addr");
    lb.sysctl("net.ipv4.ip_forward", "1").expect("sysctl");
    lb.sysctl("net.ipv6.conf.all.forwarding", "1")
        .expect("sysctl");
    client
        .route(&["198.18.10.1/32", "via", "198.18.0.1"])
        .expect("route");
    client
        .route(&["2001:db8:10::1/128", "via", "2001:db8::1"])
        .expect("route");
    client
        .exec("ethtool", &["-K", "eth0", "tx", "off"])
        .expect("ethtool");
    for (i, m) in members.iter().enumerate() {
        let i = i + 1;
        lab.veth(m, "eth0", &sw, &format!("p-m{i}")).expect("veth");
        sw.ip(&["link", "set", &format!("p-m{i}"), "master", "br0"])
            .expect("enslave");
        m.addr("eth0", &format!("198.18.1.1{i}/24")).expect("addr");
        m.addr("eth0", &format!("2001:db8:1::1{i}/64"))
            .expect("addr");
        m.route(&["default", "via", "198.18.1.1"])
            .expect("default route");
        m.ip(&["-6", "route", "add", "default", "via", "2001:db8:1::1"])
            .expect("default route");
        m.exec("ethtool", &["-K", "eth0", "tx", "off"])
            .expect("ethtool");
        let name = format!("m{i}");
        let own = format!("198.18.1.1{i}");
        lab.spawn(m, "python3", &["-c", MEMBER_PY, &name, &own])
            .expect("member");
    }
    let members_toml: String = (1..=3)
        .map(|i| format!("[[pool.member]]\naddress = \"198.18.1.1{i}:80\"\n"))
        .collect();
    let members6: String = (1..=3)
        .map(|i| format!("[[pool.member]]\naddress = \"[2001:db8:1::1{i}]:80\"\n"))
        .collect();
    let members53: String = (1..=3)
        .map(|i| format!("[[pool.member]]\naddress = \"198.18.1.1{i}:53\"\n"))
        .collect();
    let config = format!(
        r#"
[[virtual_service]]
name = "web"
listen = "198.18.10.1:80"
protocol = "tcp"
pool = "web"
forwarding = "nat"
interfaces = ["eth0", "eth1"]
xdp_mode = "generic"
{web_extra}

[[virtual_service]]
name = "dns"
listen = "198.18.10.1:53"
protocol = "udp"
pool = "dns"
forwarding = "nat"
interfaces = ["eth0", "eth1"]
xdp_mode = "generic"

[[pool]]
name = "web"
algorithm = "hash"
{members_toml}
[[virtual_service]]
name = "web6"
listen = "[2001:db8:10::1]:80"
protocol = "tcp"
pool = "web6"
forwarding = "nat"
interfaces = ["eth0", "eth1"]
xdp_mode = "generic"

[[pool]]
name = "web6"
algorithm = "hash"
{members6}
[[pool]]
name = "dns"
algorithm = "hash"
{members53}"#
    );
    start_fulcrum(lab, client, lb, members, Vec::new(), &config)
}

#[test]
fn nat_mode_end_to_end() {
    let s = nat_lab("xdpnat");
    s.wait_resolved(9);
    let first = wait_for(
        "a response through the VIP",
        Duration::from_secs(20),
        || curl(&s.client, "http://198.18.10.1/").filter(|b| !b.is_empty()),
    );
    assert!(
        first.ends_with(" 198.18.0.2"),
        "member sees the client: {first:?}\n{}",
        s.log()
    );
    let mut seen = std::collections::HashMap::new();
    for _ in 0..30 {
        let body = curl(&s.client, "http://198.18.10.1/").expect("curl");
        assert!(body.ends_with(" 198.18.0.2"), "{body:?}");
        *seen
            .entry(body.split(' ').next().unwrap_or("").to_string())
            .or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 3, "all members used: {seen:?}");
    let answer = wait_for("a UDP answer", Duration::from_secs(10), || {
        udp_query(&s.client, "198.18.10.1").filter(|a| !a.is_empty())
    });
    assert!(answer.ends_with(" 198.18.0.2"), "{answer:?}");
    let mut seen6 = std::collections::HashSet::new();
    for _ in 0..15 {
        let body = curl(&s.client, "http://[2001:db8:10::1]/").expect("curl");
        assert!(
            body.ends_with(" 2001:db8::2"),
            "IPv6 through nat: {body:?}\n{}",
            s.log()
        );
        seen6.insert(body.split(' ').next().unwrap_or("").to_string());
    }
    assert!(seen6.len() >= 2, "IPv6 flows spread: {seen6:?}");

    // Reload: the maps are updated in place; a held connection goes on on the same member.
    let mut hold = s
        .client
        .command("python3", &["-c", HOLD_PY, "198.18.10.1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("client");
    let mut out = BufReader::new(hold.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("first response");
    let held = line.split(' ').next().unwrap_or("").to_string();
    let r = admin(&s.lb, "POST", "/api/v1/reload", Some("{}"));
    assert!(r.contains("generation"), "reload: {r}");
    hold.stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"\n")
        .expect("go on");
    line.clear();
    out.read_line(&mut line)
        .expect("second response after the reload");
    assert!(
        line.starts_with(&format!("{held} ")),
        "held connection moved: {line:?}"
    );
    let _ = hold.wait();

    let m = admin(&s.lb, "GET", "/metrics", None);
    assert!(
        metric(&m, "fulcrum_xdp_vs_reply_packets_total", "service=\"web\"") >= 60.0,
        "{m}"
    );
    assert!(
        metric(&m, "fulcrum_xdp_vs_reply_packets_total", "service=\"dns\"") >= 1.0,
        "{m}"
    );

    // A reload that no longer lists an interface detaches from it, and only from it.
    assert!(xdp_on(&s.lb, "eth1"));
    let path = s._dir.path().join("fulcrum.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    std::fs::write(&path, text.replace(r#"["eth0", "eth1"]"#, r#"["eth0"]"#)).expect("config");
    let r = admin(&s.lb, "POST", "/api/v1/reload", Some("{}"));
    assert!(r.contains("generation"), "reload: {r}");
    assert!(!xdp_on(&s.lb, "eth1"), "detached from eth1");
    assert!(xdp_on(&s.lb, "eth0"), "still on eth0");

    // A reload refused after the XDP plane's step (the link plane's DNS proxy cannot bind: the
    // port is taken) changes nothing in the kernel: eth1 stays detached, the new VIP is not
    // written.
    let before = admin(&s.lb, "GET", "/api/v1/xdp", None);
    let text = std::fs::read_to_string(&path).expect("config");
    let taken = s
        .lb
        .command(
            "python3",
            &["-c", "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('198.18.0.1',5353))\nprint('ok',flush=True)\ntime.sleep(60)"],
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("holder");
    let mut taken = Killed(taken);
    let mut ready = String::new();
    BufReader::new(taken.0.stdout.take().expect("stdout"))
        .read_line(&mut ready)
        .expect("port taken");
    let refused = text.replace(r#"["eth0"]"#, r#"["eth0", "eth1"]"#)
        + r#"
[[virtual_service]]
name = "extra"
listen = "198.18.10.9:80"
protocol = "tcp"
pool = "web"
forwarding = "nat"
interfaces = ["eth0"]
xdp_mode = "generic"

[[pool]]
name = "uplinks"
kind = "link"
[[pool.member]]
name = "a"
interface = "eth1"
gateway = "198.18.1.11"
resolver = "198.18.1.11:53"

[[outbound]]
name = "lan"
sources = ["198.18.0.0/24"]
pool = "uplinks"
dns_proxy = "198.18.0.1:5353"
"#;
    std::fs::write(&path, refused).expect("config");
    let r = admin(&s.lb, "POST", "/api/v1/reload", Some("{}"));
    assert!(r.contains("errors") && r.contains("5353"), "reload: {r}");
    assert!(!xdp_on(&s.lb, "eth1"), "a refused reload attached to eth1");
    let after = admin(&s.lb, "GET", "/api/v1/xdp", None);
    assert!(
        !after.contains("extra"),
        "a refused reload wrote its VIP: {after}"
    );
    assert_eq!(
        before.matches("\"name\"").count(),
        after.matches("\"name\"").count()
    );
    drop(taken);
    std::fs::write(&path, text).expect("config");
}

/// Kills the child when dropped, also when an assertion fails.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A member that dies (its monitor goes down) loses its flows to the others; every other flow
/// stays on its member.
#[test]
fn a_dead_members_flows_move_and_no_other() {
    let config = format!(
        "{}\n[[monitor]]\nname = \"tcp80\"\ntype = \"tcp\"\ninterval = \"300ms\"\ntimeout = \"200ms\"\nfall = 2\n",
        service_config("dr", &[1, 2, 3], "monitors = [\"tcp80\"]")
    );
    let mut s = dr_lab("xdphc", &config);
    s.wait_resolved(6);
    wait_for("a UDP answer", Duration::from_secs(20), || {
        udp_query(&s.client, "198.18.10.1").filter(|a| !a.is_empty())
    });
    let before = udp_ports(&s.client, 21000, 60);
    let probe = *before
        .iter()
        .find(|(_, m)| *m == "m3")
        .expect("a flow on m3")
        .0;
    s.lab.kill(s.servers[2]);
    wait_for(
        "m3's flow answered by another member",
        Duration::from_secs(5),
        || {
            let r = udp_ports(&s.client, probe, 1);
            r.get(&probe)
                .filter(|m| m.starts_with('m') && *m != "m3")
                .map(drop)
        },
    );
    let after = udp_ports(&s.client, 21000, 60);
    for (p, m) in &before {
        if m == "m3" {
            assert!(after[p] == "m1" || after[p] == "m2", "{p}: {}", after[p]);
        } else {
            assert_eq!(&after[p], m, "flow {p} of a live member moved");
        }
    }
    assert!(
        s.log().contains("member out, its flows dropped"),
        "{}",
        s.log()
    );
}

fn xdp_on(ns: &Ns, ifname: &str) -> bool {
    ns.ip(&["link", "show", ifname])
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("prog/xdp"))
        .unwrap_or(false)
}

/// Attached on start; a crash (SIGKILL) leaves nothing attached (bpf_link); a program left by
/// another loader the legacy way is replaced on start; SIGTERM detaches.
#[test]
fn attach_replace_and_detach() {
    let mut s = dr_lab("xdplc", &service_config("dr", &[1, 2, 3], ""));
    assert!(xdp_on(&s.lb, "eth0"), "attached on start");
    s.lab.kill(s.fulcrum);
    // The kernel releases the link with the last reference to it, right after the exit.
    wait_for(
        "a killed Fulcrum's program to go",
        Duration::from_secs(5),
        || (!xdp_on(&s.lb, "eth0")).then_some(()),
    );

    // A stale program attached the legacy (netlink) way, as an older tool would leave it.
    let object = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fulcrum-xdp/bpf/fulcrum_xdp.o"
    );
    s.lb.ip(&[
        "link",
        "set",
        "dev",
        "eth0",
        "xdpgeneric",
        "obj",
        object,
        "sec",
        "xdp",
    ])
    .expect("legacy attach");
    assert!(xdp_on(&s.lb, "eth0"));
    let config = s._dir.path().join("fulcrum.toml");
    let child =
        s.lb.command(BIN, &["run", "-c", config.to_str().expect("path")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&s.log).expect("log"))
            .spawn()
            .expect("restart");
    let pid = child.id();
    let index = s.lab.adopt(child);
    let answer = wait_for("traffic after the restart", Duration::from_secs(20), || {
        curl(&s.client, "http://198.18.10.1/").filter(|b| !b.is_empty())
    });
    assert!(answer.ends_with(" 198.18.0.2"), "{answer:?}\n{}", s.log());
    assert!(
        s.log().contains("removing a stale program"),
        "the legacy program was replaced:\n{}",
        s.log()
    );
    // SIGTERM: detached when the process exits.
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    wait_for("detach after SIGTERM", Duration::from_secs(10), || {
        (!xdp_on(&s.lb, "eth0")).then_some(())
    });
    s.lab.kill(index);
}

/// A pass-all XDP program of "another tool", compiled with clang into `dir`.
fn foreign_program(dir: &std::path::Path) -> std::path::PathBuf {
    let source = dir.join("other_tool.c");
    std::fs::write(
        &source,
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         SEC(\"xdp\") int other_tool_pass(struct xdp_md *ctx) { return XDP_PASS; }\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n",
    )
    .expect("write the program");
    let object = dir.join("other_tool.o");
    let out = std::process::Command::new("clang")
        .args([
            "-target",
            "bpf",
            "-O2",
            "-I/usr/include/x86_64-linux-gnu",
            "-c",
        ])
        .arg(&source)
        .arg("-o")
        .arg(&object)
        .output()
        .expect("clang (scripts/test-packages)");
    assert!(
        out.status.success(),
        "clang: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    object
}

/// Another tool's XDP program on a listed interface is neither removed nor replaced: Fulcrum
/// refuses to start, names the program, and leaves it attached.
#[test]
fn another_tools_program_is_left_attached() {
    let mut s = dr_lab("xdpft", &service_config("dr", &[1, 2, 3], ""));
    s.lab.kill(s.fulcrum);
    wait_for(
        "a killed Fulcrum's program to go",
        Duration::from_secs(5),
        || (!xdp_on(&s.lb, "eth0")).then_some(()),
    );
    let object = foreign_program(s._dir.path());
    s.lb.ip(&[
        "link",
        "set",
        "dev",
        "eth0",
        "xdpgeneric",
        "obj",
        object.to_str().expect("path"),
        "sec",
        "xdp",
    ])
    .expect("attach the other tool's program");
    let attached_name = |ns: &Ns| {
        ns.ip(&["link", "show", "eth0"])
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("name other_tool_pass"))
            .unwrap_or(false)
    };
    assert!(attached_name(&s.lb));
    let config = s._dir.path().join("fulcrum.toml");
    let child =
        s.lb.command(BIN, &["run", "-c", config.to_str().expect("path")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&s.log).expect("log"))
            .spawn()
            .expect("restart");
    let index = s.lab.adopt(child);
    let pid = s.lab.pid(index).expect("pid");
    // Exited: gone, or a zombie until the lab reaps it.
    wait_for(
        "Fulcrum to refuse and exit",
        Duration::from_secs(20),
        || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            matches!(state, None | Some("Z")).then_some(())
        },
    );
    let log = s.log();
    assert!(
        log.contains("other_tool_pass") && log.contains("another tool"),
        "a clear error naming the program:\n{log}"
    );
    assert!(
        attached_name(&s.lb),
        "the other tool's program stays attached"
    );
    s.lab.kill(index);
}

fn curl_from(ns: &Ns, source: &str, url: &str) -> Option<String> {
    let out = ns
        .exec(
            "curl",
            &["-s", "--max-time", "2", "--interface", source, "-g", url],
        )
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// allow / deny of a nat service enforced in the kernel: a client in a denied prefix (or outside
/// `allow`) gets nothing, an allowed one its answers; the drops are counted by reason in
/// /metrics and the XDP API. A reload that denies a served client leaves its open connection
/// alone and refuses its new ones.
#[test]
fn nat_access_lists_in_the_kernel() {
    let lists = "allow = \"198.18.0.0/24\"\ndeny = \"198.18.0.3/32\"\nflow_limits = { new_per_second = 1000, max = 1000 }";
    let s = nat_lab_with("xdpacl", lists);
    s.client.addr("eth0", "198.18.0.3/24").expect("addr");
    s.client.addr("eth0", "198.18.5.5/32").expect("addr");
    s.wait_resolved(9);
    let body = wait_for(
        "an allowed client's answer",
        Duration::from_secs(20),
        || curl_from(&s.client, "198.18.0.2", "http://198.18.10.1/").filter(|b| !b.is_empty()),
    );
    assert!(body.ends_with(" 198.18.0.2"), "{body:?}");
    for src in ["198.18.0.3", "198.18.5.5"] {
        let b = curl_from(&s.client, src, "http://198.18.10.1/").unwrap_or_default();
        assert!(b.is_empty(), "{src} got an answer: {b:?}");
    }
    let m = admin(&s.lb, "GET", "/metrics", None);
    let denied = metric(&m, "fulcrum_xdp_vs_drops_total", "reason=\"denied\"");
    assert!(denied >= 1.0, "{m}");
    assert!(
        metric(&m, "fulcrum_xdp_vs_drops_total", "reason=\"not_allowed\"") >= 1.0,
        "{m}"
    );
    assert!(
        m.lines()
            .any(|l| l.starts_with("fulcrum_xdp_vs_drops_total")
                && l.contains("service=\"web\"")
                && l.contains("reason=\"denied\"")),
        "{m}"
    );
    let api = admin(&s.lb, "GET", "/api/v1/xdp", None);
    assert!(api.contains("\"denied\""), "{api}");
    assert!(api.contains("\"flow_limits\""), "{api}");

    // Reload: deny .2 instead of .3. The connection .2 holds goes on; its new ones do not.
    let mut hold = s
        .client
        .command("python3", &["-c", HOLD_PY, "198.18.10.1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("client");
    let mut out = BufReader::new(hold.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("first response");
    assert!(line.trim_end().ends_with(" 198.18.0.2"), "{line:?}");
    let path = s._dir.path().join("fulcrum.toml");
    let text = std::fs::read_to_string(&path).expect("config");
    std::fs::write(&path, text.replace("198.18.0.3/32", "198.18.0.2/32")).expect("config");
    let r = admin(&s.lb, "POST", "/api/v1/reload", Some("{}"));
    assert!(r.contains("generation"), "reload: {r}");
    hold.stdin
        .as_mut()
        .expect("stdin")
        .write_all(b"\n")
        .expect("go on");
    line.clear();
    out.read_line(&mut line)
        .expect("second response after the reload");
    assert!(
        line.trim_end().ends_with(" 198.18.0.2"),
        "held connection cut by the reload: {line:?}"
    );
    let _ = hold.wait();
    let b = curl_from(&s.client, "198.18.0.2", "http://198.18.10.1/").unwrap_or_default();
    assert!(
        b.is_empty(),
        "a new connection of a now denied client: {b:?}"
    );
    let b = wait_for(
        "the no longer denied client",
        Duration::from_secs(10),
        || curl_from(&s.client, "198.18.0.3", "http://198.18.10.1/").filter(|b| !b.is_empty()),
    );
    assert!(b.ends_with(" 198.18.0.3"), "{b:?}");
    let m = admin(&s.lb, "GET", "/metrics", None);
    assert!(
        metric(&m, "fulcrum_xdp_vs_drops_total", "reason=\"denied\"") > denied,
        "{m}"
    );
    assert!(
        metric(&m, "fulcrum_xdp_vs_flows", "service=\"web\"") >= 1.0,
        "{m}"
    );
}

/// A SYN flood from spoofed sources: `count` IPv4 TCP SYNs (raw socket, headers written here)
/// to `dst`:80 from 150 addresses in `prefix`.0/24, source ports from 1024 + `first`, with no
/// handshake behind them.
const SYN_FLOOD_PY: &str = r#"
import socket, struct, sys
def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF
dst, count, prefix = socket.inet_aton(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
first = int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for i in range(count):
    src = socket.inet_aton("%s.%d" % (prefix, 100 + i % 150))
    tcp = struct.pack("!HHIIBBHHH", 1024 + first + i, 80, i, 0, 5 << 4, 0x02, 64240, 0, 0)
    pseudo = src + dst + struct.pack("!BBH", 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", csum(pseudo + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), i & 0xFFFF, 0, 64, 6, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    s.sendto(ip + tcp, (sys.argv[1], 0))
print(count)
"#;

/// `flow_limits` through the binary: a SYN flood from spoofed sources at one nat VIP creates at
/// most `max` flows, is dropped by reason beyond the token bucket and the cap, and the other
/// VIPs, which share the kernel's connection tables, go on serving new clients meanwhile.
#[test]
fn a_syn_flood_to_one_vip_is_capped_and_the_others_go_on() {
    let limits = "flow_limits = { new_per_second = 200, burst = 200, max = 300 }";
    let s = nat_lab_with("xdpflood", limits);
    s.wait_resolved(9);
    wait_for(
        "the IPv6 VIP before the flood",
        Duration::from_secs(20),
        || curl(&s.client, "http://[2001:db8:10::1]/").filter(|b| !b.is_empty()),
    );
    // Two waves a second apart: the first spends the bucket (200 flows), the second its refill
    // up to the cap of 300 flows at once.
    for first in ["0", "3000"] {
        let sent = s
            .client
            .exec(
                "python3",
                &["-c", SYN_FLOOD_PY, "198.18.10.1", "3000", "198.18.0", first],
            )
            .expect("flood");
        assert_eq!(String::from_utf8_lossy(&sent.stdout).trim(), "3000");
        std::thread::sleep(Duration::from_millis(1200));
    }

    let m = wait_for("the flood's drops counted", Duration::from_secs(10), || {
        let m = admin(&s.lb, "GET", "/metrics", None);
        let dropped = metric(
            &m,
            "fulcrum_xdp_vs_drops_total",
            "reason=\"flow_rate_limited\"",
        ) + metric(
            &m,
            "fulcrum_xdp_vs_drops_total",
            "reason=\"flow_limit_reached\"",
        );
        (dropped >= 5000.0).then_some(m)
    });
    let flows = metric(&m, "fulcrum_xdp_vs_flows", "service=\"web\"");
    eprintln!(
        "flooded VIP: {flows} flows; dropped {} over the rate, {} over max",
        metric(
            &m,
            "fulcrum_xdp_vs_drops_total",
            "reason=\"flow_rate_limited\""
        ),
        metric(
            &m,
            "fulcrum_xdp_vs_drops_total",
            "reason=\"flow_limit_reached\""
        )
    );
    assert!(
        (1.0..=300.0).contains(&flows),
        "flows of the flooded VIP: {flows}\n{m}"
    );
    for reason in ["flow_rate_limited", "flow_limit_reached"] {
        let label = format!("reason=\"{reason}\"");
        assert!(
            metric(&m, "fulcrum_xdp_vs_drops_total", &label) >= 1.0,
            "{reason}: {m}"
        );
    }
    // The tables every VIP shares still take new flows of the others.
    let v6 = curl(&s.client, "http://[2001:db8:10::1]/").unwrap_or_default();
    assert!(
        v6.ends_with(" 2001:db8::2"),
        "the IPv6 VIP: {v6:?}\n{}",
        s.log()
    );
    let dns = udp_query(&s.client, "198.18.10.1").unwrap_or_default();
    assert!(
        dns.ends_with(" 198.18.0.2"),
        "the udp VIP: {dns:?}\n{}",
        s.log()
    );
}

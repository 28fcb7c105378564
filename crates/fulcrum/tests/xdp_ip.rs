//! End to end: `protocol = "ip"` VIPs (every IP protocol to the address) and tcp port-0
//! wildcards of the in-kernel forwarder, through the real binary in network namespaces the test
//! creates: a client, Fulcrum and two members. Needs root (CI runs as root).
//!
//! GRE and ESP: the CI kernel has neither GRE (CONFIG_NET_IPGRE_DEMUX) nor ESP
//! (CONFIG_INET_ESP) nor AEAD ciphers, so `ip tunnel` / `ip xfrm` cannot terminate them. The
//! client and the members exchange real GRE (RFC 2784 header, IPv4 inside) and ESP (SPI,
//! sequence number, opaque payload) packets through raw sockets of protocols 47 and 50 instead:
//! on the wire they are what those stacks send, which is all the forwarder sees.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use fulcrum_testkit::netns::{Lab, Ns};

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const TOKEN: &str = "xdp-ip-test-token-0123456789";
const VIP: &str = "198.18.10.1";
const VIP6: &str = "2001:db8:10::1";

/// A member: answers GRE and ESP packets (raw sockets, bound to `bind` when given: the VIP in
/// dr mode) with the same header and "reply NAME CLIENT", and TCP on ports 80 and 8080 with
/// "NAME PORT CLIENT".
const MEMBER_PY: &str = r#"
import socket, sys, threading
name, bind = sys.argv[1], sys.argv[2]
def raw(proto):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, proto)
    if bind:
        s.bind((bind, 0))
    while True:
        d, a = s.recvfrom(65535)
        body = d[(d[0] & 0xf) * 4:]
        if b"reply" in body:
            continue
        head = body[:4] if proto == 47 else body[:8]
        s.sendto(head + f"reply {name} {a[0]}".encode(), (a[0], 0))
def tcp(port):
    l = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("0.0.0.0", port))
    l.listen(64)
    while True:
        c, a = l.accept()
        c.sendall(f"{name} {port} {a[0]}\n".encode())
        c.close()
for p in (47, 50):
    threading.Thread(target=raw, args=(p,), daemon=True).start()
for p in (80, 8080):
    threading.Thread(target=tcp, args=(p,), daemon=True).start()
threading.Event().wait()
"#;

/// The client's side of GRE (47) or ESP (50): sends a packet to the VIP until a reply comes
/// (at most 5 tries), prints "SOURCE TEXT" of the reply.
const RAW_CLIENT_PY: &str = r#"
import socket, struct, sys
vip, proto = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, proto)
s.settimeout(1)
if proto == 47:
    inner = bytes([0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]) + bytes(8)
    packet = struct.pack("!HH", 0, 0x0800) + inner + b"hello"
else:
    packet = struct.pack("!II", 0x1001, 1) + b"hello-esp-payload"
for _ in range(5):
    s.sendto(packet, (vip, 0))
    try:
        while True:
            d, a = s.recvfrom(65535)
            body = d[(d[0] & 0xf) * 4:]
            at = body.find(b"reply")
            if at >= 0:
                print(a[0], body[at:].decode())
                sys.exit(0)
    except socket.timeout:
        pass
sys.exit(1)
"#;

/// `n` TCP connections to each port: one "NAME PORT CLIENT" line per connection.
const TCP_CLIENT_PY: &str = r#"
import socket, sys
vip, n = sys.argv[1], int(sys.argv[2])
for port in map(int, sys.argv[3:]):
    for _ in range(n):
        c = socket.create_connection((vip, port), timeout=2)
        print(c.makefile().readline().strip(), flush=True)
        c.close()
"#;

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// GRE (47) or ESP (50) to `vip`: (reply source, member name, client address the member saw).
fn raw_exchange(ns: &Ns, vip: &str, proto: u8) -> Option<(String, String, String)> {
    let out = ns
        .exec("python3", &["-c", RAW_CLIENT_PY, vip, &proto.to_string()])
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut w = text.split(' ');
    let (from, _, name, seen) = (w.next()?, w.next()?, w.next()?, w.next()?);
    Some((from.into(), name.into(), seen.into()))
}

fn tcp_lines(ns: &Ns, n: u32, ports: &[&str]) -> Option<Vec<String>> {
    let mut args = vec!["-c", TCP_CLIENT_PY, VIP];
    let n = n.to_string();
    args.push(&n);
    args.extend_from_slice(ports);
    let out = ns.exec("python3", &args).ok()?;
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect(),
    )
}

fn ping(ns: &Ns, addr: &str) -> bool {
    ns.exec("ping", &["-c", "1", "-W", "2", addr]).is_ok()
}

/// ICMP echo requests a namespace's stack answered ("InEchos" of /proc/net/snmp, per netns).
fn echoes_answered(ns: &Ns, v6: bool) -> u64 {
    let (file, field) = if v6 {
        ("/proc/net/snmp6", "Icmp6InEchos")
    } else {
        ("/proc/net/snmp", "InEchos")
    };
    let Ok(out) = ns.exec("cat", &[file]) else {
        return 0;
    };
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if v6 {
        return text
            .lines()
            .find_map(|l| l.strip_prefix(field)?.trim().parse().ok())
            .unwrap_or(0);
    }
    // Two "Icmp:" lines: names, then values.
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with("Icmp:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let (Some(names), Some(values)) = (rows.first(), rows.get(1)) else {
        return 0;
    };
    names
        .iter()
        .position(|n| *n == field)
        .and_then(|i| values.get(i)?.parse().ok())
        .unwrap_or(0)
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
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Setup {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_resolved(&self, n: usize) {
        wait_for("member next hops", Duration::from_secs(20), || {
            (self.log().matches("next hop resolved").count() >= n).then_some(())
        });
    }

    fn metrics(&self) -> String {
        let auth = format!("Authorization: Bearer {TOKEN}");
        let out = self
            .lb
            .exec(
                "curl",
                &[
                    "-s",
                    "--max-time",
                    "3",
                    "-H",
                    &auth,
                    "http://127.0.0.1:9900/metrics",
                ],
            )
            .expect("metrics");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// The member (by name) whose stack answered echo requests since `before`.
    fn echo_answerer(&self, before: &[u64], v6: bool) -> Option<String> {
        let now: Vec<u64> = self
            .members
            .iter()
            .map(|m| echoes_answered(m, v6))
            .collect();
        let grew: Vec<usize> = (0..now.len()).filter(|&i| now[i] > before[i]).collect();
        match grew[..] {
            [i] => Some(format!("m{}", i + 1)),
            _ => None,
        }
    }
}

fn start_fulcrum(mut lab: Lab, client: Ns, lb: Ns, members: Vec<Ns>, body: &str) -> Setup {
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
    lab.adopt(child);
    let s = Setup {
        lab,
        client,
        lb,
        members,
        log,
        _dir: dir,
    };
    wait_for("Fulcrum's admin API", Duration::from_secs(20), || {
        s.lb.exec(
            "curl",
            &[
                "-sf",
                "-H",
                &format!("Authorization: Bearer {TOKEN}"),
                "http://127.0.0.1:9900/api/v1/status",
            ],
        )
        .ok()
        .filter(|o| !o.stdout.is_empty())
    });
    s
}

fn members_toml(prefix: &str) -> String {
    (1..=2)
        .map(|i| format!("[[pool.member]]\naddress = \"{prefix}{i}:0\"\n"))
        .collect()
}

/// One L2 segment (a bridge) with the client, Fulcrum and two members holding the VIPs on lo:
/// the dr topology. An ip service on the VIPs and a tcp port-0 service on the IPv4 VIP.
fn dr_lab(tag: &str) -> Setup {
    let mut lab = Lab::new(tag);
    let sw = lab.ns("sw").expect("ns");
    sw.ip(&["link", "add", "br0", "type", "bridge"])
        .expect("bridge");
    sw.ip(&["link", "set", "br0", "up"]).expect("bridge up");
    let client = lab.ns("cl").expect("ns");
    let lb = lab.ns("lb").expect("ns");
    let members: Vec<Ns> = (1..=2)
        .map(|i| lab.ns(&format!("m{i}")).expect("ns"))
        .collect();
    let plug = |ns: &Ns, port: &str| {
        lab.veth(ns, "eth0", &sw, port).expect("veth");
        sw.ip(&["link", "set", port, "master", "br0"])
            .expect("enslave");
    };
    plug(&client, "p-cl");
    plug(&lb, "p-lb");
    client
        .exec("ethtool", &["-K", "eth0", "tx", "off"])
        .expect("ethtool");
    client.addr("eth0", "198.18.0.2/24").expect("addr");
    client.addr("eth0", "2001:db8::2/64").expect("addr");
    lb.addr("eth0", "198.18.0.1/24").expect("addr");
    lb.addr("eth0", "2001:db8::1/64").expect("addr");
    client
        .route(&[&format!("{VIP}/32"), "via", "198.18.0.1"])
        .expect("route");
    client
        .route(&[&format!("{VIP6}/128"), "via", "2001:db8::1"])
        .expect("route");
    for (i, m) in members.iter().enumerate() {
        let i = i + 1;
        plug(m, &format!("p-m{i}"));
        m.addr("eth0", &format!("198.18.0.1{i}/24")).expect("addr");
        m.addr("eth0", &format!("2001:db8::1{i}/64")).expect("addr");
        m.addr("lo", &format!("{VIP}/32")).expect("vip on lo");
        m.addr("lo", &format!("{VIP6}/128")).expect("vip on lo");
        m.sysctl("net.ipv4.conf.all.arp_ignore", "1")
            .expect("sysctl");
        m.sysctl("net.ipv4.conf.all.arp_announce", "2")
            .expect("sysctl");
    }
    for (i, m) in members.iter().enumerate() {
        lab.spawn(
            m,
            "python3",
            &["-c", MEMBER_PY, &format!("m{}", i + 1), VIP],
        )
        .expect("member");
    }
    let members4 = members_toml("198.18.0.1");
    let config = format!(
        r#"
[[virtual_service]]
name = "vpn"
listen = ["{VIP}", "{VIP6}"]
protocol = "ip"
pool = "gw"
forwarding = "dr"
interfaces = ["eth0"]
xdp_mode = "generic"

[[virtual_service]]
name = "any-port"
listen = "{VIP}:0"
protocol = "tcp"
pool = "gw"
forwarding = "dr"
interfaces = ["eth0"]
xdp_mode = "generic"

[[pool]]
name = "gw"
algorithm = "hash"
{members4}"#
    );
    start_fulcrum(lab, client, lb, members, &config)
}

#[test]
fn ip_vip_in_dr_mode_carries_gre_esp_and_icmp_echo() {
    let s = dr_lab("xdpipdr");
    s.wait_resolved(2);
    let before: Vec<u64> = s
        .members
        .iter()
        .map(|m| echoes_answered(m, false))
        .collect();
    wait_for(
        "an ICMP echo through the ip VIP",
        Duration::from_secs(20),
        || ping(&s.client, VIP).then_some(()),
    );
    let pinged = s
        .echo_answerer(&before, false)
        .unwrap_or_else(|| panic!("one member answered the echo\n{}", s.log()));
    let (from, gre_member, seen) = wait_for("a GRE reply", Duration::from_secs(10), || {
        raw_exchange(&s.client, VIP, 47)
    });
    // dr: the member answers the client directly, from the VIP, and saw the client itself.
    assert_eq!((from.as_str(), seen.as_str()), (VIP, "198.18.0.2"));
    let (from, esp_member, seen) = wait_for("an ESP reply", Duration::from_secs(10), || {
        raw_exchange(&s.client, VIP, 50)
    });
    assert_eq!((from.as_str(), seen.as_str()), (VIP, "198.18.0.2"));
    // One client, one member, whatever the protocol (hashed by the client address).
    assert_eq!(gre_member, esp_member);
    assert_eq!(pinged, gre_member);
    // IPv6: ICMPv6 echo to the ip VIP's IPv6 address is answered by a member too.
    let before6: Vec<u64> = s.members.iter().map(|m| echoes_answered(m, true)).collect();
    wait_for(
        "an ICMPv6 echo through the ip VIP",
        Duration::from_secs(10),
        || ping(&s.client, VIP6).then_some(()),
    );
    assert!(
        s.echo_answerer(&before6, true).is_some(),
        "a member answered the ICMPv6 echo"
    );
    let m = s.metrics();
    assert!(
        metric(&m, "fulcrum_xdp_vs_new_flows_total", "service=\"vpn\"") >= 4.0,
        "{m}"
    );
}

/// tcp port 0: every port to the VIP is the service's, and its connections spread over the
/// members by the 5-tuple (the ip service on the same address comes after it).
#[test]
fn tcp_port_zero_wildcard_balances_connections_to_any_port() {
    let s = dr_lab("xdpipany");
    s.wait_resolved(2);
    wait_for(
        "a TCP answer through the wildcard",
        Duration::from_secs(20),
        || tcp_lines(&s.client, 1, &["8080"]).filter(|l| l.len() == 1),
    );
    let lines = tcp_lines(&s.client, 20, &["80", "8080"]).expect("tcp client");
    assert_eq!(lines.len(), 40, "{lines:?}");
    for port in ["80", "8080"] {
        let members: std::collections::HashSet<&str> = lines
            .iter()
            .filter(|l| l.split(' ').nth(1) == Some(port))
            .map(|l| {
                assert!(l.ends_with(" 198.18.0.2"), "member sees the client: {l}");
                l.split(' ').next().unwrap_or("")
            })
            .collect();
        assert_eq!(members.len(), 2, "port {port} spread over both: {lines:?}");
    }
    let m = s.metrics();
    assert!(
        metric(&m, "fulcrum_xdp_vs_new_flows_total", "service=\"any-port\"") >= 41.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "fulcrum_xdp_vs_new_flows_total", "service=\"vpn\""),
        0.0,
        "TCP went to the port-0 service, not the ip one"
    );
}

/// nat: Fulcrum routes between the client and the members; the member sees the client's
/// address, answers from its own, and Fulcrum puts the VIP back as the source.
#[test]
fn ip_vip_in_nat_mode_translates_gre_esp_icmp_and_tcp() {
    let mut lab = Lab::new("xdpipnat");
    let sw = lab.ns("sw").expect("ns");
    sw.ip(&["link", "add", "br0", "type", "bridge"])
        .expect("bridge");
    sw.ip(&["link", "set", "br0", "up"]).expect("bridge up");
    let client = lab.ns("cl").expect("ns");
    let lb = lab.ns("lb").expect("ns");
    let members: Vec<Ns> = (1..=2)
        .map(|i| lab.ns(&format!("m{i}")).expect("ns"))
        .collect();
    lab.veth(&client, "eth0", &lb, "eth0").expect("veth");
    lab.veth(&lb, "eth1", &sw, "p-lb").expect("veth");
    sw.ip(&["link", "set", "p-lb", "master", "br0"])
        .expect("enslave");
    client.addr("eth0", "198.18.0.2/24").expect("addr");
    lb.addr("eth0", "198.18.0.1/24").expect("addr");
    lb.addr("eth1", "198.18.1.1/24").expect("addr");
    lb.sysctl("net.ipv4.ip_forward", "1").expect("sysctl");
    client
        .route(&[&format!("{VIP}/32"), "via", "198.18.0.1"])
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
        m.route(&["default", "via", "198.18.1.1"])
            .expect("default route");
        m.exec("ethtool", &["-K", "eth0", "tx", "off"])
            .expect("ethtool");
        lab.spawn(m, "python3", &["-c", MEMBER_PY, &format!("m{i}"), ""])
            .expect("member");
    }
    let config = format!(
        r#"
[[virtual_service]]
name = "vpn"
listen = "{VIP}"
protocol = "ip"
pool = "gw"
forwarding = "nat"
interfaces = ["eth0", "eth1"]
xdp_mode = "generic"
idle_timeout = "60s"

[[pool]]
name = "gw"
algorithm = "hash"
{}"#,
        members_toml("198.18.1.1")
    );
    let s = start_fulcrum(lab, client, lb, members, &config);
    s.wait_resolved(2);
    let before: Vec<u64> = s
        .members
        .iter()
        .map(|m| echoes_answered(m, false))
        .collect();
    wait_for(
        "an ICMP echo through the nat ip VIP",
        Duration::from_secs(20),
        || ping(&s.client, VIP).then_some(()),
    );
    let pinged = s
        .echo_answerer(&before, false)
        .unwrap_or_else(|| panic!("one member answered the echo\n{}", s.log()));
    for proto in [47u8, 50] {
        let (from, member, seen) = wait_for("a raw reply", Duration::from_secs(10), || {
            raw_exchange(&s.client, VIP, proto)
        });
        assert_eq!(from, VIP, "proto {proto}: the reply comes from the VIP");
        assert_eq!(
            seen, "198.18.0.2",
            "proto {proto}: the member sees the client"
        );
        assert_eq!(member, pinged, "proto {proto}: the client's member");
    }
    // TCP to any port, not translated: the member answers on the port the client chose.
    let lines = tcp_lines(&s.client, 3, &["8080"]).expect("tcp client");
    assert_eq!(lines.len(), 3, "{lines:?}");
    for l in &lines {
        assert_eq!(l, &format!("{pinged} 8080 198.18.0.2"));
    }
    let m = s.metrics();
    assert!(
        metric(&m, "fulcrum_xdp_vs_reply_packets_total", "service=\"vpn\"") >= 3.0,
        "{m}"
    );
    drop(s.lab);
}

//! Client-address transparency (`source = "client"`), through the binary in network
//! namespaces the test creates: a client, Fulcrum's namespace (a router: ip_forward) and a
//! member whose default route goes via Fulcrum. The member reports the peer address it sees;
//! with `source = "client"` that is the client's own address (and port), with the default
//! (`local`) Fulcrum's address on the member network.
//!
//!   client 198.18.50.2 — cl0 [fl] 198.18.50.1 … 198.18.51.1 mb0 — member 198.18.51.2
//!          fd00:50::2                fd00:50::1 … fd00:51::1         fd00:51::2

mod common;
#[path = "common/lab.rs"]
mod lab;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_testkit::netns::{Lab, Ns};
use lab::{api, api_raw, in_ns, wait_for, NsFulcrum, ADMIN_TOKEN};

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const CLIENT: &str = "198.18.50.2";
const CLIENT6: &str = "fd00:50::2";
const FL_CLIENT_SIDE: &str = "198.18.50.1";
const FL_MEMBER_SIDE: &str = "198.18.51.1";
const MEMBER_TCP: &str = "198.18.51.2:7000";
const MEMBER_HTTP: &str = "198.18.51.2:8080";
const MEMBER6_TCP: &str = "[fd00:51::2]:7000";

struct Net {
    lab: Lab,
    client: Ns,
    fl: Ns,
    stop: Arc<AtomicBool>,
}

impl Drop for Net {
    fn drop(&mut self) {
        // The member threads end; the lab (dropped after this) deletes the namespaces.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A member in `ns` at `addr` that reports the peer address of each connection: an HTTP
/// request is answered with it as the body (then closed), any other line with it as a line,
/// after which the connection is held until the client closes.
fn reporter(ns: &Ns, addr: &str, stop: Arc<AtomicBool>) {
    let addr: SocketAddr = addr.parse().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let _ = ns.thread(move || {
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
                    std::thread::spawn(move || report(stream, peer));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("member thread")
        .expect("member bind");
}

fn report(stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(mut w) = stream.try_clone() else {
        return;
    };
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    if line.starts_with("GET ") {
        // HTTP/1.1 with keep-alive: every request on the connection is answered with the peer,
        // until one asks to close.
        loop {
            let mut head = std::mem::take(&mut line);
            while r.read_line(&mut head).is_ok_and(|n| n > 2) {}
            let close = head.to_ascii_lowercase().contains("connection: close");
            let body = peer.to_string();
            let connection = if close { "close" } else { "keep-alive" };
            if write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{body}",
                body.len()
            )
            .is_err()
                || close
                || r.read_line(&mut line).unwrap_or(0) == 0
            {
                return;
            }
        }
    }
    // Every line is answered with the peer, until the client closes.
    loop {
        if writeln!(w, "{peer}").is_err() {
            return;
        }
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
    }
}

fn net(tag: &str) -> Net {
    let mut lab = Lab::new(tag);
    let client = lab.ns("client").unwrap();
    let fl = lab.ns("fl").unwrap();
    let member = lab.ns("member").unwrap();
    lab.veth(&client, "eth0", &fl, "cl0").unwrap();
    lab.veth(&fl, "mb0", &member, "eth0").unwrap();
    client.addr("eth0", &format!("{CLIENT}/24")).unwrap();
    client.addr("eth0", &format!("{CLIENT6}/64")).unwrap();
    fl.addr("cl0", &format!("{FL_CLIENT_SIDE}/24")).unwrap();
    fl.addr("cl0", "fd00:50::1/64").unwrap();
    fl.addr("mb0", &format!("{FL_MEMBER_SIDE}/24")).unwrap();
    fl.addr("mb0", "fd00:51::1/64").unwrap();
    member.addr("eth0", "198.18.51.2/24").unwrap();
    member.addr("eth0", "fd00:51::2/64").unwrap();
    client.route(&["default", "via", FL_CLIENT_SIDE]).unwrap();
    client
        .ip(&["-6", "route", "add", "default", "via", "fd00:50::1"])
        .unwrap();
    // The members' replies to client addresses go back through Fulcrum.
    member.route(&["default", "via", FL_MEMBER_SIDE]).unwrap();
    member
        .ip(&["-6", "route", "add", "default", "via", "fd00:51::1"])
        .unwrap();
    for (key, value) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.default.rp_filter", "0"),
    ] {
        fl.sysctl(key, value).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    for addr in [MEMBER_TCP, MEMBER_HTTP, MEMBER6_TCP] {
        reporter(&member, addr, stop.clone());
    }
    Net {
        lab,
        client,
        fl,
        stop,
    }
}

/// The services; `source` for all but the IPv6 one ("tcp6"), which has `source6`.
fn config_v6(source: &str, source6: &str, cert: &str, key: &str) -> String {
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token = "{ADMIN_TOKEN}"

[[virtual_service]]
name = "tcp"
listen = "{FL_CLIENT_SIDE}:7000"
protocol = "tcp"
pool = "tcp"
source = "{source}"

[[virtual_service]]
name = "tcp6"
listen = "[fd00:50::1]:7000"
protocol = "tcp"
pool = "tcp6"
source = "{source6}"

[[virtual_service]]
name = "tcp2"
listen = "{FL_CLIENT_SIDE}:7001"
protocol = "tcp"
pool = "tcp"
source = "{source}"

[[virtual_service]]
name = "web"
listen = "{FL_CLIENT_SIDE}:8080"
protocol = "http"
pool = "web"
source = "{source}"

[[virtual_service]]
name = "secure"
listen = "{FL_CLIENT_SIDE}:8443"
protocol = "https"
pool = "web"
source = "{source}"
tls = [{{ cert = "{cert}", key = "{key}" }}]

[[virtual_service]]
name = "host"
listen = "{FL_CLIENT_SIDE}:7002"
protocol = "tcp"
pool = "tcp"

[[pool]]
name = "tcp"
monitors = []
[[pool.member]]
address = "{MEMBER_TCP}"

[[pool]]
name = "tcp6"
monitors = []
[[pool.member]]
address = "{MEMBER6_TCP}"

[[pool]]
name = "web"
monitors = []
reuse = "always"
[[pool.member]]
address = "{MEMBER_HTTP}"
"#
    )
}

fn config(source: &str, cert: &str, key: &str) -> String {
    config_v6(source, source, cert, key)
}

/// From the client namespace: connects to `vs` (from `bind` when given, with SO_REUSEADDR),
/// sends a line, and returns the member's report of the peer it saw and the client's own
/// address; the connection is kept open in `held`.
fn ask_tcp(
    client: &Ns,
    vs: &str,
    bind: Option<SocketAddr>,
    held: &mut Vec<TcpStream>,
) -> Result<(SocketAddr, SocketAddr), String> {
    let vs: SocketAddr = vs.parse().unwrap();
    let (stream, seen, me) = in_ns(client, move || {
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(vs),
            socket2::Type::STREAM,
            None,
        )
        .map_err(|e| e.to_string())?;
        if let Some(b) = bind {
            sock.set_reuse_address(true).map_err(|e| e.to_string())?;
            sock.bind(&b.into()).map_err(|e| format!("bind {b}: {e}"))?;
        }
        sock.connect_timeout(&vs.into(), Duration::from_secs(3))
            .map_err(|e| format!("connect {vs}: {e}"))?;
        let s: TcpStream = sock.into();
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let me = s.local_addr().map_err(|e| e.to_string())?;
        let mut w = s.try_clone().map_err(|e| e.to_string())?;
        w.write_all(b"who\n").map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(s.try_clone().map_err(|e| e.to_string())?)
            .read_line(&mut line)
            .map_err(|e| format!("read from {vs}: {e}"))?;
        let seen: SocketAddr = line
            .trim()
            .parse()
            .map_err(|_| format!("member report {line:?} from {vs}"))?;
        Ok::<_, String>((s, seen, me))
    })?;
    held.push(stream);
    Ok((seen, me))
}

/// Asks the member again over an open connection of `ask_tcp`: the peer it reports.
fn again(stream: &TcpStream) -> Result<SocketAddr, String> {
    let mut w = stream.try_clone().map_err(|e| e.to_string())?;
    w.write_all(b"who\n").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(w)
        .read_line(&mut line)
        .map_err(|e| format!("read: {e}"))?;
    line.trim()
        .parse()
        .map_err(|_| format!("member report {line:?}"))
}

/// From the client namespace: one HTTP GET to `vs` over a connection of its own; the member's
/// report and the client's address.
fn ask_http(client: &Ns, vs: &str) -> Result<(SocketAddr, SocketAddr), String> {
    let vs: SocketAddr = vs.parse().unwrap();
    in_ns(client, move || {
        let mut s = TcpStream::connect_timeout(&vs, Duration::from_secs(3))
            .map_err(|e| format!("connect {vs}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let me = s.local_addr().map_err(|e| e.to_string())?;
        write!(
            s,
            "GET / HTTP/1.1\r\nHost: {vs}\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut out = String::new();
        s.read_to_string(&mut out).map_err(|e| e.to_string())?;
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let seen: SocketAddr = body
            .trim()
            .parse()
            .map_err(|_| format!("answer from {vs}: {out:?}"))?;
        Ok((seen, me))
    })
}

/// A keep-alive HTTP/1.1 client connection in the client namespace.
struct KeepAlive {
    stream: BufReader<TcpStream>,
    me: SocketAddr,
}

impl KeepAlive {
    fn open(client: &Ns, vs: &str) -> Result<KeepAlive, String> {
        let vs: SocketAddr = vs.parse().unwrap();
        in_ns(client, move || {
            let s = TcpStream::connect_timeout(&vs, Duration::from_secs(3))
                .map_err(|e| format!("connect {vs}: {e}"))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .map_err(|e| e.to_string())?;
            let me = s.local_addr().map_err(|e| e.to_string())?;
            Ok(KeepAlive {
                stream: BufReader::new(s),
                me,
            })
        })
    }

    /// One GET on the connection: the member's report of the peer it saw.
    fn get(&mut self) -> Result<SocketAddr, String> {
        self.stream
            .get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: vs\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut length = 0;
        loop {
            let mut line = String::new();
            if self
                .stream
                .read_line(&mut line)
                .map_err(|e| e.to_string())?
                == 0
            {
                return Err("closed before the answer".into());
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().map_err(|_| format!("{line:?}"))?;
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0u8; length];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| e.to_string())?;
        let body = String::from_utf8_lossy(&body).to_string();
        body.parse().map_err(|_| format!("answer {body:?}"))
    }
}

/// From the client namespace: one HTTPS GET with curl (the certificate is self-signed); the
/// member's report.
fn ask_https(client: &Ns, url: &str) -> Result<SocketAddr, String> {
    let out = client
        .exec("curl", &["-sk", "--max-time", "5", url])
        .map_err(|e| format!("curl {url}: {e}"))?;
    let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
    body.parse()
        .map_err(|_| format!("answer from {url}: {body:?}"))
}

fn metric(ns: &Ns, sample: &str) -> Option<f64> {
    let (_, text) = api_raw(ns, "GET", "/metrics", "");
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
}

fn service_status(ns: &Ns, name: &str) -> serde_json::Value {
    let (_, status) = api(ns, "GET", "/api/v1/status");
    status["virtual_services"]
        .as_array()
        .and_then(|v| v.iter().find(|s| s["name"] == name).cloned())
        .unwrap_or_default()
}

fn rules(fl: &Ns) -> String {
    let v4 = fl
        .ip(&["rule", "show"])
        .map(|o| o.stdout)
        .unwrap_or_default();
    let v6 = fl
        .ip(&["-6", "rule", "show"])
        .map(|o| o.stdout)
        .unwrap_or_default();
    format!(
        "{}{}",
        String::from_utf8_lossy(&v4),
        String::from_utf8_lossy(&v6)
    )
}

#[test]
fn members_see_the_clients_own_address() {
    let mut net = net("tp");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) =
        fulcrum_testkit::pki::self_signed(dir.path(), "vs", "vs.test", 30, Some("IP:198.18.50.1"));
    let text = config("client", &cert, &key);
    let fl = net.fl.clone();
    let f = NsFulcrum::start(&mut net.lab, &fl, BIN, &text);
    let client = net.client.clone();
    let client_ip: IpAddr = CLIENT.parse().unwrap();
    let mut held = Vec::new();

    // tcp: the member sees the client's address and port.
    let (seen, me) = ask_tcp(&client, "198.18.50.1:7000", None, &mut held)
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    assert_eq!(seen, me, "tcp: the member saw {seen}, the client is {me}");

    // tcp over IPv6.
    let (seen, me) = ask_tcp(&client, "[fd00:50::1]:7000", None, &mut held)
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    assert_eq!(seen, me, "tcp6: the member saw {seen}, the client is {me}");

    // http: the member connection is the client connection's own, from its address and port.
    let (seen, me) =
        ask_http(&client, "198.18.50.1:8080").unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    assert_eq!(seen, me, "http: the member saw {seen}, the client is {me}");

    // Member connections are never shared between clients, even with reuse = "always": a
    // second client connection gets a member connection of its own, from its own port, while
    // the first keeps its own for its next request.
    let mut a = KeepAlive::open(&client, "198.18.50.1:8080").unwrap();
    assert_eq!(a.get().unwrap(), a.me);
    let mut b = KeepAlive::open(&client, "198.18.50.1:8080").unwrap();
    assert_eq!(b.get().unwrap(), b.me, "client b got a's member connection");
    assert_eq!(a.get().unwrap(), a.me);
    drop(a);
    let mut c = KeepAlive::open(&client, "198.18.50.1:8080").unwrap();
    assert_eq!(
        c.get().unwrap(),
        c.me,
        "client c got a closed client's member connection"
    );

    // https (TLS terminated by Fulcrum).
    let seen = ask_https(&client, "https://198.18.50.1:8443/")
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    assert_eq!(seen.ip(), client_ip, "https: the member saw {seen}");

    // The default: the member sees Fulcrum's address on its network.
    let (seen, _) = ask_tcp(&client, "198.18.50.1:7002", None, &mut held)
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    assert_eq!(seen.ip().to_string(), FL_MEMBER_SIDE, "source = local");

    // The client reaches two services, each to the same member, from one address and port:
    // the second member connection cannot take that 4-tuple again. It comes from the client's
    // address with another port, and is counted.
    let port = 40123;
    let from = SocketAddr::new(client_ip, port);
    let (first, _) = ask_tcp(&client, "198.18.50.1:7000", Some(from), &mut held)
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    assert_eq!(first, from);
    let (second, me) = ask_tcp(&client, "198.18.50.1:7001", Some(from), &mut held)
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    assert_eq!(me, from);
    assert_eq!(
        second.ip(),
        client_ip,
        "fallback keeps the client's address"
    );
    assert_ne!(second.port(), port, "fallback takes another port");
    assert_eq!(
        metric(&fl, "fulcrum_transparent_port_fallbacks_total{vs=\"tcp2\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&fl, "fulcrum_transparent_port_fallbacks_total{vs=\"tcp\"}"),
        Some(0.0)
    );
    let status = service_status(&fl, "tcp2");
    assert_eq!(status["transparent"]["port_fallbacks"], 1, "{status}");
    assert_eq!(status["transparent"]["connections"], 1, "{status}");
    assert!(service_status(&fl, "host").get("transparent").is_none());
    assert!(metric(&fl, "fulcrum_transparent_connections_total{vs=\"tcp\"}").unwrap_or(0.0) >= 2.0);

    // The return path Fulcrum installed.
    let installed = rules(&fl);
    assert!(
        installed.contains("fwmark 0x46540001 lookup 1179910145"),
        "{installed}"
    );
    let nft = fl
        .exec("nft", &["list", "table", "inet", "fulcrum_transparent"])
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_else(|e| e);
    assert!(nft.contains("socket transparent 1"), "{nft}");

    // A reload without source = "client": the return path stays while a client connection
    // of those services is open (its member connection still comes from the client's
    // address), and goes with the last of them.
    let kept = held.remove(0);
    drop(held);
    drop((b, c));
    let local = config("local", &cert, &key);
    std::fs::write(f.dir.path().join("fulcrum.toml"), local).unwrap();
    let (code, body) = api_raw(&fl, "POST", "/api/v1/reload", "");
    assert_eq!(code, 200, "{body}\n{}", f.logs());
    std::thread::sleep(Duration::from_millis(600));
    assert!(rules(&fl).contains("0x46540001"), "{}", rules(&fl));
    let me = kept.local_addr().unwrap();
    assert_eq!(
        again(&kept).unwrap(),
        me,
        "the kept connection after the reload"
    );
    drop(kept);
    assert!(
        wait_for(Duration::from_secs(5), || !rules(&fl)
            .contains("0x46540001")),
        "{}",
        rules(&fl)
    );
    let mut held = Vec::new();
    let (seen, _) = ask_tcp(&client, "198.18.50.1:7000", None, &mut held)
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    assert_eq!(seen.ip().to_string(), FL_MEMBER_SIDE, "after the reload");
    drop(held);

    // source = "client" on IPv4 services only: no IPv6 rule. Then on the IPv6 one too: the
    // IPv6 rule is added to the running return path, and IPv6 clients are seen again.
    let v6_rules = || {
        fl.ip(&["-6", "rule", "show"])
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    };
    std::fs::write(
        f.dir.path().join("fulcrum.toml"),
        config_v6("client", "local", &cert, &key),
    )
    .unwrap();
    let (code, body) = api_raw(&fl, "POST", "/api/v1/reload", "");
    assert_eq!(code, 200, "{body}\n{}", f.logs());
    assert!(rules(&fl).contains("0x46540001"), "{}", rules(&fl));
    assert!(!v6_rules().contains("0x46540001"), "{}", v6_rules());
    std::fs::write(
        f.dir.path().join("fulcrum.toml"),
        config("client", &cert, &key),
    )
    .unwrap();
    let (code, body) = api_raw(&fl, "POST", "/api/v1/reload", "");
    assert_eq!(code, 200, "{body}\n{}", f.logs());
    assert!(v6_rules().contains("0x46540001"), "{}", v6_rules());
    let mut held = Vec::new();
    let (seen, me) = ask_tcp(&client, "[fd00:50::1]:7000", None, &mut held)
        .unwrap_or_else(|e| panic!("{e}\n{}", f.logs()));
    assert_eq!(seen, me, "tcp6 after the reload: the member saw {seen}");
    drop(held);

    // A graceful stop: the rule, the route and the table go.
    let pid = net.lab.pid(f.index).expect("fulcrum's pid").to_string();
    fulcrum_testkit::netns::run("kill", &["-TERM", &pid]).unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || !std::path::Path::new(&format!(
            "/proc/{pid}/status"
        ))
        .exists()
            || std::fs::read_to_string(format!("/proc/{pid}/status"))
                .is_ok_and(|s| s.contains("State:\tZ"))),
        "fulcrum did not stop:\n{}",
        f.logs()
    );
    let left = rules(&fl);
    assert!(!left.contains("0x46540001"), "{left}");
    let routes = fl
        .ip(&["route", "show", "table", "1179910145"])
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    assert!(routes.trim().is_empty(), "{routes}");
    assert!(
        fl.exec("nft", &["list", "table", "inet", "fulcrum_transparent"])
            .is_err(),
        "the nftables table is left"
    );
}

#[test]
fn check_explains_and_refuses() {
    let base = "[[pool]]\nname = \"p\"\n[[pool.member]]\naddress = \"127.0.0.1:9\"\n";
    let service = |protocol: &str, extra: &str| {
        format!(
            "[[virtual_service]]\nname = \"s\"\nlisten = \"127.0.0.1:7000\"\nprotocol = \"{protocol}\"\npool = \"p\"\n{extra}\n{base}"
        )
    };

    let (ok, out) = common::check(&service("tcp", "source = \"client\""));
    assert!(ok, "{out}");
    assert!(out.contains("route their replies"), "{out}");
    assert!(out.contains("CAP_NET_ADMIN"), "{out}");
    let (ok, out) = common::check(&service("tcp", "source = \"local\""));
    assert!(ok && !out.contains("note:"), "{out}");

    let (ok, out) = common::check(&service("http", "source = \"clinet\""));
    assert!(!ok, "{out}");
    assert!(out.contains("bad.toml:6"), "{out}");
    assert!(out.contains("virtual_service[0].source"), "{out}");
    assert!(out.contains("expected one of: local, client"), "{out}");

    let (ok, out) = common::check(&service(
        "https",
        "source = \"client\"\nsnat = \"127.0.0.2\"\ntls = [{ cert = \"/nonexistent.crt\", key = \"/nonexistent.key\" }]",
    ));
    assert!(!ok, "{out}");
    assert!(out.contains("cannot be combined with `snat`"), "{out}");

    let (ok, out) = common::check(&service("message", "source = \"client\""));
    assert!(!ok, "{out}");
    assert!(out.contains("not available on message services"), "{out}");

    let (ok, out) = common::check(&service("ftp", "source = \"client\""));
    assert!(!ok, "{out}");
    assert!(
        out.contains("applies to protocol tcp / http / https / message"),
        "{out}"
    );

    let (ok, out) = common::check(
        &service("http", "source = \"client\"")
            .replace("name = \"p\"\n", "name = \"p\"\nhttp2 = true\n"),
    );
    assert!(!ok, "{out}");
    assert!(out.contains("http2"), "{out}");
}

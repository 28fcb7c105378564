//! `ha.sync` carries what a user notices across a failover: header, cookie_passive and RADIUS
//! persistence entries (their keys hash under a secret both nodes derive from the sync key),
//! cookie_insert cookies (signed with a secret derived the same way) and TLS session tickets
//! (keys derived the same way). The master is killed with SIGKILL; every client goes on to the
//! member it had, and a TLS client resumes its session on the new master.

#[path = "common/lab.rs"]
mod lab;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_testkit::netns::{Lab, Ns};
use lab::*;

const BIN: &str = env!("CARGO_BIN_EXE_fulcrum");
const VIP: &str = "198.18.0.100";
const M1: &str = "198.18.0.21";
const M2: &str = "198.18.0.22";

fn at(port: u16) -> SocketAddr {
    SocketAddr::new(VIP.parse().unwrap(), port)
}

/// An HTTP member that answers with its name and, to a request without a `SID` cookie, sets one
/// of its own (`SID=<name>-<n>`): the session cookie `cookie_passive` learns.
struct CookieMember {
    stop: Arc<AtomicBool>,
}

impl CookieMember {
    fn start(ns: &Ns, addr: SocketAddr, name: &'static str) -> CookieMember {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let path = format!("/var/run/netns/{}", ns.name);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            enter(&path);
            let l = TcpListener::bind(addr).expect("bind member");
            l.set_nonblocking(true).expect("nonblocking");
            let _ = ready_tx.send(());
            let n = Arc::new(AtomicU64::new(0));
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => {
                        let n = n.clone();
                        std::thread::spawn(move || answer(c, name, &n));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("member ready");
        CookieMember { stop }
    }
}

impl Drop for CookieMember {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn answer(mut c: TcpStream, name: &str, n: &AtomicU64) {
    let _ = c.set_nonblocking(false);
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let set = if head.contains("sid=") {
        String::new()
    } else {
        format!(
            "Set-Cookie: SID={name}-{}; Path=/\r\n",
            n.fetch_add(1, Ordering::Relaxed)
        )
    };
    let body = format!("{name}\n");
    let _ = write!(
        c,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{set}Connection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A UDP member that answers every datagram with its name.
fn udp_member(ns: &Ns, addr: SocketAddr, name: &'static str) {
    let path = format!("/var/run/netns/{}", ns.name);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        enter(&path);
        let s = UdpSocket::bind(addr).expect("bind udp member");
        let _ = ready_tx.send(());
        let mut buf = [0u8; 4096];
        while let Ok((_, from)) = s.recv_from(&mut buf) {
            let _ = s.send_to(name.as_bytes(), from);
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("udp member ready");
}

/// A response: who answered, and the `name=value` of each Set-Cookie.
#[derive(Debug)]
struct Reply {
    body: String,
    cookies: Vec<String>,
}

/// One GET to `addr` with `extra` header lines, from the calling thread's namespace.
fn get(addr: SocketAddr, extra: &str) -> Result<Reply, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no head")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.to_string());
    }
    let cookies = head
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("set-cookie")
                .then(|| v.trim().split(';').next().unwrap_or("").to_string())
        })
        .collect();
    Ok(Reply {
        body: body.trim().to_string(),
        cookies,
    })
}

/// A RADIUS Access-Request for `user` (code 1, a User-Name attribute).
fn access_request(user: &str, id: u8) -> Vec<u8> {
    let len = 20 + 2 + user.len();
    let mut p = vec![1, id];
    p.extend_from_slice(&(len as u16).to_be_bytes());
    p.extend_from_slice(&[7u8; 16]);
    p.extend_from_slice(&[1, (2 + user.len()) as u8]);
    p.extend_from_slice(user.as_bytes());
    p
}

/// Who answers `user`'s Access-Request (a new source port each time).
fn radius(addr: SocketAddr, user: &str) -> Result<String, String> {
    let s = UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .map_err(|e| e.to_string())?;
    s.send_to(&access_request(user, 1), addr)
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 512];
    let (n, _) = s.recv_from(&mut buf).map_err(|e| format!("recv: {e}"))?;
    Ok(String::from_utf8_lossy(&buf[..n]).to_string())
}

/// `openssl s_client` from namespace `ns` to `addr`, one request read to the end (so TLS 1.3
/// tickets that follow the handshake are kept), with `args` (`-sess_out`, `-sess_in`).
fn s_client(ns: &Ns, addr: SocketAddr, args: &[&str]) -> String {
    let connect = addr.to_string();
    // Bounded: coreutils' timeout ends a hung handshake after 15 s.
    let mut all = vec![
        "15", "openssl", "s_client", "-connect", &connect, "-ign_eof",
    ];
    all.extend_from_slice(args);
    let mut child = ns
        .command("timeout", &all)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("openssl is installed by scripts/test.sh");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request");
    let out = child.wait_with_output().expect("openssl output");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A node's directory with its admin token file: `cookie.secret` (the cookie secret of a node
/// without `ha.sync`) lives beside it, so each node has its own, as on two machines.
fn node_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin.token");
    std::fs::write(&token, "lab-admin-token-0123456789\n").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    dir
}

fn config(dir: &std::path::Path, name: &str, prio: u8, me: &str, peer: &str, tls: &str) -> String {
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token_file = "{}/admin.token"

[ha]
node = "{name}"
interface = "eth0"
vrid = 51
priority = {prio}
advert_interval = "100ms"
vips = ["{VIP}/24"]
sync = {{ listen = "{me}:7500", peers = ["{peer}:7500"], key = "a-sync-key-for-the-test-0123" }}

[[virtual_service]]
name = "hdr"
listen = ["0.0.0.0:80"]
protocol = "http"
pool = "web"
persistence = "by-header"

[[virtual_service]]
name = "passive"
listen = ["0.0.0.0:81"]
protocol = "http"
pool = "web"
persistence = "by-session-cookie"

[[virtual_service]]
name = "insert"
listen = ["0.0.0.0:82"]
protocol = "http"
pool = "web"
persistence = "by-inserted-cookie"

[[virtual_service]]
name = "tls"
listen = ["0.0.0.0:443"]
protocol = "https"
pool = "web"
{tls}

[[virtual_service]]
name = "radius"
listen = ["0.0.0.0:1812"]
protocol = "udp"
udp_mode = "per_packet"
pool = "aaa"
persistence = "by-user"

[[pool]]
name = "web"
algorithm = "round_robin"
[[pool.member]]
address = "{M1}:8080"
[[pool.member]]
address = "{M2}:8080"

[[pool]]
name = "aaa"
algorithm = "round_robin"
[[pool.member]]
address = "{M1}:1812"
[[pool.member]]
address = "{M2}:1812"

[[persistence]]
name = "by-header"
type = "header"
header = "X-Session"

[[persistence]]
name = "by-session-cookie"
type = "cookie_passive"
cookie = "SID"

[[persistence]]
name = "by-inserted-cookie"
type = "cookie_insert"

[[persistence]]
name = "by-user"
type = "radius"
attribute = "User-Name"
"#,
        dir.display()
    )
}

/// The sessions a client runs before the failover, and what must hold after it.
struct Sessions {
    headers: Vec<String>,
    passive_cookies: Vec<String>,
    inserted_cookies: Vec<String>,
    users: Vec<String>,
}

/// Every session answered by `want`.
fn check_sessions(s: &Sessions, want: &str) -> Result<(), String> {
    let expect = |what: String, got: Result<String, String>| match got {
        Ok(w) if w == want => Ok(()),
        other => Err(format!("{what}: {other:?}")),
    };
    for h in &s.headers {
        let r = get(at(80), &format!("X-Session: {h}\r\n")).map(|r| r.body);
        expect(format!("header {h}"), r)?;
    }
    for c in &s.passive_cookies {
        let r = get(at(81), &format!("Cookie: {c}\r\n")).map(|r| r.body);
        expect(format!("cookie_passive {c}"), r)?;
    }
    for c in &s.inserted_cookies {
        let r = get(at(82), &format!("Cookie: {c}\r\n")).map(|r| r.body);
        expect(format!("cookie_insert {c}"), r)?;
    }
    for u in &s.users {
        expect(format!("radius {u}"), radius(at(1812), u))?;
    }
    Ok(())
}

#[test]
fn persistence_of_every_kind_and_tls_resumption_hold_on_the_new_master() {
    let mut lab = Lab::new("has");
    let a = lab.ns("a").unwrap();
    let b = lab.ns("b").unwrap();
    let c = lab.ns("c").unwrap();
    let srv = lab.ns("s").unwrap();
    segment(
        &mut lab,
        &[
            (&a, "198.18.0.1/24"),
            (&b, "198.18.0.2/24"),
            (&c, "198.18.0.10/24"),
            (&srv, &format!("{M1}/24")),
        ],
    );
    srv.addr("eth0", &format!("{M2}/24")).unwrap();
    let _m1 = CookieMember::start(&srv, format!("{M1}:8080").parse().unwrap(), "m1");
    let _m2 = CookieMember::start(&srv, format!("{M2}:8080").parse().unwrap(), "m2");
    udp_member(&srv, format!("{M1}:1812").parse().unwrap(), "m1");
    udp_member(&srv, format!("{M2}:1812").parse().unwrap(), "m2");
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = fulcrum_testkit::pki::self_signed(certs.path(), "vip", VIP, 2, None);

    let tls = format!("tls = [{{ cert = \"{cert}\", key = \"{key}\" }}]");
    let (dir_a, dir_b) = (node_dir(), node_dir());
    let config_a = config(dir_a.path(), "a", 150, "198.18.0.1", "198.18.0.2", &tls);
    let config_b = config(dir_b.path(), "b", 100, "198.18.0.2", "198.18.0.1", &tls);
    let fa = NsFulcrum::start_in(&mut lab, &a, BIN, &config_a, dir_a);
    let fb = NsFulcrum::start_in(&mut lab, &b, BIN, &config_b, dir_b);
    expect_role(&fa, "master");
    expect_role(&fb, "backup");
    assert!(wait_for(Duration::from_secs(5), || holds(&a, VIP)));

    // m2 takes no new sessions while they start (weight 0, which reaches b through the sync
    // too), then gets its weight back: without the synced state, b's round robin would send
    // about half of these sessions to m2 after the failover.
    let weight = |w: u32| {
        for (pool, port) in [("web", 8080), ("aaa", 1812)] {
            let path = format!("/api/v1/pools/{pool}/members/{M2}:{port}/weight");
            let body = format!("{{\"weight\": {w}}}");
            assert_eq!(api_with(&a, "PUT", &path, &body).0, 200);
        }
    };
    weight(0);
    let sessions = in_ns(&c, || {
        let mut s = Sessions {
            headers: (0..8).map(|i| format!("session-{i}")).collect(),
            passive_cookies: Vec::new(),
            inserted_cookies: Vec::new(),
            users: (0..8).map(|i| format!("user{i}")).collect(),
        };
        for _ in 0..8 {
            let r = get(at(81), "").expect("cookie_passive");
            assert_eq!(r.body, "m1");
            let sid = r.cookies.iter().find(|c| c.starts_with("SID="));
            s.passive_cookies
                .push(sid.expect("the member set SID").clone());
            let r = get(at(82), "").expect("cookie_insert");
            assert_eq!(r.body, "m1");
            let id = r.cookies.iter().find(|c| c.starts_with("FULCRUM="));
            s.inserted_cookies
                .push(id.expect("Fulcrum set its cookie").clone());
        }
        check_sessions(&s, "m1").expect("sessions stick on a");
        s
    });
    let sess = tempfile::tempdir().unwrap();
    let sess_file = sess.path().join("tls.session").display().to_string();
    let out = s_client(&c, at(443), &["-sess_out", &sess_file]);
    assert!(out.contains("New, TLSv1.3"), "{out}");
    weight(1);

    // b has every entry (per table, in GET /api/v1/ha) before a dies.
    let received = |t: &serde_json::Value, vs: &str| {
        t.as_array()
            .into_iter()
            .flatten()
            .find(|e| e["service"] == vs)
            .and_then(|e| e["entries_received"].as_u64())
            .unwrap_or(0)
    };
    assert!(
        wait_for(Duration::from_secs(5), || {
            let t = fb.ha()["sync"]["tables"].clone();
            received(&t, "hdr") >= 8 && received(&t, "passive") >= 8 && received(&t, "radius") >= 8
        }),
        "{}",
        fb.ha()
    );
    let ta = fa.ha()["sync"]["tables"].clone();
    for vs in ["hdr", "passive", "radius"] {
        let e = ta
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["service"] == vs)
            .unwrap_or_else(|| panic!("{vs} in {ta}"));
        assert_eq!(e["shared_hash"], true, "{e}");
        assert!(e["entries_sent"].as_u64() >= Some(8), "{e}");
    }
    // The weights reached b, so the checks below meet a b that would otherwise spread.
    std::thread::sleep(Duration::from_millis(300));

    lab.kill(fa.index);
    a.ip(&["link", "set", "eth0", "down"]).unwrap();
    expect_role(&fb, "master");
    assert!(wait_for(Duration::from_secs(5), || {
        in_ns(&c, || get(at(80), "").is_ok())
    }));
    let failover = in_ns(&c, move || {
        check_sessions(&sessions, "m1")?;
        // New sessions on b do spread (so the checks above did test the synced state).
        let fresh: Vec<String> = (100..104)
            .map(|i| {
                get(at(80), &format!("X-Session: fresh-{i}\r\n"))
                    .map(|r| r.body)
                    .unwrap_or_default()
            })
            .collect();
        Ok::<_, String>(fresh)
    });
    let fresh = failover.unwrap_or_else(|e| panic!("after the failover: {e}\n{}", fb.logs()));
    assert!(fresh.iter().any(|m| m == "m2"), "{fresh:?}");

    // The TLS client resumes its session with the new master.
    let out = s_client(&c, at(443), &["-sess_in", &sess_file]);
    assert!(out.contains("Reused, TLSv1.3"), "{out}");
    let metrics = api_raw(&b, "GET", "/metrics", "").1;
    assert!(
        metrics.contains("fulcrum_ha_sync_entries_received_total{vrid=\"51\",vs=\"hdr\"}"),
        "{metrics}"
    );
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

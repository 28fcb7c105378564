//! Helpers for tests that run Fulcrum inside network namespaces (`fulcrum_testkit::netns::Lab`):
//! threads that enter a namespace to serve or to be a client, the admin API of a Fulcrum that
//! listens inside one, and a shared Ethernet segment (a bridge in a namespace of its own).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum_testkit::netns::{Lab, Ns};

/// Runs `f` on a thread that has entered `ns`'s network namespace: sockets it creates live there.
pub fn in_ns<T: Send + 'static>(ns: &Ns, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{}", ns.name);
    std::thread::spawn(move || {
        enter(&path);
        f()
    })
    .join()
    .expect("namespace thread")
}

/// Moves the calling thread into the network namespace at `path`.
pub fn enter(path: &str) {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    // SAFETY: setns(2) on a namespace fd we hold open; it changes only this thread's network
    // namespace and touches no memory of ours.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

/// A bridge in namespace `sw` and, per host, a veth from the host's `eth0` into it.
pub fn segment(lab: &mut Lab, hosts: &[(&Ns, &str)]) -> Ns {
    let sw = lab.ns("sw").expect("switch namespace");
    sw.ip(&["link", "add", "br0", "type", "bridge"])
        .expect("bridge");
    sw.ip(&["link", "set", "br0", "up"]).expect("bridge up");
    for (i, (ns, cidr)) in hosts.iter().enumerate() {
        let port = format!("p{i}");
        lab.veth(ns, "eth0", &sw, &port).expect("veth");
        sw.ip(&["link", "set", &port, "master", "br0"])
            .expect("into the bridge");
        ns.addr("eth0", cidr).expect("address");
    }
    sw
}

/// A tiny HTTP server inside a namespace that answers every request with its name; stops when
/// `stop` is called (its listener closes, so health checks fail).
pub struct Backend {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backend {
    pub fn start(ns: &Ns, addr: SocketAddr, name: &str) -> Backend {
        let stop = Arc::new(AtomicBool::new(false));
        let path = format!("/var/run/netns/{}", ns.name);
        let (s, name) = (stop.clone(), name.to_string());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            enter(&path);
            let l = TcpListener::bind(addr).expect("backend bind");
            l.set_nonblocking(true).expect("nonblocking");
            let _ = ready_tx.send(());
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => {
                        let name = name.clone();
                        std::thread::spawn(move || serve(c, &name));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("backend ready");
        Backend {
            stop,
            thread: Some(thread),
        }
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(mut c: TcpStream, name: &str) {
    let _ = c.set_nonblocking(false);
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = format!("{name}\n");
    let _ = write!(
        c,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// One HTTP/1.1 GET with its own connection, from the calling thread's namespace; the body, or
/// why it failed.
pub fn http_get(addr: SocketAddr, timeout: Duration) -> Result<String, String> {
    let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    exchange(s, addr, timeout)
}

/// As `http_get`, from source address `from`.
pub fn http_get_from(
    from: std::net::IpAddr,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<String, String> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .map_err(|e| e.to_string())?;
    sock.bind(&SocketAddr::new(from, 0).into())
        .map_err(|e| format!("bind {from}: {e}"))?;
    sock.connect_timeout(&addr.into(), timeout)
        .map_err(|e| format!("connect: {e}"))?;
    exchange(sock.into(), addr, timeout)
}

fn exchange(mut s: TcpStream, addr: SocketAddr, timeout: Duration) -> Result<String, String> {
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no response head: {text:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("status: {}", head.lines().next().unwrap_or("")));
    }
    Ok(body.trim().to_string())
}

/// The admin API of a Fulcrum inside `ns` (at 127.0.0.1:9900 there): status and JSON body.
/// The admin token of every node the lab starts (`token = ADMIN_TOKEN` in their `[admin]`).
pub const ADMIN_TOKEN: &str = "lab-admin-token-0123456789";

pub fn api(ns: &Ns, method: &str, path: &str) -> (u16, serde_json::Value) {
    api_with(ns, method, path, "")
}

/// As `api`, with a JSON request body.
pub fn api_with(ns: &Ns, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    let (status, text) = api_raw(ns, method, path, body);
    (status, serde_json::from_str(&text).unwrap_or_default())
}

/// The status and body text of an admin API request inside `ns`.
pub fn api_raw(ns: &Ns, method: &str, path: &str, body: &str) -> (u16, String) {
    let (method, path, body) = (method.to_string(), path.to_string(), body.to_string());
    in_ns(ns, move || {
        let Ok(mut s) = TcpStream::connect_timeout(
            &SocketAddr::from(([127, 0, 0, 1], 9900)),
            Duration::from_secs(1),
        ) else {
            return (0, String::new());
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:9900\r\nConnection: close\r\n\
             Authorization: Bearer {ADMIN_TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).to_string();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, body.to_string())
    })
}

/// A Fulcrum process inside a namespace, its config and log in a temporary directory.
pub struct NsFulcrum {
    pub ns: Ns,
    pub dir: tempfile::TempDir,
    pub index: usize,
}

impl NsFulcrum {
    /// Writes `config` and starts `fulcrum run` in `ns`; waits until its API answers.
    pub fn start(lab: &mut Lab, ns: &Ns, bin: &str, config: &str) -> NsFulcrum {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_in(lab, ns, bin, config, dir)
    }

    /// As `start`, in an existing directory (a restart keeps its files).
    pub fn start_in(
        lab: &mut Lab,
        ns: &Ns,
        bin: &str,
        config: &str,
        dir: tempfile::TempDir,
    ) -> NsFulcrum {
        let path = dir.path().join("fulcrum.toml");
        std::fs::write(&path, config).expect("write config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("fulcrum.log"))
            .expect("log");
        let child = ns
            .command(bin, &["run", "-c", &path.display().to_string()])
            .env("RUST_LOG", "info")
            // What Fulcrum keeps at run time (conntrackd's files) goes with the test's directory.
            .env("RUNTIME_DIRECTORY", dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fulcrum");
        let index = lab.adopt(child);
        let f = NsFulcrum {
            ns: ns.clone(),
            dir,
            index,
        };
        let end = Instant::now() + Duration::from_secs(20);
        while api(ns, "GET", "/api/v1/status").0 != 200 {
            assert!(
                Instant::now() < end,
                "fulcrum in {} not ready:\n{}",
                ns.name,
                f.logs()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        f
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fulcrum.log")).unwrap_or_default()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("fulcrum.log")
    }

    pub fn ha(&self) -> serde_json::Value {
        api(&self.ns, "GET", "/api/v1/ha").1
    }

    pub fn role(&self) -> String {
        self.ha()["role"].as_str().unwrap_or("?").to_string()
    }
}

/// Polls `cond` every 20 ms until it holds or `deadline` passes.
pub fn wait_for(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `ns` holds `ip` (IPv4 or IPv6) on `eth0`.
pub fn holds(ns: &Ns, ip: &str) -> bool {
    let (family, word) = if ip.contains(':') {
        ("-6", "inet6")
    } else {
        ("-4", "inet")
    };
    ns.ip(&[family, "addr", "show", "dev", "eth0"])
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("{word} {ip}/")))
        .unwrap_or(false)
}

/// What a bounded client loop saw: when each request ended and who answered (or why not).
pub struct ClientLog {
    pub results: Vec<(Instant, Result<String, String>)>,
}

impl ClientLog {
    pub fn failures(&self) -> usize {
        self.results.iter().filter(|(_, r)| r.is_err()).count()
    }

    /// The service gap: from the last answer by `from` to the first answer by `to` after it.
    pub fn gap(&self, from: &str, to: &str) -> Option<Duration> {
        let last_from = self
            .results
            .iter()
            .rposition(|(_, r)| r.as_deref() == Ok(from))?;
        let first_to = self.results[last_from..]
            .iter()
            .find(|(_, r)| r.as_deref() == Ok(to))?;
        Some(first_to.0 - self.results[last_from].0)
    }

    pub fn served_by(&self, who: &str) -> usize {
        self.results
            .iter()
            .filter(|(_, r)| r.as_deref() == Ok(who))
            .count()
    }
}

/// A client in `ns` that GETs `vip` every `pause` until `stop` is set, at most `max` requests.
pub fn client_loop(
    ns: &Ns,
    vip: SocketAddr,
    pause: Duration,
    max: usize,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<ClientLog> {
    let path = format!("/var/run/netns/{}", ns.name);
    std::thread::spawn(move || {
        enter(&path);
        let mut results = Vec::new();
        while results.len() < max && !stop.load(Ordering::Relaxed) {
            let r = http_get(vip, Duration::from_millis(200));
            results.push((Instant::now(), r));
            std::thread::sleep(pause);
        }
        ClientLog { results }
    })
}

/// The VIP of the HA pair tests (ha.rs, ha_abuse.rs) on their 198.18.0.0/24 segment.
pub const HA_VIP: &str = "198.18.0.100";

/// A node: an HTTP service on port 80 of every address (so it answers on the VIP once it holds
/// it) in front of a local backend on 127.0.0.1:8080, checked every 100 ms.
pub fn ha_node_config(name: &str, priority: u8, extra: &str) -> String {
    format!(
        r#"[admin]
listen = "127.0.0.1:9900"
token = "lab-admin-token-0123456789"

[ha]
node = "{name}"
interface = "eth0"
vrid = 51
priority = {priority}
advert_interval = "100ms"
vips = ["{HA_VIP}/24"]
{extra}

[[virtual_service]]
name = "web"
listen = ["0.0.0.0:80"]
protocol = "http"
pool = "local"

[[pool]]
name = "local"
monitors = ["up"]
reuse = "never"
[[pool.member]]
address = "127.0.0.1:8080"

[[monitor]]
name = "up"
type = "tcp"
port = 8080
interval = "100ms"
timeout = "100ms"
fall = 2
rise = 2
"#
    )
}

/// Turns off IPv6 duplicate address detection for the interfaces `ns` gets from now on (call it
/// before the veths): while the link-local addresses are tentative, for a second or two, the
/// first packets to a fresh neighbour can wait for a retransmission.
pub fn no_dad(ns: &Ns) {
    for scope in ["all", "default"] {
        ns.sysctl(&format!("net.ipv6.conf.{scope}.accept_dad"), "0")
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

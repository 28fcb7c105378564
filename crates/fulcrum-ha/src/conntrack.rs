//! Routed flows across a failover (`[ha] conntrack_sync`): conntrackd, the netfilter project's
//! daemon for exactly this, copies the kernel's connection tracking of forwarded flows (their
//! NAT bindings and marks included, so a flow keeps its link and its SNAT address) to the peer
//! over a dedicated link in FTFW mode. The VRRP node drives it as keepalived's
//! `primary-backup.sh` does: on becoming master it commits the peer's copy into the kernel
//! *before* it takes the VIPs, so the first packet of a moved flow finds its state; on leaving
//! mastership it shortens the stale entries' timers and asks the new master for its table.
//!
//! Written here rather than reimplemented: the FTFW protocol, its acknowledgements and the
//! netlink event stream are conntrackd's; Fulcrum only writes its configuration, keeps the
//! process running and calls its control socket at role changes.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

/// What `[ha] conntrack_sync` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackConfig {
    /// The dedicated link to the peer.
    pub interface: String,
    /// Unicast UDP to this address; `None`: multicast to [`MULTICAST_GROUP`].
    pub peer: Option<Ipv4Addr>,
    pub port: u16,
}

/// conntrackd's customary multicast group for FTFW.
pub const MULTICAST_GROUP: Ipv4Addr = Ipv4Addr::new(225, 0, 0, 50);

/// How long a commit may hold back taking the VIPs: past it the VIPs are taken anyway (the
/// commit goes on) — a master that waits too long for its flow table is a master missing.
const COMMIT_WAIT: Duration = Duration::from_millis(1500);
/// Any other control call (flush, resync, bulk send, timers).
const CONTROL_WAIT: Duration = Duration::from_secs(10);

/// `GET /api/v1/ha` → `conntrack_sync`.
#[derive(Debug, Clone, Serialize)]
pub struct ConntrackStatus {
    pub interface: String,
    /// `unicast` or `multicast`.
    pub transport: &'static str,
    pub running: bool,
    /// Times conntrackd was started again after it ended by itself.
    pub restarts: u64,
    pub commits: u64,
    pub commit_failures: u64,
    /// How long the last commit into the kernel took, in milliseconds.
    pub last_commit_ms: Option<f64>,
    pub control_failures: u64,
    pub error: Option<String>,
}

#[derive(Default)]
struct Counters {
    restarts: AtomicU64,
    commits: AtomicU64,
    commit_failures: AtomicU64,
    control_failures: AtomicU64,
    /// Microseconds; u64::MAX: none yet.
    last_commit_us: AtomicU64,
}

/// A running conntrackd and the calls on its control socket.
pub struct Conntrackd {
    cfg: ConntrackConfig,
    dir: PathBuf,
    conf: PathBuf,
    child: Arc<Mutex<Option<Child>>>,
    stopping: Arc<AtomicBool>,
    counters: Arc<Counters>,
    error: Arc<Mutex<Option<String>>>,
}

/// conntrackd's configuration. `local` is this node's address on the sync link, `ignore` the
/// addresses whose flows are the node's own (its interfaces, its VIPs): a proxied connection
/// ends in this process and cannot move, so copying it would only fill the peer's table.
pub fn render_config(
    cfg: &ConntrackConfig,
    local: Ipv4Addr,
    ignore: &[IpAddr],
    dir: &Path,
) -> String {
    let mut s =
        String::from("# Written by Fulcrum for [ha] conntrack_sync; rewritten at every start.\n");
    s.push_str("Sync {\n  Mode FTFW {\n    DisableExternalCache Off\n  }\n");
    match cfg.peer {
        Some(peer) => {
            let _ = write!(
                s,
                "  UDP {{\n    IPv4_address {local}\n    IPv4_Destination_Address {peer}\n    Port {port}\n    Interface {ifname}\n    SndSocketBuffer 1249280\n    RcvSocketBuffer 1249280\n    Checksum on\n  }}\n",
                port = cfg.port,
                ifname = cfg.interface,
            );
        }
        None => {
            let _ = write!(
                s,
                "  Multicast {{\n    IPv4_address {MULTICAST_GROUP}\n    Group {port}\n    IPv4_interface {local}\n    Interface {ifname}\n    SndSocketBuffer 1249280\n    RcvSocketBuffer 1249280\n    Checksum on\n  }}\n",
                port = cfg.port,
                ifname = cfg.interface,
            );
        }
    }
    s.push_str("}\nGeneral {\n  Systemd off\n  HashSize 32768\n  HashLimit 262144\n");
    let _ = writeln!(s, "  LogFile {}", dir.join("conntrackd.log").display());
    s.push_str("  Syslog off\n");
    let _ = writeln!(s, "  LockFile {}", dir.join("conntrackd.lock").display());
    let _ = writeln!(
        s,
        "  UNIX {{\n    Path {}\n  }}",
        dir.join("conntrackd.ctl").display()
    );
    s.push_str("  NetlinkBufferSize 2097152\n  NetlinkBufferSizeMaxGrowth 8388608\n  NetlinkOverrunResync On\n");
    // Userspace filtering: the kernel-side filter has a small fixed room for addresses.
    s.push_str("  Filter From Userspace {\n    Protocol Accept {\n      TCP\n      UDP\n      SCTP\n      DCCP\n    }\n    Address Ignore {\n");
    let mut seen: Vec<IpAddr> = Vec::new();
    let fixed = [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        IpAddr::V4(local),
    ];
    for ip in fixed.iter().chain(ignore) {
        if seen.contains(ip) {
            continue;
        }
        seen.push(*ip);
        match ip {
            IpAddr::V4(a) => {
                let _ = writeln!(s, "      IPv4_address {a}");
            }
            IpAddr::V6(a) => {
                let _ = writeln!(s, "      IPv6_address {a}");
            }
        }
    }
    s.push_str("    }\n  }\n}\n");
    s
}

/// The directory of this process's conntrackd (configuration, control socket, lock, log):
/// under systemd's runtime directory or /run/fulcrum, one per process so two nodes on one
/// host (or a test's namespaces) never share a control socket. Directories of processes that
/// are gone are removed.
fn runtime_dir() -> std::io::Result<PathBuf> {
    let base = std::env::var_os("RUNTIME_DIRECTORY")
        .and_then(|v| {
            // systemd may list several, separated by ':'.
            v.to_str()
                .and_then(|s| s.split(':').next())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("/run/fulcrum"));
    std::fs::create_dir_all(&base)?;
    if let Ok(entries) = std::fs::read_dir(&base) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("conntrackd."))
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = base.join(format!("conntrackd.{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn spawn_daemon(conf: &Path) -> std::io::Result<Child> {
    let mut cmd = Command::new("conntrackd");
    cmd.arg("-C")
        .arg(conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2) and
    // getppid(2), both async-signal-safe; it touches no memory of the parent. PDEATHSIG ends
    // conntrackd with the thread that started it — the supervisor thread, which lives as long
    // as the process — so a kill -9 of Fulcrum leaves no daemon holding the control socket.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 || libc::getppid() == 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// What a control call of conntrackd came to: its exit status, with its words when it failed.
fn outcome(flag: &str, out: std::io::Result<std::process::Output>) -> Result<(), String> {
    let out = out.map_err(|e| format!("conntrackd {flag}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "conntrackd {flag}: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

impl Conntrackd {
    /// Writes the configuration and starts conntrackd under a supervisor thread that starts it
    /// again (after a second) whenever it ends by itself, and asks the peer for its table
    /// after each start.
    pub fn start(
        cfg: &ConntrackConfig,
        local: Ipv4Addr,
        ignore: &[IpAddr],
    ) -> std::io::Result<Arc<Conntrackd>> {
        let dir = runtime_dir()?;
        let conf = dir.join("conntrackd.conf");
        std::fs::write(&conf, render_config(cfg, local, ignore, &dir))?;
        let ct = Arc::new(Conntrackd {
            cfg: cfg.clone(),
            dir,
            conf,
            child: Arc::new(Mutex::new(None)),
            stopping: Arc::new(AtomicBool::new(false)),
            counters: Arc::new(Counters {
                last_commit_us: AtomicU64::new(u64::MAX),
                ..Counters::default()
            }),
            error: Arc::new(Mutex::new(None)),
        });
        let supervisor = ct.clone();
        std::thread::Builder::new()
            .name("fulcrum-conntrackd".into())
            .spawn(move || supervisor.supervise())?;
        Ok(ct)
    }

    fn supervise(&self) {
        let mut first = true;
        while !self.stopping.load(Ordering::Acquire) {
            // A lock file left by a conntrackd that was killed keeps the next one from starting.
            let _ = std::fs::remove_file(self.dir.join("conntrackd.lock"));
            match spawn_daemon(&self.conf) {
                Ok(child) => {
                    if !first {
                        self.counters.restarts.fetch_add(1, Ordering::Relaxed);
                    }
                    *self.child.lock() = Some(child);
                    *self.error.lock() = None;
                    self.after_start();
                }
                Err(e) => {
                    tracing::error!(error = %e, "HA: cannot start conntrackd (routed flows will not survive a failover)");
                    *self.error.lock() = Some(format!("cannot start conntrackd: {e}"));
                }
            }
            first = false;
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let mut guard = self.child.lock();
                let ended = match guard.as_mut() {
                    Some(c) => match c.try_wait() {
                        Ok(Some(status)) => Some(status.to_string()),
                        Ok(None) => None,
                        Err(e) => Some(e.to_string()),
                    },
                    None => Some("not running".to_string()),
                };
                if let Some(how) = ended {
                    *guard = None;
                    drop(guard);
                    if !self.stopping.load(Ordering::Acquire) {
                        tracing::warn!(status = %how, log = %self.dir.join("conntrackd.log").display(), "HA: conntrackd ended; starting it again in 1 s");
                        *self.error.lock() = Some(format!("conntrackd ended ({how})"));
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    break;
                }
            }
        }
    }

    /// Once the control socket answers: ask the peer for its table (a node that starts or
    /// restarts as backup knows nothing of the flows already running) and send ours.
    fn after_start(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.control_blocking("-s").is_ok() {
                for flag in ["-n", "-B"] {
                    if let Err(e) = self.control_blocking(flag) {
                        self.counters
                            .control_failures
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "HA: conntrackd {flag}");
                    }
                }
                tracing::info!(interface = %self.cfg.interface, "HA: conntrackd running");
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        tracing::warn!("HA: conntrackd's control socket did not answer within 5 s");
    }

    fn control_command(&self, flag: &str) -> Command {
        let mut cmd = Command::new("conntrackd");
        cmd.arg("-C")
            .arg(&self.conf)
            .arg(flag)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    }

    fn control_blocking(&self, flag: &str) -> Result<(), String> {
        outcome(flag, self.control_command(flag).output())
    }

    async fn control(&self, flag: &str, wait: Duration) -> Result<(), String> {
        let child = tokio::process::Command::from(self.control_command(flag))
            .spawn()
            .map_err(|e| format!("conntrackd {flag}: {e}"))?;
        match tokio::time::timeout(wait, child.wait_with_output()).await {
            Ok(out) => outcome(flag, out),
            Err(_) => Err(format!("conntrackd {flag}: no answer within {wait:?}")),
        }
    }

    /// Becoming master, before the VIPs are taken: the peer's flows into the kernel (bounded by
    /// [`COMMIT_WAIT`]); then, in the background, the caches flushed, the internal cache
    /// filled again from the kernel and sent in bulk to the peer, now the backup.
    pub async fn becoming_master(self: &Arc<Self>) {
        let started = Instant::now();
        match self.control("-c", COMMIT_WAIT).await {
            Ok(()) => {
                let took = started.elapsed();
                self.counters.commits.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .last_commit_us
                    .store(took.as_micros() as u64, Ordering::Relaxed);
                tracing::info!(
                    took_ms = took.as_secs_f64() * 1e3,
                    "HA: peer's routed flows committed to the kernel"
                );
            }
            Err(e) => {
                self.counters
                    .commit_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "HA: routed flows not committed; forwarded connections of the old master may break");
            }
        }
        let me = self.clone();
        tokio::spawn(async move {
            for flag in ["-f", "-R", "-B"] {
                if let Err(e) = me.control(flag, CONTROL_WAIT).await {
                    me.counters.control_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "HA: conntrackd after becoming master");
                }
            }
        });
    }

    /// Leaving mastership (backup or fault): the entries this node had age out soon (so a
    /// later failback does not meet stale ones), and the new master's table is asked for.
    pub fn left_master(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            for flag in ["-t", "-n"] {
                if let Err(e) = me.control(flag, CONTROL_WAIT).await {
                    me.counters.control_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "HA: conntrackd after leaving mastership");
                }
            }
        });
    }

    /// Ends conntrackd (at shutdown, after VRRP has resigned).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        if let Some(mut c) = self.child.lock().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    pub fn status(&self) -> ConntrackStatus {
        let c = &self.counters;
        let last = c.last_commit_us.load(Ordering::Relaxed);
        ConntrackStatus {
            interface: self.cfg.interface.clone(),
            transport: if self.cfg.peer.is_some() {
                "unicast"
            } else {
                "multicast"
            },
            running: self.child.lock().is_some(),
            restarts: c.restarts.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            commit_failures: c.commit_failures.load(Ordering::Relaxed),
            last_commit_ms: (last != u64::MAX).then(|| last as f64 / 1e3),
            control_failures: c.control_failures.load(Ordering::Relaxed),
            error: self.error.lock().clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unicast_and_multicast_configurations() {
        let dir = Path::new("/run/fulcrum/conntrackd.1");
        let mut cfg = ConntrackConfig {
            interface: "sync0".into(),
            peer: Some(Ipv4Addr::new(198, 18, 254, 2)),
            port: 3780,
        };
        let local = Ipv4Addr::new(198, 18, 254, 1);
        let ignore = [
            "198.18.100.1".parse().unwrap(),
            "198.18.254.1".parse().unwrap(),
            "fe80::1".parse().unwrap(),
        ];
        let u = render_config(&cfg, local, &ignore, dir);
        assert!(u.contains("  UDP {\n    IPv4_address 198.18.254.1\n    IPv4_Destination_Address 198.18.254.2\n    Port 3780\n    Interface sync0\n"), "{u}");
        assert!(
            u.contains("Path /run/fulcrum/conntrackd.1/conntrackd.ctl"),
            "{u}"
        );
        assert!(
            u.contains("LockFile /run/fulcrum/conntrackd.1/conntrackd.lock"),
            "{u}"
        );
        // Each ignored address once, the sync link's own included.
        assert_eq!(u.matches("IPv4_address 198.18.254.1").count(), 2, "{u}");
        assert!(u.contains("      IPv4_address 198.18.100.1\n"), "{u}");
        assert!(u.contains("      IPv6_address fe80::1\n"), "{u}");
        assert!(u.contains("      IPv6_address ::1\n"), "{u}");
        cfg.peer = None;
        let m = render_config(&cfg, local, &ignore, dir);
        assert!(m.contains("  Multicast {\n    IPv4_address 225.0.0.50\n    Group 3780\n    IPv4_interface 198.18.254.1\n    Interface sync0\n"), "{m}");
        assert!(!m.contains("UDP {"), "{m}");
        // Braces balance (conntrackd refuses the file otherwise).
        assert_eq!(m.matches('{').count(), m.matches('}').count());
    }
}

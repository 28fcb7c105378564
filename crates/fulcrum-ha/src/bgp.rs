//! Scale-out (active-active): announce the VIP prefixes through a local BIRD 2 (this file) or
//! GoBGP (gobgp.rs) while this node can serve them, and withdraw them when it cannot, when it
//! is put in maintenance, and when it stops — however it stops. One announcer loop (`run`)
//! decides; a `SpeakerOps` per daemon makes its daemon agree.
//!
//! The BIRD design, and why:
//! - Fulcrum owns one BIRD configuration fragment (`bgp.include`), which the operator's
//!   bird.conf includes once: a `protocol static fulcrum4` (and `fulcrum6`) listing the prefixes
//!   announced now. A change rewrites the file atomically and sends `configure`; BIRD compares
//!   the old and new config and only the static protocol's routes change (BGP sessions stay up).
//!   The file is the truth: a BIRD that restarts reads the current decision at start.
//! - Every route points at a TUN interface (`bgp.interface`) that this process creates and
//!   holds open. The kernel deletes a non-persistent TUN when its last descriptor closes, which
//!   happens however the process ends (SIGTERM, panic, kill -9, OOM killer). BIRD's static route
//!   through a vanished interface is unreachable, so BIRD withdraws the prefix at once, without
//!   Fulcrum's help and without waiting for a hold timer. A Fulcrum that is alive but wedged
//!   (not dead) keeps its routes: that failure mode is what BFD/hold timers and the health of
//!   the node itself do not cover either (docs/operations.md "Scale-out").
//! - The control socket is spoken directly (a Unix stream, replies of lines with 4-digit codes;
//!   BIRD's doc/reply_codes) rather than by running `birdc`: one persistent connection, no
//!   process spawned from a multi-threaded server per change, the reply codes as they are (no
//!   scraping of a human-oriented tool's output), and no dependency on birdc being in PATH.
//!   No maintained Rust crate speaks this protocol; the subset needed is small.
//!
//! Nothing here blocks a data plane: the announcer is one task with timeouts on every exchange;
//! a BIRD that is down is reported (`reachable`, `last_error`), retried every interval, and its
//! configuration file is still kept current so it starts with the right prefixes.

use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Notify;

/// How long one exchange with BIRD may take before the connection is dropped and retried.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the BGP sessions' states are read for the API.
pub(crate) const SESSIONS_EVERY: Duration = Duration::from_secs(2);
/// A reply longer than this is refused (BIRD's longest replies are route dumps we never ask for).
const MAX_REPLY_LINES: usize = 10_000;
/// A reply line longer than this is refused: BIRD's are a few dozen bytes, and a peer that
/// sends bytes without a newline must not make this process buffer them.
const MAX_LINE_BYTES: usize = 64 * 1024;
/// Bytes of one reply, all lines together.
const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

/// The static protocols in the fragment, by family (the operator's BGP export filters name them).
pub const PROTOCOL_V4: &str = "fulcrum4";
pub const PROTOCOL_V6: &str = "fulcrum6";
/// With OSPF: the prefixes of a node in maintenance, exported into OSPF only, at the drain cost.
pub const DRAINING_V4: &str = "fulcrum4d";
pub const DRAINING_V6: &str = "fulcrum6d";

/// `[bgp] ospf` (BIRD only): the prefixes also go into OSPF as external type-1 routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ospf {
    pub area: String,
    pub interfaces: Vec<String>,
    pub cost: u32,
    pub drain_cost: u32,
    /// Seconds.
    pub hello: u64,
    pub dead: u64,
    /// BIRD's interface type: "broadcast" or "ptp".
    pub network: String,
}

/// One line of a BIRD control-socket reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub code: u16,
    pub text: String,
}

/// A whole reply: its lines, and the code of the last one, which says how the command went
/// (0xxx done, 1xxx/2xxx data, 8xxx run-time error, 9xxx parse error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    pub lines: Vec<Line>,
}

impl Reply {
    pub fn is_error(&self) -> bool {
        self.code >= 8000
    }

    /// The text of the final line (BIRD's message).
    pub fn message(&self) -> &str {
        self.lines.last().map_or("", |l| l.text.as_str())
    }
}

/// What one line of a reply is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// `DDDD-text`: more lines follow.
    More(Line),
    /// `DDDD text`: the reply ends here.
    Last(Line),
    /// ` text`: continues the previous line's code.
    Continued(String),
    /// `+text`: an asynchronous message (only with `echo`), not part of a reply.
    Async,
}

/// Parses one line of the control-socket protocol (without its newline).
pub fn parse_line(line: &str) -> Result<Parsed, String> {
    if let Some(rest) = line.strip_prefix(' ') {
        return Ok(Parsed::Continued(rest.to_string()));
    }
    if line.starts_with('+') {
        return Ok(Parsed::Async);
    }
    let b = line.as_bytes();
    if b.len() < 5 || !b[..4].iter().all(u8::is_ascii_digit) {
        return Err(format!("not a BIRD reply line: {:?}", truncate(line)));
    }
    // Four ASCII digits then an ASCII separator: in range for u16, and byte 5 is a character
    // boundary (checked before slicing: the fuzzer found a multi-byte character there).
    let more = match b[4] {
        b'-' => true,
        b' ' => false,
        _ => return Err(format!("not a BIRD reply line: {:?}", truncate(line))),
    };
    let code = line[..4].parse::<u16>().map_err(|e| e.to_string())?;
    let line = Line {
        code,
        text: line[5..].to_string(),
    };
    Ok(if more {
        Parsed::More(line)
    } else {
        Parsed::Last(line)
    })
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(80) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Feeds lines until a reply is complete: `Some(reply)` when it is.
#[derive(Default)]
pub struct ReplyReader {
    lines: Vec<Line>,
    last_code: u16,
}

impl ReplyReader {
    pub fn push(&mut self, line: &str) -> Result<Option<Reply>, String> {
        if self.lines.len() >= MAX_REPLY_LINES {
            return Err("reply too long".into());
        }
        match parse_line(line)? {
            Parsed::More(l) => {
                self.last_code = l.code;
                self.lines.push(l);
                Ok(None)
            }
            Parsed::Continued(text) => {
                self.lines.push(Line {
                    code: self.last_code,
                    text,
                });
                Ok(None)
            }
            Parsed::Async => Ok(None),
            Parsed::Last(l) => {
                let code = l.code;
                self.lines.push(l);
                self.last_code = 0;
                Ok(Some(Reply {
                    code,
                    lines: std::mem::take(&mut self.lines),
                }))
            }
        }
    }
}

/// A connection to BIRD's control socket.
pub struct BirdClient {
    reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    writer: tokio::net::unix::OwnedWriteHalf,
    /// From the greeting (`0001 BIRD 2.0.12 ready.`).
    pub version: String,
}

impl BirdClient {
    pub async fn connect(path: &Path) -> Result<BirdClient, String> {
        let stream = tokio::time::timeout(EXCHANGE_TIMEOUT, UnixStream::connect(path))
            .await
            .map_err(|_| format!("{}: connect timed out", path.display()))?
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let (r, writer) = stream.into_split();
        let mut c = BirdClient {
            reader: BufReader::new(r),
            writer,
            version: String::new(),
        };
        let hello = c.read_reply().await?;
        if hello.code != 1 {
            return Err(format!(
                "{}: unexpected greeting {} {}",
                path.display(),
                hello.code,
                hello.message()
            ));
        }
        c.version = hello
            .message()
            .trim_end_matches(" ready.")
            .trim()
            .to_string();
        Ok(c)
    }

    async fn read_reply(&mut self) -> Result<Reply, String> {
        let mut rr = ReplyReader::default();
        let mut line = Vec::new();
        let mut total = 0;
        let read = async {
            loop {
                let n = read_line_bounded(&mut self.reader, &mut line).await?;
                if n == 0 {
                    return Err("BIRD closed the control connection".to_string());
                }
                total += n;
                if total > MAX_REPLY_BYTES {
                    return Err(format!("reply too long (over {MAX_REPLY_BYTES} bytes)"));
                }
                let text = String::from_utf8_lossy(&line);
                if let Some(reply) = rr.push(text.trim_end_matches(['\n', '\r']))? {
                    return Ok(reply);
                }
            }
        };
        tokio::time::timeout(EXCHANGE_TIMEOUT, read)
            .await
            .map_err(|_| "BIRD did not answer in time".to_string())?
    }

    /// Sends one command and reads its reply (an error reply is returned, not an `Err`).
    pub async fn command(&mut self, cmd: &str) -> Result<Reply, String> {
        let mut bytes = cmd.as_bytes().to_vec();
        bytes.push(b'\n');
        tokio::time::timeout(EXCHANGE_TIMEOUT, self.writer.write_all(&bytes))
            .await
            .map_err(|_| "write to BIRD timed out".to_string())?
            .map_err(|e| format!("write: {e}"))?;
        self.read_reply().await
    }
}

/// Reads one line (with its newline, if any) into `line`, refusing one longer than
/// `MAX_LINE_BYTES` before buffering more of it; 0 at the end of the stream.
async fn read_line_bounded<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
) -> Result<usize, String> {
    line.clear();
    loop {
        let buf = reader.fill_buf().await.map_err(|e| format!("read: {e}"))?;
        if buf.is_empty() {
            return Ok(line.len());
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > MAX_LINE_BYTES {
            return Err(format!("reply line too long (over {MAX_LINE_BYTES} bytes)"));
        }
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if done {
            return Ok(line.len());
        }
    }
}

/// What the fragment says: the prefixes announced, and (with OSPF) those of a node in
/// maintenance, which OSPF keeps at the drain cost while BGP withdraws them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub serving: BTreeSet<IpNet>,
    pub draining: BTreeSet<IpNet>,
}

/// The configuration fragment: the prefixes through `interface`, and the OSPF instances.
pub fn render(interface: &str, d: &Decision, ospf: Option<&Ospf>) -> String {
    let mut out = String::from(
        "# Written by Fulcrum ([bgp]): the prefixes it announces now. Do not edit; it is\n\
         # rewritten on every change. Routes point at Fulcrum's liveness interface, so they\n\
         # vanish when the Fulcrum process ends.\n",
    );
    let statics = |out: &mut String, name: &str, family: &str, v6: bool, set: &BTreeSet<IpNet>| {
        out.push_str(&format!("protocol static {name} {{\n  {family};\n"));
        for p in set.iter().filter(|p| p.addr().is_ipv6() == v6) {
            out.push_str(&format!("  route {} via \"{interface}\";\n", p.trunc()));
        }
        out.push_str("}\n");
    };
    for (name, family, v6) in [(PROTOCOL_V4, "ipv4", false), (PROTOCOL_V6, "ipv6", true)] {
        statics(&mut out, name, family, v6, &d.serving);
    }
    let Some(o) = ospf else { return out };
    let interfaces = o
        .interfaces
        .iter()
        .map(|i| format!("\"{i}\""))
        .collect::<Vec<_>>()
        .join(", ");
    for (proto, version, family, serving, draining, v6) in [
        (
            "fulcrum_ospf4",
            "v2",
            "ipv4",
            PROTOCOL_V4,
            DRAINING_V4,
            false,
        ),
        (
            "fulcrum_ospf6",
            "v3",
            "ipv6",
            PROTOCOL_V6,
            DRAINING_V6,
            true,
        ),
    ] {
        statics(&mut out, draining, family, v6, &d.draining);
        out.push_str(&format!(
            "protocol ospf {version} {proto} {{\n  {family} {{\n    import none;\n    export filter {{\n      if proto = \"{serving}\" then {{ ospf_metric1 = {cost}; accept; }}\n      if proto = \"{draining}\" then {{ ospf_metric1 = {drain}; accept; }}\n      reject;\n    }};\n  }};\n  area {area} {{\n    interface {interfaces} {{\n      type {network};\n      hello {hello};\n      dead {dead};\n    }};\n  }};\n}}\n",
            cost = o.cost,
            drain = o.drain_cost,
            area = o.area,
            network = o.network,
            hello = o.hello,
            dead = o.dead,
        ));
    }
    out
}

/// Writes `text` to `path` atomically: a temporary file beside it with a name of its own
/// (created exclusively: a fixed name could be a symlink someone planted, or be shared by two
/// writers), fsync, rename. The temporary file is removed if anything fails before the rename.
fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".fulcrum-bird-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    // BIRD usually runs as its own user: it must be able to read the file.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o644))?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// A TUN interface held open by this process: the kernel deletes it when the process ends.
pub struct LivenessLink {
    _fd: OwnedFd,
    pub name: String,
}

impl LivenessLink {
    pub fn create(name: &str) -> io::Result<LivenessLink> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "interface name must be 1 to 15 bytes",
            ));
        }
        // SAFETY: open(2) with a NUL-terminated literal path; the result is checked below.
        let raw = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor we just opened and own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = ifreq(name);
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads (and writes back the name into) the ifreq we own, which lives
        // across the call; the descriptor is a valid /dev/net/tun handle.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        set_up(name)?;
        Ok(LivenessLink {
            _fd: fd,
            name: name.to_string(),
        })
    }
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data (a name array and a union of integers); all-zero is a
    // valid value of it.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    req
}

/// Sets IFF_UP on `name` (SIOCGIFFLAGS / SIOCSIFFLAGS on a throwaway datagram socket).
fn set_up(name: &str) -> io::Result<()> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let mut req = ifreq(name);
    // SAFETY: SIOCGIFFLAGS fills the flags of the ifreq we own; the socket is valid.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: reading the union member SIOCGIFFLAGS just wrote.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own; the socket is valid.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub mod gobgp;

/// Which daemon announces, and how to reach it (from `[bgp]`).
#[derive(Debug, Clone)]
pub enum SpeakerConfig {
    Bird {
        /// BIRD's control socket.
        control: PathBuf,
        /// The fragment Fulcrum writes.
        include: PathBuf,
        /// The liveness interface.
        interface: String,
        /// Also into OSPF.
        ospf: Option<Ospf>,
    },
    Gobgp {
        /// gobgpd's gRPC API (host:port).
        address: String,
        /// The process that withdraws the paths if Fulcrum dies (gobgp.rs).
        watchdog: Option<gobgp::WatchdogCommand>,
    },
}

/// What the announcer runs with (from `[bgp]`).
#[derive(Debug, Clone)]
pub struct BgpConfig {
    pub speaker: SpeakerConfig,
    /// How often health is evaluated (and a lost speaker retried).
    pub interval: Duration,
}

/// Each configured prefix and whether this node can serve it now (the binary's health view).
pub type Desired = Arc<dyn Fn() -> Vec<(IpNet, bool)> + Send + Sync>;

/// Where a speaker reports a problem (logged once per distinct message, counted, shown).
pub(crate) type Report<'a> = &'a (dyn Fn(String) + Sync);

/// A local BGP daemon that announces prefixes on Fulcrum's behalf (BIRD, GoBGP). The announcer
/// loop is the same for every daemon: what to announce is decided here, the speaker only makes
/// its daemon agree, and tells what it has accepted and who its peers are.
pub(crate) trait SpeakerOps: Send + 'static {
    /// `speaker` in the API.
    const NAME: &'static str;
    /// Makes the daemon announce exactly `want.serving` (a subset of `configured`), and the
    /// draining prefixes where it has a way to (OSPF's cost), connecting first when needed;
    /// called every interval, so a daemon that was down catches up.
    fn announce(
        &mut self,
        want: &Decision,
        configured: &[IpNet],
        report: Report<'_>,
    ) -> impl Future<Output = ()> + Send;
    /// The daemon's BGP sessions (an error drops what was known of them).
    fn sessions(&mut self) -> impl Future<Output = Result<Vec<Session>, String>> + Send;
    /// Withdraws everything, for shutdown (the announce of an empty set has been tried first).
    fn shutdown(&mut self, report: Report<'_>) -> impl Future<Output = ()> + Send;
    /// What the daemon has accepted (`None` until it is known).
    fn announced(&self) -> Option<BTreeSet<IpNet>>;
    /// The last exchange with the daemon worked.
    fn reachable(&self) -> bool;
    /// Fills the speaker's own fields of the status.
    fn describe(&self, status: &mut BgpStatus);
}

/// A BGP session of the local speaker (BIRD's `show protocols`, GoBGP's ListPeer).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Session {
    pub name: String,
    pub state: String,
    pub info: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct PrefixStatus {
    pub prefix: String,
    /// Its services have a healthy member here.
    pub healthy: bool,
    /// Accepted by the speaker (in the fragment BIRD has loaded, in gobgpd's RIB).
    pub announced: bool,
}

/// `GET /api/v1/ha` → `bgp`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct BgpStatus {
    /// "bird" or "gobgp".
    pub speaker: &'static str,
    /// BIRD's control socket or gobgpd's API address.
    pub control: String,
    /// BIRD: the fragment Fulcrum writes (absent for GoBGP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub include: Option<String>,
    /// The speaker answers.
    pub reachable: bool,
    pub bird_version: Option<String>,
    /// BIRD: whether the liveness interface exists (routes are only active while it does).
    pub liveness_interface: Option<String>,
    /// GoBGP: the process that withdraws the paths if this one dies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog_pid: Option<u32>,
    /// The prefixes the speaker has accepted to announce.
    pub announced: Vec<String>,
    pub prefixes: Vec<PrefixStatus>,
    pub sessions: Vec<Session>,
    pub last_error: Option<String>,
    pub last_error_at_ms: Option<u64>,
    /// Successful changes of the announced set.
    pub changes: u64,
    pub errors: u64,
}

struct Shared {
    status: Mutex<BgpStatus>,
    maintenance: AtomicBool,
    stopping: AtomicBool,
    wake: Notify,
}

/// The running announcer.
pub struct Announcer {
    shared: Arc<Shared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Announcer {
    /// Starts the announcer task on the current tokio runtime.
    pub fn start(config: BgpConfig, desired: Desired, maintenance: bool) -> Announcer {
        let (speaker, control, include) = match &config.speaker {
            SpeakerConfig::Bird {
                control, include, ..
            } => (
                "bird",
                control.display().to_string(),
                Some(include.display().to_string()),
            ),
            SpeakerConfig::Gobgp { address, .. } => ("gobgp", address.clone(), None),
        };
        let shared = Arc::new(Shared {
            status: Mutex::new(BgpStatus {
                speaker,
                control,
                include,
                ..BgpStatus::default()
            }),
            maintenance: AtomicBool::new(maintenance),
            stopping: AtomicBool::new(false),
            wake: Notify::new(),
        });
        let task = match config.speaker {
            SpeakerConfig::Bird {
                control,
                include,
                interface,
                ospf,
            } => tokio::spawn(run(
                Bird::new(control, include, interface, ospf),
                config.interval,
                desired,
                shared.clone(),
            )),
            SpeakerConfig::Gobgp { address, watchdog } => tokio::spawn(run(
                gobgp::Gobgp::new(address, watchdog),
                config.interval,
                desired,
                shared.clone(),
            )),
        };
        Announcer {
            shared,
            task: Mutex::new(Some(task)),
        }
    }

    pub fn status(&self) -> BgpStatus {
        self.shared.status.lock().clone()
    }

    pub fn maintenance(&self) -> bool {
        self.shared.maintenance.load(Ordering::Acquire)
    }

    /// In maintenance every prefix is withdrawn (at once: the task wakes up).
    pub fn set_maintenance(&self, on: bool) {
        self.shared.maintenance.store(on, Ordering::Release);
        self.shared.wake.notify_one();
    }

    /// Withdraws every prefix (tells the speaker, then lets go of the liveness interface or
    /// watchdog), waiting at most a few seconds for the daemon.
    pub async fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        let task = self.task.lock().take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(EXCHANGE_TIMEOUT * 3, task).await;
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shared {
    fn error(&self, e: String) {
        let mut s = self.status.lock();
        if s.last_error.as_deref() != Some(e.as_str()) {
            tracing::warn!(error = %e, speaker = s.speaker, "BGP");
        }
        s.last_error = Some(e);
        s.last_error_at_ms = Some(now_ms());
        s.errors += 1;
    }
}

/// The BGP sessions in a `show protocols` reply (lines 1002: name, proto, table, state, since,
/// info; `since` may be one or two words depending on BIRD's timeformat).
pub fn sessions(reply: &Reply) -> Vec<Session> {
    reply
        .lines
        .iter()
        .filter(|l| l.code == 1002)
        .filter_map(|l| {
            let w: Vec<&str> = l.text.split_whitespace().collect();
            if w.len() < 4 || w[1] != "BGP" {
                return None;
            }
            let info_at = w
                .iter()
                .enumerate()
                .skip(4)
                .find(|(_, t)| !t.starts_with(|c: char| c.is_ascii_digit()))
                .map_or(w.len(), |(i, _)| i);
            Some(Session {
                name: w[0].to_string(),
                state: w[3].to_string(),
                info: w[info_at..].join(" "),
            })
        })
        .collect()
}

/// Why `configure` failed.
enum ConfigureError {
    /// The connection broke or timed out: drop it and reconnect.
    Connection(String),
    /// BIRD answered with an error (the operator's config does not parse, …): the connection
    /// is fine, the announced set is unchanged in BIRD.
    Refused(String),
}

/// Tells BIRD to re-read its configuration (and so the fragment).
async fn configure(client: &mut BirdClient) -> Result<(), ConfigureError> {
    let r = client
        .command("configure")
        .await
        .map_err(ConfigureError::Connection)?;
    // 0003 reconfigured, 0004 in progress, 0005 queued behind one in progress, 0019 nothing to do.
    if r.is_error() || !matches!(r.code, 3 | 4 | 5 | 19) {
        return Err(ConfigureError::Refused(format!(
            "BIRD refused `configure`: {} {}",
            r.code,
            r.message()
        )));
    }
    Ok(())
}

/// The BIRD speaker: the fragment, the control connection, the liveness interface.
struct Bird {
    control: PathBuf,
    include: PathBuf,
    interface: String,
    client: Option<BirdClient>,
    version: Option<String>,
    link: Option<LivenessLink>,
    ospf: Option<Ospf>,
    /// What BIRD has accepted; `None` until the first successful configure on a connection.
    applied: Option<Decision>,
    /// What the file says.
    written: Option<Decision>,
    reachable: bool,
}

impl Bird {
    fn new(control: PathBuf, include: PathBuf, interface: String, ospf: Option<Ospf>) -> Bird {
        Bird {
            control,
            include,
            interface,
            ospf,
            client: None,
            version: None,
            link: None,
            applied: None,
            written: None,
            reachable: false,
        }
    }
}

impl SpeakerOps for Bird {
    const NAME: &'static str = "bird";

    async fn announce(&mut self, want: &Decision, _configured: &[IpNet], report: Report<'_>) {
        // Without OSPF there is nowhere to keep draining prefixes: the file stays as it is.
        let want = &Decision {
            serving: want.serving.clone(),
            draining: if self.ospf.is_some() {
                want.draining.clone()
            } else {
                BTreeSet::new()
            },
        };
        if self.written.as_ref() != Some(want) {
            match write_atomically(
                &self.include,
                &render(&self.interface, want, self.ospf.as_ref()),
            ) {
                Ok(()) => self.written = Some(want.clone()),
                Err(e) => report(format!("cannot write {}: {e}", self.include.display())),
            }
        }
        if self.client.is_none() {
            match BirdClient::connect(&self.control).await {
                Ok(c) => {
                    tracing::info!(control = %self.control.display(), version = %c.version, "BGP: connected to BIRD");
                    self.version = Some(c.version.clone());
                    self.client = Some(c);
                    self.applied = None;
                }
                Err(e) => {
                    self.reachable = false;
                    report(format!("BIRD control socket {e}"));
                }
            }
        }
        if let Some(c) = self.client.as_mut() {
            self.reachable = true;
            if self.written.as_ref() == Some(want) && self.applied.as_ref() != Some(want) {
                match configure(c).await {
                    Ok(()) => self.applied = Some(want.clone()),
                    Err(ConfigureError::Refused(e)) => report(e),
                    Err(ConfigureError::Connection(e)) => {
                        report(e);
                        self.reachable = false;
                        self.client = None;
                    }
                }
            }
        }
        // The liveness interface comes after the first decision is written: a fragment
        // left by an earlier process must not come back to life before this one has
        // judged it.
        if self.link.is_none() && self.written.is_some() {
            match LivenessLink::create(&self.interface) {
                Ok(l) => self.link = Some(l),
                Err(e) => report(format!(
                    "cannot create the liveness interface {} (TUN): {e}",
                    self.interface
                )),
            }
        }
    }

    async fn sessions(&mut self) -> Result<Vec<Session>, String> {
        let Some(c) = self.client.as_mut() else {
            return Err("BIRD not connected".to_string());
        };
        match c.command("show protocols").await {
            Ok(r) => Ok(sessions(&r)),
            Err(e) => {
                self.reachable = false;
                self.client = None;
                Err(e)
            }
        }
    }

    async fn shutdown(&mut self, _report: Report<'_>) {
        // Withdrawn in BIRD (when it answered); closing the interface withdraws anyway.
        drop(self.link.take());
    }

    fn announced(&self) -> Option<BTreeSet<IpNet>> {
        self.applied.as_ref().map(|d| d.serving.clone())
    }

    fn reachable(&self) -> bool {
        self.reachable
    }

    fn describe(&self, status: &mut BgpStatus) {
        status.bird_version = self.version.clone();
        status.liveness_interface = self.link.as_ref().map(|l| l.name.clone());
    }
}

async fn run<S: SpeakerOps>(
    mut speaker: S,
    interval: Duration,
    desired: Desired,
    shared: Arc<Shared>,
) {
    let report = |e: String| shared.error(e);
    let mut sessions_at = tokio::time::Instant::now();
    let mut last: Option<BTreeSet<IpNet>> = None;
    loop {
        let stopping = shared.stopping.load(Ordering::Acquire);
        let maintenance = shared.maintenance.load(Ordering::Acquire);
        let view = desired();
        let configured: Vec<IpNet> = view.iter().map(|(p, _)| *p).collect();
        let healthy: BTreeSet<IpNet> = view.iter().filter(|(_, h)| *h).map(|(p, _)| *p).collect();
        let want = match (stopping, maintenance) {
            (true, _) => Decision::default(),
            (false, true) => Decision {
                serving: BTreeSet::new(),
                draining: healthy,
            },
            (false, false) => Decision {
                serving: healthy,
                draining: BTreeSet::new(),
            },
        };
        speaker.announce(&want, &configured, &report).await;
        if speaker.reachable() && !stopping && sessions_at.elapsed() >= SESSIONS_EVERY {
            sessions_at = tokio::time::Instant::now();
            match speaker.sessions().await {
                Ok(s) => shared.status.lock().sessions = s,
                Err(e) => shared.error(e),
            }
        }
        let announced = speaker.announced();
        if let (Some(before), Some(now)) = (&last, &announced) {
            if before != now {
                shared.status.lock().changes += 1;
            }
        }
        if announced.is_some() && announced != last {
            tracing::info!(speaker = S::NAME, announced = ?announced.iter().flatten().map(ToString::to_string).collect::<Vec<_>>(), "BGP: announced prefixes changed");
            last = announced.clone();
        }
        {
            let mut s = shared.status.lock();
            s.reachable = speaker.reachable();
            if !s.reachable {
                // What the speaker said about its sessions is no longer known.
                s.sessions.clear();
            }
            speaker.describe(&mut s);
            s.announced = announced
                .iter()
                .flatten()
                .map(ToString::to_string)
                .collect();
            s.prefixes = view
                .iter()
                .map(|(p, h)| PrefixStatus {
                    prefix: p.to_string(),
                    healthy: *h,
                    announced: announced.as_ref().is_some_and(|a| a.contains(p)),
                })
                .collect();
        }
        if stopping {
            speaker.shutdown(&report).await;
            speaker.describe(&mut shared.status.lock());
            tracing::info!(speaker = S::NAME, "BGP: prefixes withdrawn for shutdown");
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shared.wake.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lines_parse_and_group() {
        let mut r = ReplyReader::default();
        assert_eq!(
            r.push("0002-Reading configuration from /etc/bird.conf"),
            Ok(None)
        );
        let reply = r.push("0003 Reconfigured").expect("ok").expect("complete");
        assert_eq!(reply.code, 3);
        assert_eq!(reply.lines.len(), 2);
        assert!(!reply.is_error());

        let mut r = ReplyReader::default();
        assert_eq!(
            r.push("1002-device1    Device     ---        up     18:02:14.503  "),
            Ok(None)
        );
        assert_eq!(r.push(" continued"), Ok(None));
        assert_eq!(r.push("+async log line"), Ok(None));
        let reply = r.push("0000 ").expect("ok").expect("complete");
        assert_eq!(
            reply.lines[1],
            Line {
                code: 1002,
                text: "continued".into()
            }
        );
        assert_eq!(reply.lines.len(), 3);

        let err = ReplyReader::default()
            .push("8002 /etc/bird.conf, line 3: syntax error")
            .expect("ok")
            .expect("complete");
        assert!(err.is_error());
        assert_eq!(err.message(), "/etc/bird.conf, line 3: syntax error");

        for bad in [
            "",
            "abc",
            "12345",
            "0001",
            "0001x",
            "é001 x",
            "00\u{e9} x",
            "7739\u{fffd}0",
        ] {
            assert!(ReplyReader::default().push(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bgp_sessions_come_from_show_protocols() {
        let reply = Reply {
            code: 0,
            lines: vec![
                Line { code: 2002, text: "Name       Proto      Table      State  Since         Info".into() },
                Line { code: 1002, text: "device1    Device     ---        up     18:02:14.503  ".into() },
                Line { code: 1002, text: "router     BGP        ---        up     18:02:16.000  Established   ".into() },
                Line { code: 1002, text: "backup     BGP        ---        start  2026-12-01 18:02:16  Active        Socket: Connection refused".into() },
            ],
        };
        assert_eq!(
            sessions(&reply),
            vec![
                Session {
                    name: "router".into(),
                    state: "up".into(),
                    info: "Established".into()
                },
                Session {
                    name: "backup".into(),
                    state: "start".into(),
                    info: "Active Socket: Connection refused".into()
                },
            ]
        );
    }

    #[test]
    fn the_fragment_lists_each_family_in_its_protocol() {
        let set: BTreeSet<IpNet> = ["198.51.100.10/32", "2001:db8::10/128", "203.0.113.0/24"]
            .iter()
            .map(|s| s.parse().expect("prefix"))
            .collect();
        let d = Decision {
            serving: set.clone(),
            draining: BTreeSet::new(),
        };
        let text = render("fulcrum-bgp", &d, None);
        assert!(!text.contains("ospf"), "{text}");
        let v4 = text
            .split("protocol static fulcrum6")
            .next()
            .expect("v4 part");
        assert!(v4.contains("protocol static fulcrum4 {\n  ipv4;\n"));
        assert!(v4.contains("  route 198.51.100.10/32 via \"fulcrum-bgp\";\n"));
        assert!(v4.contains("  route 203.0.113.0/24 via \"fulcrum-bgp\";\n"));
        assert!(!v4.contains("2001:db8"));
        assert!(text.contains("protocol static fulcrum6 {\n  ipv6;\n  route 2001:db8::10/128 via \"fulcrum-bgp\";\n}\n"));
        // Nothing announced: both protocols stay (the operator's filters name them), empty.
        let empty = render("x", &Decision::default(), None);
        assert!(empty.contains("protocol static fulcrum4 {\n  ipv4;\n}\n"));
        assert!(empty.contains("protocol static fulcrum6 {\n  ipv6;\n}\n"));
    }

    #[test]
    fn with_ospf_draining_prefixes_get_their_own_protocol_and_the_drain_cost() {
        let ospf = Ospf {
            area: "0.0.0.0".into(),
            interfaces: vec!["eth0".into(), "eth1".into()],
            cost: 10,
            drain_cost: 60000,
            hello: 1,
            dead: 3,
            network: "ptp".into(),
        };
        let d = Decision {
            serving: BTreeSet::new(),
            draining: ["198.51.100.10/32".parse().expect("prefix")].into(),
        };
        let text = render("fulcrum-bgp", &d, Some(&ospf));
        // BGP's protocol is empty (maintenance withdraws); OSPF's draining one has the prefix.
        assert!(
            text.contains("protocol static fulcrum4 {\n  ipv4;\n}\n"),
            "{text}"
        );
        assert!(text.contains("protocol static fulcrum4d {\n  ipv4;\n  route 198.51.100.10/32 via \"fulcrum-bgp\";\n}\n"), "{text}");
        assert!(text.contains("protocol ospf v2 fulcrum_ospf4 {"), "{text}");
        assert!(
            text.contains("if proto = \"fulcrum4\" then { ospf_metric1 = 10; accept; }"),
            "{text}"
        );
        assert!(
            text.contains("if proto = \"fulcrum4d\" then { ospf_metric1 = 60000; accept; }"),
            "{text}"
        );
        assert!(text.contains("protocol ospf v3 fulcrum_ospf6 {"), "{text}");
        assert!(
            text.contains("  area 0.0.0.0 {\n    interface \"eth0\", \"eth1\" {\n      type ptp;\n      hello 1;\n      dead 3;\n    };\n  };"),
            "{text}"
        );
        assert_eq!(text.matches('{').count(), text.matches('}').count());
    }
}

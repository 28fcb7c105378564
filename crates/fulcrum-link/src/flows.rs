//! The flows of Fulcrum's links in the kernel's connection table, for least-connections pools
//! (flows per link) and `rtt` pools (where the LAN's flows go).
//!
//! A dump of the whole table (`conntrack -L`) costs about a microsecond per tracked flow, which
//! a gateway with a million flows cannot pay every second. So the table is dumped once, then
//! kept from conntrack's event stream (`conntrack -E`, NEW and DESTROY: a flow's link mark is
//! set before the kernel confirms it, so NEW carries it), and dumped again only when the
//! stream says it lost events (the socket buffer overflowed), when the stream died, and every
//! `RESYNC` against the small drift of events that cross a dump. conntrack-tools is the tool
//! made for both (libnetfilter_conntrack); talking ctnetlink by hand would mean writing its
//! attribute parser again.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::plan::{MARK_BASE, MARK_MASK};

/// How long a count built from events is trusted before the table is dumped again.
const RESYNC: Duration = Duration::from_secs(60);
/// The event socket's receive buffer: a burst of this many bytes of events (about 100,000
/// flows) is absorbed before the kernel drops events and a resync is needed.
const EVENT_BUFFER: &str = "16777216";

/// One flow of a link: its mark and original destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Flow {
    mark: u32,
    dst: IpAddr,
}

#[derive(Default)]
struct Table {
    /// Flows with a link mark, by conntrack id (unique among live flows).
    flows: HashMap<u32, Flow>,
    /// Events were lost or the stream ended: the next read dumps the table.
    stale: bool,
    dumped: Option<Instant>,
}

/// A running `conntrack -E` and the table it keeps.
pub struct FlowWatch {
    table: Arc<Mutex<Table>>,
    child: Option<Child>,
}

impl FlowWatch {
    /// Starts the event stream (before the first dump, so no flow falls between the two).
    pub fn start() -> Self {
        let table = Arc::new(Mutex::new(Table {
            stale: true,
            ..Table::default()
        }));
        let child = spawn_events(&table);
        if child.is_none() {
            tracing::warn!("conntrack -E did not start: link flows are counted by dumps of the connection table");
        }
        FlowWatch { table, child }
    }

    /// Flows per link mark.
    pub fn per_mark(&mut self) -> HashMap<u32, u64> {
        self.resync_if_due();
        let mut out = HashMap::new();
        for f in self.table.lock().flows.values() {
            *out.entry(f.mark).or_insert(0) += 1;
        }
        out
    }

    /// Distinct destinations per link mark, up to `limit` per mark.
    pub fn destinations(&mut self, limit: usize) -> HashMap<u32, Vec<IpAddr>> {
        self.resync_if_due();
        let mut out: HashMap<u32, Vec<IpAddr>> = HashMap::new();
        for f in self.table.lock().flows.values() {
            let v = out.entry(f.mark).or_default();
            if v.len() < limit && !v.contains(&f.dst) {
                v.push(f.dst);
            }
        }
        out
    }

    fn resync_if_due(&mut self) {
        let exited = match &mut self.child {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        };
        if exited {
            if let Some(mut c) = self.child.take() {
                let _ = c.wait();
                tracing::warn!("conntrack -E ended; restarting it");
            }
            self.child = spawn_events(&self.table);
        }
        let due = {
            let t = self.table.lock();
            t.stale || self.child.is_none() || t.dumped.is_none_or(|d| d.elapsed() >= RESYNC)
        };
        if due {
            // The events that arrive while the dump runs are applied to the old table and
            // replaced by the dump: a flow created meanwhile may be missed until the next
            // resync, never counted twice (ids are the keys).
            let dumped = dump();
            let mut t = self.table.lock();
            if let Some(flows) = dumped {
                t.flows = flows;
                t.stale = false;
            }
            t.dumped = Some(Instant::now());
        }
    }
}

impl Drop for FlowWatch {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_events(table: &Arc<Mutex<Table>>) -> Option<Child> {
    let mut cmd = Command::new("conntrack");
    cmd.args([
        "-E",
        "-e",
        "NEW,DESTROY",
        // No `-f`: IPv4 and IPv6 flows, whose marks are the same links'.
        "-o",
        "id",
        "-b",
        EVENT_BUFFER,
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2) and
    // getppid(2), both async-signal-safe; it touches no memory of the parent. PDEATHSIG ends
    // the stream with Fulcrum even after a kill -9 (else it would live until its next write).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 || libc::getppid() == 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().ok()?;
    let stdout = child.stdout.take()?;
    let stderr = child.stderr.take()?;
    let events = table.clone();
    let spawned = std::thread::Builder::new()
        .name("link-flows".into())
        .spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut t = events.lock();
                match parse_event(&line) {
                    Some(Event::New(id, flow)) => {
                        t.flows.insert(id, flow);
                    }
                    Some(Event::Destroy(id)) => {
                        t.flows.remove(&id);
                    }
                    None => {}
                }
            }
            events.lock().stale = true;
        });
    let losses = table.clone();
    let watched = std::thread::Builder::new()
        .name("link-flows-err".into())
        .spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("ENOBUFS") {
                    tracing::warn!(
                        "conntrack events were lost; the link flow counts are dumped again"
                    );
                    losses.lock().stale = true;
                }
            }
        });
    if spawned.is_err() || watched.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    }
    Some(child)
}

#[derive(Debug, PartialEq, Eq)]
enum Event {
    New(u32, Flow),
    Destroy(u32),
}

/// One line of `conntrack -E -o id`: `[NEW] tcp 6 120 SYN_SENT src=… dst=… … mark=N id=N`.
fn parse_event(line: &str) -> Option<Event> {
    let line = line.trim_start();
    if let Some(rest) = line.strip_prefix("[NEW]") {
        let (id, flow) = parse_flow(rest)?;
        Some(Event::New(id, flow))
    } else if let Some(rest) = line.strip_prefix("[DESTROY]") {
        Some(Event::Destroy(last_field(rest, "id=")?))
    } else {
        None
    }
}

/// The id and link flow of a listing or event line; `None` for flows without a link mark.
fn parse_flow(line: &str) -> Option<(u32, Flow)> {
    let mark: u32 = field(line, "mark=")?;
    if mark & MARK_MASK != MARK_BASE {
        return None;
    }
    // The first `dst=` is the original direction's.
    let dst = field(line, "dst=")?;
    Some((last_field(line, "id=")?, Flow { mark, dst }))
}

/// The last `key` of the line: `-o id` writes the flow's id at the end, after an ICMP flow's
/// own `id=` fields.
fn last_field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    line.split_whitespace()
        .filter_map(|w| w.strip_prefix(key))
        .next_back()
        .and_then(|v| v.parse().ok())
}

fn field<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.parse().ok())
}

/// The link flows of the whole table (`conntrack -L`); `None` when it cannot be read.
fn dump() -> Option<HashMap<u32, Flow>> {
    let o = Command::new("conntrack")
        .args(["-L", "-o", "id"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !o.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(parse_flow)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_listing_lines() {
        let new = "    [NEW] tcp      6 120 SYN_SENT src=198.18.100.2 dst=198.19.0.10 sport=46300 dport=80 [UNREPLIED] src=198.19.0.10 dst=198.18.1.2 sport=80 dport=46300 mark=1179385857 id=3024345794";
        let flow = Flow {
            mark: 0x464c_0001,
            dst: IpAddr::from([198, 19, 0, 10]),
        };
        assert_eq!(parse_event(new), Some(Event::New(3024345794, flow)));
        let destroy = "[DESTROY] tcp      6 120 CLOSE src=198.18.100.2 dst=198.19.0.10 sport=46300 dport=80 mark=1179385857 id=3024345794 [USERSPACE] portid=3482697319";
        assert_eq!(parse_event(destroy), Some(Event::Destroy(3024345794)));
        let listing = "udp      17 29 src=198.18.100.2 dst=198.19.0.10 sport=60725 dport=53 [UNREPLIED] src=198.19.0.10 dst=198.18.1.2 sport=53 dport=60725 mark=1179385857 use=1 id=42";
        assert_eq!(parse_flow(listing), Some((42, flow)));
        // Flows that are not on a link, and lines that are not flows.
        assert_eq!(
            parse_flow("tcp 6 src=1.2.3.4 dst=5.6.7.8 mark=0 id=1"),
            None
        );
        assert_eq!(
            parse_flow("tcp 6 src=1.2.3.4 dst=5.6.7.8 mark=7 id=1"),
            None
        );
        assert_eq!(
            parse_event("NOTICE: Netlink socket buffer size has been set to 16777216 bytes."),
            None
        );
        assert_eq!(parse_event("[NEW] tcp 6 mark=1179385857 id=x"), None);
        // IPv6 flows, and ICMP ones whose own `id=` comes before the flow's.
        let v6 = "icmpv6   58 29 src=fd00:100::2 dst=2001:db8:9::10 type=128 code=0 id=16413 src=2001:db8:9::10 dst=2001:db8:1::2 type=129 code=0 id=16413 mark=1179385857 use=1 id=292628074";
        assert_eq!(
            parse_flow(v6),
            Some((
                292628074,
                Flow {
                    mark: 0x464c_0001,
                    dst: "2001:db8:9::10".parse().unwrap(),
                }
            ))
        );
    }
}

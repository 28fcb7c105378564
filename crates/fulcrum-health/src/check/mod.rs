//! The check kinds: one `Check` per monitor, run once per interval against one member.
//!
//! A kind is a variant of `Check` and a module beside this one. Each takes the monitor's config
//! once (`Check::new`) and then, per run, a `Probe` (where to connect and by when) and returns a
//! `Verdict`. Kinds run to the deadline themselves so a failure can say what was seen before
//! time ran out; `Check::run` adds a backstop for anything that does not.

mod agent;
mod dialogue;
mod dns;
mod http;
mod icmp;
mod radius;
mod send_expect;
mod snmp;
mod snmp_ber;
mod snmp_v3;
mod tcp;
mod tls;
mod udp;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use fulcrum_config::{Monitor, MonitorKind};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

pub use agent::{parse_agent_reply, AgentReply};
pub use snmp::parse_snmp_response;
pub use snmp_ber::SnmpValue;
pub use snmp_v3::{parse_v3_response, Engine, LocalKeys, UsmUser, V3Reply};

/// Entry points for the fuzz targets (fuzz/): the health checks' readers of member replies.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::dialogue::fuzz_nntp as nntp_reply;
    pub use super::dns::fuzz_judge as dns_reply;
    pub use super::http::fuzz_reply as http_reply;
    pub use super::radius::fuzz_judge as radius_reply;
}

use crate::text;

/// Slack past the deadline before the backstop gives up on a kind: the kinds time out on
/// their own at the deadline and say more about it, so they should win that race.
const BACKSTOP_GRACE: Duration = Duration::from_millis(100);

/// One active check kind, built from a monitor's config.
#[derive(Debug)]
pub(crate) enum Check {
    /// A TCP connection is accepted within the timeout.
    Tcp,
    /// An HTTP/1.1 request answered with an expected status (and body text); over TLS for
    /// `https`.
    Http(http::HttpCheck),
    /// Optional bytes sent, then the reply must contain the expected bytes.
    SendExpect(send_expect::SendExpectCheck),
    /// HAProxy's agent protocol: the member reports its own health, weight and state.
    Agent(agent::AgentCheck),
    /// A DNS query answered with the expected response code (and answer).
    Dns(dns::DnsCheck),
    /// RADIUS Status-Server, or an Access-Request with test credentials.
    Radius(radius::RadiusCheck),
    /// SMTP, POP3, IMAP, FTP or NNTP: greeting, a command (or login), goodbye.
    Dialogue(dialogue::DialogueCheck),
    /// ICMP echo to the member's address.
    Icmp(icmp::IcmpCheck),
    /// An SNMP v2c GET of one OID; its value may set the member's weight.
    Snmp(snmp::SnmpCheck),
}

/// Longest timeout or interval honoured: validation bounds neither from above, and a value near
/// `Duration::MAX` would overflow the clock arithmetic of a deadline.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);
/// Shortest timeout: a zero one would fail every check before it could connect.
const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// Where and until when one run of a check probes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe {
    /// The member's ip at the monitor's port (or the member's).
    pub addr: SocketAddr,
    /// The member's own address, for an HTTP `Host` header when the monitor names none.
    pub member: SocketAddr,
    pub timeout: Duration,
    pub deadline: Instant,
    /// Set for link monitors: probe out of this link, not by the main routing table.
    pub via: Option<Via>,
}

/// How a link monitor's probe leaves: bound to the link's interface (SO_BINDTODEVICE) and its
/// source address, and marked (SO_MARK) so the link's policy-routing rule picks its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Via {
    device: [u8; 16],
    device_len: u8,
    /// Source address of the probes (the link's SNAT address).
    pub source: Option<std::net::IpAddr>,
    /// Firewall mark of the probes (0 = none).
    pub mark: u32,
}

impl Via {
    /// `None` when `device` is not an interface name (empty or longer than 15 bytes).
    pub fn new(device: &str, source: Option<std::net::IpAddr>, mark: u32) -> Option<Via> {
        let b = device.as_bytes();
        if b.is_empty() || b.len() > 15 {
            return None;
        }
        let mut d = [0u8; 16];
        d[..b.len()].copy_from_slice(b);
        Some(Via {
            device: d,
            device_len: b.len() as u8,
            source,
            mark,
        })
    }

    /// The interface name.
    pub fn device(&self) -> &[u8] {
        &self.device[..usize::from(self.device_len)]
    }

    /// Binds `socket` to the link: device, mark, and (for `bind_source`) the source address.
    pub(crate) fn apply(&self, socket: &socket2::Socket, bind_source: bool) -> io::Result<()> {
        socket.bind_device(Some(self.device()))?;
        if self.mark != 0 {
            socket.set_mark(self.mark)?;
        }
        if let (true, Some(ip)) = (bind_source, self.source) {
            match socket.bind(&SocketAddr::new(ip, 0).into()) {
                // In a gateway pair the link's SNAT address is a VIP that the master holds: the
                // backup probes from the interface's own address, so it knows which links work
                // before it takes over.
                Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => {}
                other => other?,
            }
        }
        Ok(())
    }
}

impl Probe {
    /// Probes from inside the pool's VRF (`vrf` on the pool): bound to its device, as the
    /// member connections are.
    pub fn in_vrf(mut self, vrf: Option<&str>) -> Probe {
        if let Some(device) = vrf {
            self.via = Via::new(device, None, 0);
        }
        self
    }

    pub fn new(member: SocketAddr, port: Option<u16>, timeout: Duration) -> Probe {
        let timeout = timeout.clamp(MIN_TIMEOUT, MAX_WAIT);
        Probe {
            addr: SocketAddr::new(member.ip(), port.unwrap_or(member.port())),
            member,
            timeout,
            deadline: Instant::now() + timeout,
            via: None,
        }
    }

    /// "timeout after 1s".
    pub fn timed_out(&self) -> String {
        format!("timeout after {}", text::duration(self.timeout))
    }
}

/// What one run found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A result for the member's state machine.
    Health { ok: bool, detail: String },
    /// An agent answered: its health word (if any) and overrides.
    Agent { reply: AgentReply, detail: String },
    /// Nothing to record: an agent that could not be reached says nothing about the member,
    /// whose reachability is the health checks' job.
    Nothing { why: String },
}

impl Verdict {
    pub fn pass(detail: impl Into<String>) -> Verdict {
        Verdict::Health {
            ok: true,
            detail: detail.into(),
        }
    }

    pub fn fail(detail: impl Into<String>) -> Verdict {
        Verdict::Health {
            ok: false,
            detail: detail.into(),
        }
    }
}

impl Check {
    pub fn new(monitor: &Monitor) -> Check {
        match monitor.kind {
            MonitorKind::Tcp => Check::Tcp,
            MonitorKind::Http => Check::Http(http::HttpCheck::new(monitor, false)),
            MonitorKind::Https => Check::Http(http::HttpCheck::new(monitor, true)),
            MonitorKind::SendExpect => {
                Check::SendExpect(send_expect::SendExpectCheck::new(monitor))
            }
            MonitorKind::Agent => Check::Agent(agent::AgentCheck::new(monitor)),
            MonitorKind::Dns => Check::Dns(dns::DnsCheck::new(monitor)),
            MonitorKind::Radius => Check::Radius(radius::RadiusCheck::new(monitor)),
            MonitorKind::Smtp
            | MonitorKind::Pop3
            | MonitorKind::Imap
            | MonitorKind::Ftp
            | MonitorKind::Nntp => Check::Dialogue(dialogue::DialogueCheck::new(monitor)),
            MonitorKind::Icmp => Check::Icmp(icmp::IcmpCheck),
            MonitorKind::Snmp => Check::Snmp(snmp::SnmpCheck::new(monitor)),
        }
    }

    pub async fn run(&self, probe: &Probe) -> Verdict {
        let run = async {
            match self {
                Check::Tcp => tcp::run(probe).await,
                Check::Http(c) => c.run(probe).await,
                Check::SendExpect(c) => c.run(probe).await,
                Check::Agent(c) => c.run(probe).await,
                Check::Dns(c) => c.run(probe).await,
                Check::Radius(c) => c.run(probe).await,
                Check::Dialogue(c) => c.run(probe).await,
                Check::Icmp(c) => c.run(probe).await,
                Check::Snmp(c) => c.run(probe).await,
            }
        };
        match tokio::time::timeout_at(probe.deadline + BACKSTOP_GRACE, run).await {
            Ok(verdict) => verdict,
            Err(_) if matches!(self, Check::Agent(_)) => Verdict::Nothing {
                why: probe.timed_out(),
            },
            Err(_) => Verdict::fail(probe.timed_out()),
        }
    }
}

/// Connects to `probe.addr` by the deadline; the error is a finished detail
/// ("connect: connection refused", "connect: timeout after 1s").
pub(crate) async fn connect(probe: &Probe) -> Result<TcpStream, String> {
    let connecting = async {
        match &probe.via {
            None => TcpStream::connect(probe.addr).await,
            Some(via) => {
                let domain = socket2::Domain::for_address(probe.addr);
                let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
                s.set_nonblocking(true)?;
                via.apply(&s, true)?;
                let std: std::net::TcpStream = s.into();
                tokio::net::TcpSocket::from_std_stream(std)
                    .connect(probe.addr)
                    .await
            }
        }
    };
    match tokio::time::timeout_at(probe.deadline, connecting).await {
        Ok(Ok(stream)) => {
            // Checks write one small request and wait for the answer: Nagle would only delay it.
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) => Err(format!("connect: {}", text::io_error(&e))),
        Err(_) => Err(format!("connect: {}", probe.timed_out())),
    }
}

/// Reads what is available into `buf` without letting it grow past `limit`; 0 means EOF (or no
/// room left). Cancel-safe: a read cut short by a timeout leaves `buf` as it was.
pub(crate) async fn read_more<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    limit: usize,
) -> io::Result<usize> {
    const CHUNK: usize = 8192;
    let room = limit.saturating_sub(buf.len()).min(CHUNK);
    if room == 0 {
        return Ok(0);
    }
    buf.reserve(room);
    match stream.take(room as u64).read_buf(buf).await {
        // Many TLS servers close without close_notify; for a check that is just the end of the
        // reply (truncation attacks do not matter to a health verdict).
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
        other => other,
    }
}

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod protocol_tests;

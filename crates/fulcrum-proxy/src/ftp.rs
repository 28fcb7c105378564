//! `protocol = "ftp"`: a tcp service that reads the FTP control channel line by line so that
//! the data connections of a session reach the member of its control connection. Passive
//! answers (227 / 229) are rewritten to a port Fulcrum listens on at the address the client
//! connected to; active commands (PORT / EPRT) to a port Fulcrum listens on at the member side.
//! After `AUTH TLS` is accepted the control channel is relayed blind, and the passive range is
//! forwarded port for port to the session's member.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fulcrum_net::forward::{forward, ForwardOptions};
use fulcrum_net::listener::StreamHandler;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::tcp::TcpService;

/// Longest control line accepted (RFC 959 lines are short; 8 KiB leaves room for long paths).
pub const MAX_LINE: usize = 8192;

/// How long a data listener waits for its one connection.
const DATA_ACCEPT_TIMEOUT: Duration = Duration::from_secs(30);

/// A `protocol = "ftp"` virtual service.
#[derive(Debug)]
pub struct FtpService {
    /// Member choice, persistence, admission and counters as a tcp service has them.
    pub tcp: TcpService,
    /// `ftp_passive_ports`; `None`: any free port.
    pub passive_ports: Option<RangeInclusive<u16>>,
}

impl StreamHandler for FtpService {
    fn handle(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, local: SocketAddr) {
        let tracked = self.tcp.tracker.track();
        tokio::spawn(async move {
            self.serve(stream, peer, local).await;
            drop(tracked);
        });
    }
}

/// What a control line is, as far as the helper cares.
#[derive(Debug, PartialEq, Eq)]
pub enum ControlLine {
    /// Member: `227 Entering Passive Mode (h1,h2,h3,h4,p1,p2)`.
    Passive(SocketAddr),
    /// Member: `229 Entering Extended Passive Mode (|||port|)`.
    ExtendedPassive(u16),
    /// Member: `234` (TLS accepted).
    TlsAccepted,
    /// Client: `PORT h1,h2,h3,h4,p1,p2` or `EPRT |n|addr|port|`.
    Active(SocketAddr),
    /// Client: `AUTH TLS` / `AUTH SSL`.
    AuthTls,
    /// A 227 / 229 / PORT / EPRT line whose address cannot be read.
    Malformed,
    Other,
}

fn trim_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Six comma-separated numbers 0..=255: an IPv4 address and a port (PORT and 227 syntax).
fn parse_h1_p2(text: &str) -> Option<SocketAddr> {
    let mut numbers = [0u8; 6];
    let mut parts = text.trim().split(',');
    for n in &mut numbers {
        *n = parts.next()?.trim().parse().ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    let ip = Ipv4Addr::new(numbers[0], numbers[1], numbers[2], numbers[3]);
    let port = u16::from(numbers[4]) << 8 | u16::from(numbers[5]);
    Some(SocketAddr::new(IpAddr::V4(ip), port))
}

/// `|n|addr|port|` (EPRT, RFC 2428); any single delimiter character.
fn parse_eprt(text: &str) -> Option<SocketAddr> {
    let text = text.trim();
    let delimiter = text.chars().next()?;
    let fields: Vec<&str> = text.split(delimiter).collect();
    let [_, family, addr, port, end] = fields.as_slice() else {
        return None;
    };
    if !end.is_empty() {
        return None;
    }
    let ip: IpAddr = addr.parse().ok()?;
    let matches_family = match *family {
        "1" => ip.is_ipv4(),
        "2" => ip.is_ipv6(),
        _ => false,
    };
    if !matches_family {
        return None;
    }
    Some(SocketAddr::new(ip, port.parse().ok()?))
}

/// A member's reply line.
pub fn classify_reply(line: &[u8]) -> ControlLine {
    let Ok(text) = std::str::from_utf8(trim_eol(line)) else {
        return ControlLine::Other;
    };
    if text.starts_with("234") {
        return ControlLine::TlsAccepted;
    }
    if let Some(rest) = text.strip_prefix("227 ") {
        // The numbers may or may not be in parentheses (RFC 1123 4.1.2.6).
        let Some(start) = rest.find(|c: char| c.is_ascii_digit()) else {
            return ControlLine::Malformed;
        };
        let digits = &rest[start..];
        let end = digits
            .find(|c: char| !(c.is_ascii_digit() || c == ','))
            .unwrap_or(digits.len());
        return parse_h1_p2(&digits[..end]).map_or(ControlLine::Malformed, ControlLine::Passive);
    }
    if let Some(rest) = text.strip_prefix("229 ") {
        let inner = rest
            .split_once('(')
            .and_then(|(_, r)| r.split_once(')'))
            .map(|(inner, _)| inner);
        let port = inner.and_then(|inner| {
            let d = inner.chars().next()?;
            let fields: Vec<&str> = inner.split(d).collect();
            match fields.as_slice() {
                ["", "", "", port, ""] => port.parse::<u16>().ok(),
                _ => None,
            }
        });
        return port.map_or(ControlLine::Malformed, ControlLine::ExtendedPassive);
    }
    ControlLine::Other
}

/// A client's command line.
pub fn classify_command(line: &[u8]) -> ControlLine {
    let Ok(text) = std::str::from_utf8(trim_eol(line)) else {
        return ControlLine::Other;
    };
    let (verb, argument) = text.split_once(' ').unwrap_or((text, ""));
    if verb.eq_ignore_ascii_case("PORT") {
        return parse_h1_p2(argument).map_or(ControlLine::Malformed, ControlLine::Active);
    }
    if verb.eq_ignore_ascii_case("EPRT") {
        return parse_eprt(argument).map_or(ControlLine::Malformed, ControlLine::Active);
    }
    if verb.eq_ignore_ascii_case("AUTH") {
        let mechanism = argument.trim();
        if ["TLS", "SSL", "TLS-C", "TLS-P"]
            .iter()
            .any(|m| mechanism.eq_ignore_ascii_case(m))
        {
            return ControlLine::AuthTls;
        }
    }
    ControlLine::Other
}

/// The 227 answer for `at`; `None` for an IPv6 address (227 cannot carry one).
pub fn passive_reply(at: SocketAddr) -> Option<String> {
    let IpAddr::V4(ip) = at.ip() else {
        return None;
    };
    let [a, b, c, d] = ip.octets();
    let port = at.port();
    Some(format!(
        "227 Entering Passive Mode ({a},{b},{c},{d},{},{}).\r\n",
        port >> 8,
        port & 0xff
    ))
}

/// The PORT (IPv4) or EPRT (IPv6) command that points a member at `at`.
pub fn active_command(at: SocketAddr) -> String {
    match at.ip() {
        IpAddr::V4(ip) => {
            let [a, b, c, d] = ip.octets();
            let port = at.port();
            format!("PORT {a},{b},{c},{d},{},{}\r\n", port >> 8, port & 0xff)
        }
        IpAddr::V6(ip) => format!("EPRT |2|{ip}|{}|\r\n", at.port()),
    }
}

/// Reads one line (up to and with `\n`) of at most `MAX_LINE` bytes, appended to `line`
/// (the caller clears it once handled, so a call cancelled by a timeout loses nothing).
/// `Ok(false)`: the peer closed; an error for a line that is too long.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> io::Result<bool> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(!line.is_empty());
        }
        let (take, done) = match memchr::memchr(b'\n', available) {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        if line.len() + take > MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "control line too long",
            ));
        }
        line.extend_from_slice(&available[..take]);
        reader.consume(take);
        if done {
            return Ok(true);
        }
    }
}

/// Binds a data listener on `ip`, on a port of `range` when given (tried from a point that
/// varies per call so that concurrent sessions do not race for the same first port).
fn bind_data_listener(ip: IpAddr, range: Option<&RangeInclusive<u16>>) -> io::Result<TcpListener> {
    let bind = |port: u16| -> io::Result<TcpListener> {
        let socket = match ip {
            IpAddr::V4(_) => TcpSocket::new_v4()?,
            IpAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::new(ip, port))?;
        socket.listen(1)
    };
    let Some(range) = range else {
        return bind(0);
    };
    let (low, high) = (*range.start(), *range.end());
    let count = u32::from(high - low) + 1;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = (NEXT.fetch_add(1, Ordering::Relaxed) % u64::from(count)) as u32;
    let mut last = io::Error::new(io::ErrorKind::AddrInUse, "no passive port free");
    for i in 0..count {
        let port = low as u32 + (start + i) % count;
        // `port` is within low..=high, both u16.
        match bind(port as u16) {
            Ok(l) => return Ok(l),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Which connection a data listener lets in, and where it relays it to.
struct DataRelay {
    listener: TcpListener,
    /// Only this peer address may connect (the session's client, or its member).
    allowed: IpAddr,
    /// Where the accepted connection is relayed to.
    target: SocketAddr,
    /// The local address to connect to `target` from (`None`: the host's choice).
    source: Option<IpAddr>,
}

impl FtpService {
    /// Relays the one data connection `relay` accepts; `busy` counts it while it runs.
    fn spawn_data_relay(&self, relay: DataRelay, busy: Arc<AtomicUsize>) {
        let stats = self.tcp.stats.clone();
        let tracked = self.tcp.tracker.track();
        let opts = ForwardOptions {
            idle_timeout: self.tcp.idle_timeout,
            splice: true,
        };
        let connect_timeout = self.tcp.pool.connect_timeout;
        let name = self.tcp.name.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + DATA_ACCEPT_TIMEOUT;
            // Bounded: each round either accepts or ends at the deadline.
            let mut incoming = loop {
                match tokio::time::timeout_at(deadline, relay.listener.accept()).await {
                    Ok(Ok((s, from))) if from.ip() == relay.allowed => break s,
                    Ok(Ok((_, from))) => {
                        // A data connection from another host would let it steal or inject a
                        // transfer (pasv_promiscuous=NO).
                        stats.ftp_refused.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(service = %name, %from, expected = %relay.allowed, "FTP data connection from a foreign address refused");
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(service = %name, error = %e, "FTP data accept");
                    }
                    Err(_) => return,
                }
            };
            drop(relay.listener);
            let connect = async {
                let socket = match relay.target {
                    SocketAddr::V4(_) => TcpSocket::new_v4()?,
                    SocketAddr::V6(_) => TcpSocket::new_v6()?,
                };
                if let Some(ip) = relay
                    .source
                    .filter(|ip| ip.is_ipv4() == relay.target.is_ipv4())
                {
                    socket.bind(SocketAddr::new(ip, 0))?;
                }
                socket.connect(relay.target).await
            };
            let mut outgoing = match tokio::time::timeout(connect_timeout, connect).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(service = %name, target = %relay.target, error = %e, "FTP data connect");
                    return;
                }
                Err(_) => return,
            };
            stats.ftp_data_connections.fetch_add(1, Ordering::Relaxed);
            busy.fetch_add(1, Ordering::Relaxed);
            forward(&mut incoming, &mut outgoing, opts, |a, b| {
                stats.bytes_in.fetch_add(a, Ordering::Relaxed);
                stats.bytes_out.fetch_add(b, Ordering::Relaxed);
            })
            .await;
            busy.fetch_sub(1, Ordering::Relaxed);
            drop(tracked);
        });
    }

    async fn serve(&self, client: TcpStream, peer: SocketAddr, local: SocketAddr) {
        let tcp = &self.tcp;
        let Some(_conn) = tcp.stats.admit(tcp.max_connections) else {
            return;
        };
        tcp.stats.requests_total.fetch_add(1, Ordering::Relaxed);
        let (mut attempts, key) = tcp.attempts(peer);
        let Some((picked, member_stream, _)) = tcp
            .connect_member(&tcp.pool, peer, &mut attempts, key.as_ref())
            .await
        else {
            return;
        };
        let member = &picked.member;
        let _connection = member.open_connection();
        let member_local = match member_stream.local_addr() {
            Ok(a) => a,
            Err(_) => return,
        };
        let member_peer = member.address;
        let session = Session {
            service: self,
            client_addr: peer,
            vip: local,
            member_addr: member_peer,
            member_local,
            data_busy: Arc::new(AtomicUsize::new(0)),
        };
        let (up, down) = session.relay(client, member_stream).await;
        member.stats.add_bytes(up, down);
        if down > 0 {
            member.record_exchange_success();
        }
    }
}

/// One control connection and the addresses its data connections are checked against.
struct Session<'a> {
    service: &'a FtpService,
    client_addr: SocketAddr,
    /// The address the client connected to: where passive listeners open.
    vip: SocketAddr,
    member_addr: SocketAddr,
    /// Fulcrum's address towards the member: where active listeners open.
    member_local: SocketAddr,
    /// Data connections of this session being relayed now.
    data_busy: Arc<AtomicUsize>,
}

/// What the two directions of a control channel share while it is relayed line by line.
struct ControlChannel {
    /// Both writers are shared: a refused PORT is answered to the client from the command
    /// direction, in order with the member's replies.
    client_wr: tokio::sync::Mutex<OwnedWriteHalf>,
    member_wr: tokio::sync::Mutex<OwnedWriteHalf>,
    /// Bytes client→member and member→client.
    up: AtomicU64,
    down: AtomicU64,
    /// Set by the reply direction when an `AUTH TLS` was answered (true: 234).
    tls_tx: tokio::sync::watch::Sender<Option<bool>>,
    awaiting_auth: AtomicBool,
    idle: Duration,
}

/// Runs both directions of the control channel until both turned to TLS (true each) or one
/// ended without (false): the first direction to end without TLS ends the session.
async fn first_to_end(
    commands: impl std::future::Future<Output = bool>,
    replies: impl std::future::Future<Output = bool>,
) -> (bool, bool) {
    tokio::pin!(commands, replies);
    let mut up_done = None;
    let mut down_done = None;
    while up_done.is_none() || down_done.is_none() {
        tokio::select! {
            r = &mut commands, if up_done.is_none() => {
                up_done = Some(r);
                if !r { break; }
            }
            r = &mut replies, if down_done.is_none() => {
                down_done = Some(r);
                if !r { break; }
            }
        }
    }
    (up_done == Some(true), down_done == Some(true))
}

/// Explicit FTPS: from here on the control channel is opaque. Bytes already buffered past the
/// last line go first. Returns (client→member, member→client) bytes.
async fn relay_opaque(
    (client_rd, client_wr): (BufReader<OwnedReadHalf>, OwnedWriteHalf),
    (member_rd, member_wr): (BufReader<OwnedReadHalf>, OwnedWriteHalf),
    idle: Duration,
) -> (u64, u64) {
    let to_member = client_rd.buffer().to_vec();
    let to_client = member_rd.buffer().to_vec();
    let client = client_wr.reunite(client_rd.into_inner());
    let member = member_wr.reunite(member_rd.into_inner());
    let (Ok(mut client), Ok(mut member)) = (client, member) else {
        return (0, 0);
    };
    fulcrum_net::relay::run_timed(
        &mut client,
        &to_member,
        &mut member,
        &to_client,
        idle,
        &mut |_, _| {},
        None,
    )
    .await
}

impl Session<'_> {
    fn refused(&self) {
        self.service
            .tcp
            .stats
            .ftp_refused
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Relays the control channel until either side closes; returns (client→member,
    /// member→client) bytes.
    async fn relay(&self, client: TcpStream, member: TcpStream) -> (u64, u64) {
        let (client_rd, client_wr) = client.into_split();
        let (member_rd, member_wr) = member.into_split();
        let mut client_rd = BufReader::new(client_rd);
        let mut member_rd = BufReader::new(member_rd);
        let (tls_tx, mut tls_rx) = tokio::sync::watch::channel(None::<bool>);
        let ch = ControlChannel {
            client_wr: tokio::sync::Mutex::new(client_wr),
            member_wr: tokio::sync::Mutex::new(member_wr),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            tls_tx,
            awaiting_auth: AtomicBool::new(false),
            idle: self.service.tcp.idle_timeout,
        };
        let (to_tls_up, to_tls_down) = first_to_end(
            self.relay_commands(&ch, &mut client_rd, &mut tls_rx),
            self.relay_replies(&ch, &mut member_rd),
        )
        .await;
        let ControlChannel {
            client_wr,
            member_wr,
            up,
            down,
            idle,
            ..
        } = ch;
        let (mut up_total, mut down_total) = (up.into_inner(), down.into_inner());
        if to_tls_up && to_tls_down {
            let client = (client_rd, client_wr.into_inner());
            let member = (member_rd, member_wr.into_inner());
            let (u, d) = relay_opaque(client, member, idle).await;
            up_total += u;
            down_total += d;
        }
        let stats = &self.service.tcp.stats;
        stats.bytes_in.fetch_add(up_total, Ordering::Relaxed);
        stats.bytes_out.fetch_add(down_total, Ordering::Relaxed);
        (up_total, down_total)
    }

    /// The client's commands to the member, line by line, with PORT / EPRT rewritten; returns
    /// true when an `AUTH TLS` the member accepted turns the channel to TLS.
    async fn relay_commands(
        &self,
        ch: &ControlChannel,
        client_rd: &mut BufReader<OwnedReadHalf>,
        tls_rx: &mut tokio::sync::watch::Receiver<Option<bool>>,
    ) -> bool {
        let idle = ch.idle;
        let mut line = Vec::new();
        loop {
            line.clear();
            match tokio::time::timeout(idle, read_line(client_rd, &mut line)).await {
                Ok(Ok(true)) => {}
                Ok(Err(_)) => {
                    self.refused();
                    return false;
                }
                Ok(Ok(false)) => return false,
                // A silent control connection is normal while its transfer runs (the data
                // relay has its own idle timeout).
                Err(_) if self.data_busy.load(Ordering::Relaxed) > 0 => continue,
                Err(_) => return false,
            }
            let out = match classify_command(&line) {
                ControlLine::Active(target) => match self.open_active(target) {
                    Ok(rewritten) => rewritten.into_bytes(),
                    Err(answer) => {
                        let mut w = ch.client_wr.lock().await;
                        if w.write_all(answer.as_bytes()).await.is_err() {
                            return false;
                        }
                        continue;
                    }
                },
                ControlLine::Malformed => {
                    self.refused();
                    let mut w = ch.client_wr.lock().await;
                    if w.write_all(b"501 Syntax error in parameters.\r\n")
                        .await
                        .is_err()
                    {
                        return false;
                    }
                    continue;
                }
                ControlLine::AuthTls => {
                    // Forget the answer to an earlier AUTH the member refused.
                    ch.tls_tx.send_replace(None);
                    ch.awaiting_auth.store(true, Ordering::Relaxed);
                    line.clone()
                }
                _ => line.clone(),
            };
            if ch.member_wr.lock().await.write_all(&out).await.is_err() {
                return false;
            }
            ch.up.fetch_add(out.len() as u64, Ordering::Relaxed);
            if ch.awaiting_auth.load(Ordering::Relaxed) {
                // The client sends nothing more in clear text until the answer: wait for it
                // (bounded by the idle timeout) to know whether TLS bytes follow.
                let answered = tokio::time::timeout(idle, tls_rx.wait_for(|a| a.is_some())).await;
                match answered.ok().and_then(|r| r.ok()).map(|a| *a) {
                    Some(Some(true)) => return true,
                    Some(_) => {}
                    None => return false,
                }
            }
        }
    }

    /// The member's replies to the client, line by line, with passive addresses rewritten;
    /// returns true when it accepted an `AUTH TLS`.
    async fn relay_replies(
        &self,
        ch: &ControlChannel,
        member_rd: &mut BufReader<OwnedReadHalf>,
    ) -> bool {
        let mut line = Vec::new();
        loop {
            line.clear();
            match read_line(member_rd, &mut line).await {
                Ok(true) => {}
                Ok(false) => return false,
                Err(_) => {
                    self.refused();
                    return false;
                }
            }
            let classified = classify_reply(&line);
            let out = match classified {
                ControlLine::Passive(target) => self.open_passive(target, true, &line),
                ControlLine::ExtendedPassive(port) => {
                    self.open_passive(SocketAddr::new(self.member_addr.ip(), port), false, &line)
                }
                ControlLine::Malformed => {
                    self.refused();
                    line.clone()
                }
                _ => line.clone(),
            };
            let is_final = line.get(3) == Some(&b' ');
            if ch.awaiting_auth.load(Ordering::Relaxed) && is_final {
                ch.awaiting_auth.store(false, Ordering::Relaxed);
                let accepted = classified == ControlLine::TlsAccepted;
                if accepted {
                    self.open_tls_passthrough();
                }
                if ch.client_wr.lock().await.write_all(&out).await.is_err() {
                    return false;
                }
                ch.down.fetch_add(out.len() as u64, Ordering::Relaxed);
                let _ = ch.tls_tx.send(Some(accepted));
                if accepted {
                    return true;
                }
                continue;
            }
            if ch.client_wr.lock().await.write_all(&out).await.is_err() {
                return false;
            }
            ch.down.fetch_add(out.len() as u64, Ordering::Relaxed);
        }
    }

    /// The member announced `target` for a passive transfer: listen on the virtual address and
    /// answer with it. `ipv4_reply`: the member answered 227 (else 229).
    fn open_passive(&self, target: SocketAddr, ipv4_reply: bool, original: &[u8]) -> Vec<u8> {
        // A member behind NAT may announce 0.0.0.0 or its own private address; an unspecified one
        // means "the address you reached me at".
        let target = if target.ip().is_unspecified() {
            SocketAddr::new(self.member_addr.ip(), target.port())
        } else {
            target
        };
        let listener = match bind_data_listener(self.vip.ip(), self.service.passive_ports.as_ref())
        {
            Ok(l) => l,
            Err(e) => {
                tracing::info!(service = %self.service.tcp.name, error = %e, "no passive port to offer");
                self.refused();
                return b"425 Can't open data connection.\r\n".to_vec();
            }
        };
        let Ok(at) = listener.local_addr() else {
            return b"425 Can't open data connection.\r\n".to_vec();
        };
        let reply = if ipv4_reply {
            passive_reply(at)
        } else {
            Some(format!(
                "229 Entering Extended Passive Mode (|||{}|)\r\n",
                at.port()
            ))
        };
        let Some(reply) = reply else {
            // A 227 to an IPv6 client cannot be rewritten.
            self.refused();
            return original.to_vec();
        };
        self.service.spawn_data_relay(
            DataRelay {
                listener,
                allowed: self.client_addr.ip(),
                target,
                source: None,
            },
            self.data_busy.clone(),
        );
        reply.into_bytes()
    }

    /// The client asked the member to connect to `target` (PORT / EPRT): listen on the member
    /// side and rewrite the command to that; the error is the answer the client gets instead.
    fn open_active(&self, target: SocketAddr) -> Result<String, String> {
        if target.ip() != self.client_addr.ip() {
            // FTP bounce: a client may only have data sent to itself.
            self.refused();
            tracing::info!(service = %self.service.tcp.name, client = %self.client_addr, %target, "PORT to a foreign address refused");
            return Err("500 Illegal PORT command.\r\n".into());
        }
        let listener = bind_data_listener(self.member_local.ip(), None).map_err(|e| {
            tracing::info!(service = %self.service.tcp.name, error = %e, "no active data listener");
            "425 Can't open data connection.\r\n".to_string()
        })?;
        let at = listener
            .local_addr()
            .map_err(|_| "425 Can't open data connection.\r\n".to_string())?;
        self.service.spawn_data_relay(
            DataRelay {
                listener,
                allowed: self.member_addr.ip(),
                target,
                source: Some(self.vip.ip()),
            },
            self.data_busy.clone(),
        );
        Ok(active_command(at))
    }

    /// After `AUTH TLS`: the member's passive answers are encrypted, so every port of the
    /// range is forwarded to the same port of this session's member for the session's client.
    fn open_tls_passthrough(&self) {
        let Some(range) = self.service.passive_ports.clone() else {
            tracing::info!(service = %self.service.tcp.name, "AUTH TLS without ftp_passive_ports: data connections cannot be followed");
            return;
        };
        for port in range {
            let socket = match self.vip.ip() {
                IpAddr::V4(_) => TcpSocket::new_v4(),
                IpAddr::V6(_) => TcpSocket::new_v6(),
            };
            let listener = socket.and_then(|s| {
                s.set_reuseaddr(true)?;
                s.bind(SocketAddr::new(self.vip.ip(), port))?;
                s.listen(1)
            });
            // Ports another session holds are skipped: that session's member gets them.
            if let Ok(listener) = listener {
                self.service.spawn_data_relay(
                    DataRelay {
                        listener,
                        allowed: self.client_addr.ip(),
                        target: SocketAddr::new(self.member_addr.ip(), port),
                        source: None,
                    },
                    self.data_busy.clone(),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passive_answers_are_read() {
        assert_eq!(
            classify_reply(b"227 Entering Passive Mode (127,0,0,2,195,80).\r\n"),
            ControlLine::Passive("127.0.0.2:50000".parse().unwrap())
        );
        assert_eq!(
            classify_reply(b"229 Entering Extended Passive Mode (|||50001|)\r\n"),
            ControlLine::ExtendedPassive(50001)
        );
        assert_eq!(classify_reply(b"227 nonsense\r\n"), ControlLine::Malformed);
        assert_eq!(
            classify_reply(b"227 (1,2,3,4,5,666)\r\n"),
            ControlLine::Malformed
        );
        assert_eq!(classify_reply(b"229 (|||x|)\r\n"), ControlLine::Malformed);
        assert_eq!(classify_reply(b"234 Proceed\r\n"), ControlLine::TlsAccepted);
    }

    #[test]
    fn active_commands_are_read() {
        assert_eq!(
            classify_command(b"PORT 127,0,0,1,4,1\r\n"),
            ControlLine::Active("127.0.0.1:1025".parse().unwrap())
        );
        assert_eq!(
            classify_command(b"eprt |2|::1|5282|\r\n"),
            ControlLine::Active("[::1]:5282".parse().unwrap())
        );
        assert_eq!(
            classify_command(b"EPRT |1|::1|5282|\r\n"),
            ControlLine::Malformed
        );
        assert_eq!(classify_command(b"AUTH TLS\r\n"), ControlLine::AuthTls);
        assert_eq!(classify_command(b"LIST\r\n"), ControlLine::Other);
    }

    #[test]
    fn rewrites_round_trip() {
        let at: SocketAddr = "10.1.2.3:50100".parse().unwrap();
        let reply = passive_reply(at).unwrap();
        assert_eq!(classify_reply(reply.as_bytes()), ControlLine::Passive(at));
        assert_eq!(
            classify_command(active_command(at).as_bytes()),
            ControlLine::Active(at)
        );
    }
}

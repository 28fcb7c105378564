//! Framed-message peers for message-based load balancing: a "switch" member (the banking host of
//! the F5 seed: 2-byte length + 12-byte id, answering every message after a delay) and a client
//! that speaks the same framing.
//!
//! The framing code here is written independently of Fulcrum's framer on purpose: the black-box
//! tests cross-check two implementations of every variant.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Length of the id at the start of every body.
pub const ID_LEN: usize = 12;

/// How a length field is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthCode {
    Binary { big_endian: bool },
    Ascii,
    Bcd,
}

/// A framing, as Fulcrum's `framing` table describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireFraming {
    Length {
        /// Bytes before the length field (`length_offset` of them), written as given.
        prefix: Vec<u8>,
        /// Width of the length field (`length_bytes`).
        width: usize,
        code: LengthCode,
        includes_header: bool,
        adjust: i64,
    },
    Delimiter(Vec<u8>),
}

impl WireFraming {
    /// The seed's framing: a 2-byte big-endian length of the body.
    pub fn two_byte() -> WireFraming {
        WireFraming::Length {
            prefix: Vec::new(),
            width: 2,
            code: LengthCode::Binary { big_endian: true },
            includes_header: false,
            adjust: 0,
        }
    }

    pub fn binary(width: usize, big_endian: bool) -> WireFraming {
        WireFraming::Length {
            prefix: Vec::new(),
            width,
            code: LengthCode::Binary { big_endian },
            includes_header: false,
            adjust: 0,
        }
    }

    fn header_len(&self) -> usize {
        match self {
            WireFraming::Length { prefix, width, .. } => prefix.len() + width,
            WireFraming::Delimiter(_) => 0,
        }
    }

    /// The inline table for Fulcrum's config, with `max_message`.
    pub fn toml(&self, max_message: usize) -> String {
        match self {
            WireFraming::Length {
                prefix,
                width,
                code,
                includes_header,
                adjust,
            } => {
                let code = match code {
                    LengthCode::Binary { big_endian } => {
                        format!("length_encoding = \"binary\", big_endian = {big_endian}")
                    }
                    LengthCode::Ascii => "length_encoding = \"ascii\"".to_string(),
                    LengthCode::Bcd => "length_encoding = \"bcd\"".to_string(),
                };
                format!(
                    "{{ length_bytes = {width}, length_offset = {}, {code}, length_includes_header = {includes_header}, length_adjust = {adjust}, max_message = {max_message} }}",
                    prefix.len()
                )
            }
            WireFraming::Delimiter(d) => {
                let bytes: Vec<String> = d.iter().map(|b| b.to_string()).collect();
                format!(
                    "{{ delimiter = [{}], max_message = {max_message} }}",
                    bytes.join(", ")
                )
            }
        }
    }

    /// One frame around `body`.
    pub fn encode(&self, body: &[u8]) -> Vec<u8> {
        match self {
            WireFraming::Length {
                prefix,
                width,
                code,
                includes_header,
                adjust,
            } => {
                let header = prefix.len() + width;
                let total = body.len() as i64 + if *includes_header { header as i64 } else { 0 };
                let value = (total - adjust).max(0) as u64;
                let mut out = prefix.clone();
                out.extend_from_slice(&encode_length(value, *width, *code));
                out.extend_from_slice(body);
                out
            }
            WireFraming::Delimiter(d) => {
                let mut out = body.to_vec();
                out.extend_from_slice(d);
                out
            }
        }
    }

    /// Takes one frame off the front of `buf`; its body, or `None` if it is not complete yet.
    pub fn decode(&self, buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, String> {
        match self {
            WireFraming::Length {
                width,
                code,
                includes_header,
                adjust,
                ..
            } => {
                let header = self.header_len();
                if buf.len() < header {
                    return Ok(None);
                }
                let value = decode_length(&buf[header - width..header], *code)? as i64 + adjust;
                let body = if *includes_header {
                    value - header as i64
                } else {
                    value
                };
                if body < 0 {
                    return Err(format!("length {value} shorter than the header"));
                }
                let total = header + body as usize;
                if buf.len() < total {
                    return Ok(None);
                }
                let frame: Vec<u8> = buf.drain(..total).collect();
                Ok(Some(frame[header..].to_vec()))
            }
            WireFraming::Delimiter(d) => {
                let Some(at) = buf.windows(d.len()).position(|w| w == d.as_slice()) else {
                    return Ok(None);
                };
                let frame: Vec<u8> = buf.drain(..at + d.len()).collect();
                Ok(Some(frame[..at].to_vec()))
            }
        }
    }
}

fn encode_length(value: u64, width: usize, code: LengthCode) -> Vec<u8> {
    match code {
        LengthCode::Binary { big_endian } => {
            let be = value.to_be_bytes();
            let mut v = be[8 - width..].to_vec();
            if !big_endian {
                v.reverse();
            }
            v
        }
        LengthCode::Ascii => format!("{value:0width$}").into_bytes(),
        LengthCode::Bcd => {
            let digits = format!("{value:0w$}", w = width * 2).into_bytes();
            digits
                .chunks(2)
                .map(|p| ((p[0] - b'0') << 4) | (p[1] - b'0'))
                .collect()
        }
    }
}

fn decode_length(field: &[u8], code: LengthCode) -> Result<u64, String> {
    match code {
        LengthCode::Binary { big_endian } => {
            let mut v = field.to_vec();
            if !big_endian {
                v.reverse();
            }
            Ok(v.iter().fold(0u64, |a, b| (a << 8) | u64::from(*b)))
        }
        LengthCode::Ascii => std::str::from_utf8(field)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad ASCII length {field:?}")),
        LengthCode::Bcd => field.iter().try_fold(0u64, |a, b| {
            let (hi, lo) = (u64::from(b >> 4), u64::from(b & 15));
            if hi > 9 || lo > 9 {
                Err(format!("bad BCD length {field:?}"))
            } else {
                Ok(a * 100 + hi * 10 + lo)
            }
        }),
    }
}

/// A 12-byte id from a number: "000000000042".
pub fn id(n: u64) -> [u8; ID_LEN] {
    let mut out = [0u8; ID_LEN];
    out.copy_from_slice(format!("{n:012}").as_bytes());
    out
}

/// One answer as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub id: Vec<u8>,
    /// The switch that answered.
    pub server: String,
    /// The payload of the request, echoed.
    pub payload: Vec<u8>,
}

impl Answer {
    pub fn parse(body: &[u8]) -> Option<Answer> {
        if body.len() < ID_LEN {
            return None;
        }
        let (id, rest) = body.split_at(ID_LEN);
        let bar = rest.iter().position(|b| *b == b'|')?;
        Some(Answer {
            id: id.to_vec(),
            server: String::from_utf8_lossy(&rest[..bar]).into_owned(),
            payload: rest[bar + 1..].to_vec(),
        })
    }
}

/// How a switch answers.
#[derive(Debug, Clone)]
pub struct SwitchOptions {
    /// Every answer waits this long (a payload starting `sleep:MS;` waits MS instead).
    pub delay: Duration,
    /// Answer in the order of the requests on each connection (a FIFO host); otherwise each
    /// message is answered when its own delay is over, out of order.
    pub ordered: bool,
}

impl Default for SwitchOptions {
    fn default() -> Self {
        SwitchOptions {
            delay: Duration::ZERO,
            ordered: false,
        }
    }
}

#[derive(Default)]
struct SwitchState {
    messages: AtomicU64,
    connections: AtomicU64,
    active: AtomicU64,
    max_outstanding: AtomicU64,
    ids: Mutex<Vec<Vec<u8>>>,
    proxy_headers: Mutex<Vec<Vec<u8>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// Duplex: the answer writers of the connections, newest last (for the switch's own
    /// requests). Simplex: unused.
    /// Weak, so a connection's writer still ends when its reader does.
    writers: Mutex<Vec<mpsc::WeakUnboundedSender<Out>>>,
    /// Simplex: where every answer goes (the receive-only connection's writer).
    receive: Mutex<Option<mpsc::UnboundedSender<Vec<u8>>>>,
    /// Receive-only connections accepted (simplex), and frames written on them.
    receive_connections: AtomicU64,
    receive_frames: AtomicU64,
    /// Frames written on the connections the requests came in on.
    duplex_frames: AtomicU64,
    /// Simplex: the task of the receive-only port (listener and connection).
    receive_task: Mutex<Option<JoinHandle<()>>>,
    /// Ids of the switch's own requests not answered yet, and the answers' bodies.
    originated: Mutex<std::collections::HashSet<Vec<u8>>>,
    origin_answers: Mutex<Vec<Vec<u8>>>,
}

/// A frame for a connection's answer writer: when it is due, the frame (none: a request not
/// answered), and whether it answers a request (counted as no longer outstanding).
type Out = (Instant, Option<Vec<u8>>, bool);

/// A framed-message member. Payload commands: `sleep:MS;…` delays that answer, `noreply…` is
/// never answered, `orphan…` is answered with an id that was never sent.
pub struct MessageSwitch {
    pub addr: SocketAddr,
    pub name: String,
    framing: WireFraming,
    state: Arc<SwitchState>,
    accept: JoinHandle<()>,
}

impl Drop for MessageSwitch {
    fn drop(&mut self) {
        self.kill();
    }
}

impl MessageSwitch {
    pub async fn start(
        addr: SocketAddr,
        name: &str,
        framing: WireFraming,
        options: SwitchOptions,
    ) -> io::Result<MessageSwitch> {
        MessageSwitch::launch(addr, None, name, framing, options).await
    }

    /// A simplex host (the card scheme of the F5 seed): it reads requests on the connections
    /// made to `addr` and never answers there; every answer (and every request of its own) goes
    /// out on the newest connection made to `receive`, its receive-only port. Answers due while
    /// no receive connection is up wait for one.
    pub async fn start_simplex(
        addr: SocketAddr,
        receive: SocketAddr,
        name: &str,
        framing: WireFraming,
        options: SwitchOptions,
    ) -> io::Result<MessageSwitch> {
        MessageSwitch::launch(addr, Some(Receive::Listen(receive)), name, framing, options).await
    }

    /// As `start_simplex`, but the host opens its receive-only connection itself, from its own
    /// IP to `fulcrum` (Fulcrum's `simplex.receive_listen`), and opens it again whenever it
    /// closes.
    pub async fn start_simplex_dialing(
        addr: SocketAddr,
        fulcrum: SocketAddr,
        name: &str,
        framing: WireFraming,
        options: SwitchOptions,
    ) -> io::Result<MessageSwitch> {
        MessageSwitch::launch(addr, Some(Receive::Dial(fulcrum)), name, framing, options).await
    }

    async fn launch(
        addr: SocketAddr,
        receive: Option<Receive>,
        name: &str,
        framing: WireFraming,
        options: SwitchOptions,
    ) -> io::Result<MessageSwitch> {
        let listener = crate::bind_tcp(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(SwitchState::default());
        if let Some(receive) = receive {
            let receive = match receive {
                Receive::Listen(at) => ReceiveSide::Listen(TcpListener::bind(at).await?),
                Receive::Dial(to) => ReceiveSide::Dial {
                    from: addr.ip(),
                    to,
                },
            };
            let (tx, rx) = mpsc::unbounded_channel();
            if let Ok(mut r) = state.receive.lock() {
                *r = Some(tx);
            }
            let task = tokio::spawn(serve_receive(receive, rx, state.clone()));
            if let Ok(mut t) = state.receive_task.lock() {
                *t = Some(task);
            }
        }
        let (st, n) = (state.clone(), Arc::<str>::from(name));
        let framing_for_accept = framing.clone();
        let accept = tokio::spawn(async move {
            let framing = framing_for_accept;
            while let Ok((s, _)) = listener.accept().await {
                st.connections.fetch_add(1, Ordering::Relaxed);
                let task = tokio::spawn(serve_switch(
                    s,
                    n.clone(),
                    framing.clone(),
                    options.clone(),
                    st.clone(),
                ));
                if let Ok(mut t) = st.tasks.lock() {
                    t.retain(|t| !t.is_finished());
                    t.push(task);
                }
            }
        });
        Ok(MessageSwitch {
            addr,
            name: name.to_string(),
            framing: framing.clone(),
            state,
            accept,
        })
    }

    /// Messages received so far.
    pub fn messages(&self) -> u64 {
        self.state.messages.load(Ordering::Relaxed)
    }

    /// Connections accepted so far, and open now.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }

    pub fn active(&self) -> u64 {
        self.state.active.load(Ordering::Relaxed)
    }

    /// The most messages ever outstanding (received, not answered) on one connection.
    pub fn max_outstanding(&self) -> u64 {
        self.state.max_outstanding.load(Ordering::Relaxed)
    }

    /// Ids of every message received, in arrival order.
    pub fn ids(&self) -> Vec<Vec<u8>> {
        self.state.ids.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// PROXY protocol headers that connections started with, raw.
    pub fn proxy_headers(&self) -> Vec<Vec<u8>> {
        self.state
            .proxy_headers
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// Receive-only connections accepted so far (simplex), and frames written on them.
    pub fn receive_connections(&self) -> u64 {
        self.state.receive_connections.load(Ordering::Relaxed)
    }

    pub fn receive_frames(&self) -> u64 {
        self.state.receive_frames.load(Ordering::Relaxed)
    }

    /// Frames written on the connections requests came in on (none for a simplex host).
    pub fn duplex_frames(&self) -> u64 {
        self.state.duplex_frames.load(Ordering::Relaxed)
    }

    /// Sends a request of the switch's own (`body`: a 12-byte id first): on the receive-only
    /// connection of a simplex host, else on the newest connection still open. A message
    /// carrying that id later is its answer (recorded, not answered). False when no connection
    /// could take it.
    pub fn originate(&self, body: &[u8]) -> bool {
        let frame = self.framing.encode(body);
        if let Ok(mut o) = self.state.originated.lock() {
            o.insert(body.get(..ID_LEN).unwrap_or(body).to_vec());
        }
        if let Some(tx) = self.state.receive.lock().ok().and_then(|r| r.clone()) {
            return tx.send(frame).is_ok();
        }
        let writers = self
            .state
            .writers
            .lock()
            .map(|w| w.clone())
            .unwrap_or_default();
        writers.iter().rev().any(|w| {
            w.upgrade()
                .is_some_and(|w| w.send((Instant::now(), Some(frame.clone()), false)).is_ok())
        })
    }

    /// Bodies of the answers to the switch's own requests, in arrival order.
    pub fn origin_answers(&self) -> Vec<Vec<u8>> {
        self.state
            .origin_answers
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// Simplex: closes the receive-only port and its connection, and listens there no more;
    /// the request port stays up (half a host).
    pub fn kill_receive(&self) {
        if let Some(t) = self
            .state
            .receive_task
            .lock()
            .ok()
            .and_then(|mut t| t.take())
        {
            t.abort();
        }
    }

    /// Stops listening and cuts every connection, like a crashed host.
    pub fn kill(&self) {
        self.kill_receive();
        self.accept.abort();
        if let Ok(mut t) = self.state.tasks.lock() {
            for t in t.drain(..) {
                t.abort();
            }
        }
    }
}

/// Aborts a task when dropped: a killed switch takes its connection writers down with it.
struct AbortOnDrop(JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct ActiveGuard(Arc<SwitchState>);
impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn serve_switch(
    stream: TcpStream,
    name: Arc<str>,
    framing: WireFraming,
    options: SwitchOptions,
    state: Arc<SwitchState>,
) {
    state.active.fetch_add(1, Ordering::Relaxed);
    let _active = ActiveGuard(state.clone());
    let _ = stream.set_nodelay(true);
    let (mut rd, wr) = stream.into_split();
    let outstanding = Arc::new(AtomicU64::new(0));
    // Answers reach the writer as (due time, frame, answers a request); in ordered mode in
    // request order.
    let (tx, mut rx) = mpsc::unbounded_channel::<Out>();
    let out = outstanding.clone();
    let ordered = options.ordered;
    // Simplex: answers go to the receive-only connection; this one stays open, silent.
    let simplex = state.receive.lock().ok().and_then(|r| r.clone());
    if simplex.is_none() {
        if let Ok(mut w) = state.writers.lock() {
            w.retain(|w| w.upgrade().is_some());
            w.push(tx.downgrade());
        }
    }
    let st = state.clone();
    let (mut wr, _silent) = match simplex {
        Some(_) => (None, Some(wr)),
        None => (Some(wr), None),
    };
    let mut writer = AbortOnDrop(tokio::spawn(async move {
        while let Some((due, frame, answers)) = rx.recv().await {
            if ordered {
                tokio::time::sleep_until(due).await;
            }
            // Counted as answered before the bytes leave, so a peer that reacts to the answer
            // at once never sees this message as still outstanding.
            if answers {
                out.fetch_sub(1, Ordering::Relaxed);
            }
            let Some(frame) = frame else { continue };
            match (&mut wr, &simplex) {
                (Some(wr), _) => {
                    st.duplex_frames.fetch_add(1, Ordering::Relaxed);
                    if wr.write_all(&frame).await.is_err() {
                        return;
                    }
                }
                (None, Some(receive)) => {
                    let _ = receive.send(frame);
                }
                (None, None) => return,
            }
        }
    }));
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut first = true;
    'read: loop {
        let n = match rd.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        if first {
            // A PROXY protocol header (v1 or v2) may open the connection: recorded, not a message.
            let maybe = buf.starts_with(b"PROXY ") || buf.starts_with(b"\r\n\r\n\0\r\nQUIT\n");
            let prefix_of_one = b"PROXY ".starts_with(&buf[..buf.len().min(6)])
                || b"\r\n\r\n\0\r\nQUIT\n".starts_with(&buf[..buf.len().min(12)]);
            if maybe || (prefix_of_one && buf.len() < 12) {
                match crate::servers::split_proxy_header(&buf) {
                    Some(end) => {
                        if let Ok(mut h) = state.proxy_headers.lock() {
                            h.push(buf[..end].to_vec());
                        }
                        buf.drain(..end);
                    }
                    None if buf.len() < 256 => continue,
                    None => {}
                }
            }
            first = false;
        }
        loop {
            let body = match framing.decode(&mut buf) {
                Ok(Some(b)) => b,
                Ok(None) => break,
                Err(_) => break 'read,
            };
            let key = body.get(..ID_LEN).unwrap_or(&body);
            if state.originated.lock().is_ok_and(|mut o| o.remove(key)) {
                // The answer to one of the switch's own requests.
                if let Ok(mut a) = state.origin_answers.lock() {
                    a.push(body);
                }
                continue;
            }
            state.messages.fetch_add(1, Ordering::Relaxed);
            let now = outstanding.fetch_add(1, Ordering::Relaxed) + 1;
            state.max_outstanding.fetch_max(now, Ordering::Relaxed);
            let id = body.get(..ID_LEN).unwrap_or(&body).to_vec();
            if let Ok(mut ids) = state.ids.lock() {
                ids.push(id.clone());
            }
            let payload = body.get(ID_LEN..).unwrap_or_default().to_vec();
            let delay = payload
                .strip_prefix(b"sleep:")
                .and_then(|r| {
                    let end = r.iter().position(|b| *b == b';')?;
                    std::str::from_utf8(&r[..end]).ok()?.parse().ok()
                })
                .map(Duration::from_millis)
                .unwrap_or(options.delay);
            let answer = if payload.starts_with(b"noreply") {
                None
            } else {
                let id = if payload.starts_with(b"orphan") {
                    b"ORPHAN-ORPHA".to_vec()
                } else {
                    id
                };
                let mut body = id;
                body.extend_from_slice(name.as_bytes());
                body.push(b'|');
                body.extend_from_slice(&payload);
                Some(framing.encode(&body))
            };
            let due = Instant::now() + delay;
            if ordered || delay.is_zero() {
                let _ = tx.send((due, answer, true));
            } else {
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until(due).await;
                    let _ = tx.send((due, answer, true));
                });
            }
        }
    }
    drop(tx);
    // Answers still due go out before the connection closes (a clean close, not a crash).
    let _ = (&mut writer.0).await;
}

/// Where a simplex host's receive-only connection comes from.
enum Receive {
    /// Fulcrum connects to this address of the host.
    Listen(SocketAddr),
    /// The host connects to this address of Fulcrum.
    Dial(SocketAddr),
}

enum ReceiveSide {
    Listen(TcpListener),
    Dial {
        from: std::net::IpAddr,
        to: SocketAddr,
    },
}

impl ReceiveSide {
    /// The next receive connection: accepted, or made (retried every 50 ms).
    async fn next(&self) -> io::Result<TcpStream> {
        match self {
            ReceiveSide::Listen(l) => Ok(l.accept().await?.0),
            ReceiveSide::Dial { from, to } => loop {
                let sock = if to.is_ipv6() {
                    tokio::net::TcpSocket::new_v6()?
                } else {
                    tokio::net::TcpSocket::new_v4()?
                };
                sock.bind(SocketAddr::new(*from, 0))?;
                match sock.connect(*to).await {
                    Ok(s) => return Ok(s),
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            },
        }
    }
}

/// The receive-only side of a simplex host: the newest connection takes every frame (a frame
/// whose write failed is written again on the next one). A dialing host opens a new connection
/// when Fulcrum closes its current one.
async fn serve_receive(
    side: ReceiveSide,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    state: Arc<SwitchState>,
) {
    let dial = matches!(side, ReceiveSide::Dial { .. });
    let mut current: Option<TcpStream> = None;
    let mut retry: Option<Vec<u8>> = None;
    let mut scratch = [0u8; 512];
    loop {
        if let (Some(s), Some(frame)) = (&mut current, &retry) {
            if s.write_all(frame).await.is_ok() {
                state.receive_frames.fetch_add(1, Ordering::Relaxed);
                retry = None;
            } else {
                current = None;
                continue;
            }
        }
        let accepting = !dial || current.is_none();
        let reading = dial && current.is_some();
        tokio::select! {
            next = side.next(), if accepting => {
                let Ok(s) = next else { return };
                let _ = s.set_nodelay(true);
                state.receive_connections.fetch_add(1, Ordering::Relaxed);
                current = Some(s);
            }
            // Fulcrum sends nothing here: a read that ends is Fulcrum closing the connection.
            n = async { current.as_mut()?.read(&mut scratch).await.ok() }, if reading => {
                if matches!(n, Some(0) | None) {
                    current = None;
                }
            }
            frame = frames.recv(), if current.is_some() && retry.is_none() => {
                let Some(frame) = frame else { return };
                retry = Some(frame);
            }
        }
    }
}

/// A client speaking a framing.
pub struct MessageClient {
    pub framing: WireFraming,
    rd: OwnedReadHalf,
    wr: OwnedWriteHalf,
    buf: Vec<u8>,
}

impl MessageClient {
    pub async fn connect(addr: SocketAddr, framing: WireFraming) -> io::Result<MessageClient> {
        MessageClient::connect_from(addr, None, framing).await
    }

    /// As `connect`, from `source` (an address of this host, e.g. 127.0.0.2) when given.
    pub async fn connect_from(
        addr: SocketAddr,
        source: Option<std::net::IpAddr>,
        framing: WireFraming,
    ) -> io::Result<MessageClient> {
        let sock = if addr.is_ipv6() {
            tokio::net::TcpSocket::new_v6()?
        } else {
            tokio::net::TcpSocket::new_v4()?
        };
        if let Some(ip) = source {
            sock.bind(SocketAddr::new(ip, 0))?;
        }
        let s = tokio::time::timeout(Duration::from_secs(5), sock.connect(addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        s.set_nodelay(true)?;
        let (rd, wr) = s.into_split();
        Ok(MessageClient {
            framing,
            rd,
            wr,
            buf: Vec::new(),
        })
    }

    /// Sends one message: `id` then `payload` as its body.
    pub async fn send(&mut self, id: &[u8], payload: &[u8]) -> io::Result<()> {
        let mut body = id.to_vec();
        body.extend_from_slice(payload);
        let frame = self.framing.encode(&body);
        self.wr.write_all(&frame).await
    }

    /// Sends bytes as they are (bad frames).
    pub async fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.wr.write_all(bytes).await
    }

    /// Half-closes the sending side.
    pub async fn finish(&mut self) -> io::Result<()> {
        self.wr.shutdown().await
    }

    /// The next answer's body; `Ok(None)` when the connection ended; an error after `wait`.
    pub async fn recv_body(&mut self, wait: Duration) -> io::Result<Option<Vec<u8>>> {
        let deadline = Instant::now() + wait;
        loop {
            match self.framing.decode(&mut self.buf) {
                Ok(Some(body)) => return Ok(Some(body)),
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = tokio::time::timeout_at(deadline, self.rd.read(&mut chunk))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer in time"))??;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next answer, parsed.
    pub async fn recv(&mut self, wait: Duration) -> io::Result<Option<Answer>> {
        Ok(self.recv_body(wait).await?.map(|b| {
            Answer::parse(&b).unwrap_or(Answer {
                id: b,
                server: String::new(),
                payload: Vec::new(),
            })
        }))
    }

    /// Whether the connection is closed by the other side within `wait` (bytes are discarded).
    pub async fn closed_within(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut chunk = [0u8; 4096];
        loop {
            match tokio::time::timeout_at(deadline, self.rd.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    /// Splits into a sending and a receiving half, for pipelined clients.
    pub fn split(self) -> (MessageSender, MessageReceiver) {
        (
            MessageSender {
                framing: self.framing.clone(),
                wr: self.wr,
            },
            MessageReceiver {
                framing: self.framing,
                rd: self.rd,
                buf: self.buf,
            },
        )
    }
}

pub struct MessageSender {
    framing: WireFraming,
    wr: OwnedWriteHalf,
}

impl MessageSender {
    pub async fn send(&mut self, id: &[u8], payload: &[u8]) -> io::Result<()> {
        let mut body = id.to_vec();
        body.extend_from_slice(payload);
        let frame = self.framing.encode(&body);
        self.wr.write_all(&frame).await
    }

    pub async fn finish(&mut self) -> io::Result<()> {
        self.wr.shutdown().await
    }
}

pub struct MessageReceiver {
    framing: WireFraming,
    rd: OwnedReadHalf,
    buf: Vec<u8>,
}

impl MessageReceiver {
    pub async fn recv(&mut self, wait: Duration) -> io::Result<Option<Answer>> {
        let deadline = Instant::now() + wait;
        loop {
            match self.framing.decode(&mut self.buf) {
                Ok(Some(body)) => {
                    return Ok(Some(Answer::parse(&body).unwrap_or(Answer {
                        id: body,
                        server: String::new(),
                        payload: Vec::new(),
                    })))
                }
                Ok(None) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = tokio::time::timeout_at(deadline, self.rd.read(&mut chunk))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer in time"))??;
            if n == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_framing_round_trips() {
        let variants = [
            WireFraming::two_byte(),
            WireFraming::binary(1, true),
            WireFraming::binary(4, false),
            WireFraming::binary(8, true),
            WireFraming::Length {
                prefix: b"TPD".to_vec(),
                width: 4,
                code: LengthCode::Ascii,
                includes_header: true,
                adjust: 0,
            },
            WireFraming::Length {
                prefix: Vec::new(),
                width: 2,
                code: LengthCode::Bcd,
                includes_header: false,
                adjust: 2,
            },
            WireFraming::Delimiter(b"\r\n".to_vec()),
        ];
        for f in variants {
            let body = b"000000000001payload".to_vec();
            let mut wire = f.encode(&body);
            wire.extend_from_slice(&f.encode(b"second"));
            assert_eq!(f.decode(&mut wire), Ok(Some(body)), "{f:?}");
            assert_eq!(f.decode(&mut wire), Ok(Some(b"second".to_vec())), "{f:?}");
            assert!(wire.is_empty());
        }
        assert_eq!(encode_length(123, 2, LengthCode::Bcd), vec![0x01, 0x23]);
        assert_eq!(encode_length(5, 4, LengthCode::Ascii), b"0005".to_vec());
    }
}

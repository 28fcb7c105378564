//! State sync between the HA nodes (`ha.sync`): each node dials every peer and pushes its
//! current state document whenever it changes (and once a second as a heartbeat), and accepts
//! the peers' pushes on `listen`. Frames are authenticated and replay-protected (crate
//! fulcrum-frame, the GSLB exchange's format with its own magic and context).
//!
//! Two kinds of payload travel: the node's *document* (its whole API state; the latest one wins,
//! sent at every change and as a heartbeat) and *batches* of persistence entries (an incremental
//! stream through a bounded queue; a peer that falls behind, or (re)connects, gets a full dump
//! of the tables instead).
//!
//! The transport knows nothing of what it carries: the binary publishes documents and batches
//! and gets the peers' back. Each frame starts with the sender's wall-clock time in
//! milliseconds, from which the receiver measures the sync lag, and the payload's kind.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fulcrum_frame::{Channel, Key};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const CHANNEL: Channel = Channel {
    magic: b"FHS1",
    context: b"fulcrum-ha-sync-1",
    max_frame: 4 * 1024 * 1024,
};
const HEARTBEAT: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// An acceptor hears at least a heartbeat a second; this much silence ends the connection.
const IDLE: Duration = Duration::from_secs(5);

/// The purposes the binary derives secrets for (`derive_secret`), so that both nodes of a pair
/// hold the same secret without sending it.
pub mod purpose {
    /// The keyed hash of persistence tables' byte keys (header, cookie_passive, RADIUS).
    pub const TABLE_HASH: &str = "persistence-table-hash";
    /// The persistence-cookie secret of profiles that set none (cookie_insert, cookie_rewrite).
    pub const COOKIE: &str = "persistence-cookie-secret";
    /// TLS session-ticket keys (`fulcrum_tls::ticket`).
    pub const TICKETS: &str = "tls-session-tickets";
}

/// A 32-byte secret for `purpose`, derived from the sync key: `HMAC-SHA256(key,
/// "fulcrum-ha-derive-1" NUL purpose)`. Both nodes of a pair hold the same key, so they derive
/// the same secrets without sending them: the persistence tables' hash key (header, cookie and
/// RADIUS entries then mean the same on both), the persistence-cookie secret and the TLS
/// session-ticket keys.
pub fn derive_secret(sync_key: &str, purpose: &str) -> [u8; 32] {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, sync_key.as_bytes());
    let mut label = b"fulcrum-ha-derive-1\0".to_vec();
    label.extend_from_slice(purpose.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::hmac::sign(&key, &label).as_ref());
    out
}

/// What a payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Document,
    Entries,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Kind::Document => b'D',
            Kind::Entries => b'E',
        }
    }
}

/// One entry of a batch (`Kind::Entries`). A batch is a JSON array whose elements are
/// persistence entries `{"t": table, "k": key, "m": member}` or flows `{"f": {...}}`; a node
/// skips elements it does not understand, so an older peer ignores flows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A persistence entry: the service whose table holds it, the key in its text form (the
    /// binary's `key_text`) and the member.
    Persistence {
        table: String,
        key: String,
        member: SocketAddr,
    },
    /// A connection of an in-kernel (nat / dr / tunnel) service.
    Flow(FlowEntry),
}

/// A connection of an in-kernel service as it travels: everything by name and address, since
/// the nodes number VIPs, members and interfaces each their own way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowEntry {
    /// The virtual service.
    pub vs: String,
    pub client: SocketAddr,
    /// The VIP and port the client sent to.
    pub vip: SocketAddr,
    /// IP protocol: 6 (TCP), 17 (UDP), or another one of an ip VIP (`protocol = "ip"`: ESP,
    /// GRE, ICMP, ...), whose flows have no ports (`client` and `vip` ports 0).
    pub proto: u8,
    /// The member the flow goes to (a pool member's address).
    pub member: SocketAddr,
    /// nat: where replies to the client go (absent for dr / tunnel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hop: Option<FlowHop>,
    /// How long the flow has been idle on the sender (ms): 0 for a new flow; a full dump
    /// sends each flow's age, so the peer's entry expires when the sender's would.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub idle_ms: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The way back to the client of a nat flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowHop {
    /// The client's (or its router's) MAC address.
    pub mac: [u8; 6],
    /// The interface the flow came in on (by name: a pair names its interfaces alike).
    pub interface: String,
}

impl FlowEntry {
    /// Whether the entry makes sense at all (the receiver checks it against its own services).
    pub fn valid(&self) -> bool {
        let portless = self.proto != 0 && self.client.port() == 0 && self.vip.port() == 0;
        (matches!(self.proto, 6 | 17) || portless)
            && !self.vs.is_empty()
            && self.vs.len() <= 256
            && self.client.is_ipv4() == self.vip.is_ipv4()
            && self.hop.as_ref().is_none_or(|h| {
                !h.interface.is_empty() && h.interface.len() < 16 && !h.interface.contains('/')
            })
    }
}

/// An element of a batch as it is written: serialised straight from the entries, without an
/// intermediate JSON tree (the stream carries up to tens of thousands of entries a second).
#[derive(Serialize)]
#[serde(untagged)]
enum WireOut<'a> {
    Flow { f: &'a FlowEntry },
    Persistence { t: &'a str, k: &'a str, m: String },
}

/// An element of a batch as it is read on the fast path: every field optional, unknown fields
/// ignored, so a well-formed batch of any mix parses in one pass.
#[derive(Deserialize)]
struct WireIn {
    #[serde(default)]
    f: Option<FlowEntry>,
    #[serde(default)]
    t: Option<String>,
    #[serde(default)]
    k: Option<String>,
    #[serde(default)]
    m: Option<String>,
}

/// The batch for `entries` (the inverse of `decode_entries`).
pub fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    let v: Vec<WireOut<'_>> = entries
        .iter()
        .map(|e| match e {
            Entry::Persistence { table, key, member } => WireOut::Persistence {
                t: table,
                k: key,
                m: member.to_string(),
            },
            Entry::Flow(f) => WireOut::Flow { f },
        })
        .collect();
    serde_json::to_vec(&v).unwrap_or_default()
}

fn persistence(t: Option<&str>, k: Option<&str>, m: Option<&str>) -> Option<Entry> {
    Some(Entry::Persistence {
        table: t?.to_string(),
        key: k?.to_string(),
        member: m?.parse().ok()?,
    })
}

/// A peer's batch: the entries understood, and how many elements were skipped (malformed, or
/// of a kind this build does not know). An error when the batch is not a JSON array at all.
pub fn decode_entries(bytes: &[u8]) -> Result<(Vec<Entry>, u64), String> {
    let mut out = Vec::new();
    let mut skipped = 0;
    // Fast path: every element is an object whose fields have the expected types.
    if let Ok(v) = serde_json::from_slice::<Vec<WireIn>>(bytes) {
        out.reserve(v.len());
        for e in v {
            let entry = match e.f {
                Some(f) => Some(f).filter(FlowEntry::valid).map(Entry::Flow),
                None => persistence(e.t.as_deref(), e.k.as_deref(), e.m.as_deref()),
            };
            match entry {
                Some(e) => out.push(e),
                None => skipped += 1,
            }
        }
        return Ok((out, skipped));
    }
    // Otherwise element by element, skipping what does not parse.
    let v: Vec<serde_json::Value> =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JSON array: {e}"))?;
    for mut e in v {
        let entry = if let Some(f) = e.get_mut("f") {
            serde_json::from_value::<FlowEntry>(f.take())
                .ok()
                .filter(FlowEntry::valid)
                .map(Entry::Flow)
        } else {
            persistence(
                e.get("t").and_then(|t| t.as_str()),
                e.get("k").and_then(|k| k.as_str()),
                e.get("m").and_then(|m| m.as_str()),
            )
        };
        match entry {
            Some(e) => out.push(e),
            None => skipped += 1,
        }
    }
    Ok((out, skipped))
}

/// What the receiving side does with a peer's payload (with the peer's wall-clock time of
/// sending, Unix ms, for lag measures of its own); an error is logged and counted.
pub type OnReceive = Arc<dyn Fn(Kind, u64, &[u8]) -> Result<(), String> + Send + Sync>;
/// Every persistence entry as batches, for a peer that (re)connects or fell behind.
pub type FullDump = Arc<dyn Fn() -> Vec<Vec<u8>> + Send + Sync>;

/// Batches of entries waiting for the slowest peer connection; beyond, it gets a full dump.
const QUEUE: usize = 1024;

#[derive(Debug, Clone, Default, Serialize)]
pub struct PeerStatus {
    pub address: String,
    pub connected: bool,
    pub frames_sent: u64,
    pub batches_sent: u64,
    /// Batches this connection fell behind on (each time, a full dump followed).
    pub batches_lost: u64,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SyncStatus {
    pub listen: SocketAddr,
    /// The peers this node pushes its state to.
    pub peers: Vec<PeerStatus>,
    /// Documents received and applied.
    pub frames_received: u64,
    /// Connections refused because a frame failed authentication (wrong key, or worse).
    pub auth_failures: u64,
    /// Connections closed at accept: too many were waiting to authenticate (from their
    /// source, or in all).
    pub unauthenticated_refused: u64,
    /// Connections closed because their first frame did not come in time.
    pub first_frame_timeouts: u64,
    /// Received documents the binary refused.
    pub apply_errors: u64,
    /// Time from a peer's sending to this node's applying, for the last document (ms).
    pub lag_ms: Option<f64>,
    /// The largest lag of the last 1000 documents (ms).
    pub lag_max_ms: Option<f64>,
}

struct Shared {
    keys: Vec<Key>,
    listen: SocketAddr,
    peers: Mutex<BTreeMap<SocketAddr, PeerStatus>>,
    frames_received: AtomicU64,
    auth_failures: AtomicU64,
    unauthenticated_refused: AtomicU64,
    first_frame_timeouts: AtomicU64,
    apply_errors: AtomicU64,
    lags: Mutex<std::collections::VecDeque<f64>>,
    on_receive: OnReceive,
    full_dump: FullDump,
}

pub struct StateSync {
    shared: Arc<Shared>,
    doc: watch::Sender<Arc<Vec<u8>>>,
    batches: tokio::sync::broadcast::Sender<Arc<Vec<u8>>>,
    /// The task that pushes to each peer (ended when a reload removes the peer).
    dialers: Mutex<BTreeMap<SocketAddr, tokio::task::AbortHandle>>,
    runtime: tokio::runtime::Handle,
}

/// Milliseconds of wall-clock time: what each frame carries as its sending time, and what the
/// binary stamps on everything a peer compares with its own clock (lags, `changed_at_ms`).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl StateSync {
    /// Listens on `listen` and dials `peers` (on the current tokio runtime).
    pub async fn start(
        listen: SocketAddr,
        peers: &[SocketAddr],
        secrets: &[String],
        on_receive: OnReceive,
        full_dump: FullDump,
    ) -> std::io::Result<StateSync> {
        let l = TcpListener::bind(listen).await?;
        let shared = Arc::new(Shared {
            keys: fulcrum_frame::keys(secrets),
            listen,
            peers: Mutex::new(BTreeMap::new()),
            frames_received: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            unauthenticated_refused: AtomicU64::new(0),
            first_frame_timeouts: AtomicU64::new(0),
            apply_errors: AtomicU64::new(0),
            lags: Mutex::new(std::collections::VecDeque::new()),
            on_receive,
            full_dump,
        });
        let (doc, _) = watch::channel(Arc::new(Vec::new()));
        let (batches, _) = tokio::sync::broadcast::channel(QUEUE);
        tokio::spawn(accept(l, shared.clone()));
        let sync = StateSync {
            shared,
            doc,
            batches,
            dialers: Mutex::new(BTreeMap::new()),
            runtime: tokio::runtime::Handle::current(),
        };
        sync.set_peers(peers);
        Ok(sync)
    }

    /// The peers to push to (a reload may change them): new ones are dialled, removed ones'
    /// connections end. Callable from any thread.
    pub fn set_peers(&self, peers: &[SocketAddr]) {
        let mut dialers = self.dialers.lock();
        dialers.retain(|p, task| {
            let keep = peers.contains(p);
            if !keep {
                task.abort();
                self.shared.peers.lock().remove(p);
                tracing::info!(peer = %p, "HA sync: peer removed");
            }
            keep
        });
        for p in peers {
            if dialers.contains_key(p) {
                continue;
            }
            self.shared.peers.lock().insert(
                *p,
                PeerStatus {
                    address: p.to_string(),
                    ..PeerStatus::default()
                },
            );
            let task = self.runtime.spawn(dial(
                *p,
                self.shared.clone(),
                self.doc.subscribe(),
                self.batches.clone(),
            ));
            dialers.insert(*p, task.abort_handle());
        }
    }

    /// Queues a batch of persistence entries for every connected peer.
    pub fn send_batch(&self, batch: Vec<u8>) {
        // No receiver: no peer connected; it gets a full dump when it connects.
        let _ = self.batches.send(Arc::new(batch));
    }

    /// Replaces this node's document; every connected peer gets it at once.
    pub fn publish(&self, doc: Vec<u8>) {
        self.doc.send_replace(Arc::new(doc));
    }

    pub fn status(&self) -> SyncStatus {
        let s = &self.shared;
        let lags = s.lags.lock();
        SyncStatus {
            listen: s.listen,
            peers: s.peers.lock().values().cloned().collect(),
            frames_received: s.frames_received.load(Ordering::Relaxed),
            auth_failures: s.auth_failures.load(Ordering::Relaxed),
            unauthenticated_refused: s.unauthenticated_refused.load(Ordering::Relaxed),
            first_frame_timeouts: s.first_frame_timeouts.load(Ordering::Relaxed),
            apply_errors: s.apply_errors.load(Ordering::Relaxed),
            lag_ms: lags.back().copied(),
            lag_max_ms: lags.iter().copied().reduce(f64::max),
        }
    }
}

fn set_peer(s: &Shared, p: SocketAddr, f: impl FnOnce(&mut PeerStatus)) {
    if let Some(st) = s.peers.lock().get_mut(&p) {
        f(st);
    }
}

async fn dial(
    peer: SocketAddr,
    s: Arc<Shared>,
    doc: watch::Receiver<Arc<Vec<u8>>>,
    batches: tokio::sync::broadcast::Sender<Arc<Vec<u8>>>,
) {
    loop {
        let r = push(peer, &s, doc.clone(), &batches).await;
        let e = r.err().unwrap_or_else(|| "closed".into());
        set_peer(&s, peer, |p| {
            if p.connected || p.last_error.as_deref() != Some(&e) {
                tracing::info!(%peer, error = %e, "HA sync: peer connection lost; retrying");
            }
            p.connected = false;
            p.last_error = Some(e);
        });
        tokio::time::sleep(HEARTBEAT).await;
    }
}

struct Writer<'a> {
    c: &'a mut TcpStream,
    key: &'a Key,
    nonce: Vec<u8>,
    seq: u64,
}

impl Writer<'_> {
    async fn send(&mut self, kind: Kind, body: &[u8]) -> Result<(), String> {
        self.seq += 1;
        let mut payload = Vec::with_capacity(9 + body.len());
        payload.extend_from_slice(&now_ms().to_be_bytes());
        payload.push(kind.byte());
        payload.extend_from_slice(body);
        let frame = CHANNEL.encode(self.key, &self.nonce, self.seq, &payload);
        tokio::time::timeout(CONNECT_TIMEOUT, self.c.write_all(&frame))
            .await
            .map_err(|_| "write: timed out".to_string())?
            .map_err(|e| format!("write: {e}"))
    }
}

async fn push(
    peer: SocketAddr,
    s: &Shared,
    mut doc: watch::Receiver<Arc<Vec<u8>>>,
    batches: &tokio::sync::broadcast::Sender<Arc<Vec<u8>>>,
) -> Result<(), String> {
    let mut c = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(peer))
        .await
        .map_err(|_| "connect: timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    let _ = c.set_nodelay(true);
    let nonce = tokio::time::timeout(CONNECT_TIMEOUT, CHANNEL.read_challenge(&mut c))
        .await
        .map_err(|_| "challenge: timed out".to_string())??;
    let Some(key) = s.keys.first() else {
        return Err("no key configured".into());
    };
    set_peer(s, peer, |p| {
        p.connected = true;
        p.last_error = None;
    });
    tracing::info!(%peer, "HA sync: connected to peer");
    // Subscribed before the dump, so no batch falls between the two.
    let mut rx = batches.subscribe();
    let mut w = Writer {
        c: &mut c,
        key,
        nonce,
        seq: 0,
    };
    let mut probe = [0u8; 1];
    let mut dump = true;
    loop {
        // The whole document at every change and heartbeat: a peer that (re)connects gets the
        // full state with its first frame.
        let body = doc.borrow_and_update().clone();
        if !body.is_empty() {
            w.send(Kind::Document, &body).await?;
            set_peer(s, peer, |p| p.frames_sent += 1);
        }
        if std::mem::take(&mut dump) {
            for b in (s.full_dump)() {
                w.send(Kind::Entries, &b).await?;
                set_peer(s, peer, |p| p.batches_sent += 1);
            }
        }
        tokio::select! {
            r = doc.changed() => { if r.is_err() { return Ok(()); } }
            r = rx.recv() => match r {
                Ok(b) => {
                    w.send(Kind::Entries, &b).await?;
                    set_peer(s, peer, |p| p.batches_sent += 1);
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    set_peer(s, peer, |p| p.batches_lost += n);
                    dump = true;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
            },
            _ = tokio::time::sleep(HEARTBEAT) => {}
            // The acceptor never writes after its challenge: readable means it closed (it
            // refused our key, and logged why).
            r = w.c.read(&mut probe) => {
                return Err(match r {
                    Ok(0) | Err(_) => "the peer closed the connection (a key mismatch is logged there)".into(),
                    Ok(_) => "unexpected data from the peer".into(),
                });
            }
        }
    }
}

async fn accept(l: TcpListener, s: Arc<Shared>) {
    let admission = fulcrum_frame::Admission::new();
    loop {
        let (c, from) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "HA sync: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(pending) = admission.admit(from.ip()) else {
            if s.unauthenticated_refused.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(%from, "HA sync: too many connections waiting to authenticate; closed (counted in unauthenticated_refused; logged once)");
            }
            continue;
        };
        let s = s.clone();
        tokio::spawn(async move {
            if let Err(e) = receive(&s, c, pending).await {
                tracing::warn!(%from, error = %e, "HA sync: peer connection refused");
            }
        });
    }
}

async fn receive(
    s: &Shared,
    mut c: TcpStream,
    mut pending: fulcrum_frame::Pending,
) -> Result<(), String> {
    let nonce = CHANNEL.challenge(&mut c).await.map_err(|e| e.to_string())?;
    let mut last_seq = 0;
    let mut buf = Vec::new();
    loop {
        let first = pending.waiting();
        let wait = if first {
            fulcrum_frame::FIRST_FRAME_TIMEOUT.min(IDLE)
        } else {
            IDLE
        };
        let (seq, payload) = match CHANNEL
            .read_frame(&mut c, &s.keys, &nonce, last_seq, &mut buf, wait)
            .await
        {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(e) => {
                match e {
                    fulcrum_frame::ReadError::Frame(fulcrum_frame::FrameError::BadTag) => {
                        s.auth_failures.fetch_add(1, Ordering::Relaxed);
                    }
                    fulcrum_frame::ReadError::TimedOut if first => {
                        s.first_frame_timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
                return Err(e.to_string());
            }
        };
        pending.authenticated();
        last_seq = seq;
        if payload.len() < 9 {
            return Err("frame without a timestamp and kind".into());
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(&payload[..8]);
        let sent = u64::from_be_bytes(t);
        let kind = match payload[8] {
            b'D' => Kind::Document,
            b'E' => Kind::Entries,
            other => return Err(format!("unknown payload kind {other}")),
        };
        match (s.on_receive)(kind, sent, &payload[9..]) {
            Ok(()) => {
                s.frames_received.fetch_add(1, Ordering::Relaxed);
                let lag = now_ms().saturating_sub(sent) as f64;
                let mut lags = s.lags.lock();
                if lags.len() == 1000 {
                    lags.pop_front();
                }
                lags.push_back(lag);
            }
            Err(e) => {
                s.apply_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "HA sync: a peer's state was not applied");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_nonsense_is_skipped() {
        let flow = FlowEntry {
            vs: "web".into(),
            client: "198.18.0.2:40000".parse().expect("addr"),
            vip: "198.18.10.1:80".parse().expect("addr"),
            proto: 6,
            member: "198.18.1.11:8080".parse().expect("addr"),
            hop: Some(FlowHop {
                mac: [2, 0, 0, 0, 0, 1],
                interface: "eth0".into(),
            }),
            idle_ms: 0,
        };
        let dr = FlowEntry {
            hop: None,
            proto: 17,
            idle_ms: 1500,
            ..flow.clone()
        };
        let entries = vec![
            Entry::Persistence {
                table: "web".into(),
                key: "i0a".into(),
                member: "198.18.1.12:80".parse().expect("addr"),
            },
            Entry::Flow(flow.clone()),
            Entry::Flow(dr),
        ];
        assert_eq!(decode_entries(&encode_entries(&entries)), Ok((entries, 0)));
        // A flow of an ip VIP without ports (ESP) travels; one of such a protocol with ports
        // (below: ICMP, ports 1 and 80) does not.
        let esp = r#"[{"f":{"vs":"vpn","client":"198.18.0.2:0","vip":"198.18.10.1:0","proto":50,"member":"198.18.1.11:0"}}]"#;
        assert!(matches!(decode_entries(esp.as_bytes()), Ok((e, 0)) if e.len() == 1));
        let bad = [
            r#"{"f":{"vs":"web","client":"198.18.0.2:1","vip":"[2001:db8::1]:80","proto":6,"member":"198.18.1.11:80"}}"#,
            r#"{"f":{"vs":"web","client":"198.18.0.2:1","vip":"198.18.10.1:80","proto":1,"member":"198.18.1.11:80"}}"#,
            r#"{"f":{"vs":"","client":"198.18.0.2:1","vip":"198.18.10.1:80","proto":6,"member":"198.18.1.11:80"}}"#,
            r#"{"f":{"vs":"w","client":"198.18.0.2:1","vip":"198.18.10.1:80","proto":6,"member":"198.18.1.11:80","hop":{"mac":[1,2,3],"interface":"eth0"}}}"#,
            r#"{"f":{"vs":"w","client":"198.18.0.2:1","vip":"198.18.10.1:80","proto":6,"member":"198.18.1.11:80","hop":{"mac":[1,2,3,4,5,6],"interface":"../../etc"}}}"#,
            r#"{"f":7}"#,
            r#"{"t":"web","k":"i1","m":"nope"}"#,
            r#"{"x":1}"#,
            "7",
        ];
        let text = format!("[{}]", bad.join(","));
        assert_eq!(decode_entries(text.as_bytes()), Ok((Vec::new(), 9)));
        assert!(decode_entries(b"{\"f\":1}").is_err());
        assert!(decode_entries(b"\xff").is_err());
    }

    #[test]
    fn derived_secrets_depend_on_key_and_purpose() {
        let a = derive_secret("a-shared-secret-0123", "tables");
        assert_eq!(a, derive_secret("a-shared-secret-0123", "tables"));
        assert_ne!(a, derive_secret("a-shared-secret-0124", "tables"));
        assert_ne!(a, derive_secret("a-shared-secret-0123", "tickets"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn documents_reach_the_peer_and_a_wrong_key_is_refused() {
        let got = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let g = got.clone();
        let port = |l: std::net::TcpListener| l.local_addr().expect("addr");
        let (a, b, c) = (
            port(std::net::TcpListener::bind("127.0.0.1:0").expect("bind")),
            port(std::net::TcpListener::bind("127.0.0.1:0").expect("bind")),
            port(std::net::TcpListener::bind("127.0.0.1:0").expect("bind")),
        );
        let key = vec!["a-shared-secret-0123".to_string()];
        let on_b: OnReceive = Arc::new(move |k, _, d| {
            let mut v = vec![k.byte()];
            v.extend_from_slice(d);
            g.lock().push(v);
            Ok(())
        });
        let none: OnReceive = Arc::new(|_, _, _| Ok(()));
        let dump: FullDump = Arc::new(|| vec![b"dump".to_vec()]);
        let node_b = StateSync::start(b, &[], &key, on_b, dump.clone())
            .await
            .expect("b");
        let node_a = StateSync::start(a, &[b], &key, none.clone(), dump.clone())
            .await
            .expect("a");
        node_a.publish(b"{\"v\":1}".to_vec());
        let end = std::time::Instant::now() + Duration::from_secs(5);
        let has = |want: &[u8]| got.lock().iter().any(|d| d == want);
        // The document first, then the full dump of entries.
        while !has(b"Edump") && std::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            got.lock().first().map(Vec::as_slice),
            Some(&b"D{\"v\":1}"[..])
        );
        assert!(has(b"Edump"));
        node_a.publish(b"{\"v\":2}".to_vec());
        node_a.send_batch(b"one".to_vec());
        while !(has(b"D{\"v\":2}") && has(b"Eone")) && std::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(has(b"D{\"v\":2}") && has(b"Eone"));
        assert!(node_b.status().lag_ms.is_some());
        assert!(node_a.status().peers[0].connected);

        // A node with another key is refused and counted; nothing it sends is applied.
        let before = got.lock().len();
        let wrong = StateSync::start(c, &[b], &["not-the-same-secret".to_string()], none, dump)
            .await
            .expect("c");
        wrong.publish(b"{\"v\":666}".to_vec());
        while node_b.status().auth_failures == 0 && std::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(node_b.status().auth_failures >= 1);
        assert!(!got.lock()[before..].iter().any(|d| d == b"D{\"v\":666}"));

        // A reload takes b out of a's peers, then puts it back: a dials again, b gets the
        // document and the dump anew.
        node_a.set_peers(&[]);
        assert!(node_a.status().peers.is_empty());
        got.lock().clear();
        node_a.publish(b"{\"v\":3}".to_vec());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!has(b"D{\"v\":3}"), "no peer, nothing sent");
        node_a.set_peers(&[b]);
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while !(has(b"D{\"v\":3}") && has(b"Edump")) && std::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(has(b"D{\"v\":3}") && has(b"Edump"));
        assert_eq!(node_a.status().peers.len(), 1);
    }
}

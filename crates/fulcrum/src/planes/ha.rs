//! `[ha]`: runs a VRRP node (crate fulcrum-ha) whose priority follows the pools' health, serves
//! `GET /api/v1/ha` and the `fulcrum_ha_*` metrics, and resigns first on shutdown.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use fulcrum_admin::{Control, MetricFamilies, MetricKind};
use fulcrum_config::{Bgp, Config, ConfigError, Ha, HaMode};
use fulcrum_ha::machine::State;
use std::collections::HashMap;

use arc_swap::ArcSwap;
use fulcrum_balance::{PersistKey, PersistTable};
use fulcrum_ha::sync::{Entry, FlowEntry, FullDump, Kind, OnReceive, StateSync};
use fulcrum_ha::{Node, NodeConfig};
use serde_json::{json, Value};

use crate::planes::config_sync::{ConfigSync, PeerConfig};
use crate::planes::pair;

/// `[ha]` and `[bgp]` together (active_active): crate::planes::bgp.
pub fn checks(config: &Config) -> Vec<ConfigError> {
    crate::planes::bgp::checks(config)
}

/// The keys of `[ha]` that differ between two configurations (`sync` split into its own keys,
/// so a message can name the one that changed).
fn changed_keys(n: &Ha, r: &Ha) -> Vec<&'static str> {
    let sync = |f: fn(&fulcrum_config::HaSync, &fulcrum_config::HaSync) -> bool| match (
        &n.sync, &r.sync,
    ) {
        (Some(a), Some(b)) => f(a, b),
        (None, None) => false,
        _ => true,
    };
    [
        ("mode", n.mode != r.mode),
        ("node", n.node != r.node),
        ("interface", n.interface != r.interface),
        ("vrid", n.vrid != r.vrid),
        ("vrrp_version", n.vrrp_version != r.vrrp_version),
        ("priority", n.priority != r.priority),
        ("advert_interval", n.advert_interval != r.advert_interval),
        ("preempt", n.preempt != r.preempt),
        ("preempt_delay", n.preempt_delay != r.preempt_delay),
        ("peers", n.peers != r.peers),
        ("vips", n.vips != r.vips),
        ("track", n.track != r.track),
        ("track_weight", n.track_weight != r.track_weight),
        ("garp_repeat", n.garp_repeat != r.garp_repeat),
        ("garp_interval", n.garp_interval != r.garp_interval),
        ("sync", n.sync.is_some() != r.sync.is_some()),
        ("sync.listen", sync(|a, b| a.listen != b.listen)),
        ("sync.key", sync(|a, b| a.key != b.key)),
        ("sync.peers", sync(|a, b| a.peers != b.peers)),
        ("config_sync", n.config_sync != r.config_sync),
        ("conntrack_sync", n.conntrack_sync != r.conntrack_sync),
    ]
    .into_iter()
    .filter_map(|(k, changed)| changed.then_some(k))
    .collect()
}

/// The `[ha]` keys a reload applies to a running VRRP node; every other key (and `sync.peers`
/// when `ha.sync` runs, applied by the sync channel) waits for a restart.
const LIVE_KEYS: [&str; 7] = [
    "priority",
    "advert_interval",
    "preempt",
    "preempt_delay",
    "track_weight",
    "garp_repeat",
    "garp_interval",
];

/// A changed key's running and new value for the log (`sync.key` stays unsaid).
fn values(key: &str, n: &Ha, r: &Ha) -> (String, String) {
    let f = |h: &Ha| -> String {
        match key {
            "mode" => format!("{:?}", h.mode),
            "node" => format!("{:?}", h.node),
            "interface" => h.interface.clone(),
            "vrid" => h.vrid.to_string(),
            "vrrp_version" => h.vrrp_version.to_string(),
            "advert_interval" => format!("{:?}", h.advert_interval),
            "peers" => format!("{:?}", h.peers),
            "vips" => h
                .vips
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            "track" => h.track.join(", "),
            "conntrack_sync" => format!("{:?}", h.conntrack_sync),
            "sync" => if h.sync.is_some() { "set" } else { "absent" }.to_string(),
            "sync.listen" => h
                .sync
                .as_ref()
                .map(|s| s.listen.to_string())
                .unwrap_or_default(),
            "sync.peers" => h
                .sync
                .as_ref()
                .map(|s| format!("{:?}", s.peers))
                .unwrap_or_default(),
            _ => "(not shown)".to_string(),
        }
    };
    (f(r), f(n))
}

#[derive(Default)]
pub struct HaPlane {
    node: OnceLock<Node>,
    /// Shared with the receive closure, which republishes a state it took over.
    sync: Arc<OnceLock<StateSync>>,
    node_name: OnceLock<String>,
    /// The services' persistence tables (by virtual service name), current after every apply.
    tables: Arc<ArcSwap<HashMap<String, Arc<PersistTable>>>>,
    /// New persistence entries and flows on their way to the peers (bounded: see `QUEUE`).
    entries: OnceLock<tokio::sync::mpsc::Sender<Outgoing>>,
    /// Entries dropped because the queue was full.
    entries_dropped: Arc<AtomicU64>,
    /// Entries sent and received, and lags, by table.
    per_table: PerTable,
    /// Whether the last peer document had the same pools fingerprint as this node.
    peer_config_matches: Arc<parking_lot::Mutex<Option<bool>>>,
    /// Unix ms of the last operator change of member or site state here, or of the peer's
    /// state this node took over: `ha.sync` keeps the newest.
    changed_at: Arc<AtomicU64>,
    /// Active-active: the BGP announcer (`[bgp]`, crate::planes::bgp) instead of a VRRP node.
    bgp: OnceLock<fulcrum_ha::bgp::Announcer>,
    /// The connection tables of nat/dr/tunnel services (crate::planes::xdp), whose flows travel in
    /// the same stream as persistence entries.
    flows: OnceLock<Arc<crate::planes::xdp::FlowSync>>,
    /// `[ha] config_sync`: the shared part of the configuration file kept the same on both nodes.
    config_sync: Arc<OnceLock<Arc<ConfigSync>>>,
    /// Writes a peer's text through the configuration API's write path, for a version taken or adopted.
    write_config: OnceLock<WriteConfig>,
}

/// Writes a whole configuration text through the configuration API's write path.
type WriteConfig = Arc<dyn Fn(&str) -> Result<u64, Vec<String>> + Send + Sync>;

/// What a reload will change in the HA node, prepared before the reload is applied.
#[derive(Default)]
pub struct HaReload {
    node: Option<NodeConfig>,
    peers: Option<Vec<std::net::SocketAddr>>,
    applied: Vec<&'static str>,
    restart: Vec<(&'static str, String, String)>,
    notes: Vec<String>,
}

/// What the sync stream carries, in one bounded queue.
enum Outgoing {
    /// A persistence entry: (service table, key, member).
    Persist(Arc<str>, PersistKey, std::net::SocketAddr),
    /// A connection of an in-kernel service.
    Flow(FlowEntry),
}

/// New persistence entries and flows waiting to be sent; beyond this the newest are dropped
/// and counted.
const QUEUE: usize = 65_536;
/// Entries per frame.
const BATCH: usize = 1000;

/// The wire form of a persistence key: `i` and a masked address, or `h` and the keyed hash of
/// client bytes (meaningful to the peer only when both hash under the secret derived from the
/// sync key: see `PersistTable::with_key`; the feed and the dump send no others).
fn key_text(k: &PersistKey) -> String {
    match k {
        PersistKey::Ip(v) => format!("i{:032x}", v.get()),
        PersistKey::Hashed(v) => format!("h{:032x}", v.get()),
    }
}

fn key_parse(s: &str) -> Option<PersistKey> {
    let (kind, hex) = s.split_at_checked(1)?;
    if hex.is_empty() || hex.len() > 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let v = u128::from_str_radix(hex, 16).ok()?;
    match kind {
        "i" => Some(PersistKey::Ip(v.into())),
        "h" => Some(PersistKey::Hashed(v.into())),
        _ => None,
    }
}

/// Whether a peer can use this table's entry for `k`.
fn portable(table: &PersistTable, k: &PersistKey) -> bool {
    matches!(k, PersistKey::Ip(_)) || table.shared_hash()
}

fn batch(entries: &[Outgoing]) -> Vec<u8> {
    let v: Vec<Entry> = entries
        .iter()
        .map(|e| match e {
            Outgoing::Persist(t, k, m) => Entry::Persistence {
                table: t.to_string(),
                key: key_text(k),
                member: *m,
            },
            Outgoing::Flow(f) => Entry::Flow(f.clone()),
        })
        .collect();
    fulcrum_ha::sync::encode_entries(&v)
}

/// Per table (by service name): entries sent and received, and the lag of received batches.
#[derive(Default)]
struct TableCounters {
    sent: u64,
    received: u64,
    /// Lags (ms) of the last batches that carried entries of this table.
    lags: std::collections::VecDeque<f64>,
}

type PerTable = Arc<parking_lot::Mutex<std::collections::BTreeMap<Arc<str>, TableCounters>>>;
/// Batches whose lag a table remembers.
const LAG_WINDOW: usize = 256;

/// Stores a peer's batch of persistence entries in the tables of the same services; its flows
/// go to `flows` (the connection tables).
fn apply_entries(
    bytes: &[u8],
    tables: &HashMap<String, Arc<PersistTable>>,
    flows: &mut Vec<FlowEntry>,
) -> Result<HashMap<String, u64>, String> {
    let (entries, _) = fulcrum_ha::sync::decode_entries(bytes)?;
    let mut n: HashMap<String, u64> = HashMap::new();
    for e in entries {
        let (table, key, m) = match e {
            Entry::Flow(f) => {
                flows.push(f);
                continue;
            }
            Entry::Persistence { table, key, member } => (table, key, member),
        };
        let (Some((name, t)), Some(k)) = (tables.get_key_value(&table), key_parse(&key)) else {
            continue;
        };
        // A hash under another key (this node has no ha.sync secret for it) finds nothing.
        if !portable(t, &k) {
            continue;
        }
        t.insert_synced(k, m);
        *n.entry(name.clone()).or_default() += 1;
    }
    Ok(n)
}

/// A fingerprint of the pools' configuration (FNV-1a over its debug text): two nodes of a pair
/// should serve the same pools, and `ha.sync` reports when they do not. Stable between two
/// processes of the same build; nodes running different builds may report a difference.
fn pools_hash(control: &dyn Control) -> String {
    let pools = control.pools();
    let configs: Vec<&fulcrum_config::Pool> = pools.iter().map(|p| &p.config).collect();
    let text = format!("{configs:?}");
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The document `ha.sync` sends: this node's member and site overrides, when they last
/// changed, and the fingerprint of its pools; with `config_sync`, its configuration.
fn document(
    node: &str,
    changed_at_ms: u64,
    control: &dyn Control,
    config: Option<&ConfigSync>,
) -> Vec<u8> {
    let mut doc = json!({
        "node": node,
        "changed_at_ms": changed_at_ms,
        "pools_hash": pools_hash(control),
        "state": crate::state_file::current(control),
    });
    if let Some(cs) = config {
        doc["config"] = cs.document();
    }
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// The receiving side of `ha.sync`: what it needs of the plane, held apart from it since it
/// runs in the sync tasks.
struct SyncReceiver<C> {
    /// This node's name, in the document it republishes.
    me: String,
    control: Weak<C>,
    state_file: Option<PathBuf>,
    changed_at: Arc<AtomicU64>,
    republish: Arc<OnceLock<StateSync>>,
    peer_config_matches: Arc<parking_lot::Mutex<Option<bool>>>,
    tables: Arc<ArcSwap<HashMap<String, Arc<PersistTable>>>>,
    per_table: PerTable,
    flow_sync: Option<Arc<crate::planes::xdp::FlowSync>>,
    config_sync: Arc<OnceLock<Arc<ConfigSync>>>,
    write_config: Option<WriteConfig>,
}

impl<C: Control> SyncReceiver<C> {
    fn receive(&self, kind: Kind, sent_ms: u64, bytes: &[u8]) -> Result<(), String> {
        if kind == Kind::Entries {
            self.take_entries(sent_ms, bytes)
        } else {
            self.take_document(bytes)
        }
    }

    /// A batch of the peer's persistence entries and flows, sent at `sent_ms`.
    fn take_entries(&self, sent_ms: u64, bytes: &[u8]) -> Result<(), String> {
        let mut flows = Vec::new();
        let got = apply_entries(bytes, &self.tables.load(), &mut flows)?;
        if let Some(fs) = &self.flow_sync {
            fs.apply(&flows, sent_ms);
        }
        let lag = fulcrum_ha::sync::now_ms().saturating_sub(sent_ms) as f64;
        let mut pt = self.per_table.lock();
        for (name, n) in got {
            let c = pt.entry(Arc::from(name.as_str())).or_default();
            c.received += n;
            if c.lags.len() == LAG_WINDOW {
                c.lags.pop_front();
            }
            c.lags.push_back(lag);
        }
        Ok(())
    }

    /// The peer's document: its configuration (config_sync), its pools fingerprint, and its
    /// member and site states, taken over when newer than this node's.
    fn take_document(&self, bytes: &[u8]) -> Result<(), String> {
        let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        let theirs = doc["changed_at_ms"].as_u64().ok_or("no changed_at_ms")?;
        let Some(control) = self.control.upgrade() else {
            return Ok(());
        };
        if let (Some(cs), Some(write)) = (self.config_sync.get(), &self.write_config) {
            if !doc["config"].is_null() {
                if let Some(peer) = cs.received(&doc["config"])? {
                    take_peer_config(cs.clone(), peer, write.clone());
                }
            }
        }
        let same = doc["pools_hash"].as_str() == Some(pools_hash(control.as_ref()).as_str());
        if self.peer_config_matches.lock().replace(same) != Some(same) && !same {
            tracing::warn!(peer = %doc["node"], "HA sync: the peer's pools differ from this node's configuration (pools_hash); a failover changes what is served");
        }
        if theirs <= self.changed_at.load(Ordering::Acquire) {
            return Ok(());
        }
        self.changed_at.store(theirs, Ordering::Release);
        let n = crate::state_file::apply_remote(&doc["state"], control.as_ref());
        tracing::info!(peer = %doc["node"], changes = n, "HA sync: took over the peer's newer member and site states");
        if let Some(path) = &self.state_file {
            crate::state_file::save(control.as_ref(), path, theirs);
        }
        // This node's document now says the same, so a peer that restarts gets it back.
        if let Some(sync) = self.republish.get() {
            let cs = self.config_sync.get().map(Arc::as_ref);
            sync.publish(document(&self.me, theirs, control.as_ref(), cs));
        }
        Ok(())
    }
}
/// Takes a peer's configuration on a blocking thread (a reload waits on the planes), once at a
/// time (`ConfigSync::received` offers nothing while a take runs).
fn take_peer_config(cs: Arc<ConfigSync>, peer: PeerConfig, write: WriteConfig) {
    tokio::task::spawn_blocking(move || {
        let mut next = Some(peer);
        // Bounded: each round takes a newer version than the last.
        for _ in 0..16 {
            let Some(peer) = next.take() else { break };
            let _ = cs.take(&peer, |text| write(text));
            next = cs.still_behind();
        }
    });
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "fulcrum".into())
}

fn node_config(ha: &Ha) -> NodeConfig {
    NodeConfig {
        node: ha.node.clone().unwrap_or_else(host_name),
        interface: ha.interface.clone(),
        vrid: ha.vrid,
        vrrp_version: ha.vrrp_version,
        priority: ha.priority,
        advert_interval: ha.advert_interval,
        preempt: ha.preempt,
        preempt_delay: ha.preempt_delay,
        peers: ha.peers.clone(),
        vips: ha
            .vips
            .iter()
            .map(|v| fulcrum_ha::Vip {
                net: v.net,
                interface: v.interface.clone(),
            })
            .collect(),
        track_weight: ha.track_weight,
        garp_repeat: ha.garp_repeat,
        garp_interval: ha.garp_interval,
        maintenance: false,
        conntrack: ha
            .conntrack_sync
            .as_ref()
            .map(|c| fulcrum_ha::conntrack::ConntrackConfig {
                interface: c.interface.clone(),
                peer: c.peer,
                port: c.port,
            }),
    }
}

impl HaPlane {
    /// Starts the node when the config has `[ha]`. `control` gives the health view: the node
    /// can serve while every tracked pool (`ha.track`, or every pool) has a member that is up.
    pub fn start<C: Control>(&self, ha: Option<&Ha>, maintenance: bool, control: Weak<C>) {
        // Active-active runs no VRRP: `start_bgp` announces the VIPs instead.
        let Some(ha) = ha.filter(|h| h.mode != HaMode::ActiveActive) else {
            return;
        };
        if maintenance {
            tracing::warn!("HA: starting in maintenance (saved in admin.state_file); PUT /api/v1/ha/maintenance {{\"maintenance\": false}} ends it");
        }
        if ha.sync.is_some() {
            tracing::info!("ha.sync: member and site states set through the API, persistence tables and the connection tables of nat/dr/tunnel services are shared; the table hash key, the persistence-cookie secret and TLS ticket keys are derived from ha.sync.key");
        }
        let track = ha.track.clone();
        let health = Arc::new(move || {
            let Some(c) = control.upgrade() else {
                return true;
            };
            c.pools()
                .iter()
                .filter(|p| track.is_empty() || track.iter().any(|t| *t == *p.name))
                .filter(|p| !p.members().is_empty())
                .all(|p| p.members().iter().any(|m| m.health.is_up()))
        });
        let mut cfg = node_config(ha);
        cfg.maintenance = maintenance;
        let _ = self.node.set(Node::start(cfg, health));
    }

    /// At a reload, before anything is applied: the VRRP node will take what can change while
    /// it runs (priority, advert_interval, preempt, preempt_delay, track_weight, garp_repeat,
    /// garp_interval), the sync channel its new `peers`; every other changed key is reported
    /// and the running value kept in the new configuration, so it says what runs and the
    /// secrets derived from `ha.sync.key` follow the key the sync channel uses. Nothing changes
    /// until `commit_reload`: a reload refused by a later step leaves the node as it was.
    pub fn prepare_reload(&self, new: &mut Config, running: &Config) -> HaReload {
        let mut out = HaReload::default();
        if new.ha == running.ha {
            return out;
        }
        let (Some(n), Some(r)) = (&new.ha, &running.ha) else {
            let what = if new.ha.is_some() { "added" } else { "removed" };
            out.notes.push(format!(
                "[ha] {what}: takes effect at the next restart; this node runs on as it started"
            ));
            new.ha = running.ha.clone();
            return out;
        };
        let changed = changed_keys(n, r);
        let mut kept = (*r).clone();
        if self.node.get().is_some() {
            out.node = Some(node_config(n));
            kept.priority = n.priority;
            if n.vrrp_version == r.vrrp_version {
                kept.advert_interval = n.advert_interval;
            }
            kept.preempt = n.preempt;
            kept.preempt_delay = n.preempt_delay;
            kept.track_weight = n.track_weight;
            kept.garp_repeat = n.garp_repeat;
            kept.garp_interval = n.garp_interval;
            out.applied = changed
                .iter()
                .copied()
                .filter(|k| LIVE_KEYS.contains(k))
                .filter(|k| *k != "advert_interval" || n.vrrp_version == r.vrrp_version)
                .collect();
        }
        // ha.sync.peers: new peers are dialled, removed ones let go; listen and key stay.
        if let (Some(_), Some(ns), Some(rs)) = (self.sync.get(), &n.sync, &mut kept.sync) {
            if ns.peers != rs.peers {
                out.peers = Some(ns.peers.clone());
                rs.peers = ns.peers.clone();
                out.applied.push("sync.peers");
            }
        }
        for key in changed.iter().filter(|k| !out.applied.contains(k)) {
            let (from, to) = values(key, n, r);
            out.restart.push((key, from, to));
        }
        new.ha = Some(kept);
        out
    }

    /// The reload was applied: the VRRP node and the sync channel take their part of it.
    pub fn commit_reload(&self, change: HaReload) {
        for note in &change.notes {
            tracing::warn!("{note}");
        }
        if let (Some(node), Some(cfg)) = (self.node.get(), &change.node) {
            node.reconfigure(cfg);
        }
        if let (Some(sync), Some(peers)) = (self.sync.get(), &change.peers) {
            sync.set_peers(peers);
        }
        if !change.applied.is_empty() {
            tracing::info!(applied = %change.applied.join(", "), "[ha] changes applied by the reload");
        }
        for (key, from, to) in &change.restart {
            tracing::warn!(
                key = %format!("ha.{key}"),
                running = %from,
                configured = %to,
                "ha.{key} changed: it takes effect at the next restart; this node runs on with the running value"
            );
        }
    }

    /// Starts announcing when the config has `[bgp]` (active-active: no VRRP node runs).
    pub fn start_bgp<C: Control>(
        &self,
        bgp: Option<&Bgp>,
        ha: Option<&Ha>,
        maintenance: bool,
        control: Weak<C>,
    ) {
        let Some(bgp) = bgp else { return };
        let node = ha.and_then(|h| h.node.clone()).unwrap_or_else(host_name);
        let _ = self.node_name.set(node);
        let _ = self
            .bgp
            .set(crate::planes::bgp::start(bgp, maintenance, control));
    }

    /// The XDP plane's connection tables, synchronised by `ha.sync` (set once, at assembly).
    pub fn set_flow_sync(&self, flows: Arc<crate::planes::xdp::FlowSync>) {
        let _ = self.flows.set(flows);
    }

    /// An operator change here: newer than anything this node has seen, even within one
    /// millisecond of the last (two API calls in a row must both reach the peer).
    pub fn operator_changed(&self) {
        let now = fulcrum_ha::sync::now_ms();
        let _ = self
            .changed_at
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                Some(now.max(old + 1))
            });
    }

    /// After every apply: the services' persistence tables (new ones after a reload), whose
    /// new entries `ha.sync` streams to the peers.
    pub fn attach_tables(&self, tables: &HashMap<String, Arc<PersistTable>>) {
        self.tables.store(Arc::new(tables.clone()));
        self.attach_feeds();
    }

    fn attach_feeds(&self) {
        let Some(tx) = self.entries.get() else { return };
        for (name, table) in self.tables.load().iter() {
            let (tx, name, dropped, shared) = (
                tx.clone(),
                Arc::<str>::from(name.as_str()),
                self.entries_dropped.clone(),
                table.shared_hash(),
            );
            table.set_feed(Some(Box::new(move |k: &PersistKey, m| {
                if !shared && matches!(k, PersistKey::Hashed(_)) {
                    return;
                }
                if tx
                    .try_send(Outgoing::Persist(name.clone(), k.clone(), m))
                    .is_err()
                {
                    dropped.fetch_add(1, Ordering::Relaxed);
                }
            })));
        }
    }

    pub fn changed_at(&self) -> u64 {
        self.changed_at.load(Ordering::Acquire)
    }

    /// Sends this node's state to the peers (`ha.sync`).
    pub fn publish(&self, control: &dyn Control) {
        if let (Some(sync), Some(node)) = (self.sync.get(), self.node_name.get()) {
            sync.publish(document(
                node,
                self.changed_at(),
                control,
                self.config_sync.get().map(Arc::as_ref),
            ));
        }
    }

    /// After every configuration this node applied: `config_sync` records the change (the
    /// publish that follows every apply sends it).
    pub fn config_applied(&self) {
        if let Some(cs) = self.config_sync.get() {
            cs.applied();
        }
    }

    /// `PUT /api/v1/ha/config_sync` `{"adopt": "peer" | "local"}`: settles a divergence.
    fn config_sync_api(&self, body: &[u8]) -> (u16, Value) {
        let Some(cs) = self.config_sync.get() else {
            return (
                404,
                json!({ "error": "configuration sync is not configured ([ha] config_sync)" }),
            );
        };
        let side = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v["adopt"].as_str().map(str::to_string));
        match side.as_deref() {
            // The new lineage reaches the peer with the document App publishes after every
            // successful mutating call of a plane (App::plane_api).
            Some("local") => match cs.keep_local() {
                Ok(()) => (200, cs.status()),
                Err(e) => (409, json!({ "error": e })),
            },
            Some("peer") => {
                let (Some(peer), Some(write)) = (cs.peer(), self.write_config.get()) else {
                    return (
                        409,
                        json!({ "error": "no configuration from the peer yet" }),
                    );
                };
                // A reload blocks on the planes: off this worker's other tasks meanwhile.
                match tokio::task::block_in_place(|| cs.take(&peer, |text| write(text))) {
                    Ok(_) => (200, cs.status()),
                    Err(errors) => (400, json!({ "errors": errors })),
                }
            }
            _ => (
                400,
                json!({ "error": "expected {\"adopt\": \"peer\"} or {\"adopt\": \"local\"}" }),
            ),
        }
    }

    /// Starts `ha.sync`: listens, dials the peers, and takes over a peer's state when it is
    /// newer than this node's (`changed_at_ms`, from the state file at start).
    pub async fn start_sync<C: Control>(
        &self,
        ha: Option<&Ha>,
        changed_at_ms: u64,
        state_file: Option<PathBuf>,
        config_file: Option<&std::path::Path>,
        control: Weak<C>,
    ) -> Result<(), String> {
        let Some((ha, sync)) = ha.and_then(|h| h.sync.as_ref().map(|s| (h, s))) else {
            return Ok(());
        };
        self.changed_at.store(changed_at_ms, Ordering::Release);
        let node = ha.node.clone().unwrap_or_else(host_name);
        let _ = self.node_name.set(node.clone());
        if ha.config_sync {
            self.open_config_sync(&node, config_file, control.clone())?;
        }
        let receiver = SyncReceiver {
            me: node,
            control: control.clone(),
            state_file,
            changed_at: self.changed_at.clone(),
            republish: self.sync.clone(),
            peer_config_matches: self.peer_config_matches.clone(),
            tables: self.tables.clone(),
            per_table: self.per_table.clone(),
            flow_sync: self.flows.get().cloned(),
            config_sync: self.config_sync.clone(),
            write_config: self.write_config.get().cloned(),
        };
        let on_receive: OnReceive = Arc::new(move |kind: Kind, sent_ms: u64, bytes: &[u8]| {
            receiver.receive(kind, sent_ms, bytes)
        });
        let s = StateSync::start(
            sync.listen,
            &sync.peers,
            std::slice::from_ref(&sync.key),
            on_receive,
            self.full_dump(),
        )
        .await
        .map_err(|e| format!("cannot listen on {} (ha.sync.listen): {e}", sync.listen))?;
        let _ = self.sync.set(s);
        self.start_sending();
        if let Some(c) = control.upgrade() {
            self.publish(c.as_ref());
        }
        tracing::info!(listen = %sync.listen, peers = sync.peers.len(), "HA sync: running (member and site states set through the API, persistence tables)");
        Ok(())
    }

    /// `[ha] config_sync`: opens its record beside `config_file` and sets the path a peer's
    /// configuration is written through (the configuration API's, as the peer's author).
    fn open_config_sync<C: Control>(
        &self,
        node: &str,
        config_file: Option<&std::path::Path>,
        control: Weak<C>,
    ) -> Result<(), String> {
        let file = config_file.ok_or(
            "[ha] config_sync needs a configuration file (it writes the peer's changes into it)",
        )?;
        let cs = ConfigSync::open(node, file).map_err(|e| format!("config_sync: {e}"))?;
        let _ = self.config_sync.set(Arc::new(cs));
        let _ = self.write_config.set(Arc::new(move |text: &str| {
            let Some(c) = control.upgrade() else {
                return Err(vec!["shutting down".into()]);
            };
            let author = fulcrum_admin::Author {
                who: "peer".into(),
                from: "config_sync".into(),
            };
            match c.config_write(text, None, false, author) {
                Ok(w) => Ok(w.generation.unwrap_or_else(|| c.generation())),
                Err(fulcrum_admin::ConfigRefusal::Invalid(errors)) => Err(errors),
                Err(fulcrum_admin::ConfigRefusal::Unavailable(e)) => Err(vec![e]),
                Err(fulcrum_admin::ConfigRefusal::Stale { current }) => {
                    Err(vec![format!("version {current} changed meanwhile")])
                }
            }
        }));
        Ok(())
    }

    /// Every persistence entry and flow as batches, for a peer that (re)connects or fell
    /// behind.
    fn full_dump(&self) -> FullDump {
        let all = self.tables.clone();
        let dump_flows = self.flows.get().cloned();
        Arc::new(move || {
            let mut out = Vec::new();
            // Services sharing one table (a RADIUS profile) send it once.
            let mut seen = std::collections::HashSet::new();
            for (name, table) in all.load().iter() {
                if !seen.insert(Arc::as_ptr(table)) {
                    continue;
                }
                let name = Arc::<str>::from(name.as_str());
                let entries: Vec<_> = table
                    .entries()
                    .into_iter()
                    .filter(|(k, _)| portable(table, k))
                    .map(|(k, m)| Outgoing::Persist(name.clone(), k, m))
                    .collect();
                out.extend(entries.chunks(BATCH).map(batch));
            }
            // The connection tables of nat/dr/tunnel services, walked now.
            if let Some(fs) = &dump_flows {
                let flows: Vec<Outgoing> = fs.dump(None).into_iter().map(Outgoing::Flow).collect();
                out.extend(flows.chunks(BATCH).map(batch));
            }
            out
        })
    }

    /// New persistence entries and flows: a bounded queue, drained in batches by one task.
    fn start_sending(&self) {
        let (tx, mut rx) = tokio::sync::mpsc::channel(QUEUE);
        if let Some(fs) = self.flows.get() {
            // A full queue loses the flow (counted in `sync.flows.lost`).
            let tx = tx.clone();
            fs.set_sink(Box::new(move |f| tx.try_send(Outgoing::Flow(f)).is_ok()));
        }
        let _ = self.entries.set(tx);
        self.attach_feeds();
        let sender = self.sync.clone();
        let per_table = self.per_table.clone();
        tokio::spawn(async move {
            let mut buf: Vec<Outgoing> = Vec::with_capacity(BATCH);
            while rx.recv_many(&mut buf, BATCH).await > 0 {
                if let Some(s) = sender.get() {
                    s.send_batch(batch(&buf));
                    let mut pt = per_table.lock();
                    for e in &buf {
                        if let Outgoing::Persist(name, _, _) = e {
                            pt.entry(name.clone()).or_default().sent += 1;
                        }
                    }
                }
                buf.clear();
            }
        });
    }

    /// Resigns mastership and removes the VIPs (before connections drain, so the peer takes
    /// over at once).
    pub async fn shutdown(&self) {
        if let Some(b) = self.bgp.get() {
            b.shutdown().await;
        }
        if let Some(n) = self.node.get() {
            n.shutdown().await;
        }
    }

    /// `/api/v1/ha`: `GET` the node's status; `PUT maintenance` with `{"maintenance": bool}`.
    pub fn api(&self, method: &str, path: &[&str], body: &[u8]) -> (u16, Value) {
        if let ("PUT", ["config_sync"]) = (method, path) {
            return self.config_sync_api(body);
        }
        let (code, mut answer) = self.node_api(method, path, body);
        if let (200, "GET", [], Some(cs)) = (code, method, path, self.config_sync.get()) {
            answer["config_sync"] = cs.status();
        }
        (code, answer)
    }

    fn node_api(&self, method: &str, path: &[&str], body: &[u8]) -> (u16, Value) {
        if let Some(b) = self.bgp.get() {
            let node = self.node_name.get().map_or("", String::as_str);
            return crate::planes::bgp::api(b, node, method, path, body);
        }
        let Some(n) = self.node.get() else {
            return (
                404,
                json!({ "error": "high availability is not configured ([ha])" }),
            );
        };
        let status = || {
            serde_json::to_value(n.status()).unwrap_or_else(|e| json!({ "error": e.to_string() }))
        };
        match (method, path) {
            ("GET", []) => {
                let mut s = status();
                if let Some(sync) = self.sync.get() {
                    let st = sync.status();
                    s["sync_lag_ms"] = json!(st.lag_ms);
                    s["sync"] = serde_json::to_value(st).unwrap_or_default();
                    s["sync"]["peer_config_matches"] = json!(*self.peer_config_matches.lock());
                    s["sync"]["entries_dropped"] =
                        json!(self.entries_dropped.load(Ordering::Relaxed));
                    s["sync"]["tables"] = self.table_status();
                    if let Some(fs) = self.flows.get() {
                        s["sync"]["flows"] = fs.status();
                    }
                }
                (200, s)
            }
            ("PUT", ["maintenance"]) => match pair::maintenance_body(body) {
                Ok(on) => {
                    // The node's thread applies it within a moment (a master resigns at once).
                    n.set_maintenance(on);
                    (200, status())
                }
                Err(e) => e,
            },
            _ => pair::other_route(method, path),
        }
    }

    /// `sync.tables` of `GET /api/v1/ha`: per persistence table (by service), what travels.
    fn table_status(&self) -> Value {
        let tables = self.tables.load();
        let pt = self.per_table.lock();
        let mut names: std::collections::BTreeSet<&str> =
            tables.keys().map(String::as_str).collect();
        names.extend(pt.keys().map(|k| &**k));
        names
            .into_iter()
            .map(|name| {
                let c = pt.get(name);
                let t = tables.get(name);
                json!({
                    "service": name,
                    "entries": t.map(|t| t.len()),
                    // Byte keys (header, cookie_passive, RADIUS) hash under the shared secret.
                    "shared_hash": t.map(|t| t.shared_hash()),
                    "entries_sent": c.map_or(0, |c| c.sent),
                    "entries_received": c.map_or(0, |c| c.received),
                    "lag_ms": c.and_then(|c| c.lags.back().copied()),
                    "lag_max_ms": c.and_then(|c| c.lags.iter().copied().reduce(f64::max)),
                })
            })
            .collect()
    }

    pub fn metrics(&self, w: &mut MetricFamilies) {
        if let Some(b) = self.bgp.get() {
            crate::planes::bgp::metrics(b, w);
        }
        let Some(n) = self.node.get() else { return };
        let s = n.status();
        let vrid = s.vrid.to_string();
        let l = [("vrid", vrid.as_str())];
        let mut samples = w.gauge(
            "fulcrum_ha_state",
            "VRRP state of this node: 1 for the current one.",
        );
        for st in [State::Init, State::Backup, State::Master, State::Fault] {
            let v = s.role == st;
            samples.sample(&[("vrid", &vrid), ("state", st.as_str())], v);
        }
        let mut samples = w.gauge(
            "fulcrum_ha_priority",
            "Priority advertised now (lowered or 0 while tracked pools are down).",
        );
        samples.sample(&l, f64::from(s.priority));
        counters(
            w,
            &l,
            [
                (
                    "fulcrum_ha_transitions_total",
                    "VRRP state changes.",
                    s.transitions,
                ),
                (
                    "fulcrum_ha_became_master_total",
                    "Times this node became master.",
                    s.became_master,
                ),
                (
                    "fulcrum_ha_adverts_sent_total",
                    "VRRP advertisements sent.",
                    s.adverts.sent,
                ),
                (
                    "fulcrum_ha_adverts_received_total",
                    "Valid VRRP advertisements received for this VRID.",
                    s.adverts.received,
                ),
            ],
        );
        let mut samples = w.counter(
            "fulcrum_ha_adverts_dropped_total",
            "Received protocol-112 packets dropped, by reason.",
        );
        for (reason, v) in [
            ("truncated", s.dropped.truncated),
            ("not_vrrp", s.dropped.not_vrrp),
            ("ttl", s.dropped.ttl),
            ("version", s.dropped.version),
            ("checksum", s.dropped.checksum),
            ("not_a_peer", s.dropped.not_a_peer),
        ] {
            samples.sample(&[("vrid", &vrid), ("reason", reason)], v);
        }
        counters(
            w,
            &l,
            [
                (
                    "fulcrum_ha_address_mismatch_total",
                    "Adverts for this VRID listing other addresses than ha.vips (a misconfiguration).",
                    s.adverts.address_mismatch,
                ),
                (
                    "fulcrum_ha_garps_sent_total",
                    "Gratuitous ARPs sent for the VIPs.",
                    s.garps_sent,
                ),
            ],
        );
        if let Some(ct) = &s.conntrack_sync {
            conntrack_metrics(ct, &l, w);
        }
        if let Some(sync) = self.sync.get() {
            self.sync_metrics(sync, &vrid, w);
        }
    }

    /// The `fulcrum_ha_sync_*` families (`ha.sync`).
    fn sync_metrics(&self, sync: &StateSync, vrid: &str, w: &mut MetricFamilies) {
        let l = [("vrid", vrid)];
        let st = sync.status();
        counters(
            w,
            &l,
            [
                (
                    "fulcrum_ha_sync_frames_received_total",
                    "State sync documents received from peers and applied.",
                    st.frames_received,
                ),
                (
                    "fulcrum_ha_sync_auth_failures_total",
                    "State sync connections refused: a frame failed authentication.",
                    st.auth_failures,
                ),
                (
                    "fulcrum_ha_sync_unauthenticated_refused_total",
                    "State sync connections closed at accept: too many were waiting to authenticate (from their source, or in all).",
                    st.unauthenticated_refused,
                ),
                (
                    "fulcrum_ha_sync_first_frame_timeouts_total",
                    "State sync connections closed because their first frame did not come in time.",
                    st.first_frame_timeouts,
                ),
            ],
        );
        let mut samples = w.gauge(
            "fulcrum_ha_sync_lag_seconds",
            "Sync lag of the last document: from the peer's sending to this node's applying.",
        );
        samples.sample(&l, st.lag_ms.unwrap_or(0.0) / 1000.0);
        let mut samples = w.gauge(
            "fulcrum_ha_sync_config_mismatch",
            "1 when the peer's pools differ from this node's (pools_hash).",
        );
        let mismatch = *self.peer_config_matches.lock() == Some(false);
        samples.sample(&l, mismatch);
        if let Some(fs) = self.flows.get() {
            let mut samples = w.counter(
                "fulcrum_ha_sync_flows_total",
                "Connections of nat/dr/tunnel services synchronised, by event: sent to the peers, lost (a full queue or ring buffer), received, applied to this node's tables, dropped (unknown service, member or interface).",
            );
            for (event, n) in fs.counts() {
                samples.sample(&[("vrid", vrid), ("event", event)], n);
            }
            if let Some(lag) = fs.lag_ms() {
                let mut samples = w.gauge(
                    "fulcrum_ha_sync_flows_lag_seconds",
                    "Sync lag of the last batch of flows received.",
                );
                samples.sample(&l, lag / 1000.0);
            }
        }
        let pt = self.per_table.lock();
        if !pt.is_empty() {
            let mut samples = w.counter(
                "fulcrum_ha_sync_entries_sent_total",
                "Persistence entries sent to the peers, by service table.",
            );
            for (name, c) in pt.iter() {
                samples.sample(&[("vrid", vrid), ("vs", name)], c.sent);
            }
            let mut samples = w.counter(
                "fulcrum_ha_sync_entries_received_total",
                "Persistence entries received from the peers and stored, by service table.",
            );
            for (name, c) in pt.iter() {
                samples.sample(&[("vrid", vrid), ("vs", name)], c.received);
            }
            let mut samples = w.gauge(
                "fulcrum_ha_sync_table_lag_seconds",
                "Sync lag of the last batch of entries of this service table.",
            );
            for (name, c) in pt.iter() {
                if let Some(lag) = c.lags.back() {
                    samples.sample(&[("vrid", vrid), ("vs", name)], lag / 1000.0);
                }
            }
        }
    }
}

/// VRRP serves no virtual service; as a plane it follows the persistence tables of each
/// configuration (for `ha.sync`) and shows itself: `/api/v1/ha` and the `fulcrum_ha_*` metric
/// families. Start and shutdown stay with `App` (they need the running app and an async
/// resignation).
impl crate::planes::DataPlane for HaPlane {
    /// `ha.sync` streams the entries of the persistence tables now in force.
    fn commit(&self, cx: &mut crate::planes::CommitCx) {
        self.attach_tables(cx.tables);
    }

    fn metrics(&self, out: &mut MetricFamilies) {
        HaPlane::metrics(self, out);
    }

    fn api(&self, request: &fulcrum_admin::ApiRequest) -> Option<(u16, Value)> {
        match request.path {
            ["ha", rest @ ..] => Some(HaPlane::api(self, request.method, rest, request.body)),
            _ => None,
        }
    }
}

/// Counter families of one sample each, labelled `l`: (name, help, count).
fn counters<const N: usize>(
    w: &mut MetricFamilies,
    l: &[(&str, &str)],
    families: [(&str, &str, u64); N],
) {
    for (name, help, n) in families {
        w.counter(name, help).sample(l, n);
    }
}

/// `[ha] conntrack_sync`: conntrackd's health and its commits at failover.
fn conntrack_metrics(
    ct: &fulcrum_ha::conntrack::ConntrackStatus,
    l: &[(&str, &str)],
    w: &mut MetricFamilies,
) {
    for (name, kind, help, v) in [
        (
            "fulcrum_ha_conntrackd_up",
            MetricKind::Gauge,
            "1 while conntrackd (conntrack_sync) runs.",
            f64::from(u8::from(ct.running)),
        ),
        (
            "fulcrum_ha_conntrackd_restarts_total",
            MetricKind::Counter,
            "Times conntrackd ended by itself and was started again.",
            ct.restarts as f64,
        ),
        (
            "fulcrum_ha_conntrack_commits_total",
            MetricKind::Counter,
            "Commits of the peer's routed flows into the kernel on becoming master.",
            ct.commits as f64,
        ),
        (
            "fulcrum_ha_conntrack_commit_failures_total",
            MetricKind::Counter,
            "Commits that failed or did not finish in time (the VIPs were taken anyway).",
            ct.commit_failures as f64,
        ),
        (
            "fulcrum_ha_conntrack_last_commit_seconds",
            MetricKind::Gauge,
            "How long the last commit took.",
            ct.last_commit_ms.unwrap_or(0.0) / 1e3,
        ),
        (
            "fulcrum_ha_conntrack_control_failures_total",
            MetricKind::Counter,
            "Other conntrackd control calls (flush, resync, bulk send, timers) that failed.",
            ct.control_failures as f64,
        ),
    ] {
        let mut samples = w.family(name, kind, help);
        samples.sample(l, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_keeps_the_running_ha_and_everything_else_changes() {
        let text = |prio: u8, key: &str, port: u16| {
            format!(
                "[ha]\ninterface = \"eth0\"\nvrid = 1\npriority = {prio}\nvips = [\"198.18.0.100/24\"]\n\
                 sync = {{ listen = \"127.0.0.1:7500\", key = \"{key}\" }}\n\
                 [[virtual_service]]\nname = \"w\"\nlisten = \"127.0.0.1:{port}\"\nprotocol = \"tcp\"\npool = \"p\"\n\
                 [[pool]]\nname = \"p\"\n"
            )
        };
        let dir = std::path::Path::new(".");
        let running = fulcrum_config::parse(&text(100, "the-sync-key-0123456", 1), "t", dir)
            .expect("running");
        let mut new =
            fulcrum_config::parse(&text(200, "a-new-sync-key-01234", 2), "t", dir).expect("new");
        // Without a running VRRP node nothing of [ha] applies: the running one is kept.
        let plane = HaPlane::default();
        let change = plane.prepare_reload(&mut new, &running);
        plane.commit_reload(change);
        assert_eq!(new.ha, running.ha);
        assert_eq!(
            changed_keys(
                &fulcrum_config::parse(&text(200, "a-new-sync-key-01234", 2), "t", dir)
                    .expect("new")
                    .ha
                    .expect("ha"),
                running.ha.as_ref().expect("ha")
            ),
            ["priority", "sync.key"]
        );
        assert_eq!(
            new.virtual_services[0].listen,
            ["127.0.0.1:2".parse().expect("addr")]
        );
        // Derived secrets follow the key the sync channel runs with.
        assert_eq!(
            pair::shared_secret(&new, fulcrum_ha::sync::purpose::COOKIE),
            pair::shared_secret(&running, fulcrum_ha::sync::purpose::COOKIE)
        );
        assert_ne!(
            pair::shared_secret(&new, fulcrum_ha::sync::purpose::COOKIE),
            pair::shared_secret(&new, fulcrum_ha::sync::purpose::TICKETS)
        );
    }

    #[test]
    fn persistence_keys_round_trip_and_garbage_is_refused() {
        let keys = [
            PersistKey::source("192.0.2.7".parse().expect("ip"), 32, 128),
            PersistKey::source("2001:db8::1".parse().expect("ip"), 32, 64),
        ];
        for k in keys.into_iter().chain([
            PersistKey::Hashed(7.into()),
            PersistKey::Hashed(u128::MAX.into()),
        ]) {
            assert_eq!(key_parse(&key_text(&k)), Some(k));
        }
        for bad in [
            "h",
            "h+1",
            "-1",
            "i-1",
            "",
            "i",
            "ixyz",
            "b0",
            "bzz",
            "x12",
            "i1234567890123456789012345678901234",
        ] {
            assert_eq!(key_parse(bad), None, "{bad}");
        }
        // A batch with broken entries: the good ones are stored, the rest skipped.
        let t = Arc::new(PersistTable::new(fulcrum_balance::TableSpec {
            idle_timeout: std::time::Duration::from_secs(60),
            max_entries: 100,
        }));
        let tables = HashMap::from([("web".to_string(), t.clone())]);
        let k = PersistKey::source("192.0.2.9".parse().expect("ip"), 32, 128);
        let b = format!(
            r#"[{{"t":"web","k":"{}","m":"198.18.0.21:8080"}},{{"t":"nope","k":"b00","m":"1.2.3.4:1"}},{{"t":"web","k":"b0","m":"x"}},{{"t":"web","k":"h01","m":"1.2.3.4:1"}},7]"#,
            key_text(&k)
        );
        // The hashed entry is skipped: this table hashes per process.
        let mut flows = Vec::new();
        assert_eq!(
            apply_entries(b.as_bytes(), &tables, &mut flows),
            Ok(HashMap::from([("web".to_string(), 1)]))
        );
        assert!(flows.is_empty());
        assert_eq!(t.get(&k), Some("198.18.0.21:8080".parse().expect("addr")));
        // A table under the shared secret takes hashed entries.
        let shared = Arc::new(PersistTable::with_key(
            fulcrum_balance::TableSpec {
                idle_timeout: std::time::Duration::from_secs(60),
                max_entries: 100,
            },
            Some([3; 32]),
        ));
        let tables = HashMap::from([("web".to_string(), shared.clone())]);
        let h = shared.key(b"session=1");
        let b = format!(
            r#"[{{"t":"web","k":"{}","m":"198.18.0.22:80"}}]"#,
            key_text(&h)
        );
        assert!(apply_entries(b.as_bytes(), &tables, &mut flows).is_ok());
        assert_eq!(
            shared.get(&h),
            Some("198.18.0.22:80".parse().expect("addr"))
        );
        assert!(apply_entries(b"{not json", &tables, &mut flows).is_err());
    }
}

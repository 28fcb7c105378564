//! `[ha]`: runs a VRRP node (crate fulcrum-ha) whose priority follows the pools' health, serves
//! `GET /api/v1/ha` and the `fulcrum_ha_*` metrics, and resigns first on shutdown.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use fulcrum_admin::{Control, MetricsWriter};
use fulcrum_config::{Bgp, Config, ConfigError, Ha, HaMode};
use fulcrum_ha::machine::State;
use std::collections::HashMap;

use arc_swap::ArcSwap;
use fulcrum_balance::{PersistKey, PersistTable};
use fulcrum_ha::sync::{FullDump, Kind, OnReceive, StateSync};
use fulcrum_ha::{Node, NodeConfig};
use serde_json::{json, Value};

/// `[ha]` and `[bgp]` together (active_active): crate::bgp.
pub fn checks(config: &Config) -> Vec<ConfigError> {
    crate::bgp::checks(config)
}

#[derive(Default)]
pub struct HaPlane {
    node: OnceLock<Node>,
    /// Shared with the receive closure, which republishes a state it took over.
    sync: Arc<OnceLock<StateSync>>,
    node_name: OnceLock<String>,
    /// The services' persistence tables (by virtual service name), current after every apply.
    tables: Arc<ArcSwap<HashMap<String, Arc<PersistTable>>>>,
    /// New persistence entries on their way to the peers (bounded: see `QUEUE`).
    entries: OnceLock<tokio::sync::mpsc::Sender<(Arc<str>, PersistKey, std::net::SocketAddr)>>,
    /// Entries dropped because the queue was full.
    entries_dropped: Arc<AtomicU64>,
    /// Whether the last peer document had the same pools fingerprint as this node.
    peer_config_matches: Arc<parking_lot::Mutex<Option<bool>>>,
    /// Unix ms of the last operator change of member or site state here, or of the peer's
    /// state this node took over: `ha.sync` keeps the newest.
    changed_at: Arc<AtomicU64>,
    /// Active-active: the BGP announcer (`[bgp]`, crate::bgp) instead of a VRRP node.
    bgp: OnceLock<fulcrum_ha::bgp::Announcer>,
}

/// New persistence entries waiting to be sent; beyond this the newest are dropped and counted.
const QUEUE: usize = 65_536;
/// Entries per frame.
const BATCH: usize = 1000;

/// The wire form of a persistence key, or `None` for a key the peer could not use: byte keys
/// (header, cookie, RADIUS) are stored as a hash keyed per process (see `PersistTable::key`), so
/// the same client value hashes differently on the peer. Until the nodes share that hash key,
/// only source-address entries are synchronised.
fn key_text(k: &PersistKey) -> Option<String> {
    match k {
        PersistKey::Ip(v) => Some(format!("i{v:032x}")),
        PersistKey::Hashed(_) => None,
    }
}

fn key_parse(s: &str) -> Option<PersistKey> {
    let hex = s.strip_prefix('i')?;
    if hex.len() > 32 {
        return None;
    }
    u128::from_str_radix(hex, 16).ok().map(PersistKey::Ip)
}

fn batch(entries: &[(Arc<str>, PersistKey, std::net::SocketAddr)]) -> Vec<u8> {
    let v: Vec<Value> = entries
        .iter()
        .filter_map(|(t, k, m)| Some(json!({ "t": &**t, "k": key_text(k)?, "m": m.to_string() })))
        .collect();
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Stores a peer's batch of entries in the tables of the same services.
fn apply_entries(
    bytes: &[u8],
    tables: &HashMap<String, Arc<PersistTable>>,
) -> Result<usize, String> {
    let v: Vec<Value> = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let mut n = 0;
    for e in &v {
        let (Some(t), Some(k), Some(m)) = (
            e["t"].as_str().and_then(|t| tables.get(t)),
            e["k"].as_str().and_then(key_parse),
            e["m"].as_str().and_then(|m| m.parse().ok()),
        ) else {
            continue;
        };
        t.insert_synced(k, m);
        n += 1;
    }
    Ok(n)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
/// changed, and the fingerprint of its pools.
fn document(node: &str, changed_at_ms: u64, control: &dyn Control) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "node": node,
        "changed_at_ms": changed_at_ms,
        "pools_hash": pools_hash(control),
        "state": crate::state_file::current(control),
    }))
    .unwrap_or_default()
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
        priority: ha.priority,
        advert_interval: ha.advert_interval,
        preempt: ha.preempt,
        preempt_delay: ha.preempt_delay,
        peers: ha.peers.clone(),
        vips: ha.vips.clone(),
        track_weight: ha.track_weight,
        garp_repeat: ha.garp_repeat,
        garp_interval: ha.garp_interval,
        maintenance: false,
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
            tracing::warn!("ha.sync: member and site states set through the API and persistence tables are shared; connections and TLS ticket keys are not in this build");
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
        let _ = self.bgp.set(crate::bgp::start(bgp, maintenance, control));
    }

    /// An operator change here: newer than anything this node has seen, even within one
    /// millisecond of the last (two API calls in a row must both reach the peer).
    pub fn operator_changed(&self) {
        let now = now_ms();
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
            let (tx, name, dropped) = (
                tx.clone(),
                Arc::<str>::from(name.as_str()),
                self.entries_dropped.clone(),
            );
            table.set_feed(Some(Box::new(move |k: &PersistKey, m| {
                if tx.try_send((name.clone(), k.clone(), m)).is_err() {
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
            sync.publish(document(node, self.changed_at(), control));
        }
    }

    /// Starts `ha.sync`: listens, dials the peers, and takes over a peer's state when it is
    /// newer than this node's (`changed_at_ms`, from the state file at start).
    pub async fn start_sync<C: Control>(
        &self,
        ha: Option<&Ha>,
        changed_at_ms: u64,
        state_file: Option<PathBuf>,
        control: Weak<C>,
    ) -> Result<(), String> {
        let Some((ha, sync)) = ha.and_then(|h| h.sync.as_ref().map(|s| (h, s))) else {
            return Ok(());
        };
        self.changed_at.store(changed_at_ms, Ordering::Release);
        let node = ha.node.clone().unwrap_or_else(host_name);
        let _ = self.node_name.set(node.clone());
        let changed_at = self.changed_at.clone();
        let c = control.clone();
        let (me, republish) = (node.clone(), self.sync.clone());
        let matches = self.peer_config_matches.clone();
        let tables = self.tables.clone();
        let on_receive: OnReceive = Arc::new(move |kind: Kind, bytes: &[u8]| {
            if kind == Kind::Entries {
                return apply_entries(bytes, &tables.load()).map(drop);
            }
            let doc: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
            let theirs = doc["changed_at_ms"].as_u64().ok_or("no changed_at_ms")?;
            let Some(control) = c.upgrade() else {
                return Ok(());
            };
            let same = doc["pools_hash"].as_str() == Some(pools_hash(control.as_ref()).as_str());
            if matches.lock().replace(same) != Some(same) && !same {
                tracing::warn!(peer = %doc["node"], "HA sync: the peer's pools differ from this node's configuration (pools_hash); a failover changes what is served");
            }
            if theirs <= changed_at.load(Ordering::Acquire) {
                return Ok(());
            }
            changed_at.store(theirs, Ordering::Release);
            let n = crate::state_file::apply_remote(&doc["state"], control.as_ref());
            tracing::info!(peer = %doc["node"], changes = n, "HA sync: took over the peer's newer member and site states");
            if let Some(path) = &state_file {
                crate::state_file::save(control.as_ref(), path, theirs);
            }
            // This node's document now says the same, so a peer that restarts gets it back.
            if let Some(sync) = republish.get() {
                sync.publish(document(&me, theirs, control.as_ref()));
            }
            Ok(())
        });
        let all = self.tables.clone();
        let full_dump: FullDump = Arc::new(move || {
            let mut out = Vec::new();
            for (name, table) in all.load().iter() {
                let name = Arc::<str>::from(name.as_str());
                let entries: Vec<_> = table
                    .entries()
                    .into_iter()
                    .map(|(k, m)| (name.clone(), k, m))
                    .collect();
                out.extend(entries.chunks(BATCH).map(batch));
            }
            out
        });
        let s = StateSync::start(
            sync.listen,
            &sync.peers,
            std::slice::from_ref(&sync.key),
            on_receive,
            full_dump,
        )
        .await
        .map_err(|e| format!("cannot listen on {} (ha.sync.listen): {e}", sync.listen))?;
        let _ = self.sync.set(s);
        // New persistence entries: a bounded queue, drained in batches by one task.
        let (tx, mut rx) = tokio::sync::mpsc::channel(QUEUE);
        let _ = self.entries.set(tx);
        self.attach_feeds();
        let sender = self.sync.clone();
        tokio::spawn(async move {
            let mut buf = Vec::with_capacity(BATCH);
            while rx.recv_many(&mut buf, BATCH).await > 0 {
                if let Some(s) = sender.get() {
                    s.send_batch(batch(&buf));
                }
                buf.clear();
            }
        });
        if let Some(c) = control.upgrade() {
            self.publish(c.as_ref());
        }
        tracing::info!(listen = %sync.listen, peers = sync.peers.len(), "HA sync: running (member and site states set through the API, persistence tables)");
        Ok(())
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
        if let Some(b) = self.bgp.get() {
            let node = self.node_name.get().map_or("", String::as_str);
            return crate::bgp::api(b, node, method, path, body);
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
                }
                (200, s)
            }
            ("PUT", ["maintenance"]) => {
                let on = serde_json::from_slice::<Value>(body)
                    .ok()
                    .and_then(|v| v.get("maintenance").and_then(Value::as_bool));
                let Some(on) = on else {
                    return (
                        400,
                        json!({ "error": "the body must be {\"maintenance\": true | false}" }),
                    );
                };
                // The node's thread applies it within a moment (a master resigns at once).
                n.set_maintenance(on);
                (200, status())
            }
            (_, [] | ["maintenance"]) => (
                405,
                json!({ "error": format!("{method} is not allowed here") }),
            ),
            _ => (404, json!({ "error": "no such endpoint" })),
        }
    }

    pub fn metrics(&self, w: &mut MetricsWriter) {
        if let Some(b) = self.bgp.get() {
            crate::bgp::metrics(b, w);
        }
        let Some(n) = self.node.get() else { return };
        let s = n.status();
        let vrid = s.vrid.to_string();
        let l = [("vrid", vrid.as_str())];
        w.family(
            "fulcrum_ha_state",
            "gauge",
            "VRRP state of this node: 1 for the current one.",
        );
        for st in [State::Init, State::Backup, State::Master, State::Fault] {
            let v = if s.role == st { 1.0 } else { 0.0 };
            w.sample(
                "fulcrum_ha_state",
                &[("vrid", &vrid), ("state", st.as_str())],
                v,
            );
        }
        w.family(
            "fulcrum_ha_priority",
            "gauge",
            "Priority advertised now (lowered or 0 while tracked pools are down).",
        );
        w.sample("fulcrum_ha_priority", &l, f64::from(s.priority));
        w.family(
            "fulcrum_ha_transitions_total",
            "counter",
            "VRRP state changes.",
        );
        w.sample("fulcrum_ha_transitions_total", &l, s.transitions as f64);
        w.family(
            "fulcrum_ha_became_master_total",
            "counter",
            "Times this node became master.",
        );
        w.sample("fulcrum_ha_became_master_total", &l, s.became_master as f64);
        w.family(
            "fulcrum_ha_adverts_sent_total",
            "counter",
            "VRRP advertisements sent.",
        );
        w.sample("fulcrum_ha_adverts_sent_total", &l, s.adverts.sent as f64);
        w.family(
            "fulcrum_ha_adverts_received_total",
            "counter",
            "Valid VRRP advertisements received for this VRID.",
        );
        w.sample(
            "fulcrum_ha_adverts_received_total",
            &l,
            s.adverts.received as f64,
        );
        w.family(
            "fulcrum_ha_adverts_dropped_total",
            "counter",
            "Received protocol-112 packets dropped, by reason.",
        );
        for (reason, v) in [
            ("truncated", s.dropped.truncated),
            ("not_vrrp", s.dropped.not_vrrp),
            ("ttl", s.dropped.ttl),
            ("version", s.dropped.version),
            ("checksum", s.dropped.checksum),
        ] {
            w.sample(
                "fulcrum_ha_adverts_dropped_total",
                &[("vrid", &vrid), ("reason", reason)],
                v as f64,
            );
        }
        w.family(
            "fulcrum_ha_address_mismatch_total",
            "counter",
            "Adverts for this VRID listing other addresses than ha.vips (a misconfiguration).",
        );
        w.sample(
            "fulcrum_ha_address_mismatch_total",
            &l,
            s.adverts.address_mismatch as f64,
        );
        w.family(
            "fulcrum_ha_garps_sent_total",
            "counter",
            "Gratuitous ARPs sent for the VIPs.",
        );
        w.sample("fulcrum_ha_garps_sent_total", &l, s.garps_sent as f64);
        if let Some(sync) = self.sync.get() {
            let st = sync.status();
            w.family(
                "fulcrum_ha_sync_frames_received_total",
                "counter",
                "State sync documents received from peers and applied.",
            );
            w.sample(
                "fulcrum_ha_sync_frames_received_total",
                &l,
                st.frames_received as f64,
            );
            w.family(
                "fulcrum_ha_sync_auth_failures_total",
                "counter",
                "State sync connections refused: a frame failed authentication.",
            );
            w.sample(
                "fulcrum_ha_sync_auth_failures_total",
                &l,
                st.auth_failures as f64,
            );
            w.family(
                "fulcrum_ha_sync_lag_seconds",
                "gauge",
                "Sync lag of the last document: from the peer's sending to this node's applying.",
            );
            w.sample(
                "fulcrum_ha_sync_lag_seconds",
                &l,
                st.lag_ms.unwrap_or(0.0) / 1000.0,
            );
            w.family(
                "fulcrum_ha_sync_config_mismatch",
                "gauge",
                "1 when the peer's pools differ from this node's (pools_hash).",
            );
            let mismatch = *self.peer_config_matches.lock() == Some(false);
            w.sample(
                "fulcrum_ha_sync_config_mismatch",
                &l,
                if mismatch { 1.0 } else { 0.0 },
            );
        }
    }
}

/// VRRP serves no virtual service; as a plane it follows the persistence tables of each
/// configuration (for `ha.sync`) and shows itself: `/api/v1/ha` and the `fulcrum_ha_*` metric
/// families. Start and shutdown stay with `App` (they need the running app and an async
/// resignation).
impl crate::plane::DataPlane for HaPlane {
    /// `ha.sync` streams the entries of the persistence tables now in force.
    fn commit(&self, cx: &mut crate::plane::CommitCx) {
        self.attach_tables(cx.tables);
    }

    fn metrics(&self, out: &mut MetricsWriter) {
        HaPlane::metrics(self, out);
    }

    fn api(&self, request: &fulcrum_admin::ApiRequest) -> Option<(u16, Value)> {
        match request.path {
            ["ha", rest @ ..] => Some(HaPlane::api(self, request.method, rest, request.body)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persistence_keys_round_trip_and_garbage_is_refused() {
        let keys = [
            PersistKey::source("192.0.2.7".parse().expect("ip"), 32, 128),
            PersistKey::source("2001:db8::1".parse().expect("ip"), 32, 64),
        ];
        for k in keys {
            assert_eq!(key_text(&k).and_then(|t| key_parse(&t)), Some(k));
        }
        assert_eq!(
            key_text(&PersistKey::Hashed(7)),
            None,
            "per-process hashes stay home"
        );
        for bad in [
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
            r#"[{{"t":"web","k":"{}","m":"198.18.0.21:8080"}},{{"t":"nope","k":"b00","m":"1.2.3.4:1"}},{{"t":"web","k":"b0","m":"x"}},7]"#,
            key_text(&k).expect("ip key")
        );
        assert_eq!(apply_entries(b.as_bytes(), &tables), Ok(1));
        assert_eq!(t.get(&k), Some("198.18.0.21:8080".parse().expect("addr")));
        assert!(apply_entries(b"{not json", &tables).is_err());
    }
}

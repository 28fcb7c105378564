//! `[ha] config_sync`: the two nodes of a pair keep the shared part of their configuration file
//! (everything but `[admin]`, `[ha]`, `[bgp]`, `[global]`: `fulcrum_config::shared`) the same.
//!
//! Every version a node applies is a *change*: an id, a sequence number, the node it came from
//! and the digest of its shared text. A node keeps the last changes it went through (its
//! lineage, saved beside the configuration file so a restart remembers it) and sends the
//! lineage and its shared text in its `ha.sync` document. Comparing lineages tells what to do:
//! the same head is in sync; a peer whose lineage contains this node's head has moved on, and
//! this node takes the peer's text (written into its own file around its own node sections,
//! then applied by a reload, all or nothing); a peer whose head is in this node's lineage is
//! behind and will do the same; anything else is a divergence (both changed while apart), which
//! is reported and takes nothing until an operator adopts one side (F5's config-sync works
//! the same way: a change has an origin, and a conflict waits for the administrator).

use std::path::{Path, PathBuf};

use fulcrum_config::shared;
use parking_lot::Mutex;
use serde_json::{json, Value};

use fulcrum_ha::sync::now_ms;

/// Changes a lineage keeps: a node that missed more than this while apart reports a
/// divergence instead of catching up.
const LINEAGE: usize = 64;
/// The largest shared text taken from a peer (the sync channel's frames are bounded too).
const MAX_SHARED: usize = 4 << 20;

#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub id: String,
    pub seq: u64,
    pub origin: String,
    pub at_ms: u64,
    pub digest: String,
}

impl Change {
    fn to_json(&self) -> Value {
        json!({
            "id": self.id, "seq": self.seq, "origin": self.origin,
            "at_ms": self.at_ms, "digest": self.digest,
        })
    }

    fn from_json(v: &Value) -> Option<Change> {
        Some(Change {
            id: v["id"].as_str()?.to_string(),
            seq: v["seq"].as_u64()?,
            origin: v["origin"].as_str()?.to_string(),
            at_ms: v["at_ms"].as_u64()?,
            digest: v["digest"].as_str()?.to_string(),
        })
    }
}

fn lineage_json(l: &[Change]) -> Value {
    Value::Array(l.iter().map(Change::to_json).collect())
}

fn lineage_from(v: &Value) -> Option<Vec<Change>> {
    let l: Option<Vec<Change>> = v.as_array()?.iter().map(Change::from_json).collect();
    l.filter(|l| !l.is_empty() && l.len() <= LINEAGE)
}

/// What a peer's document says of its configuration.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    pub node: String,
    pub lineage: Vec<Change>,
    pub shared: String,
}

impl PeerConfig {
    fn head(&self) -> &Change {
        // A lineage is never empty (`lineage_from`).
        &self.lineage[self.lineage.len() - 1]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    InSync,
    /// The peer went on from this node's version: take the peer's.
    PeerAhead,
    /// This node went on from the peer's version: the peer takes this one.
    PeerBehind,
    Diverged,
}

pub fn verdict(mine: &[Change], theirs: &[Change]) -> Verdict {
    let (Some(m), Some(t)) = (mine.last(), theirs.last()) else {
        return Verdict::Diverged;
    };
    if m.id == t.id {
        Verdict::InSync
    } else if theirs.iter().any(|c| c.id == m.id) {
        Verdict::PeerAhead
    } else if mine.iter().any(|c| c.id == t.id) {
        Verdict::PeerBehind
    } else {
        Verdict::Diverged
    }
}

struct State {
    lineage: Vec<Change>,
    shared: String,
    peer: Option<PeerConfig>,
    /// The lineage a reload in progress takes when it applies the peer's text.
    taking: Option<Vec<Change>>,
    /// The peer head whose text this node refused (not retried until the peer changes).
    refused: Option<(String, String)>,
}

pub struct ConfigSync {
    node: String,
    file: PathBuf,
    saved: PathBuf,
    state: Mutex<State>,
}

/// Where a node keeps its lineage: beside the configuration file.
fn saved_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".sync.json");
    file.with_file_name(name)
}

fn new_id(node: &str, digest: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    shared::digest(&format!("{node}/{nanos}/{}/{digest}", std::process::id()))
}

/// A change this node made: a fresh id.
fn own_change(node: &str, seq: u64, digest: String) -> Change {
    Change {
        id: new_id(node, &digest),
        seq,
        origin: node.to_string(),
        at_ms: now_ms(),
        digest,
    }
}

fn read_shared(file: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    shared::shared_part(&text).map_err(|e| format!("{}: {e}", file.display()))
}

impl ConfigSync {
    /// Opens the node's lineage and brings it up to the file: a file edited while the node was
    /// stopped is a new change of this node's.
    pub fn open(node: &str, file: &Path) -> Result<ConfigSync, String> {
        let shared = read_shared(file)?;
        let digest = shared::digest(&shared);
        let saved = saved_path(file);
        let mut lineage = std::fs::read(&saved)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| lineage_from(&v["lineage"]))
            .unwrap_or_default();
        match lineage.last() {
            Some(head) if head.digest == digest => {}
            Some(head) => {
                let seq = head.seq + 1;
                lineage.push(own_change(node, seq, digest));
            }
            // A first start: the id is the text's, so two nodes started from the same file
            // are in sync at once.
            None => lineage.push(Change {
                id: format!("file-{digest}"),
                seq: 1,
                origin: node.to_string(),
                at_ms: now_ms(),
                digest,
            }),
        }
        let cs = ConfigSync {
            node: node.to_string(),
            file: file.to_path_buf(),
            saved,
            state: Mutex::new(State {
                lineage,
                shared,
                peer: None,
                taking: None,
                refused: None,
            }),
        };
        cs.save(&cs.state.lock());
        Ok(cs)
    }

    fn save(&self, st: &State) {
        let text = json!({ "node": self.node, "lineage": lineage_json(&st.lineage) }).to_string();
        if let Err(e) = crate::state_file::write_bytes(&self.saved, text.as_bytes()) {
            tracing::warn!(file = %self.saved.display(), error = %e, "config_sync: cannot save the lineage; a restart will not remember it");
        }
    }

    /// After every configuration this node applied (a reload, an API write, a peer's text):
    /// records a new change when the shared part is not the head's.
    pub fn applied(&self) {
        let shared = match read_shared(&self.file) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "config_sync: the applied file cannot be split; the peer keeps the previous version");
                return;
            }
        };
        let digest = shared::digest(&shared);
        let mut st = self.state.lock();
        if let Some(taking) = st.taking.take() {
            if taking.last().is_some_and(|h| h.digest == digest) {
                st.lineage = taking;
                st.shared = shared;
                self.save(&st);
                return;
            }
        }
        if st.lineage.last().is_some_and(|h| h.digest == digest) {
            return;
        }
        let seq = st.lineage.last().map_or(1, |h| h.seq + 1);
        Self::push(&mut st.lineage, own_change(&self.node, seq, digest));
        st.shared = shared;
        self.save(&st);
    }

    fn push(lineage: &mut Vec<Change>, c: Change) {
        lineage.push(c);
        if lineage.len() > LINEAGE {
            lineage.remove(0);
        }
    }

    /// The `config` part of this node's `ha.sync` document.
    pub fn document(&self) -> Value {
        let st = self.state.lock();
        json!({ "node": self.node, "lineage": lineage_json(&st.lineage), "shared": st.shared })
    }

    /// A peer's document arrived: remembers what it says and returns its configuration when
    /// this node should take it now.
    pub fn received(&self, config: &Value) -> Result<Option<PeerConfig>, String> {
        let lineage = lineage_from(&config["lineage"]).ok_or("config_sync: no valid lineage")?;
        let shared = config["shared"]
            .as_str()
            .ok_or("config_sync: no shared text")?;
        if shared.len() > MAX_SHARED {
            return Err(format!(
                "config_sync: the peer's configuration is larger than {MAX_SHARED} bytes"
            ));
        }
        let peer = PeerConfig {
            node: config["node"].as_str().unwrap_or("peer").to_string(),
            lineage,
            shared: shared.to_string(),
        };
        let mut st = self.state.lock();
        let v = verdict(&st.lineage, &peer.lineage);
        let head = peer.head().id.clone();
        let before = st.peer.as_ref().map(|p| verdict(&st.lineage, &p.lineage));
        st.peer = Some(peer.clone());
        if v == Verdict::Diverged && before != Some(Verdict::Diverged) {
            tracing::error!(peer = %peer.node, "config_sync: this node and the peer both changed the configuration while apart; nothing is taken until an operator adopts one side (PUT /api/v1/ha/config_sync)");
        }
        let refused = st.refused.as_ref().is_some_and(|(id, _)| *id == head);
        Ok((v == Verdict::PeerAhead && st.taking.is_none() && !refused).then_some(peer))
    }

    /// Takes `peer`'s shared text: merged around this node's own sections and handed to
    /// `write`, the configuration API's one write path (validated, written, kept in the
    /// history, applied; a refused apply leaves the file as it was).
    pub fn take(
        &self,
        peer: &PeerConfig,
        write: impl FnOnce(&str) -> Result<u64, Vec<String>>,
    ) -> Result<u64, Vec<String>> {
        let old = std::fs::read_to_string(&self.file)
            .map_err(|e| vec![format!("cannot read {}: {e}", self.file.display())])?;
        let merged = shared::with_shared(&old, &peer.shared).map_err(|e| vec![e])?;
        self.state.lock().taking = Some(peer.lineage.clone());
        let r = write(&merged);
        let mut st = self.state.lock();
        st.taking = None;
        match &r {
            Ok(_) => {
                st.refused = None;
                tracing::info!(peer = %peer.node, seq = peer.head().seq, origin = %peer.head().origin, "config_sync: took the peer's configuration");
            }
            Err(errors) => {
                st.refused = Some((peer.head().id.clone(), errors.join("; ")));
                tracing::error!(peer = %peer.node, errors = %errors.join("; "), "config_sync: the peer's configuration is refused here; this node keeps its own");
            }
        }
        r
    }

    /// An operator settles a divergence by keeping this node's version: it becomes a change
    /// made after the peer's head, so the peer takes it.
    pub fn keep_local(&self) -> Result<(), String> {
        let mut st = self.state.lock();
        let peer_head = st
            .peer
            .as_ref()
            .map(|p| p.head().clone())
            .ok_or("no configuration from the peer yet")?;
        let digest = st
            .lineage
            .last()
            .map(|h| h.digest.clone())
            .unwrap_or_default();
        let seq = st.lineage.last().map_or(0, |h| h.seq).max(peer_head.seq) + 1;
        Self::push(&mut st.lineage, peer_head);
        Self::push(&mut st.lineage, own_change(&self.node, seq, digest));
        self.save(&st);
        Ok(())
    }

    /// After a take: the peer's newest document, when it went on meanwhile (a document that
    /// arrives while a take runs is remembered, not taken at once).
    pub fn still_behind(&self) -> Option<PeerConfig> {
        let st = self.state.lock();
        let peer = st.peer.as_ref()?;
        let refused = st
            .refused
            .as_ref()
            .is_some_and(|(id, _)| *id == peer.head().id);
        (verdict(&st.lineage, &peer.lineage) == Verdict::PeerAhead && !refused)
            .then(|| peer.clone())
    }

    /// The peer's configuration, for an operator who adopts it.
    pub fn peer(&self) -> Option<PeerConfig> {
        self.state.lock().peer.clone()
    }

    /// `config_sync` in `GET /api/v1/ha`.
    pub fn status(&self) -> Value {
        let st = self.state.lock();
        let local = st.lineage.last().map(Change::to_json);
        let Some(peer) = &st.peer else {
            return json!({ "state": "unknown", "local": local, "peer": null });
        };
        let (state, behind) = match verdict(&st.lineage, &peer.lineage) {
            Verdict::InSync => ("in_sync", Value::Null),
            Verdict::PeerAhead => ("behind", json!("local")),
            Verdict::PeerBehind => ("behind", json!("peer")),
            Verdict::Diverged => ("diverged", Value::Null),
        };
        let refused = st
            .refused
            .as_ref()
            .filter(|(id, _)| *id == peer.head().id)
            .map(|(_, e)| e.clone());
        json!({
            "state": state,
            "behind": behind,
            "local": local,
            "peer": peer.head().to_json(),
            "peer_node": peer.node,
            "refused": refused,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(id: &str, seq: u64) -> Change {
        Change {
            id: id.into(),
            seq,
            origin: "n".into(),
            at_ms: 0,
            digest: id.into(),
        }
    }

    #[test]
    fn lineages_say_who_is_ahead() {
        let a = [change("x", 1), change("y", 2)];
        let b = [change("x", 1)];
        assert_eq!(verdict(&a, &a), Verdict::InSync);
        assert_eq!(verdict(&b, &a), Verdict::PeerAhead);
        assert_eq!(verdict(&a, &b), Verdict::PeerBehind);
        let c = [change("x", 1), change("z", 2)];
        assert_eq!(verdict(&a, &c), Verdict::Diverged);
        assert_eq!(verdict(&[], &a), Verdict::Diverged);
    }

    const FILE: &str = "[admin]\nlisten = \"127.0.0.1:9000\"\n\n[[pool]]\nname = \"web\"\n";

    #[test]
    fn a_change_on_one_node_is_taken_by_the_other_and_a_refusal_restores_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (fa, fb) = (dir.path().join("a.toml"), dir.path().join("b.toml"));
        std::fs::write(&fa, FILE).unwrap();
        std::fs::write(&fb, FILE.replace("9000", "9001")).unwrap();
        let (a, b) = (
            ConfigSync::open("a", &fa).unwrap(),
            ConfigSync::open("b", &fb).unwrap(),
        );
        // Same shared text at the first start: in sync without a word.
        assert!(b.received(&a.document()).unwrap().is_none());
        assert_eq!(b.status()["state"], "in_sync");
        std::fs::write(&fa, format!("{FILE}[[pool]]\nname = \"api\"\n")).unwrap();
        a.applied();
        let take = b
            .received(&a.document())
            .unwrap()
            .expect("b takes a's change");
        assert_eq!(b.status()["behind"], "local");
        // The write path writes the merged text, then applies it.
        let r = b.take(&take, |text| {
            std::fs::write(&fb, text).unwrap();
            b.applied();
            Ok(2)
        });
        assert!(r.is_ok());
        let text = std::fs::read_to_string(&fb).unwrap();
        assert!(text.contains("9001") && text.contains("\"api\""), "{text}");
        assert_eq!(b.status()["state"], "in_sync");
        assert_eq!(
            a.received(&b.document()).unwrap().map(|p| p.node),
            None,
            "a is not behind"
        );
        // A restart of b remembers where it was.
        let b2 = ConfigSync::open("b", &fb).unwrap();
        assert!(b2.received(&a.document()).unwrap().is_none());
        assert_eq!(b2.status()["state"], "in_sync");
        // A version b refuses (the write path put the file back) is not retried.
        std::fs::write(&fa, format!("{FILE}[[pool]]\nname = \"bad\"\n")).unwrap();
        a.applied();
        let take = b2.received(&a.document()).unwrap().unwrap();
        let before = std::fs::read_to_string(&fb).unwrap();
        assert!(b2.take(&take, |_| Err(vec!["port in use".into()])).is_err());
        assert_eq!(std::fs::read_to_string(&fb).unwrap(), before);
        assert!(b2.received(&a.document()).unwrap().is_none());
        assert_eq!(b2.status()["refused"], "port in use");
    }

    #[test]
    fn changes_on_both_sides_diverge_until_one_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (fa, fb) = (dir.path().join("a.toml"), dir.path().join("b.toml"));
        std::fs::write(&fa, FILE).unwrap();
        std::fs::write(&fb, FILE).unwrap();
        let (a, b) = (
            ConfigSync::open("a", &fa).unwrap(),
            ConfigSync::open("b", &fb).unwrap(),
        );
        std::fs::write(&fa, format!("{FILE}[[pool]]\nname = \"on-a\"\n")).unwrap();
        a.applied();
        std::fs::write(&fb, format!("{FILE}[[pool]]\nname = \"on-b\"\n")).unwrap();
        b.applied();
        assert!(b.received(&a.document()).unwrap().is_none());
        assert!(a.received(&b.document()).unwrap().is_none());
        assert_eq!(a.status()["state"], "diverged");
        assert_eq!(b.status()["state"], "diverged");
        // The operator keeps b's: a takes it.
        b.keep_local().unwrap();
        let take = a.received(&b.document()).unwrap().expect("a takes b's");
        assert!(take.shared.contains("on-b"));
    }
}

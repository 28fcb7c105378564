//! `admin.state_file`: what the operator set through the API (member states and weights, GSLB
//! site states) survives a restart.
//!
//! The file holds only overrides: a member whose state or weight differs from its configuration
//! file's value, with that configuration value beside it. At start an override is applied only
//! while the configuration still says what it said when the override was made, which is the
//! rule a reload follows (`Member::reconfigure`): the file's own value wins only when it changes.
//! Every write goes to a temporary file that is synced and renamed over the old one, so a crash
//! leaves either the old or the new state, never half of one.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use fulcrum_admin::Control;
use fulcrum_balance::Pool;
use fulcrum_config::AdminState;
use serde_json::{json, Value};

const VERSION: u64 = 1;

/// GSLB sites an operator took out of service, from `/api/v1/gslb/sites`.
fn gslb_site_states(control: &dyn Control) -> Vec<(String, String)> {
    let (200, v) = plane(control, "GET", &["gslb", "sites"], &[]) else {
        return Vec::new();
    };
    v["sites"]
        .as_array()
        .map(|sites| {
            sites
                .iter()
                .filter_map(|s| Some((s["name"].as_str()?.to_string(), s["state"].as_str()?)))
                .filter(|(_, state)| *state != AdminState::Enabled.as_str())
                .map(|(n, s)| (n, s.to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// A route of a plane (`gslb/…`, `ha`) as the API would answer it; 404 when no plane has it.
fn plane(control: &dyn Control, method: &str, path: &[&str], body: &[u8]) -> (u16, Value) {
    let request = fulcrum_admin::ApiRequest {
        method,
        path,
        query: &[],
        body,
    };
    control.plane_api(&request).unwrap_or((404, Value::Null))
}

/// The member and site overrides of `control` (what `ha.sync` shares).
pub fn current(control: &dyn Control) -> Value {
    snapshot(&control.pools(), &gslb_site_states(control))
}

/// Writes the current overrides of `control` to `path`, with the time of the last operator
/// change (`ha.sync` orders the nodes' states by it); a failure is logged (the change itself
/// stands, it only would not survive a restart).
pub fn save(control: &dyn Control, path: &Path, changed_at_ms: u64) {
    let mut value = current(control);
    let (status, ha) = plane(control, "GET", &["ha"], &[]);
    value["ha_maintenance"] = json!(status == 200 && ha["maintenance"] == true);
    value["changed_at_ms"] = json!(changed_at_ms);
    match write(path, &value) {
        Ok(()) => tracing::debug!(path = %path.display(), "state file written"),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot write the state file; API changes will not survive a restart")
        }
    }
}

/// What `load` hands to the HA plane, which starts after it.
#[derive(Debug, Default)]
pub struct Loaded {
    pub maintenance: bool,
    pub changed_at_ms: u64,
}

/// At start: applies the saved overrides in `path` to the running configuration.
pub fn load(control: &dyn Control, path: &Path) -> Loaded {
    let state = match read(path) {
        Ok(Some(s)) => s,
        Ok(None) => return Loaded::default(),
        Err(e) => {
            tracing::error!(error = %e, "state file ignored; the configuration's states and weights apply");
            return Loaded::default();
        }
    };
    let (r, sites) = restore(&state, &control.pools());
    let mut sites_applied = 0;
    for (name, st) in sites {
        let body = json!({ "state": st.as_str() }).to_string();
        let path = ["gslb", "sites", name.as_str(), "state"];
        if plane(control, "PUT", &path, body.as_bytes()).0 == 200 {
            sites_applied += 1;
        } else {
            tracing::warn!(site = %name, "state file: no such gslb site any more; its saved state is dropped");
        }
    }
    let maintenance = state["ha_maintenance"].as_bool().unwrap_or(false);
    tracing::info!(path = %path.display(), members = r.applied, superseded = r.superseded, gslb_sites = sites_applied, ha_maintenance = maintenance, "state file applied");
    Loaded {
        maintenance,
        changed_at_ms: state["changed_at_ms"].as_u64().unwrap_or(0),
    }
}

/// A peer's state (`ha.sync`, newer than this node's): its member overrides are applied as at
/// start (an override stands while the configuration's value is the one it was made against),
/// this node's overrides the peer no longer has are ended, and GSLB sites take the peer's
/// states. Returns how many members and sites changed.
pub fn apply_remote(state: &Value, control: &dyn Control) -> usize {
    let pools = control.pools();
    let mut changed = 0;
    let before: Vec<(AdminState, u32)> = pools
        .iter()
        .flat_map(|p| p.members().iter().map(|m| (m.state(), m.weight())))
        .collect();
    let (_, sites) = restore(state, &pools);
    let empty = Vec::new();
    let entry = |pool: &str, addr: std::net::SocketAddr| {
        state["members"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .find(|e| {
                e["pool"] == pool
                    && e["address"].as_str().and_then(|a| a.parse().ok()) == Some(addr)
            })
            .cloned()
    };
    // What the peer does not override, this node does not either.
    for p in &pools {
        for m in p.members() {
            let e = entry(&p.name, m.address);
            let (state_override, weight_override) = e.as_ref().map_or((false, false), |e| {
                (
                    e["state"] != e["config_state"],
                    e["weight"] != e["config_weight"],
                )
            });
            if !state_override {
                m.set_state(m.config_state());
            }
            if !weight_override {
                m.set_weight(m.config_weight());
            }
        }
        p.refresh();
    }
    let after = pools
        .iter()
        .flat_map(|p| p.members().iter().map(|m| (m.state(), m.weight())));
    changed += before.iter().zip(after).filter(|(b, a)| **b != *a).count();
    let wanted: std::collections::HashMap<String, AdminState> = sites.into_iter().collect();
    let (status, all) = plane(control, "GET", &["gslb", "sites"], &[]);
    if status == 200 {
        for s in all["sites"].as_array().unwrap_or(&empty) {
            let (Some(name), Some(now)) = (
                s["name"].as_str(),
                s["state"].as_str().and_then(AdminState::parse),
            ) else {
                continue;
            };
            let want = wanted.get(name).copied().unwrap_or(AdminState::Enabled);
            if want != now {
                let body = json!({ "state": want.as_str() }).to_string();
                plane(
                    control,
                    "PUT",
                    &["gslb", "sites", name, "state"],
                    body.as_bytes(),
                );
                changed += 1;
            }
        }
    }
    changed
}

/// The overrides of `pools` and the non-enabled GSLB `sites` (`(name, state)`), as JSON.
pub fn snapshot(pools: &[Arc<Pool>], sites: &[(String, String)]) -> Value {
    let mut members = Vec::new();
    for p in pools {
        for m in p.members() {
            let (state, weight) = (m.state(), m.weight());
            let (cstate, cweight) = (m.config_state(), m.config_weight());
            if state == cstate && weight == cweight {
                continue;
            }
            members.push(json!({
                "pool": &*p.name,
                "address": m.address.to_string(),
                "state": state.as_str(),
                "weight": weight,
                "config_state": cstate.as_str(),
                "config_weight": cweight,
            }));
        }
    }
    let sites: Vec<Value> = sites
        .iter()
        .map(|(name, state)| json!({ "name": name, "state": state }))
        .collect();
    json!({ "version": VERSION, "members": members, "gslb_sites": sites })
}

/// Writes `value` to `path` atomically (`write_bytes`).
pub fn write(path: &Path, value: &Value) -> std::io::Result<()> {
    let mut text = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    text.push(b'\n');
    write_bytes(path, &text)
}

/// Writes `bytes` to `path` atomically: a temporary file beside it (with the old file's
/// permissions), fsync, rename, fsync of the directory (so the rename itself survives a power
/// cut). A reader sees the old file or the new one, never a part.
pub fn write_bytes(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state".into());
    // Unique per write: a sync update and an API change may write at the same moment.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.tmp.{}.{n}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        if let Ok(meta) = std::fs::metadata(path) {
            f.set_permissions(meta.permissions())?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Reads the file; a missing file is an empty state, anything unreadable an error (the process
/// still starts, with the configuration's values, and says so).
pub fn read(path: &Path) -> Result<Option<Value>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
    match v.get("version").and_then(Value::as_u64) {
        Some(VERSION) => Ok(Some(v)),
        other => Err(format!(
            "{}: unsupported state file version {other:?} (expected {VERSION})",
            path.display()
        )),
    }
}

/// What `restore` did, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub applied: usize,
    /// Overrides dropped because the configuration's own value changed meanwhile, or the
    /// member is gone.
    pub superseded: usize,
}

/// Applies the member overrides of `state` to `pools`; returns the GSLB site states to apply.
pub fn restore(state: &Value, pools: &[Arc<Pool>]) -> (Restored, Vec<(String, AdminState)>) {
    let mut r = Restored::default();
    let empty = Vec::new();
    for e in state["members"].as_array().unwrap_or(&empty) {
        let pool = e["pool"].as_str().unwrap_or_default();
        let member = e["address"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .and_then(|addr| {
                let p = pools.iter().find(|p| &*p.name == pool)?;
                Some((p.clone(), p.member_by_addr(addr)?.1.clone()))
            });
        let Some((p, m)) = member else {
            tracing::warn!(pool, address = %e["address"], "state file: no such member any more; its saved state is dropped");
            r.superseded += 1;
            continue;
        };
        let mut used = false;
        let saved_cstate = e["config_state"].as_str().and_then(AdminState::parse);
        // Each entry carries both fields; only the one that differs from its saved config value
        // is an override.
        let state = e["state"].as_str().and_then(AdminState::parse);
        if let Some(state) = state.filter(|s| Some(*s) != saved_cstate) {
            if saved_cstate == Some(m.config_state()) {
                m.set_state(state);
                used = true;
            } else if state != m.config_state() {
                tracing::info!(pool, member = %m.label, saved = %state, "state file: the configuration's state changed since; it wins");
            }
        }
        let saved_cweight = e["config_weight"].as_u64();
        let weight = e["weight"].as_u64().and_then(|w| u32::try_from(w).ok());
        if let Some(weight) = weight.filter(|w| Some(u64::from(*w)) != saved_cweight) {
            if saved_cweight == Some(u64::from(m.config_weight())) {
                m.set_weight(weight);
                used = true;
            } else if weight != m.config_weight() {
                tracing::info!(pool, member = %m.label, saved = weight, "state file: the configuration's weight changed since; it wins");
            }
        }
        if used {
            r.applied += 1;
            p.refresh();
        } else {
            r.superseded += 1;
        }
    }
    let sites = state["gslb_sites"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|s| {
            Some((
                s["name"].as_str()?.to_string(),
                s["state"].as_str().and_then(AdminState::parse)?,
            ))
        })
        .collect();
    (r, sites)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(text: &str) -> Arc<Pool> {
        let cfg = fulcrum_config::parse(text, "t.toml", Path::new(".")).expect("config");
        Arc::new(Pool::new(&cfg.pools[0], &[], None))
    }

    const ONE: &str = r#"
[[pool]]
name = "web"
[[pool.member]]
address = "127.0.0.1:8001"
[[pool.member]]
address = "127.0.0.1:8002"
weight = 5
"#;

    #[test]
    fn only_overrides_are_saved_and_restored() {
        let p = pool(ONE);
        assert_eq!(
            snapshot(std::slice::from_ref(&p), &[])["members"],
            json!([])
        );
        p.members()[0].set_state(AdminState::Drain);
        p.members()[1].set_weight(9);
        let saved = snapshot(
            std::slice::from_ref(&p),
            &[("east".into(), "disabled".into())],
        );
        assert_eq!(saved["members"].as_array().map(Vec::len), Some(2));

        let fresh = pool(ONE);
        let (r, sites) = restore(&saved, std::slice::from_ref(&fresh));
        assert_eq!(
            r,
            Restored {
                applied: 2,
                superseded: 0
            }
        );
        assert_eq!(fresh.members()[0].state(), AdminState::Drain);
        assert_eq!(fresh.members()[1].weight(), 9);
        assert_eq!(sites, vec![("east".to_string(), AdminState::Disabled)]);
    }

    #[test]
    fn a_changed_config_value_wins_over_the_saved_override() {
        let p = pool(ONE);
        p.members()[0].set_state(AdminState::Drain);
        p.members()[1].set_weight(9);
        let saved = snapshot(&[p], &[]);
        // Meanwhile the operator edited the file: member 1 now disabled there, member 2 weight 7.
        let edited = pool(
            &ONE.replace("8001\"", "8001\"\nstate = \"disabled\"")
                .replace("weight = 5", "weight = 7"),
        );
        let (r, _) = restore(&saved, std::slice::from_ref(&edited));
        assert_eq!(r.applied, 0);
        assert_eq!(r.superseded, 2);
        assert_eq!(edited.members()[0].state(), AdminState::Disabled);
        assert_eq!(edited.members()[1].weight(), 7);
    }

    #[test]
    fn writes_atomically_and_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        assert_eq!(read(&path), Ok(None));
        let v = json!({ "version": VERSION, "members": [], "gslb_sites": [] });
        write(&path, &v).expect("write");
        assert_eq!(read(&path), Ok(Some(v)));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty());
        std::fs::write(&path, b"{not json").expect("write");
        assert!(read(&path).is_err());
    }
}

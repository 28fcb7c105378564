//! `[ha]`: runs a VRRP node (crate fulcrum-ha) whose priority follows the pools' health, serves
//! `GET /api/v1/ha` and the `fulcrum_ha_*` metrics, and resigns first on shutdown.

use std::sync::{Arc, OnceLock, Weak};

use fulcrum_admin::{Control, MetricsWriter};
use fulcrum_config::{Config, ConfigError, Ha, HaMode};
use fulcrum_ha::machine::State;
use fulcrum_ha::{Node, NodeConfig};
use serde_json::{json, Value};

/// What the config asks that this build cannot do yet is an error, not a silent no-op.
pub fn checks(config: &Config) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    if let Some(ha) = &config.ha {
        if ha.mode == HaMode::ActiveActive {
            errors.push(config.locations.error(
                "ha.mode",
                "active_active (BGP announcement of the VIPs) is not implemented in this build; use active_standby",
            ));
        }
    }
    errors
}

#[derive(Default)]
pub struct HaPlane {
    node: OnceLock<Node>,
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
        let Some(ha) = ha else { return };
        if maintenance {
            tracing::warn!("HA: starting in maintenance (saved in admin.state_file); PUT /api/v1/ha/maintenance {{\"maintenance\": false}} ends it");
        }
        if ha.sync.is_some() {
            tracing::warn!("ha.sync: state synchronisation is not implemented in this build; only VRRP failover runs");
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

    /// Resigns mastership and removes the VIPs (before connections drain, so the peer takes
    /// over at once).
    pub async fn shutdown(&self) {
        if let Some(n) = self.node.get() {
            n.shutdown().await;
        }
    }

    /// `/api/v1/ha`: `GET` the node's status; `PUT maintenance` with `{"maintenance": bool}`.
    pub fn api(&self, method: &str, path: &[&str], body: &[u8]) -> (u16, Value) {
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
            ("GET", []) => (200, status()),
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
    }
}

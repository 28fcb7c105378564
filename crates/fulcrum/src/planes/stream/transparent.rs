//! Client-address transparency (`source = "client"` on tcp, http and https services): the
//! return path the kernel needs (`fulcrum_link::transparent`), installed while a running
//! service has the key and removed when none has (reload) or at shutdown; its counters in
//! `/metrics`; and what `fulcrum check` tells the operator about it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_admin::{CounterFamily, MetricFamilies};
use fulcrum_config::Config;
use fulcrum_link::transparent::{ReturnPath, MARK, ROUTE_TABLE, RULE_PREF, TABLE};
use fulcrum_net::{ServiceStats, Transparent};
use parking_lot::Mutex;

use crate::planes::{BuildCx, CommitCx, DataPlane};

/// Whether `config` runs a service with `source = "client"`, and whether one listens on IPv6
/// (its clients, and so its member connections, are IPv6).
fn needs(config: &Config) -> Option<bool> {
    let mut found = None;
    for vs in config.virtual_services.iter().filter(|v| v.transparent()) {
        let v6 = vs.listen.iter().any(|a| a.is_ipv6());
        found = Some(found.unwrap_or(false) || v6);
    }
    found
}

/// What `fulcrum check` says about a configuration with `source = "client"`: what the host and
/// the members need. Empty without such a service.
pub fn notes(config: &Config) -> Vec<String> {
    let names: Vec<&str> = config
        .virtual_services
        .iter()
        .filter(|v| v.transparent())
        .map(|v| v.name.as_str())
        .collect();
    if names.is_empty() {
        return Vec::new();
    }
    vec![
        format!(
            "note: source = \"client\" ({}): member connections leave from the clients' own addresses, so the members must route their replies to those clients through this host (a default route, or a route to the client networks, via Fulcrum's address on the member network)",
            names.join(", ")
        ),
        format!(
            "note: source = \"client\": Fulcrum needs CAP_NET_ADMIN (root) and installs the return path itself: nftables table inet {TABLE} (packets of transparent sockets get mark {MARK:#x}), ip rule fwmark {MARK:#x} lookup {ROUTE_TABLE} pref {RULE_PREF}, ip route local 0.0.0.0/0 (and ::/0 for IPv6 listeners) dev lo table {ROUTE_TABLE}"
        ),
    ]
}

/// Installs the return path once a configuration with `source = "client"` is built (refusing
/// it when that fails). When a committed configuration has none, the return path stays while
/// client connections of the services that had it are open (their member connections still
/// need the replies), and goes with the last of them (`refresh`, every 200 ms).
#[derive(Default)]
pub struct TransparentPlane {
    path: ReturnPath,
    /// Whether the return path was in place before the configuration being applied, so an
    /// abort can take away what `complete` added; `Some` while a configuration is applied.
    before: Mutex<Option<bool>>,
    /// The counters of the services with `source = "client"`: of the configuration being
    /// applied, and of the one running.
    prepared: Mutex<Vec<Arc<ServiceStats>>>,
    running: Mutex<Vec<Arc<ServiceStats>>>,
    /// After a reload left no such service: the services whose open client connections still
    /// use the return path.
    draining: Mutex<Vec<Arc<ServiceStats>>>,
}

fn idle(services: &[Arc<ServiceStats>]) -> bool {
    services
        .iter()
        .all(|s| s.connections_active.load(Ordering::Relaxed) == 0)
}

impl TransparentPlane {
    /// Takes the return path away: at shutdown, once the connections that used it are done
    /// (the nftables table would go with the process anyway; the rule and route would not).
    pub fn remove(&self) {
        if let Err(e) = self.path.remove() {
            tracing::warn!(error = %e, "removing the return path of client-address transparency");
        }
    }
}

impl DataPlane for TransparentPlane {
    fn complete(&self, cx: &BuildCx) -> Result<(), Vec<String>> {
        *self.before.lock() = Some(self.path.installed());
        *self.prepared.lock() = cx
            .config
            .virtual_services
            .iter()
            .filter(|v| v.transparent())
            .filter_map(|v| cx.stats.get(&v.name).cloned())
            .collect();
        if let Some(v6) = needs(cx.config) {
            self.path.install(v6).map_err(|e| {
                vec![format!(
                    "source = \"client\": cannot install the return path for replies to client addresses (needs CAP_NET_ADMIN): {e}"
                )]
            })?;
        }
        Ok(())
    }

    fn commit(&self, cx: &mut CommitCx) {
        *self.before.lock() = None;
        let services = std::mem::take(&mut *self.prepared.lock());
        let mut draining = self.draining.lock();
        if needs(cx.config).is_some() {
            draining.clear();
            *self.running.lock() = services;
            return;
        }
        draining.append(&mut self.running.lock());
        if self.path.installed() && idle(&draining) {
            draining.clear();
            self.remove();
        } else if self.path.installed() {
            tracing::info!(
                "no service has source = \"client\" any more: the return path stays until their client connections have closed"
            );
        }
    }

    fn abort(&self) {
        self.prepared.lock().clear();
        if self.before.lock().take() == Some(false) && self.path.installed() {
            self.remove();
        }
    }

    fn refresh(&self, _config: &Config) {
        // Not while a configuration is being applied: it may be installing the path anew.
        let applying = self.before.lock();
        if applying.is_some() {
            return;
        }
        let mut draining = self.draining.lock();
        if !draining.is_empty() && idle(&draining) {
            draining.clear();
            self.remove();
        }
    }

    fn metrics(&self, w: &mut MetricFamilies) {
        metrics(w);
    }
}

/// `fulcrum_transparent_*` per service with `source = "client"`.
pub fn metrics(w: &mut MetricFamilies) {
    let services = Transparent::all();
    if services.is_empty() {
        return;
    }
    let families: [CounterFamily<Transparent>; 3] = [
        (
            "fulcrum_transparent_connections_total",
            "Member connections established from the client's own address (source = \"client\").",
            |t| t.connections.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_transparent_port_fallbacks_total",
            "Member connections whose client port was taken towards the member (EADDRINUSE / EADDRNOTAVAIL): made from the client's address with a port the kernel picked.",
            |t| t.port_fallbacks.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_transparent_failures_total",
            "Member connections that could not come from the client's address (family mismatch, socket option refused, no port left); not counted against the member.",
            |t| t.failures.load(Ordering::Relaxed),
        ),
    ];
    w.counters_per_vs(&families, services.iter().map(|t| (&*t.service, &**t)));
}

//! Assembly of `protocol = "udp"` virtual services: their datagram listeners (kept across
//! reloads with the flows they hold), counters and RADIUS persistence tables, and their
//! metric families.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use arc_swap::ArcSwap;
use fulcrum_admin::{CounterFamily, MetricFamilies};
use fulcrum_balance::{PersistTable, TableSpec};
use fulcrum_config::{Config, Malformed, PersistenceKind, Protocol, VirtualService};
use fulcrum_net::{DatagramListeners, ListenAddr, PreparedDatagram, StreamHandler};
use fulcrum_proxy::{RadiusPersistence, UdpService, UdpStats};
use parking_lot::Mutex;

use crate::planes::{BuildCx, CommitCx, DataPlane};

/// The udp side of the process.
pub struct UdpPlane {
    sockets_per_address: usize,
    state: Mutex<State>,
    /// Per service, for `/metrics`: read without the reload lock.
    shown: ArcSwap<Vec<(String, Arc<UdpStats>)>>,
}

#[derive(Default)]
struct State {
    listeners: DatagramListeners<UdpService>,
    stats: HashMap<String, Arc<UdpStats>>,
    /// RADIUS persistence tables by profile name: shared by the services naming the profile.
    radius: HashMap<String, Arc<PersistTable>>,
    /// The configuration being applied: its bound addresses and compiled services.
    pending: Option<(PreparedDatagram, Next)>,
}

/// What a configuration being applied adds up to, committed only if all of it worked.
#[derive(Default)]
struct Next {
    handlers: Vec<(ListenAddr, Arc<UdpService>)>,
    stats: HashMap<String, Arc<UdpStats>>,
    radius: HashMap<String, Arc<PersistTable>>,
    shown: Vec<(String, Arc<UdpStats>)>,
}

impl UdpPlane {
    pub fn new(sockets_per_address: usize) -> UdpPlane {
        UdpPlane {
            sockets_per_address,
            state: Mutex::default(),
            shown: ArcSwap::default(),
        }
    }
}

impl DataPlane for UdpPlane {
    /// Binds the udp addresses `config` adds; nothing running changes.
    fn prepare(&self, config: &Config) -> Result<(), Vec<String>> {
        let wanted: Vec<ListenAddr> = config
            .virtual_services
            .iter()
            .filter(|v| self.serves(v))
            .flat_map(|v| {
                v.listen
                    .iter()
                    .map(|a| ListenAddr::new(*a, v.vrf.as_deref()))
            })
            .collect();
        let mut state = self.state.lock();
        state.pending = None;
        let prepared = state
            .listeners
            .prepare(&wanted, self.sockets_per_address)
            .map_err(|errs| errs.iter().map(ToString::to_string).collect::<Vec<_>>())?;
        state.pending = Some((prepared, Next::default()));
        Ok(())
    }

    fn serves(&self, vs: &VirtualService) -> bool {
        vs.as_udp().is_some() && !vs.in_kernel()
    }

    /// Compiles one udp service into the pending configuration.
    fn build(
        &self,
        vs: &VirtualService,
        cx: &mut BuildCx,
    ) -> Result<Option<Arc<dyn StreamHandler>>, String> {
        let config = cx.config;
        let section = vs
            .as_udp()
            .ok_or_else(|| format!("virtual service {:?} is not udp", vs.name))?;
        let pool = cx
            .pool(vs)
            .ok_or_else(|| format!("virtual service {:?} has no pool", vs.name))?;
        let source = cx.source_persistence(vs);
        let stats = cx.stats(vs);
        let rules = fulcrum_proxy::L4Rules::compile(vs.rules(), pool.clone(), cx.pools, &stats)
            .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?;
        // Probes of passively downed members must not be TCP connects to a UDP-only server:
        // each pool the service's flows can use, when only udp services use it.
        for p in rules.pools() {
            let only_udp = config
                .virtual_services
                .iter()
                .filter(|v| uses_pool(v, &p.name))
                .all(|v| v.protocol() == Protocol::Udp);
            p.set_datagram(only_udp);
        }
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some((_, next)) = state.pending.as_mut() else {
            return Err("udp: build without prepare".into());
        };
        let udp = state.stats.get(&vs.name).cloned().unwrap_or_default();
        let radius = cx
            .persistence(vs)
            .filter(|p| p.kind == PersistenceKind::Radius)
            .and_then(|p| {
                let attribute = fulcrum_config::radius_attribute(p.attribute.as_deref()?)?;
                let spec = TableSpec {
                    idle_timeout: p.table_timeout(),
                    max_entries: p.max_entries,
                };
                let secret = crate::planes::pair::shared_secret(
                    config,
                    fulcrum_ha::sync::purpose::TABLE_HASH,
                );
                let table = next.radius.get(&p.name).cloned().unwrap_or_else(|| {
                    match state.radius.get(&p.name) {
                        Some(t) => t.respec_keyed(spec, secret),
                        None => Arc::new(PersistTable::with_key(spec, secret)),
                    }
                });
                next.radius.insert(p.name.clone(), table.clone());
                // Among the service's tables: ha.sync streams its entries, metrics count them.
                cx.tables.insert(vs.name.clone(), table.clone());
                Some(RadiusPersistence {
                    table,
                    attribute,
                    drop_malformed: p.malformed == Malformed::Drop,
                })
            });
        let service = Arc::new(UdpService {
            name: Arc::from(vs.name.as_str()),
            pool,
            rules,
            mode: section.mode,
            session_timeout: section.session_timeout,
            max_sessions: section.max_sessions,
            radius,
            source,
            stats,
            udp: udp.clone(),
            access: (!vs.access.is_empty()).then(|| Arc::new(vs.access.clone())),
        });
        for addr in &vs.listen {
            let at = ListenAddr::new(*addr, vs.vrf.as_deref());
            next.handlers.push((at, service.clone()));
        }
        next.stats.insert(vs.name.clone(), udp.clone());
        next.shown.push((vs.name.clone(), udp));
        Ok(None)
    }

    /// Installs the pending configuration: kept sockets (and their flows) get the new services,
    /// prepared ones start, the rest close.
    fn commit(&self, _cx: &mut CommitCx) {
        let mut state = self.state.lock();
        let Some((prepared, next)) = state.pending.take() else {
            return;
        };
        state.listeners.commit(prepared, next.handlers);
        state.stats = next.stats;
        state.radius = next.radius;
        self.shown.store(Arc::new(next.shown));
    }

    fn abort(&self) {
        self.state.lock().pending = None;
    }

    /// Stops receiving (shutdown): flows end with their sockets.
    fn shutdown(&self) {
        self.state.lock().listeners.close_all();
    }

    fn metrics(&self, w: &mut MetricFamilies) {
        self.write_metrics(w);
    }
}

/// Whether `vs` sends clients to pool `name` (its own pool or a rule's).
fn uses_pool(vs: &VirtualService, name: &str) -> bool {
    vs.pool.as_deref() == Some(name)
        || vs
            .rules()
            .iter()
            .any(|r| matches!(&r.action, fulcrum_config::RuleAction::Pool(p) if p == name))
}

impl UdpPlane {
    /// The udp metric families (see docs/operations.md).
    fn write_metrics(&self, w: &mut MetricFamilies) {
        let shown = self.shown.load();
        if shown.is_empty() {
            return;
        }
        let families: [CounterFamily<UdpStats>; 12] = [
            (
                "fulcrum_udp_datagrams_out_total",
                "Datagrams relayed from members to clients.",
                |s| s.datagrams_out.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_sessions_expired_total",
                "Flows ended by session_timeout.",
                |s| s.sessions_expired.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_sessions_evicted_total",
                "Flows evicted because the flow table was full (max_sessions).",
                |s| s.sessions_evicted.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_table_full_drops_total",
                "Datagrams dropped because no flow could be made.",
                |s| s.table_full.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_source_limited_total",
                "Datagrams dropped because their source had a quarter of max_sessions (at least 16) in one-way flows.",
                |s| s.source_limited.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_rescheduled_total",
                "Session flows moved to another member.",
                |s| s.rescheduled.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_foreign_replies_total",
                "Datagrams from addresses that are not members, dropped.",
                |s| s.foreign_replies.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_send_errors_total",
                "Datagrams that could not be sent.",
                |s| s.send_errors.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_icmp_errors_total",
                "ICMP errors received for datagrams sent to members.",
                |s| s.icmp_errors.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_radius_malformed_total",
                "Datagrams that were not well-formed RADIUS packets.",
                |s| s.radius_malformed.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_radius_no_attribute_total",
                "RADIUS packets without the persistence attribute.",
                |s| s.radius_no_attribute.load(Ordering::Relaxed),
            ),
            (
                "fulcrum_udp_radius_dropped_total",
                "Datagrams dropped by malformed = \"drop\".",
                |s| s.radius_dropped.load(Ordering::Relaxed),
            ),
        ];
        w.counters_per_vs(&families, shown.iter().map(|(vs, s)| (vs.as_str(), &**s)));
    }
}

//! The data-plane trait: how `App` assembles every protocol the same way, so adding one (XDP,
//! links, HA) means implementing this beside the plane's own code and listing it once in
//! `App::new`, with no central `match` on protocols to extend.
//!
//! A configuration is applied in steps that every plane takes part in, under the reload lock:
//! `prepare` acquires what can fail (sockets, files, programs) without changing what runs;
//! `build` compiles each virtual service the plane serves against the new pools; `complete`
//! sees them all at once; `commit` makes the result live. If any plane fails before `commit`, every plane is told to `abort`, and the
//! running configuration stays untouched.
//!
//! One module a plane below; `stream` holds what the stream planes (tcp, http, https, message)
//! share in front of their own handlers: admission, source address pools, client TCP tuning.

pub mod bgp;
pub mod config_sync;
pub mod dns;
pub mod ha;
pub mod http;
pub mod link;
pub mod message;
pub mod pair;
pub mod stream;
pub mod tcp;
pub mod udp;
pub mod xdp;

use std::collections::HashMap;
use std::sync::Arc;

use fulcrum_admin::{ApiRequest, MetricFamilies};
use fulcrum_balance::{PersistTable, Pool, TableSpec};
use fulcrum_config::{Config, Persistence, PersistenceKind, VirtualService};
use fulcrum_http::tls::ServerTls;
use fulcrum_net::{ServiceStats, Snat, StreamHandler, Tracker, Transparent};
use fulcrum_proxy::SourcePersistence;
use serde_json::Value;

use crate::planes::http::tls::TlsAssembly;

/// One data plane of the process.
pub trait DataPlane: Send + Sync {
    /// Step 1: acquires what `config` needs that can fail (binding new datagram addresses,
    /// compiling zones); nothing running changes. Forgets an earlier preparation that was never
    /// committed.
    fn prepare(&self, _config: &Config) -> Result<(), Vec<String>> {
        Ok(())
    }

    /// Whether this plane runs virtual service `vs`.
    fn serves(&self, _vs: &VirtualService) -> bool {
        false
    }

    /// Step 2: compiles one virtual service this plane serves. A stream service returns the
    /// handler its listening sockets hand accepted connections to; a plane with sockets of its
    /// own returns `None`.
    fn build(
        &self,
        _vs: &VirtualService,
        _cx: &mut BuildCx,
    ) -> Result<Option<Arc<dyn StreamHandler>>, String> {
        Ok(None)
    }

    /// Step 2b, once every service is built and the new stream listeners are bound: the last
    /// step that may refuse the configuration. A plane that programs the kernel for all its
    /// services at once (XDP) does it here.
    fn complete(&self, _cx: &BuildCx) -> Result<(), Vec<String>> {
        Ok(())
    }

    /// Step 3: makes what `prepare` and `build` made live.
    fn commit(&self, _cx: &mut CommitCx) {}

    /// Another plane failed after this one prepared: drops the preparation.
    fn abort(&self) {}

    /// Every 200 ms, after the pools' refresh: follow what changes between reloads.
    fn refresh(&self, _config: &Config) {}

    /// Stops serving at shutdown (established connections are waited for by the tracker).
    fn shutdown(&self) {}

    /// Writes this plane's metric families at each scrape of `/metrics`: the plane is
    /// registered once as a collector, so this reads whatever the last commit made live.
    fn metrics(&self, _out: &mut MetricFamilies) {}

    /// Answers the routes this plane adds under `/api/v1/`; `None` if the route is not its own.
    fn api(&self, _request: &ApiRequest) -> Option<(u16, Value)> {
        None
    }
}

/// What building a configuration's services shares: the new pools, and the per-service state
/// kept across reloads by service name (counters, persistence tables).
pub struct BuildCx<'a> {
    pub config: &'a Config,
    pub pools: &'a [Arc<Pool>],
    pub tracker: &'a Arc<Tracker>,
    /// TLS termination state by service name (ticket keys, session caches, counters), for
    /// every service with `tls` whatever its plane.
    tls: &'a TlsAssembly,
    old_stats: &'a HashMap<String, Arc<ServiceStats>>,
    old_tables: &'a HashMap<String, Arc<PersistTable>>,
    pub(crate) stats: HashMap<String, Arc<ServiceStats>>,
    pub(crate) tables: HashMap<String, Arc<PersistTable>>,
}

impl<'a> BuildCx<'a> {
    pub fn new(
        config: &'a Config,
        pools: &'a [Arc<Pool>],
        tracker: &'a Arc<Tracker>,
        tls: &'a TlsAssembly,
        old_stats: &'a HashMap<String, Arc<ServiceStats>>,
        old_tables: &'a HashMap<String, Arc<PersistTable>>,
    ) -> BuildCx<'a> {
        BuildCx {
            config,
            pools,
            tracker,
            tls,
            old_stats,
            old_tables,
            stats: HashMap::new(),
            tables: HashMap::new(),
        }
    }

    /// The service's counters: the same object as before the reload when the name stays.
    pub fn stats(&mut self, vs: &VirtualService) -> Arc<ServiceStats> {
        let st = self
            .stats
            .get(&vs.name)
            .or_else(|| self.old_stats.get(&vs.name))
            .cloned()
            .unwrap_or_default();
        self.stats.insert(vs.name.clone(), st.clone());
        st
    }

    /// The service's default pool.
    pub fn pool(&self, vs: &VirtualService) -> Option<Arc<Pool>> {
        let name = vs.pool.as_ref()?;
        self.pools.iter().find(|p| &*p.name == name).cloned()
    }

    /// The service's persistence profile, if it names one.
    pub fn persistence(&self, vs: &VirtualService) -> Option<&'a Persistence> {
        vs.persistence
            .as_ref()
            .and_then(|n| self.config.persistence(n))
    }

    /// The service's persistence table when its profile is one of `kinds`: the table it had
    /// before the reload (entries kept, bounds updated) or a new one.
    pub fn table(
        &mut self,
        vs: &VirtualService,
        kinds: &[PersistenceKind],
    ) -> Option<(Arc<PersistTable>, &'a Persistence)> {
        let profile = self.persistence(vs).filter(|p| kinds.contains(&p.kind))?;
        let spec = TableSpec {
            idle_timeout: profile.table_timeout(),
            max_entries: profile.max_entries,
        };
        // With ha.sync, byte keys hash under the secret both nodes derive, so entries travel.
        let secret =
            crate::planes::pair::shared_secret(self.config, fulcrum_ha::sync::purpose::TABLE_HASH);
        let table = match self
            .tables
            .get(&vs.name)
            .or_else(|| self.old_tables.get(&vs.name))
        {
            Some(t) => t.respec_keyed(spec, secret),
            None => Arc::new(PersistTable::with_key(spec, secret)),
        };
        self.tables.insert(vs.name.clone(), table.clone());
        Some((table, profile))
    }

    /// TLS termination of a service with `tls` (https, and tcp or message with TLS offload),
    /// keeping its ticket keys, session cache and counters across reloads.
    pub fn stream_tls(&self, vs: &VirtualService) -> Result<Option<Arc<ServerTls>>, String> {
        if vs.tls().is_none() {
            return Ok(None);
        }
        self.tls
            .server(vs, self.config)
            .map(Some)
            .map_err(|e| format!("virtual service {:?}: {e}", vs.name))
    }

    /// The service's pool of source addresses for member connections (`snat`), if any.
    pub fn snat(&self, vs: &VirtualService) -> Result<Option<Arc<Snat>>, String> {
        Snat::for_service(&vs.name, vs.snat())
            .map_err(|e| format!("virtual service {:?}: {e}", vs.name))
    }

    /// The service's transparency counters when it has `source = "client"` (kept across
    /// reloads by service name).
    pub fn transparent(&self, vs: &VirtualService) -> Option<Arc<Transparent>> {
        vs.transparent().then(|| Transparent::for_service(&vs.name))
    }

    /// `source_ip` persistence of an L4 service (tcp, udp, message).
    pub fn source_persistence(&mut self, vs: &VirtualService) -> Option<SourcePersistence> {
        let (table, p) = self.table(vs, &[PersistenceKind::SourceIp])?;
        Some(SourcePersistence {
            table,
            mask_v4: p.source_mask,
            mask_v6: p.source_mask_v6,
        })
    }
}

/// What committing shares: the configuration and pools now running, and the pools planes add
/// for health checking (GSLB site addresses).
pub struct CommitCx<'a> {
    pub config: &'a Config,
    pub pools: &'a [Arc<Pool>],
    /// The persistence tables now in force, by service name (HA streams their entries).
    pub tables: &'a HashMap<String, Arc<PersistTable>>,
    pub checked_pools: Vec<Arc<Pool>>,
}

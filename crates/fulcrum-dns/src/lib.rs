//! Fulcrum's DNS: an authoritative server (zones from master files and inline records) whose
//! GSLB names are answered by site health, client region and load, IP tables (ISP lists and
//! GeoIP), and the exchange of site state between Fulcrum instances.
//!
//! The binary drives it through [`DnsRuntime`]: `prepare` compiles a configuration and binds
//! the addresses it adds (nothing running changes if either fails), `commit` swaps it in.

pub mod catalog;
pub mod engine;
pub mod exchange;
pub mod gslb;
pub mod iptable;
pub mod learnt;
pub mod proximity;
pub mod rrl;
pub mod server;
pub mod service;
pub mod table;
pub mod wire;
pub mod zone;

use std::sync::Arc;

use fulcrum_balance::Pool;
use fulcrum_config::{Config, ConfigError};
use parking_lot::Mutex;

pub use engine::{Action, Counters, Engine, Transport};
pub use gslb::{Client, GslbState};
pub use server::{DnsServer, Registry};
pub use service::{GslbService, PeerStatus, RedirectTarget};

use catalog::Catalog;
use iptable::{GeoCache, Locator};

/// A configuration compiled for answering: zones and tables loaded and checked.
pub struct Compiled {
    pub catalog: Catalog,
    pub locator: Arc<Locator>,
}

/// Loads the zones, zone files, prefix files and GeoIP databases `config` names. Every problem
/// is a located config error: inline records and tables at their key, zone files at their own
/// file and line.
pub fn compile(config: &Config, geo_cache: &mut GeoCache) -> Result<Compiled, Vec<ConfigError>> {
    let loc = &config.locations;
    let mut errors = Vec::new();
    for (i, n) in config.gslb.names.iter().enumerate() {
        if n.sites.len() > gslb::MAX_SITES {
            errors.push(loc.error(
                &format!("gslb.name[{i}].sites"),
                format!(
                    "{} sites; a name may have at most {}",
                    n.sites.len(),
                    gslb::MAX_SITES
                ),
            ));
        }
        if n.answers > gslb::MAX_ANSWERS {
            errors.push(loc.error(
                &format!("gslb.name[{i}].answers"),
                format!(
                    "{} is more than {} addresses per answer",
                    n.answers,
                    gslb::MAX_ANSWERS
                ),
            ));
        }
        if let Err(e) = zone::parse_name(&n.fqdn) {
            errors.push(loc.error(&format!("gslb.name[{i}].fqdn"), e));
        }
    }
    if let Some(dns) = &config.dns {
        if dns.udp_payload > 4096 {
            errors.push(loc.error(
                "dns.udp_payload",
                format!(
                    "{} is above 4096, the largest UDP response Fulcrum sends",
                    dns.udp_payload
                ),
            ));
        }
        if dns.tcp_idle_timeout.is_zero() {
            errors.push(loc.error("dns.tcp_idle_timeout", "must be longer than 0s"));
        }
    }
    let locator = match Locator::build(&config.ip_tables, geo_cache) {
        Ok(l) => Some(l),
        Err(es) => {
            errors.extend(es.into_iter().map(|e| loc.error(&e.key, e.message)));
            None
        }
    };
    let gslb_names: Vec<Vec<u8>> = config
        .gslb
        .names
        .iter()
        .filter_map(|n| zone::parse_name(&n.fqdn).ok())
        .collect();
    let catalog = match Catalog::build(config.dns.as_ref(), &gslb_names) {
        Ok(c) => Some(c),
        Err(es) => {
            for e in es {
                errors.push(match e.file {
                    Some((path, line)) => ConfigError {
                        file: path.display().to_string(),
                        line,
                        column: if line > 0 { 1 } else { 0 },
                        key: e.key,
                        message: e.message,
                    },
                    None => loc.error(&e.key, e.message),
                });
            }
            None
        }
    };
    match (catalog, locator) {
        (Some(catalog), Some(locator)) if errors.is_empty() => Ok(Compiled {
            catalog,
            locator: Arc::new(locator),
        }),
        _ => Err(errors),
    }
}

/// Whether the config uses DNS or GSLB at all.
pub fn configured(config: &Config) -> bool {
    config.dns.is_some() || !config.gslb.sites.is_empty() || !config.gslb.names.is_empty()
}

/// Addresses, sockets and state a new configuration needs, ready to commit.
pub struct Prepared {
    compiled: Compiled,
    server: Option<server::Prepared>,
    exchange_listener: Option<std::net::TcpListener>,
}

/// DNS and GSLB in a running process, kept across reloads.
pub struct DnsRuntime {
    server: Mutex<DnsServer>,
    gslb: GslbService,
    geo_cache: Mutex<GeoCache>,
    sockets_per_address: usize,
}

impl DnsRuntime {
    /// Starts with nothing configured; must be called in a tokio runtime.
    pub fn new(sockets_per_address: usize) -> DnsRuntime {
        let empty = Arc::new(Locator::default());
        let state = GslbState::build(&Config::default(), empty.clone(), None);
        let engine = Engine {
            catalog: Catalog::default(),
            gslb: Arc::new(GslbState::build(&Config::default(), empty, None)),
            udp_payload: 1232,
            rrl: None,
        };
        DnsRuntime {
            server: Mutex::new(DnsServer::new(engine)),
            gslb: GslbService::new(state),
            geo_cache: Mutex::new(GeoCache::new()),
            sockets_per_address,
        }
    }

    /// Compiles `config` and binds the DNS and exchange addresses it adds. Errors leave
    /// everything running as it was.
    pub fn prepare(&self, config: &Config) -> Result<Prepared, Vec<String>> {
        let compiled = compile(config, &mut self.geo_cache.lock())
            .map_err(|e| e.iter().map(ToString::to_string).collect::<Vec<_>>())?;
        let wanted = config
            .dns
            .as_ref()
            .map(|d| d.listen.clone())
            .unwrap_or_default();
        let server = self
            .server
            .lock()
            .prepare(&wanted, self.sockets_per_address)?;
        let exchange_listener = self.gslb.prepare_listener(config).map_err(|e| vec![e])?;
        Ok(Prepared {
            compiled,
            server: Some(server),
            exchange_listener,
        })
    }

    /// Swaps the prepared configuration in. Returns the pools of site addresses, which the
    /// caller hands to `HealthService::apply` together with its own pools. `local_pools` are
    /// the pools this instance serves (the local site's own capacity figures).
    pub fn commit(
        &self,
        mut p: Prepared,
        config: &Config,
        local_pools: Vec<Arc<Pool>>,
    ) -> Vec<Arc<Pool>> {
        let previous = self.gslb.state();
        let state = GslbState::build(config, p.compiled.locator.clone(), Some(&previous));
        let site_pools = state.site_pools();
        let services = learnt::LocalService::from_config(config, &local_pools);
        self.gslb.apply(
            state,
            config,
            p.exchange_listener.take(),
            local_pools,
            services,
        );
        let engine = Engine {
            catalog: p.compiled.catalog,
            gslb: self.gslb.state(),
            udp_payload: config.dns.as_ref().map_or(1232, |d| d.udp_payload),
            rrl: config
                .dns
                .as_ref()
                .and_then(|d| d.rate_limit.as_ref())
                .map(|r| Arc::new(rrl::Rrl::new(r))),
        };
        let wanted = config
            .dns
            .as_ref()
            .map(|d| d.listen.clone())
            .unwrap_or_default();
        let idle = config
            .dns
            .as_ref()
            .map_or(std::time::Duration::from_secs(10), |d| d.tcp_idle_timeout);
        if let Some(prepared) = p.server.take() {
            self.server.lock().commit(prepared, &wanted, engine, idle);
        }
        site_pools
    }

    pub fn gslb(&self) -> &GslbService {
        &self.gslb
    }

    pub fn engine(&self) -> Arc<Engine> {
        self.server.lock().engine()
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.server.lock().registry.clone()
    }

    /// Stops the listeners and the exchange.
    pub fn shutdown(&self) {
        self.server.lock().close_all();
        self.gslb.shutdown();
    }
}

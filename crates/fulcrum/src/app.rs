//! Assembly: a validated `Config` becomes a `Snapshot` of pools and services behind listeners;
//! a reload builds the next snapshot beside the running one and swaps it in whole.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use fulcrum_admin::{Control, ServiceInfo};
use fulcrum_balance::{PersistTable, Pool, TableSpec};
use fulcrum_config::{Config, ConfigError, PersistenceKind, Protocol};
use fulcrum_health::HealthService;
use fulcrum_proxy::listener::default_sockets_per_address;
use fulcrum_proxy::{
    Listeners, ServiceStats, SourcePersistence, StreamHandler, TcpService, Tracker,
};
use parking_lot::Mutex;

/// How often pools recompute dynamic weights (slow start, agents, measured speed and traffic).
const REFRESH_EVERY: Duration = Duration::from_millis(200);

/// Where the configuration comes from.
pub enum Source {
    File(PathBuf),
    /// Demo mode: built-in text.
    Inline {
        name: String,
        text: String,
    },
}

impl Source {
    pub fn load(&self) -> Result<Config, Vec<String>> {
        let parsed = match self {
            Source::File(path) => fulcrum_config::load(path),
            Source::Inline { name, text } => fulcrum_config::parse(text, name, Path::new(".")),
        };
        let config = parsed.map_err(|e| e.messages())?;
        let errors = runtime_checks(&config);
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(errors.iter().map(ToString::to_string).collect())
        }
    }
}

/// Checks that need more than the config's own text: the zone, prefix and GeoIP files DNS and
/// GSLB load, and the certificates and keys of https services and TLS pools.
fn runtime_checks(config: &Config) -> Vec<ConfigError> {
    let mut errors = crate::dns::checks(config);
    errors.extend(crate::https::checks(config));
    errors.extend(crate::tuning::checks(config));
    errors.extend(crate::link::checks(config));
    errors
}

/// `fulcrum check`: the summary of a valid config, or every error.
pub fn check(path: &Path) -> Result<String, Vec<String>> {
    let c = Source::File(path.to_path_buf()).load()?;
    Ok(format!(
        "{} virtual services, {} pools, {} monitors{}",
        c.virtual_services.len(),
        c.pools.len(),
        c.monitors.len(),
        crate::dns::summary(&c) + &crate::link::summary(&c)
    ))
}

/// What the data planes and the API read; replaced whole on reload.
pub struct Snapshot {
    pub config: Arc<Config>,
    pub pools: Vec<Arc<Pool>>,
    pub services: Vec<ServiceInfo>,
}

/// State that only the (serialised) reload path touches.
struct Assembly {
    listeners: Listeners,
    stats: HashMap<String, Arc<ServiceStats>>,
    tables: HashMap<String, Arc<PersistTable>>,
}

pub struct App {
    source: Source,
    snapshot: ArcSwap<Snapshot>,
    assembly: Mutex<Assembly>,
    generation: AtomicU64,
    tracker: Arc<Tracker>,
    health: HealthService,
    dns: Arc<crate::dns::Dns>,
    sockets_per_address: usize,
    udp: crate::udp::Udp,
    messages: crate::message::Messages,
    http: crate::http::HttpAssembly,
    links: crate::link::LinkPlane,
}

impl App {
    fn new(source: Source, workers: usize) -> App {
        App {
            source,
            snapshot: ArcSwap::from_pointee(Snapshot {
                config: Arc::new(Config::default()),
                pools: Vec::new(),
                services: Vec::new(),
            }),
            assembly: Mutex::new(Assembly {
                listeners: Listeners::default(),
                stats: HashMap::new(),
                tables: HashMap::new(),
            }),
            generation: AtomicU64::new(0),
            tracker: Arc::new(Tracker::default()),
            health: HealthService::new(),
            dns: Arc::new(crate::dns::Dns::new(default_sockets_per_address(workers))),
            sockets_per_address: default_sockets_per_address(workers),
            udp: crate::udp::Udp::default(),
            messages: crate::message::Messages::default(),
            http: crate::http::HttpAssembly::new(),
            links: crate::link::LinkPlane::default(),
        }
    }

    /// Applies `config`: binds new addresses first (a failure changes nothing), then builds the
    /// pools (keeping members that stay, with their health and counters) and services, swaps
    /// listeners' handlers and the snapshot, and retargets the health checks.
    fn apply(&self, config: Config) -> Result<u64, Vec<String>> {
        let mut asm = self.assembly.lock();
        let wanted: Vec<SocketAddr> = config
            .virtual_services
            .iter()
            .filter(|v| !v.protocol.is_datagram())
            .flat_map(|v| v.listen.iter().copied())
            .collect();
        let prepared = asm
            .listeners
            .prepare(&wanted, self.sockets_per_address)
            .map_err(|errs| errs.iter().map(ToString::to_string).collect::<Vec<_>>())?;
        let udp_prepared = self.udp.prepare(&config, self.sockets_per_address)?;
        let mut udp_next = crate::udp::Next::default();
        let dns = self.dns.prepare(&config)?;
        self.links.apply(&config)?;

        self.messages.begin();
        let old = self.snapshot.load_full();
        let pools: Vec<Arc<Pool>> = config
            .pools
            .iter()
            .map(|pc| {
                let previous = old.pools.iter().find(|p| *p.name == pc.name);
                let checks = fulcrum_health::check_specs(pc, &config.monitors);
                Arc::new(Pool::new(pc, &checks, previous.map(|p| p.as_ref())))
            })
            .collect();

        let mut handlers: Vec<(SocketAddr, Arc<dyn StreamHandler>)> = Vec::new();
        let mut services = Vec::new();
        let mut stats = HashMap::new();
        let mut tables = HashMap::new();
        let mut http_build = crate::http::HttpBuild::default();
        for vs in &config.virtual_services {
            let st = asm.stats.get(&vs.name).cloned().unwrap_or_default();
            stats.insert(vs.name.clone(), st.clone());
            let pool = vs
                .pool
                .as_ref()
                .and_then(|name| pools.iter().find(|p| &*p.name == name))
                .cloned();
            let persistence = vs.persistence.as_ref().and_then(|n| config.persistence(n));
            let source_persistence = persistence
                .filter(|p| p.kind == PersistenceKind::SourceIp)
                .map(|p| {
                    let spec = TableSpec {
                        idle_timeout: p.table_timeout(),
                        max_entries: p.max_entries,
                    };
                    let table = match asm.tables.get(&vs.name) {
                        Some(t) => t.respec(spec),
                        None => Arc::new(PersistTable::new(spec)),
                    };
                    tables.insert(vs.name.clone(), table.clone());
                    SourcePersistence {
                        table,
                        mask_v4: p.source_mask,
                        mask_v6: p.source_mask_v6,
                    }
                });
            if let (Protocol::Udp, Some(pool)) = (vs.protocol, &pool) {
                self.udp.build(
                    vs,
                    &config,
                    pool.clone(),
                    st.clone(),
                    source_persistence,
                    &mut udp_next,
                );
                services.push(ServiceInfo {
                    name: vs.name.clone(),
                    protocol: vs.protocol,
                    listen: vs.listen.clone(),
                    stats: st,
                });
                continue;
            }
            let handler: Arc<dyn StreamHandler> = match (vs.protocol, pool) {
                (Protocol::Tcp, Some(pool)) => Arc::new(TcpService {
                    name: Arc::from(vs.name.as_str()),
                    pool,
                    persistence: source_persistence,
                    proxy_protocol: vs.proxy_protocol,
                    idle_timeout: vs.idle_timeout,
                    max_connections: vs.max_connections,
                    splice: true,
                    stats: st.clone(),
                    tracker: self.tracker.clone(),
                }),
                (Protocol::Message, Some(pool)) => {
                    self.messages
                        .handler(vs, pool, st.clone(), source_persistence, &self.tracker)
                }
                (Protocol::Http | Protocol::Https, _) => self
                    .http
                    .service(
                        vs,
                        &config,
                        &pools,
                        st.clone(),
                        &asm.tables,
                        &mut tables,
                        &self.tracker,
                        &self.dns,
                        &mut http_build,
                    )
                    .map_err(|e| vec![e])?,
                // runtime_checks refused everything else before we got here.
                _ => {
                    return Err(vec![format!(
                        "virtual service {:?} cannot run in this build",
                        vs.name
                    )])
                }
            };
            for addr in &vs.listen {
                handlers.push((*addr, handler.clone()));
            }
            services.push(ServiceInfo {
                name: vs.name.clone(),
                protocol: vs.protocol,
                listen: vs.listen.clone(),
                stats: st,
            });
        }

        asm.listeners
            .commit(prepared, handlers)
            .map_err(|e| vec![format!("cannot start listening: {e}")])?;
        crate::tuning::apply(&mut asm.listeners, &config);
        self.udp.commit(udp_prepared, udp_next);
        self.messages.commit();
        asm.stats = stats;
        asm.tables = tables;
        let site_pools = self.dns.commit(dns, &config, &pools);
        self.http.commit(&pools, http_build);
        self.health
            .apply(&[pools.as_slice(), &site_pools].concat(), &config.monitors);
        self.snapshot.store(Arc::new(Snapshot {
            config: Arc::new(config),
            pools,
            services,
        }));
        Ok(self.generation.fetch_add(1, Ordering::AcqRel) + 1)
    }

    fn reload_now(&self) -> Result<u64, Vec<String>> {
        let config = self.source.load()?;
        let before = self.snapshot.load();
        if config.admin.listen != before.config.admin.listen {
            tracing::warn!(from = %before.config.admin.listen, to = %config.admin.listen, "admin.listen changes take effect at the next restart");
        }
        if config.global.workers != before.config.global.workers {
            tracing::warn!(
                from = before.config.global.workers,
                to = config.global.workers,
                "global.workers changes take effect at the next restart"
            );
        }
        let generation = self.apply(config)?;
        tracing::info!(generation, "configuration reloaded");
        Ok(generation)
    }

    fn refresh_pools(&self) {
        let snapshot = self.snapshot.load();
        for p in &snapshot.pools {
            p.refresh();
        }
        self.links.sync_gslb(&snapshot.config, &self.dns);
    }

    /// Stops accepting, then waits for connections to finish, up to the configured deadline.
    async fn shutdown(&self) {
        let deadline = self.snapshot.load().config.global.shutdown_timeout;
        self.assembly.lock().listeners.close_all();
        self.udp.close_all();
        self.dns.shutdown();
        self.health.shutdown();
        self.http.retire_all();
        self.links.shutdown().await;
        let active = self.tracker.active();
        if active > 0 {
            tracing::info!(connections = active, deadline = ?deadline, "stopped accepting; waiting for connections to finish");
        }
        let left = self.tracker.wait_idle(deadline).await;
        if left > 0 {
            tracing::warn!(
                connections = left,
                "shutdown deadline reached; closing remaining connections"
            );
        }
    }
}

impl Control for App {
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn services(&self) -> Vec<ServiceInfo> {
        self.snapshot.load().services.clone()
    }

    fn pools(&self) -> Vec<Arc<Pool>> {
        self.snapshot.load().pools.clone()
    }

    fn admin_token(&self) -> Option<Arc<str>> {
        self.snapshot
            .load()
            .config
            .admin
            .token
            .as_deref()
            .map(Arc::from)
    }

    fn extra_metrics(&self, out: &mut fulcrum_admin::MetricsWriter) {
        self.udp.metrics(out);
        self.dns.metrics(out);
        self.messages.write_metrics(out);
        self.http.metrics(out);
        self.links.metrics(out);
    }

    fn links_api(&self) -> serde_json::Value {
        self.links.api()
    }

    fn gslb_api(&self, method: &str, path: &[&str], body: &[u8]) -> (u16, serde_json::Value) {
        self.dns.api(method, path, body)
    }

    fn cache_api(
        &self,
        method: &str,
        service: &str,
        query: &[(String, String)],
    ) -> (u16, serde_json::Value) {
        self.http.cache_api(method, service, query)
    }

    fn reload(&self) -> Result<u64, Vec<String>> {
        let r = self.reload_now();
        if let Err(errors) = &r {
            tracing::error!(errors = %errors.join("; "), "reload refused; the running configuration stays");
        }
        r
    }
}

/// Builds the runtime, runs `setup` in it (demo backends), applies `config`, serves the admin API
/// and handles signals until shutdown.
pub fn run_blocking<F, Fut, G>(source: Source, config: Config, setup: F) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<G, String>>,
{
    let workers = match config.global.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .thread_name("fulcrum-worker")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let _guard = match setup().await {
            Ok(g) => g,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        let admin_addr = config.admin.listen;
        let app = Arc::new(App::new(source, workers));
        if let Err(errors) = app.apply(config) {
            for e in errors {
                eprintln!("{e}");
            }
            return ExitCode::FAILURE;
        }
        let admin = match tokio::net::TcpListener::bind(admin_addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("cannot listen on {admin_addr} (admin.listen): {e}");
                return ExitCode::FAILURE;
            }
        };
        tokio::spawn(fulcrum_admin::serve(admin, app.clone()));
        let ticker = app.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(REFRESH_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                ticker.refresh_pools();
            }
        });
        let services = app.services();
        for s in &services {
            let listen: Vec<String> = s.listen.iter().map(ToString::to_string).collect();
            tracing::info!(service = %s.name, protocol = %s.protocol, listen = %listen.join(","), "listening");
        }
        tracing::info!(admin = %admin_addr, version = env!("CARGO_PKG_VERSION"), "fulcrum is running");
        wait_for_signals(&app).await;
        app.shutdown().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

async fn wait_for_signals(app: &Arc<App>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut hup), Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; running until killed");
        std::future::pending::<()>().await;
        return;
    };
    loop {
        tokio::select! {
            _ = hup.recv() => {
                tracing::info!("SIGHUP: reloading");
                let app = app.clone();
                let _ = tokio::task::spawn_blocking(move || app.reload()).await;
            }
            _ = term.recv() => { tracing::info!("SIGTERM: shutting down (a second SIGTERM or SIGINT stops at once)"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: shutting down (a second SIGINT or SIGTERM stops at once)"); break; }
        }
    }
    // While connections drain, another SIGTERM or SIGINT means "now".
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal: stopping without waiting for connections");
        std::process::exit(130);
    });
}

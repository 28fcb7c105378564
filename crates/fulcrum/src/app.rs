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
use fulcrum_admin::{ApiRequest, Control, ServiceInfo};
use fulcrum_balance::{PersistTable, Pool};
use fulcrum_config::{Config, ConfigError};
use fulcrum_health::HealthService;
use fulcrum_net::listener::default_sockets_per_address;
use fulcrum_net::{ListenAddr, Listeners, Prepared, ServiceStats, StreamHandler, Tracker};
use parking_lot::Mutex;

use crate::planes::{BuildCx, CommitCx, DataPlane};

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
    /// The configuration file, when there is one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Source::File(path) => Some(path),
            Source::Inline { .. } => None,
        }
    }

    pub fn load(&self) -> Result<Config, Vec<String>> {
        let parsed = match self {
            Source::File(path) => fulcrum_config::load(path),
            Source::Inline { name, text } => fulcrum_config::parse(text, name, Path::new(".")),
        };
        Self::checked(parsed)
    }

    /// What `fulcrum check` would say of `text` as this source's file: the configuration
    /// API's validation, with the same messages.
    pub fn validate(&self, text: &str) -> Result<Config, Vec<String>> {
        let parsed = match self {
            Source::File(path) => fulcrum_config::parse(
                text,
                &path.display().to_string(),
                &path.parent().map(Path::to_path_buf).unwrap_or_default(),
            ),
            Source::Inline { name, .. } => fulcrum_config::parse(text, name, Path::new(".")),
        };
        Self::checked(parsed)
    }

    fn checked(
        parsed: Result<Config, fulcrum_config::ConfigErrors>,
    ) -> Result<Config, Vec<String>> {
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
    let mut errors = crate::planes::dns::checks(config);
    errors.extend(crate::planes::http::tls::checks(config));
    errors.extend(crate::planes::http::filters::checks(config));
    errors.extend(crate::planes::stream::tuning::checks(config));
    errors.extend(crate::planes::ha::checks(config));
    errors.extend(crate::planes::link::checks(config));
    errors
}

/// `fulcrum check`: the summary of a valid config, or every error.
/// `fulcrum check`: the summary of a valid configuration, and notes on what it needs of the
/// host (printed after the summary).
pub fn check(path: &Path) -> Result<(String, Vec<String>), Vec<String>> {
    let c = Source::File(path.to_path_buf()).load()?;
    let summary = format!(
        "{} virtual services, {} pools, {} monitors{}",
        c.virtual_services.len(),
        c.pools.len(),
        c.monitors.len(),
        crate::planes::dns::summary(&c) + &crate::planes::link::summary(&c)
    );
    let mut notes = crate::planes::stream::transparent::notes(&c);
    notes.extend(crate::planes::dns::notes(&c));
    Ok((summary, notes))
}

/// What the data planes and the API read; replaced whole on reload.
pub struct Snapshot {
    pub config: Arc<Config>,
    pub pools: Vec<Arc<Pool>>,
    pub services: Vec<ServiceInfo>,
}

/// State that only the (serialised) reload path touches.
struct Assembly {
    /// The stream listeners every tcp, http(s) and message service shares.
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
    sockets_per_address: usize,
    /// Every data plane, in commit order; each serves the virtual services it claims.
    planes: Vec<Arc<dyn DataPlane>>,
    /// Serialises writers of `admin.state_file`.
    state_lock: Mutex<()>,
    /// VRRP: a control-plane component; it also shows itself to the API and metrics through
    /// the plane list.
    ha: Arc<crate::planes::ha::HaPlane>,
    /// Where the admin API is bound (set at start; `admin.listen` changes need a restart).
    admin_bound: SocketAddr,
    admin_access: ArcSwap<fulcrum_admin::Access>,
    cap: Arc<crate::limits::GlobalCap>,
    /// TLS termination state of every service with `tls`, by name (shared by the planes).
    tls: Arc<crate::planes::http::tls::TlsAssembly>,
    /// Link and gateway load balancing: in the plane list, and here for its async shutdown.
    links: Arc<crate::planes::link::LinkPlane>,
    /// The return path of `source = "client"`: in the plane list, and here to be removed once
    /// the connections that use it have finished.
    transparent: Arc<crate::planes::stream::transparent::TransparentPlane>,
    /// The configuration API's versions and write path (a process started from a file).
    config_store: Option<crate::config_store::ConfigStore>,
}

impl App {
    fn new(
        source: Source,
        workers: usize,
        admin_bound: SocketAddr,
        access: fulcrum_admin::Access,
    ) -> App {
        let config_store = source.file().and_then(|f| {
            crate::config_store::ConfigStore::open(f)
                .map_err(|e| tracing::warn!(error = %e, "the configuration API cannot keep versions; writes through it are refused"))
                .ok()
        });
        let tracker = Arc::new(Tracker::default());
        let sockets_per_address = default_sockets_per_address(workers);
        let dns = Arc::new(crate::planes::dns::DnsPlane::new(sockets_per_address));
        let ha = Arc::new(crate::planes::ha::HaPlane::default());
        let xdp = Arc::new(crate::planes::xdp::XdpPlane::default());
        ha.set_flow_sync(xdp.flow_sync());
        let tls = Arc::new(crate::planes::http::tls::TlsAssembly::default());
        let links = Arc::new(crate::planes::link::LinkPlane::new(dns.clone()));
        let transparent = Arc::new(crate::planes::stream::transparent::TransparentPlane::default());
        // In-kernel forwarding first: it claims the tcp/udp services with `forwarding` other
        // than "proxy" before the proxies do.
        let planes: Vec<Arc<dyn DataPlane>> = vec![
            xdp,
            Arc::new(crate::planes::tcp::TcpPlane),
            Arc::new(crate::planes::udp::UdpPlane::new(sockets_per_address)),
            Arc::new(crate::planes::message::MessagePlane::default()),
            dns.clone(),
            Arc::new(crate::planes::http::HttpPlane::new(dns, tls.clone())),
            ha.clone(),
            links.clone(),
            transparent.clone(),
        ];
        App {
            cap: Arc::new(crate::limits::GlobalCap::new(tracker.clone())),
            admin_bound,
            admin_access: ArcSwap::from_pointee(access),
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
            tracker,
            health: HealthService::new(),
            sockets_per_address,
            planes,
            state_lock: Mutex::new(()),
            ha,
            tls,
            links,
            transparent,
            config_store,
        }
    }

    /// After an API change (`operator`: of member or site state, which `ha.sync` shares with
    /// the peers) or a reload: rewrite `admin.state_file` and publish the state to the peers.
    fn save_api_state(&self, operator: bool) {
        if operator {
            self.ha.operator_changed();
        }
        let _one_writer = self.state_lock.lock();
        self.ha.publish(self);
        if let Some(path) = self.snapshot.load().config.admin.state_file.clone() {
            crate::state_file::save(self, &path, self.ha.changed_at());
        }
    }

    /// Applies `config`: every plane prepares (binding new addresses; a failure changes
    /// nothing), the pools are built (keeping members that stay, with their health and
    /// counters), every virtual service is built by its plane, the stream listeners bind what
    /// is new; then listeners, planes and the snapshot switch over and the health checks are
    /// retargeted.
    fn apply(&self, mut config: Config) -> Result<u64, Vec<String>> {
        crate::admin::fill_cookie_secrets(&mut config).map_err(|e| vec![e])?;
        let mut asm = self.assembly.lock();
        let abort = || {
            for plane in &self.planes {
                plane.abort();
            }
        };
        let built = self.build(&config, &mut asm);
        let (pools, services, handlers, stats, tables, prepared) = match built {
            Ok(b) => b,
            Err(errors) => {
                abort();
                return Err(errors);
            }
        };
        self.cap.configure(config.global.max_connections);
        if let Err(e) = asm.listeners.commit(prepared, handlers) {
            abort();
            return Err(vec![format!("cannot start listening: {e}")]);
        }
        crate::planes::stream::tuning::apply(&mut asm.listeners, &config);
        asm.stats = stats;
        asm.tables = tables;
        let mut cx = CommitCx {
            config: &config,
            pools: &pools,
            tables: &asm.tables,
            checked_pools: pools.clone(),
        };
        for plane in &self.planes {
            plane.commit(&mut cx);
        }
        // State kept by service name for whichever plane runs the service: TLS sessions and
        // counters, SNAT pools. Services that left drop theirs.
        let runs = |name: &str, uses: &dyn Fn(&fulcrum_config::VirtualService) -> bool| {
            config
                .virtual_services
                .iter()
                .any(|v| v.name == name && uses(v))
        };
        self.tls.retain(&|name| runs(name, &|v| v.tls().is_some()));
        fulcrum_net::Snat::retain(&|name| runs(name, &|v| !v.snat().is_empty()));
        fulcrum_net::Transparent::retain(&|name| runs(name, &|v| v.transparent()));
        let checked = cx.checked_pools;
        self.health.apply(&checked, &config.monitors);
        self.snapshot.store(Arc::new(Snapshot {
            config: Arc::new(config),
            pools,
            services,
        }));
        Ok(self.generation.fetch_add(1, Ordering::AcqRel) + 1)
    }

    /// The steps of `apply` that change nothing running: planes prepare, pools and services are
    /// built, new stream listeners are bound (not yet accepting), planes complete.
    #[allow(clippy::type_complexity)]
    fn build(
        &self,
        config: &Config,
        asm: &mut Assembly,
    ) -> Result<
        (
            Vec<Arc<Pool>>,
            Vec<ServiceInfo>,
            Vec<(ListenAddr, Arc<dyn StreamHandler>)>,
            HashMap<String, Arc<ServiceStats>>,
            HashMap<String, Arc<PersistTable>>,
            Prepared,
        ),
        Vec<String>,
    > {
        for plane in &self.planes {
            plane.prepare(config)?;
        }
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
        let mut cx = BuildCx::new(
            config,
            &pools,
            &self.tracker,
            &self.tls,
            &asm.stats,
            &asm.tables,
        );
        let mut handlers = Vec::new();
        let mut services = Vec::new();
        for vs in &config.virtual_services {
            let Some(plane) = self.planes.iter().find(|p| p.serves(vs)) else {
                return Err(vec![format!(
                    "virtual service {:?} cannot run in this build",
                    vs.name
                )]);
            };
            if let Some(handler) = plane.build(vs, &mut cx).map_err(|e| vec![e])? {
                // Access lists and the global connection cap sit in front of every stream
                // service, whatever its protocol.
                let st = cx.stats(vs);
                let handler =
                    crate::planes::stream::access::guard(&vs.access, &self.cap, &st, handler);
                handlers.extend(
                    vs.listen
                        .iter()
                        .map(|addr| (ListenAddr::new(*addr, vs.vrf.as_deref()), handler.clone())),
                );
            }
            services.push(ServiceInfo {
                name: vs.name.clone(),
                protocol: vs.protocol(),
                listen: vs.listen.clone(),
                stats: cx.stats(vs),
                transparent: cx.transparent(vs),
            });
        }
        let wanted: Vec<ListenAddr> = handlers.iter().map(|(at, _)| at.clone()).collect();
        let prepared = asm
            .listeners
            .prepare(&wanted, self.sockets_per_address)
            .map_err(|errs| errs.iter().map(ToString::to_string).collect::<Vec<_>>())?;
        for plane in &self.planes {
            plane.complete(&cx)?;
        }
        let (stats, tables) = (cx.stats, cx.tables);
        Ok((pools, services, handlers, stats, tables, prepared))
    }

    fn reload_now(&self) -> Result<u64, Vec<String>> {
        let mut config = self.source.load()?;
        let before = self.snapshot.load();
        if config.admin.listen != before.config.admin.listen {
            tracing::warn!(from = %before.config.admin.listen, to = %config.admin.listen, "admin.listen changes take effect at the next restart");
        }
        if config.admin.socket != before.config.admin.socket
            || format!("{:?}", config.admin.tls) != format!("{:?}", before.config.admin.tls)
        {
            tracing::warn!("admin.socket and admin.tls changes take effect at the next restart");
        }
        let ha_change = self.ha.prepare_reload(&mut config, &before.config);
        crate::planes::bgp::reload_warnings(before.config.bgp.as_ref(), config.bgp.as_ref());
        if config.global.workers != before.config.global.workers {
            tracing::warn!(
                from = before.config.global.workers,
                to = config.global.workers,
                "global.workers changes take effect at the next restart"
            );
        }
        let access = crate::admin::access(&config.admin, self.admin_bound).map_err(|e| vec![e])?;
        let generation = self.apply(config)?;
        // Only now, with everything else applied: a refused reload left the VRRP node as it was.
        self.ha.commit_reload(ha_change);
        if let Some(store) = &self.config_store {
            store.applied();
        }
        self.ha.config_applied();
        self.admin_access.store(Arc::new(access));
        tracing::info!(generation, "configuration reloaded");
        // A reload may have ended overrides (the file's value changed): keep the file in step.
        self.save_api_state(false);
        Ok(generation)
    }

    fn refresh_pools(&self) {
        let snapshot = self.snapshot.load();
        for p in &snapshot.pools {
            p.refresh();
        }
        crate::elastic::tick(&snapshot.pools);
        for plane in &self.planes {
            plane.refresh(&snapshot.config);
        }
    }

    /// Stops accepting, then waits for connections to finish, up to the configured deadline.
    async fn shutdown(&self) {
        let deadline = self.snapshot.load().config.global.shutdown_timeout;
        self.ha.shutdown().await;
        self.assembly.lock().listeners.close_all();
        self.health.shutdown();
        for plane in &self.planes {
            plane.shutdown();
        }
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
        self.transparent.remove();
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

    fn admin_access(&self) -> fulcrum_admin::Access {
        fulcrum_admin::Access::clone(&self.admin_access.load())
    }

    fn config(&self) -> Option<Arc<Config>> {
        Some(self.snapshot.load().config.clone())
    }

    fn register_metrics(self: Arc<Self>, registry: &mut fulcrum_admin::Registry) {
        let cap = self.cap.clone();
        registry.register_collector(fulcrum_admin::collector(move |out| cap.metrics(out)));
        let app = self.clone();
        registry.register_collector(fulcrum_admin::collector(move |out| {
            // The tables of the configuration in force: a reload replaces the map.
            let tables: Vec<_> = app.assembly.lock().tables.clone().into_iter().collect();
            crate::limits::persistence_metrics(out, &tables);
        }));
        for plane in &self.planes {
            let plane = plane.clone();
            registry.register_collector(fulcrum_admin::collector(move |out| plane.metrics(out)));
        }
        registry.register_collector(fulcrum_admin::collector(
            crate::planes::stream::snat::metrics,
        ));
    }

    fn plane_api(&self, request: &ApiRequest) -> Option<(u16, serde_json::Value)> {
        let answer = self.planes.iter().find_map(|p| p.api(request));
        if request.method != "GET" && matches!(answer, Some((200, _))) {
            // A plane's own admin state changed: keep the state file in step. HA maintenance
            // is this node's own (saved, not shared with the peer); GSLB site states are an
            // operator's change for both nodes.
            self.save_api_state(request.path.first() != Some(&"ha"));
        }
        answer
    }

    fn api_state_changed(&self) {
        self.save_api_state(true);
    }

    fn config_text(&self) -> Option<(String, u64)> {
        self.config_store.as_ref().map(|s| s.current())
    }

    fn config_write(
        &self,
        text: &str,
        if_match: Option<u64>,
        dry_run: bool,
        author: fulcrum_admin::Author,
    ) -> Result<fulcrum_admin::ConfigWrite, fulcrum_admin::ConfigRefusal> {
        let Some(store) = &self.config_store else {
            return Err(fulcrum_admin::ConfigRefusal::Unavailable(
                "this process runs without a configuration file".into(),
            ));
        };
        store.write(
            text,
            if_match,
            dry_run,
            author,
            |t| self.source.validate(t).map(|_| ()),
            || self.reload(),
        )
    }

    fn config_history(&self) -> serde_json::Value {
        self.config_store
            .as_ref()
            .map_or_else(|| serde_json::json!({ "versions": [] }), |s| s.history())
    }

    fn config_version(&self, version: u64) -> Option<String> {
        self.config_store.as_ref()?.version_text(version)
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
    match crate::limits::raise_nofile() {
        Ok((before, after)) if before != after => {
            tracing::info!(from = before, to = after, "raised the open-file limit")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
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
        let admin_config = config.admin.clone();
        let config_state_file = config.admin.state_file.clone();
        let ha = config.ha.clone();
        let bgp = config.bgp.clone();
        let access = match crate::admin::access(&config.admin, admin_addr) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        let app = Arc::new(App::new(source, workers, admin_addr, access));
        if let Err(errors) = app.apply(config) {
            for e in errors {
                eprintln!("{e}");
            }
            return ExitCode::FAILURE;
        }
        let saved = config_state_file
            .as_deref()
            .map(|path| crate::state_file::load(app.as_ref(), path))
            .unwrap_or_default();
        app.ha
            .start(ha.as_ref(), saved.maintenance, Arc::downgrade(&app));
        app.ha.start_bgp(
            bgp.as_ref(),
            ha.as_ref(),
            saved.maintenance,
            Arc::downgrade(&app),
        );
        if let Err(e) = app
            .ha
            .start_sync(
                ha.as_ref(),
                saved.changed_at_ms,
                config_state_file,
                app.source.file(),
                Arc::downgrade(&app),
            )
            .await
        {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
        let admin = match crate::admin::listeners(&admin_config).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        tokio::spawn(fulcrum_admin::serve_all(admin, app.clone()));
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

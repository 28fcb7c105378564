//! Assembly of `protocol = "message"` services: one dispatcher (`Hub`) per pool a service's
//! client connections can go to (its own pool, and each pool its rules name), kept across
//! reloads by service and pool name so client connections stay and their next messages go to
//! the new pool of that name, and the message metric families.

use std::collections::HashMap;
use std::sync::Arc;

use fulcrum_admin::{MetricFamilies, MetricKind};
use fulcrum_balance::Pool;
use fulcrum_config::{Config, VirtualService};
use fulcrum_net::StreamHandler;
use fulcrum_proxy::message::{FailReason, Hub, MessageStats, Settings};
use fulcrum_proxy::{MessageService, SourcePersistence};
use parking_lot::Mutex;

use crate::planes::{BuildCx, CommitCx, DataPlane};

/// What a reload under way will do to a service's dispatcher once it commits.
enum Plan {
    /// A new dispatcher (new service, or its message settings changed); it replaces the one of
    /// that name, whose client connections keep it until they close.
    New(Arc<Hub>),
    /// The same dispatcher, re-targeted at the new pool.
    Retarget(Arc<Hub>, Arc<Pool>, Option<SourcePersistence>),
}

/// `simplex.receive_listen`: a listener whose connections are the members' receive connections,
/// handed to the dispatchers of the service that has it (by the member's IP).
struct Receiver {
    targets: Arc<arc_swap::ArcSwap<Vec<Arc<Hub>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // The task owns the listener: the address is free again.
        self.task.abort();
    }
}

#[derive(Default)]
struct Inner {
    /// Per service: its dispatchers, the one of its own pool first, then one per pool its
    /// rules name.
    hubs: HashMap<String, Vec<Arc<Hub>>>,
    /// Service counters by name, kept across reloads and dispatchers.
    stats: HashMap<String, Arc<MessageStats>>,
    /// Per service: its plans, and whether the last one is the `member_requests.fallback_pool`
    /// dispatcher.
    plans: Vec<(String, Vec<Plan>, bool)>,
    /// `simplex.receive_listen` listeners by address, and those a reload under way bound, and
    /// which service each address is for once it commits.
    receivers: HashMap<std::net::SocketAddr, Receiver>,
    new_receivers: HashMap<std::net::SocketAddr, std::net::TcpListener>,
    receive_plans: Vec<(String, std::net::SocketAddr)>,
}

/// The message services of the process.
#[derive(Default)]
pub struct MessagePlane {
    inner: Mutex<Inner>,
}

impl DataPlane for MessagePlane {
    /// Forgets a preparation that was not committed.
    fn prepare(&self, _config: &Config) -> Result<(), Vec<String>> {
        let mut inner = self.inner.lock();
        inner.plans.clear();
        inner.new_receivers.clear();
        inner.receive_plans.clear();
        Ok(())
    }

    fn serves(&self, vs: &VirtualService) -> bool {
        vs.as_message().is_some()
    }

    /// The handler for one message service of the configuration being prepared. Nothing runs
    /// differently until `commit`.
    fn build(
        &self,
        vs: &VirtualService,
        cx: &mut BuildCx,
    ) -> Result<Option<Arc<dyn StreamHandler>>, String> {
        let section = vs
            .as_message()
            .ok_or_else(|| format!("virtual service {:?} is not message", vs.name))?;
        let pool = cx
            .pool(vs)
            .ok_or_else(|| format!("virtual service {:?} has no pool", vs.name))?;
        let persistence = cx.source_persistence(vs);
        let stats = cx.stats(vs);
        let rules = fulcrum_proxy::L4Rules::compile(vs.rules(), pool, cx.pools, &stats)
            .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?;
        // TLS towards the clients (`tls`), source addresses towards the members (`snat`).
        let tls = cx.stream_tls(vs)?;
        let snat = cx.snat(vs)?;
        let framing_hook = match &section.framing.wasm {
            Some(path) => Some(framing_hook(path)?),
            None => None,
        };
        let mut inner = self.inner.lock();
        if let Some(fulcrum_config::Simplex::ReceiveListen(addr)) = &section.simplex {
            inner.prepare_receiver(&vs.name, *addr)?;
        }
        let messages = inner.stats.entry(vs.name.clone()).or_default().clone();
        // Re-encryption to the members (the pool's `tls`), as for tcp services: no ALPN.
        let settings_for = |pool: &Pool| -> Result<Settings, String> {
            let member_tls = crate::planes::http::tls::stream_member_tls(pool)
                .map_err(|e| format!("virtual service {:?}: {e}", vs.name))?;
            Ok(Settings {
                snat: snat.clone(),
                member_tls,
                framing: section.framing.clone(),
                mode: section.mode,
                sequence: section.sequence.clone(),
                options: section.options.clone(),
                proxy_protocol: section.stream.proxy_protocol,
                framing_hook: framing_hook.clone(),
                simplex: section.simplex.clone(),
                member_requests: section.member_requests.clone(),
            })
        };
        let old = inner.hubs.get(&vs.name).map(Vec::as_slice);
        let mut hubs = Vec::new();
        let mut plans = Vec::new();
        for pool in rules.pools() {
            let settings = settings_for(pool)?;
            let counters = (stats.clone(), messages.clone());
            let (hub, plan) = keep_or_new(old, &vs.name, settings, counters, pool, &persistence);
            hubs.push(hub);
            plans.push(plan);
        }
        // `member_requests.fallback_pool`: one more dispatcher, over that pool, whose "client"
        // is the member connection that received a member's request. Kept with the service's
        // other dispatchers (started, re-targeted and closed with them; its member counters are
        // exported), but no client connection of the service is given it.
        let fallback = match section
            .member_requests
            .as_ref()
            .and_then(|r| r.fallback_pool.as_ref())
        {
            Some(name) => {
                let pool = cx
                    .pools
                    .iter()
                    .find(|p| &*p.name == name.as_str())
                    .cloned()
                    .ok_or_else(|| format!("virtual service {:?}: no pool {name:?}", vs.name))?;
                let settings = Settings {
                    options: fulcrum_config::MessageOptions {
                        // Fulcrum's connections to the branch hosts are ordinary duplex ones.
                        member_connections: section.options.member_connections.max(2),
                        ..section.options.clone()
                    },
                    simplex: None,
                    member_requests: None,
                    ..settings_for(&pool)?
                };
                // Its own counters: its "requests" are members' requests, counted by the
                // service as `originated`.
                let counters = (stats.clone(), Arc::default());
                let (hub, plan) = keep_or_new(old, &vs.name, settings, counters, &pool, &None);
                plans.push(plan);
                Some(hub)
            }
            None => None,
        };
        inner
            .plans
            .push((vs.name.clone(), plans, fallback.is_some()));
        let hub = hubs
            .first()
            .cloned()
            .ok_or_else(|| format!("virtual service {:?} has no pool", vs.name))?;
        Ok(Some(Arc::new(MessageService {
            hub,
            rules,
            hubs,
            idle_timeout: vs.idle_timeout,
            max_connections: vs.max_connections,
            tracker: cx.tracker.clone(),
            tls,
        })))
    }

    /// Applies what `build` prepared: new dispatchers open their member connections, kept ones
    /// switch to the new pool, and dispatchers of removed or replaced services close their member
    /// connections once their last client connection has gone.
    fn commit(&self, _cx: &mut CommitCx) {
        let mut inner = self.inner.lock();
        let plans = std::mem::take(&mut inner.plans);
        let mut hubs: HashMap<String, Vec<Arc<Hub>>> = HashMap::new();
        for (name, plans, has_fallback) in plans {
            let service = hubs.entry(name).or_default();
            for plan in plans {
                service.push(match plan {
                    Plan::New(hub) => {
                        hub.start();
                        hub
                    }
                    Plan::Retarget(hub, pool, persistence) => {
                        hub.retarget(pool, persistence);
                        hub
                    }
                });
            }
            // The service's dispatchers hand members' requests to the fallback one from now on.
            let fallback = has_fallback.then(|| service.last().cloned()).flatten();
            let own = service.len() - usize::from(fallback.is_some());
            for hub in &service[..own] {
                hub.set_fallback(fallback.clone());
            }
        }
        // Dispatchers no longer in use (service removed, settings changed, or a pool no rule
        // names any more) close their member connections after their last client connection.
        for (name, old) in &inner.hubs {
            for hub in old {
                let kept = hubs
                    .get(name)
                    .is_some_and(|new| new.iter().any(|h| Arc::ptr_eq(h, hub)));
                if !kept {
                    hub.unregister();
                }
            }
        }
        inner.stats.retain(|name, _| hubs.contains_key(name));
        inner.commit_receivers(&hubs);
        inner.hubs = hubs;
    }

    fn abort(&self) {
        let mut inner = self.inner.lock();
        inner.plans.clear();
        inner.new_receivers.clear();
        inner.receive_plans.clear();
    }

    /// Client connections read no new message; each closes once the answers to the messages
    /// it carries are written (the tracker waits for them up to `shutdown_timeout`), and the
    /// member connections close after the last client.
    fn shutdown(&self) {
        for hub in self.inner.lock().hubs.values().flatten() {
            hub.stop_clients();
            hub.unregister();
        }
    }

    fn metrics(&self, w: &mut MetricFamilies) {
        self.write_metrics(w);
    }
}

impl Inner {
    /// `simplex.receive_listen` of service `name`: its listener is bound now (a reload whose
    /// address cannot be bound fails), unless it runs already.
    fn prepare_receiver(&mut self, name: &str, addr: std::net::SocketAddr) -> Result<(), String> {
        if self
            .receive_plans
            .iter()
            .any(|(n, a)| *a == addr && n != name)
        {
            return Err(format!(
                "virtual service {name:?}: simplex.receive_listen {addr} is another service's too"
            ));
        }
        self.receive_plans.push((name.to_string(), addr));
        if self.receivers.contains_key(&addr) || self.new_receivers.contains_key(&addr) {
            return Ok(());
        }
        // Bound as every listener of Fulcrum's is (SO_REUSEADDR for a quick restart,
        // non-blocking, a deep backlog).
        let listener = fulcrum_net::listener::bind_stream(addr)
            .map_err(|e| format!("virtual service {name:?}: simplex.receive_listen {addr}: {e}"))?;
        self.new_receivers.insert(addr, listener);
        Ok(())
    }

    /// Starts the listeners bound for this configuration, points every listener at its service's
    /// current dispatchers, and closes those no service has any more.
    fn commit_receivers(&mut self, hubs: &HashMap<String, Vec<Arc<Hub>>>) {
        let plans = std::mem::take(&mut self.receive_plans);
        for (addr, listener) in std::mem::take(&mut self.new_receivers) {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(%addr, error = %e, "simplex.receive_listen: cannot listen");
                    continue;
                }
            };
            // Pointed at its service before it accepts anything.
            let service = plans.iter().find(|(_, a)| *a == addr);
            let first = service.and_then(|(name, _)| hubs.get(name)).cloned();
            let targets = Arc::new(arc_swap::ArcSwap::from_pointee(first.unwrap_or_default()));
            let task = tokio::spawn(accept_receive(listener, targets.clone()));
            self.receivers.insert(addr, Receiver { targets, task });
        }
        for (name, addr) in &plans {
            if let (Some(r), Some(h)) = (self.receivers.get(addr), hubs.get(name)) {
                r.targets.store(Arc::new(h.clone()));
            }
        }
        self.receivers
            .retain(|addr, _| plans.iter().any(|(_, a)| a == addr));
    }
}

/// Accepts the members' receive connections (`simplex.receive_listen`) and hands each to the
/// dispatcher with a member of that IP; others are closed and counted.
async fn accept_receive(
    listener: tokio::net::TcpListener,
    targets: Arc<arc_swap::ArcSwap<Vec<Arc<Hub>>>>,
) {
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was accepted.
                tracing::debug!(error = %e, "simplex.receive_listen: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let hubs = targets.load_full();
        let mut taken = false;
        for hub in hubs.iter() {
            match hub.receive_connection(stream, peer) {
                Ok(()) => {
                    taken = true;
                    break;
                }
                Err(s) => stream = s,
            }
        }
        if !taken {
            if let Some(hub) = hubs.first() {
                hub.messages
                    .receive_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(service = %hub.name, %peer, "closed a receive connection from an address that is no member's");
            }
        }
    }
}

impl MessagePlane {
    /// The message metric families (see docs/operations.md).
    fn write_metrics(&self, w: &mut MetricFamilies) {
        let mut services: Vec<Vec<Arc<Hub>>> = self
            .inner
            .lock()
            .hubs
            .values()
            .filter(|h| !h.is_empty())
            .cloned()
            .collect();
        if services.is_empty() {
            return;
        }
        services.sort_by(|a, b| a[0].name.cmp(&b[0].name));
        // The dispatchers of one service share its counters: the service families are written
        // once per service (from its first dispatcher), the member ones for every dispatcher.
        let hubs: Vec<Arc<Hub>> = services.iter().map(|s| s[0].clone()).collect();
        type Field = fn(&MessageStats) -> u64;
        let service: [(&str, MetricKind, &str, Field); 14] = [
            ("fulcrum_message_requests_total", MetricKind::Counter, "Messages received from clients.", |s| {
                load(&s.requests)
            }),
            ("fulcrum_message_responses_total", MetricKind::Counter, "Answers delivered to the client that sent the message.", |s| {
                load(&s.responses)
            }),
            ("fulcrum_message_in_flight", MetricKind::Gauge, "Messages received and not answered or failed yet.", |s| {
                s.in_flight()
            }),
            ("fulcrum_message_paused_total", MetricKind::Counter, "Times client connections stopped reading because a member queue was at member_queue (back-pressure).", |s| {
                load(&s.paused)
            }),
            ("fulcrum_message_redispatched_total", MetricKind::Counter, "Re-sends to another member after a member connection died with the message unanswered.", |s| {
                load(&s.redispatched)
            }),
            ("fulcrum_message_client_gone_total", MetricKind::Counter, "Answers that came back after their client connection had closed.", |s| {
                load(&s.client_gone)
            }),
            ("fulcrum_message_member_bad_frames_total", MetricKind::Counter, "Member connections closed for a bad frame from the member.", |s| {
                load(&s.member_bad_frames)
            }),
            ("fulcrum_message_originated_total", MetricKind::Counter, "Requests members sent of their own (member_requests).", |s| {
                load(&s.originated)
            }),
            ("fulcrum_message_originated_delivered_total", MetricKind::Counter, "Members' own requests handed to the client connection they name or to the fallback pool.", |s| {
                load(&s.originated_delivered)
            }),
            ("fulcrum_message_originated_undeliverable_total", MetricKind::Counter, "Members' own requests dropped: no client connection of that name and no fallback pool.", |s| {
                load(&s.originated_undeliverable)
            }),
            ("fulcrum_message_originated_answered_total", MetricKind::Counter, "Answers to members' own requests written back to the member that asked.", |s| {
                load(&s.originated_answered)
            }),
            ("fulcrum_message_receive_refused_total", MetricKind::Counter, "Connections to simplex.receive_listen from an address that is no member's (closed).", |s| {
                load(&s.receive_refused)
            }),
            ("fulcrum_message_originated_lost_total", MetricKind::Counter, "Answers of clients to members' own requests whose member connection had closed (dropped).", |s| {
                load(&s.originated_lost)
            }),
            ("fulcrum_message_simplex_send_dropped_bytes_total", MetricKind::Counter, "Bytes simplex members sent on their send-only connections (read and dropped).", |s| {
                load(&s.simplex_send_dropped_bytes)
            }),
        ];
        for (name, kind, help, get) in service {
            let mut samples = w.family(name, kind, help);
            for h in &hubs {
                samples.sample(&[("vs", &h.name)], get(&h.messages));
            }
        }
        let mut samples = w.gauge(
            "fulcrum_message_queued",
            "Messages waiting in the member queues (bounded per member by member_queue).",
        );
        for s in &services {
            samples.sample(
                &[("vs", &s[0].name)],
                s.iter().map(|h| h.queued()).sum::<usize>(),
            );
        }
        let mut samples = w.counter(
            "fulcrum_message_failed_total",
            "Messages that failed without an answer, by reason.",
        );
        for h in &hubs {
            for r in FailReason::ALL {
                samples.sample(
                    &[("vs", &h.name), ("reason", r.as_str())],
                    h.messages.failed(r),
                );
            }
        }
        let mut samples = w.counter(
            "fulcrum_message_client_bad_frames_total",
            "Client connections closed for a bad frame, by reason.",
        );
        for h in &hubs {
            for (reason, c) in [
                ("oversize", &h.messages.client_oversize),
                ("malformed", &h.messages.client_malformed),
            ] {
                samples.sample(&[("vs", &h.name), ("reason", reason)], load(c));
            }
        }
        let mut samples = w.histogram(
            "fulcrum_message_latency_seconds",
            "From a message's arrival to its answer being handed to its client connection.",
        );
        for h in &hubs {
            let lat = &h.messages.latency;
            let buckets = lat.buckets();
            // The count from the buckets read, so it matches the +Inf bucket even while
            // messages are being observed.
            let count = buckets.iter().map(|(_, n)| n).sum();
            samples.histogram(&[("vs", &h.name)], lat.sum_seconds(), count, &buckets);
        }
        let all: Vec<Arc<Hub>> = services.iter().flatten().cloned().collect();
        member_metrics(w, &all);
    }
}

/// The per-member families, for every dispatcher of every service.
fn member_metrics(w: &mut MetricFamilies, all: &[Arc<Hub>]) {
    type MemberField = fn(&fulcrum_proxy::message::MemberMessageStats) -> u64;
    let member: [(&str, MetricKind, &str, MemberField); 6] = [
        (
            "fulcrum_message_member_sent_total",
            MetricKind::Counter,
            "Messages written to the member (re-sends included).",
            |s| load(&s.sent),
        ),
        (
            "fulcrum_message_member_responses_total",
            MetricKind::Counter,
            "Answers from the member paired with their message.",
            |s| load(&s.responses),
        ),
        (
            "fulcrum_message_member_in_flight",
            MetricKind::Gauge,
            "Messages sent to the member and not answered yet.",
            |s| load(&s.in_flight),
        ),
        (
            "fulcrum_message_member_orphans_total",
            MetricKind::Counter,
            "Answers from the member that matched no waiting message (dropped).",
            |s| load(&s.orphans),
        ),
        (
            "fulcrum_message_member_timeouts_total",
            MetricKind::Counter,
            "Messages the member did not answer within message_timeout.",
            |s| load(&s.timeouts),
        ),
        (
            "fulcrum_message_member_connections",
            MetricKind::Gauge,
            "Connections open from Fulcrum to the member for this service.",
            |s| load(&s.connections),
        ),
    ];
    let states: Vec<_> = all
        .iter()
        .map(|h| (h.clone(), h.dispatch_state()))
        .collect();
    for (name, kind, help, get) in member {
        let mut samples = w.family(name, kind, help);
        for (h, d) in &states {
            for links in &d.members {
                samples.sample(
                    &[
                        ("vs", &h.name),
                        ("pool", &d.pool.name),
                        ("member", &links.member.label),
                    ],
                    get(&links.stats),
                );
            }
        }
    }
}

/// The dispatcher this service had for a pool of that name while its settings stay
/// (re-targeted at `pool`), else a new one.
fn keep_or_new(
    old: Option<&[Arc<Hub>]>,
    service: &str,
    settings: Settings,
    (stats, messages): (Arc<fulcrum_net::stats::ServiceStats>, Arc<MessageStats>),
    pool: &Arc<Pool>,
    persistence: &Option<SourcePersistence>,
) -> (Arc<Hub>, Plan) {
    let kept = old.and_then(|old| {
        old.iter()
            .find(|h| h.dispatch_state().pool.name == pool.name && h.settings == settings)
            .cloned()
    });
    match kept {
        Some(hub) => {
            let plan = Plan::Retarget(hub.clone(), pool.clone(), persistence.clone());
            (hub, plan)
        }
        None => {
            let hub = Hub::new(
                Arc::from(service),
                settings,
                stats,
                messages,
                pool.clone(),
                persistence.clone(),
            );
            (hub.clone(), Plan::New(hub))
        }
    }
}

fn load(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(std::sync::atomic::Ordering::Relaxed)
}

/// Loads a message service's framing hook (`framing.wasm`): one instance per worker thread, the
/// default sandbox limits.
fn framing_hook(path: &std::path::Path) -> Result<fulcrum_proxy::message::framing::Hook, String> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| format!("framing hook {name}: {e}"))?;
    let filter = fulcrum_wasm::Filter::new(fulcrum_wasm::Spec {
        name: name.clone(),
        root_id: String::new(),
        bytes,
        config: Vec::new(),
        on_error: fulcrum_wasm::OnError::FailClosed,
        limits: fulcrum_wasm::Limits::default(),
        disable_after: 0,
        max_request_body: 0,
        instances: std::thread::available_parallelism().map_or(2, |n| n.get().min(16)),
        stats: Default::default(),
    })
    .map_err(|e| format!("framing hook {name}: {e}"))?;
    if !filter.interest().message_frame {
        return Err(format!(
            "framing hook {name}: the module exports no fulcrum_on_message_frame"
        ));
    }
    Ok(fulcrum_proxy::message::framing::Hook(std::sync::Arc::new(
        filter,
    )))
}

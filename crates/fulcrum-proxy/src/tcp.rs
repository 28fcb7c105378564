//! The L4 TCP full proxy (source NAT, the seeds' one-arm mode): accept, consult persistence,
//! then the service's rules for the pool (`rules`), schedule, connect with retries, forward
//! both ways, report the outcome to the member.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fulcrum_balance::hash::{hash_ip, hash_socket_addr};
use fulcrum_balance::member::{ConnectionGuard, RequestGuard};
use fulcrum_balance::{Attempts, PersistKey, PersistTable, PickContext, Picked, Pool};
use fulcrum_config::{HashKey, ProxyProtocol};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

use fulcrum_net::forward::{forward_watched, write_all, End, ForwardOptions, ZeroWindowWatch};
use fulcrum_net::listener::StreamHandler;
use fulcrum_net::stats::ServiceStats;
use fulcrum_net::tracker::{Tracked, Tracker};

use crate::rules::{Choice, L4Rules};

/// Source-address persistence for a service.
#[derive(Debug, Clone)]
pub struct SourcePersistence {
    pub table: Arc<PersistTable>,
    pub mask_v4: u8,
    pub mask_v6: u8,
}

impl SourcePersistence {
    pub fn key(&self, client: SocketAddr) -> PersistKey {
        PersistKey::source(client.ip(), self.mask_v4, self.mask_v6)
    }
}

/// A pool a connection of a tcp service can go to, with the TLS towards its members (the
/// pool's `tls`: re-encryption).
#[derive(Debug)]
pub struct PoolRoute {
    pub pool: Arc<Pool>,
    pub member_tls: Option<Arc<fulcrum_tls::client::MemberTls>>,
}

/// A `protocol = "tcp"` virtual service, as compiled from the config.
#[derive(Debug)]
pub struct TcpService {
    pub name: Arc<str>,
    /// The service's own pool (`routes[0].pool`).
    pub pool: Arc<Pool>,
    /// The rules choosing a connection's pool: an index into `routes`, which lists
    /// `rules.pools()` in the same order.
    pub rules: L4Rules,
    pub routes: Vec<PoolRoute>,
    pub persistence: Option<SourcePersistence>,
    pub proxy_protocol: Option<ProxyProtocol>,
    pub idle_timeout: Duration,
    pub max_connections: u32,
    pub splice: bool,
    pub stats: Arc<ServiceStats>,
    pub tracker: Arc<Tracker>,
    /// Source addresses for member connections (`snat`); None connects from the default.
    pub snat: Option<Arc<fulcrum_net::snat::Snat>>,
    /// `source = "client"`: member connections from the client's own address (and the
    /// service's counters of them); wins over `snat`, which the configuration refuses beside it.
    pub transparent: Option<Arc<fulcrum_net::Transparent>>,
    /// TLS termination (`tls` on the service): clients speak TLS, members get the plain bytes.
    pub tls: Option<Arc<fulcrum_tls::ServerTls>>,
}

/// Either side of a connection with TLS on one end: a TLS stream or a plain socket.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

impl StreamHandler for TcpService {
    fn handle(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, local: SocketAddr) {
        let tracked = self.tracker.track();
        // `serve` is the task itself: a wrapping async block would keep a second copy of the
        // arguments in every connection's task.
        tokio::spawn(self.serve(tracked, stream, peer, local));
    }
}

/// The hash `algorithm = "hash"` uses for an L4 client.
pub fn l4_hash(key: &HashKey, client: SocketAddr) -> Option<u64> {
    match key {
        HashKey::SourceIp => Some(hash_ip(client.ip())),
        HashKey::SourceIpPort => Some(hash_socket_addr(client)),
        // HTTP keys cannot be computed at L4 (the config refuses them for tcp services).
        _ => None,
    }
}

impl TcpService {
    /// Parameters are dropped in reverse order: `tracked` comes before the sockets so that a
    /// shutdown waiting on the tracker finds them closed, as when it was dropped after `serve`.
    async fn serve(
        self: Arc<Self>,
        _tracked: Tracked,
        mut client: TcpStream,
        peer: SocketAddr,
        local: SocketAddr,
    ) {
        if self.max_connections > 0
            && self.stats.connections_active.load(Ordering::Relaxed)
                >= u64::from(self.max_connections)
        {
            self.stats.over_limit.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Persistence, then the rules: the pool of this connection, or a `drop` rule (reset at
        // once, as `deny` does; counted in the rule's hits, not as a connection).
        let Some((route, key, remembered)) = self.route(peer, local) else {
            tracing::debug!(service = %self.name, client = %peer, "dropped by a rule");
            let _ = client.set_zero_linger();
            return;
        };
        let _conn = self.stats.open();
        self.stats.requests_total.fetch_add(1, Ordering::Relaxed);
        // TCP_NODELAY comes from the listener (inherited; `tcp.nodelay` may turn it off).
        if self.tls.is_some() || route.member_tls.is_some() {
            // Boxed: the handshake state would otherwise enlarge every plain connection's task.
            return Box::pin(self.serve_tls(client, peer, local, route, key, remembered)).await;
        }

        let opts = ForwardOptions {
            idle_timeout: self.idle_timeout,
            splice: self.splice,
        };
        let pool = &route.pool;
        let mut attempts = attempts_in(pool, peer, remembered);
        loop {
            // Boxed: a task is as large as its largest await, and the connect (source address,
            // VRF, timeout, PROXY header) is larger than the forwarding an idle connection
            // waits in. Inline, every idle connection would keep that room for its lifetime.
            let Some(MemberConnection {
                picked,
                stream: mut member_stream,
                connect_time,
                _counted,
            }) = Box::pin(self.open_member(pool, peer, local, &mut attempts, key.as_ref())).await
            else {
                return;
            };
            let member = &picked.member;

            // fastest_response: one sample per connection, the connect time plus the member's
            // time to its first byte (see `forward_watched`); the connect time alone when nobody
            // said anything.
            let mut timed = false;
            // `zero_window_timeout`: a member that stops reading is a passive failure.
            let mut zero_window = |stalled: Duration| {
                tracing::info!(service = %self.name, client = %peer, member = %member.label, ?stalled, "member keeps a zero receive window");
                member.record_passive_failure(&format!(
                    "zero receive window for {:.1}s with data to send",
                    stalled.as_secs_f64()
                ));
            };
            let watch = pool
                .config
                .zero_window_timeout
                .map(|after| ZeroWindowWatch {
                    after,
                    report: &mut zero_window,
                });
            let outcome = forward_watched(
                &mut client,
                &mut member_stream,
                opts,
                |up, down| {
                    member.stats.add_bytes(up, down);
                    self.stats.bytes_in.fetch_add(up, Ordering::Relaxed);
                    self.stats.bytes_out.fetch_add(down, Ordering::Relaxed);
                },
                |wait| {
                    timed = true;
                    member.stats.observe_response_time(connect_time + wait);
                },
                watch,
            )
            .await;
            if !timed {
                member.stats.observe_response_time(connect_time);
            }
            match outcome.end {
                End::Member(e) if outcome.downstream == 0 => {
                    // Reset before a single byte of reply: the member failed this client.
                    member.record_passive_failure(&format!("reset before any reply: {e}"));
                    // Nothing was exchanged (e.g. the member died with this connection still in
                    // its accept queue): the client is as good as new, so give it another member.
                    let more = attempts.failed(&picked);
                    if outcome.upstream_taken == 0 && more {
                        continue;
                    }
                }
                end => {
                    if matches!(end, End::IdleTimeout) {
                        tracing::debug!(service = %self.name, client = %peer, member = %member.label, "idle timeout");
                    }
                    // A reply, or a clean end, shows the member working; silence shows nothing.
                    if outcome.downstream > 0 || matches!(end, End::Closed) {
                        member.record_exchange_success();
                    }
                }
            }
            return;
        }
    }

    /// A connection with TLS on the client side (termination), the member side
    /// (re-encryption) or both: the bytes are relayed through user space (no splice); the
    /// `fastest_response` sample is taken as on the plain path.
    async fn serve_tls(
        &self,
        client: TcpStream,
        peer: SocketAddr,
        local: SocketAddr,
        route: &PoolRoute,
        key: Option<PersistKey>,
        remembered: Option<SocketAddr>,
    ) {
        let mut client: Box<dyn Stream> = match &self.tls {
            Some(tls) => match tls.accept(client, &self.name, peer).await {
                Some((s, _)) => Box::new(s),
                // Counted and logged by `accept`.
                None => return,
            },
            None => Box::new(client),
        };
        let pool = &route.pool;
        let mut attempts = attempts_in(pool, peer, remembered);
        loop {
            let Some(MemberConnection {
                picked,
                stream: member_stream,
                connect_time,
                _counted,
            }) = self
                .open_member(pool, peer, local, &mut attempts, key.as_ref())
                .await
            else {
                return;
            };
            let member = &picked.member;
            let retry = |attempts: &mut Attempts<'_>, why: String| {
                member.record_passive_failure(&why);
                attempts.failed(&picked)
            };
            let mut member_io: Box<dyn Stream> = match &route.member_tls {
                Some(mt) => {
                    let handshake = mt.connect(member_stream, member.address);
                    match tokio::time::timeout(pool.connect_timeout, handshake).await {
                        Ok(Ok(s)) => Box::new(s),
                        Ok(Err(e)) => {
                            if retry(&mut attempts, format!("TLS handshake: {e}")) {
                                continue;
                            }
                            return;
                        }
                        Err(_) => {
                            let why = format!(
                                "TLS handshake not finished within {:?}",
                                pool.connect_timeout
                            );
                            if retry(&mut attempts, why) {
                                continue;
                            }
                            return;
                        }
                    }
                }
                None => Box::new(member_stream),
            };
            // fastest_response: connect time + time to the member's first byte, as without TLS.
            let mut timed = false;
            let mut first_reply = |wait: Duration| {
                timed = true;
                member.stats.observe_response_time(connect_time + wait);
            };
            let mut live = member.stats.live();
            let (up, down) = fulcrum_net::relay::run_timed(
                &mut *client,
                &[],
                &mut *member_io,
                &[],
                self.idle_timeout,
                &mut |sent, received| live.add(sent, received),
                Some(&mut first_reply),
            )
            .await;
            drop(live);
            if !timed {
                member.stats.observe_response_time(connect_time);
            }
            self.stats.bytes_in.fetch_add(up, Ordering::Relaxed);
            self.stats.bytes_out.fetch_add(down, Ordering::Relaxed);
            if down > 0 {
                member.record_exchange_success();
            }
            return;
        }
    }

    /// The client's persistence key and the member it names, if any.
    pub(crate) fn remembered(&self, peer: SocketAddr) -> (Option<PersistKey>, Option<SocketAddr>) {
        let key = self.persistence.as_ref().map(|p| p.key(peer));
        let remembered = match (&self.persistence, &key) {
            (Some(p), Some(k)) => p.table.get(k),
            _ => None,
        };
        (key, remembered)
    }

    /// Where a new connection goes (persistence, then the rules): the pool and its member TLS,
    /// the persistence key and the member it remembers; `None`: a `drop` rule matched.
    pub(crate) fn route(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Option<(&PoolRoute, Option<PersistKey>, Option<SocketAddr>)> {
        let (key, remembered) = self.remembered(peer);
        match self.rules.choose(peer.ip(), local.port(), remembered) {
            Choice::Pool(i) => {
                let route = self.routes.get(i).or(self.routes.first())?;
                Some((route, key, remembered))
            }
            Choice::Drop => None,
        }
    }

    /// A client's attempts at the service's own pool (ftp): the member its source persisted
    /// to first, then the scheduler; with the persistence key to record the chosen member under.
    pub(crate) fn attempts(&self, peer: SocketAddr) -> (Attempts<'_>, Option<PersistKey>) {
        let (key, remembered) = self.remembered(peer);
        (attempts_in(&self.pool, peer, remembered), key)
    }

    /// A member connection for a client from `peer` to `local`, ready for its bytes: connected
    /// (see `connect_member`), counted as a connection and a request of the member while it
    /// lives, and sent the PROXY header when the service sends one. A member that cannot take
    /// the header is a passive failure, and the next one is tried.
    pub(crate) async fn open_member(
        &self,
        pool: &Pool,
        peer: SocketAddr,
        local: SocketAddr,
        attempts: &mut Attempts<'_>,
        key: Option<&PersistKey>,
    ) -> Option<MemberConnection> {
        loop {
            let (picked, stream, connect_time) =
                self.connect_member(pool, peer, attempts, key).await?;
            let member = &picked.member;
            let counted = (member.open_connection(), member.open_request());
            if let Some(version) = self.proxy_protocol {
                let header = fulcrum_net::proxy_protocol::header(version, peer, local);
                if let Err(e) = write_all(&stream, &header).await {
                    member.record_passive_failure(&format!("writing PROXY header: {e}"));
                    if attempts.failed(&picked) {
                        continue;
                    }
                    return None;
                }
            }
            return Some(MemberConnection {
                picked,
                stream,
                connect_time,
                _counted: counted,
            });
        }
    }

    /// Connects to the next member of `attempts` (at `pool`); a failed connect is reported to
    /// the member and the next member tried, until the pool's `retries` are spent.
    pub(crate) async fn connect_member(
        &self,
        pool: &Pool,
        peer: SocketAddr,
        attempts: &mut Attempts<'_>,
        key: Option<&PersistKey>,
    ) -> Option<(Picked, TcpStream, Duration)> {
        loop {
            let Some(picked) = attempts.next_member() else {
                if attempts.tried() == 0 {
                    self.stats.no_member.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(service = %self.name, client = %peer, "no member available");
                } else {
                    self.stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
                }
                return None;
            };
            let started = Instant::now();
            let source =
                fulcrum_net::Source::of(self.snat.as_deref(), self.transparent.as_deref(), peer);
            match fulcrum_net::snat::connect_from(
                source,
                pool.config.vrf.as_deref(),
                picked.member.address,
                pool.connect_timeout,
            )
            .await
            {
                Ok(stream) => {
                    // The connect time is folded into the first-byte sample by the caller.
                    let connect_time = started.elapsed();
                    if let (Some(p), Some(k), false) =
                        (&self.persistence, key, attempts.persisted())
                    {
                        p.table.insert(k.clone(), picked.member.address);
                    }
                    return Some((picked, stream, connect_time));
                }
                Err(e) if fulcrum_net::snat::is_snat_exhaustion(&e) => {
                    // No source port left (`snat`), or the client's address cannot be taken
                    // (`source = "client"`): not the member's fault, and no other member would
                    // fare better from the same addresses. Refuse the client at once.
                    self.stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(service = %self.name, client = %peer, error = %e, "no source address left");
                    return None;
                }
                Err(e) => {
                    picked
                        .member
                        .record_connect_failure(&format!("connect: {e}"));
                }
            }
            if !attempts.failed(&picked) {
                self.stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(service = %self.name, client = %peer, attempts = attempts.tried(), "every connection attempt failed");
                return None;
            }
        }
    }
}

/// A member connection `TcpService::open_member` made ready.
pub(crate) struct MemberConnection {
    pub(crate) picked: Picked,
    pub(crate) stream: TcpStream,
    /// How long the connect took (folded into the first-byte sample).
    pub(crate) connect_time: Duration,
    /// The member's connection and request counts, up while this lives.
    pub(crate) _counted: (ConnectionGuard, RequestGuard),
}

/// A client's attempts at `pool`: the member persistence remembers first (when the pool holds
/// it), then the scheduler.
pub(crate) fn attempts_in(
    pool: &Pool,
    peer: SocketAddr,
    remembered: Option<SocketAddr>,
) -> Attempts<'_> {
    let ctx = PickContext {
        hash: l4_hash(&pool.hash_key, peer),
    };
    pool.attempts(ctx, remembered)
}

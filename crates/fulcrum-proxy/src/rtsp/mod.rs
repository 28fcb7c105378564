//! `protocol = "rtsp"` (RTSP/1.0, RFC 2326): a tcp service that reads its control connections
//! message by message. The first request of a connection chooses the member: a `Session` the
//! service remembers (`rtsp_session` persistence) goes back to the member that opened it;
//! otherwise the service's rules — http rules, compiled and matched by `fulcrum_http::rules`
//! against the request's URL and headers — choose the pool, and the pool's scheduler the
//! member. Every later message of the connection goes to that member. Interleaved binary data
//! (`$` frames) passes untouched in both directions; SETUPs over unicast UDP get their
//! `Transport` rewritten so that RTP and RTCP flow through relays of Fulcrum's (`media`), as
//! FTP's data connections do through `ftp`'s listeners.

pub mod media;
pub mod message;
pub mod transport;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use fulcrum_balance::{Member, PersistTable};
use fulcrum_http::head::{Limits, RequestHead};
use fulcrum_http::rules::{Action, RuleSet};
use fulcrum_net::listener::StreamHandler;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::tcp::{attempts_in, MemberConnection, TcpService};
use media::{MediaRelay, RelayCounters, SocketPair};
use message::{answer, parse, split_url, Frame, Message, MAX_FRAME};
use transport::PortPair;

/// UDP streams (SETUPs waiting for their reply, and relays) one connection may hold.
pub const MAX_STREAMS: usize = 16;

/// Relays a service keeps for sessions whose control connection has closed.
pub const MAX_DETACHED: usize = 4096;

/// A `protocol = "rtsp"` virtual service.
#[derive(Debug)]
pub struct RtspService {
    /// Admission, member connections, source persistence and counters as a tcp service has
    /// them; `tcp.routes` lists the service's pool first, then the pools the rules name.
    pub tcp: TcpService,
    /// The rules; `Action::Pool(i)` is `tcp.routes[i]`.
    pub rules: RuleSet,
    /// `rtsp_session` persistence: session id → the member whose SETUP reply gave it.
    pub sessions: Option<Arc<PersistTable>>,
    /// `rtsp_rtp_ports`; `None`: any free pair.
    pub rtp_ports: Option<RangeInclusive<u16>>,
    /// Relays of sessions that outlived their control connection.
    pub detached: DetachedRelays,
}

/// An RTSP session is not bound to a connection (RFC 2326 §3): a client may close its control
/// connection after PLAY and send its TEARDOWN on another. The UDP relays of a session whose
/// connection closed are kept here, so its media keeps flowing for as long as the member sends
/// it; they end at a TEARDOWN answered on any connection, or idle. Whether the member stops
/// the session when its connection closes is the member's choice, as it is without a proxy.
#[derive(Debug, Default)]
pub struct DetachedRelays {
    relays: parking_lot::Mutex<Vec<(Vec<u8>, JoinHandle<()>)>>,
}

impl DetachedRelays {
    /// Keeps `relay` for `session`; gives it back when the service holds its bound already.
    fn adopt(&self, session: Vec<u8>, relay: JoinHandle<()>) -> Result<(), JoinHandle<()>> {
        let mut relays = self.relays.lock();
        relays.retain(|(_, r)| !r.is_finished());
        if relays.len() >= MAX_DETACHED {
            return Err(relay);
        }
        relays.push((session, relay));
        Ok(())
    }

    /// Ends the kept relays of `session`.
    fn end(&self, session: &[u8]) {
        self.relays.lock().retain(|(s, relay)| {
            let ends = s == session || relay.is_finished();
            if ends {
                relay.abort();
            }
            !ends
        });
    }
}

impl Drop for DetachedRelays {
    /// A service that is replaced or removed takes its kept relays with it.
    fn drop(&mut self) {
        for (_, relay) in self.relays.get_mut().iter() {
            relay.abort();
        }
    }
}

impl StreamHandler for RtspService {
    fn handle(self: Arc<Self>, stream: TcpStream, peer: SocketAddr, local: SocketAddr) {
        let tracked = self.tcp.tracker.track();
        tokio::spawn(async move {
            self.serve(stream, peer, local).await;
            drop(tracked);
        });
    }
}

/// What reading the next frame of a direction gave.
enum Read {
    Frame(Frame),
    Closed,
    Idle,
    Malformed(&'static str),
}

/// Reads until `buf` starts with a whole frame (bounded by `MAX_FRAME` bytes), the peer
/// closes, or `idle` (when given) passes without a byte.
async fn read_frame(rd: &mut OwnedReadHalf, buf: &mut BytesMut, idle: Option<Duration>) -> Read {
    loop {
        match parse(buf) {
            Ok(Some(frame)) => return Read::Frame(frame),
            Ok(None) if buf.len() >= MAX_FRAME => return Read::Malformed("message too large"),
            Ok(None) => {}
            Err(why) => return Read::Malformed(why),
        }
        buf.reserve(8192);
        let read = match idle {
            Some(idle) => tokio::time::timeout(idle, rd.read_buf(buf)).await,
            None => Ok(rd.read_buf(buf).await),
        };
        match read {
            Ok(Ok(0)) | Ok(Err(_)) => return Read::Closed,
            Ok(Ok(_)) => {}
            Err(_) => return Read::Idle,
        }
    }
}

/// The head http rules see for an RTSP request: its method, the URL's path and authority
/// (`OPTIONS *`: the asterisk), and its header fields but the framing ones, which are RTSP's
/// own (built as an HTTP/2 request's head is built from its parts). A field no HTTP head may
/// carry is left out; a URL that is no RTSP URL is an error, so that no request slips past the
/// rules by being odd.
fn rule_head(buf: &[u8], m: &Message) -> Result<RequestHead, &'static str> {
    let url = m.url(buf).ok_or("not a request")?;
    let (authority, path) = match split_url(url) {
        Some((authority, path)) => (Some(authority), path),
        None if url == b"*" => (None, url),
        None => return Err("not an rtsp:// URL"),
    };
    let mut headers = http::HeaderMap::new();
    for (n, v) in &m.fields {
        let Ok(name) = http::HeaderName::from_bytes(&buf[n.clone()]) else {
            continue;
        };
        use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, HOST, TRANSFER_ENCODING, UPGRADE};
        if [
            HOST,
            CONTENT_LENGTH,
            TRANSFER_ENCODING,
            CONNECTION,
            UPGRADE,
            EXPECT,
        ]
        .contains(&name)
        {
            continue;
        }
        if let Ok(value) = http::HeaderValue::from_bytes(&buf[v.clone()]) {
            headers.append(name, value);
        }
    }
    let method = m.method(buf).ok_or("not a request")?;
    RequestHead::from_h2(method, path, authority, &headers, &Limits::default())
        .map_err(|e| e.reason)
}

/// Where a connection goes.
enum Route {
    /// `tcp.routes[i]`, with the member a session names.
    To(usize, Option<SocketAddr>),
    /// A `drop = true` rule matched.
    Drop,
    /// The first request cannot be matched against the rules (answered 400).
    Malformed(&'static str),
}

impl RtspService {
    /// Where a connection goes by its first request: its session's member, else the rules.
    fn choose(&self, buf: &[u8], first: &Message, peer: SocketAddr) -> Route {
        if let (Some(table), Some(id)) = (&self.sessions, first.session(buf)) {
            if let Some(addr) = table.get(&table.key(id)) {
                let route = self
                    .tcp
                    .routes
                    .iter()
                    .position(|r| r.pool.persistent(addr, &[]).is_some());
                if let Some(i) = route {
                    return Route::To(i, Some(addr));
                }
            }
        }
        if self.rules.is_empty() {
            return Route::To(0, None);
        }
        let head = match rule_head(buf, first) {
            Ok(h) => h,
            Err(why) => return Route::Malformed(why),
        };
        let rule = self.rules.find(&head, peer.ip());
        match rule.and_then(|i| self.rules.get(i)).map(|r| &r.action) {
            Some(Action::Pool(i)) if *i < self.tcp.routes.len() => Route::To(*i, None),
            Some(Action::Drop) => Route::Drop,
            // Other actions are refused for rtsp services by the configuration's checks.
            _ => Route::To(0, None),
        }
    }

    fn malformed(&self, why: &str, peer: SocketAddr, side: &str) {
        self.tcp
            .stats
            .rtsp_malformed
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(service = %self.tcp.name, client = %peer, side, why, "malformed RTSP message");
    }

    async fn serve(&self, client: TcpStream, peer: SocketAddr, local: SocketAddr) {
        let tcp = &self.tcp;
        let Some(_conn) = tcp.stats.admit(tcp.max_connections) else {
            return;
        };
        let (mut client_rd, mut client_wr) = client.into_split();
        let mut buf = BytesMut::with_capacity(8192);
        let first = match read_frame(&mut client_rd, &mut buf, Some(tcp.idle_timeout)).await {
            Read::Frame(Frame::Message(m)) if m.method(&buf).is_some() => m,
            Read::Frame(_) => {
                self.malformed("the first message is not a request", peer, "client");
                let _ = client_wr.write_all(&answer(400, "Bad Request", None)).await;
                return;
            }
            Read::Malformed(why) => {
                self.malformed(why, peer, "client");
                let _ = client_wr.write_all(&answer(400, "Bad Request", None)).await;
                return;
            }
            Read::Closed | Read::Idle => return,
        };
        let (route, by_session) = match self.choose(&buf, &first, peer) {
            Route::To(route, by_session) => (route, by_session),
            Route::Drop => {
                tracing::debug!(service = %tcp.name, client = %peer, "dropped by a rule");
                return;
            }
            Route::Malformed(why) => {
                self.malformed(why, peer, "client");
                let cseq = first.cseq(&buf).map(<[u8]>::to_vec);
                let _ = client_wr
                    .write_all(&answer(400, "Bad Request", cseq.as_deref()))
                    .await;
                return;
            }
        };
        let pool = &tcp.routes[route].pool;
        let (key, by_source) = tcp.remembered(peer);
        let mut attempts = attempts_in(pool, peer, by_session.or(by_source));
        let Some(MemberConnection {
            picked,
            stream,
            _counted,
            ..
        }) = tcp
            .open_member(pool, peer, local, &mut attempts, key.as_ref())
            .await
        else {
            let cseq = first.cseq(&buf).map(<[u8]>::to_vec);
            let _ = client_wr
                .write_all(&answer(503, "Service Unavailable", cseq.as_deref()))
                .await;
            return;
        };
        let Ok(member_local) = stream.local_addr() else {
            return;
        };
        let connection = Connection {
            service: self,
            client: peer,
            vip: local.ip(),
            member: picked.member.clone(),
            member_local: member_local.ip(),
            client_wr: tokio::sync::Mutex::new(client_wr),
            state: parking_lot::Mutex::new(State::default()),
            counters: RelayCounters {
                stats: tcp.stats.clone(),
                last_datagram: Arc::new(AtomicU64::new(0)),
                started: tokio::time::Instant::now(),
            },
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
        };
        let (member_rd, member_wr) = stream.into_split();
        let (up, down) = connection
            .relay((client_rd, buf), (member_rd, member_wr))
            .await;
        connection.detach_sessions();
        picked.member.stats.add_bytes(up, down);
        if down > 0 {
            picked.member.record_exchange_success();
        }
    }
}

/// A SETUP sent to the member and not answered yet (by its CSeq).
struct PendingSetup {
    /// Unicast UDP: the member-side pair its `client_port` now names, and the client's own.
    udp: Option<(SocketPair, PortPair)>,
}

/// What a connection's two directions share about its sessions.
#[derive(Default)]
struct State {
    setups: HashMap<Vec<u8>, PendingSetup>,
    /// TEARDOWNs sent to the member (by CSeq), with the session they end.
    teardowns: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// Running UDP relays and the session each belongs to.
    relays: Vec<(Option<Vec<u8>>, JoinHandle<()>)>,
    /// Sessions this connection has seen opened (counted once).
    sessions: HashSet<Vec<u8>>,
}

impl Drop for State {
    /// Relays not handed to the service (those without a session) end with the connection.
    fn drop(&mut self) {
        for (_, relay) in &self.relays {
            relay.abort();
        }
    }
}

/// What to do with a client's frame.
enum Verdict {
    /// Sent on unchanged.
    AsItCame,
    /// Sent on as rewritten here.
    Forward(Vec<u8>),
    /// Answered by Fulcrum (this answer); the member never sees it.
    Answer(Vec<u8>),
}

/// One client connection and its member connection.
struct Connection<'a> {
    service: &'a RtspService,
    client: SocketAddr,
    /// The address the client connected to: where client-side relays open.
    vip: IpAddr,
    member: Arc<Member>,
    /// Fulcrum's address towards the member: where member-side relays open.
    member_local: IpAddr,
    client_wr: tokio::sync::Mutex<OwnedWriteHalf>,
    state: parking_lot::Mutex<State>,
    counters: RelayCounters,
    up: AtomicU64,
    down: AtomicU64,
}

impl Connection<'_> {
    /// Relays both directions until either ends; returns (client→member, member→client) bytes.
    async fn relay(
        &self,
        (client_rd, client_buf): (OwnedReadHalf, BytesMut),
        (member_rd, member_wr): (OwnedReadHalf, OwnedWriteHalf),
    ) -> (u64, u64) {
        tokio::select! {
            _ = self.client_to_member(client_rd, client_buf, member_wr) => {}
            _ = self.member_to_client(member_rd) => {}
        }
        let stats = &self.service.tcp.stats;
        let (up, down) = (
            self.up.load(Ordering::Relaxed),
            self.down.load(Ordering::Relaxed),
        );
        stats.bytes_in.fetch_add(up, Ordering::Relaxed);
        stats.bytes_out.fetch_add(down, Ordering::Relaxed);
        (up, down)
    }

    async fn to_client(&self, bytes: &[u8]) -> bool {
        let ok = self.client_wr.lock().await.write_all(bytes).await.is_ok();
        self.down.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        ok
    }

    /// Whether a relay carried a datagram within the idle timeout: a control connection is
    /// quiet while its media flows over UDP.
    fn media_flowing(&self) -> bool {
        let last = self.counters.last_datagram.load(Ordering::Relaxed);
        let now = self.counters.started.elapsed().as_secs() + 1;
        last > 0 && now.saturating_sub(last) <= self.service.tcp.idle_timeout.as_secs().max(1)
    }

    async fn client_to_member(
        &self,
        mut rd: OwnedReadHalf,
        mut buf: BytesMut,
        mut member_wr: OwnedWriteHalf,
    ) {
        let idle = self.service.tcp.idle_timeout;
        loop {
            let frame = match read_frame(&mut rd, &mut buf, Some(idle)).await {
                Read::Frame(f) => f,
                Read::Idle if self.media_flowing() => continue,
                Read::Closed | Read::Idle => return,
                Read::Malformed(why) => {
                    self.service.malformed(why, self.client, "client");
                    self.to_client(&answer(400, "Bad Request", None)).await;
                    return;
                }
            };
            let len = frame.len();
            let out = match &frame {
                Frame::Message(m) if m.method(&buf).is_some() => self.on_request(&buf, m),
                // Interleaved data and responses pass as they came, without a copy.
                _ => Verdict::AsItCame,
            };
            let sent = match &out {
                Verdict::AsItCame => Some(&buf[..len]),
                Verdict::Forward(bytes) => Some(&bytes[..]),
                Verdict::Answer(_) => None,
            };
            if let Some(bytes) = sent {
                if member_wr.write_all(bytes).await.is_err() {
                    return;
                }
                self.up.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            buf.advance(len);
            if let Verdict::Answer(bytes) = out {
                if !self.to_client(&bytes).await {
                    return;
                }
            }
        }
    }

    /// A client's request on its way to the member: counted; SETUPs over UDP get a member-side
    /// relay pair, TEARDOWNs are remembered to end their session's relays at the reply.
    fn on_request(&self, buf: &[u8], m: &Message) -> Verdict {
        let stats = &self.service.tcp.stats;
        stats.requests_total.fetch_add(1, Ordering::Relaxed);
        let Some(cseq) = m.cseq(buf) else {
            self.service
                .malformed("request without CSeq", self.client, "client");
            return Verdict::Answer(answer(400, "Bad Request", None));
        };
        let method = m.method(buf).unwrap_or_default();
        let mut state = self.state.lock();
        if method.eq_ignore_ascii_case(b"TEARDOWN") {
            if state.teardowns.len() < MAX_STREAMS {
                let session = m.session(buf).map(<[u8]>::to_vec);
                state.teardowns.insert(cseq.to_vec(), session);
            }
            return Verdict::AsItCame;
        }
        if !method.eq_ignore_ascii_case(b"SETUP") {
            return Verdict::AsItCame;
        }
        let transport = m.header(buf, "transport").unwrap_or_default();
        let Some(client_ports) = transport::ports(transport, "client_port") else {
            // Interleaved (TCP): nothing to relay, but its reply may open a session.
            if state.setups.len() < MAX_STREAMS {
                state
                    .setups
                    .insert(cseq.to_vec(), PendingSetup { udp: None });
            }
            return Verdict::AsItCame;
        };
        // Relays that ended on their own (idle) no longer count.
        state.relays.retain(|(_, relay)| !relay.is_finished());
        if state.setups.len() + state.relays.len() >= MAX_STREAMS {
            tracing::info!(service = %self.service.tcp.name, client = %self.client, "RTSP connection at its UDP stream bound");
            return Verdict::Answer(answer(453, "Not Enough Bandwidth", Some(cseq)));
        }
        let pair = SocketPair::bind(self.member_local, self.service.rtp_ports.as_ref());
        let rewritten = pair.as_ref().ok().and_then(|p| {
            let ports = p.ports().ok()?;
            transport::request_to_member(transport, ports)
        });
        let (Ok(pair), Some(rewritten)) = (pair, rewritten) else {
            tracing::info!(service = %self.service.tcp.name, client = %self.client, "no UDP port pair free for an RTSP stream");
            return Verdict::Answer(answer(503, "Service Unavailable", Some(cseq)));
        };
        state.setups.insert(
            cseq.to_vec(),
            PendingSetup {
                udp: Some((pair, client_ports)),
            },
        );
        Verdict::Forward(m.with_header(buf, "transport", &rewritten))
    }

    async fn member_to_client(&self, mut rd: OwnedReadHalf) {
        // The member's silence is the client's business (the client direction times out).
        let mut buf = BytesMut::with_capacity(8192);
        loop {
            let frame = match read_frame(&mut rd, &mut buf, None).await {
                Read::Frame(f) => f,
                Read::Closed | Read::Idle => return,
                Read::Malformed(why) => {
                    self.service.malformed(why, self.client, "member");
                    return;
                }
            };
            let len = frame.len();
            let rewritten = match &frame {
                Frame::Message(m) if m.status().is_some() => self.on_response(&buf, m),
                // Interleaved data passes as it came, without a copy.
                _ => None,
            };
            let out = rewritten.as_deref().unwrap_or(&buf[..len]);
            if !self.to_client(out).await {
                return;
            }
            buf.advance(len);
        }
    }

    /// A member's reply on its way to the client: a SETUP's opens its session (remembered for
    /// persistence) and, over UDP, its relay; a TEARDOWN's ends the session's relays. `Some`:
    /// the reply as rewritten for the client; `None`: it goes as it came.
    fn on_response(&self, buf: &[u8], m: &Message) -> Option<Vec<u8>> {
        let cseq = m.cseq(buf)?;
        let ok = m.status().is_some_and(|s| (200..300).contains(&s));
        let mut state = self.state.lock();
        if let Some(session) = state.teardowns.remove(cseq) {
            if ok {
                self.end_session(&mut state, session.as_deref());
            }
            return None;
        }
        let setup = state.setups.remove(cseq)?;
        if !ok {
            return None;
        }
        let session = m.session(buf).map(<[u8]>::to_vec);
        if let Some(id) = &session {
            self.opened(&mut state, id);
        }
        let (member_side, client_ports) = setup.udp?;
        let transport = m.header(buf, "transport").unwrap_or_default();
        let Some(member_ports) = transport::ports(transport, "server_port") else {
            // The member chose a transport without server ports (interleaved): no relay.
            return None;
        };
        let client_side = match SocketPair::bind(self.vip, self.service.rtp_ports.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                tracing::info!(service = %self.service.tcp.name, client = %self.client, error = %e, "no UDP port pair free for an RTSP stream");
                return None;
            }
        };
        let rewritten = client_side.ports().ok().and_then(|ports| {
            transport::reply_to_client(transport, client_ports, ports, self.vip)
        })?;
        let relay = MediaRelay {
            member_side,
            client_side,
            client_ip: self.client.ip(),
            client_ports,
            member_ip: self.member.address.ip(),
            member_ports,
            member_source: transport::source(transport),
        };
        let handle = tokio::spawn(relay.run(self.service.tcp.idle_timeout, self.counters.clone()));
        state.relays.push((session, handle));
        Some(m.with_header(buf, "transport", &rewritten))
    }

    /// A session a SETUP reply gave: counted once, and remembered for its member.
    fn opened(&self, state: &mut State, id: &[u8]) {
        if state.sessions.len() < MAX_STREAMS && state.sessions.insert(id.to_vec()) {
            self.service
                .tcp
                .stats
                .rtsp_sessions
                .fetch_add(1, Ordering::Relaxed);
        }
        if let Some(table) = &self.service.sessions {
            table.insert(table.key(id), self.member.address);
        }
    }

    /// The connection ended: the relays of its sessions stay with the service (their media
    /// keeps flowing until TEARDOWN or idle); relays without a session end with it.
    fn detach_sessions(&self) {
        let relays = std::mem::take(&mut self.state.lock().relays);
        for (session, relay) in relays {
            if relay.is_finished() {
                continue;
            }
            let Some(session) = session else {
                relay.abort();
                continue;
            };
            if let Err(relay) = self.service.detached.adopt(session, relay) {
                tracing::info!(service = %self.service.tcp.name, client = %self.client,
                    "RTSP relays kept for closed connections at their bound; this session's media ends with its connection");
                relay.abort();
            }
        }
    }

    /// TEARDOWN answered: the session's relays end (also those kept from a closed connection)
    /// and the member is forgotten for it.
    fn end_session(&self, state: &mut State, id: Option<&[u8]>) {
        state.relays.retain(|(session, relay)| {
            let ends = id.is_none() || session.as_deref() == id;
            if ends {
                relay.abort();
            }
            !ends
        });
        if let Some(id) = id {
            self.service.detached.end(id);
        }
        if let (Some(table), Some(id)) = (&self.service.sessions, id) {
            table.remove(&table.key(id));
        }
    }
}

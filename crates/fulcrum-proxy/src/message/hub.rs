//! The dispatcher of one message service: it schedules every message on its own with the pool,
//! hands it to the chosen member's connections, and takes it back when a member connection dies.
//!
//! Ownership is the delivery guarantee. A `Message` is owned by exactly one place at a time — a
//! member's queue, a member connection's pending table, or the dispatcher in between — and it is
//! consumed by handing its answer or its failure to the client connection it came from. Rust's
//! move semantics therefore make "answered at most once" structural; and a message dropped by any
//! other path (a task aborted at shutdown) reports itself failed from its `Drop`, so a client
//! connection never waits for an answer that nothing will send.

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::collections::VecDeque;

use arc_swap::ArcSwap;
use bytes::Bytes;
use fulcrum_balance::{Member, PickContext, Pool};
use fulcrum_config::{
    Algorithm, Delivery, Framing, MemberRequests, MessageMode, MessageOptions, ProxyProtocol,
    Sequence, Simplex,
};
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use crate::message::framing::{field_in_body, Framer};
use crate::message::stats::{FailReason, MemberMessageStats, MessageStats};
use crate::tcp::{l4_hash, SourcePersistence};
use fulcrum_net::stats::ServiceStats;

/// How many times a message may be handed back unsent (its member's connections could not be
/// established, or the member left the pool) before it fails; the message timeout bounds it too.
const MAX_BOUNCES: u32 = 16;

/// What a message service's member connections depend on. A reload that changes any of it builds
/// a new dispatcher (new member connections) for client connections accepted from then on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub framing: Framing,
    pub mode: MessageMode,
    pub sequence: Option<Sequence>,
    pub options: MessageOptions,
    pub proxy_protocol: Option<ProxyProtocol>,
    /// Source addresses for member connections (`snat`).
    pub snat: Option<Arc<fulcrum_net::snat::Snat>>,
    /// TLS to the members (the pool's `tls`): every member connection is re-encrypted. Compared
    /// by what it verifies and sends (CA certificates by content), so a reload that changes it
    /// builds a new dispatcher with new connections.
    pub member_tls: Option<Arc<fulcrum_tls::client::MemberTls>>,
    /// `framing.wasm`: the loaded framing hook.
    pub framing_hook: Option<crate::message::framing::Hook>,
    /// `simplex`: each member answers on a receive-only connection of its own.
    pub simplex: Option<Simplex>,
    /// `member_requests`: requests the members send of their own.
    pub member_requests: Option<MemberRequests>,
}

impl Settings {
    /// Answers are paired with requests by sequence key (async, with `sequence` or a framing
    /// hook that gives keys), not by order.
    pub(crate) fn by_id(&self) -> bool {
        self.mode == MessageMode::Async && (self.sequence.is_some() || self.framing_hook.is_some())
    }

    /// Messages one member connection carries at once.
    pub(crate) fn window(&self) -> usize {
        match self.mode {
            MessageMode::Sync => 1,
            MessageMode::Async => self.options.max_pending as usize,
        }
    }

    /// Connections opened per member as soon as it joins (sync opens more on demand).
    pub(crate) fn base_connections(&self) -> usize {
        match self.mode {
            MessageMode::Sync => 1,
            MessageMode::Async => self.options.member_connections as usize,
        }
    }
}

/// What goes back to a client connection for one of its messages, or, unasked, a member's own
/// request (`member_requests`).
#[derive(Debug)]
pub(crate) enum Reply {
    Response {
        index: u64,
        bytes: Bytes,
    },
    Failed {
        index: u64,
    },
    /// A member's request for this client connection: written to the client as it is; the
    /// client's message carrying the same sequence id goes back to `asker` (the member
    /// connection that received the request).
    Request {
        bytes: Bytes,
        id: Range<usize>,
        asker: Arc<Client>,
    },
}

/// A client connection as its messages know it: where answers go, and its address.
pub(crate) struct Client {
    reply: mpsc::UnboundedSender<Reply>,
    pub peer: SocketAddr,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("peer", &self.peer).finish()
    }
}

impl Client {
    pub(crate) fn new(reply: mpsc::UnboundedSender<Reply>, peer: SocketAddr) -> Arc<Client> {
        Arc::new(Client { reply, peer })
    }

    /// Hands `reply` over; gives it back when the connection is gone.
    pub(crate) fn send(&self, reply: Reply) -> Result<(), Reply> {
        self.reply.send(reply).map_err(|e| e.0)
    }
}

/// One message on its way: the frame as received, and where its answer goes.
///
/// Kept small (it is moved between queues and tables several times): the client's channel and
/// address sit behind one shared pointer, the sequence id is an offset, and the rarely used list
/// of members to avoid is boxed.
pub(crate) struct Message {
    pub bytes: Bytes,
    client: Arc<Client>,
    /// Position of this message among its client's messages.
    index: u64,
    pub accepted: Instant,
    /// Where the sequence id lies within `bytes` (async with `sequence`); length 0 = none.
    id_at: u32,
    id_len: u8,
    /// Sends to members so far.
    pub attempts: u8,
    /// Hand-backs without a send (see `MAX_BOUNCES`).
    pub bounces: u8,
    /// Answered or failed: nothing more is owed to the client.
    done: bool,
    /// Members whose connection died with this message, or could not take it: avoided next.
    tried: Option<Box<[SocketAddr]>>,
    /// The member the framing hook chose (`fulcrum.member`); boxed, as rarely set.
    chosen: Option<Box<SocketAddr>>,
}

impl Message {
    pub(crate) fn new(
        bytes: Bytes,
        id: Option<Range<usize>>,
        client: Arc<Client>,
        index: u64,
        accepted: Instant,
        chosen: Option<SocketAddr>,
    ) -> Message {
        // The client connection bounds frames by max_message (at most 64 MiB) and ids by 64
        // bytes, so both fit; anything else would be a bug, and then the message has no id.
        let (id_at, id_len) = id
            .and_then(|r| Some((u32::try_from(r.start).ok()?, u8::try_from(r.len()).ok()?)))
            .unwrap_or((0, 0));
        Message {
            bytes,
            client,
            index,
            accepted,
            id_at,
            id_len,
            attempts: 0,
            bounces: 0,
            done: false,
            tried: None,
            chosen: chosen.map(Box::new),
        }
    }

    /// Where the sequence id lies within `bytes`.
    pub(crate) fn id(&self) -> Option<Range<usize>> {
        (self.id_len > 0).then(|| {
            let at = self.id_at as usize;
            at..at + usize::from(self.id_len)
        })
    }

    pub(crate) fn peer(&self) -> SocketAddr {
        self.client.peer
    }

    /// Members to avoid for this message.
    pub(crate) fn tried(&self) -> &[SocketAddr] {
        self.tried.as_deref().unwrap_or_default()
    }

    fn avoid(&mut self, member: SocketAddr) {
        if !self.tried().contains(&member) {
            let mut v = self.tried().to_vec();
            v.push(member);
            self.tried = Some(v.into_boxed_slice());
        }
    }

    /// Hands the answer to the client connection; false when that connection is gone.
    fn answer(mut self, bytes: Bytes) -> bool {
        self.done = true;
        self.client
            .reply
            .send(Reply::Response {
                index: self.index,
                bytes,
            })
            .is_ok()
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.client.reply.send(Reply::Failed { index: self.index });
        }
    }
}

/// The connections of one service to one member, and the queue of messages waiting for them.
pub struct MemberLinks {
    pub member: Arc<Member>,
    pub stats: MemberMessageStats,
    /// Messages scheduled on this member, waiting for a connection with room. A per-member lock
    /// held for a push or for taking a batch; links take as many as they have room for at once.
    queue: Mutex<VecDeque<Message>>,
    /// The queue's length, for the scheduler and metrics without the lock.
    queued: AtomicUsize,
    /// A message was queued: wakes one connected link with room.
    pub(crate) work: Notify,
    /// A message was scheduled here while no link was connected: wakes links in back-off.
    pub(crate) wanted: Notify,
    /// The set is retired, or the service is shutting down: wakes every link.
    pub(crate) closing: Notify,
    retired: AtomicBool,
    /// Links connected now, and those of them with room for another message.
    ready: AtomicUsize,
    pub(crate) idle: AtomicUsize,
    /// Link tasks alive (connected or not).
    tasks: AtomicU32,
    /// `simplex.receive_listen`: the receive connection the member opened last, until its link
    /// takes it; `arrived` wakes the link.
    inbound: Mutex<Option<tokio::net::TcpStream>>,
    pub(crate) arrived: Notify,
}

impl MemberLinks {
    fn new(member: Arc<Member>) -> MemberLinks {
        MemberLinks {
            member,
            stats: MemberMessageStats::default(),
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            work: Notify::new(),
            wanted: Notify::new(),
            closing: Notify::new(),
            retired: AtomicBool::new(false),
            ready: AtomicUsize::new(0),
            idle: AtomicUsize::new(0),
            tasks: AtomicU32::new(0),
            inbound: Mutex::new(None),
            arrived: Notify::new(),
        }
    }

    /// The receive connection the member opened (`simplex.receive_listen`), if one is waiting.
    pub(crate) fn take_inbound(&self) -> Option<tokio::net::TcpStream> {
        self.inbound.lock().take()
    }

    pub fn ready(&self) -> usize {
        self.ready.load(Ordering::Acquire)
    }

    pub(crate) fn set_ready(&self, up: bool) {
        if up {
            self.ready.fetch_add(1, Ordering::AcqRel);
        } else {
            self.ready.fetch_sub(1, Ordering::AcqRel);
        }
    }

    pub(crate) fn retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    /// Messages waiting for a connection of this member.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Moves up to `max` queued messages, oldest first, to `out`; returns whether more are left.
    pub(crate) fn take(&self, max: usize, out: &mut Vec<Message>, hub: &Hub) -> bool {
        let left = {
            let mut q = self.queue.lock();
            let n = max.min(q.len());
            out.extend(q.drain(..n));
            self.queued.store(q.len(), Ordering::Relaxed);
            q.len()
        };
        if left < hub.queue_limit() / 2 {
            hub.relieved();
        }
        left > 0
    }

    fn push(self: &Arc<Self>, msg: Message, hub: &Arc<Hub>) {
        let len = {
            let mut q = self.queue.lock();
            q.push_back(msg);
            self.queued.store(q.len(), Ordering::Relaxed);
            q.len()
        };
        if len >= hub.queue_limit() {
            hub.congested();
        }
        self.work.notify_one();
        if self.ready() == 0 {
            self.wanted.notify_waiters();
        }
        if hub.settings.mode == MessageMode::Sync && self.idle.load(Ordering::Acquire) == 0 {
            // No idle connection: open another, as far as member_connections allows.
            self.spawn_links(hub, hub.settings.options.member_connections as usize, false);
        }
        // Retirement drains the queue after setting the flag; a push that raced it finds the
        // flag here and drains what it added.
        if self.retired() {
            self.drain(hub);
        }
    }

    /// Sends every queued message elsewhere.
    pub(crate) fn drain(&self, hub: &Arc<Hub>) {
        // Taken out first: rescheduling may queue on this very set again.
        let queued = std::mem::take(&mut *self.queue.lock());
        self.queued.store(0, Ordering::Relaxed);
        for mut msg in queued {
            msg.bounces += 1;
            msg.avoid(self.member.address);
            if u32::from(msg.bounces) > MAX_BOUNCES {
                hub.fail(msg, FailReason::MemberFailed);
            } else {
                hub.dispatch(msg);
            }
        }
    }

    /// Starts link tasks until `target` run; `keep` ones reconnect forever, the others end when
    /// their connection does.
    fn spawn_links(self: &Arc<Self>, hub: &Arc<Hub>, target: usize, keep: bool) {
        loop {
            let n = self.tasks.load(Ordering::Acquire);
            if n as usize >= target || self.retired() {
                return;
            }
            if self
                .tasks
                .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                (hub.link_task)(self.clone(), hub.clone(), keep);
                if !keep {
                    return;
                }
            }
        }
    }

    pub(crate) fn task_ended(&self) {
        self.tasks.fetch_sub(1, Ordering::AcqRel);
    }

    fn retire(&self, hub: &Arc<Hub>) {
        self.retired.store(true, Ordering::SeqCst);
        self.closing.notify_waiters();
        self.wanted.notify_waiters();
        self.drain(hub);
    }

    /// Whether links should stop taking messages and end once theirs are answered.
    pub(crate) fn closing_for(&self, hub: &Hub) -> bool {
        self.retired() || hub.is_shut()
    }
}

/// The pool and member connection sets new messages go to; swapped whole on reload.
pub struct Dispatch {
    pub pool: Arc<Pool>,
    /// One set per pool member, in pool order.
    pub members: Vec<Arc<MemberLinks>>,
    pub persistence: Option<SourcePersistence>,
}

impl Dispatch {
    /// The member for a message, walked through the pool's attempts (`Pool::attempts`):
    /// persistence first, then the scheduler among the members the message has not failed on.
    /// Readiness is this plane's own: a member whose connections are all down, or whose queue
    /// is full, is passed over while another can take the message. The persisted member takes
    /// it whenever a connection of it is up, full queue or not (the client stays where it is).
    /// How many sends a message gets is `max_attempts` (see `member_failed`), not the pool's
    /// `retries`.
    fn choose(&self, msg: &Message, limit: usize) -> Option<usize> {
        let pool = &self.pool;
        let key = self.persistence.as_ref().map(|p| p.key(msg.peer()));
        let remembered = match (&self.persistence, &key) {
            (Some(p), Some(k)) => p.table.get(k),
            _ => None,
        };
        // The framing hook's choice comes ahead of persistence; a member not in the pool, or
        // out, leaves the choice to the attempts below, as a forgotten one would.
        let preferred = msg.chosen.as_deref().copied().or(remembered);
        // Only the hash algorithm reads the key: skip hashing the client per message otherwise.
        let ctx = PickContext {
            hash: (pool.algorithm == Algorithm::Hash)
                .then(|| l4_hash(&pool.hash_key, msg.peer()))
                .flatten(),
        };
        let mut attempts = pool.attempts(ctx, preferred).after(msg.tried());
        let mut full = None;
        let mut fallback = None;
        let mut chosen = None;
        while !attempts.all_out() {
            let Some(p) = attempts.next_member() else {
                break;
            };
            let links = &self.members[p.index];
            if links.ready() > 0 && (attempts.persisted() || links.queued() < limit) {
                chosen = Some(p.index);
                break;
            }
            if links.ready() > 0 {
                // Its queue is full: another member takes the message if one can; otherwise
                // it is queued here anyway (it was read already) and the clients pause.
                full.get_or_insert(p.index);
            } else {
                // The member may take work but has no connection up (it just recovered, or
                // just joined): have its connections retry now instead of at the end of their
                // back-off.
                links.wanted.notify_waiters();
                fallback.get_or_insert(p.index);
            }
            attempts.pass_over(&p);
        }
        if chosen.is_none() && fallback.is_none() && attempts.tried() > 0 {
            // Every other member is out: the one the message failed on may still serve its
            // re-send (a lone member that restarted).
            fallback = attempts.any_member().map(|p| p.index);
        }
        let chosen = chosen.or(full).or(fallback)?;
        if let (Some(p), Some(k)) = (&self.persistence, key) {
            let addr = self.members[chosen].member.address;
            if remembered != Some(addr) {
                p.table.insert(k, addr);
            }
        }
        Some(chosen)
    }
}

/// One message service's dispatcher, shared by its client connections and member connections.
pub struct Hub {
    pub name: Arc<str>,
    pub settings: Settings,
    pub(crate) framer: Framer,
    current: ArcSwap<Dispatch>,
    pub stats: Arc<ServiceStats>,
    pub messages: Arc<MessageStats>,
    clients: AtomicUsize,
    registered: AtomicBool,
    /// What client connections may do now: read new messages or pause (back-pressure), or stop
    /// reading and finish what they carry (shutdown). A watch: no change is missed by a client
    /// between its check and its wait.
    flow: tokio::sync::watch::Sender<Flow>,
    /// Mirrors `flow.congested`, so the hot path reads an atomic, not the watch's lock.
    congested: AtomicBool,
    /// Starts the task of one member connection (`link::spawn`). Handed in by `Hub::new`
    /// (message/mod.rs) so that the dispatcher does not depend on how a member connection is
    /// driven, while the link task depends on the dispatcher it serves.
    link_task: LinkTask,
    /// `member_requests.client_field`: the client connections by the name their messages
    /// carry (the latest connection that sent a name has it).
    named: Mutex<std::collections::HashMap<Vec<u8>, std::sync::Weak<Client>>>,
    /// `member_requests.fallback_pool`: the dispatcher over that pool (set by the plane).
    fallback: arc_swap::ArcSwapOption<Hub>,
}

/// Starts one member connection's task: the member's links, the hub, and whether it reconnects
/// for ever (`keep`) or ends with its connection.
pub(crate) type LinkTask = fn(Arc<MemberLinks>, Arc<Hub>, bool);

/// See `Hub::flow`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Flow {
    /// A message went to a member whose queue is at `member_queue` (no other member had room):
    /// clients stop reading until that queue is half empty.
    pub congested: bool,
    /// The process is shutting down: clients read no new message, wait for the answers to the
    /// ones in flight, write them and close.
    pub stopping: bool,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("name", &self.name).finish()
    }
}

impl Hub {
    /// A dispatcher over `pool` whose member connections run as `link_task` starts them; no
    /// member connection is opened before `start`.
    pub(crate) fn with_link_task(
        name: Arc<str>,
        settings: Settings,
        stats: Arc<ServiceStats>,
        messages: Arc<MessageStats>,
        pool: Arc<Pool>,
        persistence: Option<SourcePersistence>,
        link_task: LinkTask,
    ) -> Arc<Hub> {
        let members = pool
            .members()
            .iter()
            .map(|m| Arc::new(MemberLinks::new(m.clone())))
            .collect();
        Arc::new(Hub {
            name,
            framer: match &settings.framing_hook {
                Some(hook) => Framer::with_hook(&settings.framing, hook.clone()),
                None => Framer::new(&settings.framing),
            },
            settings,
            current: ArcSwap::from_pointee(Dispatch {
                pool,
                members,
                persistence,
            }),
            stats,
            messages,
            clients: AtomicUsize::new(0),
            registered: AtomicBool::new(true),
            flow: tokio::sync::watch::Sender::new(Flow::default()),
            congested: AtomicBool::new(false),
            link_task,
            named: Mutex::new(std::collections::HashMap::new()),
            fallback: arc_swap::ArcSwapOption::empty(),
        })
    }

    /// `member_queue`: messages waiting per member before clients are paused.
    pub(crate) fn queue_limit(&self) -> usize {
        self.settings.options.member_queue as usize
    }

    /// A member queue is at `member_queue`: client connections take no new message.
    pub(crate) fn is_congested(&self) -> bool {
        self.congested.load(Ordering::Acquire)
    }

    pub(crate) fn flow(&self) -> tokio::sync::watch::Receiver<Flow> {
        self.flow.subscribe()
    }

    fn congested(&self) {
        if !self.congested.swap(true, Ordering::AcqRel) {
            self.messages.paused.fetch_add(1, Ordering::Relaxed);
            self.flow.send_modify(|f| f.congested = true);
        }
    }

    fn relieved(&self) {
        if self.congested.load(Ordering::Acquire) && self.congested.swap(false, Ordering::AcqRel) {
            self.flow.send_modify(|f| f.congested = false);
        }
    }

    /// At shutdown: client connections stop reading new messages, and close once the answers to
    /// the messages they carry are written (the shutdown timeout bounds the wait).
    pub fn stop_clients(&self) {
        self.flow.send_modify(|f| f.stopping = true);
    }

    /// Messages waiting in the member queues.
    pub fn queued(&self) -> usize {
        self.current.load().members.iter().map(|l| l.queued()).sum()
    }

    /// Opens the member connections.
    pub fn start(self: &Arc<Self>) {
        for links in &self.current.load().members {
            links.spawn_links(self, self.settings.base_connections(), true);
        }
    }

    /// Sends new messages to `pool` from now on. Member connection sets of members that stay
    /// (the same member, as a reload keeps it) are kept; sets of members that left stop taking
    /// messages, finish the ones they carry and close; their queued messages are rescheduled.
    pub fn retarget(self: &Arc<Self>, pool: Arc<Pool>, persistence: Option<SourcePersistence>) {
        let old = self.current.load_full();
        let members: Vec<Arc<MemberLinks>> = pool
            .members()
            .iter()
            .map(|m| {
                old.members
                    .iter()
                    .find(|l| Arc::ptr_eq(&l.member, m))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(MemberLinks::new(m.clone())))
            })
            .collect();
        let gone: Vec<Arc<MemberLinks>> = old
            .members
            .iter()
            .filter(|l| !members.iter().any(|n| Arc::ptr_eq(n, l)))
            .cloned()
            .collect();
        self.current.store(Arc::new(Dispatch {
            pool,
            members,
            persistence,
        }));
        self.start();
        for links in gone {
            links.retire(self);
        }
    }

    /// The service left the configuration: member connections close once no client connection
    /// of this dispatcher is left.
    pub fn unregister(&self) {
        self.registered.store(false, Ordering::SeqCst);
        if self.clients.load(Ordering::SeqCst) == 0 {
            self.wake_links();
        }
    }

    pub(crate) fn is_shut(&self) -> bool {
        !self.registered.load(Ordering::SeqCst) && self.clients.load(Ordering::SeqCst) == 0
    }

    fn wake_links(&self) {
        for links in &self.current.load().members {
            links.closing.notify_waiters();
            links.wanted.notify_waiters();
        }
    }

    pub(crate) fn client_joined(&self) {
        self.clients.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn client_left(&self) {
        if self.clients.fetch_sub(1, Ordering::SeqCst) == 1
            && !self.registered.load(Ordering::SeqCst)
        {
            self.wake_links();
        }
    }

    /// The dispatcher's current pool and member connection sets.
    pub fn dispatch_state(&self) -> Arc<Dispatch> {
        self.current.load_full()
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.current.load().pool.connect_timeout
    }

    /// The pool's VRF, which member connections are bound into.
    pub(crate) fn vrf(&self) -> Option<String> {
        self.current.load().pool.config.vrf.clone()
    }

    /// Schedules a message and queues it on the chosen member's connections.
    pub(crate) fn dispatch(self: &Arc<Self>, msg: Message) {
        // A message just read from its client cannot be overdue: only re-sends and bounces
        // pay for a clock read.
        let retry = msg.attempts > 0 || msg.bounces > 0;
        if retry && msg.accepted.elapsed() >= self.settings.options.message_timeout {
            return self.fail(msg, FailReason::Timeout);
        }
        let d = self.current.load();
        match d.choose(&msg, self.queue_limit()) {
            Some(i) => {
                let links = d.members[i].clone();
                drop(d);
                links.push(msg, self);
            }
            None => self.fail(msg, FailReason::NoMember),
        }
    }

    /// A message whose member connection died before the member answered: sent again to another
    /// member (at_least_once, within max_attempts), or failed.
    pub(crate) fn member_failed(self: &Arc<Self>, mut msg: Message, member: SocketAddr) {
        msg.avoid(member);
        if self.settings.options.delivery == Delivery::AtLeastOnce
            && u32::from(msg.attempts) < self.settings.options.max_attempts
        {
            self.messages.redispatched.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(service = %self.name, %member, attempts = msg.attempts, "re-sending a message its member did not answer");
            self.dispatch(msg);
        } else {
            self.fail(msg, FailReason::MemberFailed);
        }
    }

    /// A message never sent to `member` that must go elsewhere (its link could not keep it).
    pub(crate) fn bounce(self: &Arc<Self>, mut msg: Message, member: SocketAddr) {
        msg.bounces += 1;
        msg.avoid(member);
        if u32::from(msg.bounces) > MAX_BOUNCES {
            self.fail(msg, FailReason::MemberFailed);
        } else {
            self.dispatch(msg);
        }
    }

    /// Hands an answer to the message's client connection.
    pub(crate) fn deliver(&self, msg: Message, bytes: Bytes, now: Instant) {
        let latency = now.saturating_duration_since(msg.accepted);
        if msg.answer(bytes) {
            self.messages.responses.fetch_add(1, Ordering::Relaxed);
            self.messages.latency.observe(latency);
        } else {
            self.messages.client_gone.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A connection to the service's `simplex.receive_listen` from `peer`: the receive
    /// connection of the member of that IP (it replaces one the member opened before and that
    /// no link took yet). Given back when no member of the pool has that IP.
    pub fn receive_connection(
        &self,
        stream: tokio::net::TcpStream,
        peer: SocketAddr,
    ) -> Result<(), tokio::net::TcpStream> {
        let d = self.current.load();
        let Some(links) = d
            .members
            .iter()
            .find(|l| l.member.address.ip() == peer.ip())
        else {
            return Err(stream);
        };
        *links.inbound.lock() = Some(stream);
        links.arrived.notify_one();
        links.wanted.notify_waiters();
        Ok(())
    }

    /// `member_requests.fallback_pool`: where member requests go that no named client takes.
    pub fn set_fallback(&self, fallback: Option<Arc<Hub>>) {
        self.fallback.store(fallback);
    }

    pub fn fallback(&self) -> Option<Arc<Hub>> {
        self.fallback.load_full()
    }

    /// A client connection's messages carry `name` (`member_requests.client_field`): member
    /// requests naming it go to that connection from now on.
    pub(crate) fn name_client(&self, name: &[u8], client: &Arc<Client>) {
        let mut named = self.named.lock();
        // Names of closed connections are swept as the table grows, so it stays near the
        // number of live ones.
        if named.len() >= 1024 && named.len().is_power_of_two() {
            named.retain(|_, c| c.strong_count() > 0);
        }
        named.insert(name.to_vec(), Arc::downgrade(client));
    }

    /// A request a member sent of its own (`bytes`, its sequence id at `id`, its body at
    /// `body`), received by the member connection `asker`: handed to the client connection the
    /// message names, else to the fallback pool, else dropped and counted.
    pub(crate) fn member_request(
        &self,
        bytes: Bytes,
        id: Range<usize>,
        body: Range<usize>,
        asker: &Arc<Client>,
        now: Instant,
    ) {
        self.messages.originated.fetch_add(1, Ordering::Relaxed);
        let Some(reqs) = &self.settings.member_requests else {
            return;
        };
        let mut bytes = bytes;
        let named = reqs.client_field.as_ref().and_then(|f| {
            let name = bytes.get(field_in_body(&body, f.offset, f.length)?)?;
            self.named
                .lock()
                .get(name)
                .and_then(std::sync::Weak::upgrade)
        });
        if let Some(client) = named {
            let request = Reply::Request {
                bytes,
                id: id.clone(),
                asker: asker.clone(),
            };
            match client.send(request) {
                Ok(()) => {
                    self.messages
                        .originated_delivered
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // Closed since it named itself: the fallback pool may take it.
                Err(Reply::Request { bytes: b, .. }) => bytes = b,
                Err(_) => return,
            }
        }
        match self.fallback.load_full() {
            Some(fallback) => {
                self.messages
                    .originated_delivered
                    .fetch_add(1, Ordering::Relaxed);
                let msg = Message::new(bytes, Some(id), asker.clone(), 0, now, None);
                fallback.dispatch(msg);
            }
            None => {
                self.messages
                    .originated_undeliverable
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(service = %self.name, member = %asker.peer, "dropped a member's request: no client connection of that name, and no fallback pool");
            }
        }
    }

    pub(crate) fn fail(&self, msg: Message, reason: FailReason) {
        self.messages.count_failure(reason);
        match reason {
            FailReason::NoMember => {
                self.stats.no_member.fetch_add(1, Ordering::Relaxed);
            }
            FailReason::MemberFailed => {
                self.stats.upstream_failures.fetch_add(1, Ordering::Relaxed);
            }
            FailReason::Timeout => {}
        }
        tracing::debug!(service = %self.name, client = %msg.peer(), reason = reason.as_str(), "message failed");
        drop(msg);
    }

    /// Messages received and not yet answered or failed.
    pub fn in_flight(&self) -> u64 {
        self.messages.in_flight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_balance::persist::{PersistTable, TableSpec};

    fn addr(i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 20_000 + i as u16))
    }

    /// A dispatch over `n` round-robin members without health checks; member connection
    /// readiness is set by hand, no connection is opened.
    fn dispatch(n: usize, persistence: bool) -> Dispatch {
        let members: String = (0..n)
            .map(|i| format!("[[pool.member]]\naddress = \"{}\"\n", addr(i)))
            .collect();
        let text = format!(
            "[[virtual_service]]\nname = \"m\"\nlisten = \"127.0.0.1:1\"\nprotocol = \"message\"\npool = \"p\"\nframing = {{ length_bytes = 2 }}\n[[pool]]\nname = \"p\"\nmonitors = []\n{members}"
        );
        let cfg = fulcrum_config::parse(&text, "t.toml", std::path::Path::new("."))
            .expect("a valid config");
        let pool = Arc::new(Pool::new(&cfg.pools[0], &[], None));
        let members = pool
            .members()
            .iter()
            .map(|m| Arc::new(MemberLinks::new(m.clone())))
            .collect();
        let persistence = persistence.then(|| SourcePersistence {
            table: Arc::new(PersistTable::new(TableSpec {
                idle_timeout: Duration::from_secs(60),
                max_entries: 100,
            })),
            mask_v4: 32,
            mask_v6: 128,
        });
        Dispatch {
            pool,
            members,
            persistence,
        }
    }

    fn message(tried: &[SocketAddr]) -> (Message, mpsc::UnboundedReceiver<Reply>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let client = Client::new(tx, SocketAddr::from(([127, 0, 0, 9], 5000)));
        let mut msg = Message::new(
            Bytes::from_static(b"\0\x01x"),
            None,
            client,
            0,
            Instant::now(),
            None,
        );
        for a in tried {
            msg.avoid(*a);
        }
        // Answered by the test: nothing reports it failed when it drops.
        msg.done = true;
        (msg, rx)
    }

    #[test]
    fn choose_passes_over_members_without_a_connection_and_wakes_them() {
        let d = dispatch(3, false);
        d.members[2].set_ready(true);
        let (msg, _rx) = message(&[]);
        for _ in 0..4 {
            assert_eq!(d.choose(&msg, 10), Some(2));
        }
        // Nothing up at all: the scheduler's member is taken anyway (its links were woken).
        d.members[2].set_ready(false);
        assert!(d.choose(&msg, 10).is_some());
        assert_eq!(d.pool.no_member.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn choose_avoids_the_members_the_message_failed_on_until_none_is_left() {
        let d = dispatch(2, false);
        for l in &d.members {
            l.set_ready(true);
        }
        let (msg, _rx) = message(&[addr(0)]);
        for _ in 0..4 {
            assert_eq!(d.choose(&msg, 10), Some(1));
        }
        // Failed on both: the re-send may still go to one of them (a member that restarted).
        let (msg, _rx) = message(&[addr(0), addr(1)]);
        assert!(d.choose(&msg, 10).is_some());
        // Both disabled: nowhere to go.
        for m in d.pool.members() {
            m.set_state(fulcrum_config::AdminState::Disabled);
        }
        assert_eq!(d.choose(&msg, 10), None);
    }

    #[test]
    fn choose_keeps_a_persisted_client_on_its_member_even_with_a_full_queue() {
        let d = dispatch(3, true);
        for l in &d.members {
            l.set_ready(true);
        }
        let (msg, _rx) = message(&[]);
        let first = d.choose(&msg, 10).expect("a member");
        // Every queue is "full" (limit 0): the persisted member still takes the client's
        // messages, where a client without persistence would go to the scheduler's choice.
        for _ in 0..4 {
            assert_eq!(d.choose(&msg, 0), Some(first));
        }
        // Its connections are all down: the message goes elsewhere, and the table follows.
        d.members[first].set_ready(false);
        let other = d.choose(&msg, 10).expect("a member");
        assert_ne!(other, first);
        assert_eq!(d.choose(&msg, 10), Some(other));
    }

    #[test]
    fn choose_prefers_a_member_with_room_over_a_full_one() {
        let d = dispatch(2, false);
        for l in &d.members {
            l.set_ready(true);
        }
        // Member 0's queue holds one message; the limit is one.
        let (queued, _rx0) = message(&[]);
        d.members[0].queue.lock().push_back(queued);
        d.members[0].queued.store(1, Ordering::Relaxed);
        let (msg, _rx) = message(&[]);
        for _ in 0..4 {
            assert_eq!(d.choose(&msg, 1), Some(1));
        }
        // Both full: queued anyway (the message was read), on one of them.
        assert!(d.choose(&msg, 0).is_some());
        assert_eq!(d.pool.no_member.load(Ordering::Relaxed), 0);
    }
}

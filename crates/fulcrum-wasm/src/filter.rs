//! A configured filter (its instances, counters and failure policy), a virtual service's chain
//! of them, and the per-stream driver that runs the chain's callbacks in order.
//!
//! Instances are per filter, a few of them (one per worker thread, as Envoy has one per worker),
//! each behind its own lock held only for the length of one call: a stream opens its context in
//! one instance and stays there, so a filter's per-stream state lives where its callbacks run.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use wasmtime::InstancePre;

use crate::abi::{action, Pair};
use crate::engine::{self, ModuleInfo};
use crate::head::{HeadPairs, RequestLine};
use crate::plugin::{Limits, LocalReply, OutgoingCall, Plugin, Props, SharedStore};
use crate::vm::{Failure, HostState, HttpState, Interest, Phase, Vm};

/// What happens to a request when its filter fails (traps, loops, runs out of memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// The request is answered 500 (or its response cut short).
    #[default]
    FailClosed,
    /// The request goes on as if the filter were absent.
    FailOpen,
}

/// A filter as configured.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The module's path as configured (its name everywhere).
    pub name: String,
    pub bytes: Vec<u8>,
    /// The root id the filter's root context registers under (`""` when it registers one).
    pub root_id: String,
    pub config: Vec<u8>,
    pub on_error: OnError,
    pub limits: Limits,
    /// Consecutive failures after which the filter is disabled (0: never).
    pub disable_after: u32,
    /// The largest request body the filter reads (0: it is given none).
    pub max_request_body: usize,
    /// Instances (one per worker thread is the sound number).
    pub instances: usize,
    /// The counters, kept by the caller across reloads; a new filter enables them again.
    pub stats: Arc<FilterStats>,
}

impl Spec {
    /// `bytes` under `name` with the defaults a configuration leaves: no root id or
    /// configuration, failing closed, the default limits, never disabled, 1 MiB of request
    /// body, one instance.
    pub fn of(name: &str, bytes: Vec<u8>) -> Spec {
        Spec {
            name: name.into(),
            bytes,
            root_id: String::new(),
            config: Vec::new(),
            on_error: OnError::FailClosed,
            limits: Limits::default(),
            disable_after: 0,
            max_request_body: 1 << 20,
            instances: 1,
            stats: Default::default(),
        }
    }
}

#[derive(Debug, Default)]
pub struct FilterStats {
    pub calls: AtomicU64,
    pub budget_exceeded: AtomicU64,
    pub memory_exceeded: AtomicU64,
    pub traps: AtomicU64,
    pub local_replies: AtomicU64,
    pub http_calls: AtomicU64,
    pub instance_restarts: AtomicU64,
    pub disabled: AtomicBool,
    consecutive: AtomicU32,
}

impl FilterStats {
    pub fn failures(&self) -> u64 {
        self.budget_exceeded.load(Ordering::Relaxed)
            + self.memory_exceeded.load(Ordering::Relaxed)
            + self.traps.load(Ordering::Relaxed)
    }
}

type Slot = Mutex<Arc<Mutex<Vm>>>;

pub struct Filter {
    pub name: Arc<str>,
    pub on_error: OnError,
    pub info: ModuleInfo,
    pub stats: Arc<FilterStats>,
    plugin: Arc<Plugin>,
    pre: InstancePre<HostState>,
    slots: Vec<Slot>,
    next: AtomicUsize,
    interest: Interest,
    disable_after: u32,
    max_request_body: usize,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filter").field("name", &self.name).finish()
    }
}

impl Filter {
    /// Compiles (or reuses) the module, links it and starts its instances: a module that does
    /// not load, link, start or accept its configuration is refused here, at load or reload.
    pub fn new(spec: Spec) -> Result<Filter, String> {
        let (module, info) = engine::load(&spec.bytes)?;
        let pre = crate::hostcalls::prepare(&module)?;
        let name: Arc<str> = spec.name.into();
        let plugin = Arc::new(Plugin {
            name: name.clone(),
            config: spec.config,
            limits: spec.limits,
            shared: SharedStore::of(&name),
            root_id: spec.root_id,
            queues_ready: Default::default(),
        });
        let mut slots = Vec::new();
        for _ in 0..spec.instances.max(1) {
            let vm = Vm::start(&pre, plugin.clone())?;
            slots.push(Mutex::new(Arc::new(Mutex::new(vm))));
        }
        let mut interest = slots[0].lock().lock().interest();
        interest.request_body &= spec.max_request_body > 0;
        interest.properties = module
            .imports()
            .any(|i| i.module() == "env" && i.name() == "proxy_get_property");
        spec.stats.disabled.store(false, Ordering::Relaxed);
        spec.stats.consecutive.store(0, Ordering::Relaxed);
        Ok(Filter {
            name,
            on_error: spec.on_error,
            info,
            stats: spec.stats,
            plugin,
            pre,
            slots,
            next: AtomicUsize::new(0),
            interest,
            disable_after: spec.disable_after,
            max_request_body: spec.max_request_body,
        })
    }

    pub fn interest(&self) -> Interest {
        self.interest
    }

    pub fn is_disabled(&self) -> bool {
        self.stats.disabled.load(Ordering::Relaxed)
    }

    /// The tick period the filter's root context asked for, if any.
    pub fn tick_period(&self) -> Option<std::time::Duration> {
        let ms = self
            .slots
            .iter()
            .map(|s| s.lock().lock().tick_ms())
            .max()
            .unwrap_or(0);
        (ms > 0).then(|| std::time::Duration::from_millis(ms as u64))
    }

    /// Calls every instance's `proxy_on_tick`.
    pub fn tick(&self) {
        for i in 0..self.slots.len() {
            let vm = self.slots[i].lock().clone();
            let r = vm.lock().tick();
            let _ = self.settle(i, &vm, r, false);
        }
    }

    /// The queues with new items that this filter's instances registered, once there are some.
    pub async fn queues_ready(&self) -> Vec<u32> {
        self.plugin.queues_ready.ready().await
    }

    /// Calls `proxy_on_queue_ready` for each of `queues` on every instance that registered it.
    pub fn queue_ready(&self, queues: &[u32]) {
        for i in 0..self.slots.len() {
            let vm = self.slots[i].lock().clone();
            for q in queues {
                let r = vm.lock().queue_ready(*q);
                if self.settle(i, &vm, r, false).is_err() {
                    break;
                }
            }
        }
    }

    /// Asks the module's `fulcrum_on_message_frame` where the next message of a stream ends,
    /// showing it the first `FRAME_PEEK` bytes of `buf` (a length field is near the start; the
    /// frame announced may be longer than what it was shown). A failed call is counted as any
    /// filter failure and reads as malformed: the connection is closed.
    pub fn message_frame(&self, buf: &[u8]) -> MessageFrame {
        let (slot, vm) = self.pick();
        let mut http = HttpState {
            body: buf[..buf.len().min(FRAME_PEEK)].to_vec(),
            ..HttpState::default()
        };
        let r = vm.lock().message_frame(&mut http);
        match self.settle(slot, &vm, r, true) {
            Ok(v) => match MessageFrame::decode(v) {
                MessageFrame::Frame { len, key, .. } => MessageFrame::Frame {
                    len,
                    key,
                    member: http.chosen_member(),
                },
                other => other,
            },
            Err(_) => MessageFrame::Malformed,
        }
    }

    fn pick(&self) -> (usize, Arc<Mutex<Vm>>) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        (i, self.slots[i].lock().clone())
    }

    /// Counts a call's outcome (a success ends a run of consecutive failures only when
    /// `phase`: opening a context succeeds even in a filter that fails every request); a
    /// failed instance is replaced for the streams that come next
    /// (its memory may be half-updated), while streams already in it finish there.
    fn settle<T>(
        &self,
        slot: usize,
        vm: &Arc<Mutex<Vm>>,
        r: Result<T, Failure>,
        phase: bool,
    ) -> Result<T, Failure> {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        match &r {
            Ok(_) if !phase => {}
            Ok(_) => {
                if self.stats.consecutive.load(Ordering::Relaxed) != 0 {
                    self.stats.consecutive.store(0, Ordering::Relaxed);
                }
            }
            Err(f) => {
                let counter = match f {
                    Failure::Budget => &self.stats.budget_exceeded,
                    Failure::Memory => &self.stats.memory_exceeded,
                    Failure::Trap(_) => &self.stats.traps,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(filter = &*self.name, "filter failed: {f}");
                let n = self.stats.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
                if self.disable_after > 0 && n >= self.disable_after && !self.is_disabled() {
                    self.stats.disabled.store(true, Ordering::Relaxed);
                    tracing::error!(
                        filter = &*self.name,
                        failures = n,
                        "filter disabled after consecutive failures; a reload enables it again"
                    );
                }
                let mut s = self.slots[slot].lock();
                if Arc::ptr_eq(&s, vm) {
                    match Vm::start(&self.pre, self.plugin.clone()) {
                        Ok(fresh) => {
                            *s = Arc::new(Mutex::new(fresh));
                            self.stats.instance_restarts.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            tracing::error!(filter = &*self.name, "restarting the filter: {e}")
                        }
                    }
                }
            }
        }
        r
    }
}

/// The most buffered bytes a framing hook is shown.
pub const FRAME_PEEK: usize = 4096;

/// What a framing hook says of the bytes at the start of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageFrame {
    /// More bytes are needed.
    More,
    /// The bytes cannot start a message: the connection is closed.
    Malformed,
    /// The next message is `len` bytes long; its sequence key (pairing an answer with its
    /// request) lies at `key` within it.
    Frame {
        len: usize,
        key: Option<std::ops::Range<usize>>,
        /// The member the hook chose for the message (`fulcrum.member`), if it chose one.
        member: Option<std::net::SocketAddr>,
    },
}

impl MessageFrame {
    /// The hook's answer: 0 = more bytes; negative = malformed; else the frame's length in
    /// bits 0-31, its key's offset in bits 32-47 and length in bits 48-62 (0: no key).
    pub fn decode(v: i64) -> MessageFrame {
        if v == 0 {
            return MessageFrame::More;
        }
        let len = (v & 0xffff_ffff) as usize;
        if v < 0 || len == 0 {
            return MessageFrame::Malformed;
        }
        let (at, n) = (((v >> 32) & 0xffff) as usize, ((v >> 48) & 0x7fff) as usize);
        if n > 0 && at + n > len {
            return MessageFrame::Malformed;
        }
        MessageFrame::Frame {
            len,
            key: (n > 0).then_some(at..at + n),
            member: None,
        }
    }
}

/// Makes the `proxy_http_call`s of filters: given the pool named in the call, sends the request
/// to one of its members and returns the response (`:status` first), or `None` when no member
/// answered in time.
pub trait HttpCalls: Send + Sync {
    fn call(
        &self,
        call: OutgoingCall,
    ) -> Pin<Box<dyn Future<Output = Option<CallResponse>> + Send + '_>>;
}

#[derive(Debug, Clone, Default)]
pub struct CallResponse {
    pub headers: Vec<Pair>,
    pub body: Vec<u8>,
}

/// A virtual service's filters, in order.
pub struct Chain {
    pub filters: Vec<Arc<Filter>>,
    pub calls: Option<Arc<dyn HttpCalls>>,
}

impl Chain {
    /// Whether any filter wants response bodies (the response is then streamed through them,
    /// chunked).
    pub fn wants_response_body(&self) -> bool {
        self.filters
            .iter()
            .any(|f| f.interest.response_body && !f.is_disabled())
    }

    /// Opens a stream through the chain.
    pub fn stream(self: &Arc<Self>, props: Props) -> Stream {
        let props = Arc::new(props);
        let mut parts = Vec::with_capacity(self.filters.len());
        let mut refused = None;
        for f in &self.filters {
            if f.is_disabled() {
                if f.on_error == OnError::FailClosed {
                    refused = Some(format!("filter {} is disabled", f.name));
                }
                continue;
            }
            let (slot, vm) = f.pick();
            let opened = vm.lock().open();
            match f.settle(slot, &vm, opened, false) {
                Ok(ctx) => parts.push(Part {
                    filter: f.clone(),
                    slot,
                    vm,
                    ctx,
                    http: HttpState {
                        props: props.clone(),
                        ..HttpState::default()
                    },
                    live: true,
                }),
                Err(e) if f.on_error == OnError::FailClosed => {
                    refused = Some(format!("filter {}: {e}", f.name));
                }
                Err(_) => {}
            }
        }
        Stream {
            chain: self.clone(),
            parts,
            refused,
            changed: false,
        }
    }
}

struct Part {
    filter: Arc<Filter>,
    slot: usize,
    vm: Arc<Mutex<Vm>>,
    ctx: i32,
    http: HttpState,
    /// False once the filter failed open: it is skipped for the rest of the stream.
    live: bool,
}

/// What the proxy does next with a stream after a filter phase.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    /// Answer with this instead of going on.
    Local(LocalReply),
    /// A filter failed closed (or closed the stream): answer 500 before any response went out,
    /// cut the stream after.
    Fail(String),
}

/// One request's way through a chain. Dropping it ends the filters' contexts (`proxy_on_done`,
/// `proxy_on_log`, `proxy_on_delete`).
pub struct Stream {
    chain: Arc<Chain>,
    parts: Vec<Part>,
    refused: Option<String>,
    /// A filter changed the head of the last phase.
    changed: bool,
}

/// The most body bytes a filter may hold back (pausing on body callbacks) before it fails.
const MAX_HELD_BODY: usize = 8 << 20;

impl Stream {
    /// Runs `proxy_on_request_headers` of every filter in order over `headers` (pseudo-fields
    /// first), waiting out the HTTP calls a filter pauses for.
    pub async fn request_headers(
        &mut self,
        headers: &mut HeadPairs,
        end_of_stream: bool,
    ) -> Verdict {
        if let Some(why) = self.refused.take() {
            return Verdict::Fail(why);
        }
        self.headers(Phase::RequestHeaders, headers, end_of_stream)
            .await
    }

    /// `proxy_on_response_headers` of every filter (`:status` first in `headers`).
    pub async fn response_headers(
        &mut self,
        headers: &mut HeadPairs,
        end_of_stream: bool,
    ) -> Verdict {
        self.headers(Phase::ResponseHeaders, headers, end_of_stream)
            .await
    }

    /// Keeps the request's pseudo-fields, as they go to the member, for the properties of the
    /// later phases (`request.path` in a response callback, say).
    /// `line` is asked for only when a filter of the stream can read properties.
    pub fn keep_request_line(&mut self, line: impl FnOnce() -> RequestLine) {
        if !self.parts.iter().any(|p| p.filter.interest.properties) {
            return;
        }
        let line = Arc::new(line());
        for part in self.parts.iter_mut() {
            if part.filter.interest.properties {
                part.http.request_line = Some(line.clone());
            }
        }
    }

    /// The member the request went to, for the response phase's properties.
    pub fn set_upstream(&mut self, pool: Option<Arc<str>>, member: Option<std::net::SocketAddr>) {
        for part in &mut self.parts {
            part.http.pool = pool.clone();
            part.http.member = member;
        }
    }

    /// A property a filter set on this stream (`proxy_set_property`), by its dotted name; the
    /// last filter that set it wins. Fulcrum reads `fulcrum.member` (the member a filter chose
    /// for the request) this way.
    pub fn property(&self, name: &str) -> Option<&[u8]> {
        self.parts
            .iter()
            .rev()
            .find_map(|p| p.http.custom_property(name))
    }

    /// The member a filter chose for the request (`fulcrum.member`), the last filter's choice
    /// winning.
    pub fn chosen_member(&self) -> Option<std::net::SocketAddr> {
        self.parts.iter().rev().find_map(|p| p.http.chosen_member())
    }

    /// Whether a filter changed the head in the last header phase (add, replace, remove or set
    /// of its fields): the proxy rebuilds the head only then.
    pub fn head_changed(&self) -> bool {
        self.changed
    }

    /// Whether any live filter reads the request head (`false`: the phase can be skipped).
    pub fn wants_request_headers(&self) -> bool {
        self.refused.is_some()
            || self
                .parts
                .iter()
                .any(|p| p.live && p.filter.interest.request_headers)
    }

    /// Whether any live filter reads the response head.
    pub fn wants_response_headers(&self) -> bool {
        self.parts
            .iter()
            .any(|p| p.live && p.filter.interest.response_headers)
    }

    async fn headers(&mut self, phase: Phase, headers: &mut HeadPairs, eos: bool) -> Verdict {
        self.changed = false;
        for i in 0..self.parts.len() {
            let part = &mut self.parts[i];
            let wanted = match phase {
                Phase::RequestHeaders => part.filter.interest.request_headers,
                _ => part.filter.interest.response_headers,
            };
            if !part.live || !wanted {
                continue;
            }
            let slot = match phase {
                Phase::RequestHeaders => &mut part.http.request_headers,
                _ => &mut part.http.response_headers,
            };
            *slot = std::mem::take(headers);
            let n = slot.len();
            let r = part
                .vm
                .lock()
                .phase(part.ctx, phase, &mut part.http, n, eos);
            let r = part.filter.settle(part.slot, &part.vm, r, true);
            self.changed |= std::mem::take(&mut part.http.headers_changed);
            let slot = match phase {
                Phase::RequestHeaders => &mut part.http.request_headers,
                _ => &mut part.http.response_headers,
            };
            *headers = std::mem::take(slot);
            let verdict = match r {
                Err(f) => Self::failed(part, f),
                Ok(a) => Self::after(part, a == action::PAUSE, self.chain.calls.as_deref()).await,
            };
            if verdict != Verdict::Continue {
                return verdict;
            }
        }
        Verdict::Continue
    }

    fn failed(part: &mut Part, f: Failure) -> Verdict {
        part.live = false;
        match part.filter.on_error {
            OnError::FailOpen => Verdict::Continue,
            OnError::FailClosed => Verdict::Fail(format!("filter {}: {f}", part.filter.name)),
        }
    }

    /// What a callback left behind: a local reply, a close, or a pause that waits for the
    /// filter's HTTP calls to be answered.
    async fn after(part: &mut Part, paused: bool, calls: Option<&dyn HttpCalls>) -> Verdict {
        loop {
            if let Some(l) = part.http.local.take() {
                part.filter
                    .stats
                    .local_replies
                    .fetch_add(1, Ordering::Relaxed);
                part.http.calls.clear();
                return Verdict::Local(l);
            }
            if part.http.closed {
                return Verdict::Fail(format!("filter {} closed the stream", part.filter.name));
            }
            if !paused || part.http.resumed {
                part.http.resumed = false;
                // Calls made by a filter that did not wait for them are still made: their
                // answers reach the filter before the stream's next phase.
                if part.http.calls.is_empty() {
                    return Verdict::Continue;
                }
            }
            let Some(call) = (!part.http.calls.is_empty()).then(|| part.http.calls.remove(0))
            else {
                // Paused with nothing to wait for: the stream would hang for ever.
                let f = Failure::Trap("paused with no HTTP call pending".into());
                return Self::failed(part, f);
            };
            part.filter.stats.http_calls.fetch_add(1, Ordering::Relaxed);
            let token = call.token;
            let timeout = call.timeout;
            let answer = match calls {
                Some(c) => tokio::time::timeout(timeout, c.call(call))
                    .await
                    .ok()
                    .flatten(),
                None => None,
            };
            let answer = answer.unwrap_or_default();
            part.http.call_headers = answer.headers;
            part.http.call_body = answer.body;
            let r = part
                .vm
                .lock()
                .http_call_response(part.ctx, token, &mut part.http);
            part.http.call_headers.clear();
            part.http.call_body.clear();
            if let Err(f) = part.filter.settle(part.slot, &part.vm, r, true) {
                return Self::failed(part, f);
            }
        }
    }

    /// The largest request body the live filters of this stream read (the smallest of their
    /// `max_request_body`); `None` when none reads request bodies.
    pub fn request_body_limit(&self) -> Option<usize> {
        self.parts
            .iter()
            .filter(|p| p.live && p.filter.interest.request_body)
            .map(|p| p.filter.max_request_body)
            .min()
    }

    /// Runs `proxy_on_request_body` of every filter over `chunk` in order, waiting out the HTTP
    /// calls a filter pauses for (a body scanner asking a service before the request goes on);
    /// what the last one lets through is left in `chunk`. A filter may answer the request
    /// itself (`Verdict::Local`).
    pub async fn request_body(&mut self, chunk: &mut Vec<u8>, end_of_stream: bool) -> Verdict {
        for i in 0..self.parts.len() {
            let part = &mut self.parts[i];
            if !part.live || !part.filter.interest.request_body {
                continue;
            }
            let paused = match Self::body_call(part, Phase::RequestBody, chunk, end_of_stream) {
                Err(f) => {
                    let v = Self::failed(part, f);
                    if v != Verdict::Continue {
                        return v;
                    }
                    *chunk = std::mem::take(&mut part.http.body);
                    continue;
                }
                Ok(a) => a == action::PAUSE,
            };
            let waits = !part.http.calls.is_empty() || part.http.local.is_some();
            if paused && !waits && !end_of_stream {
                // The filter holds the body back until it has seen more of it.
                if let Err(v) = Self::held(part) {
                    return v;
                }
                return Verdict::Continue;
            }
            // Paused at the end with nothing to wait for: the body goes on (nothing would
            // resume it).
            let v = Self::after(part, paused && waits, self.chain.calls.as_deref()).await;
            if v != Verdict::Continue {
                return v;
            }
            *chunk = std::mem::take(&mut part.http.body);
        }
        Verdict::Continue
    }

    /// Whether any live filter of this stream reads the response body.
    pub fn wants_response_body(&self) -> bool {
        self.parts
            .iter()
            .any(|p| p.live && p.filter.interest.response_body)
    }

    /// Runs `proxy_on_response_body` of every filter over `chunk` in order; what the last one
    /// lets through is left in `chunk` (empty while a filter holds the body back). `Err` when a
    /// filter failed closed: the response must be cut.
    pub fn response_body(
        &mut self,
        chunk: &mut Vec<u8>,
        end_of_stream: bool,
    ) -> Result<(), String> {
        for part in &mut self.parts {
            if !part.live || !part.filter.interest.response_body {
                continue;
            }
            match Self::body_call(part, Phase::ResponseBody, chunk, end_of_stream) {
                Ok(a) if a == action::PAUSE && !end_of_stream => {
                    if let Err(v) = Self::held(part) {
                        if let Verdict::Fail(why) = v {
                            return Err(why);
                        }
                        *chunk = std::mem::take(&mut part.http.body);
                        continue;
                    }
                    return Ok(());
                }
                Ok(_) => *chunk = std::mem::take(&mut part.http.body),
                Err(f) => {
                    if let Verdict::Fail(why) = Self::failed(part, f) {
                        return Err(why);
                    }
                    *chunk = std::mem::take(&mut part.http.body);
                }
            }
        }
        Ok(())
    }

    /// Whether the response must go through the filters' body transform: a live filter reads
    /// its body or its trailers.
    pub fn wants_response_transform(&self) -> bool {
        self.wants_response_body() || self.wants_response_trailers()
    }

    /// Whether any live filter of this stream reads response trailers.
    pub fn wants_response_trailers(&self) -> bool {
        self.parts
            .iter()
            .any(|p| p.live && p.filter.interest.response_trailers)
    }

    /// Runs `proxy_on_response_trailers` of every filter in order over `trailers`. `Err` when a
    /// filter failed closed: the response must be cut. (A pause cannot hold trailers back:
    /// they end the stream, so it goes on.)
    pub fn response_trailers(&mut self, trailers: &mut Vec<Pair>) -> Result<(), String> {
        for part in &mut self.parts {
            if !part.live || !part.filter.interest.response_trailers {
                continue;
            }
            part.http.response_trailers = std::mem::take(trailers);
            let r = part.vm.lock().response_trailers(part.ctx, &mut part.http);
            let r = part.filter.settle(part.slot, &part.vm, r, true);
            *trailers = std::mem::take(&mut part.http.response_trailers);
            if let Err(f) = r {
                if let Verdict::Fail(why) = Self::failed(part, f) {
                    return Err(why);
                }
            }
        }
        Ok(())
    }

    /// Adds `chunk` to what the filter holds of the body and makes the body callback over all
    /// of it (a filter that paused sees the bytes it held back again, as Envoy buffers them).
    fn body_call(
        part: &mut Part,
        phase: Phase,
        chunk: &mut Vec<u8>,
        end_of_stream: bool,
    ) -> Result<u32, Failure> {
        if part.http.body.is_empty() {
            part.http.body = std::mem::take(chunk);
        } else {
            part.http.body.append(chunk);
        }
        let size = part.http.body.len();
        let r = part
            .vm
            .lock()
            .phase(part.ctx, phase, &mut part.http, size, end_of_stream);
        part.filter.settle(part.slot, &part.vm, r, true)
    }

    /// A filter paused on a body callback: fine while what it holds stays under
    /// `MAX_HELD_BODY`; past it the filter fails (`Err` with what the stream does then, the
    /// filter's body left in place for a fail-open filter).
    fn held(part: &mut Part) -> Result<(), Verdict> {
        if part.http.body.len() <= MAX_HELD_BODY {
            return Ok(());
        }
        let f = Failure::Trap(format!("held back more than {MAX_HELD_BODY} bytes of body"));
        Err(Self::failed(part, f))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        for part in &mut self.parts {
            let r = part.vm.lock().close(part.ctx, &mut part.http);
            if part.live {
                let _ = part.filter.settle(part.slot, &part.vm, r, false);
            }
        }
    }
}

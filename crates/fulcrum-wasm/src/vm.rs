//! One instance of a filter module (a "VM" in proxy-wasm's words): its store, its memory cap
//! and time budget, the host calls it may make, and the callbacks the host makes into it.
//!
//! Between calls the stream's data lives with the stream; for the length of one call it is
//! moved into the store (`HostState::http`), so host calls reach it without sharing or locking
//! anything else.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{
    Caller, Instance, InstancePre, Store, StoreLimits, StoreLimitsBuilder, Trap, TypedFunc,
};

use crate::abi::{self, status, Pair};
use crate::engine;
use crate::head::HeadPairs;
use crate::plugin::{LocalReply, OutgoingCall, Plugin};

/// What one stream (an HTTP request and its response) shows a filter, moved into the store for
/// each call.
#[derive(Default)]
pub struct HttpState {
    /// The heads of the header phases, lent by the proxy (`head`).
    pub request_headers: HeadPairs,
    pub response_headers: HeadPairs,
    pub request_trailers: Vec<Pair>,
    pub response_trailers: Vec<Pair>,
    /// The body bytes of the current body callback (request or response).
    pub body: Vec<u8>,
    pub local: Option<LocalReply>,
    pub calls: Vec<OutgoingCall>,
    /// The answer to a `proxy_http_call`, while `proxy_on_http_call_response` runs.
    pub call_headers: Vec<Pair>,
    pub call_body: Vec<u8>,
    /// The filter asked the paused stream to go on (`proxy_continue_stream`).
    pub resumed: bool,
    /// The filter asked to end the stream (`proxy_close_stream`).
    pub closed: bool,
    /// The filter changed the request or response head.
    pub headers_changed: bool,
    pub props: Arc<crate::Props>,
    /// The request's pseudo-fields after its header phase, for later phases' properties.
    pub request_line: Option<Arc<crate::head::RequestLine>>,
    /// The pool and member the request went to, for the response phase's properties.
    pub pool: Option<Arc<str>>,
    pub member: Option<std::net::SocketAddr>,
    /// Properties the filter set (`proxy_set_property`), readable by later filters' calls on
    /// the same stream through the same VM.
    pub custom: Vec<(Vec<u8>, Vec<u8>)>,
}

impl HttpState {
    /// A property the filter set, by its dotted name (the filter's path separates with NUL or
    /// dots); the last one set wins.
    pub fn custom_property(&self, name: &str) -> Option<&[u8]> {
        self.custom
            .iter()
            .rev()
            .find(|(k, _)| {
                k.len() == name.len()
                    && k.iter()
                        .zip(name.bytes())
                        .all(|(a, b)| *a == b || (*a == 0 && b == b'.'))
            })
            .map(|(_, v)| v.as_slice())
    }

    /// The member a filter chose (`fulcrum.member` set to `"ip:port"`), Fulcrum's member-choice
    /// hook.
    pub fn chosen_member(&self) -> Option<std::net::SocketAddr> {
        let v = self.custom_property("fulcrum.member")?;
        std::str::from_utf8(v).ok()?.trim().parse().ok()
    }
}

pub(crate) struct HostState {
    limits: StoreLimits,
    pub plugin: Arc<Plugin>,
    pub http: HttpState,
    /// The tick period the root context asked for (0: none).
    pub tick_ms: u32,
    /// The shared queues this instance registered (`proxy_on_queue_ready` is for them).
    pub queues: Vec<u32>,
    next_call_token: u32,
    /// The instance's memory and allocator, found once: a lookup by name per host call costs
    /// more than most host calls.
    memory: Option<wasmtime::Memory>,
    alloc: Option<TypedFunc<i32, i32>>,
}

/// Why a call into a filter failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The call ran past its time budget.
    Budget,
    /// The instance tried to grow its memory past the cap.
    Memory,
    /// Any other trap (unreachable, out-of-bounds access, stack overflow, a host call misused).
    Trap(String),
}

impl Failure {
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Budget => "budget",
            Failure::Memory => "memory",
            Failure::Trap(_) => "trap",
        }
    }

    fn of(e: wasmtime::Error) -> Failure {
        if let Some(Trap::Interrupt) = e.downcast_ref::<Trap>() {
            return Failure::Budget;
        }
        let text = format!("{e:#}");
        if text.contains("forcing trap when growing memory") {
            return Failure::Memory;
        }
        Failure::Trap(text.lines().next().unwrap_or("trap").to_string())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Budget => f.write_str("the call ran past its time budget"),
            Failure::Memory => f.write_str("the filter's memory would pass its cap"),
            Failure::Trap(t) => write!(f, "trap: {t}"),
        }
    }
}

type Cb1 = TypedFunc<i32, ()>;
type Cb1R = TypedFunc<i32, i32>;
type Cb2 = TypedFunc<(i32, i32), ()>;
type Cb2R = TypedFunc<(i32, i32), i32>;
type Cb3R = TypedFunc<(i32, i32, i32), i32>;
type Cb5 = TypedFunc<(i32, i32, i32, i32, i32), ()>;

/// The callbacks a module exports, looked up once per instance.
struct Callbacks {
    context_create: Cb2,
    vm_start: Option<Cb2R>,
    configure: Option<Cb2R>,
    tick: Option<Cb1>,
    request_headers: Option<Cb3R>,
    request_body: Option<Cb3R>,
    response_headers: Option<Cb3R>,
    response_body: Option<Cb3R>,
    response_trailers: Option<Cb2R>,
    http_call_response: Option<Cb5>,
    queue_ready: Option<Cb2>,
    done: Option<Cb1R>,
    log: Option<Cb1>,
    delete: Option<Cb1>,
    /// Fulcrum's message framing hook (no proxy-wasm callback does this).
    message_frame: Option<TypedFunc<(i32, i32), i64>>,
}

impl Callbacks {
    fn find(instance: &Instance, store: &mut Store<HostState>) -> Result<Callbacks, String> {
        let mut get = |name: &str| instance.get_func(&mut *store, name);
        let funcs: Vec<Option<wasmtime::Func>> = [
            "proxy_on_context_create",
            "proxy_on_vm_start",
            "proxy_on_configure",
            "proxy_on_tick",
            "proxy_on_request_headers",
            "proxy_on_request_body",
            "proxy_on_response_headers",
            "proxy_on_response_body",
            "proxy_on_http_call_response",
            "proxy_on_queue_ready",
            "proxy_on_done",
            "proxy_on_log",
            "proxy_on_delete",
            "fulcrum_on_message_frame",
            "proxy_on_response_trailers",
        ]
        .iter()
        .map(|n| get(n))
        .collect();
        macro_rules! cb {
            ($i:expr, $name:expr) => {
                match &funcs[$i] {
                    None => None,
                    Some(f) => Some(
                        f.typed(&*store)
                            .map_err(|e| format!("{} has the wrong signature: {e}", $name))?,
                    ),
                }
            };
        }
        let context_create = cb!(0, "proxy_on_context_create")
            .ok_or_else(|| "the module exports no proxy_on_context_create".to_string())?;
        Ok(Callbacks {
            context_create,
            vm_start: cb!(1, "proxy_on_vm_start"),
            configure: cb!(2, "proxy_on_configure"),
            tick: cb!(3, "proxy_on_tick"),
            request_headers: cb!(4, "proxy_on_request_headers"),
            request_body: cb!(5, "proxy_on_request_body"),
            response_headers: cb!(6, "proxy_on_response_headers"),
            response_body: cb!(7, "proxy_on_response_body"),
            http_call_response: cb!(8, "proxy_on_http_call_response"),
            queue_ready: cb!(9, "proxy_on_queue_ready"),
            done: cb!(10, "proxy_on_done"),
            log: cb!(11, "proxy_on_log"),
            delete: cb!(12, "proxy_on_delete"),
            message_frame: cb!(13, "fulcrum_on_message_frame"),
            response_trailers: cb!(14, "proxy_on_response_trailers"),
        })
    }
}

/// Which stream callback to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    RequestHeaders,
    RequestBody,
    ResponseHeaders,
    ResponseBody,
}

/// What an instance's module exports of the stream callbacks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Interest {
    pub request_headers: bool,
    pub request_body: bool,
    pub response_headers: bool,
    pub response_body: bool,
    /// `fulcrum_on_message_frame`: the module frames messages.
    pub message_frame: bool,
    pub queue_ready: bool,
    pub response_trailers: bool,
    /// The module imports `proxy_get_property`: it can read properties (set by the filter, not
    /// the instance: an import, not a callback).
    pub properties: bool,
}

/// The root context's id in every instance.
pub const ROOT: i32 = 1;

pub struct Vm {
    store: Store<HostState>,
    cb: Callbacks,
    next_ctx: i32,
    budget_ticks: u64,
}

impl Vm {
    /// A new instance of `module`, started (`_initialize`, `proxy_on_vm_start`) and configured
    /// (`proxy_on_configure` with the plugin's configuration).
    pub fn start(pre: &InstancePre<HostState>, plugin: Arc<Plugin>) -> Result<Vm, String> {
        let engine = engine::engine();
        let limits = StoreLimitsBuilder::new()
            .memory_size(plugin.limits.memory)
            .memories(1)
            .instances(1)
            .trap_on_grow_failure(true)
            .build();
        let budget_ticks = ticks(plugin.limits.budget);
        let mut store = Store::new(
            engine,
            HostState {
                limits,
                plugin,
                http: HttpState::default(),
                tick_ms: 0,
                queues: Vec::new(),
                next_call_token: 1,
                memory: None,
                alloc: None,
            },
        );
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(budget_ticks);
        let instance = pre
            .instantiate(&mut store)
            .map_err(|e| format!("instantiating: {}", Failure::of(e)))?;
        let cb = Callbacks::find(&instance, &mut store)?;
        let memory = instance.get_memory(&mut store, "memory");
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "proxy_on_memory_allocate")
            .or_else(|_| instance.get_typed_func::<i32, i32>(&mut store, "malloc"))
            .ok();
        store.data_mut().memory = memory;
        store.data_mut().alloc = alloc;
        for init in ["_initialize", "_start"] {
            if let Ok(f) = instance.get_typed_func::<(), ()>(&mut store, init) {
                store.set_epoch_deadline(budget_ticks);
                f.call(&mut store, ())
                    .map_err(|e| format!("{init}: {}", Failure::of(e)))?;
                break;
            }
        }
        let mut vm = Vm {
            store,
            cb,
            next_ctx: ROOT + 1,
            budget_ticks,
        };
        vm.arm();
        vm.cb
            .context_create
            .call(&mut vm.store, (ROOT, 0))
            .map_err(|e| format!("proxy_on_context_create: {}", Failure::of(e)))?;
        if let Some(f) = vm.cb.vm_start.clone() {
            vm.arm();
            let ok = f
                .call(&mut vm.store, (ROOT, 0))
                .map_err(|e| format!("proxy_on_vm_start: {}", Failure::of(e)))?;
            if ok == 0 {
                return Err("proxy_on_vm_start refused to start".into());
            }
        }
        if let Some(f) = vm.cb.configure.clone() {
            vm.arm();
            let size = vm.store.data().plugin.config.len() as i32;
            let ok = f
                .call(&mut vm.store, (ROOT, size))
                .map_err(|e| format!("proxy_on_configure: {}", Failure::of(e)))?;
            if ok == 0 {
                return Err("proxy_on_configure refused the configuration".into());
            }
        }
        Ok(vm)
    }

    /// Starts the time budget of the next call.
    fn arm(&mut self) {
        self.store.set_epoch_deadline(self.budget_ticks);
    }

    pub fn interest(&self) -> Interest {
        Interest {
            request_headers: self.cb.request_headers.is_some(),
            request_body: self.cb.request_body.is_some(),
            response_headers: self.cb.response_headers.is_some(),
            response_body: self.cb.response_body.is_some(),
            message_frame: self.cb.message_frame.is_some(),
            queue_ready: self.cb.queue_ready.is_some(),
            response_trailers: self.cb.response_trailers.is_some(),
            properties: false,
        }
    }

    pub fn tick_ms(&self) -> u32 {
        self.store.data().tick_ms
    }

    /// Opens a stream context under the root context.
    pub fn open(&mut self) -> Result<i32, Failure> {
        let id = self.next_ctx;
        // Ids are never reused while the instance lives; wrapping after 2^31 streams skips the
        // root's id.
        self.next_ctx = self.next_ctx.checked_add(1).unwrap_or(ROOT + 1);
        self.arm();
        self.cb
            .context_create
            .call(&mut self.store, (id, ROOT))
            .map_err(Failure::of)?;
        Ok(id)
    }

    /// Runs one stream callback with `http` moved in for its length; returns the action.
    pub fn phase(
        &mut self,
        ctx: i32,
        phase: Phase,
        http: &mut HttpState,
        size: usize,
        end_of_stream: bool,
    ) -> Result<u32, Failure> {
        let f = match phase {
            Phase::RequestHeaders => self.cb.request_headers.clone(),
            Phase::RequestBody => self.cb.request_body.clone(),
            Phase::ResponseHeaders => self.cb.response_headers.clone(),
            Phase::ResponseBody => self.cb.response_body.clone(),
        };
        let Some(f) = f else {
            return Ok(abi::action::CONTINUE);
        };
        let args = (ctx, size as i32, end_of_stream as i32);
        self.with(http, |vm| f.call(&mut vm.store, args))
            .map(|a| a as u32)
    }

    /// `proxy_on_response_trailers` over `http.response_trailers`; returns the action.
    pub fn response_trailers(&mut self, ctx: i32, http: &mut HttpState) -> Result<u32, Failure> {
        let Some(f) = self.cb.response_trailers.clone() else {
            return Ok(abi::action::CONTINUE);
        };
        let args = (ctx, http.response_trailers.len() as i32);
        self.with(http, |vm| f.call(&mut vm.store, args))
            .map(|a| a as u32)
    }

    /// Hands a filter the answer to its `proxy_http_call`.
    pub fn http_call_response(
        &mut self,
        ctx: i32,
        token: u32,
        http: &mut HttpState,
    ) -> Result<(), Failure> {
        let Some(f) = self.cb.http_call_response.clone() else {
            return Ok(());
        };
        let args = (
            ctx,
            token as i32,
            http.call_headers.len() as i32,
            http.call_body.len() as i32,
            0,
        );
        self.with(http, |vm| f.call(&mut vm.store, args))
    }

    /// `proxy_on_done`, `proxy_on_log` and `proxy_on_delete`: the stream is over.
    pub fn close(&mut self, ctx: i32, http: &mut HttpState) -> Result<(), Failure> {
        let (done, log, delete) = (
            self.cb.done.clone(),
            self.cb.log.clone(),
            self.cb.delete.clone(),
        );
        // Moving the stream's state into the store and back is most of a close's cost.
        if done.is_none() && log.is_none() && delete.is_none() {
            return Ok(());
        }
        self.with(http, |vm| {
            if let Some(f) = done {
                f.call(&mut vm.store, ctx)?;
            }
            if let Some(f) = log {
                vm.arm();
                f.call(&mut vm.store, ctx)?;
            }
            if let Some(f) = delete {
                vm.arm();
                f.call(&mut vm.store, ctx)?;
            }
            Ok(())
        })
    }

    /// `fulcrum_on_message_frame(root, size)` with the buffered bytes in `http.body` (the
    /// filter reads them as `DOWNSTREAM_DATA`): what it answers about the next message.
    pub fn message_frame(&mut self, http: &mut HttpState) -> Result<i64, Failure> {
        let Some(f) = self.cb.message_frame.clone() else {
            return Ok(-1);
        };
        let size = http.body.len() as i32;
        self.with(http, |vm| f.call(&mut vm.store, (ROOT, size)))
    }

    pub fn tick(&mut self) -> Result<(), Failure> {
        let Some(f) = self.cb.tick.clone() else {
            return Ok(());
        };
        self.arm();
        f.call(&mut self.store, ROOT).map_err(Failure::of)
    }

    /// `proxy_on_queue_ready` on the root context, for a queue this instance registered.
    pub fn queue_ready(&mut self, queue: u32) -> Result<(), Failure> {
        let Some(f) = self.cb.queue_ready.clone() else {
            return Ok(());
        };
        if !self.store.data().queues.contains(&queue) {
            return Ok(());
        }
        self.arm();
        f.call(&mut self.store, (ROOT, queue as i32))
            .map_err(Failure::of)
    }

    fn with<R>(
        &mut self,
        http: &mut HttpState,
        call: impl FnOnce(&mut Vm) -> wasmtime::Result<R>,
    ) -> Result<R, Failure> {
        std::mem::swap(&mut self.store.data_mut().http, http);
        self.arm();
        let r = call(self);
        std::mem::swap(&mut self.store.data_mut().http, http);
        r.map_err(Failure::of)
    }

    pub(crate) fn next_token(state: &mut HostState) -> u32 {
        let t = state.next_call_token;
        state.next_call_token = t.wrapping_add(1).max(1);
        t
    }
}

/// Epoch ticks for a budget: rounded up, plus one because the current tick may be about to end.
fn ticks(budget: Duration) -> u64 {
    let tick = engine::TICK.as_micros().max(1);
    (budget.as_micros().div_ceil(tick) as u64).max(1) + 1
}

/// The instance's memory, as the calling filter exported it.
pub(crate) fn memory(caller: &mut Caller<'_, HostState>) -> Option<wasmtime::Memory> {
    caller.data().memory
}

/// Copies `len` bytes at `ptr` out of the filter's memory.
pub(crate) fn read(caller: &mut Caller<'_, HostState>, ptr: i32, len: i32) -> Result<Vec<u8>, u32> {
    let mem = memory(caller).ok_or(status::INTERNAL_FAILURE)?;
    let (p, l) = (ptr as u32 as usize, len as u32 as usize);
    let end = p.checked_add(l).ok_or(status::INVALID_MEMORY_ACCESS)?;
    mem.data(&*caller)
        .get(p..end)
        .map(|s| s.to_vec())
        .ok_or(status::INVALID_MEMORY_ACCESS)
}

/// Writes `bytes` at `at` in the filter's memory.
pub(crate) fn write(caller: &mut Caller<'_, HostState>, at: i32, bytes: &[u8]) -> Result<(), u32> {
    let mem = memory(caller).ok_or(status::INTERNAL_FAILURE)?;
    let p = at as u32 as usize;
    let end = p
        .checked_add(bytes.len())
        .ok_or(status::INVALID_MEMORY_ACCESS)?;
    mem.data_mut(&mut *caller)
        .get_mut(p..end)
        .ok_or(status::INVALID_MEMORY_ACCESS)?
        .copy_from_slice(bytes);
    Ok(())
}

/// Hands `bytes` to the filter: memory from its own allocator, filled, and its address and
/// length written where the filter asked. An allocator that traps makes the host call trap.
pub(crate) fn give(
    caller: &mut Caller<'_, HostState>,
    bytes: &[u8],
    ret_ptr: i32,
    ret_len: i32,
) -> wasmtime::Result<u32> {
    let Some(alloc) = caller.data().alloc.clone() else {
        return Ok(status::INTERNAL_FAILURE);
    };
    // Never a null pointer for an empty value: SDKs read null as "absent".
    let p = alloc.call(&mut *caller, bytes.len().max(1) as i32)?;
    if p == 0 {
        return Ok(status::INTERNAL_FAILURE);
    }
    let r = write(caller, p, bytes)
        .and_then(|_| write(caller, ret_ptr, &(p as u32).to_le_bytes()))
        .and_then(|_| write(caller, ret_len, &(bytes.len() as u32).to_le_bytes()));
    Ok(match r {
        Ok(()) => status::OK,
        Err(s) => s,
    })
}

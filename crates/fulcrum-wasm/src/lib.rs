//! The proxy-wasm host: WebAssembly filters (ABI 0.2.1, the version the public SDKs target) run
//! around a virtual service's rules, sandboxed by wasmtime with a memory cap and a time budget
//! per call.
//!
//! ```text
//!   engine   one wasmtime engine, modules compiled once by digest, the epoch clock
//!   vm       one instance: its store, limits, the callbacks it exports
//!   hostcalls  what a filter may ask of the host (headers, bodies, properties, shared data,
//!            queues, metrics, HTTP calls, local replies, logging)
//!   filter   a configured filter (instances, counters, failure policy), a chain, and the
//!            per-stream driver the HTTP plane calls
//!   head     the proxy's head lent to a header phase, made into pairs only when a filter looks
//! ```
//!
//! Why a host of our own rather than a crate: no maintained Rust crate implements the host side
//! of proxy-wasm on wasmtime (the reference host is C++, in Envoy); the ABI is a few dozen calls
//! over linear memory, written here against its specification.

pub mod abi;
mod engine;
mod filter;
mod head;
mod hostcalls;
mod plugin;
mod vm;

pub use abi::Pair;
pub use engine::{load, ModuleInfo};
pub use filter::{
    CallResponse, Chain, Filter, FilterStats, HttpCalls, MessageFrame, OnError, Spec, Stream,
    Verdict, FRAME_PEEK,
};
pub use head::{Head, HeadPairs, RequestLine};
pub use plugin::{metrics, FilterMetric, Limits, LocalReply, OutgoingCall, Props};
pub use vm::{Failure, Interest};

/// Checks a module as `fulcrum check` does: it compiles, carries an ABI marker, a memory and an
/// allocator, links against the host calls, and starts with `config` under `root_id`.
pub fn check(bytes: &[u8], root_id: &str, config: &[u8]) -> Result<ModuleInfo, String> {
    let f = Filter::new(Spec {
        root_id: root_id.into(),
        config: config.to_vec(),
        ..Spec::of("check", bytes.to_vec())
    })?;
    Ok(f.info.clone())
}

#[cfg(test)]
mod tests;

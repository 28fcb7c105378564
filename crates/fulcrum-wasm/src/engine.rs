//! One wasmtime engine for the process: modules compiled once (by digest, so a reload that
//! names an unchanged module reuses its code), and the clock that bounds every call into a
//! filter.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, Module};

use crate::abi;

/// How often the engine's epoch advances: the resolution of a call's time budget. Epoch
/// interruption costs a load and a compare at loop heads and calls; fuel would cost a counter
/// update per basic block, measurably more on the per-request path.
/// Compiled modules kept for reuse across reloads.
const MODULES_KEPT: usize = 64;

pub const TICK: Duration = Duration::from_millis(2);

pub(crate) struct Shared {
    pub engine: Engine,
    modules: Mutex<HashMap<[u8; 32], Module>>,
}

/// The process's engine, started on first use with its epoch clock.
pub(crate) fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let mut config = Config::new();
        config.epoch_interruption(true);
        // Filters run on the proxy's own threads: a deep recursion must trap, not take the
        // thread's stack with it.
        config.max_wasm_stack(512 * 1024);
        let engine = match Engine::new(&config) {
            Ok(e) => e,
            // The configuration is fixed above; an engine that cannot be built with it is a
            // build of wasmtime without cranelift, which Cargo.toml rules out.
            Err(e) => panic!("wasmtime engine: {e}"),
        };
        let clock = engine.clone();
        let _ = std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || loop {
                std::thread::sleep(TICK);
                clock.increment_epoch();
            });
        Shared {
            engine,
            modules: Mutex::new(HashMap::new()),
        }
    })
}

/// What `fulcrum check` and a load learn about a module.
#[derive(Debug, Clone)]
pub struct ModuleInfo {
    /// The ABI marker export the module carries.
    pub abi: &'static str,
    /// The proxy-wasm callbacks it exports (the host calls only those).
    pub callbacks: Vec<String>,
    pub compile_time: Duration,
    /// Whether this load compiled it (false: the process had it already).
    pub compiled: bool,
    /// SHA-256 of the module's bytes: two loads of the same module have the same digest.
    pub digest: [u8; 32],
}

/// Compiles `bytes` (binary or text format), or returns the module compiled before from the
/// same bytes; checks that it is a proxy-wasm filter: an ABI marker, a memory, an allocator.
pub fn load(bytes: &[u8]) -> Result<(Module, ModuleInfo), String> {
    let s = shared();
    let digest: [u8; 32] = Sha256::digest(bytes).into();
    let started = std::time::Instant::now();
    let cached = s.modules.lock().get(&digest).cloned();
    let (module, compiled) = match cached {
        Some(m) => (m, false),
        None => {
            let m = Module::new(&s.engine, bytes).map_err(|e| format!("{e:#}"))?;
            let mut cache = s.modules.lock();
            // Reloads that change a module add one entry each; a long-lived process must not
            // keep every version it ever ran.
            if cache.len() >= MODULES_KEPT {
                cache.clear();
            }
            cache.insert(digest, m.clone());
            (m, true)
        }
    };
    let info = inspect(&module)?;
    Ok((
        module,
        ModuleInfo {
            compile_time: started.elapsed(),
            compiled,
            digest,
            ..info
        },
    ))
}

fn inspect(module: &Module) -> Result<ModuleInfo, String> {
    let exports: Vec<&str> = module.exports().map(|e| e.name()).collect();
    let abi = abi::ABI_MARKERS
        .iter()
        .find(|m| exports.contains(m))
        .copied()
        .ok_or_else(|| {
            format!(
                "not a proxy-wasm filter of ABI 0.2.1: it exports none of {:?}",
                abi::ABI_MARKERS
            )
        })?;
    if !exports.contains(&"memory") {
        return Err("the module exports no memory".into());
    }
    if !exports.contains(&"proxy_on_memory_allocate") && !exports.contains(&"malloc") {
        return Err(
            "the module exports no allocator (proxy_on_memory_allocate or malloc): \
             the host could not hand it header values"
                .into(),
        );
    }
    if !exports.contains(&"proxy_on_context_create") {
        return Err("the module exports no proxy_on_context_create".into());
    }
    let callbacks = exports
        .iter()
        .filter(|e| e.starts_with("proxy_on_") || e.starts_with("fulcrum_on_"))
        .map(|e| e.to_string())
        .collect();
    Ok(ModuleInfo {
        abi,
        callbacks,
        compile_time: Duration::ZERO,
        compiled: false,
        digest: [0; 32],
    })
}

pub(crate) fn engine() -> &'static Engine {
    &shared().engine
}

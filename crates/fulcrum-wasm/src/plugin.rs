//! What every instance of one filter shares: its configuration and limits, the shared data and
//! queues of its VM id, and the metrics it defines.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::abi::Pair;

/// A filter's sandbox limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most linear memory one instance may grow to, bytes.
    pub memory: usize,
    /// The longest one call into the filter may run.
    pub budget: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: 32 << 20,
            budget: Duration::from_millis(20),
        }
    }
}

pub struct Plugin {
    /// The module's path as configured: names the filter in logs, metrics and the API, and is
    /// its VM id (filters of one module share data and queues).
    pub name: Arc<str>,
    /// The root context the filter registers under (Envoy's `root_id`): SDKs look their root
    /// context up by it.
    pub root_id: String,
    pub config: Vec<u8>,
    pub limits: Limits,
    pub shared: Arc<SharedStore>,
    /// The queues this filter's instances registered that have had items added since they
    /// were last told (`proxy_on_queue_ready`).
    pub queues_ready: Arc<QueueWake>,
}

/// Queue ids with new items for one filter, and the wake-up of the task that tells its
/// instances. Enqueueing never calls into another instance itself: that instance may be the
/// one enqueueing, or waiting on the caller's.
#[derive(Default)]
pub struct QueueWake {
    pending: Mutex<Vec<u32>>,
    notify: tokio::sync::Notify,
}

impl QueueWake {
    fn wake(&self, id: u32) {
        let mut p = self.pending.lock();
        if !p.contains(&id) {
            p.push(id);
        }
        drop(p);
        self.notify.notify_one();
    }

    /// The queues with new items, once there are some.
    pub async fn ready(&self) -> Vec<u32> {
        loop {
            let ids = std::mem::take(&mut *self.pending.lock());
            if !ids.is_empty() {
                return ids;
            }
            self.notify.notified().await;
        }
    }
}

/// An answer the filter makes itself (`proxy_send_local_response`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u16,
    pub details: String,
    pub body: Vec<u8>,
    pub headers: Vec<Pair>,
}

/// A `proxy_http_call` the host is to make once the callback returns.
#[derive(Debug, Clone)]
pub struct OutgoingCall {
    pub token: u32,
    /// The pool to send it to (`upstream` in the call).
    pub upstream: String,
    pub headers: Vec<Pair>,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

/// What a filter can read of its stream with `proxy_get_property`.
#[derive(Debug, Clone, Default)]
pub struct Props {
    pub source: Option<SocketAddr>,
    pub destination: Option<SocketAddr>,
    pub virtual_service: Arc<str>,
    pub sni: Option<String>,
    pub protocol: &'static str,
}

/// Shared key-value data and queues of one VM id (`proxy_get_shared_data`, queues), kept for
/// the process's life so a reload does not lose them.
#[derive(Default)]
pub struct SharedStore {
    data: Mutex<SharedData>,
    queues: Mutex<Queues>,
}

/// The values by key with their versions, and the bytes they hold in all.
#[derive(Default)]
struct SharedData {
    values: HashMap<Vec<u8>, (Vec<u8>, u32)>,
    bytes: usize,
}

#[derive(Default)]
struct Queues {
    by_name: HashMap<Vec<u8>, u32>,
    items: HashMap<u32, std::collections::VecDeque<Vec<u8>>>,
    /// The filters whose instances registered each queue (told when items arrive).
    watchers: HashMap<u32, Vec<Weak<QueueWake>>>,
}

/// The most items a shared queue holds; an enqueue beyond it is refused.
const QUEUE_DEPTH: usize = 10_000;
/// The most bytes of shared data one VM id holds.
const SHARED_BYTES: usize = 64 << 20;

impl SharedStore {
    /// The store of a VM id, the same object for every filter of that id.
    pub fn of(vm_id: &str) -> Arc<SharedStore> {
        static STORES: OnceLock<Mutex<HashMap<String, Arc<SharedStore>>>> = OnceLock::new();
        STORES
            .get_or_init(Default::default)
            .lock()
            .entry(vm_id.to_string())
            .or_default()
            .clone()
    }

    pub fn get(&self, key: &[u8]) -> Option<(Vec<u8>, u32)> {
        self.data.lock().values.get(key).cloned()
    }

    /// Sets `key`; with a non-zero `cas` only if the value is still the one read with it.
    pub fn set(&self, key: &[u8], value: Vec<u8>, cas: u32) -> Result<(), u32> {
        let mut d = self.data.lock();
        let SharedData { values, bytes } = &mut *d;
        let replaced = values.get(key).map_or(0, |(v, _)| key.len() + v.len());
        if *bytes - replaced + key.len() + value.len() > SHARED_BYTES {
            return Err(crate::abi::status::INTERNAL_FAILURE);
        }
        let added = key.len() + value.len();
        match values.get_mut(key) {
            Some((v, c)) => {
                if cas != 0 && cas != *c {
                    return Err(crate::abi::status::CAS_MISMATCH);
                }
                *v = value;
                *c = c.wrapping_add(1).max(1);
            }
            None => {
                values.insert(key.to_vec(), (value, 1));
            }
        }
        *bytes = *bytes - replaced + added;
        Ok(())
    }

    /// Registers (or finds) the queue `name`; `watcher` is told when items are added to it.
    pub fn register_queue(&self, name: &[u8], watcher: &Arc<QueueWake>) -> u32 {
        let mut q = self.queues.lock();
        let id = match q.by_name.get(name) {
            Some(id) => *id,
            None => {
                let id = q.by_name.len() as u32 + 1;
                q.by_name.insert(name.to_vec(), id);
                q.items.insert(id, Default::default());
                id
            }
        };
        let w = q.watchers.entry(id).or_default();
        // Filters of replaced configurations are gone: their entries go with this one.
        w.retain(|x| x.strong_count() > 0);
        if !w
            .iter()
            .any(|x| std::ptr::eq(x.as_ptr(), Arc::as_ptr(watcher)))
        {
            w.push(Arc::downgrade(watcher));
        }
        id
    }

    pub fn resolve_queue(&self, name: &[u8]) -> Option<u32> {
        self.queues.lock().by_name.get(name).copied()
    }

    pub fn enqueue(&self, id: u32, item: Vec<u8>) -> Result<(), u32> {
        let mut q = self.queues.lock();
        let items = q.items.get_mut(&id).ok_or(crate::abi::status::NOT_FOUND)?;
        if items.len() >= QUEUE_DEPTH {
            return Err(crate::abi::status::INTERNAL_FAILURE);
        }
        items.push_back(item);
        let watchers: Vec<Arc<QueueWake>> = q
            .watchers
            .get(&id)
            .map(|w| w.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        drop(q);
        for w in watchers {
            w.wake(id);
        }
        Ok(())
    }

    pub fn dequeue(&self, id: u32) -> Result<Vec<u8>, u32> {
        let mut q = self.queues.lock();
        let items = q.items.get_mut(&id).ok_or(crate::abi::status::NOT_FOUND)?;
        items.pop_front().ok_or(crate::abi::status::EMPTY)
    }
}

/// A metric a filter defined (`proxy_define_metric`).
pub struct FilterMetric {
    pub name: String,
    pub kind: u32,
    /// Counter or gauge value; a histogram's sum.
    pub value: AtomicI64,
    /// A histogram's number of recordings.
    pub count: AtomicU64,
}

/// Every metric filters defined, for the process's life (ids stay valid across reloads).
pub fn metrics() -> &'static Mutex<Vec<Arc<FilterMetric>>> {
    static METRICS: OnceLock<Mutex<Vec<Arc<FilterMetric>>>> = OnceLock::new();
    METRICS.get_or_init(Default::default)
}

/// The most metrics filters may define in all: a filter defining one per request would
/// otherwise grow the registry and the scrape without bound.
const METRICS_MAX: usize = 1_000;

/// The id of the metric `name` of `kind`, defined now if new.
pub fn define_metric(kind: u32, name: &str) -> Option<u32> {
    let mut m = metrics().lock();
    if let Some(i) = m.iter().position(|x| x.name == name && x.kind == kind) {
        return Some(i as u32 + 1);
    }
    if m.len() >= METRICS_MAX {
        return None;
    }
    m.push(Arc::new(FilterMetric {
        name: name.to_string(),
        kind,
        value: AtomicI64::new(0),
        count: AtomicU64::new(0),
    }));
    Some(m.len() as u32)
}

pub fn metric(id: u32) -> Option<Arc<FilterMetric>> {
    metrics().lock().get((id as usize).checked_sub(1)?).cloned()
}

impl FilterMetric {
    pub fn increment(&self, by: i64) {
        self.value.fetch_add(by, Ordering::Relaxed);
    }

    pub fn record(&self, v: i64) {
        if self.kind == crate::abi::metric::HISTOGRAM {
            self.value.fetch_add(v, Ordering::Relaxed);
            self.count.fetch_add(1, Ordering::Relaxed);
        } else {
            self.value.store(v, Ordering::Relaxed);
        }
    }
}

//! Storage: stored responses (head + body chunks) keyed by URL, each URL holding its Vary
//! variants, in a `moka` cache bounded by bytes (its TinyLFU admission keeps one-off scans from
//! flushing the hot set), shared by every worker thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use super::policy::{self, Directives};

/// A stored response. Immutable: a 304 makes a new one beside the same body chunks.
#[derive(Debug)]
pub struct Entry {
    pub status: u16,
    /// Stored end-to-end fields (no framing, hop-by-hop or Age).
    pub headers: HeaderMap,
    /// `headers` as HTTP/1.1 field lines, made once for every hit.
    pub h1_fields: Vec<u8>,
    pub body: Vec<Bytes>,
    pub body_len: u64,
    /// The request's normalised values of the fields the response varies on.
    pub vary: Vec<(String, Option<Vec<u8>>)>,
    pub cc: Directives,
    pub lifetime: u64,
    pub initial_age: u64,
    pub response_time: i64,
    pub etag: Option<Bytes>,
    pub last_modified: Option<i64>,
    pub date: Option<i64>,
}

impl Entry {
    /// Builds an entry from stored fields and the exchange's times.
    pub fn new(
        status: u16,
        mut headers: HeaderMap,
        body: Vec<Bytes>,
        vary: Vec<(String, Option<Vec<u8>>)>,
        request_time: i64,
        response_time: i64,
        age_value: u64,
    ) -> Entry {
        let names: Vec<_> = headers
            .keys()
            .filter(|n| policy::excluded_from_storage(n.as_str()))
            .cloned()
            .collect();
        for n in names {
            headers.remove(n);
        }
        // CDN-Cache-Control, when valid, replaces Cache-Control and Expires (RFC 9213).
        let cdn = policy::targeted(
            headers
                .get_all("cdn-cache-control")
                .iter()
                .map(|v| v.as_bytes()),
        );
        let expires = if cdn.is_some() {
            None
        } else {
            headers
                .get("expires")
                .map(|v| policy::http_date(v.as_bytes()))
        };
        let cc = cdn.unwrap_or_else(|| {
            Directives::parse(
                headers
                    .get_all("cache-control")
                    .iter()
                    .map(|v| v.as_bytes()),
            )
        });
        // Fields the origin named in `no-cache="…"` or `private="…"` are not kept (§5.2.2.4,
        // §5.2.2.7): the stored response is reused without them.
        for name in cc.no_cache_fields.iter().chain(&cc.private_fields) {
            headers.remove(name.as_str());
        }
        let date = headers
            .get("date")
            .and_then(|v| policy::http_date(v.as_bytes()));
        let times = policy::Times {
            date,
            expires,
            last_modified: headers
                .get("last-modified")
                .and_then(|v| policy::http_date(v.as_bytes())),
        };
        let lifetime = policy::freshness_lifetime(status, &cc, &times, response_time);
        let initial_age = policy::corrected_initial_age(&policy::AgeInputs {
            age_value,
            date,
            request_time,
            response_time,
        });
        let mut h1_fields = Vec::with_capacity(256);
        for (n, v) in &headers {
            h1_fields.extend_from_slice(n.as_str().as_bytes());
            h1_fields.extend_from_slice(b": ");
            h1_fields.extend_from_slice(v.as_bytes());
            h1_fields.extend_from_slice(b"\r\n");
        }
        let body_len = body.iter().map(|b| b.len() as u64).sum();
        Entry {
            status,
            etag: headers
                .get("etag")
                .map(|v| Bytes::copy_from_slice(v.as_bytes())),
            last_modified: times.last_modified,
            date,
            headers,
            h1_fields,
            body,
            body_len,
            vary,
            cc,
            lifetime,
            initial_age,
            response_time,
        }
    }

    /// The entry's current age (§4.2.3).
    pub fn age(&self, now: i64) -> u64 {
        policy::current_age(self.initial_age, self.response_time, now)
    }

    /// Bytes the entry accounts for against `size`.
    pub fn weight(&self) -> u64 {
        self.body_len + 2 * self.h1_fields.len() as u64 + 256
    }

    /// Does this variant answer a request with these normalised values?
    pub fn matches(&self, request_value: &dyn Fn(&str) -> Option<Vec<u8>>) -> bool {
        self.vary
            .iter()
            .all(|(name, stored)| request_value(name) == *stored)
    }

    /// A validator exists to revalidate with.
    pub fn has_validator(&self) -> bool {
        self.etag.is_some() || self.last_modified.is_some()
    }
}

/// The variants stored for one URL.
pub type Variants = Arc<Vec<Arc<Entry>>>;

/// Counters of one cache.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub stale: AtomicU64,
    pub revalidated: AtomicU64,
    pub stored: AtomicU64,
    pub evicted: AtomicU64,
    /// Responses that started to be stored and were given up: larger than max_object, or no
    /// room left among the fills in progress (they hold at most `size` together).
    pub abandoned: AtomicU64,
}

/// The bounded store of one virtual service.
pub struct Store {
    map: moka::sync::Cache<Arc<str>, Variants>,
    pub size: u64,
}

fn weigh(key: &Arc<str>, v: &Variants) -> u32 {
    let w: u64 = v.iter().map(|e| e.weight()).sum::<u64>() + key.len() as u64;
    u32::try_from(w).unwrap_or(u32::MAX)
}

impl Store {
    pub fn new(size: u64, stats: Arc<CacheStats>) -> Store {
        let map = moka::sync::Cache::builder()
            .max_capacity(size)
            .weigher(weigh)
            .eviction_listener(move |_k, _v, cause| {
                if cause == moka::notification::RemovalCause::Size {
                    stats.evicted.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build();
        Store { map, size }
    }

    pub fn get(&self, key: &str) -> Option<Variants> {
        self.map.get(key)
    }

    /// Stores `entry` for `key`, replacing the variant it replaces (same Vary values).
    pub fn put(&self, key: &str, entry: Arc<Entry>) {
        let key: Arc<str> = Arc::from(key);
        let mut list: Vec<Arc<Entry>> = Vec::new();
        if let Some(old) = self.map.get(&key) {
            for e in old.iter() {
                if e.vary != entry.vary {
                    list.push(e.clone());
                }
            }
        }
        // Newest first: the most recent matching variant is used (§4.1).
        list.insert(0, entry);
        list.truncate(16);
        self.map.insert(key, Arc::new(list));
    }

    /// Replaces one stored variant (a 304 freshened it).
    pub fn replace(&self, key: &str, old: &Arc<Entry>, new: Arc<Entry>) {
        let Some(cur) = self.map.get(key) else {
            return;
        };
        let list: Vec<Arc<Entry>> = cur
            .iter()
            .map(|e| {
                if Arc::ptr_eq(e, old) {
                    new.clone()
                } else {
                    e.clone()
                }
            })
            .collect();
        self.map.insert(Arc::from(key), Arc::new(list));
    }

    pub fn remove(&self, key: &str) -> bool {
        self.map.remove(key).is_some()
    }

    /// Removes every key `select` accepts; returns how many.
    pub fn remove_where(&self, select: impl Fn(&str) -> bool) -> u64 {
        let keys: Vec<Arc<str>> = self
            .map
            .iter()
            .filter(|(k, _)| select(k))
            .map(|(k, _)| (*k).clone())
            .collect();
        let mut n = 0;
        for k in keys {
            if self.map.remove(&k).is_some() {
                n += 1;
            }
        }
        n
    }

    /// (URLs, variants, bytes) stored now.
    pub fn usage(&self) -> (u64, u64, u64) {
        self.map.run_pending_tasks();
        let mut variants = 0;
        for (_, v) in self.map.iter() {
            variants += v.len() as u64;
        }
        (self.map.entry_count(), variants, self.map.weighted_size())
    }

    /// Copies every entry into a store of another size (a reload changed `size`).
    pub fn resized(&self, size: u64, stats: Arc<CacheStats>) -> Store {
        let s = Store::new(size, stats);
        for (k, v) in self.map.iter() {
            s.map.insert((*k).clone(), v);
        }
        s
    }
}

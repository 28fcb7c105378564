//! Persistence tables: client key → member address, with idle expiry and a size bound.
//!
//! Entries name the member by address, not by index, so they survive reloads that reorder or
//! change a pool; an entry whose member is gone, down or disabled is ignored by `Pool::persistent`
//! and overwritten by the next choice.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use moka::sync::Cache;

/// Told of every entry this node chooses (not of entries a peer sent): `ha.sync` streams them.
pub type Feed = Box<dyn Fn(&PersistKey, SocketAddr) + Send + Sync>;

/// A persistence key: a masked client address, or bytes (a header value, a RADIUS attribute).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PersistKey {
    Ip(u128),
    Bytes(Box<[u8]>),
}

impl PersistKey {
    /// The client address with host bits beyond the prefix cleared (`source_mask`); IPv4-mapped
    /// IPv6 addresses count as IPv4.
    pub fn source(ip: IpAddr, mask_v4: u8, mask_v6: u8) -> PersistKey {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4);
                let m = if mask_v4 == 0 {
                    0
                } else {
                    u32::MAX << (32 - u32::from(mask_v4.min(32)))
                };
                // Keep v4 keys apart from v6 ones by placing them in the IPv4-mapped range.
                PersistKey::Ip(u128::from(Ipv6Addr::from(
                    u128::from(bits & m) | (0xffff << 32),
                )))
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let m = if mask_v6 == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(mask_v6.min(128)))
                };
                PersistKey::Ip(bits & m)
            }
        }
    }

    pub fn bytes(b: &[u8]) -> PersistKey {
        PersistKey::Bytes(b.into())
    }
}

/// The identity of a table: a reload keeps the table (and its entries) while this stays equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    pub idle_timeout: Duration,
    pub max_entries: u64,
}

pub struct PersistTable {
    pub spec: TableSpec,
    entries: Cache<PersistKey, SocketAddr>,
    feed: ArcSwapOption<Feed>,
}

impl std::fmt::Debug for PersistTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistTable")
            .field("spec", &self.spec)
            .finish()
    }
}

impl PersistTable {
    pub fn new(spec: TableSpec) -> PersistTable {
        let entries = Cache::builder()
            .max_capacity(spec.max_entries)
            .time_to_idle(spec.idle_timeout)
            .build();
        PersistTable {
            spec,
            entries,
            feed: ArcSwapOption::empty(),
        }
    }

    /// Sets (or clears) the feed of new entries.
    pub fn set_feed(&self, feed: Option<Feed>) {
        self.feed.store(feed.map(Arc::new));
    }

    /// An entry a peer chose: stored without telling the feed (which would send it back).
    pub fn insert_synced(&self, key: PersistKey, member: SocketAddr) {
        self.entries.insert(key, member);
    }

    /// Every entry, for a peer that (re)connects.
    pub fn entries(&self) -> Vec<(PersistKey, SocketAddr)> {
        self.entries
            .iter()
            .map(|(k, v)| ((*k).clone(), v))
            .collect()
    }

    /// Looks a key up; a hit counts as use and restarts its idle timer.
    pub fn get(&self, key: &PersistKey) -> Option<SocketAddr> {
        self.entries.get(key)
    }

    pub fn insert(&self, key: PersistKey, member: SocketAddr) {
        if let Some(feed) = self.feed.load().as_ref() {
            feed(&key, member);
        }
        self.entries.insert(key, member);
    }

    pub fn remove(&self, key: &PersistKey) {
        self.entries.invalidate(key);
    }

    /// Entries currently held (approximate: expiry and eviction run lazily).
    pub fn len(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.entry_count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A table for `spec`: this one if it is the same, else a new one holding these entries.
    pub fn respec(self: &std::sync::Arc<Self>, spec: TableSpec) -> std::sync::Arc<PersistTable> {
        if self.spec == spec {
            return self.clone();
        }
        let new = PersistTable::new(spec);
        for (k, v) in self.entries.iter() {
            new.entries.insert((*k).clone(), v);
        }
        std::sync::Arc::new(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_source_addresses() {
        let a = PersistKey::source("192.0.2.7".parse().unwrap(), 24, 128);
        let b = PersistKey::source("192.0.2.200".parse().unwrap(), 24, 128);
        let c = PersistKey::source("192.0.3.7".parse().unwrap(), 24, 128);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mapped = PersistKey::source("::ffff:192.0.2.9".parse().unwrap(), 24, 128);
        assert_eq!(a, mapped);
        let v6a = PersistKey::source("2001:db8::1".parse().unwrap(), 32, 64);
        let v6b = PersistKey::source("2001:db8::2".parse().unwrap(), 32, 64);
        assert_eq!(v6a, v6b);
        assert_eq!(
            PersistKey::source("10.1.2.3".parse().unwrap(), 0, 0),
            PersistKey::source("10.9.9.9".parse().unwrap(), 0, 0)
        );
    }

    #[test]
    fn bounded_and_expiring() {
        let t = PersistTable::new(TableSpec {
            idle_timeout: Duration::from_millis(50),
            max_entries: 100,
        });
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        for i in 0..1000u32 {
            t.insert(PersistKey::bytes(&i.to_be_bytes()), addr);
        }
        assert!(t.len() <= 100, "{}", t.len());
        t.insert(PersistKey::bytes(b"x"), addr);
        assert_eq!(t.get(&PersistKey::bytes(b"x")), Some(addr));
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(t.get(&PersistKey::bytes(b"x")), None);
    }
}

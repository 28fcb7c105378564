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
    Ip(Key128),
    /// Client-chosen bytes (a header value, a cookie, a RADIUS attribute) as a keyed 128-bit
    /// hash (`PersistTable::key`): an entry costs the same whatever the client sent (up to
    /// 32 KiB for a header), and a client cannot aim keys at one hash bucket without the key.
    Hashed(Key128),
}

/// 128 bits kept as two `u64`s: a `u128` is 16-byte aligned, and so was every value holding a
/// key, up to an HTTP exchange's future (its attempts remember the client's key); a box of a
/// 16-byte-aligned future takes the allocator's slower aligned path, once per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key128([u64; 2]);

impl Key128 {
    pub fn get(self) -> u128 {
        (u128::from(self.0[0]) << 64) | u128::from(self.0[1])
    }
}

impl From<u128> for Key128 {
    fn from(v: u128) -> Key128 {
        Key128([(v >> 64) as u64, v as u64])
    }
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
                PersistKey::Ip(
                    u128::from(Ipv6Addr::from(u128::from(bits & m) | (0xffff << 32))).into(),
                )
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let m = if mask_v6 == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(mask_v6.min(128)))
                };
                PersistKey::Ip((bits & m).into())
            }
        }
    }
}

/// The keyed hash of a table's byte keys, 128 bits.
///
/// - `Local`: two SipHash-1-3 instances with independent random keys (std's `RandomState`, the
///   HashDoS-resistant PRF of its HashMap): meaningful in this process only.
/// - `Shared`: HMAC-SHA256 under a key both HA nodes derive from `ha.sync.key`, cut to 128 bits:
///   the same client value gives the same key on the peer, so `ha.sync` can carry header,
///   cookie and RADIUS entries. Still keyed, so a client cannot aim keys at one bucket.
#[derive(Clone)]
enum KeyHasher {
    Local {
        hi: std::collections::hash_map::RandomState,
        lo: std::collections::hash_map::RandomState,
    },
    Shared {
        key: ring::hmac::Key,
        /// The secret it was made from, to tell whether a reload changed it.
        secret: [u8; 32],
    },
}

impl KeyHasher {
    fn new(secret: Option<[u8; 32]>) -> KeyHasher {
        match secret {
            Some(secret) => KeyHasher::Shared {
                key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret),
                secret,
            },
            None => KeyHasher::Local {
                hi: Default::default(),
                lo: Default::default(),
            },
        }
    }

    fn secret(&self) -> Option<[u8; 32]> {
        match self {
            KeyHasher::Shared { secret, .. } => Some(*secret),
            KeyHasher::Local { .. } => None,
        }
    }

    fn hash(&self, bytes: &[u8]) -> u128 {
        match self {
            KeyHasher::Local { hi, lo } => {
                use std::hash::BuildHasher;
                (u128::from(hi.hash_one(bytes)) << 64) | u128::from(lo.hash_one(bytes))
            }
            KeyHasher::Shared { key, .. } => {
                let tag = ring::hmac::sign(key, bytes);
                let mut b = [0u8; 16];
                b.copy_from_slice(&tag.as_ref()[..16]);
                u128::from_be_bytes(b)
            }
        }
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
    hasher: KeyHasher,
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
    /// A table whose byte keys hash with a key of this process only.
    pub fn new(spec: TableSpec) -> PersistTable {
        Self::with_hasher(spec, KeyHasher::new(None))
    }

    /// A table whose byte keys hash under `secret` (shared by the HA nodes), or per process
    /// without one.
    pub fn with_key(spec: TableSpec, secret: Option<[u8; 32]>) -> PersistTable {
        Self::with_hasher(spec, KeyHasher::new(secret))
    }

    /// Whether byte keys hash under a shared secret (so a peer can use them).
    pub fn shared_hash(&self) -> bool {
        self.hasher.secret().is_some()
    }

    fn with_hasher(spec: TableSpec, hasher: KeyHasher) -> PersistTable {
        let entries = Cache::builder()
            .max_capacity(spec.max_entries)
            .time_to_idle(spec.idle_timeout)
            .build();
        PersistTable {
            spec,
            entries,
            hasher,
            feed: ArcSwapOption::empty(),
        }
    }

    /// The key of client-chosen bytes in this table (a keyed 128-bit hash; see `Hashed`).
    pub fn key(&self, bytes: &[u8]) -> PersistKey {
        PersistKey::Hashed(self.hasher.hash(bytes).into())
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
        self.respec_keyed(spec, self.hasher.secret())
    }

    /// As `respec`, with the byte-key hash under `secret` (see `with_key`). When the secret
    /// changes, entries of byte keys cannot be found any more and are left behind; source
    /// address entries move over.
    pub fn respec_keyed(
        self: &std::sync::Arc<Self>,
        spec: TableSpec,
        secret: Option<[u8; 32]>,
    ) -> std::sync::Arc<PersistTable> {
        let same_key = self.hasher.secret() == secret;
        if self.spec == spec && same_key {
            return self.clone();
        }
        let hasher = if same_key {
            self.hasher.clone()
        } else {
            KeyHasher::new(secret)
        };
        let new = PersistTable::with_hasher(spec, hasher);
        for (k, v) in self.entries.iter() {
            if same_key || matches!(*k, PersistKey::Ip(_)) {
                new.entries.insert((*k).clone(), v);
            }
        }
        if let Some(feed) = self.feed.load_full() {
            new.feed.store(Some(feed));
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
            t.insert(t.key(&i.to_be_bytes()), addr);
        }
        assert!(t.len() <= 100, "{}", t.len());
        t.insert(t.key(b"x"), addr);
        assert_eq!(t.get(&t.key(b"x")), Some(addr));
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(t.get(&t.key(b"x")), None);
    }

    #[test]
    fn byte_keys_are_fixed_size_keyed_hashes() {
        // No heap part: an entry costs the same for a 32 KiB header value as for one byte.
        // And 8-byte aligned (see `Key128`).
        assert_eq!(std::mem::size_of::<PersistKey>(), 24);
        assert_eq!(std::mem::align_of::<PersistKey>(), 8);
        let spec = TableSpec {
            idle_timeout: Duration::from_secs(60),
            max_entries: 100,
        };
        let t = std::sync::Arc::new(PersistTable::new(spec.clone()));
        let big = vec![b'a'; 32 * 1024];
        assert!(matches!(t.key(&big), PersistKey::Hashed(_)));
        assert_eq!(t.key(&big), t.key(&big));
        assert_ne!(t.key(b"a"), t.key(b"b"));
        // Another table has another key: the same bytes hash differently.
        let other = PersistTable::new(spec.clone());
        assert_ne!(t.key(b"session-1"), other.key(b"session-1"));
        // A table rebuilt by a reload keeps its key, so its entries are still found.
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        t.insert(t.key(b"session-1"), addr);
        let respecced = t.respec(TableSpec {
            max_entries: 200,
            ..spec
        });
        assert_eq!(respecced.get(&respecced.key(b"session-1")), Some(addr));
    }

    #[test]
    fn tables_with_one_shared_secret_hash_alike() {
        let spec = TableSpec {
            idle_timeout: Duration::from_secs(60),
            max_entries: 100,
        };
        let secret = [7u8; 32];
        let a = std::sync::Arc::new(PersistTable::with_key(spec.clone(), Some(secret)));
        let b = PersistTable::with_key(spec.clone(), Some(secret));
        let c = PersistTable::with_key(spec.clone(), Some([8u8; 32]));
        assert!(a.shared_hash() && !PersistTable::new(spec.clone()).shared_hash());
        assert_eq!(a.key(b"JSESSIONID=42"), b.key(b"JSESSIONID=42"));
        assert_ne!(a.key(b"JSESSIONID=42"), c.key(b"JSESSIONID=42"));
        assert_ne!(a.key(b"a"), a.key(b"b"));
        // A new secret at reload: byte-key entries are left behind, address entries move.
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let ip = PersistKey::source("192.0.2.1".parse().unwrap(), 32, 128);
        a.insert(a.key(b"s"), addr);
        a.insert(ip.clone(), addr);
        let r = a.respec_keyed(spec.clone(), None);
        assert!(!r.shared_hash());
        assert_eq!(r.get(&ip), Some(addr));
        assert_eq!(r.len(), 1);
        assert!(std::sync::Arc::ptr_eq(
            &a,
            &a.respec_keyed(spec, Some(secret))
        ));
    }
}

/// `cargo test -p fulcrum-balance --lib -- --ignored entry_memory --nocapture`: the memory
/// one table entry costs (for docs/operations.md).
#[cfg(test)]
mod measure {
    use super::*;

    fn rss_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    #[test]
    #[ignore]
    fn entry_memory() {
        let n = 1_000_000u32;
        let t = PersistTable::new(TableSpec {
            idle_timeout: Duration::from_secs(600),
            max_entries: u64::from(n),
        });
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let before = rss_bytes();
        let big = vec![b'h'; 32 * 1024];
        for i in 0..n {
            let mut v = big.clone();
            v[..4].copy_from_slice(&i.to_be_bytes());
            t.insert(t.key(&v), addr);
        }
        let entries = t.len();
        let after = rss_bytes();
        eprintln!(
            "{entries} entries of 32 KiB client values: {} MiB, {} bytes per entry",
            (after - before) >> 20,
            (after - before) / entries.max(1)
        );
    }
}

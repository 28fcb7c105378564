//! Stable hashing for consistent scheduling and persistence keys.
//!
//! The hash must be the same in every Fulcrum process and version (active-active nodes behind
//! ECMP must send a key to the same member), so std's `DefaultHasher`, whose algorithm may change
//! between Rust releases, is not used. FNV-1a over the bytes, finished with the murmur3 64-bit
//! mixer for avalanche, is tiny, fixed and fast for the short keys involved.

use std::net::{IpAddr, SocketAddr};

pub fn hash_bytes(bytes: &[u8]) -> u64 {
    hash_with_seed(bytes, 0)
}

pub fn hash_with_seed(bytes: &[u8], seed: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    fmix64(h)
}

/// The `k`-th alternative to a finished hash `h`, for probing.
#[inline]
pub fn rehash(h: u64, k: u64) -> u64 {
    fmix64(h ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

pub fn hash_ip(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(v4) => hash_bytes(&v4.octets()),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => hash_bytes(&v4.octets()),
            None => hash_bytes(&v6.octets()),
        },
    }
}

pub fn hash_socket_addr(addr: SocketAddr) -> u64 {
    hash_with_seed(&addr.port().to_be_bytes(), hash_ip(addr.ip()))
}

//! The data plane's flow hash, mirrored from `flow_hash` in bpf/fulcrum_xdp.c so userspace (and
//! the tests) can tell which ring slot a flow lands on. A fixture test checks the two agree.

use crate::maps::FlowKey;

fn mix(h: u32, k: u32) -> u32 {
    let k = k
        .wrapping_mul(0xcc9e_2d51)
        .rotate_left(15)
        .wrapping_mul(0x1b87_3593);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

/// MurmurHash3-style hash of the flow's words as the C side loads them (little-endian loads of
/// network-order bytes). `src_only`: source-address persistence hashes only the client address.
pub fn flow_hash(k: &FlowKey, src_only: bool) -> u32 {
    let mut h = 0x4675_6c63;
    for w in k.src {
        h = mix(h, w);
    }
    if !src_only {
        h = mix(h, (u32::from(k.sport) << 16) | u32::from(k.dport));
        h = mix(h, u32::from(k.proto));
    }
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

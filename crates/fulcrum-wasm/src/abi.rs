//! The numbers and byte layouts of the proxy-wasm ABI (version 0.2.1, the one the public SDKs
//! target): what the host and a filter agree on without sharing any code.

/// Results of host calls.
pub mod status {
    pub const OK: u32 = 0;
    pub const NOT_FOUND: u32 = 1;
    pub const BAD_ARGUMENT: u32 = 2;
    pub const INVALID_MEMORY_ACCESS: u32 = 6;
    pub const EMPTY: u32 = 7;
    pub const CAS_MISMATCH: u32 = 8;
    pub const INTERNAL_FAILURE: u32 = 10;
    pub const UNIMPLEMENTED: u32 = 12;
}

/// What a stream callback returns.
pub mod action {
    pub const CONTINUE: u32 = 0;
    pub const PAUSE: u32 = 1;
}

/// Which header map a host call means.
pub mod map {
    pub const REQUEST_HEADERS: u32 = 0;
    pub const REQUEST_TRAILERS: u32 = 1;
    pub const RESPONSE_HEADERS: u32 = 2;
    pub const RESPONSE_TRAILERS: u32 = 3;
    pub const HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
    pub const HTTP_CALL_RESPONSE_TRAILERS: u32 = 7;
}

/// Which buffer a host call means.
pub mod buffer {
    pub const REQUEST_BODY: u32 = 0;
    pub const RESPONSE_BODY: u32 = 1;
    pub const DOWNSTREAM_DATA: u32 = 2;
    pub const UPSTREAM_DATA: u32 = 3;
    pub const HTTP_CALL_RESPONSE_BODY: u32 = 4;
    pub const VM_CONFIGURATION: u32 = 6;
    pub const PLUGIN_CONFIGURATION: u32 = 7;
}

/// `proxy_continue_stream` / `proxy_close_stream` targets.
pub mod stream {
    pub const REQUEST: u32 = 0;
    pub const RESPONSE: u32 = 1;
}

/// `proxy_define_metric` kinds.
pub mod metric {
    pub const COUNTER: u32 = 0;
    pub const GAUGE: u32 = 1;
    pub const HISTOGRAM: u32 = 2;
}

/// The export that names the ABI a module was built for. 0.2.0 differs from 0.2.1 only in
/// calls Fulcrum answers the same way, so both are accepted.
pub const ABI_MARKERS: [&str; 2] = ["proxy_abi_version_0_2_1", "proxy_abi_version_0_2_0"];

/// One header field as a filter sees it: pseudo-fields (`:method`, `:path`, `:authority`,
/// `:scheme`, `:status`) first, names lower-case.
pub type Pair = (Vec<u8>, Vec<u8>);

/// Serialises header pairs the way `proxy_get_header_map_pairs` returns them: the count, then
/// each name's and value's length (u32 little-endian), then each name and value followed by a
/// NUL byte.
pub fn encode_pairs(pairs: &[Pair]) -> Vec<u8> {
    let data: usize = pairs.iter().map(|(n, v)| n.len() + v.len() + 2).sum();
    let mut out = Vec::with_capacity(4 + pairs.len() * 8 + data);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (n, v) in pairs {
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (n, v) in pairs {
        out.extend_from_slice(n);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Reads header pairs in the layout of [`encode_pairs`] (what a filter hands to
/// `proxy_set_header_map_pairs`, `proxy_send_local_response` and `proxy_http_call`). `None`
/// when the bytes do not hold that layout; the lengths are checked against what is there, so
/// a filter cannot make the host read past its buffer.
pub fn decode_pairs(b: &[u8]) -> Option<Vec<Pair>> {
    if b.is_empty() {
        return Some(Vec::new());
    }
    let word = |at: usize| -> Option<usize> {
        let w = b.get(at..at + 4)?;
        Some(u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
    };
    let n = word(0)?;
    let mut sizes = Vec::with_capacity(n.min(1024));
    let mut at = 4usize;
    for _ in 0..n {
        sizes.push((word(at)?, word(at + 4)?));
        at = at.checked_add(8)?;
    }
    let mut pairs = Vec::with_capacity(sizes.len());
    for (nl, vl) in sizes {
        let name = b.get(at..at.checked_add(nl)?)?.to_vec();
        at += nl + 1;
        let value = b.get(at..at.checked_add(vl)?)?.to_vec();
        at += vl + 1;
        if at > b.len() {
            return None;
        }
        pairs.push((name, value));
    }
    Some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_short_input_is_refused() {
        let pairs = vec![
            (b":method".to_vec(), b"GET".to_vec()),
            (b"x-a".to_vec(), Vec::new()),
        ];
        let b = encode_pairs(&pairs);
        assert_eq!(decode_pairs(&b), Some(pairs));
        for cut in 1..b.len() {
            assert_eq!(decode_pairs(&b[..cut]), None, "cut at {cut}");
        }
        assert_eq!(decode_pairs(&[]), Some(Vec::new()));
        // A count that promises more than the bytes hold.
        assert_eq!(decode_pairs(&u32::MAX.to_le_bytes()), None);
    }
}

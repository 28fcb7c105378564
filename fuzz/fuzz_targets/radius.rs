//! Any datagram given to the RADIUS reader of `type = "radius"` persistence is answered with an
//! attribute, "absent" or "malformed", never a panic or an out-of-bounds read; a packet it
//! accepts can be walked to its end.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let kind = data.first().copied().unwrap_or(1);
    let _ = fulcrum_proxy::radius::key_of(data, kind);
    if let Ok(p) = fulcrum_proxy::radius::parse(data) {
        let total: usize = p.attributes().map(|(_, v)| v.len() + 2).sum();
        assert!(total + fulcrum_proxy::radius::HEADER_LEN <= data.len());
    }
});

//! Proximity probes read whatever comes back to their socket: `is_reply` decides, on any
//! bytes, whether they answer the probe query (its id, the response bit); it never panics and
//! never takes the query itself for a reply.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let id = u16::from_be_bytes([data[0], data[1]]);
    let reply = &data[2..];
    let yes = fulcrum_dns::proximity::is_reply(id, reply);
    if yes {
        assert!(reply.len() >= 12 && reply[2] & 0x80 != 0);
    }
    assert!(!fulcrum_dns::proximity::is_reply(
        id,
        &fulcrum_dns::proximity::probe_query(id)
    ));
});

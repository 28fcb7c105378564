//! Whatever an SNMP agent (or anything on its port) sends is parsed without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let id = data.first().map_or(0, |&b| i32::from(b));
    let _ = fulcrum_health::parse_snmp_response(data, id);
});

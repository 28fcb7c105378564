//! Whatever an agent-check server sends is parsed without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fulcrum_health::parse_agent_reply(data);
});

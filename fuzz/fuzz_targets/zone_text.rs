//! Zone master-file text (files and inline records) is parsed or refused without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let origin = hickory_proto::rr::Name::from_ascii("example.com.").expect("valid");
    let _ = fulcrum_dns::zone::parse_master(text, &origin);
});

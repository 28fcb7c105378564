//! What members answer to health checks: HTTP replies (head, framing, the chunked body reader
//! across arbitrary splits), DNS answers to a `type = "dns"` check, RADIUS answers to a
//! `type = "radius"` check (signed with the check's secret half of the time, so the fuzzer
//! gets past the Response Authenticator), and NNTP status lines and GROUP answers to a
//! `type = "nntp"` check.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    match sel % 5 {
        0 | 1 => {
            let split = rest.first().map_or(0, |&b| usize::from(b) * 4);
            let _ = fulcrum_health::fuzzing::http_reply(rest, sel & 0x10 != 0, split);
        }
        2 => {
            let _ = fulcrum_health::fuzzing::dns_reply(rest);
        }
        4 => fulcrum_health::fuzzing::nntp_reply(rest),
        _ => {
            let mut reply = rest.to_vec();
            let _ =
                fulcrum_health::fuzzing::radius_reply(&mut reply, sel & 0x10 != 0, sel & 0x20 != 0);
        }
    }
});

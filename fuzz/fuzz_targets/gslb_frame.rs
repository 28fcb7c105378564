//! Whatever a peer sends on the site state exchange is refused or accepted without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let keys = fulcrum_dns::exchange::keys(&["a-shared-secret-for-fuzzing".to_string()]);
    if data.len() < 4 {
        return;
    }
    let Ok(n) = fulcrum_dns::exchange::frame_len([data[0], data[1], data[2], data[3]]) else {
        return;
    };
    let rest = &data[4..];
    if rest.len() < n + 32 {
        return;
    }
    let _ = fulcrum_dns::exchange::decode_frame(&keys, &[0; 16], 0, &rest[..n], &rest[n..n + 32]);
    // The payload decoder itself, past authentication.
    let _ = serde_json::from_slice::<fulcrum_dns::table::Report>(rest);
});

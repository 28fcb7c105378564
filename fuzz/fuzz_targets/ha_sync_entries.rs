//! Whatever a peer sends as a batch of `ha.sync` entries (persistence entries and XDP flows,
//! past the frame's HMAC check) is decoded or refused without a panic, and what is accepted
//! encodes and decodes back the same.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok((entries, _skipped)) = fulcrum_ha::sync::decode_entries(data) else {
        return;
    };
    for e in &entries {
        if let fulcrum_ha::sync::Entry::Flow(f) = e {
            assert!(f.valid());
        }
    }
    let again = fulcrum_ha::sync::encode_entries(&entries);
    assert_eq!(
        fulcrum_ha::sync::decode_entries(&again),
        Ok((entries, 0))
    );
});

//! The site state exchange past its HMAC check: the fuzz input is the payload (and sequence
//! number) of a frame signed with a key the receiver holds, so every input reaches the report
//! decoding and its checks instead of stopping at the tag.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let keys = fulcrum_dns::exchange::keys(&["a-shared-secret-for-fuzzing".to_string()]);
    let nonce = [0x5a; 16];
    let mut s = [0u8; 8];
    s.copy_from_slice(&data[..8]);
    let seq = u64::from_be_bytes(s);
    let payload = &data[8..];
    let frame = fulcrum_dns::exchange::encode_payload(&keys[0], &nonce, seq, payload);
    let Ok(n) = fulcrum_dns::exchange::frame_len([frame[0], frame[1], frame[2], frame[3]]) else {
        return;
    };
    let rest = &frame[4..];
    let last_seq = 0;
    match fulcrum_dns::exchange::decode_frame(&keys, &nonce, last_seq, &rest[..n], &rest[n..]) {
        Ok((got, report)) => {
            assert_eq!(got, seq);
            assert!(seq > last_seq);
            assert!(!report.instance.is_empty() && report.sites.len() <= 4096);
            // What the receiver keeps must survive its own encoding: a report it accepted
            // is sent on (as a frame) and read back the same.
            let again = fulcrum_dns::exchange::encode_frame(&keys[0], &nonce, seq, &report);
            let m = fulcrum_dns::exchange::frame_len([again[0], again[1], again[2], again[3]])
                .expect("an accepted report fits a frame again");
            let (_, back) = fulcrum_dns::exchange::decode_frame(
                &keys,
                &nonce,
                last_seq,
                &again[4..4 + m],
                &again[4 + m..],
            )
            .expect("a re-encoded report decodes");
            assert_eq!(back.instance, report.instance);
            assert_eq!(back.sites.len(), report.sites.len());
        }
        Err(e) => {
            // A frame signed with our key never fails authentication.
            assert_ne!(e, fulcrum_dns::exchange::FrameError::BadTag);
        }
    }
});

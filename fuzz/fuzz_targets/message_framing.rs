//! The message framer over arbitrary framing settings and arbitrary bytes: it never panics,
//! every frame it returns lies within the buffer and within max_message, and feeding the same
//! bytes one at a time (the incremental delimiter scan) finds the same first frame.
#![no_main]

use fulcrum_config::{Framing, LengthEncoding};
use fulcrum_proxy::message::{FrameError, Framer};
use libfuzzer_sys::fuzz_target;

fn framing(cfg: &[u8]) -> Framing {
    let b = |i: usize| cfg.get(i).copied().unwrap_or(0);
    let encoding = match b(0) % 3 {
        0 => LengthEncoding::Binary,
        1 => LengthEncoding::Ascii,
        _ => LengthEncoding::Bcd,
    };
    let delimiter = (b(1) % 4 == 0).then(|| {
        let len = usize::from(b(2) % 4) + 1;
        (0..len).map(|i| b(3 + i)).collect::<Vec<u8>>()
    });
    Framing {
        length_bytes: [1, 2, 4, 8, 3, 6][usize::from(b(7)) % 6],
        length_offset: usize::from(b(8) % 8),
        big_endian: b(9) & 1 == 0,
        length_includes_header: b(9) & 2 == 0,
        max_message: usize::from(u16::from_le_bytes([b(10), b(11)])) + 1,
        length_encoding: encoding,
        length_adjust: i64::from(i8::from_le_bytes([b(12)])),
        delimiter,
        wasm: None,
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 13 {
        return;
    }
    let (cfg, bytes) = data.split_at(13);
    let framer = Framer::new(&framing(cfg));
    let max_body = framing(cfg).max_message;

    // The whole buffer: frames one after another until an error or more bytes are needed.
    let mut rest = bytes;
    let mut first: Option<Result<Option<usize>, FrameError>> = None;
    loop {
        let mut scanned = 0;
        let r = framer.parse(rest, &mut scanned);
        if first.is_none() {
            first = Some(r.clone().map(|f| f.map(|f| f.len)));
        }
        match r {
            Ok(Some(f)) => {
                assert!(
                    f.len > 0 || framer.header_len() == 0,
                    "a frame consumes bytes"
                );
                assert!(f.len <= rest.len());
                assert!(f.len <= framer.max_frame());
                assert!(f.body.start <= f.body.end && f.body.end <= f.len);
                assert!(f.body.len() <= max_body);
                if f.len == 0 {
                    break;
                }
                rest = &rest[f.len..];
            }
            Ok(None) | Err(_) => break,
        }
    }

    // The same bytes arriving one at a time find the same first frame.
    let mut scanned = 0;
    let mut incremental = Ok(None);
    for end in 0..=bytes.len() {
        incremental = framer
            .parse(&bytes[..end], &mut scanned)
            .map(|f| f.map(|f| f.len));
        if !matches!(incremental, Ok(None)) {
            break;
        }
    }
    match (&first, &incremental) {
        (Some(Ok(Some(a))), Ok(Some(b))) => assert_eq!(a, b),
        (Some(Ok(None)), Ok(None)) => {}
        (Some(Err(_)), Err(_)) => {}
        (a, b) => panic!("whole {a:?} vs incremental {b:?}"),
    }
});

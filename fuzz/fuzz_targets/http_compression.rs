//! Response compression with arbitrary inputs: any request and response heads (Accept-Encoding
//! with any weights, any Content-Type, Content-Encoding, Cache-Control, Vary, ETag) go through
//! the plan and the field rewriting, and when a coding is chosen, arbitrary body bytes go
//! through its encoder in arbitrary pieces with flushes. Never a panic; a compressed response's
//! fields always name its coding and vary on Accept-Encoding.
#![no_main]

use std::sync::Arc;

use fulcrum_config::{Compression, CompressionAlgorithm as A, CompressionLevels};
use fulcrum_http::compress::{CompressStats, Compressor, Plan, Stream};
use fulcrum_http::head::{Limits, Parse, RequestHead, ResponseHead};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Layout: [level byte][request head]\0[response head]\0[body]
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.splitn(3, |b| *b == 0);
    let (Some(req), Some(resp)) = (parts.next(), parts.next()) else {
        return;
    };
    let body = parts.next().unwrap_or_default();
    let c = Compressor::new(&Compression {
        algorithms: vec![A::Br, A::Zstd, A::Gzip, A::Deflate],
        min_size: u64::from(sel & 0x0f) * 64,
        types: vec!["text/*".into(), "application/json".into(), "*/*".into()],
        levels: CompressionLevels {
            gzip: 1 + u32::from(sel % 9),
            deflate: 1 + u32::from(sel % 9),
            br: u32::from(sel % 12),
            zstd: 1 + i32::from(sel % 19),
        },
    });
    let mut rq = RequestHead::with_buffer(req.to_vec());
    if !matches!(rq.parse(&Limits::default()), Ok(Parse::Complete)) {
        return;
    }
    let mut rs = ResponseHead::with_buffer(resp.to_vec());
    if !matches!(rs.parse(), Ok(Parse::Complete)) {
        return;
    }
    let plan = c.plan(&rq, &rs, sel & 0x80 != 0);
    let mut fields = Vec::new();
    fulcrum_http::compress::write_fields_for_fuzzing(&mut fields, plan, &rs);
    let text = String::from_utf8_lossy(&fields).to_ascii_lowercase();
    if let Plan::Encode(coding) = plan {
        assert!(text.contains(&format!("content-encoding: {}", coding.algo)));
        assert!(text.contains("vary: "));
        let Ok(mut s) = Stream::start(coding, None, Arc::new(CompressStats::default())) else {
            return;
        };
        let mut out = Vec::new();
        for (i, piece) in body.chunks(1 + usize::from(sel) * 7).enumerate() {
            s.write(piece).unwrap();
            if i % 3 == 0 {
                s.flush().unwrap();
            }
            s.drain_into(&mut out, i % 2 == 0);
        }
        s.finish().unwrap();
        s.drain_into(&mut out, true);
    }
});

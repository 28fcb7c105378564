//! The metric families of HTTP response compression (`compression` on http services).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_admin::MetricsWriter;
use fulcrum_http::compress::ALGORITHMS;
use fulcrum_http::HttpStats;

/// `fulcrum_http_compressed_responses_total` and the compressors' byte counters, per service.
pub fn metrics(w: &mut MetricsWriter, stats: &[(String, Arc<HttpStats>)]) {
    w.family(
        "fulcrum_http_compressed_responses_total",
        "counter",
        "Responses compressed by the proxy, by algorithm (content-coding).",
    );
    for (name, s) in stats {
        for a in ALGORITHMS {
            w.sample(
                "fulcrum_http_compressed_responses_total",
                &[("vs", name), ("algorithm", a.as_str())],
                s.compression.responses_of(a) as f64,
            );
        }
    }
    type Field = fn(&HttpStats) -> u64;
    let families: [(&str, &str, Field); 2] = [
        (
            "fulcrum_http_compression_in_bytes_total",
            "Response body bytes fed to the compressors (before compression).",
            |s| s.compression.bytes_in.load(Ordering::Relaxed),
        ),
        (
            "fulcrum_http_compression_out_bytes_total",
            "Bytes the compressors produced (compressed bodies, before chunked framing).",
            |s| s.compression.bytes_out.load(Ordering::Relaxed),
        ),
    ];
    for (family, help, get) in families {
        w.family(family, "counter", help);
        for (name, s) in stats {
            w.sample(family, &[("vs", name)], get(s) as f64);
        }
    }
}

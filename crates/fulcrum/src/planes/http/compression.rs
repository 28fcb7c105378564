//! The metric families of HTTP response compression (`compression` on http services).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_admin::{CounterFamily, MetricFamilies};
use fulcrum_http::compress::ALGORITHMS;
use fulcrum_http::HttpStats;

/// `fulcrum_http_compressed_responses_total` and the compressors' byte counters, per service.
pub fn metrics(w: &mut MetricFamilies, stats: &[(String, Arc<HttpStats>)]) {
    let mut samples = w.counter(
        "fulcrum_http_compressed_responses_total",
        "Responses compressed by the proxy, by algorithm (content-coding).",
    );
    for (name, s) in stats {
        for a in ALGORITHMS {
            samples.sample(
                &[("vs", name), ("algorithm", a.as_str())],
                s.compression.responses_of(a),
            );
        }
    }
    let families: [CounterFamily<HttpStats>; 2] = [
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
    w.counters_per_vs(
        &families,
        stats.iter().map(|(name, s)| (name.as_str(), &**s)),
    );
}

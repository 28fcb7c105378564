//! A process-wide monotonic millisecond clock, so member timestamps fit in atomics.

use std::sync::OnceLock;
use std::time::Instant;

static START: OnceLock<Instant> = OnceLock::new();

/// Milliseconds since the first call in this process; never 0, so 0 can mean "not set".
pub fn now_ms() -> u64 {
    let start = *START.get_or_init(Instant::now);
    start.elapsed().as_millis() as u64 + 1
}

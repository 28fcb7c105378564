//! The end of an input for the targets that run a proxy and its member on one runtime.

use std::time::Duration;

use tokio::time::Instant;

/// The tasks alive now: taken at the start of an input, for `settle`.
pub fn alive() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Runs the runtime until no more than `before` tasks are alive (what `alive` counted when the
/// input began), so every task an input spawned ends within the input: what it allocated is
/// freed before libFuzzer compares the input's mallocs with its frees. An input that leaves
/// memory for the next one to free looks like a leak and costs a re-run and a LeakSanitizer
/// pass over the whole heap, which made those passes most of the targets' time. On the paused
/// clock the waiting is free.
///
/// Checked: the tasks do end, within 10 s of that clock (the targets' timeouts are all far
/// shorter): a connection, link or timer task that outlives its client, service and member
/// is a leak the proxy would have too.
pub async fn settle(before: usize) {
    let metrics = tokio::runtime::Handle::current().metrics();
    let until = Instant::now() + Duration::from_secs(10);
    while metrics.num_alive_tasks() > before && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let alive = metrics.num_alive_tasks();
    assert!(
        alive <= before,
        "{} tasks of this input still alive 10 s after it ended",
        alive - before
    );
}

//! `[[virtual_service.filter]]`: the proxy-wasm filters (ABI 0.2.1) of an http or https
//! service, run in the order written around its rules. The module itself is checked when the
//! service is built (and by `fulcrum check`): here only the keys.

use std::path::PathBuf;
use std::time::Duration;

use crate::reader::{Cx, FromNode, Node};
use crate::string_enum;
use crate::types::{read_table, ByteSize};

string_enum!(
    /// What a request meets when its filter fails (traps, runs out of time or memory, or is
    /// disabled).
    FilterOnError {
        /// 500 before the response began; the response cut short after.
        FailClosed = "fail_closed",
        /// The request goes on as if the filter were absent.
        FailOpen = "fail_open",
    }
);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// The `.wasm` file (or `.wat`, the text format); relative paths are from the
    /// configuration's folder. Its path as
    /// written names the filter in metrics and the API, and is its VM id: filters loaded from
    /// one module share data and queues.
    pub module: PathBuf,
    /// Handed to the filter's `proxy_on_configure`.
    pub config: String,
    /// The root context the filter registers under (Envoy's `root_id`; SDK filters look their
    /// root context up by it).
    pub root_id: String,
    pub on_error: FilterOnError,
    /// The most linear memory one instance may grow to.
    pub max_memory: u64,
    /// The longest one call into the filter may run.
    pub time_budget: Duration,
    /// Consecutive failed requests after which the filter is disabled until the next reload
    /// (0: never).
    pub disable_after: u32,
    /// The largest request body the filter is given (buffered whole, `proxy_on_request_body`
    /// once with end of stream); a larger one is answered 413. 0: the filter is not given
    /// request bodies, which then stream to the member untouched.
    pub max_request_body: u64,
}

pub const DEFAULT_FILTER_MEMORY: u64 = 32 << 20;
pub const DEFAULT_FILTER_BUDGET: Duration = Duration::from_millis(20);
pub const DEFAULT_FILTER_DISABLE_AFTER: u32 = 100;
pub const DEFAULT_FILTER_REQUEST_BODY: u64 = 1 << 20;
/// As the most a filter may hold back of a response body.
const MAX_FILTER_REQUEST_BODY: u64 = 8 << 20;

impl FromNode for Filter {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let module: Option<String> = t.req(cx, "module");
            let config = t.opt(cx, "config").unwrap_or_default();
            let root_id = t.opt(cx, "root_id").unwrap_or_default();
            let on_error = t.opt(cx, "on_error").unwrap_or(FilterOnError::FailClosed);
            let max_memory = t
                .opt::<ByteSize>(cx, "max_memory")
                .map_or(DEFAULT_FILTER_MEMORY, |b| b.0);
            let time_budget = t.opt(cx, "time_budget").unwrap_or(DEFAULT_FILTER_BUDGET);
            let disable_after = t
                .opt(cx, "disable_after")
                .unwrap_or(DEFAULT_FILTER_DISABLE_AFTER);
            let max_request_body = t
                .opt::<ByteSize>(cx, "max_request_body")
                .map_or(DEFAULT_FILTER_REQUEST_BODY, |b| b.0);
            let at = t.path().to_string();
            if max_request_body > MAX_FILTER_REQUEST_BODY {
                cx.error_path(
                    &format!("{at}.max_request_body"),
                    "must be at most 8MiB (the body is held in memory while filters read it)",
                );
            }
            // A wasm page is 64 KiB; below a few pages no filter built by an SDK starts.
            if !(1 << 20..=4 << 30).contains(&max_memory) {
                cx.error_path(
                    &format!("{at}.max_memory"),
                    "must be between 1MiB and 4GiB (a wasm32 memory's size)",
                );
            }
            if time_budget < Duration::from_millis(1) || time_budget > Duration::from_secs(10) {
                cx.error_path(
                    &format!("{at}.time_budget"),
                    "must be between 1ms and 10s (the clock that stops a filter ticks every 2ms)",
                );
            }
            let module = module?;
            if !(module.ends_with(".wasm") || module.ends_with(".wat")) {
                cx.error_path(
                    &format!("{at}.module"),
                    "expected the path of a WebAssembly module (.wasm, or .wat in the text format)",
                );
            }
            Some(Filter {
                module: module.into(),
                config,
                root_id,
                on_error,
                max_memory,
                time_budget,
                disable_after,
                max_request_body,
            })
        })
    }
}

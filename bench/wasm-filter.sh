#!/usr/bin/env bash
# The proxy-wasm host's own cost per request (crates/fulcrum-wasm, no proxy around it): open a
# stream, run the request and response header callbacks, close it — for a filter exporting
# only those callbacks and for the committed C filter (reads, removes and adds a header) — and
# each module's compile-and-start time. Medians of five rounds of N requests on one thread.
# Not yet a comparison with a peer: the host is not wired into the HTTP plane; once it is, the
# figure to publish is CPU per request through Fulcrum with and without a filter, beside the
# same edit made by a declarative rule (bench/http.sh's h2load/wrk harness).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${N:-200000}
bench_build -p fulcrum-wasm --example stream_cost
"$BUILD_DIR/examples/stream_cost" "$N"

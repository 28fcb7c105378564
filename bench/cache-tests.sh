#!/usr/bin/env bash
# Runs the public http-tests "cache-tests" suite (https://cache-tests.fyi) against Fulcrum's HTTP
# cache: the suite's origin server on 127.0.0.1:18000, Fulcrum in front of it on 127.0.0.1:18002
# (a reverse-proxy cache, like the suite's nginx/Squid/ATS runs), the suite's client against
# Fulcrum. Prints the failing test ids and the pass rate, and the same rate for the reference
# results the suite ships (results/*.json).
#
# CACHE_TESTS=DIR uses an existing checkout (else it is cloned into a temporary directory);
# needs node >= 18 and npm (the suite's dependencies come from the npm registry).
set -euo pipefail
cd "$(dirname "$0")/.."
FULCRUM=${FULCRUM:-target/debug/fulcrum}
[ "$FULCRUM" = target/debug/fulcrum ] && cargo build -q -p fulcrum
. bench/lib.sh
bench_workdir

dir=${CACHE_TESTS:-}
if [ -z "$dir" ]; then
  dir=$work/cache-tests
  git clone -q --depth 1 https://github.com/http-tests/cache-tests.git "$dir"
fi
(cd "$dir" && [ -d node_modules ] || npm i --omit=dev --silent >/dev/null)

# POOL=tuned (default) keeps the suite's origin in the pool whatever it does: the origin answers
# 5xx and drops connections on purpose, so passive health would take it out between tests
# (statuses are not counted; resets need 1000 in a row). POOL=default runs the same service
# with a pool as a user writes it (no monitor, default passive health) to show what that costs.
# POOL=both runs the two one after the other.
run_suite() {
  local variant=$1 pool_keys=""
  if [ "$variant" = tuned ]; then
    pool_keys=$'passive_statuses = []\nmonitors = ["alive"]'
  fi
  cat >"$work/fulcrum.toml" <<CONF
[admin]
listen = "127.0.0.1:18099"
[[virtual_service]]
name = "ct"
listen = ["127.0.0.1:18002"]
protocol = "http"
pool = "origin"
cache = { size = "64MiB", max_object = "8MiB" }
[[pool]]
name = "origin"
$pool_keys
[[pool.member]]
address = "127.0.0.1:18000"
[[monitor]]
name = "alive"
type = "tcp"
fall = 1000
CONF
  RUST_LOG=warn "$FULCRUM" run -c "$work/fulcrum.toml" 2>"$work/fulcrum-$variant.log" &
  local fpid=$!
  wait_port 127.0.0.1:18002
  (cd "$dir" && npm run --silent cli --base=http://127.0.0.1:18002) >"$work/results-$variant.json" 2>"$work/cli.err"
  kill "$fpid" 2>/dev/null || true
  wait "$fpid" 2>/dev/null || true
  node -e '
const r = require(process.argv[1]); const v = Object.entries(r);
let pass = 0;
for (const [k, x] of v) { if (x === true) pass++; else console.log("FAIL", k, JSON.stringify(x).slice(0, 140)); }
console.log(`fulcrum (${process.argv[2]} pool): ${pass}/${v.length} = ${(100 * pass / v.length).toFixed(1)}%`);
' "$work/results-$variant.json" "$variant"
}

(cd "$dir" && npm_config_port=18000 npm_config_protocol=http npm_config_pidfile="$work/server.pid" \
  exec node test-engine/server/server.mjs >"$work/server.log" 2>&1) &
pids+=($!)
wait_port 127.0.0.1:18000
case "${POOL:-tuned}" in
  both) run_suite tuned; run_suite default ;;
  *) run_suite "${POOL:-tuned}" ;;
esac
for f in "$dir"/results/*.json; do
  node -e '
const r = require(process.argv[1]); const v = Object.entries(r);
const pass = v.filter(([, x]) => x === true).length;
console.log(`${require("path").basename(process.argv[1], ".json")}: ${pass}/${v.length} = ${(100 * pass / v.length).toFixed(1)}%`);
' "$f"
done

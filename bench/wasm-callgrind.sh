#!/usr/bin/env bash
# proxy-wasm filters, counted rather than timed: bench/wasm-filter.sh's services through one
# Fulcrum under valgrind's callgrind, and the user-space instructions per request of each over a
# fixed number of HTTP/1.1 keep-alive requests (h2load --h1), the counters zeroed behind a
# warm-up and dumped after each service. Timed through the proxy, differences under ~1 µs are
# lost in this machine's noise; counts agree within ~0.5 % between runs, so the rows' differences
# are what each filter costs the proxy's own code (the kernel is left out).
#   bench/wasm-callgrind.sh [REQUESTS=20000]
#   FULCRUM=path (default target/$PROFILE/fulcrum); FULCRUM_ALT=path: a second binary counted
#   the same way, its rows beside the first's (a change before and after)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${1:-20000}
need valgrind; need nginx; need nghttp2-client h2load
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum

M1=18611 M2=18612 ADMIN=18620
NONE=18621 RULE=18622 NOOP=18623 HDR=18624 BODY=18625 SDK=18626
bench_workdir
hello_members "$M1" "$M2"
. bench/wasm-configs.sh
wasm_filter_config

rows=(none rule noop header sdk)
declare -A instr
# counted LABEL BINARY: instructions per request of each row, into instr[LABEL.ROW].
counted() {
  local label=$1 bin=$2 pid port row out f extra
  RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" valgrind --tool=callgrind \
    --callgrind-out-file="$work/$label.cg" "$bin" run --config "$work/fulcrum.toml" \
    2>"$work/$label.vg" &
  pid=$!; pids+=($pid)
  # Under valgrind the start (TLS-free, but wasmtime compiles four modules) takes seconds.
  for _ in $(seq 1200); do (exec 3<>"/dev/tcp/127.0.0.1/$SDK") 2>/dev/null && break; sleep 0.1; done
  for row in "${rows[@]}"; do
    extra=()
    case $row in
      none) port=$NONE ;;
      rule) port=$RULE extra=(-H "x-internal: 1") ;;
      noop) port=$NOOP ;;
      header) port=$HDR extra=(-H "x-internal: 1") ;;
      sdk) port=$SDK ;;
    esac
    taskset -c "$BENCH_CPU_LOAD" h2load --h1 -c 10 -n 3000 "${extra[@]}" "http://127.0.0.1:$port/" >/dev/null 2>&1
    callgrind_control -z "$pid" >/dev/null 2>&1
    out=$(taskset -c "$BENCH_CPU_LOAD" h2load --h1 -c 10 -n "$N" "${extra[@]}" "http://127.0.0.1:$port/" 2>&1)
    grep -q "$N succeeded" <<<"$out" || { echo "$label $row: not every request succeeded" >&2; grep '^requests:' <<<"$out" >&2; exit 1; }
    callgrind_control -d "$pid" >/dev/null 2>&1
    sleep 1
    f=$(ls -t "$work/$label".cg.* | head -1)
    instr[$label.$row]=$(awk -v n="$N" '/^summary:/ {printf "%.0f", $2 / n; exit}' "$f")
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

labels=(fulcrum)
counted fulcrum "$FULCRUM"
if [ -n "${FULCRUM_ALT:-}" ]; then
  labels+=(alt)
  counted alt "$FULCRUM_ALT"
fi

echo "## User-space instructions per request ($N HTTP/1.1 keep-alive requests per row)"
head="| service |"; rule="|---|"
for l in "${labels[@]}"; do head+=" $l | over none |"; rule+="---:|---:|"; done
echo "$head"; echo "$rule"
for row in "${rows[@]}"; do
  line="| $row |"
  for l in "${labels[@]}"; do
    line+=" ${instr[$l.$row]} | $((instr[$l.$row] - instr[$l.none])) |"
  done
  echo "$line"
done
echo
echo "FULCRUM=$FULCRUM${FULCRUM_ALT:+ FULCRUM_ALT=$FULCRUM_ALT}"

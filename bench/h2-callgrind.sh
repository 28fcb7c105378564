#!/usr/bin/env bash
# HTTP/2 clients, counted rather than timed: Fulcrum and HAProxy on bench/h2.sh's path (TLS +
# HTTP/2 from h2load, HTTP/1.1 to two nginx members over reused connections), each run under
# valgrind's callgrind, and the user-space events per request over a fixed number of requests.
# Instruction counts do not move with the machine's noise the way CPU time does (two runs agree
# within ~0.5 %), so they show what a change does to the proxy's own work; they leave out the
# kernel, and the cache figures are valgrind's simulated caches, not this CPU's.
#   bench/h2-callgrind.sh [REQUESTS=20000]     CACHE=1: also simulate caches and branch prediction (slower)
#   FULCRUM=path (default target/$PROFILE/fulcrum)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
N=${1:-20000}
need valgrind; need haproxy; need nginx; need nghttp2-client h2load; need openssl
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
CG=(valgrind --tool=callgrind --compress-strings=no --compress-pos=no)
[ "${CACHE:-0}" = 1 ] && CG+=(--cache-sim=yes --branch-sim=yes)

M1=18611 M2=18612 F=18650 H=18651 FA=18692
bench_workdir
bench_cert "$work"
hello_members "$M1" "$M2"

. bench/h2-configs.sh
h2_configs

# counted NAME PORT COMMAND...: events per request of COMMAND (under callgrind) over N
# requests, after a warm-up of 5,000 that the counters are zeroed behind.
counted() {
  local name=$1 port=$2 pid out f; shift 2
  RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "${CG[@]}" --callgrind-out-file="$work/$name.cg" "$@" \
    2>"$work/$name.vg" &
  pid=$!; pids+=($pid)
  for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  taskset -c "$BENCH_CPU_LOAD" h2load -c 50 -m 10 -n 5000 "https://127.0.0.1:$port/" >/dev/null 2>&1
  callgrind_control -z "$pid" >/dev/null 2>&1
  out=$(taskset -c "$BENCH_CPU_LOAD" h2load -c 50 -m 10 -n "$N" "https://127.0.0.1:$port/" 2>&1)
  grep -q "$N succeeded" <<<"$out" || { echo "$name: not every request succeeded" >&2; grep '^requests:' <<<"$out" >&2; exit 1; }
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  f=$(ls -t "$work/$name".cg.* | head -1)
  awk -v n="$N" -v name="$name" '/^events:/ {for (i = 2; i <= NF; i++) ev[i] = $i}
    /^summary:/ {printf "%s", name; for (i = 2; i <= NF; i++) printf " %s=%.0f", ev[i], $i / n; print ""; exit}' "$f"
}

counted fulcrum "$F" "$FULCRUM" run -c "$work/fulcrum.toml"
counted haproxy "$H" haproxy -db -f "$work/haproxy.cfg"

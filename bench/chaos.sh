#!/usr/bin/env bash
# Chaos run: Fulcrum (protocol http) in front of three members under steady HTTP/1.1 (wrk) and
# HTTP/2 (h2load) load, while, for DURATION seconds:
#   - it is reloaded RELOADS times (SIGHUP, the pool's weights alternating so that each reload
#     changes the configuration), spread over the run;
#   - member 2 (nginx) is killed and restarted every 30 s (down 5 s each time);
#   - member 3 (crates/fulcrum-testkit bin chaos-member) resets 10 % of its connections right
#     after reading the first request (SO_LINGER 0), before any response.
# All requests are idempotent GETs; the pool has retries = 2 and a 1 s HTTP monitor.
# Reported: requests and failures per client (wrk: non-2xx, socket errors, timeouts; h2load:
# failed + errored), Fulcrum's own retry and reset counters, its descriptors (/proc/PID/fd)
# and RSS before the load, at the end of the load, and after 10 s of quiet.
#
#   bench/chaos.sh [DURATION=180] [RELOADS=100]   FULCRUM=path (default $BUILD_DIR/fulcrum: target/$PROFILE, see bench/lib.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
DURATION=${1:-180} RELOADS=${2:-100}
need nginx; need wrk; need nghttp2-client h2load
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
MEMBER=${MEMBER:-target/debug/chaos-member}
[ "$MEMBER" = target/debug/chaos-member ] && cargo build -q -p fulcrum-testkit --bin chaos-member
ulimit -n "$(ulimit -Hn)"

M1=18411 M2=18412 M3=18413 F=18480 FA=18490
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; [ -n "${m2_pid:-}" ] && kill "$m2_pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

member_conf() {  # member_conf PORT NAME
  cat <<CONF
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/$2.pid;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$1 reuseport; location / { return 200 "hello from $2\n"; } }
}
CONF
}
member_conf $M1 m1 >"$work/m1.conf"
member_conf $M2 m2 >"$work/m2.conf"
taskset -c "$BENCH_CPU_LOAD" nginx -p "$work" -c "$work/m1.conf" 2>>"$work/members.err" &
pids+=($!)
start_m2() { taskset -c "$BENCH_CPU_LOAD" nginx -p "$work" -c "$work/m2.conf" 2>>"$work/members.err" & m2_pid=$!; }
start_m2
taskset -c "$BENCH_CPU_LOAD" "$MEMBER" 127.0.0.1:$M3 10 &
pids+=($!)
for p in $M1 $M2 $M3; do wait_port 127.0.0.1:$p; done

fulcrum_conf() {  # fulcrum_conf WEIGHT
  cat <<CONF
$(fulcrum_head "127.0.0.1:$FA")
[[monitor]]
name = "web"
type = "http"
interval = "1s"
timeout = "500ms"
[[virtual_service]]
name = "web"
listen = "127.0.0.1:$F"
protocol = "http"
pool = "members"
[[pool]]
name = "members"
monitors = ["web"]
retries = 2
[[pool.member]]
address = "127.0.0.1:$M1"
weight = $1
[[pool.member]]
address = "127.0.0.1:$M2"
[[pool.member]]
address = "127.0.0.1:$M3"
CONF
}
fulcrum_conf 100 >"$work/fulcrum.toml"
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/fulcrum.toml" 2>"$work/fulcrum.err" &
fpid=$!; pids+=($fpid)
wait_port 127.0.0.1:$F
# Warm up (member connections, health states), then the baseline.
wrk -t1 -c20 -d3s "http://127.0.0.1:$F/" >/dev/null 2>&1 || true
sleep 2
fd0=$(ls /proc/$fpid/fd | wc -l); rss0=$(rss_kib $fpid)

taskset -c "$BENCH_CPU_LOAD" wrk -t1 -c20 -d"${DURATION}s" --timeout 5s "http://127.0.0.1:$F/" >"$work/wrk.out" 2>&1 &
wrk_pid=$!
taskset -c "$BENCH_CPU_LOAD" h2load -c10 -m10 -D "$DURATION" "http://127.0.0.1:$F/" >"$work/h2load.out" 2>&1 &
h2_pid=$!

start=$(date +%s)
reloads=0 kills=0
next_kill=$((start + 30))
interval=$(awk -v d="$DURATION" -v r="$RELOADS" 'BEGIN { printf "%.3f", (d - 5) / r }')
while kill -0 $wrk_pid 2>/dev/null; do
  now=$(date +%s)
  if [ "$reloads" -lt "$RELOADS" ]; then
    fulcrum_conf $(( reloads % 2 ? 100 : 90 )) >"$work/fulcrum.toml"
    kill -HUP $fpid
    reloads=$((reloads + 1))
  fi
  if [ "$now" -ge "$next_kill" ] && [ "$now" -lt $((start + DURATION - 10)) ]; then
    kill "$m2_pid" 2>/dev/null || true; wait "$m2_pid" 2>/dev/null || true
    kills=$((kills + 1))
    restart_at=$((now + 5))
    next_kill=$((now + 30))
  fi
  if [ -n "${restart_at:-}" ] && [ "$now" -ge "$restart_at" ]; then
    start_m2; restart_at=
  fi
  sleep "$interval"
done
wait $h2_pid 2>/dev/null || true
fd1=$(ls /proc/$fpid/fd | wc -l); rss1=$(rss_kib $fpid)
sleep 10
fd2=$(ls /proc/$fpid/fd | wc -l); rss2=$(rss_kib $fpid)

wrk_reqs=$(awk '/requests in/ {print $1}' "$work/wrk.out")
wrk_non2xx=$(awk '/Non-2xx/ {print $NF}' "$work/wrk.out"); wrk_non2xx=${wrk_non2xx:-0}
wrk_err=$(awk '/Socket errors/ {gsub(/,/,""); print "connect " $4 ", read " $6 ", write " $8 ", timeout " $10}' "$work/wrk.out")
wrk_errn=$(awk '/Socket errors/ {gsub(/,/,""); print $4 + $6 + $8 + $10}' "$work/wrk.out"); wrk_errn=${wrk_errn:-0}
h2_line=$(grep '^requests:' "$work/h2load.out" || echo "requests: ?")
h2_total=$(awk '/^requests:/ {print $2}' "$work/h2load.out")
h2_fail=$(awk '/^requests:/ {print $10 + $12}' "$work/h2load.out")
metrics=$(curl -s "http://127.0.0.1:$FA/metrics")
m() { awk -v k="$1" '$1 == k {print $2}' <<<"$metrics"; }
retries=$(m 'fulcrum_http_retries_total{vs="web"}')
reload_ok=$(grep -c 'reload' "$work/fulcrum.err" || true)

echo
echo "Chaos run: ${DURATION} s, $reloads reloads (SIGHUP), member 2 killed $kills times (5 s down), member 3 resetting 10 % of connections; Fulcrum $FULCRUM"
echo
echo "| measure | value |"
echo "|---|---|"
echo "| wrk (HTTP/1.1, 20 conns): requests | ${wrk_reqs:-?} |"
echo "| wrk: non-2xx responses | $wrk_non2xx |"
echo "| wrk: socket errors | ${wrk_err:-none} |"
echo "| h2load (HTTP/2, 10 conns × 10 streams): $h2_line | |"
echo "| h2load: failed + errored | ${h2_fail:-?} of ${h2_total:-?} |"
echo "| Fulcrum retries (fulcrum_http_retries_total) | ${retries:-?} |"
echo "| descriptors before / end of load / +10 s | $fd0 / $fd1 / $fd2 |"
echo "| RSS MiB before / end of load / +10 s | $((rss0 / 1024)) / $((rss1 / 1024)) / $((rss2 / 1024)) |"
echo
echo "wrk:"; sed 's/^/    /' "$work/wrk.out"
echo "h2load:"; grep -E '^(finished|requests|status codes|traffic)' "$work/h2load.out" | sed 's/^/    /'
echo "fulcrum log lines mentioning reload: $reload_ok; errors and warnings (first 20):"
grep -iE 'warn|error' "$work/fulcrum.err" | head -20 | sed 's/^/    /'

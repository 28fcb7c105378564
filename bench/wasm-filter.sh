#!/usr/bin/env bash
# proxy-wasm filters, what they cost per request.
#
# 1. Through the proxy: one Fulcrum process (pinned alone on one CPU) with five http services in
#    front of the same nginx member ("hello, world"): no filter; the request edit made by a
#    declarative rule (`request_headers.set`); a no-op filter (only the header callbacks, each
#    returning Continue); the committed C filter (reads one field, removes one, adds one); and
#    the probe filter upper-casing the response body as it streams; and a filter built with the
#    AssemblyScript SDK (adds a request and a response field). nginx making the same edit
#    (proxy_set_header) is the peer. wrk on the other CPU; CPU time per request, req/s, p99;
#    medians of ROUNDS runs of SECS seconds.
# 2. The host alone (crates/fulcrum-wasm/examples/stream_cost.rs): header callbacks per request
#    without a proxy, and each module's compile-and-start time.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-6} CONNS=${CONNS:-32} N=${N:-200000}
need nginx; need wrk
bench_build -p fulcrum -p fulcrum-wasm --bin fulcrum --example stream_cost
ulimit -n "$(ulimit -Hn)"

M1=18611 M2=18612 ADMIN=18620 NGX=18630
NONE=18621 RULE=18622 NOOP=18623 HDR=18624 BODY=18625 SDK=18626
bench_workdir
hello_members "$M1" "$M2"

. bench/wasm-configs.sh
wasm_filter_config
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$BUILD_DIR/fulcrum" run --config "$work/fulcrum.toml" 2>"$work/fulcrum.err" &
fpid=$!; pids+=($fpid)
for p in $NONE $RULE $NOOP $HDR $BODY $SDK; do wait_port "127.0.0.1:$p"; done

cat >"$work/nginx.conf" <<CONF
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/nginx.pid;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream members { server 127.0.0.1:$M1; server 127.0.0.1:$M2; keepalive 64; }
  server {
    listen 127.0.0.1:$NGX;
    location / {
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Filter bench;
      proxy_set_header X-Internal "";
      proxy_pass http://members;
    }
  }
}
CONF
taskset -c "$BENCH_CPU_PROXY" nginx -p "$work" -c "$work/nginx.conf" 2>"$work/nginx.err" &
npid=$!; pids+=($npid)
wait_port "127.0.0.1:$NGX"
sleep 0.5
nworker=$(pgrep -P "$npid" | head -1)

declare -A cpu rps p99
rows=(none rule noop header body sdk nginx)
for r in $(seq "$ROUNDS"); do
  for row in "${rows[@]}"; do
    case $row in
      none) port=$NONE pid=$fpid extra=() ;;
      rule) port=$RULE pid=$fpid extra=(-H "x-internal: 1") ;;
      noop) port=$NOOP pid=$fpid extra=() ;;
      header) port=$HDR pid=$fpid extra=(-H "x-internal: 1") ;;
      body) port=$BODY pid=$fpid extra=(-H "x-upper: 1") ;;
      sdk) port=$SDK pid=$fpid extra=() ;;
      nginx) port=$NGX pid=$nworker extra=(-H "x-internal: 1") ;;
    esac
    read -r _ c q p < <(wrk_run "$pid" "http://127.0.0.1:$port/" "$SECS" "$CONNS" "${extra[@]}")
    cpu[$row]+="$c "; rps[$row]+="$q "; p99[$row]+="$p "
  done
done
base=$(median ${cpu[none]})
echo "## Through the proxy ($PROFILE build; medians of $ROUNDS x ${SECS}s, $CONNS connections)"
echo "| service | CPU µs/request | over no filter | req/s | p99 ms |"
echo "|---|---:|---:|---:|---:|"
for row in "${rows[@]}"; do
  c=$(median ${cpu[$row]})
  over=$(awk -v a="$c" -v b="$base" 'BEGIN { printf "%+.2f", a - b }')
  [ "$row" = nginx ] && over="(peer)"
  echo "| $row | $c | $over | $(median ${rps[$row]}) | $(median ${p99[$row]}) |"
done
echo
echo "## The host alone"
"$BUILD_DIR/examples/stream_cost" "$N"

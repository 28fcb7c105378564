#!/usr/bin/env bash
# L4 TCP proxy: Fulcrum (protocol tcp) against HAProxy (mode tcp), same loopback set-up.
# Proxy pinned alone on one CPU; wrk and two nginx backends on the other. Reports the proxy's CPU
# time per request (keep-alive clients, and a new connection per request), req/s, p99, and
# memory per idle proxied connection; medians of ROUNDS runs of SECS seconds, alternating peers.
# MEM_ONLY=1: only the memory row (no wrk rounds before it), for iterating on connection size.
# NO_THP=1: both proxies run without transparent huge pages (bench/no_thp.py), so that their
# RSS grows by 4 KiB pages rather than 2 MiB ones and the memory row resolves bytes, not KiB.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-8} CONNS=${CONNS:-50} HOLD=${HOLD:-2000}
need haproxy; need nginx; need wrk
bench_build -p fulcrum
ulimit -n "$(ulimit -Hn)"
wrap=(); [ "${NO_THP:-0}" = 1 ] && wrap=(python3 bench/no_thp.py)

bench_workdir

taskset -c "$BENCH_CPU_LOAD" nginx -p "$work" -c "$PWD/bench/nginx-backend.conf" 2>"$work/nginx.err" &
pids+=($!)
wait_port 127.0.0.1:18101

cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:18900")
[[virtual_service]]
name = "bench"
listen = "127.0.0.1:18080"
protocol = "tcp"
pool = "nginx"
[[pool]]
name = "nginx"
algorithm = "round_robin"
[[pool.member]]
address = "127.0.0.1:18101"
[[pool.member]]
address = "127.0.0.1:18102"
CONF
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "${wrap[@]}" $BUILD_DIR/fulcrum run -c "$work/fulcrum.toml" &
fulcrum_pid=$!; pids+=($fulcrum_pid)

cat >"$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 9000
defaults
  mode tcp
  timeout connect 3s
  timeout client 60s
  timeout server 60s
frontend bench
  bind 127.0.0.1:18081
  default_backend nginx
backend nginx
  balance roundrobin
  server a 127.0.0.1:18101
  server b 127.0.0.1:18102
CONF
taskset -c "$BENCH_CPU_PROXY" "${wrap[@]}" haproxy -db -f "$work/haproxy.cfg" &
haproxy_pid=$!; pids+=($haproxy_pid)
wait_port 127.0.0.1:18080; wait_port 127.0.0.1:18081

declare -A cpu rps p99
[ "${MEM_ONLY:-0}" = 1 ] && ROUNDS=0
for round in $(seq "$ROUNDS"); do
  for mode in keepalive close; do
    extra=(); [ "$mode" = close ] && extra=(-H "Connection: close")
    for peer in fulcrum haproxy; do
      if [ $peer = fulcrum ]; then pid=$fulcrum_pid port=18080; else pid=$haproxy_pid port=18081; fi
      read -r _ c r p <<<"$(wrk_run "$pid" "http://127.0.0.1:$port/" "$SECS" "$CONNS" "${extra[@]}")"
      cpu[$peer,$mode]+="$c "; rps[$peer,$mode]+="$r "; p99[$peer,$mode]+="$p "
      echo "round $round $mode $peer: cpu/req ${c}us req/s $r p99 ${p}ms" >&2
    done
  done
done

mem_f=$(mem_per_conn "$fulcrum_pid" 18080)
sleep 1
mem_h=$(mem_per_conn "$haproxy_pid" 18081)

row() {  # row LABEL MODE
  local f h
  f=$(median ${cpu[fulcrum,$2]}); h=$(median ${cpu[haproxy,$2]})
  printf '| %s: CPU per request (µs) | %s | %s | %s |\n' "$1" "$f" "$h" "$(ratio "$f" "$h")"
  f=$(median ${rps[fulcrum,$2]}); h=$(median ${rps[haproxy,$2]})
  printf '| %s: requests/s | %s | %s | %s |\n' "$1" "$f" "$h" "$(ratio "$f" "$h")"
  f=$(median ${p99[fulcrum,$2]}); h=$(median ${p99[haproxy,$2]})
  printf '| %s: p99 latency (ms) | %s | %s | %s |\n' "$1" "$f" "$h" "$(ratio "$f" "$h")"
}
echo
if [ "${MEM_ONLY:-0}" != 1 ]; then
  echo "| TCP proxy, $CONNS connections, median of $ROUNDS × ${SECS}s | Fulcrum | HAProxy $(haproxy -v | awk 'NR==1 {print $3}') | Fulcrum ÷ HAProxy |"
  echo "|---|---|---|---|"
  row "keep-alive clients" keepalive
  row "new connection per request" close
fi
printf '| memory per idle proxied connection (KiB, %s held) | %s | %s | %s |\n' "$HOLD" "$mem_f" "$mem_h" "$(ratio "$mem_f" "$mem_h")"

#!/usr/bin/env bash
# Message-based load balancing: Fulcrum (protocol message, async, answers paired by a 12-byte
# sequence id, every message scheduled on its own over 2 long connections per member) against
# HAProxy mode tcp forwarding the same bytes connection by connection — a cost reference: HAProxy
# does not look at messages, so it cannot balance them; it pays for bytes only.
#
# Proxy pinned alone on one CPU; the load generator (testkit msgload: long connections, a window
# of messages outstanding on each, 200-byte bodies with a 2-byte length) and two echoing hosts
# (testkit msgswitch) on the other. Reports the proxy's CPU time per message, messages/s and p99
# from the client's side; medians of ROUNDS runs of SECS seconds, alternating peers.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-8} SIZE=${SIZE:-200}
# Load shapes "connections×window": many POS controllers, and the seed's few long connections.
SHAPES=${SHAPES:-"50x16 2x128"}
need haproxy
bench_build -p fulcrum -p fulcrum-testkit --bins
ulimit -n "$(ulimit -Hn)"

# Ports of its own (bench/tcp.sh uses 180xx/181xx): HAProxy and Fulcrum bind with SO_REUSEPORT,
# so a port another benchmark still holds would silently share its connections.
for port in 18280 18281 18291 18292 18980; do
  if ss -Hltn "sport = :$port" | grep -q .; then echo "port $port is in use; stop what holds it" >&2; exit 1; fi
done

bench_workdir

taskset -c "$BENCH_CPU_LOAD" $BUILD_DIR/msgswitch 127.0.0.1:18291 127.0.0.1:18292 &
pids+=($!)
wait_port 127.0.0.1:18291; wait_port 127.0.0.1:18292

message_config 127.0.0.1:18280 127.0.0.1:18980 127.0.0.1:18291 127.0.0.1:18292 >"$work/fulcrum.toml"
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" $BUILD_DIR/fulcrum run -c "$work/fulcrum.toml" &
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
  bind 127.0.0.1:18281
  default_backend hosts
backend hosts
  balance roundrobin
  server a 127.0.0.1:18291
  server b 127.0.0.1:18292
CONF
taskset -c "$BENCH_CPU_PROXY" haproxy -db -f "$work/haproxy.cfg" &
haproxy_pid=$!; pids+=($haproxy_pid)
wait_port 127.0.0.1:18280; wait_port 127.0.0.1:18281

declare -A cpu rps p99
for round in $(seq "$ROUNDS"); do
  for shape in $SHAPES; do
    conns=${shape%x*} window=${shape#*x}
    for peer in fulcrum haproxy; do
      if [ $peer = fulcrum ]; then pid=$fulcrum_pid port=18280; else pid=$haproxy_pid port=18281; fi
      read -r c r p <<<"$(msg_run "$pid" "$port" "$conns" "$window")"
      cpu[$peer,$shape]+="$c "; rps[$peer,$shape]+="$r "; p99[$peer,$shape]+="$p "
      echo "round $round $shape $peer: cpu/msg ${c}us msg/s $r p99 ${p}ms" >&2
    done
  done
done

# Fulcrum balanced every message: show the per-member split it achieved.
split=$(curl -s http://127.0.0.1:18980/api/v1/pools/hosts | python3 -c 'import json,sys; print(" / ".join(str(m["requests_total"]) for m in json.load(sys.stdin)["members"]))')

row() {  # row SHAPE
  local f h conns=${1%x*} window=${1#*x}
  f=$(median ${cpu[fulcrum,$1]}); h=$(median ${cpu[haproxy,$1]})
  printf '| %s conns × %s outstanding: CPU per message (µs) | %s | %s | %s |\n' "$conns" "$window" "$f" "$h" "$(ratio "$f" "$h")"
  f=$(median ${rps[fulcrum,$1]}); h=$(median ${rps[haproxy,$1]})
  printf '| %s conns × %s outstanding: messages/s | %s | %s | %s |\n' "$conns" "$window" "$f" "$h" "$(ratio "$f" "$h")"
  f=$(median ${p99[fulcrum,$1]}); h=$(median ${p99[haproxy,$1]})
  printf '| %s conns × %s outstanding: p99 latency (ms) | %s | %s | %s |\n' "$conns" "$window" "$f" "$h" "$(ratio "$f" "$h")"
}
echo
echo "| Message LB, ${SIZE}-byte bodies, median of $ROUNDS × ${SECS}s | Fulcrum (async MBLB, per message) | HAProxy $(haproxy -v | awk 'NR==1 {print $3}') mode tcp (per connection) | Fulcrum ÷ HAProxy |"
echo "|---|---|---|---|"
for shape in $SHAPES; do row "$shape"; done
echo
echo "Messages Fulcrum sent to each member over the whole run: $split"

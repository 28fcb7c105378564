#!/usr/bin/env bash
# UDP proxy: Fulcrum (protocol udp, per_packet and session) against nginx's stream module (UDP,
# `proxy_responses 1` for per-packet and without it for sessions), same loopback set-up.
# The proxy runs alone on one CPU; a batched closed-loop load generator (fulcrum-udpload: FLOWS
# client sockets × WINDOW requests in flight) and two batched echo backends (fulcrum-udpecho)
# share the other. Reports datagrams/s through the proxy, the proxy's CPU time per datagram
# (each request and each reply counts as one), p99 round trip and losses; medians of ROUNDS
# runs of SECS seconds, alternating peers. A direct run (no proxy) shows what the generator and
# backends can do on their CPU. On a shared machine, the proxy's CPU is shared with whatever
# else runs on its core: then CPU per datagram is the figure to compare, not datagrams/s.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-6} FLOWS=${FLOWS:-64} WINDOW=${WINDOW:-4} SIZE=${SIZE:-64}
need nginx
[ -e /usr/lib/nginx/modules/ngx_stream_module.so ] || need libnginx-mod-stream /usr/share/nginx/modules-available/mod-stream.conf
bench_build -p fulcrum -p fulcrum-testkit --bins
ulimit -n "$(ulimit -Hn)"

bench_workdir

wait_udp() {  # wait_udp PORT: until something is bound to the UDP port (10 s)
  for _ in $(seq 200); do
    ss -Hlun "sport = :$1" | grep -q . && return 0
    sleep 0.05
  done
  echo "nothing listens on udp port $1" >&2; return 1
}

taskset -c "$BENCH_CPU_LOAD" $BUILD_DIR/fulcrum-udpecho 127.0.0.1:18201 127.0.0.1:18202 &
pids+=($!)
wait_udp 18201; wait_udp 18202

cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:18900")
[[virtual_service]]
name = "per-packet"
listen = "127.0.0.1:18053"
protocol = "udp"
pool = "echo"
udp_mode = "per_packet"
[[virtual_service]]
name = "session"
listen = "127.0.0.1:18054"
protocol = "udp"
pool = "echo"
udp_mode = "session"
[[pool]]
name = "echo"
algorithm = "round_robin"
[[pool.member]]
address = "127.0.0.1:18201"
[[pool.member]]
address = "127.0.0.1:18202"
CONF
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" $BUILD_DIR/fulcrum run -c "$work/fulcrum.toml" &
fulcrum_pid=$!; pids+=($fulcrum_pid)

cat >"$work/nginx.conf" <<CONF
load_module /usr/lib/nginx/modules/ngx_stream_module.so;
daemon off;
master_process off;
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
worker_rlimit_nofile 65536;
events { worker_connections 16384; }
stream {
  upstream echo { server 127.0.0.1:18201; server 127.0.0.1:18202; }
  # The same 4 MiB socket buffers Fulcrum's listening sockets ask for.
  server { listen 127.0.0.1:18063 udp rcvbuf=4m sndbuf=4m; proxy_pass echo; proxy_responses 1; proxy_timeout 30s; }
  server { listen 127.0.0.1:18064 udp rcvbuf=4m sndbuf=4m; proxy_pass echo; proxy_timeout 30s; }
}
CONF
taskset -c "$BENCH_CPU_PROXY" nginx -p "$work" -c "$work/nginx.conf" &
nginx_pid=$!; pids+=($nginx_pid)
wait_udp 18053; wait_udp 18054; wait_udp 18063; wait_udp 18064

# load PID PORT: prints "datagrams_per_s cpu_us_per_datagram p99_ms lost"
load() {
  local pid=$1 port=$2 before after out received secs p99 lost
  before=$(cpu_ticks "$pid")
  out=$(taskset -c "$BENCH_CPU_LOAD" $BUILD_DIR/fulcrum-udpload "127.0.0.1:$port" "$FLOWS" "$WINDOW" "$SECS" "$SIZE")
  after=$(cpu_ticks "$pid")
  received=$(sed -E 's/.*received=([0-9]+).*/\1/' <<<"$out")
  secs=$(sed -E 's/.*secs=([0-9.]+).*/\1/' <<<"$out")
  p99=$(sed -E 's/.*p99_us=([0-9]+).*/\1/' <<<"$out")
  lost=$(sed -E 's/.*lost=([0-9]+).*/\1/' <<<"$out")
  awk -v r="$received" -v s="$secs" -v t=$((after - before)) -v hz="$CLK_TCK" -v p="$p99" -v l="$lost" \
    'BEGIN { d = 2 * r; printf "%.0f %.2f %.3f %d\n", d / s, (d > 0 ? t / hz * 1e6 / d : 0), p / 1000, l }'
}

direct=$(taskset -c "$BENCH_CPU_LOAD" $BUILD_DIR/fulcrum-udpload 127.0.0.1:18201 "$FLOWS" "$WINDOW" "$SECS" "$SIZE")
echo "direct to one backend (no proxy): $direct" >&2

declare -A rate cpu p99 lost
for round in $(seq "$ROUNDS"); do
  for mode in per_packet session; do
    for peer in fulcrum nginx; do
      case $peer/$mode in
        fulcrum/per_packet) pid=$fulcrum_pid port=18053 ;;
        fulcrum/session) pid=$fulcrum_pid port=18054 ;;
        nginx/per_packet) pid=$nginx_pid port=18063 ;;
        nginx/session) pid=$nginx_pid port=18064 ;;
      esac
      read -r r c p l <<<"$(load "$pid" "$port")"
      rate[$peer,$mode]+="$r "; cpu[$peer,$mode]+="$c "; p99[$peer,$mode]+="$p "; lost[$peer,$mode]+="$l "
      echo "round $round $mode $peer: ${r} datagrams/s, ${c}us CPU/datagram, p99 ${p}ms, lost $l" >&2
    done
  done
done

HOLD=${HOLD:-4000}
mem_per_flow() {  # mem_per_flow PID PORT: KiB of RSS per idle UDP session flow
  local pid=$1 port=$2 before after
  before=$(rss_kib "$pid")
  coproc HOLDER { python3 bench/hold_udp_flows.py 127.0.0.1 "$port" "$HOLD"; }
  read -r _ answered <&"${HOLDER[0]}"
  echo "memory: $answered of $HOLD flows answered on port $port" >&2
  sleep 1
  after=$(rss_kib "$pid")
  echo >&"${HOLDER[1]}"; wait "$HOLDER_PID" 2>/dev/null || true
  awk -v a="$after" -v b="$before" -v n="$HOLD" 'BEGIN { printf "%.2f", (a - b) / n }'
}
mem_f=$(mem_per_flow "$fulcrum_pid" 18054)
mem_n=$(mem_per_flow "$nginx_pid" 18064)

row() {  # row LABEL MODE
  local f n
  f=$(median ${cpu[fulcrum,$2]}); n=$(median ${cpu[nginx,$2]})
  printf '| %s: CPU per datagram (µs) | %s | %s | %s |\n' "$1" "$f" "$n" "$(ratio "$f" "$n")"
  f=$(median ${rate[fulcrum,$2]}); n=$(median ${rate[nginx,$2]})
  printf '| %s: datagrams/s through the proxy | %s | %s | %s |\n' "$1" "$f" "$n" "$(ratio "$f" "$n")"
  f=$(median ${p99[fulcrum,$2]}); n=$(median ${p99[nginx,$2]})
  printf '| %s: p99 round trip (ms) | %s | %s | %s |\n' "$1" "$f" "$n" "$(ratio "$f" "$n")"
  f=$(median ${lost[fulcrum,$2]}); n=$(median ${lost[nginx,$2]})
  printf '| %s: requests lost per run | %s | %s | |\n' "$1" "$f" "$n"
}
echo
echo "| UDP proxy, $FLOWS flows × $WINDOW in flight, $SIZE-byte datagrams, median of $ROUNDS × ${SECS}s | Fulcrum | nginx $(nginx -v 2>&1 | sed 's|.*/||') stream | Fulcrum ÷ nginx |"
echo "|---|---|---|---|"
row "per-packet (nginx: proxy_responses 1)" per_packet
row "session" session
printf '| memory per idle session flow (KiB, %s held; kernel socket memory not included) | %s | %s | %s |\n' "$HOLD" "$mem_f" "$mem_n" "$(ratio "$mem_f" "$mem_n")"
echo
echo "Direct to one echo backend, no proxy: $direct"

#!/usr/bin/env bash
# HTTPS termination: Fulcrum (protocol https, rustls with ring) against HAProxy (Debian build,
# OpenSSL), both with the same ECDSA P-256 certificate, in front of the same two nginx members
# (plain HTTP, member connections reused). Pinned like bench/http.sh: each proxy alone on one CPU,
# wrk and the members on the other. Reports the proxy's CPU time per request with keep-alive
# HTTPS clients, req/s and p99; and the CPU time per full handshake with a new TLS connection
# per request (session tickets and caches off on both sides, so nothing resumes). Medians of
# ROUNDS runs of SECS seconds, alternating peers.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-8} CONNS=${CONNS:-50}
need haproxy; need nginx; need wrk; need openssl
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
ulimit -n "$(ulimit -Hn)"

# Ports of their own, so this can run beside the other benchmarks.
M1=18411 M2=18412 F=18443 H=18444 FA=18490
bench_workdir

# One self-signed ECDSA P-256 certificate for both proxies.
bench_cert "$work"

hello_members "$M1" "$M2"

cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:$FA")
[[virtual_service]]
name = "bench"
listen = "127.0.0.1:$F"
protocol = "https"
pool = "nginx"
tls = [{ cert = "$work/site.crt", key = "$work/site.key" }]
tls_options = { session_tickets = false, session_cache = 0 }
forward_headers = { x_forwarded_host = false, via = false }
[[pool]]
name = "nginx"
algorithm = "round_robin"
reuse = "safe"
[[pool.member]]
address = "127.0.0.1:$M1"
[[pool.member]]
address = "127.0.0.1:$M2"
CONF
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/fulcrum.toml" &
fulcrum_pid=$!; pids+=($fulcrum_pid)

cat >"$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 9000
  tune.ssl.cachesize 0
  ssl-default-bind-options no-tls-tickets
defaults
  mode http
  timeout connect 3s
  timeout client 60s
  timeout server 60s
  option forwardfor
  http-reuse safe
frontend bench
  bind 127.0.0.1:$H ssl crt $work/site.pem alpn http/1.1
  http-request set-header X-Forwarded-Proto https
  default_backend nginx
backend nginx
  balance roundrobin
  server a 127.0.0.1:$M1
  server b 127.0.0.1:$M2
CONF
taskset -c "$BENCH_CPU_PROXY" haproxy -db -f "$work/haproxy.cfg" &
haproxy_pid=$!; pids+=($haproxy_pid)
for p in $F $H; do wait_port 127.0.0.1:$p; done

# What the clients negotiate with each proxy (printed for the record).
for p in $F $H; do
  echo | openssl s_client -connect 127.0.0.1:$p -servername bench.test 2>/dev/null | awk -v p=$p '/^New,/ {print "port " p ": " $0}' >&2
done

peers=(fulcrum haproxy)
pid_of() { case $1 in fulcrum) echo $fulcrum_pid;; haproxy) echo $haproxy_pid;; esac; }
port_of() { case $1 in fulcrum) echo $F;; haproxy) echo $H;; esac; }

declare -A cpu rps p99
for round in $(seq "$ROUNDS"); do
  for mode in keepalive handshake; do
    extra=(); [ "$mode" = handshake ] && extra=(-H "Connection: close")
    for peer in "${peers[@]}"; do
      read -r _ c r p <<<"$(wrk_run "$(pid_of $peer)" "https://127.0.0.1:$(port_of $peer)/" "$SECS" "$CONNS" "${extra[@]}")"
      cpu[$peer,$mode]+="$c "; rps[$peer,$mode]+="$r "; p99[$peer,$mode]+="$p "
      echo "round $round $mode $peer: cpu/req ${c}us req/s $r p99 ${p}ms" >&2
    done
  done
done

# Every handshake of the "handshake" runs must have been a full one.
curl -s "http://127.0.0.1:$FA/metrics" | grep '^fulcrum_tls_handshakes_total' >&2

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
echo "| HTTPS termination, ECDSA P-256, $CONNS connections, median of $ROUNDS × ${SECS}s | Fulcrum (rustls, ring) | HAProxy $(haproxy -v | awk 'NR==1 {print $3}') ($(openssl version | awk '{print $1, $2}')) | Fulcrum ÷ HAProxy |"
echo "|---|---|---|---|"
row "keep-alive HTTPS requests" keepalive
row "full handshake per request (new TLS connection, no resumption)" handshake

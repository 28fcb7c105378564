#!/usr/bin/env bash
# The two TLS paths bench/https.sh leaves out, Fulcrum against HAProxy (Debian build, OpenSSL) in
# the same run, pinned like the other benches (each proxy alone on one CPU; clients and members on
# the other):
#  - resumed handshakes: a new TLS connection per request that resumes the session of the one
#    before (TLS 1.3 session tickets; `openssl s_time -reuse`, one connection at a time), against
#    full handshakes with the same client (`s_time -new`). CPU time of the proxy per connection.
#  - re-encryption: plain HTTP clients (wrk, keep-alive, and a new connection per request), TLS
#    from the proxy to two nginx members (certificate verified against the test CA, SNI sent,
#    member connections reused). CPU time per request, req/s, p99.
# Medians of ROUNDS runs of SECS seconds, alternating the proxies.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-8} CONNS=${CONNS:-50}
need haproxy; need nginx; need wrk; need openssl
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
ulimit -n "$(ulimit -Hn)"

# Ports of their own, so this can run beside the other benchmarks.
M1=18511 M2=18512 FT=18543 HT=18544 FR=18545 HR=18546 FA=18590
bench_workdir

# A CA and a certificate it signs (a verifying client, rustls or OpenSSL, refuses a CA
# certificate presented as the server's own).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -keyout "$work/ca.key" -out "$work/ca.crt" -subj /CN=bench-ca \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$work/site.key" -out "$work/site.csr" -subj /CN=bench.test 2>/dev/null
printf 'subjectAltName=DNS:bench.test,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >"$work/site.ext"
openssl x509 -req -in "$work/site.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
  -days 2 -extfile "$work/site.ext" -out "$work/site.crt" 2>/dev/null
cat "$work/site.crt" "$work/site.key" >"$work/site.pem"

# Members speak TLS on M1/M2 (for the re-encryption rows) and plain HTTP on M1+100/M2+100 (behind
# the terminating listeners of the resumption rows).
P1=$((M1 + 100)) P2=$((M2 + 100))
cat >"$work/members.conf" <<CONF
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/members.pid;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  ssl_certificate $work/site.crt;
  ssl_certificate_key $work/site.key;
  ssl_session_cache shared:members:1m;
  server { listen 127.0.0.1:$M1 ssl reuseport; location / { return 200 "hello, world\n"; } }
  server { listen 127.0.0.1:$M2 ssl reuseport; location / { return 200 "hello, world\n"; } }
  server { listen 127.0.0.1:$P1 reuseport; location / { return 200 "hello, world\n"; } }
  server { listen 127.0.0.1:$P2 reuseport; location / { return 200 "hello, world\n"; } }
}
CONF
taskset -c "$BENCH_CPU_LOAD" nginx -p "$work" -c "$work/members.conf" 2>"$work/members.err" &
pids+=($!)
wait_port 127.0.0.1:$M1
wait_port 127.0.0.1:$P1

cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:$FA")
[[virtual_service]]
name = "terminate"
listen = "127.0.0.1:$FT"
protocol = "https"
pool = "plain"
tls = [{ cert = "$work/site.crt", key = "$work/site.key" }]
forward_headers = { x_forwarded_host = false, via = false }
[[virtual_service]]
name = "reencrypt"
listen = "127.0.0.1:$FR"
protocol = "http"
pool = "tls"
forward_headers = { x_forwarded_host = false, via = false }
[[pool]]
name = "plain"
algorithm = "round_robin"
reuse = "safe"
[[pool.member]]
address = "127.0.0.1:$P1"
[[pool.member]]
address = "127.0.0.1:$P2"
[[pool]]
name = "tls"
algorithm = "round_robin"
reuse = "safe"
tls = { ca = "$work/ca.crt", sni = "bench.test" }
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
defaults
  mode http
  timeout connect 3s
  timeout client 60s
  timeout server 60s
  option forwardfor
  http-reuse safe
frontend terminate
  bind 127.0.0.1:$HT ssl crt $work/site.pem alpn http/1.1
  http-request set-header X-Forwarded-Proto https
  default_backend plain
frontend reencrypt
  bind 127.0.0.1:$HR
  default_backend tls
backend plain
  balance roundrobin
  server a 127.0.0.1:$P1
  server b 127.0.0.1:$P2
backend tls
  balance roundrobin
  server a 127.0.0.1:$M1 ssl verify required ca-file $work/ca.crt sni str(bench.test)
  server b 127.0.0.1:$M2 ssl verify required ca-file $work/ca.crt sni str(bench.test)
CONF
taskset -c "$BENCH_CPU_PROXY" haproxy -db -f "$work/haproxy.cfg" &
haproxy_pid=$!; pids+=($haproxy_pid)
for p in $FT $HT $FR $HR; do wait_port 127.0.0.1:$p; done

peers=(fulcrum haproxy)
pid_of() { case $1 in fulcrum) echo $fulcrum_pid;; haproxy) echo $haproxy_pid;; esac; }
tls_port() { case $1 in fulcrum) echo $FT;; haproxy) echo $HT;; esac; }
reenc_port() { case $1 in fulcrum) echo $FR;; haproxy) echo $HR;; esac; }

# s_time_run PID PORT -new|-reuse: "connections cpu_us_per_connection", with the share of
# resumed connections checked from s_time's own report.
s_time_run() {
  local pid=$1 port=$2 how=$3 before after out conns
  before=$(cpu_ticks "$pid")
  out=$(taskset -c "$BENCH_CPU_LOAD" openssl s_time -connect "127.0.0.1:$port" -www / "$how" \
    -time "$SECS" 2>&1)
  after=$(cpu_ticks "$pid")
  conns=$(awk '/connections in [0-9.]+ real seconds/ {n=$1} END {print n+0}' <<<"$out")
  awk -v t=$((after - before)) -v hz="$CLK_TCK" -v n="$conns" \
    'BEGIN { if (n > 0) printf "%d %.2f\n", n, t / hz * 1e6 / n; else print "0 nan" }'
}

# Whether each proxy really resumes: a second connection with the first's session.
for peer in "${peers[@]}"; do
  port=$(tls_port "$peer")
  openssl s_client -connect "127.0.0.1:$port" -sess_out "$work/$peer.sess" </dev/null >/dev/null 2>&1 || true
  how=$(openssl s_client -connect "127.0.0.1:$port" -sess_in "$work/$peer.sess" </dev/null 2>/dev/null \
    | awk '/^(New|Reused),/ {print $1}' || true)
  echo "$peer: second connection ${how:-?}" >&2
done

declare -A cpu rps p99
for round in $(seq "$ROUNDS"); do
  for peer in "${peers[@]}"; do
    for how in -new -reuse; do
      read -r n c <<<"$(s_time_run "$(pid_of "$peer")" "$(tls_port "$peer")" "$how")"
      cpu[$peer,$how]+="$c "; rps[$peer,$how]+="$(awk -v n="$n" -v s="$SECS" 'BEGIN {printf "%.1f", n / s}') "
      echo "round $round $peer s_time $how: $n connections, cpu/conn ${c}us" >&2
    done
    for mode in keepalive close; do
      extra=(); [ "$mode" = close ] && extra=(-H "Connection: close")
      read -r _ c r p <<<"$(wrk_run "$(pid_of "$peer")" "http://127.0.0.1:$(reenc_port "$peer")/" "$SECS" "$CONNS" "${extra[@]}")"
      cpu[$peer,$mode]+="$c "; rps[$peer,$mode]+="$r "; p99[$peer,$mode]+="$p "
      echo "round $round $peer re-encrypt $mode: cpu/req ${c}us req/s $r p99 ${p}ms" >&2
    done
  done
done

curl -s "http://127.0.0.1:$FA/metrics" | grep -E '^fulcrum_tls_(handshakes|resumptions)' >&2 || true

row() {  # row LABEL KEY ARRAY
  local -n arr=$3
  local f h
  f=$(median ${arr[fulcrum,$2]}); h=$(median ${arr[haproxy,$2]})
  printf '| %s | %s | %s | %s |\n' "$1" "$f" "$h" "$(ratio "$f" "$h")"
}
echo
echo "| TLS paths, ECDSA P-256, median of $ROUNDS × ${SECS}s | Fulcrum (rustls, ring) | HAProxy $(haproxy -v | awk 'NR==1 {print $3}') ($(openssl version | awk '{print $1, $2}')) | Fulcrum ÷ HAProxy |"
echo "|---|---|---|---|"
row "full handshake per connection, one client (s_time -new): CPU per connection (µs)" -new cpu
row "resumed handshake per connection, one client (s_time -reuse): CPU per connection (µs)" -reuse cpu
row "resumed handshakes: connections/s" -reuse rps
row "re-encryption, $CONNS keep-alive clients: CPU per request (µs)" keepalive cpu
row "re-encryption, keep-alive: requests/s" keepalive rps
row "re-encryption, keep-alive: p99 latency (ms)" keepalive p99
row "re-encryption, new client connection per request: CPU per request (µs)" close cpu
row "re-encryption, new client connection per request: requests/s" close rps
row "re-encryption, new client connection per request: p99 latency (ms)" close p99

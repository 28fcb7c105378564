#!/usr/bin/env bash
# HTTP/2 clients: h2load against Fulcrum (https, ALPN h2), HAProxy (`alpn h2`) and nginx
# (`listen ... ssl http2`), each terminating TLS + HTTP/2 and forwarding HTTP/1.1 to the same
# two nginx members over reused connections. Pinned like bench/http.sh: each proxy alone on one
# CPU, h2load and the members on the other. CLIENTS connections with STREAMS concurrent streams
# each; the TLS handshakes happen once per connection, so this measures the HTTP/2 path.
# Reports the proxy's CPU time per request, req/s and the mean request time h2load reports (it
# prints no percentiles). Medians of ROUNDS runs of SECS seconds, alternating the proxies.
# FULCRUM_ALT=path adds a second Fulcrum binary to the same rounds (another build, e.g. the
# BOLT-optimized one from scripts/release-bolt.sh), reported on a row of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-8} CLIENTS=${CLIENTS:-50} STREAMS=${STREAMS:-10}
need haproxy; need nginx; need nghttp2-client h2load; need openssl
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
ulimit -n "$(ulimit -Hn)"

M1=18611 M2=18612 F=18643 H=18644 N=18645 FA=18690 FB=18646 FA2=18693
bench_workdir

bench_cert "$work"

hello_members "$M1" "$M2"

. bench/h2-configs.sh
h2_configs
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/fulcrum.toml" &
fulcrum_pid=$!; pids+=($fulcrum_pid)

if [ -n "${FULCRUM_ALT:-}" ]; then
  sed "s/:$F\"/:$FB\"/; s/:$FA\"/:$FA2\"/" "$work/fulcrum.toml" >"$work/fulcrum-alt.toml"
  RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$FULCRUM_ALT" run -c "$work/fulcrum-alt.toml" &
  alt_pid=$!; pids+=($alt_pid)
  wait_port 127.0.0.1:$FB
fi

taskset -c "$BENCH_CPU_PROXY" haproxy -db -f "$work/haproxy.cfg" &
haproxy_pid=$!; pids+=($haproxy_pid)

cat >"$work/proxy.conf" <<CONF
master_process off;
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/proxy.pid;
events { worker_connections 9000; }
http {
  access_log off;
  keepalive_requests 1000000;
  http2_max_requests 1000000;
  upstream members { server 127.0.0.1:$M1; server 127.0.0.1:$M2; keepalive 64; }
  server {
    listen 127.0.0.1:$N ssl http2;
    ssl_certificate $work/site.crt;
    ssl_certificate_key $work/site.key;
    http2_max_concurrent_streams 128;
    location / {
      proxy_pass http://members;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
CONF
taskset -c "$BENCH_CPU_PROXY" nginx -p "$work" -c "$work/proxy.conf" 2>"$work/proxy.err" &
nginx_pid=$!; pids+=($nginx_pid)
for p in $F $H $N; do wait_port 127.0.0.1:$p; done

peers=(fulcrum haproxy nginx)
[ -n "${FULCRUM_ALT:-}" ] && peers+=(alt)
pid_of() { case $1 in fulcrum) echo $fulcrum_pid;; haproxy) echo $haproxy_pid;; nginx) echo $nginx_pid;; alt) echo $alt_pid;; esac; }
port_of() { case $1 in fulcrum) echo $F;; haproxy) echo $H;; nginx) echo $N;; alt) echo $FB;; esac; }

# h2load_run PID PORT: "requests cpu_us_per_request req_per_s mean_ms"; fails the run when a
# request failed or the protocol negotiated is not h2.
h2load_run() {
  local pid=$1 port=$2 before after out reqs ok rps mean
  before=$(cpu_ticks "$pid")
  out=$(taskset -c "$BENCH_CPU_LOAD" h2load -c "$CLIENTS" -m "$STREAMS" -D "$SECS" \
    "https://127.0.0.1:$port/" 2>&1)
  after=$(cpu_ticks "$pid")
  grep -q "Application protocol: h2" <<<"$out" || { echo "h2load did not negotiate h2 on $port" >&2; echo "$out" >&2; exit 1; }
  reqs=$(awk '/^requests:/ {print $8}' <<<"$out")   # "N succeeded"
  ok=$(awk '/^requests:/ {print $10}' <<<"$out")    # "N failed"
  [ "${ok:-1}" = 0 ] || echo "h2load on $port: $ok requests failed" >&2
  rps=$(awk '/^finished in/ {gsub(",", "", $4); print $4}' <<<"$out")
  mean=$(awk '/^time for request:/ {v=$6; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}' <<<"$out")
  awk -v t=$((after - before)) -v hz="$CLK_TCK" -v r="$reqs" -v rps="$rps" -v m="$mean" \
    'BEGIN { if (r > 0) printf "%d %.2f %s %s\n", r, t / hz * 1e6 / r, rps, m; else print "0 nan nan nan" }'
}

declare -A cpu rps lat
for round in $(seq "$ROUNDS"); do
  for peer in "${peers[@]}"; do
    read -r n c r m <<<"$(h2load_run "$(pid_of "$peer")" "$(port_of "$peer")")"
    cpu[$peer]+="$c "; rps[$peer]+="$r "; lat[$peer]+="$m "
    echo "round $round $peer: $n requests, cpu/req ${c}us req/s $r mean ${m}ms" >&2
  done
done

row() {  # row LABEL ARRAY LOWER_IS_BETTER [PEER: fulcrum or alt]
  local -n arr=$2
  local f h n best
  f=$(median ${arr[${4:-fulcrum}]}); h=$(median ${arr[haproxy]}); n=$(median ${arr[nginx]})
  if [ "$3" = 1 ]; then best=$(printf '%s\n' "$h" "$n" | sort -g | head -1); else best=$(printf '%s\n' "$h" "$n" | sort -g | tail -1); fi
  printf '| %s | %s | %s | %s | %s |\n' "$1" "$f" "$h" "$n" "$(ratio "$f" "$best")"
}
echo
echo "| HTTP/2 over TLS, h2load $CLIENTS connections × $STREAMS streams, median of $ROUNDS × ${SECS}s | Fulcrum | HAProxy $(haproxy -v | awk 'NR==1 {print $3}') | nginx $(nginx -v 2>&1 | awk -F/ '{print $2}') | Fulcrum ÷ better peer |"
echo "|---|---|---|---|---|"
row "CPU per request (µs)" cpu 1
row "requests/s" rps 0
row "mean request time (ms)" lat 1
if [ -n "${FULCRUM_ALT:-}" ]; then
  echo
  echo "FULCRUM_ALT ($FULCRUM_ALT) in the same rounds, in the Fulcrum column:"
  row "CPU per request (µs)" cpu 1 alt
  row "requests/s" rps 0 alt
  row "mean request time (ms)" lat 1 alt
  echo "Fulcrum ÷ FULCRUM_ALT, CPU per request: $(ratio "$(median ${cpu[fulcrum]})" "$(median ${cpu[alt]})")"
fi

#!/usr/bin/env bash
# HTTP cache hits: Fulcrum (virtual_service.cache) against nginx proxy_cache serving the same hot
# object, same loopback set-up as bench/http.sh: each proxy pinned alone on one CPU, wrk and the
# nginx member on the other. The member marks the objects cacheable for an hour
# (Cache-Control: max-age=3600); after a warm-up request every request of the run is a cache
# hit. Objects of 4 KiB and 64 KiB, keep-alive clients. Reports the proxy's CPU time per
# request, req/s and p99, medians of ROUNDS runs of SECS seconds, alternating peers; and how
# many requests reached the member (should be one per object and proxy).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-8} CONNS=${CONNS:-50}
need nginx; need wrk
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
ulimit -n "$(ulimit -Hn)"

# Ports of their own, so this can run beside the other benchmarks.
M=18311 F=18380 N=18382 FA=18390
bench_workdir

head -c 4096 /dev/urandom | base64 -w0 | head -c 4096 >"$work/4k"
head -c 65536 /dev/urandom | base64 -w0 | head -c 65536 >"$work/64k"
mkdir -p "$work/www" && mv "$work/4k" "$work/64k" "$work/www/"
chmod -R a+rX "$work"   # nginx workers (nobody) read the objects

cat >"$work/member.conf" <<CONF
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/member.pid;
events { worker_connections 8192; }
http {
  access_log $work/member.log;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$M reuseport;
    root $work/www;
    location / { add_header Cache-Control "max-age=3600"; etag on; }
  }
}
CONF
taskset -c "$BENCH_CPU_LOAD" nginx -p "$work" -c "$work/member.conf" 2>"$work/member.err" &
pids+=($!)
wait_port 127.0.0.1:$M

cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:$FA")
[[virtual_service]]
name = "bench"
listen = "127.0.0.1:$F"
protocol = "http"
pool = "member"
forward_headers = { x_forwarded_host = false, via = false }
cache = { size = "256MiB", max_object = "8MiB" }
[[pool]]
name = "member"
[[pool.member]]
address = "127.0.0.1:$M"
CONF
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/fulcrum.toml" &
fulcrum_pid=$!; pids+=($fulcrum_pid)

mkdir -p "$work/nginx-cache"
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
  proxy_cache_path $work/nginx-cache levels=1:2 keys_zone=hot:10m max_size=256m inactive=1h use_temp_path=off;
  upstream member { server 127.0.0.1:$M; keepalive 16; }
  server {
    listen 127.0.0.1:$N;
    location / {
      proxy_pass http://member;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_cache hot;
      proxy_cache_key \$scheme\$host\$request_uri;
      add_header Cache-Status \$upstream_cache_status;
    }
  }
}
CONF
taskset -c "$BENCH_CPU_PROXY" nginx -p "$work" -c "$work/proxy.conf" 2>"$work/proxy.err" &
nginx_pid=$!; pids+=($nginx_pid)
for p in $F $N; do wait_port 127.0.0.1:$p; done

pid_of() { case $1 in fulcrum) echo $fulcrum_pid;; nginx) echo $nginx_pid;; esac; }
port_of() { case $1 in fulcrum) echo $F;; nginx) echo $N;; esac; }
peers=(fulcrum nginx)
objects=(4k 64k)

# Warm up: store each object in both caches and check the second answer is a hit.
for peer in "${peers[@]}"; do
  for o in "${objects[@]}"; do
    curl -s -o /dev/null "http://127.0.0.1:$(port_of $peer)/$o"
    status=$(curl -s -o /dev/null -D - "http://127.0.0.1:$(port_of $peer)/$o" | tr -d '\r' | awk -F': ' 'tolower($1) == "cache-status" {print $2}')
    echo "warm-up $peer /$o: $status" >&2
    case $status in HIT|"fulcrum; hit") ;; *) echo "no cache hit from $peer for /$o" >&2; exit 1;; esac
  done
done
warm=$(wc -l <"$work/member.log")

declare -A cpu rps p99
for round in $(seq "$ROUNDS"); do
  for o in "${objects[@]}"; do
    for peer in "${peers[@]}"; do
      read -r _ c r p <<<"$(wrk_run "$(pid_of $peer)" "http://127.0.0.1:$(port_of $peer)/$o" "$SECS" "$CONNS")"
      cpu[$peer,$o]+="$c "; rps[$peer,$o]+="$r "; p99[$peer,$o]+="$p "
      echo "round $round /$o $peer: cpu/req ${c}us req/s $r p99 ${p}ms" >&2
    done
  done
done
member_requests=$(($(wc -l <"$work/member.log") - warm))

row() {  # row OBJECT
  local f n
  f=$(median ${cpu[fulcrum,$1]}); n=$(median ${cpu[nginx,$1]})
  printf '| %s hit: CPU per request (µs) | %s | %s | %s |\n' "$1" "$f" "$n" "$(ratio "$f" "$n")"
  f=$(median ${rps[fulcrum,$1]}); n=$(median ${rps[nginx,$1]})
  printf '| %s hit: requests/s | %s | %s | %s |\n' "$1" "$f" "$n" "$(ratio "$f" "$n")"
  f=$(median ${p99[fulcrum,$1]}); n=$(median ${p99[nginx,$1]})
  printf '| %s hit: p99 latency (ms) | %s | %s | %s |\n' "$1" "$f" "$n" "$(ratio "$f" "$n")"
}
echo
echo "| Cache hits, $CONNS keep-alive connections, median of $ROUNDS × ${SECS}s | Fulcrum | nginx $(nginx -v 2>&1 | sed 's|.*/||') proxy_cache | Fulcrum ÷ nginx |"
echo "|---|---|---|---|"
for o in "${objects[@]}"; do row "$o"; done
echo
echo "Requests that reached the member during the runs: $member_requests (after the warm-up misses, every request is a hit)."

#!/usr/bin/env bash
# L7 HTTP proxy: Fulcrum (protocol http) against HAProxy (mode http, http-reuse safe) and nginx
# (upstream keepalive), same loopback set-up as bench/tcp.sh: each proxy pinned alone on one CPU,
# wrk and two nginx members on the other. All three add X-Forwarded-For and X-Forwarded-Proto and
# reuse member connections. Reports the proxy's CPU time per request (keep-alive clients, and a
# new connection per request), req/s, p99, memory per idle client connection, and Fulcrum's
# member connections opened per request; medians of ROUNDS runs of SECS seconds, alternating
# peers. Also runs Fulcrum with 300 content-switching rules (the match near the end) and, with
# HYPER=1, the plain hyper proxy measured as a baseline (crates/fulcrum-http/examples).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-8} CONNS=${CONNS:-50} HOLD=${HOLD:-2000} HYPER=${HYPER:-1}
need haproxy; need nginx; need wrk
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}   # another build of the binary, for quick comparisons
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
[ "$HYPER" = 1 ] && bench_build -p fulcrum-http --example hyper_baseline
ulimit -n "$(ulimit -Hn)"

# Ports of their own, so this can run beside bench/tcp.sh.
M1=18211 M2=18212 F=18280 H=18281 N=18282 R=18283 Y=18284 FA=18290 RA=18291
bench_workdir

hello_members "$M1" "$M2"

fulcrum_conf() {  # fulcrum_conf PORT ADMIN RULES
  cat <<CONF
$(fulcrum_head "127.0.0.1:$2")
[[virtual_service]]
name = "bench"
listen = "127.0.0.1:$1"
protocol = "http"
pool = "nginx"
forward_headers = { x_forwarded_host = false, via = false }
CONF
  if [ "$3" -gt 0 ]; then
    for i in $(seq 0 $(($3 - 2))); do
      case $((i % 3)) in
        0) printf '[[virtual_service.rule]]\nhost = "h%d.example.com"\npath_prefix = "/app%d/"\npool = "nginx"\n' "$i" "$i" ;;
        1) printf '[[virtual_service.rule]]\npath_prefix = "/p%d/"\nmethod = ["GET", "POST"]\npool = "nginx"\n' "$i" ;;
        2) printf '[[virtual_service.rule]]\npath_regex = "^/r%d/[0-9]+$"\npool = "nginx"\n' "$i" ;;
      esac
    done
    printf '[[virtual_service.rule]]\nname = "last"\nhost = "127.0.0.1"\npath_prefix = "/"\npool = "nginx"\n'
  fi
  cat <<CONF
[[pool]]
name = "nginx"
algorithm = "round_robin"
reuse = "safe"
[[pool.member]]
address = "127.0.0.1:$M1"
[[pool.member]]
address = "127.0.0.1:$M2"
CONF
}
fulcrum_conf $F $FA 0 >"$work/fulcrum.toml"
fulcrum_conf $R $RA 300 >"$work/rules.toml"
"$FULCRUM" check -c "$work/rules.toml" >/dev/null
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/fulcrum.toml" &
fulcrum_pid=$!; pids+=($fulcrum_pid)
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/rules.toml" &
rules_pid=$!; pids+=($rules_pid)

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
frontend bench
  bind 127.0.0.1:$H
  http-request set-header X-Forwarded-Proto http
  default_backend nginx
backend nginx
  balance roundrobin
  server a 127.0.0.1:$M1
  server b 127.0.0.1:$M2
CONF
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
  upstream members { server 127.0.0.1:$M1; server 127.0.0.1:$M2; keepalive 64; }
  server {
    listen 127.0.0.1:$N;
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

peers=(fulcrum haproxy nginx rules)
if [ "$HYPER" = 1 ]; then
  taskset -c "$BENCH_CPU_PROXY" $BUILD_DIR/examples/hyper_baseline 127.0.0.1:$Y 127.0.0.1:$M1 127.0.0.1:$M2 &
  hyper_pid=$!; pids+=($hyper_pid); peers+=(hyper)
fi
for p in $F $H $N $R; do wait_port 127.0.0.1:$p; done
[ "$HYPER" = 1 ] && wait_port 127.0.0.1:$Y

pid_of() { case $1 in fulcrum) echo $fulcrum_pid;; haproxy) echo $haproxy_pid;; nginx) echo $nginx_pid;; rules) echo $rules_pid;; hyper) echo $hyper_pid;; esac; }
port_of() { case $1 in fulcrum) echo $F;; haproxy) echo $H;; nginx) echo $N;; rules) echo $R;; hyper) echo $Y;; esac; }

declare -A cpu rps p99
for round in $(seq "$ROUNDS"); do
  for mode in keepalive close; do
    extra=(); [ "$mode" = close ] && extra=(-H "Connection: close")
    for peer in "${peers[@]}"; do
      read -r _ c r p <<<"$(wrk_run "$(pid_of $peer)" "http://127.0.0.1:$(port_of $peer)/" "$SECS" "$CONNS" "${extra[@]}")"
      cpu[$peer,$mode]+="$c "; rps[$peer,$mode]+="$r "; p99[$peer,$mode]+="$p "
      echo "round $round $mode $peer: cpu/req ${c}us req/s $r p99 ${p}ms" >&2
    done
  done
done

# Short client connections onto long member connections: what the members saw.
reuse=$(curl -s "http://127.0.0.1:$FA/api/v1/pools/nginx" | python3 -c 'import json,sys; p=json.load(sys.stdin); print(p["requests_total"], p["connections_total"])')

declare -A mem
for peer in fulcrum haproxy nginx; do
  mem[$peer]=$(mem_per_conn "$(pid_of $peer)" "$(port_of $peer)"); sleep 1
done

best() { awk -v a="$1" -v b="$2" 'BEGIN { print (a < b) ? a : b }'; }
row() {  # row LABEL MODE
  local f h n r y
  f=$(median ${cpu[fulcrum,$2]}); h=$(median ${cpu[haproxy,$2]}); n=$(median ${cpu[nginx,$2]}); r=$(median ${cpu[rules,$2]})
  y=n/a; [ "$HYPER" = 1 ] && y=$(median ${cpu[hyper,$2]})
  printf '| %s: CPU per request (µs) | %s | %s | %s | %s | %s | %s |\n' "$1" "$f" "$h" "$n" "$(ratio "$f" "$(best "$h" "$n")")" "$r" "$y"
  f=$(median ${rps[fulcrum,$2]}); h=$(median ${rps[haproxy,$2]}); n=$(median ${rps[nginx,$2]}); r=$(median ${rps[rules,$2]})
  y=n/a; [ "$HYPER" = 1 ] && y=$(median ${rps[hyper,$2]})
  printf '| %s: requests/s | %s | %s | %s | %s | %s | %s |\n' "$1" "$f" "$h" "$n" "$(ratio "$f" "$(awk -v a="$h" -v b="$n" 'BEGIN { print (a > b) ? a : b }')")" "$r" "$y"
  f=$(median ${p99[fulcrum,$2]}); h=$(median ${p99[haproxy,$2]}); n=$(median ${p99[nginx,$2]}); r=$(median ${p99[rules,$2]})
  y=n/a; [ "$HYPER" = 1 ] && y=$(median ${p99[hyper,$2]})
  printf '| %s: p99 latency (ms) | %s | %s | %s | %s | %s | %s |\n' "$1" "$f" "$h" "$n" "$(ratio "$f" "$(best "$h" "$n")")" "$r" "$y"
}
echo
echo "| HTTP proxy, $CONNS connections, median of $ROUNDS × ${SECS}s | Fulcrum | HAProxy $(haproxy -v | awk 'NR==1 {print $3}') | nginx $(nginx -v 2>&1 | sed 's|.*/||') | Fulcrum ÷ better peer | Fulcrum, 300 rules | plain hyper |"
echo "|---|---|---|---|---|---|---|"
row "keep-alive clients" keepalive
row "new connection per request" close
printf '| memory per idle client connection (KiB, %s held) | %s | %s | %s | %s | | |\n' "$HOLD" "${mem[fulcrum]}" "${mem[haproxy]}" "${mem[nginx]}" "$(ratio "${mem[fulcrum]}" "$(best "${mem[haproxy]}" "${mem[nginx]}")")"
read -r reqs conns <<<"$reuse"
echo
echo "Fulcrum member connections: $conns opened for $reqs requests ($(awk -v r="$reqs" -v c="$conns" 'BEGIN { if (c > 0) printf "%.0f", r / c; else print "n/a" }') requests per connection)."

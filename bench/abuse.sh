#!/usr/bin/env bash
# Abuse runs, side by side: Fulcrum, HAProxy and nginx, each in front of the same nginx member,
# each pinned alone on one CPU (wrk, the attackers and the member on the other). For every
# attack, legitimate HTTP/1.1 clients (wrk, 8 keep-alive connections, 2 s timeout) run for the
# whole attack; reported: their success rate (2xx among all requests, socket errors and
# timeouts counted as failures), their p99 latency, and the proxy's peak RSS growth over the
# attack (sampled every 0.5 s).
#
#   bench/abuse.sh [SECS=15]           FULCRUM=path/to/fulcrum (default target/$PROFILE/fulcrum, see bench/lib.sh)
#                                      ATTACKS="none slowloris ..." (default: all, in the order below)
#
# Attacks (all bounded by SECS):
#   slowloris    slowhttptest -H: 1000 connections sending header lines every 10 s
#   slow POST    slowhttptest -B: 1000 connections sending a 8 KiB body at ~1 byte per 10 s
#   rapid reset  h2abuse rapid (crates/fulcrum-testkit bin): 4 h2c connections writing HEADERS +
#                RST_STREAM pairs (raw frames) as fast as they can, reconnecting when closed
#   stream flood h2abuse flood: 4 h2c connections opening streams past the server's concurrency
#                limit (their resets never leave the client), reconnecting when closed
#   zero window  h2abuse hold: 200 h2c connections asking for a 1 MiB body with window 0, kept
#                busy with a HEAD every 500 ms
#   header flood wrk with a Lua script: every request carries a new 4 KiB X-Session value, the
#                key of a header persistence table (Fulcrum: persistence type "header";
#                HAProxy: stick-table type binary len 4096 on req.hdr(x-session); nginx has no
#                header persistence table, it hashes the header: `hash $http_x_session`)
#   vrrp spoof / sync flood (HA=1, the default; HA=0 leaves them out): bench/ha-abuse.sh after
#                the table, in namespaces of its own: a stranger on the HA segment forging
#                priority-255 adverts (Fulcrum with peers, keepalived with unicast_peer without
#                and with check_unicast_src) and flooding ha.sync's port
# h2 attacks go to HAProxy's and Fulcrum's single port (h2c detected by its preface) and to a
# second nginx port with `http2` (nginx 1.22 cannot serve h2c and HTTP/1.1 on one port).
# Timeouts set alike: header 10 s, body/idle 30 s. Needs slowhttptest (Debian package
# `slowhttptest`), wrk, haproxy, nginx; installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SECS=${1:-15}
ATTACKS=${ATTACKS:-none slowloris slowpost rapid streamflood zerowindow flood}
need haproxy; need nginx; need wrk; need slowhttptest
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
H2ABUSE=${H2ABUSE:-target/debug/h2abuse}
[ "$H2ABUSE" = target/debug/h2abuse ] && [[ "$ATTACKS" =~ rapid|streamflood|zerowindow ]] && cargo build -q -p fulcrum-testkit --bin h2abuse
ulimit -n "$(ulimit -Hn)"

M=18311 F=18380 H=18381 N=18382 N2=18383 FA=18390
bench_workdir

mkdir -p "$work/www"
echo "hello, world" >"$work/www/index.html"
head -c 1048576 /dev/zero | tr '\0' 'b' >"$work/www/big"
cat >"$work/member.conf" <<CONF
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/member.pid;
events { worker_connections 16384; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$M; root $work/www; location = / { return 200 "hello, world\n"; } }
}
CONF
taskset -c "$BENCH_CPU_LOAD" nginx -p "$work" -c "$work/member.conf" 2>"$work/member.err" &
pids+=($!)
wait_port 127.0.0.1:$M

cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:$FA")
[[persistence]]
name = "session"
type = "header"
header = "x-session"
[[virtual_service]]
name = "web"
listen = "127.0.0.1:$F"
protocol = "http"
pool = "member"
persistence = "session"
header_timeout = "10s"
idle_timeout = "30s"
[[pool]]
name = "member"
monitors = []
[[pool.member]]
address = "127.0.0.1:$M"
CONF
RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/fulcrum.toml" 2>"$work/fulcrum.err" &
fulcrum_pid=$!; pids+=($fulcrum_pid)

cat >"$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 9000
defaults
  mode http
  timeout connect 3s
  timeout http-request 10s
  timeout client 30s
  timeout server 30s
frontend web
  bind 127.0.0.1:$H
  default_backend member
backend member
  stick-table type binary len 4096 size 1m expire 30m
  stick on req.hdr(x-session)
  server a 127.0.0.1:$M
CONF
taskset -c "$BENCH_CPU_PROXY" haproxy -db -f "$work/haproxy.cfg" 2>"$work/haproxy.err" &
haproxy_pid=$!; pids+=($haproxy_pid)

cat >"$work/proxy.conf" <<CONF
master_process off;
worker_processes 1;
worker_rlimit_nofile 19000;
daemon off;
error_log stderr error;
pid $work/proxy.pid;
events { worker_connections 9000; }
http {
  access_log off;
  client_header_timeout 10s;
  client_body_timeout 30s;
  send_timeout 30s;
  keepalive_timeout 30s;
  large_client_header_buffers 4 16k;
  upstream member { hash \$http_x_session; server 127.0.0.1:$M; keepalive 64; }
  server {
    listen 127.0.0.1:$N;
    listen 127.0.0.1:$N2 http2;
    location / {
      proxy_pass http://member;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
CONF
taskset -c "$BENCH_CPU_PROXY" nginx -p "$work" -c "$work/proxy.conf" 2>"$work/proxy.err" &
nginx_pid=$!; pids+=($nginx_pid)
for p in $F $H $N $N2; do wait_port 127.0.0.1:$p; done

cat >"$work/flood.lua" <<'LUA'
local pad = string.rep("s", 4000)
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["X-Session"] = pad .. n .. "-" .. math.random(1, 1e9) })
end
LUA

pid_of() { case $1 in fulcrum) echo $fulcrum_pid;; haproxy) echo $haproxy_pid;; nginx) echo $nginx_pid;; esac; }
port_of() { case $1 in fulcrum) echo $F;; haproxy) echo $H;; nginx) echo $N;; esac; }
h2port_of() { case $1 in fulcrum) echo $F;; haproxy) echo $H;; nginx) echo $N2;; esac; }

# attack NAME PEER: starts the attack in the background, prints its pid
attack() {
  local port h2port
  port=$(port_of "$2"); h2port=$(h2port_of "$2")
  case $1 in
    none) sleep "$SECS" & ;;
    slowloris) taskset -c "$BENCH_CPU_LOAD" slowhttptest -H -c 1000 -r 500 -i 10 -x 24 -p 3 -l "$SECS" -u "http://127.0.0.1:$port/" >"$work/$1-$2.out" 2>&1 & ;;
    slowpost) taskset -c "$BENCH_CPU_LOAD" slowhttptest -B -c 1000 -r 500 -i 10 -s 8192 -x 10 -p 3 -l "$SECS" -u "http://127.0.0.1:$port/" >"$work/$1-$2.out" 2>&1 & ;;
    rapid) taskset -c "$BENCH_CPU_LOAD" "$H2ABUSE" rapid "127.0.0.1:$h2port" "$SECS" 4 >"$work/$1-$2.out" 2>&1 & ;;
    streamflood) taskset -c "$BENCH_CPU_LOAD" "$H2ABUSE" flood "127.0.0.1:$h2port" "$SECS" 4 >"$work/$1-$2.out" 2>&1 & ;;
    zerowindow) taskset -c "$BENCH_CPU_LOAD" "$H2ABUSE" hold "127.0.0.1:$h2port" /big 200 "$SECS" >"$work/$1-$2.out" 2>&1 & ;;
    flood) taskset -c "$BENCH_CPU_LOAD" wrk -t1 -c16 -d"${SECS}s" -s "$work/flood.lua" "http://127.0.0.1:$port/" >"$work/$1-$2.out" 2>&1 & ;;
  esac
  echo $!
}

# legit PEER: "success_pct p99_ms requests" of 8 wrk connections over SECS-2 seconds
legit() {
  local out reqs non2xx errs p99
  out=$(taskset -c "$BENCH_CPU_LOAD" wrk -t1 -c8 -d"$((SECS - 2))s" --timeout 2s --latency "http://127.0.0.1:$(port_of "$1")/" 2>&1)
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  errs=$(awk '/Socket errors/ {gsub(/,/,""); print $4 + $6 + $8 + $10}' <<<"$out")
  p99=$(awk '$1 == "99%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}' <<<"$out")
  awk -v r="${reqs:-0}" -v n="${non2xx:-0}" -v e="${errs:-0}" -v p="${p99:-nan}" \
    'BEGIN { t = r + e; printf "%s %s %d\n", (t > 0 ? sprintf("%.2f", 100 * (r - n) / t) : "0"), p, r }'
}

declare -A result
for a in $ATTACKS; do
  for peer in fulcrum haproxy nginx; do
    pid=$(pid_of $peer)
    before=$(rss_kib "$pid"); peak=$before
    apid=$(attack $a $peer)
    sleep 1
    legit $peer >"$work/legit" &
    lpid=$!
    while kill -0 "$lpid" 2>/dev/null; do
      r=$(rss_kib "$pid"); [ "$r" -gt "$peak" ] && peak=$r
      sleep 0.5
    done
    read -r ok p99 n <"$work/legit"
    # The attack runs in a subshell's background (not our child): let it finish and report.
    for _ in $(seq 100); do kill -0 "$apid" 2>/dev/null || break; sleep 0.1; done
    kill "$apid" 2>/dev/null || true
    grow=$(awk -v a="$peak" -v b="$before" 'BEGIN { printf "%.1f", (a - b) / 1024 }')
    note=""
    if [ -s "$work/$a-$peer.out" ]; then
      case $a in
        rapid|streamflood|zerowindow) note=$(grep -E '^(streams_reset|holders)=' "$work/$a-$peer.out" | tail -1 || true) ;;
        flood) note="flood: $(awk '/requests in/ {print $1}' "$work/$a-$peer.out") requests with distinct keys" ;;
        *) note="slowhttptest, most connected at once: $(grep -o 'connected: *[0-9]*' "$work/$a-$peer.out" | grep -o '[0-9]*' | sort -n | tail -1)" ;;
      esac
    fi
    result[$a,$peer]="$ok% / ${p99} ms / +${grow} MiB"
    echo "$a $peer: legit ok ${ok}% of $n, p99 ${p99} ms, RSS +${grow} MiB (peak $((peak / 1024)) MiB) $note" >&2
    # Let the proxy shed the attack's connections before the next run.
    sleep 3
  done
done

echo
echo "| attack (${SECS} s; legit: 8 wrk connections) — success / p99 / peak RSS growth | Fulcrum | HAProxy $(haproxy -v | awk 'NR==1 {print $3}') | nginx $(nginx -v 2>&1 | sed 's|.*/||') |"
echo "|---|---|---|---|"
for a in $ATTACKS; do
  printf '| %s | %s | %s | %s |\n' "$a" "${result[$a,fulcrum]}" "${result[$a,haproxy]}" "${result[$a,nginx]}"
done

if [ "${HA:-1}" = 1 ]; then
  echo
  FULCRUM="$FULCRUM" bench/ha-abuse.sh "$SECS"
fi

#!/usr/bin/env bash
# What the HTTP/2 attack rows of bench/abuse.sh cost Fulcrum, and why: Fulcrum alone (one worker,
# CPU 0) in front of an nginx member, `h2abuse $ATTACK` for SECS with 4 connections; every 0.5 s
# the proxy's RSS and its established member connections are sampled. Prints the RSS before,
# the peak, the RSS 3 s after the attack, the most member connections seen, and from Fulcrum's
# h2 debug log how many HEADERS and RST_STREAM frames it received and how it closed them.
#
#   bench/h2-stream-memory.sh [SECS=10]     FULCRUM=path (default target/$PROFILE/fulcrum)
#                                           ATTACK=rapid (default) or flood (h2abuse modes)
#                                           extra environment for Fulcrum: FULCRUM_ENV="K=V ..."
#                                           (e.g. MIMALLOC_PURGE_DELAY=0 to tell allocator
#                                           retention from live memory); FULCRUM_LOG=warn
#                                           for the figures without the frame log
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
SECS=${1:-10}
need nginx
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
H2ABUSE=${H2ABUSE:-target/debug/h2abuse}
[ "$H2ABUSE" = target/debug/h2abuse ] && cargo build -q -p fulcrum-testkit --bin h2abuse
M=18411 F=18480 FA=18490
bench_workdir
mkdir -p "$work/www"
cat >"$work/member.conf" <<CONF
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/member.pid;
events { worker_connections 16384; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:$M; root $work/www; location = / { return 200 "hello, world\n"; } } }
CONF
taskset -c "$BENCH_CPU_LOAD" nginx -p "$work" -c "$work/member.conf" 2>"$work/member.err" &
pids+=($!)
wait_port 127.0.0.1:$M
cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:$FA")
[[virtual_service]]
name = "web"
listen = "127.0.0.1:$F"
protocol = "http"
pool = "member"
header_timeout = "10s"
idle_timeout = "30s"
[[pool]]
name = "member"
monitors = []
[[pool.member]]
address = "127.0.0.1:$M"
CONF
# h2's frame log (debug) tells which frames arrived; it slows Fulcrum (FULCRUM_LOG=warn: without).
env ${FULCRUM_ENV:-} RUST_LOG=${FULCRUM_LOG:-warn,h2=debug} taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/fulcrum.toml" 2>"$work/fulcrum.err" &
fulcrum_pid=$!; pids+=($fulcrum_pid)
wait_port 127.0.0.1:$F
sleep 0.5
before=$(rss_kib $fulcrum_pid); peak=$before; conns=0
taskset -c "$BENCH_CPU_LOAD" "$H2ABUSE" "${ATTACK:-rapid}" "127.0.0.1:$F" "$SECS" 4 >"$work/abuse.out" 2>&1 &
apid=$!
while kill -0 $apid 2>/dev/null; do
  r=$(rss_kib $fulcrum_pid); [ "$r" -gt "$peak" ] && peak=$r
  c=$(ss -Htn state established "( dport = :$M )" | wc -l); [ "$c" -gt "$conns" ] && conns=$c
  sleep 0.5
done
sleep 3
after=$(rss_kib $fulcrum_pid)
count() { grep -c "$1" "$work/fulcrum.err" || true; }
echo "RSS before $((before / 1024)) MiB, peak +$(((peak - before) / 1024)) MiB, 3 s after +$(((after - before) / 1024)) MiB; member connections at most $conns"
echo "attacker: $(cat "$work/abuse.out")"
echo "Fulcrum received: HEADERS $(count 'received frame=Headers'), RST_STREAM $(count 'received frame=Reset'); sent: RST_STREAM REFUSED_STREAM $(count 'error_code: REFUSED_STREAM'), GOAWAY $(count 'send frame=GoAway') ($(grep -o 'debug_data: b"[a-z_]*"' "$work/fulcrum.err" | sort | uniq -c | tr '\n' ' '))"

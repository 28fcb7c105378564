#!/usr/bin/env bash
# The configuration API: what a write costs and how soon it serves.
#
# 1. One node, a pool of 1,000 members (plus the ones the run adds): WRITES member additions
#    through PUT /api/v1/config/pools/p/members/{address}. Each answers once the configuration
#    is validated as `fulcrum check` does, written to the file, kept in the history and applied,
#    so its latency is the time to serving on this node. Beside it, HAProxy's runtime API
#    (`add server` + `enable server` on its stats socket) on a backend of 1,000 servers: the
#    peer's way to add a member without a reload (it neither validates a whole configuration nor
#    writes a file: what it adds is lost at its next reload unless written elsewhere).
# 2. An [ha] pair with config_sync in namespaces this script creates (198.18.0.0/24): PAIR
#    writes on node b (a new tcp service each), each timed until node a serves it.
# Prints p50 / p99 latency (ms) and writes per second.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need haproxy
need python3
WRITES=${WRITES:-200}
PAIR=${PAIR:-100}
MEMBERS=${MEMBERS:-1000}
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ -x "$FULCRUM" ] || bench_build -p fulcrum
work=$(mktemp -d)
KEEP_LOGS=${KEEP_LOGS:-}
P="fl-cfg-$$"
pids=()
nsx() { ip netns exec "$P-$1" "${@:2}"; }
teardown() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for n in a b; do ip netns del "$P-$n" 2>/dev/null || true; done
  [ -n "$KEEP_LOGS" ] && cp -r "$work" /tmp/config-bench-logs
  rm -rf "$work"
}
trap teardown EXIT

# ---- 1. one node, 1,000 members -----------------------------------------------------------
admin=127.0.0.1:$((20000 + RANDOM % 10000))
vs=127.0.0.1:$((30000 + RANDOM % 10000))
{
  printf '[admin]\nlisten = "%s"\ntoken = "bench-config-token-0123456789"\n\n' "$admin"
  printf '[[virtual_service]]\nname = "svc"\nlisten = ["%s"]\nprotocol = "tcp"\npool = "p"\n\n' "$vs"
  printf '# the application servers\n[[pool]]\nname = "p"\n'
  for i in $(seq 0 $((MEMBERS - 1))); do
    printf '[[pool.member]]\naddress = "127.0.1.%d:%d"\n' $((i / 250 + 1)) $((10000 + i % 250))
  done
} >"$work/fulcrum.toml"
taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/fulcrum.toml" 2>"$work/fulcrum.log" &
pids+=($!)
fpid=$!
wait_port "$admin"
read -r f50 f99 frate < <(python3 bench/config_api.py fulcrum "$admin" bench-config-token-0123456789 p "$WRITES" 40000)
frss=$(rss_kib "$fpid")
kill "$fpid"

{
  printf 'global\n  stats socket %s/hap.sock mode 600 level admin\n' "$work"
  printf 'defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 10s\n  timeout server 10s\n'
  printf 'frontend f\n  bind %s\n  default_backend p\n' "$vs"
  printf 'backend p\n  balance roundrobin\n'
  for i in $(seq 0 $((MEMBERS - 1))); do
    printf '  server m%d 127.0.1.%d:%d\n' "$i" $((i / 250 + 1)) $((10000 + i % 250))
  done
} >"$work/haproxy.cfg"
taskset -c "$BENCH_CPU_PROXY" haproxy -db -f "$work/haproxy.cfg" 2>"$work/haproxy.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/hap.sock" ] && break; sleep 0.05; done
read -r h50 h99 hrate < <(python3 bench/config_api.py haproxy "$work/hap.sock" p "$WRITES" 40000)

# ---- 2. a pair with config_sync -----------------------------------------------------------
for n in a b; do ip netns add "$P-$n"; nsx "$n" ip link set lo up; done
ip link add "$P-va" type veth peer name "$P-vb"
ip link set "$P-va" netns "$P-a" name eth0
ip link set "$P-vb" netns "$P-b" name eth0
nsx a ip addr add 198.18.0.1/24 dev eth0; nsx a ip link set eth0 up
nsx b ip addr add 198.18.0.2/24 dev eth0; nsx b ip link set eth0 up
node() {  # node NAME PRIORITY ME PEER
  cat <<CONF
[admin]
listen = "127.0.0.1:9900"
token = "bench-config-token-0123456789"

[ha]
node = "$1"
interface = "eth0"
vrid = 61
priority = $2
advert_interval = "100ms"
vips = ["198.18.0.100/24"]
config_sync = true
sync = { listen = "$3:7500", peers = ["$4:7500"], key = "bench-config-sync-key-0123" }

[[pool]]
name = "local"
[[pool.member]]
address = "127.0.0.1:7001"
CONF
}
for n in a b; do
  mkdir -p "$work/$n"
  # The member: answers every connection with a line.
  ip netns exec "$P-$n" python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7001)); s.listen(512)
while True:
    c, _ = s.accept(); c.sendall(b"hi\n"); c.close()' &
  pids+=($!)
done
node a 150 198.18.0.1 198.18.0.2 >"$work/a/fulcrum.toml"
node b 100 198.18.0.2 198.18.0.1 >"$work/b/fulcrum.toml"
for n in a b; do
  ip netns exec "$P-$n" "$FULCRUM" run -c "$work/$n/fulcrum.toml" 2>"$work/$n/fulcrum.log" &
  pids+=($!)
done
for n in a b; do
  for _ in $(seq 200); do nsx "$n" bash -c '(exec 3<>/dev/tcp/127.0.0.1/9900)' 2>/dev/null && break; sleep 0.05; done
done
sleep 1  # the sync channel connects
read -r p50 p99 prate < <(nsx b python3 bench/config_api.py pair 127.0.0.1:9900 bench-config-token-0123456789 198.18.0.1 "$PAIR" 41000)

echo
echo "| what | p50 ms | p99 ms | writes/s |"
echo "|---|---|---|---|"
echo "| Fulcrum: add a member through PUT /api/v1/config/pools/p/members/{address}, pool of $MEMBERS (validated, written, kept, applied) | $f50 | $f99 | $frate |"
echo "| HAProxy 2.6 runtime API: add server + enable server, backend of $MEMBERS (not validated as a whole, not written) | $h50 | $h99 | $hrate |"
echo "| Fulcrum pair: a service added on node b through the API, until node a serves it ($PAIR writes) | $p50 | $p99 | $prate |"
echo "Fulcrum RSS after $WRITES writes on $MEMBERS members: ${frss} KiB; $FULCRUM"

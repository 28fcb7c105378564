#!/usr/bin/env bash
# VRRP failover: Fulcrum against keepalived in the same harness. Two nodes and a client on one
# Ethernet segment (a bridge), all in network namespaces this script creates (198.18.0.0/24).
# Node a (priority 150) is master; two clients GET the VIP every 10 ms, each request on a new
# connection: an impatient one (200 ms timeout per attempt, one retry) that measures the service
# gap (last answer from a to the first from b) and counts failed attempts and requests failed
# even after their retry, and a patient one (3 s timeout, no retry: the kernel's own SYN
# retransmission after 1 s is its retry) that counts failed requests. Then node a dies (every
# process killed with SIGKILL and its link set down, like a machine losing power).
#
# Scenarios: Fulcrum with 100 ms and 1 s adverts (VRRPv3), keepalived at its defaults
# (VRRPv2, advert_int 1) and with advert_int 0.1 (VRRPv3). ROUNDS per scenario (default 5).
# Prints one line per round and a median table.
#
# Then stability: a settled pair with 100 ms adverts, both nodes pinned to CPU STRESS_CPU, while
# 8 stress-ng CPU workers saturate that CPU for STRESS_SECS (default 20): how many times the
# backup took over although the master was alive (a spurious failover), for Fulcrum and for
# keepalived. (One CPU only: the machine is shared.)
# Needs root, keepalived, python3, stress-ng.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need keepalived
need python3
need stress-ng
STRESS_SECS=${STRESS_SECS:-20}
STRESS_CPU=${STRESS_CPU:-1}   # the nodes and the stress share this CPU; the others stay free
PIN=
FULCRUM=${FULCRUM:-target/debug/fulcrum}
[ "$FULCRUM" = target/debug/fulcrum ] && cargo build -q -p fulcrum
ROUNDS=${ROUNDS:-5}
work=$(mktemp -d)
P="fl-hab-$$"
VIP=198.18.0.100
CLIENT=$PWD/bench/ha_client.py

nsx() { ip netns exec "$P-$1" "${@:2}"; }

teardown() {
  for n in a b c sw; do
    for pid in $(ip netns pids "$P-$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$P-$n" 2>/dev/null || true
  done
}
sweep() {  # every namespace of this run, also those of a round that was interrupted
  for ns in $(ip netns list | awk '{print $1}' | grep "^fl-hab-$$-"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}
trap 'sweep; rm -rf "$work"' EXIT

segment() {
  # Fresh names every round: a namespace deleted while its killed processes are still exiting
  # cannot be reused at once ("Peer netns reference is invalid").
  # (round runs in a command substitution: a counter would not survive it, so the subshell's
  # own pid names the round.)
  P="fl-hab-$$-$BASHPID"
  ha_segment "$P" c
}

fulcrum_node() {  # fulcrum_node NAME PRIORITY INTERVAL
  local n=$1 prio=$2 int=$3
  cat >"$work/$n.toml" <<CONF
[admin]
listen = "127.0.0.1:9900"
[ha]
node = "$n"
interface = "eth0"
vrid = 51
priority = $prio
advert_interval = "$int"
vips = ["$VIP/24"]
[[virtual_service]]
name = "web"
listen = ["0.0.0.0:80"]
protocol = "http"
pool = "local"
[[pool]]
name = "local"
reuse = "never"
[[pool.member]]
address = "127.0.0.1:8080"
CONF
  nsx "$n" python3 "$CLIENT" serve "$n" 127.0.0.1 8080 &
  nsx "$n" $PIN "$FULCRUM" run -c "$work/$n.toml" 2>"$work/$n.log" &
}

keepalived_node() {  # keepalived_node NAME PRIORITY ADVERT_INT VERSION
  local n=$1 prio=$2 int=$3 ver=$4
  cat >"$work/$n.conf" <<CONF
global_defs {
  router_id $n
  vrrp_version $ver
}
vrrp_instance VI {
  state BACKUP
  interface eth0
  virtual_router_id 51
  priority $prio
  advert_int $int
  virtual_ipaddress {
    $VIP/24
  }
}
CONF
  nsx "$n" python3 "$CLIENT" serve "$n" 0.0.0.0 80 &
  nsx "$n" $PIN keepalived -f "$work/$n.conf" --dont-fork -l -P -p "$work/$n.pid" -r "$work/$n.vrrp.pid" \
    -c "$work/$n.chk.pid" >"$work/$n.log" 2>&1 &
}

holds_vip() { ip -n "$P-$1" -4 addr show dev eth0 | grep -q "inet $VIP/"; }

round() {  # round KIND INTERVAL [VERSION] -> prints the client's JSON line
  local kind=$1 int=$2 ver=${3:-3} secs
  segment
  if [ "$kind" = fulcrum ]; then
    fulcrum_node a 150 "$int"; sleep 0.3; fulcrum_node b 100 "$int"
  else
    keepalived_node a 150 "$int" "$ver"; sleep 0.3; keepalived_node b 100 "$int" "$ver"
  fi
  # a master, b backup, and still so 1.5 s later (b settled, a's gratuitous ARPs done).
  local settled=
  for _ in $(seq 400); do
    if holds_vip a && ! holds_vip b; then
      sleep 1.5
      holds_vip a && ! holds_vip b && { settled=1; break; }
    fi
    sleep 0.05
  done
  [ -n "$settled" ] || { echo "node a never settled as the only master" >&2; cat "$work"/a.log >&2; exit 1; }
  case $int in *ms) secs=4 ;; 0.*) secs=4 ;; *) secs=7 ;; esac
  nsx c python3 "$CLIENT" load "$VIP" 80 "$secs" 0.2 1 >"$work/client.json" &
  local client=$!
  nsx c python3 "$CLIENT" load "$VIP" 80 "$secs" 3 0 >"$work/patient.json" &
  local patient=$!
  sleep 1
  for pid in $(ip netns pids "$P-a"); do kill -9 "$pid" 2>/dev/null || true; done
  ip -n "$P-a" link set eth0 down
  wait "$client" "$patient"
  python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); a["patient_failed"]=b["failed_requests"]; a["patient_requests"]=b["requests"]; print(json.dumps(a))' "$work/client.json" "$work/patient.json"
  teardown
  wait 2>/dev/null || true
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) print "-"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

declare -A rows
run_scenario() {  # run_scenario LABEL KIND INTERVAL [VERSION]
  local label=$1; shift
  local gaps=() fa=() fr=() pf=() out
  local invalid=0 r=0
  while [ "$r" -lt "$ROUNDS" ]; do
    out=$(round "$@")
    # A round counts when the client saw a, then b: a loaded machine can delay a node so much
    # that the other one takes over before the kill (a spurious failover, reported apart).
    if ! python3 -c 'import json,sys; v=json.loads(sys.argv[1]); sys.exit(0 if v["first"]=="a" and v["last"]=="b" and v["gap_ms"] is not None else 1)' "$out"; then
      invalid=$((invalid + 1))
      echo "$label: round not counted: $out"
      [ "$invalid" -le $((ROUNDS * 2)) ] && continue
      echo "$label: too many rounds not counted" >&2; exit 1
    fi
    r=$((r + 1))
    echo "$label round $r: $out"
    gaps+=("$(python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(v["gap_ms"] if v["gap_ms"] is not None else "nan")' "$out")")
    fa+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["failed_attempts"])' "$out")")
    fr+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["failed_requests"])' "$out")")
    pf+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["patient_failed"])' "$out")")
  done
  rows[$label]="$(printf '%s\n' "${gaps[@]}" | median) | $(printf '%s\n' "${fa[@]}" | median) | $(printf '%s\n' "${fr[@]}" | median) | $(printf '%s\n' "${pf[@]}" | median) | ${gaps[*]} | $invalid"
}

# stability KIND INTERVAL VERSION -> the number of times b became master under CPU saturation
stability() {
  local kind=$1 int=$2 ver=${3:-3}
  PIN="taskset -c $STRESS_CPU"
  segment
  if [ "$kind" = fulcrum ]; then
    fulcrum_node a 150 "$int"; sleep 0.3; fulcrum_node b 100 "$int"
  else
    keepalived_node a 150 "$int" "$ver"; sleep 0.3; keepalived_node b 100 "$int" "$ver"
  fi
  PIN=
  for _ in $(seq 400); do holds_vip a && ! holds_vip b && break; sleep 0.05; done
  sleep 2
  local before after
  if [ "$kind" = fulcrum ]; then
    before=$(nsx b curl -s 127.0.0.1:9900/api/v1/ha | python3 -c 'import json,sys; print(json.load(sys.stdin)["became_master"])')
  else
    before=$(grep -c "Entering MASTER STATE" "$work/b.log" || true)
  fi
  stress-ng --cpu 8 --taskset "$STRESS_CPU" --timeout "${STRESS_SECS}s" --quiet >/dev/null 2>&1 || true
  if [ "$kind" = fulcrum ]; then
    after=$(nsx b curl -s 127.0.0.1:9900/api/v1/ha | python3 -c 'import json,sys; print(json.load(sys.stdin)["became_master"])')
  else
    after=$(grep -c "Entering MASTER STATE" "$work/b.log" || true)
  fi
  echo $((after - before))
  teardown
  wait 2>/dev/null || true
}

run_scenario "Fulcrum, VRRPv3 adverts 100 ms" fulcrum 100ms
run_scenario "keepalived $(keepalived --version 2>&1 | head -1 | awk '{print $2}'), VRRPv3 advert_int 0.1" keepalived 0.1 3
run_scenario "Fulcrum, VRRPv3 adverts 1 s" fulcrum 1s
run_scenario "keepalived, defaults (VRRPv2, advert_int 1)" keepalived 1 2

echo
echo "| Master dies (kill -9 + link down), median of $ROUNDS | service gap (ms) | failed attempts (200 ms timeout) | requests failed after one retry | requests failed, 3 s timeout | gaps per round (ms) | rounds not counted |"
echo "|---|---|---|---|---|---|---|"
for k in "Fulcrum, VRRPv3 adverts 100 ms" "keepalived $(keepalived --version 2>&1 | head -1 | awk '{print $2}'), VRRPv3 advert_int 0.1" "Fulcrum, VRRPv3 adverts 1 s" "keepalived, defaults (VRRPv2, advert_int 1)"; do
  echo "| $k | ${rows[$k]} |"
done

echo
s_f=$(stability fulcrum 100ms)
s_k=$(stability keepalived 0.1 3)
echo "| ${STRESS_SECS} s of 8 stress-ng workers on the nodes' CPU, 100 ms adverts, master alive | spurious takeovers by the backup |"
echo "|---|---|"
echo "| Fulcrum | $s_f |"
echo "| keepalived, advert_int 0.1 | $s_k |"

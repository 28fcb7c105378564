#!/usr/bin/env bash
# Outbound link load balancing: what the packet path costs through Fulcrum's namespace, against
# plain routing (one line, no nftables: the physical limit of this set-up) and against an
# mwan3-style setup written by hand (nftables connmark + random split + fwmark rules + SNAT, the
# mechanism mwan3 builds with iptables). Then the failover detection time.
#
#   lan (198.18.100.2) — lan0 [fl] wan0 — isp0 — inet (198.19.0.10: nginx, iperf3)
#                                  wan1 — isp1 —/
#
# Measures, per mode, in one run:
#   - new flows per second and CPU per new flow: wrk with `Connection: close` (every request is
#     a new TCP flow through the router), the machine's busy CPU time ÷ requests;
#   - bulk throughput: iperf3, 4 parallel streams;
#   - Fulcrum's own CPU time over the whole run (its control plane: probes, rate sampling).
# Fulcrum's packet path is the kernel's, so a debug build measures the same path as a release
# one (the control plane's CPU is the only part the build changes).
#
# Usage: bench/link.sh            (SECS=5 by default; needs root, nft, wrk, iperf3, nginx)
set -euo pipefail
SECS=${SECS:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${FULCRUM:-$ROOT/target/debug/fulcrum}
. "$ROOT/bench/lib.sh"
# A missing tool would leave its column empty rather than fail the run.
need iperf3; need wrk; need nginx; need nftables nft
P=bl$$
WORK=$(mktemp -d)
PIDS=()

FPID=
cleanup() {
  [ -z "$FPID" ] || kill "$FPID" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.3
  for n in lan fl isp0 isp1 inet; do ip netns del "$P-$n" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

x() { local ns=$1; shift; ip netns exec "$P-$ns" "$@"; }

for n in lan fl isp0 isp1 inet; do ip netns add "$P-$n"; x "$n" ip link set lo up; done
ip link add eth0 netns "$P-lan" type veth peer name lan0 netns "$P-fl"
x lan ip addr add 198.18.100.2/24 dev eth0; x lan ip link set eth0 up
x fl ip addr add 198.18.100.1/24 dev lan0; x fl ip link set lan0 up
x lan ip route add default via 198.18.100.1
x fl sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
for a in 198.19.0.10/32 198.19.0.11/32; do x inet ip addr add "$a" dev lo; done
for k in 0 1; do
  ip link add "wan$k" netns "$P-fl" type veth peer name eth0 netns "$P-isp$k"
  ip link add eth1 netns "$P-isp$k" type veth peer name "isp$k" netns "$P-inet"
  x fl ip addr add "198.18.$((k + 1)).2/24" dev "wan$k"; x fl ip link set "wan$k" up
  x "isp$k" ip addr add "198.18.$((k + 1)).1/24" dev eth0; x "isp$k" ip link set eth0 up
  x "isp$k" ip addr add "198.18.$((k + 11)).1/24" dev eth1; x "isp$k" ip link set eth1 up
  x inet ip addr add "198.18.$((k + 11)).2/24" dev "isp$k"; x inet ip link set "isp$k" up
  x "isp$k" sysctl -qw net.ipv4.ip_forward=1
  x "isp$k" ip route add 198.19.0.0/16 via "198.18.$((k + 11)).2"
  x inet ip route add "198.18.$((k + 1)).0/24" via "198.18.$((k + 11)).1"
done

cat > "$WORK/nginx.conf" <<EOF
daemon off;
worker_processes 1;
pid $WORK/nginx.pid;
error_log stderr error;
events { worker_connections 4096; }
http {
  access_log off;
  server { listen 198.19.0.10:8080 reuseport backlog=4096; location / { return 200 "ok\n"; } }
}
EOF
x inet taskset -c 1 nginx -c "$WORK/nginx.conf" -p "$WORK" >/dev/null 2>&1 & PIDS+=($!)
x inet iperf3 -s -B 198.19.0.10 -p 5201 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.5

busy_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
proc_jiffies() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
HZ=$(getconf CLK_TCK)

measure() {
  # Warm up (ARP, conntrack), then new flows.
  x lan wrk -t1 -c8 -d1s -H "Connection: close" http://198.19.0.10:8080/ >/dev/null 2>&1 || true
  local b0; b0=$(busy_jiffies)
  local out; out=$(x lan taskset -c 1 wrk -t1 -c32 -d"${SECS}s" -H "Connection: close" http://198.19.0.10:8080/ 2>&1)
  local b1; b1=$(busy_jiffies)
  local reqs; reqs=$(echo "$out" | awk '/requests in/{print $1}')
  local rps; rps=$(echo "$out" | awk '/Requests\/sec/{print $2}')
  local errs; errs=$(echo "$out" | awk '/Socket errors|Non-2xx/{print}' | tr '\n' ' ')
  local cpu_us; cpu_us=$(awk -v d=$((b1 - b0)) -v hz="$HZ" -v n="$reqs" 'BEGIN{printf "%.1f", d * 1e6 / hz / n}')
  local gbit; gbit=$(x lan iperf3 -c 198.19.0.10 -p 5201 -t "$SECS" -P 4 -J 2>/dev/null |
    awk -F: '/"sum_received"/{s=1} s && /"bits_per_second"/{gsub(/[ ,]/,"",$2); printf "%.2f", $2/1e9; exit}')
  [ -z "$errs" ] || echo "  wrk: $errs" >&2
  echo "$rps $cpu_us $gbit"
}

plain_up() {
  x fl ip route add default via 198.18.1.1
  x fl nft -f - <<'EOF2'
table inet plain {
  chain post {
    type nat hook postrouting priority srcnat;
    oifname "wan0" snat ip to 198.18.1.2
  }
}
EOF2
}
plain_down() { x fl nft delete table inet plain; x fl ip route del default; }

# mwan3-style by hand: restore the connection mark (original direction; replies route to the
# LAN by main); a new flow gets a random line; save the mark; fwmark rules to a table per line;
# SNAT per line.
mwan_up() {
  x fl nft -f - <<'EOF2'
table inet mwan {
  chain pre {
    type filter hook prerouting priority mangle;
    ct direction reply return
    meta mark set ct mark
    iifname "lan0" ct state new meta mark 0 meta mark set numgen random mod 2 map { 0 : 0x100, 1 : 0x200 }
    ct mark set meta mark
  }
  chain post {
    type nat hook postrouting priority srcnat;
    meta mark 0x100 oifname "wan0" snat ip to 198.18.1.2
    meta mark 0x200 oifname "wan1" snat ip to 198.18.2.2
  }
}
EOF2
  x fl ip route add default via 198.18.1.1 dev wan0 table 101
  x fl ip route add default via 198.18.2.1 dev wan1 table 102
  x fl ip rule add fwmark 0x100/0xff00 lookup 101 pref 2001
  x fl ip rule add fwmark 0x200/0xff00 lookup 102 pref 2002
}
mwan_down() {
  x fl nft delete table inet mwan
  x fl ip rule del pref 2001; x fl ip rule del pref 2002
  x fl ip route flush table 101; x fl ip route flush table 102
}

# Fulcrum, two lines 1:1, ICMP probes through each line every second.
cat > "$WORK/fulcrum.toml" <<'EOF2'
[admin]
listen = "127.0.0.1:9400"
[[monitor]]
name = "through"
type = "icmp"
targets = ["198.19.0.10", "198.19.0.11"]
interval = "1s"
timeout = "500ms"
rise = 1
fall = 2
[[pool]]
name = "uplinks"
kind = "link"
algorithm = "weighted_round_robin"
[[pool.member]]
name = "a"
interface = "wan0"
gateway = "198.18.1.1"
snat = "198.18.1.2"
monitors = ["through"]
[[pool.member]]
name = "b"
interface = "wan1"
gateway = "198.18.2.1"
snat = "198.18.2.2"
monitors = ["through"]
[[outbound]]
name = "lan"
sources = ["198.18.100.0/24"]
pool = "uplinks"
EOF2
FCPU=0
FWALL=0
fulcrum_up() {
  RUST_LOG=warn ip netns exec "$P-fl" taskset -c 0 "$BIN" run -c "$WORK/fulcrum.toml" 2>>"$WORK/fulcrum.log" &
  FPID=$!
  for _ in $(seq 100); do x fl curl -sf http://127.0.0.1:9400/api/v1/status >/dev/null 2>&1 && break; sleep 0.1; done
  F0=$(proc_jiffies $FPID); T0=$(date +%s.%N)
}
fulcrum_down() {
  local f1; f1=$(proc_jiffies $FPID)
  FCPU=$((FCPU + f1 - F0)); FWALL=$(awk -v a="$FWALL" -v t0="$T0" -v t1="$(date +%s.%N)" 'BEGIN{print a + t1 - t0}')
  kill -TERM "$FPID"; wait "$FPID" || true
}

ROUNDS=${ROUNDS:-3}
declare -A R
for round in $(seq "$ROUNDS"); do
  for mode in plain mwan fulcrum; do
    "${mode}_up"
    R[$mode,$round]=$(measure)
    if [ "$mode" = fulcrum ]; then
      x fl curl -s http://127.0.0.1:9400/api/v1/links |
        python3 -c 'import json,sys; print("  round", sys.argv[1], "Fulcrum flows per link:", {l["name"]: l["flows_total"] for l in json.load(sys.stdin)["links"]})' "$round" >&2
    fi
    "${mode}_down"
  done
done

median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }
echo "| mode (median of $ROUNDS × ${SECS}s) | new flows/s (wrk, Connection: close) | machine CPU per new flow (µs) | iperf3 -P 4 (Gbit/s) | per round: flows/s; µs; Gbit/s |"
echo "|---|---|---|---|---|"
for mode in plain mwan fulcrum; do
  case $mode in
    plain) name="plain routing, one line";;
    mwan) name="mwan3-style nftables, 2 lines";;
    fulcrum) name="Fulcrum, 2 lines";;
  esac
  rows=""; for r in $(seq "$ROUNDS"); do rows="$rows${R[$mode,$r]}"$'\n'; done
  rps=$(echo -n "$rows" | cut -d' ' -f1 | median)
  cpu=$(echo -n "$rows" | cut -d' ' -f2 | median)
  gb=$(echo -n "$rows" | cut -d' ' -f3 | median)
  per=$(echo -n "$rows" | tr '\n' '/' | sed 's#/$##; s#/# / #g')
  echo "| $name | $rps | $cpu | $gb | $per |"
done
awk -v d="$FCPU" -v hz="$HZ" -v w="$FWALL" 'BEGIN{printf "\nFulcrum process CPU while it ran: %.3f s over %.1f s (%.2f%% of a core): probes and rate sampling\n", d/hz, w, 100*d/hz/w}'

fulcrum_up

# 4. Failover detection: line a's ISP stops forwarding; time until Fulcrum reports it down.
x isp0 sysctl -qw net.ipv4.ip_forward=0
t0=$(date +%s.%N)
for _ in $(seq 200); do
  if x fl curl -s http://127.0.0.1:9400/api/v1/links | grep -q '"health":"down"'; then break; fi
  sleep 0.05
done
t1=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" 'BEGIN{printf "Fulcrum failover detection (interval 1s, timeout 500ms, fall 2): %.2f s\n", b-a}'
echo "mwan3 defaults (mwan3track: interval 10, timeout 4, down 5, count 1): 5 failed rounds of ping timeout + interval ≈ 5 × (4 + 10) s = 70 s (at least 4 × 14 + 4 = 60 s)"

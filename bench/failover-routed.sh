#!/usr/bin/env bash
# Routed flows across a failover of a gateway pair: how long a download routed (link load
# balancing with SNAT over two lines) by the master stops when the master machine dies, and
# whether it survives at all.
#
# The pair is the LAN's gateway (VIP 198.18.100.1) with two uplinks whose SNAT addresses are
# VIPs too; a dedicated sync link joins the nodes (namespaces this script creates, 198.18.0.0/15
# and 198.19.0.10 inside them only). Each round: a paced download (about 3.2 MB/s) from a
# server behind both ISPs; 1.5 s in, the master's processes are killed (kill -9) and its links
# set down (the machine gone); the client reports the longest pause between two reads and
# whether the download ended complete.
#
#   fulcrum:    two Fulcrum nodes, [ha] with conntrack_sync (conntrackd driven by Fulcrum)
#   keepalived: the same by hand — keepalived (VRRPv3, 100 ms adverts, the same VIPs), a
#               notify script doing what conntrackd's primary-backup.sh does, conntrackd with the
#               same FTFW settings, nftables marks + SNAT and policy routing per line
#
# ROUNDS rounds each (default 3); prints the median gap (ms) and the rounds that survived.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need keepalived
need conntrackd
need nftables nft
need python3
ROUNDS=${ROUNDS:-3}
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ -x "$FULCRUM" ] || bench_build -p fulcrum
work=$(mktemp -d)
P="fl-rfo-$$"
NS=(sw lan gwa gwb isp0 isp1 inet)
nsx() { ip netns exec "$P-$1" "${@:2}"; }
pids=()
teardown() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  pkill -9 -f "$work/" 2>/dev/null || true
  wait 2>/dev/null || true
  for n in "${NS[@]}"; do ip netns del "$P-$n" 2>/dev/null || true; done
  rm -rf "$work"
}
trap teardown EXIT

plug=0
link_to_switch() {  # link_to_switch NS IFNAME BRIDGE CIDR
  local p="p$plug"
  plug=$((plug + 1))
  ip link add "$2" netns "$P-$1" type veth peer name "$p" netns "$P-sw"
  ip -n "$P-sw" link set "$p" master "$3" up
  ip -n "$P-$1" link set "$2" up
  ip -n "$P-$1" addr add "$4" dev "$2"
}

build_net() {
  for n in "${NS[@]}"; do ip netns add "$P-$n"; ip -n "$P-$n" link set lo up; done
  for br in brl bra brb; do ip -n "$P-sw" link add "$br" type bridge; ip -n "$P-sw" link set "$br" up; done
  link_to_switch lan eth0 brl 198.18.100.2/24
  ip -n "$P-lan" route add default via 198.18.100.1
  local i=11
  for g in gwa gwb; do
    link_to_switch $g eth0 brl "198.18.100.$i/24"
    link_to_switch $g wan0 bra "198.18.1.$i/24"
    link_to_switch $g wan1 brb "198.18.2.$i/24"
    nsx $g sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
    i=$((i + 1))
  done
  ip link add sync0 netns "$P-gwa" type veth peer name sync0 netns "$P-gwb"
  ip -n "$P-gwa" addr add 198.18.254.1/30 dev sync0; ip -n "$P-gwa" link set sync0 up
  ip -n "$P-gwb" addr add 198.18.254.2/30 dev sync0; ip -n "$P-gwb" link set sync0 up
  ip -n "$P-inet" addr add 198.19.0.10/32 dev lo
  for k in 0 1; do
    link_to_switch isp$k eth0 $([ $k = 0 ] && echo bra || echo brb) "198.18.$((k + 1)).1/24"
    ip link add eth1 netns "$P-isp$k" type veth peer name isp$k netns "$P-inet"
    ip -n "$P-isp$k" addr add "198.18.$((k + 11)).1/24" dev eth1; ip -n "$P-isp$k" link set eth1 up
    ip -n "$P-inet" addr add "198.18.$((k + 11)).2/24" dev isp$k; ip -n "$P-inet" link set isp$k up
    nsx isp$k sysctl -qw net.ipv4.ip_forward=1
    ip -n "$P-isp$k" route add 198.19.0.0/16 via "198.18.$((k + 11)).2"
    ip -n "$P-inet" route add "198.18.$((k + 1)).0/24" via "198.18.$((k + 11)).1"
  done
}

cat >"$work/server.py" <<'EOF'
import socket, threading, time
CHUNK = 64 * 1024
TOTAL = 320 * CHUNK          # 20 MiB at ~3.2 MB/s: about 6.5 s
def serve(c):
    try:
        for _ in range(TOTAL // CHUNK):
            c.sendall(b"x" * CHUNK)
            time.sleep(0.02)
    except OSError:
        pass
    c.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.19.0.10", 7001))
s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
EOF
cat >"$work/client.py" <<'EOF'
# Prints: longest pause between reads in ms (after the first byte), bytes, "complete"|error
import socket, sys, time
TOTAL = 320 * 64 * 1024
s = socket.create_connection(("198.19.0.10", 7001), timeout=5)
s.settimeout(20)
got, last, gap, how = 0, None, 0.0, "complete"
open(sys.argv[1], "w").close()        # tells the script the download has started
try:
    while True:
        b = s.recv(65536)
        now = time.monotonic()
        if not b:
            break
        if last is not None:
            gap = max(gap, now - last)
        last = now
        got += len(b)
except OSError as e:
    how = type(e).__name__
if got != TOTAL and how == "complete":
    how = "short"
print(f"{gap * 1000:.0f} {got} {how}")
EOF

fulcrum_config() {  # fulcrum_config NODE PRIORITY PEER
  cat <<EOF
[admin]
listen = "127.0.0.1:9900"
token = "bench-token-0123456789abcdef"
[ha]
node = "$1"
interface = "eth0"
vrid = 61
priority = $2
advert_interval = "100ms"
vips = ["198.18.100.1/24", "198.18.1.2/24 dev wan0", "198.18.2.2/24 dev wan1"]
conntrack_sync = { interface = "sync0", peer = "$3" }
[[monitor]]
name = "through"
type = "icmp"
targets = ["198.19.0.10"]
interval = "300ms"
timeout = "300ms"
rise = 1
fall = 3
[[pool]]
name = "uplinks"
kind = "link"
algorithm = "round_robin"
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
EOF
}

# The keepalived pair by hand: what Fulcrum writes for the same lines, in nft and ip rules.
hand_rules() {  # hand_rules NS
  nsx "$1" nft -f - <<'EOF'
table inet gw {
  chain pre {
    type filter hook prerouting priority mangle; policy accept;
    iifname "eth0" ip saddr 198.18.100.0/24 ct state new ct mark set numgen inc mod 2 map { 0 : 0x1, 1 : 0x2 }
    iifname "eth0" meta mark set ct mark
  }
  chain post {
    type nat hook postrouting priority srcnat; policy accept;
    meta mark 0x1 oifname "wan0" snat ip to 198.18.1.2
    meta mark 0x2 oifname "wan1" snat ip to 198.18.2.2
  }
}
EOF
  for k in 1 2; do
    ip -n "$P-$1" rule add fwmark $k table $((100 + k))
    ip -n "$P-$1" route add default via "198.18.$k.1" dev "wan$((k - 1))" table $((100 + k))
  done
}

conntrackd_conf() {  # conntrackd_conf NODE LOCAL PEER
  cat <<EOF
Sync {
  Mode FTFW {
    DisableExternalCache Off
  }
  UDP {
    IPv4_address $2
    IPv4_Destination_Address $3
    Port 3780
    Interface sync0
    SndSocketBuffer 1249280
    RcvSocketBuffer 1249280
    Checksum on
  }
}
General {
  Systemd off
  HashSize 32768
  HashLimit 262144
  LogFile $work/$1-conntrackd.log
  Syslog off
  LockFile $work/$1-conntrackd.lock
  UNIX {
    Path $work/$1-conntrackd.ctl
  }
  NetlinkBufferSize 2097152
  NetlinkBufferSizeMaxGrowth 8388608
  NetlinkOverrunResync On
  Filter From Userspace {
    Protocol Accept {
      TCP
      UDP
    }
    Address Ignore {
      IPv4_address 127.0.0.1
      IPv4_address $2
      IPv4_address 198.18.100.1
      IPv4_address 198.18.1.2
      IPv4_address 198.18.2.2
    }
  }
}
EOF
}

notify_script() {  # notify_script NODE: conntrackd's primary-backup.sh with this node's paths
  cat <<EOF
#!/bin/sh
C="conntrackd -C $work/$1-conntrackd.conf"
case "\$1" in
  primary) \$C -c; \$C -f; \$C -R; \$C -B ;;
  backup) \$C -t; \$C -n ;;
  fault) \$C -t ;;
esac
exit 0
EOF
}

keepalived_conf() {  # keepalived_conf NODE PRIORITY
  cat <<EOF
global_defs {
  vrrp_version 3
  script_user root
  enable_script_security
}
vrrp_instance VI_61 {
  state BACKUP
  interface eth0
  virtual_router_id 61
  priority $2
  advert_int 0.1
  virtual_ipaddress {
    198.18.100.1/24 dev eth0
    198.18.1.2/24 dev wan0
    198.18.2.2/24 dev wan1
  }
  notify_master "$work/$1-notify.sh primary"
  notify_backup "$work/$1-notify.sh backup"
  notify_fault "$work/$1-notify.sh fault"
}
EOF
}

start_pair() {  # start_pair fulcrum|keepalived
  local peer=(198.18.254.2 198.18.254.1) local_=(198.18.254.1 198.18.254.2) prio=(200 100) i=0
  for g in gwa gwb; do
    if [ "$1" = fulcrum ]; then
      fulcrum_config $g "${prio[$i]}" "${peer[$i]}" >"$work/$g.toml"
      nsx $g "$FULCRUM" run -c "$work/$g.toml" 2>"$work/$g.log" &
      pids+=($!)
      eval "pid_$g=$!"
    else
      hand_rules $g
      # Left by the daemons killed in the round before: each refuses to start while they exist.
      rm -f "$work/$g-conntrackd.lock" "$work/$g-ka.pid" "$work/$g-vrrp.pid"
      conntrackd_conf $g "${local_[$i]}" "${peer[$i]}" >"$work/$g-conntrackd.conf"
      notify_script $g >"$work/$g-notify.sh"
      chmod 755 "$work/$g-notify.sh"
      keepalived_conf $g "${prio[$i]}" >"$work/$g-keepalived.conf"
      nsx $g conntrackd -C "$work/$g-conntrackd.conf" >/dev/null 2>&1 &
      pids+=($!)
      eval "ct_$g=$!"
      nsx $g keepalived -n -l -D -f "$work/$g-keepalived.conf" -p "$work/$g-ka.pid" \
        -r "$work/$g-vrrp.pid" >"$work/$g-keepalived.log" 2>&1 &
      pids+=($!)
      eval "pid_$g=$!"
    fi
    i=$((i + 1))
  done
  # Ready: a holds the LAN VIP and a flow through the pair gets an answer.
  for _ in $(seq 1 100); do
    if ip -n "$P-gwa" -4 addr show dev eth0 | grep -q 198.18.100.1/ &&
      nsx lan python3 -c 'import socket; socket.create_connection(("198.19.0.10", 7001), timeout=0.5).close()' 2>/dev/null; then
      sleep 2   # both nodes' conntrackd running, the backup's links probed
      return 0
    fi
    sleep 0.1
  done
  echo "the $1 pair did not come up" >&2
  for f in "$work"/*.log; do echo "== $f" >&2; tail -n 20 "$f" >&2; done
  return 1
}

round() {  # round fulcrum|keepalived: prints "gap_ms bytes outcome"
  build_net
  nsx inet python3 "$work/server.py" &
  pids+=($!)
  start_pair "$1"
  rm -f "$work/started"
  nsx lan python3 "$work/client.py" "$work/started" >"$work/result" &
  local client=$!
  while [ ! -e "$work/started" ]; do sleep 0.05; done
  sleep 1.5
  if [ "$1" = fulcrum ]; then
    kill -9 "$pid_gwa"
  else
    kill -9 "$pid_gwa" "$ct_gwa"
    pkill -9 -f "$work/gwa-keepalived.conf" || true
  fi
  for i in eth0 wan0 wan1 sync0; do ip -n "$P-gwa" link set "$i" down; done
  wait "$client" || true
  cat "$work/result"
  # A round that broke keeps its logs for a look (KEEP_FAILED=DIR).
  if [ -n "${KEEP_FAILED:-}" ] && ! grep -q complete "$work/result"; then
    mkdir -p "$KEEP_FAILED" && cp -r "$work" "$KEEP_FAILED/$1-$(date +%s)"
  fi
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  pkill -9 -f "$work/" 2>/dev/null || true
  wait 2>/dev/null || true
  pids=()
  for n in "${NS[@]}"; do ip netns del "$P-$n" 2>/dev/null || true; done
  plug=0
}

summary=()
for who in ${WHO:-fulcrum keepalived}; do
  gaps=()
  ok=0
  for r in $(seq 1 "$ROUNDS"); do
    round "$who" >"$work/round.out"
    read -r gap bytes how <"$work/round.out"
    echo "$who round $r: longest pause ${gap} ms, ${bytes} bytes, ${how}"
    gaps+=("$gap")
    [ "$how" = complete ] && ok=$((ok + 1))
  done
  summary+=("$(printf '%-11s median longest pause %s ms; %d of %d downloads complete' "$who" "$(median "${gaps[@]}")" "$ok" "$ROUNDS")")
done
printf '%s\n' "${summary[@]}"

#!/bin/bash
# End to end in network namespaces: requests/s (a new connection per request, and keep-alive)
# and the balancer's CPU per connection of Fulcrum `forwarding = "dr"` and `"nat"` (XDP,
# generic mode on veth) against Fulcrum `forwarding = "proxy"` (tcp) and HAProxy `mode tcp`.
# Needs root, wrk, nginx, haproxy, bpftool. Creates its own namespaces (removed on exit) and
# sends traffic only inside them (198.18.0.0/15).
#
# usage: bench/xdp-e2e.sh [SECONDS_PER_RUN] [ROUNDS]     (default 5 s, 3 rounds)
#   FULCRUM_BIN=path   the fulcrum binary (default target/$PROFILE/fulcrum with PROFILE=release, else target/debug)
#   MODES="dr nat proxy haproxy"   which balancers to measure (default these four); also
#                      "dr-native": dr with xdp_mode = "native", an XDP_PASS program attached
#                      natively to the peer veth (without it native XDP_TX frames are lost,
#                      see docs/xdp.md)
#
# Topologies are those of crates/fulcrum/tests/xdp.rs:
#   dr:   client, balancer and 3 members on one bridge; the VIP on the members' lo
#         (arp_ignore/arp_announce), replies member -> client directly.
#   nat:  client -- balancer eth0; balancer eth1 -- bridge -- 3 members, whose default route
#         is the balancer. proxy and HAProxy run in this topology too (VIP on the balancer's lo).
# Transmit checksum offload off on the client and members; XDP in generic mode.
#
# CPU of the balancer:
#   proxy, haproxy: utime+stime of the process (/proc/PID/stat) during the run.
#   dr, nat: the XDP program's own run time (kernel.bpf_stats_enabled, run_time_ns of the
#   attached program) plus the Fulcrum process's utime+stime: a lower bound, without generic
#   XDP's skb work around the program.
#   Whole machine, for all: system-wide system+softirq time (/proc/stat) of the run minus an
#   idle run of the same duration, per connection, minus the same for the client talking to a
#   member directly (no balancer), plus the balancer's utime: an estimate of everything the
#   balancer hop adds; tick-sampled and noisy on a shared machine (see bench/RESULTS.md).
set -euo pipefail
cd "$(dirname "$0")/.."

D=${1:-5}
ROUNDS=${2:-3}
[ "$D" -ge 1 ] && [ "$D" -le 60 ] || { echo "SECONDS_PER_RUN must be 1..60" >&2; exit 2; }
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 10 ] || { echo "ROUNDS must be 1..10" >&2; exit 2; }
BIN=${FULCRUM_BIN:-}
if [ -z "$BIN" ]; then
    if [ -x "target/${PROFILE:-release}/fulcrum" ]; then BIN=target/${PROFILE:-release}/fulcrum; else BIN=target/debug/fulcrum; fi
fi
BIN=$(realpath -m "$BIN")
[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 2; }
for t in wrk nginx haproxy bpftool ethtool; do
    command -v "$t" >/dev/null || { echo "missing $t" >&2; exit 2; }
done

ulimit -n "$(ulimit -Hn)"
P="xe$$"
TMP=$(mktemp -d)
NSS=()
PIDS=()
STATS_BEFORE=$(sysctl -n kernel.bpf_stats_enabled)
cleanup() {
    set +e
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 0.3
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    for n in "${NSS[@]}"; do ip netns del "$n" 2>/dev/null; done
    sysctl -qw kernel.bpf_stats_enabled="$STATS_BEFORE"
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

ns() { NSS+=("$P-$1"); ip netns add "$P-$1"; ip -n "$P-$1" link set lo up; }
x() { local n=$1; shift; ip netns exec "$P-$n" "$@"; }
veth() { # ns1 if1 ns2 if2
    ip link add "${P}t" type veth peer name "${P}u"
    ip link set "${P}t" netns "$P-$1" name "$2"
    ip link set "${P}u" netns "$P-$3" name "$4"
    ip -n "$P-$1" link set "$2" up
    ip -n "$P-$3" link set "$4" up
}
bridge() { ns "$1"; ip -n "$P-$1" link add br0 type bridge; ip -n "$P-$1" link set br0 up; }
plug() { veth "$1" "$2" "$3" "$4"; ip -n "$P-$3" link set "$4" master br0; }

# --- members: nginx, one worker, a tiny static page --------------------------------------
mkdir -p "$TMP/www"
echo ok > "$TMP/www/index.html"
start_nginx() { # ns
    local d="$TMP/nginx-$1"
    mkdir -p "$d"
    cat > "$d/nginx.conf" <<EOF
user root;
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log $d/error.log;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $d; proxy_temp_path $d; fastcgi_temp_path $d;
    uwsgi_temp_path $d; scgi_temp_path $d;
    keepalive_requests 1000000;
    server { listen 80 backlog=4096; root $TMP/www; }
}
EOF
    # ip netns exec directly (not the x function): $! must be nginx itself, not a subshell
    ip netns exec "$P-$1" nginx -c "$d/nginx.conf" -p "$d" </dev/null >/dev/null 2>&1 &
    PIDS+=($!)
}
tune_host() { # ns
    x "$1" ethtool -K eth0 tx off >/dev/null
    x "$1" sysctl -qw net.ipv4.tcp_tw_reuse=1 net.ipv4.ip_local_port_range="1024 65000" \
        net.core.somaxconn=4096
}

# --- DR topology: prefix d* --------------------------------------------------------------
bridge dsw; ns dcl; ns dlb
plug dcl eth0 dsw p-cl; plug dlb eth0 dsw p-lb
ip -n "$P-dcl" addr add 198.18.0.2/24 dev eth0
ip -n "$P-dlb" addr add 198.18.0.1/24 dev eth0
ip -n "$P-dcl" route add 198.18.10.1/32 via 198.18.0.1
tune_host dcl
for i in 1 2 3; do
    ns dm$i; plug dm$i eth0 dsw p-m$i
    ip -n "$P-dm$i" addr add 198.18.0.1$i/24 dev eth0
    ip -n "$P-dm$i" addr add 198.18.10.1/32 dev lo
    x dm$i sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2
    tune_host dm$i
    start_nginx dm$i
done

# --- NAT topology (also proxy and HAProxy): prefix n* ------------------------------------
bridge nsw; ns ncl; ns nlb
veth ncl eth0 nlb eth0
plug nlb eth1 nsw p-lb
ip -n "$P-ncl" addr add 198.18.0.2/24 dev eth0
ip -n "$P-nlb" addr add 198.18.0.1/24 dev eth0
ip -n "$P-nlb" addr add 198.18.1.1/24 dev eth1
x nlb sysctl -qw net.ipv4.ip_forward=1 net.ipv4.ip_local_port_range="1024 65000" \
    net.ipv4.tcp_tw_reuse=1 net.core.somaxconn=4096
ip -n "$P-ncl" route add 198.18.10.1/32 via 198.18.0.1
tune_host ncl
for i in 1 2 3; do
    ns nm$i; plug nm$i eth0 nsw p-m$i
    ip -n "$P-nm$i" addr add 198.18.1.1$i/24 dev eth0
    ip -n "$P-nm$i" route add default via 198.18.1.1
    tune_host nm$i
    start_nginx nm$i
done

# --- balancers ---------------------------------------------------------------------------
fulcrum_conf() { # mode -> config file
    local mode=$1 f="$TMP/fulcrum-$1.toml" net=1 ifs='["eth0", "eth1"]' extra="" xm=generic
    if [ "$mode" = dr-native ]; then mode=dr; xm=native; fi
    if [ "$mode" = dr ]; then net=0; ifs='["eth0"]'; fi
    if [ "$mode" != proxy ]; then
        extra="forwarding = \"$mode\"
interfaces = $ifs
xdp_mode = \"$xm\""
    fi
    cat > "$f" <<EOF
[admin]
listen = "127.0.0.1:9900"

[[virtual_service]]
name = "web"
listen = "198.18.10.1:80"
protocol = "tcp"
pool = "web"
$extra

[[pool]]
name = "web"
algorithm = "hash"
$(for i in 1 2 3; do printf '[[pool.member]]\naddress = "198.18.%s.1%s:80"\n' $net $i; done)
EOF
    echo "$f"
}
BAL_PID=""
start_balancer() { # kind
    local kind=$1 lbns=nlb log="$TMP/$1.log"
    case $kind in dr*) lbns=dlb ;; esac
    if [ "$kind" = dr-native ]; then
        ip -n "$P-dsw" link set dev p-lb xdpdrv obj crates/fulcrum-xdp/bpf/fulcrum_xdp.o program xdp_pass
    fi
    case $kind in
    proxy|haproxy) ip -n "$P-nlb" addr add 198.18.10.1/32 dev lo ;;
    esac
    case $kind in
    haproxy)
        cat > "$TMP/haproxy.cfg" <<EOF
global
    maxconn 4000
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend web
    bind 198.18.10.1:80
    default_backend web
backend web
    balance source
    server m1 198.18.1.11:80
    server m2 198.18.1.12:80
    server m3 198.18.1.13:80
EOF
        ip netns exec "$P-$lbns" haproxy -db -f "$TMP/haproxy.cfg" </dev/null >"$log" 2>&1 &
        ;;
    *)
        local conf
        conf=$(fulcrum_conf "$kind")
        ip netns exec "$P-$lbns" "$BIN" run -c "$conf" </dev/null >"$log" 2>&1 &
        ;;
    esac
    BAL_PID=$!
    PIDS+=("$BAL_PID")
    # Ready when a request through the VIP is answered (XDP: once next hops are resolved).
    local cl=ncl
    case $kind in dr*) cl=dcl ;; esac
    for _ in $(seq 1 200); do
        if x $cl curl -s --max-time 1 -o /dev/null -w '%{http_code}' http://198.18.10.1/ 2>/dev/null \
            | grep -q 200; then
            # every member reachable (XDP resolves next hops one by one)
            sleep 2
            return 0
        fi
        sleep 0.1
    done
    echo "$kind did not come up:" >&2; cat "$log" >&2; exit 1
}
stop_balancer() {
    kill "$BAL_PID" 2>/dev/null || true
    wait "$BAL_PID" 2>/dev/null || true
    ip -n "$P-nlb" addr del 198.18.10.1/32 dev lo 2>/dev/null || true
    ip -n "$P-dsw" link set dev p-lb xdpdrv off 2>/dev/null || true
    sleep 0.5
}

# --- measurement -------------------------------------------------------------------------
HZ=$(getconf CLK_TCK)
stat_cpu() { awk '/^cpu /{print $2+$3, $4, $7}' /proc/stat; } # user+nice system softirq
proc_cpu() { awk '{print $14, $15}' "/proc/$1/stat"; }        # utime stime
xdp_prog_ids() { # ns: ids of the XDP programs attached in that namespace
    ip -n "$P-$1" link show | grep -o 'prog/xdp id [0-9]*' | awk '{print $3}' | sort -u
}
prog_time() { # ids... -> run_time_ns run_cnt (sum)
    local t=0 c=0 id j
    for id in "$@"; do
        j=$(bpftool prog show id "$id" 2>/dev/null || true)
        t=$((t + $(echo "$j" | grep -o 'run_time_ns [0-9]*' | awk '{print $2+0}' | head -1 || echo 0)))
        c=$((c + $(echo "$j" | grep -o 'run_cnt [0-9]*' | awk '{print $2+0}' | head -1 || echo 0)))
    done
    echo "$t $c"
}
RESULTS="$TMP/results"
: > "$RESULTS"
# run KIND CONN CLIENT_NS URL: one wrk run, one result line:
# kind conn requests user system softirq proc_ticks prog_ns prog_cnt proc_utime_ticks
run() {
    local kind=$1 conn=$2 cl=$3 url=$4 hdr=() ids=() s0 s1 p0="0 0" p1="0 0" b0="0 0" b1="0 0" out req
    [ "$conn" = close ] && hdr=(-H "Connection: close")
    case $kind in dr*) mapfile -t ids < <(xdp_prog_ids dlb) ;; nat) mapfile -t ids < <(xdp_prog_ids nlb) ;; esac
    [ ${#ids[@]} -gt 0 ] && b0=$(prog_time "${ids[@]}")
    case $kind in idle|direct) ;; *) p0=$(proc_cpu "$BAL_PID") ;; esac
    s0=$(stat_cpu)
    if [ "$kind" = idle ]; then
        sleep "$D"; req=0
    else
        out=$(x $cl timeout $((D + 10)) wrk -t2 -c16 -d"${D}s" "${hdr[@]}" "$url" 2>&1)
        req=$(echo "$out" | awk '/requests in/{print $1}')
        if echo "$out" | grep -qE 'Socket errors|Non-2xx'; then
            echo "$kind/$conn: $(echo "$out" | grep -E 'Socket errors|Non-2xx')" >&2
        fi
    fi
    s1=$(stat_cpu)
    case $kind in idle|direct) ;; *) p1=$(proc_cpu "$BAL_PID") ;; esac
    [ ${#ids[@]} -gt 0 ] && b1=$(prog_time "${ids[@]}")
    read -r u0 y0 q0 <<<"$s0"; read -r u1 y1 q1 <<<"$s1"
    read -r bt0 bc0 <<<"$b0"; read -r bt1 bc1 <<<"$b1"
    read -r pu0 ps0 <<<"$p0"; read -r pu1 ps1 <<<"$p1"
    echo "$kind $conn ${req:-0} $((u1 - u0)) $((y1 - y0)) $((q1 - q0)) $((pu1 - pu0 + ps1 - ps0)) $((bt1 - bt0)) $((bc1 - bc0)) $((pu1 - pu0))" \
        | tee -a "$RESULTS" >&2
}

sysctl -qw kernel.bpf_stats_enabled=1
echo "# fulcrum: $BIN; $D s per run, $ROUNDS rounds; load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$ROUNDS"); do
    echo "# round $r (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    run idle - - -
    for c in close keepalive; do run direct $c dcl http://198.18.0.11/; done
    for kind in ${MODES:-dr nat proxy haproxy}; do
        start_balancer $kind
        cl=ncl; case $kind in dr*) cl=dcl ;; esac
        for c in close keepalive; do run $kind $c $cl http://198.18.10.1/; done
        stop_balancer
    done
done
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# --- summary: medians over rounds ---------------------------------------------------------
awk -v D="$D" -v HZ="$HZ" '
function median(key,   n, i, j, t, a) {
    n = split(vals[key], a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function add(key, v) { vals[key] = vals[key] " " v }
function m(key, fmt) { return (key in vals) ? sprintf(fmt, median(key)) : "-" }
# kernel busy = system + softirq ticks, system-wide (user time left out: the concurrent builds own most of it)
$1 == "idle" { ib[++ni] = ($5 + $6) / HZ * 1e6; next }
{ r = ++seen[$1 " " $2]; k = $1 " " $2; reqs[k, r] = $3; busy[k, r] = ($5 + $6) / HZ * 1e6
  proc[k, r] = $7 / HZ * 1e6; prog[k, r] = $8 / 1000; ut[k, r] = $10 / HZ * 1e6; rounds[k] = r }
END {
    printf "| mode | conn | req/s | balancer process CPU us/conn | XDP program us/conn | balancer CPU us/conn | conns per balancer CPU-s | whole machine: extra CPU us/conn vs direct (system-wide sys+softirq, plus the balancer utime) |\n"
    printf "|---|---|---|---|---|---|---|---|\n"
    nk = split("direct dr dr-native nat proxy haproxy", kinds, " ")
    split("close keepalive", conns, " ")
    for (ki = 1; ki <= nk; ki++) for (ci = 1; ci <= 2; ci++) {
        k = kinds[ki] " " conns[ci]
        for (r = 1; r <= rounds[k]; r++) {
            n = reqs[k, r]; if (n == 0) continue
            add(k " rps", n / D)
            bpc = (busy[k, r] - ib[r]) / n
            if (kinds[ki] == "direct") { directb[conns[ci], r] = bpc; continue }
            add(k " extra", bpc - directb[conns[ci], r] + ut[k, r] / n)
            add(k " proc", proc[k, r] / n)
            if (kinds[ki] ~ /^(dr|nat)/) add(k " prog", prog[k, r] / n)
            add(k " bal", (proc[k, r] + prog[k, r]) / n)
            add(k " cps", n / ((proc[k, r] + prog[k, r]) / 1e6 + 1e-9))
        }
        if (!(k " rps" in vals)) continue
        printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", kinds[ki], conns[ci], m(k " rps", "%.0f"),
            m(k " proc", "%.2f"), m(k " prog", "%.2f"), m(k " bal", "%.2f"), m(k " cps", "%.0f"),
            m(k " extra", "%.1f")
    }
}' "$RESULTS"
echo
echo "raw (kind conn requests user_ticks system_ticks softirq_ticks balancer_utime+stime_ticks xdp_prog_ns xdp_prog_runs balancer_utime_ticks; ticks of $HZ Hz):"
cat "$RESULTS"

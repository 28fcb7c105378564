#!/usr/bin/env bash
# Authoritative DNS: Fulcrum against gdnsd (Debian), the same zone and a two-site dynamic name
# (Fulcrum: a GSLB name with round_robin over two sites; gdnsd: plugin_weighted, equal weights),
# same set-up as bench/tcp.sh: each server pinned alone on one CPU with one UDP thread, dnsperf
# (4 clients) on the other. Reports queries/s, the server's CPU time per query and lost queries;
# medians of ROUNDS runs of SECS seconds, alternating servers.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-10} CLIENTS=${CLIENTS:-4}
need dnsperf; need gdnsd
bench_build -p fulcrum

bench_workdir

ZONE='$TTL 300
@       IN SOA ns1 hostmaster 2024010101 3600 600 86400 60
        IN NS  ns1
ns1     IN A   192.0.2.1
www     IN A   192.0.2.80
www     IN A   192.0.2.81
mail    IN MX  10 mx1
mx1     IN A   192.0.2.25
'
mkdir -p "$work/gdnsd/zones"
printf '%s' "$ZONE" >"$work/example.com.zone"
{ printf '%s' "$ZONE"; echo 'app 30 DYNA weighted!app'; } >"$work/gdnsd/zones/example.com"

cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:18900")
[dns]
listen = "127.0.0.1:18353"
[[dns.zone]]
origin = "example.com."
file = "$work/example.com.zone"
[[gslb.site]]
name = "east"
addresses = ["192.0.2.10"]
[[gslb.site]]
name = "west"
addresses = ["192.0.2.20"]
[[gslb.name]]
fqdn = "app.example.com."
sites = ["east", "west"]
algorithm = "round_robin"
ttl = 30
CONF
cat >"$work/gdnsd/config" <<CONF
options => {
  listen => [ 127.0.0.1 ]
  dns_port => 18354
  udp_threads => 1
  tcp_threads => 1
}
plugins => {
  weighted => {
    multi = false
    service_types = up
    app => {
      east = [ 192.0.2.10, 1 ]
      west = [ 192.0.2.20, 1 ]
    }
  }
}
CONF

RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" $BUILD_DIR/fulcrum run -c "$work/fulcrum.toml" &
fulcrum_pid=$!; pids+=($fulcrum_pid)
taskset -c "$BENCH_CPU_PROXY" gdnsd -c "$work/gdnsd" start 2>"$work/gdnsd.log" &
gdnsd_pid=$!; pids+=($gdnsd_pid)
for port in 18353 18354; do
  for _ in $(seq 100); do
    dig +short +time=1 +tries=1 @127.0.0.1 -p $port www.example.com A >/dev/null 2>&1 && break
    sleep 0.1
  done
done
# Same answers from both before measuring.
for name in www.example.com app.example.com nope.example.com; do
  f=$(dig +norec @127.0.0.1 -p 18353 $name A | grep -c 'status: NOERROR\|status: NXDOMAIN')
  g=$(dig +norec @127.0.0.1 -p 18354 $name A | grep -c 'status: NOERROR\|status: NXDOMAIN')
  [ "$f" = 1 ] && [ "$g" = 1 ] || { echo "unexpected answer for $name" >&2; exit 1; }
done

printf 'www.example.com A\n' >"$work/q-static"
printf 'app.example.com A\n' >"$work/q-dynamic"
printf 'www.example.com A\napp.example.com A\nmail.example.com MX\nnope.example.com A\nmx1.example.com AAAA\n' >"$work/q-mixed"

# dnsperf_run PID PORT QUERYFILE: prints "completed lost qps cpu_us_per_query"
dnsperf_run() {
  local pid=$1 port=$2 file=$3 before after out done lost qps
  before=$(cpu_ticks "$pid")
  out=$(taskset -c "$BENCH_CPU_LOAD" dnsperf -s 127.0.0.1 -p "$port" -d "$file" -l "$SECS" -c "$CLIENTS" -T 1 2>&1)
  after=$(cpu_ticks "$pid")
  done=$(awk '/Queries completed:/ {print $3}' <<<"$out")
  lost=$(awk '/Queries lost:/ {print $3}' <<<"$out")
  qps=$(awk '/Queries per second:/ {printf "%.0f", $4}' <<<"$out")
  awk -v d="$done" -v l="$lost" -v q="$qps" -v t=$((after - before)) -v hz="$CLK_TCK" \
    'BEGIN { printf "%s %s %s %.2f\n", d, l, q, (d > 0 ? t / hz * 1e6 / d : 0) }'
}

declare -A cpu qps lost
for round in $(seq "$ROUNDS"); do
  for mix in static dynamic mixed; do
    for peer in fulcrum gdnsd; do
      if [ $peer = fulcrum ]; then pid=$fulcrum_pid port=18353; else pid=$gdnsd_pid port=18354; fi
      read -r d l q c <<<"$(dnsperf_run "$pid" "$port" "$work/q-$mix")"
      cpu[$peer,$mix]+="$c "; qps[$peer,$mix]+="$q "; lost[$peer,$mix]+="$l "
      echo "round $round $mix $peer: $q queries/s, cpu/query ${c}us, completed $d, lost $l" >&2
    done
  done
done

row() {  # row LABEL MIX
  local f g
  f=$(median ${cpu[fulcrum,$2]}); g=$(median ${cpu[gdnsd,$2]})
  printf '| %s: CPU per query (µs) | %s | %s | %s |\n' "$1" "$f" "$g" "$(ratio "$f" "$g")"
  f=$(median ${qps[fulcrum,$2]}); g=$(median ${qps[gdnsd,$2]})
  printf '| %s: queries/s | %s | %s | %s |\n' "$1" "$f" "$g" "$(ratio "$f" "$g")"
  f=$(awk '{s=0; for (i=1; i<=NF; i++) s+=$i; print s}' <<<"${lost[fulcrum,$2]}")
  g=$(awk '{s=0; for (i=1; i<=NF; i++) s+=$i; print s}' <<<"${lost[gdnsd,$2]}")
  printf '| %s: queries lost (all rounds) | %s | %s | |\n' "$1" "$f" "$g"
}
echo
echo "| DNS, dnsperf $CLIENTS clients, median of $ROUNDS × ${SECS}s | Fulcrum | gdnsd $(gdnsd -h 2>&1 | awk '/version/ {print $3; exit}') | Fulcrum ÷ gdnsd |"
echo "|---|---|---|---|"
row "static name (www A)" static
row "two-site dynamic name (app A)" dynamic
row "mix (static, dynamic, MX, NXDOMAIN, NODATA)" mixed

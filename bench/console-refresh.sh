#!/usr/bin/env bash
# Dashboard refresh cost on the admin thread: CPU time the fulcrum process spends answering the
# six API calls one dashboard refresh makes (status, pools, history since the last sample, audit,
# alerts, gslb/sites), with MEMBERS pool members, minus the idle cost (sampler, health checks)
# over the same wall time.
# Usage: bench/console-refresh.sh [BIN] [MEMBERS] [REFRESHES]
set -euo pipefail
bin=${1:-target/debug/fulcrum}
members=${2:-50}
refreshes=${3:-300}
dir=$(mktemp -d)
trap 'rc=$?; kill $pid 2>/dev/null; [ $rc = 0 ] || cat "$dir/log" >&2; rm -rf "$dir"' EXIT
admin=127.0.0.1:$((20000 + RANDOM % 20000))
vs=127.0.0.1:$((20000 + RANDOM % 20000))
{
  echo "[admin]"; echo "listen = \"$admin\""
  echo "[[virtual_service]]"; echo 'name = "svc"'; echo "listen = [\"$vs\"]"; echo 'protocol = "tcp"'; echo 'pool = "p"'
  echo "[[pool]]"; echo 'name = "p"'
  for i in $(seq 1 "$members"); do echo "[[pool.member]]"; echo "address = \"127.0.0.$((i / 250 + 2)):$((10000 + i))\""; done
} > "$dir/f.toml"
"$bin" run -c "$dir/f.toml" 2>"$dir/log" & pid=$!
for _ in $(seq 100); do curl -sf "http://$admin/api/v1/status" >/dev/null && break; sleep 0.1; done
sleep 3 # a few samples in the ring
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
urls=()
for _ in $(seq "$refreshes"); do
  urls+=("http://$admin/api/v1/status" "http://$admin/api/v1/pools" "http://$admin/api/v1/history?since=$(date +%s)"
         "http://$admin/api/v1/audit" "http://$admin/api/v1/alerts" "http://$admin/api/v1/gslb/sites")
done
t0=$(date +%s.%N); c0=$(ticks)
curl -s "${urls[@]}" >/dev/null          # one connection, as the page's keep-alive
t1=$(date +%s.%N); c1=$(ticks)
wall=$(echo "$t1 - $t0" | bc -l)
sleep "$wall"; c2=$(ticks)                 # idle over the same wall time
busy=$(echo "($c1 - $c0) / $hz" | bc -l); idle=$(echo "($c2 - $c1) / $hz" | bc -l)
bytes=$(curl -s "http://$admin/api/v1/pools" | wc -c)
printf 'members=%d refreshes=%d wall=%.2fs cpu=%.3fs idle=%.3fs\n' "$members" "$refreshes" "$wall" "$busy" "$idle"
printf 'CPU per dashboard refresh: %.3f ms (6 requests; /api/v1/pools is %d bytes)\n' \
  "$(echo "($busy - $idle) * 1000 / $refreshes" | bc -l)" "$bytes"

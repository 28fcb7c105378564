#!/usr/bin/env bash
# HTTP response compression: Fulcrum (`compression`, gzip at LEVEL) against nginx (`gzip on`,
# gzip_comp_level LEVEL) in front of the same nginx member serving a static HTML page (about
# 128 KiB, uncompressed, with Content-Length). Same loopback set-up as bench/http.sh: each proxy
# pinned alone on one CPU, wrk (Accept-Encoding: gzip) and the member on the other. Reports the
# proxy's CPU time per MiB of original body, req/s and p99; medians of ROUNDS runs of SECS
# seconds, alternating peers. Also runs Fulcrum with brotli (level 4) and zstd (level 3), and
# prints each proxy's compressed size of the page.
#
# FULCRUM=path compares another build (e.g. one with a different flate2 backend).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
ROUNDS=${ROUNDS:-3} SECS=${SECS:-8} CONNS=${CONNS:-16} LEVEL=${LEVEL:-6}
need nginx; need wrk; need curl
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ "$FULCRUM" = "$BUILD_DIR/fulcrum" ] && bench_build -p fulcrum
ulimit -n "$(ulimit -Hn)"

# Ports of their own, so this can run beside the other benches.
M=18411 F=18480 N=18482 B=18483 Z=18484 FA=18490 BA=18491 ZA=18492
bench_workdir

# A realistic page: a product table with varied numbers and names (compresses about 8:1 with
# gzip -6, like real HTML).
mkdir -p "$work/www"
python3 - "$work/www/page.html" <<'PY'
import random, sys
random.seed(7)
words = "alpha beta gamma delta widget gadget sprocket bolt nut washer cable adapter module sensor".split()
rows = []
for i in range(1150):
    name = " ".join(random.choice(words).capitalize() for _ in range(3))
    rows.append(f'<tr class="r{i%2}"><td><a href="/p/{random.randint(10000,99999)}">{name}</a></td>'
                f'<td>{random.randint(1,999)}.{random.randint(0,99):02d} EUR</td><td>{random.choice(["in stock","2 days","sold out"])}</td></tr>')
html = ('<!doctype html><html><head><meta charset="utf-8"><title>Catalogue</title>'
        '<link rel="stylesheet" href="/s.css"></head><body><table>\n' + "\n".join(rows) + '\n</table></body></html>\n')
open(sys.argv[1], "w").write(html)
PY
size=$(stat -c %s "$work/www/page.html")
chmod 755 "$work" "$work/www"; chmod 644 "$work/www/page.html"   # nginx workers run as nobody

cat >"$work/member.conf" <<CONF
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/member.pid;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  include /etc/nginx/mime.types;
  server { listen 127.0.0.1:$M; root $work/www; gzip off; }
}
CONF
taskset -c "$BENCH_CPU_LOAD" nginx -p "$work" -c "$work/member.conf" 2>"$work/member.err" &
pids+=($!)
wait_port 127.0.0.1:$M

fulcrum_conf() {  # fulcrum_conf PORT ADMIN ALGORITHM LEVEL
  cat <<CONF
$(fulcrum_head "127.0.0.1:$2")
[[virtual_service]]
name = "bench"
listen = "127.0.0.1:$1"
protocol = "http"
pool = "member"
forward_headers = { x_forwarded_host = false, via = false }
compression = { algorithms = ["$3"], min_size = 1024, types = ["text/*", "application/json"], levels = { $3 = $4 } }
[[pool]]
name = "member"
reuse = "safe"
[[pool.member]]
address = "127.0.0.1:$M"
CONF
}
fulcrum_conf $F $FA gzip "$LEVEL" >"$work/fulcrum.toml"
fulcrum_conf $B $BA br 4 >"$work/br.toml"
fulcrum_conf $Z $ZA zstd 3 >"$work/zstd.toml"
for c in fulcrum br zstd; do
  RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/$c.toml" &
  pids+=($!); eval "${c}_pid=$!"
done

cat >"$work/proxy.conf" <<CONF
master_process off;
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/proxy.pid;
events { worker_connections 9000; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream member { server 127.0.0.1:$M; keepalive 64; }
  gzip on;
  gzip_comp_level $LEVEL;
  gzip_min_length 1024;
  gzip_types text/plain text/css application/json;
  gzip_proxied any;
  gzip_vary on;
  server {
    listen 127.0.0.1:$N;
    location / {
      proxy_pass http://member;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
CONF
taskset -c "$BENCH_CPU_PROXY" nginx -p "$work" -c "$work/proxy.conf" 2>"$work/proxy.err" &
nginx_pid=$!; pids+=($nginx_pid)
for p in $F $N $B $Z; do wait_port 127.0.0.1:$p; done

pid_of() { case $1 in fulcrum) echo $fulcrum_pid;; nginx) echo $nginx_pid;; br) echo $br_pid;; zstd) echo $zstd_pid;; esac; }
port_of() { case $1 in fulcrum) echo $F;; nginx) echo $N;; br) echo $B;; zstd) echo $Z;; esac; }
coding_of() { case $1 in fulcrum|nginx) echo gzip;; *) echo "$1";; esac; }

# Every proxy must really compress, and the result must decode to the page.
declare -A csize
for peer in fulcrum nginx br zstd; do
  c=$(coding_of $peer)
  curl -s -H "Accept-Encoding: $c" -D "$work/h" -o "$work/body.$peer" "http://127.0.0.1:$(port_of $peer)/page.html"
  grep -qi "^content-encoding: $c" "$work/h" || { echo "$peer did not compress:" >&2; cat "$work/h" >&2; exit 1; }
  case $c in gzip) gzip -dc ;; br) brotli -dc ;; zstd) zstd -dcq ;; esac <"$work/body.$peer" | cmp -s - "$work/www/page.html" \
    || { echo "$peer: the decoded body differs from the page" >&2; exit 1; }
  csize[$peer]=$(stat -c %s "$work/body.$peer")
done

# CPU ms per MiB of original body, from wrk_run's CPU µs per request.
per_mib() { awk -v us="$1" -v s="$size" 'BEGIN { printf "%.2f", us / 1000 / (s / 1048576) }'; }

declare -A cpu rps p99
peers=(fulcrum nginx br zstd)
for round in $(seq "$ROUNDS"); do
  for peer in "${peers[@]}"; do
    read -r _ c r p <<<"$(wrk_run "$(pid_of $peer)" "http://127.0.0.1:$(port_of $peer)/page.html" "$SECS" "$CONNS" -H "Accept-Encoding: $(coding_of $peer)")"
    m=$(per_mib "$c")
    cpu[$peer]+="$m "; rps[$peer]+="$r "; p99[$peer]+="$p "
    echo "round $round $peer: cpu ${m}ms/MiB req/s $r p99 ${p}ms" >&2
  done
done

row() {  # row LABEL ARRAY
  local -n a=$2
  local f n b z
  f=$(median ${a[fulcrum]}); n=$(median ${a[nginx]}); b=$(median ${a[br]}); z=$(median ${a[zstd]})
  printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$f" "$n" "$(ratio "$f" "$n")" "$b" "$z"
}
echo
echo "| Compression, $size-byte HTML page, $CONNS connections, median of $ROUNDS × ${SECS}s | Fulcrum gzip $LEVEL | nginx $(nginx -v 2>&1 | sed 's|.*/||') gzip_comp_level $LEVEL | Fulcrum ÷ nginx | Fulcrum br 4 | Fulcrum zstd 3 |"
echo "|---|---|---|---|---|---|"
row "proxy CPU per MiB of original body (ms)" cpu
row "requests/s" rps
row "p99 latency (ms)" p99
printf '| compressed size (bytes) | %s | %s | %s | %s | %s |\n' "${csize[fulcrum]}" "${csize[nginx]}" "$(ratio "${csize[fulcrum]}" "${csize[nginx]}")" "${csize[br]}" "${csize[zstd]}"

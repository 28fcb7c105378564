# Shared helpers for the benchmarks: pinning, CPU accounting, wrk parsing, medians.
# Sourced by the bench scripts; all traffic stays on 127.0.0.1.

BENCH_CPU_PROXY=${BENCH_CPU_PROXY:-0}   # the proxy under test runs alone on this CPU
BENCH_CPU_LOAD=${BENCH_CPU_LOAD:-1}     # load generator and backends share this one
CLK_TCK=$(getconf CLK_TCK)

# PROFILE=release (default): the fat-LTO build whose figures get published. PROFILE=bench-fast:
# the same without LTO and with 16 codegen units, which builds in a fraction of the time on two
# cores; use it while iterating and say so next to any figure it produced.
PROFILE=${PROFILE:-release}
BUILD_DIR=target/$PROFILE
bench_cert() {  # bench_cert DIR: self-signed ECDSA P-256 site.key, site.crt, site.pem (bench.test, 127.0.0.1)
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -keyout "$1/site.key" -out "$1/site.crt" -subj /CN=bench.test \
    -addext subjectAltName=DNS:bench.test,IP:127.0.0.1 2>/dev/null
  cat "$1/site.crt" "$1/site.key" >"$1/site.pem"
}

hello_members() {  # hello_members PORT1 PORT2: two nginx members answering "hello, world" on
  # 127.0.0.1 (one worker on the load CPU, keep-alive without a request limit); uses the caller's
  # $work and pids, waits until the first listens.
  cat >"$work/members.conf" <<CONF
worker_processes 1;
daemon off;
error_log stderr error;
pid $work/members.pid;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$1 reuseport; location / { return 200 "hello, world\n"; } }
  server { listen 127.0.0.1:$2 reuseport; location / { return 200 "hello, world\n"; } }
}
CONF
  taskset -c "$BENCH_CPU_LOAD" nginx -p "$work" -c "$work/members.conf" 2>"$work/members.err" &
  pids+=($!)
  wait_port "127.0.0.1:$1"
}

bench_workdir() {  # a temporary folder $work and a list $pids: when the script exits, every
  # process in $pids is stopped and $work removed
  work=$(mktemp -d)
  pids=()
  trap bench_cleanup EXIT
}
bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}

fulcrum_member_pool() {  # fulcrum_member_pool PORT1 PORT2: the TOML of the benchmarks' Fulcrum pool
  # "nginx": the two hello members on 127.0.0.1, round robin, member connections reused.
  printf '[[pool]]\nname = "nginx"\nalgorithm = "round_robin"\nreuse = "safe"\n'
  printf '[[pool.member]]\naddress = "127.0.0.1:%s"\n' "$1" "$2"
}

# BENCH_PREBUILT=1: use the binaries already in target/$PROFILE as they are. One script builds
# `-p fulcrum` alone and another `-p fulcrum -p fulcrum-testkit`: Cargo unifies features per
# invocation, so alternating them rebuilds the fat-LTO binary each time (many minutes here);
# build once (`-p fulcrum`, then `-p fulcrum-testkit --bins` on its own) and run them all.
bench_build() {  # bench_build CARGO_BUILD_ARGS...: builds in $PROFILE
  [ "${BENCH_PREBUILT:-0}" = 1 ] && return 0
  cargo build --profile "$PROFILE" -q "$@"
}

need() {  # need PACKAGE [COMMAND]: installs a Debian package when its command is missing
  local pkg=$1 cmd=${2:-$1}
  command -v "$cmd" >/dev/null 2>&1 && return 0
  echo "installing $pkg" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
}

cpu_ticks() {  # user+system clock ticks of a process and its threads
  awk '{print $14 + $15}' "/proc/$1/stat"
}

rss_kib() {
  awk '/^VmRSS/ {print $2}' "/proc/$1/status"
}

wait_port() {  # wait_port HOST:PORT — up to 10 s
  local hp=$1
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/${hp%:*}/${hp##*:}") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $hp" >&2
  return 1
}

# wrk_run PID URL SECONDS CONNECTIONS [extra wrk args...]
# Prints "requests cpu_us_per_request req_per_s p99_ms" for the process PID under that load.
wrk_run() {
  local pid=$1 url=$2 secs=$3 conns=$4; shift 4
  local before after out reqs rps p99 cpu
  before=$(cpu_ticks "$pid")
  out=$(taskset -c "$BENCH_CPU_LOAD" wrk -t1 -c"$conns" -d"${secs}s" --latency "$@" "$url" 2>&1)
  after=$(cpu_ticks "$pid")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; print v}' <<<"$out")
  errors=$(awk '/Socket errors|Non-2xx/ {print}' <<<"$out")
  [ -n "$errors" ] && echo "wrk: $errors" >&2
  cpu=$(awk -v t=$((after - before)) -v hz="$CLK_TCK" -v r="$reqs" 'BEGIN { if (r > 0) printf "%.2f", t / hz * 1e6 / r; else print "nan" }')
  echo "$reqs $cpu $rps $p99"
}

median() {  # median of the arguments
  printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

mem_per_conn() {  # mem_per_conn PID PORT: KiB of RSS per idle client connection (HOLD of them)
  local pid=$1 port=$2 before after
  before=$(rss_kib "$pid")
  coproc HOLDER { python3 bench/hold_connections.py 127.0.0.1 "$port" "$HOLD"; }
  read -r _ <&"${HOLDER[0]}"
  sleep 1
  after=$(rss_kib "$pid")
  echo >&"${HOLDER[1]}"; wait "$HOLDER_PID" 2>/dev/null || true
  awk -v a="$after" -v b="$before" -v n="$HOLD" 'BEGIN { printf "%.1f", (a - b) / n }'
}

fulcrum_head() {  # fulcrum_head ADMIN_ADDRESS: the benchmarks' [global] (one worker) and [admin] lines
  printf '[global]\nworkers = 1\n[admin]\nlisten = "%s"\n' "$1"
}

# message_config LISTEN ADMIN MEMBER1 MEMBER2: the message-LB service both message benches run
# (async, 2-byte length prefix, 12-byte sequence id, two connections per member).
message_config() {
  cat <<CONF
$(fulcrum_head "$2")
[[virtual_service]]
name = "bench"
listen = "$1"
protocol = "message"
pool = "hosts"
framing = { length_bytes = 2 }
message_mode = "async"
sequence = { offset = 0, length = 12 }
member_connections = 2
max_pending = 1024
[[pool]]
name = "hosts"
algorithm = "round_robin"
[[pool.member]]
address = "$3"
[[pool.member]]
address = "$4"
CONF
}

# msg_run PID PORT CONNS WINDOW: "cpu_us_per_message messages_per_s p99_ms" of PID while
# msgload ($MSGLOAD, default $BUILD_DIR/msgload) drives 127.0.0.1:PORT for $SECS seconds.
msg_run() {
  local pid=$1 port=$2 conns=$3 window=$4 before after out rate p99 errors all
  before=$(cpu_ticks "$pid")
  out=$(taskset -c "$BENCH_CPU_LOAD" "${MSGLOAD:-$BUILD_DIR/msgload}" "127.0.0.1:$port" "$conns" "$window" "$SECS" "$SIZE")
  after=$(cpu_ticks "$pid")
  read -r _ rate _ p99 errors all <<<"$out"
  [ "$errors" != 0 ] && echo "msgload: $errors errors" >&2
  awk -v t=$((after - before)) -v hz="$CLK_TCK" -v m="$all" -v r="$rate" -v p="$p99" \
    'BEGIN { printf "%.2f %s %s\n", (m > 0 ? t / hz * 1e6 / m : 0), r, p }'
}

ha_segment() {  # ha_segment PREFIX THIRD: namespaces PREFIX-{sw,a,b,THIRD}, each host's eth0 on the
  # bridge br0 in PREFIX-sw: a 198.18.0.1, b 198.18.0.2, THIRD 198.18.0.10 (/24)
  local prefix=$1 third=$2
  for n in sw a b "$third"; do ip netns add "$prefix-$n"; ip -n "$prefix-$n" link set lo up; done
  ip -n "$prefix-sw" link add br0 type bridge
  ip -n "$prefix-sw" link set br0 up
  local i=0 h n addr
  for h in a:198.18.0.1 b:198.18.0.2 "$third:198.18.0.10"; do
    n=${h%%:*} addr=${h##*:}
    ip link add eth0 netns "$prefix-$n" type veth peer name "p$i" netns "$prefix-sw"
    ip -n "$prefix-sw" link set "p$i" master br0
    ip -n "$prefix-sw" link set "p$i" up
    ip -n "$prefix-$n" link set eth0 up
    ip -n "$prefix-$n" addr add "$addr/24" dev eth0
    i=$((i + 1))
  done
}

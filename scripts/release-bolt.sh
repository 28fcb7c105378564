#!/usr/bin/env bash
# The release binary laid out by BOLT (LLVM's post-link optimizer) from a training run.
#
# Why: on the HTTP/2 path Fulcrum executes fewer instructions per request than HAProxy but
# misses the instruction cache more (bench/RESULTS.md, "HTTP/2 counted, not timed"): its hot
# code is spread over h2, hyper, tokio, rustls and our own crates in whatever order the linker
# left it. BOLT reorders functions and basic blocks by measured use and moves cold blocks out
# of the way. Profile-guided optimization in rustc would need an llvm-profdata of rustc's own
# LLVM version, which this toolchain does not ship; BOLT works on the linked binary and, in its
# instrumentation mode, needs no hardware counters.
#
#   scripts/release-bolt.sh            -> target/bolt/fulcrum (and the unoptimized target/bolt/release/fulcrum)
#
# Steps: a release build with relocations kept (--emit-relocs: BOLT needs them to move
# functions), an instrumented copy, a training run of that copy on every proxy path (HTTP/1
# keep-alive and new connection, HTTP/2 over TLS on 50 and then 200 new connections (full
# handshakes), HTTP/1 over TLS, TCP, UDP and DNS), then the optimized binary. The training traffic stays on
# 127.0.0.1. The build has its own target folder: its RUSTFLAGS differ from the plain release.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need bolt-16 llvm-bolt-16; need wrk; need nghttp2-client h2load; need nginx; need openssl
need dnsutils dig
# The versioned path: llvm-bolt finds its instrumentation runtime in ../lib beside itself.
BOLT=/usr/lib/llvm-16/bin/llvm-bolt
export CARGO_TARGET_DIR=${BOLT_TARGET_DIR:-target/bolt}
TRAIN_SECS=${TRAIN_SECS:-4}

[ "${BENCH_PREBUILT:-0}" = 1 ] ||   # bench/lib.sh's knob: take the binary already built
  RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C link-arg=-Wl,--emit-relocs" cargo build --release -p fulcrum -q
plain=$CARGO_TARGET_DIR/release/fulcrum
out=$CARGO_TARGET_DIR/fulcrum

M1=18911 M2=18912 HTTP=18920 HTTPS=18921 TCP=18922 UDP=18923 DNS=18924 FA=18930 UDPM=18913
bench_workdir

"$BOLT" "$plain" -instrument -o "$work/fulcrum.instr" \
  --instrumentation-file="$work/profile.fdata" >"$work/instrument.log" 2>&1 ||
  { cat "$work/instrument.log" >&2; exit 1; }

bench_cert "$work"
hello_members "$M1" "$M2"
python3 - "$UDPM" >/dev/null 2>&1 <<'PY' &
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1])))
while True:
    data, peer = s.recvfrom(65535)
    s.sendto(data, peer)
PY
pids+=($!)

cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:$FA")
[[virtual_service]]
name = "http"
listen = "127.0.0.1:$HTTP"
protocol = "http"
pool = "nginx"
[[virtual_service]]
name = "https"
listen = "127.0.0.1:$HTTPS"
protocol = "https"
pool = "nginx"
tls = [{ cert = "$work/site.crt", key = "$work/site.key" }]
[[virtual_service]]
name = "tcp"
listen = "127.0.0.1:$TCP"
protocol = "tcp"
pool = "nginx"
[[virtual_service]]
name = "udp"
listen = "127.0.0.1:$UDP"
protocol = "udp"
pool = "echo"
$(fulcrum_member_pool "$M1" "$M2")
[[pool]]
name = "echo"
[[pool.member]]
address = "127.0.0.1:$UDPM"
[dns]
listen = ["127.0.0.1:$DNS"]
[[dns.zone]]
origin = "bench.test."
records = ["www 60 IN A 192.0.2.10"]
CONF
"$plain" check -c "$work/fulcrum.toml" >/dev/null
RUST_LOG=warn "$work/fulcrum.instr" run -c "$work/fulcrum.toml" 2>"$work/fulcrum.err" &
fulcrum_pid=$!
for p in $HTTP $HTTPS $TCP; do wait_port 127.0.0.1:$p; done

train() { echo "training: $*" >&2; "$@" >"$work/train.out" 2>&1 || { cat "$work/train.out" >&2; exit 1; }; }
train wrk -t1 -c50 -d"${TRAIN_SECS}s" "http://127.0.0.1:$HTTP/"
train wrk -t1 -c20 -d"${TRAIN_SECS}s" -H "Connection: close" "http://127.0.0.1:$HTTP/"
train h2load -c 50 -m 10 -D "$TRAIN_SECS" "https://127.0.0.1:$HTTPS/"
train h2load -c 200 -m 1 -n 2000 "https://127.0.0.1:$HTTPS/"
train wrk -t1 -c50 -d"${TRAIN_SECS}s" "https://127.0.0.1:$HTTPS/"
train wrk -t1 -c50 -d"${TRAIN_SECS}s" "http://127.0.0.1:$TCP/"
train wrk -t1 -c20 -d"${TRAIN_SECS}s" -H "Connection: close" "http://127.0.0.1:$TCP/"
train python3 - "$UDP" <<'PY'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
for i in range(20000):
    s.sendto(b"x" * 64, ("127.0.0.1", int(sys.argv[1])))
    s.recv(2048)
PY
train bash -c "for i in \$(seq 300); do dig +tries=1 +time=1 @127.0.0.1 -p $DNS www.bench.test A +short; done"

# The profile is written when the instrumented process exits.
kill -TERM "$fulcrum_pid"
wait "$fulcrum_pid" || true
[ -s "$work/profile.fdata" ] || { echo "the instrumented run wrote no profile" >&2; cat "$work/fulcrum.err" >&2; exit 1; }

"$BOLT" "$plain" -o "$out" -data="$work/profile.fdata" \
  -reorder-blocks=ext-tsp -reorder-functions=hfsort+ -split-functions -split-all-cold \
  -split-eh -icf=1 -use-gnu-stack -dyno-stats >"$work/optimize.log" 2>&1 ||
  { cat "$work/optimize.log" >&2; exit 1; }
grep -E "BOLT-INFO: (basic block reordering|.* functions? (have|with) profile)|Total (taken|executed)" "$work/optimize.log" >&2 || true
echo "$out"

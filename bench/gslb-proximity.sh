#!/usr/bin/env bash
# GSLB proximity (issue 24): answer latency of a proximity name with a cold cache (every query
# from a new /24: answered by the fallback while the probes start) and a warm one (the prefix
# measured by both sites), against a static round_robin name on the same server; and the probe
# traffic 1,000 distinct resolver prefixes cause. Two instances (east 127.0.0.2, west 127.0.0.3)
# exchange reports; a UDP responder on 0.0.0.0 stands for every resolver (it answers from the
# address each probe went to). Queries carry EDNS Client Subnet, one at a time, from Python.
# PROFILE=dev by default (the debug build the tests use); figures are for comparing the three
# cases with each other, not with other servers.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-dev}
. bench/lib.sh
N=${N:-2000} PREFIXES=${PREFIXES:-1000}
if [ "$PROFILE" = dev ]; then cargo build -q -p fulcrum; BIN=target/debug/fulcrum; else bench_build -p fulcrum; BIN=$BUILD_DIR/fulcrum; fi

bench_workdir

RESOLVER_PORT=18553
config() {  # config SITE SOURCE ADMIN DNS
  cat <<CONF
[admin]
listen = "$3"
[dns]
listen = "$4"
[[dns.zone]]
origin = "example.com."
[gslb]
local_site = "$1"
key = "a-shared-secret-for-the-bench"
proximity = { port = $RESOLVER_PORT, source = "$2", timeout = "500ms", max_age = "5m" }
[[gslb.site]]
name = "east"
addresses = ["192.0.2.10"]
peer = "127.0.0.2:18540"
[[gslb.site]]
name = "west"
addresses = ["198.51.100.10"]
peer = "127.0.0.3:18540"
[[gslb.name]]
fqdn = "app.example.com."
sites = ["east", "west"]
algorithm = "proximity"
fallback = "round_robin"
[[gslb.name]]
fqdn = "static.example.com."
sites = ["east", "west"]
algorithm = "round_robin"
CONF
}
config east 127.0.0.2 127.0.0.1:18901 127.0.0.1:18353 >"$work/east.toml"
config west 127.0.0.3 127.0.0.1:18902 127.0.0.1:18354 >"$work/west.toml"

python3 - "$work/responder.count" "$RESOLVER_PORT" <<'PY' &
# Every resolver: answers each query (response bit set) from the address it was sent to, and
# counts queries and bytes per source.
import socket, struct, sys, json, signal
out, port = sys.argv[1], int(sys.argv[2])
PKTINFO = getattr(socket, "IP_PKTINFO", 8)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, PKTINFO, 1)
s.bind(("0.0.0.0", port))
counts = {}
def dump(*_):
    json.dump(counts, open(out, "w")); sys.exit(0)
signal.signal(signal.SIGTERM, dump)
while True:
    data, anc, _, src = s.recvmsg(1500, socket.CMSG_SPACE(12))
    dst = next((d[4:8] for lvl, typ, d in anc if lvl == socket.IPPROTO_IP and typ == PKTINFO), None)
    c = counts.setdefault(src[0], [0, 0]); c[0] += 1; c[1] += len(data) + 28
    json.dump(counts, open(out, "w"))
    if len(data) < 12 or dst is None:
        continue
    reply = bytearray(data); reply[2] |= 0x80
    s.sendmsg([bytes(reply)], [(socket.IPPROTO_IP, PKTINFO, struct.pack("I4s4s", 0, dst, b"\0" * 4))], 0, src)
PY
pids+=($!)
"$BIN" run -c "$work/east.toml" >"$work/east.log" 2>&1 & pids+=($!)
"$BIN" run -c "$work/west.toml" >"$work/west.log" 2>&1 & pids+=($!)
wait_port 127.0.0.1:18901; wait_port 127.0.0.1:18902
for _ in $(seq 100); do
  r=$(curl -s 127.0.0.1:18901/api/v1/gslb/table | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["reporters"]))')
  [ "$r" = 2 ] && break; sleep 0.1
done

python3 - "$N" "$PREFIXES" <<'PY'
import socket, struct, sys, time, json, urllib.request
N, P = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
def query(name, ecs, qid):
    q = struct.pack(">HHHHHH", qid, 0, 1, 0, 0, 1)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
    addr = socket.inet_aton(ecs)[:3]
    opt = struct.pack(">HBB", 1, 24, 0) + addr
    q += b"\0" + struct.pack(">HHIH", 41, 1232, 0, 4 + len(opt)) + struct.pack(">HH", 8, len(opt)) + opt
    t = time.perf_counter_ns()
    s.sendto(q, ("127.0.0.1", 18353))
    while True:
        r = s.recv(1500)
        if r[:2] == q[:2]:
            us = (time.perf_counter_ns() - t) / 1000
            assert r[3] & 0x0f == 0 and struct.unpack(">H", r[6:8])[0] >= 1, f"not an answer: {r!r}"
            return us
def stats(name, v):
    v.sort()
    print(f"| {name} | {len(v)} | {v[len(v)//2]:.0f} | {v[len(v)*9//10]:.0f} | {v[len(v)*99//100]:.0f} |")
def api(port):
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/gslb/proximity"))
print("| Case | Queries | Median µs | p90 µs | p99 µs |\n|---|---|---|---|---|")
stats("static (round_robin)", [query("static.example.com", "127.200.0.1", i & 0xffff) for i in range(N)])
query("app.example.com", "127.200.0.1", 1)
for _ in range(50):
    if api(18901)["warm_answers"] > 0: break
    query("app.example.com", "127.200.0.1", 2); time.sleep(0.1)
w0, c0 = api(18901)["warm_answers"], api(18901)["cold_answers"]
stats("proximity, warm (prefix measured by both sites)", [query("app.example.com", "127.200.0.1", i & 0xffff) for i in range(N)])
warm_note = f"warm run: {api(18901)['warm_answers'] - w0} warm, {api(18901)['cold_answers'] - c0} cold answers of {N}"
ecs = [f"127.{1 + k // 250}.{k % 250}.1" for k in range(P)]
c0 = api(18901)["cold_answers"]
stats(f"proximity, cold ({P} new /24s, one query each)", [query("app.example.com", e, k & 0xffff) for k, e in enumerate(ecs)])
print(f"\n{warm_note}\ncold run: {api(18901)['cold_answers'] - c0} cold answers of {P}")
t0 = time.time()
while time.time() - t0 < 60:
    a, b = api(18901), api(18902)
    if a["probes_sent"] >= P + 1 and b["probes_sent"] >= P + 1: break
    time.sleep(0.5)
print(f"probes settled after {time.time() - t0:.1f} s: east {json.dumps(api(18901))}\nwest {json.dumps(api(18902))}")
w0, c0 = api(18901)["warm_answers"], api(18901)["cold_answers"]
stats(f"proximity, the same {P} /24s again (measured now)", [query("app.example.com", e, k & 0xffff) for k, e in enumerate(ecs)])
print(f"second pass: {api(18901)['warm_answers'] - w0} warm, {api(18901)['cold_answers'] - c0} cold of {P}")
PY
sleep 1
python3 - "$work/responder.count" "$PREFIXES" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); p = int(sys.argv[2])
for src, (n, b) in sorted(c.items()):
    print(f"probes from {src}: {n} datagrams, {b} bytes (IP+UDP) for {p} + 1 prefixes: {n / (p + 1) * 1000:.0f} per 1,000 resolvers")
PY

#!/usr/bin/env bash
# Scale-out (BGP): how fast the upstream router drops a Fulcrum node that stops (SIGTERM) or dies
# (kill -9), and what new connections see meanwhile. The harness is the namespace test
# crates/fulcrum/tests/bgp.rs (ecmp_over_two_nodes_…): a router namespace running BIRD 2 with
# ECMP (merge paths, L4 multipath hash) and two nodes each running BIRD 2 driven by Fulcrum;
# a client behind the router opens a new connection to the VIP every 5 ms during the kill.
# The same with gobgpd as each node's speaker (gobgp_announces_…, IPv6 client, dual-stack VIPs):
#   gobgp_kill9_withdrawn_ms  kill -9 sent (the watchdog SIGTERMed first, as systemd would) →
#                             both next hops (IPv4 and IPv6) gone on the router (the watchdog
#                             deletes the paths through gobgpd's API when Fulcrum's pipe closes)
#   gobgp_kill9_failed        new IPv6 connections that failed from the kill on
#   gobgp_sigterm_withdrawn_ms SIGTERM → both next hops gone (Fulcrum's own DeletePath)
#   sigterm_withdrawn_ms  SIGTERM sent → the router's kernel route has lost the node's next hop
#   kill9_withdrawn_ms    kill -9 sent → the same (the routes hang on Fulcrum's TUN interface,
#                         which the kernel deletes with the process; BIRD withdraws at once)
#   kill9_failed          new connections that failed from the kill on (out of kill9_requests)
# The same through OSPF (crates/fulcrum/tests/ospf.rs: the node's BIRD exports the VIP into OSPF
# to a BIRD neighbour; the VIP's route is left to settle first, see MinLSInterval there):
#   ospf_sigterm_withdrawn_ms SIGTERM → the router has no route to the VIP (polled every ~10 ms)
#   ospf_kill9_withdrawn_ms   kill -9 → the same
# Times are polled every 20 ms (`ip route` in the router namespace): read them as ± 20 ms.
# ROUNDS (default 5) runs of the test; prints each round and the medians.
# Needs root, bird2, gobgpd.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need bird2 bird
need gobgpd gobgpd
ROUNDS=${ROUNDS:-5}
cargo test -q -p fulcrum --test bgp --test ospf --no-run 2>/dev/null
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq "$ROUNDS"); do
  for t in ecmp_over_two_nodes gobgp_announces; do
    cargo test -q -p fulcrum --test bgp "$t" -- --nocapture 2>&1 \
      | grep '^bench:' | sed 's/^bench: //' | tr '\n' ' ' | tee -a "$out"
  done
  BENCH_OSPF_SETTLE_MS=6000 cargo test -q -p fulcrum --test ospf -- --nocapture 2>&1 \
    | grep '^bench:' | sed 's/^bench: //' | tr '\n' ' ' | tee -a "$out"
  echo | tee -a "$out"
done
median() {  # median KEY
  grep -oE "(^| )$1=[0-9.]+" "$out" | cut -d= -f2 | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'
}
echo
echo "median over $ROUNDS rounds:"
for k in sigterm_withdrawn_ms kill9_withdrawn_ms kill9_failed kill9_requests \
  gobgp_sigterm_withdrawn_ms gobgp_kill9_withdrawn_ms gobgp_kill9_failed gobgp_kill9_requests \
  ospf_sigterm_withdrawn_ms ospf_kill9_withdrawn_ms; do
  printf '  %-28s %s\n' "$k" "$(median "$k")"
done

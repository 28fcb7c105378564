#!/bin/sh
# ns per packet of the XDP forwarder through BPF_PROG_RUN (LRU-hit and new-flow paths, dr mode;
# with an access list of 10 and of 10,000 prefixes, a deny-list drop, and flow_limits; with
# wildcard VIPs: through a tcp port-0 VIP, ESP to an ip VIP)
# next to a trivial XDP_PASS program measured in the same run. Needs root.
# usage: bench/xdp.sh [RUNS_PER_ROUND]   (default 2000000)
set -eu
cd "$(dirname "$0")/.."
exec cargo run -q -p fulcrum-xdp --example xdp_bench -- "${1:-2000000}"

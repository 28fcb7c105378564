#!/usr/bin/env bash
# Message plane A/B: two Fulcrum binaries (say main and a branch) on the bench/message.sh load,
# side by side in the same run, to see what a change costs the message path.
#   bench/message-ab.sh A_BINARY B_BINARY [BIN_DIR]
# BIN_DIR holds msgload and msgswitch (testkit; default target/release). Each proxy runs alone
# on one CPU in turn (BENCH_CPU_PROXY); load generator and the two echoing hosts on the other.
# Reports CPU per message, messages/s and p99 from the client's side: medians of ROUNDS runs of
# SECS seconds, alternating A and B. Build without fat LTO to save time if both are built alike.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
A=$1 B=$2 BIN=${3:-$BUILD_DIR}
ROUNDS=${ROUNDS:-5} SECS=${SECS:-6} SIZE=${SIZE:-200}
SHAPES=${SHAPES:-"50x16 2x128"}
ulimit -n "$(ulimit -Hn)"
for port in 18380 18381 18391 18392 18990 18991; do
  if ss -Hltn "sport = :$port" | grep -q .; then echo "port $port is in use; stop what holds it" >&2; exit 1; fi
done

bench_workdir

taskset -c "$BENCH_CPU_LOAD" "$BIN/msgswitch" 127.0.0.1:18391 127.0.0.1:18392 &
pids+=($!)
wait_port 127.0.0.1:18391; wait_port 127.0.0.1:18392

declare -A pid port
for side in a b; do
  if [ $side = a ]; then port[$side]=18380 admin=18990 bin=$A; else port[$side]=18381 admin=18991 bin=$B; fi
  message_config "127.0.0.1:${port[$side]}" "127.0.0.1:$admin" 127.0.0.1:18391 127.0.0.1:18392 >"$work/$side.toml"
  RUST_LOG=warn taskset -c "$BENCH_CPU_PROXY" "$bin" run -c "$work/$side.toml" &
  pid[$side]=$!; pids+=($!)
  wait_port "127.0.0.1:${port[$side]}"
done

MSGLOAD=$BIN/msgload

declare -A cpu rps p99
for round in $(seq "$ROUNDS"); do
  for shape in $SHAPES; do
    conns=${shape%x*} window=${shape#*x}
    for side in a b; do
      read -r c r p <<<"$(msg_run "${pid[$side]}" "${port[$side]}" "$conns" "$window")"
      cpu[$side,$shape]+="$c "; rps[$side,$shape]+="$r "; p99[$side,$shape]+="$p "
      echo "round $round $shape $side: cpu/msg ${c}us msg/s $r p99 ${p}ms" >&2
    done
  done
done

echo
echo "| Message LB, ${SIZE}-byte bodies, median of $ROUNDS × ${SECS}s | A | B | B ÷ A |"
echo "|---|---|---|---|"
row() {  # row LABEL SHAPE A_VALUES B_VALUES
  local a b conns=${2%x*} window=${2#*x}
  a=$(median $3); b=$(median $4)
  printf '| %s conns × %s outstanding: %s | %s | %s | %s |\n' "$conns" "$window" "$1" "$a" "$b" "$(ratio "$b" "$a")"
}
for shape in $SHAPES; do
  row "CPU per message (µs)" "$shape" "${cpu[a,$shape]}" "${cpu[b,$shape]}"
  row "messages/s" "$shape" "${rps[a,$shape]}" "${rps[b,$shape]}"
  row "p99 latency (ms)" "$shape" "${p99[a,$shape]}" "${p99[b,$shape]}"
done

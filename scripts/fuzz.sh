#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for SECONDS each, with libFuzzer through cargo-fuzz,
# and prints how many inputs each ran. Exits non-zero if any target finds a crash, a leak or a
# timeout (libFuzzer leaves the input in fuzz/artifacts/<target>/).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]        default: 60 seconds, every target
#   RUNS=10000000 scripts/fuzz.sh 3600 ...       stop each target after RUNS inputs (SECONDS caps it)
#
# The toolchain is stable: cargo-fuzz's nightly-only flags (-Zsanitizer=address, sancov) are
# unlocked with RUSTC_BOOTSTRAP=1. cargo-fuzz is installed when missing.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
shift || true
export RUSTC_BOOTSTRAP=1
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
# Same dependency versions as the main workspace (fuzz/ is its own workspace).
[ -e Cargo.lock ] || cp ../Cargo.lock Cargo.lock
if (($#)); then targets=("$@"); else mapfile -t targets < <(cargo fuzz list); fi
# Built before the clock starts, so a target's seconds are spent fuzzing.
cargo fuzz build
mkdir -p ../bench/out
summary=../bench/out/fuzz-summary.txt
: >"$summary"
failed=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  log=../bench/out/fuzz-$t.log
  echo "== $t ($secs s${RUNS:+, at most $RUNS inputs})"
  limits=(-max_total_time="$secs")
  [ -n "${RUNS:-}" ] && limits+=(-runs="$RUNS")
  start=$SECONDS
  if cargo fuzz run "$t" "corpus/$t" "${seeds[@]}" -- "${limits[@]}" -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    failed=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  took=$((SECONDS - start))
  printf '%-20s %-7s %12s runs in %ss\n' "$t" "$result" "${runs:-?}" "$took" | tee -a "$summary"
  [ "$result" = ok ] || tail -20 "$log"
done
echo "summary in bench/out/fuzz-summary.txt"
exit $failed

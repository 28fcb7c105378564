#!/usr/bin/env bash
# The whole test suite, as CI runs it on a fresh machine (root, Rust toolchain, Debian packages
# reachable). Installs what the tests need when it is missing, so no test skips for lack of a tool.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests drive (real clients and peers); one per line in scripts/test-packages.
mapfile -t wanted < <(grep -v '^\s*#' scripts/test-packages | grep -v '^\s*$')
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing test dependencies: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# A clean clone gains nothing from incremental compilation, and its caches roughly double the
# build's footprint on disk (a CI run once failed on a full disk while linking test binaries).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Many sockets at once in the load tests.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

echo "== format"
cargo fmt --all -- --check
echo "== module circles"
python3 scripts/module-cycles.py
echo "== code shape"
python3 scripts/code-shape.py
echo "== lint"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== fuzz targets build"
# fuzz/ is its own workspace (cargo-fuzz builds it with sanitizer flags the main one must not
# get), so the workspace build does not see it: check every target here, without sanitizers, so
# a change that breaks one fails the test command instead of the next fuzzing run. The lock
# file is the main workspace's, so the dependencies are the ones tested.
[ -e fuzz/Cargo.lock ] || cp Cargo.lock fuzz/Cargo.lock
CARGO_TARGET_DIR=target cargo check --manifest-path fuzz/Cargo.toml --bins
echo "== tests"
cargo test --workspace --locked "$@"

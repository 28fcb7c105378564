#!/usr/bin/env bash
# Rebuilds the example filters from their C sources (Debian packages clang and lld). The .wasm
# files are committed, so tests and users need neither; the output is the same byte for byte
# with the same clang and lld.
set -euo pipefail
cd "$(dirname "$0")"
for src in *.c; do
  clang --target=wasm32 -O2 -nostdlib -ffreestanding -fno-builtin \
    -Wl,--no-entry -Wl,--strip-all -Wl,--export-dynamic \
    -o "${src%.c}.wasm" "$src"
done

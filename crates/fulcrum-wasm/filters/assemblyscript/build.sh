#!/usr/bin/env bash
# Rebuilds ../sdk_add_header.wasm from assembly/index.ts with the public AssemblyScript
# proxy-wasm SDK (@solo-io/proxy-runtime) at the versions package-lock.json pins (Debian's
# nodejs and npm; npm fetches the packages). The output is the same byte for byte.
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund >/dev/null
node_modules/.bin/asc assembly/index.ts -b ../sdk_add_header.wasm --use abort=abort_proc_exit --optimize

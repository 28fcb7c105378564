#!/bin/sh
# Compiles the XDP program. The object is checked in (bpf/fulcrum_xdp.o, embedded with
# include_bytes!) so `cargo build` works without clang; tests/object.rs runs this script and
# requires the result to be byte-identical to the checked-in object.
#
# Determinism: clang's BPF output is identical run to run for the same clang and headers; the
# only input that varies between checkouts is the compilation directory, which DWARF records
# (DW_AT_comp_dir). -fdebug-prefix-map rewrites it to ".", so the object does not depend on
# where the repository lives. A different clang major version does generate different code; the
# reference object is built with Debian 12's clang 14 (the CI image).
#
# usage: bpf/build.sh [OUTPUT]   (default: bpf/fulcrum_xdp.o)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/fulcrum_xdp.o}
cd "$here"
exec clang -target bpf -g -O2 -Wall -Werror \
    -I/usr/include/x86_64-linux-gnu \
    -fdebug-prefix-map="$here"=. \
    -c fulcrum_xdp.c -o "$out"

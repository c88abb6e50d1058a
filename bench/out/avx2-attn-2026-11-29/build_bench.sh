#!/bin/sh
# Builds attnbench (this folder) against a build directory's libraries.
# Run from the repository root: sh bench/out/avx2-attn-2026-11-29/build_bench.sh BUILD_DIR OUT
B=$1
D=$(dirname "$0")
gcc -O2 -std=gnu11 -Icpu -Ibase -I. "$D/attnbench.c" "$B/runtime/libhkv.a" "$B"/cpu/libhkv_cpu_*.a \
    -fopenmp -lhwloc -lnuma -ldnnl -lm -o "$2"

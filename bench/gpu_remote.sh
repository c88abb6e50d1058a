#!/usr/bin/env bash
# The command a lent GPU machine runs (the device tool's `run`, from the
# repository root), over a pack made here by tools/scripts/gpu_pack.sh:
#
#     bench/gpu_remote.sh PACK SECONDS [SCRIPT [ARGS...]]
#
# Unpacks PACK (e.g. .devrun/pack.tar.xz, carried) to /tmp/p, installs the
# gguf wheel (tests/pipeline needs it) of .whl/ or the pack, sets the library
# path, then runs SCRIPT (default bench/gpu_check.sh) as
# `SCRIPT /tmp/p/b /tmp/gpu-out SECONDS ARGS...` (bench/gpu_ab.sh: with the
# pack's baseline /tmp/p/a/hetkv first); results in /tmp/gpu-out and, when
# OUT names a folder (the folder a lent machine sends back, 8 files at
# most), summary.txt, all.log and a results.tar.xz of the rest there.
# GPU_CHECK_SKIP / GPU_CHECK_PIPELINE pass through. E.g. (.devrun and .whl
# carried):
#
#     GPU_CHECK_SKIP='test_gpu_attn' bench/gpu_remote.sh .devrun/pack.tar.xz 380
#
# A bench invocation there costs 15-40 s before its first step (weights,
# page-locked tiers, probes) and a tests/pipeline case about 36 s (two
# processes, each creating a CUDA context): size SECONDS by that.
set -u
PACK=$1
BUDGET=$2
SCRIPT=${3:-bench/gpu_check.sh}
shift $(($# < 3 ? $# : 3))
mkdir -p /tmp/p && tar xJf "$PACK" -C /tmp/p || exit 1
whl=
for f in .whl/*.whl /tmp/p/*.whl; do [ -f "$f" ] && whl=$f && break; done
if [ -n "$whl" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$whl" && export PYTHONPATH=/tmp/site
fi
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
O=/tmp/gpu-out
case "$SCRIPT" in
*gpu_ab.sh) "$SCRIPT" /tmp/p/a/hetkv /tmp/p/b "$O" "$BUDGET" "$@" ;;   # a pack made with a baseline
*) "$SCRIPT" /tmp/p/b "$O" "$BUDGET" "$@" ;;
esac
rc=$?
if [ -n "${OUT:-}" ]; then
    cp "$O/summary.txt" "$O/all.log" "$OUT/" 2>/dev/null
    tar cJf "$OUT/results.tar.xz" -C "$O" .
fi
exit $rc

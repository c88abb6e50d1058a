#!/usr/bin/env bash
# Two builds of hetkv side by side on a machine with a real NVIDIA GPU, in
# one run (the same card, clocks and host load for both):
#
#     bench/gpu_ab.sh A_BIN B_BUILD OUT_DIR [SECONDS]
#
# A_BIN is the baseline hetkv binary (e.g. the previous commit's, packed by
# tools/scripts/gpu_pack.sh --base), B_BUILD the CUDA build under test. Runs B's
# kernel tests named in GPU_AB_TESTS (default test_gpu_forward), each kernel
# timed alone on the device for B (--only GPU_AB_ONLY, default q4,attention)
# and for A (--quick, all rows: a baseline binary may predate --only), then
# `hetkv bench GPU_AB_BENCH --json` with A and B (default: Llama-3-8B's shape
# at 8K, batch 1 and 4, snapkv with 1024 kept rows: the device-bound case),
# then B alone with each bench of GPU_AB_B_ONLY ('|'-separated; default: full,
# whose whole context is near: attention on the device alone), then, with
# GPU_AB_PIPELINE set (its value: test_pipeline.py's options, e.g. "--only
# full,ctkvr"), the device pipeline against the CPU path. Output as bench/gpu_check.sh's: OUT_DIR/all.log,
# OUT_DIR/summary.txt and one JSON per step; SECONDS (default 400) bounds it.
set -u
A=$1
BUILD=$2
OUT=$3
BUDGET=${4:-400}
. "$(dirname "$0")/gpu_lib.sh"
B=$BUILD/tools/hetkv

for t in ${GPU_AB_TESTS:-test_gpu_forward}; do
    step "$t" 60 "$BUILD/tests/gpu/$t"
done
step kernels_b 90 sh -c "\"$B\" bench kernels --device cuda --only ${GPU_AB_ONLY:-q4,attention} --json >\"$OUT/kernels_b.json\""
step kernels_a 60 sh -c "\"$A\" bench kernels --device cuda --quick --json >\"$OUT/kernels_a.json\""
ARGS=${GPU_AB_BENCH:-"--synthetic llama3-8b --device cuda --ctx 8192 --batch 1,4 --steps 16 --configs snapkv:budget=1024"}
step decode_b 120 sh -c "\"$B\" bench $ARGS --json >\"$OUT/decode_b.json\""
step decode_a 120 sh -c "\"$A\" bench $ARGS --json >\"$OUT/decode_a.json\""
# B alone: benches separated by '|', each its own step (decode_b_only, _2, ...)
B_ONLY=${GPU_AB_B_ONLY:-"--synthetic llama3-8b --device cuda --ctx 8192 --batch 1,4 --steps 16 --configs full --gpu-profile|--synthetic llama3-8b --device cuda --ctx 8192 --batch 1 --steps 16 --configs snapkv:budget=1024 --gpu-profile"}
i=1
IFS='|' read -ra BENCHES <<<"$B_ONLY"
for args in "${BENCHES[@]}"; do
    name=decode_b_only
    [ "$i" -gt 1 ] && name=decode_b_only_$i
    step "$name" 150 sh -c "\"$B\" bench $args --json >\"$OUT/$name.json\""
    i=$((i + 1))
done
# the device pipeline against the CPU path on tiny generated models, when asked
if [ -n "${GPU_AB_PIPELINE:-}" ]; then
    step pipeline_tiny 150 python3 "$(dirname "$0")/../tests/pipeline/test_pipeline.py" \
        --bin-dir "$BUILD/tools" $GPU_AB_PIPELINE
fi
echo "total $(($(date +%s) - T0)) s" | tee -a "$SUM"

#!/usr/bin/env bash
# The checks to run on a machine with a real NVIDIA GPU, in one go:
#
#     bench/gpu_check.sh [BUILD_DIR] [OUT_DIR] [SECONDS]
#
# BUILD_DIR is a CUDA build (meson setup BUILD -Dgpu_arch=sm_90 or sm_89;
# default build). It runs, in order of value, each step under its own time
# limit so that one slow or hung step costs only its share: the tests/gpu
# kernel tests, each gpu/ kernel of a decode step timed alone on the device
# (`hetkv bench kernels --device cuda`: the weight products, decode and
# prefill attention, copies, beside a device-to-device probe; its JSON in
# bench_gpu_kernels.json, its rows also in all.log as they are measured),
# bench --device cuda on Llama-3-8B's shape (synthetic Q4
# weights, speed does not depend on the values) at 8K, the CPU-vs-device
# pipeline test on tiny generated models for every policy, the same bench at
# 32K, SmolLM2's shape on the CPU and on the device side by side,
# `hetkv plan --predict` for the card (the predictions the measurements are
# checked against, with this host's probe), and compute-sanitizer's memcheck
# on two kernel tests where the tool is there.
#
# Writes OUT_DIR/all.log (every step's output), OUT_DIR/summary.txt (one
# line per step: name, exit status, seconds) and the benches' JSON. SECONDS
# (default 480) bounds the whole run: a step that would start past it is
# skipped and says so; so is each step named in GPU_CHECK_SKIP (space-separated).
# GPU_CHECK_PIPELINE adds options to the pipeline step (e.g. "--only laq,speckv").
# GPU_CHECK_PREDICT names the card for plan --predict (default: from nvidia-smi).
set -u
BUILD=${1:-build}
OUT=${2:-gpu-check-out}
BUDGET=${3:-480}
. "$(dirname "$0")/gpu_lib.sh"
HKV=$BUILD/tools/hetkv

for t in "$BUILD"/tests/gpu/test_gpu_*; do
    [ -x "$t" ] && [ -f "$t" ] && step "$(basename "$t")" 90 "$t"
done

# each kernel alone, timed with events on the device (tools/bench/bench_gpu.c)
step bench_gpu_kernels 60 sh -c "\"$HKV\" bench kernels --device cuda --json >\"$OUT/bench_gpu_kernels.json\""

# the decode step replayed as a CUDA graph (pipeline/cuda_graph.c) on a real
# device: logits bit-identical to --gpu-no-graphs's, within tolerance of the
# CPU path's, graphs recorded and replayed (about 80 s: 6 processes)
step pipeline_graphs 120 python3 tests/pipeline/test_pipeline.py --bin-dir "$BUILD/tools" --only full \
    --dump-only --modes prompt,batch --near 4,124 --rows 8 --n-tokens 40 --expect-graphs

LLAMA_CONFIGS="full;ctkvr;quest:budget=1024;snapkv:budget=1024;rocketkv:budget=1024"
bench_json() { # NAME LIMIT ARGS...: the JSON to OUT/NAME.json
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" sh -c "\"$HKV\" bench $* --json >\"$OUT/$name.json\""
}
bench_json bench_llama3_8b_8k 150 --synthetic llama3-8b --device cuda --ctx 8192 --batch 1,4 \
    --steps 16 --configs "'$LLAMA_CONFIGS'"
# the dense baseline: a near tier that holds the whole context, so full (and
# any policy) runs entirely on the device, no far tier, no per-layer host work
bench_json bench_llama3_8b_8k_all_near 90 --synthetic llama3-8b --device cuda --ctx 8192 \
    --batch 1,4,16 --steps 16 --local 8300 --configs "'full'"
# the same with every layer's host step before the device goes on (the
# pipeline before host steps ran behind the device): the A/B of that change
bench_json bench_llama3_8b_8k_all_near_lockstep 90 --synthetic llama3-8b --device cuda --ctx 8192 \
    --batch 1,4,16 --steps 16 --local 8300 --gpu-lockstep --configs "'full'"
# the same with every op queued on its own (--gpu-no-graphs): the A/B of the
# decode step recorded once per batch size and replayed as a CUDA graph
bench_json bench_llama3_8b_8k_all_near_nographs 90 --synthetic llama3-8b --device cuda --ctx 8192 \
    --batch 1,4,16 --steps 16 --local 8300 --gpu-no-graphs --configs "'full'"
# micro-batch ping-pong against one batch (--gpu-pingpong): ctkvr's host far
# part beside the device's products, at batch 4 and 16
bench_json bench_llama3_8b_8k_ctkvr 90 --synthetic llama3-8b --device cuda --ctx 8192 \
    --batch 4,16 --steps 8 --configs "'ctkvr'"
bench_json bench_llama3_8b_8k_ctkvr_pingpong 90 --synthetic llama3-8b --device cuda --ctx 8192 \
    --batch 4,16 --steps 8 --gpu-pingpong --configs "'ctkvr'"
# where a step's device time goes, op by op (--gpu-profile: events around every op)
bench_json bench_llama3_8b_8k_profile 90 --synthetic llama3-8b --device cuda --ctx 8192 --batch 1 \
    --steps 16 --gpu-profile --configs "'snapkv:budget=1024'"
# every policy, three cases each, two processes a case: about 5 minutes on an H100
# (GPU_CHECK_PIPELINE: more test_pipeline.py options, e.g. "--only laq,speckv")
# shellcheck disable=SC2086
step pipeline_tiny 300 python3 tests/pipeline/test_pipeline.py --bin-dir "$BUILD/tools" ${GPU_CHECK_PIPELINE:-}
# a long prompt on 8 of the 32 layers: the prefill's speed at 16K
bench_json bench_llama3_8b_l8_16k 90 --synthetic llama3-8b@8 --device cuda --ctx 16384 --batch 1 \
    --steps 8 --configs "'full;ctkvr'"
# the same prompt with the device's copy capped at 4K tokens: every later
# chunk attends the rest from the far tier, streamed through the device in
# 4096-key blocks (pipeline/cuda_prefill_stream.c); against the run above
bench_json bench_llama3_8b_l8_16k_stream 90 --synthetic llama3-8b@8 --device cuda --ctx 16384 \
    --batch 1 --steps 8 --gpu-prompt-keys 4096 --configs "'full;ctkvr'"
bench_json bench_smollm2_cuda 60 --synthetic smollm2-135m --device cuda --ctx 8192 --batch 1,16 \
    --steps 16 --configs "'full;ctkvr'"
bench_json bench_smollm2_cpu 60 --synthetic smollm2-135m --device cpu --ctx 8192 --batch 1,16 \
    --steps 16 --configs "'full;ctkvr'"
# the card to predict for: GPU_CHECK_PREDICT, else guessed from nvidia-smi's name
PRED=${GPU_CHECK_PREDICT:-}
if [ -z "$PRED" ]; then
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)" in
        *H200*) PRED=h200 ;; *H100*PCIe*) PRED=h100-pcie ;; *H100*) PRED=h100 ;;
        *4090*) PRED=rtx4090 ;; *A100*) PRED=a100 ;; *) PRED=h200 ;;
    esac
fi
step plan_predict 30 sh -c "\"$HKV\" plan --predict $PRED --synthetic llama3-8b --policy full,ctkvr \
    --ctx 8192,32768 --batch 1,4 >\"$OUT/plan_predict.txt\" 2>&1"
if command -v compute-sanitizer >/dev/null; then
    step memcheck_attn 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$BUILD/tests/gpu/test_gpu_attn"
    step memcheck_ctkvr 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$BUILD/tests/gpu/test_gpu_ctkvr"
fi
echo "total $(($(date +%s) - T0)) s" | tee -a "$SUM"

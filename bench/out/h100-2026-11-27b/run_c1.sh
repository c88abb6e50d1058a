#!/bin/bash
# device call (session 16): session 15's device paths on a real card: the kernels they added,
# rocketkv's stage 2 and the window scores in the 8K bench, a prompt streamed past its copy,
# the pipeline's new cases against the CPU path, memcheck on the new kernels
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
mkdir -p /tmp/p && tar xJf .devrun/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
B=/tmp/p/b
H=$B/tools/hetkv
T0=$(date +%s)
el() { echo $(($(date +%s)-T0)); }
t() { local n=$1 lim=$2; shift 2; echo "=== $n $(el)s: $*"; timeout -k 5 $lim "$@" > $OUT/$n.txt 2>&1; echo "rc=$? $(el)s"; tail -3 $OUT/$n.txt; }
r() { local n=$1 lim=$2; shift 2; echo "=== $n $(el)s: $*"; timeout -k 5 $lim "$@" --json > $OUT/$n.json 2>>$OUT/log.txt; echo "rc=$? $(el)s"; }
nvidia-smi -L
t gpu_attn 40 $B/tests/gpu/test_gpu_attn
t gpu_page_policies 30 $B/tests/gpu/test_gpu_page_policies
t gpu_policies 30 $B/tests/gpu/test_gpu_policies
r b8k 100 $H bench --synthetic llama3-8b --device cuda --ctx 8192 --batch 1,4 --steps 16 --configs "full;snapkv:budget=1024;rocketkv:budget=1024"
r l8_16k 50 $H bench --synthetic llama3-8b@8 --device cuda --ctx 16384 --batch 1 --steps 8 --configs "full;ctkvr"
r l8_16k_stream 60 $H bench --synthetic llama3-8b@8 --device cuda --ctx 16384 --batch 1 --steps 8 --gpu-prompt-keys 4096 --configs "full;ctkvr"
P="python3 tests/pipeline/test_pipeline.py --bin-dir $B/tools --dump-only --modes prompt --rows 5"
export PYTHONUNBUFFERED=1
t pipe_stream 60 $P --only ctkvr --expect-streamed "--device-args=--gpu-prompt-keys 8 --gpu-prompt-block 4"
t pipe_rocket 60 $P --only rocketkv
t pipe_window 60 $P --only snapkv --policy-arg window=4 --expect-device-scores
if command -v compute-sanitizer >/dev/null; then
  t mc_page 40 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/gpu/test_gpu_page_policies
  t mc_policies 40 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/gpu/test_gpu_policies
fi
r l8_32k 60 $H bench --synthetic llama3-8b@8 --device cuda --ctx 32768 --batch 1 --steps 4 --configs "full"
r l8_32k_stream 80 $H bench --synthetic llama3-8b@8 --device cuda --ctx 32768 --batch 1 --steps 4 --gpu-prompt-keys 4096 --configs "full"
if command -v compute-sanitizer >/dev/null; then
  t mc_attn 50 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/gpu/test_gpu_attn
fi
echo "total $(el)s"

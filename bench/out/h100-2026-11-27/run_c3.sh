#!/bin/bash
# device call 3: the deferred host steps drained as their rows land, slots for every layer at b16,
# the host's time per op; then the pipeline against the CPU path for the policies not yet run on a GPU
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
mkdir -p /tmp/p && tar xJf .devrun/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
H=/tmp/p/b/tools/hetkv
L="--synthetic llama3-8b --device cuda --ctx 8192 --local 8300 --steps 16 --configs full"
T0=$(date +%s)
r() { local n=$1 lim=$2; shift 2; echo "=== $n $(($(date +%s)-T0))s: $*"; timeout -k 5 $lim "$@" --json > $OUT/$n.json 2>>$OUT/log.txt; echo "rc=$? $(($(date +%s)-T0))s"; }
nvidia-smi -L
r near_prof 60 $H bench $L --batch 1,16 --gpu-profile
r near 50 $H bench $L --batch 1,16
r near_lock 50 $H bench $L --batch 1,16 --gpu-lockstep
echo "=== pipeline $(($(date +%s)-T0))s"
left=$((290 - ($(date +%s)-T0)))
PYTHONUNBUFFERED=1 timeout -k 5 $left python3 tests/pipeline/test_pipeline.py --bin-dir /tmp/p/b/tools --only laq,speckv,fastkv,specpc > $OUT/pipeline.txt 2>&1
echo "rc=$? total $(($(date +%s)-T0))s"

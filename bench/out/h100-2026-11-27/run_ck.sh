#!/bin/bash
# device call: unpack the CUDA build, run bench/gpu_check.sh, bring back the logs
set -u
cd "$(dirname "$0")/.."
BUDGET=${1:-380}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
mkdir -p /tmp/p && tar xJf .devrun/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
O=/tmp/o
bench/gpu_check.sh /tmp/p/b $O "$BUDGET"
cp $O/summary.txt $O/all.log "$OUT/"
tar cJf "$OUT/ck.tar.xz" -C $O .

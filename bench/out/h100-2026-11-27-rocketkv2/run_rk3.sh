#!/bin/bash
# helper session: variants of rocketkv stage 2's kernels, alone
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/p && tar xJf .devrun/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
for v in z2 nomatch k512 nokc z2; do
  timeout -k 5 30 .devrun/hetkv_$v bench kernels --device cuda --only policy > $OUT/policy_$v.txt 2>&1
  echo "== $v rc=$?"; grep "^policy" $OUT/policy_$v.txt | cut -c1-22,62-82
done

#!/bin/bash
# device call (session 16, 2): where rocketkv's device step goes: per-op profile of rocketkv against snapkv, and per kernel under nsys where the machine has it
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/p && tar xJf .devrun/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
H=/tmp/p/b/tools/hetkv
T0=$(date +%s)
el() { echo $(($(date +%s)-T0)); }
L="--synthetic llama3-8b --device cuda --ctx 8192 --batch 1"
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "nsys: '$NSYS' $(el)s"
timeout -k 5 70 $H bench $L --steps 8 --gpu-profile --configs "rocketkv:budget=1024;snapkv:budget=1024" --json > $OUT/prof.json 2>$OUT/prof.err
echo "prof rc=$? $(el)s"
if [ -n "$NSYS" ]; then
  timeout -k 5 120 $NSYS profile -t cuda -o /tmp/rk --force-overwrite true $H bench $L --steps 8 --configs "rocketkv:budget=1024" > $OUT/nsys_run.txt 2>&1
  echo "nsys rc=$? $(el)s"
  timeout -k 5 60 $NSYS stats --report cuda_gpu_kern_sum --format csv -o /tmp/k /tmp/rk.nsys-rep > /dev/null 2>&1
  cp /tmp/k*.csv $OUT/ 2>/dev/null
  head -c 3000 /tmp/k*.csv
  echo "stats $(el)s"
fi

#!/bin/bash
# device call 2: where a batch-1 step's time goes (op profile, nsys), deferred vs lockstep at b16, ping-pong
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/p && tar xJf .devrun/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
H=/tmp/p/b/tools/hetkv
L="--synthetic llama3-8b --device cuda"
T0=$(date +%s)
r() { local n=$1 lim=$2; shift 2; echo "=== $n $(($(date +%s)-T0))s: $*"; timeout -k 5 $lim "$@" --json > $OUT/$n.json 2>>$OUT/log.txt; echo "rc=$? $(($(date +%s)-T0))s"; }
which nsys ncu; ls /usr/local/cuda/bin | grep -i -E 'nsys|ncu' ; ls /opt/nvidia 2>/dev/null
r prof_near 45 $H bench $L --ctx 8192 --local 8300 --batch 1 --steps 16 --gpu-profile --configs full
r ctkvr_b4 45 $H bench $L --ctx 8192 --batch 4 --steps 8 --configs ctkvr
r ctkvr_b4_pp 45 $H bench $L --ctx 8192 --batch 4 --steps 8 --gpu-pingpong --configs ctkvr
NS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NS" ]; then
  echo "=== nsys $NS"
  timeout -k 5 30 $NS profile -t cuda -o /tmp/ns --force-overwrite true $H bench $L --ctx 1024 --local 1100 --batch 1 --steps 8 --configs full >>$OUT/log.txt 2>&1
  timeout -k 5 15 $NS stats -r cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_trace -f csv -o /tmp/nsr /tmp/ns.nsys-rep >>$OUT/log.txt 2>&1
  ls /tmp/nsr* ; for f in /tmp/nsr*kern_sum*.csv /tmp/nsr*api_sum*.csv; do cp $f $OUT/; done
  f=$(ls /tmp/nsr*gpu_trace*.csv | head -1); [ -n "$f" ] && tail -3000 $f | gzip > $OUT/trace_tail.csv.gz
fi
echo "total $(($(date +%s)-T0))s"

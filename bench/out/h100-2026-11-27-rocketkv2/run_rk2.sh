#!/bin/bash
# helper session: rocketkv stage 2's new kernels alone, their tests on the card, then the step
set -u
cd "$(dirname "$0")/.."
mkdir -p /tmp/p && tar xJf .devrun/pack.tar.xz -C /tmp/p
export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
H=/tmp/p/b/tools/hetkv
T0=$(date +%s)
el() { echo $(($(date +%s)-T0)); }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout -k 5 40 $H bench kernels --device cuda --only policy > $OUT/policy.txt 2>&1
echo "policy rc=$? $(el)s"; cat $OUT/policy.txt | tail -9
timeout -k 5 40 /tmp/p/b/tests/gpu/test_gpu_page_policies > $OUT/t_page.txt 2>&1
echo "page_policies rc=$? $(el)s"; tail -4 $OUT/t_page.txt
timeout -k 5 30 /tmp/p/b/tests/gpu/test_gpu_policies > $OUT/t_pol.txt 2>&1
echo "policies rc=$? $(el)s"; tail -3 $OUT/t_pol.txt
L="--synthetic llama3-8b --device cuda --ctx 8192 --batch 1"
timeout -k 5 60 $H bench $L --steps 8 --gpu-profile --configs "rocketkv:budget=1024;snapkv:budget=1024" --json > $OUT/prof.json 2>$OUT/prof.err
echo "prof rc=$? $(el)s"
python3 - <<'PY' 2>&1 | head -30
import json,os
j=json.load(open(os.environ['OUT']+'/prof.json'))
def walk(o,path=''):
    if isinstance(o,dict):
        for k,v in o.items():
            if k in ('step_ms','ms_per_step','tok_s','config','policy','decode_ms') : print(path+k, v)
            walk(v,path+k+'.')
    elif isinstance(o,list):
        for i,v in enumerate(o[:6]): walk(v,path+str(i)+'.')
walk(j)
PY

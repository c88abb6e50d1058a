H=/work/main/build-emu/tools/hetkv
n=$1; shift
rm -f out_$n.jsonl
/usr/bin/time -f "%e s" $H batch -m /work/main/models/SmolLM2-135M-Instruct.Q4_1.gguf -i in.jsonl -o out_$n.jsonl -c 1024 --max-batch 4 -t 2 -q --json --no-mpi --sink 4 --local 32 --chunk 64 --prefix-cache 2 --policy full "$@" 2>err_$n.txt > summ_$n.json; echo "$n rc=$?"
python3 -c "
import json,sys
s=json.load(open('summ_$n.json')) if open('summ_$n.json').read().strip() else {}
tl=s.get('device',{}).get('timeline',{})
print({k:tl.get(k) for k in ['device_resident_rows','resident_rows_up','device_resident_prefix_rows','resident_prefix_rows_up','resident_prefix_cascades','fallbacks_total']}, s.get('prefix_cache',{}).get('hits'), s.get('prefix_cache',{}).get('saved_bytes'))
for l in open('out_$n.jsonl'):
    o=json.loads(l); print(o['custom_id'], o['hetkv'].get('tokens'))
"; tail -1 err_$n.txt

#!/usr/bin/env bash
# One command for a throughput and fidelity sweep and its pictures:
#
#     tools/scripts/sweep.sh MODEL OUTDIR [CONTEXTS] [BUDGETS] [POLICIES]
#
# defaults: contexts 1024,2048,4096; budgets 2%,5%,15% of each context (at 1024 the
# far tier of a fidelity run is 172 tokens, so 15% is the largest share);
# policies ctkvr;quest;snapkv (full is always measured: the reference).
# Writes OUTDIR/bench.jsonl and .csv (hetkv bench -o: decode tokens/s, bytes per step
# and speed-up over full at every context x budget x policy, batch 1), OUTDIR/eval.jsonl
# and .csv (hetkv eval: fidelity against full and passkey/needle accuracy at the same
# points; eval.jsonl is written part by part, so rerunning the command after a stop
# resumes the sweep), and the pictures of tools/scripts/plot_rows.py into OUTDIR.
# Extra arguments for both commands (threads, --sink/--local) in HKV_SWEEP_ARGS.
set -eu
MODEL=$1
OUT=$2
CTX=${3:-1024,2048,4096}
BUDGETS=${4:-2%,5%,15%}
POLICIES=${5:-ctkvr;quest;snapkv}
HERE=$(cd "$(dirname "$0")" && pwd)
HKV=${HKV:-$HERE/../../build/tools/hetkv}
mkdir -p "$OUT"
# shellcheck disable=SC2086
"$HKV" bench -m "$MODEL" --ctx "$CTX" --batch 1 --steps 16 --budgets "$BUDGETS" \
    --configs "full;$POLICIES" ${HKV_SWEEP_ARGS:-} -o jsonl >"$OUT/bench.jsonl.part"
mv "$OUT/bench.jsonl.part" "$OUT/bench.jsonl"
# shellcheck disable=SC2086
"$HKV" eval -m "$MODEL" --ctx "$CTX" --cont 64 --budgets "$BUDGETS" --configs "full;$POLICIES" \
    --tasks passkey,needle --trials 2 ${HKV_SWEEP_ARGS:-} --out "$OUT/eval.jsonl" >/dev/null
for f in bench eval; do   # the same rows as CSV (header from the first row; null -> empty)
    python3 - "$OUT/$f.jsonl" "$OUT/$f.csv" <<'PY'
import csv, json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
with open(sys.argv[2], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
PY
done
python3 "$HERE/plot_rows.py" "$OUT/bench.jsonl" "$OUT/eval.jsonl" -o "$OUT"

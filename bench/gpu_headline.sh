#!/usr/bin/env bash
# The headline run: decoding beyond the GPU's memory, on a GPU machine, in one go:
#
#     bench/gpu_headline.sh [BUILD_DIR] [OUT_DIR] [SECONDS]
#
# Llama-3.1-8B's shape (synthetic Q4 weights: speed does not depend on the
# values) under a 24 GB cap (the RTX 4090 our users have; HEADLINE_GPU_MEM),
# for each context of HEADLINE_CTX, in this order:
#   split_CTX  the selection policies (HEADLINE_CONFIGS: ctkvr; ctkvr on int8
#              key sketches with lists of 1.5 rho' (half the host's bytes a
#              token, docs/EVAL.md); the same lists over the 8-bit far tier
#              (far=q8: the forks' rows converted from the fp16 prefill, the
#              same bytes and speed as a q8 prefill's); those lists on 4-bit
#              sketches over the 8-bit tier (a third of the default's bytes);
#              quest, snapkv,
#              rocketkv; then ctkvr over q8 alone and the sketches alone; all
#              at their default budgets) with the far tier in the
#              host's page-locked memory, at the batches of HEADLINE_BATCH_CTX
#              (one prefill, forked to each batch);
#   dense_CTX  full with the whole context on the device (--local past the
#              context), at the largest batch the cap admits (bench
#              --admit-only, tried from 16 down), the prompt's own sequence in
#              the batch so the device holds the batch once;
# first the device's policy kernels alone (bench kernels --only policy,sync: ctkvr's
# recall and index build among them, and the host's wait for the device asleep
# and polling), then per context as above, then the A/B steps at 32K (below:
# the host asleep on its waits; micro-batch ping-pong), then one host core's
# far step (far_core.jsonl: bench far -t 1 --warm); `hetkv plan --predict`
# for the same rows (this host's probe), and
# bench/headline_rows.py, which gathers every row into OUT/headline.json and
# OUT/headline.md. Each bench writes its rows as they are measured
# (OUT/NAME.jsonl; its progress and text rows in OUT/NAME.log), so a step
# stopped by its time limit keeps what it measured. SECONDS (default 540)
# bounds the whole run (bench/gpu_lib.sh's step()).
set -u
BUILD=${1:-build}
OUT=${2:-gpu-headline-out}
BUDGET=${3:-540}
. "$(dirname "$0")/gpu_lib.sh"
HKV=$BUILD/tools/hetkv
MODEL=${HEADLINE_MODEL:---synthetic llama3.1-8b}
GPU_MEM=${HEADLINE_GPU_MEM:-24G}
CTXS=${HEADLINE_CTX:-98304 32768 65536}
CONFIGS=${HEADLINE_CONFIGS:-ctkvr;ctkvr:sketch=2,rho=1536;ctkvr:rho=1536,far=q8;ctkvr:sketch=3,rho=1536,far=q8;quest;snapkv;rocketkv;ctkvr:far=q8;ctkvr:sketch=2;ctkvr:sketch=1}
STEPS=${HEADLINE_STEPS:-8}
CHUNK=${HEADLINE_CHUNK:-2048}
# per-step limits in seconds: the 96K prefill is the long part (PREDICTION:
# ~100-200 s for 32 layers on an H100/H200 class card)
split_limit() { case $1 in 98304|131072) echo 280 ;; 65536) echo 200 ;; *) echo 130 ;; esac; }
dense_limit() { case $1 in 98304|131072) echo 240 ;; 65536) echo 150 ;; *) echo 90 ;; esac; }
# batches of the split rows: host memory bounds them (a ctkvr sequence at 96K
# holds 12 GiB of far K/V and 5.4 GB of IVF lists, page-locked)
split_batches() {
    local v
    v=$(eval echo "\${HEADLINE_BATCH_$1:-}")
    if [ -n "$v" ]; then echo "$v"; return; fi
    # bench refuses, by name and reason, a largest batch the host cannot hold
    # (page-locked far tier) and measures the others (headline.json "refused")
    echo 1,4,8
}
{
    echo "headline: model $MODEL, --gpu-mem $GPU_MEM, contexts $CTXS, configs $CONFIGS, steps $STEPS, chunk $CHUNK"
    free -g | head -2
} | tee -a "$LOG"

# the device's policy kernels alone first (~10 s): ctkvr's recall, whose latency was
# the suspect behind the first run's per-layer waits (kernels_policy.json, "recall")
step kernels_policy 60 sh -c "\"$HKV\" bench kernels --device cuda --only policy,sync --quick --json \
    >\"$OUT/kernels_policy.json\" 2>\"$OUT/kernels_policy.log\""

split_step() { # NAME CTX
    # shellcheck disable=SC2086
    step "$1" "$(split_limit "$2")" sh -c "\"$HKV\" bench $MODEL --device cuda --gpu-mem $GPU_MEM \
        --ctx $2 --batch $(split_batches "$2") --steps $STEPS --chunk $CHUNK --configs '$CONFIGS' \
        -o jsonl >\"$OUT/$1.jsonl\" 2>\"$OUT/$1.log\""
}
for ctx in $CTXS; do
    t=$(date +%s)
    split_step "split_$ctx" "$ctx"
    if [ ! -s "$OUT/split_$ctx.jsonl" ] && [ $(($(date +%s) - t)) -lt 90 ] && [ "$CHUNK" != 256 ]; then
        # a quick failure with no row: the prompt in the default 256-row chunks from here on
        echo "split_$ctx: no row in $(($(date +%s) - t)) s with --chunk $CHUNK; --chunk 256 from here" |
            tee -a "$SUM"
        CHUNK=256
        split_step "split_${ctx}_chunk256" "$ctx"
    fi
    dense_b=""
    for b in 16 8 4 2 1; do
        # shellcheck disable=SC2086
        if "$HKV" bench $MODEL --device cuda --gpu-mem "$GPU_MEM" --ctx "$ctx" --batch "$b" \
            --steps "$STEPS" --chunk "$CHUNK" --local $((ctx + STEPS + 64)) --configs full \
            --admit-only >>"$LOG" 2>&1; then
            dense_b=$b
            break
        fi
    done
    if [ -z "$dense_b" ]; then
        echo "dense_$ctx refused: the whole context of one sequence does not fit $GPU_MEM" | tee -a "$SUM"
        continue
    fi
    # shellcheck disable=SC2086
    step "dense_$ctx" "$(dense_limit "$ctx")" sh -c "\"$HKV\" bench $MODEL --device cuda --gpu-mem $GPU_MEM \
        --ctx $ctx --batch $dense_b --steps $STEPS --chunk $CHUNK --local $((ctx + STEPS + 64)) \
        --configs full -o jsonl >\"$OUT/dense_$ctx.jsonl\" 2>\"$OUT/dense_$ctx.log\""
    if [ "$ctx" = "$(echo "$CTXS" | awk '{print $1}')" ]; then
        # the predictions right after the first context: a late step must not lose them
        PRED=${HEADLINE_PREDICT:-}
        if [ -z "$PRED" ]; then
            case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)" in
                *H200*) PRED=h200 ;; *H100*PCIe*) PRED=h100-pcie ;; *H100*) PRED=h100 ;;
                *4090*) PRED=rtx4090 ;; *A100*) PRED=a100 ;; *) PRED=h200 ;;
            esac
        fi
        # shellcheck disable=SC2086
        step plan_predict 40 sh -c "\"$HKV\" plan --predict $PRED $MODEL --policy full,ctkvr \
            --ctx $(echo $CTXS | tr ' ' ,) --batch 1,4,8 --gpu-mem $GPU_MEM -o jsonl \
            >\"$OUT/plan_predict.jsonl\" 2>\"$OUT/plan_predict.log\"; \
            \"$HKV\" plan --predict rtx4090 $MODEL --policy full,ctkvr --ctx $(echo $CTXS | tr ' ' ,) \
            --batch 1,4,8 --gpu-mem 24G --host-gbs 70 -o jsonl >\"$OUT/plan_predict_rtx4090.jsonl\" \
            2>>\"$OUT/plan_predict.log\""
    fi
done
# The A/B steps, at one context (HEADLINE_AB_CTX), after every default row:
#   split_CTX_sleep     ctkvr at batch 1 with the host asleep on each layer's
#                       event (--gpu-spin-us 0) instead of polling it (the
#                       default); the first run's 0.5-0.6 ms a layer in which
#                       neither side worked (H200, 2026-11-30) was measured
#                       asleep. kernels_policy.json's sync rows time the bare
#                       wait both ways.
#   split_CTX_ompactive ctkvr at batch 1 with the OpenMP team spinning between
#                       layers (OMP_WAIT_POLICY=active), not asleep after
#                       libgomp's spin: each layer's far part wakes the team
#   split_CTX_teamspin  the same by hetkv's own hand (--gpu-team-spin): the
#                       team waits for the device's rows with the host, so a
#                       user need not set the environment; the model fitted
#                       ~270 us a layer of host time to the wake (H200 run)
#   split_CTX_profile   ctkvr at batch 1 with every op timed (--gpu-profile --json:
#                       the device's and the host's time per op, a step)
#   split_CTX_pingpong  ctkvr at the split's batches past 1 in two micro-batches
#                       (--gpu-pingpong), whose default waits for these rows.
AB=${HEADLINE_AB_CTX:-32768}
case " $CTXS " in *" $AB "*)
    ab_step() { # VARIANT BATCHES DEVICE-OPTION [ENV=VALUE]
        step "split_${AB}_$1" "$(split_limit "$AB")" env ${4:-} sh -c "\"$HKV\" bench $MODEL --device cuda \
            --gpu-mem $GPU_MEM --ctx $AB --batch $2 --steps $STEPS --chunk $CHUNK --configs ctkvr \
            $3 -o jsonl >\"$OUT/split_${AB}_$1.jsonl\" 2>\"$OUT/split_${AB}_$1.log\""
    }
    ab_step sleep 1 "--gpu-spin-us 0"
    ab_step ompactive 1 "" OMP_WAIT_POLICY=active
    ab_step teamspin 1 --gpu-team-spin
    # every op timed on the device, and the host's time in each op's call
    # (timeline "ops", "ops_host"): where a batch-1 step's ~9 ms of host time
    # outside its far work and waits goes
    step "split_${AB}_profile" "$(split_limit "$AB")" sh -c "\"$HKV\" bench $MODEL --device cuda \
        --gpu-mem $GPU_MEM --ctx $AB --batch 1 --steps $STEPS --chunk $CHUNK --configs ctkvr \
        --gpu-profile --json >\"$OUT/split_${AB}_profile.json\" 2>\"$OUT/split_${AB}_profile.log\""
    pp_b=$(split_batches "$AB" | tr , '\n' | awk '$1 > 1' | paste -sd, -)
    [ -n "$pp_b" ] && ab_step pingpong "$pp_b" --gpu-pingpong ;;
esac
# one of this host's cores on the far step of one layer, its rows cached (~30 s):
# the ceiling plan --predict --host-core-us takes; 16 of them against the
# probe say whether this host's far part is bound by its cores or its memory
# (bench/predict_fit.py --desktop-core-rows carries such rows to a desktop)
step far_core 60 sh -c "\"$HKV\" bench far -t 1 --warm --ctx ${HEADLINE_FAR_CTX:-32768} --batch 1 --steps 16 \
    --configs 'ctkvr;ctkvr:sketch=3,rho=1536,far=q8' -o jsonl >\"$OUT/far_core.jsonl\" \
    2>\"$OUT/far_core.log\""
python3 "$(dirname "$0")/headline_rows.py" "$OUT" >>"$LOG" 2>&1 || echo "headline_rows.py failed" | tee -a "$SUM"
echo "total $(($(date +%s) - T0)) s" | tee -a "$SUM"

#!/usr/bin/env bash
# 64 sequences decoding over one shared 1K prompt (issue 39), side by side in
# one run: hetkv with the prompt copied into every sequence against
# `bench --shared-prefix` (one copy by reference, full's cascade), natively and
# held to AVX2, and llama.cpp's shared-prompt run (llama-batched-bench -pps
# -kvu; without sharing too with LLAMA_COPIES=1), built as tools/scripts/llama_cpp_peer.sh
# builds it (--avx2 for an AVX2-only build).
#
#   bash bench/shared_prefix.sh BUILD PEER_BIN MODEL OUT [THREADS] [BATCH] [CTX]
#
# Raw output in OUT/, one file a command; the commands are at the top of each.
set -euo pipefail
build=$1 peer=$2 model=$3 out=$4 t=${5:-2} b=${6:-64} ctx=${7:-1024}
mkdir -p "$out"
steps=16
run() {   # name, command...
    local f="$out/$1.txt"
    shift
    echo "\$ $*" > "$f"
    "$@" >> "$f" 2>&1
    grep -E "batch +$b:|^\| +[0-9]+ \| +[0-9]+ \| +$b " "$f" || true
}
probe="--probe-mib 256"
for isa in native avx2-novnni; do
    ia=()
    [ "$isa" = native ] || ia=(--isa "$isa")
    for sp in copy shared; do
        sa=()
        [ "$sp" = copy ] || sa=(--shared-prefix)
        run "hetkv_${isa}_${sp}" "$build/tools/hetkv" bench -m "$model" --ctx "$ctx" --batch "$b" \
            --steps "$steps" --precision fast -t "$t" $probe "${ia[@]}" "${sa[@]}"
    done
done
# llama.cpp: prompt processed once and shared (-pps) in a unified KV cache
# (-kvu), then each sequence generates; and every sequence with its own prompt
export LD_LIBRARY_PATH="$peer${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
run llama_shared "$peer/llama-batched-bench" -m "$model" -t "$t" -c $((ctx + b * steps * 2)) \
    -b 2048 -ub 512 -npp "$ctx" -ntg "$steps" -npl "$b" -pps -kvu
# (every sequence with its own prompt: its unified cache attends all of them, slow; LLAMA_COPIES=1)
if [ "${LLAMA_COPIES:-0}" = 1 ]; then
    run llama_copies "$peer/llama-batched-bench" -m "$model" -t "$t" -c $((b * (ctx + steps * 2))) \
        -b 2048 -ub 512 -npp "$ctx" -ntg "$steps" -npl "$b" -kvu
fi

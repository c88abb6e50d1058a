#!/usr/bin/env bash
# Fuzz the parsers of untrusted input (docs/FUZZING.md).
#
#   tools/scripts/fuzz.sh [SECONDS_PER_TARGET [TARGET...]]    default: 60 s, every target
#
# Configures build-fuzz when needed (clang, -Dfuzz=true, ASan+UBSan,
# -Dcuda=disabled), builds the harnesses, then for each target: every kept
# crash in tests/fuzz/crashes/<target>/ once (a regression input that must
# no longer fail), then libFuzzer for SECONDS_PER_TARGET on a temporary copy
# of tests/fuzz/corpus/<target>/ (the repository's corpus is never written).
# One summary line per target; crash, leak, timeout and OOM inputs are kept
# under build-fuzz/artifacts/<target>/. Exits 1 when any target failed.
#
# Environment: HKV_FUZZ_JOBS (ninja -j, default: nproc), HKV_FUZZ_TOKENIZER
# (a GGUF whose byte-level BPE tokenizer the tokenizer and batch targets use,
# e.g. models/SmolLM2-135M-Instruct.Q4_1.gguf; default tests/fuzz/data/tok_bpe.gguf),
# HKV_FUZZ_KEEP=DIR (copy each target's grown corpus to DIR/<target>/).
set -u -o pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$SRC/build-fuzz"
SECS="${1:-60}"
shift $(( $# > 0 ? 1 : 0 ))
ALL=(gguf tokenizer chat args batch_line batch_body json_text)
if [ $# -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL[@]}"); fi

# -max_len per target: a GGUF header with its metadata and tiny tensors; a
# prompt; a conversation; one argument; a request line or body; a text.
max_len() {
    case "$1" in
        gguf) echo 65536 ;; tokenizer | chat | json_text) echo 4096 ;; args) echo 256 ;;
        batch_line | batch_body) echo 8192 ;; *) echo 4096 ;;
    esac
}

case "$SECS" in '' | *[!0-9]*) echo "fuzz.sh: SECONDS_PER_TARGET must be a whole number" >&2; exit 2 ;; esac
for t in "${TARGETS[@]}"; do
    case " ${ALL[*]} " in *" $t "*) ;; *) echo "fuzz.sh: unknown target '$t' (${ALL[*]})" >&2; exit 2 ;; esac
done
command -v clang >/dev/null || { echo "fuzz.sh: clang is missing (apt-get install clang)" >&2; exit 2; }

if [ ! -f "$BUILD/build.ninja" ]; then
    CC=clang CXX=clang++ meson setup "$BUILD" "$SRC" -Dfuzz=true -Db_sanitize=address,undefined \
        -Db_lundef=false -Dcuda=disabled -Dbuildtype=debugoptimized >"$BUILD.setup.log" 2>&1 ||
        { cat "$BUILD.setup.log" >&2; echo "fuzz.sh: meson setup failed" >&2; exit 2; }
    mv "$BUILD.setup.log" "$BUILD/fuzz-setup.log"
fi
EXES=()
for t in "${TARGETS[@]}"; do EXES+=("tests/fuzz/fuzz_$t"); done
ninja -C "$BUILD" -j "${HKV_FUZZ_JOBS:-$(nproc)}" "${EXES[@]}" >"$BUILD/fuzz-build.log" 2>&1 ||
    { tail -40 "$BUILD/fuzz-build.log" >&2; echo "fuzz.sh: build failed" >&2; exit 2; }

# Sanitizer reports must end the run so that libFuzzer keeps the input.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=0
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for t in "${TARGETS[@]}"; do
    exe="$BUILD/tests/fuzz/fuzz_$t"
    art="$BUILD/artifacts/$t"
    mkdir -p "$art"
    log="$BUILD/artifacts/$t.log"
    # 1. the kept crashes, each once
    crashes=()
    if [ -d "$SRC/tests/fuzz/crashes/$t" ]; then
        while IFS= read -r -d '' f; do crashes+=("$f"); done \
            < <(find "$SRC/tests/fuzz/crashes/$t" -type f -print0 | sort -z)
    fi
    if [ ${#crashes[@]} -gt 0 ]; then
        if ! "$exe" -timeout=10 -rss_limit_mb=2048 "${crashes[@]}" >"$log.regress" 2>&1; then
            printf '%-16s REGRESSION: a kept crash of tests/fuzz/crashes/%s fails again (log %s)\n' \
                "fuzz_$t" "$t" "$log.regress"
            grep -m3 -E "ERROR|check failed|runtime error|Running:" "$log.regress" | sed 's/^/    /'
            failed=1
            continue
        fi
    fi
    # 2. fuzz a temporary copy of the corpus
    corpus="$WORK/$t"
    mkdir -p "$corpus"
    [ -d "$SRC/tests/fuzz/corpus/$t" ] && cp -r "$SRC/tests/fuzz/corpus/$t/." "$corpus/"
    n0=$(find "$corpus" -type f | wc -l)
    dict=()
    [ -f "$SRC/tests/fuzz/dict/$t.dict" ] && dict=(-dict="$SRC/tests/fuzz/dict/$t.dict")
    before=$(find "$art" -type f | wc -l)
    t0=$(date +%s)
    "$exe" "$corpus" -max_total_time="$SECS" -max_len="$(max_len "$t")" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art/" "${dict[@]}" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    n1=$(find "$corpus" -type f | wc -l)
    after=$(find "$art" -type f | wc -l)
    verdict="ok"
    if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ]; then
        verdict="FAILED (exit $rc): $(grep -m1 -E 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)|check failed|runtime error' "$log" || echo 'see the log'); inputs in $art/, log $log"
        failed=1
    fi
    printf '%-16s %4ss  execs %-10s cov %-6s ft %-6s corpus %s -> %s  %s\n' "fuzz_$t" "$secs" \
        "${execs:-?}" "${cov:-?}" "${ft:-?}" "$n0" "$n1" "$verdict"
    if [ -n "${HKV_FUZZ_KEEP:-}" ]; then
        mkdir -p "$HKV_FUZZ_KEEP/$t" && cp -r "$corpus/." "$HKV_FUZZ_KEEP/$t/"
    fi
done
exit "$failed"

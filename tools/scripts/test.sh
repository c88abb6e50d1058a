#!/usr/bin/env bash
# The test suite. Dependencies and the default model first (tools/scripts/setup_deps.sh,
# tools/scripts/get_model.sh), then one of two sets:
#
#   tools/scripts/test.sh         the quick set, the default (a few minutes on 2 cores):
#                         build-emu/ only (gpu/ on the CUDA emulator), every meson
#                         suite there (unit suites, model, cli, batch, serve, eval,
#                         plan, gpu, emu, ptxas, ref, and a representative part of
#                         pipeline) except the tests tagged suite 'slow'
#                         (tests/*/meson.build says why each is slow) or
#                         'sanitize' (meant for the sanitizer builds).
#   tools/scripts/test.sh --full  what .ci/run calls: the default build build/
#                         compiled (with nvcc where present: it must build), every
#                         build-emu/ test including the 'slow' ones (but 'extra',
#                         below), then
#     build-asan/ the gpu and emu suites, the CPU-GPU pipeline (a ctkvr run through prompt,
#                 decode and a second turn, and quest, snapkv, laq likewise; a long decode,
#                 leak-checked), the unit suites (cpu, gguf, tokenizer, index, plan) and the
#                 model suite's tiny-model tests under AddressSanitizer + UBSan + LeakSanitizer;
#     build-tsan/ (clang, LLVM's libomp with its Archer tool, so TSan sees OpenMP's
#                 barriers) the gpu suite (but gpu_ctkvr and the policy kernels, below), the
#                 ctkvr pipeline run, the far attention's pieces and the decode products'
#                 work stealing at 2 and 16 threads under ThreadSanitizer (the emu suite's
#                 stream tests spin on volatile flags in pinned memory, a CUDA idiom that is
#                 a data race in the C++ model TSan checks);
#     build-asan/ again: the allocation-failure walk (tests/fault; the ASan build
#                 carries the fault injection, inert unless a test sets HKV_FAULT_AT).
#
#   tools/scripts/test.sh --extra the tests tagged suite 'extra' (build-emu/): the longest
#                         runs of the pipeline matrix (every policy, SmolLM2's logits
#                         through the device path), outside CI's hour; run them when
#                         the pipeline changes.
#
# Extra arguments go to build-emu's meson test (e.g. --suite gpu). Ends with
# tools/scripts/test_summary.py: every failed and skipped test named with its reason,
# the ISA variants this CPU could not test, one count line; a skip of
# something this script installs or fetches fails the run.
set -euo pipefail
cd "$(dirname "$0")/../.."
full=0
if [ "${1:-}" = --full ]; then full=1; shift; fi
if [ "${1:-}" = --extra ]; then full=2; shift; fi
tools/scripts/setup_deps.sh
tools/scripts/get_model.sh
tools/scripts/build.sh emu
# nvcc for the ptxas suite: $NVCC, or the machine's own toolkit, or else NVIDIA's
# PyPI wheels unpacked into .deps/cuda (tools/scripts/setup_nvcc.sh). Given to
# build-emu's tests alone: meson would take $NVCC for a CUDA build of build/.
nvcc=${NVCC:-$(command -v nvcc || true)}
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
[ -n "$nvcc" ] || nvcc=$(tools/scripts/setup_nvcc.sh)
status=0
logs=(build-emu/meson-logs/testlog.json)
# Two tests at a time on 2 cores: most are single-threaded Python driving one
# process; the ones that must run alone (timing, ports, MPI) say
# is_parallel: false in their meson.build.
jobs=(--num-processes "${HKV_TEST_JOBS:-2}")
if [ $full = 0 ]; then
    NVCC="$nvcc" meson test -C build-emu --print-errorlogs "${jobs[@]}" --no-suite slow --no-suite sanitize "$@" || status=$?
    python3 tools/scripts/test_summary.py "${logs[@]}" || status=1
    exit $status
fi
if [ $full = 2 ]; then
    NVCC="$nvcc" meson test -C build-emu --print-errorlogs "${jobs[@]}" --suite extra "$@" || status=$?
    python3 tools/scripts/test_summary.py "${logs[@]}" || status=1
    exit $status
fi

# Each phase's wall time, printed as it ends: CI has 60 minutes for all of it.
t_phase=$SECONDS
phase() { echo "test.sh: $1: $((SECONDS - t_phase)) s (total $SECONDS s)"; t_phase=$SECONDS; }
phase "setup and build-emu"
# build/ is a compile check (nvcc's, where present): the library and hetkv, not
# the tests, which run in build-emu/
HKV_BUILD_TARGETS="tools/hetkv tools/hkv-dump-logits" tools/scripts/build.sh
phase "build/"
NVCC="$nvcc" meson test -C build-emu --print-errorlogs "${jobs[@]}" --no-suite sanitize --no-suite extra "$@" || status=$?
phase "build-emu: every test but the extra ones"

# Only what the sanitizer runs use is built under them: the gpu and emu
# suites' executables and the two the pipeline tests run; under ASan also the
# unit suites' (second argument: the folders, space-separated).
sanitizer_targets() {
    python3 - "$1" "$2" <<'PY'
import json, os, subprocess, sys
d, dirs = sys.argv[1], sys.argv[2].split()
out = subprocess.run(["meson", "introspect", "--targets", d], capture_output=True, text=True, check=True)
names = []
for t in json.loads(out.stdout):
    path = os.path.relpath(t["filename"][0], os.path.abspath(d))
    if t["type"] == "executable" and (any(path.startswith(x + "/") for x in dirs)
                                      or path in ("tools/hetkv", "tools/hkv-dump-logits")):
        names.append(path)
print(" ".join(names))
PY
}
# The model suite's tests on tiny generated models (SmolLM2's take minutes
# each under ASan; build-emu runs them)
asan_model=(model_logits_tiny model_logits_tiny_tiered_full model_logits_tiny_tiered_oracle_all
            model_logits_tiny_tiered_quest_all model_logits_tiny_tiered_snapkv_all
            model_logits_tiny_tiered_rocketkv_all model_logits_tiny_tiered_fastkv_all
            model_logits_tiny_plain model_tsp_tiny model_lookahead_tiny model_fast_tiny)
for v in asan tsan; do
    d=build-$v
    suites=(--suite gpu --suite emu --suite cpu --suite gguf --suite tokenizer --suite index
            --suite plan --suite kv)
    dirs="tests/gpu tests/emu tests/cpu tests/gguf tests/tokenizer tests/index tests/plan tests/model tests/kv"
    named=(pipeline_sanitized pipeline_asan_long pipeline_asan_policies pipeline_asan_pingpong
           pipeline_asan_stream "${asan_model[@]}")   # meson: suites and names do not mix
    # gpu_ctkvr's host reference reads a struct on the main thread's stack
    # from OpenMP workers; when TSan cannot restore the worker's stack the
    # OpenMP suppression does not match and the join it cannot see is
    # reported (seen once in three runs): not run under TSan. gpu_policies and
    # gpu_page_policies neither: their coalesced scoring kernels (gpu/tile_dot.cuh)
    # shuffle 63 times per 32 keys, each a fiber switch in the emulator, which under
    # TSan ran past 10 minutes and was killed for memory on this 24 GB machine; their
    # blocks share nothing but their inputs, and they run under ASan+UBSan above.
    # Under TSan also the OpenMP far attention in pieces (model_far_pieces_threads:
    # 2 and 16 threads), the shared prefix's cascade (kv_prefix), the items claimed
    # by NUMA node (kv_numa) and the decode
    # products' work stealing (cpu_gemv, cpu_gemv_16t),
    # with libomp's Archer showing TSan the barriers (build.sh builds build-tsan/ with clang).
    if [ "$v" = tsan ]; then
        suites=(gpu_model gpu_attn gpu_decode_split cpu_gemv cpu_gemv_16t kv_prefix kv_numa)
        dirs="tests/gpu tests/emu tests/cpu tests/kv"
        named=(pipeline_sanitized model_far_pieces_threads)
    fi
    HKV_BUILD_TARGETS=build.ninja tools/scripts/build.sh "$v" >/dev/null   # configure only
    HKV_BUILD_TARGETS="$(sanitizer_targets "$d" "$dirs")" tools/scripts/build.sh "$v" >/dev/null
    # UBSan must fail the test, not only print; TSan cannot see inside the
    # uninstrumented OpenMP runtime (tests/gpu/tsan.supp says why); an
    # absurd size must reach the code's own check as a NULL (plan_pinned
    # asks for 2^60 bytes of page-locked memory), not abort in ASan.
    # TSan's runs stay one at a time: each of its tests is multi-threaded and
    # TSan's own memory is several times the test's.
    sjobs=("${jobs[@]}")
    archer=()
    if [ "$v" = tsan ]; then
        sjobs=(--num-processes 1)
        lib=$(clang -print-file-name=libarcher.so)
        [ -f "$lib" ] || lib=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | tail -1 || true)
        [ -f "$lib" ] || { echo "test.sh: libarcher.so not found (libomp-dev)" >&2; exit 1; }
        archer=(OMP_TOOL_LIBRARIES="$lib" ARCHER_OPTIONS=verbose=1)
    fi
    env "${archer[@]}" ASAN_OPTIONS=allocator_may_return_null=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    LSAN_OPTIONS="suppressions=$PWD/tests/gpu/lsan.supp" \
    TSAN_OPTIONS="suppressions=$PWD/tests/gpu/tsan.supp history_size=7 halt_on_error=0" \
        meson test -C "$d" --no-rebuild --print-errorlogs "${sjobs[@]}" "${suites[@]}" \
            --timeout-multiplier 4 || status=$?
    env "${archer[@]}" UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    LSAN_OPTIONS="suppressions=$PWD/tests/gpu/lsan.supp" \
    TSAN_OPTIONS="suppressions=$PWD/tests/gpu/tsan.supp history_size=7 halt_on_error=0" \
        meson test -C "$d" --no-rebuild --print-errorlogs "${sjobs[@]}" "${named[@]}" \
            --timeout-multiplier 2 --logbase pipeline || status=$?
    logs+=("$d/meson-logs/testlog.json" "$d/meson-logs/pipeline.json")
    phase "build-$v: build and tests"
done
# The allocation-failure walk (tests/fault): every allocation of a few whole
# jobs failed in turn, under ASan + UBSan + LeakSanitizer, by build-asan/'s
# hetkv (built above), a run a core at a time (tests/fault/test_fault_walk.py).
meson test -C build-asan --no-rebuild --print-errorlogs --num-processes 1 fault_walk \
    --logbase fault || status=$?
phase "build-asan: the fault walk"
logs+=(build-asan/meson-logs/fault.json)
python3 tools/scripts/test_summary.py --slowest 15 "${logs[@]}" || status=1
exit $status

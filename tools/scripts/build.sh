#!/usr/bin/env bash
# Configure (once) and build. Without arguments: build/, the default build
# (gpu/ compiled by nvcc when it is present). With a first argument naming a
# variant, its own directory:
#   emu    build-emu/   gpu/ on the CUDA emulator (-Dgpu_emu=true): kernels run on the CPU
#   asan   build-asan/  the emulator build under AddressSanitizer + UBSan, with fault
#                       injection (-Dfault_inject=true, tests/fault: inert unless
#                       HKV_FAULT_AT is set; the walk fails device allocations too)
#   tsan   build-tsan/  the emulator build under ThreadSanitizer, by clang with libomp (Archer)
# Extra arguments go to meson setup. HKV_BUILD_TARGETS limits what ninja builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
variant=${1:-}
case "$variant" in
    emu) dir=build-emu; shift; opts=(-Dgpu_emu=true --buildtype=release) ;;
    asan|fault) dir=build-asan; shift   # 'fault': the name of its own build before
          opts=(-Dgpu_emu=true -Dfault_inject=true --buildtype=debugoptimized
                -Db_sanitize=address,undefined -Db_lundef=false) ;;
    tsan) dir=build-tsan; shift   # clang, so that OpenMP is LLVM's libomp, whose Archer tool
          # shows TSan the barriers and task ends (libgomp's are invisible to it)
          export CC=clang CXX=clang++
          opts=(-Dgpu_emu=true --buildtype=debugoptimized -Db_sanitize=thread -Db_lundef=false) ;;
    ""|-*) dir=build; opts=(--buildtype=release) ;;
    *) echo "build.sh: unknown variant '$variant' (emu, asan, tsan, fault)" >&2; exit 2 ;;
esac
# a build-tsan/ configured by gcc (before libomp's Archer) is set up again
if [ "$variant" = tsan ] && [ -f "$dir/build.ninja" ] &&
   ! grep -q 'command = clang ' "$dir/build.ninja"; then
    rm -rf "$dir"
fi
# a build-asan/ configured before it carried fault injection gains it
if [ "$dir" = build-asan ] && [ -f "$dir/build.ninja" ] && ! grep -q HKV_FAULT_INJECT "$dir/build.ninja"; then
    meson configure "$dir" -Dfault_inject=true >/dev/null
fi
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${opts[@]}" "$@" >/dev/null
fi
# shellcheck disable=SC2086
ninja -C "$dir" ${HKV_BUILD_TARGETS:-} >/dev/null
echo "build: $dir/tools/hetkv"

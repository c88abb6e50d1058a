#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-batched-bench as a peer to measure
# hetkv against (issue 15), from the llama-cpp-python source package on PyPI
# (the only place this project's machines can get llama.cpp from). CPU only,
# -march=native as llama.cpp's own default. Nothing of it is committed: the
# source and the build live in build-peer/ (ignored).
#
#   tools/llama_cpp_peer.sh [VERSION]       # default 0.3.36 (llama.cpp of that release)
#
# Prints the directory holding the two binaries on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${1:-0.3.36}
dir=build-peer/llama-cpp-python-$ver
bin=$dir/build/bin
if [ -x "$bin/llama-bench" ] && [ -x "$bin/llama-batched-bench" ]; then
    echo "$bin"
    exit 0
fi
mkdir -p build-peer
tarball=build-peer/llama_cpp_python-$ver.tar.gz
if [ ! -f "$tarball" ]; then
    python3 -m pip download "llama-cpp-python==$ver" --no-binary :all: --no-deps -d build-peer >&2
fi
rm -rf "$dir"
mkdir -p "$dir"
tar xzf "$tarball" -C "$dir" --strip-components=1
src=$dir/vendor/llama.cpp
# On CPUs with AMX, -march=native turns on ggml's AMX kernels, and in 0.3.36
# the Q4_1 one (tinygemm_kernel_amx<block_q8_1, block_q4_1>) dies of SIGILL
# on a tile its configuration left out (seen on a Xeon with AMX-INT8, with
# the process granted the tile state): there the peer is built with the
# same ISA as native (AVX-512 F/CD/VL/DQ/BW, VBMI, VNNI, BF16, AVX-VNNI) but
# no AMX, which is llama.cpp at its best on that machine short of the crash.
isa=(-DGGML_NATIVE=ON)
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
         -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
         -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    echo "llama_cpp_peer: AMX here: ggml built without its AMX kernels (see the comment)" >&2
fi
cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
cmake --build "$dir/build" --target llama-bench llama-batched-bench -j "$(nproc)" >&2
echo "$bin"

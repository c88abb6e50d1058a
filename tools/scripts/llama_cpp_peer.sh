#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-batched-bench as a peer to measure
# hetkv against (issue 15), from the llama-cpp-python source package on PyPI
# (the only place this project's machines can get llama.cpp from). CPU by default,
# -march=native as llama.cpp's own default. Nothing of it is committed: the
# source and the build live in build-peer/ (ignored).
#
#   tools/scripts/llama_cpp_peer.sh [VERSION]                 # default 0.3.36 (llama.cpp of that release)
#   tools/scripts/llama_cpp_peer.sh --cuda sm_90 [VERSION]     # the CUDA backend for one architecture
#                                                      # (sm_90 H100/H200, sm_89 RTX 4090; issue 37)
#   tools/scripts/llama_cpp_peer.sh --avx2 [VERSION]           # CPU, AVX2/FMA/F16C only (no AVX-512,
#                                                      # no AVX-VNNI): an AVX2-only CPU's llama.cpp
#                                                      # on any x86 machine (issue 38)
#
# The CUDA build is static (BUILD_SHARED_LIBS=OFF) so the two binaries travel
# to a GPU machine alone (they load the machine's libcudart and libcublas;
# NCCL and OpenSSL are left out: with them the binary also wanted libnccl.so.2,
# 218 MB, which no call can carry, and libssl);
# nvcc from /usr/local/cuda or PATH. It compiles ggml's CUDA kernels for one
# architecture: expect tens of minutes on 2 cores, so start it early.
#
# Prints the directory holding the two binaries on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
cuda=""
avx2=""
if [ "${1:-}" = "--avx2" ]; then
    avx2=1
    shift
elif [ "${1:-}" = "--cuda" ]; then
    cuda=${2:?--cuda needs an architecture, e.g. sm_90}
    case "$cuda" in sm_[0-9][0-9]) ;; *) echo "llama_cpp_peer: --cuda $cuda: expected sm_NN" >&2; exit 2 ;; esac
    shift 2
fi
ver=${1:-0.3.36}
dir=build-peer/llama-cpp-python-$ver
out=$dir/build${cuda:+-cuda-$cuda}${avx2:+-avx2}
bin=$out/bin
if [ -x "$bin/llama-bench" ] && [ -x "$bin/llama-batched-bench" ]; then
    echo "$bin"
    exit 0
fi
mkdir -p build-peer
tarball=build-peer/llama_cpp_python-$ver.tar.gz
if [ ! -f "$tarball" ]; then
    python3 -m pip download "llama-cpp-python==$ver" --no-binary :all: --no-deps -d build-peer >&2
fi
src=$dir/vendor/llama.cpp
if [ ! -f "$src/CMakeLists.txt" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    tar xzf "$tarball" -C "$dir" --strip-components=1
fi
if [ -n "$cuda" ]; then
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    [ -x "$nvcc" ] || { echo "llama_cpp_peer: --cuda needs nvcc (not on PATH nor in /usr/local/cuda)" >&2; exit 1; }
    cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_NATIVE=OFF \
        -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="${cuda#sm_}" -DBUILD_SHARED_LIBS=OFF \
        -DGGML_CUDA_NCCL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
    cmake --build "$out" --target llama-bench llama-batched-bench -j "$(nproc)" >&2
    echo "$bin"
    exit 0
fi
# On CPUs with AMX, -march=native turns on ggml's AMX kernels, and in 0.3.36
# the Q4_1 one (tinygemm_kernel_amx<block_q8_1, block_q4_1>) dies of SIGILL
# on a tile its configuration left out (seen on a Xeon with AMX-INT8, with
# the process granted the tile state): there the peer is built with the
# same ISA as native (AVX-512 F/CD/VL/DQ/BW, VBMI, VNNI, BF16, AVX-VNNI) but
# no AMX, which is llama.cpp at its best on that machine short of the crash.
isa=(-DGGML_NATIVE=ON)
if [ -n "$avx2" ]; then
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
         -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
elif grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
         -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
         -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    echo "llama_cpp_peer: AMX here: ggml built without its AMX kernels (see the comment)" >&2
fi
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
cmake --build "$out" --target llama-bench llama-batched-bench -j "$(nproc)" >&2
echo "$bin"

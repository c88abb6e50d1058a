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
cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >&2
cmake --build "$dir/build" --target llama-bench llama-batched-bench -j "$(nproc)" >&2
echo "$bin"

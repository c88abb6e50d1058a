#!/usr/bin/env bash
# Pack a CUDA build for a GPU machine that has the NVIDIA driver and CUDA's
# libraries but not this project's Debian ones (the device machines lent to
# sessions: Ubuntu, CUDA in /usr/local/cuda/lib64, no network):
#
#     tools/scripts/gpu_pack.sh BUILD_DIR PACK.tar.xz [BASE_HETKV]
#
# b/ holds BUILD_DIR's hetkv, hkv-dump-logits and tests/gpu executables, a/
# the optional baseline hetkv (bench/gpu_ab.sh), lib/ every shared library they
# load except glibc's, the C++ runtime and CUDA's (the machine's own are newer
# or must match its driver), and the gguf wheel of .whl/ when there is one
# (tests/pipeline). On the GPU machine, bench/gpu_remote.sh PACK SECONDS
# [SCRIPT] does all of it; by hand:
#
#     tar xJf PACK.tar.xz -C /tmp/p
#     export LD_LIBRARY_PATH=/tmp/p/lib:/usr/local/cuda/lib64
#     bench/gpu_check.sh /tmp/p/b OUT 480      # or bench/gpu_ab.sh /tmp/p/a/hetkv /tmp/p/b OUT
set -eu
BUILD=$1
PACK=$2
BASE=${3:-}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/b/tools" "$T/b/tests/gpu" "$T/lib"
cp "$BUILD/tools/hetkv" "$BUILD/tools/hkv-dump-logits" "$T/b/tools/"
for t in "$BUILD"/tests/gpu/test_gpu_*; do
    [ -f "$t" ] && [ -x "$t" ] && cp "$t" "$T/b/tests/gpu/"
done
if [ -n "$BASE" ]; then
    mkdir -p "$T/a"
    cp "$BASE" "$T/a/hetkv"
fi
skip='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libcudart)\.'
find "$T/a" "$T/b" -type f 2>/dev/null | while read -r f; do
    ldd "$f" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
    echo "$name" | grep -Eq "$skip" || cp -L "$path" "$T/lib/$name"
done
ls .whl/*.whl >/dev/null 2>&1 && cp .whl/*.whl "$T/"
tar cJf "$PACK" -C "$T" .
echo "$PACK: $(du -h "$PACK" | cut -f1), $(ls "$T/lib" | wc -l) libraries"

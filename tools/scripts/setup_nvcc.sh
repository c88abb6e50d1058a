#!/usr/bin/env bash
# nvcc for the ptxas suite (tests/ptxas: no spills on sm_89/sm_90, the MMAs
# present) on a machine without a CUDA toolkit, from NVIDIA's PyPI wheels:
# the compiler (nvcc, ptxas, cicc) and the headers gpu/*.cu include (runtime,
# crt, cccl, cuBLAS's), pinned to the toolkit the GPU runs were built with
# (13.0, as /usr/local/cuda on the development machines).
#
# Unpacked into .deps/cuda (git-ignored), never onto PATH: the default build's
# meson finds no nvcc there and stays CPU-only; only the ptxas suite is pointed
# at it (test.sh exports NVCC). No GPU library is installed: the cuBLAS wheel
# is read for its six headers, the others for their binaries and headers. Prints the nvcc path; idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.deps/cuda
wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14)
stamp="$dest/.wheels"
if [ -x "$dest/bin/nvcc" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${wheels[*]}" ]; then
    echo "$PWD/$dest/bin/nvcc"; exit 0
fi
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
# pip's cache keeps the wheels for the next fresh clone (the cuBLAS one is ~400 MB)
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$dl" "${wheels[@]}" >&2 || {
    echo "setup_nvcc: pip could not download ${wheels[*]}" >&2; exit 1; }
rm -rf "$dest.new"
mkdir -p "$dest.new"
python3 - "$dl" "$dest.new" <<'PY'
import glob, os, stat, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
n = 0
for whl in sorted(glob.glob(os.path.join(src, '*.whl'))):
    z = zipfile.ZipFile(whl)
    for info in z.infolist():
        parts = info.filename.split('/')
        # nvidia/cu13/<bin|include|nvvm|...>/...: a toolkit's tree under nvidia/cu13
        if len(parts) < 4 or parts[0] != 'nvidia' or info.is_dir():
            continue
        if parts[2] == 'lib':   # no libraries: nvcc -fatbin links nothing
            continue
        out = os.path.join(dest, *parts[2:])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as f, open(out, 'wb') as g:
            g.write(f.read())
        mode = (info.external_attr >> 16) & 0o777
        if mode & stat.S_IXUSR or parts[2] == 'bin' or parts[-2:-1] == ['bin']:
            os.chmod(out, 0o755)
        n += 1
if n == 0:
    sys.exit('setup_nvcc: the wheels held no nvidia/cu13 tree')
PY
echo "${wheels[*]}" > "$dest.new/.wheels"
rm -rf "$dest"
mv "$dest.new" "$dest"
"$dest/bin/nvcc" --version >/dev/null || { echo "setup_nvcc: $dest/bin/nvcc does not run" >&2; exit 1; }
echo "$PWD/$dest/bin/nvcc"

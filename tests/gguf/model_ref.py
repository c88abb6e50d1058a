#!/usr/bin/env python3
"""Cross-check the real model through gguf-py, then run test_gguf_model.

usage: model_ref.py CHECKER MODEL

Skips (exit 77) when MODEL is absent. gguf-py's GGUFReader lists every
tensor (name, type, dims, absolute data offset) and dequantises a few rows of
several tensors; the C checker compares both with what hkv_gguf_open and
hkv_ggml_dequant_row give. Without numpy/gguf only the C checks run.
"""
import os
import subprocess
import sys
import tempfile

ROWS = {  # tensor -> rows to compare
    "token_embd.weight": [0, 1, 2, 1000, 49151],   # q8_0
    "blk.0.attn_q.weight": [0, 100, 575],           # q4_1
    "blk.29.ffn_down.weight": [0, 575],             # q4_1, ne0 = 1536
    "blk.0.attn_norm.weight": [0],                  # f32
    "output_norm.weight": [0],                      # f32
}


def generate(model, outdir):
    import numpy as np
    from gguf import GGUFReader, quants

    r = GGUFReader(model)
    with open(os.path.join(outdir, "meta.txt"), "w") as f:
        f.write(f"n_kv {len(r.fields) - 3}\n")  # minus the 3 header pseudo-fields
    with open(os.path.join(outdir, "tensors.txt"), "w") as f:
        for t in r.tensors:
            ne = [int(x) for x in t.shape] + [1] * (4 - len(t.shape))
            f.write(f"{t.name} {int(t.tensor_type)} {len(t.shape)} {' '.join(map(str, ne))} "
                    f"{int(t.data_offset)}\n")
    by_name = {t.name: t for t in r.tensors}
    with open(os.path.join(outdir, "rows.bin"), "wb") as fb, \
            open(os.path.join(outdir, "rows.txt"), "w") as ft:
        for name, rows in ROWS.items():
            t = by_name[name]
            ne0 = int(t.shape[0])
            raw = np.asarray(t.data).reshape(int(np.prod(t.shape)) // ne0, -1)
            vals = quants.dequantize(raw[rows], t.tensor_type).reshape(len(rows), ne0)
            for i, row in enumerate(rows):
                ft.write(f"{name} {row} {ne0} {fb.tell()}\n")
                fb.write(vals[i].astype(np.float32).tobytes())


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    checker, model = sys.argv[1], sys.argv[2]
    if not os.path.exists(model):
        print(f"SKIP: {model} is absent (tools/scripts/get_model.sh fetches it)")
        return 77
    try:
        import numpy  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as e:
        print(f"gguf-py unavailable ({e}): running the C checks only")
        return subprocess.run([checker, model]).returncode
    with tempfile.TemporaryDirectory(prefix="hkv_model_") as tmp:
        generate(model, tmp)
        sys.stdout.flush()
        return subprocess.run([checker, model, tmp]).returncode


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Reference data for test_ggml_dequant, from gguf-py (an independent numpy
implementation of the ggml formats), then run the C checker on it.

usage: dequant_ref.py CHECKER [OUTDIR]

Random but valid blocks per type: random bytes, with every fp16 scale field
replaced by a random finite half (subnormals and zero included) so no NaN
scale poisons a whole block. Two extra blocks per type: all-zero quants and
all-0xff quants. Half/bf16 inputs are fully random (inf and NaN included).
Exit status is the checker's; 77 (skip) when numpy or gguf is missing.
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import GGML_QUANT_SIZES
    from gguf import quants
except ImportError as e:  # pragma: no cover
    print(f"SKIP: needs numpy and gguf (pip install -r tests/requirements.txt): {e}")
    sys.exit(77)

# type -> byte offsets of fp16 scale fields inside a block (format definition)
HALF_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.Q8_K: [],
}
# our type sizes; Q8_K is missing from older gguf-py tables
SIZES = {**{t: GGML_QUANT_SIZES[t] for t in HALF_FIELDS if t in GGML_QUANT_SIZES},
         T.Q8_K: (256, 292)}


def finite_halves(rng, n):
    h = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    # exponent 31 is inf/NaN: clear its top bit to get a large finite half
    return np.where((h & 0x7C00) == 0x7C00, h & np.uint16(0xBFFF), h).astype(np.uint16)


def finite_f32(rng, n):
    x = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    return np.where((x & 0x7F800000) == 0x7F800000, x & np.uint32(0xBFFFFFFF), x).astype(np.uint32)


def q8_k_reference(raw):
    # gguf-py has no Q8_K dequantiser: f32 d, int8 qs[256], int16 bsums[16];
    # y = qs * d, written here from the format definition.
    d = raw[:, :4].copy().view(np.float32)
    qs = raw[:, 4:260].copy().view(np.int8).astype(np.float32)
    with np.errstate(over="ignore"):  # huge random scales give inf, on both sides
        return (qs * d).reshape(-1)


def make_blocks(rng, qtype, n_blocks):
    bs, ts = SIZES[qtype]
    raw = rng.integers(0, 256, (n_blocks, ts), dtype=np.uint8)
    raw[-2, :] = 0x00
    raw[-1, :] = 0xFF
    for off in HALF_FIELDS[qtype]:
        raw[:, off:off + 2] = finite_halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.Q8_K:
        raw[:, 0:4] = finite_f32(rng, n_blocks).view(np.uint8).reshape(n_blocks, 4)
    return raw


def write(outdir, name, arr):
    with open(os.path.join(outdir, name), "wb") as f:
        f.write(np.ascontiguousarray(arr).tobytes())


def generate(outdir, seed):
    rng = np.random.default_rng(seed)
    manifest = []
    for qtype in HALF_FIELDS:
        bs, _ = SIZES[qtype]
        raw = make_blocks(rng, qtype, 4096 // bs * 16)
        if qtype == T.Q8_K:
            ref = q8_k_reference(raw)
        else:
            ref = quants.dequantize(raw.reshape(-1), qtype).reshape(-1)
        name = qtype.name.lower().replace("_k", "_K")
        write(outdir, name + ".q", raw)
        write(outdir, name + ".f32", ref.astype(np.float32))
        manifest.append(f"{name} {int(qtype)} {ref.size}")
    # plain types: random bit patterns (NaN and inf included)
    n = 1 << 14
    f32_raw = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    f16_raw = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    for name, qtype, raw in (("f32", T.F32, f32_raw), ("f16", T.F16, f16_raw),
                             ("bf16", T.BF16, f16_raw)):
        ref = quants.dequantize(raw.view(np.uint8), qtype).reshape(-1)
        write(outdir, name + ".q", raw)
        write(outdir, name + ".f32", ref.astype(np.float32))
        manifest.append(f"{name} {int(qtype)} {ref.size}")
    with open(os.path.join(outdir, "manifest.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")

    # every half -> f32
    write(outdir, "fp16_all.f32", np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32))
    # f32 -> half / bf16: random bits, values in the half range, every half,
    # and every tie halfway between neighbouring halves (round-to-even cases)
    halves = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = (halves[:-1] + halves[1:]) / 2  # exact in float32: 12 significant bits
    ins = np.concatenate([
        rng.integers(0, 1 << 32, 1 << 17, dtype=np.uint32),
        (rng.standard_normal(1 << 17) * 10.0 ** rng.uniform(-9, 5.5, 1 << 17)).astype(np.float32).view(np.uint32),
        halves.astype(np.float32).view(np.uint32),
        mids.astype(np.float32).view(np.uint32),
        np.array([65504.0, 65519.996, 65520.0, 65536.0, 2.0 ** -25, 2.0 ** -24, 2.0 ** -14,
                  np.inf, 0.0], dtype=np.float32).view(np.uint32),
    ]).astype(np.uint32)
    ins = np.concatenate([ins, ins ^ np.uint32(0x80000000)])
    with np.errstate(over="ignore", invalid="ignore"):
        to16 = ins.view(np.float32).astype(np.float16).view(np.uint16)
    tobf = quants.quantize(ins.view(np.float32), T.BF16).view(np.uint16)
    write(outdir, "f32_conv.in", ins)
    write(outdir, "f32_to_fp16.out", to16)
    write(outdir, "f32_to_bf16.out", tobf)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    seed = int(os.environ.get("HKV_TEST_SEED", "20240611"))
    print(f"seed {seed} (set HKV_TEST_SEED to change)")
    with tempfile.TemporaryDirectory(prefix="hkv_dequant_") as tmp:
        outdir = sys.argv[2] if len(sys.argv) > 2 else tmp
        os.makedirs(outdir, exist_ok=True)
        generate(outdir, seed)
        sys.stdout.flush()
        return subprocess.run([sys.argv[1], outdir]).returncode


if __name__ == "__main__":
    sys.exit(main())

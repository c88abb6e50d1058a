#!/usr/bin/env python3
"""fastkv's token-selective propagation (TSP) prefill against the float64
numpy reference (tests/ref/ref_forward.py forward_tsp / decode_tsp).

    python3 tests/model/test_tsp.py --bin-dir build/tools

On tiny random models with more layers than the presets (so layers before,
at and after the TSP layer all exist), a prompt longer than tsp_len is
prefilled by `hkv-dump-logits --mode prompt` (hkv_prefill, which hands it
to the TSP driver) in small chunks (--rows), then the rest of the tokens are
decoded one per step, teacher-forced. The reference runs every token through
layers 0..tsp_layer, selects tsp_len tokens by the TSP layer's window scores
(exact softmax, summed over the window and all heads, pooled, sinks and the
last max(L_local, window) forced) and continues with those rows only, at
their original positions; decode attends every key a layer holds (the
policy's budget is set above the far tier, so decode drops nothing).

Small-budget cases: decode attends, per KV head, the sinks, the kept far tokens of
fastkv_keep (group-shared window scores among the tokens the layer holds) and
everything from the ring start on.

Checks per case: the last prompt token's logits and every decode row within
tol of the reference (argmax equal); and the same logits differ from the
full (no-TSP) reference by far more than tol, so the cut really happened.
Bad parameters (tsp_layer past the model, tsp_len below the near tier) must
fail with a message naming the parameter. Exit 0 all passed, 1 a failure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import replace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
sys.path.insert(0, os.path.join(ROOT, "tools", "scripts"))

import gen_tiny_gguf as gen  # noqa: E402
import ref_forward as rf  # noqa: E402

n_pass = n_fail = 0


def report(ok: bool, name: str, msg: str) -> None:
    global n_pass, n_fail
    n_pass += ok
    n_fail += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)


def dump(exe: str, model: str, ids: list[int], prefix: int, args: list[str], vocab: int, tmp: str):
    out = os.path.join(tmp, "tsp_logits.bin")
    if os.path.exists(out):
        os.remove(out)
    cmd = [exe, "-m", model, "--tokens", ",".join(map(str, ids)), "--mode", "prompt",
           "--prefix", str(prefix), "-o", out] + args
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if cp.returncode != 0:
        return None, cp.stderr.strip()
    return np.fromfile(out, dtype="<f4").reshape(len(ids), vocab).astype(np.float64), ""


def case(exe, tmp, name, cfg, n_tok, prefix, tsp_layer, tsp_len, window, pool, sink, local, rows,
         tol, seed, turn2=None, budget=100000):
    path = os.path.join(tmp, name + ".gguf")
    gen.write_model(cfg, path, verbose=False)
    ref = rf.RefModel(path)
    rng = np.random.default_rng(seed)
    ids = [int(x) for x in rng.integers(0, ref.vocab, n_tok)]
    args = ["--rows", str(rows), "--sink", str(sink), "--local", str(local), "--policy", "fastkv",
            "--policy-arg", f"tsp_layer={tsp_layer}", "--policy-arg", f"tsp_len={tsp_len}",
            "--policy-arg", f"window={window}", "--policy-arg", f"pool={pool}",
            "--policy-arg", f"budget={budget}"]
    if turn2:
        args += ["--turn2", f"{turn2[0]},{turn2[1]}"]
    c, msg = dump(exe, path, ids, prefix, args, ref.vocab, tmp)
    if c is None:
        report(False, name, msg)
        return
    lg, kv, sel = ref.forward_tsp(ids[:prefix], tsp_layer, tsp_len, window, 7, pool == 1, sink, local)
    keep = None
    if budget < prefix:   # decode attends each layer's kept set (fastkv_keep), not every key
        keep = ref.fastkv_keep(kv, prefix, budget, window, 7, pool == 1, sink, local)
    r = [lg]
    rows_cmp = [prefix - 1]   # engine rows compared
    p = prefix
    while p < n_tok:
        if turn2 and p == turn2[0]:
            # a later turn: every row through every layer, attending the keys each layer holds
            pos = np.arange(turn2[0], turn2[1])
            x = ref.tok_embd[np.array(ids[turn2[0]:turn2[1]])].astype(ref.dtype, copy=True)
            for l in range(ref.n_layers):
                x = ref._layer_sel(l, x, pos, kv)
            r.append((ref.rmsnorm(x[-1:], ref.out_norm) @ ref.output.T)[0])
            rows_cmp.append(turn2[1] - 1)
            p = turn2[1]
            continue
        r.append(ref.decode_tsp(ids[p], kv, p, keep))
        rows_cmp.append(p)
        p += 1
    r = np.array(r)
    cc = c[rows_cmp]
    scale = float(np.abs(r).max())
    rel = float(np.abs(cc - r).max()) / scale
    am = int((cc.argmax(1) != r.argmax(1)).sum())
    report(rel <= tol and am == 0 and np.isfinite(cc).all(), name,
           f"{len(sel)} of {prefix} tokens propagated past layer {tsp_layer}; {len(r)} rows, "
           f"rel {rel:.2e} (tol {tol:.0e}), argmax mismatches {am}")
    full = ref.forward(ids, None, "all")[rows_cmp]
    dfull = float(np.abs(cc - full).max()) / scale
    report(dfull > 20 * tol, name + " differs from full",
           f"rel {dfull:.2e} from the full-prompt reference (must exceed {20 * tol:.0e})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--tol", type=float, default=2e-3)
    a = ap.parse_args(argv)
    exe = None
    for d in (a.bin_dir, os.path.join(a.bin_dir, "tools")):
        p = os.path.join(d, "hkv-dump-logits")
        if os.path.isfile(p):
            exe = p
    if not exe:
        print("hkv-dump-logits not found", file=sys.stderr)
        return 1
    llama = replace(gen.PRESETS["llama_gqa3_q41"], layers=4)
    qwen = replace(gen.PRESETS["qwen2_gqa3_hd128_q80"], layers=3)
    with tempfile.TemporaryDirectory() as tmp:
        # chunks of 16 rows: both stages span several forward calls
        case(exe, tmp, "llama4_tsp1_avg", llama, 140, 120, 1, 48, 8, 1, 4, 16, 16, a.tol, 1)
        case(exe, tmp, "llama4_tsp0_max", llama, 110, 100, 0, 40, 6, 0, 2, 20, 16, a.tol, 2)
        case(exe, tmp, "llama4_tsp2_onechunk", llama, 96, 90, 2, 30, 8, 1, 3, 8, 256, a.tol, 3)
        case(exe, tmp, "qwen3_tsp0", qwen, 100, 90, 0, 36, 8, 1, 4, 12, 16, a.tol, 4)
        # a second turn after a propagated prompt: its rows attend the propagated positions
        # of the later layers (and every one of the earlier), across chunks
        case(exe, tmp, "llama4_tsp1_turn2", llama, 160, 100, 1, 40, 8, 1, 4, 16, 16, a.tol, 5,
             turn2=(104, 150))
        # a small budget: decode attends each layer's kept far tokens (group-shared, chosen
        # among the propagated ones past the TSP layer), the sinks and the local window
        case(exe, tmp, "llama4_tsp1_budget12", llama, 130, 110, 1, 44, 8, 1, 4, 16, 16, a.tol, 6,
             budget=12)
        case(exe, tmp, "qwen3_tsp1_budget6_max", qwen, 110, 100, 1, 40, 6, 0, 2, 12, 32, a.tol, 7,
             budget=6)
        # bad parameters: a clear error naming the parameter
        path = os.path.join(tmp, "llama4.gguf")
        gen.write_model(llama, path, verbose=False)
        for arg, want in (("tsp_layer=9", "tsp_layer"), ("tsp_len=10", "tsp_len"),
                          ("kernel=4", "kernel"), ("window=0", "window")):
            c, msg = dump(exe, path, list(range(1, 60)), 50,
                          ["--policy", "fastkv", "--policy-arg", arg], 1000, tmp)
            report(c is None and want in msg, f"rejects {arg}", msg.splitlines()[-1] if msg else "accepted")
    print(f"test_tsp: {n_pass} passed, {n_fail} failed")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The tiered cache's far attention in pieces (kv/kv_tiered_attn.c,
FAR_PIECE = 512 rows): with few decode rows x KV heads for the threads, the
pieces of every row run side by side and are merged in order. Checks, on a
tiny generated model with a far tier of ~4,600 rows (nine pieces):

  threads  the logits are bit-identical for -t 1, 2 and 5 (--threads; prompt mode, one
           sequence; batch mode, three sequences), for full and quest; and in prompt mode
           for oracle, ctkvr and ctkvr on int8 sketches and on 4-bit ones over the 8-bit
           far tier, whose scoring of one KV head's
           rows is spread over the threads without a selection of their own
           (kv/kv_score_team.c: 4,600 far keys, ~2,000 candidates: 4-18 pieces,
           256 fp16 rows or 512 sketch rows a piece);
  plain    the tiered cache with full equals the plain contiguous cache (its
           own attention, no pieces) within 2e-4 of max|logit|.

    python3 tests/model/test_far_pieces.py --bin-dir build/tools
Exit 0: passed, 1: failed. Last line: 'test_far_pieces: N passed, N failed'.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "scripts"))


def dump(bin_dir, model, ids, mode, extra, threads, out):
    cmd = [os.path.join(bin_dir, "hkv-dump-logits"), "-m", model, "--tokens", ",".join(map(str, ids)),
           "--mode", mode, "-t", str(threads), "-o", out, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed ({p.returncode}): {p.stderr.strip()[-300:]}")
    return np.fromfile(out, dtype=np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--threads", default="1,2,5",
                    help="thread counts, the first the reference (TSan runs 2,16: tools/scripts/test.sh)")
    ap.add_argument("--n-tokens", type=int, default=4700, help="prompt length (far pieces of 512 rows)")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    t0 = threads[0]
    import gen_tiny_gguf as gen
    passed = failed = 0

    def report(ok, label, msg):
        nonlocal passed, failed
        passed += ok
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {label}: {msg}")

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        gen.write_model(gen.PRESETS["llama_gqa3_q41"], model, verbose=False)
        ids = [int(x) for x in np.random.default_rng(5).integers(3, 900, a.n_tokens)]
        near = ["--sink", "4", "--local", "64"]
        modes = {"prompt": ["--prefix", str(a.n_tokens - 10), "--rows", "512"], "batch": []}
        pols = (["--policy", "full"], ["--policy", "quest", "--policy-arg", "budget=3000"],
                ["--policy", "oracle", "--policy-arg", "k=500"],
                ["--policy", "ctkvr", "--policy-arg", "Cp=8"],
                ["--policy", "ctkvr", "--policy-arg", "Cp=8", "--policy-arg", "sketch=1"],
                ["--policy", "ctkvr", "--policy-arg", "Cp=8", "--policy-arg", "sketch=3",
                 "--far-kv", "q8"])
        for pol in pols:
            for mode, margs in modes.items():
                if mode == "batch" and pol[1] not in ("full", "quest"):
                    continue
                label = f"{' '.join(pol[1::2])} {mode}"
                try:
                    runs = {t: dump(a.bin_dir, model, ids, mode, near + pol + margs, t,
                                    os.path.join(tmp, f"{t}.bin")) for t in threads}
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    report(False, label, str(e))
                    continue
                rows = int(np.isfinite(runs[t0]).sum())
                same = all(np.array_equal(runs[t0], runs[t], equal_nan=True) for t in threads[1:])
                report(same and rows > 0, f"{label} -t {'/'.join(map(str, threads))}",
                       f"{rows} logits, bit-identical: {same}")
                if pol[1] == "full":
                    try:
                        ref = dump(a.bin_dir, model, ids, mode, ["--kv", "plain"] + margs, 2,
                                   os.path.join(tmp, "plain.bin"))
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        report(False, f"{label} vs plain", str(e))
                        continue
                    m = np.isfinite(ref) & np.isfinite(runs[t0])
                    rel = float(np.abs(ref[m] - runs[t0][m]).max() / np.abs(ref[m]).max())
                    report(m.sum() == rows and rel <= 2e-4, f"{label} vs plain cache",
                           f"{int(m.sum())} logits, max rel {rel:.2e} (tol 2e-4)")
    print(f"test_far_pieces: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

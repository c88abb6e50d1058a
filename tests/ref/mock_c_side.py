#!/usr/bin/env python3
"""Stand-in for the C executables, to test tests/model/test_logits.py itself.

`make_bin_dir(dir, bug)` writes two wrapper scripts, hkv-dump-logits and
hetkv, that call this file. They follow the C side's command-line contract and
compute with the reference in float32 output, optionally with a deliberate bug
so the harness can be shown to catch it:

  none        correct (batch rows equal the single-sequence logits)
  chunks      batch mode as 3 independent sequences (contiguous chunks)
  neox        wrong RoPE layout for the architecture
  nofp16      K/V kept in full precision (a small, legitimate-looking change)
  gqa         query head h uses kv head h % n_kv instead of h // (n_head/n_kv)
  noise       logits + 1e-2 * max|logit| noise
  shortgen    hetkv run stops after 5 tokens without end-of-generation
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import ref_forward as rf  # noqa: E402


def _model(path: str, bug: str) -> rf.RefModel:
    m = rf.RefModel(path, kv_fp16=(bug != "nofp16"))
    if bug == "neox":
        m.neox = not m.neox
    if bug == "gqa" and m.n_head != m.n_kv:
        G, R = m.n_kv, m.n_head // m.n_kv
        D = m.head_dim
        # permute query heads so that head h lands where h % G would be served
        perm = np.array([(h % G) * R + h // G for h in range(m.n_head)])
        for L in m.layers:
            L["wq"] = L["wq"].reshape(m.n_head, D, -1)[np.argsort(perm)].reshape(m.n_head * D, -1)
            L["wo"] = L["wo"].reshape(-1, m.n_head, D)[:, np.argsort(perm)].reshape(-1, m.n_head * D)
            if L["bq"] is not None:
                L["bq"] = L["bq"].reshape(m.n_head, D)[np.argsort(perm)].reshape(-1)
    return m


def dump(argv, bug: str) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--mode", required=True, choices=["prefill", "decode", "batch"])
    ap.add_argument("-o", required=True)
    ap.add_argument("-t", type=int)
    a = ap.parse_args(argv)
    ids = [int(x) for x in a.tokens.split(",")]
    m = _model(a.m, bug)
    if a.mode == "batch" and bug == "chunks":
        n = len(ids)
        cuts = [0, n // 6 + 1, n // 2 + 1, n]
        lg = np.concatenate([m.logits(ids[s:e]) for s, e in zip(cuts, cuts[1:])])
    elif a.mode == "decode":
        c = m.new_cache()
        lg = np.concatenate([m.forward([t], c) for t in ids])
    else:
        lg = m.logits(ids)
    if bug == "noise":
        lg = lg + 1e-2 * np.abs(lg).max() * np.random.default_rng(0).standard_normal(lg.shape)
    lg.astype("<f4").tofile(a.o)
    return 0


def run(argv, bug: str) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("-m", required=True)
    ap.add_argument("-p", required=True)
    ap.add_argument("-n", type=int, required=True)
    ap.add_argument("--temp", type=float)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from bpe_min import BPE
    ids = BPE(a.m).encode(a.p)
    m = _model(a.m, bug)
    from gguf import GGUFReader
    eos = int(GGUFReader(a.m).fields["tokenizer.ggml.eos_token_id"].contents())
    out = m.greedy(ids, a.n, stop_ids=(eos,))
    if bug == "shortgen":
        out = out[:5]
    print("loading... (log line before the JSON)")
    print(json.dumps({"prompt_tokens": ids, "tokens": out, "text": BPE(a.m).decode(out)}))
    return 0


def make_bin_dir(d: str, bug: str = "none") -> str:
    os.makedirs(d, exist_ok=True)
    for name, fn in (("hkv-dump-logits", "dump"), ("hetkv", "run")):
        p = os.path.join(d, name)
        with open(p, "w") as f:
            f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} {fn} {bug} \"$@\"\n")
        os.chmod(p, os.stat(p).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return d


if __name__ == "__main__":
    fn, bug = sys.argv[1], sys.argv[2]
    sys.exit(dump(sys.argv[3:], bug) if fn == "dump" else run(sys.argv[3:], bug))

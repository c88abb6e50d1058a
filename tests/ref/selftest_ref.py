#!/usr/bin/env python3
"""Self-checks of the reference and the tiny-model generator (no C code involved).

1. Every preset of tools/scripts/gen_tiny_gguf.py is written, read back, and run
   through ref_forward; logits are finite and vary across vocab and positions.
2. The vectorised reference equals a deliberately naive one written here
   (token-by-token loops, per-head loops, RoPE via complex multiplication on
   explicit (pair) indices), in float64, to ~1e-10.
3. All-at-once logits equal one-token-at-a-time and chunked forward (the KV
   cache path) to ~1e-12.
4. Q4_K / Q6_K raw blocks written by the generator dequantise (gguf-py) to
   values with the intended spread, and the Q4_K scale packing round-trips.

Usage: python3 tests/ref/selftest_ref.py   (exit 0 on pass, 1 on failure)
"""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tools", "scripts"))

import gen_tiny_gguf as gen  # noqa: E402
import ref_forward as rf  # noqa: E402


def naive_logits(m: rf.RefModel, ids) -> np.ndarray:
    """Loop-per-token, loop-per-head forward; same math, no shared code paths
    except the dequantised weights."""
    H, G, D, nr = m.n_head, m.n_kv, m.head_dim, m.n_rot
    R = H // G
    Ks = [[] for _ in range(m.n_layers)]
    Vs = [[] for _ in range(m.n_layers)]
    out = []

    def norm(x, w):
        return x / np.sqrt(np.sum(x * x) / len(x) + m.eps) * w

    def rope(vec, pos):
        vec = vec.copy()
        for i in range(nr // 2):
            theta = pos * m.freq_scale * m.rope_base ** (-2.0 * i / nr)
            a, b = (i, i + nr // 2) if m.neox else (2 * i, 2 * i + 1)
            z = complex(vec[a], vec[b]) * complex(np.cos(theta), np.sin(theta))
            vec[a], vec[b] = z.real, z.imag
        return vec

    for pos, tok in enumerate(ids):
        x = m.tok_embd[tok].copy()
        for l, L in enumerate(m.layers):
            h = norm(x, L["attn_norm"])
            q = L["wq"] @ h + (L["bq"] if L["bq"] is not None else 0)
            k = L["wk"] @ h + (L["bk"] if L["bk"] is not None else 0)
            v = L["wv"] @ h + (L["bv"] if L["bv"] is not None else 0)
            kh = np.stack([rope(k[g * D:(g + 1) * D], pos) for g in range(G)])
            vh = v.reshape(G, D)
            if m.kv_fp16:
                kh = kh.astype(np.float16).astype(np.float64)
                vh = vh.astype(np.float16).astype(np.float64)
            Ks[l].append(kh)
            Vs[l].append(vh)
            o = np.zeros(H * D)
            for hh in range(H):
                g = hh // R
                qh = rope(q[hh * D:(hh + 1) * D], pos)
                sc = np.array([qh @ Ks[l][t][g] for t in range(pos + 1)]) / np.sqrt(D)
                w = np.exp(sc - sc.max())
                w /= w.sum()
                o[hh * D:(hh + 1) * D] = sum(w[t] * Vs[l][t][g] for t in range(pos + 1))
            x = x + L["wo"] @ o
            h = norm(x, L["ffn_norm"])
            gt = L["wg"] @ h
            x = x + L["wd"] @ (gt / (1 + np.exp(-gt)) * (L["wu"] @ h))
        out.append(m.output @ norm(x, m.out_norm))
    return np.array(out)


def main() -> int:
    fails = 0
    total = 0
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as d:
        paths = gen.write_all_presets(d)
        for name, p in paths.items():
            m = rf.RefModel(p)
            ids = rng.integers(0, m.vocab, 12)
            L = m.logits(ids)
            nv = naive_logits(m, ids)
            c = m.new_cache()
            inc = np.concatenate([m.forward([i], c) for i in ids])
            c = m.new_cache()
            ch = np.concatenate([m.forward(ids[:5], c), m.forward(ids[5:], c)])
            e_naive = np.abs(nv - L).max()
            e_inc = max(np.abs(inc - L).max(), np.abs(ch - L).max())
            ok = (np.isfinite(L).all() and L.std(axis=1).min() > 0.5 and
                  len(set(L.argmax(1).tolist())) > 3 and e_naive < 1e-9 and e_inc < 1e-9)
            fails += not ok
            total += 1
            print(f"{'PASS' if ok else 'FAIL'} ref/{name}: naive-vs-vectorised {e_naive:.1e}, "
                  f"incremental {e_inc:.1e}, logit std {L.std():.2f}, "
                  f"{len(set(L.argmax(1).tolist()))} distinct argmax of {len(ids)}")

    # K-quant blocks
    from gguf.quants import dequantize
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import Q4_K
    blk = gen.random_q4_k(rng, 64, 512, 0.05)
    x = dequantize(blk, QT.Q4_K)
    sc, mn = Q4_K.get_scale_min(blk.reshape(-1, 144)[:, 4:16])
    ok = (x.shape == (64, 512) and abs(x.std() - 0.05) < 0.01 and abs(x.mean()) < 0.005
          and sc.min() >= 40 and sc.max() <= 63 and mn.max() <= 63)
    fails += not ok
    total += 1
    print(f"{'PASS' if ok else 'FAIL'} ref/q4_k_blocks: std {x.std():.4f} mean {x.mean():.5f} "
          f"sc [{sc.min()},{sc.max()}] m [{mn.min()},{mn.max()}]")
    blk = gen.random_q6_k(rng, 64, 512, 0.05)
    x = dequantize(blk, QT.Q6_K)
    ok = x.shape == (64, 512) and abs(x.std() - 0.05) < 0.01 and abs(x.mean()) < 0.005
    fails += not ok
    total += 1
    print(f"{'PASS' if ok else 'FAIL'} ref/q6_k_blocks: std {x.std():.4f} mean {x.mean():.5f}")
    print(f"{total - fails} passed, {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

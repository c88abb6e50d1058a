#!/usr/bin/env python3
"""Independent numpy reference forward pass for Llama-family GGUF models.

Reads the file with gguf-py (GGUFReader), dequantises every weight once with
gguf.quants.dequantize, and runs the decoder in float64 (default; --dtype
float32 is available). Architectures: llama (RoPE on interleaved pairs
(x[2i], x[2i+1]), ggml's normal mode) and qwen2 (RoPE on NeoX halves
(x[i], x[i+n_rot/2]), q/k/v biases).

To mirror the runtime's storage, K (after RoPE) and V are rounded to float16
before attention, as the KV cache holds them in fp16 (kv_fp16=True, the default;
--no-kv-fp16 turns it off). Nothing else is rounded: activations and the
query stay in the compute dtype.

API
    logits(model_path, token_ids) -> np.ndarray [n, vocab] (float64)
    greedy(model_path, prompt_ids, n_new, stop_ids=()) -> list of new ids
    RefModel(path).forward(ids, cache) for incremental use
CLI
    python3 tests/ref/ref_forward.py MODEL --tokens 1,2,3 --out logits.npy
    python3 tests/ref/ref_forward.py MODEL --tokens 1,2,3 --greedy 32
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

try:
    from gguf import GGUFReader
    from gguf.quants import dequantize
except ImportError as e:  # pragma: no cover
    sys.stderr.write("ref_forward.py needs the PyPI package 'gguf' (pip install gguf): %s\n" % e)
    raise


def _field(r: GGUFReader, key: str, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


class KVCache:
    """Per-layer K and V: [n_kv_heads, T, head_dim] each, in the compute dtype
    (holding fp16-representable values when kv_fp16)."""

    def __init__(self, n_layers: int):
        self.k: list[np.ndarray | None] = [None] * n_layers
        self.v: list[np.ndarray | None] = [None] * n_layers
        self.n = 0


class RefModel:
    def __init__(self, path: str, kv_fp16: bool = True, dtype=np.float64, verbose: bool = False):
        t0 = time.time()
        self.path = path
        self.kv_fp16 = kv_fp16
        self.dtype = np.dtype(dtype)
        r = GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch not in ("llama", "qwen2"):
            raise ValueError(f"{path}: unsupported architecture {arch!r} (llama, qwen2)")
        self.arch = arch
        a = arch
        self.n_layers = int(_field(r, f"{a}.block_count"))
        self.dim = int(_field(r, f"{a}.embedding_length"))
        self.n_ff = int(_field(r, f"{a}.feed_forward_length"))
        self.n_head = int(_field(r, f"{a}.attention.head_count"))
        self.n_kv = int(_field(r, f"{a}.attention.head_count_kv", self.n_head))
        self.head_dim = int(_field(r, f"{a}.attention.key_length", self.dim // self.n_head))
        vlen = int(_field(r, f"{a}.attention.value_length", self.head_dim))
        if vlen != self.head_dim:
            raise ValueError("value_length != key_length is not supported")
        self.n_rot = int(_field(r, f"{a}.rope.dimension_count", self.head_dim))
        self.rope_base = float(_field(r, f"{a}.rope.freq_base", 10000.0))
        self.eps = float(_field(r, f"{a}.attention.layer_norm_rms_epsilon", 1e-5))
        stype = _field(r, f"{a}.rope.scaling.type", "none")
        sfac = _field(r, f"{a}.rope.scaling.factor", None)
        if stype in ("linear",) and sfac:
            self.freq_scale = 1.0 / float(sfac)
        elif stype in ("none", None) or (stype == "linear" and not sfac):
            self.freq_scale = 1.0
        else:
            raise ValueError(f"rope scaling type {stype!r} not supported by the reference")
        self.neox = arch == "qwen2"
        if self.n_head % self.n_kv:
            raise ValueError("head_count not a multiple of head_count_kv")

        tensors = {t.name: t for t in r.tensors}

        def W(name: str) -> np.ndarray:
            t = tensors[name]
            a_ = dequantize(t.data, t.tensor_type)
            # ggml shape [ne0, ne1] -> numpy [ne1, ne0]
            shape = tuple(int(x) for x in reversed(t.shape))
            return np.asarray(a_, dtype=self.dtype).reshape(shape)

        def Wopt(name: str):
            return W(name) if name in tensors else None

        self.tok_embd = W("token_embd.weight")                 # [vocab, dim]
        self.vocab = self.tok_embd.shape[0]
        self.out_norm = W("output_norm.weight")
        self.output = Wopt("output.weight")
        self.tied = self.output is None
        if self.tied:
            self.output = self.tok_embd
        self.layers = []
        for l in range(self.n_layers):
            p = f"blk.{l}."
            L = dict(
                attn_norm=W(p + "attn_norm.weight"),
                wq=W(p + "attn_q.weight"), wk=W(p + "attn_k.weight"), wv=W(p + "attn_v.weight"),
                bq=Wopt(p + "attn_q.bias"), bk=Wopt(p + "attn_k.bias"), bv=Wopt(p + "attn_v.bias"),
                wo=W(p + "attn_output.weight"),
                ffn_norm=W(p + "ffn_norm.weight"),
                wg=W(p + "ffn_gate.weight"), wu=W(p + "ffn_up.weight"), wd=W(p + "ffn_down.weight"),
            )
            self.layers.append(L)
        # RoPE frequencies theta_i = base^(-2i/n_rot), i < n_rot/2
        i = np.arange(self.n_rot // 2, dtype=np.float64)
        self.inv_freq = self.rope_base ** (-2.0 * i / self.n_rot)
        if verbose:
            print(f"ref: loaded {path} ({arch}, {self.n_layers} layers, dim {self.dim}, heads "
                  f"{self.n_head}/{self.n_kv}x{self.head_dim}, vocab {self.vocab}, "
                  f"{'tied' if self.tied else 'untied'}) in {time.time() - t0:.1f}s", file=sys.stderr)

    # ------------------------------------------------------------ pieces
    def rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: [n, heads, head_dim]; pos: [n] absolute positions."""
        ang = (pos.astype(np.float64) * self.freq_scale)[:, None] * self.inv_freq[None, :]
        cos = np.cos(ang).astype(self.dtype)[:, None, :]
        sin = np.sin(ang).astype(self.dtype)[:, None, :]
        out = x.copy()
        nr = self.n_rot
        if self.neox:
            x0 = x[..., : nr // 2]
            x1 = x[..., nr // 2: nr]
            out[..., : nr // 2] = x0 * cos - x1 * sin
            out[..., nr // 2: nr] = x0 * sin + x1 * cos
        else:
            x0 = x[..., 0:nr:2]
            x1 = x[..., 1:nr:2]
            out[..., 0:nr:2] = x0 * cos - x1 * sin
            out[..., 1:nr:2] = x0 * sin + x1 * cos
        return out

    def _kv_round(self, x: np.ndarray) -> np.ndarray:
        if self.kv_fp16:
            return x.astype(np.float16).astype(self.dtype)
        return x

    # ------------------------------------------------------------ forward
    def new_cache(self) -> KVCache:
        return KVCache(self.n_layers)

    def forward(self, ids, cache: KVCache | None = None, want_logits: str = "all") -> np.ndarray:
        """Process ids at positions cache.n .. cache.n+len(ids)-1 (0.. without a
        cache). Returns logits [n, vocab] ("all") or [1, vocab] ("last")."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("ids must be a non-empty 1-D list")
        if ids.min() < 0 or ids.max() >= self.vocab:
            raise ValueError(f"token id out of range [0, {self.vocab})")
        if cache is None:
            cache = self.new_cache()
        n = len(ids)
        p0 = cache.n
        pos = p0 + np.arange(n)
        H, G, D = self.n_head, self.n_kv, self.head_dim
        R = H // G
        scale = 1.0 / np.sqrt(D)
        T = p0 + n
        # causal mask: query i (abs pos p0+i) sees keys t <= p0+i
        mask = np.arange(T)[None, :] > pos[:, None]               # [n, T]

        x = self.tok_embd[ids].astype(self.dtype, copy=True)      # [n, dim]
        for l, L in enumerate(self.layers):
            h = self.rmsnorm(x, L["attn_norm"])
            q = h @ L["wq"].T
            k = h @ L["wk"].T
            v = h @ L["wv"].T
            if L["bq"] is not None:
                q = q + L["bq"]
            if L["bk"] is not None:
                k = k + L["bk"]
            if L["bv"] is not None:
                v = v + L["bv"]
            q = self.rope(q.reshape(n, H, D), pos)
            k = self._kv_round(self.rope(k.reshape(n, G, D), pos))
            v = self._kv_round(v.reshape(n, G, D))
            k = k.transpose(1, 0, 2)                               # [G, n, D]
            v = v.transpose(1, 0, 2)
            if cache.k[l] is not None:
                k = np.concatenate([cache.k[l], k], axis=1)
                v = np.concatenate([cache.v[l], v], axis=1)
            cache.k[l], cache.v[l] = k, v
            # query head h uses kv head h // R (ggml's broadcast)
            qg = q.reshape(n, G, R, D).transpose(1, 2, 0, 3).reshape(G, R * n, D)
            s = (qg @ k.transpose(0, 2, 1)) * scale                # [G, R*n, T]
            s = s.reshape(G, R, n, T)
            s = np.where(mask[None, None], -np.inf, s)
            s = s - s.max(axis=-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=-1, keepdims=True)
            o = p.reshape(G, R * n, T) @ v                         # [G, R*n, D]
            o = o.reshape(G, R, n, D).transpose(2, 0, 1, 3).reshape(n, H * D)
            x = x + o @ L["wo"].T
            h = self.rmsnorm(x, L["ffn_norm"])
            g = h @ L["wg"].T
            u = h @ L["wu"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ L["wd"].T
        cache.n = T
        if want_logits == "last":
            x = x[-1:]
        x = self.rmsnorm(x, self.out_norm)
        return x @ self.output.T

    def logits(self, ids) -> np.ndarray:
        return self.forward(ids, None, "all")

    def greedy(self, prompt_ids, n_new: int, stop_ids=(), return_logits: bool = False):
        """Greedy continuation: prefill the prompt, then one token per step.
        Stops after a token in stop_ids (which is included). Returns the new ids
        (and the [len, vocab] logits that chose each, when return_logits)."""
        cache = self.new_cache()
        lg = self.forward(list(prompt_ids), cache, "last")[-1]
        out, lgs = [], []
        for _ in range(n_new):
            t = int(np.argmax(lg))
            out.append(t)
            lgs.append(lg)
            if t in stop_ids or len(out) == n_new:
                break
            lg = self.forward([t], cache, "last")[-1]
        if return_logits:
            return out, np.array(lgs)
        return out


    # ------------------------------------------------------------ TSP (FastKV)
    def _layer_sel(self, l: int, x: np.ndarray, pos: np.ndarray, kv: dict, q_out=None,
                   allow=None) -> np.ndarray:
        """Layer l on rows x at explicit positions pos (ascending), appending
        their K/V to kv[l] = (kpos, k [G,T,D], v) and attending causally over
        every position kv[l] holds (allow: a function (l, kpos) -> [G, T]
        bool of the keys each KV head may attend, or None). q_out: list that
        receives the roped queries [n, H, D] (fp16-rounded, as the runtime
        keeps them)."""
        L = self.layers[l]
        n = len(pos)
        H, G, D = self.n_head, self.n_kv, self.head_dim
        R = H // G
        h = self.rmsnorm(x, L["attn_norm"])
        q, k, v = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
        if L["bq"] is not None:
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
        q = self.rope(q.reshape(n, H, D), pos)
        if q_out is not None:
            q_out.append(q.astype(np.float16).astype(self.dtype))
        k = self._kv_round(self.rope(k.reshape(n, G, D), pos)).transpose(1, 0, 2)
        v = self._kv_round(v.reshape(n, G, D)).transpose(1, 0, 2)
        if l in kv:
            kp0, k0, v0 = kv[l]
            kpos, k, v = np.concatenate([kp0, pos]), np.concatenate([k0, k], 1), np.concatenate([v0, v], 1)
        else:
            kpos = pos.copy()
        kv[l] = (kpos, k, v)
        mask = kpos[None, :] > pos[:, None]
        qg = q.reshape(n, G, R, D).transpose(1, 2, 0, 3).reshape(G, R * n, D)
        sc = ((qg @ k.transpose(0, 2, 1)) / np.sqrt(D)).reshape(G, R, n, len(kpos))
        sc = np.where(mask[None, None], -np.inf, sc)
        if allow is not None:
            sc = np.where(allow(l, kpos)[:, None, None, :], sc, -np.inf)
        pr = np.exp(sc - sc.max(axis=-1, keepdims=True))
        pr /= pr.sum(axis=-1, keepdims=True)
        o = (pr.reshape(G, R * n, len(kpos)) @ v).reshape(G, R, n, D).transpose(2, 0, 1, 3).reshape(n, H * D)
        x = x + o @ L["wo"].T
        h = self.rmsnorm(x, L["ffn_norm"])
        g = h @ L["wg"].T
        return x + ((g / (1.0 + np.exp(-g))) * (h @ L["wu"].T)) @ L["wd"].T

    def tsp_select(self, q_win: np.ndarray, win_pos: np.ndarray, kpos: np.ndarray, k: np.ndarray,
                   tsp_len: int, kernel: int, avg: bool, forced) -> np.ndarray:
        """FastKV's HiddenCompress (notes B1-B2) over keys k [G,T,D] at kpos
        (= 0..T-1): window attention (exact softmax over the keys each window
        query sees) summed over the window rows and all heads, pooled along
        the sequence (avg: zero padding counted), top tsp_len with the forced
        positions first; ascending positions."""
        H, G, D = self.n_head, self.n_kv, self.head_dim
        R = H // G
        T = len(kpos)
        tot = np.zeros(T)
        for gi in range(G):
            s = np.zeros(T)
            for r in range(len(win_pos)):
                for j in range(R):
                    lg = k[gi] @ q_win[r, gi * R + j] / np.sqrt(D)
                    lg = np.where(kpos <= win_pos[r], lg, -np.inf)
                    e = np.exp(lg - lg.max())
                    s += e / e.sum()
            pad = kernel // 2
            sp = np.concatenate([np.zeros(pad) if avg else np.full(pad, -np.inf), s,
                                 np.zeros(pad) if avg else np.full(pad, -np.inf)])
            win = np.lib.stride_tricks.sliding_window_view(sp, kernel)
            tot += win.sum(axis=1) / kernel if avg else win.max(axis=1)
        key = np.where(np.isin(kpos, list(forced)), np.inf, tot)
        order = sorted(range(T), key=lambda i: (-key[i], i))
        return np.sort(kpos[order[:min(tsp_len, T)]])

    def forward_tsp(self, ids, tsp_layer: int, tsp_len: int, window: int, kernel: int = 7,
                    avg: bool = True, L_init: int = 4, L_local: int = 256):
        """Token-selective propagation prefill: every token through layers
        0..tsp_layer, the selected ones (plus the sinks and the last
        max(L_local, window), which hetkv's near tier holds) onward at their
        original positions. Returns (last-token logits, kv, selected
        positions); decode_tsp continues it (every present key attended)."""
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        pos = np.arange(n)
        kv: dict = {"win": {}}
        x = self.tok_embd[ids].astype(self.dtype, copy=True)
        sel = pos
        for l in range(self.n_layers):
            qs: list = []
            x = self._layer_sel(l, x, sel, kv, qs)
            kv["win"][l] = qs[0][-window:]   # the layer's observation window
            if l == tsp_layer and n > tsp_len:
                tail = max(L_local, window)
                forced = set(range(min(L_init, n))) | set(range(max(n - tail, 0), n))
                kpos, k, _ = kv[l]
                sel = self.tsp_select(qs[0][n - window:], pos[n - window:], kpos, k, tsp_len,
                                      kernel, avg, forced)
                x = x[sel]
        lg = self.rmsnorm(x[-1:], self.out_norm) @ self.output.T
        return lg[0], kv, sel

    def fastkv_keep(self, kv: dict, end: int, budget: int, window: int, kernel: int, avg: bool,
                    L_init: int, L_local: int) -> dict:
        """fastkv's per-layer keep over a forward_tsp cache of a prompt of end
        tokens: per KV head, window attention (exact softmax over the keys the
        layer holds) summed over the window and the group, pooled along the
        held positions, top budget far positions (far: [L_init, ring_from),
        ring_from = max(end - L_local, L_init)). Returns l -> [G] sets."""
        H, G, D = self.n_head, self.n_kv, self.head_dim
        R = H // G
        ring_from = max(end - L_local, L_init)
        keep = {}
        for l in range(self.n_layers):
            kpos, k, _ = kv[l]
            qw = kv["win"][l]
            wpos = np.arange(end - len(qw), end)
            far = (kpos >= L_init) & (kpos < ring_from)
            sets = []
            for gi in range(G):
                s = np.zeros(len(kpos))
                for r in range(len(wpos)):
                    for j in range(R):
                        lg = np.where(kpos <= wpos[r], k[gi] @ qw[r, gi * R + j] / np.sqrt(D), -np.inf)
                        e = np.exp(lg - lg.max())
                        s += e / e.sum()
                pad = kernel // 2
                fill = np.zeros(pad) if avg else np.full(pad, -np.inf)
                win = np.lib.stride_tricks.sliding_window_view(np.concatenate([fill, s, fill]), kernel)
                s = win.sum(axis=1) / kernel if avg else win.max(axis=1)
                cand = [i for i in range(len(kpos)) if far[i]]
                cand.sort(key=lambda i: (-(np.inf if kpos[i] >= wpos[0] else s[i]), i))
                sets.append(set(int(kpos[i]) for i in cand[:budget]))
            keep[l] = sets
        keep["ring_from"], keep["L_init"] = ring_from, L_init
        return keep

    def decode_tsp(self, tok: int, kv: dict, p: int, keep: dict | None = None) -> np.ndarray:
        """One decode token at position p over a forward_tsp cache; with
        keep (fastkv_keep), each KV head attends the sinks, its kept far
        positions and everything from ring_from on."""
        allow = None
        if keep is not None:
            def allow(l, kpos):
                base = (kpos < keep["L_init"]) | (kpos >= keep["ring_from"])
                return np.array([base | np.isin(kpos, list(keep[l][g])) for g in range(self.n_kv)])
        x = self.tok_embd[np.array([tok])].astype(self.dtype, copy=True)
        for l in range(self.n_layers):
            x = self._layer_sel(l, x, np.array([p]), kv, allow=allow)
        return (self.rmsnorm(x, self.out_norm) @ self.output.T)[0]


_models: dict = {}


def load(model_path: str, kv_fp16: bool = True, dtype=np.float64, verbose: bool = False) -> RefModel:
    """Load (once per process, per path/options) a RefModel."""
    key = (model_path, kv_fp16, np.dtype(dtype).str)
    if key not in _models:
        _models[key] = RefModel(model_path, kv_fp16=kv_fp16, dtype=dtype, verbose=verbose)
    return _models[key]


def logits(model_path: str, token_ids, kv_fp16: bool = True) -> np.ndarray:
    """Logits [n, vocab] (float64) for every position of token_ids."""
    return load(model_path, kv_fp16).logits(token_ids)


def greedy(model_path: str, prompt_ids, n_new: int, stop_ids=(), kv_fp16: bool = True) -> list[int]:
    """n_new greedy tokens after prompt_ids (stops early after a stop id)."""
    return load(model_path, kv_fp16).greedy(prompt_ids, n_new, stop_ids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="numpy reference forward pass for llama/qwen2 GGUF files")
    ap.add_argument("model")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="comma-separated token ids")
    src.add_argument("--text", help="prompt text, tokenised by tests/ref/bpe_min.py (approximate "
                     "GPT-2 BPE for ASCII English; not the tokenizer under test)")
    ap.add_argument("--out", help="write logits [n, vocab] to this .npy (float64)")
    ap.add_argument("--out-f32", help="write logits as raw little-endian float32 [n][vocab]")
    ap.add_argument("--greedy", type=int, default=0, metavar="N", help="print N greedy new ids")
    ap.add_argument("--no-kv-fp16", action="store_true", help="keep K/V in the compute dtype")
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    a = ap.parse_args(argv)
    bpe = None
    if a.text is not None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bpe_min import BPE
        bpe = BPE(a.model)
        ids = bpe.encode(a.text)
        print(f"ref: prompt ids {','.join(map(str, ids))}", file=sys.stderr)
    else:
        ids = [int(x) for x in a.tokens.replace(" ", "").split(",") if x != ""]
    m = load(a.model, not a.no_kv_fp16, np.dtype(a.dtype), verbose=True)
    t0 = time.time()
    if a.out or a.out_f32 or not a.greedy:
        lg = m.logits(ids)
        dt = time.time() - t0
        if a.out:
            np.save(a.out, lg)
        if a.out_f32:
            lg.astype("<f4").tofile(a.out_f32)
        am = lg.argmax(axis=1)
        print(f"ref: {len(ids)} tokens in {dt:.2f}s; logits range [{lg.min():.3f}, {lg.max():.3f}], "
              f"argmax {','.join(map(str, am))}", file=sys.stderr)
    if a.greedy:
        t0 = time.time()
        out = m.greedy(ids, a.greedy)
        print(",".join(map(str, out)))
        if bpe is not None:
            print(repr(bpe.decode(ids)) + " -> " + repr(bpe.decode(out)), file=sys.stderr)
        print(f"ref: {len(out)} greedy tokens in {time.time() - t0:.2f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write tiny Llama-family GGUF models with random weights, for end-to-end tests.

The files are complete enough for a llama.cpp-compatible loader and for the
whole hetkv CLI: all the hyper-parameter keys, a minimal byte-level BPE
tokenizer (tokenizer.ggml.model "gpt2") with ChatML control tokens and a ChatML
chat template, and the usual tensor names.

    # one model, shape on the command line
    python3 tools/scripts/gen_tiny_gguf.py --arch llama --layers 2 --dim 192 --heads 3 \
        --kv-heads 1 --head-dim 64 --ffn 480 --vocab 1000 --wtype q4_1 -o m.gguf
    # a named preset (see --list-presets)
    python3 tools/scripts/gen_tiny_gguf.py --preset llama_gqa3_q41 -o m.gguf
    # every preset into a folder, as <dir>/<preset>.gguf
    python3 tools/scripts/gen_tiny_gguf.py --all-presets -o DIR

RoPE layout follows the architecture, as in llama.cpp: arch llama rotates
interleaved pairs (x[2i], x[2i+1]) (ggml "normal" rope; the HF->GGUF converter
permutes Q/K rows for this), arch qwen2 rotates NeoX halves (x[i], x[i+d/2]) and
has q/k/v biases. The generator only writes weights; the layout is a property
of the architecture that the reader (tests/ref/ref_forward.py, the C engine)
must apply.

Weight types: f32, f16, q8_0, q4_0, q4_1 are quantised from random float
weights with gguf.quants.quantize; gguf-py cannot quantise K-quants, so q4_k and
q6_k tensors are written as random but valid raw blocks (small positive fp16
super-block scales, 6-bit sub-block scales/mins chosen so each sub-block is
roughly zero-mean). A type whose block does not divide a row (K-quants need
rows that are a multiple of 256) falls back to q8_0, then f16, and the
fallback is reported. Norm weights and biases are always f32. --dequant-f32
writes the same model (same random draws) with every matrix stored as f32
holding the dequantised values: the same function without quantised kernels.

Scales: weights are drawn so that attention scores and logits have a spread of
a few units (std(logit) ~ 3, std(q.k/sqrt(d)) ~ 2): the logits vary, argmax is
well separated, activations stay O(1) through the layers.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize as gguf_dequantize
    from gguf.quants import quantize as gguf_quantize
except ImportError as e:  # pragma: no cover
    sys.stderr.write("gen_tiny_gguf.py needs the PyPI package 'gguf' (pip install gguf): %s\n" % e)
    raise

QK_K = 256

WTYPES = {
    "f32": QT.F32,
    "f16": QT.F16,
    "q8_0": QT.Q8_0,
    "q4_0": QT.Q4_0,
    "q4_1": QT.Q4_1,
    "q4_k": QT.Q4_K,
    "q6_k": QT.Q6_K,
}
# "mix": each 2-D tensor gets one of these, rotating over tensor and layer index.
MIX_CYCLE = ["q4_1", "q8_0", "f16", "q4_k", "q4_0", "q6_k", "f32"]

FTYPE = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "q6_k": gguf.LlamaFileType.MOSTLY_Q6_K,
    "mix": gguf.LlamaFileType.MOSTLY_Q4_K_M,
}


@dataclass
class Config:
    arch: str = "llama"
    layers: int = 2
    dim: int = 192
    heads: int = 3
    kv_heads: int = 1
    head_dim: int = 64
    ffn: int = 480
    vocab: int = 1000
    ctx: int = 512
    rope_base: float = 1e5
    rope_scale: float = 0.0        # > 0: rope.scaling.type linear with this factor
    eps: float = 1e-5
    wtype: str = "q4_1"
    embd_wtype: str | None = None  # token_embd.weight (default: wtype)
    out_wtype: str | None = None   # output.weight when untied (default: wtype)
    tied: bool = True
    seed: int = 1234
    tok_pre: str = "gpt-2"         # tokenizer.ggml.pre
    dequant_f32: bool = False      # store every matrix as f32 holding its dequantised values
    raw_blocks: bool = False       # q4_0/q4_1 as random valid blocks, not quantised fp32 (fast)
    note: str = ""


# Each preset names what it covers. GQA ratio = heads / kv_heads.
PRESETS: dict[str, Config] = {
    # SmolLM2-like: GQA 3 with 2 KV heads, head_dim 64, Q4_1 matrices, Q8_0 tied embeddings.
    "llama_gqa3_q41": Config(
        arch="llama", layers=2, dim=384, heads=6, kv_heads=2, head_dim=64, ffn=960,
        vocab=1000, rope_base=1e5, wtype="q4_1", embd_wtype="q8_0", tied=True, seed=11,
        note="SmolLM2-like: GQA 3 (6/2), hd 64, q4_1 + q8_0 tied embd, ffn 96*10"),
    # Plain MHA in f32: the math without any quantisation.
    "llama_mha_f32": Config(
        arch="llama", layers=2, dim=128, heads=2, kv_heads=2, head_dim=64, ffn=288,
        vocab=1000, rope_base=1e4, wtype="f32", tied=False, seed=12,
        note="MHA (GQA 1), hd 64, f32, untied, ffn 96*3"),
    # GQA 4, head_dim 128, odd model dim 160 (q width 1024 != dim), f16, untied.
    "llama_gqa4_hd128_f16": Config(
        arch="llama", layers=2, dim=160, heads=8, kv_heads=2, head_dim=128, ffn=384,
        vocab=1000, rope_base=5e5, wtype="f16", tied=False, seed=13,
        note="GQA 4 (8/2), hd 128, dim 160 (key_length != dim/heads), f16, untied"),
    # K-quants: Q4_K matrices, Q6_K output (as in a Q4_K_M file), Q8_0 embeddings.
    "llama_kquant": Config(
        arch="llama", layers=2, dim=256, heads=4, kv_heads=4, head_dim=64, ffn=768,
        vocab=1000, rope_base=1e4, wtype="q4_k", embd_wtype="q8_0", out_wtype="q6_k",
        tied=False, seed=14,
        note="MHA, hd 64, q4_k matrices, q6_k output, q8_0 embd, untied"),
    # Linear RoPE scaling (rope.scaling.type linear, factor 4), Q4_0, dim 96, odd vocab.
    "llama_ropelin_q40": Config(
        arch="llama", layers=2, dim=96, heads=3, kv_heads=3, head_dim=64, ffn=576,
        vocab=515, rope_base=1e4, rope_scale=4.0, wtype="q4_0", tied=True, seed=15,
        note="MHA, hd 64, dim 96 (key_length), q4_0 tied, linear rope scaling x4, vocab 515"),
    # Qwen2: NeoX RoPE + q/k/v biases, GQA 3, head_dim 128, Q8_0, tied.
    # (llama.cpp's qwen2 loader wants heads*head_dim == dim, so qwen2 presets keep that.)
    "qwen2_gqa3_hd128_q80": Config(
        arch="qwen2", layers=2, dim=384, heads=3, kv_heads=1, head_dim=128, ffn=672,
        vocab=1000, rope_base=1e6, eps=1e-6, wtype="q8_0", tied=True, seed=16,
        note="qwen2 (NeoX rope, qkv bias), GQA 3, hd 128, q8_0 tied, ffn 96*7"),
    # Qwen2 with a per-tensor mix of every type, GQA 4 with 2 KV heads, 3 layers.
    "qwen2_gqa4_mix": Config(
        arch="qwen2", layers=3, dim=512, heads=8, kv_heads=2, head_dim=64, ffn=768,
        vocab=1000, rope_base=1e6, eps=1e-6, wtype="mix", tied=False, seed=17,
        note="qwen2, GQA 4 (8/2), hd 64, mix of q4_1/q8_0/f16/q4_k/q4_0/q6_k/f32, untied"),
}


# Real sizes, by --preset only: not in PRESETS, which the test suites write in full.
BIG_PRESETS: dict[str, Config] = {
    # Llama-3.1-8B's shape (128256-token vocabulary, 128K trained context) in Q4_0 written as
    # random blocks: a 4.6 GB file in seconds, the same file for hetkv and llama.cpp (issue 37).
    # Speed does not depend on the values.
    "llama31_8b_q40": Config(
        arch="llama", layers=32, dim=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
        vocab=128256, ctx=131072, rope_base=5e5, wtype="q4_0", tied=False, seed=18,
        raw_blocks=True, note="Llama-3.1-8B's shape, q4_0 random blocks, untied"),
}

# ---------------------------------------------------------------- tokenizer

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]   # ids 0, 1, 2 as in SmolLM2
BOS_ID, EOS_ID = 1, 2
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"), ("Ġ", "a"),
    ("r", "e"), ("Ġt", "he"), ("Ġ", "s"), ("e", "n"), ("o", "r"), ("Ġ", "w"), ("a", "t"),
    ("i", "s"), ("Ġ", "o"), ("Ġ", "c"), ("e", "s"), ("Ġ", "b"), ("i", "t"), ("l", "l"),
    ("Ġ", "f"), ("Ġ", "p"), ("in", "g"), ("Ġ", "m"), ("o", "u"), ("Ġa", "n"), ("Ġan", "d"),
    ("Ġ", "i"), ("Ġo", "f"), ("H", "e"), ("He", "ll"), ("Hell", "o"), ("Ġw", "or"),
    ("Ġwor", "l"), ("Ġworl", "d"), ("Ġ", "H"), ("ĠH", "e"), ("ĠHe", "ll"), ("ĠHell", "o"), ("Ġi", "s"), ("Ċ", "Ċ"),
]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_vocab(n_vocab: int) -> tuple[list[str], list[int], list[str]]:
    tokens = list(SPECIALS)
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIALS)
    b2u = bytes_to_unicode()
    for b in range(256):
        tokens.append(b2u[b])
        types.append(int(gguf.TokenType.NORMAL))
    have = set(tokens)
    merges = []
    for a, b in MERGES:
        assert a in have and b in have, (a, b)
        m = a + b
        assert m not in have, m
        merges.append(f"{a} {b}")
        tokens.append(m)
        types.append(int(gguf.TokenType.NORMAL))
        have.add(m)
    if n_vocab < len(tokens):
        raise SystemExit(f"--vocab must be at least {len(tokens)} (specials + 256 bytes + merges)")
    # padding as the HF converter writes it
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(int(gguf.TokenType.UNUSED))
    return tokens, types, merges


# ---------------------------------------------------------------- weights

def block_of(t: str) -> int:
    return {"f32": 1, "f16": 1, "q8_0": 32, "q4_0": 32, "q4_1": 32, "q4_k": QK_K, "q6_k": QK_K}[t]


def resolve_type(want: str, ne0: int) -> str:
    for t in (want, "q8_0", "f16"):
        if ne0 % block_of(t) == 0:
            return t
    return "f16"


def _f16_bytes(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).reshape(-1, 1).view(np.uint8)


def random_q4_k(rng: np.random.Generator, rows: int, ne0: int, std: float) -> np.ndarray:
    """Random valid Q4_K blocks: x = d*sc*q - dmin*m, q in 0..15, each sub-block ~ zero mean."""
    nb = rows * ne0 // QK_K
    d = (std / 237.0) * rng.uniform(0.6, 1.4, nb)
    dmin = d * 8.0
    sc = rng.integers(40, 64, size=(nb, 8))
    m = np.clip(np.rint(sc * 7.5 / 8.0), 0, 63).astype(np.int64)
    packed = np.zeros((nb, 12), dtype=np.uint8)
    for j in range(4):
        packed[:, j] = (sc[:, j] & 0x3F) | ((sc[:, j + 4] >> 4) << 6)
        packed[:, j + 4] = (m[:, j] & 0x3F) | ((m[:, j + 4] >> 4) << 6)
        packed[:, j + 8] = (sc[:, j + 4] & 0x0F) | ((m[:, j + 4] & 0x0F) << 4)
    qs = rng.integers(0, 256, size=(nb, QK_K // 2), dtype=np.uint8)
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, qs], axis=1)
    assert blocks.shape[1] == 144
    return blocks.reshape(rows, -1)


def random_q4_0(rng: np.random.Generator, rows: int, ne0: int, std: float) -> np.ndarray:
    """Random valid Q4_0 blocks: x = d*(q-8), q in 0..15 uniform (std 4.6 d)."""
    nb = rows * ne0 // 32
    d = (std / 4.61) * rng.uniform(0.6, 1.4, nb)
    qs = np.frombuffer(rng.bytes(nb * 16), dtype=np.uint8).reshape(nb, 16)
    return np.concatenate([_f16_bytes(d), qs], axis=1).reshape(rows, -1)


def random_q4_1(rng: np.random.Generator, rows: int, ne0: int, std: float) -> np.ndarray:
    """Random valid Q4_1 blocks: x = d*q + m, q in 0..15 uniform, m = -7.5 d (zero mean)."""
    nb = rows * ne0 // 32
    d = (std / 4.61) * rng.uniform(0.6, 1.4, nb)
    qs = np.frombuffer(rng.bytes(nb * 16), dtype=np.uint8).reshape(nb, 16)
    return np.concatenate([_f16_bytes(d), _f16_bytes(-7.5 * d), qs], axis=1).reshape(rows, -1)


def random_q6_k(rng: np.random.Generator, rows: int, ne0: int, std: float) -> np.ndarray:
    """Random valid Q6_K blocks: x = d*sc*(q-32), q in 0..63, sc int8."""
    nb = rows * ne0 // QK_K
    sc = rng.integers(16, 64, size=(nb, 16)) * rng.choice([-1, 1], size=(nb, 16))
    rms_sc = np.sqrt(np.mean(sc.astype(np.float64) ** 2, axis=1))
    d = std / (18.47 * rms_sc) * rng.uniform(0.6, 1.4, nb)
    ql = rng.integers(0, 256, size=(nb, QK_K // 2), dtype=np.uint8)
    qh = rng.integers(0, 256, size=(nb, QK_K // 4), dtype=np.uint8)
    blocks = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _f16_bytes(d)], axis=1)
    assert blocks.shape[1] == 210
    return blocks.reshape(rows, -1)


class TensorMaker:
    def __init__(self, cfg: Config, writer: gguf.GGUFWriter, verbose: bool):
        self.cfg = cfg
        self.w = writer
        self.rng = np.random.default_rng(cfg.seed)
        self.verbose = verbose
        self.counter = 0
        self.layer = 0
        self.summary: dict[str, int] = {}

    def vec(self, name: str, mean: float, std: float, n: int) -> None:
        v = (mean + std * self.rng.standard_normal(n)).astype(np.float32)
        self.w.add_tensor(name, v)

    def mat(self, name: str, rows: int, ne0: int, std: float, want: str) -> None:
        """A [rows][ne0] matrix (ggml shape [ne0, rows]), y = W x with x of length ne0."""
        if want == "mix":   # rotate by tensor and by layer so every slot sees several types
            want = MIX_CYCLE[(self.counter + self.layer) % len(MIX_CYCLE)]
        self.counter += 1
        t = resolve_type(want, ne0)
        if t != want and self.verbose:
            print(f"  {name}: {want} does not fit rows of {ne0}, using {t}", file=sys.stderr)
        self.summary[t] = self.summary.get(t, 0) + 1
        if t == "q4_k":
            data, qt = random_q4_k(self.rng, rows, ne0, std), QT.Q4_K
        elif self.cfg.raw_blocks and t == "q4_0":
            data, qt = random_q4_0(self.rng, rows, ne0, std), QT.Q4_0
        elif self.cfg.raw_blocks and t == "q4_1":
            data, qt = random_q4_1(self.rng, rows, ne0, std), QT.Q4_1
        elif t == "q6_k":
            data, qt = random_q6_k(self.rng, rows, ne0, std), QT.Q6_K
        else:
            a = (std * self.rng.standard_normal((rows, ne0))).astype(np.float32)
            qt = WTYPES[t]
            data = gguf_quantize(a, qt)
        if self.cfg.dequant_f32 and qt != QT.F32:
            # same values, stored as f32 (gguf-py's dequantisation)
            self.w.add_tensor(name, np.asarray(gguf_dequantize(data, qt), dtype=np.float32).reshape(rows, ne0))
        elif qt in (QT.F32, QT.F16):
            self.w.add_tensor(name, data)
        else:
            self.w.add_tensor(name, data, raw_dtype=qt)


def write_model(cfg: Config, path: str, verbose: bool = True) -> None:
    c = cfg
    if c.arch not in ("llama", "qwen2"):
        raise SystemExit("--arch must be llama or qwen2")
    if c.heads % c.kv_heads != 0:
        raise SystemExit("--heads must be a multiple of --kv-heads")
    if c.head_dim % 2 != 0:
        raise SystemExit("--head-dim must be even")
    for t in (c.wtype, c.embd_wtype, c.out_wtype):
        if t is not None and t not in WTYPES and t != "mix":
            raise SystemExit(f"unknown weight type {t}")
    tokens, types, merges = build_vocab(c.vocab)

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path, c.arch)
    w.add_type("model")
    w.add_name(f"hetkv tiny {c.arch} L{c.layers} d{c.dim} h{c.heads}/{c.kv_heads}x{c.head_dim} {c.wtype}")
    w.add_context_length(c.ctx)
    w.add_embedding_length(c.dim)
    w.add_block_count(c.layers)
    w.add_feed_forward_length(c.ffn)
    w.add_head_count(c.heads)
    w.add_head_count_kv(c.kv_heads)
    if c.head_dim * c.heads != c.dim:
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(c.rope_base)
    if c.rope_scale > 0:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(c.rope_scale)
    w.add_layer_norm_rms_eps(c.eps)
    w.add_vocab_size(c.vocab)
    w.add_file_type(int(FTYPE[c.wtype]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    w.add_tokenizer_model("gpt2")
    # llama.cpp names the GPT-2 pre-tokenizer "gpt-2" (it rejects "gpt2"); hetkv takes both
    w.add_tokenizer_pre(c.tok_pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(0)
    w.add_pad_token_id(EOS_ID)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHATML_TEMPLATE)

    tm = TensorMaker(c, w, verbose)
    qd = c.heads * c.head_dim
    kvd = c.kv_heads * c.head_dim
    emb_std = 3.0 / np.sqrt(c.dim)       # std(logit) ~ 3 after the final norm
    tm.mat("token_embd.weight", c.vocab, c.dim, emb_std, c.embd_wtype or c.wtype)
    for l in range(c.layers):
        p = f"blk.{l}."
        tm.layer = l
        tm.vec(p + "attn_norm.weight", 1.0, 0.1, c.dim)
        qk_std = np.sqrt(2.0 / c.dim)    # std(q.k/sqrt(hd)) ~ 2
        tm.mat(p + "attn_q.weight", qd, c.dim, qk_std, c.wtype)
        tm.mat(p + "attn_k.weight", kvd, c.dim, qk_std, c.wtype)
        tm.mat(p + "attn_v.weight", kvd, c.dim, 1.0 / np.sqrt(c.dim), c.wtype)
        if c.arch == "qwen2":
            tm.vec(p + "attn_q.bias", 0.0, 0.3, qd)
            tm.vec(p + "attn_k.bias", 0.0, 0.3, kvd)
            tm.vec(p + "attn_v.bias", 0.0, 0.1, kvd)
        tm.mat(p + "attn_output.weight", c.dim, qd, 0.5 / np.sqrt(qd), c.wtype)
        tm.vec(p + "ffn_norm.weight", 1.0, 0.1, c.dim)
        tm.mat(p + "ffn_gate.weight", c.ffn, c.dim, 1.0 / np.sqrt(c.dim), c.wtype)
        tm.mat(p + "ffn_up.weight", c.ffn, c.dim, 1.0 / np.sqrt(c.dim), c.wtype)
        tm.mat(p + "ffn_down.weight", c.dim, c.ffn, 0.5 / np.sqrt(c.ffn), c.wtype)
    tm.vec("output_norm.weight", 1.0, 0.1, c.dim)
    if not c.tied:
        tm.mat("output.weight", c.vocab, c.dim, emb_std, c.out_wtype or c.wtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if verbose:
        types_s = ", ".join(f"{k}x{v}" for k, v in sorted(tm.summary.items()))
        print(f"wrote {path}: {c.arch} L{c.layers} dim {c.dim} heads {c.heads}/{c.kv_heads} "
              f"hd {c.head_dim} ffn {c.ffn} vocab {c.vocab} {'tied' if c.tied else 'untied'} "
              f"[{types_s}]", file=sys.stderr)


def write_all_presets(out_dir: str, verbose: bool = False) -> dict[str, str]:
    """Write every preset as out_dir/<name>.gguf; returns name -> path."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name, cfg in PRESETS.items():
        p = os.path.join(out_dir, name + ".gguf")
        write_model(cfg, p, verbose)
        paths[name] = p
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Config()
    ap.add_argument("--preset", help="start from a named preset (flags given override it)")
    ap.add_argument("--all-presets", action="store_true", help="write every preset into the folder -o")
    ap.add_argument("--list-presets", action="store_true")
    ap.add_argument("--arch", choices=["llama", "qwen2"])
    ap.add_argument("--layers", type=int)
    ap.add_argument("--dim", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--head-dim", type=int, help="default dim/heads")
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--ctx", type=int)
    ap.add_argument("--rope-base", type=float)
    ap.add_argument("--rope-scale", type=float, help="linear RoPE scaling factor (0: none)")
    ap.add_argument("--eps", type=float, help="RMSNorm epsilon")
    ap.add_argument("--wtype", choices=sorted(WTYPES) + ["mix"])
    ap.add_argument("--embd-wtype", choices=sorted(WTYPES), help="token_embd.weight type")
    ap.add_argument("--out-wtype", choices=sorted(WTYPES), help="output.weight type (untied)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tied", dest="tied", action="store_true", default=None,
                   help="no output.weight: logits use token_embd.weight")
    g.add_argument("--no-tied", dest="tied", action="store_false")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--dequant-f32", action="store_true", default=None,
                    help="same model (same random draws), every matrix stored as f32 with the "
                         "dequantised values of its --wtype: isolates the quantised kernels")
    ap.add_argument("--raw-blocks", action="store_true", default=None,
                    help="q4_0/q4_1 matrices as random valid blocks instead of quantised fp32 "
                         "draws: seconds for a file of billions of weights")
    ap.add_argument("--tok-pre", help='tokenizer.ggml.pre (default "gpt-2", the name llama.cpp uses)')
    ap.add_argument("-o", "--output", help="output .gguf (or folder with --all-presets)")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)

    if a.list_presets:
        for name, c in {**PRESETS, **BIG_PRESETS}.items():
            print(f"{name:24s} {c.note}")
        return 0
    if not a.output:
        ap.error("-o is required")
    if a.all_presets:
        write_all_presets(a.output, verbose=not a.quiet)
        return 0
    if a.preset:
        allp = {**PRESETS, **BIG_PRESETS}
        if a.preset not in allp:
            ap.error(f"unknown preset {a.preset}; one of {', '.join(allp)}")
        cfg = replace(allp[a.preset])
    else:
        cfg = replace(d)
    for k in ("arch", "layers", "dim", "heads", "kv_heads", "head_dim", "ffn", "vocab", "ctx",
              "rope_base", "rope_scale", "eps", "wtype", "embd_wtype", "out_wtype", "tied", "seed",
              "tok_pre", "dequant_f32", "raw_blocks"):
        v = getattr(a, k)
        if v is not None:
            setattr(cfg, k, v)
    if a.head_dim is None and not a.preset and a.dim is not None and a.heads is not None:
        cfg.head_dim = cfg.dim // cfg.heads
    if a.arch == "qwen2" and a.eps is None and not a.preset:
        cfg.eps = 1e-6
    write_model(cfg, a.output, verbose=not a.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())

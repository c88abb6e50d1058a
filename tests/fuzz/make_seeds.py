#!/usr/bin/env python3
"""Write the fuzzers' committed inputs: the two tokenizer models of
tests/fuzz/data/ and the seed corpora of tests/fuzz/corpus/<target>/.

    python3 tests/fuzz/make_seeds.py      # needs numpy, gguf, tokenizers, sentencepiece

Deterministic (fixed seeds, text from the repository's docs as of
DOCS_COMMIT), so running it again rewrites the same files. The corpora only start the fuzzers: what
libFuzzer finds during a run stays in its temporary copy (tools/scripts/fuzz.sh).
The input formats are those of tests/fuzz/fuzz_common.h.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "tools", "scripts"))
sys.path.insert(0, os.path.join(SRC, "tests", "tokenizer"))

import numpy as np  # noqa: E402
import gguf  # noqa: E402
import gen_tiny_gguf as gen  # noqa: E402
import tokref  # noqa: E402

DATA = os.path.join(HERE, "data")
CORPUS = os.path.join(HERE, "corpus")

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + "
    "messages[0]['content'] | trim + '\\n<</SYS>>\\n\\n' %}{% endif %}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content | trim + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}"
    "{% endif %}{% endfor %}")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]   # control, ids 0..2 as in SmolLM2
USER_TOKEN = "<tag>"                                         # a user-defined token (type 4)


def put(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


# The docs as of this commit: the text the tokenizers are trained on and the
# seeds are cut from, fixed so that the files do not drift as the docs change.
DOCS_COMMIT = "d21734b"


def docs_text() -> str:
    text = ""
    for p in ("README.md", "docs/ARCHITECTURE.md", "docs/BATCH.md", "docs/SERVE.md"):
        r = subprocess.run(["git", "-C", SRC, "show", "%s:%s" % (DOCS_COMMIT, p)],
                           capture_output=True)
        if r.returncode == 0:
            text += r.stdout.decode("utf-8") + "\n"
            continue
        sys.stderr.write("make_seeds.py: no commit %s here (shallow clone?): using the current %s, "
                         "the files will differ from the committed ones\n" % (DOCS_COMMIT, p))
        with open(os.path.join(SRC, p), encoding="utf-8") as f:
            text += f.read() + "\n"
    return text


# ------------------------------------------------------------ tokenizers

def bpe_tokenizer(path: str) -> None:
    """Byte-level BPE trained with HF tokenizers on the docs (plus some
    non-Latin text so multi-byte merges exist): ~1200 tokens, SmolLM2's
    control tokens, one user-defined token, SmolLM2's chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    extra = "\n".join(t for t in tokref.CRAFTED if "\0" not in t) * 3
    tok.train_from_iterator(docs_text().splitlines() + extra.splitlines(), trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    types = [3 if t in SPECIALS else 1 for t in tokens]
    tokens.append(USER_TOKEN)
    types.append(4)
    tokref.write_gguf(path, "gpt2", tokens, types, merges=merges, pre="smollm", bos=1, eos=2,
                      unk=0, add_bos=False, template=SMOLLM2_TEMPLATE)


def spm_tokenizer(path: str) -> None:
    """SentencePiece BPE (byte fallback, identity normalisation: Llama 2's
    settings) on the docs, 600 pieces, user symbol <tag>, Llama 2 template."""
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(docs_text()[:20000].splitlines()), model_writer=model,
        model_type="bpe", vocab_size=600, byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, character_coverage=1.0,
        user_defined_symbols=[USER_TOKEN], minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 4 if tokens[-1] == USER_TOKEN else 1)
    tokref.write_gguf(path, "llama", tokens, types, scores=scores, bos=sp.bos_id(),
                      eos=sp.eos_id(), unk=sp.unk_id(), add_bos=True, add_space_prefix=True,
                      template=LLAMA2_TEMPLATE)


# ------------------------------------------------------------ GGUF seeds

def tiny_models(out: str) -> None:
    """Whole models small enough to load in microseconds (dim 32..64, one
    or two layers): every architecture path of model_config.c and model.c."""
    cfgs = {
        "llama_q40_tied": gen.Config(arch="llama", layers=1, dim=32, heads=1, kv_heads=1,
                                     head_dim=32, ffn=32, vocab=301, wtype="q4_0", seed=1),
        "llama_q41_gqa": gen.Config(arch="llama", layers=2, dim=32, heads=2, kv_heads=1,
                                    head_dim=16, ffn=32, vocab=301, wtype="q4_1",
                                    embd_wtype="q8_0", seed=2),
        "qwen2_q80_bias": gen.Config(arch="qwen2", layers=1, dim=32, heads=2, kv_heads=1,
                                     head_dim=16, ffn=32, vocab=301, wtype="q8_0", eps=1e-6,
                                     rope_base=1e6, seed=3),
        "llama_f16_untied_ropelin": gen.Config(arch="llama", layers=1, dim=32, heads=1,
                                               kv_heads=1, head_dim=32, ffn=32, vocab=301,
                                               wtype="f16", embd_wtype="q4_0", out_wtype="q4_0",
                                               tied=False, rope_scale=4.0, seed=4),
        "llama_keylen_mix": gen.Config(arch="llama", layers=1, dim=32, heads=2, kv_heads=1,
                                       head_dim=32, ffn=32, vocab=301, wtype="mix",
                                       embd_wtype="q4_0", seed=5, tok_pre="llama3"),
    }
    for name, cfg in cfgs.items():
        gen.write_model(cfg, os.path.join(out, name + ".gguf"), verbose=False)
    # the first one cut where its tensor data starts: header and metadata only
    with open(os.path.join(out, "llama_q40_tied.gguf"), "rb") as f:
        whole = f.read()
    r = gguf.GGUFReader(os.path.join(out, "llama_q40_tied.gguf"))
    cut = min(t.data_offset for t in r.tensors)
    put(os.path.join(out, "llama_q40_tied_header_only.gguf"), whole[:cut])


def special_tensors(path: str) -> None:
    """A model with rope_freqs.weight and matrices of types that go through
    dequantisation (q5_0, q5_1, bf16), written by hand; plus K-quant, i8 and
    f64 tensors outside the model, for the repack of every tensor."""
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(path, "llama")
    dim, ffn, vocab = 32, 32, 16
    w.add_block_count(1)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_rope_freq_base(5e5)
    w.add_context_length(128)

    def mat(name, rows, cols, qt):
        a = (0.1 * rng.standard_normal((rows, cols))).astype(np.float32)
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)

    QT = gguf.GGMLQuantizationType
    mat("token_embd.weight", vocab, dim, QT.Q5_0)
    mat("output.weight", vocab, dim, QT.Q5_1)
    w.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    w.add_tensor("rope_freqs.weight", np.linspace(1, 8, 8).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(dim, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(dim, np.float32))
    mat("blk.0.attn_q.weight", 32, dim, QT.BF16)
    mat("blk.0.attn_k.weight", 32, dim, QT.Q8_0)
    mat("blk.0.attn_v.weight", 32, dim, QT.Q4_1)
    mat("blk.0.attn_output.weight", dim, 32, QT.F32)
    mat("blk.0.ffn_gate.weight", ffn, dim, QT.F16)
    mat("blk.0.ffn_up.weight", ffn, dim, QT.F16)
    mat("blk.0.ffn_down.weight", dim, ffn, QT.Q5_0)
    # K-quant rows (256 wide), not part of the model: the repack of every tensor
    w.add_tensor("extra.q4_k", gen.random_q4_k(rng, 1, 256, 0.1), raw_dtype=QT.Q4_K)
    w.add_tensor("extra.q6_k", gen.random_q6_k(rng, 1, 256, 0.1), raw_dtype=QT.Q6_K)
    w.add_tensor("extra.i8", np.arange(-16, 16, dtype=np.int8))
    w.add_tensor("extra.f64", np.linspace(-1, 1, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def metadata_zoo(path: str) -> None:
    """No tensors; one key of every value type and arrays of each."""
    w = gguf.GGUFWriter(path, "llama")
    V = gguf.GGUFValueType
    w.add_uint8("zoo.u8", 200)
    w.add_int8("zoo.i8", -100)
    w.add_uint16("zoo.u16", 60000)
    w.add_int16("zoo.i16", -30000)
    w.add_uint32("zoo.u32", 4000000000)
    w.add_int32("zoo.i32", -2000000000)
    w.add_float32("zoo.f32", 1.5)
    w.add_bool("zoo.bool", True)
    w.add_string("zoo.str", "héllo")
    w.add_uint64("zoo.u64", 2**63 + 5)
    w.add_int64("zoo.i64", -(2**62))
    w.add_float64("zoo.f64", 1e300)
    w.add_array("zoo.arr_u8", [1, 2, 3])
    w.add_array("zoo.arr_str", ["a", "", "ccc"])
    w.add_array("zoo.arr_f32", [0.5, -1.0])
    w.add_array("zoo.arr_empty", [])
    w.add_key_value("llama.block_count", 2**31, V.UINT64)
    w.add_key_value("llama.embedding_length", -1, V.INT32)
    w.add_key_value("llama.attention.layer_norm_rms_epsilon", 1e-5, V.FLOAT64)
    w.add_key_value("general.alignment", 64, V.UINT32)
    w.add_key_value("tokenizer.ggml.model", "gpt2", V.STRING)
    w.add_key_value("tokenizer.ggml.tokens", ["a", "b", "ab", "<|im_start|>"], V.ARRAY,
                    sub_type=V.STRING)
    w.add_key_value("tokenizer.ggml.merges", ["a b", "ab ab", "x y"], V.ARRAY, sub_type=V.STRING)
    w.add_key_value("tokenizer.ggml.token_type", [1, 1, 1, 3], V.ARRAY, sub_type=V.INT32)
    w.add_key_value("tokenizer.ggml.bos_token_id", 3, V.UINT32)
    w.add_key_value("tokenizer.chat_template", "<|im_start|>system\nHi<|im_end|>", V.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def gguf_corpus() -> None:
    out = os.path.join(CORPUS, "gguf")
    tiny_models(out)
    special_tensors(os.path.join(out, "llama_special_tensors.gguf"))
    metadata_zoo(os.path.join(out, "metadata_zoo.gguf"))
    for name in ("tok_bpe.gguf", "tok_spm.gguf"):
        shutil.copy(os.path.join(DATA, name), os.path.join(out, name))
    put(os.path.join(out, "empty.gguf"), b"")
    put(os.path.join(out, "v3_empty_header.gguf"), b"GGUF" + struct.pack("<IQQ", 3, 0, 0))


# ------------------------------------------------------------ text targets

def prompt_texts() -> list[str]:
    docs = docs_text()
    paras = [p for p in docs.split("\n\n") if 40 < len(p) < 600]
    return ([t for t in tokref.CRAFTED if len(t) < 700] + paras[::9][:24] +
            tokref.random_texts(16, seed=13))


def tokenizer_corpus() -> None:
    """Mode byte (fuzz_common.h: tokenizer, flags) then the text; a few in
    ids mode."""
    out = os.path.join(CORPUS, "tokenizer")
    texts = prompt_texts()
    for i, t in enumerate(texts):
        mode = (i % 5) | ((i // 5) % 2) << 3 | ((i // 10) % 2) << 4   # tokenizer, bos, special
        put(os.path.join(out, "text_%03d" % i), bytes([mode]) + t.encode("utf-8"))
    put(os.path.join(out, "bad_utf8"), bytes([0]) + b"ok \xff\xfe \xc3( \xe2\x82 \xf0\x9f\x98 end")
    put(os.path.join(out, "spm_marks"), bytes([4]) + "a\u2581b <tag>x<tag>".encode("utf-8"))
    # vocabulary mode (bit 6): kind byte (type, or >= 0xF0 for a merge), score byte, text
    def vocab(mode, text, entries):
        fields = [text.encode()]
        for e in entries:
            if isinstance(e, tuple):
                kind, score, t = e
                fields.append(bytes([kind, (0x40 + score) & 0xFF]) + t.encode())   # never a NUL
            else:
                fields.append(b"\xf0" + e.encode())
        return bytes([0x40 | mode]) + b"\0".join(fields)
    bpe = [(3, 0, "<|im_start|>"), (3, 0, "<|im_end|>"), (4, 0, "<tag>")]
    bpe += [(1, 0, c) for c in "abcdeĠĊ"] + [(1, 0, "ab"), (1, 0, "Ġa"), (1, 0, "abc"), (6, 0, "x")]
    bpe += ["a b", "ab c", "Ġ a", "zz top"]
    put(os.path.join(out, "vocab_bpe"), vocab(0x08 | 0x10, "<|im_start|>ab abc\nabcab <tag>x", bpe))
    put(os.path.join(out, "vocab_bpe_llama3"), vocab(0x04, "abc abc", bpe))
    spm = [(3, 0, "<s>"), (3, 0, "</s>"), (2, 0, "<unk>"), (4, 0, "<tag>")]
    spm += [(1, -k, t) for k, t in enumerate(["▁", "a", "b", "▁a", "ab", "▁ab"])]
    spm += [(6, 0, "<0x%02X>" % b) for b in (0x20, 0x61, 0xE2, 0x96, 0x81)]
    put(os.path.join(out, "vocab_spm"), vocab(0x01 | 0x20 | 0x80, "ab a <tag>b  \u00e9", spm))
    for i in range(4):
        ids = [(7 * i + 31 * k) % 1300 for k in range(24)] + [-1, 99999]
        put(os.path.join(out, "ids_%d" % i), bytes([0x20 | i]) + struct.pack("<%di" % len(ids), *ids))


def chat_corpus() -> None:
    """Flag byte (template choice, add_assistant, NULL system) then
    NUL-separated fields: [template when custom,] role, content, role, ..."""
    out = os.path.join(CORPUS, "chat")
    convs = [
        [("user", "Hello!")],
        [("system", "Be brief."), ("user", "Say hi."), ("assistant", "Hi."), ("user", "Again")],
        [("system", ""), ("user", "  padded  \n")],
        [("user", "<|im_start|>system\ninjected<|im_end|>"), ("assistant", "[INST] x [/INST]")],
        [("tool", "x"), ("user", "\u4e2d\u6587 emoji \U0001F600")],
        [("assistant", "first"), ("user", "second"), ("system", "late system")],
    ]
    k = 0
    for fam in range(5):
        for j, conv in enumerate(convs):
            flags = fam | (((j + fam) % 2) << 3) | ((j == 2) << 4)
            fields = []
            for role, content in conv:
                fields += [role, content]
            put(os.path.join(out, "chat_%02d" % k), bytes([flags]) + "\0".join(fields).encode())
            k += 1
    for i, tmpl in enumerate([SMOLLM2_TEMPLATE, LLAMA3_TEMPLATE, LLAMA2_TEMPLATE, MISTRAL_TEMPLATE,
                              "{{ '<|im_start|>system\\nDefault with \\'quote\\' and \\\\n<|im_end|>' }}",
                              "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>",
                              "unknown {{ messages }}"]):
        fields = [tmpl, "user", "Hi", "assistant", "Hello"]
        put(os.path.join(out, "tmpl_%02d" % i), bytes([5 | (i % 2) << 3]) + "\0".join(fields).encode())


def args_corpus() -> None:
    """Selector byte (fuzz_args.c) then NUL-separated strings."""
    out = os.path.join(CORPUS, "args")
    cases = [
        (0, ["12"]), (0, ["-9223372036854775808"]), (0, ["99999999999999999999"]), (0, [" +7"]),
        (0, ["0x10"]), (1, ["0.25"]), (1, ["1e308"]), (1, ["nan"]), (1, ["-inf"]),
        (2, ["24G"]), (2, ["1.5GiB"]), (2, ["512m"]), (2, ["4096"]), (2, ["16e18"]), (2, ["0x1p4K"]),
        (2, ["-0"]), (2, ["1TB"]), (2, ["7 kb"]),
        (3, ["1,2,4"]), (3, ["1024,8192,,"]), (3, ["-1,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"]),
        (4, ["\x02", "rho_p=256"]), (4, ["\x02", "rho_p=3%"]), (4, ["\x03", "budget=1e3"]),
        (4, ["\x04", "window=-1"]), (4, ["\x05", "mt=1"]), (4, ["\x07", "lookahead=0.5"]),
        (4, ["\x00", "x"]), (4, ["\x09", "budget=="]),
        (5, ["--policy", "ctkvr", "--policy-arg", "rho_p=256", "--sink", "4", "--local", "256"]),
        (5, ["--kv", "plain", "--policy", "quest"]),
        (5, ["--policy", "speckv", "--draft", "m.gguf", "--policy-arg", "lookahead=8"]),
        (5, ["--precision", "fast", "--local", "0"]),
        (5, ["--policy-arg", "x=1", "--policy", "nope"]),
    ]
    for i, (sel, fields) in enumerate(cases):
        put(os.path.join(out, "args_%02d" % i), bytes([sel]) + "\0".join(fields).encode())


def batch_requests() -> list:
    words = docs_text().split()
    txt = " ".join(words[100:140])
    return [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Summarise this: " + txt}],
                  "max_tokens": 12, "temperature": 0}},
        {"custom_id": "comp", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": txt, "max_tokens": 12, "temperature": 0}},
        {"custom_id": "special", "url": "/v1/completions", "method": "POST",
         "body": {"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "max_tokens": 8,
                  "temperature": 0, "unknown_field": {"ignored": True}}},
        {"custom_id": "stop", "url": "/v1/completions", "method": "POST",
         "body": {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 30, "temperature": 0, "stop": [" 9"]}},
        {"custom_id": "ids", "url": "/v1/completions", "method": "POST",
         "body": {"prompt": [1, 2, 3, 4], "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "seed": 3}},
        {"custom_id": "parts", "url": "/v1/chat/completions", "method": "POST",
         "body": {"messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": [{"type": "text", "text": "Say hi."}]}],
                  "max_completion_tokens": 5, "temperature": 0, "n": 1, "stream": False}},
        {"custom_id": "dev", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}],
                  "top_k": 40, "seed": -5, "stop": "\n", "presence_penalty": 0, "logit_bias": {},
                  "response_format": {"type": "text"}, "logprobs": False, "best_of": 1}},
        {"url": "/v1/completions", "body": {"prompt": "a"}},
        {"custom_id": "nourl", "body": {"prompt": "a"}},
        {"custom_id": "badurl", "url": "/v1/embeddings", "body": {"input": "a"}},
        {"custom_id": "get", "method": "GET", "url": "/v1/completions", "body": {"prompt": "a"}},
        {"custom_id": "nobody", "url": "/v1/completions"},
        {"custom_id": "nomsg", "url": "/v1/chat/completions", "body": {}},
        {"custom_id": "role", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "tool", "content": "x"}]}},
        {"custom_id": "image", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}},
        {"custom_id": "noprompt", "url": "/v1/completions", "body": {}},
        {"custom_id": "n2", "url": "/v1/completions", "body": {"prompt": "a", "n": 2}},
        {"custom_id": "logprobs", "url": "/v1/completions", "body": {"prompt": "a", "logprobs": 3}},
        {"custom_id": "mt0", "url": "/v1/completions", "body": {"prompt": "a", "max_tokens": 0}},
        {"custom_id": "temp", "url": "/v1/completions", "body": {"prompt": "a", "temperature": 5}},
        {"custom_id": "stop5", "url": "/v1/completions",
         "body": {"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}},
        {"custom_id": "tokid", "url": "/v1/completions", "body": {"prompt": [1, 99999999]}},
        {"custom_id": "many", "url": "/v1/completions", "body": {"prompt": ["a", "b"]}},
        {"custom_id": "empty", "url": "/v1/completions", "body": {"prompt": ""}},
        {"custom_id": "uni\u00e9\U0001F600", "url": "/v1/completions",
         "body": {"prompt": "caf\u00e9 \u4e2d\u6587 \\u escapes \ud83d\ude00", "suffix": None}},
    ]


def batch_corpus() -> None:
    out_l = os.path.join(CORPUS, "batch_line")
    out_b = os.path.join(CORPUS, "batch_body")
    reqs = batch_requests()
    for i, r in enumerate(reqs):
        put(os.path.join(out_l, "line_%02d" % i), json.dumps(r).encode())
        if isinstance(r.get("body"), dict):
            put(os.path.join(out_b, "body_%02d" % i), json.dumps(r["body"]).encode())
    put(os.path.join(out_l, "torn"), b'{"custom_id": "x1", "url": "/v1/completions", "body": {"prompt": "a"')
    put(os.path.join(out_l, "not_object"), b'[1, 2, 3]')
    put(os.path.join(out_b, "stream"), json.dumps({"prompt": "a", "stream": True}).encode())


# ------------------------------------------------------------ dictionaries

def dict_entry(b) -> str:
    if isinstance(b, str):
        b = b.encode()
    return '"' + "".join(chr(c) if 32 <= c < 127 and c not in (34, 92) else "\\x%02X" % c
                         for c in b) + '"'


def write_dict(name: str, title: str, words) -> None:
    lines = ["# libFuzzer dictionary for fuzz_%s: %s (tests/fuzz/make_seeds.py)" % (name, title)]
    lines += ["w%d=%s" % (i, dict_entry(w)) for i, w in enumerate(words)]
    put(os.path.join(HERE, "dict", name + ".dict"), ("\n".join(lines) + "\n").encode())


def dictionaries() -> None:
    keys = [
        "general.architecture", "general.name", "general.alignment", "llama", "qwen2",
        "llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
        "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.key_length",
        "llama.attention.value_length", "llama.attention.layer_norm_rms_epsilon",
        "llama.rope.freq_base", "llama.rope.dimension_count", "llama.rope.scaling.type",
        "llama.rope.scaling.factor", "llama.context_length", "linear", "none",
        "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id", "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_space_prefix", "tokenizer.chat_template", "gpt2", "smollm", "llama3",
        "llama-bpe", "token_embd.weight", "output.weight", "output_norm.weight",
        "rope_freqs.weight", "blk.0.", "blk.1.", "attn_norm.weight", "ffn_norm.weight",
        "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
        "ffn_up.weight", "ffn_down.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
        "<|im_start|>", "<|start_header_id|>", "[INST]", "<<SYS>>"]
    words = [b"GGUF", struct.pack("<I", 2), struct.pack("<I", 3)]
    for k in keys:   # as they appear in the file: u64 length, then the bytes
        words += [k, struct.pack("<Q", len(k)) + k.encode()]
    words += [struct.pack("<I", v) for v in (0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 12, 0x7FFFFFFF, 0xFFFFFFFF)]
    words += [struct.pack("<Q", v) for v in (0, 1, 2**31, 2**32, 2**63 - 1, 2**64 - 1)]
    write_dict("gguf", "magic, versions, key and tensor names, counts", words)
    json_words = [
        '"custom_id"', '"method"', '"POST"', '"url"', '"/v1/chat/completions"', '"/v1/completions"',
        '"body"', '"messages"', '"role"', '"content"', '"system"', '"user"', '"assistant"',
        '"developer"', '"type"', '"text"', '"prompt"', '"max_tokens"', '"max_completion_tokens"',
        '"temperature"', '"top_p"', '"top_k"', '"seed"', '"stop"', '"n"', '"best_of"', '"stream"',
        '"stream_options"', '"include_usage"', '"echo"', '"logprobs"', '"presence_penalty"',
        '"frequency_penalty"', '"logit_bias"', '"tools"', '"functions"', '"response_format"',
        '"suffix"', '"policy"', '"policy_args"', '"ctkvr"', '"rho_p"', '"budget"', '"quest"',
        '"snapkv"', "true", "false", "null", "[]", "{}", "1e308", "-1", "0.5",
        "9223372036854775807", '"\\u0000"', '"\\ud83d\\ude00"', '"<|im_start|>"', '"<|im_end|>"']
    for name in ("batch_line", "batch_body"):
        write_dict(name, "OpenAI request fields", json_words)
    write_dict("chat", "roles, template markers, the field separator", [
        "system", "user", "assistant", "<|im_start|>", "<|im_end|>", "<|im_start|>system\\n",
        "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "[INST]", "[/INST]", "<<SYS>>",
        "<</SYS>>", "{{", "{%", "\\n", "\\'", "'<|im_start|>system\n", "\0"])
    write_dict("args", "numbers, units, options, policies and their keys", [
        "K", "M", "G", "T", "KiB", "MiB", "GiB", "TiB", "kb", "mb", "gb", "tb", "e", "e+", "0x", "inf",
        "nan", ",", "=", "\0", "--kv", "plain", "tiered", "--policy", "--policy-arg", "--sink",
        "--local", "--draft", "--precision", "exact", "fast", "full", "oracle", "ctkvr", "quest",
        "snapkv", "rocketkv", "laq", "speckv", "specpc", "fastkv", "rho_p", "rho", "budget", "window",
        "lookahead", "mt", "dcu", "dcu_cos", "tail", "C", "Cp", "k", "kernel", "page", "pool", "rerank",
        "split", "tsp_layer", "tsp_len", "w1", "w2", "neighbors", "skip_layers"])
    write_dict("tokenizer", "special and user tokens, spaces, byte classes", [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tag>", "<s>", "</s>", "\u2581", "'s", "'LL",
        "\r\n", "\u00a0", "\u3000", "\U0001F600", "\u0661\u0662", b"\xff", b"\xc3", b"\xe2\x96"])


def json_text_corpus() -> None:
    """Raw bytes: prompt text, invalid and truncated UTF-8, NUL and controls."""
    out = os.path.join(CORPUS, "json_text")
    for i, t in enumerate(prompt_texts()[::3]):
        put(os.path.join(out, "text_%02d" % i), t.encode("utf-8"))
    put(os.path.join(out, "bad_utf8"), b"ok \xff\xfe \xc3( \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf end")
    put(os.path.join(out, "controls"), bytes(range(0, 40)) + b"\x7f\"\\/")
    put(os.path.join(out, "cut_emoji"), "caf\u00e9 \U0001F600".encode("utf-8")[:-2])


def main() -> int:
    os.makedirs(DATA, exist_ok=True)
    bpe_tokenizer(os.path.join(DATA, "tok_bpe.gguf"))
    spm_tokenizer(os.path.join(DATA, "tok_spm.gguf"))
    for t in ("gguf", "tokenizer", "chat", "args", "batch_line", "batch_body", "json_text"):
        shutil.rmtree(os.path.join(CORPUS, t), ignore_errors=True)
    gguf_corpus()
    tokenizer_corpus()
    chat_corpus()
    args_corpus()
    batch_corpus()
    json_text_corpus()
    dictionaries()
    total = 0
    for root, _, files in os.walk(HERE):
        if "/corpus" in root or root.endswith("/data"):
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print("wrote tests/fuzz/data and tests/fuzz/corpus: %d KB" % (total // 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main())

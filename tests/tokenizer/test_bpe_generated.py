"""Byte-level BPE on generated GGUFs, one per pre-tokenizer (gpt2, smollm,
llama3, qwen2): HF tokenizers trains a small vocabulary on Debian license
texts, gguf-py writes it (tokens, types, merges, pre), and our ids must equal
HF's id for id, with and without special-token parsing; our decode must equal
HF's decode and give back the text. Needs no model.
Usage: test_bpe_generated.py TOK_TOOL [MODEL]"""
import json
import os
import sys
import tempfile

import tokref

tokref.need("tokenizers", "gguf", "numpy")
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im"]
USER = "<tag>"
UNREACHABLE = ["\u0120zqxv", "zqxv"]


def train(pre, corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = tokref.hf_pre_tokenizer(pre)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    if pre == "llama3":   # Llama 3 takes a whole word that is a token before merging
        j = json.loads(tok.to_str())
        j["model"]["ignore_merges"] = True
        # Words no merge sequence reaches, so only ignore_merges finds them.
        base = tok.get_vocab_size(with_added_tokens=True)
        for k, w in enumerate(UNREACHABLE):
            j["model"]["vocab"][w] = base + k
        tok = Tokenizer.from_str(json.dumps(j))
    tok.add_tokens([AddedToken(USER, special=False, normalized=False)])
    return tok


def to_gguf(tok, pre, path):
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for s, i in vocab.items():
        tokens[i] = s
    assert None not in tokens
    types = [3 if s in SPECIALS else 4 if s == USER else 1 for s in tokens]
    if pre == "llama3":
        assert tokens[-1 - len(UNREACHABLE):-1] == UNREACHABLE
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    tokref.write_gguf(path, "gpt2", tokens, types, merges=merges, pre=pre, bos=0, eos=2,
                      add_bos=False)
    return len(merges)


def main():
    tool = tokref.Tool(sys.argv[1])
    docs = tokref.corpus_files(max_docs=40)
    corpus = [t for _, t in docs]
    texts = [t for _, t in docs[:25]] + tokref.CRAFTED + ["a zqxv zqxv\nzqxv<tag>"] + tokref.random_texts(150, seed=2)
    texts = [t for t in texts if "\0" not in t]
    chk = tokref.Checker("bpe_generated")
    with tempfile.TemporaryDirectory() as tmp:
        tpath = tokref.write_text(tmp, "\0".join(texts))
        for pre in ("gpt2", "smollm", "llama3", "qwen2"):
            tok = train(pre, corpus)
            g = os.path.join(tmp, "bpe-%s.gguf" % pre)
            to_gguf(tok, pre, g)
            for special in (True, False):
                tok.encode_special_tokens = not special
                want = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
                out = tool.run("encode", g, tpath, "multi", *(["special"] if special else []))
                got = [[int(x) for x in line.split()] for line in out.decode().split("\n")[:-1]]
                chk.eq(len(got), len(texts), "%s: one line per text" % pre)
                for text, a, b in zip(texts, got, want):
                    chk.eq(a, b, "%s special=%s ids of %r" % (pre, special, text[:50]))
                if not special:
                    continue
                # Decode: ours (specials rendered) must give the text back and match HF.
                ipath = tokref.write_text(tmp, "\n".join(" ".join(map(str, ids)) for ids in got) + "\n", "ids.txt")
                dec = tool.run("decode", g, ipath, "special", "multi").decode().split("\n")
                for text, ids, h in zip(texts, got, dec):
                    chk.eq(bytes.fromhex(h).decode("utf-8"), text, "%s round trip of %r" % (pre, text[:50]))
                    chk.eq(bytes.fromhex(h).decode("utf-8"), tok.decode(ids, skip_special_tokens=False),
                           "%s decode vs HF of %r" % (pre, text[:50]))
    return chk.done()


if __name__ == "__main__":
    sys.exit(main())

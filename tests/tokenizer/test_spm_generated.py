"""SentencePiece path on a generated GGUF: the sentencepiece package trains a
tiny BPE model (byte fallback, identity normalisation as Llama 2 uses, one
user-defined symbol), gguf-py writes its pieces, scores and types as model
"llama", and our ids must equal sentencepiece's encode id for id; our
decode must give the text back. Needs no model.
Usage: test_spm_generated.py TOK_TOOL [MODEL]"""
import io
import os
import sys
import tempfile

import tokref

tokref.need("sentencepiece", "gguf", "numpy")
import sentencepiece as spm  # noqa: E402


def train(corpus_text):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_text.splitlines()), model_writer=model, model_type="bpe",
        vocab_size=600, byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, character_coverage=1.0,
        user_defined_symbols=["<tag>"], minloglevel=2)
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def to_gguf(sp, path):
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 4 if tokens[-1] == "<tag>" else 1)
    tokref.write_gguf(path, "llama", tokens, types, scores=scores, bos=sp.bos_id(), eos=sp.eos_id(),
                      unk=sp.unk_id(), add_bos=True, add_space_prefix=True)


def main():
    tool = tokref.Tool(sys.argv[1])
    docs = tokref.corpus_files(max_docs=10)
    # A few KB of training text: small enough that many test characters
    # (CJK, emoji, accents) are missing and take the byte fallback.
    sp = train("\n".join(t for _, t in docs[:3])[:6000])
    texts = [t for _, t in docs[3:12]] + tokref.CRAFTED + tokref.random_texts(150, seed=3)
    texts += ["a<tag>b", "<tag> x", "x <tag>", "<tag><tag>"]
    texts = [t for t in texts if "\0" not in t]
    chk = tokref.Checker("spm_generated")
    with tempfile.TemporaryDirectory() as tmp:
        g = os.path.join(tmp, "spm.gguf")
        to_gguf(sp, g)
        tpath = tokref.write_text(tmp, "\0".join(texts))
        out = tool.run("encode", g, tpath, "multi")
        got = [[int(x) for x in line.split()] for line in out.decode().split("\n")[:-1]]
        chk.eq(len(got), len(texts), "one line per text")
        for text, ids in zip(texts, got):
            chk.eq(ids, sp.encode(text), "ids of %r" % text[:50])
        # BOS from add_bos
        bos = tool.encode(g, tokref.write_text(tmp, "hello"), bos=True)
        chk.eq(bos, [sp.bos_id()] + sp.encode("hello"), "add_bos prepends <s>")
        ipath = tokref.write_text(tmp, "\n".join(" ".join(map(str, ids)) for ids in got) + "\n", "ids.txt")
        dec = tool.run("decode", g, ipath, "multi").decode().split("\n")
        for text, ids, h in zip(texts, got, dec):
            chk.eq(bytes.fromhex(h).decode("utf-8"), text, "round trip of %r" % text[:50])
            chk.eq(bytes.fromhex(h).decode("utf-8"), sp.decode(ids), "decode vs sentencepiece of %r" % text[:50])
    return chk.done()


if __name__ == "__main__":
    sys.exit(main())

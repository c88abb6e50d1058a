"""Our pre-tokenizer matchers against HF tokenizers' pre-tokenizers (Oniguruma
regexes, Digits, ByteLevel) on real text, crafted strings and random Unicode.
Needs no model. Usage: test_pretokenize.py TOK_TOOL [MODEL]"""
import sys
import tempfile

import tokref

tokref.need("tokenizers")


def main():
    tool = tokref.Tool(sys.argv[1])
    u2b = {c: b for b, c in tokref.bytes_to_unicode().items()}
    texts = [t for _, t in tokref.corpus_files(max_docs=20)]
    texts += tokref.CRAFTED + tokref.random_texts(400, seed=1)
    texts = [t for t in texts if "\0" not in t]
    chk = tokref.Checker("pretokenize")
    with tempfile.TemporaryDirectory() as tmp:
        path = tokref.write_text(tmp, "\0".join(texts))
        for pre in ("gpt2", "smollm", "llama3", "qwen2"):
            ref = tokref.hf_pre_tokenizer(pre)
            lines = tool.run("split", pre, path).decode().split("\n")
            chk.eq(len(lines), len(texts) + 1, "%s: one output line per text" % pre)
            for text, line in zip(texts, lines):
                got = [bytes.fromhex(h) for h in line.split()]
                want = [bytes(u2b[c] for c in piece) for piece, _ in ref.pre_tokenize_str(text)]
                chk.eq(got, want, "%s split of %r" % (pre, text[:60]))
    return chk.done()


if __name__ == "__main__":
    sys.exit(main())

"""The real SmolLM2-135M-Instruct GGUF: our ids against an HF tokenizers BPE
built from the file's own vocabulary and merges with SmolLM2's pre-tokenizer
(Digits(individual) + ByteLevel) and its control tokens as special added
tokens; decode round trips; metadata (BOS/EOS/EOG, add_bos); the chat
template against jinja2 rendering of the file's tokenizer.chat_template; and
the speed on 1 MB of text. Skips (77) when the model is absent.
Usage: test_smollm2.py TOK_TOOL MODEL"""
import os
import sys
import tempfile

import tokref

MAX_SECONDS_PER_MB = 1.0


def load_reference(path):
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in strings("tokenizer.ggml.merges")]
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    tmpl = bytes(r.fields["tokenizer.chat_template"].parts[-1]).decode("utf-8")
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = tokref.hf_pre_tokenizer("smollm")
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok, tokens, tmpl


def render_jinja(tmpl, messages, gen):
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(tmpl).render(messages=messages, add_generation_prompt=gen,
                                        bos_token="<|im_start|>", eos_token="<|im_end|>")


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Write a haiku\nabout café ☕ and 42 cats."}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "  spaced  "}],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}],
]


def main():
    if len(sys.argv) < 3 or not os.path.isfile(sys.argv[2]):
        print("SKIP: model not found at %s" % (sys.argv[2] if len(sys.argv) > 2 else "(no path)"))
        return tokref.SKIP
    tokref.need("tokenizers", "gguf", "numpy", "jinja2")
    tool, model = tokref.Tool(sys.argv[1]), sys.argv[2]
    ref, tokens, tmpl = load_reference(model)
    chk = tokref.Checker("smollm2")
    docs = tokref.corpus_files(max_docs=120)
    texts = [t for _, t in docs] + tokref.CRAFTED + tokref.random_texts(200, seed=4)
    texts = [t for t in texts if "\0" not in t]
    with tempfile.TemporaryDirectory() as tmp:
        tpath = tokref.write_text(tmp, "\0".join(texts))
        got_special = None
        for special in (True, False):
            ref.encode_special_tokens = not special
            want = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
            out = tool.run("encode", model, tpath, "multi", *(["special"] if special else []))
            got = [[int(x) for x in line.split()] for line in out.decode().split("\n")[:-1]]
            chk.eq(len(got), len(texts), "one line per text")
            for text, a, b in zip(texts, got, want):
                chk.eq(a, b, "special=%s ids of %r" % (special, text[:50]))
            got_special = got_special or got
        ipath = tokref.write_text(tmp, "\n".join(" ".join(map(str, ids)) for ids in got_special) + "\n", "ids.txt")
        dec = tool.run("decode", model, ipath, "special", "multi").decode().split("\n")
        for text, h in zip(texts, dec):
            chk.eq(bytes.fromhex(h).decode("utf-8"), text, "round trip of %r" % text[:50])
        # Without render_special the control tokens vanish from the text.
        ids = tool.encode(model, tokref.write_text(tmp, "<|im_start|>user\nhi<|im_end|>"), special=True)
        chk.eq(ids[0], 1, "<|im_start|> parsed as id 1")
        chk.eq(tool.decode(model, ids, tmp).decode(), "user\nhi", "control tokens hidden in decode")

        info = dict(line.split("=", 1) for line in tool.run("info", model).decode().split("\n") if line)
        chk.eq((info["n_vocab"], info["bos"], info["eos"], info["add_bos"], info["family"]),
               ("49152", "1", "2", "0", "chatml"), "metadata")
        eog = sorted(int(x) for x in info["eog"].split(","))
        chk.eq(eog, sorted([tokens.index("<|endoftext|>"), tokens.index("<|im_end|>")]), "end-of-generation tokens")
        chk.eq(tool.encode(model, tokref.write_text(tmp, "hi"), bos=True)[0], 1, "BOS prepended on request")

        for conv in CONVERSATIONS:
            for gen in (True, False):
                args = [x for m in conv for x in (m["role"], m["content"])]
                ours = tool.run("chat", model, int(gen), *args).decode()
                chk.eq(ours, render_jinja(tmpl, conv, gen), "chat %r gen=%s" % (conv[0]["content"][:20], gen))
                ref.encode_special_tokens = False
                chk.eq(tool.encode(model, tokref.write_text(tmp, ours), special=True),
                       ref.encode(ours, add_special_tokens=False).ids, "chat prompt ids")

        # Speed: 1 MB of license text, best of 3.
        blob = "\n".join(t for _, t in docs)
        blob = (blob * (1 + (1 << 20) // len(blob)))[: 1 << 20]
        bench = tool.run("bench", model, tokref.write_text(tmp, blob, "mb.txt"), 3).decode()
        secs = float(bench.split("seconds=")[1])
        print("1 MB: %s" % bench.strip())
        chk.eq(secs < MAX_SECONDS_PER_MB, True, "1 MB in %.3f s (limit %.1f s)" % (secs, MAX_SECONDS_PER_MB))
    return chk.done()


if __name__ == "__main__":
    sys.exit(main())

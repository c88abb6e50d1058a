"""Malformed or unsupported tokenizer metadata in otherwise valid GGUFs
(written with gguf-py): loading must fail with the right status and a message
naming the key or value, never crash. Needs no model.
Usage: test_load_errors.py TOK_TOOL [MODEL]"""
import os
import subprocess
import sys
import tempfile

import tokref

tokref.need("gguf", "numpy")
import gguf  # noqa: E402

U = tokref.bytes_to_unicode()
BYTES = [U[b] for b in range(256)]


def write(path, edit):
    """A valid byte-level tokenizer, then edit(kv) changes or drops keys."""
    kv = {
        "tokenizer.ggml.model": ("str", "gpt2"),
        "tokenizer.ggml.pre": ("str", "smollm"),
        "tokenizer.ggml.tokens": ("strs", BYTES + ["ab", "<|im_end|>"]),
        "tokenizer.ggml.token_type": ("i32s", [1] * 257 + [3]),
        "tokenizer.ggml.merges": ("strs", ["a b"]),
        "tokenizer.ggml.eos_token_id": ("u32", 257),
    }
    edit(kv)
    w = gguf.GGUFWriter(path, "llama")
    for k, (ty, v) in kv.items():
        if ty == "str":
            w.add_string(k, v)
        elif ty == "strs":
            w.add_array(k, v)
        elif ty == "i32s":
            w.add_key_value(k, v, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        elif ty == "u32":
            w.add_uint32(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def set_(key, ty, val):
    def f(kv):
        kv[key] = (ty, val)
    return f


def drop(key):
    def f(kv):
        del kv[key]
    return f


CASES = [  # name, edit, expected status, words the message must hold
    ("valid", lambda kv: None, None, []),
    ("model", set_("tokenizer.ggml.model", "str", "wordpiece"), "UNSUPPORTED", ["wordpiece"]),
    ("pre", set_("tokenizer.ggml.pre", "str", "tekken"), "UNSUPPORTED", ["tekken", "tokenizer.ggml.pre"]),
    ("no tokens", drop("tokenizer.ggml.tokens"), "NOTFOUND", ["tokenizer.ggml.tokens"]),
    ("tokens not strings", set_("tokenizer.ggml.tokens", "i32s", [1, 2, 3]), "FORMAT", ["tokenizer.ggml.tokens"]),
    ("no merges", drop("tokenizer.ggml.merges"), "NOTFOUND", ["merges"]),
    ("types length", set_("tokenizer.ggml.token_type", "i32s", [1, 1]), "FORMAT", ["token_type"]),
    ("eos range", set_("tokenizer.ggml.eos_token_id", "u32", 5000), "FORMAT", ["eos"]),
    ("no model", drop("tokenizer.ggml.model"), "NOTFOUND", ["tokenizer.ggml.model"]),
]


def main():
    tool = sys.argv[1]
    chk = tokref.Checker("load_errors")
    with tempfile.TemporaryDirectory() as tmp:
        text = tokref.write_text(tmp, "ab 12")
        for name, edit, status, words in CASES:
            g = os.path.join(tmp, "bad.gguf")
            write(g, edit)
            p = subprocess.run([tool, "encode", g, text], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            err = p.stderr.decode(errors="replace")
            if status is None:
                chk.eq((p.returncode, p.stdout.split()), (0, [b"256", b"32", b"49", b"50"]), "%s: loads" % name)
                continue
            chk.eq(p.returncode, 1, "%s: fails cleanly (stderr %r)" % (name, err[-200:]))
            chk.eq("status=" + status in err, True, "%s: status %s in %r" % (name, status, err[-200:]))
            for w in words:
                chk.eq(w in err, True, "%s: message names %r: %r" % (name, w, err[-200:]))
    return chk.done()


if __name__ == "__main__":
    sys.exit(main())

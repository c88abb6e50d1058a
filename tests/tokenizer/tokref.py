"""Shared pieces of the tokenizer tests: running tok_tool, the texts we test
on, GGUF writing with gguf-py, and the HF reference pre-tokenizers."""
import glob
import os
import random
import subprocess
import sys

SKIP = 77

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


def need(*modules):
    """Import the reference packages or fail with what to install."""
    missing = []
    for m in modules:
        try:
            __import__(m)
        except ImportError:
            missing.append(m)
    if missing:
        print("missing Python packages %s: pip install -r tests/requirements.txt" % ", ".join(missing))
        sys.exit(1)


class Tool:
    def __init__(self, path):
        self.path = path

    def run(self, *args, input_bytes=None):
        p = subprocess.run([self.path] + [str(a) for a in args], input=input_bytes,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if p.returncode != 0:
            raise RuntimeError("tok_tool %s failed (%d): %s" % (" ".join(map(str, args[:2])), p.returncode,
                                                                 p.stderr.decode(errors="replace")))
        return p.stdout

    def encode(self, gguf, path, special=False, bos=False):
        flags = (["special"] if special else []) + (["bos"] if bos else [])
        return [int(x) for x in self.run("encode", gguf, path, *flags).split()]

    def decode(self, gguf, ids, tmpdir, special=False):
        p = os.path.join(tmpdir, "ids.txt")
        with open(p, "w") as f:
            f.write("\n".join(map(str, ids)))
        return self.run("decode", gguf, p, *(["special"] if special else []))


def write_text(tmpdir, text, name="text.txt"):
    p = os.path.join(tmpdir, name)
    with open(p, "wb") as f:
        f.write(text.encode("utf-8") if isinstance(text, str) else text)
    return p


def corpus_files(max_docs=60, max_size=64 << 10):
    """Real text from Debian packages on this machine, in a stable order: the
    common licenses, then copyright files spread over the package list."""
    docs = sorted(glob.glob("/usr/share/doc/*/copyright"))
    step = max(1, len(docs) // max_docs) if max_docs else 1
    files = sorted(glob.glob("/usr/share/common-licenses/*")) + docs[::step][:max_docs]
    out = []
    for f in files:
        if os.path.isfile(f) and not os.path.islink(f) and os.path.getsize(f) <= max_size:
            with open(f, "rb") as fh:
                data = fh.read()
            try:
                out.append((f, data.decode("utf-8")))
            except UnicodeDecodeError:
                pass
    return out


CRAFTED = [
    "", " ", "  ", "\n", "a", "Hello world", "Hello, world!", "  leading spaces", "trailing spaces   ",
    "I'm here; you're there, they've gone, we'll see, he'd know, it's John's. DON'T SHOUT, I'M OK",
    "'s 't 're 've 'm 'll 'd '' ' 'x",
    "café naïve résumé déjà vu Ångström façade coöperate", "Zürich Straße Übermaß",
    "中文测试：你好，世界！日本語のテキスト、カタカナ。한국어 텍스트",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 keycap 1️⃣",
    "tabs\tand\t\ttabs\t", "lines\nand\n\nmore\n\n\nlines\n", "crlf\r\nline\r\n\r\nend\r",
    "mixed \t \n \r\n  \t\t  end", "    indented code:\n        return x\n",
    "digits 0 12 345 6789 1234567890 3.14159 1e-10 0x1F 1,000,000",
    "Arabic ١٢٣ Devanagari १२३ fractions ½ ¾ superscripts x² y³ roman Ⅻ",
    "punct !!! ??? ... --- ___ *** ### @@@ $$$ %%% ^^^ &&& (()) [[]] {{}} <<>> |||",
    "url https://example.com/path?a=1&b=2#frag email someone@example.org",
    "code: for (int i = 0; i < n; i++) { x[i] += y[i] * 2; } // comment",
    "non-breaking\u00a0space ideographic\u3000space nel\u0085char ls\u2028ps\u2029end",
    "zero\u200bwidth\u200cjoin\u200dx soft\u00adhyphen bom\ufeffx",
    "combining e\u0301 a\u0308 n\u0303 and precomposed é ä ñ",
    "Greek αβγ ΑΒΓ Cyrillic привет ПРИВЕТ Hebrew שלום Arabic مرحبا Thai สวัสดี",
    "long wordsssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssss",
    "ab" * 300, " " * 200 + "x", "\n" * 50, "9" * 100,
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_start|>x<|im_end|> <|endoftext|>text<|im_end|",
    "'ſ 'S 'Re 'VE 'lL 'D",
]


def random_texts(n, seed, max_len=60):
    """Strings mixing the classes the patterns care about, plus random
    assigned code points from all planes."""
    import unicodedata
    rng = random.Random(seed)
    pool = list("abcXYZ stdmrvleSTDMRVLE'0123456789 \t\r\n.,;!?-_()[]{}<>/\\\"@#")
    pool += ["\u00a0", "\u3000", "\u0085", "\u2028", "\u200b", "\u0301", "é", "ß", "ſ", "中", "文", "ア",
             "한", "😀", "👍🏽", "١", "٣", "½", "Ⅻ", "²", "α", "Ж", "\u1680", "\u2009", "\x1c", "\x7f", "\u00ad",
             "  ", "\n\n", " \n", "'s", "'LL", "'ve"]
    out = []
    for _ in range(n):
        s = []
        for _ in range(rng.randint(0, max_len)):
            if rng.random() < 0.12:
                while True:   # a random assigned code point, no surrogates
                    cp = rng.choice([rng.randint(0x80, 0x2FFF), rng.randint(0x3000, 0xFFFF),
                                     rng.randint(0x10000, 0x3FFFF)])
                    if not 0xD800 <= cp <= 0xDFFF and unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co"):
                        break
                s.append(chr(cp))
            else:
                s.append(rng.choice(pool))
        out.append("".join(s))
    return out


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def hf_pre_tokenizer(pre):
    """The HF pre-tokenizer that the GGUF pre type stands for."""
    from tokenizers import Regex, pre_tokenizers as pt
    bl = pt.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "gpt2":
        return bl
    if pre == "smollm":
        return pt.Sequence([pt.Digits(individual_digits=True), bl])
    pattern = {"llama3": LLAMA3_PATTERN, "qwen2": QWEN2_PATTERN}[pre]
    return pt.Sequence([pt.Split(Regex(pattern), behavior="isolated", invert=False),
                        pt.ByteLevel(add_prefix_space=False, use_regex=False)])


def write_gguf(path, model, tokens, types, scores=None, merges=None, pre=None, bos=None, eos=None,
               unk=None, eot=None, add_bos=None, add_space_prefix=None, template=None):
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for fn, v in ((w.add_bos_token_id, bos), (w.add_eos_token_id, eos), (w.add_unk_token_id, unk),
                  (w.add_eot_token_id, eot), (w.add_add_bos_token, add_bos),
                  (w.add_add_space_prefix, add_space_prefix), (w.add_chat_template, template)):
        if v is not None:
            fn(v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class Checker:
    """Counts failures and prints the first few in detail."""

    def __init__(self, name):
        self.name, self.failures, self.checks = name, 0, 0

    def eq(self, got, want, what):
        self.checks += 1
        if got == want:
            return True
        self.failures += 1
        if self.failures <= 8:
            print("FAIL %s: %s" % (self.name, what))
            if isinstance(got, list) and isinstance(want, list):
                i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
                print("  first difference at %d: got %r, want %r (lengths %d, %d)"
                      % (i, got[i:i + 8], want[i:i + 8], len(got), len(want)))
            else:
                print("  got  %r\n  want %r" % (got[:300], want[:300]))
        return False

    def done(self):
        print("%s: %d checks, %d failures" % (self.name, self.checks, self.failures))
        return 1 if self.failures else 0

"""Minimal byte-level BPE (tokenizer.ggml.model "gpt2") for the reference tools.

Only for convenience in tests/ref (turning an English prompt into ids, printing
generated ids as text). It is NOT the tokenizer under test, and its
pre-tokenizer is the GPT-2 pattern restricted to ASCII letters and digits
(digits one by one, as SmolLM2/Llama-3 split them), which is exact for plain
ASCII English and approximate elsewhere. The harness in tests/model takes its
prompt ids from the C side instead.
"""

from __future__ import annotations

import re

from gguf import GGUFReader

_PAT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def _bytes_to_unicode() -> dict[int, str]:
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


class BPE:
    def __init__(self, path: str):
        r = GGUFReader(path)
        model = r.fields["tokenizer.ggml.model"].contents()
        if model != "gpt2":
            raise ValueError(f"bpe_min handles tokenizer.ggml.model gpt2 only, not {model}")
        self.tokens: list[str] = r.fields["tokenizer.ggml.tokens"].contents()
        merges = r.fields["tokenizer.ggml.merges"].contents()
        self.rank = {tuple(m.split(" ", 1)): i for i, m in enumerate(merges)}
        self.id_of = {t: i for i, t in enumerate(self.tokens)}
        self.b2u = _bytes_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}
        tt = r.fields.get("tokenizer.ggml.token_type")
        self.types = tt.contents() if tt is not None else [1] * len(self.tokens)

    def _bpe(self, word: str) -> list[str]:
        parts = list(word)
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = self.rank.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        return parts

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in _PAT.findall(text):
            u = "".join(self.b2u[b] for b in piece.encode("utf-8"))
            ids.extend(self.id_of[p] for p in self._bpe(u))
        return ids

    def decode(self, ids) -> str:
        out = bytearray()
        for i in ids:
            t = self.tokens[i]
            if self.types[i] == 3:      # control: render as its text
                out += t.encode("utf-8")
            elif all(ch in self.u2b for ch in t):
                out += bytes(self.u2b[ch] for ch in t)
            else:
                out += t.encode("utf-8")
        return out.decode("utf-8", errors="replace")

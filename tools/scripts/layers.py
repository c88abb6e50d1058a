#!/usr/bin/env python3
"""The layer order of the source folders, checked: every #include "x.h" that
crosses it upward is listed, and so is every pair of folders that include
each other. Exit 1 when there is one (the meson test `layers` runs it).

    python3 tools/scripts/layers.py [--root DIR] [--graph]

Each folder may include its own headers and those of the folders before it
in LAYERS; the applications under tools/ may also include tools/cli/ (what
every command shares) and serve/ may include batch/ (the server runs on the
batch runner's scheduler), and tools/hetkv.c and tools/hkv_dump_logits.c,
which sit above every application, include them all. Headers are found by
name (the build puts every folder on the include path), so two headers of
the same name in two folders are an error too.
"""
import argparse
import collections
import os
import re
import sys

# Lowest first: the ground floor, the kernels, the policies and transfers,
# the KV cache, what a GGUF file holds, the device plans, the engine, the
# CUDA backend and pipeline, then the applications.
LAYERS = ["base", "cpu", "gpu", "index", "transfer", "kv", "model", "plan", "runtime",
          "pipeline", "tools/cli", "tools/batch", "tools/serve", "tools/bench", "tools/eval",
          "tools/plan", "tools"]
# Application folders side by side: each may use tools/cli (and serve batch),
# none another's.
APPS = {"tools/batch": set(), "tools/serve": {"tools/batch"}, "tools/bench": set(),
        "tools/eval": set(), "tools/plan": set()}
SOURCE = (".c", ".h", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(rel: str) -> str | None:
    best = None
    for f in LAYERS:
        if rel.startswith(f + "/") and (best is None or len(f) > len(best)):
            best = f
    if best == "tools" and "/" in rel[len("tools/"):]:
        return None   # tools/scripts and the like: not C
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    ap.add_argument("--graph", action="store_true", help="print every folder-to-folder edge")
    a = ap.parse_args()
    files, headers, dup = [], {}, []
    for f in LAYERS:
        top = os.path.join(a.root, f)
        for dp, dn, fn in os.walk(top):
            dn[:] = [d for d in dn if d not in ("emu",)] if f == "gpu" else dn
            for n in fn:
                rel = os.path.relpath(os.path.join(dp, n), a.root)
                if folder_of(rel) != f or not n.endswith(SOURCE + (".h.in",)):
                    continue
                files.append((f, rel))
                if n.endswith((".h", ".cuh", ".inc", ".h.in")):
                    h = n[:-3] if n.endswith(".in") else n
                    if h in headers and headers[h] != f:
                        dup.append(f"{h}: in {headers[h]}/ and {f}/")
                    headers.setdefault(h, f)
    rank = {f: i for i, f in enumerate(LAYERS)}
    edges, bad = collections.Counter(), []
    for f, rel in files:
        with open(os.path.join(a.root, rel), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for m in INCLUDE.finditer(text):
            to = headers.get(os.path.basename(m.group(1)))
            if to is None or to == f:
                continue
            edges[(f, to)] += 1
            if f in APPS and to in APPS and to not in APPS[f]:
                bad.append(f"{rel}: includes {m.group(1)} of {to}/ (one application's code in another's)")
            elif rank[to] > rank[f] and not (f in APPS and to in APPS[f]):
                bad.append(f"{rel}: includes {m.group(1)} of {to}/, above {f}/ in the layer order")
    mutual = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})
    if a.graph:
        for (x, y), n in sorted(edges.items(), key=lambda e: (rank[e[0][0]], rank[e[0][1]])):
            print(f"{x} -> {y}: {n}")
    for d in dup:
        print("layers: two headers of one name:", d)
    for b in bad:
        print("layers: upward:", b)
    for x, y in mutual:
        print(f"layers: {x}/ and {y}/ include each other")
    n = len(dup) + len(bad) + len(mutual)
    print(f"layers: {len(files)} files in {len(LAYERS)} folders, {sum(edges.values())} includes "
          f"across folders, {n} problem(s); order: {' < '.join(LAYERS)}")
    return 1 if n else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Best-of table from a raw.txt of `hetkv bench ... -o jsonl` runs, each
preceded by its "$ command" line (bench/out/avx2-fast-*/README.md): per
(--isa, --precision) decode tok/s at each (ctx, batch) and prefill tok/s at
each ctx, the best of the repetitions (a shared machine: the best is the
least disturbed), with the fast/exact ratios of the same table.

    python3 bench/avx2_fast_table.py bench/out/avx2-fast-2026-11-28/raw.txt
"""
import json
import shlex
import sys


def main(path):
    best, isa, prec = {}, None, None
    for line in open(path):
        if line.startswith("$ "):
            args = shlex.split(line[2:].split("#")[0])
            isa, prec = args[args.index("--isa") + 1], args[args.index("--precision") + 1]
        elif line.startswith("{"):
            r = json.loads(line)
            for key, v in ((("decode", r["ctx"], r["batch"]), r["decode_tok_s"]),
                           (("prefill", r["ctx"], 0), r["prefill_tok_s"])):
                k = (isa, prec) + key
                best[k] = max(best.get(k, 0), v)
    cols = sorted({k[2:] for k in best}, key=lambda c: (c[0] != "decode", c[1], c[2]))
    name = lambda c: f"decode b{c[2]} @{c[1]}" if c[0] == "decode" else f"prefill {c[1]}"
    runs = sorted({k[:2] for k in best})
    print("| tok/s | " + " | ".join(name(c) for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for run in runs:
        print(f"| {run[0]} {run[1]} | " + " | ".join(f"{best.get(run + c, 0):.1f}" for c in cols) + " |")
    for run in runs:
        ex = (run[0], "exact")
        if run[1] == "fast" and any(r == ex for r in runs):
            print(f"| {run[0]} fast / exact | " +
                  " | ".join(f"{best[run + c] / best[ex + c]:.2f}x" for c in cols) + " |")
    if ("avx2", "fast") in runs and ("avx2-novnni", "exact") in runs:
        print("| avx2 (AVX-VNNI) fast / avx2-novnni exact | " +
              " | ".join(f"{best[('avx2', 'fast') + c] / best[('avx2-novnni', 'exact') + c]:.2f}x" for c in cols) + " |")


if __name__ == "__main__":
    main(sys.argv[1])

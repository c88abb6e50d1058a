#!/usr/bin/env python3
"""hetkv against llama.cpp on the CPU, side by side in one run (issue 15's table).

    python3 bench/peer_cpu.py [--hetkv build/tools/hetkv] [--peer DIR] [-m MODEL]
                              [-t THREADS] [--reps N] [--out DIR] [--isa NAME]

DIR holds llama-bench and llama-batched-bench (tools/scripts/llama_cpp_peer.sh builds
them and prints DIR). For each repetition, in turn: hetkv bench (exact and
fast precision) at ctx 1024 for batches 1, 4, 16, 64, at ctx 8192 for
batch 1, and batch 1 at short context (a 16-token prompt, 128 tokens
decoded, beside llama-bench's tg128: 128 from an empty context);
llama-batched-bench at the same prompt length, generated tokens and
batches (each sequence its own prompt, as hetkv's, and with -pps, the prompt
shared, as the issue measured); llama-bench prefill at 1024 and 8192. The
best of the repetitions is reported (the machines are shared: the best is the
least disturbed), with the same-run bandwidth probe. Writes the raw outputs
and table.md into --out. --isa goes to hetkv (e.g. avx2-novnni: the AVX2 kernels
without AVX-VNNI, an AVX2-only CPU's, beside a llama.cpp built for AVX2 only:
tools/scripts/llama_cpp_peer.sh); with avx2* hetkv also runs under
ONEDNN_MAX_CPU_ISA=AVX2.
"""
import argparse
import json
import os
import re
import subprocess
import sys

BATCHES = [1, 4, 16, 64]
NGEN = 16
SHORT_CTX, SHORT_GEN = 16, 128   # decode at short context: llama-bench's tg128


def run(cmd, log, env=None):
    print("+", " ".join(cmd), file=sys.stderr)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n" + r.stdout + r.stderr + "\n")
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout, r.stderr


def hetkv_env(a):
    """--isa avx2*: oneDNN (the exact path's sgemm), which picks its own ISA,
    held to AVX2 as well, so that exact is what an AVX2-only CPU runs."""
    if not a.isa or not a.isa.startswith("avx2"):
        return None
    return dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")


def hetkv_rows(a, precision, ctx, batches, log, steps=NGEN):
    out, _ = run([a.hetkv, "bench", "-m", a.model, "--ctx", str(ctx), "--batch",
                  ",".join(map(str, batches)), "--steps", str(steps), "-t", str(a.threads),
                  "--precision", precision, "-o", "jsonl"] + (["--isa", a.isa] if a.isa else []), log,
                 hetkv_env(a))
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def batched_bench(a, pps, log):
    ctx = max(BATCHES) * (1024 + NGEN)   # llama.cpp gives each sequence ctx / n_seq_max
    cmd = [os.path.join(a.peer, "llama-batched-bench"), "-m", a.model, "-c", str(ctx), "-b", "2048",
           "-ub", "512", "-npp", "1024", "-ntg", str(NGEN), "-npl", ",".join(map(str, BATCHES)),
           "-t", str(a.threads), "-tb", str(a.threads)]
    if pps:
        cmd.append("-pps")
    out, err = run(cmd, log)
    res = {}
    for line in (out + err).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0].isdigit():
            # PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s
            res[int(cells[2])] = {"pp": float(cells[5]), "tg": float(cells[7])}
    return res


def llama_bench(a, n_prompt, n_gen, log):
    out, _ = run([os.path.join(a.peer, "llama-bench"), "-m", a.model, "-t", str(a.threads), "-p", str(n_prompt),
                  "-n", str(n_gen), "-r", "2", "-o", "json"], log)
    rows = json.loads(out)
    return rows[0]["avg_ts"]


def best(vals):
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hetkv", default="build/tools/hetkv")
    ap.add_argument("--peer", required=True, help="directory of llama-bench, llama-batched-bench")
    ap.add_argument("-m", "--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="bench/out/peer-cpu")
    ap.add_argument("--isa", help="hetkv --isa (default: the best this CPU has)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "raw.txt")
    open(log, "w").close()
    h = {}       # (precision, ctx, batch) -> [(decode, prefill, decode's share of the probe)]
    probe = []
    p_sep, p_pps, pp, tg = {}, {}, {1024: [], 8192: []}, []
    for _ in range(a.reps):
        for prec in ("exact", "fast"):
            for ctx, batches, steps in ((SHORT_CTX, [1], SHORT_GEN), (1024, BATCHES, NGEN), (8192, [1], NGEN)):
                for r in hetkv_rows(a, prec, ctx, batches, log, steps):
                    h.setdefault((prec, ctx, r["batch"]), []).append(
                        (r["decode_tok_s"], r["prefill_tok_s"], r.get("frac_of_probe")))
                    probe.append(r["probe_gbs"])
        for pps, dst in ((False, p_sep), (True, p_pps)):
            for b, v in batched_bench(a, pps, log).items():
                dst.setdefault(b, []).append(v)
        for n in pp:
            pp[n].append(llama_bench(a, n, 0, log))
        tg.append(llama_bench(a, 0, SHORT_GEN, log))

    def hd(prec, ctx, b):
        return best([x[0] for x in h.get((prec, ctx, b), [])])

    def hf(prec, ctx, b):   # the best decode row's share of its run's probe
        rows = [x for x in h.get((prec, ctx, b), []) if x[0] is not None]
        return max(rows)[2] if rows else None

    def hp(prec, ctx):
        return best([x[1] for x in h.get((prec, ctx, 1), [])])

    def f(x):
        return "–" if x is None else f"{x:,.0f}"

    def ratio(x, y):
        return "–" if x is None or not y else f"{x / y:.2f}x"

    lines = [f"Threads {a.threads}, model {os.path.basename(a.model)}, hetkv --isa {a.isa or 'best'}, best of {a.reps} "
             f"repetitions; bandwidth probe {min(probe):.1f}-{max(probe):.1f} GB/s over the run.", "",
             "| tok/s | decode b1 short | " + " | ".join(f"decode b{b}" for b in BATCHES) +
             " | prefill 1K | prefill 8K |",
             "|---|" + "---|" * (len(BATCHES) + 3)]
    rows = [("hetkv exact", [hd("exact", SHORT_CTX, 1)] + [hd("exact", 1024, b) for b in BATCHES],
             hp("exact", 1024), hp("exact", 8192)),
            ("hetkv fast", [hd("fast", SHORT_CTX, 1)] + [hd("fast", 1024, b) for b in BATCHES],
             hp("fast", 1024), hp("fast", 8192)),
            ("llama.cpp, own prompts", [best(tg)] + [best([v["tg"] for v in p_sep.get(b, [])]) for b in BATCHES],
             best(pp[1024]), best(pp[8192])),
            ("llama.cpp -pps (shared prompt)", [None] + [best([v["tg"] for v in p_pps.get(b, [])]) for b in BATCHES],
             None, None)]
    for name, dec, p1, p8 in rows:
        lines.append(f"| {name} | " + " | ".join(f(x) for x in dec) + f" | {f(p1)} | {f(p8)} |")
    fast, peer = rows[1], rows[2]
    lines.append("| hetkv fast / llama.cpp | " + " | ".join(ratio(x, y) for x, y in zip(fast[1], peer[1]))
                 + f" | {ratio(fast[2], peer[2])} | {ratio(fast[3], peer[3])} |")
    shares = [hf("fast", SHORT_CTX, 1)] + [hf("fast", 1024, b) for b in BATCHES]
    lines.append("| hetkv fast, bytes read / probe | " +
                 " | ".join("–" if x is None else f"{100 * x:.0f}%" for x in shares) + " | | |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "table.md"), "w") as fo:
        fo.write(table)
    print(table)


if __name__ == "__main__":
    main()

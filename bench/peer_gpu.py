#!/usr/bin/env python3
"""hetkv's dense GPU path against llama.cpp's CUDA backend, same card, same file (issue 37).

    python3 bench/peer_gpu.py --hetkv BUILD/tools/hetkv --peer DIR [-m MODEL.gguf]
                              [--ctx 1024,8192,32768] [--batch 1,4,16] [--out DIR]

DIR holds llama-batched-bench, and llama-bench where it travelled, built with
CUDA (tools/scripts/llama_cpp_peer.sh --cuda sm_90: static, 78 MB each, 41 MB each
xz-compressed, so one of them fits beside the pack in a device call's 64 MiB:
llama-batched-bench, whose shared-prompt prefill rate stands in for
llama-bench's). MODEL (default /tmp/llama31_8b_q40.gguf) is
written first when absent: Llama-3.1-8B's shape in Q4_0 as random blocks
(tools/scripts/gen_tiny_gguf.py --preset llama31_8b_q40, seconds; needs the gguf package).
Per context: hetkv bench --device cuda with the whole context on the device
(--local past it, full) at every batch, its prompt prefilled once and forked;
llama-batched-bench with the prompt shared (-pps, likewise prefilled once), all
layers on the GPU, flash attention; llama-bench's prompt processing of the
context from empty; hetkv again with --gpu-no-graphs at the contexts of
--no-graphs-ctx (the replayed decode step's A/B). Writes OUT/raw.txt (every command and its output),
OUT/peer_gpu.json ({"rows": [{engine, ctx, batch, decode_tok_s,
prefill_tok_s}, ...]}) and OUT/table.md. A command that fails is logged and
its rows left out; the others still run.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NGEN = 32


def run(cmd, log, timeout):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out, err, rc = r.stdout, r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, rc = f"timed out after {timeout} s", 124
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n(exit {rc})\n{out}{err}\n")
    if rc != 0:   # what it printed still counts: bench streams its rows as measured
        print(f"failed ({rc}): {' '.join(cmd)}\n{err[-1500:]}", file=sys.stderr)
    return out + "\n" + err, rc == 0


def hetkv_rows(a, ctx, log, extra=(), engine="hetkv"):
    # the whole context near: --local past the prompt and the generated tokens
    out, _ = run([a.hetkv, "bench", "-m", a.model, "--device", "cuda", "--ctx", str(ctx), "--batch",
               ",".join(map(str, a.batch)), "--steps", str(NGEN), "--chunk", "2048", "--local",
               str(ctx + NGEN + 64), "--configs", "full", "-o", "jsonl", *extra], log, a.timeout)
    rows = []
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows.append({"engine": engine, "ctx": ctx, "batch": r["batch"],
                         "decode_tok_s": r["decode_tok_s"], "prefill_tok_s": r["prefill_tok_s"]})
    return rows


def fa_args(tool, log):
    """llama.cpp's flash-attention flag: '-fa on' where it takes a value, else '-fa 1'/'-fa'."""
    h, _ = run([tool, "--help"], log, 60)
    if "[on|off|auto]" in h:
        return ["-fa", "on"]
    return ["-fa", "1"] if os.path.basename(tool) == "llama-bench" else ["-fa"]


def batched_rows(a, ctx, log):
    tool = os.path.join(a.peer, "llama-batched-bench")
    n = max(a.batch)
    out, _ = run([tool, "-m", a.model, "-ngl", "99", *fa_args(tool, log), "-c", str((ctx + NGEN) * n),
               "-b", "2048", "-ub", "512", "-npp", str(ctx), "-ntg", str(NGEN), "-npl",
               ",".join(map(str, a.batch)), "-pps"], log, a.timeout)
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0].isdigit():
            # PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s
            # -pps: one prompt prefilled and shared, so S_PP is that prompt's rate
            rows.append({"engine": "llama.cpp", "ctx": ctx, "batch": int(cells[2]),
                         "decode_tok_s": float(cells[7]), "prefill_tok_s": float(cells[5])})
    return rows


def prefill_rows(a, log):
    tool = os.path.join(a.peer, "llama-bench")
    if not os.access(tool, os.X_OK):   # batched-bench's own prefill figures stand
        return {}
    out, _ = run([tool, "-m", a.model, "-ngl", "99", *fa_args(tool, log), "-p",
               ",".join(map(str, a.ctx)), "-n", "0", "-r", "2", "-o", "json"], log, a.timeout)
    try:
        js = json.loads(out[out.index("["):out.rindex("]") + 1])
    except ValueError:
        js = []
    return {r["n_prompt"]: r["avg_ts"] for r in js if r.get("n_gen") == 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hetkv", default="build/tools/hetkv")
    ap.add_argument("--peer", required=True, help="directory of llama-bench, llama-batched-bench (CUDA)")
    ap.add_argument("-m", "--model", default="/tmp/llama31_8b_q40.gguf")
    ap.add_argument("--ctx", default="1024,8192,32768")
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--no-graphs-ctx", default="1024,8192",
                    help="contexts also run with --gpu-no-graphs (every op queued on its own, "
                    "engine hetkv-no-graphs): the A/B of the replayed decode step")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per command")
    ap.add_argument("--out", default="bench/out/peer-gpu")
    a = ap.parse_args()
    a.ctx = [int(x) for x in a.ctx.split(",")]
    a.batch = [int(x) for x in a.batch.split(",")]
    os.makedirs(a.out, exist_ok=True)
    log = os.path.join(a.out, "raw.txt")
    open(log, "w").close()
    if not os.path.exists(a.model):
        gen = os.path.join(HERE, "..", "tools", "scripts", "gen_tiny_gguf.py")
        if not run([sys.executable, gen, "--preset", "llama31_8b_q40", "-o", a.model], log, 600)[1]:
            sys.exit("could not write the model")
    rows = []
    ab = [int(x) for x in a.no_graphs_ctx.split(",") if x]
    for ctx in a.ctx:
        rows += hetkv_rows(a, ctx, log)
        if ctx in ab:
            rows += hetkv_rows(a, ctx, log, ["--gpu-no-graphs"], "hetkv-no-graphs")
        rows += batched_rows(a, ctx, log)
    pp = prefill_rows(a, log)
    for r in rows:   # llama.cpp's prefill from llama-bench where it ran
        if r["engine"] == "llama.cpp" and pp.get(r["ctx"]):
            r["prefill_tok_s"] = pp[r["ctx"]]
    with open(os.path.join(a.out, "peer_gpu.json"), "w") as f:
        json.dump({"model": os.path.basename(a.model), "rows": rows}, f, indent=1)

    def get(engine, ctx, b, k):
        for r in rows:
            if r["engine"] == engine and r["ctx"] == ctx and r["batch"] == b:
                return r[k]
        return None

    def fmt(x):
        return "–" if x is None else f"{x:,.1f}"

    def ratio(x, y):
        return "–" if x is None or not y else f"{x / y:.2f}x"

    lines = ["| ctx | batch | hetkv decode tok/s | llama.cpp decode tok/s | ratio | hetkv without "
             "graphs | graphs' gain | hetkv prefill tok/s | llama.cpp prefill tok/s | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for ctx in a.ctx:
        for b in a.batch:
            hd, ld = get("hetkv", ctx, b, "decode_tok_s"), get("llama.cpp", ctx, b, "decode_tok_s")
            hn = get("hetkv-no-graphs", ctx, b, "decode_tok_s")
            hp, lp = get("hetkv", ctx, b, "prefill_tok_s"), get("llama.cpp", ctx, b, "prefill_tok_s")
            lines.append(f"| {ctx} | {b} | {fmt(hd)} | {fmt(ld)} | {ratio(hd, ld)} | {fmt(hn)} | "
                         f"{ratio(hd, hn)} | {fmt(hp)} | {fmt(lp)} | {ratio(hp, lp)} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""hetkv batch throughput: one job of mixed-length requests built from real
text (the copyright files of the machine's Debian packages), run one request
at a time (--max-batch 1) and with continuous batching, per policy. Prints a
markdown table (bench/BATCH.md records one).

    python3 bench/batch_bench.py BUILD_DIR MODEL [--n 24] [--out-tokens 64]
        [--words 48,96,192,384,768] [--configs "1:full;8:full;8:ctkvr;8:snapkv"]

A configuration is MAXBATCH:POLICY (one process, --threads threads), or
mpiK:MAXBATCH:POLICY (mpirun -n K, dynamic hand-out, --threads / K threads
per rank) or shardK:MAXBATCH:POLICY (K processes at once, --shard I/K, the
static split, the same threads per process; wall = the slowest). With
--words 768,48 every other request is long: the static split then gives all
the long ones to one shard, which is what dynamic hand-out is for.
"""
import argparse
import glob
import shutil
import json
import os
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--n", type=int, default=24)
ap.add_argument("--out-tokens", type=int, default=64)
ap.add_argument("--words", default="48,96,192,384,768")
ap.add_argument("--configs", default="1:full;8:full;8:ctkvr;8:snapkv")
ap.add_argument("--threads", default="2")
a = ap.parse_args()

# One stream of words from every copyright file; request i reads its n words
# from its own offset, so prompts longer than any one file (6K tokens is
# ~4,500 words) are still real text, and no two requests share a prefix.
words = []
for p in sorted(glob.glob("/usr/share/doc/*/copyright")):
    try:
        with open(p, encoding="utf-8") as f:
            words += f.read().split()
    except (UnicodeDecodeError, OSError):
        continue
lens = [int(x) for x in a.words.split(",")]
if len(words) < 2 * max(lens):
    raise SystemExit(f"only {len(words)} words in /usr/share/doc/*/copyright, {2 * max(lens)} needed")
tmp = tempfile.mkdtemp(prefix="hkv_bbench_")
inp = os.path.join(tmp, "in.jsonl")
with open(inp, "w") as f:
    off = 0
    for i in range(a.n):
        n = lens[i % len(lens)]
        if off + n > len(words):
            off = 0
        body = {"messages": [{"role": "user", "content": "Summarise this license text:\n" +
                              " ".join(words[off:off + n])}],
                "max_tokens": a.out_tokens, "temperature": 0}
        f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": body}) + "\n")
        off += n

print(f"{a.n} chat requests, prompts of {a.words} words (+ template), max_tokens {a.out_tokens}, "
      f"--ignore-eos, {a.threads} threads\n")
print("| processes | max-batch | policy | wall s | requests/s | prompt tok/s | generated tok/s | "
      "mean decode batch |")
print("|---|---|---|---|---|---|---|---|")
hetkv = os.path.join(a.build, "tools", "hetkv")
for run_i, cfg in enumerate(a.configs.split(";")):
    parts = cfg.split(":")
    how, k = "one", 1
    if len(parts) == 3:
        how, k = parts[0].rstrip("0123456789"), int(parts[0].lstrip("mpishard"))
        parts = parts[1:]
    b, pol = parts
    threads = str(max(1, int(a.threads) // k))
    base = ["batch", "-m", a.model, "-i", inp, "-t", threads, "--max-batch", b, "--policy", pol,
            "--ignore-eos", "-q", "--json"]
    if how == "one":
        out = os.path.join(tmp, f"out{run_i}_{b}_{pol}.jsonl")
        p = subprocess.run([hetkv, *base, "-o", out], capture_output=True, text=True, check=True)
        s = json.loads(p.stdout)
        wall, n, pt, gt, mb = (s["wall_s"], s["answered"], s["prompt_tokens"], s["generated_tokens"],
                               s["mean_decode_batch"])
        label = "1"
    elif how == "mpi":
        if not shutil.which("mpirun"):
            raise SystemExit("mpirun is missing (openmpi-bin)")
        out = os.path.join(tmp, f"out{run_i}_mpi{k}_{b}_{pol}.jsonl")
        p = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-n", str(k), hetkv,
                            *base, "-o", out], capture_output=True, text=True, check=True)
        s = json.loads(p.stdout.strip().splitlines()[-1])
        wall, n, pt, gt, mb = (s["wall_s"], s["answered"], s["prompt_tokens"], s["generated_tokens"],
                               s["mean_decode_batch"])
        label = f"{k} ranks (MPI, dynamic: {s['answered_by_rank']})"
    else:   # static shards, all at once
        import time
        t0 = time.time()
        ps = [subprocess.Popen([hetkv, *base, "--shard", f"{i}/{k}", "-o",
                                os.path.join(tmp, f"out{run_i}_sh{k}_{i}_{b}_{pol}.jsonl")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in range(k)]
        outs = [json.loads(p.communicate()[0]) for p in ps]
        wall = time.time() - t0
        n = sum(o["answered"] for o in outs)
        pt = sum(o["prompt_tokens"] for o in outs)
        gt = sum(o["generated_tokens"] for o in outs)
        mb = sum(o["mean_decode_batch"] for o in outs) / k
        walls = "/".join(f"{o['wall_s']:.0f}" for o in outs)
        label = f"{k} shards (static: {[o['answered'] for o in outs]}, {walls} s)"
    print(f"| {label} | {b} | {pol} | {wall:.1f} | {n / wall:.3f} | {pt / wall:.1f} | {gt / wall:.1f} | "
          f"{mb:.2f} |", flush=True)

#!/usr/bin/env python3
"""hetkv batch throughput: one job of mixed-length requests built from real
text (the copyright files of the machine's Debian packages), run one request
at a time (--max-batch 1) and with continuous batching, per policy. Prints a
markdown table (bench/BATCH.md records one).

    python3 bench/batch_bench.py BUILD_DIR MODEL [--n 24] [--out-tokens 64]
        [--words 48,96,192,384,768] [--configs "1:full;8:full;8:ctkvr;8:snapkv"]
"""
import argparse
import glob
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

texts = []
for p in sorted(glob.glob("/usr/share/doc/*/copyright")):
    try:
        with open(p, encoding="utf-8") as f:
            w = f.read().split()
    except (UnicodeDecodeError, OSError):
        continue
    if len(w) >= 800:
        texts.append(w)
if not texts:
    raise SystemExit("no Debian copyright files with 800+ words under /usr/share/doc")
lens = [int(x) for x in a.words.split(",")]
tmp = tempfile.mkdtemp(prefix="hkv_bbench_")
inp = os.path.join(tmp, "in.jsonl")
with open(inp, "w") as f:
    for i in range(a.n):
        w = texts[i % len(texts)]
        n = lens[i % len(lens)]
        body = {"messages": [{"role": "user", "content": "Summarise this license text:\n" +
                              " ".join(w[:n])}],
                "max_tokens": a.out_tokens, "temperature": 0}
        f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": body}) + "\n")

print(f"{a.n} chat requests, prompts of {a.words} words (+ template), max_tokens {a.out_tokens}, "
      f"--ignore-eos, {a.threads} threads\n")
print("| max-batch | policy | wall s | requests/s | prompt tok/s | generated tok/s | mean decode batch |")
print("|---|---|---|---|---|---|---|")
for cfg in a.configs.split(";"):
    b, pol = cfg.split(":")
    out = os.path.join(tmp, f"out_{b}_{pol}.jsonl")
    cmd = [os.path.join(a.build, "tools", "hetkv"), "batch", "-m", a.model, "-i", inp, "-o", out,
           "-t", a.threads, "--max-batch", b, "--policy", pol, "--ignore-eos", "-q", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    s = json.loads(p.stdout)
    print(f"| {b} | {pol} | {s['wall_s']:.1f} | {s['requests_per_s']:.3f} | {s['prompt_tok_s']:.1f} | "
          f"{s['generated_tok_s']:.1f} | {s['mean_decode_batch']:.2f} |", flush=True)

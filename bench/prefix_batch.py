#!/usr/bin/env python3
"""Many questions over one document, as one `hetkv batch` job, with the
prefix cache off and on (issue 39): the whole job's wall time, the prompt
tokens prefilled, the KV's peak host bytes (near and far tiers), and whether
the answers are the same token for token. The document is real text (the
copyright files of the machine's Debian packages), the questions differ.

    python3 bench/prefix_batch.py BUILD_DIR MODEL [--n 64] [--words 1100]
        [--out-tokens 32] [--max-batch 64] [--policy full] [--chunk 256] [--only-on] [--out DIR]

Writes DIR/summary_{off,on}.json (batch --json), DIR/out_{off,on}.jsonl and
DIR/table.md, and prints the table.
"""
import argparse
import glob
import json
import os
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--n", type=int, default=64)
ap.add_argument("--words", type=int, default=1100)
ap.add_argument("--out-tokens", type=int, default=32)
ap.add_argument("--max-batch", type=int, default=64)
ap.add_argument("--policy", default="full")
ap.add_argument("--threads", default="2")
ap.add_argument("--ctx", type=int, default=8192)
ap.add_argument("--chunk", type=int, default=256)
ap.add_argument("--only-on", action="store_true", help="the run with the cache alone")
ap.add_argument("--out", default=None)
a = ap.parse_args()

words = []
for p in sorted(glob.glob("/usr/share/doc/*/copyright")):
    try:
        with open(p, errors="replace") as f:
            words += f.read().split()
    except OSError:
        pass
    if len(words) > a.words:
        break
doc = " ".join(words[:a.words])
topics = ["the license", "the authors", "warranty", "redistribution", "the year", "the source",
          "patents", "trademarks"]
reqs = []
for i in range(a.n):
    q = f"Question {i + 1}: in one sentence, what does the text above say about {topics[i % len(topics)]}?"
    reqs.append({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"messages": [{"role": "user", "content": doc + "\n\n" + q}],
                          "max_tokens": a.out_tokens, "temperature": 0}})
out_dir = a.out or tempfile.mkdtemp(prefix="hetkv-prefix-")
os.makedirs(out_dir, exist_ok=True)
inp = os.path.join(out_dir, "requests.jsonl")
with open(inp, "w") as f:
    for r in reqs:
        f.write(json.dumps(r) + "\n")

hetkv = os.path.join(a.build, "tools", "hetkv")
res = {}
for name, extra in (("off", []), ("on", ["--prefix-cache", "2"]))[1 if a.only_on else 0:]:
    out = os.path.join(out_dir, f"out_{name}.jsonl")
    if os.path.exists(out):
        os.remove(out)
    cmd = [hetkv, "batch", "-m", a.model, "-i", inp, "-o", out, "-q", "--json", "-t", a.threads,
           "--max-batch", str(a.max_batch), "-c", str(a.ctx), "--chunk", str(a.chunk), "--policy",
           a.policy, *extra]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr[-500:]}")
    summ = json.loads(p.stdout.strip().splitlines()[-1])
    if summ.get("errors"):
        raise SystemExit(f"{' '.join(cmd)}: {summ['errors']} requests failed (see {out})")
    with open(os.path.join(out_dir, f"summary_{name}.json"), "w") as f:
        json.dump({"command": cmd, "wall_s": wall, "summary": summ}, f, indent=1)
    toks, pre = {}, {}
    with open(out) as f:
        for line in f:
            o = json.loads(line)
            toks[o["custom_id"]] = o["hetkv"].get("tokens")
            pre[o["custom_id"]] = o["hetkv"].get("prefill_s", 0)
    res[name] = (wall, summ, toks, pre)

same = sum(res["off"][2][k] == res["on"][2].get(k) for k in res["off"][2]) if "off" in res else None
mib = 1 << 20
rows = ["| prefix cache | wall s | prompt tokens prefilled | prefill s | decode s | "
        "peak MiB: KV near / far, index |", "|---|---:|---:|---:|---:|---:|"]
for name in res:
    wall, s, _, _ = res[name]
    pc = s.get("prefix_cache", {})
    prefilled = s["prompt_tokens"] - pc.get("reused_tokens", 0)
    kv = s.get("kv_peak_bytes", {})
    rows.append(f"| {name} | {wall:.1f} | {prefilled:,} | {s['prefill_s']:.1f} | {s['decode_s']:.1f} | "
                f"{kv.get('near', 0) / mib:.0f} / {kv.get('far', 0) / mib:.0f}, "
                f"{kv.get('index', 0) / mib:.0f} |")
on = res["on"][1]
rows.append("")
vs = (f"{res['off'][0] / res['on'][0]:.1f}x faster with the cache; answers identical for {same} of "
      f"{a.n}" if "off" in res else "the cache's run alone")
rows.append(f"{a.n} requests, {on['prompt_tokens'] // a.n} prompt tokens each (one "
            f"{a.words}-word document + a question), {a.out_tokens} answer tokens, --max-batch "
            f"{a.max_batch}, --chunk {a.chunk}, policy {a.policy}, {a.threads} threads. Whole job: "
            f"{vs}; prefix cache {json.dumps(on.get('prefix_cache', {}))}.")
# a hit's prefill: starting from the prefix (fork_s, all hits) and its own suffix
pc = on.get("prefix_cache", {})
hits_pre = sorted(res["on"][3].values())[:-1] if a.n > 1 else []   # all but the first's
if pc.get("hits") and hits_pre:
    t_hits = sum(hits_pre)
    rows.append(f"A hit's prefill (median of the {len(hits_pre)} but the first request's): "
                f"{hits_pre[len(hits_pre) // 2] * 1e3:.0f} ms, of which starting from the kept "
                f"prefix {pc['fork_s'] / pc['hits'] * 1e3:.1f} ms on average; "
                f"(fork + suffix) / suffix = {t_hits / max(t_hits - pc['fork_s'], 1e-9):.2f} over "
                f"the hits; the first request's whole prompt {max(res['on'][3].values()):.2f} s.")
table = "\n".join(rows)
with open(os.path.join(out_dir, "table.md"), "w") as f:
    f.write(table + "\n")
print(table)
print(f"raw files: {out_dir}")

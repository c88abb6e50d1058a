#!/usr/bin/env python3
"""Load benchmark of hetkv serve (not a test): C concurrent streaming clients
on 127.0.0.1, each sending completion requests one after another until the
level's request bound or time bound is reached; per level: requests/s,
generated tokens/s, time to first token and inter-token latency at p50 and p99.
Beside them, the same prompts run as one `hetkv batch` job. Prints a markdown
table (docs/SERVE.md records one).

    python3 tools/scripts/serve_bench.py BUILD_DIR MODEL [--clients 1,8,32] [--requests 32]
        [--max-tokens 32] [--time-limit 120] [--max-batch 8] [--threads 2] [--no-batch]
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import tempfile
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("model")
ap.add_argument("--clients", default="1,8,32")
ap.add_argument("--requests", type=int, default=32, help="requests per level (bound)")
ap.add_argument("--time-limit", type=float, default=120, help="seconds per level (bound)")
ap.add_argument("--max-tokens", type=int, default=32)
ap.add_argument("--max-batch", type=int, default=8)
ap.add_argument("--threads", default="2")
ap.add_argument("--ctx", default="2048")
ap.add_argument("--no-batch", action="store_true", help="skip the hetkv batch baseline")
a = ap.parse_args()
hetkv = os.path.join(a.build, "tools", "hetkv")
src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

with open(os.path.join(src, "README.md"), encoding="utf-8") as f:
    WORDS = f.read().split()
# prompts of 24 to 192 words (about 40 to 300 tokens), fixed for every level
PROMPTS = [" ".join(WORDS[(53 * i) % 600:(53 * i) % 600 + [24, 48, 96, 192][i % 4]])
           for i in range(max(a.requests, 1))]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def start_server():
    p = subprocess.Popen([hetkv, "serve", "-m", a.model, "--port", "0", "-t", a.threads,
                          "--ctx", a.ctx, "--max-batch", str(a.max_batch), "--max-queue", "256"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"listening on http://[^ ]*:(\d+) ", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))
    raise SystemExit("the server did not start")


def one_request(port, prompt):
    """(ttft, [inter-token gaps], completion tokens) of one streamed completion."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]}")
    times, n_tok = [], 0
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        o = json.loads(line[6:])
        if o.get("usage"):
            n_tok = o["usage"]["completion_tokens"]
        if o["choices"] and o["choices"][0]["text"]:
            times.append(time.perf_counter())
    c.close()
    if not times:
        return None, [], n_tok
    return times[0] - t0, [b - x for x, b in zip(times, times[1:])], n_tok


def level(port, n_clients):
    lock = threading.Lock()
    nxt = [0]
    ttft, itl, toks, errors = [], [], [0], []
    t_end = time.perf_counter() + a.time_limit

    def client():
        while True:
            with lock:
                i = nxt[0]
                if i >= a.requests or time.perf_counter() > t_end:
                    return
                nxt[0] += 1
            try:
                f, gaps, n = one_request(port, PROMPTS[i % len(PROMPTS)])
            except Exception as e:   # noqa: BLE001 - counted and shown
                with lock:
                    errors.append(repr(e))
                continue
            with lock:
                if f is not None:
                    ttft.append(f)
                itl.extend(gaps)
                toks[0] += n

    t0 = time.perf_counter()
    ts = [threading.Thread(target=client) for _ in range(n_clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    el = time.perf_counter() - t0
    done = len(ttft)
    return (f"| serve | {n_clients} | {done} | {el:.1f} | {done / el:.2f} | {toks[0] / el:.1f} | "
            f"{pct(ttft, 50) * 1e3:.0f} | {pct(ttft, 99) * 1e3:.0f} | {pct(itl, 50) * 1e3:.0f} | "
            f"{pct(itl, 99) * 1e3:.0f} |" + (f" {len(errors)} errors: {errors[0]}" if errors else ""))


def batch_baseline():
    tmp = tempfile.mkdtemp(prefix="hkv_sbench_")
    inp, out = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        for i in range(a.requests):
            f.write(json.dumps({"custom_id": f"r{i}", "url": "/v1/completions", "body": {
                "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": a.max_tokens, "temperature": 0}}) + "\n")
    p = subprocess.run([hetkv, "batch", "-m", a.model, "-i", inp, "-o", out, "-t", a.threads, "--ctx",
                        a.ctx, "--max-batch", str(a.max_batch), "-q", "--json"],
                       capture_output=True, text=True, timeout=3600)
    if p.returncode:
        return f"| batch | - | - | - | - | - | | | | | failed: {p.stderr[-200:]}"
    s = json.loads(p.stdout)
    ttft = []
    with open(out, encoding="utf-8") as f:
        for line in f:
            ttft.append(json.loads(line)["hetkv"]["ttft_s"])
    return (f"| batch job | (all {a.requests} queued) | {s['answered']} | {s['wall_s']:.1f} | "
            f"{s['requests_per_s']:.2f} | {s['generated_tok_s']:.1f} | {pct(ttft, 50) * 1e3:.0f} | "
            f"{pct(ttft, 99) * 1e3:.0f} | | |")


srv, port = start_server()
rows = []
try:
    for n in [int(x) for x in a.clients.split(",")]:
        rows.append(level(port, n))
        print(rows[-1], flush=True)
finally:
    srv.terminate()
    srv.wait(60)
if not a.no_batch:
    rows.append(batch_baseline())
print(f"\n{a.requests} requests per level (bound {a.time_limit:.0f} s), prompts of 24-192 words, "
      f"max_tokens {a.max_tokens}, greedy, --max-batch {a.max_batch}, -t {a.threads}\n")
print("| mode | clients | requests | wall s | requests/s | generated tok/s | TTFT p50 ms | "
      "TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(r)

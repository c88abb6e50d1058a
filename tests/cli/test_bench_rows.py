#!/usr/bin/env python3
"""hetkv bench -o md|csv|json|jsonl: one self-describing row per measured
point, the same rows in every format (docs/BENCH_ROWS.md).

    python3 tests/cli/test_bench_rows.py BUILD_DIR
"""
import csv
import io
import json
import os
import subprocess
import sys

hetkv = os.path.join(sys.argv[1], "tools", "hetkv")
ARGS = ["bench", "--synthetic", "smollm2-135m@2", "--ctx", "512,1024", "--batch", "1,2", "--steps", "2",
        "--probe-mib", "64", "--local", "32", "--configs", "full;quest:budget=64", "-t", "2"]
KEYS = ["model", "model_file", "config", "spec", "policy", "budget", "ctx", "batch", "steps", "threads", "isa",
        "precision", "device", "commit", "date", "probe_gbs", "prefill_tok_s", "decode_tok_s", "step_ms",
        "bytes_per_step", "bytes_counted", "gbs", "frac_of_probe", "matmul_frac", "attn_frac", "vs_full", "ttft_s"]
fails = []


def out(fmt):
    p = subprocess.run([hetkv, *ARGS, "-o", fmt], capture_output=True, text=True, timeout=600)
    if p.returncode:
        fails.append(f"-o {fmt}: exit {p.returncode}: {p.stderr[-300:]}")
    return p.stdout


rows = [json.loads(l) for l in out("jsonl").splitlines()]
if len(rows) != 8:   # 2 contexts x 2 batches x 2 configs
    fails.append(f"jsonl: {len(rows)} rows, not 8")
for r in rows:
    missing = [k for k in KEYS if k not in r]
    if missing:
        fails.append(f"jsonl: row without {missing}")
        break
    if r["policy"] == "quest" and r["budget"] != 64:
        fails.append(f"jsonl: quest's budget {r['budget']}")
    if r["policy"] == "full" and not (r["bytes_per_step"] > 0 and r["budget"] is None):
        fails.append(f"jsonl: full's bytes {r['bytes_per_step']}, budget {r['budget']}")
    if r["policy"] == "quest" and not (r["vs_full"] and r["vs_full"] > 0):
        fails.append(f"jsonl: quest without vs_full: {r['vs_full']}")
    if not (r["decode_tok_s"] > 0 and r["device"] == "cpu" and r["commit"]):
        fails.append(f"jsonl: row {r}")
        break
# bytes counted by the cache on the host path: every policy's, and full's grow
# by exactly the rows one more context token adds (2 layers x 3 KV heads x K and
# V of 64 fp16 = 1536 bytes a token per batch row); quest reads less than full
byt = {(r["policy"], r["ctx"], r["batch"]): r["bytes_per_step"] for r in rows}
for b in (1, 2):
    grow = byt.get(("full", 1024, b), 0) - byt.get(("full", 512, b), 0)
    if abs(grow - b * 512 * 1536) > 0.01 * b * 512 * 1536:
        fails.append(f"bytes: full's grow by {grow} from context 512 to 1024 at batch {b}, "
                     f"not {b * 512 * 1536}")
    for ctx in (512, 1024):
        q, f = byt.get(("quest", ctx, b)), byt.get(("full", ctx, b))
        if not (q and f and q < f):
            fails.append(f"bytes: quest {q} against full {f} at context {ctx}, batch {b}")
if not all(r["bytes_counted"] for r in rows):
    fails.append("bytes: a host-path row not counted by the cache")
got = {(r["config"], r["ctx"], r["batch"]) for r in rows}
c = list(csv.DictReader(io.StringIO(out("csv"))))
if {(x["config"], int(x["ctx"]), int(x["batch"])) for x in c} != got or list(c[0].keys())[:len(KEYS)] != KEYS:
    fails.append(f"csv: rows or header differ: {list(c[0].keys()) if c else c}")
md = out("md").splitlines()
if len(md) != 2 + len(rows) or not md[0].startswith("| model | model_file |") or not md[1].startswith("|---|"):
    fails.append(f"md: {md[:2]}")
js = json.loads(out("json"))
if len(js.get("results", [])) != len(rows):
    fails.append("json: not the --json object")
# --budgets: a sweep axis crossed with the configs that take a budget and set none
b = subprocess.run([hetkv, "bench", "--synthetic", "smollm2-135m@2", "--ctx", "512", "--batch", "1",
                    "--steps", "2", "--probe-mib", "64", "--local", "32", "-t", "2", "--configs",
                    "full;quest;snapkv:budget=40", "--budgets", "2%,64", "-o", "jsonl"],
                   capture_output=True, text=True, timeout=600)
brows = [json.loads(l) for l in b.stdout.splitlines()]
want = [("full", None), ("quest", 10), ("quest", 64), ("snapkv", 40)]
if [(r["policy"], r["budget"]) for r in brows] != want:
    fails.append(f"--budgets: {[(r['policy'], r['budget']) for r in brows]}, not {want}: {b.stderr[-300:]}")
# --shared-prefix: the forks hold the prompt once (3 forks x 2 layers x 3 KV heads x 1024 rows x
# K and V of 128 bytes less), and full's cascade reads its pieces once a step
SP = ["bench", "--synthetic", "smollm2-135m@2", "--ctx", "1024", "--batch", "4", "--steps", "2",
      "--probe-mib", "64", "--local", "32", "-t", "2", "-o", "jsonl"]
sp = {}
for extra in ([], ["--shared-prefix"]):
    q = subprocess.run([hetkv, *SP, *extra], capture_output=True, text=True, timeout=600)
    r = [json.loads(l) for l in q.stdout.splitlines()]
    if q.returncode or len(r) != 1 or r[0]["shared_prefix"] != bool(extra):
        fails.append(f"--shared-prefix {extra}: exit {q.returncode}: {q.stderr[-300:]}")
    else:
        sp[bool(extra)] = r[0]
if len(sp) == 2:
    held = sp[False]["kv_host_bytes"] - sp[True]["kv_host_bytes"]
    if abs(held - 3 * 2 * 3 * 1024 * 128 * 2) > 1e-4 * held:
        fails.append(f"--shared-prefix: {held} fewer KV bytes held, not {3 * 2 * 3 * 1024 * 256}")
    if not sp[True]["host_bytes_per_step"] < 0.5 * sp[False]["host_bytes_per_step"]:
        fails.append(f"--shared-prefix: {sp[True]['host_bytes_per_step']} bytes read a step, "
                     f"{sp[False]['host_bytes_per_step']} unshared")
# the plain cache shares the prompt too (kv_plain.c's seq_share): the same bytes fewer
pl = {}
for extra in ([], ["--shared-prefix"]):
    q = subprocess.run([hetkv, *[a for a in SP if a not in ("--local", "32")], "--kv", "plain",
                        *extra], capture_output=True, text=True, timeout=600)
    r = [json.loads(l) for l in q.stdout.splitlines()] if q.returncode == 0 else []
    if len(r) != 1:
        fails.append(f"--kv plain {extra}: exit {q.returncode}: {q.stderr[-300:]}")
    else:
        pl[bool(extra)] = r[0]
if len(pl) == 2:   # (4 forks: the prompt's own sequence decodes in the batch only when tiered)
    held = pl[False]["kv_host_bytes"] - pl[True]["kv_host_bytes"]
    if abs(held - 4 * 2 * 3 * 1024 * 128 * 2) > 1e-4 * held:
        fails.append(f"--shared-prefix --kv plain: {held} fewer KV bytes held, not "
                     f"{4 * 2 * 3 * 1024 * 256}")
p = subprocess.run([hetkv, *ARGS, "-o", "xml"], capture_output=True, text=True)
if p.returncode != 2 or "unknown format 'xml'" not in p.stderr:
    fails.append(f"-o xml: exit {p.returncode}: {p.stderr}")
# hetkv plan -o: the --json rows flattened, the same keys in every row
PLAN = [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "24G,48G", "--ctx", "8192,32768",
        "--policy", "full,ctkvr"]
p = subprocess.run(PLAN + ["-o", "jsonl"], capture_output=True, text=True, timeout=120)
prow = [json.loads(l) for l in p.stdout.splitlines()] if p.returncode == 0 else []
if len(prow) != 8 or any(list(r.keys()) != list(prow[0].keys()) for r in prow) or \
        not all(r["model"].startswith("Llama-3-8B") and r["commit"] and r["max_batch"] >= 1 for r in prow):
    fails.append(f"plan -o jsonl: {len(prow)} rows (want 8 = 2 caps x 2 contexts x 2 policies): "
                 f"{p.stderr[-300:]}")
js = subprocess.run(PLAN + ["--json"], capture_output=True, text=True, timeout=120)
if prow and js.returncode == 0 and [r["max_batch"] for r in prow] != \
        [r["max_batch"] for r in json.loads(js.stdout)["rows"]]:
    fails.append("plan -o jsonl: max_batch differs from --json's rows")
if js.returncode == 0:
    # the weights as --device cuda holds them (q4 by default), not fp16: dense Llama-3-8B at
    # 32K fits 4 sequences under 24 GiB, as the H200 run's admission said (8 refused)
    jo = json.loads(js.stdout)
    dense = [r for r in jo["rows"] if r["config"] == "full" and r["ctx"] == 32768 and r["cap"] == 24 << 30]
    if jo.get("gpu_weights") != "q4" or not 4.6e9 < jo["gpu_weight_bytes"] < 5.1e9 or \
            [r["max_batch"] for r in dense] != [4]:
        fails.append(f"plan: weights {jo.get('gpu_weights')} {jo['gpu_weight_bytes']}, dense 32K "
                     f"at 24G {[r['max_batch'] for r in dense]} (want q4, ~4.7e9, [4])")
t = subprocess.run(PLAN + ["--host-mem", "1T"], capture_output=True, text=True, timeout=120)
if t.returncode != 0 or "(h: " in t.stdout:
    fails.append(f"plan --host-mem 1T: exit {t.returncode}, a host-bound note where no row is: {t.stdout[-300:]}")
c = list(csv.DictReader(io.StringIO(subprocess.run(PLAN + ["-o", "csv"], capture_output=True,
                                                   text=True, timeout=120).stdout)))
if len(c) != 8 or (prow and list(c[0].keys()) != list(prow[0].keys())):
    fails.append(f"plan -o csv: {len(c)} rows or another header")
for f in fails:
    print("FAIL", f)
print(f"test_bench_rows: {len(fails)} failures")
sys.exit(1 if fails else 0)

#!/usr/bin/env python3
"""hetkv eval end to end on a generated tiny model, and its errors.

The tiny model has random weights, so its task answers are noise; what is
checked is the machinery and the invariants every run must keep:
  - full against itself: KL 0, greedy agreement 1, recall 1, attention error 0;
  - oracle: recall 1 of its own top-k, and exactly k far tokens + the near
    tier attended per step and KV head;
  - ctkvr: recall in [0, 1], never more than its budget attended;
  - every task asked trials x turns questions of every configuration;
  - the JSON (stdout with --json, and --out FILE) holds the same object;
  - bad input fails before any work with a message naming the problem.
The corpus is /usr/share/common-licenses, present on every Debian system.

    python3 tests/eval/test_eval.py BUILD_DIR
"""
import csv
import io
import json
import os
import subprocess
import sys
import tempfile

build = sys.argv[1]
src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
hetkv = os.path.join(build, "tools", "hetkv")
corpus = "/usr/share/common-licenses"

passed = failed = 0


def check(ok, name, detail=""):
    global passed, failed
    print(("PASS" if ok else "FAIL"), name, "" if ok else detail)
    passed += bool(ok)
    failed += not ok


tmp = tempfile.mkdtemp()
model = os.path.join(tmp, "tiny.gguf")
gen = subprocess.run([sys.executable, os.path.join(src, "tools", "scripts", "gen_tiny_gguf.py"), "--preset",
                      "llama_gqa3_q41", "--ctx", "2048", "-o", model], capture_output=True, text=True)
if gen.returncode != 0 or not os.path.isdir(corpus):
    print("cannot generate the tiny model or no corpus:", gen.stderr[-300:])
    print("test_eval: 0 passed, 0 failed, 1 skipped")
    sys.exit(77)

NEAR = 4 + 32
base = [hetkv, "eval", "-m", model, "--corpus", corpus, "--local", "32", "-q"]
out_file = os.path.join(tmp, "eval.json")
r = subprocess.run(base + ["--ctx", "1024", "--cont", "16", "--task-ctx", "1024", "--trials", "2",
                           "--configs", "oracle:k=10%;ctkvr:rho_p=10%;ctkvr:rho_p=5%,dcu=0",
                           "--json", "--out", out_file], capture_output=True, text=True, timeout=600)
check(r.returncode == 0, "tiny run exits 0", r.stderr[-600:])
try:
    d = json.loads(r.stdout)
    with open(out_file) as f:
        d2 = json.load(f)
except (ValueError, OSError) as e:
    check(False, "JSON output", str(e))
    print(f"test_eval: {passed} passed, {failed} failed")
    sys.exit(1)
check(d == d2, "--out holds the same object as --json")
check(d["configs"][0] == "full", "full is added as the reference", d["configs"])
fid = d["fidelity"][0]["configs"]
full, oracle, ct, ct0 = fid
check(full["kl"] == 0 and full["greedy_agree"] == 1 and full["recall"] == 1 and full["rel_err"] < 1e-5,
      "full against itself", full)
check(oracle["label"] == "oracle k=102 (10%)" and oracle["budget"] == 102, "budget 10% of 1024", oracle)
check(oracle["recall"] == 1, "oracle recall of its own top-k is 1", oracle["recall"])
check(abs(oracle["attended_per_step"] - (102 + NEAR)) < 1e-6, "oracle attends k + near",
      oracle["attended_per_step"])
for c in (ct, ct0):
    check(0 <= c["recall"] <= 1 and c["attended_per_step"] <= c["budget"] + NEAR + 1e-6
          and c["kl"] >= 0 and 0 <= c["greedy_agree"] <= 1, "ctkvr bounds: " + c["label"], c)
check(ct0["label"] == "ctkvr rho_p=51 (5%) dcu=0", "label keeps the other arguments", ct0["label"])
check([t["task"] for t in d["tasks"]] == ["passkey", "needle", "multineedle", "multiturn"], "all tasks")
for t in d["tasks"]:
    turns = 3 if t["task"] == "multiturn" else 1
    check(len(t["configs"]) == 4 and all(c["questions"] == 2 * turns for c in t["configs"])
          and len(t["trial_log"]) == 2, "questions asked: " + t["task"])
check(d["memory"]["far"]["peak"] > 0 and d["memory"]["index"]["peak"] > 0, "memory per tier", d["memory"])

# fastkv prefills the prompt itself (token-selective propagation): without a cut (the prompt
# is shorter than tsp_len) and with one at tsp_len=300, each measured against full (its fork
# is its own prefill; decode attends the kept set, the near tier and the far tokens that
# arrived since, up to --cont 16); the multi-turn task continues a propagated prompt.
r = subprocess.run(base + ["--ctx", "1024", "--cont", "16", "--task-ctx", "1024", "--trials", "1",
                           "--tasks", "multiturn", "--json", "--configs",
                           "fastkv:budget=10%;fastkv:budget=10%,tsp_len=300"],
                   capture_output=True, text=True, timeout=600)
check(r.returncode == 0, "fastkv eval exits 0", r.stderr[-600:])
if r.returncode == 0:
    d = json.loads(r.stdout)
    _, fk, fk_tsp = d["fidelity"][0]["configs"]
    for c in (fk, fk_tsp):
        check(c["kl"] > 1e-6 and 0 <= c["recall"] <= 1 and 0 <= c["greedy_agree"] <= 1
              and c["attended_per_step"] <= c["budget"] + NEAR + 16, "fastkv bounds: " + c["label"], c)
    check(fk_tsp["label"] == "fastkv budget=102 (10%) tsp_len=300" and fk_tsp["kl"] != fk["kl"],
          "the cut changes the result", (fk["kl"], fk_tsp["kl"], fk_tsp["label"]))
    t = d["tasks"][0]
    check(len(t["configs"]) == 3 and all(c["questions"] == 3 for c in t["configs"]),
          "fastkv multi-turn questions asked", t["configs"])

# -o csv / jsonl: one row per (fidelity context or task and context, configuration), the
# same figures as the JSON object's, every row with the same keys
rows_args = base + ["--ctx", "1024", "--cont", "16", "--task-ctx", "1024", "--trials", "1",
                    "--tasks", "passkey", "--configs", "oracle:k=10%"]
r = subprocess.run(rows_args + ["-o", "jsonl"], capture_output=True, text=True, timeout=600)
rc = subprocess.run(rows_args + ["-o", "csv"], capture_output=True, text=True, timeout=600)
try:
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    crows = list(csv.DictReader(io.StringIO(rc.stdout)))
except ValueError as e:
    rows, crows = [], []
    check(False, "-o jsonl rows parse", str(e))
kinds = [(x["kind"], x["policy"]) for x in rows]
check(kinds == [("fidelity", "full"), ("fidelity", "oracle"), ("passkey", "full"), ("passkey", "oracle")],
      "-o jsonl: a row per (kind, configuration)", kinds)
if len(rows) == 4:
    check(all(list(x.keys()) == list(rows[0].keys()) for x in rows) and rows[1]["budget"] == 102
          and rows[1]["recall"] == 1 and rows[0]["kl"] == 0 and rows[2]["recall"] is None
          and rows[2]["total"] == 1 and rows[2]["accuracy"] in (0, 1) and rows[0]["commit"],
          "-o jsonl: the fields", rows)
check(len(crows) == 4 and list(crows[0].keys()) == list(rows[0].keys() if rows else []),
      "-o csv: the same rows and header", rc.stdout[:300])
r = subprocess.run(rows_args + ["-o", "csv", "--json"], capture_output=True, text=True, timeout=120)
check(r.returncode == 2 and "give one" in r.stderr, "-o csv with --json refused", r.stderr[-200:])

# --out FILE.jsonl: each part's rows appended as it ends; a run stopped after the fidelity part
# (its rows and a torn line left) resumes with the task part only; another sweep is refused
sweep_file = os.path.join(tmp, "sweep.jsonl")
r = subprocess.run(rows_args + ["--out", sweep_file, "-o", "jsonl"], capture_output=True, text=True,
                   timeout=600)
with open(sweep_file) as f:
    lines = f.read().splitlines()
def same_row(a, b):   # -o jsonl writes 6 significant digits, the file all of them
    return a.keys() == b.keys() and all(
        abs(a[k] - b[k]) <= 1e-5 * max(1, abs(b[k])) if isinstance(a[k], float) else a[k] == b[k]
        for k in a)


printed = [json.loads(x) for x in r.stdout.splitlines()]
check(r.returncode == 0 and len(lines) == 4 and len(printed) == 4
      and all(same_row(a, json.loads(b)) for a, b in zip(printed, lines)),
      "--out FILE.jsonl: the rows, as -o jsonl prints them", (r.returncode, len(lines)))
with open(sweep_file, "w") as f:   # stopped in the second part: its first row torn
    f.write("\n".join(lines[:2]) + "\n" + lines[2][:40])
r = subprocess.run(rows_args + ["--out", sweep_file, "-o", "jsonl"], capture_output=True, text=True,
                   timeout=600)
with open(sweep_file) as f:
    again = [json.loads(x) for x in f.read().splitlines()]   # the torn line cut, every line whole
kinds = [(x["kind"], x["policy"]) for x in again]
check(r.returncode == 0 and kinds == [("fidelity", "full"), ("fidelity", "oracle"), ("passkey", "full"),
                                      ("passkey", "oracle")] and len(r.stdout.splitlines()) == 4,
      "resumed: the fidelity part skipped, the task part run, every row once", (r.returncode, kinds))
r = subprocess.run(base + ["--ctx", "1024", "--cont", "16", "--tasks", "none", "--configs", "oracle:k=5%",
                           "--out", sweep_file], capture_output=True, text=True, timeout=600)
check(r.returncode == 1 and "another sweep" in r.stderr, "rows of another sweep refused", r.stderr[-200:])

small = os.path.join(tmp, "small.txt")
with open(small, "w") as f:
    f.write("A short text. " * 80)
M = ["-m", model, "--corpus", corpus, "--local", "32"]
errors = [
    ("unknown policy", ["--configs", "full;magic"], 2, "unknown policy 'magic'"),
    ("unknown key", ["--configs", "oracle:zz=1"], 2, "has no parameter 'zz'"),
    ("bad value", ["--configs", "ctkvr:dcu=3"], 2, "out of range"),
    ("bad share", ["--configs", "oracle:k=0%"], 2, "not a share"),
    ("share on a non-budget key", ["--configs", "ctkvr:Cp=5%"], 2, "only the budget"),
    ("single-policy options", ["--policy", "ctkvr"], 2, "do not apply"),
    ("unknown task", ["--tasks", "haystack"], 2, "unknown task 'haystack'"),
    ("nothing to run", ["--no-fidelity", "--tasks", "none"], 2, "nothing to run"),
    ("past the trained context", ["--ctx", "4096"], 1, "trained context of 2048"),
    ("context too short", ["--ctx", "256", "--tasks", "none"], 1, "too short"),
    ("budget above the far tier", ["--ctx", "1024", "--cont", "16", "--tasks", "none", "--configs",
                                   "oracle:k=2000"], 1, "larger than the far tier"),
    ("missing corpus", ["--corpus", "/nonexistent/text"], 1, "/nonexistent/text"),
    ("corpus too short", ["--corpus", small, "--ctx", "1024", "--tasks", "none"], 1, "corpus tokens"),
    ("missing model", ["-m", "/nonexistent/m.gguf"], 1, "/nonexistent/m.gguf"),
]
for name, extra, want, frag in errors:
    r = subprocess.run([hetkv, "eval", *M, *extra], capture_output=True, text=True, timeout=120)
    msg = r.stderr + r.stdout
    check(r.returncode == want and frag.lower() in msg.lower(), "error: " + name,
          f"(exit {r.returncode}) {msg[-300:]!r}")

print(f"test_eval: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

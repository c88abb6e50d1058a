#!/usr/bin/env python3
"""laq, speckv and specpc end to end on tiny random models, and seq_rewind.

    python3 tests/model/test_lookahead.py --bin-dir build/tools --rewind build/tests/model/test_rewind

With one real model here, speckv and specpc use the target itself as the
draft (--draft TARGET); a second tiny model with another vocabulary checks
the mismatch error. Cases:
  rewind     test_rewind (both KV backends: rewind after decode steps, after
             a prompt segment, into the prompt; logits equal to a run that
             never held the extra tokens);
  exact      hetkv run greedy with --local 5 --sink 3 (the lookahead wraps
             the ring several times, so the rewind restores it from the far
             rows) and budgets covering the context: laq, speckv and specpc
             print exactly full's tokens;
  small      small budgets run and print n tokens;
  bench/eval hetkv bench and hetkv eval (fidelity, one task) with the three
             policies; eval with budgets covering the far tier reproduces full
             (KL 0);
  errors     missing --draft, vocabulary mismatch, bad parameters.
Exit 0 all passed, 1 a failure."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "scripts"))

passed = failed = 0


def check(ok: bool, name: str, detail="") -> None:
    global passed, failed
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)
    passed += bool(ok)
    failed += not ok


def run(cmd, timeout=600):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="2"))


def tokens(out: str):
    dec = json.JSONDecoder()
    for i, ch in enumerate(out):
        if ch == "{":
            try:
                obj, _ = dec.raw_decode(out[i:])
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and "tokens" in obj:
                return obj
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--rewind", required=True, help="the test_rewind executable")
    a = ap.parse_args()
    import gen_tiny_gguf as gen

    hetkv = os.path.join(a.bin_dir, "hetkv")
    tmp = tempfile.mkdtemp()
    models = {}
    for name in ("llama_gqa3_q41", "qwen2_gqa3_hd128_q80", "llama_ropelin_q40"):
        models[name] = os.path.join(tmp, name + ".gguf")
        gen.write_model(gen.PRESETS[name], models[name], verbose=False)

    r = run([a.rewind, models["llama_gqa3_q41"]])
    print(r.stdout.rstrip())
    check(r.returncode == 0, "rewind (plain and tiered)", r.stdout[-400:] + r.stderr[-300:])

    prompt = ("The quick brown fox jumps over the lazy dog, and then it runs away into the "
              "forest where nobody can find it. ") * 2
    near = ["--local", "5", "--sink", "3"]
    for name in ("llama_gqa3_q41", "qwen2_gqa3_hd128_q80"):
        m = models[name]
        base = [hetkv, "run", "-m", m, "-p", prompt, "-n", "12", "--temp", "0", "--json",
                "--ignore-eos", *near]
        ref = run(base)
        rt = tokens(ref.stdout)
        check(ref.returncode == 0 and rt is not None, f"{name}: full runs", ref.stderr[-300:])
        if rt is None:
            continue
        n_prompt = len(rt["prompt_tokens"])
        exact = {
            "laq": ["--policy", "laq", "--policy-arg", "budget=100000"],
            "laq w2=0 L=20": ["--policy", "laq", "--policy-arg", "budget=100000", "--policy-arg",
                              "w2=0", "--policy-arg", "lookahead=20"],
            "speckv": ["--policy", "speckv", "--policy-arg", "budget=100000", "--draft", m],
            "specpc": ["--policy", "specpc", "--policy-arg", f"C={n_prompt}", "--draft", m],
        }
        for label, extra in exact.items():
            p = run(base + extra)
            t = tokens(p.stdout)
            ok = p.returncode == 0 and t is not None and t["tokens"] == rt["tokens"]
            check(ok, f"{name}: {label} with a budget covering the context = full's tokens",
                  (t or {}).get("tokens", p.stderr[-300:]))
        small = {
            "laq budget=2": ["--policy", "laq", "--policy-arg", "budget=2"],
            "speckv budget=2 lookahead=3": ["--policy", "speckv", "--policy-arg", "budget=2",
                                            "--policy-arg", "lookahead=3", "--draft", m],
            "specpc C=12": ["--policy", "specpc", "--policy-arg", "C=12", "--policy-arg", "window=4",
                            "--policy-arg", "kernel=3", "--policy-arg", "neighbors=3",
                            "--policy-arg", "skip_layers=1", "--draft", m],
        }
        for label, extra in small.items():
            p = run(base + extra)
            t = tokens(p.stdout)
            check(p.returncode == 0 and t is not None and len(t["tokens"]) == 12,
                  f"{name}: {label} runs", p.stderr[-300:])
            if label.startswith("spec") and t is not None:
                check("draft_memory" in t and t["draft_memory"]["weights"] > 0,
                      f"{name}: {label} reports the draft's memory", t.keys())

    m = models["llama_gqa3_q41"]
    # bench: every policy on the same prefilled prompt
    p = run([hetkv, "bench", "-m", m, "--ctx", "96", "--batch", "1,2", "--steps", "3", "--probe-mib", "16",
             "--configs", "full;laq:budget=16;speckv:budget=16;specpc:C=48,skip_layers=1", "--draft", m, *near],
            timeout=600)
    check(p.returncode == 0 and all(s in p.stdout + p.stderr for s in ("laq", "speckv", "specpc")),
          "bench with laq, speckv, specpc", p.stdout[-400:] + p.stderr[-400:])

    # eval: fidelity + a task; budgets covering the far tier (1024 - 16 continuation - 36 near
    # = 972 tokens) reproduce full
    corpus = "/usr/share/common-licenses"
    if os.path.isdir(corpus):
        em = os.path.join(tmp, "tiny2k.gguf")
        g = run([sys.executable, os.path.join(ROOT, "tools", "scripts", "gen_tiny_gguf.py"), "--preset",
                 "llama_gqa3_q41", "--ctx", "2048", "-o", em])
        ev = [hetkv, "eval", "-m", em, "--corpus", corpus, "--local", "32", "-q", "--draft", em, "--json"]
        p = run(ev + ["--ctx", "1024", "--cont", "16", "--tasks", "none", "--configs",
                      "laq:budget=972;speckv:budget=972;laq:budget=10%;speckv:budget=10%;"
                      "specpc:C=25%,skip_layers=1"], timeout=900)
        try:
            fid = json.loads(p.stdout)["fidelity"][0]["configs"]
            check(p.returncode == 0 and len(fid) == 6, "eval fidelity runs laq, speckv, specpc",
                  [c["label"] for c in fid])
            for c in fid[1:3]:
                check(c["kl"] < 1e-9 and c["greedy_agree"] == 1, f"eval {c['label']}: = full", c)
            for c in fid[3:]:
                check(c["kl"] >= 0 and 0 <= c["greedy_agree"] <= 1, f"eval {c['label']}: bounds", c)
        except (ValueError, KeyError, IndexError) as e:
            check(False, "eval fidelity JSON", f"{e}: {p.stderr[-500:]}")
        p = run(ev + ["--no-fidelity", "--task-ctx", "1024", "--trials", "1", "--tasks", "passkey",
                      "--configs", "laq:budget=10%;speckv:budget=10%;specpc:C=25%,skip_layers=1"],
                timeout=900)
        try:
            t = json.loads(p.stdout)["tasks"][0]
            check(p.returncode == 0 and len(t["configs"]) == 4 and
                  all(c["questions"] == 1 for c in t["configs"]), "eval task with laq, speckv, specpc",
                  t["configs"])
        except (ValueError, KeyError, IndexError) as e:
            check(False, "eval task JSON", f"{e}: {p.stderr[-500:]}")

    prompt_args = ["-p", "hello world", "-n", "2"]
    errors = [
        ("speckv without --draft", ["--policy", "speckv"], "needs --draft"),
        ("specpc without --draft", ["--policy", "specpc"], "needs --draft"),
        ("draft with another vocabulary", ["--policy", "speckv", "--draft", models["llama_ropelin_q40"]],
         "vocabulary"),
        ("missing draft file", ["--policy", "speckv", "--draft", "/nonexistent/d.gguf"], "/nonexistent/d.gguf"),
        ("--kv plain with --draft", ["--kv", "plain", "--draft", m], "draft"),
        ("laq even kernel", ["--policy", "laq", "--policy-arg", "kernel=4"], "kernel"),
        ("laq lookahead 0", ["--policy", "laq", "--policy-arg", "lookahead=0"], "lookahead"),
        ("speckv window -1", ["--policy", "speckv", "--policy-arg", "window=-1", "--draft", m], "window"),
        ("specpc C=0", ["--policy", "specpc", "--policy-arg", "C=0", "--draft", m], "C=0"),
        ("specpc skip_layers past the draft", ["--policy", "specpc", "--policy-arg", "C=2",
                                               "--policy-arg", "skip_layers=99", "--draft", m], "skip_layers"),
    ]
    for label, extra, frag in errors:
        p = run([hetkv, "run", "-m", m, *prompt_args, *extra])
        check(p.returncode != 0 and frag in p.stderr and "Segmentation" not in p.stderr,
              f"error: {label}", f"rc {p.returncode}: {p.stderr[-300:]}")

    print(f"test_lookahead: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

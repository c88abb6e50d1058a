#!/usr/bin/env python3
"""Per-sequence placement (--policy auto with --device cuda, tools/cli/cli_device.c
and runtime/scheduler.c): when the batch does not fit the device whole, as many
sequences at a time as fit beside the split keep their whole KV on the device
(full, pipeline/cuda_resident.c), the others run ctkvr in the split. On a tiny
generated model, 6 requests through `hetkv batch --max-batch 4` (so that later
requests arrive as earlier ones finish), context 512, --local 8:

  split     a cap for the split alone: every line "split", ctkvr;
  some      a cap for the split and 2 whole sequences, --split-overflow: stderr
            says "up to 2 of the 4", the job's placement says how many ran
            where, every "device" line ran full and every "split" line ctkvr, at
            least 2 on the device;
  waits     the same cap without --split-overflow (the default): a request
            that fits a slot waits for one, so all 6 run on the device, 2 at a
            time, none in the split, and the job counts the ones that waited;
  all       room for 4: every request on the device;
  given     --gpu-resident 1 under auto, --split-overflow: one at a time;
            (these five with --gpu-resident-rows at a whole context, 502 far rows)
  sized     no --gpu-resident-rows, a cap for the split and 4 slots of what the
            job's longest request needs: the slots are sized from the job's
            requests (stderr names the size), 4 at a time, all 6 on the device
            (whole-context slots admit 1 at that cap);
  rows100   --gpu-resident-rows 100: the two requests that need more than 100
            far rows run ctkvr, never a slot they would outgrow, no fallbacks
            (the others wait for a slot);
  tokens    each request's greedy tokens are the CPU path's under the policy its
            line names (batch invariance: the CPU runs each group alone);
  refused   --gpu-resident without --device cuda is refused by name;
  run       hetkv run without -c plans the context the run needs (prompt + -n),
            not the model's trained one: at the split's cap (split case) 4
            completions of a short prompt run dense (every row near), the CPU
            path's tokens; -c 512 at that cap is refused, as the run without
            -c was when it was planned at the model's 512 rows;
  bench     hetkv bench --policy auto places its batch as batch does: under a
            cap for the split and 2 whole sequences, 2 of the 4 forks run full
            on the device (rows: config auto, resident_seqs 2; the timeline's
            device_resident_rows counts 2 a layer and step), the rest ctkvr;
            with room for everything and no --local, full dense.

    python3 tests/pipeline/test_placement.py --bin-dir build-emu/tools
Exit 77 without a CUDA device (a GPU or the emulator)."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "scripts"))
import gen_tiny_gguf as gen  # noqa: E402
from device_checks import Checks, need_device  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin-dir", required=True)
a = ap.parse_args()
hetkv = os.path.join(a.bin_dir, "hetkv")
need_device(hetkv)
check = Checks()


CTX, NEAR = 512, ["--sink", "2", "--local", "8"]
with tempfile.TemporaryDirectory() as tmp:
    preset = gen.PRESETS["llama_gqa3_q41"]
    model = os.path.join(tmp, "tiny.gguf")
    gen.write_model(preset, model, verbose=False)
    inp = os.path.join(tmp, "in.jsonl")
    reqs = {}
    with open(inp, "w") as f:
        for i in range(6):
            p = "Once upon a time there was a small model that read about the sea. " * (i % 3 + 1)
            reqs[f"r{i}"] = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": p, "max_tokens": 6 + 2 * i, "temperature": 0}}
            f.write(json.dumps(reqs[f"r{i}"]) + "\n")

    def batch(ids, *extra):
        src = inp
        if ids is not None:
            src = os.path.join(tmp, "sub.jsonl")
            with open(src, "w") as f:
                for i in ids:
                    f.write(json.dumps(reqs[i]) + "\n")
        out = os.path.join(tmp, "out.jsonl")
        if os.path.exists(out):
            os.remove(out)
        p = subprocess.run([hetkv, "batch", "-m", model, "-i", src, "-o", out, "-c", str(CTX),
                            "--max-batch", "4", "-t", "2", "-q", "--json", "--no-mpi", *NEAR,
                            *extra], capture_output=True, text=True, timeout=900)
        lines = {}
        if os.path.exists(out):
            for l in open(out):
                o = json.loads(l)
                usage = ((o.get("response") or {}).get("body") or {}).get("usage", {})
                lines[o["custom_id"]] = dict(o["hetkv"], prompt_tokens=usage.get("prompt_tokens"))
        summ = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else {}
        return p, lines, summ

    # the split's own plan, from the refusal of a cap too small for it
    p, _, _ = batch(None, "--device", "cuda", "--gpu-mem", "1M")
    m = re.search(r"with policy ctkvr needs ([0-9.]+) MiB", p.stderr)
    check(p.returncode == 1 and m, "the split's plan named in a refusal", p.stderr.strip()[-300:])
    if not m:
        sys.exit(1)
    base = float(m.group(1)) * 2**20
    # one whole sequence: K and V of the far rows, every layer and KV head, fp16
    row = preset.layers * preset.kv_heads * preset.head_dim * 4
    seq = (CTX - 10) * row
    whole = ["--gpu-resident-rows", str(CTX - 10)]

    def cap(n, per=seq):
        return f"{int((base + n * per + per // 2) / 1024)}K"

    # what the job's requests need (prompt + answer + 1, less the 10 near rows),
    # from the tokens a CPU run reports
    _, cpu, _ = batch(None, "--policy", "full")
    need = {i: h["prompt_tokens"] + reqs[i]["body"]["max_tokens"] + 1 - 10 for i, h in cpu.items()}
    longest = max(need.values()) if need else 0
    check(len(need) == 6 and longest < (CTX - 10) // 2, "the job's far rows", need)

    runs = {}
    for name, extra in (("split", ["--gpu-mem", cap(0)] + whole),
                        ("some", ["--gpu-mem", cap(2), "--split-overflow"] + whole),
                        ("waits", ["--gpu-mem", cap(2)] + whole),
                        ("all", ["--gpu-mem", cap(4)] + whole),
                        ("given", ["--gpu-mem", cap(4), "--gpu-resident", "1", "--split-overflow"] + whole),
                        ("sized", ["--gpu-mem", cap(4, longest * row)]),
                        ("rows100", ["--gpu-mem", cap(4), "--gpu-resident-rows", "100"])):
        p, lines, summ = batch(None, "--device", "cuda", *extra)
        runs[name] = (lines, summ)
        pl = summ.get("placement", {})
        dev = sorted(i for i, h in lines.items() if h.get("placement") == "device")
        consistent = all((h.get("placement") == "device") == (h["policy"] == "full") and
                         h["policy"] in ("full", "ctkvr") for h in lines.values())
        ok = p.returncode == 0 and len(lines) == 6 and consistent
        if name == "split":
            ok = ok and not dev and "placement" not in summ and "keep their whole KV" not in p.stderr
        else:
            want = {"some": 2, "waits": 2, "all": 4, "given": 1, "sized": 4, "rows100": 4}[name]
            ok = ok and pl.get("resident_max") == want and pl.get("device") == len(dev)
            if name == "rows100":   # exactly the requests that fit 100 far rows
                ok = ok and dev == sorted(i for i in need if need[i] <= 100) and len(dev) < 6
            else:
                ok = ok and (len(dev) == 6 if name in ("all", "sized", "waits") else want <= len(dev) < 6)
            if name == "waits":   # 4 admitted at a time, 2 slots: the rest waited
                ok = ok and pl.get("split") == 0 and pl.get("waited", 0) >= 2 and "wait for a slot" in p.stderr
            if name in ("some", "given"):
                ok = ok and pl.get("waited") == 0
            if name != "given":
                ok = ok and f"up to {want} of the 4 sequences" in p.stderr
            if name == "sized":
                ok = ok and f"in slots of {longest} far rows, what the job's longest" in p.stderr
            # the placed requests attended their far tiers on the device, none fell back
            tl = summ.get("device", {}).get("timeline", {})
            ok = ok and tl.get("device_resident_rows", 0) > 0 and tl.get("fallbacks_total") == 0
            pl = dict(pl, resident_rows=tl.get("device_resident_rows"),
                      fallbacks=tl.get("fallbacks_total"))
        check(ok, f"{name}: placement", f"device {dev}, job {pl}, exit {p.returncode} "
              f"{p.stderr.strip()[-300:] if p.returncode else ''}")

    # the CPU path's tokens, each group under the policy its lines name
    # whole-context slots at the sized run's cap: one at a time
    p, _, summ = batch(None, "--device", "cuda", "--gpu-mem", cap(4, longest * row), *whole)
    check(p.returncode == 0 and summ.get("placement", {}).get("resident_max") == 1,
          "whole-context slots at the sized run's cap: 1 at a time", summ.get("placement"))
    for name in ("some", "waits", "given", "rows100"):
        lines = runs[name][0]
        for pol in ("full", "ctkvr"):
            ids = sorted(i for i, h in lines.items() if h["policy"] == pol)
            if not ids:
                continue
            _, ref, _ = batch(ids, "--policy", pol)
            same = all(ref.get(i, {}).get("tokens") == lines[i]["tokens"] for i in ids)
            check(same, f"{name}: {pol} requests give the CPU path's tokens",
                  {i: (lines[i]["tokens"], ref.get(i, {}).get("tokens")) for i in ids if
                   ref.get(i, {}).get("tokens") != lines[i]["tokens"]})
    # run without -c: the plan at what the run needs
    def run(*extra):
        p = subprocess.run([hetkv, "run", "-m", model, "-p", "Once upon a time", "-n", "6", "-b", "4",
                            "--temp", "0", "-t", "2", "--json", *extra], capture_output=True, text=True,
                           timeout=600)
        return p, (json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else {})
    p, dev = run("--device", "cuda", "--gpu-mem", cap(0))
    _, cpu = run("--policy", "full")
    check(dev.get("policy") == "full" and "auto -> ctkvr" not in p.stderr and
          dev.get("near_rows", 0) >= len(dev.get("prompt_tokens", [])) + 7 and
          dev.get("tokens") and dev.get("tokens") == cpu.get("tokens"),
          "run without -c: planned at its own rows, dense, the CPU path's tokens",
          f"exit {p.returncode} {dev.get('policy')} {dev.get('tokens')} {cpu.get('tokens')} "
          f"{p.stderr.strip()[-200:]}")
    p, _ = run("--device", "cuda", "--gpu-mem", cap(0), "-c", str(CTX))
    check(p.returncode == 1 and "auto -> ctkvr" in p.stderr, "run -c 512 at that cap: the split's plan",
          p.stderr.strip()[-200:])

    # bench --policy auto: the split's plan at batch 4, then 2 whole sequences beside it
    def bench(*extra):
        return subprocess.run([hetkv, "bench", "-m", model, "--device", "cuda", "--policy", "auto",
                               "--ctx", str(CTX - 12), "--batch", "4", "--steps", "2", "--probe-mib",
                               "16", "-t", "2", *extra], capture_output=True, text=True, timeout=900)
    p = bench("--gpu-mem", "1M", *NEAR)
    m = re.search(r"with policy ctkvr needs ([0-9.]+) MiB", p.stderr)
    check(p.returncode == 1 and m, "bench: the split's plan named in a refusal", p.stderr.strip()[-300:])
    if m:
        bbase = float(m.group(1)) * 2**20
        p = bench("--gpu-mem", f"{int((bbase + 2 * seq + seq // 2) / 1024)}K", *NEAR, "--json")
        res = json.loads(p.stdout)["results"] if p.returncode == 0 and p.stdout.strip() else []
        tl = res[0].get("timeline", {}) if res else {}
        ok = (len(res) == 1 and res[0]["config"] == "auto" and
              "up to 2 of the 4 sequences" in p.stderr and
              tl.get("device_resident_rows") == 2 * 2 * preset.layers and tl.get("fallbacks_total") == 0)
        check(ok, "bench --policy auto: 2 of 4 whole on the device, 2 under ctkvr",
              f"exit {p.returncode} {res and res[0].get('config')} {tl.get('device_resident_rows')} "
              f"{p.stderr.strip()[-300:]}")
        p = bench("--gpu-mem", f"{int((bbase + 2 * seq + seq // 2) / 1024)}K", *NEAR, "-o", "jsonl")
        rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        check(p.returncode == 0 and len(rows) == 1 and rows[0]["resident_seqs"] == 2 and
              rows[0]["policy"] == "ctkvr" and rows[0]["config"] == "auto",
              "bench --policy auto rows: resident_seqs 2, the split's policy",
              rows and {k: rows[0][k] for k in ("config", "policy", "resident_seqs")})
    p = bench("--gpu-mem", "2G", "-o", "jsonl")
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    check(p.returncode == 0 and len(rows) == 1 and rows[0]["policy"] == "full" and
          rows[0]["resident_seqs"] == 0 and "near tier holds the whole context" in p.stderr,
          "bench --policy auto with room: full, dense", rows and rows[0].get("policy"))
    p = subprocess.run([hetkv, "run", "-m", model, "-p", "x", "--gpu-resident", "2"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 1 and "--gpu-resident and its -chunk, -rows and -prefixes keep sequences on the GPU"
          in p.stderr, "--gpu-resident without --device cuda refused", p.stderr.strip())
check.done("test_placement")

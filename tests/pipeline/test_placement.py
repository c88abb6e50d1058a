#!/usr/bin/env python3
"""Per-sequence placement (--policy auto with --device cuda, tools/cli/cli_device.c
and runtime/scheduler.c): when the batch does not fit the device whole, as many
sequences at a time as fit beside the split keep their whole KV on the device
(full, pipeline/cuda_resident.c), the others run ctkvr in the split. On a tiny
generated model, 6 requests through `hetkv batch --max-batch 4` (so that later
requests arrive as earlier ones finish), context 512, --local 8:

  split     a cap for the split alone: every line "split", ctkvr;
  some      a cap for the split and 2 whole sequences: stderr says "up to 2 of
            the 4", the job's placement says how many ran where, every "device"
            line ran full and every "split" line ctkvr, at least 2 on the device;
  all       room for 4: every request on the device;
  given     --gpu-resident 1 under auto: one at a time;
  tokens    each request's greedy tokens are the CPU path's under the policy its
            line names (batch invariance: the CPU runs each group alone);
  refused   --gpu-resident without --device cuda is refused by name.

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
                lines[o["custom_id"]] = o["hetkv"]
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
    seq = (CTX - 10) * preset.layers * preset.kv_heads * preset.head_dim * 4

    def cap(n):
        return f"{int((base + n * seq + seq // 2) / 1024)}K"

    runs = {}
    for name, extra in (("split", ["--gpu-mem", cap(0)]), ("some", ["--gpu-mem", cap(2)]),
                        ("all", ["--gpu-mem", cap(4)]),
                        ("given", ["--gpu-mem", cap(4), "--gpu-resident", "1"])):
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
            want = {"some": 2, "all": 4, "given": 1}[name]
            ok = ok and pl.get("resident_max") == want and pl.get("device") == len(dev)
            ok = ok and (len(dev) == 6 if name == "all" else want <= len(dev) < 6)
            if name != "given":
                ok = ok and f"up to {want} of the 4 sequences" in p.stderr
            # the placed requests attended their far tiers on the device, none fell back
            tl = summ.get("device", {}).get("timeline", {})
            ok = ok and tl.get("device_resident_rows", 0) > 0 and tl.get("fallbacks_total") == 0
            pl = dict(pl, resident_rows=tl.get("device_resident_rows"),
                      fallbacks=tl.get("fallbacks_total"))
        check(ok, f"{name}: placement", f"device {dev}, job {pl}, exit {p.returncode} "
              f"{p.stderr.strip()[-300:] if p.returncode else ''}")

    # the CPU path's tokens, each group under the policy its lines name
    for name in ("some", "given"):
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
    p = subprocess.run([hetkv, "run", "-m", model, "-p", "x", "--gpu-resident", "2"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 1 and "--gpu-resident and its -chunk, -rows and -prefixes keep sequences on the GPU"
          in p.stderr, "--gpu-resident without --device cuda refused", p.stderr.strip())
check.done("test_placement")

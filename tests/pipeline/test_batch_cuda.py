#!/usr/bin/env python3
"""hetkv batch --device cuda (the scheduler's continuous batching through the
CPU-GPU pipeline, ctkvr with a tiny near tier) on a tiny generated model:
every request answered, and greedy outputs identical with --max-batch 1 and
--max-batch 10 (batch invariance on the device: the decode products go
through the GEMV, whose per-row sums do not depend on the batch); then
policy full without --local, which puts the whole context in the device's
near tier: the outputs of the CPU path.

    python3 tests/pipeline/test_batch_cuda.py --bin-dir build-emu/tools

Exit 0 passed, 1 failed, 77 no CUDA device usable.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "scripts"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    a = ap.parse_args()
    hetkv = os.path.join(a.bin_dir, "hetkv")
    info = subprocess.run([hetkv, "info", "--json"], capture_output=True, text=True)
    try:
        if json.loads(info.stdout).get("cuda", {}).get("backend", "none") == "none":
            print("skipped: this hetkv has no CUDA backend")
            return 77
    except ValueError:
        print("skipped: hetkv info --json gave no JSON")
        return 77
    import gen_tiny_gguf as gen
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        gen.write_model(gen.PRESETS["llama_gqa3_q41"], model, verbose=False)
        inp = os.path.join(tmp, "in.jsonl")
        with open(inp, "w") as f:
            for i in range(10):   # prompts of different lengths, so sequences join and leave
                body = {"prompt": f"the cat {i} sat. " * (i % 3 + 2), "max_tokens": 6 + i % 4,
                        "temperature": 0}
                f.write(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                    "url": "/v1/completions", "body": body}) + "\n")
        outs = {}
        for mb in (1, 10):
            out = os.path.join(tmp, f"out{mb}.jsonl")
            p = subprocess.run([hetkv, "batch", "-m", model, "-i", inp, "-o", out, "--max-batch",
                                str(mb), "--device", "cuda", "-q", "--sink", "2", "--local", "6",
                                "--policy", "ctkvr"], capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                print(f"FAIL --max-batch {mb}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
                return 1
            rows = [json.loads(line) for line in open(out)]
            outs[mb] = {r["custom_id"]: r["response"]["body"]["choices"][0]["text"] for r in rows
                        if r.get("response") and r["response"].get("status_code") == 200}
            if len(outs[mb]) != 10:
                print(f"FAIL --max-batch {mb}: {len(outs[mb])} of 10 requests answered")
                return 1
        diff = [k for k in outs[1] if outs[1][k] != outs[10][k]]
        if diff:
            print(f"FAIL outputs differ between --max-batch 1 and 10 for {diff}")
            return 1
        print("ok   10 requests through the pipeline, --max-batch 1 and 10 identical")
        # policy full without --local: the whole context near, attention on the
        # device alone; the same greedy outputs as the CPU path
        full = {}
        for dev in ("cuda", "cpu"):
            out = os.path.join(tmp, f"full_{dev}.jsonl")
            p = subprocess.run([hetkv, "batch", "-m", model, "-i", inp, "-o", out, "--max-batch", "10",
                                "--device", dev, "-q", "--policy", "full", "-c", "600"],
                               capture_output=True, text=True, timeout=900)
            if p.returncode != 0:
                print(f"FAIL full --device {dev}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
                return 1
            near_all = "near tier holds the whole context" in p.stderr
            if near_all != (dev == "cuda"):
                print(f"FAIL full --device {dev}: whole-context near tier {near_all}: {p.stderr[-300:]}")
                return 1
            rows = [json.loads(line) for line in open(out)]
            full[dev] = {r["custom_id"]: r["response"]["body"]["choices"][0]["text"] for r in rows
                         if r.get("response") and r["response"].get("status_code") == 200}
        diff = [k for k in full["cpu"] if full["cpu"][k] != full["cuda"].get(k)]
        if len(full["cpu"]) != 10 or diff:
            print(f"FAIL full, whole context near: {len(full['cpu'])} answered, differ from the CPU "
                  f"path for {diff}")
            return 1
        print("ok   full with the whole context near: the CPU path's outputs")
        # --gpu-profile: every op timed; together they are the calls' device time
        p = subprocess.run([hetkv, "bench", "-m", model, "--device", "cuda", "--ctx", "64",
                            "--batch", "2", "--steps", "2", "--local", "16", "--gpu-profile",
                            "--json"], capture_output=True, text=True, timeout=900)
        try:
            tl = json.loads(p.stdout)["results"][0]["timeline"]
            ops, total = tl["ops"], tl["device_total_s"]
        except (ValueError, KeyError, IndexError) as e:
            print(f"FAIL bench --gpu-profile: no ops in the timeline ({e}): {p.stderr[-300:]}")
            return 1
        want = {"embed", "rmsnorm", "qkv", "wo", "ffn_in", "down", "head", "rope", "attention",
                "swiglu", "add", "copy"}
        if set(ops) != want or not all(ops[k] > 0 for k in want - {"copy"}) or \
                abs(sum(ops.values()) - total) > 0.05 * total:
            print(f"FAIL bench --gpu-profile: ops {ops} against a device total of {total}")
            return 1
        print(f"ok   --gpu-profile: {len(ops)} ops, {sum(ops.values()):.3f} s of {total:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

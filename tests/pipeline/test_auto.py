#!/usr/bin/env python3
"""--policy auto, the default with --device cuda (tools/cli/cli_device.c): the
whole KV on the device (full, dense) when the plan admits the batch x context
under the cap, else ctkvr in the split. On SmolLM2, 2 sequences at 4K:

  fits      --gpu-mem 3G: full with the near tier holding the whole context,
            and the greedy tokens the CPU path's under full;
  split     --gpu-mem 300M (weights and the split fit, the whole KV not): ctkvr
            with the default near tier, the CPU path's tokens under ctkvr;
  named     --policy full there is refused by the plan, naming the bytes;
  batch     hetkv batch with no --policy: ctkvr picked for the job, its two short
            requests placed on the device in slots sized from the job (full);
  refused   --policy auto with --policy-arg is refused by name;
  chunk     run's prompt chunk: 256 at 4K; at 16K with --device cuda 2048 where
            the device has room (--gpu-mem 500M: ctkvr, the CPU path's tokens
            at the same chunk), 256 where it has not (300M); --chunk N on the
            CPU path gives its tokens at N and says N.

    python3 tests/pipeline/test_auto.py BUILD_DIR MODEL
Exit 77 without a CUDA device (a GPU or the emulator) or the model."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from device_checks import Checks, need_device  # noqa: E402

build, model = sys.argv[1], sys.argv[2]
hetkv = os.path.join(build, "tools", "hetkv")
if not os.path.exists(model):
    print(f"skip: {model} is missing (tools/scripts/get_model.sh fetches it)")
    sys.exit(77)
need_device(hetkv)
check = Checks()


def run(*extra, ctx="4096", batch="2"):
    cmd = [hetkv, "run", "-m", model, "-p", "The capital of France is", "-n", "5", "-c", ctx,
           "-b", batch, "-t", "2", "--json", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode:
        return None, p.stderr.strip()[-300:]
    return json.loads(p.stdout), p.stderr


fits, e1 = run("--device", "cuda", "--gpu-mem", "3G")
cpu_full, _ = run("--policy", "full")
check(fits and fits["policy"] == "full" and fits["near_rows"] >= 4096 and "auto -> full" in e1,
      "fits: full, the whole context near", fits and (fits["policy"], fits["near_rows"]))
check(fits and cpu_full and fits["tokens"] == cpu_full["tokens"], "fits: the CPU path's tokens",
      fits and cpu_full and (fits["tokens"], cpu_full["tokens"]))
split, e2 = run("--device", "cuda", "--gpu-mem", "300M")
cpu_ct, _ = run("--policy", "ctkvr")
check(split and split["policy"] == "ctkvr" and split["near_rows"] < 4096 and "auto -> ctkvr" in e2,
      "split: ctkvr", split and (split["policy"], split["near_rows"]))
check(split and cpu_ct and split["tokens"] == cpu_ct["tokens"], "split: the CPU path's tokens",
      split and cpu_ct and (split["tokens"], cpu_ct["tokens"]))
check(fits and split and fits["chunk"] == 256 and split["chunk"] == 256, "4K: prompt chunks of 256",
      fits and split and (fits["chunk"], split["chunk"]))
big, e4 = run("--device", "cuda", "--gpu-mem", "500M", ctx="16384", batch="1")
cpu_big, _ = run("--policy", "ctkvr", "--chunk", "2048", ctx="16384", batch="1")
check(big and big["chunk"] == 2048 and "the prompt goes in chunks of 2048 rows" in e4,
      "16K with room: chunks of 2048", big and big["chunk"])
check(big and cpu_big and big["tokens"] == cpu_big["tokens"] and cpu_big["chunk"] == 2048,
      "16K: the CPU path's tokens at the same chunk", big and cpu_big and (big["tokens"], cpu_big["tokens"]))
small, e5 = run("--device", "cuda", "--gpu-mem", "300M", ctx="16384", batch="1")
check(small and small["chunk"] == 256 and "chunks of 2048" not in e5, "16K without room: 256",
      small and small["chunk"])
c3, _ = run("--policy", "full", "--chunk", "3")
check(c3 and cpu_full and c3["chunk"] == 3 and c3["tokens"] == cpu_full["tokens"],
      "--chunk 3: the same tokens", c3 and (c3["chunk"], c3["tokens"]))
named, e3 = run("--device", "cuda", "--gpu-mem", "300M", "--policy", "full")
check(named is None and "with policy full needs" in e3 and "but the cap is 300.00 MiB" in e3,
      "named full: refused by the plan", e3)
with tempfile.TemporaryDirectory() as tmp:
    inp, out = os.path.join(tmp, "i.jsonl"), os.path.join(tmp, "o.jsonl")
    with open(inp, "w") as f:
        for i in range(2):
            f.write(json.dumps({"custom_id": f"a{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"prompt": f"Count to {i + 3}:", "max_tokens": 3}}) + "\n")
    p = subprocess.run([hetkv, "batch", "-m", model, "-i", inp, "-o", out, "-c", "4096",
                        "--max-batch", "2", "-t", "2", "-q", "--device", "cuda", "--gpu-mem", "300M"],
                       capture_output=True, text=True, timeout=600)
    lines = [json.loads(l) for l in open(out)] if os.path.exists(out) else []
    # auto picks ctkvr for the job (4096 x 2 does not fit 300M); both requests
    # fit the near tier, so slots sized from the job (1 far row) hold both:
    # they run full, placed on the device, and their lines say so
    check(p.returncode == 0 and len(lines) == 2 and "policy auto -> ctkvr" in p.stderr and
          "every request of the job fits the near tier" in p.stderr and
          all(o["hetkv"]["policy"] == "full" and o["hetkv"].get("placement") == "device" for o in lines),
          "batch: the picked policy, the job's slots, the placement on every line",
          p.stderr[-300:] or [(o["hetkv"]["policy"], o["hetkv"].get("placement")) for o in lines])
p = subprocess.run([hetkv, "run", "-m", model, "-p", "x", "--policy", "auto", "--policy-arg", "rho_p=64"],
                   capture_output=True, text=True, timeout=60)
check(p.returncode != 0 and "--policy auto picks full or ctkvr itself" in p.stderr, "auto with --policy-arg refused",
      p.stderr.strip())
check.done("test_auto")

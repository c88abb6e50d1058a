#!/usr/bin/env python3
"""bench/predict_fit.py recovers the terms a run was made with.

    python3 test_predict_fit.py BUILD_DIR

A headline.json whose rows are `hetkv plan --predict h200` itself with known
terms (products at 0.4 of the bandwidth and +0.2 a GEMV row, attention at
0.6, 8 us an op, the host at 0.5 of its probe and 100 us a layer, a 300 us
round trip): the fit must find the terms within 10% and predict every row
within 2%, each left out within 10%. Then rows the model cannot produce with
any terms (the split's step doubled) must show as errors, not be absorbed;
one core's far-step rows (bench far -t 1 --warm) bound the desktop's split
by its cores, and a row of more threads is refused; and a run dir without
rows is an error that names the file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

TRUE = {"mem_eff": 0.4, "gemv_row_cost": 0.2, "attn_eff": 0.6, "kernel_us": 8.0,
        "host_eff": 0.5, "host_wake_us": 100.0, "trip_us": 300.0}
FLAGS = {"mem_eff": "--mem-eff", "gemv_row_cost": "--gemv-row-cost", "attn_eff": "--attn-eff",
         "kernel_us": "--kernel-us", "host_eff": "--host-eff", "host_wake_us": "--host-wake-us",
         "trip_us": "--trip-us"}
ROWS = [("dense", "full", 16384, 1), ("dense", "full", 8192, 4), ("split", "ctkvr", 32768, 1),
        ("split", "ctkvr", 32768, 4)]
GB = 24 << 30
HOST_GBS = 100.0

fails = 0


def check(ok: bool, what: str) -> None:
    global fails
    if not ok:
        fails += 1
        print("FAIL:", what)


def model_row(hetkv: str, kind: str, spec: str, ctx: int, batch: int) -> dict:
    cmd = [hetkv, "plan", "--predict", "h200", "--synthetic", "llama3.1-8b", "--configs", spec,
           "--ctx", str(ctx), "--batch", str(batch), "--gpu-mem", str(GB), "--host-gbs",
           str(HOST_GBS), "--pipeline", "built", "-o", "jsonl"]
    for k, v in TRUE.items():
        cmd += [FLAGS[k], str(v)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    p = json.loads(out.stdout.splitlines()[0])
    assert p["fits"], p
    # a bench row as bench/headline_rows.py keeps it, its timeline the model's
    return {"kind": kind, "spec": spec, "policy": spec, "config": spec, "ctx": ctx,
            "batch": batch, "gpu_mem": GB, "far_kv": "f16", "probe_gbs": HOST_GBS,
            "variant": "default", "step_ms": p["built_step_ms"],
            "decode_tok_s": p["built_tok_s"], "dev_products_ms": p["built_dev_products_ms"],
            "dev_near_ms": p["built_dev_attn_ms"],
            "dev_cpu_busy_ms": p["built_host_busy_ms"] if kind == "split" else 0.0}


def fit(root: str, hetkv: str, run: str, extra: tuple = ()) -> dict:
    out = subprocess.run([sys.executable, os.path.join(root, "bench", "predict_fit.py"), run,
                          "--hetkv", hetkv, "--device", "h200", "--desktop-ctx", "32768",
                          "--desktop-batch", "1,4", "--desktop-configs", "", *extra],
                         capture_output=True, text=True)
    check(out.returncode == 0, "predict_fit.py exited %d: %s" % (out.returncode, out.stderr[-500:]))
    return json.load(open(os.path.join(run, "predict_fit.json"), encoding="utf-8"))


def main() -> int:
    build = sys.argv[1]
    hetkv = os.path.join(build, "tools", "hetkv")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows = [model_row(hetkv, *r) for r in ROWS]
    rows.append({**rows[2], "variant": "pingpong", "step_ms": 1.0})   # an A/B row: not fitted
    with tempfile.TemporaryDirectory() as run:
        json.dump({"rows": rows}, open(os.path.join(run, "headline.json"), "w"))
        # one core's far step (bench far -t 1 --warm rows): 10 ms a (sequence, KV
        # head), the least of two rows, on 8 cores: at least 32 x 8 x 10 / 8 = 320 ms
        # of host time a token, so the split's best falls under 1000 / 320 tok/s
        core = os.path.join(run, "core.jsonl")
        with open(core, "w") as f:
            for ms in (80.0, 95.0):
                f.write(json.dumps({"config": "ctkvr", "ctx": 32768, "batch": 1, "threads": 1,
                                    "isa": "avx2", "warm": True, "kv_heads": 8, "step_ms": ms}) + "\n")
        res = fit(root, hetkv, run, ("--desktop-core-rows", core, "--desktop-cores", "8"))
        s = res["summary"]
        check(s["rows"] == 4, "fitted %d rows, want the 4 default ones" % s["rows"])
        for k, v in TRUE.items():
            got = s["params"][k]
            check(abs(got / v - 1) < 0.10, "%s fitted %.4g, made with %.4g" % (k, got, v))
        check(s["max_abs_err_fit"] < 0.02, "largest error in the fit %.3f" % s["max_abs_err_fit"])
        check(s["max_abs_err_left_out"] is not None and s["max_abs_err_left_out"] < 0.10,
              "largest error left out %s" % s["max_abs_err_left_out"])
        d = res["desktop"]
        check(d["device"] == "rtx4090" and len(d["rows"]) == 4 and
              all(r["kind"] in ("dense", "split") for r in d["rows"]),
              "desktop rows: %s" % d["rows"])
        # the ratios at 64 and 128 GiB of host memory, ping-pong off and on; the flag
        # reaches the plan (the split's batch-4 step differs with it)
        rs = d["ratios"]
        check(sorted((r["host_mem"] >> 30, r["pingpong"]) for r in rs) ==
              [(64, False), (64, True), (128, False), (128, True)], "ratio lines: %s" % rs)
        sp = {r["pingpong"]: r["best_split"]["tok_s"] for r in rs if r["host_mem"] == 64 << 30}
        check(sp[True] != sp[False], "ping-pong did not change the split's best: %s" % sp)
        md = open(os.path.join(run, "predict_fit.md"), encoding="utf-8").read()
        check("PREDICTION" in md and "left out" in md, "the Markdown says what is predicted")
        cb = d.get("core_bound") or []
        check(sorted((r["isa"], r["host_cores"], r["host_mem"] >> 30, r["pingpong"]) for r in cb) ==
              [("avx2", 8, 64, False), ("avx2", 8, 64, True), ("avx2", 8, 128, False),
               ("avx2", 8, 128, True)], "core-bound lines: %s" % cb)
        check(all(r["best_split"] and r["best_split"]["tok_s"] < 1000 / 320 for r in cb) and
              all(r["best_split"]["tok_s"] < x["best_split"]["tok_s"] for r in cb for x in rs
                  if (x["host_mem"], x["pingpong"]) == (r["host_mem"], r["pingpong"])),
              "the cores' ceiling bounds the split: %s against %s" % (cb, rs))
        check(d["core_us"] == [{"isa": "avx2", "config": "ctkvr", "ctx": 32768, "us": 10000.0}] and
              "avx2 ctkvr 32K 10000" in md, "one core's time, the least row's: %s" % d["core_us"])
        with open(core, "a") as f:   # a row of two threads is no core's ceiling
            f.write(json.dumps({"config": "ctkvr", "ctx": 32768, "batch": 1, "threads": 2,
                                "isa": "avx2", "warm": True, "kv_heads": 8, "step_ms": 5.0}) + "\n")
        out = subprocess.run([sys.executable, os.path.join(root, "bench", "predict_fit.py"), run,
                              "--hetkv", hetkv, "--device", "h200", "--desktop-core-rows", core],
                             capture_output=True, text=True)
        check(out.returncode == 2 and "2 threads" in out.stderr and "-t 1 --warm" in out.stderr,
              "a row of two threads: rc %d, %s" % (out.returncode, out.stderr.strip()))

        # a split step the terms cannot produce (twice the model's at batch 4
        # only) shows as an error
        bad = [dict(r) for r in rows[:4]]
        bad[3]["step_ms"] *= 2
        json.dump({"rows": bad}, open(os.path.join(run, "headline.json"), "w"))
        res = fit(root, hetkv, run)
        check(res["summary"]["max_abs_err_fit"] > 0.15,
              "a doubled step was absorbed: largest error %.3f" % res["summary"]["max_abs_err_fit"])

        json.dump({"rows": []}, open(os.path.join(run, "headline.json"), "w"))
        out = subprocess.run([sys.executable, os.path.join(root, "bench", "predict_fit.py"), run,
                              "--hetkv", hetkv, "--device", "h200"], capture_output=True, text=True)
        check(out.returncode == 2 and "headline.json" in out.stderr,
              "no rows: rc %d, %s" % (out.returncode, out.stderr.strip()))
    if fails:
        print("%d check(s) failed" % fails)
        return 1
    print("predict_fit checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

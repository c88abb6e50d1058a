#!/usr/bin/env python3
"""bench/gpu_headline.sh end to end on a small shape (the emulator in CI): the
run beyond the GPU's memory keeps working between the sessions lent a GPU.

    python3 tests/pipeline/test_headline.py BUILD_DIR

Runs the script with SmolLM2's shape on its first 2 layers, a 512-token
context, two selection policies at batch 1 and 2, under a 1 GiB cap, and
checks what bench/headline_rows.py gathered: a row per (policy, batch) with
the far tier on the host and its timeline, host bytes and time to first
token; one dense row with the whole context on the device (no host far
work); the split-over-dense ratio; the predictions' rows; the device's
policy kernels timed alone (ctkvr's recall) and the host's wait for the
device (asleep, polled); the speed model fitted to the rows (bench/predict_fit.py); ctkvr's A/B row with the host asleep on every wait
(--gpu-spin-us 0), with the team waiting beside it (--gpu-team-spin), with every op profiled and with micro-batch ping-pong; one host core's far step
(far_core.jsonl); and the row file a stopped step
leaves (each row written as it is measured). Exit 0 passed, 1
failed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    build = sys.argv[1]
    fails = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            fails.append(what)

    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, HKV_EMU_MEM="4G", HEADLINE_MODEL="--synthetic smollm2-135m@2",
                   HEADLINE_GPU_MEM="1G", HEADLINE_CTX="512", HEADLINE_BATCH_512="1,2",
                   HEADLINE_STEPS="2", HEADLINE_CHUNK="256", HEADLINE_CONFIGS="ctkvr;quest",
                   HEADLINE_PREDICT="h200", HEADLINE_AB_CTX="512", HEADLINE_FAR_CTX="2048")
        r = subprocess.run(["bash", os.path.join(ROOT, "bench", "gpu_headline.sh"), build, out, "600"],
                           env=env, capture_output=True, text=True, timeout=900)
        print(r.stdout[-3000:], r.stderr[-3000:])
        check(r.returncode == 0, f"gpu_headline.sh exit {r.returncode}")
        summary = open(os.path.join(out, "summary.txt")).read()
        check("split_512" in summary and "dense_512" in summary and "rc=0" in summary,
              "summary names the split and dense steps")
        path = os.path.join(out, "headline.json")
        if not os.path.exists(path):
            check(False, "headline.json written")
            return 1
        h = json.load(open(path))
        split = [x for x in h["rows"] if x["kind"] == "split" and x["variant"] == "default"]
        # the A/B of the host's wait: ctkvr at batch 1 asleep on every event
        ab = [x for x in h["rows"] if x["variant"] == "sleep"]
        check(len(ab) == 1 and ab[0]["policy"] == "ctkvr" and ab[0]["batch"] == 1
              and "--gpu-spin-us 0" in ab[0]["config"] and ab[0]["dev_cpu_waits"] > 0
              and ab[0]["dev_cpu_waits_slept"] == ab[0]["dev_cpu_waits"],
              f"the sleep A/B row: {[(x['config'], x['dev_cpu_waits'], x['dev_cpu_waits_slept']) for x in ab]}")
        dense = [x for x in h["rows"] if x["kind"] == "dense"]
        got = sorted((x["policy"], x["batch"]) for x in split)
        check(got == [("ctkvr", 1), ("ctkvr", 2), ("quest", 1), ("quest", 2)], f"split rows {got}")
        for x in split:
            check(x["decode_tok_s"] > 0 and x["ttft_s"] and x["ttft_s"] > 0 and x["gpu_mem"] == 1 << 30
                  and x["dev_cpu_busy_ms"] is not None and x["host_bytes_per_token"] > 0
                  and x["chunk"] == 256,
                  f"split {x['config']} b{x['batch']}: tok/s, TTFT, cap, timeline, host bytes, chunk")
        om = [x for x in h["rows"] if x["variant"] == "ompactive"]
        check([(x["policy"], x["batch"]) for x in om] == [("ctkvr", 1)]
              and "OMP_WAIT_POLICY=active" in om[0]["config"], f"the OpenMP A/B row: {om}")
        ts = [x for x in h["rows"] if x["variant"] == "teamspin"]
        check([(x["policy"], x["batch"]) for x in ts] == [("ctkvr", 1)]
              and "--gpu-team-spin" in ts[0]["config"] and ts[0]["dev_cpu_waits"] > 0,
              f"the team's A/B row (--gpu-team-spin): {ts}")
        # the A/B of micro-batch ping-pong: ctkvr at the split's batches past 1
        pp = sorted((x["policy"], x["batch"], x["config"]) for x in h["rows"] if x["variant"] == "pingpong")
        check([(p, b) for p, b, _ in pp] == [("ctkvr", 2)] and "--gpu-pingpong" in pp[0][2],
              f"the ping-pong A/B rows: {pp}")
        # one host core's far step, cached (bench far -t 1 --warm): both configurations
        core = h.get("far_core", [])
        check(sorted(c["config"] for c in core) == ["ctkvr", "ctkvr:sketch=3,rho=1536,far=q8"]
              and all(c["ctx"] == 2048 and c["step_ms"] > 0 and c["bytes_per_step"] > 0 for c in core),
              f"one host core's far step: {core}")
        # the profiled A/B step: every op's device time and the host's, per step
        prof = {x["op"]: x for x in h.get("profile", [])}
        check({"qkv", "attention", "rmsnorm"} <= set(prof) and prof["attention"]["host_ms"] > 0
              and prof["qkv"]["device_ms"] > 0 and "| attention |" in open(os.path.join(out, "headline.md")).read(),
              f"the profiled step's ops: {sorted(prof)}")
        check(len(dense) == 1 and dense[0]["policy"] == "full" and dense[0]["batch"] >= 1,
              f"one dense row ({len(dense)})")
        if dense:
            # the whole context near: the host attends nothing far
            check(dense[0]["host_bytes_per_token"] == 0, "dense: no host far reads "
                  f"({dense[0]['host_bytes_per_token']})")
        q = h["ratios"]
        check(len(q) == 1 and q[0]["split_over_dense"] and q[0]["ctkvr_over_dense"],
              f"ratios {q}")
        pred = os.path.join(out, "plan_predict.jsonl")
        check(os.path.exists(pred) and os.path.getsize(pred) > 0, "plan --predict rows")
        # the plan names ctkvr with its budgets: its row at batch 1 (the plan's
        # batches are 1, 4, 8) gets the prediction beside it
        c1 = [x for x in split if x["policy"] == "ctkvr" and x["batch"] == 1]
        check(len(c1) == 1 and c1[0]["predicted_tok_s"],
              f"a prediction beside ctkvr {[(x['policy'], x['batch'], x['predicted_tok_s']) for x in c1]}")
        # the device's policy kernels alone, ctkvr's recall among them (emulated: not a speed)
        kern = h.get("kernels", [])
        check(any(k["kernel"] == "ctkvr recall" and k["us"] and k["us"] > 0 for k in kern)
              and "ctkvr recall" in open(os.path.join(out, "headline.md")).read(),
              f"the recall kernel's row: {[(k['kernel'], k['us']) for k in kern]}")
        check({k["kernel"] for k in kern if k["group"] == "sync"}
              == {"wait slept", "wait polled", "round trip slept", "round trip polled"},
              "the host's wait for the device timed alone, asleep and polled")
        rows = [ln for ln in open(os.path.join(out, "split_512.jsonl")) if ln.startswith("{")]
        check(len(rows) == 4, f"split_512.jsonl: one line a row ({len(rows)})")
        # the model fitted to the run's rows (bench/predict_fit.py, run on the
        # development VM after a GPU call): quest's rows have no formula and
        # are left out, ctkvr's and dense's are fitted, the desktop predicted
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "predict_fit.py"), out,
                            "--hetkv", os.path.join(build, "tools", "hetkv"), "--synthetic",
                            "smollm2-135m@2", "--desktop-ctx", "512", "--desktop-batch", "1",
                            "--desktop-configs", ""], capture_output=True, text=True, timeout=900)
        fit_path = os.path.join(out, "predict_fit.json")
        check(r.returncode == 0 and os.path.exists(fit_path), f"predict_fit.py: {r.stderr[-600:]}")
        if os.path.exists(fit_path):
            fj = json.load(open(fit_path))
            kinds = sorted({(x["kind"], x["spec"].split(":")[0]) for x in fj["rows"]})
            check(kinds == [("dense", "full"), ("split", "ctkvr")],
                  f"fitted rows: ctkvr's and dense's, not quest's ({kinds})")
            check(fj["summary"]["device"] == "h200" and fj["summary"]["max_abs_err_fit"] is not None
                  and fj["desktop"]["rows"], "the fit's summary and the desktop's rows")
    print(f"test_headline: {'FAILED' if fails else 'passed'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

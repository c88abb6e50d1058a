#!/usr/bin/env python3
"""Gather a headline run's rows (bench/gpu_headline.sh) into one file.

    python3 bench/headline_rows.py OUT_DIR

Reads OUT_DIR/split_*.jsonl and dense_*.jsonl (`hetkv bench -o jsonl` rows)
and plan_predict.jsonl (`hetkv plan --predict -o jsonl`), writes
OUT_DIR/headline.json ({"rows": [...], "ratios": [...]}: per row the config,
context, batch, GPU cap, decode tokens/s, time to first token, the step's
timeline per decode step and the host's bytes per token; per context the best
split tokens/s over the best dense tokens/s; the batches bench refused at
admission, from split_*.log and dense_*.log, with the reason; the device's
policy kernels timed alone, from kernels_policy.json, `bench kernels --json`:
ctkvr's recall among them) and OUT_DIR/headline.md (the same as Markdown tables). Rows come from whatever the run measured: a step stopped
by its time limit leaves the rows it wrote."""
from __future__ import annotations

import glob
import json
import os
import re
import sys

# tools/bench/cmd_bench.c: a largest batch the device or the host cannot hold,
# for every configuration or (a config's far=q8 holding less) for one
REFUSED = re.compile(r"^hetkv bench: batch (\d+) refused(?: for '([^']*)')?: (.*)$")

KEEP = ["config", "spec", "policy", "budget", "ctx", "batch", "gpu_mem", "decode_tok_s", "step_ms",
        "ttft_s", "prefill_tok_s", "fork_s", "chunk", "dev_cpu_busy_ms", "dev_cpu_wait_ms",
        "dev_wait_cpu_ms", "dev_near_ms", "dev_products_ms", "dev_total_ms", "dev_h2d_mb",
        "dev_d2h_mb", "host_bytes_per_token", "host_roofline_tok_s", "probe_gbs", "far_kv",
        "prefill_h2d_gb", "prefill_rows_streamed", "dev_graph_steps", "threads", "device",
        "commit", "date", "dev_cpu_waits", "dev_cpu_waits_slept"]


# OUT/split_CTX_<variant>.jsonl: the script's A/B steps, each one device option
VARIANTS = {"sleep": "--gpu-spin-us 0", "pingpong": "--gpu-pingpong",
            "ompactive": "OMP_WAIT_POLICY=active", "teamspin": "--gpu-team-spin"}


def read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass   # a line cut by the step's time limit
    return rows


def fmt(v, nd=1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    rows = []
    for kind in ("split", "dense"):
        for path in sorted(glob.glob(os.path.join(out, f"{kind}_*.jsonl"))):
            for r in read_jsonl(path):
                row = {"kind": kind, "file": os.path.basename(path)}
                row.update({k: r.get(k) for k in KEEP})
                # the A/B rows beside the defaults: the host asleep on its waits,
                # micro-batch ping-pong
                row["variant"] = "default"
                for v, flag in VARIANTS.items():
                    if path.endswith(f"_{v}.jsonl"):
                        row["variant"] = v
                        if row["config"]:
                            row["config"] += f" ({flag})"
                rows.append(row)
    refused = []
    for path in sorted(glob.glob(os.path.join(out, "split_*.log")) +
                       glob.glob(os.path.join(out, "dense_*.log"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = REFUSED.match(line.strip())
                if m:
                    refused.append({"file": os.path.basename(path), "batch": int(m.group(1)),
                                    "config": m.group(2) or "all", "reason": m.group(3)})
    kernels = []
    kpath = os.path.join(out, "kernels_policy.json")
    if os.path.exists(kpath):
        try:
            kj = json.load(open(kpath, encoding="utf-8"))
        except ValueError:   # a step stopped mid-write
            kj = {}
        for k in kj.get("rows", []):
            if k.get("group") in ("policy", "recall", "index", "sync"):
                kernels.append({"group": k["group"], "kernel": k.get("kernel"), "shape": k.get("shape"),
                                "us": k.get("us"), "gbs": k.get("gbs"),
                                "emulated": bool(k.get("emulated"))})
    # the profiled A/B step (--gpu-profile --json): per op and step, the device's
    # time and the host's time in the op's call
    profile = []
    for path in sorted(glob.glob(os.path.join(out, "split_*_profile.json"))):
        try:
            pj = json.load(open(path, encoding="utf-8"))
        except ValueError:   # a step stopped mid-write
            continue
        for res in pj.get("results", []):
            t = res.get("timeline") or {}
            ns = t.get("steps") or 1
            for op, dev_s in (t.get("ops") or {}).items():
                profile.append({"file": os.path.basename(path), "config": res.get("config"),
                                "ctx": res.get("ctx"), "batch": res.get("batch"), "op": op,
                                "device_ms": dev_s * 1e3 / ns,
                                "host_ms": (t.get("ops_host") or {}).get(op, 0) * 1e3 / ns,
                                "step_ms": res.get("step_ms")})
    pred = {}
    ppath = os.path.join(out, "plan_predict.jsonl")
    if os.path.exists(ppath):
        for p in read_jsonl(ppath):
            if p.get("fits") and p.get("built_tok_s") is not None:
                # the plan names a policy with its budgets ("ctkvr C=2048 rho=2480
                # rho'=992"): its defaults, which the rows with no arguments ran
                pred[(p["policy"].split()[0], p["ctx"], p["batch"])] = p["built_tok_s"]
    for row in rows:
        # full is predicted with the whole KV on the device: the dense rows only
        key = (row["policy"], row["ctx"], row["batch"])
        if row["policy"] == "full" and row["kind"] != "dense":
            key = None
        if row.get("spec") not in (None, row["policy"]):   # arguments of its own: not the plan's
            key = None
        row["predicted_tok_s"] = pred.get(key) if key else None
    ratios = []
    for ctx in sorted({r["ctx"] for r in rows}):
        split = [r for r in rows if r["ctx"] == ctx and r["kind"] == "split"]
        dense = [r for r in rows if r["ctx"] == ctx and r["kind"] == "dense"]
        bs = max(split, key=lambda r: r["decode_tok_s"], default=None)
        bd = max(dense, key=lambda r: r["decode_tok_s"], default=None)
        bc = max((r for r in split if r["policy"] == "ctkvr"), key=lambda r: r["decode_tok_s"],
                 default=None)
        ratios.append({
            "ctx": ctx,
            "best_split": bs and {"config": bs["config"], "batch": bs["batch"],
                                  "decode_tok_s": bs["decode_tok_s"]},
            "best_ctkvr": bc and {"config": bc["config"], "batch": bc["batch"],
                                  "decode_tok_s": bc["decode_tok_s"]},
            "best_dense": bd and {"batch": bd["batch"], "decode_tok_s": bd["decode_tok_s"]},
            "split_over_dense": bs["decode_tok_s"] / bd["decode_tok_s"] if bs and bd else None,
            "ctkvr_over_dense": bc["decode_tok_s"] / bd["decode_tok_s"] if bc and bd else None,
        })
    # one host core's far step, its rows cached (bench far -t 1 --warm -o jsonl):
    # the host's ceiling per core, against the split rows' host busy
    core = []
    cpath = os.path.join(out, "far_core.jsonl")
    if os.path.exists(cpath):
        core = [{k: c.get(k) for k in ("config", "ctx", "batch", "isa", "step_ms", "bytes_per_step",
                                        "gbs", "probe_gbs")} for c in read_jsonl(cpath)]
    with open(os.path.join(out, "headline.json"), "w", encoding="utf-8") as f:
        json.dump({"rows": rows, "ratios": ratios, "refused": refused, "kernels": kernels,
                   "profile": profile, "far_core": core}, f, indent=1)
    md = ["| kind | config | ctx | batch | decode tok/s | predicted | TTFT s | step ms | host busy | "
          "host waits | device waits | device products | near | PCIe up/down MB | host MB/token | "
          "host roofline tok/s |", "|" + "---|" * 16]
    for r in rows:
        md.append("| " + " | ".join([
            r["kind"], r["config"] or "-", str(r["ctx"]), str(r["batch"]), fmt(r["decode_tok_s"]),
            fmt(r["predicted_tok_s"]), fmt(r["ttft_s"]), fmt(r["step_ms"], 2),
            fmt(r["dev_cpu_busy_ms"], 2),
            fmt(r["dev_cpu_wait_ms"], 2) + (f" ({fmt(r['dev_cpu_waits_slept'], 0)} of "
                                            f"{fmt(r['dev_cpu_waits'], 0)} slept)"
                                            if r.get("dev_cpu_waits") is not None else ""),
            fmt(r["dev_wait_cpu_ms"], 2),
            fmt(r["dev_products_ms"], 2), fmt(r["dev_near_ms"], 2),
            f"{fmt(r['dev_h2d_mb'])} / {fmt(r['dev_d2h_mb'])}",
            fmt(r["host_bytes_per_token"] / 1e6 if r["host_bytes_per_token"] else None),
            fmt(r["host_roofline_tok_s"])]) + " |")
    md += ["", "| ctx | best split (config, batch, tok/s) | best ctkvr | best dense (batch, tok/s) | "
           "split / dense | ctkvr / dense |", "|---|---|---|---|---|---|"]
    for q in ratios:
        bs, bc, bd = q["best_split"], q["best_ctkvr"], q["best_dense"]
        md.append("| " + " | ".join([
            str(q["ctx"]),
            f"{bs['config']}, {bs['batch']}, {bs['decode_tok_s']:.1f}" if bs else "-",
            f"{bc['batch']}, {bc['decode_tok_s']:.1f}" if bc else "-",
            f"{bd['batch']}, {bd['decode_tok_s']:.1f}" if bd else "-",
            fmt(q["split_over_dense"], 2), fmt(q["ctkvr_over_dense"], 2)]) + " |")
    if kernels:
        md += ["", "| device kernel, alone | shape | us a call | GB/s |", "|---|---|---|---|"]
        md += [f"| {k['kernel']}{' (emulated: not a speed)' if k['emulated'] else ''} | {k['shape']} | "
               f"{fmt(k['us'])} | {fmt(k['gbs'])} |" for k in kernels]
    if profile:
        q = profile[0]
        md += ["", f"Profiled ({q['file']}: {q['config']}, ctx {q['ctx']}, batch {q['batch']}, "
               f"step {fmt(q['step_ms'], 2)} ms with the profile's events), per step:", "",
               "| op | device ms | host ms in its calls |", "|---|---|---|"]
        md += [f"| {x['op']} | {fmt(x['device_ms'], 2)} | {fmt(x['host_ms'], 2)} |"
               for x in sorted(profile, key=lambda x: -x["host_ms"])]
    if core:
        md += ["", "One host core's far step of one layer, its rows cached (far_core.jsonl; x the "
               "host's cores: its far part's ceiling):", "",
               "| config | ctx | kernels | ms a layer | MB | GB/s one core | probe GB/s (one core) |",
               "|---|---|---|---|---|---|---|"]
        md += [f"| {c['config']} | {c['ctx']} | {c['isa']} | {fmt(c['step_ms'], 3)} | "
               f"{fmt((c['bytes_per_step'] or 0) / 1e6)} | {fmt(c['gbs'], 2)} | {fmt(c['probe_gbs'])} |"
               for c in core]
    if refused:
        md += ["", "| refused (file, batch, config) | why |", "|---|---|"]
        md += [f"| {q['file']}, {q['batch']}, {q['config']} | {q['reason']} |" for q in refused]
    with open(os.path.join(out, "headline.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Calibrate `hetkv plan --predict` on a headline run's measured rows, then
predict a desktop card with the calibrated model (issue 35, item 6).

    python3 bench/predict_fit.py RUN_DIR [--hetkv PATH] [--device h200]
        [--synthetic llama3.1-8b] [--desktop rtx4090] [--desktop-host-gbs 70]

RUN_DIR holds headline.json (bench/headline_rows.py). Every row with a
measured step (the split's and dense's rows at their default device options;
not `--policy auto`, which mixes both, nor the A/B variants; full and ctkvr,
the policies the model has formulas for) is predicted by
`hetkv plan --predict DEVICE` with the row's own configuration, context,
batch, cap, far-tier format and the host bandwidth its run probed.

The model's structure stays as built (plan/gpu_predict.c); what the fit sets
are its seven measured terms, the ones the first GPU runs showed the data
sheet's defaults to be wrong about or the roofline to leave out, each on the
part of the timeline it prices (Levenberg-Marquardt on the log errors of
those parts, all terms together):

  mem_eff        the products' share of the device's bandwidth, and
  gemv_row_cost  what each row of a GEMV past the first adds to its time:
                 every row's dev_products_ms against the model's products;
  attn_eff       the decode attention's share: the dense rows' dev_near_ms
                 (the whole KV attended) against the model's attention;
  kernel_us      the least time of one op queued by the host, its launch and
                 queueing included: the dense rows' step;
  host_eff       the host's far-tier kernels' share of the probed bandwidth,
  host_wake_us   and their fixed cost a layer (the team's wake and fork):
                 the split rows' host busy (dev_cpu_busy_ms);
  trip_us        the split's round trip per layer beyond the work the model
                 prices (the device's recall latency, waits where neither side
                 works): the split rows' step.

The step's error is shown in sample and left one out (each row predicted by
the terms fitted on the others): the second is the model's error to state
beside any prediction made with it.

Writes RUN_DIR/predict_fit.json and RUN_DIR/predict_fit.md: the parameters,
per row the measured step, the data-sheet prediction and the calibrated one;
then the same configurations predicted on the desktop card (RTX 4090, PCIe
4.0, desktop DDR5 at --desktop-host-gbs, --desktop-host-mem-gib of it for the
far tier) under a 24 GB cap with the calibrated terms, labelled PREDICTION:
the figure the issue's 24 GB users care about. The terms describe the code
and machine of the run they were fitted on; carried to another card and host
they are an assumption, which the Markdown says.

Rows kept out of the fit (--holdout, e.g. the same run at another thread
count) are predicted with the fitted terms: an error there is one the
left-one-out figure cannot show."""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import re
import subprocess
import sys

# name: (command-line flag, data-sheet default, lower bound, upper bound)
PARAMS = {
    "mem_eff": ("--mem-eff", 0.8, 0.05, 1.0),
    "attn_eff": ("--attn-eff", 0.8, 0.05, 1.0),
    "gemv_row_cost": ("--gemv-row-cost", 0.0, 0.001, 4.0),
    "kernel_us": ("--kernel-us", 4.0, 0.5, 50.0),
    "host_eff": ("--host-eff", 0.8, 0.02, 1.0),
    "host_wake_us": ("--host-wake-us", 15.0, 1.0, 5000.0),
    "trip_us": ("--trip-us", 0.0, 1.0, 20000.0),
}
# the policies plan --predict has formulas for (plan/gpu_predict.c)
MODELLED = ("full", "ctkvr")
# the timeline's parts the terms are fitted on: (rows, measured field, the model's)
PARTS = [
    (("split", "dense"), "products_ms", "built_dev_products_ms"),
    (("dense",), "near_ms", "built_dev_attn_ms"),
    (("split",), "host_busy_ms", "built_host_busy_ms"),
    (("split", "dense"), "step_ms", "built_step_ms"),
]
# a term whose data-sheet value is 0 starts the fit here (the fit works in logs)
START = {"gemv_row_cost": 0.05, "trip_us": 50.0}


class Predictor:
    """`hetkv plan --predict` for rows, cached by (row, params); one call for
    the rows that differ only in context and batch."""

    def __init__(self, hetkv: str, device: str, synthetic: str):
        self.hetkv, self.device, self.synthetic = hetkv, device, synthetic
        self.cache: dict = {}
        self.pool = cf.ThreadPoolExecutor(max_workers=4)

    def command(self, q: dict, params: dict, device: str | None = None) -> list[str]:
        cmd = [self.hetkv, "plan", "--predict", device or self.device, "--synthetic",
               self.synthetic, "--configs", q["spec"], "--ctx", str(q["ctx"]), "--batch",
               str(q["batch"]), "--gpu-mem", str(q["gpu_mem"]), "--host-gbs",
               "%.4g" % q["host_gbs"], "--far-kv", q.get("far_kv") or "f16", "--pipeline",
               "built", "-o", "jsonl"]
        if q.get("host_mem"):
            cmd += ["--host-mem", str(q["host_mem"])]
        if q.get("pingpong"):
            cmd.append("--gpu-pingpong")
        if q.get("core_us"):   # the host's cores as a ceiling (bench far -t 1 --warm)
            cmd += ["--host-core-us", "%.4g" % q["core_us"], "--host-cores", str(q["host_cores"])]
        for name, v in params.items():
            cmd += [PARAMS[name][0], "%.6g" % v]
        return cmd

    def group(self, qs: list[dict], params: dict, device: str | None) -> None:
        """One call for rows that differ only in context and batch: the plan
        predicts their cross product, the rows asked for are kept."""
        q0 = qs[0]
        ctxs = sorted({q["ctx"] for q in qs})
        bs = sorted({q["batch"] for q in qs})
        g = {**q0, "ctx": ",".join(map(str, ctxs)), "batch": ",".join(map(str, bs))}
        out = subprocess.run(self.command(g, params, device), capture_output=True, text=True)
        rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
        if out.returncode or len(rows) != len(ctxs) * len(bs):
            raise RuntimeError("plan --predict failed for %s: %s" %
                               (q0["spec"], out.stderr.strip()[-400:]))
        for r in rows:
            self.cache[self.key({**q0, "ctx": r["ctx"], "batch": r["batch"]}, params, device)] = r

    def key(self, q: dict, params: dict, device: str | None):
        return (device, q["spec"], q["ctx"], q["batch"], q["gpu_mem"], round(q["host_gbs"], 3),
                q.get("far_kv"), q.get("host_mem"), bool(q.get("pingpong")),
                q.get("core_us"), q.get("host_cores"),
                tuple(sorted((k, float("%.6g" % v)) for k, v in params.items())))

    def many(self, qs: list[dict], params: dict, device: str | None = None) -> list[dict]:
        todo: dict = {}
        for q in qs:
            if self.key(q, params, device) not in self.cache:
                g = (q["spec"], q["gpu_mem"], round(q["host_gbs"], 3), q.get("far_kv"),
                     q.get("host_mem"), bool(q.get("pingpong")), q.get("core_us"),
                     q.get("host_cores"))
                todo.setdefault(g, []).append(q)
        list(self.pool.map(lambda g: self.group(g, params, device), todo.values()))
        return [self.cache[self.key(q, params, device)] for q in qs]


def measured_rows(headline: dict) -> list[dict]:
    """The rows to fit: a measured step at the default device options."""
    out = []
    for r in headline.get("rows", []):
        if r.get("kind") not in ("split", "dense") or r.get("variant") not in (None, "default") or \
                not r.get("step_ms"):
            continue
        if r.get("resident_seqs"):   # --policy auto: some sequences dense, some split
            continue
        if r.get("policy") not in MODELLED:   # plan --predict has no formula for it
            continue
        spec = r.get("spec") or r.get("policy")
        # bench's budget for a spec without one ("ctkvr rho_p=983 (3%)"): the row ran it
        m = re.search(r"\brho_p=(\d+)", r.get("config") or "")
        if r.get("policy") == "ctkvr" and m and "rho_p=" not in spec:
            spec += ("," if ":" in spec else ":") + "rho_p=" + m.group(1)
        if not r.get("probe_gbs") and r.get("kind") == "split":
            continue   # no host bandwidth to predict the host's part with
        out.append({"kind": r["kind"], "spec": spec, "user_spec": r.get("spec") or r.get("policy"),
                    "config": r.get("config"), "ctx": r["ctx"],
                    "batch": r["batch"], "gpu_mem": r["gpu_mem"], "far_kv": r.get("far_kv"),
                    "host_gbs": r.get("probe_gbs") or 100.0, "step_ms": r["step_ms"],
                    "host_busy_ms": r.get("dev_cpu_busy_ms"),
                    "products_ms": r.get("dev_products_ms"), "near_ms": r.get("dev_near_ms"),
                    "decode_tok_s": r.get("decode_tok_s"), "commit": r.get("commit")})
    return out


def log_errors(pred: Predictor, rows: list[dict], params: dict, have: str = "step_ms",
               model: str = "built_step_ms") -> list[float]:
    preds = pred.many(rows, params)
    return [math.log(p[model] / r[have]) if p.get(model) else 10.0 for p, r in zip(preds, rows)]


def residuals(pred: Predictor, rows: list[dict], params: dict) -> list[float]:
    """Log errors of every part of every row that measured it."""
    preds = pred.many(rows, params)
    out = []
    for kinds, have, model in PARTS:
        for r, p in zip(rows, preds):
            if r["kind"] in kinds and r.get(have):
                out.append(math.log(p[model] / r[have]) if p.get(model) else 10.0)
    return out


def solve(a: list[list[float]], b: list[float]) -> list[float]:
    """a x = b by Gaussian elimination with partial pivoting (a small, SPD)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        piv = max(range(c, n), key=lambda i: abs(m[i][c]))
        m[c], m[piv] = m[piv], m[c]
        if abs(m[c][c]) < 1e-300:
            continue
        for i in range(c + 1, n):
            f = m[i][c] / m[c][c]
            for j in range(c, n + 1):
                m[i][j] -= f * m[c][j]
    x = [0.0] * n
    for c in reversed(range(n)):
        if abs(m[c][c]) < 1e-300:
            continue
        x[c] = (m[c][n] - sum(m[c][j] * x[j] for j in range(c + 1, n))) / m[c][c]
    return x


def fit(pred: Predictor, rows: list[dict], iters: int = 30, start: dict | None = None) -> dict:
    """Levenberg-Marquardt on the parts' log errors, the terms in logs and held
    within their bounds; the Jacobian by differences. A term no row informs
    (a zero column: no dense rows for attn_eff) keeps its start."""
    names = list(PARAMS)
    lo = [math.log(PARAMS[n][2]) for n in names]
    hi = [math.log(PARAMS[n][3]) for n in names]
    p0 = start or {n: START.get(n, PARAMS[n][1]) for n in names}
    th = [min(max(math.log(p0[n]), lo[i]), hi[i]) for i, n in enumerate(names)]

    def at(t):
        return {n: math.exp(v) for n, v in zip(names, t)}

    def cost(r):
        return sum(x * x for x in r)

    r = residuals(pred, rows, at(th))
    c = cost(r)
    lam, h = 1e-2, 0.01
    for _ in range(iters):
        cols = []
        for i in range(len(names)):
            t2 = th[:]
            t2[i] = t2[i] + h if t2[i] + h <= hi[i] else t2[i] - h
            r2 = residuals(pred, rows, at(t2))
            cols.append([(y - x) / (t2[i] - th[i]) for x, y in zip(r, r2)])
        jtj = [[sum(a * b for a, b in zip(ci, cj)) for cj in cols] for ci in cols]
        jtr = [sum(a * b for a, b in zip(ci, r)) for ci in cols]
        improved = False
        for _ in range(8):
            a = [[jtj[i][j] + (lam * jtj[i][i] + 1e-12 if i == j else 0) for j in range(len(names))]
                 for i in range(len(names))]
            d = solve(a, [-x for x in jtr])
            t2 = [min(max(t + x, lo[i]), hi[i]) for i, (t, x) in enumerate(zip(th, d))]
            r2 = residuals(pred, rows, at(t2))
            c2 = cost(r2)
            if c2 < c:
                improved = c - c2 > 1e-9 * max(c, 1e-12) and max(abs(x - y) for x, y in zip(t2, th)) > 1e-4
                th, r, c = t2, r2, c2
                lam = max(lam / 3, 1e-7)
                break
            lam *= 4
        if not improved:
            break
    return at(th)


def core_times(paths: list[str], scale: float) -> dict:
    """One core's far work of one (sequence, KV head) in a layer, us, by
    (ISA, config, ctx), from `hetkv bench far -t 1 --warm -o jsonl` rows
    (the least of repeated rows), divided by the desktop core's speed over
    the measuring one's."""
    out: dict = {}
    for path in paths:
        for line in open(path, encoding="utf-8"):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r.get("threads") != 1 or not r.get("warm") or not r.get("step_ms"):
                raise ValueError("%s: a row of %s threads%s; the ceiling is one core's, cached "
                                 "(bench far -t 1 --warm)" % (path, r.get("threads"),
                                                               "" if r.get("warm") else ", caches swept"))
            k = (r["isa"], r["config"], int(r["ctx"]))
            us = r["step_ms"] * 1e3 / (r["batch"] * r["kv_heads"]) / scale
            out[k] = min(us, out.get(k, us))
    return out


def desktop_table(pred: Predictor, rows: list[dict], params: dict, device: str, host_gbs: float,
                  host_mem: int, ctxs: list[int], batches: list[int], extra: list[str],
                  pingpong: bool = False, cores: tuple | None = None) -> list[dict]:
    """cores: (ISA, host cores, core_times()): each split row gets the host's
    compute ceiling, and only the configurations measured at every context
    are predicted (an unbounded one would win unfairly)."""
    # the configurations as the user named them: each context at its own budget
    specs = sorted({r["user_spec"] for r in rows if r["kind"] == "split"} | set(extra))
    if cores:
        specs = [s for s in specs if all((cores[0], s, c) in cores[2] for c in ctxs)]
    qs = []
    for ctx in ctxs:
        for b in batches:
            qs.append({"spec": "full", "ctx": ctx, "batch": b, "gpu_mem": 24 << 30,
                       "host_gbs": host_gbs, "far_kv": "f16", "kind": "dense", "host_mem": host_mem})
            for s in specs:
                far = "q8" if "far=q8" in s else "f16"
                qs.append({"spec": s, "ctx": ctx, "batch": b, "gpu_mem": 24 << 30,
                           "host_gbs": host_gbs, "far_kv": far, "kind": "split", "host_mem": host_mem,
                           "pingpong": pingpong})
                if cores:
                    qs[-1].update(core_us=cores[2][(cores[0], s, ctx)], host_cores=cores[1])
    out = []
    for q, cal, ds in zip(qs, pred.many(qs, params, device), pred.many(qs, {}, device)):
        out.append({**q, "fits": bool(cal.get("fits")), "tok_s": cal.get("built_tok_s"),
                    "datasheet_tok_s": ds.get("built_tok_s"),
                    "host_bytes_per_token": (cal.get("built_host_bytes") or 0) / q["batch"]})
    return out


def best_ratios(desk: list[dict], ctxs: list[int], host_mem: int, pingpong: bool) -> list[dict]:
    """Per context: the best dense row that fits beside the best split row."""
    out = []
    for ctx in ctxs:
        at = [x for x in desk if x["ctx"] == ctx and x["fits"] and x["tok_s"]]
        bd = max((x for x in at if x["kind"] == "dense"), key=lambda x: x["tok_s"], default=None)
        bsx = max((x for x in at if x["kind"] == "split"), key=lambda x: x["tok_s"], default=None)
        out.append({"ctx": ctx, "host_mem": host_mem, "pingpong": pingpong,
                    "best_dense": bd and {"batch": bd["batch"], "tok_s": bd["tok_s"]},
                    "best_split": bsx and {"spec": bsx["spec"], "batch": bsx["batch"],
                                           "tok_s": bsx["tok_s"]},
                    "split_over_dense": bsx["tok_s"] / bd["tok_s"] if bd and bsx else None})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--hetkv", default=os.environ.get("HKV", "build/tools/hetkv"))
    ap.add_argument("--device", default=None, help="the run's card (default: plan_predict.jsonl's)")
    ap.add_argument("--synthetic", default="llama3.1-8b")
    ap.add_argument("--desktop", default="rtx4090")
    ap.add_argument("--desktop-host-gbs", type=float, default=70.0)
    ap.add_argument("--desktop-host-mem-gib", default="64,128",
                    help="the desktop's host memory the far tier may pin, GiB; a list: the first is "
                         "the table's, each a line of the ratios (default 64,128)")
    ap.add_argument("--desktop-ctx", default="32768,65536,98304,131072")
    ap.add_argument("--desktop-batch", default="1,4,8,16")
    ap.add_argument("--holdout", action="append", default=[], metavar="JSONL",
                    help="bench rows (`hetkv bench -o jsonl`) of the same run kept out of the fit "
                         "and predicted with its terms (e.g. another thread count)")
    ap.add_argument("--desktop-configs", default="ctkvr;ctkvr:sketch=3,rho=1536,far=q8",
                    help="split configurations predicted on the desktop card besides the run's")
    ap.add_argument("--desktop-core-rows", action="append", default=[], metavar="JSONL",
                    help="`hetkv bench far -t 1 --warm -o jsonl` rows (one core, rows cached; one "
                         "file per ISA) at the desktop contexts: the host's cores as a ceiling on "
                         "its far part, beside the bandwidth terms")
    ap.add_argument("--desktop-cores", default="8,16",
                    help="the desktop's cores for --desktop-core-rows (a list: a line each)")
    ap.add_argument("--desktop-core-scale", type=float, default=1.0,
                    help="a desktop core's speed over the core that measured the rows (default 1)")
    a = ap.parse_args()
    try:
        ctimes = core_times(a.desktop_core_rows, a.desktop_core_scale)
    except (OSError, ValueError, KeyError) as e:
        print("predict_fit: --desktop-core-rows: %s" % e, file=sys.stderr)
        return 2
    hj = os.path.join(a.run_dir, "headline.json")
    try:
        headline = json.load(open(hj, encoding="utf-8"))
    except (OSError, ValueError) as e:
        print("predict_fit: cannot read %s: %s" % (hj, e), file=sys.stderr)
        return 2
    device = a.device
    pp = os.path.join(a.run_dir, "plan_predict.jsonl")
    if not device and os.path.exists(pp):
        for line in open(pp, encoding="utf-8"):
            if line.startswith("{"):
                device = json.loads(line).get("device_name")
                break
    if not device:
        print("predict_fit: no --device and no plan_predict.jsonl to take it from", file=sys.stderr)
        return 2
    rows = measured_rows(headline)
    if not rows:
        print("predict_fit: %s has no measured split or dense rows" % hj, file=sys.stderr)
        return 2
    pred = Predictor(a.hetkv, device, a.synthetic)
    default = {n: v[1] for n, v in PARAMS.items()}
    params = fit(pred, rows)
    e_ds = log_errors(pred, rows, default)
    e_in = log_errors(pred, rows, params)
    # left one out: each row by the terms fitted on the others
    e_loo = []
    for i, r in enumerate(rows):
        rest = rows[:i] + rows[i + 1:]
        if not any(x["kind"] == r["kind"] for x in rest):   # its terms would be unfitted
            e_loo.append(None)
            continue
        e_loo.append(log_errors(pred, [r], fit(pred, rest, start=params))[0])   # from the full fit
    cal = pred.many(rows, params)
    table = []
    for r, c, d0, d1, d2 in zip(rows, cal, e_ds, e_in, e_loo):
        table.append({**r, "datasheet_step_ms": r["step_ms"] * math.exp(d0),
                      "calibrated_step_ms": c["built_step_ms"],
                      "calibrated_host_busy_ms": c.get("built_host_busy_ms"),
                      "calibrated_products_ms": c.get("built_dev_products_ms"),
                      "calibrated_attn_ms": c.get("built_dev_attn_ms"),
                      "err_datasheet": math.exp(d0) - 1, "err_fit": math.exp(d1) - 1,
                      "err_left_out": None if d2 is None else math.exp(d2) - 1})
    loo = [abs(math.exp(x) - 1) for x in e_loo if x is not None]
    summary = {"device": device, "params": params, "datasheet_params": default,
               "commits": sorted({r["commit"] for r in rows if r.get("commit")}),
               "rows": len(rows),
               "max_abs_err_fit": max(abs(math.exp(x) - 1) for x in e_in),
               "max_abs_err_left_out": max(loo) if loo else None,
               "rms_log_err_fit": math.sqrt(sum(x * x for x in e_in) / len(e_in))}
    held = []
    for path in a.holdout:
        raw = []
        for line in open(path, encoding="utf-8"):
            if line.startswith("{"):
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                raw.append({**r, "kind": "dense" if r.get("policy") == "full" else "split"})
        for r in measured_rows({"rows": raw}):
            c = pred.many([r], params)[0]
            held.append({**r, "file": os.path.basename(path), "calibrated_step_ms": c["built_step_ms"],
                         "calibrated_host_busy_ms": c.get("built_host_busy_ms"),
                         "err": c["built_step_ms"] / r["step_ms"] - 1})
    if held:
        summary["max_abs_err_holdout"] = max(abs(h["err"]) for h in held)
    ctxs = [int(x) for x in a.desktop_ctx.split(",")]
    bs = [int(x) for x in a.desktop_batch.split(",")]
    extra = [x for x in a.desktop_configs.split(";") if x]
    mems = [int(x) << 30 for x in str(a.desktop_host_mem_gib).split(",") if x]
    # the table at the first host size, the split as it runs by default (ping-pong off); then
    # each host size with ping-pong off and on: which of the two decides the ratio
    desk = desktop_table(pred, rows, params, a.desktop, a.desktop_host_gbs, mems[0], ctxs, bs, extra)
    ratios = []
    for mem in mems:
        for pp in (False, True):
            d = desk if (mem, pp) == (mems[0], False) else desktop_table(
                pred, rows, params, a.desktop, a.desktop_host_gbs, mem, ctxs, bs, extra, pp)
            ratios += best_ratios(d, ctxs, mem, pp)
    # the host's cores as a ceiling: per ISA measured and core count, the same ratios
    bound = []
    for isa in sorted({k[0] for k in ctimes}):
        for n in [int(x) for x in a.desktop_cores.split(",") if x]:
            for mem in mems:
                for pp in (False, True):
                    d = desktop_table(pred, rows, params, a.desktop, a.desktop_host_gbs, mem, ctxs, bs,
                                      extra, pp, (isa, n, ctimes))
                    for x in best_ratios(d, ctxs, mem, pp):
                        bound.append({**x, "isa": isa, "host_cores": n})
    res = {"prediction_note": "the desktop rows are a PREDICTION of the calibrated model; the "
           "fit's rows are measurements beside the model's step for them",
           "summary": summary, "rows": table, "holdout": held, "desktop": {"device": a.desktop,
           "host_gbs": a.desktop_host_gbs, "gpu_mem": 24 << 30,
           "host_mem": mems[0], "rows": desk, "ratios": ratios, "core_bound": bound,
           "core_rows": a.desktop_core_rows, "core_scale": a.desktop_core_scale,
           "core_us": [{"isa": k[0], "config": k[1], "ctx": k[2], "us": v}
                       for k, v in sorted(ctimes.items())]}}
    with open(os.path.join(a.run_dir, "predict_fit.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
    md = write_md(res)
    with open(os.path.join(a.run_dir, "predict_fit.md"), "w", encoding="utf-8") as f:
        f.write(md)
    print(md)
    return 0


def fnum(v, nd=1) -> str:
    return "-" if v is None else ("%.*f" % (nd, v))


def write_md(res: dict) -> str:
    s = res["summary"]
    p, d = s["params"], s["datasheet_params"]
    out = ["## `plan --predict %s` calibrated on %d measured rows" % (s["device"], s["rows"]), "",
           "| term | data sheet's | fitted |", "|---|---|---|"]
    for n in PARAMS:
        out.append("| %s | %g | %.3g |" % (n, d[n], p[n]))
    out += ["", "Step time per row (ms): measured, the data sheet's prediction, the calibrated one; "
            "the error of the fit's own rows and of each row left out of the fit.", "",
            "| row | ctx | batch | measured | data sheet | calibrated | error (fit) | error (left out) "
            "| host busy measured / model | products measured / model | device attention measured "
            "/ model |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lo = r["err_left_out"]
        out.append("| %s %s | %d | %d | %.1f | %.1f | %.1f | %+.0f%% | %s | %s / %s | %s / %s | "
                   "%s / %s |" % (
            r["kind"], r["spec"], r["ctx"], r["batch"], r["step_ms"], r["datasheet_step_ms"],
            r["calibrated_step_ms"], 100 * r["err_fit"], "-" if lo is None else "%+.0f%%" % (100 * lo),
            fnum(r["host_busy_ms"]), fnum(r["calibrated_host_busy_ms"]), fnum(r["products_ms"], 2),
            fnum(r["calibrated_products_ms"], 2), fnum(r["near_ms"], 2), fnum(r["calibrated_attn_ms"], 2)))
    mo = s["max_abs_err_left_out"]
    out += ["", "Largest error: %.0f%% in the fit, %s left out." % (
        100 * s["max_abs_err_fit"], "-" if mo is None else "%.0f%%" % (100 * mo)), ""]
    if res.get("holdout"):
        out += ["Rows kept out of the fit (other options of the same run), by the terms above:", "",
                "| file | row | ctx | batch | host GB/s | measured ms | calibrated ms | error | host busy "
                "measured / model |", "|---|---|---|---|---|---|---|---|---|"]
        for h in res["holdout"]:
            out.append("| %s | %s %s | %d | %d | %.0f | %.1f | %.1f | %+.0f%% | %s / %s |" % (
                h["file"], h["kind"], h["spec"], h["ctx"], h["batch"], h["host_gbs"], h["step_ms"],
                h["calibrated_step_ms"], 100 * h["err"], fnum(h["host_busy_ms"]),
                fnum(h["calibrated_host_busy_ms"])))
        out.append("")
    dk = res["desktop"]
    out += ["### PREDICTION: %s, 24 GB cap, host %.0f GB/s and %d GiB, with the terms above" % (
        dk["device"], dk["host_gbs"], dk["host_mem"] >> 30), "",
            "The terms were fitted on %s rows of commit %s on its host; here they are carried to "
            "another card and host as they are, an assumption: the fit's own error (above, left "
            "out: %s) is the least this prediction carries." % (
                s["device"], ", ".join(s["commits"]) or "(not recorded)",
                "-" if mo is None else "%.0f%%" % (100 * mo)), "",
            "| config | ctx | batch | tok/s calibrated | tok/s data sheet | host MB / token |",
            "|---|---|---|---|---|---|"]
    for r in dk["rows"]:
        out.append("| %s | %d | %d | %s | %s | %s |" % (
            r["spec"], r["ctx"], r["batch"], fnum(r["tok_s"]) if r["fits"] else "does not fit",
            fnum(r["datasheet_tok_s"]) if r["fits"] else "-",
            fnum(r["host_bytes_per_token"] / 1e6, 0) if r["kind"] == "split" else "-"))
    out += ["", "The best of each side at each context; the split as it runs by default (ping-pong "
            "off) and with `--gpu-pingpong`, at each host memory size (which caps the split's "
            "batch: its far tier is page-locked). Ping-pong was measured once, +3% at 8K on an "
            "H100 where the host bound the step (docs/GPU_MEASURED.md); its rows here hide the "
            "fitted round trip behind the other half's device work, which no run has shown yet.",
            "", "| ctx | host GiB | ping-pong | best dense (batch, tok/s) | best split (config, batch, "
            "tok/s) | split / dense |", "|---|---|---|---|---|---|"]
    for x in dk["ratios"]:
        bd, bs = x["best_dense"], x["best_split"]
        out.append("| %d | %d | %s | %s | %s | %s |" % (
            x["ctx"], x.get("host_mem", dk["host_mem"]) >> 30, "on" if x.get("pingpong") else "off",
            "-" if not bd else "%d, %.1f" % (bd["batch"], bd["tok_s"]),
            "-" if not bs else "%s, %d, %.1f" % (bs["spec"], bs["batch"], bs["tok_s"]),
            "-" if x["split_over_dense"] is None else "%.2fx" % x["split_over_dense"]))
    out.append("")
    if dk.get("core_bound"):
        ctxs = sorted({x["ctx"] for x in dk["core_bound"]})
        out += ["With the host's cores as a ceiling as well: one core's far work of a (sequence, KV "
                "head) in a layer, its rows cached, measured by `hetkv bench far -t 1 --warm` (%s; "
                "a desktop core taken as %gx that core), times the items over the cores, bounds "
                "the host's part wherever it exceeds the bytes' time. Only the configurations "
                "measured so are predicted." % (
                    ", ".join(os.path.basename(p) for p in dk["core_rows"]), dk["core_scale"]), "",
                "Split / dense where the cores change it, best of each side:", "",
                "| kernels | cores | host GiB | ping-pong | " + " | ".join("%dK" % (c >> 10) for c in ctxs)
                + " |", "|---" * (4 + len(ctxs)) + "|"]
        hdr = len(out)
        free = {(x["ctx"], x.get("host_mem", dk["host_mem"]), x.get("pingpong")): x["split_over_dense"]
                for x in dk["ratios"]}
        seen, same = [], []
        for x in dk["core_bound"]:
            k = (x["isa"], x["host_cores"], x["host_mem"], x["pingpong"])
            if k in seen or k in same:
                continue
            lines = [y for y in dk["core_bound"] if (y["isa"], y["host_cores"], y["host_mem"],
                                                     y["pingpong"]) == k]
            if all(y["split_over_dense"] is not None and abs(
                    y["split_over_dense"] - (free.get((y["ctx"], y["host_mem"], y["pingpong"])) or 0))
                   < 5e-3 for y in lines):
                same.append(k)   # the bytes' time exceeds the cores' everywhere: as above
            else:
                seen.append(k)
        for k in seen:
            cells = []
            for c in ctxs:
                x = next((y for y in dk["core_bound"] if (y["isa"], y["host_cores"], y["host_mem"],
                          y["pingpong"]) == k and y["ctx"] == c), None)
                r = x and x["split_over_dense"]
                cells.append("-" if not r else "%.2fx (%s b%d)" % (
                    r, x["best_split"]["spec"].replace("ctkvr:", "").replace("ctkvr", "default"),
                    x["best_split"]["batch"]))
            out.append("| %s | %d | %d | %s | %s |" % (k[0], k[1], k[2] >> 30, "on" if k[3] else "off",
                                                      " | ".join(cells)))
        if not seen:
            del out[hdr - 5:hdr]   # no line differs: no table
        if same:
            def vals(i, f=str):
                return ", ".join(f(v) for v in sorted({k[i] for k in same}))
            out += ["", "Unchanged from the ratios above at every context (the bytes' time exceeds "
                    "the cores'): %d of the %d combinations of kernels (%s), cores (%s), host GiB "
                    "(%s) and ping-pong (%s)." % (
                        len(same), len(same) + len(seen), vals(0), vals(1), vals(2, lambda v: str(v >> 30)),
                        vals(3, lambda v: "on" if v else "off"))]
        out += ["", "One core's time a (sequence, KV head), us: " + "; ".join(
            "%s %s %dK %.0f" % (c["isa"], c["config"], c["ctx"] >> 10, c["us"]) for c in dk["core_us"]), ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())

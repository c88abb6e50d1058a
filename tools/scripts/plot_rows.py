#!/usr/bin/env python3
"""Pictures of `hetkv bench -o jsonl|csv` and `hetkv eval -o jsonl|csv` rows
(docs/BENCH_ROWS.md). From bench rows:

  decode.png    decode tokens/s against context, one line per configuration,
                one panel per batch size (log-scale context axis);
  speedup.png   decode tokens/s over full's at the same context and batch,
                against the budget (tokens), one line per policy and context;
  timeline.png  (rows measured with --device cuda) the pipeline's time per
                decode step: host far-tier work, host waiting for the device,
                device waiting for the host, the device's products and near
                attention, per configuration and batch.

From eval rows (those with a "kind"):

  fidelity.png  recall of the oracle's top tokens, KL(full || policy) of the
                next-token distribution and greedy agreement with full,
                against the budget, one line per policy and context;
  tasks.png     task accuracy as a heat map: configurations down, (task,
                context) across, the share of answers holding the value.

    python3 tools/scripts/plot_rows.py ROWS.jsonl [MORE.jsonl|.csv|BENCH.json ...] -o OUTDIR [--title TEXT]

(BENCH.json: a `hetkv bench --json` object, its results taken as rows.)

Each picture names in its title the model, device, threads, commit and date
of the rows it shows. matplotlib comes from Debian (python3-matplotlib,
tools/scripts/setup_deps.sh) or pip.
"""
import argparse
import csv
import json
import os
import sys
from collections import defaultdict

NUM = ("budget", "ctx", "batch", "steps", "threads", "probe_gbs", "prefill_tok_s", "decode_tok_s",
       "step_ms", "bytes_per_step", "gbs", "frac_of_probe", "matmul_frac", "attn_frac", "vs_full",
       "ttft_s", "dev_cpu_busy_ms", "dev_cpu_wait_ms", "dev_wait_cpu_ms", "dev_near_ms",
       "dev_products_ms", "dev_total_ms", "dev_h2d_mb", "dev_d2h_mb", "recall", "rel_err", "kl",
       "kl_max", "agree", "nll", "attended", "far", "index_bytes", "ms_per_token", "correct", "total",
       "accuracy")


def from_bench_json(d, path):
    """Rows from a `hetkv bench --json` object (older runs kept only that, e.g. the
    H200 runs in bench/out/): the fields the pictures use, the timeline per step."""
    rows = []
    dev = (d.get("device") or {}).get("backend", "cpu")
    for res in d.get("results", []):
        run = os.path.splitext(os.path.basename(path))[0]   # the file names the run: A or B
        r = {"model": d["model"], "device": dev, "threads": d["threads"],
             "commit": os.path.basename(os.path.dirname(os.path.abspath(path))), "date": "",
             "config": f"{res['config']} [{run}]", "spec": f"{res['config']} [{run}]", "policy": res["config"].split()[0], "budget": None,
             "ctx": res["ctx"], "batch": res["batch"], "decode_tok_s": res["decode_tok_s"],
             "step_ms": res["step_ms"], "vs_full": res.get("vs_full")}
        tl = res.get("timeline")
        if tl:
            n = tl.get("steps") or 1
            for key, src in (("dev_cpu_busy_ms", "cpu_busy_s"), ("dev_cpu_wait_ms", "cpu_wait_device_s"),
                             ("dev_wait_cpu_ms", "device_wait_cpu_s"), ("dev_near_ms", "device_near_s"),
                             ("dev_products_ms", "device_products_s"), ("dev_total_ms", "device_total_s")):
                r[key] = 1e3 * tl.get(src, 0.0) / n
        rows.append(r)
    return rows


def load(paths):
    rows = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            if p.endswith(".csv"):
                for r in csv.DictReader(f):
                    for k in NUM:
                        if k in r:
                            r[k] = float(r[k]) if r[k] != "" else None
                    rows.append(r)
            elif p.endswith(".json"):
                rows += from_bench_json(json.load(f), p)
            else:
                rows += [json.loads(l) for l in f if l.strip()]
    if not rows:
        raise SystemExit(f"plot_rows: no rows in {paths}")
    return rows


def about(rows, title):
    r = rows[0]
    what = f"{r['model']}, {r['device']}, {int(r['threads'])} threads, {r['commit']}, {r['date'][:10]}"
    return f"{title}\n{what}" if title else what


def finish(fig, plt, out, name, suptitle):
    """The picture's title line, its layout, the PNG."""
    fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=120)
    plt.close(fig)


def plot_decode(rows, plt, out, title):
    batches = sorted({int(r["batch"]) for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches) + 2.5, 4.2), squeeze=False)
    for ax, b in zip(axes[0], batches):
        by = defaultdict(list)
        for r in rows:
            if int(r["batch"]) == b:
                by[r.get("spec") or r["config"]].append((r["ctx"], r["decode_tok_s"]))
        for cfg, pts in sorted(by.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=cfg)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("decode throughput (tokens/s, whole batch)")
        ax.set_title(f"batch {b}")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    finish(fig, plt, out, "decode.png", about(rows, title))


def plot_speedup(rows, plt, out, title):
    sel = [r for r in rows if r.get("budget") not in (None, "") and r.get("vs_full") not in (None, "")]
    if not sel:
        return False
    batches = sorted({int(r["batch"]) for r in sel})
    fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4.2), squeeze=False)
    for ax, b in zip(axes[0], batches):
        by = defaultdict(list)
        for r in sel:
            if int(r["batch"]) == b:
                by[(r["policy"], int(r["ctx"]))].append((r["budget"], r["vs_full"]))
        for (pol, ctx), pts in sorted(by.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{pol}, ctx {ctx}")
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("budget (tokens kept or selected per KV head)")
        ax.set_ylabel("decode tokens/s / full's (same context, batch)")
        ax.set_title(f"batch {b}")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    finish(fig, plt, out, "speedup.png", about(sel, title))
    return True


def plot_timeline(rows, plt, out, title):
    sel = [r for r in rows if r.get("dev_total_ms") not in (None, "")]
    if not sel:
        return False
    parts = [("dev_cpu_busy_ms", "host: far-tier work"), ("dev_cpu_wait_ms", "host waits for device"),
             ("dev_wait_cpu_ms", "device waits for host"), ("dev_near_ms", "device: near attention"),
             ("dev_products_ms", "device: weight products")]
    labels = [f"{r['config']}\nctx {int(r['ctx'])} b {int(r['batch'])}" for r in sel]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.1 * len(sel)) * 2, 4.8))
    x = range(len(sel))
    for ax, group, name in ((axes[0], parts[:3], "host view"), (axes[1], parts[3:], "device view")):
        bottom = [0.0] * len(sel)
        for key, lab in group:
            vals = [r[key] or 0.0 for r in sel]
            ax.bar(x, vals, bottom=bottom, label=lab)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.plot(x, [r["step_ms"] for r in sel], "k_", ms=20, label="whole step")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=6, rotation=45, ha="right")
        ax.set_ylabel("ms per decode step")
        ax.set_title(name)
        ax.legend(fontsize=7)
    emu = "\n(cuda-emu: the emulator's times are not a GPU's)" if sel[0]["device"] == "cuda-emu" else ""
    finish(fig, plt, out, "timeline.png", about(sel, title) + emu)
    return True


def plot_fidelity(rows, plt, out, title):
    sel = [r for r in rows if r.get("kind") == "fidelity" and r.get("budget") not in (None, "")]
    if not sel:
        return False
    panels = [("recall", "recall of the oracle's top-budget far tokens", False),
              ("kl", "KL(full || policy), next-token distribution (nats)", True),
              ("agree", "greedy agreement with full", False)]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    by = defaultdict(list)
    for r in sel:
        by[(r["policy"], int(r["ctx"]))].append(r)
    for ax, (key, label, logy) in zip(axes, panels):
        for (pol, ctx), rs in sorted(by.items()):
            pts = sorted((r["budget"], r[key]) for r in rs if r.get(key) is not None)
            if logy:
                pts = [(b, max(v, 1e-6)) for b, v in pts]   # a zero KL drawn at the floor
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{pol}, ctx {ctx}")
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, 1.05)
        ax.set_xlabel("budget (far tokens per step and KV head)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="lower right")
    finish(fig, plt, out, "fidelity.png", about(sel, title))
    return True


def plot_tasks(rows, plt, out, title):
    sel = [r for r in rows if r.get("kind") not in (None, "", "fidelity") and r.get("accuracy") is not None]
    if not sel:
        return False
    def name(r):   # "ctkvr rho_p=20 (2%)" -> "ctkvr 2%": a budget share is one row across contexts
        lab = r["config"]
        if "(" in lab and lab.rstrip().endswith("%)"):
            return f"{r['policy']} {lab[lab.rindex('(') + 1:lab.rindex(')')]}"
        return lab
    cols = sorted({(r["kind"], int(r["ctx"])) for r in sel}, key=lambda c: (c[0], c[1]))
    cfgs = []
    for r in sel:   # first-seen order: full first, as eval runs them
        if name(r) not in cfgs:
            cfgs.append(name(r))
    acc = {(name(r), r["kind"], int(r["ctx"])): r for r in sel}
    grid = [[acc[(c, k, x)]["accuracy"] if (c, k, x) in acc else float("nan") for (k, x) in cols]
            for c in cfgs]
    fig, ax = plt.subplots(figsize=(1.2 * len(cols) + 4, 0.45 * len(cfgs) + 2))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    for i, c in enumerate(cfgs):
        for j, (k, x) in enumerate(cols):
            r = acc.get((c, k, x))
            if r:
                ax.text(j, i, f"{int(r['correct'])}/{int(r['total'])}", ha="center", va="center",
                        fontsize=7, color="white" if r["accuracy"] < 0.6 else "black")
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([f"{k}\nctx {x}" for k, x in cols], fontsize=7)
    ax.set_yticks(range(len(cfgs)))
    ax.set_yticklabels(cfgs, fontsize=7)
    fig.colorbar(im, ax=ax, label="accuracy (answers holding the value)")
    finish(fig, plt, out, "tasks.png", about(sel, title))
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot_rows: matplotlib is missing (apt-get install python3-matplotlib)")
    rows = load(a.rows)
    os.makedirs(a.out, exist_ok=True)
    bench = [r for r in rows if r.get("kind") in (None, "")]
    evals = [r for r in rows if r.get("kind") not in (None, "")]
    made = []
    if bench:
        plot_decode(bench, plt, a.out, a.title)
        made.append("decode.png")
        if plot_speedup(bench, plt, a.out, a.title):
            made.append("speedup.png")
        if plot_timeline(bench, plt, a.out, a.title):
            made.append("timeline.png")
    if plot_fidelity(evals, plt, a.out, a.title):
        made.append("fidelity.png")
    if plot_tasks(evals, plt, a.out, a.title):
        made.append("tasks.png")
    print(f"plot_rows: {len(rows)} rows -> {', '.join(os.path.join(a.out, m) for m in made)}")


if __name__ == "__main__":
    sys.exit(main())

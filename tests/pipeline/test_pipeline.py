#!/usr/bin/env python3
"""The CUDA backend (--device cuda: the device forward pass and the CPU-GPU
attention pipeline, on a GPU or on the CUDA emulator) against the CPU path,
for every policy, on a tiny generated model or a real one.

    python3 tests/pipeline/test_pipeline.py --bin-dir build-emu/tools [--model M.gguf]

Per policy configuration, hkv-dump-logits runs the same tokens on both
devices in `prompt` mode (a prefill of --prefix tokens in chunks of --rows,
decode steps, a second prompt turn, more decode steps) and in `batch` mode
(three sequences of different lengths decoding together), with a tiny near
tier so that ring eviction, the far tier and the policy's selection are
exercised at every step. Checks:
  logits  max|cuda - cpu| / max|cpu| <= tol (2e-3 tiny, 1e-2 real) at every
          row, and the argmax equal except where the CPU path has a near tie
          (top-2 gap below tol * max|cpu|), counted;
  run     `hetkv run --device cuda --temp 0` gives the CPU path's tokens;
  memory  a --gpu-mem cap too small for the weights is refused with a message
          naming the tier and the sizes, exit 1, no crash;
  fallbacks  the timeline's fallbacks (work the device offers that the host
          did instead, by reason) are exactly what the case expects: none
          but those its structure makes (expected_fallbacks), plus the reason
          --expect-fallback names for a case about falling back.
Exit 0: all passed, 1: a failure, 77: no CUDA device usable (not built with
the emulator or CUDA) or --model absent. Last line: 'test_pipeline: N passed, N failed'.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "scripts"))

NEAR = ["--sink", "2", "--local", "6"]
# hetkv run's prompt: long enough for a far tier past the near one on every model
RUN_PROMPT = ("Hello world, this is a test. The quick brown fox jumps over the lazy dog while "
              "the fishermen of a small village by the sea mend their nets.")


def policies(draft: str) -> dict[str, list[str]]:
    return {
        "full": [],
        "oracle k=8": ["--policy", "oracle", "--policy-arg", "k=8"],
        "ctkvr": ["--policy", "ctkvr"],
        # the rerank on int8 key sketches (certified: the fp16 rerank's choice); its own
        # first word, so --only ctkvr (the sanitizer runs) leaves it out
        "ctkvr-sketch sketch=1": ["--policy", "ctkvr", "--policy-arg", "sketch=1"],
        # on 4-bit sketches over the 8-bit far tier (approximate at the cut)
        "ctkvr-sketch4 sketch=3 far=q8": ["--policy", "ctkvr", "--policy-arg", "sketch=3", "--far-kv", "q8"],
        "quest budget=16": ["--policy", "quest", "--policy-arg", "budget=16"],
        "snapkv budget=12": ["--policy", "snapkv", "--policy-arg", "budget=12"],
        "rocketkv budget=12": ["--policy", "rocketkv", "--policy-arg", "budget=12"],
        "fastkv budget=12": ["--policy", "fastkv", "--policy-arg", "budget=12"],
        "laq budget=8": ["--policy", "laq", "--policy-arg", "budget=8"],
        "speckv budget=8": ["--policy", "speckv", "--policy-arg", "budget=8", "--draft", draft],
        "specpc C=20": ["--policy", "specpc", "--policy-arg", "C=20", "--draft", draft],
    }


class Results:
    def __init__(self):
        self.passed = self.failed = 0

    def report(self, ok: bool, name: str, msg: str = "") -> None:
        if ok:
            self.passed += 1
            print(f"ok   {name}{': ' + msg if msg else ''}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {name}: {msg}", flush=True)


def run(cmd, timeout, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env} if env else None)


def dump(a, model, ids, mode, extra, device, vocab, tmp, env=None):
    out = os.path.join(tmp, f"{device}.bin")
    src = ["--synthetic", model[len("synthetic:"):]] if model.startswith("synthetic:") else ["-m", model]
    cmd = [os.path.join(a.bin_dir, "hkv-dump-logits"), *src, "--tokens",
           ",".join(map(str, ids)), "--mode", mode, "-o", out, "--device", device, *extra]
    if a.threads:
        cmd += ["-t", str(a.threads)]
    if device == "cuda" and a.device_args:
        cmd += a.device_args.split()
    p = run(cmd, a.timeout, env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... --device {device} failed ({p.returncode}): "
                           f"{p.stderr.strip()[-400:]}")
    LAST_STDERR[0] = p.stderr
    if device == "cuda":   # its timeline, a JSON line on stdout
        j = json.loads(p.stdout.strip().splitlines()[-1])
        LAST_TIMELINE.clear()
        LAST_TIMELINE.update(j["device"]["timeline"])
        N_LAYER[model] = j["n_layer"]
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


LAST_TIMELINE: dict = {}   # the last --device cuda dump's pipeline timeline
LAST_STDERR = [""]         # the last dump's stderr
EMULATED = [True]          # the CUDA backend is the emulator (HKV_EMU_* applies)
N_LAYER: dict = {}         # model: its layers (from the dumps' JSON)


def fallbacks(tl: dict) -> dict:
    """The timeline's fallbacks with a count (reason: count)."""
    return {k: v for k, v in tl.get("fallbacks", {}).items() if v}


def far_from() -> int:
    """The first position whose decode step leaves far tokens (sinks + local)."""
    return int(NEAR[1]) + int(NEAR[3])


def expected_fallbacks(policy: str, n_layer: int, decode_after: list, no_prompt: int = 0) -> dict:
    """The fallbacks a case's structure makes, reason: count of (decode row, layer)s.
    decode_after: the first decode position after each prompt end that has one;
    no_prompt: decode rows with far tokens of a sequence that never had a prompt end.
      quest, rocketkv: the first decode step after a prompt end selects on the host,
        the device's near ring not current yet (it is uploaded whole in that step):
        no_device_copy;
      a sequence without a prompt end (batch mode's first): the eviction policies and
        rocketkv have no selection for the device to use, so the host selects at every
        step with far tokens; quest builds its pages from its first far token on, after
        the step that brings it: before_first_selection.
    Everything else (ctkvr, full, oracle, the prompt-end builds and scores) is on the
    device: no fallback."""
    exp = {}
    first = sum(1 for p in decode_after if p >= far_from())
    if policy in ("quest", "rocketkv") and first:
        exp["no_device_copy"] = n_layer * first
    if no_prompt and policy in ("snapkv", "laq", "speckv", "rocketkv"):
        exp["before_first_selection"] = n_layer * no_prompt
    if no_prompt and policy == "quest":
        exp["before_first_selection"] = n_layer
    return exp


def check_fallbacks(a, tl: dict, exp: dict) -> tuple[bool, str]:
    """The timeline's fallbacks against exp; with --expect-fallback, that reason
    counted besides (how many depends on the work offered) and the rest as exp."""
    got = fallbacks(tl)
    ok = sum(got.values()) == tl.get("fallbacks_total", -1)
    if a.expect_fallback:
        ok = ok and got.pop(a.expect_fallback, 0) > 0
    ok = ok and got == exp
    return ok, (f"; fallbacks {fallbacks(tl)} (expected {exp}"
                f"{' and ' + a.expect_fallback if a.expect_fallback else ''})")


def check_resident(a, policy: str) -> tuple[bool, str]:
    """With --expect-resident (and --device-args '--gpu-resident N', N slots for
    every sequence): a full case's decode rows attended their whole far tier on the
    device (device_resident_rows > 0, rows uploaded), any other policy's none."""
    if not a.expect_resident:
        return True, ""
    rows = LAST_TIMELINE.get("device_resident_rows", -1)
    up = LAST_TIMELINE.get("resident_rows_up", -1)
    ok = rows > 0 and up > 0 if policy == "full" else rows == 0
    return ok, f"; {rows} resident (decode row, layer)s, {up} far rows uploaded"


def check_graphs(a, model, ids, mode, extra, vocab, tmp, g, policy):
    """With --expect-graphs: the run just dumped (g, LAST_TIMELINE) against the
    same one with --gpu-no-graphs; returns (ok, message)."""
    if not a.expect_graphs:
        return True, ""
    tl = dict(LAST_TIMELINE)
    steps, caps = tl.get("graph_steps", -1), tl.get("graph_captures", -1)
    if policy != "full":   # a device part: nothing recorded (so nothing to compare)
        return steps == 0, f"; graphs: {steps} steps replayed (none wanted: a device part)"
    g0 = dump(a, model, ids, mode, extra + ["--gpu-no-graphs"], "cuda", vocab, tmp)
    same = g.shape == g0.shape and bool(np.array_equal(g, g0, equal_nan=True))
    off = LAST_TIMELINE.get("graph_steps", -1)
    want = steps > caps > 0
    msg = (f"; graphs: {steps} steps replayed ({caps} recorded), {off} with --gpu-no-graphs, "
           f"logits {'bit-identical' if same else 'DIFFER'}")
    if not EMULATED[0]:   # a real device records what it is given
        return same and want and off == 0, msg
    # a device that refuses to record: warned, the steps op by op
    g1 = dump(a, model, ids, mode, extra, "cuda", vocab, tmp, {"HKV_EMU_REFUSE_CAPTURE": "1"})
    same1 = g.shape == g1.shape and bool(np.array_equal(g, g1, equal_nan=True))
    warned = "could not record" in LAST_STDERR[0]
    refused = LAST_TIMELINE.get("graph_steps", -1)
    ok1 = same1 and warned and refused == 0
    want = want and ok1
    msg += (f"; recording refused: {refused} graph steps, warned {warned}, logits "
            f"{'bit-identical' if same1 else 'DIFFER'}")
    return same and want and off == 0, msg


def compare(c, g, tol):
    rows = [i for i in range(c.shape[0]) if not np.isnan(c[i]).any()]
    if not rows:
        return False, "no rows"
    worst, ties, bad = 0.0, 0, []
    for i in rows:
        if np.isnan(g[i]).any():
            return False, f"row {i}: NaN on the device"
        scale = float(np.max(np.abs(c[i]))) or 1.0
        rel = float(np.max(np.abs(g[i] - c[i]))) / scale
        worst = max(worst, rel)
        ac, ag = int(np.argmax(c[i])), int(np.argmax(g[i]))
        if ac != ag:
            top2 = np.sort(c[i])[-2:]
            if top2[1] - top2[0] < tol * scale:
                ties += 1
            else:
                bad.append(i)
    ok = worst <= tol and not bad
    return ok, (f"{len(rows)} rows, worst rel {worst:.2e} (tol {tol:.0e}), argmax differs at "
                f"{bad[:5]}{' (near ties: %d)' % ties if ties else ''}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--model", help="a real GGUF model (default: a tiny generated one)")
    ap.add_argument("--synthetic", help="a synthetic model of a real shape (hetkv's --synthetic, "
                    "e.g. llama3-8b@1): no tokenizer, so no `hetkv run` and no draft policies")
    ap.add_argument("--n-tokens", type=int, default=44)
    ap.add_argument("--only", help="comma-separated policy names")
    ap.add_argument("--modes", default="prompt,batch", help="which of prompt,batch to run")
    ap.add_argument("--rows", default="5,64", help="prefill chunk sizes of the prompt mode")
    ap.add_argument("--threads", type=int, default=0,
                    help="host threads (-t; 0: one per core). ThreadSanitizer runs use 1: OpenMP's "
                    "runtime is not instrumented, so its joins are invisible and every parallel "
                    "region would report; the pipeline's own threads (device streams, the "
                    "emulator's workers, the host thread) are what the run checks")
    ap.add_argument("--dump-only", action="store_true",
                    help="only the logits comparisons (sanitizer builds: no run, bench, cap checks)")
    ap.add_argument("--long", type=int, default=0, metavar="N",
                    help="also decode N tokens with hetkv run --device cuda (ctkvr, dcu=1): it must "
                    "end cleanly (under ASan: no leak)")
    ap.add_argument("--near", metavar="SINK,LOCAL",
                    help="the near tier (default 2,6: a far tier from the 9th token); a wide one "
                    "(e.g. 4,252) makes the device split its near attention across blocks "
                    "(flash-decoding)")
    ap.add_argument("--device-args", default="",
                    help="extra options for the --device cuda side only (e.g. '--gpu-gemm split')")
    ap.add_argument("--budget", type=int, default=0,
                    help="the budget of every policy that takes one, instead of its case's")
    ap.add_argument("--expect-deferred", action="store_true",
                    help="the near tier holds every context: hetkv run --device cuda must run host "
                         "steps behind the device (host_deferred_steps > 0) and give the CPU path's "
                         "tokens, and with --gpu-lockstep none")
    ap.add_argument("--expect-graphs", action="store_true",
                    help="the near tier holds every context: every dump case runs again with "
                         "--gpu-no-graphs and must give bit-identical logits; a policy without a "
                         "device part (full) must have replayed decode steps as CUDA graphs "
                         "(graph_steps > 0, a graph recorded per batch shape), one with a device "
                         "part none (pipeline/cuda_graph.c)")
    ap.add_argument("--expect-waits", action="store_true",
                    help="hetkv run --device cuda with --gpu-spin-us 0 (every wait for the "
                         "device's rows sleeps on its event), with a 1 s poll (none sleeps) and "
                         "with the OpenMP team waiting too (--gpu-team-spin) gives the CPU "
                         "path's tokens, and the timeline counts the waits so")
    ap.add_argument("--expect-pingpong", action="store_true",
                    help="with --device-args=--gpu-pingpong: hetkv bench --device cuda at batch 4 "
                         "must run micro-batch steps (pingpong_steps > 0) for each policy")
    ap.add_argument("--expect-streamed", action="store_true",
                    help="with --device-args '--gpu-prompt-keys N': every prompt-mode case must "
                         "attend prompt rows on the device with keys streamed from the far tier "
                         "(prompt_rows_streamed > 0), the logits still the CPU path's")
    ap.add_argument("--expect-resident", action="store_true",
                    help="with --device-args '--gpu-resident 3': full's decode rows attend their "
                         "whole far tier on the device (pipeline/cuda_resident.c), copied up as it "
                         "grows, the logits still the CPU path's; the other policies none")
    ap.add_argument("--both-args", default="",
                    help="extra options for both sides, CPU and --device cuda, of every case "
                         "(e.g. '--far-kv q8': the 8-bit far tier, which the device's prompt "
                         "rounds to)")
    ap.add_argument("--policy-arg", action="append", default=[], metavar="K=V",
                    help="one more argument for every selected policy case (e.g. window=4: an "
                         "observation window shorter than the prompt, so that scores decide)")
    ap.add_argument("--expect-device-scores", action="store_true",
                    help="every prompt-mode case's prompt-end window scores ran on the device "
                         "(window_scores_device > 0, none declined to the host)")
    ap.add_argument("--expect-fallback", metavar="REASON",
                    help="a case about falling back (e.g. no_room, with --device-args "
                         "'--gpu-offload-mem 1K'): every prompt-mode case and greedy run counts "
                         "REASON in the timeline's fallbacks besides what its structure makes, "
                         "and still gives the CPU path's logits and tokens; with no_room no "
                         "prompt-end index build or window scoring ran on the device")
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args(argv)
    global NEAR
    if a.near:
        sink, local = a.near.split(",")
        NEAR = ["--sink", sink, "--local", local]
    res = Results()
    hetkv = os.path.join(a.bin_dir, "hetkv")
    info = run([hetkv, "info", "--json"], 60)
    try:
        backend = json.loads(info.stdout).get("cuda", {}).get("backend", "none")
    except (ValueError, AttributeError):
        backend = "none"
    if backend == "none":
        print("test_pipeline: skipped: this hetkv has no CUDA backend (build with -Dgpu_emu=true)")
        return 77
    EMULATED[0] = backend == "cuda-emu"
    with tempfile.TemporaryDirectory() as tmp:
        if a.synthetic:
            model, tol = "synthetic:" + a.synthetic, 1e-2
        elif a.model:
            if not os.path.exists(a.model):
                print(f"test_pipeline: skipped: {a.model} is absent")
                return 77
            model, tol = a.model, 1e-2
        else:
            import gen_tiny_gguf as gen
            model, tol = os.path.join(tmp, "tiny.gguf"), 2e-3
            gen.write_model(gen.PRESETS["llama_gqa3_q41"], model, verbose=False)
        try:   # the vocabulary, from the width of one dumped row
            vocab = dump(a, model, [1], "prefill", [], "cpu", 0, tmp).shape[1]
        except RuntimeError as e:
            res.report(False, "model", str(e))
            return 1
        rng = np.random.default_rng(7)
        n = a.n_tokens
        ids = [int(x) for x in rng.integers(3, vocab, n)]
        pre, t2 = n // 2, (n // 2 + 6, n // 2 + 14)   # prompt, decode 6, second turn, decode
        cases = policies(model)
        if a.budget:
            cases = {k.replace(k.split(" budget=")[-1], str(a.budget)) if " budget=" in k else k:
                     [f"budget={a.budget}" if x.startswith("budget=") else x for x in v]
                     for k, v in cases.items()}
        if a.synthetic:
            cases = {k: v for k, v in cases.items() if "--draft" not in v}
        only = set(a.only.split(",")) if a.only else None
        for kv in a.policy_arg:
            cases = {k: v + ["--policy-arg", kv] for k, v in cases.items()}
        if a.both_args:
            cases = {k: v + a.both_args.split() for k, v in cases.items()}
        for name, pol in cases.items():
            if only and name.split()[0] not in only:
                continue
            for rows in ([["--rows", r] for r in a.rows.split(",")] if "prompt" in a.modes else []):
                extra = [*NEAR, *pol, *rows]
                label = f"{name} prompt+turn2 {' '.join(rows)}"
                try:
                    mode_args = ["--prefix", str(pre), "--turn2", f"{t2[0]},{t2[1]}"]
                    c = dump(a, model, ids, "prompt", extra + mode_args, "cpu", vocab, tmp)
                    g = dump(a, model, ids, "prompt", extra + mode_args, "cuda", vocab, tmp)
                    ok, msg = compare(c, g, tol)
                    exp = expected_fallbacks(name.split()[0], N_LAYER[model],
                                             [p for p in (pre, t2[1]) if p < n])
                    fok, fmsg = check_fallbacks(a, LAST_TIMELINE, exp)
                    gok, gmsg = check_graphs(a, model, ids, "prompt", extra + mode_args, vocab, tmp,
                                             g, name.split()[0])
                    rok, rmsg = check_resident(a, name.split()[0])
                    ok, msg = ok and fok and gok and rok, msg + fmsg + gmsg + rmsg
                    if a.expect_fallback == "no_room":   # the prompt-end work went to the host
                        done = LAST_TIMELINE.get("index_builds_device", 0) + \
                            LAST_TIMELINE.get("window_scores_device", 0)
                        ok = ok and done == 0
                        msg += f", {done} prompt-end offloads on the device"
                    if a.expect_streamed:
                        st = LAST_TIMELINE.get("prompt_rows_streamed", 0)
                        ok = ok and st > 0
                        msg += (f"; {st} of {LAST_TIMELINE.get('prompt_rows_device')} device prompt "
                                "rows streamed keys from the far tier")
                        if name.split()[0] == "ctkvr":   # its index built on the device all the same
                            ib = LAST_TIMELINE.get("index_builds_device", 0)
                            ok = ok and ib > 0
                            msg += f", {ib} index builds on the device"
                    if a.expect_device_scores:
                        sd = LAST_TIMELINE.get("window_scores_device", 0)
                        sh = LAST_TIMELINE.get("window_scores_host", 0)
                        ok = ok and sd > 0 and sh == 0
                        msg += f"; window scores: {sd} on the device, {sh} on the host"
                    res.report(ok, label, msg)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    res.report(False, label, str(e))
            if name.split()[0] in ("fastkv", "specpc") or "batch" not in a.modes:
                continue   # prompt-processing policies: their prefill is the prompt mode's
            label = f"{name} batch of 3 lengths"
            try:
                extra = [*NEAR, *pol]
                c = dump(a, model, ids, "batch", extra, "cpu", vocab, tmp)
                g = dump(a, model, ids, "batch", extra, "cuda", vocab, tmp)
                ok, msg = compare(c, g, tol)
                # seq 0 decodes from its first token (no prompt end), seqs 1 and 2
                # from the end of prompts of n // 3 and n // 2 tokens (hkv-dump-logits)
                exp = expected_fallbacks(name.split()[0], N_LAYER[model],
                                         [p for p in (n // 3, n // 2) if p < n],
                                         max(0, n - far_from()))
                fok, fmsg = check_fallbacks(a, LAST_TIMELINE, exp)
                gok, gmsg = check_graphs(a, model, ids, "batch", extra, vocab, tmp, g,
                                         name.split()[0])
                rok, rmsg = check_resident(a, name.split()[0])
                res.report(ok and fok and gok and rok, label, msg + fmsg + gmsg + rmsg)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                res.report(False, label, str(e))
        if a.long:   # a long decode through the pipeline (DCU grows the index every step)
            p = run([hetkv, "run", "-m", model, "-p", "Hello world, this is a test.", "-n", str(a.long),
                     "-c", str(a.long + 64),
                     "--temp", "0", "--ignore-eos", "--json", "--device", "cuda", *NEAR,
                     *(["-t", str(a.threads)] if a.threads else []),
                     "--policy", "ctkvr", "--policy-arg", "dcu=1"], a.timeout)
            try:
                j = json.loads(p.stdout.strip().splitlines()[-1])
                ok = p.returncode == 0 and j["n_generated"] == a.long
                res.report(ok, f"long decode of {a.long} tokens (ctkvr dcu=1)",
                           f"exit {p.returncode}, far tier peak {j['memory']['far']} bytes, "
                           f"{j['device']['timeline']['near_resyncs']} near resyncs")
            except (ValueError, KeyError, IndexError) as e:
                res.report(False, f"long decode of {a.long} tokens", f"exit {p.returncode}: {e}: "
                           f"{p.stderr.strip()[-400:]}")
        if a.expect_deferred:   # every row's keys near: the host's steps run behind the device
            for name, pol in cases.items():
                if only and name.split()[0] not in only:
                    continue
                got = {}
                for dev in (["cpu"], ["cuda"], ["cuda", "--gpu-lockstep"]):
                    p = run([hetkv, "run", "-m", model, "-p", "Hello world, this is a test.", "-n", "10",
                             "--temp", "0", "--json", "--device", *dev, *NEAR, *pol], a.timeout)
                    try:
                        j = json.loads(p.stdout.strip().splitlines()[-1])
                        got[" ".join(dev)] = (j["tokens"], j.get("device", {}).get("timeline", {}))
                    except (ValueError, IndexError) as e:
                        got[" ".join(dev)] = (f"exit {p.returncode}: {e}: {p.stderr.strip()[-300:]}", {})
                (tc, _), (tg, tl), (tk, tk_tl) = got["cpu"], got["cuda"], got["cuda --gpu-lockstep"]
                # no far tokens, so nothing for the device to hand back: no fallback
                res.report(tc == tg == tk and tl.get("host_deferred_steps", 0) > 0
                           and tk_tl.get("host_deferred_steps", 1) == 0
                           and tl.get("fallbacks_total", 1) == 0
                           and tk_tl.get("fallbacks_total", 1) == 0,
                           f"run {name}: host steps behind the device, the CPU path's tokens",
                           f"cpu {tc} cuda {tg} lockstep {tk}; deferred "
                           f"{tl.get('host_deferred_steps')} of {tl.get('layer_steps')} layer steps, "
                           f"lockstep {tk_tl.get('host_deferred_steps')}; fallbacks "
                           f"{fallbacks(tl)}, lockstep {fallbacks(tk_tl)}")
        if a.expect_waits:   # the host's waits for the device: slept, or polled to the end
            for name, pol in cases.items():
                if only and name.split()[0] not in only:
                    continue
                got = {}
                for dev in (["cpu"], ["cuda", "--gpu-spin-us", "0"],
                            ["cuda", "--gpu-spin-us", "1000000"], ["cuda", "--gpu-team-spin"]):
                    p = run([hetkv, "run", "-m", model, "-p", RUN_PROMPT, "-n", "8", "--temp", "0",
                             "--json", "--device", *dev, *NEAR, *pol], a.timeout)
                    try:
                        j = json.loads(p.stdout.strip().splitlines()[-1])
                        got[dev[-1]] = (j["tokens"], j.get("device", {}).get("timeline", {}))
                    except (ValueError, IndexError) as e:
                        got[dev[-1]] = (f"exit {p.returncode}: {e}: {p.stderr.strip()[-300:]}", {})
                (tc, _), (ts, sl), (tp, po) = got["cpu"], got["0"], got["1000000"]
                tt, te = got["--gpu-team-spin"]   # the team waiting with the host
                res.report(tt == tc and te.get("host_waits", 0) > 0,
                           f"run {name}: the team waits with the host (--gpu-team-spin)",
                           f"cpu {tc} team {tt}; waits {te.get('host_waits')}")
                res.report(tc == ts == tp and sl.get("host_waits", 0) > 0
                           and sl.get("host_waits_slept") == sl.get("host_waits")
                           and po.get("host_waits", 0) > 0 and po.get("host_waits_slept") == 0,
                           f"run {name}: the host's waits slept, or polled to the end",
                           f"cpu {tc} sleep {ts} poll {tp}; waits (slept) "
                           f"{sl.get('host_waits')} ({sl.get('host_waits_slept')}), "
                           f"{po.get('host_waits')} ({po.get('host_waits_slept')})")
        if a.expect_pingpong:   # the decode steps ran as two micro-batches
            for name, pol in cases.items():
                if only and name.split()[0] not in only or "--draft" in pol:
                    continue
                p = run([hetkv, "bench", "-m", model, "--device", "cuda", "--ctx", "40", "--batch", "4",
                         "--steps", "3", "--json", *NEAR, *pol, *a.device_args.split()], a.timeout)
                try:
                    pt = json.loads(p.stdout.strip().splitlines()[-1])["results"][0]
                    tl = pt["timeline"]
                    # the sequences are forks of the prompt's, their first step (a near
                    # resync) untimed: the timed steps and the prefill fall back nowhere
                    res.report(p.returncode == 0 and tl["pingpong_steps"] > 0
                               and tl["fallbacks_total"] == 0
                               and pt["prefill_timeline"]["fallbacks_total"] == 0,
                               f"bench {name} batch 4: micro-batch steps",
                               f"{tl['pingpong_steps']} micro-batch layer steps; fallbacks "
                               f"{fallbacks(tl)}, prefill {fallbacks(pt['prefill_timeline'])}")
                except (ValueError, KeyError, IndexError) as e:
                    res.report(False, f"bench {name} batch 4: micro-batch steps",
                               f"exit {p.returncode}: {e}: {p.stderr.strip()[-300:]}")
        if a.dump_only:
            print(f"test_pipeline: {res.passed} passed, {res.failed} failed")
            return 1 if res.failed else 0
        # greedy generation, the policies --only names (pipeline_smollm2_ctkvr: ctkvr alone)
        for name in (() if a.synthetic else ("full", "ctkvr", "quest budget=16", "snapkv budget=12",
                                                 "rocketkv budget=12", "laq budget=8")):
            if only and name.split()[0] not in only:
                continue
            pol = cases[name]
            toks = {}
            for dev in ("cpu", "cuda"):
                dargs = a.device_args.split() if dev == "cuda" else []
                p = run([hetkv, "run", "-m", model, "-p", RUN_PROMPT, "-n", "12",
                         "--temp", "0", "--json", "--device", dev, *NEAR, *pol, *dargs], a.timeout)
                if p.returncode != 0:
                    toks[dev] = f"exit {p.returncode}: {p.stderr.strip()[-300:]}"
                    continue
                j = json.loads(p.stdout.strip().splitlines()[-1])
                toks[dev] = j["tokens"]
                if dev == "cuda":
                    d = j.get("device", {})
                    tl = d.get("timeline", {})
                    # ctkvr's centroid recall runs on the device (pipeline/cuda_recall.c)
                    # and its index is built there at prompt end (pipeline/cuda_index.c),
                    # never by the host; SmolLM2's 8-token prompt leaves no far tier to index
                    # (with --expect-fallback no_room: by the host, counted)
                    nr = a.expect_fallback == "no_room"
                    recalls_ok = name != "ctkvr" or (
                        tl.get("device_recalls", 0) > 0 and
                        (nr or (tl.get("index_builds_host", 1) == 0
                                and (a.model or tl.get("index_builds_device", 0) > 0))))
                    # the prompt (from position 0, room on the device) is attended there
                    recalls_ok = recalls_ok and tl.get("prompt_rows_device", 0) > 0 \
                        and tl.get("prompt_rows_host", 1) == 0
                    # eviction policies' kept rows are attended on the device
                    # (pipeline/cuda_keep.c), copied up once per selection
                    # (laq: stage 1, then the re-selection after its lookahead)
                    evicts = name.split()[0] in ("snapkv", "laq")
                    if evicts:   # their prompt-end window scores too (cuda_index.c)
                        recalls_ok = recalls_ok and tl.get("device_kept_rows", 0) > 0 \
                            and 0 < tl.get("kept_resyncs", 0) < tl.get("layer_steps", 0) \
                            and (nr or (tl.get("window_scores_device", 0) > 0
                                        and tl.get("window_scores_host", 1) == 0))
                    else:
                        recalls_ok = recalls_ok and tl.get("device_kept_rows", 1) == 0
                    # quest selects its pages on the device (pipeline/cuda_pages.c), and
                    # rocketkv its stage 2 (pipeline/cuda_rocket.c), from the second decode
                    # step on (the first follows the prompt end)
                    if name.split()[0] in ("quest", "rocketkv"):
                        recalls_ok = recalls_ok and tl.get("device_selects", 0) > 0 \
                            and 0 < tl.get("page_resyncs", 0) < tl.get("layer_steps", 0)
                    else:
                        recalls_ok = recalls_ok and tl.get("device_selects", 1) == 0
                    # the device's time in the weight products and in whole forward
                    # calls (events on its stream), the products within the calls
                    prod, total = tl.get("device_products_s", 0), tl.get("device_total_s", 0)
                    timed = 0 < prod <= total
                    res.report(d.get("backend") in ("cuda", "cuda-emu") and tl.get("decode_rows", 0) > 0
                               and tl.get("bytes_d2h", 0) > 0 and recalls_ok and timed,
                               f"run {name}: JSON names the device and its timeline",
                               json.dumps(d)[:300])
                    # the first decode step follows the prompt end (n_prompt tokens)
                    if model not in N_LAYER:   # (no dump of this model on the device yet)
                        dump(a, model, [1], "prefill", [], "cuda", 0, tmp)
                    exp = expected_fallbacks(name.split()[0], N_LAYER[model], [j["n_prompt"]])
                    fok, fmsg = check_fallbacks(a, tl, exp)
                    res.report(fok, f"run {name}: fallbacks as expected", fmsg[2:])
            res.report(toks["cpu"] == toks["cuda"], f"run {name}: greedy tokens equal",
                       f"cpu {toks['cpu']} cuda {toks['cuda']}")
        # hetkv bench --device cuda: decode steps through the pipeline, timeline per point
        src = ["--synthetic", a.synthetic] if a.synthetic else ["-m", model]
        p = run([hetkv, "bench", *src, "--device", "cuda", "--ctx", "24", "--batch", "2", "--steps", "1",
                 "--json", *NEAR, "--policy", "ctkvr"], a.timeout)
        try:
            j = json.loads(p.stdout.strip().splitlines()[-1])
            pt, dev = j["results"][0], j["device"]
            tl = pt["timeline"]
            ok = (p.returncode == 0 and dev["backend"] in ("cuda", "cuda-emu") and tl["bytes_d2h"] > 0
                  and tl["bytes_h2d"] > 0 and tl["cpu_busy_s"] > 0 and pt["decode_tok_s"] > 0
                  and tl["device_recalls"] > 0 and 0 < tl["device_products_s"] <= tl["device_total_s"]
                  # ctkvr's decode steps and its shared prefill: nothing fell back
                  and tl["fallbacks_total"] == 0 and pt["prefill_timeline"]["fallbacks_total"] == 0)
            res.report(ok, "bench --device cuda --json: a timeline per point", json.dumps(tl))
        except (ValueError, KeyError, IndexError) as e:
            res.report(False, "bench --device cuda --json", f"exit {p.returncode}: {e}: "
                       f"{p.stderr.strip()[-300:]}")
        if a.synthetic:
            print(f"test_pipeline: {res.passed} passed, {res.failed} failed")
            return 1 if res.failed else 0
        # a device memory cap too small for the weights
        p = run([hetkv, "run", "-m", model, "-p", "Hi", "-n", "2", "--device", "cuda", "--gpu-mem",
                 "64K"], 300)
        msg = p.stderr.strip()
        res.report(p.returncode == 1 and ("cap" in msg) and "Segmentation" not in msg,
                   "a 64K --gpu-mem is refused cleanly", f"exit {p.returncode}: {msg[-300:]}")
    print(f"test_pipeline: {res.passed} passed, {res.failed} failed")
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())

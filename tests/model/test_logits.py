#!/usr/bin/env python3
"""End-to-end check of the C engine's logits against the numpy reference.

    python3 tests/model/test_logits.py --bin-dir build/tools --tiny
    python3 tests/model/test_logits.py --bin-dir build/tools --model models/SmolLM2-135M-Instruct.Q4_1.gguf
    (both flags together run both parts)

The C side (contract):
  hkv-dump-logits -m MODEL --tokens 1,2,3 --mode prefill|decode|batch -o OUT.bin [-t N]
      writes little-endian float32 logits [n_tokens][vocab], one row per position.
      prefill: all tokens in one forward batch; decode: one token per step;
      batch: the tokens split into 3 sequences of different lengths advancing
      together in batched decode steps, rows written in the original order.
  hetkv run -m MODEL -p TEXT -n N --temp 0 --json
      prints one JSON object with at least prompt_tokens and tokens (new ids).

Reference: tests/ref/ref_forward.py (float64, K/V rounded to fp16 as the
runtime's KV cache stores them). Tiny models: tools/scripts/gen_tiny_gguf.py presets.

Checks, per case:
  logits   rel = max|c - ref| / max|ref| <= tol (tiny 2e-3, real 1e-2) and the
           argmax equal at every position; a different argmax is accepted only
           where the reference itself has a near tie (its top logit exceeds the
           logit of C's pick by less than tol * max|ref|), and is counted.
  batch    compared with the single-sequence reference (the contract: rows equal
           the other modes). If that fails, the harness also tries reading the
           rows as 3 independent sequences (contiguous chunks, each from position
           0) and says which reading matched.
  greedy   `hetkv run --json`'s tokens, teacher-forced through the reference:
           at every step C's token must be the reference argmax after
           prompt_tokens + the tokens before it (same near-tie rule). Real
           model: at least --n-gen (32) steps must be compared.

Exit 0: all passed; 1: a failure; 77: --model given but the file is absent
(and nothing failed). The last line is 'test_logits: N passed, N failed, N skipped'.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
sys.path.insert(0, os.path.join(ROOT, "tools", "scripts"))

SKIP = 77
EOG_NAMES = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "</s>")
DEFAULT_PROMPT = "The history of the steam engine begins"


class CaseError(Exception):
    pass


class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0
        self.failures: list[str] = []

    def report(self, ok: bool, name: str, msg: str) -> None:
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            self.failures.append(name)
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)

    def skip(self, name: str, msg: str) -> None:
        self.skipped += 1
        print(f"SKIP {name}: {msg}", flush=True)


# ---------------------------------------------------------------- C side

def find_exe(bin_dir: str, name: str) -> str | None:
    for d in (bin_dir, os.path.join(bin_dir, "tools")):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    t0 = time.time()
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CaseError(f"timed out after {timeout:.0f}s: {shlex.join(cmd)}")
    except OSError as e:
        raise CaseError(f"cannot run {cmd[0]}: {e}")
    cp.elapsed = time.time() - t0  # type: ignore[attr-defined]
    if cp.returncode != 0:
        tail = (cp.stderr or "").strip().splitlines()[-8:]
        raise CaseError(f"exit {cp.returncode}: {shlex.join(cmd)}\n    " + "\n    ".join(tail))
    return cp


def c_dump_logits(a, model: str, ids: list[int], mode: str, vocab: int, tmp: str) -> np.ndarray:
    out = os.path.join(tmp, f"logits_{mode}_{os.getpid()}.bin")
    if os.path.exists(out):
        os.remove(out)
    cmd = [a.dump_exe, "-m", model, "--tokens", ",".join(map(str, ids)), "--mode", mode, "-o", out]
    if a.threads:
        cmd += ["-t", str(a.threads)]
    cmd += shlex.split(a.dump_args)
    _run(cmd, a.timeout)
    if not os.path.exists(out):
        raise CaseError(f"{os.path.basename(a.dump_exe)} wrote no {out}")
    raw = np.fromfile(out, dtype="<f4")
    os.remove(out)
    if raw.size != len(ids) * vocab:
        raise CaseError(f"output has {raw.size} floats, expected {len(ids)} x {vocab} = {len(ids) * vocab}")
    return raw.reshape(len(ids), vocab).astype(np.float64)


def parse_run_json(stdout: str) -> dict:
    dec = json.JSONDecoder()
    for i, ch in enumerate(stdout):
        if ch != "{":
            continue
        try:
            obj, _ = dec.raw_decode(stdout[i:])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "tokens" in obj and "prompt_tokens" in obj:
            return obj
    raise CaseError("no JSON object with prompt_tokens and tokens in stdout:\n    " +
                    "\n    ".join(stdout.strip().splitlines()[-5:]))


def c_run_greedy(a, model: str, prompt: str, n: int) -> tuple[list[int], list[int]]:
    cmd = [a.hetkv_exe, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "--json"]
    cmd += shlex.split(a.run_args)
    cp = _run(cmd, a.timeout)
    obj = parse_run_json(cp.stdout)
    try:
        return [int(x) for x in obj["prompt_tokens"]], [int(x) for x in obj["tokens"]]
    except (TypeError, ValueError):
        raise CaseError("prompt_tokens / tokens are not lists of integers")


# ---------------------------------------------------------------- comparisons

# The runtime repacks Q4_K into its Q4 format with each 32-element sub-block's
# scale and min (d*sc, dmin*m) rounded to fp16, and other K-quants (Q6_K, ...)
# to F16 (docs/HOST_KERNELS.md, "Weights"): a relative rounding of 2^-11 per
# weight, not exact like Q4_0/Q4_1/Q8_0. Presets with such tensors get this
# tolerance; still far below the 4e-2 that quantising activations to Q8, as
# ggml's own dot products do, costs on the real model.
KQUANT_TOL = 5e-3


def preset_tol(preset, base: float) -> float:
    text = repr(preset).lower()
    return max(base, KQUANT_TOL) if ("q4_k" in text or "q6_k" in text or "mix" in text) else base


def compare_logits(c: np.ndarray, r: np.ndarray, tol: float) -> tuple[bool, str, dict]:
    scale = float(np.abs(r).max())
    if not np.isfinite(c).all():
        bad = np.argwhere(~np.isfinite(c))[0]
        return False, f"non-finite value at position {bad[0]} token {bad[1]}", {}
    diff = np.abs(c - r)
    max_abs = float(diff.max())
    rel = max_abs / scale
    worst = int(diff.max(axis=1).argmax())
    ra = r.argmax(axis=1)
    ca = c.argmax(axis=1)
    same = ra == ca
    tie_eps = tol * scale
    gap = r[np.arange(len(r)), ra] - r[np.arange(len(r)), ca]
    near = (~same) & (gap <= tie_eps)
    bad = (~same) & ~near
    ok = rel <= tol and not bad.any()
    msg = (f"n={len(r)} vocab={r.shape[1]} max|diff|={max_abs:.3e} max|ref|={scale:.3g} "
           f"rel={rel:.2e} (tol {tol:g}, worst pos {worst}) argmax {int(same.sum())}/{len(r)}")
    if near.any():
        msg += f" (+{int(near.sum())} near-tie)"
    if bad.any():
        p = int(np.argmax(bad))
        msg += f"; argmax differs at pos {p}: C {ca[p]} vs ref {ra[p]} (ref gap {gap[p]:.3g})"
    return ok, msg, dict(max_abs=max_abs, rel=rel)


def batch_as_chunks(ref, ids: list[int], c: np.ndarray, tol: float):
    """Read batch rows as independent sequences (contiguous chunks of ids, each
    starting at position 0). Returns (ok, msg) or None when no 3-chunk reading fits."""
    n = len(ids)
    cache: dict[int, np.ndarray] = {}

    def from_start(s: int) -> np.ndarray:
        if s not in cache:
            cache[s] = ref.logits(ids[s:])
        return cache[s]

    starts = [0]
    expect = [from_start(0)[0]]
    for i in range(1, n):
        s = starts[-1]
        cont = from_start(s)[i - s]
        new = from_start(i)[0]
        if np.abs(c[i] - new).max() < np.abs(c[i] - cont).max():
            starts.append(i)
            expect.append(new)
        else:
            expect.append(cont)
    if len(starts) != 3:
        return None
    ok, msg, _ = compare_logits(c, np.array(expect), tol)
    lens = [b - a for a, b in zip(starts, starts[1:] + [n])]
    return ok, msg + f" [read as 3 independent sequences of lengths {lens}]"


def check_logit_modes(a, res: Results, ref, name: str, model: str, ids: list[int], tol: float,
                      tmp: str) -> None:
    r = ref.logits(ids)
    for mode in a.modes:
        case = f"{name} {mode}"
        try:
            c = c_dump_logits(a, model, ids, mode, ref.vocab, tmp)
        except CaseError as e:
            res.report(False, case, str(e))
            continue
        ok, msg, _ = compare_logits(c, r, tol)
        if not ok and mode == "batch":
            alt = batch_as_chunks(ref, ids, c, tol)
            if alt is not None and alt[0]:
                ok, msg = alt
            else:
                msg += " [also no fit as 3 independent sequences]"
        res.report(ok, case, msg)


def eog_ids(model: str) -> set[int]:
    from gguf import GGUFReader
    r = GGUFReader(model)
    out = set()
    f = r.fields.get("tokenizer.ggml.eos_token_id")
    if f is not None:
        out.add(int(f.contents()))
    f = r.fields.get("tokenizer.ggml.eot_token_id")
    if f is not None:
        out.add(int(f.contents()))
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    for i, t in enumerate(toks):
        if t in EOG_NAMES:
            out.add(i)
    return out


def check_greedy(res: Results, ref, name: str, model: str, prompt_ids: list[int], c_toks: list[int],
                 n_asked: int, n_required: int, tol: float) -> None:
    if not prompt_ids:
        res.report(False, name, "empty prompt_tokens")
        return
    if not c_toks:
        res.report(False, name, "no generated tokens")
        return
    bad_ids = [t for t in prompt_ids + c_toks if not 0 <= t < ref.vocab]
    if bad_ids:
        res.report(False, name, f"token id {bad_ids[0]} out of range [0, {ref.vocab})")
        return
    L = ref.logits(prompt_ids + c_toks)
    rows = L[len(prompt_ids) - 1:]            # rows[k] predicts c_toks[k]; rows[-1] the next one
    exact = near = 0
    first_bad = None
    for k, t in enumerate(c_toks):
        row = rows[k]
        best = int(row.argmax())
        if best == t:
            exact += 1
        elif row[best] - row[t] <= tol * np.abs(row).max():
            near += 1
        elif first_bad is None:
            first_bad = (k, t, best, float(row[best] - row[t]))
    eog = eog_ids(model)
    stopped = len(c_toks) < n_asked
    msg = (f"prompt {len(prompt_ids)} tokens, {len(c_toks)}/{n_asked} generated, "
           f"{exact} match the reference argmax" + (f", {near} at near ties" if near else ""))
    ok = first_bad is None
    if first_bad is not None:
        k, t, best, g = first_bad
        msg += f"; step {k}: C {t} vs ref {best} (ref gap {g:.3g})"
    if stopped and ok:
        last_is_eog = c_toks[-1] in eog
        next_is_eog = int(rows[-1].argmax()) in eog
        if not (last_is_eog or next_is_eog):
            ok = False
            msg += "; C stopped early but neither its last token nor the reference's next is end-of-generation"
        else:
            msg += "; stopped at end-of-generation as the reference does"
    if ok and len(c_toks) < n_required:
        if stopped:
            msg += f" (WARN: fewer than {n_required} steps compared; choose a longer-winded prompt)"
        else:
            ok = False
            msg += f"; only {len(c_toks)} steps, need {n_required}"
    res.report(ok, name, msg)


# ---------------------------------------------------------------- parts

def run_tiny(a, res: Results, tmp: str) -> None:
    import gen_tiny_gguf as gen
    import ref_forward as rf

    names = a.preset or list(gen.PRESETS)
    for n in names:
        if n not in gen.PRESETS:
            res.report(False, f"tiny/{n}", f"unknown preset (have {', '.join(gen.PRESETS)})")
    names = [n for n in names if n in gen.PRESETS]
    model_dir = os.path.join(tmp, "tiny")
    os.makedirs(model_dir, exist_ok=True)
    for i, name in enumerate(names):
        path = os.path.join(model_dir, name + ".gguf")
        gen.write_model(gen.PRESETS[name], path, verbose=False)
        ref = rf.RefModel(path)
        rng = np.random.default_rng(1000 + i)
        ids = [int(x) for x in rng.integers(0, ref.vocab, a.n_tokens)]
        tol = preset_tol(gen.PRESETS[name], a.tol)
        check_logit_modes(a, res, ref, f"tiny/{name}", path, ids, tol, tmp)
        if a.tiny_greedy:
            case = f"tiny/{name} greedy"
            try:
                p_ids, c_toks = c_run_greedy(a, path, "Hello world, this is a test.", a.tiny_n_gen)
            except CaseError as e:
                res.report(False, case, str(e))
                continue
            check_greedy(res, ref, case, path, p_ids, c_toks, a.tiny_n_gen, 1, tol)
    if a.keep:
        print(f"tiny models kept in {model_dir}")


def run_real(a, res: Results, tmp: str) -> bool:
    """Returns False when the model file is absent (skip)."""
    import ref_forward as rf

    model = a.model
    base = "real/" + os.path.basename(model)
    if not os.path.isfile(model):
        res.skip(base, f"model file {model} not found")
        return False
    t0 = time.time()
    ref = rf.RefModel(model, verbose=True)
    print(f"reference loaded in {time.time() - t0:.1f}s", flush=True)

    n_ask = a.n_gen + 8
    p_ids, c_toks = None, None
    try:
        p_ids, c_toks = c_run_greedy(a, model, a.prompt, n_ask)
    except CaseError as e:
        res.report(False, base + " greedy", str(e))
    if p_ids is not None:
        check_greedy(res, ref, base + " greedy", model, p_ids, c_toks, n_ask, a.n_gen, a.real_tol)
        try:
            from bpe_min import BPE
            bpe = BPE(model)
            print(f"    prompt: {bpe.decode(p_ids)!r}\n    C continuation: {bpe.decode(c_toks)!r}")
        except Exception:  # only cosmetic
            pass
        ids = (p_ids + c_toks)[: a.n_logits]
    else:
        from bpe_min import BPE
        ids = BPE(model).encode(a.prompt)[: a.n_logits]
        print(f"    (hetkv run failed; logits cases use the reference's own tokenisation of the prompt)")
    if len(ids) < a.n_logits:
        ids = ids + [ids[-1]] * (a.n_logits - len(ids))
    check_logit_modes(a, res, ref, base, model, ids, a.real_tol, tmp)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="C engine logits vs numpy reference",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--bin-dir", required=True, help="folder with hkv-dump-logits and hetkv")
    ap.add_argument("--model", help="real GGUF model (exit 77 when absent)")
    ap.add_argument("--tiny", action="store_true", help="generate every tiny preset and test it")
    ap.add_argument("--preset", action="append", help="only this tiny preset (repeatable)")
    ap.add_argument("--modes", default="prefill,decode,batch", help="comma-separated dump modes")
    ap.add_argument("-t", "--threads", type=int, default=0, help="pass -t N to hkv-dump-logits")
    ap.add_argument("--tol", type=float, default=2e-3, help="tiny models: max|diff|/max|ref|")
    ap.add_argument("--real-tol", type=float, default=1e-2, help="real model: max|diff|/max|ref|")
    ap.add_argument("--n-tokens", type=int, default=37, help="tiny: tokens per logits case")
    ap.add_argument("--n-logits", type=int, default=16, help="real: tokens per logits case")
    ap.add_argument("--n-gen", type=int, default=32, help="real: greedy steps that must match")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="real: prompt text for hetkv run")
    ap.add_argument("--no-tiny-greedy", dest="tiny_greedy", action="store_false",
                    help="skip the hetkv run greedy case on tiny models")
    ap.add_argument("--tiny-n-gen", type=int, default=12)
    ap.add_argument("--dump-args", default="", help="extra arguments for hkv-dump-logits")
    ap.add_argument("--run-args", default="", help="extra arguments for hetkv run")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per C command")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    a = ap.parse_args(argv)
    if not a.tiny and not a.model:
        ap.error("give --tiny and/or --model PATH")
    a.modes = [m for m in a.modes.split(",") if m]
    for m in a.modes:
        if m not in ("prefill", "decode", "batch"):
            ap.error(f"unknown mode {m}")

    res = Results()
    absent = False
    a.dump_exe = find_exe(a.bin_dir, "hkv-dump-logits")
    a.hetkv_exe = find_exe(a.bin_dir, "hetkv")
    if a.model and not os.path.isfile(a.model):
        absent = True
        res.skip("real/" + os.path.basename(a.model), f"model file {a.model} not found")
    missing = [n for n, p in (("hkv-dump-logits", a.dump_exe), ("hetkv", a.hetkv_exe)) if p is None]
    if missing and (a.tiny or not absent):
        res.report(False, "setup", f"{', '.join(missing)} not found in {a.bin_dir}")
    else:
        tmp = tempfile.mkdtemp(prefix="hkv_test_logits_")
        try:
            if a.tiny:
                run_tiny(a, res, tmp)
            if a.model and not absent:
                run_real(a, res, tmp)
        finally:
            if a.keep:
                print(f"kept {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)

    if res.failures:
        print("failed: " + "; ".join(res.failures))
    print(f"test_logits: {res.passed} passed, {res.failed} failed, {res.skipped} skipped")
    if res.failed:
        return 1
    if absent:
        return SKIP
    return 0


if __name__ == "__main__":
    sys.exit(main())

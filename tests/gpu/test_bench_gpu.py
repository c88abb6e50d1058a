#!/usr/bin/env python3
"""`hetkv bench kernels --device cuda` (tools/bench/bench_gpu.c) end to end.

    python3 tests/gpu/test_bench_gpu.py --bin-dir build-emu/tools

With a device (a GPU, or the CUDA emulator): `--quick --json` exits 0; its
JSON names the device and holds the rows each group promises (the
device-to-device probe and pinned copies both ways; Q4, Q8 and F16 products
through the GEMV and through each GEMM mode, split, fp16 and fp32; decode
attention with rows in order and through an index list; prefill attention at
two positions; rocketkv's stage 2, its two kernels alone, the push and the
token keep; ctkvr's centroid recall for 1 and 8 rows; ctkvr's index build of a
layer on both score kernels, CUDA and tensor cores), each with a time, bytes and GB/s, and the probe's share where
its bytes are DRAM's; the host's wait for a kernel and for a layer's round trip, asleep and
polled, each no shorter than the kernel waited for. On a GPU: every shape and width of the full set. Under
the emulator: the subset, every row "emulated": true, no data sheet, and
every row printed (on stderr, with --json) labelled "emulated: not a speed".
Without a device: exit 1 with an error that says why, no crash.
Exit 0: passed, 1: failed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args(argv)
    hetkv = os.path.join(a.bin_dir, "hetkv")
    fails = []

    def check(ok: bool, what: str) -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
        if not ok:
            fails.append(what)

    info = subprocess.run([hetkv, "info", "--json"], capture_output=True, text=True, timeout=60)
    cuda = json.loads(info.stdout).get("cuda", {})
    has_device = bool(cuda.get("devices"))
    p = subprocess.run([hetkv, "bench", "kernels", "--device", "cuda", "--quick", "--json"],
                       capture_output=True, text=True, timeout=a.timeout)
    if not has_device:
        err = p.stderr.strip()
        check(p.returncode == 1 and "no CUDA device" in err and "error" in err,
              f"no device ({cuda.get('backend')}): exit 1 naming why: exit {p.returncode}: {err[-300:]}")
        print(f"test_bench_gpu: {len(fails)} failed")
        return 1 if fails else 0
    if p.returncode != 0:
        print(f"FAIL exit {p.returncode}: {p.stderr.strip()[-600:]}")
        return 1
    try:
        j = json.loads(p.stdout)
    except ValueError as e:
        print(f"FAIL the JSON does not parse: {e}: {p.stdout[:300]}")
        return 1
    emu = cuda.get("backend") == "cuda-emu"
    rows = j.get("rows", [])
    check(j["device"]["emulated"] == emu and j["emulated"] == emu
          and all(r["emulated"] == emu for r in rows), f"emulated is {emu} everywhere")
    check(j["d2d_gbs"] > 0, f"the probe: {j['d2d_gbs']} GB/s")
    if emu:
        check(j["sheet"] is None and all(r["sheet_frac"] is None for r in rows),
              "the emulator has no data sheet")
        printed = [ln for ln in p.stderr.splitlines()
                   if ln.split()[:1] and ln.split()[0] in ("copy", "product", "attn_decode",
                                                          "attn_prefill", "policy", "recall",
                                                          "index", "sync")]
        check(len(printed) == len(rows) and all("emulated: not a speed" in ln for ln in printed),
              f"{len(printed)} rows printed on stderr, each labelled 'emulated: not a speed'")

    def have(group: str, kernel: str) -> list:
        return [r for r in rows if r["group"] == group and r["kernel"] == kernel]

    for k in ("d2d", "h2d pinned", "d2h pinned"):
        check(len(have("copy", k)) == 1, f"copy {k}")
    roles = 1 if emu else 5
    for t in ("q4", "q8", "f16"):
        gemv = have("product", f"{t} gemv")
        ns = sorted({r["n"] for r in gemv})
        check(len(gemv) == roles * (2 if emu else 4) and ns == ([1, 8] if emu else [1, 2, 4, 8]),
              f"{t} gemv: {len(gemv)} rows, n {ns}")
        for m in ("split", "fp16", "fp32"):
            gemm = have("product", f"{t} gemm {m}")
            ns = sorted({r["n"] for r in gemm})
            check(len(gemm) == roles * (1 if emu else 2) and ns == ([64] if emu else [64, 512])
                  and all(r["path"] == m for r in gemm), f"{t} gemm {m}: {len(gemm)} rows, n {ns}")
    dec = [r for r in rows if r["group"] == "attn_decode" and not r["forced"]]
    check(len(dec) == (2 if emu else 8) and {r["idx"] for r in dec} == {True, False}
          and all(r["n_head"] == 32 and r["n_head_kv"] == 8 and r["d"] == 128 for r in dec),
          f"decode attention: {len(dec)} rows")
    forced = [r for r in rows if r["group"] == "attn_decode" and r["forced"]]
    check(forced and all(r["seqs"] == 1 and not r["idx"] and r["split"] in (1, 4, 8, 16)
                         and r["kv_rows"] in (4096, 32768) for r in forced)
          and (not emu or [(r["split"], r["kv_rows"]) for r in forced] == [(8, 4096)]),
          f"decode attention at forced split counts: {[(r['split'], r['kv_rows']) for r in forced]}")
    pre = [r for r in rows if r["group"] == "attn_prefill"]
    check([(r["kernel"], r["path"], r["p0"] > 0) for r in pre]
          == [("prefill wmma", "wmma", False), ("prefill wmma", "wmma", True),
              ("prefill mma", "mma", False), ("prefill mma", "mma", True)],
          f"prefill attention, both kernels at p0 = 0 and later: "
          f"{[(r['kernel'], r['p0']) for r in pre]}")
    pol = [r for r in rows if r["group"] == "policy"]
    want = {("rocketkv hsa", 1), ("rocketkv hsa z", 1), ("rocketkv hsa keep", 1), ("keep tokens", 1),
            ("rocketkv push", 1)} | (set() if emu else {("rocketkv hsa", 4)})
    check({(r["kernel"], r["seqs"]) for r in pol} == want and len(pol) == len(want)
          and all(r["n_head_kv"] == 8 and r["g"] == 4 and r["d"] == 128 and r["n"] == 5261
                  and r["page"] == 2 and r["dims"] == 100 and r["k"] == 1024 for r in pol),
          f"rocketkv stage 2: {sorted((r['kernel'], r['seqs']) for r in pol)}")
    rec = [r for r in rows if r["group"] == "recall"]
    check(sorted(r["rows"] for r in rec) == ([1] if emu else [1, 8])
          and all(r["kernel"] == "ctkvr recall" and r["C"] == 2048 and r["Cp"] == 4
                  and r["n_head_kv"] == 8 and r["g"] == 4 and r["d"] == 128 for r in rec),
          f"ctkvr recall: {[(r['kernel'], r.get('rows')) for r in rec]}")
    bld = [r for r in rows if r["group"] == "index"]
    want = [(k, n) for n in ([4096] if emu else [32768, 98304])
            for k in ("ctkvr build simt", "ctkvr build mma")]
    check([(r["kernel"], r["n_far"]) for r in bld] == want
          and all(r["C"] == (64 if emu else 2048) and r["rho"] == 2560 and r["n_head_kv"] == 8
                  and r["g"] == 4 and r["d"] == 128 and r["path"] == r["kernel"].split()[-1]
                  for r in bld),
          f"ctkvr build: {[(r['kernel'], r.get('n_far')) for r in bld]}")
    # the host's waits, wall clock: none can return before the kernel it waits for ran
    syn = [r for r in rows if r["group"] == "sync"]
    check([(r["kernel"], r["wait"]) for r in syn]
          == [("wait slept", "sleep"), ("wait polled", "poll"),
              ("round trip slept", "sleep"), ("round trip polled", "poll")]
          and all(r["us"] >= r["kernel_us"] == 20 and r["reps"] >= 5 for r in syn)
          and all((r["up_bytes"] > 0) == r["kernel"].startswith("round trip") for r in syn),
          f"sync: {[(r['kernel'], r['us']) for r in syn]}")
    bad = [r["kernel"] + " " + r["shape"] for r in rows
           if r["group"] != "sync" and not (r["us"] > 0 and r["bytes"] > 0 and r["gbs"] > 0 and r["reps"] >= 1
                   and (r["link"] == "pcie" or r["probe_frac"] is not None)
                   and (r["group"] == "copy" or (r["group"] == "policy" and r["unit"] == "none")
                        or r["flops"] > 0))]
    check(not bad, f"every row has a time, bytes, GB/s, its probe share and FLOPs (a keep or push "
          f"none): {bad[:3]}")
    print(f"test_bench_gpu: {len(rows)} rows, {len(fails)} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Shared prefixes on the device path (issue 39). First, ctkvr: requests that find
the prefix cache's entry take its index by reference (index/ctkvr.c keeps the
table the device mirrors: the store's rows with a fork's own rows over them),
recall on the device with no shared_index fallback, and give the host path's
tokens, and the page-locked far tier holds the prefix once (the far-tier bytes the
cache saved are the host path's). Then a shared prefix kept once on the device
(pipeline/cuda_resident.c):
resident `full` sequences that map one prompt prefix by reference (the prefix
cache of `hetkv batch`) read it from one prefix slot, uploaded once, and keep
only their own rows in slots sized for them (--gpu-resident-rows). On a tiny
generated model (GQA 4, head size 128), 4 questions over one ~320-token
document, --prefix-cache 2, --policy full, context 512, --local 8:

  cpu       the reference: the host path with the same prefix cache;
  prefix    --gpu-resident 4 --gpu-resident-prefixes 1 --gpu-resident-rows 64:
            every decode row attended its far tier on the device, all of them
            reading the prefix slot, no fallbacks, the prefix's rows copied up
            once per layer (not once per request) and attended as cascades
            (one pass a layer for the rows decoding together: fewer cascades
            than half the rows), tokens the host path's;
  small     the same slots without a prefix slot: 64 rows hold no request's
            far tier, so every row runs on the host (fallbacks no_room), tokens
            the host path's;
  whole     --gpu-resident 4 with whole-context slots: each request copies the
            document again, more rows up than prefix + own rows above;
  refused   --gpu-resident-prefixes without --device cuda.
  ctkvr     --policy ctkvr on both paths: 3 hits, 3 index hits (by reference),
            recalls on the device, no fallbacks, the host path's tokens.

The tokens were checked to catch a prefix partial left out: with the cascades
skipped the device's tokens differ from the second token on.

    python3 tests/pipeline/test_prefix_device.py --bin-dir build-emu/tools
Exit 77 without a CUDA device (a GPU or the emulator)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "scripts"))
import gen_tiny_gguf as gen  # noqa: E402
from device_checks import Checks, need_device  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin-dir", required=True)
a = ap.parse_args()
hetkv = os.path.join(a.bin_dir, "hetkv")
need_device(hetkv)
check = Checks()

TL = ["device_resident_rows", "resident_rows_up", "device_resident_prefix_rows",
      "resident_prefix_rows_up", "resident_prefix_cascades", "fallbacks_total"]
with tempfile.TemporaryDirectory() as tmp:
    preset = gen.PRESETS["llama_gqa4_hd128_f16"]
    model = os.path.join(tmp, "tiny.gguf")
    gen.write_model(preset, model, verbose=False)
    with open(os.path.join(ROOT, "tests", "batch", "prefix_doc.txt"), encoding="utf-8") as f:
        doc = f.read().strip()[:380]
    inp = os.path.join(tmp, "in.jsonl")
    qs = ["Who wrote it?", "What is it about?", "Name one command.", "How is it tested?"]
    with open(inp, "w") as f:
        for i, q in enumerate(qs):
            f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/completions",
                                "body": {"prompt": doc + "\n\nQuestion: " + q, "max_tokens": 8,
                                         "temperature": 0}}) + "\n")

    def batch(name, *extra, policy="full"):
        out = os.path.join(tmp, f"{name}.jsonl")
        p = subprocess.run([hetkv, "batch", "-m", model, "-i", inp, "-o", out, "-c", "512",
                            "--max-batch", "4", "-t", "2", "-q", "--json", "--no-mpi", "--sink", "2",
                            "--local", "8", "--chunk", "64", "--prefix-cache", "2", "--policy",
                            policy, *extra], capture_output=True, text=True, timeout=600)
        toks = {}
        if p.returncode == 0:
            for l in open(out):
                o = json.loads(l)
                toks[o["custom_id"]] = o["hetkv"].get("tokens")
        summ = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else {}
        tl = summ.get("device", {}).get("timeline", {})
        got = {k: tl.get(k) for k in TL + ["device_recalls"]}
        got["index_hits"] = summ.get("prefix_cache", {}).get("index_hits")
        got["saved_bytes"] = summ.get("prefix_cache", {}).get("saved_bytes")
        ok = p.returncode == 0 and summ.get("prefix_cache", {}).get("hits") == len(qs) - 1
        return ok, toks, got, p.stderr.strip()[-300:]

    ok, ref, host, err = batch("ccpu", "--device", "cpu", policy="ctkvr")
    check(ok and len(ref) == len(qs) and all(ref.values()), "ctkvr: the host path", err)
    ok, toks, tl, err = batch("cdev", "--device", "cuda", policy="ctkvr")
    # the page-locked far tier maps the prefix as the host path's does (transfer/pinned.h)
    check((tl["saved_bytes"] or 0) > 0 and tl["saved_bytes"] == host["saved_bytes"],
          "ctkvr: the far tier holds the prefix once on the device path too",
          f"saved {tl['saved_bytes']} on the device, {host['saved_bytes']} on the host")
    check(ok and toks == ref, "ctkvr: the host path's tokens on the device",
          {k: (toks.get(k), ref.get(k)) for k in ref if toks.get(k) != ref.get(k)} or err)
    check(tl["index_hits"] == len(qs) - 1 and (tl["device_recalls"] or 0) > 0 and
          tl["fallbacks_total"] == 0,
          "ctkvr: the kept index taken by reference, recalled on the device", tl)

    ok, ref, _, err = batch("cpu", "--device", "cpu")
    check(ok and len(ref) == len(qs) and all(ref.values()), "the host path with the prefix cache",
          err)
    slots = ["--device", "cuda", "--gpu-resident", "4"]
    runs = {}
    for name, extra in (("prefix", slots + ["--gpu-resident-prefixes", "1", "--gpu-resident-rows", "64"]),
                        ("small", slots + ["--gpu-resident-rows", "64"]),
                        ("whole", slots)):
        ok, toks, tl, err = batch(name, *extra)
        runs[name] = tl
        check(ok and toks == ref, f"{name}: the host path's tokens",
              {k: (toks.get(k), ref.get(k)) for k in ref if toks.get(k) != ref.get(k)} or err)
    pre, small, whole = runs["prefix"], runs["small"], runs["whole"]
    # prefix rows: document's whole pages (32 rows of 256 bytes) less the sinks, per layer
    check((pre["device_resident_rows"] or 0) > 0 and
          pre["device_resident_prefix_rows"] == pre["device_resident_rows"] and
          pre["fallbacks_total"] == 0,
          "prefix: every decode row on the device read the prefix slot, no fallbacks", pre)
    # the rows decoding together on the prefix attend it in one cascade a layer
    check(0 < (pre["resident_prefix_cascades"] or 0) < pre["device_resident_prefix_rows"] / 2,
          "prefix: a cascade a layer reads the prefix for several rows at once", pre)
    doc_rows = (pre["resident_prefix_rows_up"] or 0) / preset.layers
    check(200 <= doc_rows <= 512 and (pre["resident_rows_up"] or 0) < doc_rows,
          "prefix: the document copied up once a layer, own rows fewer", pre)
    check(small["device_resident_rows"] == 0 and (small["fallbacks_total"] or 0) > 0,
          "small: 64-row slots hold no whole far tier: the host attends (no_room)", small)
    check(whole["device_resident_rows"] == pre["device_resident_rows"] and
          whole["device_resident_prefix_rows"] == 0 and
          (whole["resident_rows_up"] or 0) > 2 * ((pre["resident_prefix_rows_up"] or 0) +
                                                  (pre["resident_rows_up"] or 0)),
          "whole: each request copies the document again", f"{whole} against {pre}")
    p = subprocess.run([hetkv, "run", "-m", model, "-p", "x", "--gpu-resident-prefixes", "1"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 1 and "need --device cuda" in p.stderr,
          "--gpu-resident-prefixes without --device cuda refused", p.stderr.strip())
check.done("test_prefix_device")

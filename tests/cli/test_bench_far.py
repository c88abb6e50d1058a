#!/usr/bin/env python3
"""hetkv bench far (tools/bench/bench_far.c): the host's far step of one layer
through the tiered cache, a small shape on 2 threads.

Checks: the stream and gather probes and the fp32 peak in the header; a row per
(configuration, context, batch, scoring mode) with both probes' shares; bytes per
step > 0 that grow with the batch; the same bytes with the selections'
scoring shared by the threads and alone (the same selections: the shared
scores are the kernel's, bit for bit); the caches swept before each step
unless --warm, which reads the same bytes; ctkvr's recall the device's by
default (its centroids not read by the host step), the host's with --recall
host (more bytes: the centroids); --isa avx2 -o jsonl: a row a point on
stdout naming the ISA asked for, with the table's figures, the table on
stderr; a bad --scoring or --recall refused.

    python3 tests/cli/test_bench_far.py BUILD_DIR
Last line: 'test_bench_far: N passed, N failed'."""
import json
import os
import re
import subprocess
import sys

hetkv = os.path.join(sys.argv[1], "tools", "hetkv")
passed = failed = 0


def check(ok, what, detail=""):
    global passed, failed
    passed += bool(ok)
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + str(detail) if detail else ''}")


cmd = [hetkv, "bench", "far", "--ctx", "8192", "--batch", "1,3", "--kv-heads", "4", "--group", "2",
       "--head-dim", "128", "--configs", "ctkvr:rho_p=256;quest:budget=1024", "--steps", "3",
       "--scoring", "shared,alone", "-t", "2"]
p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
check(p.returncode == 0, "bench far runs", p.stderr.strip()[-300:])
row = re.compile(r"^(\S+)( \[alone\])?\s+(\d+)\s+(\d+) \|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)%\s+(\d+)% \|\s+([\d.]+)$")
head = re.search(r"probe ([\d.]+) GB/s, gather probe ([\d.]+) GB/s \(256-byte rows\), "
                 r"fp32 FMA peak (\d+) GFLOP/s", p.stdout)
check(head and float(head.group(1)) > 0 and float(head.group(2)) > 0 and int(head.group(3)) > 0,
      "the header gives both probes, the gather's at the keys' row size, and the compute peak",
      p.stdout.splitlines()[:1])
rows = {}
for line in p.stdout.splitlines():
    m = row.match(line)
    if m:
        rows[(m.group(1), bool(m.group(2)), int(m.group(3)), int(m.group(4)))] = float(m.group(6))
check(len(rows) == 8, "a row per configuration, batch and scoring mode", sorted(rows))
for cfg in ("ctkvr:rho_p=256", "quest:budget=1024"):
    for b in (1, 3):
        sh, al = rows.get((cfg, False, 8192, b)), rows.get((cfg, True, 8192, b))
        check(sh is not None and sh > 0 and sh == al, f"{cfg} batch {b}: MB/step shared = alone > 0",
              f"{sh} / {al}")
    one, three = rows.get((cfg, False, 8192, 1)), rows.get((cfg, False, 8192, 3))
    check(one and three and 2.5 * one < three < 3.5 * one, f"{cfg}: three sequences read ~3x one",
          f"{one} -> {three}")
check("caches swept before each step" in p.stdout and re.search(r"sweep: \d+ MiB", p.stdout),
      "the caches are swept before each step by default", p.stdout.splitlines()[:2])
w = subprocess.run(cmd + ["--warm"], capture_output=True, text=True, timeout=600)
wrows = {}
for line in w.stdout.splitlines():
    m = row.match(line)
    if m:
        wrows[(m.group(1), bool(m.group(2)), int(m.group(3)), int(m.group(4)))] = float(m.group(6))
check(w.returncode == 0 and "caches warm" in w.stdout and "sweep:" not in w.stdout and wrows == rows,
      "--warm: no sweep, the same bytes a step", f"{w.stderr.strip()[-200:]} {wrows} {rows}")
check("the device's, made before each step" in p.stdout, "the device's recall by default",
      p.stdout.splitlines()[:3])
h = subprocess.run([hetkv, "bench", "far", "--ctx", "8192", "--batch", "1", "--kv-heads", "4", "--group", "2",
                    "--head-dim", "128", "--configs", "ctkvr:rho_p=256", "--steps", "3", "-t", "2",
                    "--recall", "host"], capture_output=True, text=True, timeout=600)
hrow = [float(m.group(6)) for m in map(row.match, h.stdout.splitlines()) if m]
dev = rows.get(("ctkvr:rho_p=256", False, 8192, 1))
# C = 512 centroids of 2 heads x 128 fp16 per KV head: 4 x 512 x 2 x 256 B = 1.05 MB more, and
# nothing else (to the 0.1 MB the table prints): the device's recall, made by the bench, picks
# the lists the host's picks
check(h.returncode == 0 and "the host's own, timed" in h.stdout and len(hrow) == 1 and dev
      and abs(hrow[0] - dev - 1.05) < 0.11, "--recall host: the host reads the centroids, the same "
      "candidates", f"{hrow} vs {dev}")
# --idle-us: the calling thread polls before each step, outside the step's time
# (a 50 ms poll in a step of well under a millisecond), the bytes unchanged
i = subprocess.run(cmd[:cmd.index("--scoring")] + ["-t", "2", "--idle-us", "50000"],
                   capture_output=True, text=True, timeout=600)
irows = {}
for line in i.stdout.splitlines():
    m = row.match(line)
    if m:
        irows[(m.group(1), int(m.group(3)), int(m.group(4)))] = (float(m.group(5)), float(m.group(6)))
same = {k: v[1] for k, v in irows.items()} == {(k[0], k[2], k[3]): v for k, v in rows.items() if not k[1]}
check(i.returncode == 0 and "polls 50000 us" in i.stdout and same and irows
      and all(v[0] < 50 for v in irows.values()),
      "--idle-us: the poll outside the step, the same bytes a step", f"{irows} {i.stderr[-200:]}")
# -o jsonl: the rows on stdout (the table on stderr), each naming its ISA and
# thread count; --isa avx2 runs the AVX2 kernels (one core, cached: the
# ceiling plan --predict --host-core-us takes)
j = subprocess.run([hetkv, "bench", "far", "--ctx", "8192", "--batch", "1,3", "--kv-heads", "4", "--group", "2",
                    "--configs", "ctkvr:rho_p=256", "--steps", "3", "-t", "1", "--warm", "--isa", "avx2",
                    "-o", "jsonl"], capture_output=True, text=True, timeout=600)
try:
    jrows = [json.loads(l) for l in j.stdout.splitlines()]
except ValueError:
    jrows = []
tab = {(int(m.group(3)), int(m.group(4))): (float(m.group(5)), float(m.group(6)))
       for m in map(row.match, j.stderr.splitlines()) if m}
check(j.returncode == 0 and len(jrows) == 2 and "avx2 kernels" in j.stderr and len(tab) == 2
      and all(r["isa"] == "avx2" and r["threads"] == 1 and r["warm"] is True and r["config"] == "ctkvr:rho_p=256"
              and r["scoring"] == "alone" and r["probe_gbs"] > 0 and r["fma_gflops"] > 0 for r in jrows)
      and all(abs(r["step_ms"] - tab[(r["ctx"], r["batch"])][0]) < 1e-3 + 1e-2 * r["step_ms"]
              and abs(r["bytes_per_step"] / 1e6 - tab[(r["ctx"], r["batch"])][1]) < 0.051
              and abs(r["gbs"] - r["bytes_per_step"] / r["step_ms"] / 1e6) < 1e-3 * r["gbs"] for r in jrows),
      "-o jsonl --isa avx2: a row a point, the table's figures, on the ISA asked for",
      f"{j.stdout[:300]} {j.stderr[-300:]}")
p = subprocess.run([hetkv, "bench", "far", "--idle-us", "-5"], capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "--idle-us" in p.stderr, "a negative --idle-us refused", p.stderr.strip())
p = subprocess.run([hetkv, "bench", "far", "--recall", "gpu"], capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "--recall 'gpu'" in p.stderr, "a bad --recall refused", p.stderr.strip())
p = subprocess.run([hetkv, "bench", "far", "--scoring", "both"], capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "--scoring 'both'" in p.stderr, "a bad --scoring refused", p.stderr.strip())
print(f"test_bench_far: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

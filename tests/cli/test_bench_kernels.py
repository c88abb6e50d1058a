#!/usr/bin/env python3
"""hetkv bench kernels --quick (tools/bench/bench_kernels.c) end to end on the host.

Checks: it exits 0 (it once freed a weight set's packed twins that only the
packed rows make, and stopped after its first GEMV rows); every section's
header and the closing probe are printed; each GEMV row's rate is positive.

    python3 tests/cli/test_bench_kernels.py BUILD_DIR
Last line: 'test_bench_kernels: N passed, N failed'."""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pipeline"))
from device_checks import Checks  # noqa: E402

hetkv = os.path.join(sys.argv[1], "tools", "hetkv")
check = Checks()

p = subprocess.run([hetkv, "bench", "kernels", "--quick"], capture_output=True, text=True, timeout=900)
check(p.returncode == 0, "bench kernels --quick exits 0", f"rc {p.returncode} {p.stderr.strip()[-300:]}")
out = p.stdout
for head in ("GEMV through hkv_matmul", "bandwidth probe again at the end"):
    check(head in out, f"prints '{head}'")
gemv = re.findall(r"^(q4|q8|f16)\s+(\d+)x(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s", out, re.M)
check(len(gemv) == 18, "a GEMV row for each of 3 shapes x 3 types x n 1, 8", len(gemv))
check(all(float(g[5]) > 0 for g in gemv), "each GEMV row reads at a positive rate")
check.done("test_bench_kernels")

#!/usr/bin/env python3
"""Checks tests/model/test_logits.py itself, with tests/ref/mock_c_side.py in
place of the C executables: a correct stand-in must pass, each deliberate bug
must be caught, and an absent model must give exit 77.

Usage: python3 tests/ref/selftest_harness.py   (exit 0 when every expectation holds)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import mock_c_side  # noqa: E402

HARNESS = os.path.join(ROOT, "tests", "model", "test_logits.py")
PRESETS = ["--preset", "llama_gqa3_q41", "--preset", "qwen2_gqa4_mix"]

# (bug, extra args, expected exit code)
CASES = [
    ("none", [], 0),
    ("chunks", ["--modes", "batch", "--no-tiny-greedy"], 0),
    ("neox", ["--modes", "prefill", "--no-tiny-greedy"], 1),
    ("gqa", ["--modes", "decode", "--no-tiny-greedy"], 1),
    ("noise", ["--modes", "prefill", "--no-tiny-greedy"], 1),
    ("shortgen", ["--modes", "prefill"], 1),
]


def main() -> int:
    fails = 0
    with tempfile.TemporaryDirectory() as d:
        for bug, extra, want in CASES:
            bins = mock_c_side.make_bin_dir(os.path.join(d, bug), bug)
            cmd = [sys.executable, HARNESS, "--bin-dir", bins, "--tiny"] + PRESETS + extra
            cp = subprocess.run(cmd, capture_output=True, text=True)
            ok = cp.returncode == want
            fails += not ok
            last = (cp.stdout.strip().splitlines() or ["(no output)"])[-1]
            print(f"{'PASS' if ok else 'FAIL'} harness/{bug}: exit {cp.returncode} (want {want}); {last}")
            if not ok:
                print(cp.stdout + cp.stderr)
        bins = mock_c_side.make_bin_dir(os.path.join(d, "absent"), "none")
        cp = subprocess.run([sys.executable, HARNESS, "--bin-dir", bins, "--model",
                             os.path.join(d, "no-such-model.gguf")], capture_output=True, text=True)
        ok = cp.returncode == 77
        fails += not ok
        print(f"{'PASS' if ok else 'FAIL'} harness/absent-model: exit {cp.returncode} (want 77)")
    total = len(CASES) + 1
    print(f"{total - fails} passed, {fails} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

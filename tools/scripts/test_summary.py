#!/usr/bin/env python3
"""The end of tools/scripts/test.sh: one summary over meson's testlog.json files.

    python3 tools/scripts/test_summary.py [--slowest N] LOG.json...

Prints every failed and every skipped test by name, each skip with its
reason (the test's own line saying why it exited 77), the ISA variants this
machine could not test (lines "untested ISA: ..." that tests print where the
CPU lacks an instruction set), then one count line. Exit status 1 when a test
failed or a skip is not on the allow-list below: test.sh installs the Debian
packages and the Python packages and fetches the model, so a skip for any of
those means something broke, and a green run must not hide it.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

# The only skips a run may end green with: checks that need what no CPU-only
# machine has and test.sh does not install (regex on the reason, why allowed).
# None today: nvcc for the ptxas suite comes from tools/scripts/setup_nvcc.sh,
# and the GPU's own checks run in bench/gpu_check.sh, not in meson.
ALLOWED_SKIPS: list[tuple[str, str]] = []
UNTESTED = re.compile(r"^untested ISA: (.*)$", re.M)


def skip_reason(out: str) -> str:
    """The test's last line that mentions a skip, else its last line; a
    closing count line ("x: 0 passed, 0 failed, 1 skipped") is no reason."""
    lines = [ln.strip() for ln in out.splitlines()
             if ln.strip() and not re.match(r"^\S+: \d+ passed", ln.strip())]
    for ln in reversed(lines):
        if "skip" in ln.lower():
            return ln
    return lines[-1] if lines else "(no output)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slowest", type=int, default=0, help="also list the N slowest tests")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args(argv)
    passed, failed, allowed, bad, untested, times = 0, [], [], [], {}, []
    for path in a.logs:
        build = path.split("/meson-logs/")[0]
        with open(path) as fh:
            for line in fh:
                r = json.loads(line)
                name, res, out = f"{build}: {r['name']}", r["result"], r.get("stdout") or ""
                times.append((r.get("duration", 0.0), name))
                for what in UNTESTED.findall(out):
                    untested.setdefault(what.strip(), []).append(r["name"])
                if res in ("OK", "EXPECTEDFAIL"):
                    passed += 1
                elif res == "SKIP":
                    why = skip_reason(out)
                    ok = next((w for pat, w in ALLOWED_SKIPS if re.search(pat, why)), None)
                    (allowed if ok else bad).append((name, why, ok))
                else:
                    failed.append((name, res))
    for name, res in failed:
        print(f"FAILED  {name} ({res})")
    for name, why, _ in bad:
        print(f"SKIPPED {name}: {why}  <- counts as a failure: test.sh provides what it needs")
    for name, why, ok in allowed:
        print(f"skipped {name}: {why}  (allowed: {ok})")
    for what, names in sorted(untested.items()):
        print(f"untested ISA on this CPU: {what} ({', '.join(sorted(set(names)))})")
    if a.slowest:
        print(f"slowest {a.slowest}:")
        for d, name in sorted(times, reverse=True)[:a.slowest]:
            print(f"  {d:7.1f} s  {name}")
    print(f"tests: {passed} passed, {len(failed)} failed, {len(allowed) + len(bad)} skipped "
          f"({len(bad)} not allowed)")
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""What the device-path test scripts of tests/pipeline share: the skip when this
hetkv has no CUDA device (a GPU, or the emulator of a -Dgpu_emu=true build), and
the tally of named checks that each prints as it goes."""
import json
import subprocess
import sys


def need_device(hetkv):
    """Exit 77 (meson's skip) unless `hetkv info` lists a CUDA device."""
    info = subprocess.run([hetkv, "info", "--json"], capture_output=True, text=True, timeout=60)
    if not json.loads(info.stdout).get("cuda", {}).get("devices"):
        print("skip: no CUDA device (a GPU, or a -Dgpu_emu=true build)")
        sys.exit(77)


class Checks:
    """check(ok, what, detail) prints one line a check; done(name) prints the
    tally and exits 1 when any failed."""

    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, ok, what, detail=""):
        self.passed += bool(ok)
        self.failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + str(detail) if detail else ''}", flush=True)

    def done(self, name):
        print(f"{name}: {self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)

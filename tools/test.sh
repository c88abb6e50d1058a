#!/usr/bin/env bash
# The whole test suite: dependencies, build, the default model (for the
# real-model checks), then every meson test. Ends with one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup_deps.sh
tools/build.sh
tools/get_model.sh
status=0
meson test -C build --print-errorlogs --num-processes 1 "$@" || status=$?
python3 - <<'PY'
import json
p = f = s = 0
with open("build/meson-logs/testlog.json") as fh:
    for line in fh:
        r = json.loads(line)["result"]
        if r in ("OK", "EXPECTEDFAIL"): p += 1
        elif r == "SKIP": s += 1
        else: f += 1
print(f"tests: {p} passed, {f} failed, {s} skipped")
PY
exit $status

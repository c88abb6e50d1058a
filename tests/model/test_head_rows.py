#!/usr/bin/env python3
"""The output head in turns (runtime/forward.c, model/model.h hkv_head_rows):
a forward call asks for the logits of more rows than the logits buffer holds
(300 prompt rows in one call: the head runs 256, then 44), and every row's
logits must be those of the same prompt fed in calls of 256 and 44 rows,
whose head runs once a call: bit for bit, and all 300 rows there.

    python3 tests/model/test_head_rows.py BUILD_DIR MODEL
Exit 77 without the model."""
import os
import subprocess
import sys
import tempfile

build, model = sys.argv[1], sys.argv[2]
if not os.path.exists(model):
    print(f"skip: {model} is missing (tools/scripts/get_model.sh fetches it)")
    sys.exit(77)
dump = os.path.join(build, "tools", "hkv-dump-logits")
tokens = ",".join(str((i * 7919) % 49000 + 100) for i in range(300))
out = {}
with tempfile.TemporaryDirectory() as tmp:
    for rows in (300, 256):
        path = os.path.join(tmp, f"r{rows}.bin")
        p = subprocess.run([dump, "-m", model, "--tokens", tokens, "--rows", str(rows), "-t", "2",
                            "-o", path], capture_output=True, text=True, timeout=600)
        if p.returncode:
            print(f"FAIL hkv-dump-logits --rows {rows}: {p.stderr.strip()[-300:]}")
            sys.exit(1)
        out[rows] = open(path, "rb").read()
ok = len(out[300]) == len(out[256]) and len(out[300]) % (300 * 4) == 0 and out[300] == out[256]
print(f"{'ok  ' if ok else 'FAIL'} 300 rows' logits in one call (the head in two turns) equal "
      f"calls of 256 and 44: {len(out[300])} and {len(out[256])} bytes")
sys.exit(0 if ok else 1)

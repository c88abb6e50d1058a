#!/usr/bin/env python3
"""hetkv run under signals and a closed output, on a generated tiny model:

  SIGINT while decoding   exit 130, "stopped by signal 2" on stderr, and the text
                          streamed so far stays on stdout (more than the prompt);
  SIGTERM while a long    exit 143, "prefill stopped after N of M prompt tokens"
  prompt prefills         with 0 < N < M: the prompt is not run to its end first;
  a closed output pipe    `hetkv run ... | head -c 20`: exit 1 (not killed by
                          SIGPIPE) with "the output was closed" named.

    python3 tests/cli/test_signals.py BUILD_DIR
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

build = sys.argv[1]
src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
hetkv = os.path.join(build, "tools", "hetkv")
passed = failed = 0


def check(ok, name, detail=""):
    global passed, failed
    print(("PASS" if ok else "FAIL"), name, "" if ok else detail)
    passed += bool(ok)
    failed += not ok


tmp = tempfile.mkdtemp()
model = os.path.join(tmp, "tiny.gguf")
gen = subprocess.run([sys.executable, os.path.join(src, "tools", "scripts", "gen_tiny_gguf.py"), "--preset",
                      "llama_gqa3_q41", "--ctx", "2048", "-o", model], capture_output=True, text=True)
if gen.returncode != 0:
    print("cannot generate the tiny model:", gen.stderr[-300:])
    print("test_signals: 0 passed, 0 failed, 1 skipped")
    sys.exit(77)


def wait_for(path, pred, limit):
    """Poll a growing output file until pred(its bytes) or the time limit."""
    t0 = time.time()
    while time.time() - t0 < limit:
        with open(path, "rb") as f:
            if pred(f.read()):
                return True
        time.sleep(0.05)
    return False


# SIGINT during decode: the prompt echo and some generated text are on stdout first
prompt = "hello there"
out_path, err_path = os.path.join(tmp, "out.txt"), os.path.join(tmp, "err.txt")
with open(out_path, "wb") as out, open(err_path, "wb") as err:
    p = subprocess.Popen([hetkv, "run", "-m", model, "-p", prompt, "-n", "200000", "-c", "250000",
                          "--ignore-eos", "-t", "1"], stdout=out, stderr=err)
    started = wait_for(out_path, lambda b: len(b) > len(prompt) + 50, 120)
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=120)
text = open(out_path, "rb").read()
msg = open(err_path).read()
check(started and rc == 130 and "stopped by signal 2 (SIGINT)" in msg,
      "SIGINT while decoding: exit 130, named", (started, rc, msg[-300:]))
m = re.search(r"generation stopped after (\d+) tokens", msg)
check(m is not None and text.startswith(prompt.encode()) and len(text) > len(prompt) + 50
      and int(m.group(1)) > 0 and "decode" in msg,
      "SIGINT: the streamed text kept, the summary printed", (len(text), msg[-300:]))

# SIGTERM during a long prefill (a prompt of ~200K tokens: tens of seconds on the tiny model)
long_path = os.path.join(tmp, "long.txt")
with open(long_path, "w") as f:
    f.write("word " * 100000)
with open(err_path, "wb") as err:
    p = subprocess.Popen([hetkv, "run", "-m", model, "-f", long_path, "-n", "4", "-c", "250000", "-t", "1"],
                         stdout=subprocess.DEVNULL, stderr=err)
    time.sleep(1.5)
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=120)
msg = open(err_path).read()
m = re.search(r"prefill stopped after (\d+) of (\d+) prompt tokens", msg)
check(rc == 143 and "stopped by signal 15 (SIGTERM)" in msg and m is not None
      and 0 < int(m.group(1)) < int(m.group(2)),
      "SIGTERM while prefilling: exit 143, stopped inside the prompt", (rc, msg[-300:]))

# a closed output pipe: a write error, named, not a silent kill
p1 = subprocess.Popen([hetkv, "run", "-m", model, "-p", prompt, "-n", "100000", "-c", "120000",
                       "--ignore-eos", "-t", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
head = p1.stdout.read(20)
p1.stdout.close()   # the reader leaves
err_text = p1.stderr.read().decode()
rc = p1.wait(timeout=120)
check(len(head) == 20 and rc == 1 and "the output was closed" in err_text,
      "closed output: exit 1 naming it, not SIGPIPE", (rc, err_text[-300:]))

print(f"test_signals: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

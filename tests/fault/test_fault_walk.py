#!/usr/bin/env python3
"""The allocation-failure walk (a -Dfault_inject=true build, base/fault.h):
a whole job (load, prefill, decode, close) is run once to count its
allocations, then once per allocation N with HKV_FAULT_AT=N, so that each
one fails in turn. Every run must end in one of:

  error      exit 1 with a 'hetkv: error:' message;
  unaffected exit 0 with the unfailed run's output (an optional cache that
             is simply not kept, e.g. a staging copy);
  answered   (hetkv batch) exit 0, every request answered by a result or an
             error line (a request's own allocation failed: its line says so);

and never a crash, a sanitizer report (ASan, UBSan, LeakSanitizer: build
with -Db_sanitize=address,undefined) or a hang.

    python3 tests/fault/test_fault_walk.py --bin-dir build-asan/tools [--jobs run,quest,fastkv,laq,batch,prefix,prefix_ctkvr,q8,fast]

Jobs: run (ctkvr), quest, fastkv, laq (hetkv run on a tiny generated model,
each policy's own allocations), batch (two requests under snapkv through
the scheduler), prefix (three requests over one opening with the prefix
cache: the shared prefix's memfd and mappings; prefix_ctkvr the same under ctkvr, whose
index is shared too) and device (hetkv run --device cuda, ctkvr, on the CUDA
emulator: only the device and page-locked allocations are counted and
failed, HKV_FAULT_KINDS=device,pinned; skipped in a build without the
emulator); q8: run under ctkvr over the 8-bit far tier (--far-kv q8).
Exit 0: every allocation walked, 1: a failure, 77: not a fault-injection build.
Last line: 'fault walk: N allocations walked, N failures'.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools", "scripts"))

SAN = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "Segmentation fault")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--jobs", default="run,quest,fastkv,laq,batch,prefix,prefix_ctkvr,q8,fast,device")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="runs at a time (default: one a core)")
    a = ap.parse_args()
    hetkv = os.path.join(a.bin_dir, "hetkv")
    import gen_tiny_gguf as gen
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        gen.write_model(gen.PRESETS["llama_gqa3_q41"], model, verbose=False)
        inp = os.path.join(tmp, "in.jsonl")
        with open(inp, "w") as f:
            for i, p in enumerate(("Hello world, this is a test.", "The quick brown fox jumps.")):
                f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                                    "body": {"prompt": p, "max_tokens": 4, "temperature": 0}}) + "\n")
        # three requests over one opening, so that the prefix cache keeps it and shares it
        # by reference (kv/kv_prefix.c: its memfd and mappings fail in turn too)
        inp3 = os.path.join(tmp, "in3.jsonl")
        with open(inp3, "w") as f:
            for i, q in enumerate(("Who?", "What then?", "Where now?")):
                p = "Once upon a time there was a small model that read a long document. " + q
                f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                                    "body": {"prompt": p, "max_tokens": 3, "temperature": 0}}) + "\n")
        out = os.path.join(tmp, "out.jsonl")
        jobs = {
            "run": [hetkv, "run", "-m", model, "-p", "Hello world, this is a test.", "-n", "6", "-c", "128",
                    "--sink", "2", "--local", "8", "--policy", "ctkvr", "-t", "2", "--temp", "0"],
            "quest": [hetkv, "run", "-m", model, "-p", "Hello world, this is a test.", "-n", "6", "-c", "128",
                      "--sink", "2", "--local", "8", "--policy", "quest", "--policy-arg", "budget=8",
                      "-t", "2", "--temp", "0"],
            "fastkv": [hetkv, "run", "-m", model, "-p", "Hello world, this is a test.", "-n", "6", "-c",
                       "128", "--sink", "2", "--local", "8", "--policy", "fastkv", "--policy-arg",
                       "budget=8", "-t", "2", "--temp", "0"],
            "laq": [hetkv, "run", "-m", model, "-p", "Hello world, this is a test.", "-n", "6", "-c", "128",
                    "--sink", "2", "--local", "8", "--policy", "laq", "--policy-arg", "budget=8",
                    "-t", "2", "--temp", "0"],
            # the 8-bit far tier's tables and tiles (170 allocations, 10 s)
            "q8": [hetkv, "run", "-m", model, "-p", "Hello world, this is a test.", "-n", "6", "-c", "128",
                   "--sink", "2", "--local", "8", "--policy", "ctkvr", "--far-kv", "q8", "-t", "2",
                   "--temp", "0"],
            # precision fast: the weights interleaved at load (model/weights_pack.c), each
            # matrix's new buffer failing in turn with some packed and some not
            "fast": [hetkv, "run", "-m", model, "-p", "Hello world, this is a test.", "-n", "6", "-c",
                     "128", "--sink", "2", "--local", "8", "--policy", "ctkvr", "--precision", "fast",
                     "-t", "2", "--temp", "0"],
            "device": [hetkv, "run", "-m", model, "-p", "Hello world, this is a test.", "-n", "6", "-c",
                       "128", "--sink", "2", "--local", "8", "--policy", "ctkvr", "-t", "2", "--temp", "0",
                       "--device", "cuda"],
            "batch": [hetkv, "batch", "-m", model, "-i", inp, "-o", out, "--max-batch", "2", "-c", "128",
                      "--sink", "2", "--local", "8", "--policy", "snapkv", "--policy-arg", "budget=4",
                      "-t", "2", "-q", "--no-mpi"],
            "prefix": [hetkv, "batch", "-m", model, "-i", inp3, "-o", out, "--max-batch", "3", "-c", "128",
                       "--chunk", "8", "--prefix-cache", "2", "--policy", "full", "-t", "2", "-q",
                       "--no-mpi"],
            # ctkvr shares its index too: the store, the own rows DCU makes in a
            # decode step's threads, the index built at the last whole chunk
            "prefix_ctkvr": [hetkv, "batch", "-m", model, "-i", inp3, "-o", out, "--max-batch", "3",
                             "-c", "128", "--chunk", "8", "--prefix-cache", "2", "--policy", "ctkvr",
                             "--sink", "2", "--local", "8", "-t", "2", "-q", "--no-mpi"],
        }
        n_req = {"batch": 2, "prefix": 3, "prefix_ctkvr": 3}
        # two runs a time on two cores: a team that spins between regions would
        # take the other run's core (passive: 266 s for the walk here; spinning, 347 s)
        env0 = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
                    UBSAN_OPTIONS="print_stacktrace=1", OMP_WAIT_POLICY="passive")
        walked = failures = 0
        for name in a.jobs.split(","):
            cmd = jobs[name]
            env = dict(env0)
            if name == "device":
                info = subprocess.run([hetkv, "info", "--json"], capture_output=True, text=True)
                cuda = json.loads(info.stdout).get("cuda", {}) if info.returncode == 0 else {}
                if cuda.get("backend") != "cuda-emu":
                    print(f"device: skipped: hetkv runs no CUDA emulator here (backend "
                          f"{cuda.get('backend')!r})")
                    continue
                env["HKV_FAULT_KINDS"] = "device,pinned"
            rep = os.path.join(tmp, "count.txt")
            if os.path.exists(out):
                os.remove(out)
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout,
                               env=dict(env, HKV_FAULT_REPORT=rep))
            if not os.path.exists(rep):
                print("fault walk: skipped: not a -Dfault_inject=true build (no allocation count)")
                return 77
            if p.returncode != 0:
                print(f"FAIL {name}: the unfailed run exits {p.returncode}: {p.stderr[-400:]}")
                return 1
            base_out = p.stdout
            with open(rep) as f:
                total = int(f.read().strip())
            kinds = {"error": 0, "unaffected": 0, "answered": 0}

            def one(n: int):
                """Allocation n failed: its run's kind (None: a failure) and what to print."""
                o = os.path.join(tmp, f"out{n}.jsonl")   # each run its own output: runs overlap
                c = [o if x == out else x for x in cmd]
                try:
                    p = subprocess.run(c, capture_output=True, text=True, timeout=a.timeout,
                                       env=dict(env, HKV_FAULT_AT=str(n)))
                except subprocess.TimeoutExpired:
                    return None, f"FAIL {name} allocation {n}: hung past {a.timeout} s", False
                err = p.stderr
                bad = next((s for s in SAN if s in err), None)
                kind = None
                if bad or p.returncode < 0:
                    kind = None
                elif p.returncode == 1 and "hetkv: error:" in err:
                    kind = "error"
                elif p.returncode == 0 and name not in n_req and p.stdout == base_out:
                    kind = "unaffected"
                elif p.returncode == 0 and name in n_req and os.path.exists(o):
                    with open(o) as f:
                        lines = [json.loads(l) for l in f]
                    # a request whose own allocation failed gets an error line (without its
                    # custom_id when that copy was the one to fail)
                    ids = sorted(str(x.get("custom_id")) for x in lines)
                    want = [f"r{i}" for i in range(n_req[name])]
                    kind = "answered" if len(lines) == len(want) and (ids == want or any(
                        x.get("error") or x.get("response", {}).get("status_code") != 200
                        for x in lines)) else None
                if os.path.exists(o):
                    os.remove(o)
                where = err.strip().splitlines()
                msg = (f"FAIL {name} allocation {n}/{total}: exit {p.returncode}"
                       f"{', ' + bad if bad else ''}: {' | '.join(where[:12])[:1500]}")
                return kind, msg, True

            # the runs are independent processes: one a core (each mostly the
            # sanitizers' start-up), reported in allocation order
            with ThreadPoolExecutor(max_workers=a.workers) as pool:
                for kind, msg, ran in pool.map(one, range(1, total + 1)):
                    walked += ran
                    if kind:
                        kinds[kind] += 1
                    else:
                        failures += 1
                        print(msg)
            print(f"{name}: {total} allocations: {kinds['error']} ended with an error message, "
                  f"{kinds['unaffected']} unaffected, {kinds['answered']} answered (a request's own "
                  f"error line)")
        print(f"fault walk: {walked} allocations walked, {failures} failures")
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

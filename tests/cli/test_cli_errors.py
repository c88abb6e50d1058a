#!/usr/bin/env python3
"""Bad input at the CLI gets a clear error naming the problem and a non-zero
exit status, never a crash. Each case: argv, the expected exit status, and a
fragment the error message must contain.

    python3 tests/cli/test_cli_errors.py BUILD_DIR MODEL
"""
import json
import os
import subprocess
import sys
import tempfile

build, model = sys.argv[1], sys.argv[2]
hetkv = os.path.join(build, "tools", "hetkv")
dump = os.path.join(build, "tools", "hkv-dump-logits")
have_model = os.path.exists(model)

tmp = tempfile.mkdtemp()
truncated = os.path.join(tmp, "truncated.gguf")
notgguf = os.path.join(tmp, "notgguf.gguf")
with open(notgguf, "wb") as f:
    f.write(b"this is not a model file at all" * 10)
if have_model:
    with open(model, "rb") as src, open(truncated, "wb") as f:
        f.write(src.read(5_000_000))   # header and tensor table, data cut short

M = ["-m", model]
# A CUDA device (a GPU, or the CUDA emulator in a -Dgpu_emu=true build) runs
# --device cuda; without one the run is refused naming why.
info = subprocess.run([hetkv, "info", "--json"], capture_output=True, text=True, timeout=60)
try:
    have_dev = bool(json.loads(info.stdout).get("cuda", {}).get("devices"))
except ValueError:
    have_dev = False
cases = [
    # (name, argv, exit status, fragment of stderr)
    ("no command", [hetkv], 2, "usage"),
    ("unknown command", [hetkv, "frobnicate"], 2, "unknown command 'frobnicate'"),
    ("run without model", [hetkv, "run", "-p", "x"], 2, "no model"),
    ("run unknown option", [hetkv, "run", *M, "-p", "x", "--bogus"], 2, "unknown option '--bogus'"),
    ("run missing value", [hetkv, "run", *M, "-p"], 2, "needs a value"),
    ("run absurd n", [hetkv, "run", *M, "-p", "x", "-n", "99999999999"], 2, "out of range"),
    ("run bad temp", [hetkv, "run", *M, "-p", "x", "--temp", "-1"], 2, "out of range"),
    ("run bad number", [hetkv, "run", *M, "-p", "x", "-t", "two"], 2, "not an integer"),
    ("run prompt and file", [hetkv, "run", *M, "-p", "x", "-f", "y"], 2, "exactly one"),
    ("run missing file", [hetkv, "run", *M, "-f", "/nonexistent/prompt.txt"], 1, "/nonexistent/prompt.txt"),
    ("missing model", [hetkv, "run", "-m", "/nonexistent/m.gguf", "-p", "x"], 1, "/nonexistent/m.gguf"),
    ("not a gguf", [hetkv, "run", "-m", notgguf, "-p", "x"], 1, "magic"),
    ("unknown policy", [hetkv, "run", *M, "-p", "x", "--policy", "magic"], 1, "unknown policy 'magic'"),
    ("unknown policy key", [hetkv, "run", *M, "-p", "x", "--policy", "ctkvr", "--policy-arg", "zz=1"], 1,
     "has no parameter 'zz'"),
    ("policy value range", [hetkv, "run", *M, "-p", "x", "--policy", "ctkvr", "--policy-arg", "Cp=0"], 1,
     "out of range"),
    ("policy value type", [hetkv, "run", *M, "-p", "x", "--policy", "oracle", "--policy-arg", "k=1.5"], 1,
     "must be an integer"),
    ("policy arg syntax", [hetkv, "run", *M, "-p", "x", "--policy", "oracle", "--policy-arg", "k"], 1,
     "KEY=VALUE"),
    ("plain with policy", [hetkv, "run", *M, "-p", "x", "--kv", "plain", "--policy", "full"], 1,
     "--kv plain takes no policy"),
    ("speckv without draft", [hetkv, "run", *M, "-p", "x", "--policy", "speckv"], 1, "needs --draft MODEL"),
    ("specpc without draft", [hetkv, "run", *M, "-p", "x", "--policy", "specpc"], 1, "needs --draft MODEL"),
    ("missing draft", [hetkv, "run", *M, "-p", "x", "--policy", "speckv", "--draft", "/nonexistent/d.gguf"],
     1, "/nonexistent/d.gguf"),
    ("laq even kernel", [hetkv, "run", *M, "-p", "x", "--policy", "laq", "--policy-arg", "kernel=4"], 1,
     "kernel=4 must be odd"),
    ("laq w2 range", [hetkv, "run", *M, "-p", "x", "--policy", "laq", "--policy-arg", "w2=5000"], 1,
     "w2=5000 is out of range"),
    ("bad kv kind", [hetkv, "run", *M, "-p", "x", "--kv", "paged"], 2, "not plain or tiered"),
    # past the trained context: a warning naming both, and the run goes on
    ("context past trained", [hetkv, "run", *M, "-p", "x", "-n", "1", "-c", "9000"], 0,
     "is past Smollm2 135M 8k Lc100K Mix1 Ep2's trained context of 8192 tokens"),
    ("context absurd", [hetkv, "run", *M, "-p", "x", "-c", "99999999999"], 2, "out of range"),
    ("context too small", [hetkv, "run", *M, "-p", "hello there", "-n", "10", "-c", "4"], 1,
     "needs"),
    ("bench bad list", [hetkv, "bench", *M, "--ctx", "1024,,2"], 2, "bad list"),
    ("bench bad isa", [hetkv, "bench", *M, "--isa", "neon"], 2, "unknown"),
    ("info bad option", [hetkv, "info", "--bogus"], 2, "unknown option"),
    # devices, GPU memory caps, synthetic models, admission (tools/cli/cli_device.c, hetkv plan)
    ("gpu-mem garbage", [hetkv, "bench", "--synthetic", "smollm2-135m", "--device", "cuda", "--gpu-mem", "lots"], 2,
     "'lots' is not a size"),
    ("gpu-mem zero", [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "0G"], 2, "is zero"),
    ("gpu-mem negative", [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "-24G"], 2, "not a size"),
    ("gpu-mem absurd", [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "5000T"], 2, "absurdly large"),
    ("gpu-mem without cuda", [hetkv, "bench", *M, "--gpu-mem", "24G"], 1, "needs --device cuda"),
    ("gpu-gemm garbage", [hetkv, "bench", *M, "--device", "cuda", "--gpu-gemm", "int4"], 2,
     "is not auto, split, fp16 or fp32"),
    ("gpu-gemm without cuda", [hetkv, "bench", *M, "--gpu-gemm", "split"], 1, "needs --device cuda"),
    ("gpu-profile without cuda", [hetkv, "bench", *M, "--gpu-profile"], 1, "needs --device cuda"),
    ("gpu-lockstep without cuda", [hetkv, "run", *M, "-p", "x", "--gpu-lockstep"], 1, "needs --device cuda"),
    ("gpu-no-graphs without cuda", [hetkv, "run", *M, "-p", "x", "--gpu-no-graphs"], 1, "needs --device cuda"),
    ("gpu-pingpong without cuda", [hetkv, "bench", *M, "--gpu-pingpong"], 1, "needs --device cuda"),
    ("gpu-spin-us without cuda", [hetkv, "run", *M, "-p", "x", "--gpu-spin-us", "100"], 1, "needs --device cuda"),
    ("gpu-spin-us absurd", [hetkv, "run", *M, "-p", "x", "--device", "cuda", "--gpu-spin-us", "5000000"], 2, "--gpu-spin-us"),
    ("info gpu-mem without cuda", [hetkv, "info", "--gpu-mem", "8G"], 1, "needs --device cuda"),
    ("bad device", [hetkv, "run", *M, "-p", "x", "--device", "tpu"], 2, "not cpu or cuda"),
    # without a GPU: names why; with one (or the emulator's 4 GiB): the plan's verdict
    ("bench device cuda", [hetkv, "bench", "--synthetic", "llama3-8b", "--device", "cuda"], 1, "--device cuda"),
    ("run device cuda", [hetkv, "run", *M, "-p", "x", "-n", "2", "-c", "64", "--device", "cuda"],
     0 if have_dev else 1, "decode" if have_dev else "--device cuda"),
    ("run gpu-mem below the weights", [hetkv, "run", *M, "-p", "x", "-n", "2", "-c", "64", "--device", "cuda",
                                       "--gpu-mem", "1M"], 1, "--device cuda"),
    ("unknown synthetic", [hetkv, "bench", "--synthetic", "gpt5"], 2, "unknown synthetic model 'gpt5'"),
    ("synthetic and model", [hetkv, "bench", "--synthetic", "smollm2-135m", *M], 2, "not both"),
    ("run synthetic", [hetkv, "run", "--synthetic", "smollm2-135m", "-p", "x"], 2, "no tokenizer"),
    ("batch does not fit", [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "24G", "--ctx", "32768",
                            "--policy", "full", "--batch", "4", "--synthetic-weights", "f16"], 1,
     "needs 31.29 GiB of GPU memory (weights 14.96 GiB, near 16.00 GiB, index 0 B, workspace 343.38 MiB) "
     "but the cap is 24.00 GiB"),
    # the weights as --device cuda holds them (q4 by default): batch 4 fits, 8 does not
    ("batch does not fit q4", [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "24G", "--ctx", "32768",
                               "--policy", "full", "--batch", "8"], 1,
     "needs 37.01 GiB of GPU memory (weights 4.68 GiB, near 32.00 GiB, index 0 B, workspace 343.50 MiB) "
     "but the cap is 24.00 GiB"),
    ("index bad", [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "24G", "--index", "disk"], 2,
     "'disk' is not auto, gpu, host or both"),
    ("plan no cap", [hetkv, "plan", "--synthetic", "llama3-8b"], 2, "no cap"),
    ("plan missing draft", [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "24G", "--policy", "specpc",
                            "--draft", os.path.join(tmp, "no_such_draft.gguf")], 1, "--draft '"),
    ("plan draft vocabulary", [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "24G", "--policy",
                               "speckv", "--draft", "smollm2-135m"], 1, "must share the target's tokenizer"),
    ("plan gen too long", [hetkv, "plan", "--synthetic", "llama3-8b", "--gpu-mem", "24G", "--ctx", "1024",
                           "--policy", "specpc", "--gen", "1024"], 1, "leaves no prompt"),
    ("dump bad token", [dump, *M, "--tokens", "1,99999999", "-o", os.path.join(tmp, "o.bin")], 1,
     "outside the vocabulary"),
    # the option tables' parser names the program it runs in, and a group's
    # options a command leaves out are refused by name
    ("dump unknown option", [dump, "--bogus"], 2, "hkv-dump-logits: unknown option '--bogus' "
     "(see hkv-dump-logits --help)"),
    ("eval single-policy option", [hetkv, "eval", "--policy", "ctkvr"], 2,
     "--policy: eval runs the tiered cache with the policies of --configs"),
    ("policies argument", [hetkv, "policies", "foo"], 2, "policies: unknown argument 'foo'"),
    ("bench far bad isa", [hetkv, "bench", "far", "--isa", "x"], 2, "--isa: unknown 'x' (scalar, avx2, avx2-novnni, avx512)"),
    ("bench kernels bad isa", [hetkv, "bench", "kernels", "--isa", "x"], 2, "unknown ISA 'x'"),
    ("split-overflow in run", [hetkv, "run", *M, "-p", "hi", "--split-overflow"], 1,
     "--split-overflow is for batch and serve"),
]
# the far tier is page-locked: a batch x context past the host's memory (or
# --host-mem) is refused at admission, naming what a sequence needs; bench
# measures the batches that fit and names the ones refused
cases.append(("host-mem without cuda", [hetkv, "bench", *M, "--host-mem", "1G"], 1, "needs --device cuda"))
if have_dev:
    host = [hetkv, "bench", "--synthetic", "llama3.1-8b@1", "--device", "cuda", "--gpu-mem", "3G",
            "--host-mem", "300M", "--ctx", "32768", "--configs", "ctkvr", "--admit-only"]
    cases.append(("host memory does not fit", host + ["--batch", "2"], 1,
                  "needs 566.38 MiB of page-locked host memory (far tier K and V 256.26 MiB, index lists "
                  "310.12 MiB; 283.19 MiB a sequence) but the cap is 300.00 MiB: at most 1 such sequences fit"))
    # a list of batches forks each from the prompt's own sequence, held beside
    # them: batch B holds B + 1 sequences (1 fits 600M, 2 does not)
    wider = [a if a != "300M" else "600M" for a in host]
    cases.append(("host memory: largest batch refused", wider + ["--batch", "1,2,4"], 0,
                  "batch 2 refused: the prompt's sequence is held beside the batch's 2 forks: "
                  "--device cuda, --host-mem: batch 3 x context 32801"))
    # a configuration over the 8-bit far tier holds 0.56x the far rows: batch 2
    # is refused for the fp16 one only, and admitted for the run
    mixed = [a if a != "ctkvr" else "ctkvr;ctkvr:far=q8" for a in host]
    mixed[mixed.index("300M")] = "700M"
    cases.append(("host memory: refused for one configuration", mixed + ["--batch", "1,2"], 0,
                  "batch 2 refused for 'ctkvr': the prompt's sequence is held beside the batch's 2 "
                  "forks: --device cuda, --host-mem: batch 3 x context 32801"))
    cases.append(("host memory: the 8-bit one admitted", mixed + ["--batch", "1,2"], 0,
                  "admitted: context 32768, batch 2"))
if have_dev:   # a head size the device's attention kernels do not take: refused at creation
    hd48 = os.path.join(tmp, "hd48.gguf")
    gen = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "tools", "scripts", "gen_tiny_gguf.py")
    subprocess.run([sys.executable, gen, "--arch", "llama", "--layers", "1", "--dim", "96", "--heads", "2",
                    "--kv-heads", "1", "--head-dim", "48", "--ffn", "96", "--vocab", "400", "--wtype", "f16",
                    "-q", "-o", hd48], check=True, timeout=120)
    cases.append(("device head size 48", [dump, "-m", hd48, "--tokens", "1,2,3", "--device", "cuda", "-o",
                  os.path.join(tmp, "hd48.bin")], 1, "needs a head size that is a multiple of 32 and at most 256"))
if have_model:
    cases.append(("truncated model", [hetkv, "run", "-m", truncated, "-p", "x"], 1, "past the end"))

passed = failed = skipped = 0
# hetkv --help lists every command main() dispatches: the commands are taken
# from the unknown-command error (the dispatcher's own list), so a command
# added there and forgotten in the usage text fails here.
r = subprocess.run([hetkv, "--help"], capture_output=True, text=True, timeout=60)
err = subprocess.run([hetkv, "frobnicate"], capture_output=True, text=True, timeout=60).stderr
listed = err.split("(", 1)[1].split(";", 1)[0].replace(" ", "").split(",") if "(" in err else []
lines = [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("  ") and ln.split()]
missing = [c for c in listed if c not in lines]
ok = r.returncode == 0 and len(listed) >= 8 and not missing
print(("PASS" if ok else "FAIL"), "help lists every command", f"({', '.join(listed)})",
      "" if ok else f"missing {missing} (exit {r.returncode})")
passed += ok
failed += not ok
# eval's --help shows the KV group without the options it refuses
r = subprocess.run([hetkv, "eval", "--help"], capture_output=True, text=True, timeout=60)
opts = [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("      --")]
ok = r.returncode == 0 and "--sink" in opts and not {"--kv", "--policy", "--policy-arg"} & set(opts)
print(("PASS" if ok else "FAIL"), "eval help leaves out --kv, --policy, --policy-arg", "" if ok else opts)
passed += ok
failed += not ok
for name, argv, want_rc, frag in cases:
    if not have_model and model in argv:
        skipped += 1
        continue
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    msg = r.stderr + r.stdout
    ok = r.returncode == want_rc and frag.lower() in msg.lower() and r.returncode >= 0
    print(("PASS" if ok else "FAIL"), name, f"(exit {r.returncode})", "" if ok else repr(msg[-400:]))
    passed += ok
    failed += not ok
print(f"test_cli_errors: {passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else (77 if passed == 0 else 0))

#!/usr/bin/env python3
"""Mutation check of the GPU tier, run by hand: typical GPU bugs planted in
the real kernels of gpu/ (and one test helper), each built on the CUDA
emulator and run against `meson test --suite gpu --suite emu`, to see which
bugs the suites catch and how. A measurement, not a test: it exits 0 whatever
survives, 1 when a mutant no longer applies or does not compile (the list is
stale), 2 when the unmutated tree does not pass (nothing can be measured).

Nothing in the repository is touched: the tracked files of the working tree
are copied into a scratch tree (--work, default /tmp/hkv_gpu_mutants), where
one release emulator build (build-emu/) is set up once and every mutant is
applied, built incrementally, tested and reverted. Mutants marked `asan` or
`tsan` are also run in an AddressSanitizer+UBSan or ThreadSanitizer emulator
build there (build-asan/, build-tsan/, made on first use); mutants of the
stream-ordering class are run again with HKV_EMU_EAGER=1 (every stream item
at its call, in program order), under which a pure ordering bug disappears,
and, when they pass, with HKV_EMU_DELAY=300 (stream threads start each item
up to 300 us late, or the mutant's own delay), under which a host/stream race shows.
The scratch tree is kept between runs, so a second run rebuilds only what
changed.

  tools/scripts/gpu_mutants.py                 # all mutants, Markdown table on stdout
  tools/scripts/gpu_mutants.py --json          # the same as JSON
  tools/scripts/gpu_mutants.py --only ID[,ID]  # some of them
  tools/scripts/gpu_mutants.py --list          # the mutants, without running anything
  tools/scripts/gpu_mutants.py --compile-only  # apply and build each (no tests)

Progress goes to stderr. Python 3 standard library only.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


class Mutant:
    def __init__(self, id, cls, what, hunks, eager=False, san=None, san_tests=None, blind=None,
                 delay_us=300):
        self.id = id            # short name
        self.cls = cls          # the GPU bug class
        self.what = what        # what changed, in words
        self.hunks = hunks      # [(file, original snippet (exactly once in file), replacement)]
        self.eager = eager      # stream-ordering class: run again with HKV_EMU_EAGER=1
        self.san = san          # None, 'asan' or 'tsan': also run in that sanitizer build
        self.san_tests = san_tests  # meson test names for the sanitizer run (default: suites)
        self.blind = blind      # if it survives: why the emulator cannot see it
        self.delay_us = delay_us  # HKV_EMU_DELAY of the delayed-stream run (stream-ordering class)


M = Mutant
MUTANTS = [
    # ---- dropped or misplaced barriers -------------------------------------------------
    M("sync-attn-tile", "dropped __syncthreads",
      "attention tile loop: the barrier before a tile is overwritten removed (a warp still "
      "scoring tile t reads tile t+1's keys)",
      [("gpu/attn_common.cuh",
        "        __syncthreads();   /* the previous tile is consumed (and qw written, first time) */\n",
        "")]),
    M("sync-keep-hist", "dropped __syncthreads",
      "keep radix select: the barrier between the histogram and the first warp's bin scan removed",
      [("gpu/keep_core.cuh",
        "        __syncthreads();\n"
        "        if (threadIdx.x < 32) {   /* lane l: bins",
        "        if (threadIdx.x < 32) {   /* lane l: bins")]),
    M("sync-build-select", "dropped __syncthreads",
      "ctkvr build radix select: the barrier after thread 0 picks the bin removed (the next "
      "pass zeroes the histogram it is scanning)",
      [("gpu/ctkvr_build.cu",
        "                cum += hist[b];\n"
        "            }\n"
        "        }\n"
        "        __syncthreads();\n"
        "    }\n",
        "                cum += hist[b];\n"
        "            }\n"
        "        }\n"
        "    }\n")]),
    M("syncwarp-merge", "dropped __syncwarp",
      "attention merge: the __syncwarp between every lane reading lse_a and lane 0 writing it "
      "removed (an intra-warp race under independent thread scheduling)",
      [("gpu/attn_decode.cu",
        "        const float la = lse_a[row], lb = lse_b[row];\n        __syncwarp();\n",
        "        const float la = lse_a[row], lb = lse_b[row];\n")]),
    M("race-ws-acc-qs", "shared-memory race",
      "window scores pass 2: the write of the next row's query to shared memory moved above "
      "the barrier that protects the previous row's readers",
      [("gpu/window_scores.cu",
        "        __syncthreads();   /* qs of the previous row is no longer read */\n"
        "        for (int e = threadIdx.x; e < d; e += blockDim.x) qs[e] = hkv_h2f(qr[e]);\n"
        "        __syncthreads();\n",
        "        for (int e = threadIdx.x; e < d; e += blockDim.x) qs[e] = hkv_h2f(qr[e]);\n"
        "        __syncthreads();   /* qs of the previous row is no longer read */\n"
        "        __syncthreads();\n")]),
    M("race-rmsnorm-total", "shared-memory race",
      "RMSNorm: the barrier between warp 0 writing the block's sum to part[0] and every "
      "thread reading it removed",
      [("gpu/model_kernels.cu",
        "        if (threadIdx.x == 0) part[0] = v;\n    }\n    __syncthreads();\n",
        "        if (threadIdx.x == 0) part[0] = v;\n    }\n")]),
    M("early-return-barrier", "divergent barrier",
      "prefill: warps without a query row return before the block's tile barriers",
      [("gpu/attn_prefill.cu",
        "        __syncthreads();   /* the previous tile is consumed (and Q written, the first time) */",
        "        if (wr0 >= nrows) return;\n"
        "        __syncthreads();   /* the previous tile is consumed (and Q written, the first time) */")]),
    # ---- tails, bounds, grids ----------------------------------------------------------
    M("tail-load-oob", "off-by-one on a tail tile", "attention tile load: `j < nt` -> `j <= nt` "
      "(one key row past the end is loaded; the scores mask it)",
      [("gpu/attn_common.cuh",
        "                if (j < nt) {\n"
        "                    const int64_t r = idx ? (int64_t)idx[t0 + j] : t0 + j;\n"
        "                    kx =",
        "                if (j <= nt) {\n"
        "                    const int64_t r = idx ? (int64_t)idx[t0 + j] : t0 + j;\n"
        "                    kx =")],
      san="asan",
      blind="the extra row is loaded into the tile but masked from the scores, so results do "
            "not change; only the read past the K/V buffer is wrong"),
    M("causal-off-by-one", "off-by-one on a tail tile",
      "attention score mask: `t0 + lane < klim` -> `<=` (a prefill row also scores the next "
      "token)",
      [("gpu/attn_common.cuh", "        if (lane < nt && t0 + lane < klim) {\n",
        "        if (lane < nt && t0 + lane <= klim) {\n")]),
    M("grid-floor-prefill", "grid computed with floor",
      "prefill: blocks = nq*g / (16 W) instead of the ceiling (the last rows get no block)",
      [("gpu/attn_prefill.cu", "const int64_t bx = (nq * g + 16 * W - 1) / (16 * W);",
        "const int64_t bx = nq * g / (16 * W);")]),
    M("oob-embed-vocab", "out-of-bounds global read",
      "embedding: token id check `t < vocab` -> `t <= vocab` (id = vocab reads the row past "
      "the table)",
      [("gpu/model_kernels.cu", "(t >= 0 && t < vocab)", "(t >= 0 && t <= vocab)")],
      san="asan"),
    M("oob-rmsnorm-row", "out-of-bounds global read",
      "RMSNorm sum of squares: `i < dim` -> `i <= dim` (reads one element past the row)",
      [("gpu/model_kernels.cu",
        "    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * xr[i];\n",
        "    for (int i = threadIdx.x; i <= dim; i += blockDim.x) ss += (double)xr[i] * xr[i];\n")],
      san="asan"),
    M("grid-y-unchecked", "unchecked grid dimension",
      "pool: the `n_batch > 65535` check dropped (batch rows are grid.y)",
      [("gpu/pool_keep.cu", "n_batch < 0 || n_batch > 65535 || n < 0 || ld_in < n",
        "n_batch < 0 || n < 0 || ld_in < n")]),
    # ---- tensor-core fragments (mma.sync, ldmatrix) -----------------------------------
    M("mma-prefill-v-no-trans", "wrong fragment layout",
      "mma prefill: V's B fragments by a plain ldmatrix instead of .trans (P V with V^T's layout)",
      [("gpu/attn_prefill_mma.cu",
        "hkv_ldsm_x4_t(b, vs + (kk * 16",
        "hkv_ldsm_x4(b, vs + (kk * 16")]),
    M("mma-prefill-no-rescale", "lost online-softmax rescale",
      "mma prefill: O no longer rescaled when a row's running max grows",
      [("gpu/attn_prefill_mma.cu",
        "for (int c = 0; c < 4; c++) o[f][c] *= alpha[c >> 1];",
        "for (int c = 0; c < 4; c++) o[f][c] *= 1.0f;")]),
    M("mma-build-a-layout", "wrong fragment layout",
      "build scores on mma: A's four 8x8 matrices fetched in the wrong order (dims and rows "
      "swapped)",
      [("gpu/ctkvr_scores_mma.cu",
        "(warp * 16 + (mj & 1) * 8 + mi) * LD + kk * 16 + (mj >> 1) * 8",
        "(warp * 16 + (mj >> 1) * 8 + mi) * LD + kk * 16 + (mj & 1) * 8")]),
    M("mma-build-block-rows", "wrong block offset",
      "build scores on mma: every block reads the first 64 centroids' queries (blockIdx.y "
      "ignored)",
      [("gpu/ctkvr_scores_mma.cu",
        "const uint16_t *qb = q + (i0 + c0) * ldq",
        "const uint16_t *qb = q + (i0 + 0) * ldq")]),
    M("sync-build-mma-head", "dropped __syncthreads",
      "build scores on mma: the barrier before the next query head's rows overwrite the "
      "current ones removed (a slow warp reads head j + 1's rows)",
      [("gpu/ctkvr_scores_mma.cu",
        "        if (j) __syncthreads();   /* every warp is done with head j - 1's rows */\n",
        "")], san="tsan"),
    M("block-2048", "block larger than 1024 threads",
      "ctkvr build: 32 centroids per score block instead of 4 (64 x 32 = 2048 threads)",
      [("gpu/ctkvr_build.cu", "    int ct = 4;   /* centroids per score block",
        "    int ct = 32;   /* centroids per score block")]),
    # ---- warp collectives --------------------------------------------------------------
    # (not in gpu_internal.cuh's hkv_warp_sum/max: an emulator build runs those
    # as one collective, hkv_emu::warp_tree, so a mutant there would not be seen)
    M("shfl-offset-8", "wrong shuffle offset",
      "decode attention's row sums: the butterfly starts at LG / 4 instead of LG / 2 "
      "(sums half of each row's lanes)",
      [("gpu/attn_decode.cu",
        "for (int o = LG / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);",
        "for (int o = LG / 4; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);")]),
    M("shfl-xor-to-down", "wrong shuffle kind",
      "the coalesced tile dot's halving (gpu/tile_dot.cuh): `__shfl_xor_sync` -> "
      "`__shfl_down_sync` (the upper lanes read past their partner)",
      [("gpu/tile_dot.cuh",
        "v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);",
        "v[i] = keep + __shfl_down_sync(0xffffffffu, send, O);")]),
    M("shfl-q8-max-8", "wrong shuffle offset",
      "8-bit rows (gpu/rows.cu): a group's absmax butterfly starts at 8 instead of 16 "
      "(each half of the group takes its own scale)",
      [("gpu/rows.cu",
        "for (int m = 16; m; m >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, m));",
        "for (int m = 8; m; m >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, m));")]),
    M("shfl-width-16", "wrong shuffle width",
      "attention V accumulation: `__shfl_sync(mask, p, j)` -> width 16 (keys 16-31 take "
      "another lane's probability)",
      [("gpu/attn_common.cuh", "__shfl_sync(0xffffffffu, p, j);",
        "__shfl_sync(0xffffffffu, p, j, 16);")]),
    M("ballot-mask", "wrong warp-collective mask",
      "keep: the histogram's __match_any_sync mask 0xffffffff -> 0x0000ffff (lanes 16-31 call "
      "it unnamed)",
      [("gpu/keep_core.cuh", "__match_any_sync(0xffffffffu, bin);",
        "__match_any_sync(0x0000ffffu, bin);")]),
    # ---- atomics and shared-memory initialisation --------------------------------------
    M("atomic-to-rmw", "atomic turned into a plain read-modify-write",
      "keep radix select histogram: `atomicAdd(&hist[bin], c)` -> `hist[bin] += c`",
      [("gpu/keep_core.cuh", "atomicAdd(&hist[bin], (uint32_t)(",
        "(void)0, hist[bin] += ((uint32_t)(")],
      blind="the threads of a block are fibers on one OS thread that switch only at barriers "
            "and warp collectives, so the load, add and store of `+=` never interleave with "
            "another thread's; ThreadSanitizer is told every fiber switch synchronises"),
    M("uninit-shared-ngt", "uninitialised shared memory",
      "ctkvr build select: the `n_gt = 0` initialisation of the shared output counter dropped",
      [("gpu/ctkvr_build.cu", "krem_s = rho, n_gt = 0;", "krem_s = rho;")]),
    M("oob-shared-rmsnorm", "out-of-bounds shared read",
      "RMSNorm: warp 0 reads part[lane] for all 32 lanes of an 8-element shared array",
      [("gpu/model_kernels.cu",
        "double v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0;",
        "double v = part[threadIdx.x];")],
      san="asan",
      blind="static __shared__ arrays are thread_local in the emulator: no redzone around "
            "them for ASan, and the words read past part[] are other kernels' shared "
            "variables, zero on this path"),
    # ---- stream ordering ---------------------------------------------------------------
    M("stream-legacy-download", "missing stream synchronisation",
      "hkv_gpu_download issues its copy on the legacy stream 0 instead of the given stream "
      "(not ordered after kernels on the context's non-blocking stream)",
      [("gpu/gpu_ctx.cu",
        "cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, hkv_stream(stream))",
        "cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, 0)")], eager=True),
    M("get-nosync", "missing stream synchronisation (not a bug)",
      "test helper gpu_get: the stream synchronisation after the download dropped",
      [("tests/gpu/gpu_test.h",
        "    if (hkv_gpu_download(dst, src, bytes, s, &err) || hkv_gpu_sync(s, &err))\n",
        "    if (hkv_gpu_download(dst, src, bytes, s, &err))\n")], eager=True,
      blind="not a bug: a cudaMemcpyAsync to pageable host memory returns only when the copy "
            "is done (after everything queued before it on the stream), on a GPU as in the "
            "emulator"),
]

SUITES = ["--suite", "gpu", "--suite", "emu"]
TSAN_TESTS = ["gpu_model", "gpu_attn", "gpu_policies", "gpu_page_policies"]   # as tools/scripts/test.sh


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class ScriptError(Exception):
    pass


def run(cmd, cwd=None, env=None, timeout=None):
    return subprocess.run(cmd, cwd=cwd, env=env, timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace")


# ---- the scratch tree ---------------------------------------------------------------------

def sync_tree(src):
    """Copy the working tree's tracked files into src, writing only files whose
    content differs (unchanged files keep their mtime: builds stay incremental)."""
    out = subprocess.run(["git", "ls-files", "-z", "-s"], cwd=REPO, stdout=subprocess.PIPE,
                         check=True).stdout.decode()
    want = set()
    changed = 0
    for ent in out.split("\0"):
        if not ent:
            continue
        meta, path = ent.split("\t", 1)
        mode = meta.split()[0]
        if mode == "160000":
            continue   # submodule
        a, b = os.path.join(REPO, path), os.path.join(src, path)
        want.add(path)
        if not os.path.lexists(a):
            continue   # deleted in the working tree
        os.makedirs(os.path.dirname(b), exist_ok=True)
        if os.path.islink(a):
            t = os.readlink(a)
            if not (os.path.islink(b) and os.readlink(b) == t):
                if os.path.lexists(b):
                    os.remove(b)
                os.symlink(t, b)
                changed += 1
            continue
        with open(a, "rb") as f:
            data = f.read()
        try:
            with open(b, "rb") as f:
                same = f.read() == data
        except OSError:
            same = False
        if not same:
            if os.path.islink(b):
                os.remove(b)
            with open(b, "wb") as f:
                f.write(data)
            changed += 1
        shutil.copymode(a, b)
    manifest = os.path.join(src, ".gpu_mutants_manifest")
    if os.path.exists(manifest):
        with open(manifest) as f:
            for path in f.read().split("\0"):
                if path and path not in want and os.path.lexists(os.path.join(src, path)):
                    os.remove(os.path.join(src, path))
    with open(manifest, "w") as f:
        f.write("\0".join(sorted(want)))
    return changed


BUILD_OPTS = {
    "emu": ["-Dgpu_emu=true", "--buildtype=release"],
    "asan": ["-Dgpu_emu=true", "--buildtype=debugoptimized", "-Db_sanitize=address,undefined",
             "-Db_lundef=false"],
    "tsan": ["-Dgpu_emu=true", "--buildtype=debugoptimized", "-Db_sanitize=thread",
             "-Db_lundef=false"],
}


class Build:
    def __init__(self, work, kind):
        self.src = os.path.join(work, "src")
        self.dir = os.path.join(work, "build-" + kind)
        self.kind = kind
        self.targets = None

    def setup(self):
        if not os.path.exists(os.path.join(self.dir, "build.ninja")):
            log(f"  meson setup {self.dir}")
            r = run(["meson", "setup", self.dir, self.src] + BUILD_OPTS[self.kind])
            if r.returncode:
                raise ScriptError(f"meson setup {self.dir} failed:\n{r.stdout[-3000:]}")
        if self.targets is None:
            r = run(["meson", "introspect", "--targets", self.dir])
            if r.returncode:
                raise ScriptError(f"meson introspect failed:\n{r.stdout[-2000:]}")
            names = []
            for t in json.loads(r.stdout):
                rel = os.path.relpath(t["filename"][0], self.dir)
                # (tools/hetkv: gpu_bench_kernels runs it)
                if t["type"] == "executable" and (rel.startswith(("tests/gpu/", "tests/emu/")) or
                                                  rel == "tools/hetkv"):
                    names.append(rel)
            self.targets = names

    def build(self):
        """(ok, seconds, first error line or '')."""
        self.setup()
        t = time.time()
        r = run(["ninja", "-C", self.dir, "-j2"] + self.targets)
        dt = time.time() - t
        if r.returncode:
            err = next((l for l in r.stdout.splitlines() if re.search(r"error", l)), "")
            return False, dt, err.strip() or r.stdout.strip().splitlines()[-1:][0]
        return True, dt, ""

    def test(self, logbase, tests=None, env_extra=None, mult=1.0):
        """Run the suites (or the named tests); [(name, result, output)] and seconds."""
        env = dict(os.environ)
        env.update(env_extra or {})
        if self.kind == "asan":
            env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
        if self.kind == "tsan":
            env["TSAN_OPTIONS"] = (f"suppressions={self.src}/tests/gpu/tsan.supp history_size=7 "
                                   "halt_on_error=0")
        sel = tests if tests else SUITES
        cmd = ["meson", "test", "-C", self.dir, "--no-rebuild", "--num-processes", "2",
               "--timeout-multiplier", str(mult), "--logbase", logbase] + sel
        t = time.time()
        run(cmd, env=env, timeout=3600)
        dt = time.time() - t
        path = os.path.join(self.dir, "meson-logs", logbase + ".json")
        res = []
        try:
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    out = (r.get("stderr") or "") + "\n" + (r.get("stdout") or "")
                    out = out.replace("../src/", "")   # paths relative to the tree
                    res.append((r["name"].split(" / ")[-1], r["result"], out))
        except OSError as e:
            raise ScriptError(f"no test log {path}: {e}")
        if not res:
            raise ScriptError(f"meson test ran nothing in {self.dir}")
        return res, dt


# ---- what a failed test says --------------------------------------------------------------

def why(result, out):
    """The first line that says why a test failed."""
    lines = out.splitlines()
    pats = [
        (r"hkv cuda-emu: kernel fault[^:]*: (.*)", "emulator fault: {}"),
        (r"(ERROR: AddressSanitizer: .*)", "{}"),
        (r"(WARNING: ThreadSanitizer: .*)", "{}"),
        (r"(\S+:\d+:\d+: runtime error: .*)", "UBSan: {}"),
        (r"hkv cuda-emu: (.*)", "emulator: {}"),
        (r"(FAIL.*)", "{}"),
    ]
    for pat, fmt in pats:
        for l in lines:
            m = re.search(pat, l)
            if m:
                s = fmt.format(m.group(1).strip())
                return s if len(s) <= 300 else s[:297] + "..."
    if result == "TIMEOUT":
        return "timeout"
    tail = [l for l in lines if l.strip()]
    return f"{result}: " + (tail[-1].strip()[:200] if tail else "no output")


def failures(res):
    return [(n, r, o) for n, r, o in res if r not in ("OK", "SKIP", "EXPECTEDFAIL")]


# ---- patches ------------------------------------------------------------------------------

def apply(src, m):
    """Apply m's hunks in src; returns {file: original text} for restore()."""
    orig = {}
    for path, old, new in m.hunks:
        p = os.path.join(src, path)
        with open(p) as f:
            text = f.read()
        orig.setdefault(path, text)
        n = text.count(old)
        if n != 1:
            restore(src, orig)
            raise ScriptError(f"mutant {m.id}: the snippet occurs {n} times in {path}, not once "
                              f"(stale mutant):\n{old}")
        with open(p, "w") as f:
            f.write(text.replace(old, new))
    return orig


def restore(src, orig):
    for path, text in orig.items():
        with open(os.path.join(src, path), "w") as f:
            f.write(text)


def first_changed_line(src_text, old, new):
    a, b = old.splitlines(), new.splitlines()
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return src_text[:src_text.index(old)].count("\n") + 1 + min(i, max(len(a) - 1, 0))


def locate(src, m):
    """file:line of the first changed line of the first hunk, in the unmutated tree."""
    path, old, new = m.hunks[0]
    with open(os.path.join(src, path)) as f:
        text = f.read()
    if text.count(old) != 1:
        return f"{path}:?"
    return f"{path}:{first_changed_line(text, old, new)}"


# ---- one mutant ---------------------------------------------------------------------------

def run_mutant(m, builds, work, compile_only):
    src = os.path.join(work, "src")
    rec = {"id": m.id, "class": m.cls, "what": m.what, "where": locate(src, m), "san": m.san,
           "eager_class": m.eager}
    orig = apply(src, m)
    try:
        t0 = time.time()
        ok, bt, err = builds["emu"].build()
        rec["build_s"] = round(bt, 1)
        if not ok:
            rec.update(compiles=False, build_error=err)
            return rec
        rec["compiles"] = True
        if compile_only:
            return rec
        res, tt = builds["emu"].test("mutant-" + m.id, mult=0.25)
        fails = failures(res)
        rec["release"] = [{"test": n, "result": r, "why": why(r, o)} for n, r, o in fails]
        if m.eager and not fails:
            # A host/stream race the emulator's prompt stream threads win:
            # run again with streams that start each item late (HKV_EMU_DELAY).
            res_d, _ = builds["emu"].test("mutant-" + m.id + "-delay",
                                          tests=m.san_tests, env_extra={"HKV_EMU_DELAY": str(m.delay_us)},
                                          mult=0.25)
            rec["delay"] = [{"test": n, "result": r, "why": why(r, o)} for n, r, o in failures(res_d)]
        if m.eager and fails:
            env = {"HKV_EMU_EAGER": "1"}
            res_e, _ = builds["emu"].test("mutant-" + m.id + "-eager",
                                          tests=[n for n, _, _ in fails], env_extra=env, mult=0.25)
            rec["eager"] = [{"test": n, "result": r, "why": why(r, o)} for n, r, o in failures(res_e)]
        if m.san:
            b = builds[m.san]
            okb, sbt, serr = b.build()
            if not okb:
                rec.update(san_compiles=False, build_error=serr)
                return rec
            tests = m.san_tests or (TSAN_TESTS if m.san == "tsan" else None)
            res_s, _ = b.test("mutant-" + m.id, tests=tests, mult=1.0)
            rec["san_tests"] = tests or ["suites gpu, emu"]
            rec["sanitizer"] = [{"test": n, "result": r, "why": why(r, o)}
                                for n, r, o in failures(res_s)]
        rec["seconds"] = round(time.time() - t0, 1)
        return rec
    finally:
        restore(src, orig)


def verdict(rec, m):
    """(caught?, by which tests, how)."""
    if not rec.get("compiles", True) or rec.get("san_compiles") is False:
        return "does not compile", "", rec.get("build_error", "")
    rel, san = rec.get("release", []), rec.get("sanitizer")
    sname = {"asan": "ASan+UBSan", "tsan": "TSan"}.get(m.san, "")
    delay = rec.get("delay")
    if not rel and delay:
        return ("with HKV_EMU_DELAY", ", ".join(sorted({f["test"] for f in delay})),
                delay[0]["why"] + "; release without delays: all pass")
    if rel:
        caught = "yes"
        by = ", ".join(sorted({f["test"] for f in rel}))
        how = rel[0]["why"]
        if san:
            how += f"; {sname} build: " + san[0]["why"]
    elif san:
        caught = f"{sname} only"
        by = ", ".join(sorted({f["test"] for f in san}))
        how = san[0]["why"] + f"; release: all pass ({m.blind})" if m.blind else san[0]["why"]
    else:
        caught = "no"
        by = ""
        how = "survived" + (f" (release{' and ' + sname if m.san else ''}): {m.blind}"
                            if m.blind else f" (release{' and ' + sname if m.san else ''})")
    return caught, by, how


def eager_cell(rec, m):
    if not m.eager:
        return ""
    if not rec.get("release"):
        return "n/a (passes anyway)"
    e = rec.get("eager", [])
    return "passes (ordering bug)" if not e else "still fails: " + e[0]["why"]


def md_escape(s):
    return s.replace("|", "\\|").replace("\n", " ")


def table(recs):
    by_id = {m.id: m for m in MUTANTS}
    rows = ["| mutant | class | file:line | what changed | caught? | by which test | how "
            "| HKV_EMU_EAGER=1 |", "|---|---|---|---|---|---|---|---|"]
    for r in recs:
        m = by_id[r["id"]]
        c, by, how = verdict(r, m)
        rows.append("| " + " | ".join(md_escape(x) for x in [
            f"`{r['id']}`", r["class"], f"`{r['where']}`", r["what"], c, by, how,
            eager_cell(r, m)]) + " |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("HKV_MUTANTS_WORK", "/tmp/hkv_gpu_mutants"),
                    help="scratch directory (the tree copy and its builds); default %(default)s")
    ap.add_argument("--only", help="comma-separated mutant ids")
    ap.add_argument("--json", action="store_true", help="JSON on stdout instead of the table")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--compile-only", action="store_true",
                    help="apply and build every mutant, run no test")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the check that the unmutated tree passes")
    a = ap.parse_args()

    sel = MUTANTS
    if a.only:
        ids = [x.strip() for x in a.only.split(",") if x.strip()]
        known = {m.id for m in MUTANTS}
        bad = [x for x in ids if x not in known]
        if bad:
            ap.error(f"unknown mutant(s) {', '.join(bad)}; --list shows them")
        sel = [m for m in MUTANTS if m.id in ids]
    if a.list:
        for m in sel:
            flags = ", ".join(x for x in [m.san or "", "eager" if m.eager else ""] if x)
            print(f"{m.id:24} {m.cls:40} {m.hunks[0][0]}{'  [' + flags + ']' if flags else ''}")
        return 0

    t_start = time.time()
    work = os.path.abspath(a.work)
    src = os.path.join(work, "src")
    os.makedirs(src, exist_ok=True)
    n = sync_tree(src)
    log(f"gpu_mutants: scratch tree {src} ({n} files updated)")
    builds = {k: Build(work, k) for k in ("emu", "asan", "tsan")}
    ok, bt, err = builds["emu"].build()
    if not ok:
        raise ScriptError(f"the unmutated tree does not build: {err}")
    log(f"gpu_mutants: release emulator build {bt:.0f} s")
    baseline = None
    if not (a.no_baseline or a.compile_only):
        res, tt = builds["emu"].test("baseline", mult=0.25)
        f = failures(res)
        if f:
            log("gpu_mutants: the unmutated tree fails: " +
                "; ".join(f"{n}: {why(r, o)}" for n, r, o in f))
            return 2
        baseline = round(tt, 1)
        log(f"gpu_mutants: baseline passes ({len(res)} tests, {tt:.0f} s)")
    # grouped by file: a mutant's revert and the next one's change rebuild the same unit
    order = sorted(sel, key=lambda m: (m.hunks[0][0], MUTANTS.index(m)))
    recs, stale = {}, 0
    for i, m in enumerate(order):
        log(f"gpu_mutants: [{i + 1}/{len(order)}] {m.id} ({m.hunks[0][0]})")
        try:
            r = run_mutant(m, builds, work, a.compile_only)
        except ScriptError as e:
            log(f"  {e}")
            stale += 1
            continue
        recs[m.id] = r
        if not r["compiles"]:
            log(f"  does not compile: {r['build_error']}")
            stale += 1
            continue
        if a.compile_only:
            log(f"  compiles ({r['build_s']} s)")
            continue
        c, by, how = verdict(r, m)
        log(f"  {c}{' by ' + by if by else ''}: {how[:160]}")
        if c == "does not compile":
            stale += 1
    recs = [recs[m.id] for m in sel if m.id in recs]
    elapsed = round(time.time() - t_start)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          stdout=subprocess.PIPE, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           stdout=subprocess.PIPE, text=True).stdout.strip() != ""
    meta = {"commit": head + ("+dirty" if dirty else ""),
            "date": datetime.date.today().isoformat(), "seconds": elapsed,
            "baseline_test_seconds": baseline}
    if a.json:
        out = []
        by_id = {m.id: m for m in MUTANTS}
        for r in recs:
            c, by, how = verdict(r, by_id[r["id"]])
            out.append(dict(r, caught=c, by=by, how=how, eager=eager_cell(r, by_id[r["id"]])))
        print(json.dumps({"meta": meta, "mutants": out}, indent=1))
    elif not a.compile_only:
        print(table(recs))
        caught = sum(1 for r in recs if verdict(r, next(m for m in MUTANTS if m.id == r["id"]))[0]
                     not in ("no", "does not compile"))
        print(f"\n{caught} of {len(recs)} mutants caught; commit {meta['commit']}, "
              f"{meta['date']}, {elapsed} s")
    else:
        print(f"{len(recs) - stale} of {len(sel)} mutants compile; {elapsed} s")
    log(f"gpu_mutants: done in {elapsed} s")
    return 1 if stale else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ScriptError as e:
        log(f"gpu_mutants: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)

#!/usr/bin/env python3
"""Static per-kernel resource report for gpu/*.cu: what ptxas allocates and
what the PTX contains, per target architecture, without a GPU.

For every kernel and architecture: registers, spill stores/loads, stack
frame, static shared and constant memory (ptxas -v), the theoretical
occupancy those imply (the rules of the toolkit's cuda_occupancy.h), and
from the PTX the tensor-core MMA instructions and the 128-bit global loads.

  tools/scripts/ptxas_report.py                        # Markdown, sm_89 and sm_90
  tools/scripts/ptxas_report.py --json --out r.json
  tools/scripts/ptxas_report.py --check [--require-mma k_a,k_b]

--check exits 1 when any function spills on any architecture, or when a
kernel named in --require-mma has no MMA instruction. Exit 77 (the meson
"skipped" status) when nvcc cannot be found; exit 2 when a file fails to
compile. Python 3 standard library only. See docs/PTXAS.md.
"""

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

EXIT_SKIP = 77


def die(msg):
    """Usage errors exit 2, apart from --check's 1 (problems found)."""
    print(msg, file=sys.stderr)
    sys.exit(2)

# Include dirs and defines of the project build (meson.build's `inc` and the
# CUDA branch's -DHKV_HAVE_CUDA=1; release buildtype gives -O3 -DNDEBUG).
# No -std: the build passes none, so nvcc's default dialect applies here too.
INCLUDE_DIRS = ['.', 'base', 'runtime', 'cpu', 'index', 'transfer', 'gpu']
DEFINES = ['-DHKV_HAVE_CUDA=1', '-DNDEBUG']
OPT = ['-O3']

# Per-SM limits by architecture, as cuda_occupancy.h (CUDA 13) encodes them
# and the Programming Guide's "Technical Specifications per Compute
# Capability" table lists them. smem_per_sm is the largest carveout (the
# occupancy calculator's default state); 1 KB per block is reserved by the
# system on cc >= 8.0.
ARCH_LIMITS = {
    'sm_80': dict(max_warps=64, max_blocks=32, smem_per_sm=164 * 1024, barrier_factor=2),
    'sm_86': dict(max_warps=48, max_blocks=16, smem_per_sm=100 * 1024, barrier_factor=1),
    'sm_89': dict(max_warps=48, max_blocks=24, smem_per_sm=100 * 1024, barrier_factor=1),
    'sm_90': dict(max_warps=64, max_blocks=32, smem_per_sm=228 * 1024, barrier_factor=2),
}
COMMON_LIMITS = dict(regs_per_sm=65536, regs_per_block=65536, max_regs_per_thread=255,
                     reg_alloc_unit=256, sub_partitions=4, smem_alloc_unit=128,
                     smem_reserved_per_block=1024, warp_size=32)
CUDA_BIN_DIRS = ['/usr/local/cuda/bin']  # where the toolkit installs, often not on PATH
DEFAULT_BLOCK = 256  # assumed when the PTX carries no .maxntid/.reqntid


def find_nvcc(explicit):
    for cand in (explicit, os.environ.get('NVCC')):
        if cand:
            return shutil.which(cand) or (cand if os.access(cand, os.X_OK) else None)
    found = shutil.which('nvcc')
    if found:
        return found
    for d in CUDA_BIN_DIRS:
        cand = os.path.join(d, 'nvcc')
        if os.access(cand, os.X_OK):
            return cand
    return None


def arch_limits(arch):
    base = re.sub(r'[a-z]$', '', arch)  # sm_90a has sm_90's limits
    if base not in ARCH_LIMITS:
        die('ptxas_report: no occupancy limits known for %s (know: %s)'
                         % (arch, ', '.join(sorted(ARCH_LIMITS))))
    return dict(COMMON_LIMITS, **ARCH_LIMITS[base])


# --- names -----------------------------------------------------------------

def _itanium_plain_name(mangled):
    """Function name of a simple Itanium-mangled symbol (_Z<len><id> or
    _ZN<len><id>...E), for when no demangler is installed."""
    m = re.match(r'_Z(N?)', mangled)
    if not m:
        return mangled
    pos, parts = m.end(), []
    while pos < len(mangled) and mangled[pos].isdigit():
        n = re.match(r'\d+', mangled[pos:]).group()
        pos += len(n)
        parts.append(mangled[pos:pos + int(n)])
        pos += int(n)
        if not m.group(1):
            break
    return '::'.join(parts) if parts else mangled


def demangle_all(names):
    """mangled -> (readable signature, short name without parameters)."""
    names = sorted(set(names))
    tool = shutil.which('cu++filt') or shutil.which('c++filt')
    for d in ([] if tool else CUDA_BIN_DIRS):
        if os.access(os.path.join(d, 'cu++filt'), os.X_OK):
            tool = os.path.join(d, 'cu++filt')
    full = {}
    if tool and names:
        try:
            out = subprocess.run([tool], input='\n'.join(names) + '\n', capture_output=True,
                                 text=True, check=True).stdout.splitlines()
            if len(out) == len(names):
                full = dict(zip(names, out))
        except (OSError, subprocess.CalledProcessError):
            pass
    result = {}
    for n in names:
        sig = full.get(n, n)
        if sig != n:
            # cut the parameter list: the '(' at template depth 0
            depth, cut = 0, len(sig)
            for i, ch in enumerate(sig):
                if ch == '<':
                    depth += 1
                elif ch == '>':
                    depth -= 1
                elif ch == '(' and depth == 0:
                    cut = i
                    break
            short = sig[:cut]
        else:
            short = _itanium_plain_name(n)
        result[n] = (sig, short)
    return result


# --- ptxas -v --------------------------------------------------------------

RE_COMPILING = re.compile(r"Compiling (entry )?function '([^']+)' for '([^']+)'")
RE_PROPS = re.compile(r"Function properties for (\S+)")
RE_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
RE_USED = re.compile(r"Used (\d+) registers")


def parse_ptxas(text):
    """ptxas -v output -> {(arch, mangled): record}. Callee (non-entry)
    functions get records too, since their spills are the kernel's spills."""
    funcs = {}
    arch, current, props_for = None, None, None
    for line in text.splitlines():
        m = RE_COMPILING.search(line)
        if m:
            arch, current = m.group(3), m.group(2)
            rec = funcs.setdefault((arch, current), {})
            rec['entry'] = bool(m.group(1))
            continue
        m = RE_PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = RE_FRAME.search(line)
        if m and props_for is not None and arch is not None:
            rec = funcs.setdefault((arch, props_for), {'entry': False})
            rec['stack'], rec['spill_st'], rec['spill_ld'] = map(int, m.groups())
            rec['frame_seen'] = True
            props_for = None
            continue
        m = RE_USED.search(line)
        if m and current is not None:
            rec = funcs[(arch, current)]
            rec['regs'] = int(m.group(1))
            rec['used_seen'] = True
            b = re.search(r'used (\d+) barriers', line)
            rec['barriers'] = int(b.group(1)) if b else 0
            s = re.search(r'(\d+) bytes smem', line)
            rec['smem'] = int(s.group(1)) if s else 0
            # cmem[0] is the kernel's parameters (absent from sm_90's report:
            # parameters live elsewhere there); other banks are __constant__
            # data and compiler constants.
            rec['cmem'] = {int(b): int(n) for n, b in re.findall(r'(\d+) bytes cmem\[(\d+)\]', line)}
            current = None
    for rec in funcs.values():
        for k in ('stack', 'spill_st', 'spill_ld', 'regs', 'barriers', 'smem'):
            rec.setdefault(k, 0)
        rec.setdefault('cmem', {})
        # an entry without both lines means ptxas's wording changed: --check
        # must not read that as "no spills"
        rec['parsed'] = bool(rec.get('frame_seen') and (rec.get('used_seen') or not rec['entry']))
    return funcs


# --- PTX -------------------------------------------------------------------

RE_ENTRY = re.compile(r'^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$.]+)')
# Tensor-core math (the multiply-accumulate itself, not fragment loads).
RE_MMA = re.compile(r'^\s*(?:@!?%\w+\s+)?(mma\.sync|mma\.sp(?:::\w+)?\.sync|wmma\.mma|'
                    r'wgmma\.mma_async|tcgen05\.mma)\b')
# Global loads and their width: ld with .global among its qualifiers (any
# cache hints, .nc included) and cp.async global -> shared copies. Generic
# ld (no state space) is not counted: it may be shared or local.
RE_LD = re.compile(r'^\s*(?:@!?%\w+\s+)?ldu?((?:\.[\w:]+)+)\s')
RE_CP_ASYNC = re.compile(r'^\s*(?:@!?%\w+\s+)?cp\.async\.c[ag]\.shared(?:::\w+)?\.global'
                         r'\S*\s+[^,]+,\s*[^,]+,\s*(\d+)')
TYPE_BITS = {'8': 8, '16': 16, '32': 32, '64': 64, '128': 128, 'f16x2': 32, 'bf16x2': 32}


def global_load_bits(line):
    """Bits one PTX instruction loads from global memory, or 0."""
    m = RE_LD.match(line)
    if m:
        parts = m.group(1).split('.')[1:]
        if 'global' not in parts:
            return 0
        lanes = next((int(p[1:]) for p in parts if re.fullmatch(r'v\d+', p)), 1)
        t = parts[-1]
        bits = TYPE_BITS.get(t) or TYPE_BITS.get(t.lstrip('bsuf'), 0)
        return lanes * bits
    m = RE_CP_ASYNC.match(line)
    return 8 * int(m.group(1)) if m else 0


def parse_ptx(text):
    """PTX module -> {mangled entry: {block, block_from, mma, ldg128, ldg}}."""
    out = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = RE_ENTRY.match(lines[i])
        if not m:
            i += 1
            continue
        name = m.group(1)
        info = {'block': None, 'block_from': None, 'mma': 0, 'ldg128': 0, 'ldg': 0, 'ldg_bits': {}}
        # directives between the parameter list and the body
        while i < len(lines) and not lines[i].strip().startswith('{'):
            d = re.match(r'\s*\.(maxntid|reqntid)\s+([\d,\s]+)', lines[i])
            if d:
                dims = [int(x) for x in d.group(2).replace(' ', '').split(',') if x]
                n = 1
                for x in dims:
                    n *= x
                info['block'], info['block_from'] = n, '.' + d.group(1)
            i += 1
        depth = 0
        while i < len(lines):
            line = lines[i]
            depth += line.count('{') - line.count('}')
            if RE_MMA.match(line):
                info['mma'] += 1
            bits = global_load_bits(line)
            if bits:
                info['ldg'] += 1
                info['ldg128'] += bits >= 128
                info['ldg_bits'][bits] = info['ldg_bits'].get(bits, 0) + 1
            i += 1
            if depth == 0:
                break
        out[name] = info
    return out


# --- occupancy -------------------------------------------------------------

def _round_up(x, unit):
    return -(-x // unit) * unit


def occupancy(lim, regs, smem, barriers, block):
    """Blocks and warps resident per SM, after cuda_occupancy.h's
    cudaOccMaxActiveBlocksPerMultiprocessor with no dynamic shared memory
    and the default (largest) shared-memory carveout."""
    warps = -(-block // lim['warp_size'])
    limits = {'blocks': lim['max_blocks'], 'warps': lim['max_warps'] // warps}
    # registers go to warps in 256-register units, per SM sub-partition
    per_warp = _round_up(max(regs, 1) * lim['warp_size'], lim['reg_alloc_unit'])
    assumed_block = per_warp * _round_up(warps, lim['sub_partitions'])
    if regs > lim['max_regs_per_thread'] or assumed_block > lim['regs_per_block']:
        limits['regs'] = 0
    else:
        per_part = (lim['regs_per_sm'] // lim['sub_partitions']) // per_warp
        limits['regs'] = per_part * lim['sub_partitions'] // warps
    smem_block = _round_up(smem + lim['smem_reserved_per_block'], lim['smem_alloc_unit'])
    limits['smem'] = lim['smem_per_sm'] // smem_block
    if barriers:
        limits['barriers'] = lim['max_blocks'] * lim['barrier_factor'] // barriers
    blocks = min(limits.values())
    limiter = [k for k, v in limits.items() if v == blocks]
    return {'blocks_per_sm': blocks, 'warps_per_sm': blocks * warps,
            'occupancy': blocks * warps / lim['max_warps'], 'limited_by': limiter}


# --- driver ----------------------------------------------------------------

def compile_one(nvcc, root, src, archs, maxrreg, workdir):
    """One nvcc run per file for every arch: -fatbin skips host compilation
    (the device code is what -c would produce), --keep leaves the PTX."""
    stem = os.path.splitext(os.path.basename(src))[0]
    keep = os.path.join(workdir, stem)
    os.makedirs(keep, exist_ok=True)
    cmd = [nvcc] + OPT + DEFINES + ['-I' + os.path.join(root, d) for d in INCLUDE_DIRS]
    for a in archs:
        cmd += ['-gencode', 'arch=%s,code=%s' % (a.replace('sm_', 'compute_'), a)]
    cmd += ['-Xptxas', '-v', '-fatbin', '--keep', '--keep-dir', keep,
            '-o', os.path.join(keep, stem + '.fatbin'), src]
    if maxrreg:
        cmd.insert(1, '-maxrregcount=%d' % maxrreg)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return src, None, None, ' '.join(cmd) + '\n' + p.stdout + p.stderr
    ptx = {}
    for a in archs:
        path = os.path.join(keep, '%s.%s.ptx' % (stem, a.replace('sm_', 'compute_')))
        if len(archs) == 1 and not os.path.exists(path):
            path = os.path.join(keep, stem + '.ptx')  # nvcc's name with one target
        with open(path) as fh:
            ptx[a] = parse_ptx(fh.read())
    return src, parse_ptxas(p.stdout + p.stderr), ptx, None


def parse_launch(spec):
    """'k_a=128:20608,k_b=256' -> {name: (threads, dynamic smem bytes)}."""
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(','))):
        m = re.fullmatch(r'([\w:$.]+)=(\d+)(?::(\d+))?', item)
        if not m:
            die('ptxas_report: --launch %r: want NAME=THREADS[:DYN_SMEM_BYTES]' % item)
        out[m.group(1)] = (int(m.group(2)), int(m.group(3) or 0))
    return out


def base_name(kernel):
    """'void k_attn_decode<true>' -> 'k_attn_decode': what --launch may name for
    every instantiation of a template kernel."""
    k = re.sub(r'^void\s+', '', kernel)
    return k.split('<', 1)[0]


def build_report(nvcc, root, files, archs, maxrreg, jobs, launch=None):
    launch = launch or {}
    rows, callees, errors = [], [], []
    with tempfile.TemporaryDirectory(prefix='ptxas_report.') as work:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(lambda f: compile_one(nvcc, root, f, archs, maxrreg, work), files))
    names = []
    for src, funcs, _ptx, err in results:
        if err:
            errors.append((src, err))
            continue
        names += [n for (_a, n) in funcs]
    dem = demangle_all(names)
    for src, funcs, ptx, err in results:
        if err:
            continue
        rel = os.path.relpath(src, root)
        for (arch, name), rec in sorted(funcs.items(), key=lambda kv: (kv[0][0], dem[kv[0][1]][1])):
            base = {'file': rel, 'arch': arch, 'kernel': dem[name][1], 'signature': dem[name][0],
                    'mangled': name, 'registers': rec['regs'] if rec.get('used_seen') else None, 'spill_stores': rec['spill_st'],
                    'spill_loads': rec['spill_ld'], 'stack_frame': rec['stack'],
                    'parsed': rec['parsed']}
            if not rec['entry']:
                callees.append(base)
                continue
            p = ptx.get(arch, {}).get(name, {})
            block, block_from = p.get('block') or DEFAULT_BLOCK, p.get('block_from') or 'assumed'
            dyn = 0
            key = dem[name][1] if dem[name][1] in launch else base_name(dem[name][1])
            if key in launch:
                block, dyn = launch[key]
                block_from = '--launch'
                if p.get('block') and block > p['block']:
                    die('ptxas_report: --launch %s=%d exceeds its %s %d'
                                     % (dem[name][1], block, p['block_from'], p['block']))
            row = dict(base, smem_static=rec['smem'], smem_dynamic=dyn, barriers=rec['barriers'],
                       cmem={str(k): v for k, v in sorted(rec['cmem'].items())},
                       block=block, block_from=block_from,
                       mma=p.get('mma', 0), ldg128=p.get('ldg128', 0), ldg=p.get('ldg', 0),
                       ldg_by_bits={str(k): v for k, v in sorted(p.get('ldg_bits', {}).items())})
            row.update(occupancy(arch_limits(arch), rec['regs'], rec['smem'] + dyn, rec['barriers'],
                                 block))
            rows.append(row)
    return rows, callees, errors


def _num(v):
    return '-' if v is None else '%d' % v


def markdown(rows, callees, archs):
    out = []
    for arch in archs:
        lim = arch_limits(arch)
        out.append('### %s (%d warps/SM, %d blocks/SM, 64K regs/SM, %d KB shared/SM)\n'
                   % (arch, lim['max_warps'], lim['max_blocks'], lim['smem_per_sm'] // 1024))
        out.append('| kernel | file | regs | spill st/ld B | stack B | smem B | cmem B | block '
                   '| blocks/SM | occupancy | limited by | MMA | LDG.128 / LDG |')
        out.append('|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|')
        for r in rows:
            if r['arch'] != arch:
                continue
            cmem = ' '.join('c%s=%d' % kv for kv in sorted(r['cmem'].items())) or '-'
            block = '%d%s' % (r['block'], {'assumed': '*', '--launch': '='}.get(r['block_from'], ''))
            smem = '%d' % r['smem_static'] + ('+%d' % r['smem_dynamic'] if r['smem_dynamic'] else '')
            out.append('| %s | %s | %s | %d/%d | %d | %s | %s | %s | %d | %.0f%% | %s | %d | %d / %d |' % (
                r['kernel'], r['file'], _num(r['registers']), r['spill_stores'], r['spill_loads'],
                r['stack_frame'], smem, cmem, block, r['blocks_per_sm'],
                100 * r['occupancy'], ', '.join(r['limited_by']), r['mma'], r['ldg128'], r['ldg']))
        cs = [c for c in callees if c['arch'] == arch]
        if cs:
            out.append('\nNon-inlined device functions:\n')
            out.append('| function | file | regs | spill st/ld B | stack B |')
            out.append('|---|---|--:|--:|--:|')
            for c in cs:
                out.append('| %s | %s | %s | %d/%d | %d |' % (c['kernel'], c['file'], _num(c['registers']),
                           c['spill_stores'], c['spill_loads'], c['stack_frame']))
        out.append('')
    out.append('block: from `__launch_bounds__` (.maxntid); `*` none there, %d assumed; `=` given '
               'by --launch. smem: static, `+N` dynamic given by --launch (otherwise none is '
               'counted).' % DEFAULT_BLOCK)
    return '\n'.join(out) + '\n'


def check(rows, callees, require_mma, archs):
    problems = []
    for r in rows + callees:
        if not r['parsed']:
            problems.append('%s (%s, %s): ptxas -v lines for it not understood' % (
                r['kernel'], r['file'], r['arch']))
        if r['spill_stores'] or r['spill_loads']:
            problems.append('%s (%s, %s): spills %d B stores, %d B loads' % (
                r['kernel'], r['file'], r['arch'], r['spill_stores'], r['spill_loads']))
    for name in require_mma:
        hits = [r for r in rows if r['kernel'] == name]
        if not hits:
            problems.append('%s: required to use MMA but no such kernel was compiled' % name)
        for arch in archs:
            for r in hits:
                if r['arch'] == arch and r['mma'] == 0:
                    problems.append('%s (%s, %s): no MMA instruction in its PTX' % (name, r['file'], arch))
    return problems


# --- self-test -------------------------------------------------------------

# Kernels whose report is known in advance, so --self-test can show that this
# nvcc's output is still parsed: a spill that --check must catch, an MMA, a
# 128-bit load and a .maxntid. Without it a change in ptxas's wording could
# turn --check into a test that cannot fail.
PROBE_CU = r'''#include <mma.h>
#include <cuda_fp16.h>

// 128 threads per block, one 128-bit load per thread
__global__ void __launch_bounds__(128) probe_wide(const float4 *__restrict__ a, float4 *b)
{
    int i = blockIdx.x * 128 + threadIdx.x;
    b[i] = __ldg(a + i);
}

// one 16x16x16 tensor-core product per warp
__global__ void probe_mma(const half *a, const half *b, float *c)
{
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, half, nvcuda::wmma::row_major> fa;
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, half, nvcuda::wmma::col_major> fb;
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> fc;
    nvcuda::wmma::fill_fragment(fc, 0.0f);
    nvcuda::wmma::load_matrix_sync(fa, a, 16);
    nvcuda::wmma::load_matrix_sync(fb, b, 16);
    nvcuda::wmma::mma_sync(fc, fa, fb, fc);
    nvcuda::wmma::store_matrix_sync(c, fc, 16, nvcuda::wmma::mem_row_major);
}

// 64 live accumulators under a 32-register cap (1024 threads x 2 blocks):
// ptxas has to spill
__global__ void __launch_bounds__(1024, 2) probe_spill(const float *in, float *out, int n)
{
    float acc[64];
#pragma unroll
    for (int j = 0; j < 64; j++) acc[j] = in[j * 1024 + threadIdx.x];
    for (int i = 0; i < n; i++) {
#pragma unroll
        for (int j = 0; j < 64; j++) acc[j] = acc[j] * acc[(j + 1) & 63] + in[i];
    }
#pragma unroll
    for (int j = 0; j < 64; j++) out[j * 1024 + threadIdx.x] = acc[j];
}
'''

# (arch, regs, static smem, threads) -> blocks/SM, from the CUDA occupancy
# calculator (e.g. the well-known 64 regs x 256 threads on sm_80: 4 blocks, 50%).
OCCUPANCY_CASES = [('sm_80', 64, 0, 256, 4), ('sm_89', 48, 0, 256, 5), ('sm_89', 40, 0, 256, 6),
                   ('sm_90', 255, 0, 256, 1), ('sm_90', 32, 48 * 1024, 128, 4),
                   ('sm_89', 32, 48 * 1024, 128, 2), ('sm_90', 16, 0, 32, 32)]


def self_test(nvcc, archs):
    fails = []
    for arch, regs, smem, block, want in OCCUPANCY_CASES:
        got = occupancy(arch_limits(arch), regs, smem, 0, block)['blocks_per_sm']
        if got != want:
            fails.append('occupancy %s regs=%d smem=%d block=%d: %d blocks/SM, want %d'
                         % (arch, regs, smem, block, got, want))
    with tempfile.TemporaryDirectory(prefix='ptxas_probe.') as tmp:
        src = os.path.join(tmp, 'probe.cu')
        with open(src, 'w') as fh:
            fh.write(PROBE_CU)
        rows, callees, errors = build_report(nvcc, tmp, [src], archs, 0, 1)
    fails += ['probe failed to compile: ' + e for _s, e in errors]
    by = {(r['arch'], r['kernel']): r for r in rows}
    for arch in archs:
        k = {n: by.get((arch, n)) for n in ('probe_wide', 'probe_mma', 'probe_spill')}
        missing = [n for n, r in k.items() if r is None]
        if missing:
            fails.append('%s: no ptxas report for %s' % (arch, ', '.join(missing)))
            continue
        if not (k['probe_spill']['spill_stores'] > 0 and k['probe_spill']['spill_loads'] > 0):
            fails.append('%s: probe_spill spills but no spill was parsed' % arch)
        if k['probe_mma']['mma'] < 1:
            fails.append('%s: no MMA counted in probe_mma' % arch)
        if k['probe_wide']['ldg128'] < 1 or k['probe_wide']['block'] != 128:
            fails.append('%s: probe_wide: %d 128-bit loads, block %d (want >= 1, 128)'
                         % (arch, k['probe_wide']['ldg128'], k['probe_wide']['block']))
    problems = check(rows, callees, ['probe_mma', 'probe_wide'], archs)
    for arch in archs:
        for want in ('probe_spill (probe.cu, %s): spills' % arch,
                     'probe_wide (probe.cu, %s): no MMA' % arch):
            if not any(p.startswith(want) for p in problems):
                fails.append('--check did not report: ' + want)
        if any(p.startswith('probe_mma (probe.cu, %s)' % arch) for p in problems):
            fails.append('--check flagged probe_mma on %s' % arch)
    return fails


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--arch', default='sm_89,sm_90', help='comma list (default sm_89,sm_90)')
    ap.add_argument('--json', action='store_true', help='JSON instead of Markdown')
    ap.add_argument('--out', help='write the report here instead of stdout')
    ap.add_argument('--check', action='store_true',
                    help='exit 1 if any function spills on any arch, or a --require-mma kernel has no MMA')
    ap.add_argument('--require-mma', default='', help='comma list of kernel names that must contain MMA')
    ap.add_argument('--root', default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    help='project root whose gpu/*.cu to compile (default: this checkout)')
    ap.add_argument('--files', help='comma list of .cu files instead of ROOT/gpu/*.cu')
    ap.add_argument('--nvcc', help='nvcc to use (default: $NVCC, PATH, /usr/local/cuda/bin)')
    ap.add_argument('--maxrregcount', type=int, default=0,
                    help='pass -maxrregcount=N (to provoke spills when testing --check)')
    ap.add_argument('--self-test', action='store_true',
                    help='compile a probe with a known spill, MMA and 128-bit load; exit 1 unless all are seen')
    ap.add_argument('--launch', default='',
                    help='NAME=THREADS[:DYN_SMEM],...: block size and dynamic shared memory of '
                         'named kernels as the host launches them (for occupancy)')
    ap.add_argument('--kernels', help='comma list: report only these kernels (--check sees all)')
    ap.add_argument('--jobs', type=int, default=2, help='parallel nvcc runs (default 2)')
    args = ap.parse_args(argv)

    archs = [a.strip() for a in args.arch.split(',') if a.strip()]
    for a in archs:
        arch_limits(a)
    nvcc = find_nvcc(args.nvcc)
    if args.nvcc and not nvcc:
        print('ptxas_report: --nvcc %s: not found' % args.nvcc, file=sys.stderr)
        return 2
    if not nvcc:
        print('ptxas_report: nvcc not found (PATH, $NVCC, /usr/local/cuda/bin): skipped',
              file=sys.stderr)
        return EXIT_SKIP
    if args.self_test:
        fails = self_test(nvcc, archs)
        for f in fails:
            print('ptxas_report --self-test: ' + f, file=sys.stderr)
        if not fails:
            print('ptxas_report --self-test: %s: spill, MMA, 128-bit load, .maxntid and %d '
                  'occupancy cases as expected' % (','.join(archs), len(OCCUPANCY_CASES)),
                  file=sys.stderr)
        return 1 if fails else 0
    root = os.path.abspath(args.root)
    if args.files:
        files = [os.path.abspath(f) for f in args.files.split(',') if f]
    else:
        gdir = os.path.join(root, 'gpu')
        files = sorted(os.path.join(gdir, f) for f in os.listdir(gdir) if f.endswith('.cu'))
    if not files:
        print('ptxas_report: no .cu files under %s' % root, file=sys.stderr)
        return 2

    launch = parse_launch(args.launch)
    rows, callees, errors = build_report(nvcc, root, files, archs, args.maxrregcount,
                                         max(1, args.jobs), launch)
    unknown = sorted(set(launch) - {r['kernel'] for r in rows} - {base_name(r['kernel']) for r in rows})
    if unknown and not errors:
        print('ptxas_report: --launch names no compiled kernel: %s' % ', '.join(unknown),
              file=sys.stderr)
        return 2
    shown, shown_callees = rows, callees
    if args.kernels:
        wanted = {k.strip() for k in args.kernels.split(',')}
        shown = [r for r in rows if r['kernel'] in wanted or base_name(r['kernel']) in wanted]
        shown_callees = [c for c in callees if c['kernel'] in wanted]
    for src, err in errors:
        print('ptxas_report: %s failed to compile:\n%s' % (src, err), file=sys.stderr)
    if args.json:
        text = json.dumps({'nvcc': nvcc, 'archs': archs, 'maxrregcount': args.maxrregcount,
                           'default_block': DEFAULT_BLOCK, 'kernels': shown,
                           'device_functions': shown_callees}, indent=1) + '\n'
    else:
        text = markdown(shown, shown_callees, archs)
    if args.out:
        with open(args.out, 'w') as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    if errors:
        return 2
    if args.check:
        req = [n.strip() for n in args.require_mma.split(',') if n.strip()]
        problems = check(rows, callees, req, archs)
        nk = len({(r['file'], r['kernel']) for r in rows})
        if problems:
            print('ptxas_report --check: %d problem(s):' % len(problems), file=sys.stderr)
            for p in problems:
                print('  ' + p, file=sys.stderr)
            return 1
        print('ptxas_report --check: %d kernels in %d files on %s: no spills%s' % (
            nk, len(files), ','.join(archs), ', MMA where required' if req else ''), file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())

/* The decode products, n <= 8 activation rows (hkv_gpu_qmat_matmul sends them
 * here; qmat.cu has the matrices, their dequantisation and the GEMMs).
 *
 * A warp per output row (Q4: per one, two or four rows) reads each weight
 * once for all n activation rows, fp32 partial sums per lane, a shuffle
 * reduction. Q4 (k_qm_gemv_q4): a 32-weight block per lane (16 code
 * bytes, a 128-bit load; a warp reads 512 contiguous bytes of a row per
 * step), the weights dequantised once into registers for every activation
 * row, codes to floats by exponent bits instead of conversions; x staged by
 * the block in shared memory in the lanes' order (conflict-free 128-bit
 * reads; resident for the whole row when it fits in 32 KB, else in tiles),
 * the codes loaded steps ahead of their use. Q8: two lanes per block,
 * 128-bit loads; x in 128-bit loads where its rows are 16-byte aligned. F16
 * and F32: lane l takes columns l, l+32, ... (W and x coalesced as they are).
 * Weights dequantise to the host path's fp32 values bit for bit (qmat.cu). */
#include <limits.h>

#include <cuda_pipeline_primitives.h>

#include "gpu_internal.cuh"
#include "qmat_panel.h"   /* HKV_QMAT_GEMV_MAX_ROWS */

#define QM_WARPS 8                   /* GEMV: warps (output rows) per block */
#define QM_THREADS (QM_WARPS * 32)
#define QM_MAXN HKV_QMAT_GEMV_MAX_ROWS   /* GEMV: activation rows per call */
#define QM_MIN_BLOCKS 4              /* Q8 GEMV: blocks per SM ptxas must allow (<= 64
                                      * registers; unbounded, Q8 took 80) */
#define QM_RWARPS 8                  /* Q4 GEMV: warps per block (all share one staged x) */
#define QM_RTHREADS (QM_RWARPS * 32)
#define QM_Q4_XRES 8                 /* Q4 GEMV: x resident in shared memory up to NT * steps
                                      * (1024 columns) = this: 32 KB */
#define QM_Q4_TX(nt) ((nt) <= 2 ? 4 / (nt) : 1)   /* ... else steps per x tile (two buffers) */
/* Q4 GEMV, per CFG = NT + 16 R: steps whose codes are loaded ahead of their
 * use, and blocks per SM ptxas must allow: as much as fits without spills
 * on sm_89 and sm_90 (64 registers at NT = 1, 80 at NT <= 3 for R = 1 and
 * NT = 2 for R = 2, else 128; R = 4 from NT = 6: 255, one block; a ring
 * slot of R rows costs 6 R registers) */
#define QM_Q4_AHEAD(cfg) ((cfg) < 32 ? 3 : (cfg) < 64 && (cfg) % 16 <= 4 ? 2 : 1)
#define QM_Q4_MIN_BLOCKS(cfg)                                                                  \
    ((cfg) >= 64 ? ((cfg) % 16 <= 5 ? 2 : 1)                                                   \
                 : (cfg) % 16 == 1 ? 4 : (cfg) % 16 <= ((cfg) < 32 ? 3 : 2) ? 3 : 2)
#define QM_R2_MIN_ROWS 4096          /* Q4 GEMV, auto: two rows per warp from this many rows */

/* ---- GEMV, n <= 8 ---------------------------------------------------------- */

/* y[i][row] = the warp's sum of acc[i], i < n (n is the same in every lane). */
__device__ __forceinline__ void qm_store(const float *acc, int n, float *y, int64_t ldy,
                                         int64_t row, int lane)
{
#pragma unroll
    for (int i = 0; i < QM_MAXN; i++)
        if (i < n) {
            const float s = hkv_warp_sum(acc[i]);
            if (lane == 0) y[i * ldy + row] = s;
        }
}

#define QM_ROW_LOOP(row)                                                                   \
    for (int64_t row = (int64_t)blockIdx.x * QM_WARPS + (threadIdx.x >> 5); row < rows;    \
         row += (int64_t)gridDim.x * QM_WARPS)

/* x[0..3]: one 128-bit load when x rows are 16-byte aligned (vec, the same
 * in every thread), else four. */
__device__ __forceinline__ float4 qm_x4(const float *p, bool vec)
{
    if (vec) return __ldg((const float4 *)p);
    return make_float4(__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3));
}

/* Nibble k (byte k of v, 0..15) as a float without an int-to-float
 * conversion (a quarter-rate instruction): the bits 0x4B0000qq are the float
 * 2^23 + q exactly, and subtracting 2^23 is exact. */
__device__ __forceinline__ float qm_nib(unsigned v, int k)
{
    return __int_as_float((int)__byte_perm(v, 0x4B000000u, 0x7440u | (unsigned)k)) - 8388608.0f;
}

/* Q4 GEMV: NT = CFG % 16 activation rows, R = CFG / 16 output rows per warp
 * (both compile-time, so the loops unroll and the sums stay in registers).
 *
 * Lanes: lane l takes block l of each step (32 blocks, 1024 columns) of each
 * of its R rows: its 16 code bytes in one 128-bit load (a warp reads 512
 * contiguous bytes of a row per step; 8-byte loads per lane reached ~2.9
 * TB/s on an H200 in a load-only probe, 16-byte ones ~3.6 of its 4.3), its
 * scale and min. Code byte k holds elements k (low nibble) and 16 + k
 * (high). Each weight is dequantised once (qm_nib, one FMA: the host's
 * value) for all NT activation rows, and each activation value is read once
 * for the R rows. A block's QM_RWARPS warps take QM_RWARPS * R consecutive
 * rows (a group).
 *
 * x from shared memory: lane l needs x at 32l + 4t, t = 0..7, which as
 * global loads would touch 32 cache lines per warp instruction, per
 * activation row and per warp. The block's warps all walk the same columns,
 * so the block copies x into shared memory in the order the lanes read it:
 * per step and row, slot t of lane l at float4 t*32 + (l ^ t), so a warp's
 * read is 512 contiguous bytes (no bank conflict: the XOR permutes within
 * each quarter warp, and makes the copy's stores, 8 threads per 128-byte line
 * of x, conflict-free too). The copy is asynchronous (__pipeline_memcpy_async:
 * no registers, no wait until the barrier before the tile's use) in 8-byte
 * pieces where x rows are 16-byte aligned (the 16-byte form bypasses L1, and
 * then every block on an SM fetches the same x from L2: the products
 * measured 1.5x slower on an H200), else 4-byte ones. Columns past the end
 * are zeros (so are the weights there).
 *
 * Resident x (NT * steps <= QM_Q4_XRES, 32 KB: NT = 1 to 8192 columns, NT =
 * 2 to 4096, ...): copied once per block, then no barrier. Else x goes in
 * tiles of QM_Q4_TX(NT) steps (NT * 4 KB each: 16 to 32 KB) and two
 * buffers, the next tile copied during this one's arithmetic, one barrier
 * per tile. A block per group (the loop over groups only past the grid's
 * cap: then resident x stays, tiles start again; capping the grid at the
 * blocks that fit, a persistent grid, measured no faster on an H200).
 *
 * In flight: codes, scales and mins are loaded QM_Q4_AHEAD steps ahead of
 * their use (1 to 3: what the registers allow), across group boundaries too
 * (a ring of registers), kept as raw bits until the step's arithmetic, so
 * nothing waits on them before that: R * 20 bytes a step and lane. */
template <int R>
__device__ __forceinline__ void qm_q4_rows(int64_t *b0, int64_t rows, int nb, int64_t r0, int lane)
{
#pragma unroll
    for (int j = 0; j < R; j++) b0[j] = r0 + j < rows ? (r0 + j) * nb + lane : -1;
}

/* Step st's codes, scales and mins of the lane's blocks of its R rows (b0:
 * block `lane` of each row, -1 past the last row; in: the block is in the
 * row). */
template <int R>
__device__ __forceinline__ void qm_q4_codes(uint4 *c, uint16_t *sc, uint16_t *mn, const uint4 *q,
                                            const uint16_t *scale, const uint16_t *mins,
                                            const int64_t *b0, bool in, int st)
{
#pragma unroll
    for (int j = 0; j < R; j++) {
        c[j] = make_uint4(0, 0, 0, 0), sc[j] = 0, mn[j] = 0;   /* fp16 zeros: w = 0 outside */
        if (in && b0[j] >= 0) {
            const int64_t b = b0[j] + st * 32;
            c[j] = __ldg(q + b);
            sc[j] = __ldg(scale + b);
            mn[j] = __ldg(mins + b);
        }
    }
}

/* Starts the copy of x's steps s0 .. s0 + ns - 1 ([step][row][256 float4s],
 * in the lanes' order) into buf: thread tid takes float4 tid of each step's
 * row, floats 4t..4t+3 of block l = tid/8 (t = tid % 8): lane l's slot t. */
template <int NT>
__device__ __forceinline__ void qm_q4_xcopy(float4 *buf, const float *x, int64_t ldx, bool vec,
                                            int s0, int ns, int cols, int tid)
{
    const int l = tid >> 3, t = tid & 7;
    float4 *d = buf + t * 32 + (l ^ t);
#pragma unroll 1   /* loops: the addresses of one float4 at a time in registers */
    for (int c = s0 * 1024 + 4 * tid; c < (s0 + ns) * 1024; c += 1024) {
        const float *src = x + c;
#pragma unroll 1
        for (int i = 0; i < NT; i++, src += ldx, d += 256) {
            if (c >= cols) {
                *d = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            } else if (vec) {
                __pipeline_memcpy_async((float *)d, src, 8);
                __pipeline_memcpy_async((float *)d + 2, src + 2, 8);
            } else {
#pragma unroll
                for (int z = 0; z < 4; z++) __pipeline_memcpy_async((float *)d + z, src + z, 4);
            }
        }
    }
    __pipeline_commit();
}

template <int CFG>
static __global__ void __launch_bounds__(QM_RTHREADS, QM_Q4_MIN_BLOCKS(CFG))
k_qm_gemv_q4(const uint4 *q, const uint16_t *scale, const uint16_t *mins, int64_t rows, int nb,
             const float *x, int64_t ldx, bool vec, float *y, int64_t ldy)
{
    constexpr int NT = CFG % 16, R = CFG / 16, A = QM_Q4_AHEAD(CFG);
    HKV_DYN_SHARED(float4, xs);
    const int tid = threadIdx.x, lane = tid & 31;
    const int cols = nb * HKV_WBLOCK, nsteps = (nb + 31) / 32;
    /* steps per tile: all of them when x is resident, else QM_Q4_TX(NT) */
    const bool resident = nsteps * NT <= QM_Q4_XRES;
    const int tl = resident ? nsteps : QM_Q4_TX(NT), nft = tl * NT * 256;   /* float4s a buffer */
    const int rpg = QM_RWARPS * R, groups = (int)((rows + rpg - 1) / rpg);   /* < 2^31 (host) */
    if ((int)blockIdx.x >= groups) return;
    /* the ring: c[0] the step being computed, c[1..A] the ones after it; the
     * loads run A steps ahead, at step ls of group lg */
    uint4 c[A + 1][R];
    uint16_t sc[A + 1][R] = {}, mn[A + 1][R] = {};   /* {}: GCC cannot see the ring fill them */
    int64_t b0[R];
    int lg = blockIdx.x, ls = 0;
    qm_q4_rows<R>(b0, rows, nb, (int64_t)lg * rpg + (tid >> 5) * R, lane);
#pragma unroll
    for (int a = 0; a < A; a++) {
        qm_q4_codes<R>(c[a], sc[a], mn[a], q, scale, mins, b0, ls * 32 + lane < nb, ls);
        if (++ls == nsteps) {
            ls = 0, lg += gridDim.x;
            qm_q4_rows<R>(b0, lg < groups ? rows : 0, nb, (int64_t)lg * rpg + (tid >> 5) * R, lane);
        }
    }
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        /* x from step 0 (resident: only in the block's first group) */
        if (!resident || g == (int)blockIdx.x) {
            if (g != (int)blockIdx.x) __syncthreads();   /* the last group's reads of buffer 0 */
            qm_q4_xcopy<NT>(xs, x, ldx, vec, 0, nsteps < tl ? nsteps : tl, cols, tid);
        }
        float acc[R][NT];
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int i = 0; i < NT; i++) acc[j][i] = 0.0f;
#pragma unroll 1
        for (int st = 0; st < nsteps; st++) {
            /* step st is step s of tile k (the tiles' steps: a power of two, no division) */
            const int k = resident ? 0 : st / QM_Q4_TX(NT), s = resident ? st : st % QM_Q4_TX(NT);
            if (s == 0 && (!resident || g == (int)blockIdx.x)) {
                /* tile k has landed (this thread's copies; the barrier: everyone's),
                 * and every warp is past tile k - 1: its buffer takes tile k + 1 */
                __pipeline_wait_prior(0);
                __syncthreads();
                const int next = nsteps - (k + 1) * tl;
                if (next > 0)
                    qm_q4_xcopy<NT>(xs + ((k + 1) & 1) * nft, x, ldx, vec, (k + 1) * tl,
                                    next < tl ? next : tl, cols, tid);
            }
            qm_q4_codes<R>(c[A], sc[A], mn[A], q, scale, mins, b0, ls * 32 + lane < nb, ls);
            if (++ls == nsteps) {
                ls = 0, lg += gridDim.x;
                qm_q4_rows<R>(b0, lg < groups ? rows : 0, nb, (int64_t)lg * rpg + (tid >> 5) * R, lane);
            }
            float sf[R], mf[R];
#pragma unroll
            for (int j = 0; j < R; j++) sf[j] = hkv_h2f(sc[0][j]), mf[j] = hkv_h2f(mn[0][j]);
            const float4 *xr = xs + (k & 1) * nft + s * NT * 256;
            /* slot t: elements 4t..4t+3 (t < 4: low nibbles of word t, else high
             * nibbles of word t - 4), so each sum takes the step's 32 terms in
             * element order */
#pragma unroll
            for (int t = 0; t < 8; t++) {
                float w[R][4];
#pragma unroll
                for (int j = 0; j < R; j++) {
                    const unsigned word = (t & 3) == 0 ? c[0][j].x : (t & 3) == 1 ? c[0][j].y
                                        : (t & 3) == 2 ? c[0][j].z : c[0][j].w;
                    const unsigned nib = (t & 4 ? word >> 4 : word) & 0x0F0F0F0Fu;
#pragma unroll
                    for (int e = 0; e < 4; e++) w[j][e] = __fmaf_rn(sf[j], qm_nib(nib, e), mf[j]);
                }
#pragma unroll
                for (int i = 0; i < NT; i++) {
                    const float4 xv = xr[i * 256 + t * 32 + (lane ^ t)];
#pragma unroll
                    for (int j = 0; j < R; j++) {
                        float a = acc[j][i];
                        a += w[j][0] * xv.x, a += w[j][1] * xv.y, a += w[j][2] * xv.z, a += w[j][3] * xv.w;
                        acc[j][i] = a;
                    }
                }
            }
#pragma unroll
            for (int a = 0; a < A; a++)
#pragma unroll
                for (int j = 0; j < R; j++)
                    c[a][j] = c[a + 1][j], sc[a][j] = sc[a + 1][j], mn[a][j] = mn[a + 1][j];
        }
        const int64_t r0 = (int64_t)g * rpg + (tid >> 5) * R;
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int i = 0; i < NT; i++) {
                const float sum = hkv_warp_sum(acc[j][i]);
                if (lane == 0 && r0 + j < rows) y[i * ldy + r0 + j] = sum;
            }
    }
}

/* Q8: lane l takes half l%2 of blocks l/2, l/2+16, ...: 16 codes in one
 * 128-bit load; a warp reads 512 contiguous bytes of W per step. */
static __global__ void __launch_bounds__(QM_THREADS, QM_MIN_BLOCKS)
k_qm_gemv_q8(const signed char *q, const uint16_t *scale, int64_t rows, int64_t cols,
             const float *x, int64_t ldx, bool vec, int n, float *y, int64_t ldy)
{
    const int lane = threadIdx.x & 31, half = lane & 1;
    const int64_t nb = cols / HKV_WBLOCK;
    QM_ROW_LOOP(row) {
        float acc[QM_MAXN];
#pragma unroll
        for (int i = 0; i < QM_MAXN; i++) acc[i] = 0.0f;
        const signed char *qr = q + row * cols + half * 16;
        const uint16_t *sr = scale + row * nb;
        for (int64_t b = lane >> 1; b < nb; b += 16) {
            const uint4 bits4 = __ldg((const uint4 *)(qr + b * HKV_WBLOCK));
            const float s = hkv_h2f(__ldg(sr + b));
            const unsigned words[4] = {bits4.x, bits4.y, bits4.z, bits4.w};
#pragma unroll
            for (int t = 0; t < 4; t++) {
                float w[4];
#pragma unroll
                for (int k = 0; k < 4; k++) w[k] = s * (float)(signed char)(words[t] >> (8 * k));   /* exact */
                const float *xb = x + b * HKV_WBLOCK + half * 16 + 4 * t;
#pragma unroll
                for (int i = 0; i < QM_MAXN; i++)
                    if (i < n) {
                        const float4 v = qm_x4(xb + i * ldx, vec);
                        float a = acc[i];
                        a += w[0] * v.x, a += w[1] * v.y, a += w[2] * v.z, a += w[3] * v.w;
                        acc[i] = a;
                    }
            }
        }
        qm_store(acc, n, y, ldy, row, lane);
    }
}

/* F16 / F32 (any cols): lane l takes columns l, l+32, ... */
__device__ __forceinline__ float qm_plain_w(const uint16_t *p) { return hkv_h2f(__ldg(p)); }
__device__ __forceinline__ float qm_plain_w(const float *p) { return __ldg(p); }

template <typename W>
static __global__ void __launch_bounds__(QM_THREADS)
k_qm_gemv_plain(const W *q, int64_t rows, int64_t cols, const float *x, int64_t ldx, int n,
                float *y, int64_t ldy)
{
    const int lane = threadIdx.x & 31;
    QM_ROW_LOOP(row) {
        float acc[QM_MAXN];
#pragma unroll
        for (int i = 0; i < QM_MAXN; i++) acc[i] = 0.0f;
        const W *qr = q + row * cols;
        for (int64_t c = lane; c < cols; c += 32) {
            const float w = qm_plain_w(qr + c);
#pragma unroll
            for (int i = 0; i < QM_MAXN; i++)
                if (i < n) acc[i] += w * __ldg(x + i * ldx + c);
        }
        qm_store(acc, n, y, ldy, row, lane);
    }
}

/* The Q4 GEMV for n activation rows and r rows per warp, as a table of
 * launchers (the template arguments are compile-time): a block per group of
 * QM_RWARPS * r rows. Shared memory: x resident (NT * steps of 1024 columns
 * <= QM_Q4_XRES: at most 32 KB), else two tiles of QM_Q4_TX(NT) steps (16 KB
 * to 64 KB at NT = 8, which must opt in above 48 KB). */
template <int CFG>
static cudaError_t qm_q4_launch(cudaStream_t st, const hkv_gpu_qmat *w, const float *x, int64_t ldx,
                                bool vec, float *y, int64_t ldy)
{
    const int nt = CFG % 16, r = CFG / 16;
    const int64_t nb = w->cols / HKV_WBLOCK, nsteps = (nb + 31) / 32;
    const size_t smem =
        (size_t)(nsteps * nt <= QM_Q4_XRES ? nsteps : 2 * QM_Q4_TX(nt)) * nt * 256 * sizeof(float4);
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(k_qm_gemv_q4<CFG>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    HKV_LAUNCH(k_qm_gemv_q4<CFG>, hkv_grid1(w->rows, QM_RWARPS * r),
               QM_RTHREADS, smem, st)((const uint4 *)w->q, (const uint16_t *)w->scale,
                                      (const uint16_t *)w->min, w->rows, (int)nb, x, ldx, vec, y, ldy);
    return cudaSuccess;
}
typedef cudaError_t (*qm_q4_fn)(cudaStream_t, const hkv_gpu_qmat *, const float *, int64_t, bool,
                                float *, int64_t);
/* [1, 2, 4 rows per warp][n - 1]; four rows only from n = 4 (below, x's
 * reads are few: a forced ROW4 runs two rows) */
static const qm_q4_fn qm_q4_fns[3][QM_MAXN] = {
    {qm_q4_launch<17>, qm_q4_launch<18>, qm_q4_launch<19>, qm_q4_launch<20>, qm_q4_launch<21>,
     qm_q4_launch<22>, qm_q4_launch<23>, qm_q4_launch<24>},
    {qm_q4_launch<33>, qm_q4_launch<34>, qm_q4_launch<35>, qm_q4_launch<36>, qm_q4_launch<37>,
     qm_q4_launch<38>, qm_q4_launch<39>, qm_q4_launch<40>},
    {qm_q4_launch<33>, qm_q4_launch<34>, qm_q4_launch<35>, qm_q4_launch<68>, qm_q4_launch<69>,
     qm_q4_launch<70>, qm_q4_launch<71>, qm_q4_launch<72>},
};

/* Output rows per warp of the Q4 GEMV (as an index of qm_q4_fns: 0, 1, 2
 * for 1, 2, 4 rows). Each block copies all of x through shared memory for
 * its QM_RWARPS * R rows, so more rows per warp mean fewer copies of x per
 * weight (and fewer shared-memory reads of it): at n = 8 and two rows an
 * H100 read gate+up at 645 GB/s (20% of its probe), moving ~3x the weights'
 * bytes of x from L2. Four rows halve that; at n >= 6 they take 250
 * registers, one block of 8 warps per SM. Which wins there is for the
 * kernel benchmark's `gemv r4` rows to say on a GPU: until then AUTO takes
 * two rows from 4096 rows (measured), else one, and four only when forced. */
static int qm_q4_rows_index(const hkv_gpu_qmat *w)
{
    if (w->gemv == HKV_QMAT_GEMV_ROW1 || w->gemv == HKV_QMAT_GEMV_ROW2) return w->gemv - 1;
    if (w->gemv == HKV_QMAT_GEMV_ROW4) return 2;
    return w->rows >= QM_R2_MIN_ROWS ? 1 : 0;
}

extern "C" int hkv_gpu_qmat_gemv(const hkv_gpu_qmat *w, const float *x, int64_t ldx, int64_t n, float *y,
                                 int64_t ldy, cudaStream_t st, hkv_err *err)
{
    const int64_t rows = w->rows, cols = w->cols;
    const unsigned grid = hkv_grid1(rows, QM_WARPS);
    const bool vec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;   /* 128-bit x loads */
    switch (w->type) {
    case HKV_W_Q4: {
        const int r = qm_q4_rows_index(w);
        if (cols > INT_MAX / 2 || rows > INT_MAX)   /* the kernel's int columns and groups */
            return hkv_seterr(err, HKV_E_RANGE, "gpu qmat matmul: Q4 %lld x %lld exceeds the "
                              "GEMV's int indices", (long long)rows, (long long)cols);
        HKV_CUDA_TRY(err, qm_q4_fns[r][n - 1](st, w, x, ldx, vec, y, ldy));
        break;
    }
    case HKV_W_Q8:
        HKV_LAUNCH(k_qm_gemv_q8, grid, QM_THREADS, 0, st)(
            (const signed char *)w->q, (const uint16_t *)w->scale, rows, cols, x, ldx, vec,
            (int)n, y, ldy);
        break;
    case HKV_W_F16:
        HKV_LAUNCH(k_qm_gemv_plain<uint16_t>, grid, QM_THREADS, 0, st)(
            (const uint16_t *)w->q, rows, cols, x, ldx, (int)n, y, ldy);
        break;
    default:
        HKV_LAUNCH(k_qm_gemv_plain<float>, grid, QM_THREADS, 0, st)(
            (const float *)w->q, rows, cols, x, ldx, (int)n, y, ldy);
        break;
    }
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

/* Weight matrices on the device in their repacked host formats (cpu/kernels.h
 * enum hkv_wtype) and the products that dequantise them on the fly.
 *
 * Dequantisation gives the fp32 values of the host path (cpu/gemv_scalar.c
 * decode_span, and the vector levels) bit for bit: the scale is fp16 (11
 * significant bits) and the code at most 8 bits, so s*q is exact in fp32 and
 * Q8's s*q has no rounding at all, Q4's s*q + min exactly one, whether the
 * host or the device fuses the multiply-add or not. The device uses one FMA.
 *
 * n <= 8 (decode): the GEMV kernels of qmat_gemv.cu (each weight read once
 * for all n activation rows; its header says how).
 *
 * n > 8 (prefill chunks, large decode batches): cuBLAS GEMMs on tensor cores,
 * fp16 operands with fp32 accumulation (CUDA_R_16F inputs, CUDA_R_32F output,
 * CUBLAS_COMPUTE_32F). Plain fp16 operands would round every weight and
 * activation to 11 bits (~2^-11 relative per product), far from the host's
 * fp32 sgemm that the device is tested against (2e-3 relative logits) and
 * enough to flip ctkvr's near-tie key picks, so HKV_QMAT_GEMM_SPLIT splits
 * each operand into two fp16 parts, v = hi + lo 2^-11:
 *     hi = fp16(v),  lo = fp16((v - hi) 2^11)     (v - hi is exact in fp32)
 *     W x = Whi xhi + 2^-11 (Whi xlo + Wlo xhi)  + O(2^-22 |W| |x|)
 * i.e. ~fp32 accuracy (each part carries 11 bits; the dropped Wlo xlo and the
 * two roundings of lo are ~2^-22 relative per product) for 3x the tensor
 * work: two GEMMs, the correction one over K = 2 cols with [Whi | Wlo] rows
 * against [xlo | xhi] rows. The lo parts are kept at the scale of v (2^11
 * times the residual) so they stay normal fp16 where the residual itself
 * would be subnormal; and fp16's range (max 65504, normal from 2^-14) is
 * met by powers of two, exact in both directions: W by one per matrix
 * (hkv_gpu_qmat.wscale, from the host copy at upload), each activation row by
 * its own (max |x| to [2^14, 2^15), computed on the device as x is split),
 * undone by the GEMMs' alpha and by one pass over y. HKV_QMAT_GEMM_FP16 (one
 * GEMM, hi parts only, ~2^-11) is the fast option; HKV_QMAT_GEMM_FP32 (fp32
 * panels, CUDA-core GEMM) is what upload sets on GeForce parts, SPLIT on
 * A100 and H100 (where it pays: hkv_gpu_tensor_split_pays); hkv_gpu_qmat.gemm
 * overrides. The split differs from the host's sgemm by ~1e-7 relative: the
 * pipeline tests that compare selection policies' logits run at the
 * emulator's default sm_89 (fp32, the host's sgemm bit for bit), since such
 * differences flip ctkvr's near-tie key picks; pipeline_sm90_full runs the
 * split end to end with a policy that selects nothing.
 *
 * Why cuBLAS on dequantised panels and not a kernel that dequantises into
 * shared memory and runs MMAs there: cuBLAS has a tensor-core kernel tuned
 * per architecture (tile shapes, pipelining, TMA/wgmma on Hopper) that a hand
 * WMMA GEMM here would not match; the panel dequantisation reads each weight
 * once per call, a small cost next to the n-row GEMM; and under the CUDA
 * emulator (gpu/emu, where every pipeline test's prefill runs through these
 * products) cuBLAS is one oneDNN sgemm while a WMMA kernel would be emulated
 * thread by thread, far slower.
 *
 * Predicted speed-up of the GEMM itself, from the data sheets (dense peak,
 * not measured, no GPU here): RTX 4090 82.6 TFLOPS fp32 on CUDA cores vs 165
 * fp16 tensor with fp32 accumulate, so the 3-product split runs at 165/3 = 55
 * TFLOPS-equivalent, 0.67x the fp32 path (a slow-down: Ada's GeForce parts
 * halve fp32-accumulate tensor throughput), and the single fp16 product 2x;
 * H100 SXM 67 fp32 vs 989 fp16 tensor (dense): the split ~4.9x, the single
 * product ~15x. Peaks need large GEMMs: a panel of a few hundred rows left
 * an H100 mostly idle (measured: qmat_panel.h).
 *
 * Workspace (hkv_gpu_qmat_matmul_ws_bytes(w, max_n)): one panel of about
 * 32 MiB (qmat_panel.h says why; fp16 hi and lo side by side per row,
 * [pr][2 cols]; at least 2,048 rows or the whole matrix)
 * and the split activations of at most QM_XCHUNK = 2,048 rows ([xc][2 cols]
 * fp16 plus a scale per row): calls with more rows run the whole panel loop
 * per 2,048-row chunk (the weights are dequantised again per chunk, a small
 * cost next to a 2,048-row GEMM), so the workspace stays bounded however
 * long the prefill chunk.
 *
 * Layout for cuBLAS (column-major): a panel, row-major
 * [pr][ld], is the column-major K x pr matrix A (lda = ld); x, row-major
 * [n][ldb], the K x n matrix B; C = A^T B, pr x n with ldc = ldy, is rows
 * r0.. r0+pr of y row-major [n][ldy]. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "gpu_internal.cuh"
#include "qmat_panel.h"

extern "C" {
#include "gpu_forward.h"
}

#define QM_MAXN HKV_QMAT_GEMV_MAX_ROWS   /* GEMV (qmat_gemv.cu): activation rows per call */
#define QM_DQ_THREADS 256            /* dequantisation: threads per block (one row) */
#define QM_GRID_MAX (65535 * 16)     /* 1-D grid cap; kernels stride over the rest */
#define QM_XCHUNK HKV_QMAT_XCHUNK     /* split GEMM: activation rows per workspace chunk */
#define QM_LO_SCALE 2048.0f          /* lo parts are 2^11 x the residual (normal fp16) */
#define QM_ALIGN HKV_QMAT_ALIGN      /* workspace parts start on this (cuBLAS operands) */
#define QM_EXP_CAP 100               /* |power of two| of the range scales (fp32-safe) */

/* ---- dequantisation ------------------------------------------------------ */

/* s*q is exact (fp16 s, q < 2^8): the FMA rounds once, as s*q + mn does on the host */
__device__ __forceinline__ float qm_q4(float s, float mn, unsigned q)
{
    return __fmaf_rn(s, (float)q, mn);
}
__device__ __forceinline__ float qm_q8(float s, int q) { return s * (float)q; }   /* exact */

/* W[r][c] as fp32 (r, c in range). */
__device__ __forceinline__ float qm_elem(int type, const void *q, const uint16_t *scale,
                                         const uint16_t *mins, int64_t cols, int64_t r, int64_t c)
{
    switch (type) {
    case HKV_W_F32: return __ldg((const float *)q + r * cols + c);
    case HKV_W_F16: return hkv_h2f(__ldg((const uint16_t *)q + r * cols + c));
    case HKV_W_Q8: {
        const int64_t b = r * (cols / HKV_WBLOCK) + c / HKV_WBLOCK;
        return qm_q8(hkv_h2f(__ldg(scale + b)), (int)__ldg((const signed char *)q + r * cols + c));
    }
    case HKV_W_Q4: {
        const int64_t b = r * (cols / HKV_WBLOCK) + c / HKV_WBLOCK;
        const int j = (int)(c % HKV_WBLOCK);
        const unsigned byte = __ldg((const unsigned char *)q + b * (HKV_WBLOCK / 2) + (j & 15));
        return qm_q4(hkv_h2f(__ldg(scale + b)), hkv_h2f(__ldg(mins + b)),
                     j < 16 ? (byte & 15u) : (byte >> 4));
    }
    }
    return __int_as_float(0x7fc00000);
}

/* dst[i][0..cols) = W[ids ? ids[i] : r0 + i][:] for i < n; a row id outside
 * [0, rows) gives a NaN row. One block per row at a time, threads over columns. */
static __global__ void __launch_bounds__(QM_DQ_THREADS)
k_qm_dequant(int type, const void *q, const uint16_t *scale, const uint16_t *mins, int64_t rows,
             int64_t cols, const int32_t *ids, int64_t r0, int64_t n, float *dst, int64_t ld)
{
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const int64_t r = ids ? (int64_t)ids[i] : r0 + i;
        float *d = dst + i * ld;
        if (r < 0 || r >= rows) {
            for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = __int_as_float(0x7fc00000);
            continue;
        }
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            d[c] = qm_elem(type, q, scale, mins, cols, r, c);
    }
}

/* The 32 weights of one Q4 block as fp32, element order (byte k: elements k,
 * low nibble, and 16 + k, high), each qm_q4 as qm_elem gives it. */
__device__ __forceinline__ void qm_q4_block(uint4 c, float s, float m, float *v)
{
    const unsigned w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[4 * t + k] = qm_q4(s, m, (w[t] >> (8 * k)) & 15u);
            v[16 + 4 * t + k] = qm_q4(s, m, (w[t] >> (8 * k + 4)) & 15u);
        }
}

/* Q4 rows r0 .. r0+n into dst (ld a multiple of 4 floats, dst 16-byte
 * aligned): a thread per 32-weight block, its codes one 128-bit load and its
 * 32 values eight 128-bit stores, the same values as k_qm_dequant. That one
 * decodes each element with its own byte, scale and min loads: on an H200 a
 * 4096 x 4096 panel pass took ~0.4 ms of a 512-row product's 0.5
 * (bench kernels' gemm rows), the panels being dequantised on every call. */
static __global__ void __launch_bounds__(QM_DQ_THREADS)
k_qm_dequant_q4(const uint4 *q, const uint16_t *scale, const uint16_t *mins, int64_t nb, int64_t r0,
                int64_t n, float *dst, int64_t ld)
{
    const int64_t total = n * nb;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < total;
         u += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = u / nb, b = u - i * nb, g = (r0 + i) * nb + b;
        float v[32];
        qm_q4_block(__ldg(q + g), hkv_h2f(__ldg(scale + g)), hkv_h2f(__ldg(mins + g)), v);
        float4 *d = (float4 *)(dst + i * ld + b * HKV_WBLOCK);
#pragma unroll
        for (int k = 0; k < 8; k++) d[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
    }
}

/* ---- fp16 hi + lo split (tensor-core GEMMs) -------------------------------- */

/* lo part of v = fp16(v) + lo 2^-11: v - hi is exact in fp32 (hi is v rounded
 * to 11 bits, their difference fits in v's 24), scaled by 2^11 so it is a
 * normal fp16 whenever v is (2^-14 <= |v| < 65504). */
__device__ __forceinline__ uint16_t qm_lo(float v, uint16_t hi)
{
    return hkv_f2h((v - hkv_h2f(hi)) * QM_LO_SCALE);
}

/* 2^e as a float, |e| <= QM_EXP_CAP (a normal number: exact bits). */
__device__ __forceinline__ float qm_pow2(int e) { return __int_as_float((e + 127) << 23); }

/* Rows r0 .. r0+n of W times wscale (a power of two: exact), split:
 * dst[i][c] = hi, dst[i][cols + c] = lo (when lo; row stride 2 cols). */
static __global__ void __launch_bounds__(QM_DQ_THREADS)
k_qm_dequant_split(int type, const void *q, const uint16_t *scale, const uint16_t *mins,
                   int64_t cols, int64_t r0, int64_t n, float wscale, bool lo, uint16_t *dst)
{
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        uint16_t *d = dst + i * 2 * cols;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = qm_elem(type, q, scale, mins, cols, r0 + i, c) * wscale;
            const uint16_t h = hkv_f2h(v);
            d[c] = h;
            if (lo) d[cols + c] = qm_lo(v, h);
        }
    }
}

/* k_qm_dequant_split for Q4, a thread per 32-weight block (as
 * k_qm_dequant_q4): 64 bytes of hi parts and 64 of lo, 128-bit stores. */
static __global__ void __launch_bounds__(QM_DQ_THREADS)
k_qm_dequant_split_q4(const uint4 *q, const uint16_t *scale, const uint16_t *mins, int64_t nb,
                      int64_t r0, int64_t n, float wscale, bool lo, uint16_t *dst)
{
    const int64_t total = n * nb, cols = nb * HKV_WBLOCK;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < total;
         u += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = u / nb, b = u - i * nb, g = (r0 + i) * nb + b;
        float v[32];
        qm_q4_block(__ldg(q + g), hkv_h2f(__ldg(scale + g)), hkv_h2f(__ldg(mins + g)), v);
        unsigned hw[16], lw[16];   /* fp16 pairs, element order */
#pragma unroll
        for (int k = 0; k < 16; k++) {
            const float a = v[2 * k] * wscale, c = v[2 * k + 1] * wscale;
            const uint16_t ha = hkv_f2h(a), hc = hkv_f2h(c);
            hw[k] = (unsigned)ha | (unsigned)hc << 16;
            lw[k] = (unsigned)qm_lo(a, ha) | (unsigned)qm_lo(c, hc) << 16;
        }
        uint4 *dh = (uint4 *)(dst + i * 2 * cols + b * HKV_WBLOCK), *dl = (uint4 *)((uint16_t *)dh + cols);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            dh[k] = make_uint4(hw[4 * k], hw[4 * k + 1], hw[4 * k + 2], hw[4 * k + 3]);
            if (lo) dl[k] = make_uint4(lw[4 * k], lw[4 * k + 1], lw[4 * k + 2], lw[4 * k + 3]);
        }
    }
}

/* Activation rows i < n, each scaled by its own power of two 2^e so that its
 * max |x| lands in [2^14, 2^15) (fp16 neither overflows nor goes subnormal
 * on the large elements; rows of zeros or non-finite maxima keep e = 0), then
 * split: dst[i][c] = lo, dst[i][cols + c] = hi (when !lo only hi is written;
 * row stride 2 cols), inv[i] = 2^-e for undoing it in y. One block per row. */
static __global__ void __launch_bounds__(QM_DQ_THREADS)
k_qm_xsplit(const float *x, int64_t ldx, int64_t n, int64_t cols, bool lo, uint16_t *dst,
            float *inv)
{
    __shared__ float part[QM_DQ_THREADS / 32];
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const float *xi = x + i * ldx;
        float m = 0.0f;   /* fmaxf drops NaN: NaNs go through the split as NaN */
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(__ldg(xi + c)));
        m = hkv_warp_max(m);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
        __syncthreads();
        m = part[0];
        for (int k = 1; k < QM_DQ_THREADS / 32; k++) m = fmaxf(m, part[k]);
        __syncthreads();   /* part is reused by the block's next row */
        int e = 0;
        if (m > 0.0f && m <= 3.402823466e38f) {
            /* m in [2^(b-127), 2^(b-126)) for biased exponent b (b = 0: subnormal, below 2^-126) */
            const int b = (__float_as_int(m) >> 23) & 0xff;
            e = 15 - (b ? b - 126 : -126);
            e = e > QM_EXP_CAP ? QM_EXP_CAP : e < -QM_EXP_CAP ? -QM_EXP_CAP : e;
        }
        const float s = qm_pow2(e);
        if (threadIdx.x == 0) inv[i] = qm_pow2(-e);
        uint16_t *d = dst + i * 2 * cols;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = __ldg(xi + c) * s;
            const uint16_t h = hkv_f2h(v);
            d[cols + c] = h;
            if (lo) d[c] = qm_lo(v, h);
        }
    }
}

/* y[i][r] *= inv[i], i < n, r < rows: undoes the rows' scales (exact). */
static __global__ void __launch_bounds__(QM_DQ_THREADS)
k_qm_yscale(float *y, int64_t ldy, int64_t n, int64_t rows, const float *inv)
{
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n * rows;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = k / rows;
        y[i * ldy + k % rows] *= inv[i];
    }
}

/* ---- host side --------------------------------------------------------------- */

static unsigned qm_grid(int64_t items_per_block_units)
{
    int64_t b = items_per_block_units;
    if (b > QM_GRID_MAX) b = QM_GRID_MAX;
    return (unsigned)(b < 1 ? 1 : b);
}



/* Bytes of the three device arrays of a valid matrix. */
static void qm_sizes(int type, int64_t rows, int64_t cols, size_t *qb, size_t *sb, size_t *mb)
{
    const size_t n = (size_t)rows * (size_t)cols, blocks = n / HKV_WBLOCK;
    *qb = type == HKV_W_F32 ? n * 4 : type == HKV_W_F16 ? n * 2 : type == HKV_W_Q8 ? n : n / 2;
    *sb = type >= HKV_W_Q8 ? blocks * 2 : 0;
    *mb = type == HKV_W_Q4 ? blocks * 2 : 0;
}

static int qm_type_ok(int type) { return type >= HKV_W_F32 && type <= HKV_W_Q4; }

extern "C" void hkv_gpu_qmat_free(hkv_gpu_ctx *ctx, hkv_gpu_qmat *w)
{
    if (!w) return;
    if (w->q && qm_type_ok(w->type) && w->rows > 0 && w->cols > 0) {
        size_t qb, sb, mb;
        qm_sizes(w->type, w->rows, w->cols, &qb, &sb, &mb);
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, w->q, qb);
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, w->scale, sb);
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, w->min, mb);
    }
    memset(w, 0, sizeof *w);
}

/* Host fp16 bits to float (exact; the scales and mins of Q8/Q4). */
static float qm_host_h2f(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? ldexpf((float)m, -24)
                    : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

/* The power of two that takes the matrix's largest finite |W| (a bound of it
 * for Q8/Q4, from the scales and mins) to [2^14, 2^15): the split GEMM's
 * weights then neither overflow fp16 nor lose the small ones to its
 * subnormals. F16 weights are fp16 already (hi exact, lo zero): 1. */
static float qm_wscale(const hkv_wmat *src)
{
    const int64_t n = src->rows * src->cols, nb = n / HKV_WBLOCK;
    double mx = 0;
    if (src->type == HKV_W_F32) {
        for (int64_t i = 0; i < n; i++) {
            const double v = fabs((double)((const float *)src->q)[i]);
            if (v > mx && v <= 3.402823466e38) mx = v;
        }
    } else if (src->type == HKV_W_Q8) {   /* |s q| <= 128 |s| */
        for (int64_t b = 0; b < nb; b++) {
            const double v = 128.0 * fabs((double)qm_host_h2f(src->scale[b]));
            if (v > mx && v <= 3.402823466e38) mx = v;
        }
    } else if (src->type == HKV_W_Q4) {   /* s q + min, q in 0..15: extremes at the ends */
        for (int64_t b = 0; b < nb; b++) {
            const double s = qm_host_h2f(src->scale[b]), m = qm_host_h2f(src->min[b]);
            const double v = fmax(fabs(m), fabs(m + 15.0 * s)) * (1 + 1.0 / 16777216.0);
            if (v > mx && v <= 3.402823466e38) mx = v;
        }
    }
    if (!(mx > 0)) return 1.0f;
    int e;
    frexp(mx, &e);   /* mx in [2^(e-1), 2^e) */
    e = 15 - e;
    e = e > QM_EXP_CAP ? QM_EXP_CAP : e < -QM_EXP_CAP ? -QM_EXP_CAP : e;
    return ldexpf(1.0f, e);
}

extern "C" int hkv_gpu_qmat_upload(hkv_gpu_ctx *ctx, const hkv_wmat *src, hkv_gpu_qmat *dst,
                                   void *stream, hkv_err *err)
{
    if (!dst) return hkv_seterr(err, HKV_E_INVAL, "gpu qmat upload: no destination");
    memset(dst, 0, sizeof *dst);
    if (!ctx || !src || !src->q || src->rows < 1 || src->cols < 1 || !qm_type_ok(src->type))
        return hkv_seterr(err, HKV_E_INVAL, "gpu qmat upload: bad matrix (type %d, %lld x %lld, "
                          "data %s) or no context", src ? src->type : -1,
                          (long long)(src ? src->rows : 0), (long long)(src ? src->cols : 0),
                          src && src->q ? "present" : "missing");
    const int type = src->type;
    const int64_t rows = src->rows, cols = src->cols;
    if (type >= HKV_W_Q8 && cols % HKV_WBLOCK)
        return hkv_seterr(err, HKV_E_INVAL, "gpu qmat upload: %s weights need cols a multiple of "
                          "%d, got %lld", type == HKV_W_Q8 ? "Q8" : "Q4", HKV_WBLOCK,
                          (long long)cols);
    if ((type >= HKV_W_Q8 && !src->scale) || (type == HKV_W_Q4 && !src->min))
        return hkv_seterr(err, HKV_E_INVAL, "gpu qmat upload: %s weights without %s",
                          type == HKV_W_Q8 ? "Q8" : "Q4", src->scale ? "mins" : "scales");
    if ((uint64_t)rows > (uint64_t)INT64_MAX / 4 / (uint64_t)cols ||
        (uint64_t)rows * (uint64_t)cols > SIZE_MAX / 4)
        return hkv_seterr(err, HKV_E_RANGE, "gpu qmat upload: %lld x %lld overflows",
                          (long long)rows, (long long)cols);
    size_t qb, sb, mb;
    qm_sizes(type, rows, cols, &qb, &sb, &mb);
    hkv_err local;   /* the allocation's code is needed even when the caller passes no err */
    if (!err) hkv_err_clear(&local), err = &local;
    void *q = hkv_gpu_alloc(ctx, HKV_TIER_WEIGHTS, qb, err);
    uint16_t *s = NULL, *m = NULL;
    if (q && sb) s = (uint16_t *)hkv_gpu_alloc(ctx, HKV_TIER_WEIGHTS, sb, err);
    if (q && (!sb || s) && mb) m = (uint16_t *)hkv_gpu_alloc(ctx, HKV_TIER_WEIGHTS, mb, err);
    int rc = HKV_OK;
    if (!q || (sb && !s) || (mb && !m)) {
        rc = hkv_err_prefix(err, "weights %lld x %lld (type %d, %zu bytes)", (long long)rows,
                            (long long)cols, type, qb + sb + mb);
    } else {
        /* host arrays may be pageable: synchronise before returning */
        cudaStream_t st = hkv_stream(stream);
        cudaError_t e = cudaMemcpyAsync(q, src->q, qb, cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess && sb)
            e = cudaMemcpyAsync(s, src->scale, sb, cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess && mb) e = cudaMemcpyAsync(m, src->min, mb, cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        if (e != cudaSuccess) rc = hkv_gpu_fail(err, e, "cudaMemcpyAsync (weights)");
    }
    if (rc) {
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, m, mb);
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, s, sb);
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, q, qb);
        return rc;
    }
    dst->type = type, dst->rows = rows, dst->cols = cols;
    dst->q = q, dst->scale = s, dst->min = m;
    dst->bytes = qb + sb + mb;
    /* The path that pays on this device, from the data sheets (PREDICTED, no
     * GPU measured it): an H100's fp16 tensor cores run 989 TFLOPS against 67
     * fp32, so the split's 3x tensor work is ~5x the fp32 GEMM; an RTX 4090's
     * 165 against 82.6, so the split would be 0.67x and fp32 stays. */
    dst->gemm = hkv_gpu_tensor_split_pays(hkv_gpu_ctx_cc(ctx)) ? HKV_QMAT_GEMM_SPLIT
                                                               : HKV_QMAT_GEMM_FP32;
    dst->wscale = qm_wscale(src);
    return HKV_OK;
}

/* A device matrix as upload leaves it. */
static int qm_valid(const hkv_gpu_qmat *w)
{
    return w && w->q && qm_type_ok(w->type) && w->rows > 0 && w->cols > 0 &&
           (w->type < HKV_W_Q8 || (w->cols % HKV_WBLOCK == 0 && w->scale)) &&
           (w->type != HKV_W_Q4 || w->min) && w->gemm >= HKV_QMAT_GEMM_SPLIT &&
           w->gemm <= HKV_QMAT_GEMM_FP32 && w->gemv >= HKV_QMAT_GEMV_AUTO &&
           w->gemv <= HKV_QMAT_GEMV_ROW4 && w->wscale > 0;
}

extern "C" int hkv_gpu_qmat_clone(hkv_gpu_ctx *ctx, const hkv_gpu_qmat *src, hkv_gpu_qmat *dst,
                                  void *stream, hkv_err *err)
{
    if (!dst) return hkv_seterr(err, HKV_E_INVAL, "gpu qmat clone: no destination");
    memset(dst, 0, sizeof *dst);
    if (!ctx || !qm_valid(src))
        return hkv_seterr(err, HKV_E_INVAL, "gpu qmat clone: no context or no valid matrix");
    size_t qb, sb, mb;
    qm_sizes(src->type, src->rows, src->cols, &qb, &sb, &mb);
    hkv_err local;   /* the allocation's code is needed even when the caller passes no err */
    if (!err) hkv_err_clear(&local), err = &local;
    hkv_gpu_qmat c = *src;
    c.q = hkv_gpu_alloc(ctx, HKV_TIER_WEIGHTS, qb, err);
    c.scale = c.q && sb ? (uint16_t *)hkv_gpu_alloc(ctx, HKV_TIER_WEIGHTS, sb, err) : NULL;
    c.min = c.q && (!sb || c.scale) && mb ? (uint16_t *)hkv_gpu_alloc(ctx, HKV_TIER_WEIGHTS, mb, err)
                                          : NULL;
    int rc = HKV_OK;
    if (!c.q || (sb && !c.scale) || (mb && !c.min)) rc = err->code;
    if (!rc) rc = hkv_gpu_copy(c.q, src->q, qb, stream, err);
    if (!rc && sb) rc = hkv_gpu_copy(c.scale, src->scale, sb, stream, err);
    if (!rc && mb) rc = hkv_gpu_copy(c.min, src->min, mb, stream, err);
    if (rc) {
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, c.min, mb);
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, c.scale, sb);
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, c.q, qb);
        return hkv_err_prefix(err, "gpu qmat clone of %lld x %lld", (long long)src->rows,
                              (long long)src->cols);
    }
    *dst = c;
    return HKV_OK;
}

static int qm_dequant(const hkv_gpu_qmat *w, const int32_t *ids, int64_t r0, int64_t n, float *dst,
                      int64_t ld, cudaStream_t st, hkv_err *err)
{
    if (w->type == HKV_W_Q4 && !ids && ld % 4 == 0 && (uintptr_t)dst % 16 == 0) {
        const int64_t nb = w->cols / HKV_WBLOCK;
        HKV_LAUNCH(k_qm_dequant_q4, qm_grid((n * nb + QM_DQ_THREADS - 1) / QM_DQ_THREADS),
                   QM_DQ_THREADS, 0, st)((const uint4 *)w->q, (const uint16_t *)w->scale,
                                         (const uint16_t *)w->min, nb, r0, n, dst, ld);
        HKV_LAUNCH_CHECK(err);
        return HKV_OK;
    }
    HKV_LAUNCH(k_qm_dequant, qm_grid(n), QM_DQ_THREADS, 0, st)(
        w->type, (const void *)w->q, (const uint16_t *)w->scale, (const uint16_t *)w->min, w->rows,
        w->cols, ids, r0, n, dst, ld);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_qmat_rows(const hkv_gpu_qmat *w, const int32_t *ids, int64_t n, float *dst,
                                 int64_t ld_dst, void *stream, hkv_err *err)
{
    if (!qm_valid(w) || !ids || !dst || n < 0 || ld_dst < w->cols)
        return hkv_seterr(err, HKV_E_INVAL, "gpu qmat rows: bad arguments (matrix %s, n %lld, "
                          "ld_dst %lld, cols %lld)", qm_valid(w) ? "ok" : "invalid", (long long)n,
                          (long long)ld_dst, (long long)(w ? w->cols : 0));
    if (!n) return HKV_OK;
    return qm_dequant(w, ids, 0, n, dst, ld_dst, hkv_stream(stream), err);
}

/* Rows per GEMM panel: w->panel_rows where set, else qmat_panel.h's rule (4
 * bytes per weight, fp32 or fp16 hi + lo); at most the matrix. */
static int64_t qm_panel_rows(const hkv_gpu_qmat *w)
{
    if (w->panel_rows > 0) return w->panel_rows < w->rows ? w->panel_rows : w->rows;
    return hkv_qmat_panel_rows(w->rows, w->cols);
}

static size_t qm_align(size_t b) { return (b + QM_ALIGN - 1) / QM_ALIGN * QM_ALIGN; }

/* Activation rows per chunk of a call with n rows (the split GEMMs). */
static int64_t qm_xchunk(int64_t n) { return n < QM_XCHUNK ? n : QM_XCHUNK; }

extern "C" size_t hkv_gpu_qmat_matmul_ws_bytes(const hkv_gpu_qmat *w, int64_t max_n)
{
    if (!qm_valid(w) || max_n <= QM_MAXN) return 0;   /* the GEMV needs none */
    const size_t panel = (size_t)qm_panel_rows(w) * (size_t)w->cols * 4;
    if (w->gemm == HKV_QMAT_GEMM_FP32) return w->type == HKV_W_F32 ? 0 : panel;
    const size_t xc = (size_t)qm_xchunk(max_n);
    return qm_align(panel) + qm_align(xc * (size_t)w->cols * 4) + xc * 4;
}

extern "C" int hkv_gpu_qmat_matmul(hkv_gpu_ctx *ctx, const hkv_gpu_qmat *w, const float *x,
                                   int64_t ldx, int64_t n, float *y, int64_t ldy, void *ws,
                                   size_t ws_bytes, void *stream, hkv_err *err)
{
    if (!ctx || !qm_valid(w) || !x || !y || n < 0 || ldx < w->cols || ldy < w->rows)
        return hkv_seterr(err, HKV_E_INVAL, "gpu qmat matmul: bad arguments (matrix %s, n %lld, "
                          "ldx %lld, ldy %lld, %lld x %lld)", qm_valid(w) ? "ok" : "invalid",
                          (long long)n, (long long)ldx, (long long)ldy,
                          (long long)(w ? w->rows : 0), (long long)(w ? w->cols : 0));
    if (!n) return HKV_OK;
    const int64_t rows = w->rows, cols = w->cols;
    cudaStream_t st = hkv_stream(stream);
    if (n <= QM_MAXN) return hkv_gpu_qmat_gemv(w, x, ldx, n, y, ldy, st, err);
    const bool fp32 = w->gemm == HKV_QMAT_GEMM_FP32;
    const int64_t pr = fp32 && w->type == HKV_W_F32 ? rows : qm_panel_rows(w);
    if (2 * cols > INT_MAX || n > INT_MAX || ldx > INT_MAX || ldy > INT_MAX || pr > INT_MAX)
        return hkv_seterr(err, HKV_E_RANGE, "gpu qmat matmul: %lld x %lld by %lld rows (ldx %lld, "
                          "ldy %lld) exceeds cuBLAS's int dimensions", (long long)rows,
                          (long long)cols, (long long)n, (long long)ldx, (long long)ldy);
    const size_t need = hkv_gpu_qmat_matmul_ws_bytes(w, n);
    if (need && (!ws || ws_bytes < need))
        return hkv_seterr(err, HKV_E_INVAL, "gpu qmat matmul: workspace of %zu bytes%s, %zu needed "
                          "for %lld rows (size it with hkv_gpu_qmat_matmul_ws_bytes for the most "
                          "rows a call has)", ws ? ws_bytes : 0, ws ? "" : " (none)", need,
                          (long long)n);
    cublasHandle_t hb = hkv_gpu_ctx_blas(ctx, st);
    if (!hb) return hkv_seterr(err, HKV_E_INVAL, "gpu qmat matmul: " HKV_NO_BLAS_STREAM);
    const float one = 1.0f, zero = 0.0f;
    if (fp32) {   /* fp32 panels, CUDA-core GEMM */
        for (int64_t r0 = 0; r0 < rows; r0 += pr) {
            const int64_t m = rows - r0 < pr ? rows - r0 : pr;
            const void *a = w->q;
            if (w->type != HKV_W_F32) {
                /* the previous panel's GEMM, earlier on st, has read ws by now */
                int rc = qm_dequant(w, NULL, r0, m, (float *)ws, cols, st, err);
                if (rc) return rc;
                a = ws;
            }
            HKV_CUBLAS_TRY(err, cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)cols,
                                             &one, a, CUDA_R_32F, (int)cols, x, CUDA_R_32F,
                                             (int)ldx, &zero, y + r0, CUDA_R_32F, (int)ldy,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        return HKV_OK;
    }
    /* fp16 tensor-core GEMMs: ws = [panel pr][2 cols] | [xc][2 cols] | inv[xc] */
    const bool split = w->gemm == HKV_QMAT_GEMM_SPLIT;
    const bool wlo = split && w->type != HKV_W_F16;   /* F16 weights: lo is 0 */
    const int64_t xc = qm_xchunk(n), ld = 2 * cols;
    uint16_t *wp = (uint16_t *)ws;
    uint16_t *xp = (uint16_t *)((char *)ws + qm_align((size_t)pr * (size_t)cols * 4));
    float *inv = (float *)((char *)xp + qm_align((size_t)xc * (size_t)cols * 4));
    /* y = 2^-ew (Whi xhi + 2^-11 (Whi xlo + Wlo xhi)), still times each row's 2^ex */
    const float a_hi = 1.0f / w->wscale, a_lo = a_hi / QM_LO_SCALE;
    const int kc = (int)(wlo ? ld : cols);   /* the correction's K: [Whi | Wlo] . [xlo | xhi] */
    for (int64_t i0 = 0; i0 < n; i0 += xc) {
        const int64_t nc = n - i0 < xc ? n - i0 : xc;
        /* the previous chunk's GEMMs and scaling, earlier on st, are done with xp and inv */
        HKV_LAUNCH(k_qm_xsplit, qm_grid(nc), QM_DQ_THREADS, 0, st)(x + i0 * ldx, ldx, nc, cols,
                                                                    split, xp, inv);
        HKV_LAUNCH_CHECK(err);
        float *yc = y + i0 * ldy;
        for (int64_t r0 = 0; r0 < rows; r0 += pr) {
            const int64_t m = rows - r0 < pr ? rows - r0 : pr;
            if (w->type == HKV_W_Q4)
                HKV_LAUNCH(k_qm_dequant_split_q4,
                           qm_grid((m * (cols / HKV_WBLOCK) + QM_DQ_THREADS - 1) / QM_DQ_THREADS),
                           QM_DQ_THREADS, 0, st)((const uint4 *)w->q, (const uint16_t *)w->scale,
                                                 (const uint16_t *)w->min, cols / HKV_WBLOCK, r0, m,
                                                 w->wscale, wlo, wp);
            else
                HKV_LAUNCH(k_qm_dequant_split, qm_grid(m), QM_DQ_THREADS, 0, st)(
                    w->type, (const void *)w->q, (const uint16_t *)w->scale,
                    (const uint16_t *)w->min, cols, r0, m, w->wscale, wlo, wp);
            HKV_LAUNCH_CHECK(err);
            if (split) /* the small terms first, the large one added to them */
                HKV_CUBLAS_TRY(err, cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)nc, kc,
                                                 &a_lo, wp, CUDA_R_16F, (int)ld, xp, CUDA_R_16F,
                                                 (int)ld, &zero, yc + r0, CUDA_R_32F, (int)ldy,
                                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            HKV_CUBLAS_TRY(err, cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)nc, (int)cols,
                                             &a_hi, wp, CUDA_R_16F, (int)ld, xp + cols, CUDA_R_16F,
                                             (int)ld, split ? &one : &zero, yc + r0, CUDA_R_32F,
                                             (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        HKV_LAUNCH(k_qm_yscale, qm_grid((nc * rows + QM_DQ_THREADS - 1) / QM_DQ_THREADS),
                   QM_DQ_THREADS, 0, st)(yc, ldy, nc, rows, inv);
        HKV_LAUNCH_CHECK(err);
    }
    return HKV_OK;
}

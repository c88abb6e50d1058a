/* Weight matrices on the device in their repacked host formats (cpu/kernels.h
 * enum hkv_wtype) and the products that dequantise them on the fly.
 *
 * Dequantisation gives the fp32 values of the host path (cpu/gemv_scalar.c
 * decode_span, and the vector levels) bit for bit: the scale is fp16 (11
 * significant bits) and the code at most 8 bits, so s*q is exact in fp32 and
 * Q8's s*q has no rounding at all, Q4's s*q + min exactly one, whether the
 * host or the device fuses the multiply-add or not. The device uses one FMA.
 *
 * n <= 8 (decode): one warp per output row reads each weight once for all n
 * activation rows, fp32 partial sums per lane, a shuffle reduction. Q4: a
 * lane per 32-weight block, its 16 code bytes one 128-bit load, so a warp
 * reads 512 contiguous bytes per step; Q8: two lanes per block, 128-bit loads
 * likewise; x in 128-bit loads where its rows are 16-byte aligned. F16 and
 * F32: lane l takes columns l, l+32, ... (W and x coalesced as they are).
 *
 * n > 8 (prefill): row panels of W dequantised into ws, each followed by an
 * fp32 cuBLAS GEMM into its rows of y; F32 weights go to cuBLAS directly.
 * Layout for cuBLAS (column-major), as in gemm.cu: a panel, row-major
 * [pr][cols], is the column-major cols x pr matrix A (lda = cols); x, row-major
 * [n][ldx], the cols x n matrix B (ldb = ldx); C = A^T B, pr x n with
 * ldc = ldy, is rows r0.. r0+pr of y row-major [n][ldy]. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "gpu_internal.cuh"

extern "C" {
#include "gpu_forward.h"
}

#define QM_WARPS 8                   /* GEMV: warps (output rows) per block */
#define QM_THREADS (QM_WARPS * 32)
#define QM_MAXN 8                    /* GEMV: activation rows per call */
#define QM_MIN_BLOCKS 4              /* Q4/Q8 GEMV: blocks per SM ptxas must allow (<= 64
                                      * registers; unbounded, Q8 took 80) */
#define QM_DQ_THREADS 256            /* dequantisation: threads per block (one row) */
#define QM_PANEL_BYTES ((size_t)4 << 20)   /* GEMM path: panel target size */
#define QM_PANEL_MIN_ROWS 128        /* ... but at least this many rows (GEMM efficiency) */
#define QM_GRID_MAX (65535 * 16)     /* 1-D grid cap; kernels stride over the rest */

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

/* Q4: lane l takes whole 32-weight blocks l, l+32, ..., each one 128-bit
 * load of its 16 code bytes (a warp reads 512 contiguous bytes per step);
 * byte j of a block holds elements j (low nibble) and j + 16 (high). Word t
 * of the load is decoded to its 8 weights, then every activation row takes
 * them with two float4 reads of x. */
static __global__ void __launch_bounds__(QM_THREADS, QM_MIN_BLOCKS)
k_qm_gemv_q4(const unsigned char *q, const uint16_t *scale, const uint16_t *mins, int64_t rows,
             int64_t cols, const float *x, int64_t ldx, bool vec, int n, float *y, int64_t ldy)
{
    const int lane = threadIdx.x & 31;
    const int64_t nb = cols / HKV_WBLOCK;
    QM_ROW_LOOP(row) {
        float acc[QM_MAXN];
#pragma unroll
        for (int i = 0; i < QM_MAXN; i++) acc[i] = 0.0f;
        const uint4 *qr = (const uint4 *)(q + row * nb * (HKV_WBLOCK / 2));
        const uint16_t *sr = scale + row * nb, *mr = mins + row * nb;
        for (int64_t b = lane; b < nb; b += 32) {
            const uint4 bits4 = __ldg(qr + b);
            const float s = hkv_h2f(__ldg(sr + b)), mn = hkv_h2f(__ldg(mr + b));
            const unsigned words[4] = {bits4.x, bits4.y, bits4.z, bits4.w};
#pragma unroll
            for (int t = 0; t < 4; t++) {
                float w[8];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    w[k] = qm_q4(s, mn, (words[t] >> (8 * k)) & 15u);
                    w[4 + k] = qm_q4(s, mn, (words[t] >> (8 * k + 4)) & 15u);
                }
                const float *xb = x + b * HKV_WBLOCK + 4 * t;
#pragma unroll
                for (int i = 0; i < QM_MAXN; i++)
                    if (i < n) {
                        const float4 lo = qm_x4(xb + i * ldx, vec), hi = qm_x4(xb + i * ldx + 16, vec);
                        float a = acc[i];
                        a += w[0] * lo.x, a += w[1] * lo.y, a += w[2] * lo.z, a += w[3] * lo.w;
                        a += w[4] * hi.x, a += w[5] * hi.y, a += w[6] * hi.z, a += w[7] * hi.w;
                        acc[i] = a;
                    }
            }
        }
        qm_store(acc, n, y, ldy, row, lane);
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
                for (int k = 0; k < 4; k++) w[k] = qm_q8(s, (int)(signed char)(words[t] >> (8 * k)));
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
static __global__ void __launch_bounds__(QM_THREADS)
k_qm_gemv_f16(const uint16_t *q, int64_t rows, int64_t cols, const float *x, int64_t ldx, int n,
              float *y, int64_t ldy)
{
    const int lane = threadIdx.x & 31;
    QM_ROW_LOOP(row) {
        float acc[QM_MAXN];
#pragma unroll
        for (int i = 0; i < QM_MAXN; i++) acc[i] = 0.0f;
        const uint16_t *qr = q + row * cols;
        for (int64_t c = lane; c < cols; c += 32) {
            const float w = hkv_h2f(__ldg(qr + c));
#pragma unroll
            for (int i = 0; i < QM_MAXN; i++)
                if (i < n) acc[i] += w * __ldg(x + i * ldx + c);
        }
        qm_store(acc, n, y, ldy, row, lane);
    }
}

static __global__ void __launch_bounds__(QM_THREADS)
k_qm_gemv_f32(const float *q, int64_t rows, int64_t cols, const float *x, int64_t ldx, int n,
              float *y, int64_t ldy)
{
    const int lane = threadIdx.x & 31;
    QM_ROW_LOOP(row) {
        float acc[QM_MAXN];
#pragma unroll
        for (int i = 0; i < QM_MAXN; i++) acc[i] = 0.0f;
        const float *qr = q + row * cols;
        for (int64_t c = lane; c < cols; c += 32) {
            const float w = __ldg(qr + c);
#pragma unroll
            for (int i = 0; i < QM_MAXN; i++)
                if (i < n) acc[i] += w * __ldg(x + i * ldx + c);
        }
        qm_store(acc, n, y, ldy, row, lane);
    }
}

/* ---- host side --------------------------------------------------------------- */

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
    return HKV_OK;
}

/* A device matrix as upload leaves it. */
static int qm_valid(const hkv_gpu_qmat *w)
{
    return w && w->q && qm_type_ok(w->type) && w->rows > 0 && w->cols > 0 &&
           (w->type < HKV_W_Q8 || (w->cols % HKV_WBLOCK == 0 && w->scale)) &&
           (w->type != HKV_W_Q4 || w->min);
}

static unsigned qm_grid(int64_t items_per_block_units)
{
    int64_t b = items_per_block_units;
    if (b > QM_GRID_MAX) b = QM_GRID_MAX;
    return (unsigned)(b < 1 ? 1 : b);
}

static int qm_dequant(const hkv_gpu_qmat *w, const int32_t *ids, int64_t r0, int64_t n, float *dst,
                      int64_t ld, cudaStream_t st, hkv_err *err)
{
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

/* Rows per GEMM panel: QM_PANEL_BYTES of fp32, at least QM_PANEL_MIN_ROWS,
 * at most the matrix. */
static int64_t qm_panel_rows(const hkv_gpu_qmat *w)
{
    int64_t pr = (int64_t)(QM_PANEL_BYTES / ((size_t)w->cols * 4));
    if (pr < QM_PANEL_MIN_ROWS) pr = QM_PANEL_MIN_ROWS;
    if (pr > w->rows) pr = w->rows;
    return pr;
}

extern "C" size_t hkv_gpu_qmat_matmul_ws_bytes(const hkv_gpu_qmat *w)
{
    if (!qm_valid(w) || w->type == HKV_W_F32) return 0;
    return (size_t)qm_panel_rows(w) * (size_t)w->cols * 4;
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
    if (n <= QM_MAXN) {
        const unsigned grid = qm_grid((rows + QM_WARPS - 1) / QM_WARPS);
        const bool vec = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;   /* 128-bit x loads */
        switch (w->type) {
        case HKV_W_Q4:
            HKV_LAUNCH(k_qm_gemv_q4, grid, QM_THREADS, 0, st)(
                (const unsigned char *)w->q, (const uint16_t *)w->scale, (const uint16_t *)w->min,
                rows, cols, x, ldx, vec, (int)n, y, ldy);
            break;
        case HKV_W_Q8:
            HKV_LAUNCH(k_qm_gemv_q8, grid, QM_THREADS, 0, st)(
                (const signed char *)w->q, (const uint16_t *)w->scale, rows, cols, x, ldx, vec,
                (int)n, y, ldy);
            break;
        case HKV_W_F16:
            HKV_LAUNCH(k_qm_gemv_f16, grid, QM_THREADS, 0, st)(
                (const uint16_t *)w->q, rows, cols, x, ldx, (int)n, y, ldy);
            break;
        default:
            HKV_LAUNCH(k_qm_gemv_f32, grid, QM_THREADS, 0, st)(
                (const float *)w->q, rows, cols, x, ldx, (int)n, y, ldy);
            break;
        }
        HKV_LAUNCH_CHECK(err);
        return HKV_OK;
    }
    const int64_t pr = w->type == HKV_W_F32 ? rows : qm_panel_rows(w);
    if (cols > INT_MAX || n > INT_MAX || ldx > INT_MAX || ldy > INT_MAX || pr > INT_MAX)
        return hkv_seterr(err, HKV_E_RANGE, "gpu qmat matmul: %lld x %lld by %lld rows (ldx %lld, "
                          "ldy %lld) exceeds cuBLAS's int dimensions", (long long)rows,
                          (long long)cols, (long long)n, (long long)ldx, (long long)ldy);
    const size_t need = hkv_gpu_qmat_matmul_ws_bytes(w);
    if (need && (!ws || ws_bytes < need))
        return hkv_seterr(err, HKV_E_INVAL, "gpu qmat matmul: workspace of %zu bytes%s, %zu needed "
                          "for %lld rows", ws ? ws_bytes : 0, ws ? "" : " (none)", need,
                          (long long)n);
    cublasHandle_t hb = hkv_gpu_ctx_blas(ctx, st);
    if (!hb) return hkv_seterr(err, HKV_E_INVAL, "gpu qmat matmul: " HKV_NO_BLAS_STREAM);
    const float alpha = 1.0f, beta = 0.0f;
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
                                         &alpha, a, CUDA_R_32F, (int)cols, x, CUDA_R_32F, (int)ldx,
                                         &beta, y + r0, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT));
    }
    return HKV_OK;
}

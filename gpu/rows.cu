/* Row movement of the forward pass: gather/scatter of fp32 activation rows,
 * the bias add, K/V appends to fp16 caches, and the empty (out 0, lse -inf)
 * attention partial, and 16-bit rows scattered into a device mirror. 2-D grids: y over rows, x over the elements of a row,
 * both grid-stride, so any n and row length fit the launch limits; index
 * math in int64. */
#include <math.h>

#include "gpu_internal.cuh"

extern "C" {
#include "gpu_forward.h"
}

#define RW_THREADS 256
#define RW_GRID_Y 65535   /* the launch limit of grid y */
#define RW_GRID_X 4096    /* blocks over one row's elements; more stride */

static dim3 rw_grid(int64_t n, int64_t per_row)
{
    int64_t gx = (per_row + RW_THREADS - 1) / RW_THREADS, gy = n;
    if (gx > RW_GRID_X) gx = RW_GRID_X;
    if (gx < 1) gx = 1;
    if (gy > RW_GRID_Y) gy = RW_GRID_Y;
    if (gy < 1) gy = 1;
    return dim3((unsigned)gx, (unsigned)gy, 1);
}

#define RW_ROWS(i, n) for (int64_t i = blockIdx.y; i < (n); i += gridDim.y)
#define RW_COLS(j, m)                                                              \
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < (m);      \
         j += (int64_t)gridDim.x * blockDim.x)

static __global__ void __launch_bounds__(RW_THREADS)
k_copy_rows(float *dst, int64_t ld_dst, const int32_t *dst_rows, const float *src, int64_t ld_src,
            const int32_t *src_rows, int64_t n, int64_t cols)
{
    RW_ROWS(i, n) {
        const int64_t rd = dst_rows ? (int64_t)dst_rows[i] : i;
        const int64_t rs = src_rows ? (int64_t)src_rows[i] : i;
        if (rd < 0 || rs < 0) continue;
        float *d = dst + rd * ld_dst;
        const float *s = src + rs * ld_src;
        RW_COLS(j, cols) d[j] = s[j];
    }
}

static __global__ void __launch_bounds__(RW_THREADS)
k_add_bias(float *x, int64_t ldx, int64_t n, const float *b, int64_t cols)
{
    RW_ROWS(r, n) {
        float *xr = x + r * ldx;
        RW_COLS(j, cols) xr[j] += b[j];
    }
}

/* Element e = h*d + c of row r's K and V heads. */
static __global__ void __launch_bounds__(RW_THREADS)
k_kv_append(const float *qkv, int64_t ld, int64_t n, int64_t k_off, int64_t v_off, int n_head_kv,
            int d, const int64_t *dst, int64_t hs, uint16_t *k_cache, uint16_t *v_cache)
{
    const int64_t per_row = (int64_t)n_head_kv * d;
    RW_ROWS(r, n) {
        const int64_t o = dst[r];
        if (o < 0) continue;
        const float *row = qkv + r * ld;
        RW_COLS(e, per_row) {
            const int64_t h = e / d, c = e - h * d, to = o + h * hs + c;
            k_cache[to] = hkv_f2h(row[k_off + e]);
            v_cache[to] = hkv_f2h(row[v_off + e]);
        }
    }
}

/* As k_kv_append, each group of 32 values of a K or V head rounded to what
 * the host's 8-bit far tier returns for it (index/far_rows.h): codes of
 * rint(x * 127 / absmax), clamped to +-127, times absmax / 127, to fp16;
 * the same float operations, so the same bits. A warp is one group: the
 * block and the grid stride are multiples of 32 and so is a row's span. */
static __global__ void __launch_bounds__(RW_THREADS)
k_kv_append_q8(const float *qkv, int64_t ld, int64_t n, int64_t k_off, int64_t v_off,
               int n_head_kv, int d, const int64_t *dst, int64_t hs, uint16_t *k_cache,
               uint16_t *v_cache)
{
    const int64_t per_row = (int64_t)n_head_kv * d;
    RW_ROWS(r, n) {
        const int64_t o = dst[r];
        if (o < 0) continue;
        const float *row = qkv + r * ld;
        RW_COLS(j, 2 * per_row) {
            const int is_v = j >= per_row;
            const int64_t e = is_v ? j - per_row : j, h = e / d, c = e - h * d;
            const float x = row[(is_v ? v_off : k_off) + e];
            float a = fabsf(x);
            for (int m = 16; m; m >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, m));
            const float inv = a > 0 ? 127.0f / a : 0.0f;
            /* + 0: a small negative x rounds to -0, where the host's int8 code is 0 */
            const float code = fminf(fmaxf(rintf(x * inv), -127.0f), 127.0f) + 0.0f;
            (is_v ? v_cache : k_cache)[o + h * hs + c] = hkv_f2h(code * (a / 127.0f));
        }
    }
}

static __global__ void __launch_bounds__(RW_THREADS)
k_partial_clear(float *out, int64_t ldo, float *lse, int64_t n, int n_head, int d)
{
    const int64_t per_row = (int64_t)n_head * d;
    RW_ROWS(i, n) {
        float *o = out + i * ldo;
        RW_COLS(j, per_row) {
            o[j] = 0.0f;
            if (j < n_head) lse[i * n_head + j] = -INFINITY;
        }
    }
}

extern "C" int hkv_gpu_copy_rows(float *dst, int64_t ld_dst, const int32_t *dst_rows,
                                 const float *src, int64_t ld_src, const int32_t *src_rows,
                                 int64_t n, int64_t cols, void *stream, hkv_err *err)
{
    if (!dst || !src || n < 0 || cols < 1 || ld_dst < cols || ld_src < cols)
        return hkv_seterr(err, HKV_E_INVAL, "gpu copy rows: bad arguments (n %lld, cols %lld, "
                          "strides %lld/%lld)", (long long)n, (long long)cols,
                          (long long)ld_dst, (long long)ld_src);
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_copy_rows, rw_grid(n, cols), RW_THREADS, 0, hkv_stream(stream))(
        dst, ld_dst, dst_rows, src, ld_src, src_rows, n, cols);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_add_bias(float *x, int64_t ldx, int64_t n, const float *b, int64_t cols,
                                void *stream, hkv_err *err)
{
    if (!x || !b || n < 0 || cols < 1 || ldx < cols)
        return hkv_seterr(err, HKV_E_INVAL, "gpu add bias: bad arguments (n %lld, cols %lld, "
                          "ldx %lld)", (long long)n, (long long)cols, (long long)ldx);
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_add_bias, rw_grid(n, cols), RW_THREADS, 0, hkv_stream(stream))(x, ldx, n, b, cols);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

static int kv_append(const float *qkv, int64_t ld, int64_t n, int64_t k_off, int64_t v_off,
                     int n_head_kv, int d, const int64_t *dst, int64_t hs, uint16_t *k_cache,
                     uint16_t *v_cache, int q8, void *stream, hkv_err *err)
{
    const int64_t span = (int64_t)n_head_kv * d;
    if (!qkv || !dst || !k_cache || !v_cache || n < 0 || n_head_kv < 1 || d < 1 || k_off < 0 ||
        v_off < 0 || ld < k_off + span || ld < v_off + span || (n_head_kv > 1 ? hs < d : hs < 0) ||
        (q8 && d % 32))
        return hkv_seterr(err, HKV_E_INVAL, "gpu kv append%s: bad arguments (n %lld, %d KV heads "
                          "of %d, offsets %lld/%lld, ld %lld, head stride %lld)", q8 ? " q8" : "",
                          (long long)n, n_head_kv, d, (long long)k_off, (long long)v_off,
                          (long long)ld, (long long)hs);
    if (!n) return HKV_OK;
    if (q8)
        HKV_LAUNCH(k_kv_append_q8, rw_grid(n, 2 * span), RW_THREADS, 0, hkv_stream(stream))(
            qkv, ld, n, k_off, v_off, n_head_kv, d, dst, hs, k_cache, v_cache);
    else
        HKV_LAUNCH(k_kv_append, rw_grid(n, span), RW_THREADS, 0, hkv_stream(stream))(
            qkv, ld, n, k_off, v_off, n_head_kv, d, dst, hs, k_cache, v_cache);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_kv_append(const float *qkv, int64_t ld, int64_t n, int64_t k_off,
                                 int64_t v_off, int n_head_kv, int d, const int64_t *dst,
                                 int64_t hs, uint16_t *k_cache, uint16_t *v_cache, void *stream,
                                 hkv_err *err)
{
    return kv_append(qkv, ld, n, k_off, v_off, n_head_kv, d, dst, hs, k_cache, v_cache, 0, stream,
                     err);
}

extern "C" int hkv_gpu_kv_append_q8(const float *qkv, int64_t ld, int64_t n, int64_t k_off,
                                    int64_t v_off, int n_head_kv, int d, const int64_t *dst,
                                    int64_t hs, uint16_t *k_cache, uint16_t *v_cache, void *stream,
                                    hkv_err *err)
{
    return kv_append(qkv, ld, n, k_off, v_off, n_head_kv, d, dst, hs, k_cache, v_cache, 1, stream,
                     err);
}

extern "C" int hkv_gpu_partial_clear(float *out, int64_t ldo, float *lse, int64_t n, int n_head,
                                     int d, void *stream, hkv_err *err)
{
    if (!out || !lse || n < 0 || n_head < 1 || d < 1 || ldo < (int64_t)n_head * d)
        return hkv_seterr(err, HKV_E_INVAL, "gpu partial clear: bad arguments (n %lld, %d heads "
                          "of %d, ldo %lld)", (long long)n, n_head, d, (long long)ldo);
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_partial_clear, rw_grid(n, (int64_t)n_head * d), RW_THREADS, 0,
               hkv_stream(stream))(out, ldo, lse, n, n_head, d);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

static __global__ void __launch_bounds__(RW_THREADS)
k_scatter_u16(uint16_t *dst, const int64_t *off, const uint16_t *src, int64_t n, int64_t n16)
{
    RW_ROWS(i, n) {
        const int64_t o = off[i];
        if (o < 0) continue;
        RW_COLS(j, n16) dst[o + j] = src[i * n16 + j];
    }
}

extern "C" int hkv_gpu_scatter_u16(uint16_t *dst, const int64_t *off, const uint16_t *src,
                                   int64_t n, int64_t n16, void *stream, hkv_err *err)
{
    if (!dst || !off || !src || n < 0 || n16 < 1)
        return hkv_seterr(err, HKV_E_INVAL, "gpu scatter: bad arguments (n %lld, %lld values)",
                          (long long)n, (long long)n16);
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_scatter_u16, rw_grid(n, n16), RW_THREADS, 0, hkv_stream(stream))(dst, off, src,
                                                                                 n, n16);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

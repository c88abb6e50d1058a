/* The model's element-wise and row pieces: embedding lookup from an fp16
 * table, RMSNorm, RoPE (both layouts, per-row positions), SwiGLU, residual
 * add, fp32 <-> fp16. The math follows runtime/forward.c: RMSNorm sums
 * squares in float64 (one row per block), RoPE angles in float64. */
#include <math.h>

#include "gpu_internal.cuh"

extern "C" {
#include "gpu_kernels.h"
}

#define MK_THREADS 256

static __global__ void k_embed(const uint16_t *table, int64_t vocab, int64_t dim, const int32_t *tok,
                        int64_t n, float *x)
{
    const int64_t total = n * dim;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / dim, c = i - r * dim;
        int32_t t = tok[r];
        x[i] = (t >= 0 && t < vocab) ? hkv_h2f(table[(int64_t)t * dim + c]) : __int_as_float(0x7fc00000);
    }
}

/* The block's sum of each thread's ss (float64, warps then the first warp),
 * the same order for every kernel that uses it; every thread gets it. */
static __device__ double mk_block_sum_d(double ss)
{
    __shared__ double part[MK_THREADS / 32];
    ss = hkv_warp_sum_d(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        double v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0;
        v = hkv_warp_sum_d(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

/* One block per row: sum of squares in double, then the scaled copy. */
static __global__ void k_rmsnorm(const float *x, int64_t ldx, const float *w, int dim, float eps,
                          float *y, int64_t ldy)
{
    const float *xr = x + blockIdx.x * ldx;
    float *yr = y + blockIdx.x * ldy;
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * xr[i];
    const double sum = mk_block_sum_d(ss);
    const float r = (float)(1.0 / sqrt(sum / dim + eps));
    /* every thread has the sum before any y element that may alias x is
     * written: each thread reads only the x elements it writes itself */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

/* The residual add and the next RMSNorm in one pass (hkv_gpu_add_rmsnorm):
 * each thread adds and stores its own x elements, then sums their squares
 * in the order k_rmsnorm does, so x and y are bit for bit what k_add
 * followed by k_rmsnorm give; one launch and one read of x instead of two. */
static __global__ void k_add_rmsnorm(float *x, int64_t ldx, const float *r, int64_t ldr,
                                     const float *w, int dim, float eps, float *y, int64_t ldy)
{
    float *xr = x + blockIdx.x * ldx;
    const float *rr = r + blockIdx.x * ldr;
    float *yr = y + blockIdx.x * ldy;
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] + rr[i];
        xr[i] = v;
        ss += (double)v * v;
    }
    const double sum = mk_block_sum_d(ss);
    const float s = (float)(1.0 / sqrt(sum / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * s * w[i];
}

/* The cos/sin table of one step: one thread per (row, rotated pair), the
 * angle and its cos/sin in float64 rounded to float, as the host computes
 * them (runtime/backend_cpu.c), so the device's rotation is the host's bit
 * for bit. float64 because the angle pos * inv_freq reaches 1.3e5 rad at
 * 128K tokens, where a float argument is off by up to 2^-24 * 1.3e5 = 4e-3
 * rad; it costs one sincos per (row, pair) per step, not per layer and head,
 * so the per-layer rotation below is float only. */
static __global__ void k_rope_table(const float *inv_freq, int rot, const int64_t *pos, int64_t n,
                                    float *cs)
{
    const int half = rot / 2;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n * half;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / half;
        const int i = (int)(t - r * half);
        double sn, cn;
        sincos((double)pos[r] * (double)inv_freq[i], &sn, &cn);
        cs[r * rot + i] = (float)cn;
        cs[r * rot + half + i] = (float)sn;
    }
}

/* One thread per (row, head, rotated pair): a table lookup and four float
 * multiplies. */
static __global__ void k_rope(float *x, int64_t ldx, int64_t n, int n_heads, int head_dim, int rot,
                              int layout, const float *cs)
{
    const int half = rot / 2;
    const int64_t total = n * n_heads * half;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(t % half);
        const int64_t rh = t / half;
        const int h = (int)(rh % n_heads);
        const int64_t r = rh / n_heads;
        const float c = __ldg(cs + r * rot + i), s = __ldg(cs + r * rot + half + i);
        float *v = x + r * ldx + (int64_t)h * head_dim;
        const int ia = layout == HKV_GPU_ROPE_PAIRS ? 2 * i : i;
        const int ib = layout == HKV_GPU_ROPE_PAIRS ? 2 * i + 1 : i + half;
        const float a = v[ia], b = v[ib];
        v[ia] = a * c - b * s;
        v[ib] = a * s + b * c;
    }
}

static __global__ void k_swiglu(const float *gu, int64_t n, int64_t F, float *out)
{
    const int64_t total = n * F;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / F, j = i - r * F;
        float g = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j];
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

static __global__ void k_add(float *x, const float *y, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

static __global__ void k_f32_to_f16(const float *s, uint16_t *d, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        d[i] = hkv_f2h(s[i]);
}

static __global__ void k_f16_to_f32(const uint16_t *s, float *d, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        d[i] = hkv_h2f(s[i]);
}

extern "C" int hkv_gpu_embed(const uint16_t *table, int64_t vocab, int64_t dim,
                             const int32_t *tokens, int64_t n, float *x, void *stream, hkv_err *err)
{
    if (!table || !tokens || !x || vocab < 1 || dim < 1 || n < 0)
        return hkv_seterr(err, HKV_E_INVAL, "gpu embed: bad arguments (vocab %lld, dim %lld, n %lld)",
                          (long long)vocab, (long long)dim, (long long)n);
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_embed, hkv_grid1(n * dim, MK_THREADS), MK_THREADS, 0, hkv_stream(stream))(
        table, vocab, dim, tokens, n, x);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_rmsnorm(const float *x, int64_t ldx, const float *w, int64_t n, int dim,
                               float eps, float *y, int64_t ldy, void *stream, hkv_err *err)
{
    if (!x || !w || !y || dim < 1 || n < 0 || ldx < dim || ldy < dim || !(eps >= 0.0f))
        return hkv_seterr(err, HKV_E_INVAL, "gpu rmsnorm: bad arguments (dim %d, n %lld, strides "
                          "%lld/%lld, eps %g)", dim, (long long)n, (long long)ldx, (long long)ldy,
                          (double)eps);
    if (n > 2147483647)
        return hkv_seterr(err, HKV_E_RANGE, "gpu rmsnorm: %lld rows exceed a grid", (long long)n);
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_rmsnorm, (unsigned)n, MK_THREADS, 0, hkv_stream(stream))(
        x, ldx, w, dim, eps, y, ldy);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_add_rmsnorm(float *x, int64_t ldx, const float *r, int64_t ldr,
                                   const float *w, int64_t n, int dim, float eps, float *y,
                                   int64_t ldy, void *stream, hkv_err *err)
{
    if (!x || !r || !w || !y || y == x || dim < 1 || n < 0 || ldx < dim || ldr < dim || ldy < dim ||
        !(eps >= 0.0f))
        return hkv_seterr(err, HKV_E_INVAL, "gpu add_rmsnorm: bad arguments (dim %d, n %lld, strides "
                          "%lld/%lld/%lld, eps %g%s)", dim, (long long)n, (long long)ldx,
                          (long long)ldr, (long long)ldy, (double)eps, y && y == x ? ", y is x" : "");
    if (n > 2147483647)
        return hkv_seterr(err, HKV_E_RANGE, "gpu add_rmsnorm: %lld rows exceed a grid", (long long)n);
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_add_rmsnorm, (unsigned)n, MK_THREADS, 0, hkv_stream(stream))(
        x, ldx, r, ldr, w, dim, eps, y, ldy);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_rope_table(const float *inv_freq, int rot, const int64_t *pos, int64_t n,
                                  float *cs, void *stream, hkv_err *err)
{
    if (!inv_freq || !pos || !cs || n < 0 || rot < 2 || rot & 1)
        return hkv_seterr(err, HKV_E_INVAL, "gpu rope table: bad arguments (rot %d, n %lld)", rot,
                          (long long)n);
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_rope_table, hkv_grid1(n * (rot / 2), MK_THREADS), MK_THREADS, 0,
               hkv_stream(stream))(inv_freq, rot, pos, n, cs);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_rope(float *x, int64_t ldx, int64_t n, int n_heads, int head_dim, int rot,
                            int layout, const float *cs, void *stream, hkv_err *err)
{
    if (!x || !cs || n < 0 || n_heads < 1 || head_dim < 2 || rot < 2 || rot & 1 ||
        rot > head_dim || ldx < (int64_t)n_heads * head_dim ||
        (layout != HKV_GPU_ROPE_PAIRS && layout != HKV_GPU_ROPE_NEOX))
        return hkv_seterr(err, HKV_E_INVAL, "gpu rope: bad arguments (%d heads of %d, rot %d, "
                          "layout %d, stride %lld)", n_heads, head_dim, rot, layout, (long long)ldx);
    if (!n) return HKV_OK;
    const int64_t total = n * n_heads * (rot / 2);
    HKV_LAUNCH(k_rope, hkv_grid1(total, MK_THREADS), MK_THREADS, 0, hkv_stream(stream))(
        x, ldx, n, n_heads, head_dim, rot, layout, cs);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_swiglu(const float *gu, int64_t n, int64_t F, float *out, void *stream,
                              hkv_err *err)
{
    if (!gu || !out || n < 0 || F < 1)
        return hkv_seterr(err, HKV_E_INVAL, "gpu swiglu: bad arguments (n %lld, F %lld)",
                          (long long)n, (long long)F);
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_swiglu, hkv_grid1(n * F, MK_THREADS), MK_THREADS, 0, hkv_stream(stream))(
        gu, n, F, out);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_add(float *x, const float *y, int64_t n, void *stream, hkv_err *err)
{
    if (!x || !y || n < 0) return hkv_seterr(err, HKV_E_INVAL, "gpu add: bad arguments");
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_add, hkv_grid1(n, MK_THREADS), MK_THREADS, 0, hkv_stream(stream))(x, y, n);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_f32_to_f16(const float *src, uint16_t *dst, int64_t n, void *stream,
                                  hkv_err *err)
{
    if (!src || !dst || n < 0) return hkv_seterr(err, HKV_E_INVAL, "gpu f32_to_f16: bad arguments");
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_f32_to_f16, hkv_grid1(n, MK_THREADS), MK_THREADS, 0, hkv_stream(stream))(
        src, dst, n);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_f16_to_f32(const uint16_t *src, float *dst, int64_t n, void *stream,
                                  hkv_err *err)
{
    if (!src || !dst || n < 0) return hkv_seterr(err, HKV_E_INVAL, "gpu f16_to_f32: bad arguments");
    if (!n) return HKV_OK;
    HKV_LAUNCH(k_f16_to_f32, hkv_grid1(n, MK_THREADS), MK_THREADS, 0, hkv_stream(stream))(
        src, dst, n);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

/* Window-probability scores on the device: index/window_scores.c's
 * hkv_ws_window_scores (SnapKV, RocketKV stage 1, FastKV, LAQ, SpecKV/SpecPC
 * at prompt end), same semantics, no [window][far] matrix.
 *
 * Pass 1, k_ws_stats: block (key chunk, row r of the W*g window rows, KV
 * head); each thread folds its keys of the chunk into a running (max, sum)
 * over the keys row r sees (position <= pos0 + r/g), the block reduces them
 * into the workspace. k_ws_lse merges a row's chunks in float64 into one
 * log-sum-exp (-inf: the row sees no scored key). Pass 2, k_ws_acc: a
 * thread per scored key recomputes every visible row's score and sums (or
 * maxes) weight * exp(s - lse) into its output. Scores are q.k * (1/sqrt(d))
 * in fp32 from fp16 inputs, as the host's sgemm; the sums differ from the
 * host's only by fp32 rounding order.
 *
 * Both passes score keys a warp tile of 32 at a time (tile_dot.cuh: the warp
 * reads each key row together, coalesced, and a transposing reduction leaves
 * key l's dot product in lane l). Both use the same function with the same
 * lane for a key, so a key's score is bit for bit the same in each. */
#include <math.h>

#include "gpu_internal.cuh"
#include "tile_dot.cuh"

extern "C" {
#include "gpu_kernels.h"
}

#define WS_CHUNK 4096   /* keys per pass-1 block: W*g*KH*(n/4096) blocks */
#define WS_THREADS 256   /* at least two blocks per SM (__launch_bounds__): without the
                           * bound ptxas caps the tile scorer at 64 registers and spills */

static __device__ __forceinline__ int64_t ws_pos(const int32_t *rows, int64_t rows_ld, int h,
                                                 int64_t lo, int64_t i)
{
    return rows ? (int64_t)rows[(int64_t)h * rows_ld + i] : lo + i;
}

/* grid (chunks, W*g, KH): stats[((h*R + r)*chunks + c)*2] = (max, sum). */
static __global__ void __launch_bounds__(WS_THREADS, 2)
k_ws_stats(const uint16_t *q, int64_t ldq, int64_t pos0, int g, int d, const uint16_t *k,
           int64_t ld, int64_t hs, int64_t lo, int64_t n, const int32_t *rows, int64_t rows_ld,
           const int32_t *n_rows, float scale, float *stats)
{
    __shared__ float qs[256];
    __shared__ float red_m[WS_THREADS / 32], red_l[WS_THREADS / 32];
    const int64_t c = blockIdx.x, r = blockIdx.y, chunks = gridDim.x, R = gridDim.y;
    const int h = blockIdx.z;
    const int64_t a = r / g, qpos = pos0 + a;
    const uint16_t *qr = q + a * ldq + ((int64_t)h * g + r % g) * d;
    for (int e = threadIdx.x; e < d; e += blockDim.x) qs[e] = hkv_h2f(qr[e]);
    __syncthreads();
    const int64_t nh = n_rows ? (int64_t)n_rows[h] : n;
    const int64_t x1 = (c + 1) * WS_CHUNK < nh ? (c + 1) * WS_CHUNK : nh;
    const uint16_t *kh = k + h * hs;
    float m = -INFINITY, l = 0.0f;
    const int64_t wbase = c * WS_CHUNK + (threadIdx.x & ~31);   /* this warp's first tile */
    for (int64_t x0 = wbase; x0 < x1; x0 += blockDim.x) {       /* warp-uniform */
        const int64_t x = x0 + (threadIdx.x & 31);
        int64_t p = x < x1 ? ws_pos(rows, rows_ld, h, lo, x) : -1;
        if (p > qpos) p = -1;
        const float s = hkv_tile_dot<4>(qs, kh, ld, p, d) * scale;
        if (p < 0) continue;
        if (s > m) l = l * expf(m - s) + 1.0f, m = s;
        else l += expf(s - m);
    }
    /* warp then block reduction of (m, l) */
    for (int o = 16; o > 0; o >>= 1) {
        const float mo = __shfl_xor_sync(0xffffffffu, m, o), lo2 = __shfl_xor_sync(0xffffffffu, l, o);
        const float mm = fmaxf(m, mo);
        l = (mm == -INFINITY ? 0.0f : l * expf(m - mm) + lo2 * expf(mo - mm));
        m = mm;
    }
    const int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) red_m[w] = m, red_l[w] = l;
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = -INFINITY, L = 0.0f;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) {
            if (!(red_l[i] > 0)) continue;
            const float mm = fmaxf(M, red_m[i]);
            L = L * expf(M - mm) + red_l[i] * expf(red_m[i] - mm);
            M = mm;
        }
        float *o = stats + (((int64_t)h * R + r) * chunks + c) * 2;
        o[0] = M, o[1] = L;
    }
}

/* One thread per (KV head, row r): lse[h*R + r] over the row's chunks, in float64. */
static __global__ void k_ws_lse(const float *stats, int64_t R, int64_t chunks, int KH, float *lse)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (int64_t)KH * R) return;
    double m = -INFINITY, l = 0;
    for (int64_t c = 0; c < chunks; c++) {
        const float *s = stats + (t * chunks + c) * 2;
        if (!(s[1] > 0)) continue;
        const double mi = s[0], li = s[1];
        if (mi > m) l = l * exp(m - mi) + li, m = mi;
        else l += li * exp(mi - m);
    }
    lse[t] = l > 0 ? (float)(m + log(l)) : -INFINITY;
}

/* grid (key blocks, KH): thread per scored key i of head h. */
static __global__ void __launch_bounds__(WS_THREADS, 2)
k_ws_acc(const uint16_t *q, int64_t ldq, int64_t W, int64_t pos0, int g, int d, const uint16_t *k,
         int64_t ld, int64_t hs, int64_t lo, int64_t n, const int32_t *rows, int64_t rows_ld,
         const int32_t *n_rows, float scale, const float *lse, const float *q_weight,
         int reduce_max, float *out, int64_t ld_out)
{
    __shared__ float qs[256];
    const int h = blockIdx.y;
    const int64_t R = W * g, nh = n_rows ? (int64_t)n_rows[h] : n;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = i < nh;
    const int64_t p = live ? ws_pos(rows, rows_ld, h, lo, i) : -1;
    /* the warp's keys are all past the end: it only joins the barriers */
    const bool warp_live = (int64_t)blockIdx.x * blockDim.x + (threadIdx.x & ~31) < nh;
    const uint16_t *kh = k + h * hs;
    float acc = 0.0f;
    for (int64_t r = 0; r < R; r++) {
        const int64_t a = r / g;
        const uint16_t *qr = q + a * ldq + ((int64_t)h * g + r % g) * d;
        __syncthreads();   /* qs of the previous row is no longer read */
        for (int e = threadIdx.x; e < d; e += blockDim.x) qs[e] = hkv_h2f(qr[e]);
        __syncthreads();
        const float L = lse[(int64_t)h * R + r];
        const float wt = q_weight ? q_weight[a] : 1.0f;
        if (!warp_live || !isfinite(L) || wt == 0.0f) continue;   /* warp-uniform */
        const bool seen = live && p <= pos0 + a;
        const float s = hkv_tile_dot<4>(qs, kh, ld, seen ? p : -1, d);
        if (!seen) continue;
        const float v = wt * expf(s * scale - L);
        acc = reduce_max ? fmaxf(acc, v) : acc + v;
    }
    if (live) out[(int64_t)h * ld_out + i] = acc;
}

extern "C" size_t hkv_gpu_window_scores_ws_bytes(int64_t W, int n_head, int64_t n)
{
    if (W < 1 || n_head < 1 || n < 1) return 0;
    const int64_t chunks = (n + WS_CHUNK - 1) / WS_CHUNK;
    return ((size_t)W * n_head * (size_t)chunks * 2 + (size_t)W * n_head) * sizeof(float);
}

extern "C" int hkv_gpu_window_scores(const uint16_t *q, int64_t ldq, int64_t W, int64_t pos0,
                                     int n_head, int n_head_kv, int d, const uint16_t *k,
                                     int64_t ld, int64_t hs, int64_t lo, int64_t n,
                                     const int32_t *rows, int64_t rows_ld, const int32_t *n_rows,
                                     const float *q_weight, int reduce_max, float *out,
                                     int64_t ld_out, void *ws, size_t ws_bytes, void *stream,
                                     hkv_err *err)
{
    if (n_head_kv < 1 || n_head < n_head_kv || n_head % n_head_kv || W < 0 || n < 0 || !k ||
        !out || (W > 0 && !q) || (rows && rows_ld < n) || ld_out < n || lo < 0 ||
        ldq < (int64_t)n_head * d || n_head_kv > 65535 || W * (n_head / n_head_kv) > 65535)
        return hkv_seterr(err, HKV_E_INVAL, "gpu window scores: bad arguments (%lld window rows, "
                          "%d heads over %d KV heads, %lld keys, ld_out %lld)", (long long)W,
                          n_head, n_head_kv, (long long)n, (long long)ld_out);
    if (d < 2 || d > 256 || (d & 1) || ld < d || (ld & 1) || (hs & 1) || ((uintptr_t)k & 3))
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu window scores: needs an even head size up "
                          "to 256 and 4-byte aligned key rows (d=%d, ld=%lld)", d, (long long)ld);
    if (n == 0) return HKV_OK;
    cudaStream_t st = hkv_stream(stream);
    if (W == 0) {   /* no window: every score is 0, as the host's */
        for (int h = 0; h < n_head_kv; h++)
            HKV_CUDA_TRY(err, cudaMemsetAsync(out + (int64_t)h * ld_out, 0, (size_t)n * 4, st));
        return HKV_OK;
    }
    const size_t need = hkv_gpu_window_scores_ws_bytes(W, n_head, n);
    if (!ws || ws_bytes < need)
        return hkv_seterr(err, HKV_E_INVAL, "gpu window scores: workspace of %zu bytes, %zu needed",
                          ws_bytes, need);
    const int g = n_head / n_head_kv;
    const int64_t R = W * g, chunks = (n + WS_CHUNK - 1) / WS_CHUNK;
    float *stats = (float *)ws, *lse = stats + (size_t)n_head_kv * R * chunks * 2;
    const float scale = 1.0f / sqrtf((float)d);
    HKV_LAUNCH(k_ws_stats, dim3((unsigned)chunks, (unsigned)R, (unsigned)n_head_kv), WS_THREADS, 0,
               st)(
        q, ldq, pos0, g, d, k, ld, hs, lo, n, rows, rows_ld, n_rows, scale, stats);
    HKV_LAUNCH_CHECK(err);
    const int64_t nl = (int64_t)n_head_kv * R;
    HKV_LAUNCH(k_ws_lse, (unsigned)((nl + 127) / 128), 128, 0, st)(
        stats, R, chunks, n_head_kv, lse);
    HKV_LAUNCH_CHECK(err);
    HKV_LAUNCH(k_ws_acc, dim3((unsigned)((n + WS_THREADS - 1) / WS_THREADS), (unsigned)n_head_kv),
               WS_THREADS, 0, st)(
        q, ldq, W, pos0, g, d, k, ld, hs, lo, n, rows, rows_ld, n_rows, scale, lse, q_weight,
        reduce_max, out, ld_out);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

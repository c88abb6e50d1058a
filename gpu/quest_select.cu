/* Quest on the device (index/quest.c): the per-page element-wise key
 * max/min as far tokens arrive, and the per-step page selection.
 *
 * Bounds: [n_head_kv][np_cap][2d] fp16, a page's row [max (d) | min (d)],
 * the host's layout, so pages built on either side are interchangeable.
 * Max/min compare fp16 bit patterns mapped to order-preserving integers, as
 * the host does, so the bounds are bit-equal.
 *
 * Select: a thread per (KV head, page) computes the upper bound
 * sum_e max(q_e*max_e, q_e*min_e) = q+ . max + q- . min for each of the
 * group's query heads and keeps the max; hkv_gpu_keep takes the K best
 * pages (ties to the lower page) in ascending order; a last kernel expands
 * pages to token positions. Bounds are fp32 sums in another order than the
 * host's score_max, so pages whose bounds tie within rounding may differ. */
#include <math.h>

#include "gpu_internal.cuh"
#include "tile_dot.cuh"

#define QS_THREADS 256   /* page scores: 8 warp tiles of 32 pages per block */

extern "C" {
#include "gpu_kernels.h"
}

static __device__ __forceinline__ uint16_t q_ord16(uint16_t h)
{
    return (h & 0x8000) ? (uint16_t)~h : (uint16_t)(h | 0x8000);
}

/* grid (pages touched, KH): thread e of page pg0 + blockIdx.x folds the
 * page's positions in [from, to) into element e (a page starting in the
 * range starts from its first key, as the host's first-key copy). */
static __global__ void k_quest_extend(uint16_t *bounds, int64_t np_cap, int d, int64_t P,
                                      const uint16_t *k, int64_t ld, int64_t hs, int64_t lo,
                                      int64_t from, int64_t to, int64_t pg0)
{
    const int h = blockIdx.y;
    const int64_t pg = pg0 + blockIdx.x;
    const int64_t a0 = lo + pg * P, a = a0 > from ? a0 : from, e_end = a0 + P < to ? a0 + P : to;
    uint16_t *mx = bounds + ((int64_t)h * np_cap + pg) * 2 * d, *mn = mx + d;
    const uint16_t *kh = k + h * hs;
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        int64_t p = a;
        uint16_t vmx, vmn;
        if (a == a0) vmx = vmn = kh[p * ld + e], p++;
        else vmx = mx[e], vmn = mn[e];
        for (; p < e_end; p++) {
            const uint16_t v = kh[p * ld + e], o = q_ord16(v);
            if (o > q_ord16(vmx)) vmx = v;
            if (o < q_ord16(vmn)) vmn = v;
        }
        mx[e] = vmx, mn[e] = vmn;
    }
}

/* grid (page blocks, KH): sc[h*np + i] = max over the group of the bound
 * sum_e max(q_e, 0) max_e + min(q_e, 0) min_e. A page's bound row is
 * [max | min], 2d contiguous halves, so the bound is a dot product of that
 * row with [q+ | q-] (staged per group head in shared memory): pages are
 * scored a warp tile of 32 at a time, each row read by the whole warp
 * (tile_dot.cuh) instead of one thread walking it. */
template <int WPL>
static __global__ void __launch_bounds__(QS_THREADS, 2)
k_quest_scores(const uint16_t *bounds, int64_t np_cap, int g, int d, const float *q, int64_t np,
               float *sc)
{
    HKV_DYN_SHARED(float, qpm);   /* [g][2d]: q+ then q- of each group head */
    const int h = blockIdx.y;
    for (int e = threadIdx.x; e < g * d; e += blockDim.x) {
        const float x = q[(int64_t)h * g * d + e];
        const int j = e / d, c = e - j * d;
        qpm[j * 2 * d + c] = x > 0 ? x : 0.0f;
        qpm[j * 2 * d + d + c] = x < 0 ? x : 0.0f;
    }
    __syncthreads();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if ((int64_t)blockIdx.x * blockDim.x + (threadIdx.x & ~31) >= np) return;   /* whole warp */
    const uint16_t *bh = bounds + (int64_t)h * np_cap * 2 * d;
    float best = -INFINITY;
    for (int j = 0; j < g; j++)
        best = fmaxf(best, hkv_tile_dot<WPL>(qpm + j * 2 * d, bh, 2 * (int64_t)d, i < np ? i : -1,
                                             2 * d));
    if (i < np) sc[(int64_t)h * np + i] = best;
}

/* grid (KH): the m chosen pages (ascending) into positions; only the last
 * page of the far tier can be partial, and it sorts last. */
static __global__ void k_quest_expand(const int32_t *sel, int64_t K, const int32_t *n_sel,
                                      int64_t P, int64_t lo, int64_t hi, int32_t *out,
                                      int64_t out_ld, int32_t *n_out)
{
    const int h = blockIdx.x;
    const int64_t m = n_sel[h];
    int32_t *o = out + (int64_t)h * out_ld;
    for (int64_t t = threadIdx.x; t < m * P; t += blockDim.x) {
        const int64_t p = lo + (int64_t)sel[(int64_t)h * K + t / P] * P + t % P;
        if (p < hi) o[t] = (int32_t)p;
    }
    if (threadIdx.x == 0) {
        int64_t c = 0;
        if (m > 0) {
            const int64_t last = lo + (int64_t)sel[(int64_t)h * K + m - 1] * P;
            c = (m - 1) * P + (last + P < hi ? P : hi - last);
        }
        n_out[h] = (int32_t)c;
    }
}

/* The far tier fits the budget: every position. */
static __global__ void k_quest_all(int64_t lo, int64_t n, int32_t *out, int64_t out_ld,
                                   int32_t *n_out)
{
    const int h = blockIdx.x;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[(int64_t)h * out_ld + i] = (int32_t)(lo + i);
    if (threadIdx.x == 0) n_out[h] = (int32_t)n;
}

extern "C" int hkv_gpu_quest_extend(uint16_t *bounds, int64_t np_cap, int n_head_kv, int d,
                                    int64_t P, const uint16_t *k, int64_t ld, int64_t hs,
                                    int64_t lo, int64_t from, int64_t to, void *stream,
                                    hkv_err *err)
{
    if (!bounds || !k || n_head_kv < 1 || n_head_kv > 65535 || d < 1 || P < 1 || lo < 0 ||
        from < lo || to < from || ld < d || to - lo > np_cap * P)
        return hkv_seterr(err, HKV_E_INVAL, "gpu quest extend: bad arguments (far [%lld, %lld) "
                          "from %lld, pages of %lld, %lld pages room, d=%d)", (long long)lo,
                          (long long)to, (long long)from, (long long)P, (long long)np_cap, d);
    if (to == from) return HKV_OK;
    const int64_t pg0 = (from - lo) / P, pg1 = (to - 1 - lo) / P;
    if (pg1 - pg0 + 1 > 2147483647LL)
        return hkv_seterr(err, HKV_E_INVAL, "gpu quest extend: %lld pages in one call",
                          (long long)(pg1 - pg0 + 1));
    dim3 grid((unsigned)(pg1 - pg0 + 1), (unsigned)n_head_kv);
    HKV_LAUNCH(k_quest_extend, grid, d < 256 ? ((d + 31) / 32) * 32 : 256, 0, hkv_stream(stream))(
        bounds, np_cap, d, P, k, ld, hs, lo, from, to, pg0);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_quest_fold(uint16_t *bounds, int64_t np_cap, int n_head_kv, int d, int64_t P,
                                  const uint16_t *k, int64_t hs, int64_t lo, int64_t pos,
                                  void *stream, hkv_err *err)
{
    if (!bounds || !k || n_head_kv < 1 || n_head_kv > 65535 || d < 1 || P < 1 || lo < 0 ||
        pos < lo || pos - lo >= np_cap * P)
        return hkv_seterr(err, HKV_E_INVAL, "gpu quest fold: bad arguments (far position %lld "
                          "from %lld, pages of %lld, %lld pages room, d=%d)", (long long)pos,
                          (long long)lo, (long long)P, (long long)np_cap, d);
    /* extend's kernel over [pos, pos + 1) with a row stride of 0: the one row */
    dim3 grid(1u, (unsigned)n_head_kv);
    HKV_LAUNCH(k_quest_extend, grid, d < 256 ? ((d + 31) / 32) * 32 : 256, 0, hkv_stream(stream))(
        bounds, np_cap, d, P, k, (int64_t)0, hs, lo, pos, pos + 1, (pos - lo) / P);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" size_t hkv_gpu_quest_select_ws_bytes(int n_head_kv, int64_t n_far, int64_t P, int64_t K)
{
    if (n_head_kv < 1 || n_far < 1 || P < 1 || K < 1) return 0;
    const int64_t np = (n_far + P - 1) / P;
    return (size_t)n_head_kv * ((size_t)np * 4 + (size_t)K * 4 + 4);
}

extern "C" int hkv_gpu_quest_select(const uint16_t *bounds, int64_t np_cap, int n_head_kv, int g,
                                    int d, int64_t P, int64_t K, const float *q, int64_t lo,
                                    int64_t hi, int32_t *out, int64_t out_ld, int32_t *n_out,
                                    void *ws, size_t ws_bytes, void *stream, hkv_err *err)
{
    if (!bounds || !q || !out || !n_out || n_head_kv < 1 || n_head_kv > 65535 || g < 1 || d < 1 ||
        P < 1 || K < 1 || lo < 0 || hi < lo || hi > 2147483647 || hi - lo > np_cap * P ||
        out_ld < (hi - lo < K * P ? hi - lo : K * P))
        return hkv_seterr(err, HKV_E_INVAL, "gpu quest select: bad arguments (far [%lld, %lld), "
                          "%lld pages of %lld, out_ld %lld)", (long long)lo, (long long)hi,
                          (long long)K, (long long)P, (long long)out_ld);
    if (d > 256 || (size_t)g * 2 * d * sizeof(float) > 48 * 1024)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu quest select: head size %d x group %d "
                          "(the page scores take head sizes up to 256 and g x 2d floats of "
                          "q in 48 KB of shared memory)", d, g);
    cudaStream_t st = hkv_stream(stream);
    const int64_t n = hi - lo;
    if (n <= K * P) {   /* the budget covers the whole far tier (n may be 0) */
        HKV_LAUNCH(k_quest_all, (unsigned)n_head_kv, 256, 0, st)(lo, n, out, out_ld, n_out);
        HKV_LAUNCH_CHECK(err);
        return HKV_OK;
    }
    const size_t need = hkv_gpu_quest_select_ws_bytes(n_head_kv, n, P, K);
    if (!ws || ws_bytes < need)
        return hkv_seterr(err, HKV_E_INVAL, "gpu quest select: workspace of %zu bytes, %zu needed",
                          ws_bytes, need);
    const int64_t np = (n + P - 1) / P;
    float *sc = (float *)ws;
    int32_t *sel = (int32_t *)(sc + (size_t)n_head_kv * np), *n_sel = sel + (size_t)n_head_kv * K;
    const dim3 grid((unsigned)((np + QS_THREADS - 1) / QS_THREADS), (unsigned)n_head_kv);
    const size_t smem = (size_t)g * 2 * d * sizeof(float);
    if (d <= 128)
        HKV_LAUNCH(k_quest_scores<4>, grid, QS_THREADS, smem, st)(bounds, np_cap, g, d, q, np, sc);
    else
        HKV_LAUNCH(k_quest_scores<8>, grid, QS_THREADS, smem, st)(bounds, np_cap, g, d, q, np, sc);
    HKV_LAUNCH_CHECK(err);
    int rc = hkv_gpu_keep(sc, np, n_head_kv, np, NULL, NULL, 0, 0, K, INT64_MAX, sel, K, n_sel,
                          stream, err);
    if (rc) return hkv_err_prefix(err, "gpu quest select");
    HKV_LAUNCH(k_quest_expand, (unsigned)n_head_kv, 256, 0, st)(
        sel, K, n_sel, P, lo, hi, out, out_ld, n_out);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

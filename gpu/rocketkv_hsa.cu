/* RocketKV stage 2 on the device (index/rocketkv.c's select with rerank=1,
 * the paper's Hybrid Sparse Attention estimate) and the page bounds it reads.
 *
 * Layout as the host's rk_layer: candidate lists int32 [KH][cap] (ascending
 * far positions, n_cand[h] valid), bounds fp16 [KH][2d][pcap] (rows 0..d-1
 * the element-wise max of each page of `page` list entries, rows d..2d-1
 * the min), so a host-built index uploads as is.
 *
 * Per step and KV head (k_hsa_pages, one block): the top `dims` coordinates
 * of sum_j |q_j| (ties to the lower coordinate, hkv_topk's rule), the sign
 * of sum_j q_j picks the max or min row, z_j[p] = q_j[dims] . rows[p],
 * per-head softmax over the list's tokens at SparQ's temperature
 * tau_j = sqrt(d |q_j[dims]|_1 / |q_j|_1) summed over the group into a page
 * score; then every token gets its page's score and hkv_gpu_keep takes the
 * top k (ties to the lower list index), positions ascending. fp32 sums run
 * in another order than the host's, so pages whose scores tie within
 * rounding may swap. */
#include <math.h>

#include "gpu_internal.cuh"

extern "C" {
#include "gpu_kernels.h"
}

#define HSA_THREADS 256

static __device__ __forceinline__ uint16_t r_ord16(uint16_t h)
{
    return (h & 0x8000) ? (uint16_t)~h : (uint16_t)(h | 0x8000);
}

static __device__ __forceinline__ uint32_t r_key(float x)
{
    if (x == 0.0f) x = 0.0f;
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* grid (page blocks, KH): thread per (page, element) of pages >= pg_from. */
static __global__ void k_hsa_bounds(const int32_t *cand, int64_t cap, const int32_t *n_cand,
                                    int d, int64_t page, int64_t pcap, int64_t pg_from,
                                    const uint16_t *k, int64_t ld, int64_t hs, uint16_t *bnd)
{
    const int h = blockIdx.y;
    const int64_t n = n_cand[h], np = (n + page - 1) / page;
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t pg = pg_from + t / d;
    const int e = (int)(t % d);
    if (pg >= np) return;
    const int32_t *c = cand + (int64_t)h * cap;
    const uint16_t *kh = k + h * hs;
    const int64_t i1 = (pg + 1) * page < n ? (pg + 1) * page : n;
    uint16_t mx = kh[(int64_t)c[pg * page] * ld + e], mn = mx;
    for (int64_t i = pg * page + 1; i < i1; i++) {
        const uint16_t v = kh[(int64_t)c[i] * ld + e], o = r_ord16(v);
        if (o > r_ord16(mx)) mx = v;
        if (o < r_ord16(mn)) mn = v;
    }
    uint16_t *b = bnd + (int64_t)h * 2 * d * pcap;
    b[(int64_t)e * pcap + pg] = mx;
    b[(int64_t)(d + e) * pcap + pg] = mn;
}

/* grid KH: far position pos appended to every list, its key row (k + h*hs)
 * folded into the list's last page (a page starting at it afresh), as the
 * host's list_push; a full list is left as it is (the caller sizes cap). */
static __global__ void k_hsa_push(int32_t *cand, int64_t cap, int32_t *n_cand, int d, int64_t page,
                                  int64_t pcap, uint16_t *bnd, const uint16_t *k, int64_t hs,
                                  int32_t pos)
{
    const int h = blockIdx.x;
    const int64_t i = n_cand[h], pg = i / page;
    const bool first = i % page == 0;
    if (i >= cap) return;   /* block-uniform */
    uint16_t *mx = bnd + (int64_t)h * 2 * d * pcap + pg, *mn = mx + (int64_t)d * pcap;
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        const uint16_t v = k[(int64_t)h * hs + e], o = r_ord16(v);
        uint16_t *a = mx + (int64_t)e * pcap, *b = mn + (int64_t)e * pcap;
        if (first || o > r_ord16(*a)) *a = v;
        if (first || o < r_ord16(*b)) *b = v;
    }
    __syncthreads();   /* every thread has read n_cand[h] */
    if (threadIdx.x == 0) {
        cand[(int64_t)h * cap + i] = pos;
        n_cand[h] = (int32_t)(i + 1);
    }
}

/* Block reductions over HSA_THREADS threads (red holds HSA_THREADS / 32). */
static __device__ float blk_max(float x, float *red)
{
    x = hkv_warp_max(x);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    float m = -INFINITY;
    for (int i = 0; i < HSA_THREADS / 32; i++) m = fmaxf(m, red[i]);
    __syncthreads();
    return m;
}
static __device__ double blk_sum_d(double x, double *red)
{
    x = hkv_warp_sum_d(x);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < HSA_THREADS / 32; i++) s += red[i];
    __syncthreads();
    return s;
}

/* One block per KV head: page scores S [KH][np_ld], per-head z in zw [KH][g][np_ld]. */
static __global__ void __launch_bounds__(HSA_THREADS)
k_hsa_pages(const uint16_t *bnd, int64_t pcap, const int32_t *n_cand, int g, int d, int64_t page,
            int64_t dims, const float *q, float *zw, float *S, int64_t np_ld)
{
    __shared__ float a[256];
    __shared__ int dim_c[256], dim_row[256];
    __shared__ float tau[64];
    __shared__ float redf[HSA_THREADS / 32];
    __shared__ double redd[HSA_THREADS / 32];
    __shared__ int m1_s;
    const int h = blockIdx.x;
    const int64_t n = n_cand[h], np = (n + page - 1) / page, last = n - (np - 1) * page;
    const float *qh = q + (int64_t)h * g * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = 0;
        for (int j = 0; j < g; j++) v += fabsf(qh[j * d + c]);
        a[c] = v;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < d; c += blockDim.x) {   /* rank of each coordinate */
        const uint32_t kc = r_key(a[c]);
        int rank = 0;
        for (int c2 = 0; c2 < d; c2++) {
            const uint32_t k2 = r_key(a[c2]);
            rank += k2 > kc || (k2 == kc && c2 < c);
        }
        dim_row[c] = rank;
    }
    __syncthreads();
    if (threadIdx.x == 0) {   /* the top dims coordinates, in coordinate order */
        int m1 = 0;
        for (int c = 0; c < d; c++) {
            if (dim_row[c] < dims) {   /* m1 <= c: overwrites only ranks already read */
                float sg = 0;
                for (int j = 0; j < g; j++) sg += qh[j * d + c];
                dim_c[m1] = c;
                dim_row[m1] = sg > 0 ? c : d + c;   /* q > 0 meets the max, else the min */
                m1++;
            }
        }
        m1_s = m1;
        for (int j = 0; j < g; j++) {
            double part = 0, all = 0;
            for (int t = 0; t < m1; t++) part += fabsf(qh[j * d + dim_c[t]]);
            for (int c = 0; c < d; c++) all += fabsf(qh[j * d + c]);
            tau[j] = part > 0 && all > 0 ? (float)sqrt((double)d * part / all) : 1.0f;
        }
    }
    __syncthreads();
    const int m1 = m1_s;
    const uint16_t *b = bnd + (int64_t)h * 2 * d * pcap;
    float *z = zw + (int64_t)h * g * np_ld, *Sh = S + (int64_t)h * np_ld;
    for (int64_t p = threadIdx.x; p < np; p += blockDim.x) {
        Sh[p] = 0.0f;
        for (int j = 0; j < g; j++) {
            float acc = 0.0f;
            for (int t = 0; t < m1; t++) acc += qh[j * d + dim_c[t]] * hkv_h2f(b[(int64_t)dim_row[t] * pcap + p]);
            z[(int64_t)j * np_ld + p] = acc;
        }
    }
    __syncthreads();
    for (int j = 0; j < g; j++) {
        const float *zj = z + (int64_t)j * np_ld;
        float mx = -INFINITY;
        for (int64_t p = threadIdx.x; p < np; p += blockDim.x) mx = fmaxf(mx, zj[p]);
        mx = blk_max(mx, redf);
        double Z = 0;
        for (int64_t p = threadIdx.x; p < np; p += blockDim.x)
            Z += (double)expf((zj[p] - mx) / tau[j]) * (double)(p == np - 1 ? last : page);
        Z = blk_sum_d(Z, redd);
        const float inv = (float)(1.0 / Z);
        for (int64_t p = threadIdx.x; p < np; p += blockDim.x)
            Sh[p] += expf((zj[p] - mx) / tau[j]) * inv;   /* the thread owns p across j */
    }
}

/* ts[h][x] = S[h][x / page], x < n_cand[h]. */
static __global__ void k_hsa_tokens(const float *S, int64_t np_ld, const int32_t *n_cand,
                                    int64_t page, float *ts, int64_t ts_ld)
{
    const int h = blockIdx.y;
    const int64_t n = n_cand[h];
    for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < n;
         x += (int64_t)gridDim.x * blockDim.x)
        ts[(int64_t)h * ts_ld + x] = S[(int64_t)h * np_ld + x / page];
}

extern "C" int hkv_gpu_rocketkv_bounds(const int32_t *cand, int64_t cap, const int32_t *n_cand,
                                       int n_head_kv, int d, int64_t page, int64_t pcap,
                                       int64_t pg_from, const uint16_t *k, int64_t ld, int64_t hs,
                                       uint16_t *bnd, void *stream, hkv_err *err)
{
    if (!cand || !n_cand || !k || !bnd || n_head_kv < 1 || n_head_kv > 65535 || d < 1 ||
        page < 1 || cap < 1 || pcap < (cap + page - 1) / page || pg_from < 0 || ld < d)
        return hkv_seterr(err, HKV_E_INVAL, "gpu rocketkv bounds: bad arguments (lists of %lld, "
                          "pages of %lld, %lld page columns, d=%d)", (long long)cap,
                          (long long)page, (long long)pcap, d);
    const int64_t np = (cap + page - 1) / page;
    if (pg_from >= np) return HKV_OK;
    const int64_t items = (np - pg_from) * d;
    dim3 grid(hkv_grid1(items, 256), (unsigned)n_head_kv);
    if ((int64_t)grid.x * 256 < items)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu rocketkv bounds: %lld page elements in one "
                          "call", (long long)items);
    HKV_LAUNCH(k_hsa_bounds, grid, 256, 0, hkv_stream(stream))(
        cand, cap, n_cand, d, page, pcap, pg_from, k, ld, hs, bnd);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" int hkv_gpu_rocketkv_push(int32_t *cand, int64_t cap, int32_t *n_cand, int n_head_kv,
                                     int d, int64_t page, int64_t pcap, uint16_t *bnd,
                                     const uint16_t *k, int64_t hs, int64_t pos, void *stream,
                                     hkv_err *err)
{
    if (!cand || !n_cand || !bnd || !k || n_head_kv < 1 || n_head_kv > 65535 || d < 1 ||
        page < 1 || cap < 1 || pcap < cap / page + 1 || pos < 0 || pos > 2147483647)
        return hkv_seterr(err, HKV_E_INVAL, "gpu rocketkv push: bad arguments (lists of %lld, "
                          "pages of %lld, %lld page columns, d=%d, position %lld)", (long long)cap,
                          (long long)page, (long long)pcap, d, (long long)pos);
    HKV_LAUNCH(k_hsa_push, (unsigned)n_head_kv, d < 256 ? 32 * ((d + 31) / 32) : 256, 0,
               hkv_stream(stream))(cand, cap, n_cand, d, page, pcap, bnd, k, hs, (int32_t)pos);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

extern "C" size_t hkv_gpu_rocketkv_hsa_ws_bytes(int n_head_kv, int g, int64_t cap, int64_t page)
{
    if (n_head_kv < 1 || g < 1 || cap < 1 || page < 1) return 0;
    const int64_t np = (cap + page - 1) / page;
    return (size_t)n_head_kv * ((size_t)(g + 1) * np + (size_t)cap) * sizeof(float);
}

extern "C" int hkv_gpu_rocketkv_hsa(const uint16_t *bnd, int64_t pcap, const int32_t *cand,
                                    int64_t cap, const int32_t *n_cand, int n_head_kv, int g,
                                    int d, int64_t page, int64_t dims, int64_t k, const float *q,
                                    int32_t *out, int64_t out_ld, int32_t *n_out, void *ws,
                                    size_t ws_bytes, void *stream, hkv_err *err)
{
    if (!bnd || !cand || !n_cand || !q || !out || !n_out || n_head_kv < 1 ||
        n_head_kv > 65535 || g < 1 || g > 64 || d < 1 || d > 256 || page < 1 || cap < 1 ||
        pcap < (cap + page - 1) / page || dims < 1 || k < 1 || out_ld < (k < cap ? k : cap) ||
        cap > 2147483647)
        return hkv_seterr(err, HKV_E_INVAL, "gpu rocketkv hsa: bad arguments (lists of %lld, "
                          "pages of %lld, dims %lld, k %lld, group %d, d=%d up to 256)",
                          (long long)cap, (long long)page, (long long)dims, (long long)k, g, d);
    const size_t need = hkv_gpu_rocketkv_hsa_ws_bytes(n_head_kv, g, cap, page);
    if (!ws || ws_bytes < need)
        return hkv_seterr(err, HKV_E_INVAL, "gpu rocketkv hsa: workspace of %zu bytes, %zu needed",
                          ws_bytes, need);
    cudaStream_t st = hkv_stream(stream);
    const int64_t np = (cap + page - 1) / page;
    float *zw = (float *)ws, *S = zw + (size_t)n_head_kv * g * np, *ts = S + (size_t)n_head_kv * np;
    HKV_LAUNCH(k_hsa_pages, (unsigned)n_head_kv, HSA_THREADS, 0, st)(
        bnd, pcap, n_cand, g, d, page, dims, q, zw, S, np);
    HKV_LAUNCH_CHECK(err);
    dim3 grid(hkv_grid1(cap, 256) > 4096 ? 4096u : hkv_grid1(cap, 256), (unsigned)n_head_kv);
    HKV_LAUNCH(k_hsa_tokens, grid, 256, 0, st)(S, np, n_cand, page, ts, cap);
    HKV_LAUNCH_CHECK(err);
    /* lists within k come back whole (ascending, as the host's copy) */
    int rc = hkv_gpu_keep(ts, cap, n_head_kv, cap, n_cand, cand, cap, 0, k, INT64_MAX, out, out_ld,
                          n_out, stream, err);
    return rc ? hkv_err_prefix(err, "gpu rocketkv hsa") : HKV_OK;
}

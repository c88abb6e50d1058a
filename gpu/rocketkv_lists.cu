/* RocketKV's candidate lists on the device (index/rocketkv.c's layout):
 * their page bounds built from the keys, and a far token pushed onto every
 * list with its key folded into the last page. The stage-2 estimate that
 * reads them is rocketkv_hsa.cu.
 *
 * Layout as the host's rk_layer: candidate lists int32 [KH][cap] (ascending
 * far positions, n_cand[h] valid), bounds fp16 [KH][2d][pcap] (rows 0..d-1
 * the element-wise max of each page of `page` list entries, rows d..2d-1
 * the min), so a host-built index uploads as is. */
#include "gpu_internal.cuh"

extern "C" {
#include "gpu_kernels.h"
}

static __device__ __forceinline__ uint16_t r_ord16(uint16_t h)
{
    return (h & 0x8000) ? (uint16_t)~h : (uint16_t)(h | 0x8000);
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

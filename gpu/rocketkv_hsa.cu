/* RocketKV stage 2 on the device (index/rocketkv.c's select with rerank=1,
 * the paper's Hybrid Sparse Attention estimate) over the candidate lists
 * and page bounds of rocketkv_lists.cu (same layout).
 *
 * Per step and KV head: the top `dims` coordinates of sum_j |q_j| (ties to
 * the lower coordinate, hkv_topk's rule), the sign of sum_j q_j picks the
 * max or min row, z_j[p] = q_j[dims] . rows[p], per-head softmax over the
 * list's tokens at SparQ's temperature tau_j = sqrt(d |q_j[dims]|_1 /
 * |q_j|_1) summed over the group into a page score; the top k tokens by
 * their page's score (ties to the lower list index), positions ascending.
 *
 * Two kernels, both sized for a batch-1 step's latency (one block per KV
 * head left 124 of an H100's 132 SMs idle and ran the dims and tau loops
 * on one thread):
 *  - k_hsa_z, grid (blocks of HZ_PAGES pages, KH): each block redoes the
 *    head's dims and tau (q is 2 KB; cheaper than a launch), z for its
 *    pages (HZ_SLICES threads a page, each a slice of the dims), and its
 *    (max, sum exp) per query head: the softmax's partials;
 *  - k_hsa_keep, one block per KV head: merges the partials into each
 *    head's max and sum, page scores into shared memory, then keep_core's
 *    top k with the page as the item (no per-token score array).
 * fp32 sums run in another order than the host's, so pages whose scores
 * tie within rounding may swap.
 *
 * PREDICTION (data sheet: H100 3.35 TB/s, ~2 us a launch in a stream;
 * Llama-3-8B 8K, KH 8, g 4, d 128, n 5261, page 2, dims 100, k 1024):
 * k_hsa_z reads the chosen bound rows once, 8 x 100 x 2631 x 2 B = 4.2 MB,
 * 1.3 us at the sheet's bandwidth, ~3-4 us with its blocks' latency;
 * k_hsa_keep ~4-6 us; ~10-12 us a layer with the two launches, against
 * ~700 us for the one-block-per-head kernels. MEASURED on an H100
 * (bench kernels --only policy, 2026-11-27): z 15.0 us, keep 22.7 us
 * (7 us of it the merge and page scores), 39.1 us a layer both (156.5 us
 * for 4 sequences): latency-bound still, each block a chain of dependent
 * steps (a 32-wide-page z geometry measured 21 us, worse). */
#include <math.h>

#include "gpu_internal.cuh"
#include "keep_core.cuh"

extern "C" {
#include "gpu_kernels.h"
}

#define HZ_PAGES 64                          /* pages per z block */
#define HZ_SLICES 4                          /* threads per page: dims split four ways */
#define HZ_THREADS (HZ_PAGES * HZ_SLICES)    /* >= d (256): a thread per coordinate */
#define HZ_JC (HZ_THREADS / 32)              /* query heads per pass: a warp each for the stats */
#define HK_THREADS 1024
#define HK_SMEM_PAGES 8192                   /* page scores in shared memory up to here (32 KB) */
#define HSA_GMAX 64                          /* the group's bound */

static __device__ __forceinline__ uint32_t r_key(float x)
{
    if (x == 0.0f) x = 0.0f;
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* grid (page blocks, KH). Workspace: z [KH][g][np_ld], per block b the
 * partials pm (max) / ps (sum of exp((z - max) / tau) x tokens) at
 * [(h*nzb_ld + b)*g + j], tau [KH][HSA_GMAX] (block 0). */
static __global__ void __launch_bounds__(HZ_THREADS)
k_hsa_z(const uint16_t *bnd, int64_t pcap, const int32_t *n_cand, int g, int d, int64_t page,
        int64_t dims, int64_t k, const float *q, float *zw, int64_t np_ld, float *pm, double *ps,
        int64_t nzb_ld, float *tau_out)
{
    __shared__ float a_s[HZ_THREADS], tau_s[HSA_GMAX];
    __shared__ int on_s[HZ_THREADS], dim_c[HZ_THREADS], dim_row[HZ_THREADS], wcnt[HZ_THREADS / 32];
    __shared__ float qs[HZ_JC][HZ_THREADS];
    __shared__ float part[HZ_SLICES][HZ_JC][HZ_PAGES];
    const int h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int64_t n = n_cand[h], np = (n + page - 1) / page, p0 = (int64_t)blockIdx.x * HZ_PAGES;
    if (n <= k || p0 >= np) return;   /* block-uniform: a list within k comes back whole */
    const int64_t last = n - (np - 1) * page;
    const float *qh = q + (int64_t)h * g * d;
    int row = 0;
    bool on = false;
    if (tid < d) {
        float v = 0, sg = 0;
        for (int j = 0; j < g; j++) {
            const float x = qh[j * d + tid];
            v += fabsf(x), sg += x;
        }
        a_s[tid] = v;
        row = sg > 0 ? tid : d + tid;   /* q > 0 meets the max, else the min */
    }
    __syncthreads();
    if (tid < d) {   /* rank among the coordinates: on when in the top dims */
        const uint32_t kc = r_key(a_s[tid]);
        int rank = 0;
        for (int c2 = 0; c2 < d; c2++) {
            const uint32_t k2 = r_key(a_s[c2]);
            rank += k2 > kc || (k2 == kc && c2 < tid);
        }
        on = rank < dims;
    }
    const unsigned bal = __ballot_sync(0xffffffffu, on);   /* chosen ones in coordinate order */
    if (lane == 0) wcnt[w] = __popc(bal);
    on_s[tid] = on;
    __syncthreads();
    int m1 = 0, before = 0;
    for (int i = 0; i < HZ_THREADS / 32; i++) {
        if (i < w) before += wcnt[i];
        m1 += wcnt[i];
    }
    if (on) {
        const int t = before + __popc(bal & ((1u << lane) - 1u));
        dim_c[t] = tid, dim_row[t] = row;
    }
    for (int j = w; j < g; j += HZ_THREADS / 32) {   /* tau: a warp per query head */
        double pa = 0, al = 0;
        for (int c = lane; c < d; c += 32) {
            const double x = fabsf(qh[j * d + c]);
            al += x;
            if (on_s[c]) pa += x;
        }
        pa = hkv_warp_sum_d(pa), al = hkv_warp_sum_d(al);
        if (lane == 0) tau_s[j] = pa > 0 && al > 0 ? (float)sqrt((double)d * pa / al) : 1.0f;
    }
    const int pl = tid % HZ_PAGES, sl = tid / HZ_PAGES;
    const int64_t p = p0 + pl;
    const uint16_t *b = bnd + (int64_t)h * 2 * d * pcap + p;
    for (int j0 = 0; j0 < g; j0 += HZ_JC) {
        const int jn = g - j0 < HZ_JC ? g - j0 : HZ_JC;
        __syncthreads();   /* dims, tau ready; the last pass's qs and part read */
        for (int i = tid; i < HZ_JC * m1; i += HZ_THREADS) {
            const int jj = i / m1, t = i % m1;
            qs[jj][t] = jj < jn ? qh[(j0 + jj) * d + dim_c[t]] : 0.0f;
        }
        __syncthreads();
        float acc[HZ_JC];
#pragma unroll
        for (int jj = 0; jj < HZ_JC; jj++) acc[jj] = 0.0f;
        if (p < np) {
#pragma unroll 4
            for (int t = sl; t < m1; t += HZ_SLICES) {
                const float bv = hkv_h2f(b[(int64_t)dim_row[t] * pcap]);
#pragma unroll
                for (int jj = 0; jj < HZ_JC; jj++) acc[jj] += qs[jj][t] * bv;
            }
        }
#pragma unroll
        for (int jj = 0; jj < HZ_JC; jj++) part[sl][jj][pl] = acc[jj];
        __syncthreads();
        if (w < jn) {   /* warp w: query head j0 + w over the block's pages */
            const int j = j0 + w;
            const float tau = tau_s[j];
            float zr[HZ_PAGES / 32], mx = -INFINITY;
#pragma unroll
            for (int r = 0; r < HZ_PAGES / 32; r++) {
                const int pp = lane + 32 * r;
                float z = 0.0f;
                for (int s = 0; s < HZ_SLICES; s++) z += part[s][w][pp];
                zr[r] = p0 + pp < np ? z : -INFINITY;
                if (p0 + pp < np) zw[((int64_t)h * g + j) * np_ld + p0 + pp] = z;
                mx = fmaxf(mx, zr[r]);
            }
            mx = hkv_warp_max(mx);
            double sum = 0;
#pragma unroll
            for (int r = 0; r < HZ_PAGES / 32; r++) {
                const int64_t pp = p0 + lane + 32 * r;
                if (pp < np) sum += (double)expf((zr[r] - mx) / tau) * (double)(pp == np - 1 ? last : page);
            }
            sum = hkv_warp_sum_d(sum);
            if (lane == 0) {
                pm[((int64_t)h * nzb_ld + blockIdx.x) * g + j] = mx;
                ps[((int64_t)h * nzb_ld + blockIdx.x) * g + j] = sum;
            }
        }
    }
    if (blockIdx.x == 0 && tid < g) tau_out[h * HSA_GMAX + tid] = tau_s[tid];
}

/* One block per KV head: the head's softmax from the partials, the page
 * scores (shared memory, or S [KH][np_ld] when smem is 0), the top k. */
static __global__ void __launch_bounds__(HK_THREADS, 1)
k_hsa_keep(const float *zw, int64_t np_ld, const float *pm, const double *ps, int64_t nzb_ld,
           const float *tau_in, const int32_t *cand, int64_t cap, const int32_t *n_cand, int g,
           int64_t page, int64_t k, int smem, float *S_g, int32_t *out, int64_t out_ld,
           int32_t *n_out)
{
    HKV_DYN_SHARED(float, S_s);
    __shared__ float mx_s[HSA_GMAX], inv_s[HSA_GMAX], tau_s[HSA_GMAX];
    const int h = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int64_t n = n_cand[h], np = (n + page - 1) / page, nzb = (np + HZ_PAGES - 1) / HZ_PAGES;
    const int32_t *c = cand + (int64_t)h * cap;
    int32_t *o = out + (int64_t)h * out_ld;
    if (threadIdx.x == 0) n_out[h] = (int32_t)(n < k ? n : k);
    if (n <= k) {   /* block-uniform: the list whole (ascending, as the host's copy) */
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = c[i];
        return;
    }
    for (int j = w; j < g; j += HK_THREADS / 32) {   /* a warp per query head merges its partials */
        const float *mj = pm + (int64_t)h * nzb_ld * g + j;
        const double *sj = ps + (int64_t)h * nzb_ld * g + j;
        const float tau = tau_in[h * HSA_GMAX + j];
        float mx = -INFINITY;
        for (int64_t b = lane; b < nzb; b += 32) mx = fmaxf(mx, mj[b * g]);
        mx = hkv_warp_max(mx);
        double Z = 0;
        for (int64_t b = lane; b < nzb; b += 32) Z += sj[b * g] * (double)expf((mj[b * g] - mx) / tau);
        Z = hkv_warp_sum_d(Z);
        if (lane == 0) mx_s[j] = mx, inv_s[j] = (float)(1.0 / Z), tau_s[j] = tau;
    }
    __syncthreads();
    float *S = smem ? S_s : S_g + (int64_t)h * np_ld;
    const float *z = zw + (int64_t)h * g * np_ld;
    for (int64_t p = threadIdx.x; p < np; p += blockDim.x) {
        float v = 0.0f;
        for (int j = 0; j < g; j++) v += expf((z[(int64_t)j * np_ld + p] - mx_s[j]) / tau_s[j]) * inv_s[j];
        S[p] = v;
    }
    __syncthreads();   /* S (shared or global) visible to the block */
    kc_keep(S, np, page, n, c, 0, k, INT64_MAX, o);
}

/* Workspace pieces for lists of cap entries in pages of `page`. */
typedef struct hsa_ws {
    double *ps;
    float *pm, *tau, *zw, *S;
    int64_t np, nzb;
    size_t bytes;
} hsa_ws;

static hsa_ws hsa_layout(void *ws, int n_head_kv, int g, int64_t cap, int64_t page)
{
    hsa_ws l;
    l.np = (cap + page - 1) / page, l.nzb = (l.np + HZ_PAGES - 1) / HZ_PAGES;
    const size_t KH = (size_t)n_head_kv, part = KH * (size_t)l.nzb * g;
    char *p = (char *)ws;   /* the doubles first: ws is the allocator's alignment */
    l.ps = (double *)p, p += part * sizeof(double);
    l.pm = (float *)p, p += part * sizeof(float);
    l.tau = (float *)p, p += KH * HSA_GMAX * sizeof(float);
    l.zw = (float *)p, p += KH * g * (size_t)l.np * sizeof(float);
    l.S = (float *)p, p += l.np > HK_SMEM_PAGES ? KH * (size_t)l.np * sizeof(float) : 0;
    l.bytes = (size_t)(p - (char *)ws);
    return l;
}

extern "C" size_t hkv_gpu_rocketkv_hsa_ws_bytes(int n_head_kv, int g, int64_t cap, int64_t page)
{
    if (n_head_kv < 1 || g < 1 || cap < 1 || page < 1) return 0;
    return hsa_layout(NULL, n_head_kv, g, cap, page).bytes;
}

extern "C" int hkv_gpu_rocketkv_hsa_part(const uint16_t *bnd, int64_t pcap, const int32_t *cand,
                                         int64_t cap, const int32_t *n_cand, int n_head_kv, int g,
                                         int d, int64_t page, int64_t dims, int64_t k,
                                         const float *q, int32_t *out, int64_t out_ld,
                                         int32_t *n_out, void *ws, size_t ws_bytes, int part,
                                         void *stream, hkv_err *err)
{
    if (!bnd || !cand || !n_cand || !q || !out || !n_out || n_head_kv < 1 ||
        n_head_kv > 65535 || g < 1 || g > HSA_GMAX || d < 1 || d > HZ_THREADS || page < 1 ||
        cap < 1 || pcap < (cap + page - 1) / page || dims < 1 || k < 1 ||
        out_ld < (k < cap ? k : cap) || cap > 2147483647 || part < 1 || part > 3)
        return hkv_seterr(err, HKV_E_INVAL, "gpu rocketkv hsa: bad arguments (lists of %lld, "
                          "pages of %lld, dims %lld, k %lld, group %d up to 64, d=%d up to 256)",
                          (long long)cap, (long long)page, (long long)dims, (long long)k, g, d);
    const size_t need = hkv_gpu_rocketkv_hsa_ws_bytes(n_head_kv, g, cap, page);
    if (!ws || ws_bytes < need)
        return hkv_seterr(err, HKV_E_INVAL, "gpu rocketkv hsa: workspace of %zu bytes, %zu needed",
                          ws_bytes, need);
    cudaStream_t st = hkv_stream(stream);
    const hsa_ws l = hsa_layout(ws, n_head_kv, g, cap, page);
    if (part & 1) {
        if (l.nzb > 2147483647)
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu rocketkv hsa: %lld pages", (long long)l.np);
        HKV_LAUNCH(k_hsa_z, dim3((unsigned)l.nzb, (unsigned)n_head_kv), HZ_THREADS, 0, st)(
            bnd, pcap, n_cand, g, d, page, dims, k, q, l.zw, l.np, l.pm, l.ps, l.nzb, l.tau);
        HKV_LAUNCH_CHECK(err);
    }
    if (part & 2) {
        const int smem = l.np <= HK_SMEM_PAGES;
        HKV_LAUNCH(k_hsa_keep, (unsigned)n_head_kv, HK_THREADS, smem ? (size_t)l.np * sizeof(float) : 0,
                   st)(l.zw, l.np, l.pm, l.ps, l.nzb, l.tau, cand, cap, n_cand, g, page, k, smem, l.S,
                       out, out_ld, n_out);
        HKV_LAUNCH_CHECK(err);
    }
    return HKV_OK;
}

extern "C" int hkv_gpu_rocketkv_hsa(const uint16_t *bnd, int64_t pcap, const int32_t *cand,
                                    int64_t cap, const int32_t *n_cand, int n_head_kv, int g,
                                    int d, int64_t page, int64_t dims, int64_t k, const float *q,
                                    int32_t *out, int64_t out_ld, int32_t *n_out, void *ws,
                                    size_t ws_bytes, void *stream, hkv_err *err)
{
    return hkv_gpu_rocketkv_hsa_part(bnd, pcap, cand, cap, n_cand, n_head_kv, g, d, page, dims, k,
                                     q, out, out_ld, n_out, ws, ws_bytes, 3, stream, err);
}

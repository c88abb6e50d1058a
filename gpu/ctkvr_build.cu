/* CTKVR index build at prompt end on the device (index/ctkvr_build.c's
 * hkv_ctkvr_build_lists and the centroid store of hkv_ctkvr_prefill_end).
 *
 * For KV head h and a block of cb centroids: the group max of q_i,j . k_p
 * for every far key p goes into a [cb][n_far] fp32 workspace, on tensor
 * cores where they run (ctkvr_scores_mma.cu), else by k_build_scores here
 * (CUDA cores: tiles of 64 keys and up to 4 centroids staged in shared
 * memory as fp16, every head size and 4-byte alignment); then
 * k_build_select, one block per centroid, finds the rho-th largest score by
 * a 4-pass 8-bit radix select on order-preserving integer keys and
 * writes the rho best positions: all keys above that value, then the ties
 * in increasing position (the host's tie rule). cb is what the caller's
 * workspace holds, so memory is cb * n_far * 4 bytes: scores of all n
 * centroids over a 128K-token far tier never exist at once. */
#include <math.h>

#include "gpu_internal.cuh"

extern "C" {
#include "gpu_kernels.h"
}

#define BK 64            /* keys per score tile */
#define SEL_THREADS 256
#define SMEM_MAX (48 * 1024)

/* Unit-norm fp16 centroids: warp per (row i, query head), as hkv_ctkvr_store_unit. */
static __global__ void k_build_cent(const uint16_t *q, int64_t ldq, int64_t n, int H, int KH, int d,
                             int64_t C, const int32_t *slot, uint16_t *cent, int64_t s)
{
    const int64_t i = blockIdx.x;
    const int h = blockIdx.y, g = H / KH, lane = threadIdx.x & 31;
    const int64_t sl = slot[(int64_t)h * n + i];
    for (int j = threadIdx.x >> 5; j < g; j += blockDim.x >> 5) {
        const int64_t qh = (int64_t)h * g + j;
        const uint16_t *x = q + i * ldq + qh * d;
        double ss = 0;
        for (int e = lane; e < d; e += 32) {
            const double v = hkv_h2f(x[e]);
            ss += v * v;
        }
        ss = hkv_warp_sum_d(ss);
        const float r = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        uint16_t *c = cent + ((s * C + sl) * H + qh) * d;
        for (int e = lane; e < d; e += 32) c[e] = hkv_f2h(hkv_h2f(x[e]) * r);
    }
}

/* Thread t: key t % BK of the tile, centroid t / BK of the block's ct. Keys
 * in shared memory padded to d/2 + 1 words per row (odd: conflict-free). */
static __global__ void k_build_scores(const uint16_t *q, int64_t ldq, int64_t i0, int64_t nc, int g,
                               int d, int h, const uint16_t *k, int64_t ld, int64_t lo,
                               int64_t nfar, int ct, float *scores)
{
    HKV_DYN_SHARED(uint32_t, bs_smem);
    const int dh = d / 2, kstr = dh + 1, gdh = g * dh;
    uint32_t *qs = bs_smem;               /* [ct][g*dh] */
    uint32_t *ks = qs + ct * gdh;         /* [BK][kstr] */
    const int64_t p0 = (int64_t)blockIdx.x * BK, c0 = (int64_t)blockIdx.y * ct;
    for (int w = threadIdx.x; w < ct * gdh; w += blockDim.x) {
        const int c = w / gdh, e = w - c * gdh;
        const int64_t i = c0 + c;
        qs[w] = i < nc ? ((const uint32_t *)(q + (i0 + i) * ldq + (int64_t)h * g * d))[e] : 0u;
    }
    for (int w = threadIdx.x; w < BK * dh; w += blockDim.x) {
        const int j = w / dh, e = w - j * dh;
        const int64_t p = p0 + j;
        ks[j * kstr + e] = p < nfar ? ((const uint32_t *)(k + (lo + p) * ld))[e] : 0u;
    }
    __syncthreads();
    const int j = threadIdx.x % BK, c = threadIdx.x / BK;
    const int64_t p = p0 + j, i = c0 + c;
    if (p >= nfar || i >= nc) return;
    const uint32_t *kr = ks + j * kstr;
    float best = -INFINITY;
    for (int hj = 0; hj < g; hj++) {
        const uint32_t *qr = qs + c * gdh + hj * dh;
        float a = 0.0f;
        for (int e = 0; e < dh; e++) {
            const float2 kf = __half22float2(*reinterpret_cast<const __half2 *>(kr + e));
            const float2 qf = __half22float2(*reinterpret_cast<const __half2 *>(qr + e));
            a = fmaf(qf.x, kf.x, a);
            a = fmaf(qf.y, kf.y, a);
        }
        best = fmaxf(best, a);
    }
    scores[i * nfar + p] = best;
}

/* Order-preserving map float -> uint32 (larger float, larger key; -0 = +0). */
static __device__ __forceinline__ uint32_t sel_key(float x)
{
    if (x == 0.0f) x = 0.0f;
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __global__ void __launch_bounds__(SEL_THREADS)
k_build_select(const float *scores, int64_t nfar, int64_t lo, int64_t rho, int64_t i0, int64_t n,
               int h, const int32_t *slot, int32_t *ivf, int32_t *len, int64_t list0)
{
    __shared__ uint32_t hist[256];
    __shared__ uint32_t prefix_s, mask_s;
    __shared__ int64_t krem_s;
    __shared__ int64_t n_gt;
    __shared__ int wcount[SEL_THREADS / 32];
    const int64_t c = blockIdx.x;
    const float *row = scores + c * nfar;
    const int64_t sl = slot[(int64_t)h * n + i0 + c];
    int32_t *dst = ivf + (list0 + sl) * rho;
    if (threadIdx.x == 0) prefix_s = 0, mask_s = 0, krem_s = rho, n_gt = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = prefix_s, mask = mask_s;
        for (int64_t p = threadIdx.x; p < nfar; p += blockDim.x) {
            const uint32_t u = sel_key(row[p]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {   /* the bin holding the krem-th largest among the matches */
            int64_t cum = 0;
            for (int b = 255; b >= 0; b--) {
                if (cum + hist[b] >= krem_s) {
                    prefix_s = prefix | ((uint32_t)b << shift);
                    mask_s = mask | (255u << shift);
                    krem_s -= cum;
                    break;
                }
                cum += hist[b];
            }
        }
        __syncthreads();
    }
    const uint32_t T = prefix_s;     /* key of the rho-th best score */
    const int64_t ties = krem_s;     /* how many keys equal to T make the list */
    for (int64_t p = threadIdx.x; p < nfar; p += blockDim.x)
        if (sel_key(row[p]) > T) {
            const unsigned long long o = atomicAdd((unsigned long long *)&n_gt, 1ull);
            dst[o] = (int32_t)(lo + p);
        }
    __syncthreads();
    const int64_t base_out = n_gt;   /* = rho - ties */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int64_t taken = 0;
    for (int64_t b0 = 0; b0 < nfar && taken < ties; b0 += blockDim.x) {
        const int64_t p = b0 + threadIdx.x;
        const bool f = p < nfar && sel_key(row[p]) == T;
        const uint32_t bal = __ballot_sync(0xffffffffu, f);
        if (lane == 0) wcount[w] = __popc(bal);
        __syncthreads();
        int64_t before = 0, all = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) {
            if (i < w) before += wcount[i];
            all += wcount[i];
        }
        const int64_t o = taken + before + __popc(bal & ((1u << lane) - 1u));
        if (f && o < ties) dst[base_out + o] = (int32_t)(lo + p);
        taken += all;
        __syncthreads();   /* wcount is rewritten next round */
    }
    if (threadIdx.x == 0) len[list0 + sl] = (int32_t)rho;
}

/* hi - lo <= rho: every far position is in every list (none when empty). */
static __global__ void k_build_fill(int64_t n, int64_t lo, int64_t nfar, int64_t rho, const int32_t *slot,
                             int32_t *ivf, int32_t *len, int64_t C, int64_t lists0)
{
    const int64_t i = blockIdx.x;
    const int h = blockIdx.y;
    const int64_t list = lists0 + (int64_t)h * C + slot[(int64_t)h * n + i];
    for (int64_t p = threadIdx.x; p < nfar; p += blockDim.x) ivf[list * rho + p] = (int32_t)(lo + p);
    if (threadIdx.x == 0) len[list] = (int32_t)nfar;
}

extern "C" size_t hkv_gpu_ctkvr_build_ws_bytes(int64_t n_far, int64_t n_centroids)
{
    if (n_far < 1 || n_centroids < 1) return 0;
    return (size_t)n_far * (size_t)n_centroids * sizeof(float);
}

extern "C" int hkv_gpu_ctkvr_build_with(const hkv_gpu_ctkvr *ix, int s, const uint16_t *q,
                                        int64_t ldq, int64_t n, const int32_t *slot,
                                        const uint16_t *k, int64_t ld, int64_t hs, int64_t lo,
                                        int64_t hi, void *ws, size_t ws_bytes,
                                        hkv_gpu_scores_kernel kernel, void *stream, hkv_err *err)
{
    if (kernel != HKV_GPU_SCORES_AUTO && kernel != HKV_GPU_SCORES_SIMT &&
        kernel != HKV_GPU_SCORES_MMA)
        return hkv_seterr(err, HKV_E_INVAL, "gpu ctkvr build: unknown score kernel %d", (int)kernel);
    if (!ix || !ix->cent || !ix->ivf || !ix->len || ix->n_head_kv < 1 ||
        ix->n_head < ix->n_head_kv || ix->n_head % ix->n_head_kv || ix->C < 1 || ix->rho < 1 ||
        s < 0 || s >= ix->n_seq || !q || !slot || !k || n < 0 || n > ix->C || lo < 0 || hi < lo ||
        hi > 2147483647 || ldq < (int64_t)ix->n_head * ix->d || ix->n_head_kv > 65535)
        return hkv_seterr(err, HKV_E_INVAL, "gpu ctkvr build: bad arguments (sequence %d of %d, "
                          "%lld centroids of C=%lld, far [%lld, %lld))", s, ix ? ix->n_seq : 0,
                          (long long)n, ix ? (long long)ix->C : 0LL, (long long)lo, (long long)hi);
    const int H = ix->n_head, KH = ix->n_head_kv, d = ix->d, g = H / KH;
    if (d < 2 || d > 256 || (d & 1) || ld < d || (ld & 1) || (hs & 1) || (ldq & 1) ||
        ((uintptr_t)k & 3) || ((uintptr_t)q & 3))
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu ctkvr build: needs an even head size up to "
                          "256 and 4-byte aligned rows (d=%d, ld=%lld, ldq=%lld)", d, (long long)ld,
                          (long long)ldq);
    /* tensor cores where they run: 16-byte rows of a head size up to 128 */
    const int vec16 = !(((uintptr_t)k | (uintptr_t)q) & 15) && !(ld & 7) && !(hs & 7) &&
                      !(ldq & 7) && !(d & 7);
    const char *why = kernel == HKV_GPU_SCORES_SIMT ? "" : hkv_gpu_ctkvr_scores_mma_unfit(d, vec16);
    if (why && kernel == HKV_GPU_SCORES_MMA)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu ctkvr build scores on mma.sync (d=%d, "
                          "ld=%lld, ldq=%lld): %s", d, (long long)ld, (long long)ldq, why);
    const int mma = !why;
    if (!n) return HKV_OK;
    cudaStream_t st = hkv_stream(stream);
    const int64_t nfar = hi - lo, rho = ix->rho, C = ix->C, lists0 = (int64_t)s * KH * C;
    dim3 gc((unsigned)n, (unsigned)KH);
    HKV_LAUNCH(k_build_cent, gc, 128, 0, st)(q, ldq, n, H, KH, d, C, slot, ix->cent, s);
    HKV_LAUNCH_CHECK(err);
    if (nfar <= rho) {
        HKV_LAUNCH(k_build_fill, gc, 256, 0, st)(
            n, lo, nfar, rho, slot, ix->ivf, ix->len, C, lists0);
        HKV_LAUNCH_CHECK(err);
        return HKV_OK;
    }
    if (!ws)
        return hkv_seterr(err, HKV_E_INVAL, "gpu ctkvr build: no workspace");
    int64_t cb = (int64_t)(ws_bytes / ((size_t)nfar * sizeof(float)));
    if (cb < 1)
        return hkv_seterr(err, HKV_E_INVAL, "gpu ctkvr build: workspace of %zu bytes holds no "
                          "centroid's scores over %lld far keys (%zu bytes)", ws_bytes,
                          (long long)nfar, (size_t)nfar * sizeof(float));
    if (cb > n) cb = n;
    if (cb > 65535) cb = 65535;
    int ct = 4;   /* centroids per score block: as many as fit in shared memory */
    size_t smem = 0;
    for (; ct >= 1; ct /= 2) {
        smem = ((size_t)ct * g * (d / 2) + (size_t)BK * (d / 2 + 1)) * 4;
        if (smem <= SMEM_MAX) break;
    }
    if (ct < 1)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu ctkvr build: a group of %d heads of %d does "
                          "not fit in shared memory", g, d);
    float *scores = (float *)ws;
    for (int h = 0; h < KH; h++)
        for (int64_t i0 = 0; i0 < n; i0 += cb) {
            const int64_t nc = n - i0 < cb ? n - i0 : cb;
            if (mma) {
                const int rc = hkv_gpu_ctkvr_scores_mma(q, ldq, i0, nc, g, d, h, k + h * hs, ld,
                                                        lo, nfar, scores, st, err);
                if (rc) return rc;
            } else {
                dim3 gs((unsigned)((nfar + BK - 1) / BK), (unsigned)((nc + ct - 1) / ct));
                HKV_LAUNCH(k_build_scores, gs, BK * ct, smem, st)(
                    q, ldq, i0, nc, g, d, h, k + h * hs, ld, lo, nfar, ct, scores);
                HKV_LAUNCH_CHECK(err);
            }
            HKV_LAUNCH(k_build_select, (unsigned)nc, SEL_THREADS, 0, st)(
                scores, nfar, lo, rho, i0, n, h, slot, ix->ivf, ix->len, lists0 + (int64_t)h * C);
            HKV_LAUNCH_CHECK(err);
        }
    return HKV_OK;
}

extern "C" int hkv_gpu_ctkvr_build(const hkv_gpu_ctkvr *ix, int s, const uint16_t *q, int64_t ldq,
                                   int64_t n, const int32_t *slot, const uint16_t *k, int64_t ld,
                                   int64_t hs, int64_t lo, int64_t hi, void *ws, size_t ws_bytes,
                                   void *stream, hkv_err *err)
{
    return hkv_gpu_ctkvr_build_with(ix, s, q, ldq, n, slot, k, ld, hs, lo, hi, ws, ws_bytes,
                                    HKV_GPU_SCORES_AUTO, stream, err);
}

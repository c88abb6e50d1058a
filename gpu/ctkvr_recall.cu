/* CTKVR decode on the device (index/ctkvr.c's select up to the rerank, and
 * its dcu=1 update). First k_ctkvr_scores over (sequence x KV head,
 * centroid chunk) blocks:
 *   1. unit query heads (sum of squares in float64, as the host does),
 *   2. cosine with each valid centroid in FIFO order (oldest first), max
 *      over the group, one warp per centroid;
 * then one block per (sequence, KV head):
 *   3. top C' by repeated block arg-max (C' is small; ties to the older
 *      centroid, hkv_topk's rule), chosen scores are marked NaN,
 *   4. the chosen IVF lists and the tail set bits of a bitmap over the far
 *      tier (atomicOr: duplicates collapse),
 *   5. an ordered compaction of the bitmap (per-thread word ranges and a
 *      block prefix sum) writes candidates in increasing position, the
 *      order the host's rerank gathers in. */
#include <math.h>

#include "recall_common.cuh"

extern "C" {
#include "gpu_kernels.h"
}

/* Exclusive prefix sum of v over the block; *total gets the sum. */
static __device__ int64_t rc_block_scan(int64_t v, int64_t *total)
{
    __shared__ int64_t wsum[RC_WARPS];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int64_t x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int64_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) wsum[w] = x;
    __syncthreads();
    int64_t before = 0, all = 0;
    for (int i = 0; i < RC_WARPS; i++) {
        if (i < w) before += wsum[i];
        all += wsum[i];
    }
    __syncthreads();   /* wsum may be reused by the next call */
    *total = all;
    return before + x - v;
}

static __global__ void __launch_bounds__(RC_THREADS)
k_ctkvr_scores(const uint16_t *cent, const int32_t *fifo, int H, int KH, int d, int64_t C,
               const float *q, float *score_ws)
{
    HKV_DYN_SHARED(float, qn);            /* [g][d] unit query heads */
    const int64_t u = blockIdx.x, s = u / KH, i0 = (int64_t)blockIdx.y * RC_SCORE_SLOTS;
    const int h = (int)(u % KH), g = H / KH;
    const int64_t head = fifo[2 * u];
    int64_t count = fifo[2 * u + 1];
    count = count < 0 ? 0 : count > C ? C : count;
    if (i0 >= count) return;   /* block-uniform */
    rc_unit_heads(q + (s * H + (int64_t)h * g) * d, g, d, qn);
    __syncthreads();
    for (int64_t c0 = i0; c0 < count; c0 += (int64_t)gridDim.y * RC_SCORE_SLOTS)
        rc_score_slots(qn, g, d, cent + (s * C * H + (int64_t)h * g) * d, (int64_t)H * d, head,
                       count, C, score_ws + u * C, c0, c0 + RC_SCORE_SLOTS);
}

static __global__ void __launch_bounds__(RC_THREADS)
k_ctkvr_recall(const int32_t *ivf, const int32_t *len, const int32_t *fifo, int KH, int64_t C,
               int64_t rho, int64_t Cp, const int64_t *far, int64_t W, float *score_ws,
               uint32_t *bm_ws, int32_t *cand, int64_t cand_cap, int32_t *n_cand)
{
    const int64_t u = blockIdx.x, s = u / KH;
    const int h = (int)(u % KH);
    const int64_t lo = far[3 * s], hi = far[3 * s + 1];
    const int64_t nfar = hi - lo, nw = (nfar + 31) / 32;
    if (nfar <= 0 || nw > W) {   /* empty far tier, or longer than the workspace was sized for */
        if (threadIdx.x == 0) n_cand[u] = nfar <= 0 ? 0 : -1;
        return;
    }
    int64_t t0 = far[3 * s + 2];
    t0 = t0 < lo ? lo : t0 > hi ? hi : t0;

    const int64_t head = fifo[2 * u];
    int64_t count = fifo[2 * u + 1];
    count = count < 0 ? 0 : count > C ? C : count;
    float *sc = score_ws + u * C;   /* k_ctkvr_scores', ordered by the stream */

    uint32_t *bm = bm_ws + u * W;
    for (int64_t w = threadIdx.x; w < nw; w += blockDim.x) bm[w] = 0;
    __syncthreads();   /* zeroed before any bit is set */
    const int64_t k = Cp < count ? Cp : count;
    for (int64_t it = 0; it < k; it++) {
        float v;
        const int pick = rc_pick(sc, count, &v);
        if (pick < 0) break;   /* only NaN scores left */
        const int64_t slot = (head + pick) % C;
        const int32_t *list = ivf + ((s * KH + h) * C + slot) * rho;
        int64_t L = len[(s * KH + h) * C + slot];
        L = L < 0 ? 0 : L > rho ? rho : L;
        for (int64_t e = threadIdx.x; e < L; e += blockDim.x) {
            const int64_t p = list[e];
            if (p >= lo && p < hi) atomicOr(&bm[(p - lo) >> 5], 1u << ((p - lo) & 31));
        }
    }
    for (int64_t p = t0 + threadIdx.x; p < hi; p += blockDim.x)
        atomicOr(&bm[(p - lo) >> 5], 1u << ((p - lo) & 31));
    __syncthreads();

    const int64_t per = (nw + blockDim.x - 1) / blockDim.x;
    const int64_t w0 = threadIdx.x * per < nw ? threadIdx.x * per : nw;
    const int64_t w1 = w0 + per < nw ? w0 + per : nw;
    int64_t cnt = 0;
    for (int64_t w = w0; w < w1; w++) cnt += __popc(bm[w]);
    int64_t total = 0, o = rc_block_scan(cnt, &total);
    int32_t *out = cand + u * cand_cap;
    for (int64_t w = w0; w < w1; w++)
        for (uint32_t x = bm[w]; x; x &= x - 1, o++)
            if (o < cand_cap) out[o] = (int32_t)(lo + w * 32 + (__ffs(x) - 1));
    if (threadIdx.x == 0) n_cand[u] = (int32_t)total;
}

static size_t rc_words(int64_t max_far) { return (size_t)((max_far + 31) / 32); }

extern "C" size_t hkv_gpu_ctkvr_recall_ws_bytes(const hkv_gpu_ctkvr *ix, int64_t max_far)
{
    if (!ix || max_far < 0) return 0;
    const size_t pairs = (size_t)ix->n_seq * (size_t)ix->n_head_kv;
    return pairs * ((size_t)ix->C * sizeof(float) + rc_words(max_far) * sizeof(uint32_t));
}

static int ix_check(const hkv_gpu_ctkvr *ix, const char *who, hkv_err *err)
{
    if (!ix || !ix->cent || !ix->ivf || !ix->len || !ix->fifo || ix->n_seq < 1 ||
        ix->n_head_kv < 1 || ix->n_head < ix->n_head_kv || ix->n_head % ix->n_head_kv ||
        ix->d < 1 || ix->C < 1 || ix->C > 2147483647 || ix->rho < 1)
        return hkv_seterr(err, HKV_E_INVAL, "%s: index without buffers or with a bad shape", who);
    if ((int64_t)ix->n_seq * ix->n_head_kv > 2147483647)
        return hkv_seterr(err, HKV_E_RANGE, "%s: %d x %d (sequence, KV head) pairs exceed a grid",
                          who, ix->n_seq, ix->n_head_kv);
    return HKV_OK;
}

extern "C" int hkv_gpu_ctkvr_recall(const hkv_gpu_ctkvr *ix, const float *q, int64_t Cp,
                                    const int64_t *far, int64_t max_far, int32_t *cand,
                                    int64_t cand_cap, int32_t *n_cand, void *ws, size_t ws_bytes,
                                    void *stream, hkv_err *err)
{
    int rc = ix_check(ix, "gpu ctkvr recall", err);
    if (rc) return rc;
    if (!q || !far || !cand || !n_cand || !ws || Cp < 1 || max_far < 0 || cand_cap < 1 ||
        max_far > 2147483647)
        return hkv_seterr(err, HKV_E_INVAL, "gpu ctkvr recall: bad arguments (C'=%lld, max far "
                          "%lld, cand cap %lld)", (long long)Cp, (long long)max_far,
                          (long long)cand_cap);
    const size_t need = hkv_gpu_ctkvr_recall_ws_bytes(ix, max_far);
    if (ws_bytes < need)
        return hkv_seterr(err, HKV_E_INVAL, "gpu ctkvr recall: workspace of %zu bytes, %zu needed",
                          ws_bytes, need);
    const int g = ix->n_head / ix->n_head_kv;
    const size_t smem = (size_t)g * ix->d * sizeof(float);
    if (smem > 48 * 1024)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu ctkvr recall: a group of %d heads of %d "
                          "needs %zu bytes of shared memory (48 KB max)", g, ix->d, smem);
    const size_t pairs = (size_t)ix->n_seq * ix->n_head_kv;
    float *score_ws = (float *)ws;
    uint32_t *bm_ws = (uint32_t *)(score_ws + pairs * (size_t)ix->C);
    const dim3 grid((unsigned)pairs, rc_score_chunks(ix->C));
    HKV_LAUNCH(k_ctkvr_scores, grid, RC_THREADS, smem, hkv_stream(stream))(
        ix->cent, ix->fifo, ix->n_head, ix->n_head_kv, ix->d, ix->C, q, score_ws);
    HKV_LAUNCH_CHECK(err);
    HKV_LAUNCH(k_ctkvr_recall, (unsigned)pairs, RC_THREADS, 0, hkv_stream(stream))(
        ix->ivf, ix->len, ix->fifo, ix->n_head_kv, ix->C, ix->rho, Cp, far,
        (int64_t)rc_words(max_far), score_ws, bm_ws, cand, cand_cap, n_cand);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

/* dcu=1: the FIFO push of ctkvr_impl.h's hkv_ctkvr_fifo_push, the unit query
 * heads as the new centroid (float64 norm, fp32 scale, RNE to fp16, as
 * hkv_ctkvr_store_unit) and the reranked positions as its list. */
static __global__ void __launch_bounds__(RC_THREADS)
k_ctkvr_dcu(uint16_t *cent, int32_t *ivf, int32_t *len, int32_t *fifo, int H, int KH, int d,
            int64_t C, int64_t rho, const float *q, const int32_t *sel, int64_t sel_ld,
            const int32_t *n_sel)
{
    __shared__ int64_t slot_s;
    const int64_t u = blockIdx.x, s = u / KH;
    const int h = (int)(u % KH), g = H / KH;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t cnt = n_sel[u];
    if (cnt <= 0) return;
    if (threadIdx.x == 0) {
        int64_t head = fifo[2 * u], count = fifo[2 * u + 1], sl;
        if (count < C) {
            sl = (head + count) % C;
            count++;
        } else {
            sl = head;
            head = (head + 1) % C;
        }
        fifo[2 * u] = (int32_t)head, fifo[2 * u + 1] = (int32_t)count;
        slot_s = sl;
    }
    __syncthreads();
    const int64_t sl = slot_s;
    for (int j = warp; j < g; j += RC_WARPS) {
        const float *qj = q + (s * H + (int64_t)h * g + j) * d;
        double ss = 0;
        for (int e = lane; e < d; e += 32) ss += (double)qj[e] * qj[e];
        ss = hkv_warp_sum_d(ss);
        const float r = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        uint16_t *cj = cent + ((s * C + sl) * H + (int64_t)h * g + j) * d;
        for (int e = lane; e < d; e += 32) cj[e] = hkv_f2h(qj[e] * r);
    }
    const int64_t n = cnt < rho ? cnt : rho;
    int32_t *dst = ivf + ((s * KH + h) * C + sl) * rho;
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) dst[e] = sel[u * sel_ld + e];
    if (threadIdx.x == 0) len[(s * KH + h) * C + sl] = (int32_t)n;
}

extern "C" int hkv_gpu_ctkvr_dcu(const hkv_gpu_ctkvr *ix, const float *q, const int32_t *sel,
                                 int64_t sel_ld, const int32_t *n_sel, void *stream, hkv_err *err)
{
    int rc = ix_check(ix, "gpu ctkvr dcu", err);
    if (rc) return rc;
    if (!q || !sel || !n_sel || sel_ld < 1)
        return hkv_seterr(err, HKV_E_INVAL, "gpu ctkvr dcu: bad arguments (selection stride %lld)",
                          (long long)sel_ld);
    const size_t pairs = (size_t)ix->n_seq * ix->n_head_kv;
    HKV_LAUNCH(k_ctkvr_dcu, (unsigned)pairs, RC_THREADS, 0, hkv_stream(stream))(
        ix->cent, ix->ivf, ix->len, ix->fifo, ix->n_head, ix->n_head_kv, ix->d, ix->C, ix->rho, q,
        sel, sel_ld, n_sel);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

/* Device pieces of a cosine recall over a FIFO table of unit rows, shared by
 * the recall kernels (ctkvr_recall.cu: recall and candidate union on the
 * device; recall_top.cu: recall only, the pipeline's). One block of
 * RC_THREADS per (query row, KV head). Not a public header. */
#ifndef HKV_RECALL_COMMON_CUH
#define HKV_RECALL_COMMON_CUH

#include "gpu_internal.cuh"

#define RC_THREADS 256
#define RC_WARPS (RC_THREADS / 32)

static __device__ __forceinline__ bool rc_better(float va, int ia, float vb, int ib)
{
    return va > vb || (va == vb && ia < ib);
}

/* Unit copies of g query heads of d (qh, fp32, head j at qh + j*d) into qn:
 * sum of squares in float64 and an fp32 scale, as the host does. The caller
 * synchronises before reading qn. */
static __device__ void rc_unit_heads(const float *qh, int g, int d, float *qn)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int j = warp; j < g; j += RC_WARPS) {
        const float *qj = qh + (int64_t)j * d;
        double ss = 0;
        for (int e = lane; e < d; e += 32) ss += (double)qj[e] * qj[e];
        ss = hkv_warp_sum_d(ss);
        const float r = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (int e = lane; e < d; e += 32) qn[j * d + e] = qj[e] * r;
    }
}

/* sc[i], i < count: the cosine of the unit heads qn with the table row in
 * FIFO slot (head + i) % C, max over the g heads; head j of slot t at
 * tab + t*ld_slot + j*d (fp16). One warp per slot. The caller synchronises
 * before reading sc. */
static __device__ void rc_fifo_scores(const float *qn, int g, int d, const uint16_t *tab,
                                      int64_t ld_slot, int64_t head, int64_t count, int64_t C,
                                      float *sc)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t i = warp; i < count; i += RC_WARPS) {
        const int64_t slot = (head + i) % C;
        float best = -INFINITY;
        for (int j = 0; j < g; j++) {
            const uint16_t *cj = tab + slot * ld_slot + (int64_t)j * d;
            float a = 0.0f;
            for (int e = lane; e < d; e += 32) a = fmaf(qn[j * d + e], hkv_h2f(cj[e]), a);
            best = fmaxf(best, hkv_warp_sum(a));
        }
        if (lane == 0) sc[i] = best;
    }
}

/* The best score left in sc[0..count) (NaN: taken), ties to the lower index
 * (the older slot, hkv_topk's rule); marks it taken. Returns its index, or
 * -1 when only taken scores are left; *val gets its score. Every thread of
 * the block calls it and gets the same answer. */
static __device__ int rc_pick(float *sc, int64_t count, float *val)
{
    __shared__ float red_v[RC_WARPS];
    __shared__ int red_i[RC_WARPS];
    __shared__ int pick_s;
    __shared__ float pick_v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
        const float x = sc[i];
        if (x == x && rc_better(x, (int)i, bv, bi)) bv = x, bi = (int)i;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (rc_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) red_v[warp] = bv, red_i[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < RC_WARPS; w++)
            if (rc_better(red_v[w], red_i[w], bv, bi)) bv = red_v[w], bi = red_i[w];
        pick_s = bi, pick_v = bv;
        if (bi != 0x7fffffff) sc[bi] = __int_as_float(0x7fc00000);
    }
    __syncthreads();
    const int p = pick_s;
    *val = pick_v;
    __syncthreads();   /* pick_s and red_* are rewritten by the next call */
    return p == 0x7fffffff ? -1 : p;
}

#endif

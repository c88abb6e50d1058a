/* Device pieces of a cosine recall over a FIFO table of unit rows, shared by
 * the recall kernels (ctkvr_recall.cu: recall and candidate union on the
 * device; recall_top.cu: recall only, the pipeline's). Two launches each:
 * the scores over a grid of (query row x KV head, RC_SCORE_SLOTS slots)
 * blocks, then one block of RC_THREADS per (query row, KV head) for the top
 * C' and what follows. The scores were once the first phase of that second
 * kernel: 8 blocks at batch 1 (one per KV head of Llama-3-8B), each warp
 * walking 256 centroids in a chain of dependent loads and shuffles, about
 * 0.5 ms a layer on an H200 (PREDICTION from the headline run's per-layer
 * wait; the kernel was not timed alone). Not a public header. */
#ifndef HKV_RECALL_COMMON_CUH
#define HKV_RECALL_COMMON_CUH

#include "gpu_internal.cuh"

#define RC_THREADS 256
#define RC_WARPS (RC_THREADS / 32)
#define RC_SCORE_SLOTS 32    /* slots a scoring block scores: 4 a warp */
#define RC_VEC_PASSES 8      /* 16-byte loads a lane makes of a slot: g d <= 2048 */

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

/* Whether a warp can score a slot's g heads of d in 16-byte loads: 8
 * halves a lane that never straddle a head (d / 8 lanes a head, a power of
 * two up to 32), g d within RC_VEC_PASSES loads a lane. */
static __device__ __forceinline__ bool rc_vec_ok(int g, int d)
{
    const int w = d / 8;
    return d % 8 == 0 && w >= 1 && w <= 32 && (w & (w - 1)) == 0 &&
           (g * d + 255) / 256 <= RC_VEC_PASSES;
}

/* The cosine of unit heads qn ([g][d], fp32) with one slot's g heads (row:
 * g d contiguous halves, 16-byte aligned), max over the heads; every lane
 * of the warp gets it. Lane l holds halves 8l + 256p of pass p; a head's
 * lanes sum by butterfly within their aligned group of d / 8. */
static __device__ float rc_slot_vec(const float *qn, int g, int d, const uint16_t *row)
{
    const int lane = threadIdx.x & 31, n = g * d, np = (n + 255) / 256, w = d / 8;
    uint4 x[RC_VEC_PASSES];
#pragma unroll
    for (int p = 0; p < RC_VEC_PASSES; p++) {   /* every load issued before any sum */
        const int e = p * 256 + lane * 8;
        x[p] = make_uint4(0, 0, 0, 0);
        if (p < np && e < n) x[p] = __ldg((const uint4 *)(row + e));
    }
    float best = -INFINITY;
#pragma unroll
    for (int p = 0; p < RC_VEC_PASSES; p++) {
        if (p >= np) break;   /* warp-uniform */
        const int e = p * 256 + lane * 8;
        float a = 0.0f;
        if (e < n) {
            const __half2 *hx = reinterpret_cast<const __half2 *>(&x[p]);
            const float *qq = qn + e;   /* [g][d]: element e of the row is qn[e] */
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float2 f = __half22float2(hx[c]);
                a = fmaf(qq[2 * c], f.x, a);
                a = fmaf(qq[2 * c + 1], f.y, a);
            }
        }
        for (int o = 1; o < w; o <<= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (e < n) best = fmaxf(best, a);
    }
    return hkv_warp_max(best);
}

/* The same, one element a lane at a time (any g and d). */
static __device__ float rc_slot_scalar(const float *qn, int g, int d, const uint16_t *row)
{
    const int lane = threadIdx.x & 31;
    float best = -INFINITY;
    for (int j = 0; j < g; j++) {
        const uint16_t *cj = row + (int64_t)j * d;
        float a = 0.0f;
        for (int e = lane; e < d; e += 32) a = fmaf(qn[j * d + e], hkv_h2f(cj[e]), a);
        best = fmaxf(best, hkv_warp_sum(a));
    }
    return best;
}

/* sc[i] for i in [i0, i1) within count: the cosine of the unit heads qn with
 * the table row in FIFO slot (head + i) % C, max over the g heads; head j of
 * slot t at tab + t*ld_slot + j*d (fp16). One warp a slot. */
static __device__ void rc_score_slots(const float *qn, int g, int d, const uint16_t *tab,
                                      int64_t ld_slot, int64_t head, int64_t count, int64_t C,
                                      float *sc, int64_t i0, int64_t i1)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool vec = rc_vec_ok(g, d) && ld_slot % 8 == 0 && ((uintptr_t)tab & 15) == 0;
    if (i1 > count) i1 = count;
    for (int64_t i = i0 + warp; i < i1; i += RC_WARPS) {
        const uint16_t *row = tab + ((head + i) % C) * ld_slot;
        const float s = vec ? rc_slot_vec(qn, g, d, row) : rc_slot_scalar(qn, g, d, row);
        if (lane == 0) sc[i] = s;
    }
}

/* Scoring blocks for C slots: gridDim.y of them a (row, KV head), each
 * striding by gridDim.y chunks past the grid's limit. */
static inline unsigned rc_score_chunks(int64_t C)
{
    const int64_t n = (C + RC_SCORE_SLOTS - 1) / RC_SCORE_SLOTS;
    return (unsigned)(n < 1 ? 1 : n > 65535 ? 65535 : n);
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

/* The attention core shared by prefill and decode (internal to gpu/): a
 * block of up to ATT_WARPS warps, one query row per warp, walks one KV
 * head's keys in tiles of 32 staged in shared memory as fp16; lane j scores
 * key j of the tile, then the warp folds the tile into its row's online
 * softmax state (running max m, running sum l, fp32 accumulator of V with
 * d/32 dims per lane). No score matrix exists beyond one 32-key tile per
 * row. Output (out, lse), lse = m + log(l) in natural log; a row that saw
 * no key gets out = 0, lse = -inf (the cpu/kernels.h contract).
 *
 * Shared memory: K tile [32][d/2 + 1] 32-bit words (one word of padding per
 * row: d/2 + 1 is odd, so lane j reading row j hits 32 distinct banks), V
 * tile [32][d/2] words (lanes read consecutive halves of one row), q rows
 * [ATT_WARPS][d] fp32 (every lane reads the same element: broadcast). */
#ifndef HKV_GPU_ATTN_COMMON_CUH
#define HKV_GPU_ATTN_COMMON_CUH

#include <math.h>

#include "gpu_internal.cuh"

#define ATT_WARPS 8
#define ATT_TILE 32
#define ATT_MAXD 256

static inline size_t hkv_att_smem_bytes(int d)
{
    return (size_t)ATT_TILE * (d / 2 + 1) * 4 + (size_t)ATT_TILE * (d / 2) * 4 +
           (size_t)ATT_WARPS * d * 4;
}

/* Host-side checks shared by the launchers: NULL when fine, else what is wrong. */
static inline const char *hkv_att_check(int d, const void *k, const void *v, int64_t ld,
                                        int64_t hs, int64_t ss)
{
    if (d < 32 || d > ATT_MAXD || d % 32) return "head size must be a multiple of 32 up to 256";
    if (ld < d || (ld & 1) || (hs & 1) || (ss & 1) || ((uintptr_t)k & 3) || ((uintptr_t)v & 3))
        return "K/V rows must be 4-byte aligned (even strides, ld >= d)";
    return NULL;
}

/* One block's pass over keys [k0, kend) of one KV head (rows kb + r*ld, r =
 * idx ? idx[i] : i). This warp's row: query q (fp32 [d], global), keys
 * i < klim, results to out[d] and *lse; inactive warps only help load the
 * tiles. kend and blockDim are uniform over the block, so every thread
 * reaches every barrier. VEC: tiles load with 128-bit reads (hkv_att_vec_ok
 * on the host), else 32-bit ones. */
template <bool VEC>
static __device__ __forceinline__ void hkv_att_block_range(
    const uint16_t *__restrict__ kb, const uint16_t *__restrict__ vb, int64_t ld,
    const int32_t *__restrict__ idx, int64_t k0, int64_t kend, int d, float scale, const float *q,
    int64_t klim, float *out, float *lse, bool active)
{
    HKV_DYN_SHARED(uint32_t, att_smem);
    const int dh = d / 2, kstr = dh + 1, dw = d / 32;
    uint32_t *ks = att_smem;                        /* [32][kstr] */
    uint32_t *vs = ks + ATT_TILE * kstr;            /* [32][dh] */
    float *qw = (float *)(vs + ATT_TILE * dh) + (threadIdx.x >> 5) * d;
    const int lane = threadIdx.x & 31;
    if (active)
        for (int e = lane; e < d; e += 32) qw[e] = q[e];
    float m = -INFINITY, l = 0.0f, acc[ATT_MAXD / 32];
#pragma unroll
    for (int t = 0; t < ATT_MAXD / 32; t++) acc[t] = 0.0f;

    for (int64_t t0 = k0; t0 < kend; t0 += ATT_TILE) {
        const int nt = kend - t0 < ATT_TILE ? (int)(kend - t0) : ATT_TILE;
        __syncthreads();   /* the previous tile is consumed (and qw written, first time) */
        if (VEC) {   /* 128-bit loads: 8 halves of one row per thread */
            const int dq = dh / 4;
            for (int w = threadIdx.x; w < ATT_TILE * dq; w += blockDim.x) {
                const int j = w / dq, c = w - j * dq;
                uint32_t *kd = ks + j * kstr + 4 * c;   /* odd row stride: word stores */
                uint4 *vd = (uint4 *)(vs + j * dh + 4 * c);   /* 16-byte aligned: dh % 16 == 0 */
                if (j < nt) {
                    const int64_t r = idx ? (int64_t)idx[t0 + j] : t0 + j;
                    const uint4 kx = __ldg((const uint4 *)(kb + r * ld) + c);
                    kd[0] = kx.x, kd[1] = kx.y, kd[2] = kx.z, kd[3] = kx.w;
                    *vd = __ldg((const uint4 *)(vb + r * ld) + c);
                } else {
                    kd[0] = kd[1] = kd[2] = kd[3] = 0;
                    *vd = make_uint4(0, 0, 0, 0);
                }
            }
        } else {
            for (int w = threadIdx.x; w < ATT_TILE * dh; w += blockDim.x) {
                const int j = w / dh, c = w - j * dh;
                uint32_t kx = 0, vx = 0;
                if (j < nt) {
                    const int64_t r = idx ? (int64_t)idx[t0 + j] : t0 + j;
                    kx = ((const uint32_t *)(kb + r * ld))[c];
                    vx = ((const uint32_t *)(vb + r * ld))[c];
                }
                ks[j * kstr + c] = kx;
                vs[j * dh + c] = vx;
            }
        }
        __syncthreads();
        if (!active || t0 >= klim) continue;   /* warp-uniform */
        float s = -INFINITY;
        if (lane < nt && t0 + lane < klim) {
            const uint32_t *kr = ks + lane * kstr;
            float a = 0.0f;
            for (int c = 0; c < dh; c++) {
                const float2 kf = __half22float2(*reinterpret_cast<const __half2 *>(kr + c));
                a = fmaf(qw[2 * c], kf.x, a);
                a = fmaf(qw[2 * c + 1], kf.y, a);
            }
            s = a * scale;
        }
        const float mn = fmaxf(m, hkv_warp_max(s));
        if (mn == -INFINITY) continue;            /* nothing finite yet: no -inf - -inf */
        const float alpha = expf(m - mn);         /* m = -inf gives 0 */
        const float p = expf(s - mn);             /* masked keys give 0 */
        l = l * alpha + hkv_warp_sum(p);
#pragma unroll
        for (int t = 0; t < ATT_MAXD / 32; t++)
            if (t < dw) acc[t] *= alpha;
        const int nv = klim - t0 < nt ? (int)(klim - t0) : nt;
        for (int j = 0; j < nv; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const __half *vr = reinterpret_cast<const __half *>(vs + j * dh);
#pragma unroll
            for (int t = 0; t < ATT_MAXD / 32; t++)
                if (t < dw) acc[t] = fmaf(pj, __half2float(vr[lane + 32 * t]), acc[t]);
        }
        m = mn;
    }
    if (!active) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int t = 0; t < ATT_MAXD / 32; t++)
        if (t < dw) out[lane + 32 * t] = acc[t] * inv;
    if (lane == 0) *lse = l > 0.0f ? m + logf(l) : -INFINITY;
}

/* 1 when every K/V row the kernel reads starts on 16 bytes (base pointers,
 * row, head and sequence strides), so tiles load as uint4. */
static inline int hkv_att_vec_ok(const void *k, const void *v, int64_t ld, int64_t hs, int64_t ss)
{
    return !((uintptr_t)k & 15) && !((uintptr_t)v & 15) && !(ld & 7) && !(hs & 7) && !(ss & 7);
}

#endif

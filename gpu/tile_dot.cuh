/* Dot products of one fp32 vector with 32 fp16 rows at once, coalesced
 * (internal to gpu/). A kernel that gives each thread its own row and has
 * it walk that row touches 32 rows per load instruction of a warp; here the
 * warp reads each row together, lane l taking words l, l+32, ... (one
 * 128-byte line per row and step), every lane sums its slice of all 32 dot
 * products, and a transposing reduction (31 shuffles) leaves row l's total
 * in lane l. Used by the window scores and Quest's page bounds. */
#ifndef HKV_GPU_TILE_DOT_CUH
#define HKV_GPU_TILE_DOT_CUH

#include "gpu_internal.cuh"

/* One step of the recursive halving: a lane keeps the half of its live
 * entries its bit O selects and adds the partner's copy of that half. A
 * template per offset so every index is a constant and v stays in registers. */
template <int O>
static __device__ __forceinline__ void hkv_tile_halve(float *v, int lane)
{
    const bool up = lane & O;
#pragma unroll
    for (int i = 0; i < O; i++) {
        const float send = up ? v[i] : v[i + O], keep = up ? v[i + O] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}

/* For each lane: q . row prow of base (rows ld halves apart, each n halves,
 * n even and at most 64 WPL; prow < 0: no row, 0). q fp32 [n], in shared
 * memory. All 32 lanes must call; the result's summation order depends on
 * the lane (the row's place in the tile) only. */
template <int WPL>
static __device__ __forceinline__ float hkv_tile_dot(const float *q, const uint16_t *base,
                                                     int64_t ld, int64_t prow, int n)
{
    const int lane = threadIdx.x & 31, nw = n / 2;
    float2 qv[WPL];   /* this lane's words of q: lane + 32t */
#pragma unroll
    for (int t = 0; t < WPL; t++) {
        const int w = lane + 32 * t;
        qv[t] = w < nw ? make_float2(q[2 * w], q[2 * w + 1]) : make_float2(0.0f, 0.0f);
    }
    float v[32];
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int64_t pj = __shfl_sync(0xffffffffu, prow, j);
        float a = 0.0f;
        if (pj >= 0) {   /* warp-uniform */
            const __half2 *r = reinterpret_cast<const __half2 *>(base + pj * ld);
#pragma unroll
            for (int t = 0; t < WPL; t++) {
                const int w = lane + 32 * t;
                if (w < nw) {
                    const float2 kf = __half22float2(r[w]);
                    a = fmaf(qv[t].x, kf.x, a);
                    a = fmaf(qv[t].y, kf.y, a);
                }
            }
        }
        v[j] = a;
    }
    hkv_tile_halve<16>(v, lane);
    hkv_tile_halve<8>(v, lane);
    hkv_tile_halve<4>(v, lane);
    hkv_tile_halve<2>(v, lane);
    hkv_tile_halve<1>(v, lane);
    return v[0];
}

#endif

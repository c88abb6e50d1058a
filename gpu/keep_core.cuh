/* The top-k keep of one batch row by one thread block, shared by
 * hkv_gpu_keep (pool_keep.cu) and rocketkv's stage 2 (rocketkv_hsa.cu).
 *
 * Items i < ni carry a score s[i] and the tokens [i*page, min((i+1)*page,
 * nt)) (page 1: item = token); token x sits at position rows[x] or lo + x.
 * Kept: the min(k, nt) best tokens, a token's score its item's, positions
 * >= force_from first (their score taken as +inf; page 1 only), ties to the
 * lower token, written to out in token order (ascending positions, no
 * sort). A page's tokens are consecutive, so ranking pages by score with
 * ties to the lower page and taking tokens until k is the token ranking.
 *
 * Scores map to order-preserving 32-bit keys. A radix select of 8-bit
 * digits counts tokens per digit (a page weighs its tokens) and finds the
 * key T at the cut and how many tokens equal to T make it; it stops early
 * when the cut's digit is taken whole. Page-constant or clustered scores put
 * most keys in one bin, so a warp adds each bin once (__match_any_sync)
 * instead of one shared atomic per key. One ordered pass then keeps every
 * key above T and the first ties, with one block scan per round. Any block
 * size that is a multiple of 32, up to 1024. */
#ifndef HKV_KEEP_CORE_CUH
#define HKV_KEEP_CORE_CUH

#include "gpu_internal.cuh"

#define KC_NONE 0xffffffffu   /* no bin: a lane without a key this round */

static __device__ __forceinline__ uint32_t kc_key(float x)
{
    if (x == 0.0f) x = 0.0f;
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static __device__ __forceinline__ int64_t kc_pos(const int32_t *rows, int64_t lo, int64_t x)
{
    return rows ? (int64_t)rows[x] : lo + x;
}

static __device__ __forceinline__ uint32_t kc_key_at(const float *s, const int32_t *rows, int64_t lo,
                                                     int64_t force_from, int64_t i)
{
    if (force_from != INT64_MAX && kc_pos(rows, lo, i) >= force_from) return kc_key(INFINITY);
    return kc_key(s[i]);
}

/* Exclusive block scan of v (two 32-bit counts packed, neither carrying
 * into the other); *total the block's sum. Leaves red reusable. */
static __device__ unsigned long long kc_scan(unsigned long long v, unsigned long long *red,
                                             unsigned long long *total)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned long long inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long t = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += t;
    }
    if (lane == 31) red[w] = inc;
    __syncthreads();
    unsigned long long before = 0, all = 0;
    for (int i = 0; i < nw; i++) {
        if (i < w) before += red[i];
        all += red[i];
    }
    __syncthreads();   /* red is rewritten by the next call */
    *total = all;
    return before + inc - v;
}

static __device__ void kc_keep(const float *s, int64_t ni, int64_t page, int64_t nt,
                               const int32_t *rows, int64_t lo, int64_t k, int64_t force_from,
                               int32_t *out)
{
    __shared__ uint32_t hist[256];
    __shared__ uint32_t prefix_s, mask_s, krem_s;
    __shared__ int done_s;
    __shared__ unsigned long long red[32];
    const int64_t m = k < nt ? k : nt;
    const bool all = k >= nt;
    if (m <= 0) return;   /* block-uniform */
    const int lane = threadIdx.x & 31;
    const int64_t wlast = nt - (ni - 1) * page;   /* tokens of the last item */
    const int64_t span = (ni + blockDim.x - 1) / blockDim.x * blockDim.x;   /* whole warps */
    if (threadIdx.x == 0) prefix_s = 0, mask_s = 0, krem_s = (uint32_t)m, done_s = all;
    __syncthreads();
    for (int shift = 24; shift >= 0 && !done_s; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const uint32_t prefix = prefix_s, mask = mask_s;
        for (int64_t i0 = 0; i0 < span; i0 += blockDim.x) {
            const int64_t i = i0 + threadIdx.x;
            uint32_t bin = KC_NONE;
            if (i < ni) {
                const uint32_t u = kc_key_at(s, rows, lo, force_from, i);
                if ((u & mask) == prefix) bin = (u >> shift) & 255u;
            }
            const unsigned grp = __match_any_sync(0xffffffffu, bin);
            if (bin != KC_NONE && lane == __ffs(grp) - 1) {   /* the group's lowest lane adds it */
                const int64_t il = ni - 1 - (i - lane);   /* lane of the last item, if here */
                const bool has_last = il < 32 && ((grp >> il) & 1u);
                atomicAdd(&hist[bin], (uint32_t)(__popc(grp) * page - (has_last ? page - wlast : 0)));
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) {   /* lane l: bins 255-8l down to 248-8l; the one holding the krem-th */
            uint32_t loc = 0;
            for (int t = 0; t < 8; t++) loc += hist[255 - 8 * lane - t];
            uint32_t inc = loc;
            for (int o = 1; o < 32; o <<= 1) {
                const uint32_t t = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += t;
            }
            const uint32_t krem = krem_s;
            __syncwarp();   /* every lane read krem_s before one rewrites it */
            if (inc - loc < krem && krem <= inc) {
                uint32_t cum = inc - loc;
                for (int t = 0; t < 8; t++) {
                    const uint32_t bin = 255 - 8 * lane - t, hb = hist[bin];
                    if (cum + hb >= krem) {
                        prefix_s = prefix | (bin << shift);
                        mask_s = mask | (255u << shift);
                        krem_s = krem - cum;
                        done_s = cum + hb == krem;   /* the bin whole: every key >= its prefix */
                        break;
                    }
                    cum += hb;
                }
            }
        }
        __syncthreads();
    }
    /* kept: keys above T, and the first `ties` tokens whose key is T */
    const uint32_t T = prefix_s;
    const int64_t ties = done_s ? INT64_MAX : (int64_t)krem_s;
    int64_t gt_seen = 0, eq_seen = 0;
    for (int64_t i0 = 0; i0 < span; i0 += blockDim.x) {
        const int64_t i = i0 + threadIdx.x;
        int64_t w = 0;
        uint32_t u = 0;
        if (i < ni) {
            w = i == ni - 1 ? wlast : page;
            if (!all) u = kc_key_at(s, rows, lo, force_from, i);
        }
        const bool gt = all || u > T, eq = !all && u == T;
        unsigned long long tot;
        const unsigned long long ex =
            kc_scan(((unsigned long long)(gt ? w : 0) << 32) | (unsigned long long)(eq ? w : 0), red, &tot);
        const int64_t er = eq_seen + (int64_t)(ex & 0xffffffffu);   /* tie tokens before item i */
        const int64_t at = gt_seen + (int64_t)(ex >> 32) + (er < ties ? er : ties);
        const int64_t c = gt ? w : !eq || er >= ties ? 0 : ties - er < w ? ties - er : w;
        for (int64_t t = 0; t < c; t++) out[at + t] = (int32_t)kc_pos(rows, lo, i * page + t);
        gt_seen += (int64_t)(tot >> 32);
        eq_seen += (int64_t)(tot & 0xffffffffu);
    }
}

#endif

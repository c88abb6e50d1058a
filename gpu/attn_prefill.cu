/* Causal prefill attention on tensor cores, FlashAttention-2 structure
 * (WMMA m16n16k16, half inputs, fp32 accumulation).
 *
 * Rows of a block are (token t, query head j of KV head h's group) pairs,
 * r = t*g + j, so the g heads of a group share every K/V tile. A block of W
 * warps owns BM = 16*W consecutive rows; warp w the 16 rows 16w..16w+15. The
 * block's Q tile sits in shared memory as fp16 hi + lo parts (q*scale*log2 e
 * = hi + lo, both fp16: the "2xFP16" split), K/V tiles of BN keys stream
 * through shared memory, and each warp walks the keys in chunks of 16:
 *   S = Qhi K^T + Qlo K^T       2*d/16 MMAs into one fp32 accumulator
 *   S -> shared scratch         (a fragment's layout is unspecified: the
 *                                softmax needs rows, so S makes a round trip)
 *   online softmax per row      two lanes per row, 8 keys each, in log2 units
 *   P = Phi + Plo (fp16, <= 2^8) -> scratch
 *   O[f] += Phi V + Plo V       2*d/16 MMAs, O in fp32 accumulator registers
 * Only the chunks a warp's rows can see are computed (tiles past the block's
 * last row's diagonal are never loaded, chunks past a warp's diagonal are
 * skipped, the diagonal chunks masked per element); no score matrix exists
 * beyond one 16x16 chunk per warp, so a 128K prompt runs as query chunks
 * with a growing p0.
 *
 * Rescaling O by exp2(m_old - m_new) needs O's rows, which a WMMA fragment
 * does not expose: it is done through the scratch too (store, scale the rows,
 * load), and only when some row's running max grows by more than 8 (log2):
 * until then P = exp2(s - m) stays <= 2^8 with the stale m, exact in the
 * final O/l and well inside fp16's range. After the first chunks a row's max
 * rarely grows by that much, so most chunks skip the round trip.
 *
 * Accuracy (tests/gpu/test_gpu_attn.c against float64, 42 prefill cases,
 * d = 32..256, amplitudes up to nearly one-hot rows): Q is split into fp16
 * hi + lo, so the scores are as exact as fp32 (K is fp16 already, products
 * of halves are exact), and so is P for P.V (V is fp16 already); l sums the
 * fp32 P. Measured: out within 2.7e-6 of max|ref| per head, lse within
 * 5.7e-7 relative, the fp32 kernels' accuracy. Why both splits, at 4 d/16
 * MMAs per 16x16 chunk instead of 2: with plain fp16 Q the same cases gave
 * out errors up to 4.2e-3 of max|ref| and lse errors up to 1.6e-3 on peaky
 * rows; with fp16 Q split but P plain fp16 (FlashAttention's choice) out
 * errors of 4.4e-4 (2^-11 per weight), lse unaffected, which passed the
 * unit bound but not the pipeline: ctkvr through the pipeline
 * (tests/pipeline, prompt_growth) then picked other far keys at some decode
 * steps (logits 9e-2 off, tolerance 2e-3), a discrete choice the prompt's
 * 1e-4-size hidden-state differences flip.
 *
 * Tiles (shared memory = Q hi/lo 4*BM*(d+8) + K/V 4*BN*(d+8) + scratch
 * 1280*W bytes; rows padded by 8 halves, so 16-byte row segments of 8
 * consecutive rows hit distinct banks):
 *   d <= 64:  W = 4 (BM 64), BN 64: 41 KB   d <= 128: W = 3 (BM 48), BN 32: 46 KB
 *   d <= 256: W = 2 (BM 32), BN 32: 69 KB (opt-in above 48 KB, set before launch)
 * d = 64 and 128 stay under the 48 KB that needs no opt-in, so two blocks fit
 * on an sm_89 SM (100 KB); a wider Q tile would leave one. */
#include <math.h>
#include <mma.h>

#include "gpu_internal.cuh"

extern "C" {
#include "gpu_kernels.h"
}

using namespace nvcuda;

#define PF_CH 16        /* keys per softmax chunk: one MMA n step (S), one k step (P V) */
#define PF_SLD 20       /* scratch row stride in floats (P: 2 * PF_SLD halves) */
#define PF_TAU 8.0f     /* log2 growth of a row max that forces an O rescale */
#define PF_MAXD 256

template <int D> struct pf_cfg;
template <> struct pf_cfg<64> { enum { W = 4, BN = 64 }; };
template <> struct pf_cfg<128> { enum { W = 3, BN = 32 }; };
template <> struct pf_cfg<256> { enum { W = 2, BN = 32 }; };

/* 32 bytes of slack: WMMA pointers must be 256-bit aligned, the dynamic
 * shared memory base is only declared 16-byte aligned. */
static size_t pf_smem_bytes(int w, int bn, int d)
{
    const size_t ldm = (size_t)d + 8;
    return 32 + (size_t)w * 16 * ldm * 4 + (size_t)bn * ldm * 4 + (size_t)w * 16 * PF_SLD * 4;
}

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> pf_acc;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pf_a;

template <int D>
static __device__ __forceinline__ void pf_body(const float *__restrict__ q, int64_t ldq, int64_t nq,
                                               int H, int g, int d, int64_t p0, int64_t nk,
                                               const uint16_t *__restrict__ k,
                                               const uint16_t *__restrict__ v, int64_t ld,
                                               int64_t hs, float qscale, float *__restrict__ out,
                                               int64_t ldo, float *__restrict__ lse, int vec16)
{
    constexpr int W = pf_cfg<D>::W, BN = pf_cfg<D>::BN, BM = 16 * W, NF = D / 16;
    HKV_DYN_SHARED(unsigned char, pf_raw);
    unsigned char *base = (unsigned char *)(((uintptr_t)pf_raw + 31) & ~(uintptr_t)31);
    const int ldm = d + 8;
    __half *qh = (__half *)base, *ql = qh + BM * ldm, *ks = ql + BM * ldm, *vs = ks + BN * ldm;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *scr = (float *)(vs + BN * ldm) + warp * 16 * PF_SLD;
    const int h = blockIdx.y;
    const int64_t nrows = nq * g;
    int64_t kend;
    const int64_t r0 = hkv_pf_block_rows(BM, nrows, g, p0, nk, &kend);

    /* Q tile: q * scale * log2(e) = hi + lo, both fp16 (padding rows 0) */
    for (int i = threadIdx.x; i < BM * d; i += blockDim.x) {
        const int rr = i / d, c = i - rr * d;
        const int64_t r = r0 + rr;
        float x = 0.0f;
        if (r < nrows) {
            const int64_t t = r / g;
            x = q[t * ldq + ((int64_t)h * g + (r - t * g)) * d + c] * qscale;
        }
        const __half hi = __float2half_rn(x);
        qh[rr * ldm + c] = hi;
        ql[rr * ldm + c] = __float2half_rn(x - __half2float(hi));
    }

    /* this lane's row (two lanes per row) and the keys its warp can see */
    const int64_t wr0 = r0 + 16 * warp, my_r = wr0 + (lane >> 1);
    int64_t my_lim = p0 + my_r / g;   /* last key of this row (inclusive) */
    if (my_lim > nk - 1) my_lim = nk - 1;
    const int64_t wlast = wr0 + 15 < nrows ? wr0 + 15 : nrows - 1;
    int64_t wkey_max = wr0 < nrows ? p0 + wlast / g : -1;
    if (wkey_max > nk - 1) wkey_max = nk - 1;
    const int half8 = (lane & 1) * 8;

    pf_acc o[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) wmma::fill_fragment(o[f], 0.0f);
    float m = -INFINITY, l = 0.0f;

    const uint16_t *kb = k + (int64_t)h * hs, *vb = v + (int64_t)h * hs;
    for (int64_t t0 = 0; t0 < kend; t0 += BN) {
        const int nt = kend - t0 < BN ? (int)(kend - t0) : BN;
        __syncthreads();   /* the previous tile is consumed (and Q written, the first time) */
        if (vec16) {
            const int vpr = d / 8;
            for (int i = threadIdx.x; i < BN * vpr; i += blockDim.x) {
                const int j = i / vpr, c = i - j * vpr;
                uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
                if (j < nt) {   /* rows past the end stay 0: P = 0 times V must be 0 */
                    kx = __ldg((const uint4 *)(kb + (t0 + j) * ld) + c);
                    vx = __ldg((const uint4 *)(vb + (t0 + j) * ld) + c);
                }
                *(uint4 *)(ks + j * ldm + c * 8) = kx;
                *(uint4 *)(vs + j * ldm + c * 8) = vx;
            }
        } else {
            const int wpr = d / 2;
            for (int i = threadIdx.x; i < BN * wpr; i += blockDim.x) {
                const int j = i / wpr, c = i - j * wpr;
                uint32_t kx = 0, vx = 0;
                if (j < nt) {
                    kx = __ldg((const uint32_t *)(kb + (t0 + j) * ld) + c);
                    vx = __ldg((const uint32_t *)(vb + (t0 + j) * ld) + c);
                }
                *(uint32_t *)(ks + j * ldm + c * 2) = kx;
                *(uint32_t *)(vs + j * ldm + c * 2) = vx;
            }
        }
        __syncthreads();

        for (int c = 0; c < nt; c += PF_CH) {
            const int64_t c0 = t0 + c;
            if (c0 > wkey_max) break;   /* warp-uniform: above every row's diagonal */

            pf_acc s;
            wmma::fill_fragment(s, 0.0f);
            for (int k0 = 0; k0 < d; k0 += 16) {
                pf_a ah, al;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> bk;   /* K^T */
                wmma::load_matrix_sync(ah, qh + 16 * warp * ldm + k0, ldm);
                wmma::load_matrix_sync(al, ql + 16 * warp * ldm + k0, ldm);
                wmma::load_matrix_sync(bk, ks + c * ldm + k0, ldm);
                wmma::mma_sync(s, ah, bk, s);
                wmma::mma_sync(s, al, bk, s);
            }
            wmma::store_matrix_sync(scr, s, PF_SLD, wmma::mem_row_major);
            __syncwarp();

            /* online softmax over this lane's 8 keys of its row */
            const float *sr = scr + (lane >> 1) * PF_SLD + half8;
            float p[8], cmax = -INFINITY;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int64_t key = c0 + half8 + e;
                p[e] = key <= my_lim && key < kend ? sr[e] : -INFINITY;
                cmax = fmaxf(cmax, p[e]);
            }
            cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 1));
            const bool grow = cmax > m + PF_TAU;   /* m = -inf: the row's first key */
            const float mn = grow ? cmax : m;
            const float alpha = grow ? exp2f(m - mn) : 1.0f;
            const bool rescale_row = grow && m > -INFINITY;   /* a zero O row needs none */
            float ps = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                p[e] = p[e] == -INFINITY ? 0.0f : exp2f(p[e] - mn);
                ps += p[e];
            }
            l = l * alpha + ps;
            m = mn;
            __syncwarp();   /* S is read: the scratch is free */

            if (__any_sync(0xffffffffu, rescale_row)) {
#pragma unroll
                for (int f = 0; f < NF; f++) {
                    if (f * 16 >= d) break;
                    wmma::store_matrix_sync(scr, o[f], PF_SLD, wmma::mem_row_major);
                    __syncwarp();
                    float *orow = scr + (lane >> 1) * PF_SLD + half8;
#pragma unroll
                    for (int e = 0; e < 8; e++) orow[e] *= alpha;
                    __syncwarp();
                    wmma::load_matrix_sync(o[f], scr, PF_SLD, wmma::mem_row_major);
                    __syncwarp();
                }
            }

            /* P = hi + lo in fp16, side by side in each scratch row (halves
             * 0..15 and 16..31 of its 40) */
            __half *pr = (__half *)scr + (lane >> 1) * (2 * PF_SLD) + half8;
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const __half hi = __float2half_rn(p[e]);
                pr[e] = hi;
                pr[16 + e] = __float2half_rn(p[e] - __half2float(hi));
            }
            __syncwarp();
            pf_a aph, apl;
            wmma::load_matrix_sync(aph, (const __half *)scr, 2 * PF_SLD);
            wmma::load_matrix_sync(apl, (const __half *)scr + 16, 2 * PF_SLD);
#pragma unroll
            for (int f = 0; f < NF; f++) {
                if (f * 16 >= d) break;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> bv;
                wmma::load_matrix_sync(bv, vs + c * ldm + f * 16, ldm);
                wmma::mma_sync(o[f], aph, bv, o[f]);
                wmma::mma_sync(o[f], apl, bv, o[f]);
            }
            __syncwarp();   /* P is read before the next chunk's S lands there */
        }
    }

    if (wr0 >= nrows) return;   /* warp-uniform; no barrier follows */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    const bool mine = my_r < nrows;
    const int64_t t = my_r / g;
    const int qhd = h * g + (int)(my_r - t * g);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (mine && !(lane & 1))
        lse[t * H + qhd] = l > 0.0f ? (m + log2f(l)) * 0.69314718055994531f : -INFINITY;
    float *orow_out = out + t * ldo + (int64_t)qhd * d + half8;
#pragma unroll
    for (int f = 0; f < NF; f++) {
        if (f * 16 >= d) break;
        wmma::store_matrix_sync(scr, o[f], PF_SLD, wmma::mem_row_major);
        __syncwarp();
        const float *sr = scr + (lane >> 1) * PF_SLD + half8;
        if (mine)
#pragma unroll
            for (int e = 0; e < 8; e++) orow_out[f * 16 + e] = sr[e] * inv;
        __syncwarp();
    }
}

#define PF_KERNEL(D)                                                                              \
    static __global__ void __launch_bounds__(pf_cfg<D>::W * 32) k_attn_prefill_d##D(               \
        const float *q, int64_t ldq, int64_t nq, int H, int g, int d, int64_t p0, int64_t nk,      \
        const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs, float qscale, float *out,    \
        int64_t ldo, float *lse, int vec16)                                                        \
    {                                                                                              \
        pf_body<D>(q, ldq, nq, H, g, d, p0, nk, k, v, ld, hs, qscale, out, ldo, lse, vec16);       \
    }
PF_KERNEL(64)
PF_KERNEL(128)
PF_KERNEL(256)

/* One launch of the D-wide kernel (a macro so that the emulator's reports
 * name the kernel). Above 48 KB of dynamic shared memory a kernel must opt
 * in (99 KB on sm_89, 227 KB on sm_90). */
#define PF_LAUNCH(D)                                                                              \
    do {                                                                                          \
        const int W = pf_cfg<D>::W, BN = pf_cfg<D>::BN;                                           \
        const int64_t bx = (nq * g + 16 * W - 1) / (16 * W);                                      \
        if (bx > 2147483647)                                                                      \
            return hkv_seterr(err, HKV_E_RANGE, "gpu prefill attention: %lld queries in one "     \
                              "call; split the chunk", (long long)nq);                            \
        const size_t smem = pf_smem_bytes(W, BN, d);                                              \
        if (smem > 48 * 1024)                                                                     \
            HKV_CUDA_TRY(err, cudaFuncSetAttribute(k_attn_prefill_d##D,                           \
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,   \
                                                   (int)smem));                                   \
        dim3 grid((unsigned)bx, (unsigned)n_head_kv);                                             \
        HKV_LAUNCH(k_attn_prefill_d##D, grid, W * 32, smem, hkv_stream(stream))(                  \
            q, ldq, nq, n_head, g, d, p0, nk, k, v, ld, hs, qscale, out, ldo, lse, vec16);        \
        HKV_LAUNCH_CHECK(err);                                                                    \
        return HKV_OK;                                                                            \
    } while (0)

extern "C" int hkv_gpu_attn_prefill_with(const float *q, int64_t ldq, int64_t nq, int n_head,
                                         int n_head_kv, int d, int64_t p0, int64_t nk,
                                         const uint16_t *k, const uint16_t *v, int64_t ld,
                                         int64_t hs, float scale, float *out, int64_t ldo,
                                         float *lse, hkv_gpu_prefill_kernel kernel, void *stream,
                                         hkv_err *err)
{
    if (!q || !k || !v || !out || !lse || nq < 0 || p0 < 0 || nk < 0 || n_head_kv < 1 ||
        n_head < n_head_kv || n_head % n_head_kv || n_head_kv > 65535 ||
        ldq < (int64_t)n_head * d || ldo < (int64_t)n_head * d ||
        (kernel != HKV_GPU_PREFILL_AUTO && kernel != HKV_GPU_PREFILL_WMMA &&
         kernel != HKV_GPU_PREFILL_MMA))
        return hkv_seterr(err, HKV_E_INVAL, "gpu prefill attention: bad arguments (%lld queries "
                          "at %lld, %d heads, %d KV heads, d=%d, strides %lld/%lld, kernel %d)",
                          (long long)nq, (long long)p0, n_head, n_head_kv, d, (long long)ldq,
                          (long long)ldo, (int)kernel);
    if (d < 32 || d > PF_MAXD || d % 32)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu prefill attention (d=%d, ld=%lld): head "
                          "size must be a multiple of 32 up to 256", d, (long long)ld);
    if (ld < d || (ld & 1) || (hs & 1) || ((uintptr_t)k & 3) || ((uintptr_t)v & 3))
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu prefill attention (d=%d, ld=%lld): K/V "
                          "rows must be 4-byte aligned (even strides, ld >= d)", d, (long long)ld);
    /* 16-byte K/V loads when every row start allows them */
    const int vec16 = !(((uintptr_t)k | (uintptr_t)v) & 15) && !(ld & 7) && !(hs & 7);
    const float qscale = scale * 1.4426950408889634f;   /* scores in log2 units: exp2 */
    if (kernel != HKV_GPU_PREFILL_WMMA) {
        const char *why = hkv_gpu_prefill_mma_unfit(d, vec16);
        if (!why) {
            if (!nq) return HKV_OK;
            return hkv_gpu_prefill_mma(q, ldq, nq, n_head, n_head_kv, d, p0, nk, k, v, ld, hs,
                                       qscale, out, ldo, lse, hkv_stream(stream), err);
        }
        if (kernel == HKV_GPU_PREFILL_MMA)
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu prefill attention on mma.sync (d=%d, "
                              "ld=%lld): %s", d, (long long)ld, why);
    }
    if (!nq) return HKV_OK;
    const int g = n_head / n_head_kv;
    if (d <= 64) PF_LAUNCH(64);
    if (d <= 128) PF_LAUNCH(128);
    PF_LAUNCH(256);
}

extern "C" int hkv_gpu_attn_prefill_keys(const float *q, int64_t ldq, int64_t nq, int n_head,
                                         int n_head_kv, int d, int64_t p0, int64_t nk,
                                         const uint16_t *k, const uint16_t *v, int64_t ld,
                                         int64_t hs, float scale, float *out, int64_t ldo,
                                         float *lse, void *stream, hkv_err *err)
{
    return hkv_gpu_attn_prefill_with(q, ldq, nq, n_head, n_head_kv, d, p0, nk, k, v, ld, hs, scale,
                                     out, ldo, lse, HKV_GPU_PREFILL_AUTO, stream, err);
}

extern "C" int hkv_gpu_attn_prefill(const float *q, int64_t ldq, int64_t nq, int n_head,
                                    int n_head_kv, int d, int64_t p0, const uint16_t *k,
                                    const uint16_t *v, int64_t ld, int64_t hs, float scale,
                                    float *out, int64_t ldo, float *lse, void *stream, hkv_err *err)
{
    return hkv_gpu_attn_prefill_keys(q, ldq, nq, n_head, n_head_kv, d, p0, INT64_MAX, k, v, ld, hs,
                                     scale, out, ldo, lse, stream, err);
}

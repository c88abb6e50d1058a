/* Causal prefill attention for head sizes up to 128 on mma.sync (sm_80+),
 * FlashAttention-2's structure with the scores and the softmax in registers.
 *
 * Rows of a block are (token t, query head j of KV head h's group) pairs,
 * r = t*g + j, as in the WMMA kernel (attn_prefill.cu), so the g heads of a
 * group share every K/V tile. A block is 4 warps and 64 rows; warp w owns
 * rows 16w..16w+15 and, with gid = lane / 4, a lane holds rows gid and
 * gid + 8 of them (the m16n8k16 accumulator's layout, gpu/mma_frag.cuh).
 *   - Q (times scale * log2 e) is split once into fp16 hi + lo A fragments
 *     held in registers for the whole key range: 2 * d/16 x 4 registers.
 *   - K/V tiles of BN keys are copied asynchronously (cp.async, 16 bytes a
 *     thread) into one of two shared buffers while the other is computed on.
 *   - S = Qhi K^T + Qlo K^T: K's B fragments by ldmatrix (rows are keys, so
 *     the plain load gives K^T's column-major fragment), fp32 accumulators.
 *   - Online softmax on the accumulators themselves: a row's max and sum
 *     across its quad of lanes by two shuffles, O rescaled in registers (no
 *     round trip through shared memory, which the WMMA kernel needs because
 *     its fragments have no specified layout).
 *   - P = Phi + Plo: the S accumulator of two adjacent 8-key tiles is, lane
 *     for lane, the A fragment of a 16-key step, so P goes to the P V
 *     product without moving; V's B fragments by ldmatrix.trans.
 * Accuracy is the WMMA kernel's (the same hi/lo splits, same reasons: see
 * attn_prefill.cu), with the exact running max (P <= 1). Tiles past the
 * block's last row's diagonal are never loaded, and a warp skips a tile all
 * of whose keys lie past its rows' diagonals.
 *
 * Shared memory: 2 buffers x (K + V) x BN rows of (D + 8) halves (the pad
 * puts the 8 rows of an ldmatrix in distinct banks): d <= 64: BN 64, 36 KB;
 * d <= 128: BN 32, 34 KB; under the 48 KB that needs no opt-in, so two
 * blocks fit on an sm_89 SM. Registers: O d/8 x 4, Q 2 x d/16 x 4, S BN/8
 * x 4 floats a lane. d = 256 stays on the WMMA kernel: Q and O alone would
 * take 256 registers a lane. */
#include <math.h>

#include <cuda_pipeline_primitives.h>

#include "gpu_internal.cuh"
#include "mma_frag.cuh"

#define PM_WARPS 4
#define PM_BM (16 * PM_WARPS)

template <int D> struct pm_cfg;
template <> struct pm_cfg<64> { enum { BN = 64 }; };
template <> struct pm_cfg<128> { enum { BN = 32 }; };

static size_t pm_smem_bytes(int D, int bn) { return (size_t)2 * 2 * bn * (D + 8) * 2; }

/* Keys [t0, t0 + BN) of one KV head into a buffer: 16-byte copies, zeros
 * past kend and past column d (Q is 0 there, but 0 * NaN is not 0). */
template <int D>
static __device__ __forceinline__ void pm_load_tile(__half *ks, __half *vs, const uint16_t *kb,
                                                    const uint16_t *vb, int64_t ld, int64_t t0,
                                                    int64_t kend, int d)
{
    constexpr int BN = pm_cfg<D>::BN, CH = D / 8, LD = D + 8;
    for (int i = threadIdx.x; i < BN * CH; i += PM_WARPS * 32) {
        const int j = i / CH, c = i - j * CH;
        const bool in = t0 + j < kend && c * 8 < d;
        const int64_t off = in ? (t0 + j) * ld + c * 8 : 0;
        __pipeline_memcpy_async(ks + j * LD + c * 8, kb + off, 16, in ? 0 : 16);
        __pipeline_memcpy_async(vs + j * LD + c * 8, vb + off, 16, in ? 0 : 16);
    }
}

template <int D>
static __global__ void __launch_bounds__(PM_WARPS * 32)
k_attn_prefill_mma(const float *__restrict__ q, int64_t ldq, int64_t nq, int H, int g, int d,
                   int64_t p0, int64_t nk, const uint16_t *__restrict__ k,
                   const uint16_t *__restrict__ v, int64_t ld, int64_t hs, float qscale,
                   float *__restrict__ out, int64_t ldo, float *__restrict__ lse)
{
#ifdef HKV_MMA_OK
    constexpr int BN = pm_cfg<D>::BN, LD = D + 8, KS = D / 16, NT = BN / 8, NF = D / 8;
    HKV_DYN_SHARED(unsigned char, pm_raw);
    __half *const kv_base = (__half *)pm_raw;   /* [buffer][K | V][BN][LD] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const int h = blockIdx.y;
    const int64_t nrows = nq * g;
    int64_t kend;
    const int64_t r0 = hkv_pf_block_rows(PM_BM, nrows, g, p0, nk, &kend);
    const int64_t wr0 = r0 + 16 * warp;
    const int64_t wlast = wr0 + 15 < nrows ? wr0 + 15 : nrows - 1;
    const int64_t wkey_max = wr0 < nrows ? hkv_min_i64(p0 + wlast / g, nk - 1) : -1;

    /* this lane's two rows: their last visible key (-1: a padding row) and Q */
    int64_t lim[2];
    uint32_t qh[KS][4], ql[KS][4];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t row = wr0 + gid + 8 * r;
        const bool ok = row < nrows;
        const int64_t t = ok ? row / g : 0;
        lim[r] = ok ? hkv_min_i64(p0 + t, nk - 1) : -1;
        const float *qp = q + t * ldq + ((int64_t)h * g + (ok ? row - t * g : 0)) * d;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int c = ks * 16 + 8 * hf + 2 * tig;
                const float x0 = ok && c < d ? qp[c] * qscale : 0.0f;
                const float x1 = ok && c + 1 < d ? qp[c + 1] * qscale : 0.0f;
                hkv_split_h2(x0, x1, &qh[ks][r + 2 * hf], &ql[ks][r + 2 * hf]);
            }
    }

    float o[NF][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int f = 0; f < NF; f++) o[f][0] = o[f][1] = o[f][2] = o[f][3] = 0.0f;

    const uint16_t *kb = k + (int64_t)h * hs, *vb = v + (int64_t)h * hs;
    /* ldmatrix rows: lane -> (matrix lane / 8, row lane % 8) */
    const int mj = lane >> 3, mi = lane & 7;
    const int64_t ntiles = (kend + BN - 1) / BN;
    if (ntiles > 0) pm_load_tile<D>(kv_base, kv_base + BN * LD, kb, vb, ld, 0, kend, d);
    __pipeline_commit();
    for (int64_t it = 0; it < ntiles; it++) {
        if (it + 1 < ntiles) {
            __half *nb = kv_base + ((it + 1) & 1) * 2 * BN * LD;
            pm_load_tile<D>(nb, nb + BN * LD, kb, vb, ld, (it + 1) * BN, kend, d);
        }
        __pipeline_commit();   /* possibly empty: the wait below is the same every tile */
        __pipeline_wait_prior(1);
        __syncthreads();   /* tile it is in shared memory for every warp */
        const int64_t t0 = it * BN;
        const __half *ks = kv_base + (it & 1) * 2 * BN * LD, *vs = ks + BN * LD;
        if (t0 <= wkey_max) {   /* warp-uniform */
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
#pragma unroll
                for (int nt = 0; nt < NT; nt += 2) {
                    uint32_t b[4];   /* keys 8nt.. (b[0..1]) and 8nt+8.. (b[2..3]) x 16 dims */
                    hkv_ldsm_x4(b, ks + ((nt + (mj >> 1)) * 8 + mi) * LD + kk * 16 + (mj & 1) * 8);
                    hkv_mma16816(s[nt], qh[kk], b);
                    hkv_mma16816(s[nt], ql[kk], b);
                    hkv_mma16816(s[nt + 1], qh[kk], b + 2);
                    hkv_mma16816(s[nt + 1], ql[kk], b + 2);
                }
            /* mask past each row's diagonal; the new row maxima over the quad */
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int64_t key = t0 + nt * 8 + 2 * tig + (c & 1);
                    s[nt][c] = key <= lim[c >> 1] ? s[nt][c] : -INFINITY;
                    mx[c >> 1] = fmaxf(mx[c >> 1], s[nt][c]);
                }
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                alpha[r] = mx[r] == -INFINITY ? 1.0f : exp2f(m[r] - mx[r]);   /* m = -inf: 0 */
                m[r] = mx[r];
                l[r] *= alpha[r];
            }
#pragma unroll
            for (int f = 0; f < NF; f++)
#pragma unroll
                for (int c = 0; c < 4; c++) o[f][c] *= alpha[c >> 1];
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const float p = s[nt][c] == -INFINITY ? 0.0f : exp2f(s[nt][c] - m[c >> 1]);
                    s[nt][c] = p;
                    l[c >> 1] += p;
                }
            /* O += P V, 16 keys a step: S tiles 2kk and 2kk+1 are P's A fragment */
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                uint32_t ah[4], al[4];
                hkv_split_h2(s[2 * kk][0], s[2 * kk][1], &ah[0], &al[0]);
                hkv_split_h2(s[2 * kk][2], s[2 * kk][3], &ah[1], &al[1]);
                hkv_split_h2(s[2 * kk + 1][0], s[2 * kk + 1][1], &ah[2], &al[2]);
                hkv_split_h2(s[2 * kk + 1][2], s[2 * kk + 1][3], &ah[3], &al[3]);
#pragma unroll
                for (int f = 0; f < NF; f += 2) {
                    uint32_t b[4];   /* 16 keys x dims 8f.. (b[0..1]) and 8f+8.. (b[2..3]) */
                    hkv_ldsm_x4_t(b, vs + (kk * 16 + (mj & 1) * 8 + mi) * LD + (f + (mj >> 1)) * 8);
                    hkv_mma16816(o[f], ah, b);
                    hkv_mma16816(o[f], al, b);
                    hkv_mma16816(o[f + 1], ah, b + 2);
                    hkv_mma16816(o[f + 1], al, b + 2);
                }
            }
        }
        __syncthreads();   /* every warp is done with this buffer before it is loaded again */
    }

    if (wr0 >= nrows) return;   /* warp-uniform; no barrier follows */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int64_t row = wr0 + gid + 8 * r;
        if (row >= nrows) continue;
        const int64_t t = row / g;
        const int qhd = h * g + (int)(row - t * g);
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        if (tig == 0)
            lse[t * H + qhd] = l[r] > 0.0f ? (m[r] + log2f(l[r])) * 0.69314718055994531f : -INFINITY;
        float *op = out + t * ldo + (int64_t)qhd * d;
#pragma unroll
        for (int f = 0; f < NF; f++) {
            const int c = 8 * f + 2 * tig;
            if (c < d) op[c] = o[f][2 * r] * inv, op[c + 1] = o[f][2 * r + 1] * inv;
        }
    }
#else
    __trap();   /* built for less than sm_80: hkv_gpu_prefill_mma_unfit keeps it from launching */
#endif
}

/* Why the mma kernel cannot run this call here (NULL: it can). */
extern "C" const char *hkv_gpu_prefill_mma_unfit(int d, int vec16)
{
    if (d > 128) return "head size above 128 (d = 256 stays on the WMMA kernel)";
    if (!vec16) return "K/V rows not 16-byte aligned";
    return hkv_gpu_mma_arch_unfit((const void *)k_attn_prefill_mma<128>);
}

#define PM_LAUNCH(D)                                                                              \
    HKV_LAUNCH(k_attn_prefill_mma<D>, grid, PM_WARPS * 32, pm_smem_bytes(D, pm_cfg<D>::BN), st)(  \
        q, ldq, nq, n_head, g, d, p0, nk, k, v, ld, hs, qscale, out, ldo, lse)

extern "C" int hkv_gpu_prefill_mma(const float *q, int64_t ldq, int64_t nq, int n_head,
                                   int n_head_kv, int d, int64_t p0, int64_t nk, const uint16_t *k,
                                   const uint16_t *v, int64_t ld, int64_t hs, float qscale,
                                   float *out, int64_t ldo, float *lse, cudaStream_t st,
                                   hkv_err *err)
{
    const int g = n_head / n_head_kv;
    const int64_t bx = (nq * g + PM_BM - 1) / PM_BM;
    if (bx > 2147483647)
        return hkv_seterr(err, HKV_E_RANGE, "gpu prefill attention: %lld queries in one call; "
                          "split the chunk", (long long)nq);
    dim3 grid((unsigned)bx, (unsigned)n_head_kv);
    if (d <= 64) PM_LAUNCH(64);
    else PM_LAUNCH(128);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

/* Causal prefill attention, flash style: a block takes ATT_WARPS query rows
 * (token t, query head j of KV head h's group; consecutive rows share a
 * token, so the g heads of a group reuse every K/V tile) and walks the keys
 * [0, p0 + t_last] in tiles with an online softmax (attn_common.cuh). Memory
 * is O(tile) per block whatever the prompt length: a 128K-token prompt runs
 * as query chunks with a growing p0 and never forms an n x n matrix.
 * CUDA-core math (fp32 FMAs on fp16 K/V), not tensor cores: the correctness
 * baseline the faster kernel will be tested against. */
#include "attn_common.cuh"

extern "C" {
#include "gpu_kernels.h"
}

static __global__ void __launch_bounds__(ATT_WARPS * 32)
k_attn_prefill(const float *q, int64_t ldq, int64_t nq, int H, int g, int d, int64_t p0,
               const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs, float scale,
               float *out, int64_t ldo, float *lse)
{
    const int h = blockIdx.y;
    const int64_t nrows = nq * g, r0 = (int64_t)blockIdx.x * ATT_WARPS;
    const int64_t r = r0 + (threadIdx.x >> 5);
    const bool active = r < nrows;
    const int64_t rl = (r0 + ATT_WARPS < nrows ? r0 + ATT_WARPS : nrows) - 1;
    const int64_t kend = p0 + rl / g + 1;   /* the block's last token sees the most keys */
    const int64_t t = active ? r / g : 0;
    const int qh = h * g + (active ? (int)(r % g) : 0);
    hkv_att_block(k + h * hs, v + h * hs, ld, NULL, kend, d, scale, q + t * ldq + (int64_t)qh * d,
                  p0 + t + 1, out + t * ldo + (int64_t)qh * d, lse + t * H + qh, active);
}

extern "C" int hkv_gpu_attn_prefill(const float *q, int64_t ldq, int64_t nq, int n_head,
                                    int n_head_kv, int d, int64_t p0, const uint16_t *k,
                                    const uint16_t *v, int64_t ld, int64_t hs, float scale,
                                    float *out, int64_t ldo, float *lse, void *stream, hkv_err *err)
{
    if (!q || !k || !v || !out || !lse || nq < 0 || p0 < 0 || n_head_kv < 1 ||
        n_head < n_head_kv || n_head % n_head_kv || n_head_kv > 65535 ||
        ldq < (int64_t)n_head * d || ldo < (int64_t)n_head * d)
        return hkv_seterr(err, HKV_E_INVAL, "gpu prefill attention: bad arguments (%lld queries "
                          "at %lld, %d heads, %d KV heads, d=%d, strides %lld/%lld)", (long long)nq,
                          (long long)p0, n_head, n_head_kv, d, (long long)ldq, (long long)ldo);
    const char *why = hkv_att_check(d, k, v, ld, hs, 0);
    if (why) return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu prefill attention (d=%d, ld=%lld): %s",
                               d, (long long)ld, why);
    if (!nq) return HKV_OK;
    const int g = n_head / n_head_kv;
    const int64_t bx = (nq * g + ATT_WARPS - 1) / ATT_WARPS;
    if (bx > 2147483647)
        return hkv_seterr(err, HKV_E_RANGE, "gpu prefill attention: %lld queries in one call; "
                          "split the chunk", (long long)nq);
    dim3 grid((unsigned)bx, (unsigned)n_head_kv);
    HKV_LAUNCH(k_attn_prefill, grid, ATT_WARPS * 32, hkv_att_smem_bytes(d), hkv_stream(stream))(
        q, ldq, nq, n_head, g, d, p0, k, v, ld, hs, scale, out, ldo, lse);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

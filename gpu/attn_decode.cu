/* Decode attention (one query token per sequence) over a KV set per
 * (sequence, KV head): the near tier's sinks + ring rows in order, or a
 * gathered selection. One block per (sequence, KV head) with one warp per
 * query head of the group (attn_common.cuh), so a K/V tile is read once for
 * the whole group. Also the exact merge of two (out, lse) partials. */
#include "attn_common.cuh"

extern "C" {
#include "gpu_kernels.h"
}

static __global__ void __launch_bounds__(ATT_WARPS * 32)
k_attn_decode(const float *q, int H, int KH, int g, int d, const uint16_t *k, const uint16_t *v,
              int64_t ld, int64_t hs, int64_t ss, const int32_t *n_rows, const int32_t *idx,
              int64_t idx_ld, float scale, float *out, float *lse)
{
    const int64_t u = blockIdx.x;
    const int64_t s = u / KH;
    const int h = (int)(u % KH);
    const int j = blockIdx.y * ATT_WARPS + (threadIdx.x >> 5);
    const bool active = j < g;
    const int64_t n = n_rows[u] > 0 ? n_rows[u] : 0;
    const int64_t qh = s * H + (int64_t)h * g + (active ? j : 0);
    hkv_att_block(k + s * ss + h * hs, v + s * ss + h * hs, ld, idx ? idx + u * idx_ld : NULL, n,
                  d, scale, q + qh * d, n, out + qh * d, lse + qh, active);
}

extern "C" int hkv_gpu_attn_decode(const float *q, int n_seq, int n_head, int n_head_kv, int d,
                                   const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs,
                                   int64_t ss, const int32_t *n_rows, const int32_t *idx,
                                   int64_t idx_ld, float scale, float *out, float *lse,
                                   void *stream, hkv_err *err)
{
    if (!q || !k || !v || !n_rows || !out || !lse || n_seq < 0 || n_head_kv < 1 ||
        n_head < n_head_kv || n_head % n_head_kv || (idx && idx_ld < 1))
        return hkv_seterr(err, HKV_E_INVAL, "gpu decode attention: bad arguments (%d sequences, "
                          "%d heads, %d KV heads, idx stride %lld)", n_seq, n_head, n_head_kv,
                          (long long)idx_ld);
    const char *why = hkv_att_check(d, k, v, ld, hs, ss);
    if (why) return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu decode attention (d=%d, ld=%lld): %s",
                               d, (long long)ld, why);
    if (!n_seq) return HKV_OK;
    if ((int64_t)n_seq * n_head_kv > 2147483647 || n_head / n_head_kv > 65535 * ATT_WARPS)
        return hkv_seterr(err, HKV_E_RANGE, "gpu decode attention: %d x %d (sequence, KV head) "
                          "pairs exceed a grid", n_seq, n_head_kv);
    const int g = n_head / n_head_kv, warps = g < ATT_WARPS ? g : ATT_WARPS;
    dim3 grid((unsigned)((int64_t)n_seq * n_head_kv), (unsigned)((g + ATT_WARPS - 1) / ATT_WARPS));
    HKV_LAUNCH(k_attn_decode, grid, warps * 32, hkv_att_smem_bytes(d), hkv_stream(stream))(
        q, n_head, n_head_kv, g, d, k, v, ld, hs, ss, n_rows, idx, idx_ld, scale, out, lse);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

/* One warp per row: every lane reads both lse values before lane 0 writes
 * lse_a, so the in-place update has no read/write race. */
static __global__ void k_attn_merge(float *out_a, float *lse_a, const float *out_b, const float *lse_b,
                             int64_t n, int d)
{
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < n;
         row += step) {
        float *oa = out_a + row * d;
        const float *ob = out_b + row * d;
        const float la = lse_a[row], lb = lse_b[row];
        __syncwarp();
        if (lb == -INFINITY) {
            if (la == -INFINITY)   /* both empty: the contract's zero output */
                for (int c = lane; c < d; c += 32) oa[c] = 0.0f;
            continue;
        }
        if (la == -INFINITY) {
            for (int c = lane; c < d; c += 32) oa[c] = ob[c];
            if (lane == 0) lse_a[row] = lb;
            continue;
        }
        const float m = fmaxf(la, lb), wa = expf(la - m), wb = expf(lb - m);   /* one is 1 */
        const float inv = 1.0f / (wa + wb), ca = wa * inv, cb = wb * inv;
        for (int c = lane; c < d; c += 32) oa[c] = ca * oa[c] + cb * ob[c];
        if (lane == 0) lse_a[row] = m + log1pf(fminf(wa, wb));
    }
}

extern "C" int hkv_gpu_attn_merge(float *out_a, float *lse_a, const float *out_b,
                                  const float *lse_b, int64_t n, int d, void *stream, hkv_err *err)
{
    if (!out_a || !lse_a || !out_b || !lse_b || n < 0 || d < 1)
        return hkv_seterr(err, HKV_E_INVAL, "gpu attention merge: bad arguments (n %lld, d %d)",
                          (long long)n, d);
    if (!n) return HKV_OK;
    const int rows_per_block = 8;
    HKV_LAUNCH(k_attn_merge, hkv_grid1(n, rows_per_block), rows_per_block * 32, 0,
               hkv_stream(stream))(
        out_a, lse_a, out_b, lse_b, n, d);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

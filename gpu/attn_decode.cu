/* Decode attention (one query token per sequence) over a KV set per
 * (sequence, KV head): the near tier's sinks + ring rows in order, or a
 * gathered selection. A block per (sequence, KV head, split of the keys)
 * with one warp per query head of the group (attn_common.cuh), so a K/V
 * tile is read once for the whole group, with 128-bit loads where the rows
 * allow. Also the exact merge of two (out, lse) partials. */
#include "attn_common.cuh"

extern "C" {
#include "gpu_kernels.h"
}

/* Flash-decoding: at batch 1 an 8B model has 8 KV heads, 8 blocks for a
 * device of 128 SMs. The key range of each (sequence, KV head) is then cut
 * into n_split chunks of whole tiles, one block each (grid z); each writes
 * its partial (out, lse) to the workspace and k_attn_combine merges them
 * exactly. The lengths live on the device (n_rows), so the chunking is done
 * per block from its own length: chunk = ceil(n / n_split) rounded up to a
 * tile, and a block past the end writes the empty partial. */
template <bool VEC>
static __global__ void __launch_bounds__(ATT_WARPS * 32)
k_attn_decode(const float *q, int H, int KH, int g, int d, const uint16_t *k, const uint16_t *v,
              int64_t ld, int64_t hs, int64_t ss, const int32_t *n_rows, const int32_t *idx,
              int64_t idx_ld, float scale, float *out, float *lse, int n_split, int64_t part)
{
    const int64_t u = blockIdx.x;
    const int64_t s = u / KH;
    const int h = (int)(u % KH);
    const int j = blockIdx.y * ATT_WARPS + (threadIdx.x >> 5);
    const bool active = j < g;
    const int64_t n = n_rows[u] > 0 ? n_rows[u] : 0;
    int64_t k0 = 0, k1 = n;
    if (n_split > 1) {
        const int64_t per = (n + n_split - 1) / n_split;
        const int64_t chunk = (per + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
        k0 = (int64_t)blockIdx.z * chunk;
        if (k0 > n) k0 = n;
        k1 = k0 + chunk < n ? k0 + chunk : n;
        out += blockIdx.z * part * d;   /* this split's partial in the workspace */
        lse += blockIdx.z * part;
    }
    const int64_t qh = s * H + (int64_t)h * g + (active ? j : 0);
    /* idx_ld == 0: idx[u] is where this pair's run of rows starts (one
     * offset, folded into the base, so no list pointer stays live) */
    int64_t off = s * ss + h * hs;
    const int32_t *ix = NULL;
    if (idx) {
        if (idx_ld) ix = idx + u * idx_ld;
        else off += (int64_t)idx[u] * ld;
    }
    hkv_att_block_range<VEC>(k + off, v + off, ld, ix, k0, k1, d, scale, q + qh * d, k1,
                             out + qh * d, lse + qh, active);
}

/* The n_split partials of each of n rows into (out, lse): one warp per row,
 * the pairwise merge's formula over all of them at once. */
static __global__ void k_attn_combine(const float *ws_out, const float *ws_lse, int n_split,
                                      int64_t n, int d, float *out, float *lse)
{
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < n;
         row += step) {
        /* lane z holds split z's lse (n_split <= 32), then its weight */
        const float lz = lane < n_split ? ws_lse[lane * n + row] : -INFINITY;
        const float m = hkv_warp_max(lz);
        if (m == -INFINITY) {   /* no split saw a key */
            for (int c = lane; c < d; c += 32) out[row * d + c] = 0.0f;
            if (lane == 0) lse[row] = -INFINITY;
            continue;
        }
        const float wz = expf(lz - m);   /* -inf: 0 */
        const float sum = hkv_warp_sum(wz), inv = 1.0f / sum;
        for (int c = lane; c < d; c += 32) {
            float a = 0.0f;
            for (int z = 0; z < n_split; z++) {
                const float w = __shfl_sync(0xffffffffu, wz, z);
                if (w > 0.0f) a = fmaf(w * inv, ws_out[(z * n + row) * d + c], a);
            }
            out[row * d + c] = a;
        }
        if (lane == 0) lse[row] = m + logf(sum);
    }
}

extern "C" int hkv_gpu_attn_decode_splits(int sm_count, int n_seq, int n_head, int n_head_kv,
                                          int64_t max_rows)
{
    if (sm_count < 1 || n_seq < 1 || n_head_kv < 1 || n_head < n_head_kv || max_rows < 1) return 1;
    const int64_t g = n_head / n_head_kv;
    const int64_t blocks = (int64_t)n_seq * n_head_kv * ((g + ATT_WARPS - 1) / ATT_WARPS);
    /* Two waves of blocks (one block of 256 threads per SM leaves room for a
     * second), and no split under two tiles: a shorter one costs more in its
     * partial's write and the combine than it saves. */
    int64_t want = (2 * (int64_t)sm_count + blocks - 1) / blocks;
    const int64_t most = max_rows / (2 * ATT_TILE);
    if (want > most) want = most;
    if (want > HKV_GPU_DECODE_MAX_SPLIT) want = HKV_GPU_DECODE_MAX_SPLIT;
    return want < 1 ? 1 : (int)want;
}

extern "C" size_t hkv_gpu_attn_decode_ws_bytes(int n_seq, int n_head, int d, int n_split)
{
    if (n_split <= 1 || n_seq < 1 || n_head < 1 || d < 1) return 0;
    return (size_t)n_split * n_seq * n_head * ((size_t)d + 1) * sizeof(float);
}

extern "C" int hkv_gpu_attn_decode_split(const float *q, int n_seq, int n_head, int n_head_kv,
                                         int d, const uint16_t *k, const uint16_t *v, int64_t ld,
                                         int64_t hs, int64_t ss, const int32_t *n_rows,
                                         const int32_t *idx, int64_t idx_ld, float scale,
                                         float *out, float *lse, int n_split, void *ws,
                                         size_t ws_bytes, void *stream, hkv_err *err)
{
    if (!q || !k || !v || !n_rows || !out || !lse || n_seq < 0 || n_head_kv < 1 ||
        n_head < n_head_kv || n_head % n_head_kv || (idx && idx_ld < 0))
        return hkv_seterr(err, HKV_E_INVAL, "gpu decode attention: bad arguments (%d sequences, "
                          "%d heads, %d KV heads, idx stride %lld)", n_seq, n_head, n_head_kv,
                          (long long)idx_ld);
    if (n_split < 1 || n_split > HKV_GPU_DECODE_MAX_SPLIT)
        return hkv_seterr(err, HKV_E_INVAL, "gpu decode attention: %d splits of the key range "
                          "(1..%d)", n_split, HKV_GPU_DECODE_MAX_SPLIT);
    const char *why = hkv_att_check(d, k, v, ld, hs, ss);
    if (why) return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu decode attention (d=%d, ld=%lld): %s",
                               d, (long long)ld, why);
    if (!n_seq) return HKV_OK;
    if ((int64_t)n_seq * n_head_kv > 2147483647 || n_head / n_head_kv > 65535 * ATT_WARPS)
        return hkv_seterr(err, HKV_E_RANGE, "gpu decode attention: %d x %d (sequence, KV head) "
                          "pairs exceed a grid", n_seq, n_head_kv);
    const size_t need = hkv_gpu_attn_decode_ws_bytes(n_seq, n_head, d, n_split);
    if (need && (!ws || ws_bytes < need || ((uintptr_t)ws & 15)))
        return hkv_seterr(err, HKV_E_INVAL, "gpu decode attention: %d splits need a 16-byte "
                          "aligned workspace of %zu bytes, got %zu%s", n_split, need,
                          ws ? ws_bytes : (size_t)0, ws ? "" : " (none)");
    const int g = n_head / n_head_kv, warps = g < ATT_WARPS ? g : ATT_WARPS;
    const int64_t rows = (int64_t)n_seq * n_head;
    float *po = n_split > 1 ? (float *)ws : out;
    float *pl = n_split > 1 ? po + (size_t)n_split * rows * d : lse;
    dim3 grid((unsigned)((int64_t)n_seq * n_head_kv), (unsigned)((g + ATT_WARPS - 1) / ATT_WARPS),
              (unsigned)n_split);
    if (hkv_att_vec_ok(k, v, ld, hs, ss))
        HKV_LAUNCH(k_attn_decode<true>, grid, warps * 32, hkv_att_smem_bytes(d), hkv_stream(stream))(
            q, n_head, n_head_kv, g, d, k, v, ld, hs, ss, n_rows, idx, idx_ld, scale, po, pl,
            n_split, rows);
    else
        HKV_LAUNCH(k_attn_decode<false>, grid, warps * 32, hkv_att_smem_bytes(d),
                   hkv_stream(stream))(
            q, n_head, n_head_kv, g, d, k, v, ld, hs, ss, n_rows, idx, idx_ld, scale, po, pl,
            n_split, rows);
    HKV_LAUNCH_CHECK(err);
    if (n_split > 1) {
        const int rows_per_block = 8;
        HKV_LAUNCH(k_attn_combine, hkv_grid1(rows, rows_per_block), rows_per_block * 32, 0,
                   hkv_stream(stream))(po, pl, n_split, rows, d, out, lse);
        HKV_LAUNCH_CHECK(err);
    }
    return HKV_OK;
}

extern "C" int hkv_gpu_attn_decode(const float *q, int n_seq, int n_head, int n_head_kv, int d,
                                   const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs,
                                   int64_t ss, const int32_t *n_rows, const int32_t *idx,
                                   int64_t idx_ld, float scale, float *out, float *lse,
                                   void *stream, hkv_err *err)
{
    return hkv_gpu_attn_decode_split(q, n_seq, n_head, n_head_kv, d, k, v, ld, hs, ss, n_rows, idx,
                                     idx_ld, scale, out, lse, 1, NULL, 0, stream, err);
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

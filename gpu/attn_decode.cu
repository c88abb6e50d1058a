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
k_attn_decode(const float *q, int64_t ldq, int H, int KH, int g, int d, const uint16_t *k,
              const uint16_t *v, int64_t ld, int64_t hs, int64_t ss, const int32_t *n_rows,
              const int32_t *idx, int64_t idx_ld, float scale, float *out, float *lse, int n_split,
              int64_t part)
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
    const float *qp = q + s * ldq + ((int64_t)h * g + (active ? j : 0)) * d;
    hkv_att_block_range<VEC>(k + off, v + off, ld, ix, k0, k1, d, scale, qp, k1,
                             out + qh * d, lse + qh, active);
}

/* The decode kernel for 16-byte aligned rows and d in {32, 64, 128, 256}
 * (every model hetkv loads): D / 8 lanes read one key row, 16 bytes (8
 * halves) each, straight from global memory, so a warp reads 32 / (D / 8)
 * rows at once and no tile is staged or synchronised on. Each lane group
 * takes batches of KB keys (all loads of a batch issued before any
 * arithmetic: 2 KB 16-byte loads in flight per lane), scores them for all G
 * query heads of the block (q's 8 dims per head kept in registers, the dot
 * reduced over the group by shuffles), and folds them into its own online
 * softmax state per head. The groups' states merge exactly at the end: by
 * shuffles within a warp, then through shared memory across the warps.
 * Batches are dealt to the warps in turn, so the rows a block reads at a
 * time are contiguous. The old kernel (k_attn_decode: a warp per query head,
 * 32-key tiles staged in shared memory, a lane per key with a sequential
 * d-long dot product) read a layer's 8K-row near tier at ~300 GB/s on an
 * H200 (docs/GPU_MEASURED.md); it stays for other head sizes and rows at a
 * 4-byte stride. */
#define DEC_WARPS 8

/* Merges online-softmax state (mo, lo, ao) into (m, l, a) exactly. */
__device__ __forceinline__ void dec_fold(float &m, float &l, float *a, float mo, float lo,
                                         const float *ao)
{
    const float mn = fmaxf(m, mo);
    if (mn == -INFINITY) return;   /* both empty */
    const float x = expf(m - mn), y = expf(mo - mn);   /* -inf gives 0 */
    l = l * x + lo * y;
#pragma unroll
    for (int c = 0; c < 8; c++) a[c] = a[c] * x + ao[c] * y;
    m = mn;
}

template <int D, int G>
static __global__ void __launch_bounds__(DEC_WARPS * 32)
k_attn_decode_rows(const float *q, int64_t ldq, int H, int KH, int g, const uint16_t *k,
                   const uint16_t *v, int64_t ld, int64_t hs, int64_t ss, const int32_t *n_rows,
                   const int32_t *idx, int64_t idx_ld, float scale, float *out, float *lse,
                   int n_split, int64_t part)
{
    constexpr int LG = D / 8, NG = 32 / LG;   /* lanes per row, row groups per warp */
    constexpr int KB = G <= 4 ? 4 : 2;        /* keys per group per batch (registers) */
    __shared__ float sm_m[DEC_WARPS][G], sm_l[DEC_WARPS][G], sm_a[DEC_WARPS][G][D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane / LG, li = lane % LG;
    const int64_t u = blockIdx.x, s = u / KH;
    const int h = (int)(u % KH), j0 = blockIdx.y * G;
    const int nh = g - j0 < G ? g - j0 : G;
    const int64_t n = n_rows[u] > 0 ? n_rows[u] : 0;
    int64_t k0 = 0, k1 = n;
    if (n_split > 1) {   /* the same chunks as k_attn_decode */
        const int64_t per = (n + n_split - 1) / n_split;
        const int64_t chunk = (per + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
        k0 = (int64_t)blockIdx.z * chunk;
        if (k0 > n) k0 = n;
        k1 = k0 + chunk < n ? k0 + chunk : n;
        out += blockIdx.z * part * D;
        lse += blockIdx.z * part;
    }
    int64_t off = s * ss + h * hs + li * 8;
    const int32_t *ix = NULL;
    if (idx) {
        if (idx_ld) ix = idx + u * idx_ld;
        else off += (int64_t)idx[u] * ld;
    }
    const int64_t qh0 = s * H + (int64_t)h * g + j0;
    float qr[G][8], m[G], l[G], acc[G][8];
#pragma unroll
    for (int j = 0; j < G; j++) {
        const float *qp = q + s * ldq + ((int64_t)h * g + j0 + (j < nh ? j : 0)) * D + li * 8;
        const float4 a = *(const float4 *)qp, b = *(const float4 *)(qp + 4);
        qr[j][0] = a.x, qr[j][1] = a.y, qr[j][2] = a.z, qr[j][3] = a.w;
        qr[j][4] = b.x, qr[j][5] = b.y, qr[j][6] = b.z, qr[j][7] = b.w;
        m[j] = -INFINITY, l[j] = 0.0f;
#pragma unroll
        for (int c = 0; c < 8; c++) acc[j][c] = 0.0f;
    }
    /* warp-uniform trip count: a group past the end masks its keys */
    for (int64_t b0 = k0 + (int64_t)warp * NG * KB; b0 < k1; b0 += (int64_t)DEC_WARPS * NG * KB) {
        uint4 kx[KB], vx[KB];
#pragma unroll
        for (int t = 0; t < KB; t++) {
            const int64_t i = b0 + sub * KB + t;
            kx[t] = vx[t] = make_uint4(0, 0, 0, 0);
            if (i < k1) {
                const int64_t r = ix ? (int64_t)ix[i] : i;
                kx[t] = __ldg((const uint4 *)(k + off + r * ld));
                vx[t] = __ldg((const uint4 *)(v + off + r * ld));
            }
        }
        float sc[KB][G];
#pragma unroll
        for (int t = 0; t < KB; t++) {
            const __half2 *kh = reinterpret_cast<const __half2 *>(&kx[t]);
            float kf[8];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float2 f = __half22float2(kh[c]);
                kf[2 * c] = f.x, kf[2 * c + 1] = f.y;
            }
#pragma unroll
            for (int j = 0; j < G; j++) {
                float a = 0.0f;
#pragma unroll
                for (int c = 0; c < 8; c++) a = fmaf(qr[j][c], kf[c], a);
#pragma unroll
                for (int o = LG / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
                sc[t][j] = b0 + sub * KB + t < k1 ? a * scale : -INFINITY;
            }
        }
#pragma unroll
        for (int j = 0; j < G; j++) {
            float mx = sc[0][j];
#pragma unroll
            for (int t = 1; t < KB; t++) mx = fmaxf(mx, sc[t][j]);
            const float mn = fmaxf(m[j], mx);
            if (mn == -INFINITY) continue;   /* nothing finite yet: no -inf - -inf */
            const float alpha = expf(m[j] - mn);
            l[j] *= alpha;
#pragma unroll
            for (int c = 0; c < 8; c++) acc[j][c] *= alpha;
#pragma unroll
            for (int t = 0; t < KB; t++) {
                const float p = expf(sc[t][j] - mn);   /* masked keys give 0 */
                const __half2 *vh = reinterpret_cast<const __half2 *>(&vx[t]);
                l[j] += p;
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const float2 f = __half22float2(vh[c]);
                    acc[j][2 * c] = fmaf(p, f.x, acc[j][2 * c]);
                    acc[j][2 * c + 1] = fmaf(p, f.y, acc[j][2 * c + 1]);
                }
            }
            m[j] = mn;
        }
    }
    /* the warp's groups into one state (lanes li of every group then agree) */
#pragma unroll
    for (int o = LG; o < 32; o <<= 1)
#pragma unroll
        for (int j = 0; j < G; j++) {
            float ao[8];
#pragma unroll
            for (int c = 0; c < 8; c++) ao[c] = __shfl_xor_sync(0xffffffffu, acc[j][c], o);
            const float mo = __shfl_xor_sync(0xffffffffu, m[j], o);
            const float lo = __shfl_xor_sync(0xffffffffu, l[j], o);
            dec_fold(m[j], l[j], acc[j], mo, lo, ao);
        }
    if (sub == 0)
#pragma unroll
        for (int j = 0; j < G; j++) {
#pragma unroll
            for (int c = 0; c < 8; c++) sm_a[warp][j][li * 8 + c] = acc[j][c];
            if (li == 0) sm_m[warp][j] = m[j], sm_l[warp][j] = l[j];
        }
    __syncthreads();
    /* the warps' states into the block's partial: a thread per (head, dim) */
    for (int e = threadIdx.x; e < nh * D; e += DEC_WARPS * 32) {
        const int j = e / D, c = e % D;
        float mm = -INFINITY;
        for (int w = 0; w < DEC_WARPS; w++) mm = fmaxf(mm, sm_m[w][j]);
        float ll = 0.0f, a = 0.0f;
        if (mm != -INFINITY)
            for (int w = 0; w < DEC_WARPS; w++) {
                const float x = expf(sm_m[w][j] - mm);   /* an empty warp's -inf gives 0 */
                ll += sm_l[w][j] * x;
                a += sm_a[w][j][c] * x;
            }
        out[(qh0 + j) * D + c] = ll > 0.0f ? a / ll : 0.0f;
        if (c == 0) lse[qh0 + j] = ll > 0.0f ? mm + logf(ll) : -INFINITY;
    }
}

/* Launches k_attn_decode_rows<D, G> (the template arguments are compile-time). */
template <int D, int G>
static void dec_rows_launch(dim3 grid, cudaStream_t st, const float *q, int64_t ldq, int H, int KH,
                            int g, const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs,
                            int64_t ss, const int32_t *n_rows, const int32_t *idx, int64_t idx_ld,
                            float scale, float *out, float *lse, int n_split, int64_t part)
{
    HKV_LAUNCH(k_attn_decode_rows<D HKV_COMMA G>, grid, DEC_WARPS * 32, 0, st)(
        q, ldq, H, KH, g, k, v, ld, hs, ss, n_rows, idx, idx_ld, scale, out, lse, n_split, part);
}
typedef void (*dec_rows_fn)(dim3, cudaStream_t, const float *, int64_t, int, int, int, const uint16_t *,
                            const uint16_t *, int64_t, int64_t, int64_t, const int32_t *,
                            const int32_t *, int64_t, float, float *, float *, int, int64_t);
/* [d = 32, 64, 128, 256][G = 1, 2, 4, 8]; d = 256 stops at G = 4 (shared memory) */
static const dec_rows_fn dec_rows_fns[4][4] = {
    {dec_rows_launch<32, 1>, dec_rows_launch<32, 2>, dec_rows_launch<32, 4>, dec_rows_launch<32, 8>},
    {dec_rows_launch<64, 1>, dec_rows_launch<64, 2>, dec_rows_launch<64, 4>, dec_rows_launch<64, 8>},
    {dec_rows_launch<128, 1>, dec_rows_launch<128, 2>, dec_rows_launch<128, 4>,
     dec_rows_launch<128, 8>},
    {dec_rows_launch<256, 1>, dec_rows_launch<256, 2>, dec_rows_launch<256, 4>, NULL},
};

/* The n_split partials of each of n rows into (out, lse): a warp per (row,
 * 32 columns), lane z holding split z's weight. Each lane sums its column
 * over the splits with loads that do not wait on each other (no branch, the
 * loop unrolled: several in flight) and scales once at the end. One warp
 * per row with a weight test before each load, as before, waited one memory
 * latency a split: on an H100 the kernel benchmark's fit put it at 0.54 us
 * a split, 17 us of a 4K-row single-sequence step at 32 splits. An empty
 * split's partial is 0 with weight 0 (the split kernels write every row). */
static __global__ void k_attn_combine(const float *ws_out, const float *ws_lse, int n_split,
                                      int64_t n, int d, float *out, float *lse)
{
    const int lane = threadIdx.x & 31, cw = (d + 31) / 32;
    const int64_t step = (int64_t)gridDim.x * (blockDim.x >> 5), units = n * cw;
    for (int64_t w = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); w < units;
         w += step) {
        const int64_t row = w / cw;
        const int c = (int)(w % cw) * 32 + lane;
        /* lane z holds split z's lse (n_split <= 32), then its weight */
        const float lz = lane < n_split ? ws_lse[lane * n + row] : -INFINITY;
        const float m = hkv_warp_max(lz);
        if (m == -INFINITY) {   /* no split saw a key */
            if (c < d) out[row * d + c] = 0.0f;
            if (c == 0) lse[row] = -INFINITY;
            continue;
        }
        const float wz = expf(lz - m);   /* -inf: 0 */
        const float sum = hkv_warp_sum(wz);
        const float *src = ws_out + row * d + (c < d ? c : 0);
        const int64_t zs = n * d;
        float a = 0.0f;
#pragma unroll 8
        for (int z = 0; z < n_split; z++) a = fmaf(__shfl_sync(0xffffffffu, wz, z), src[z * zs], a);
        if (c < d) out[row * d + c] = a / sum;
        if (c == 0) lse[row] = m + logf(sum);
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

extern "C" int hkv_gpu_attn_decode_split_q(const float *q, int64_t ldq, int n_seq, int n_head,
                                           int n_head_kv, int d, const uint16_t *k,
                                           const uint16_t *v, int64_t ld, int64_t hs, int64_t ss,
                                           const int32_t *n_rows, const int32_t *idx,
                                           int64_t idx_ld, float scale, float *out, float *lse,
                                           int n_split, void *ws, size_t ws_bytes, void *stream,
                                           hkv_err *err)
{
    if (!q || !k || !v || !n_rows || !out || !lse || n_seq < 0 || n_head_kv < 1 ||
        n_head < n_head_kv || n_head % n_head_kv || (idx && idx_ld < 0) ||
        ldq < (int64_t)n_head * d || ldq % 4)
        return hkv_seterr(err, HKV_E_INVAL, "gpu decode attention: bad arguments (%d sequences, "
                          "%d heads, %d KV heads, idx stride %lld, q stride %lld)", n_seq, n_head,
                          n_head_kv, (long long)idx_ld, (long long)ldq);
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
    const int di = d == 32 ? 0 : d == 64 ? 1 : d == 128 ? 2 : d == 256 ? 3 : -1;
    const int gi = g <= 1 ? 0 : g <= 2 ? 1 : g <= 4 || di == 3 ? 2 : 3;
    if (di >= 0 && hkv_att_vec_ok(k, v, ld, hs, ss) && ((uintptr_t)q & 15) == 0) {
        const int G = 1 << gi;
        dim3 rg((unsigned)((int64_t)n_seq * n_head_kv), (unsigned)((g + G - 1) / G), (unsigned)n_split);
        dec_rows_fns[di][gi](rg, hkv_stream(stream), q, ldq, n_head, n_head_kv, g, k, v, ld, hs, ss,
                             n_rows, idx, idx_ld, scale, po, pl, n_split, rows);
    } else {
    dim3 grid((unsigned)((int64_t)n_seq * n_head_kv), (unsigned)((g + ATT_WARPS - 1) / ATT_WARPS),
              (unsigned)n_split);
    if (hkv_att_vec_ok(k, v, ld, hs, ss))
        HKV_LAUNCH(k_attn_decode<true>, grid, warps * 32, hkv_att_smem_bytes(d), hkv_stream(stream))(
            q, ldq, n_head, n_head_kv, g, d, k, v, ld, hs, ss, n_rows, idx, idx_ld, scale, po, pl,
            n_split, rows);
    else
        HKV_LAUNCH(k_attn_decode<false>, grid, warps * 32, hkv_att_smem_bytes(d),
                   hkv_stream(stream))(
            q, ldq, n_head, n_head_kv, g, d, k, v, ld, hs, ss, n_rows, idx, idx_ld, scale, po, pl,
            n_split, rows);
    }
    HKV_LAUNCH_CHECK(err);
    if (n_split > 1) {
        const int warps_per_block = 8;
        HKV_LAUNCH(k_attn_combine, hkv_grid1(rows * ((d + 31) / 32), warps_per_block),
                   warps_per_block * 32, 0, hkv_stream(stream))(po, pl, n_split, rows, d, out, lse);
        HKV_LAUNCH_CHECK(err);
    }
    return HKV_OK;
}

extern "C" int hkv_gpu_attn_decode_split(const float *q, int n_seq, int n_head, int n_head_kv,
                                         int d, const uint16_t *k, const uint16_t *v, int64_t ld,
                                         int64_t hs, int64_t ss, const int32_t *n_rows,
                                         const int32_t *idx, int64_t idx_ld, float scale,
                                         float *out, float *lse, int n_split, void *ws,
                                         size_t ws_bytes, void *stream, hkv_err *err)
{
    return hkv_gpu_attn_decode_split_q(q, (int64_t)n_head * d, n_seq, n_head, n_head_kv, d, k, v,
                                       ld, hs, ss, n_rows, idx, idx_ld, scale, out, lse, n_split,
                                       ws, ws_bytes, stream, err);
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

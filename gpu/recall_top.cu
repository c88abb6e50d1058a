/* Top-k cosine recall over FIFO tables of unit rows, for the CPU-GPU
 * pipeline (pipeline/cuda_recall.c): the device scores every valid row of a
 * (sequence, layer)'s table against the step's query heads and hands the
 * best k row slots, with their scores, to the host, which does the rest of
 * the selection. Scores over (query row x KV head, slot chunk) blocks, then
 * one block per (query row, KV head) for the top k; each query row names
 * its own table (sequences may have tables of different sizes). */
#include <math.h>

#include "recall_common.cuh"

extern "C" {
#include "gpu_forward.h"
}

/* Row i's table of KV head h: its clamped size, FIFO head and count. */
static __device__ void rt_table(const hkv_gpu_recall_row *R, int h, int64_t C_max, int64_t *C,
                                int64_t *head, int64_t *count)
{
    const int64_t c = R->C < 0 ? 0 : R->C > C_max ? C_max : R->C;
    int64_t hd = c ? R->fifo[2 * h] % c : 0, n = c ? R->fifo[2 * h + 1] : 0;
    n = n < 0 ? 0 : n > c ? c : n;
    if (hd < 0) hd += c;
    *C = c, *head = hd, *count = n;
}

/* Scores of (row, KV head) blockIdx.x, slots blockIdx.y * RC_SCORE_SLOTS on. */
static __global__ void __launch_bounds__(RC_THREADS)
k_recall_scores(const hkv_gpu_recall_row *rows, const float *q, int64_t ld_q, int H, int KH, int d,
                int64_t C_max, float *score_ws)
{
    HKV_DYN_SHARED(float, qn);   /* [g][d] unit query heads */
    const int64_t u = blockIdx.x, i = u / KH, i0 = (int64_t)blockIdx.y * RC_SCORE_SLOTS;
    const int h = (int)(u % KH), g = H / KH;
    const hkv_gpu_recall_row R = rows[i];
    int64_t C, head, count;
    rt_table(&R, h, C_max, &C, &head, &count);
    if (i0 >= count) return;   /* block-uniform */
    rc_unit_heads(q + R.row * ld_q + (int64_t)h * g * d, g, d, qn);
    __syncthreads();
    for (int64_t c0 = i0; c0 < count; c0 += (int64_t)gridDim.y * RC_SCORE_SLOTS)
        rc_score_slots(qn, g, d, R.tab + (int64_t)h * g * d, (int64_t)H * d, head, count, C,
                       score_ws + u * C_max, c0, c0 + RC_SCORE_SLOTS);
}

static __global__ void __launch_bounds__(RC_THREADS)
k_recall_top(const hkv_gpu_recall_row *rows, int KH, int64_t k_cap, int64_t C_max,
             float *score_ws, int32_t *slot, float *score, int32_t *n_top)
{
    const int64_t u = blockIdx.x, i = u / KH;
    const int h = (int)(u % KH);
    const hkv_gpu_recall_row R = rows[i];
    const int64_t at = R.row * KH + h;   /* outputs are indexed by the batch row */
    int64_t C, head, count;
    rt_table(&R, h, C_max, &C, &head, &count);
    float *sc = score_ws + u * C_max;   /* k_recall_scores', ordered by the stream */
    const int64_t k = R.k < count ? (R.k < k_cap ? R.k : k_cap) : count;
    int64_t n = 0;
    for (; n < k; n++) {
        float v;
        const int p = rc_pick(sc, count, &v);
        if (p < 0) break;
        if (threadIdx.x == 0) {
            slot[at * k_cap + n] = (int32_t)((head + p) % C);
            score[at * k_cap + n] = v;
        }
    }
    if (threadIdx.x == 0) n_top[at] = (int32_t)n;
}

extern "C" size_t hkv_gpu_recall_top_ws_bytes(int64_t n_rows, int n_head_kv, int64_t C_max)
{
    if (n_rows < 0 || n_head_kv < 1 || C_max < 0) return 0;
    return (size_t)n_rows * (size_t)n_head_kv * (size_t)C_max * sizeof(float);
}

extern "C" int hkv_gpu_recall_top(const hkv_gpu_recall_row *rows, int64_t n_rows, const float *q,
                                  int64_t ld_q, int n_head, int n_head_kv, int d, int64_t k_cap,
                                  int64_t C_max, int32_t *slot, float *score, int32_t *n_top,
                                  void *ws, size_t ws_bytes, void *stream, hkv_err *err)
{
    if (!rows || !q || !slot || !score || !n_top || !ws || n_rows < 0 || n_head_kv < 1 ||
        n_head < n_head_kv || n_head % n_head_kv || d < 1 || ld_q < (int64_t)n_head * d ||
        k_cap < 1 || C_max < 1 || C_max > 2147483647)
        return hkv_seterr(err, HKV_E_INVAL, "gpu recall: bad arguments (%lld rows, %d/%d heads, "
                          "d=%d, k cap %lld, C max %lld)", (long long)n_rows, n_head, n_head_kv, d,
                          (long long)k_cap, (long long)C_max);
    if (!n_rows) return HKV_OK;
    const size_t need = hkv_gpu_recall_top_ws_bytes(n_rows, n_head_kv, C_max);
    if (ws_bytes < need)
        return hkv_seterr(err, HKV_E_INVAL, "gpu recall: workspace of %zu bytes, %zu needed",
                          ws_bytes, need);
    if (n_rows * n_head_kv > 2147483647)
        return hkv_seterr(err, HKV_E_RANGE, "gpu recall: %lld x %d (row, KV head) pairs exceed a "
                          "grid", (long long)n_rows, n_head_kv);
    const int g = n_head / n_head_kv;
    const size_t smem = (size_t)g * d * sizeof(float);
    if (smem > 48 * 1024)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "gpu recall: a group of %d heads of %d needs "
                          "%zu bytes of shared memory (48 KB max)", g, d, smem);
    const dim3 grid((unsigned)(n_rows * n_head_kv), rc_score_chunks(C_max));
    HKV_LAUNCH(k_recall_scores, grid, RC_THREADS, smem, hkv_stream(stream))(
        rows, q, ld_q, n_head, n_head_kv, d, C_max, (float *)ws);
    HKV_LAUNCH_CHECK(err);
    HKV_LAUNCH(k_recall_top, (unsigned)(n_rows * n_head_kv), RC_THREADS, 0, hkv_stream(stream))(
        rows, n_head_kv, k_cap, C_max, (float *)ws, slot, score, n_top);
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

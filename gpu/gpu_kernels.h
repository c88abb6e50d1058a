/* CUDA kernels of the GPU tier, as a C API usable from C11.
 *
 * Conventions. Every pointer named as device memory is a device pointer;
 * fp16 values travel as uint16_t (IEEE half). Row strides (ld*, hs, ss) are
 * in elements. `stream` is a cudaStream_t (NULL: default stream). A call
 * checks its arguments on the host (HKV_E_INVAL / HKV_E_UNSUPPORTED naming
 * the problem), launches, and reports a launch error as HKV_E_DEVICE; errors
 * raised while a kernel runs surface at the next hkv_gpu_sync. Nothing here
 * allocates: workspaces are the caller's (sized by the *_ws_bytes calls) so
 * a decode step never allocates. Attention outputs are (out, lse) partials
 * with lse in natural log, -inf for an empty key set (out = 0), the same
 * contract as cpu/kernels.h, so host and device partials merge exactly.
 *
 * Attention kernels need d % 32 == 0, d <= 256, and K/V rows that are 4-byte
 * aligned (even strides): one warp per query row, one key per lane.
 *
 * Built without CUDA every entry point returns HKV_E_UNSUPPORTED. */
#ifndef HKV_GPU_KERNELS_H
#define HKV_GPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_ctx.h"
#include "kernels.h"   /* hkv_wmat, hkv_cpu_kernels: weights dequantise on the host */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- model pieces (model_kernels.cu) -------------------------------------- */

enum { HKV_GPU_ROPE_PAIRS = 0, HKV_GPU_ROPE_NEOX = 1 };   /* runtime/model.h's values */

/* x[r][:] = table[tokens[r]][:] as fp32, r < n. table fp16 [vocab][dim],
 * tokens int32 [n], x [n][dim] (device). Ids outside [0, vocab) give a NaN
 * row (the host validates ids before upload; this only keeps reads in bounds). */
int hkv_gpu_embed(const uint16_t *table, int64_t vocab, int64_t dim, const int32_t *tokens,
                  int64_t n, float *x, void *stream, hkv_err *err);

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of dim at strides ldx, ldy
 * (y may equal x). w fp32 [dim]. */
int hkv_gpu_rmsnorm(const float *x, int64_t ldx, const float *w, int64_t n, int dim, float eps,
                    float *y, int64_t ldy, void *stream, hkv_err *err);

/* Rotate in place the first `rot` dims of each of n_heads heads (head_dim
 * apart) of n rows (stride ldx), row r at position pos[r] (int64 [n]):
 * angle_i = pos * inv_freq[i] (fp32 [rot/2], scaling factors applied), in
 * float64 as the host does. layout: HKV_GPU_ROPE_PAIRS rotates (x[2i],
 * x[2i+1]), HKV_GPU_ROPE_NEOX rotates (x[i], x[i+rot/2]). */
int hkv_gpu_rope(float *x, int64_t ldx, int64_t n, int n_heads, int head_dim, int rot,
                 int layout, const float *inv_freq, const int64_t *pos, void *stream,
                 hkv_err *err);

/* out[r][j] = silu(gu[r][j]) * gu[r][F + j]: gu [n][2F] (gate then up, as the
 * stacked gate/up GEMM writes it), out [n][F], no aliasing. */
int hkv_gpu_swiglu(const float *gu, int64_t n, int64_t F, float *out, void *stream, hkv_err *err);

/* x[i] += y[i], i < n (the residual). */
int hkv_gpu_add(float *x, const float *y, int64_t n, void *stream, hkv_err *err);

/* Conversions, round to nearest even (as F16C). */
int hkv_gpu_f32_to_f16(const float *src, uint16_t *dst, int64_t n, void *stream, hkv_err *err);
int hkv_gpu_f16_to_f32(const uint16_t *src, float *dst, int64_t n, void *stream, hkv_err *err);

/* ---- GEMM (gemm.cu) ----------------------------------------------------------- */

/* A weight matrix on the device: fp16 [rows][cols] row-major (WEIGHTS tier). */
typedef struct hkv_gpu_wmat {
    int64_t rows, cols;
    uint16_t *w;
} hkv_gpu_wmat;

/* Dequantise src (any repacked format) on the host to fp16 in row panels of
 * a few MB (host WORKSPACE tier of host_mem), upload to the WEIGHTS tier. */
int hkv_gpu_wmat_upload(hkv_gpu_ctx *ctx, const hkv_cpu_kernels *kern, const hkv_wmat *src,
                        hkv_mem_account *host_mem, hkv_gpu_wmat *dst, hkv_err *err);
void hkv_gpu_wmat_free(hkv_gpu_ctx *ctx, hkv_gpu_wmat *w);

/* y[i][r] = sum_c W[r][c] x[i][c]: x fp16 [n][cols] (dense), y fp32 rows of
 * w->rows at stride ldy >= rows. cuBLAS GemmEx, fp16 in, fp32 accumulate. */
int hkv_gpu_gemm(hkv_gpu_ctx *ctx, const hkv_gpu_wmat *w, const uint16_t *x, int64_t n, float *y,
                 int64_t ldy, void *stream, hkv_err *err);

/* ---- attention (attn_prefill.cu, attn_decode.cu) ------------------------------------ */

/* Causal prefill block, flash style (key tiles, online softmax, no score
 * matrix): nq query tokens at positions p0..p0+nq-1; q fp32 [nq][n_head][d]
 * (token stride ldq), token t attends keys [0, p0+t]. KV head h's row p is at
 * k + h*hs + p*ld (fp16, v likewise); KV head h serves query heads
 * [h*g, h*g+g), g = n_head/n_head_kv. out fp32 [nq][n_head][d] (stride ldo),
 * lse [nq][n_head]. Long prompts: call per query chunk with a growing p0. */
int hkv_gpu_attn_prefill(const float *q, int64_t ldq, int64_t nq, int n_head, int n_head_kv,
                         int d, int64_t p0, const uint16_t *k, const uint16_t *v, int64_t ld,
                         int64_t hs, float scale, float *out, int64_t ldo, float *lse,
                         void *stream, hkv_err *err);

/* Decode attention, one query token per sequence: q fp32 [n_seq][n_head][d];
 * (sequence s, KV head h) attends n_rows[s*n_head_kv + h] rows (int32,
 * device) of k + s*ss + h*hs: rows 0.. in order, or, with idx, rows
 * idx[(s*n_head_kv + h)*idx_ld + i] (the near tier's sinks + ring, or a
 * far selection). out [n_seq][n_head][d], lse [n_seq][n_head]. */
int hkv_gpu_attn_decode(const float *q, int n_seq, int n_head, int n_head_kv, int d,
                        const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs, int64_t ss,
                        const int32_t *n_rows, const int32_t *idx, int64_t idx_ld, float scale,
                        float *out, float *lse, void *stream, hkv_err *err);

/* Exact merge of n partials of d, in place into (out_a, lse_a): the formula
 * of cpu/merge.c, -inf marking an empty partial. */
int hkv_gpu_attn_merge(float *out_a, float *lse_a, const float *out_b, const float *lse_b,
                       int64_t n, int d, void *stream, hkv_err *err);

/* ---- CTKVR index (ctkvr_recall.cu, ctkvr_build.cu) ------------------------------------ */

/* One layer's index for n_seq sequences, device memory, the layout of
 * index/ctkvr_impl.h's ct_layer per sequence (so it uploads as is). */
typedef struct hkv_gpu_ctkvr {
    int n_seq, n_head, n_head_kv, d;
    int64_t C, rho;
    uint16_t *cent;   /* [n_seq][C][n_head][d] fp16, L2-normalised */
    int32_t *ivf;     /* [n_seq][n_head_kv][C][rho] absolute far positions */
    int32_t *len;     /* [n_seq][n_head_kv][C] valid entries per list */
    int32_t *fifo;    /* [n_seq][n_head_kv][2]: oldest slot, slots in use */
} hkv_gpu_ctkvr;

/* Workspace bytes of hkv_gpu_ctkvr_recall with far tiers of at most max_far. */
size_t hkv_gpu_ctkvr_recall_ws_bytes(const hkv_gpu_ctkvr *ix, int64_t max_far);

/* Recall for one decode step, per (sequence s, KV head h), u = s*n_head_kv + h:
 * cosine of the step's query heads q (fp32 [n_seq][n_head][d]) with the
 * valid centroids (in FIFO order from the oldest), max over the group, top
 * Cp (ties to the older); union of their IVF lists restricted to [lo, hi),
 * plus the tail [t0, hi); deduplicated with a bitmap. far int64 [n_seq][3] =
 * {lo, hi, t0} (device). cand int32 [n_seq*n_head_kv][cand_cap] gets the
 * candidates in increasing position, n_cand [n_seq*n_head_kv] their count;
 * a count above cand_cap means the list was cut (size cand_cap >= min(hi -
 * lo, Cp*rho + hi - t0)); -1 means hi - lo exceeded max_far (the workspace's
 * bitmap size). This is the candidate set ctkvr.c's select reranks. */
int hkv_gpu_ctkvr_recall(const hkv_gpu_ctkvr *ix, const float *q, int64_t Cp, const int64_t *far,
                         int64_t max_far, int32_t *cand, int64_t cand_cap, int32_t *n_cand,
                         void *ws, size_t ws_bytes, void *stream, hkv_err *err);

/* Dynamic centroid update (dcu=1): for each u with n_sel[u] > 0, the next
 * FIFO slot of (s, h) (an unused one, else the oldest) gets the unit-norm
 * fp16 query heads of q and the first min(n_sel[u], rho) positions of
 * sel[u*sel_ld ...] (the reranked top rho) as its list. */
int hkv_gpu_ctkvr_dcu(const hkv_gpu_ctkvr *ix, const float *q, const int32_t *sel, int64_t sel_ld,
                      const int32_t *n_sel, void *stream, hkv_err *err);

/* Index build at prompt end for one sequence s of ix: the n query rows q
 * (fp16 [n][n_head][d], row stride ldq, the last prompt queries) become
 * centroids; row i goes to slot slot[h*n + i] of KV head h (int32 device
 * [n_head_kv][n]): cent gets the row's unit-norm heads, ivf/len the top rho
 * positions p in [lo, hi) by max over the group of q_i . k_h[p] (raw dot
 * products, ties to the lower position; all of [lo, hi) when hi - lo <=
 * rho). Keys: row p of KV head h at k + h*hs + p*ld. Scores are computed
 * for blocks of centroids over all keys in the workspace and never for all
 * n at once: ws_bytes must hold at least one centroid's row (see
 * hkv_gpu_ctkvr_build_ws_bytes); more lets more centroids run per launch. */
size_t hkv_gpu_ctkvr_build_ws_bytes(int64_t n_far, int64_t n_centroids);
int hkv_gpu_ctkvr_build(const hkv_gpu_ctkvr *ix, int s, const uint16_t *q, int64_t ldq, int64_t n,
                        const int32_t *slot, const uint16_t *k, int64_t ld, int64_t hs,
                        int64_t lo, int64_t hi, void *ws, size_t ws_bytes, void *stream,
                        hkv_err *err);

#ifdef __cplusplus
}
#endif

#endif

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

enum { HKV_GPU_ROPE_PAIRS = 0, HKV_GPU_ROPE_NEOX = 1 };   /* model/model.h's values */

/* x[r][:] = table[tokens[r]][:] as fp32, r < n. table fp16 [vocab][dim],
 * tokens int32 [n], x [n][dim] (device). Ids outside [0, vocab) give a NaN
 * row (the host validates ids before upload; this only keeps reads in bounds).
 * Only tests call it: the CUDA backend looks embeddings up in the repacked
 * table (hkv_gpu_qmat_rows); kept for fp16 tables and as their reference. */
int hkv_gpu_embed(const uint16_t *table, int64_t vocab, int64_t dim, const int32_t *tokens,
                  int64_t n, float *x, void *stream, hkv_err *err);

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of dim at strides ldx, ldy
 * (y may equal x). w fp32 [dim]. */
int hkv_gpu_rmsnorm(const float *x, int64_t ldx, const float *w, int64_t n, int dim, float eps,
                    float *y, int64_t ldy, void *stream, hkv_err *err);

/* x[r] += res[r], then y[r] = rmsnorm(x[r]) * w as hkv_gpu_rmsnorm (bit for
 * bit hkv_gpu_add followed by hkv_gpu_rmsnorm), in one launch; rows of dim at
 * strides ldx, ldr, ldy; y must not be x. */
int hkv_gpu_add_rmsnorm(float *x, int64_t ldx, const float *res, int64_t ldr, const float *w,
                        int64_t n, int dim, float eps, float *y, int64_t ldy, void *stream,
                        hkv_err *err);

/* A step's RoPE table: for row r at position pos[r] (int64 [n]), cs[r*rot +
 * i] = cos(angle_i), cs[r*rot + rot/2 + i] = sin(angle_i), angle_i = pos *
 * inv_freq[i] (fp32 [rot/2], scaling factors applied), in float64 rounded
 * to float as the host does. Built once per step, used by every layer. */
int hkv_gpu_rope_table(const float *inv_freq, int rot, const int64_t *pos, int64_t n, float *cs,
                       void *stream, hkv_err *err);
/* Rotate in place the first `rot` dims of each of n_heads heads (head_dim
 * apart) of n rows (stride ldx) by row r's table cs + r*rot (float math).
 * layout: HKV_GPU_ROPE_PAIRS rotates (x[2i], x[2i+1]), HKV_GPU_ROPE_NEOX
 * rotates (x[i], x[i+rot/2]). */
int hkv_gpu_rope(float *x, int64_t ldx, int64_t n, int n_heads, int head_dim, int rot,
                 int layout, const float *cs, void *stream, hkv_err *err);

/* out[r][j] = silu(gu[r][j]) * gu[r][F + j]: gu [n][2F] (gate then up, as the
 * stacked gate/up GEMM writes it), out [n][F], no aliasing. */
int hkv_gpu_swiglu(const float *gu, int64_t n, int64_t F, float *out, void *stream, hkv_err *err);

/* x[i] += y[i], i < n (the residual). */
int hkv_gpu_add(float *x, const float *y, int64_t n, void *stream, hkv_err *err);

/* Only tests call the two conversions (the emulator's and the card's rounding
 * against F16C); the pipeline converts inside its kernels. */
/* Conversions, round to nearest even (as F16C). */
int hkv_gpu_f32_to_f16(const float *src, uint16_t *dst, int64_t n, void *stream, hkv_err *err);
int hkv_gpu_f16_to_f32(const uint16_t *src, float *dst, int64_t n, void *stream, hkv_err *err);

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
/* The same with the keys bounded: token t attends keys [0, min(p0+t+1, nk)),
 * so p0 = nk attends all nk keys with every token (a block of earlier keys,
 * the streamed prefill of pipeline/cuda_prefill.c); nk = 0 gives every row
 * (0, -inf), the empty partial. */
int hkv_gpu_attn_prefill_keys(const float *q, int64_t ldq, int64_t nq, int n_head, int n_head_kv,
                              int d, int64_t p0, int64_t nk, const uint16_t *k, const uint16_t *v,
                              int64_t ld, int64_t hs, float scale, float *out, int64_t ldo,
                              float *lse, void *stream, hkv_err *err);

/* Which prefill kernel: AUTO takes mma.sync (attn_prefill_mma.cu: scores
 * and softmax in registers) where it runs (head size <= 128, 16-byte aligned
 * K/V rows, compute capability 8.0 and a build for it), else WMMA
 * (attn_prefill.cu, every head size the call takes). The others force one,
 * for the benchmark and the tests; MMA where it cannot run is
 * HKV_E_UNSUPPORTED, naming why. */
typedef enum { HKV_GPU_PREFILL_AUTO, HKV_GPU_PREFILL_WMMA, HKV_GPU_PREFILL_MMA } hkv_gpu_prefill_kernel;
int hkv_gpu_attn_prefill_with(const float *q, int64_t ldq, int64_t nq, int n_head, int n_head_kv,
                              int d, int64_t p0, int64_t nk, const uint16_t *k, const uint16_t *v,
                              int64_t ld, int64_t hs, float scale, float *out, int64_t ldo,
                              float *lse, hkv_gpu_prefill_kernel kernel, void *stream,
                              hkv_err *err);

/* Decode attention, one query token per sequence: q fp32 [n_seq][n_head][d];
 * (sequence s, KV head h) attends n_rows[s*n_head_kv + h] rows (int32,
 * device) of k + s*ss + h*hs: rows 0.. in order, or, with idx, rows
 * idx[(s*n_head_kv + h)*idx_ld + i] (a gathered selection), or, with idx
 * and idx_ld = 0, rows idx[s*n_head_kv + h] + i in order (a run that starts
 * anywhere: the near tier of the sequence a query row belongs to, one int
 * per pair instead of a list). out [n_seq][n_head][d], lse [n_seq][n_head].
 * The pipeline calls the split form (hkv_gpu_attn_decode_split); this one
 * split is what the tests hold the split's merged partials to. */
int hkv_gpu_attn_decode(const float *q, int n_seq, int n_head, int n_head_kv, int d,
                        const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs, int64_t ss,
                        const int32_t *n_rows, const int32_t *idx, int64_t idx_ld, float scale,
                        float *out, float *lse, void *stream, hkv_err *err);

/* Flash-decoding: the same, with each (sequence, KV head)'s key range cut
 * into n_split chunks of whole 32-key tiles attended by separate blocks,
 * their partials merged exactly (so the result is the unsplit one up to
 * rounding). n_split in 1..HKV_GPU_DECODE_MAX_SPLIT; n_split > 1 needs a
 * 16-byte aligned device workspace of hkv_gpu_attn_decode_ws_bytes()
 * bytes, reused by every call on the stream (no allocation in a step). */
#define HKV_GPU_DECODE_MAX_SPLIT 32
int hkv_gpu_attn_decode_split(const float *q, int n_seq, int n_head, int n_head_kv, int d,
                              const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs,
                              int64_t ss, const int32_t *n_rows, const int32_t *idx,
                              int64_t idx_ld, float scale, float *out, float *lse, int n_split,
                              void *ws, size_t ws_bytes, void *stream, hkv_err *err);
/* The same with sequence s's query heads at q + s*ldq (ldq >= n_head*d, a
 * multiple of 4): the pipeline reads them in place from its QKV rows,
 * without gathering them into [n_seq][n_head][d] first. */
int hkv_gpu_attn_decode_split_q(const float *q, int64_t ldq, int n_seq, int n_head, int n_head_kv,
                                int d, const uint16_t *k, const uint16_t *v, int64_t ld,
                                int64_t hs, int64_t ss, const int32_t *n_rows, const int32_t *idx,
                                int64_t idx_ld, float scale, float *out, float *lse, int n_split,
                                void *ws, size_t ws_bytes, void *stream, hkv_err *err);
size_t hkv_gpu_attn_decode_ws_bytes(int n_seq, int n_head, int d, int n_split);
/* The split count for a grid of n_seq x n_head_kv (sequence, KV head) pairs
 * over at most max_rows keys on a device of sm_count SMs: enough blocks for
 * two waves, no split shorter than two tiles; 1 when the grid fills the
 * device already. */
int hkv_gpu_attn_decode_splits(int sm_count, int n_seq, int n_head, int n_head_kv,
                               int64_t max_rows);

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
 * bitmap size). This is the candidate set ctkvr.c's select reranks.
 * Only tests call recall and dcu: they serve an index whose IVF lists live on
 * the device (hetkv plan's --index gpu), which the pipeline does not build;
 * it keeps the lists on the host and recalls with recall_top.cu. */
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

/* Which kernel scores the build: AUTO takes tensor cores (ctkvr_scores_mma.cu)
 * where they run (head size a multiple of 8 up to 128, 16-byte aligned q
 * and key rows, compute capability 8.0 and a build for it), else CUDA
 * cores (ctkvr_build.cu, every shape the build takes). SIMT and MMA force
 * one, for the benchmark and the tests; MMA where it cannot run is
 * HKV_E_UNSUPPORTED, naming why. hkv_gpu_ctkvr_build is AUTO. */
typedef enum { HKV_GPU_SCORES_AUTO, HKV_GPU_SCORES_SIMT, HKV_GPU_SCORES_MMA } hkv_gpu_scores_kernel;
int hkv_gpu_ctkvr_build_with(const hkv_gpu_ctkvr *ix, int s, const uint16_t *q, int64_t ldq,
                             int64_t n, const int32_t *slot, const uint16_t *k, int64_t ld,
                             int64_t hs, int64_t lo, int64_t hi, void *ws, size_t ws_bytes,
                             hkv_gpu_scores_kernel kernel, void *stream, hkv_err *err);

/* ---- other policies' prompt-end and decode pieces (window_scores.cu, pool_keep.cu,
 * quest_select.cu). Compiled and reviewed against index/; not yet run on a GPU. ---- */

/* index/window_scores.h's hkv_ws_window_scores on the device. Window: W
 * rows of q (fp16 [W][n_head][d], row stride ldq) at positions pos0 + a.
 * KV head h's key at position p: k + h*hs + p*ld (fp16). Head h scores
 * n_rows[h] (device int32, NULL: n) far rows, row i at position rows[h*rows_ld
 * + i] (device int32, ascending) or lo + i without rows. out[h*ld_out + i] =
 * sum (reduce_max: max) over window rows a and h's g heads j of
 * q_weight[a] (device fp32 [W], NULL: 1) * softmax_i(q_{a,j} . k / sqrt(d)),
 * the softmax over the scored rows with position <= pos0 + a only (0 for the
 * others). W = 0 gives zeros. d even <= 256, 4-byte aligned keys. Workspace:
 * hkv_gpu_window_scores_ws_bytes(W, n_head, n) (small: per row and 4096-key
 * chunk one (max, sum), no [W][n] matrix). */
size_t hkv_gpu_window_scores_ws_bytes(int64_t W, int n_head, int64_t n);
int hkv_gpu_window_scores(const uint16_t *q, int64_t ldq, int64_t W, int64_t pos0, int n_head,
                          int n_head_kv, int d, const uint16_t *k, int64_t ld, int64_t hs,
                          int64_t lo, int64_t n, const int32_t *rows, int64_t rows_ld,
                          const int32_t *n_rows, const float *q_weight, int reduce_max,
                          float *out, int64_t ld_out, void *ws, size_t ws_bytes, void *stream,
                          hkv_err *err);

/* hkv_ws_pool on n_batch rows of n (row b's length n_len[b], device int32,
 * or n): in [b*ld_in ...] -> out [b*ld_out ...], distinct buffers; kernel
 * odd; avg 0: max over the clipped window, 1: window sum / kernel.
 * Only tests call it: the eviction policies pool on the host after the
 * device's window scores (hkv_far_accel); it stays, tested against
 * hkv_ws_pool, for moving that pooling to the device (the accel would then
 * hand back pooled scores, a change to index/policy.h's contract). */
int hkv_gpu_pool(const float *in, int64_t ld_in, float *out, int64_t ld_out, int n_batch,
                 int64_t n, const int32_t *n_len, int kernel, int avg, void *stream,
                 hkv_err *err);

/* hkv_ws_keep per batch row b (scores s + b*lds, length n_len[b] or n):
 * the min(k, len) best, positions >= force_from first (position rows[b*rows_ld
 * + i], device int32 ascending, or lo + i), ties to the lower index; out
 * [b*out_ld ...] gets their positions ascending, n_out[b] the count (device).
 * s is not modified. */
int hkv_gpu_keep(const float *s, int64_t lds, int n_batch, int64_t n, const int32_t *n_len,
                 const int32_t *rows, int64_t rows_ld, int64_t lo, int64_t k, int64_t force_from,
                 int32_t *out, int64_t out_ld, int32_t *n_out, void *stream, hkv_err *err);

/* quest (index/quest.c): bounds fp16 [n_head_kv][np_cap][2d], page i of head
 * h = [max | min] over positions [lo + i*P, lo + (i+1)*P). extend folds far
 * positions [from, to) into their pages (from == lo starts afresh); bit-equal
 * to the host's. select: for one token's q (fp32 [n_head_kv*g][d], device)
 * over far [lo, hi) of built pages, per KV head the K pages of best group-max
 * bound sum_e max(q_e*max_e, q_e*min_e) (ties to the lower page), as
 * ascending positions into out [h*out_ld ...], the count into n_out[h]
 * (device); all of [lo, hi) when hi - lo <= K*P.
 * The pipeline folds tokens in one at a time (hkv_gpu_quest_fold) and uploads
 * the host's bounds after a rebuild; extend, the rebuild from keys, is held
 * by the tests to the host's bounds bit for bit and kept for that. */
int hkv_gpu_quest_extend(uint16_t *bounds, int64_t np_cap, int n_head_kv, int d, int64_t P,
                         const uint16_t *k, int64_t ld, int64_t hs, int64_t lo, int64_t from,
                         int64_t to, void *stream, hkv_err *err);
/* fold: one key row per KV head (k + h*hs, fp16 [d]) arriving at far
 * position pos, as extend does for [pos, pos + 1): the pipeline folds the
 * token leaving a near-tier ring from the device's own copy of it. */
int hkv_gpu_quest_fold(uint16_t *bounds, int64_t np_cap, int n_head_kv, int d, int64_t P,
                       const uint16_t *k, int64_t hs, int64_t lo, int64_t pos, void *stream,
                       hkv_err *err);
size_t hkv_gpu_quest_select_ws_bytes(int n_head_kv, int64_t n_far, int64_t P, int64_t K);
int hkv_gpu_quest_select(const uint16_t *bounds, int64_t np_cap, int n_head_kv, int g, int d,
                         int64_t P, int64_t K, const float *q, int64_t lo, int64_t hi, int32_t *out,
                         int64_t out_ld, int32_t *n_out, void *ws, size_t ws_bytes, void *stream,
                         hkv_err *err);

/* RocketKV stage 2 (index/rocketkv.c, rocketkv_hsa.cu). Lists: cand int32
 * [KH][cap] ascending far positions, n_cand[h] valid (device); bounds fp16
 * [KH][2d][pcap], pcap >= ceil(cap/page): rows 0..d-1 the max of each page of
 * `page` list entries, rows d..2d-1 the min (the host's layout). bounds
 * (re)builds pages >= pg_from of every list from the keys (k + h*hs +
 * p*ld), bit-equal to the host's. hsa: the select of rerank=1 for one
 * token's q (fp32 [KH*g][d], device): top `dims` coordinates of sum_j |q_j|,
 * page estimates, SparQ-tempered softmax per head summed over the group,
 * the top k list entries (ties to the lower entry) as ascending positions
 * into out [h*out_ld ...], counts into n_out (device); a list of at most k
 * entries comes back whole. d <= 256, g <= 64.
 * Likewise bounds: the pipeline pushes tokens (hkv_gpu_rocketkv_push) and
 * uploads the host's pages after a rebuild; only tests call this one. */
int hkv_gpu_rocketkv_bounds(const int32_t *cand, int64_t cap, const int32_t *n_cand, int n_head_kv,
                            int d, int64_t page, int64_t pcap, int64_t pg_from, const uint16_t *k,
                            int64_t ld, int64_t hs, uint16_t *bnd, void *stream, hkv_err *err);
/* push: far position pos appended to every list (n_cand[h] < cap; a full
 * list is left alone), key row k + h*hs (fp16 [d]) folded into its last
 * page, a page starting at it afresh: the host's on_far_append, from the
 * device's own copy of the token (pcap >= cap/page + 1). */
int hkv_gpu_rocketkv_push(int32_t *cand, int64_t cap, int32_t *n_cand, int n_head_kv, int d,
                          int64_t page, int64_t pcap, uint16_t *bnd, const uint16_t *k, int64_t hs,
                          int64_t pos, void *stream, hkv_err *err);
size_t hkv_gpu_rocketkv_hsa_ws_bytes(int n_head_kv, int g, int64_t cap, int64_t page);
int hkv_gpu_rocketkv_hsa(const uint16_t *bnd, int64_t pcap, const int32_t *cand, int64_t cap,
                         const int32_t *n_cand, int n_head_kv, int g, int d, int64_t page,
                         int64_t dims, int64_t k, const float *q, int32_t *out, int64_t out_ld,
                         int32_t *n_out, void *ws, size_t ws_bytes, void *stream, hkv_err *err);
/* hsa's two kernels one at a time, for the benchmark (bench_gpu_policy.c):
 * part 1 the page estimates and softmax partials into ws, part 2 the top k
 * from them (the same arguments and ws as the part 1 before it), 3 both. */
int hkv_gpu_rocketkv_hsa_part(const uint16_t *bnd, int64_t pcap, const int32_t *cand, int64_t cap,
                              const int32_t *n_cand, int n_head_kv, int g, int d, int64_t page,
                              int64_t dims, int64_t k, const float *q, int32_t *out, int64_t out_ld,
                              int32_t *n_out, void *ws, size_t ws_bytes, int part, void *stream,
                              hkv_err *err);

#ifdef __cplusplus
}
#endif

#endif

/* Scoring pieces shared by the snapkv and rocketkv policies (and the page
 * budget rules quest shares with them):
 *   window scores : SnapKV's observation-window attention over the prompt,
 *                   summed over the window's queries and the KV group's heads;
 *   pooling       : 1-D max or average pooling along the scored sequence;
 *   keep          : the top-k scored far positions of one KV head, ascending;
 *   rocketkv split: RocketKV's budget decomposition (stage 1 / stage 2);
 * and read-only access to policy state for tests and reports.
 * Not a public header of the runtime: policies and their tests include it. */
#ifndef HKV_WINDOW_SCORES_H
#define HKV_WINDOW_SCORES_H

#include <stdint.h>

#include "policy.h"

/* One window-score computation over the far tier of one layer.
 * For KV head h and each scored far position x = rows[h][i] (or lo + i):
 *   out[h*ld_out + i] = sum over window rows r < qv->n and heads j of h's
 *       group of softmax_x(q_{r,j} . k_x / sqrt(d)),
 * (or the max over them, see reduce_max below),
 * the softmax running over the scored positions x <= pos0 + r (causal: a far
 * key after a window query gets weight 0 and is left out of its
 * normalisation). Only far keys are visible here (see snapkv.c for why the
 * normalisation is over the far tier). */
typedef struct hkv_ws_job {
    const hkv_far_view *far;
    const hkv_query_view *qv;     /* the window: rows [0, qv->n) at positions pos0 + r */
    int n_head;                   /* query heads in a qv row; g = n_head / far->n_head_kv */
    const int32_t *const *rows;   /* [n_head_kv] ascending far positions, or NULL: [lo, hi) */
    const int64_t *n_rows;        /* [n_head_kv] with rows */
    float *out;                   /* [n_head_kv][ld_out] */
    int64_t ld_out;
    int n_threads;                /* <= 0: OpenMP's default */
    /* Variants (zero-initialised jobs are SnapKV's sum): reduce_max = 1 takes
     * the max over window rows and group heads instead of the sum (SpecKV,
     * SpecPC); q_weight[r] (NULL: 1) scales window row r's weights first
     * (SpecPC's linspace(0, 1, w)). */
    int reduce_max;
    const float *q_weight;
} hkv_ws_job;

/* The last w rows of qv: the cache may keep more prompt queries than a
 * policy asked for (another policy of the batch wanted more). */
static inline hkv_query_view hkv_ws_last_rows(const hkv_query_view *qv, int64_t w)
{
    hkv_query_view v = {0};
    if (!qv || qv->n <= 0) return v;
    v = *qv;
    if (v.n > w) {
        v.q += (v.n - w) * v.ld;
        v.pos0 += v.n - w;
        v.n = w;
    }
    return v;
}

/* Workspace (accounted WORKSPACE in mem) is a few MB, independent of the
 * far tier's length: keys are scored in chunks by sgemm, in two passes (the
 * normalisers first, then the weights), so no [window][far] matrix exists. */
int hkv_ws_window_scores(const hkv_cpu_kernels *kern, const hkv_ws_job *job,
                         hkv_mem_account *mem, hkv_err *err);

/* In-place 1-D pooling of s[0..n) with an odd kernel, stride 1, "same"
 * padding: avg = 0: max over [i - kernel/2, i + kernel/2] clipped to the
 * sequence (PyTorch max_pool1d with padding); avg = 1: the window's sum
 * divided by kernel, zero padding counted (avg_pool1d's default).
 * tmp holds 2n floats. */
void hkv_ws_pool(float *s, int64_t n, int kernel, int avg, float *tmp);

/* The k best of n scored positions into out, ascending; positions >=
 * force_from (the observation window, which SnapKV always keeps) rank first.
 * rows NULL: position lo + i. s is overwritten. idx and scratch hold n
 * int32 each. Returns min(k, n). */
int64_t hkv_ws_keep(float *s, const int32_t *rows, int64_t lo, int64_t n, int64_t k,
                    int64_t force_from, int32_t *out, int32_t *idx, int32_t *scratch);

/* RocketKV's budget decomposition (notes A2, gpt-fast get_params_for_token_budget):
 *   k        = round(t/2)             tokens stage 2 attends (the code caps it at
 *                                     capacity, which counts room for generated
 *                                     tokens there; here those join the
 *                                     candidates after the split, so no cap)
 *   t = min(S, t); c = max(1, S/t); r = min(0.2 + 0.06 log2 c, 0.8) (or the given split);
 *   capacity = int(S / c^r)           tokens stage 1 keeps per (layer, KV head)
 *   c2 = max(1, capacity/t); page = min(floor(c2), ceil(sqrt(c2)));
 *   dims = min(d, max(1, round(d*page/c2)))   head-dim coordinates of the estimate */
typedef struct hkv_rocketkv_split {
    double c, r, c2;
    int64_t capacity, k, page, dims;
} hkv_rocketkv_split;

/* split_r: NAN for the adaptive r, else a fixed r in [0, 1]. */
void hkv_rocketkv_split_of(int64_t S, int64_t t, int d, double split_r, hkv_rocketkv_split *out);

/* ---- read-only access to policy state (tests, reports) -------------------
 * Each returns HKV_E_INVAL if pol is not an instance of that policy or the
 * indices are out of range. */

/* quest: page `page` of (layer, kvh) as fp16 [max d | min d] (element-wise
 * over the page's keys); *n_pages: pages built so far. */
int hkv_quest_page_bounds(const hkv_policy *pol, int layer, int kvh, int64_t page,
                          const uint16_t **row, int64_t *n_pages);

/* rocketkv: the candidate list of (layer, kvh): stage-1 survivors, then the
 * far tokens that arrived since, ascending; and the layer's split. */
int hkv_rocketkv_candidates(const hkv_policy *pol, int layer, int kvh, const int32_t **list,
                            int64_t *n, hkv_rocketkv_split *split);

#endif

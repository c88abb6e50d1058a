/* `laq`: Lookahead Q-Cache (Wang et al., EMNLP 2025; notes Part A).
 *
 * Stage 1 (prefill_end): SnapKV over the far tier with the last w1 prompt
 * queries (sum of softmax weights over the window and the KV group, max
 * pooling, top budget; window positions kept first). Stage 2 is the
 * engine's (runtime/lookahead.c): t0 = argmax of the prefill logits (exact)
 * and up to L-1 more greedy tokens decoded under the stage-1 selection; the
 * cache keeps their queries, then the sequence is rewound to the prompt
 * end. Stage 3 (lookahead_end): the last w2 prompt queries (LAQ++; w2 = 0
 * is plain LAQ) and the lookahead queries score the WHOLE prompt far tier
 * afresh (sum, pooled, top budget, the last w2 prompt positions first), so
 * tokens stage 1 dropped can come back: in hetkv nothing was dropped, the
 * selection only decides what is attended. Decode then attends the kept
 * set plus every far token that arrives later (LAQ keeps all generated
 * tokens). A later prompt end (a new turn) runs stage 1 again over the
 * whole far tier: the engine looks ahead after a request's first prompt
 * only, so later turns are re-selected SnapKV-style (LAQ itself evicts once).
 *
 * Choices ([C]/[I] in the notes): the code's softmax probabilities summed
 * (not the paper's raw q.K); one selection per KV head (group sum) instead
 * of the reference's per-query-head sets; true causal visibility (a prompt
 * query sees keys up to its position, lookahead queries see every prompt
 * key), not the reference's shifted mask; keys keep their positions. The
 * softmax is normalised over the far tier (as snapkv.c explains). Budget is
 * far tokens per decode step and KV head, the meaning every policy here
 * shares (the paper's B also counts the local window, which hetkv keeps
 * near). */
#include <math.h>
#include <stdio.h>

#include "keepset.h"

enum { P_BUDGET, P_LOOKAHEAD, P_W1, P_W2, P_KERNEL, P_COUNT };

static const hkv_param_def laq_params[P_COUNT] = {
    {"budget", NAN, 1, 1 << 24, 1,
     "far tokens attended per KV head after re-selection (and in the stage-1 lookahead: the code's "
     "lookahead budget equals the final one); default about 3% of n_ctx as snapkv"},
    {"lookahead", 8, 1, 1024, 1, "lookahead tokens L decoded greedily under stage 1 (LAQ: 8)"},
    {"w1", 32, 1, 4096, 1, "stage-1 SnapKV window: last prompt queries (LAQ's code: 32)"},
    {"w2", 8, 0, 4096, 1, "last prompt queries joining the lookahead queries at re-selection "
                          "(LAQ++: 8; 0 = plain LAQ)"},
    {"kernel", 7, 1, 1023, 1, "max-pooling kernel along the sequence, odd (LAQ: 7)"},
};

typedef struct laq {
    hkv_keepset ks;
    int kernel;
    int64_t L, w1, w2;
    int64_t *prompt_end;   /* [n_layer] end of the prompt at the last prefill_end */
    size_t pe_b;
    int64_t n_lookahead;   /* lookahead queries at the last lookahead_end (layer 0) */
    int reselected;
} laq;

static double arg_of(const hkv_policy_args *a, int i) {
    return a && !isnan(a->v[i]) ? a->v[i] : laq_params[i].dflt;
}

static int64_t laq_lookahead_len(const hkv_policy_args *a, const hkv_policy_env *env) {
    (void)env;
    double v = arg_of(a, P_LOOKAHEAD);
    return v >= 1 && v <= laq_params[P_LOOKAHEAD].hi ? (int64_t)v : 8;
}

static int64_t laq_queries_wanted(const hkv_policy_args *a, const hkv_policy_env *env) {
    int64_t w1 = (int64_t)arg_of(a, P_W1), w2 = (int64_t)arg_of(a, P_W2);
    int64_t L = laq_lookahead_len(a, env), m = w2 + L;
    if (w1 < 1 || w1 > 4096) w1 = 32;
    return m > w1 ? m : w1;
}

static int laq_prefill_end(void *self, int layer, const hkv_far_view *far, const hkv_query_view *qv,
                           hkv_err *err) {
    laq *s = self;
    int rc = hkv_keepset_check(&s->ks, layer, far, "laq", err);
    if (rc) return rc;
    const hkv_query_view win = hkv_ws_last_rows(qv, s->w1);
    s->prompt_end[layer] = qv->n > 0 ? qv->pos0 + qv->n : far->hi;
    if ((rc = hkv_keepset_select(&s->ks, layer, far, &win, 0, s->kernel, win.pos0, err)))
        return hkv_err_prefix(err, "laq stage 1, layer %d", layer);
    return HKV_OK;
}

static int laq_lookahead_end(void *self, int layer, const hkv_far_view *far,
                             const hkv_query_view *qv, hkv_err *err) {
    laq *s = self;
    int rc = hkv_keepset_check(&s->ks, layer, far, "laq", err);
    if (rc) return rc;
    const int64_t end = qv->pos0 + qv->n, from = s->prompt_end[layer] - s->w2;
    if (qv->n <= 0 || end <= s->prompt_end[layer])
        return hkv_seterr(err, HKV_E_INVAL, "laq: no lookahead queries past the prompt end %lld "
                          "(layer %d)", (long long)s->prompt_end[layer], layer);
    hkv_query_view win = hkv_ws_last_rows(qv, end - from);
    if (layer == 0) s->n_lookahead = end - s->prompt_end[layer];
    if ((rc = hkv_keepset_select(&s->ks, layer, far, &win, 0, s->kernel, from, err)))
        return hkv_err_prefix(err, "laq re-selection, layer %d", layer);
    s->reselected = 1;
    return HKV_OK;
}

static void laq_on_far_append(void *self, int layer, const hkv_far_view *far) {
    (void)self, (void)layer, (void)far;   /* later far tokens are read off far->hi */
}

static int64_t laq_select(void *self, int layer, int kvh, const float *q, const hkv_far_view *far,
                          int32_t *out, hkv_policy_scratch *ws) {
    laq *s = self;
    (void)q;
    if (layer < 0 || layer >= s->ks.L || kvh < 0 || kvh >= s->ks.KH || !far || !out) return HKV_E_INVAL;
    const int64_t c = hkv_keepset_pick(&s->ks, layer, kvh, far, out);
    if (c > 0 && ws) ws->bytes += (uint64_t)c * 4;   /* the kept positions */
    return c;
}

static int64_t laq_max_select(void *self, int64_t n_far) {
    return hkv_keepset_max_select(&((laq *)self)->ks, n_far);
}

static void laq_scratch_need(void *self, int64_t n_far, int64_t *nf, int64_t *ni) {
    (void)self, (void)n_far;
    *nf = *ni = 0;
}

static void laq_describe(void *self, char *buf, size_t cap) {
    const laq *s = self;
    int n;
    double kept, scored;
    hkv_keepset_stats(&s->ks, &n, &kept, &scored);
    snprintf(buf, cap, "laq%s budget=%lld L=%lld w1=%lld w2=%lld kernel=%d, group sum; %s "
             "(%lld lookahead queries), %d layers, %.0f of %.0f far tokens kept per KV head",
             s->w2 ? "++" : "", (long long)s->ks.budget, (long long)s->L, (long long)s->w1,
             (long long)s->w2, s->kernel, s->reselected ? "re-selected" : "stage 1 only",
             (long long)s->n_lookahead, n, kept, scored);
}

static void laq_destroy(void *self) {
    laq *s = self;
    if (!s) return;
    hkv_mem_account *mem = s->ks.mem;
    hkv_keepset_free(&s->ks);
    if (s->prompt_end) hkv_host_free(mem, HKV_TIER_INDEX, s->prompt_end, s->pe_b);
    hkv_host_free(mem, HKV_TIER_INDEX, s, sizeof *s);
}

static int laq_device_takes(void *self, int layer) {
    return hkv_keepset_takes(&((laq *)self)->ks, layer);
}

static int laq_kept_set(void *self, int layer, hkv_kept_set *out) {
    return hkv_keepset_kept(&((laq *)self)->ks, layer, out);
}

static const hkv_policy_ops laq_ops = {
    .prefill_end = laq_prefill_end,
    .on_far_append = laq_on_far_append,
    .select = laq_select,
    .device_takes = laq_device_takes,
    .kept_set = laq_kept_set,
    .max_select = laq_max_select,
    .scratch_need = laq_scratch_need,
    .lookahead_end = laq_lookahead_end,
    .describe = laq_describe,
    .destroy = laq_destroy,
};

static int laq_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                      hkv_err *err) {
    int rc_args = hkv_policy_args_check(&hkv_policy_laq, a, err);
    if (rc_args) return rc_args;
    if (((int)arg_of(a, P_KERNEL) & 1) == 0)
        return hkv_seterr(err, HKV_E_RANGE, "laq: kernel=%g must be odd (a centred window)",
                          arg_of(a, P_KERNEL));
    laq *s = hkv_host_calloc(env->mem, HKV_TIER_INDEX, sizeof *s, err);
    if (!s) return hkv_err_prefix(err, "laq");
    double b = arg_of(a, P_BUDGET);
    int rc = hkv_keepset_init(&s->ks, env, isnan(b) ? hkv_policy_default_budget(env->n_ctx) : (int64_t)b,
                              "laq", err);
    if (rc) {
        hkv_host_free(env->mem, HKV_TIER_INDEX, s, sizeof *s);
        return rc;
    }
    s->kernel = (int)arg_of(a, P_KERNEL);
    s->L = (int64_t)arg_of(a, P_LOOKAHEAD);
    s->w1 = (int64_t)arg_of(a, P_W1);
    s->w2 = (int64_t)arg_of(a, P_W2);
    s->pe_b = (size_t)s->ks.L * sizeof *s->prompt_end;
    if (!(s->prompt_end = hkv_host_calloc(env->mem, HKV_TIER_INDEX, s->pe_b, err))) {
        laq_destroy(s);
        return hkv_err_prefix(err, "laq");
    }
    out->ops = &laq_ops;
    out->self = s;
    return HKV_OK;
}

const hkv_policy_def hkv_policy_laq = {
    .name = "laq",
    .kind = HKV_POLICY_EVICTION,
    .prep = HKV_PREP_LOOKAHEAD_TARGET,
    .summary = "Lookahead Q-Cache: SnapKV stage 1, L greedy lookahead steps, then re-selection over "
               "the whole prompt with the last w2 prompt queries + the lookahead queries (LAQ++)",
    .params = laq_params,
    .n_params = P_COUNT,
    .queries_wanted = laq_queries_wanted,
    .create = laq_create,
    .lookahead_len = laq_lookahead_len,
};

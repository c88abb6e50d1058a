/* `speckv`: SpecKV's KV selection from a draft model's answer (Galim et al.,
 * "Draft-based Approximate Inference for LLMs"; notes Part B.2).
 *
 * The engine (runtime/lookahead.c) lets the draft model (--draft MODEL,
 * same tokenizer) prefill the prompt and greedily answer up to `lookahead`
 * tokens; the target reads that answer as one prompt segment past the
 * prompt (its queries land in the cache's query ring), then the sequence is
 * rewound to the prompt end and lookahead_end scores the prompt far tier
 * with the last `window` prompt queries and every draft-token query: the
 * softmax weights MAX-reduced over the window's queries and the KV group's
 * heads (the code's reduction_type=max), max-pooled (kernel 7), top budget
 * per KV head, the window's own positions first. The draft tokens' K/V are
 * dropped by the rewind; the first real token comes from the prefill
 * logits (causality: the draft tokens cannot change them), so the code's
 * recompute of the last prompt token is not needed.
 *
 * Before the lookahead (prefill_end) the same scoring runs with the prompt
 * window alone, so a sequence has a selection at every moment; the
 * lookahead replaces it. A later prompt end (a new turn, no draft run)
 * re-selects that way over the whole far tier.
 *
 * Default lookahead 64: the paper's setting is "all" (to EOS or the task's
 * max_new_tokens, which hkv_generate applies: the lookahead is cut to the
 * request's n_predict), and its latency runs use a fixed length that the
 * footnote puts under 64 for typical outputs; 64 bounds the draft's cost
 * where no output cap is known (eval, bench).
 *
 * Not implemented: the target's sparse prefill (MInference vertical-slash
 * over the draft-chosen columns); the target prefills densely, as the
 * paper's "without sparse prefill" variant. Budget = far tokens attended
 * per decode step and KV head (the paper's C also counts the window, which
 * hetkv keeps near). Softmax normalised over the far tier (snapkv.c). */
#include <math.h>
#include <stdio.h>

#include "keepset.h"

enum { P_BUDGET, P_WINDOW, P_LOOKAHEAD, P_KERNEL, P_COUNT };

static const hkv_param_def speckv_params[P_COUNT] = {
    {"budget", NAN, 1, 1 << 24, 1,
     "far tokens attended per KV head (the paper's C less its window); default about 3% of n_ctx "
     "as snapkv"},
    {"window", 32, 0, 4096, 1, "last prompt queries scoring beside the draft's (SpecKV: 32)"},
    {"lookahead", 64, 1, 4096, 1, "draft tokens generated at most (the paper: until EOS or the "
                                  "task's output cap; run caps it at -n)"},
    {"kernel", 7, 1, 1023, 1, "max-pooling kernel along the sequence, odd (SpecKV: 7)"},
};

typedef struct speckv {
    hkv_keepset ks;
    int kernel;
    int64_t window, L;
    int64_t *prompt_end;   /* [n_layer] */
    size_t pe_b;
    int64_t n_draft;       /* draft queries at the last lookahead_end */
    int reselected;
} speckv;

static double arg_of(const hkv_policy_args *a, int i) {
    return a && !isnan(a->v[i]) ? a->v[i] : speckv_params[i].dflt;
}

static int64_t speckv_lookahead_len(const hkv_policy_args *a, const hkv_policy_env *env) {
    (void)env;
    double v = arg_of(a, P_LOOKAHEAD);
    return v >= 1 && v <= speckv_params[P_LOOKAHEAD].hi ? (int64_t)v : 64;
}

static int64_t speckv_queries_wanted(const hkv_policy_args *a, const hkv_policy_env *env) {
    double w = arg_of(a, P_WINDOW);
    if (!(w >= 0 && w <= 4096)) w = 32;
    int64_t n = (int64_t)w + speckv_lookahead_len(a, env);
    return n > 0 ? n : 1;
}

static int speckv_prefill_end(void *self, int layer, const hkv_far_view *far,
                              const hkv_query_view *qv, hkv_err *err) {
    speckv *s = self;
    int rc = hkv_keepset_check(&s->ks, layer, far, "speckv", err);
    if (rc) return rc;
    s->prompt_end[layer] = qv->n > 0 ? qv->pos0 + qv->n : far->hi;
    const hkv_query_view win = hkv_ws_last_rows(qv, s->window > 0 ? s->window : 1);
    if ((rc = hkv_keepset_select(&s->ks, layer, far, &win, 1, s->kernel,
                                 s->prompt_end[layer] - s->window, err)))
        return hkv_err_prefix(err, "speckv prompt end, layer %d", layer);
    return HKV_OK;
}

static int speckv_lookahead_end(void *self, int layer, const hkv_far_view *far,
                                const hkv_query_view *qv, hkv_err *err) {
    speckv *s = self;
    int rc = hkv_keepset_check(&s->ks, layer, far, "speckv", err);
    if (rc) return rc;
    const int64_t end = qv->pos0 + qv->n, from = s->prompt_end[layer] - s->window;
    if (qv->n <= 0 || end <= s->prompt_end[layer])
        return hkv_seterr(err, HKV_E_INVAL, "speckv: no draft queries past the prompt end %lld "
                          "(layer %d)", (long long)s->prompt_end[layer], layer);
    hkv_query_view win = hkv_ws_last_rows(qv, end - from);
    if (layer == 0) s->n_draft = end - s->prompt_end[layer];
    if ((rc = hkv_keepset_select(&s->ks, layer, far, &win, 1, s->kernel, from, err)))
        return hkv_err_prefix(err, "speckv selection, layer %d", layer);
    s->reselected = 1;
    return HKV_OK;
}

static void speckv_on_far_append(void *self, int layer, const hkv_far_view *far) {
    (void)self, (void)layer, (void)far;
}

static int64_t speckv_select(void *self, int layer, int kvh, const float *q,
                             const hkv_far_view *far, int32_t *out, hkv_policy_scratch *ws) {
    speckv *s = self;
    (void)q;
    if (layer < 0 || layer >= s->ks.L || kvh < 0 || kvh >= s->ks.KH || !far || !out) return HKV_E_INVAL;
    const int64_t c = hkv_keepset_pick(&s->ks, layer, kvh, far, out);
    if (c > 0 && ws) ws->bytes += (uint64_t)c * 4;   /* the kept positions */
    return c;
}

static int64_t speckv_max_select(void *self, int64_t n_far) {
    return hkv_keepset_max_select(&((speckv *)self)->ks, n_far);
}

static void speckv_scratch_need(void *self, int64_t n_far, int64_t *nf, int64_t *ni) {
    (void)self, (void)n_far;
    *nf = *ni = 0;
}

static void speckv_describe(void *self, char *buf, size_t cap) {
    const speckv *s = self;
    int n;
    double kept, scored;
    hkv_keepset_stats(&s->ks, &n, &kept, &scored);
    snprintf(buf, cap, "speckv budget=%lld window=%lld lookahead=%lld kernel=%d, max over window "
             "and group; %s (%lld draft queries), %d layers, %.0f of %.0f far tokens kept per KV head",
             (long long)s->ks.budget, (long long)s->window, (long long)s->L, s->kernel,
             s->reselected ? "draft-selected" : "prompt window only", (long long)s->n_draft, n,
             kept, scored);
}

static void speckv_destroy(void *self) {
    speckv *s = self;
    if (!s) return;
    hkv_mem_account *mem = s->ks.mem;
    hkv_keepset_free(&s->ks);
    if (s->prompt_end) hkv_host_free(mem, HKV_TIER_INDEX, s->prompt_end, s->pe_b);
    hkv_host_free(mem, HKV_TIER_INDEX, s, sizeof *s);
}

static int speckv_device_takes(void *self, int layer) {
    return hkv_keepset_takes(&((speckv *)self)->ks, layer);
}

static int speckv_kept_set(void *self, int layer, hkv_kept_set *out) {
    return hkv_keepset_kept(&((speckv *)self)->ks, layer, out);
}

static const hkv_policy_ops speckv_ops = {
    .prefill_end = speckv_prefill_end,
    .on_far_append = speckv_on_far_append,
    .select = speckv_select,
    .device_takes = speckv_device_takes,
    .kept_set = speckv_kept_set,
    .max_select = speckv_max_select,
    .scratch_need = speckv_scratch_need,
    .lookahead_end = speckv_lookahead_end,
    .describe = speckv_describe,
    .destroy = speckv_destroy,
};

static int speckv_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                         hkv_err *err) {
    int rc_args = hkv_policy_args_check(&hkv_policy_speckv, a, err);
    if (rc_args) return rc_args;
    if (((int)arg_of(a, P_KERNEL) & 1) == 0)
        return hkv_seterr(err, HKV_E_RANGE, "speckv: kernel=%g must be odd (a centred window)",
                          arg_of(a, P_KERNEL));
    speckv *s = hkv_host_calloc(env->mem, HKV_TIER_INDEX, sizeof *s, err);
    if (!s) return hkv_err_prefix(err, "speckv");
    double b = arg_of(a, P_BUDGET);
    int rc = hkv_keepset_init(&s->ks, env, isnan(b) ? hkv_policy_default_budget(env->n_ctx) : (int64_t)b,
                              "speckv", err);
    if (rc) {
        hkv_host_free(env->mem, HKV_TIER_INDEX, s, sizeof *s);
        return rc;
    }
    s->kernel = (int)arg_of(a, P_KERNEL);
    s->window = (int64_t)arg_of(a, P_WINDOW);
    s->L = (int64_t)arg_of(a, P_LOOKAHEAD);
    s->pe_b = (size_t)s->ks.L * sizeof *s->prompt_end;
    if (!(s->prompt_end = hkv_host_calloc(env->mem, HKV_TIER_INDEX, s->pe_b, err))) {
        speckv_destroy(s);
        return hkv_err_prefix(err, "speckv");
    }
    out->ops = &speckv_ops;
    out->self = s;
    return HKV_OK;
}

const hkv_policy_def hkv_policy_speckv = {
    .name = "speckv",
    .kind = HKV_POLICY_EVICTION,
    .prep = HKV_PREP_LOOKAHEAD_DRAFT,
    .summary = "SpecKV: a draft model (--draft MODEL) answers; its tokens' target queries and the "
               "last prompt queries score the prompt (max over window and group), pooled, top budget",
    .params = speckv_params,
    .n_params = P_COUNT,
    .queries_wanted = speckv_queries_wanted,
    .create = speckv_create,
    .lookahead_len = speckv_lookahead_len,
};

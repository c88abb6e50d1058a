/* `snapkv`: SnapKV's one-shot eviction at prompt end.
 *
 * At the first prompt end of a layer, the last `window` prompt queries (the
 * observation window) score every far token: their attention weights over
 * the far tier, summed over the window's queries and over the KV group's
 * query heads, then 1-D pooled along the sequence (so a kept token brings
 * its neighbours' evidence: SnapKV's clustering step). The top `budget` far
 * tokens per KV head are kept; the rest are dropped. Far tokens inside the
 * window itself (possible when the local ring is shorter than the window)
 * are always kept, as SnapKV keeps its window, and count in the budget.
 * select returns the kept set plus every far token that arrived after that
 * prompt end (decode spill, a later turn's prompt): those were never scored.
 *
 * Softmax normalisation. SnapKV normalises each window query's weights over
 * all the keys it sees: sinks, far tier, and the local window. The policy
 * interface gives prefill_end the far tier only (the near tier is the
 * cache's), so the weights here are normalised over the far keys the query
 * sees. For one query this is the full-softmax weight divided by the
 * query's far-tier mass f_i (the share of its attention not on sinks or the
 * local window): the order of far tokens under one query is the same, only
 * the window queries' votes are reweighted by 1/f_i. A query that looks
 * mostly at sinks gets an equal vote instead of a small one; on real models
 * that is a minor change next to pooling and the group sum (measured in
 * `hetkv eval`). Exact SnapKV would need the near keys in prefill_end.
 *
 * Group aggregation: the sum over the group's heads before pooling, as
 * RocketKV's stage 1 and Ada-KV do (SnapKV itself is per head; per-head
 * sets under GQA would store each KV row up to g times). Pooling: max with
 * kernel 7 by default (the brief; RocketKV's code uses max pooling), avg as
 * in the original SnapKV code with pool=1.
 *
 * Later turns: standard SnapKV compresses once. A later prompt end keeps the
 * first selection: tokens dropped then stay dropped (hetkv keeps their
 * bytes, so "dropped" is only a selection mask), and the new turn's tokens
 * are attended in full as post-eviction tokens. That is the multi-turn
 * weakness the RocketKV paper measures (SCBench; notes A9, A10). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "window_scores.h"

enum { P_BUDGET, P_WINDOW, P_KERNEL, P_POOL, P_COUNT };

static const hkv_param_def snapkv_params[P_COUNT] = {
    {"budget", NAN, 1, 1 << 24, 1,
     "far tokens kept per KV head at prompt end (SnapKV's max_capacity_prompt less the window); "
     "default about 3% of n_ctx, a multiple of 32 in [32, 1024], as ctkvr's rho_p"},
    {"window", 32, 1, 4096, 1, "observation window: the last prompt queries that score (SnapKV: 32)"},
    {"kernel", 7, 1, 1023, 1, "pooling kernel along the sequence, odd (SnapKV: 7)"},
    {"pool", 0, 0, 1, 1, "pooling: 0 max (RocketKV's SnapKV code), 1 average (SnapKV's code, "
                         "zero padding counted)"},
};

typedef struct sk_layer {
    int evicted;            /* the one eviction has run */
    int64_t evict_hi;       /* far positions >= this arrived after it: always selected */
    int32_t *kept;          /* [KH][budget] ascending positions < evict_hi */
    int64_t *n_kept;        /* [KH] */
} sk_layer;

typedef struct snapkv {
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    int L, KH, H, d, n_threads, kernel, avg;
    int64_t budget, window, lo;
    sk_layer *lay;
    int32_t *kept;
    int64_t *n_kept;
    size_t lay_b, kept_b, n_kept_b;
} snapkv;

static double arg_of(const hkv_policy_args *a, int i)
{
    return a && !isnan(a->v[i]) ? a->v[i] : snapkv_params[i].dflt;
}

static int64_t snapkv_queries_wanted(const hkv_policy_args *a, const hkv_policy_env *env)
{
    (void)env;
    double w = arg_of(a, P_WINDOW);
    return w >= 1 && w <= snapkv_params[P_WINDOW].hi ? (int64_t)w : 32;
}

/* Keep-all for a far tier that fits the budget, else score and keep. */
static int evict(snapkv *s, int layer, const hkv_far_view *far, const hkv_query_view *qv,
                 hkv_err *err)
{
    sk_layer *ly = &s->lay[layer];
    const int64_t n = far->hi - far->lo;
    if (n <= s->budget) {
        for (int h = 0; h < s->KH; h++) {
            for (int64_t i = 0; i < n; i++) ly->kept[(int64_t)h * s->budget + i] = (int32_t)(far->lo + i);
            ly->n_kept[h] = n;
        }
        return HKV_OK;
    }
    if (qv->n <= 0) {   /* no window to score with: keep the most recent far tokens */
        for (int h = 0; h < s->KH; h++) {
            for (int64_t i = 0; i < s->budget; i++)
                ly->kept[(int64_t)h * s->budget + i] = (int32_t)(far->hi - s->budget + i);
            ly->n_kept[h] = s->budget;
        }
        return HKV_OK;
    }
    /* scores [KH][n], then per head: pool (2n floats), top-k (2n int32) */
    const size_t bytes = (size_t)n * 4 * ((size_t)s->KH + 4);
    float *sc = hkv_host_alloc(s->mem, HKV_TIER_WORKSPACE, bytes, err);
    if (!sc) return hkv_err_prefix(err, "snapkv scores (%lld far tokens)", (long long)n);
    float *tmp = sc + (size_t)s->KH * n;
    int32_t *idx = (int32_t *)(tmp + 2 * n), *scr = idx + n;
    hkv_ws_job job = {.far = far, .qv = qv, .n_head = s->H, .rows = NULL, .n_rows = NULL,
                      .out = sc, .ld_out = n, .n_threads = s->n_threads};
    int rc = hkv_ws_window_scores(s->kern, &job, s->mem, err);
    for (int h = 0; !rc && h < s->KH; h++) {
        float *sh = sc + (int64_t)h * n;
        hkv_ws_pool(sh, n, s->kernel, s->avg, tmp);
        ly->n_kept[h] = hkv_ws_keep(sh, NULL, far->lo, n, s->budget, qv->pos0,
                                    ly->kept + (int64_t)h * s->budget, idx, scr);
    }
    hkv_host_free(s->mem, HKV_TIER_WORKSPACE, sc, bytes);
    return rc;
}

static int snapkv_prefill_end(void *self, int layer, const hkv_far_view *far,
                              const hkv_query_view *qv, hkv_err *err)
{
    snapkv *s = self;
    if (layer < 0 || layer >= s->L || far->n_head_kv != s->KH || far->head_dim != s->d ||
        far->hi < far->lo)
        return hkv_seterr(err, HKV_E_INVAL, "snapkv: layer %d of %d, far view of %d KV heads, "
                          "d=%d, [%lld, %lld) does not match the policy (%d KV heads, d=%d)", layer,
                          s->L, far->n_head_kv, far->head_dim, (long long)far->lo,
                          (long long)far->hi, s->KH, s->d);
    sk_layer *ly = &s->lay[layer];
    if (ly->evicted) return HKV_OK;   /* SnapKV evicts once (see the top of the file) */
    const hkv_query_view win = hkv_ws_last_rows(qv, s->window);
    int rc = evict(s, layer, far, &win, err);
    if (rc) return hkv_err_prefix(err, "snapkv prompt end, layer %d", layer);
    ly->evict_hi = far->hi;
    ly->evicted = 1;
    s->lo = far->lo;
    return HKV_OK;
}

static void snapkv_on_far_append(void *self, int layer, const hkv_far_view *far)
{
    (void)self, (void)layer, (void)far;   /* post-eviction tokens are read off far->hi */
}

static int64_t snapkv_max_select(void *self, int64_t n_far)
{
    const snapkv *s = self;
    if (n_far <= 0) return 0;
    int64_t ehi = INT64_MAX;   /* the layer with the most post-eviction tokens */
    for (int l = 0; l < s->L; l++) {
        if (!s->lay[l].evicted) return n_far;
        if (s->lay[l].evict_hi < ehi) ehi = s->lay[l].evict_hi;
    }
    int64_t post = s->lo + n_far - ehi, m = s->budget + (post > 0 ? post : 0);
    return m < n_far ? m : n_far;
}

static void snapkv_scratch_need(void *self, int64_t n_far, int64_t *nf, int64_t *ni)
{
    (void)self, (void)n_far;
    *nf = *ni = 0;
}

static int64_t snapkv_select(void *self, int layer, int kvh, const float *q, const hkv_far_view *far,
                             int32_t *out, hkv_policy_scratch *ws)
{
    snapkv *s = self;
    (void)q;
    if (layer < 0 || layer >= s->L || kvh < 0 || kvh >= s->KH || !far || !out) return HKV_E_INVAL;
    const sk_layer *ly = &s->lay[layer];
    int64_t c = 0, from = far->lo;
    if (ly->evicted) {
        const int32_t *kp = ly->kept + (int64_t)kvh * s->budget;
        for (int64_t i = 0; i < ly->n_kept[kvh]; i++)
            if (kp[i] >= far->lo && kp[i] < far->hi) out[c++] = kp[i];
        if (ws) ws->bytes += (uint64_t)ly->n_kept[kvh] * 4;   /* the kept positions */
        from = ly->evict_hi > far->lo ? ly->evict_hi : far->lo;
    }
    for (int64_t p = from; p < far->hi; p++) out[c++] = (int32_t)p;
    return c;
}

static void snapkv_describe(void *self, char *buf, size_t cap)
{
    const snapkv *s = self;
    double kept = 0, scored = 0;
    int n = 0;
    for (int l = 0; l < s->L; l++) {
        if (!s->lay[l].evicted) continue;
        n++;
        scored += (double)(s->lay[l].evict_hi - s->lo);
        for (int h = 0; h < s->KH; h++) kept += (double)s->lay[l].n_kept[h] / s->KH;
    }
    snprintf(buf, cap, "snapkv budget=%lld window=%lld kernel=%d %s-pool, group sum, evict once; "
             "%d layers evicted, %.0f of %.0f far tokens kept per KV head", (long long)s->budget,
             (long long)s->window, s->kernel, s->avg ? "avg" : "max", n, n ? kept / n : 0.0,
             n ? scored / n : 0.0);
}

static void snapkv_destroy(void *self)
{
    snapkv *s = self;
    if (!s) return;
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->kept, s->kept_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->n_kept, s->n_kept_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->lay, s->lay_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s, sizeof *s);
}

/* The kept set for a device holding its rows: fixed once evicted. */
static int snapkv_device_takes(void *self, int layer)
{
    const snapkv *s = self;
    return layer >= 0 && layer < s->L && s->lay[layer].evicted ? HKV_FALLBACK_NONE
                                                               : HKV_FALLBACK_BEFORE_SELECTION;
}

static int snapkv_kept_set(void *self, int layer, hkv_kept_set *out)
{
    const snapkv *s = self;
    if (layer < 0 || layer >= s->L || !s->lay[layer].evicted) return HKV_E_INVAL;
    const sk_layer *ly = &s->lay[layer];
    *out = (hkv_kept_set){.pos = ly->kept, .n = ly->n_kept, .ld = s->budget, .from = ly->evict_hi,
                          .version = 1};
    return HKV_OK;
}

static const hkv_policy_ops snapkv_ops = {
    .prefill_end = snapkv_prefill_end,
    .on_far_append = snapkv_on_far_append,
    .select = snapkv_select,
    .device_takes = snapkv_device_takes,
    .kept_set = snapkv_kept_set,
    .max_select = snapkv_max_select,
    .scratch_need = snapkv_scratch_need,
    .describe = snapkv_describe,
    .destroy = snapkv_destroy,
};

static int snapkv_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                         hkv_err *err)
{
    const hkv_kv_shape *sh = &env->shape;
    if (!env->kern || sh->n_layer < 1 || sh->n_head_kv < 1 || sh->head_dim < 1 ||
        sh->n_head < sh->n_head_kv || sh->n_head % sh->n_head_kv)
        return hkv_seterr(err, HKV_E_INVAL, "snapkv: bad shape (%d layers, %d heads, %d KV heads, "
                          "d=%d) or no kernels", sh->n_layer, sh->n_head, sh->n_head_kv, sh->head_dim);
    int rc_args = hkv_policy_args_check(&hkv_policy_snapkv, a, err);
    if (rc_args) return rc_args;
    if (((int)arg_of(a, P_KERNEL) & 1) == 0)
        return hkv_seterr(err, HKV_E_RANGE, "snapkv: kernel=%g must be odd (a centred window)",
                          arg_of(a, P_KERNEL));
    snapkv *s = hkv_host_calloc(env->mem, HKV_TIER_INDEX, sizeof *s, err);
    if (!s) return hkv_err_prefix(err, "snapkv");
    s->kern = env->kern, s->mem = env->mem, s->n_threads = env->n_threads;
    s->L = sh->n_layer, s->KH = sh->n_head_kv, s->H = sh->n_head, s->d = sh->head_dim;
    double b = arg_of(a, P_BUDGET);
    s->budget = isnan(b) ? hkv_policy_default_budget(env->n_ctx) : (int64_t)b;
    if (env->n_ctx > 0 && s->budget > env->n_ctx) s->budget = env->n_ctx;   /* never more than the context */
    s->window = (int64_t)arg_of(a, P_WINDOW);
    s->kernel = (int)arg_of(a, P_KERNEL);
    s->avg = (int)arg_of(a, P_POOL);
    s->lo = env->L_init;
    s->lay_b = (size_t)s->L * sizeof *s->lay;
    s->kept_b = (size_t)s->L * s->KH * (size_t)s->budget * 4;
    s->n_kept_b = (size_t)s->L * s->KH * sizeof(int64_t);
    if (!(s->lay = hkv_host_calloc(s->mem, HKV_TIER_INDEX, s->lay_b, err)) ||
        !(s->kept = hkv_host_alloc(s->mem, HKV_TIER_INDEX, s->kept_b, err)) ||
        !(s->n_kept = hkv_host_calloc(s->mem, HKV_TIER_INDEX, s->n_kept_b, err))) {
        if (!s->lay) s->lay_b = 0;
        if (!s->kept) s->kept_b = 0;
        if (!s->n_kept) s->n_kept_b = 0;
        const long long budget = s->budget;   /* s is gone after the destroy */
        snapkv_destroy(s);
        return hkv_err_prefix(err, "snapkv kept sets (budget %lld)", budget);
    }
    for (int l = 0; l < s->L; l++) {
        s->lay[l].kept = s->kept + (size_t)l * s->KH * s->budget;
        s->lay[l].n_kept = s->n_kept + (size_t)l * s->KH;
    }
    out->ops = &snapkv_ops;
    out->self = s;
    return HKV_OK;
}

const hkv_policy_def hkv_policy_snapkv = {
    .name = "snapkv",
    .kind = HKV_POLICY_EVICTION,
    .summary = "one-shot eviction at prompt end: observation-window attention summed over the "
               "window and the KV group, pooled, top budget far tokens per KV head (SnapKV)",
    .params = snapkv_params,
    .n_params = P_COUNT,
    .queries_wanted = snapkv_queries_wanted,
    .create = snapkv_create,
};

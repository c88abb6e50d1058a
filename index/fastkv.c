/* `fastkv`: FastKV (notes Part B): token-selective propagation (TSP) at
 * prefill plus a per-layer, group-shared KV budget.
 *
 * Prefill (runtime/tsp_prefill.c drives it; prep HKV_PREP_TSP): a first
 * prompt longer than tsp_len runs through layers 0..tsp_layer in full. At
 * that layer's prompt end the last `window` queries score every prompt
 * token (B1 Eq. 3: attention summed over the window, avg-pooled, summed
 * over all heads); the top tokens, plus every position hetkv's near tier
 * holds (the L_init sinks and the last L_local tokens, which include the
 * window: FastKV keeps only the window; the near tier's rows must exist in
 * every layer here), go on: tsp_len positions in all. Layers after it
 * compute only those positions, at their original positions. A prompt of
 * at most tsp_len tokens is prefilled normally (nothing would be dropped).
 *
 * KV budget (B2 KVCompress): at every layer's prompt end, the window's
 * attention over the layer's present prompt tokens (all of them up to the
 * TSP layer, the propagated ones after it), summed over the window and the
 * KV group's heads (group-shared indices, Eq. 2), avg-pooled with `kernel`
 * along that token sequence, keeps the top `budget` far tokens per KV head.
 * In hetkv terms `budget` is the far tokens a decode step attends per KV
 * head; the sinks and the local window (FastKV's window) are always
 * attended on top, from the near tier. select returns the kept set plus
 * every far token that arrived after the prompt end (decode spill), as
 * snapkv; FastKV's decode is dense over that fixed set.
 *
 * Softmax: exact, over every key each window query sees (sinks and local
 * window included): policy.h guarantees the far rows hold the whole prompt
 * at prefill_end, so the scores run over positions [0, end), not only over
 * the far tier as snapkv's do. Pooling is linear, so pooling the group sum
 * equals FastKV's per-head pooling then sum.
 *
 * tsp_layer defaults to n_layer/2 - 1 (15 for 32-layer Llama, the paper's
 * choice; 14 for SmolLM2's 30 layers). Later turns keep the first
 * selection, as snapkv (FastKV is single-prompt). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "window_scores.h"

enum { P_BUDGET, P_WINDOW, P_KERNEL, P_POOL, P_TSP_LEN, P_TSP_LAYER, P_COUNT };

static const hkv_param_def fastkv_params[P_COUNT] = {
    {"budget", NAN, 1, 1 << 24, 1,
     "B_KV: far tokens kept per KV head and layer at prompt end (FastKV: 512..2048 per KV group); "
     "default about 3% of n_ctx, a multiple of 32 in [32, 1024], as every policy's budget"},
    {"window", 8, 1, 4096, 1, "observation window: the last prompt queries that score (FastKV: 8)"},
    {"kernel", 7, 1, 1023, 1, "pooling kernel along the sequence, odd (FastKV: 7)"},
    {"pool", 1, 0, 1, 1, "pooling: 1 average (FastKV's, zero padding counted), 0 max"},
    {"tsp_len", 2048, 1, 1 << 24, 1,
     "B_TSP: prompt tokens propagated past the TSP layer, sinks and local window included "
     "(FastKV: 2048); a prompt no longer than this is prefilled in full"},
    {"tsp_layer", NAN, 0, 4096, 1,
     "last layer that processes the whole prompt (FastKV: 15 of 32); default n_layer/2 - 1"},
};

typedef struct fk_layer {
    int evicted;            /* the one selection has run */
    int64_t evict_hi;       /* far positions >= this arrived after it: always selected */
    int32_t *kept;          /* [KH][budget] ascending positions < evict_hi */
    int64_t *n_kept;        /* [KH] */
} fk_layer;

typedef struct fastkv {
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    int L, KH, H, d, n_threads, kernel, avg, tsp_layer, L_init, L_local;
    int64_t budget, window, tsp_len, lo;
    fk_layer *lay;
    int32_t *kept;
    int64_t *n_kept;
    size_t lay_b, kept_b, n_kept_b;
    int64_t tsp_n;          /* the prompt being cut (set by tsp_layer), 0: none */
    int32_t *tsp;           /* [tsp_n]: the propagated positions, ascending */
    int64_t n_tsp;
    size_t tsp_b;
} fastkv;

static double arg_of(const hkv_policy_args *a, int i)
{
    return a && !isnan(a->v[i]) ? a->v[i] : fastkv_params[i].dflt;
}

static int64_t fastkv_queries_wanted(const hkv_policy_args *a, const hkv_policy_env *env)
{
    (void)env;
    double w = arg_of(a, P_WINDOW);
    return w >= 1 && w <= fastkv_params[P_WINDOW].hi ? (int64_t)w : 8;
}

/* Positions always propagated from a prompt of n: sinks and the last
 * max(L_local, window). Returns where the tail starts. */
static int64_t forced_tail(const fastkv *f, int64_t n)
{
    int64_t t = f->L_local > f->window ? f->L_local : f->window;
    return n - t > 0 ? n - t : 0;
}

/* The propagated set from the TSP layer's scores tot[0..n) over [0, n). */
static int choose_tsp(fastkv *f, float *tot, int64_t n, int32_t *idx, int32_t *scr, hkv_err *err)
{
    if (f->tsp) hkv_host_free(f->mem, HKV_TIER_INDEX, f->tsp, f->tsp_b);
    f->tsp_b = (size_t)n * sizeof(int32_t);
    if (!(f->tsp = hkv_host_alloc(f->mem, HKV_TIER_INDEX, f->tsp_b, err))) {
        f->tsp_b = 0;
        return hkv_err_prefix(err, "fastkv propagated set (%lld tokens)", (long long)n);
    }
    for (int64_t i = 0; i < n && i < f->L_init; i++) tot[i] = INFINITY;
    int64_t k = f->tsp_len < n ? f->tsp_len : n;
    f->n_tsp = hkv_ws_keep(tot, NULL, 0, n, k, forced_tail(f, n), f->tsp, idx, scr);
    return HKV_OK;
}

static int fastkv_prefill_end(void *self, int layer, const hkv_far_view *far,
                              const hkv_query_view *qv, hkv_err *err)
{
    fastkv *f = self;
    if (layer < 0 || layer >= f->L || far->n_head_kv != f->KH || far->head_dim != f->d ||
        far->hi < far->lo)
        return hkv_seterr(err, HKV_E_INVAL, "fastkv: layer %d of %d, far view of %d KV heads, "
                          "d=%d, [%lld, %lld) does not match the policy (%d KV heads, d=%d)", layer,
                          f->L, far->n_head_kv, far->head_dim, (long long)far->lo,
                          (long long)far->hi, f->KH, f->d);
    fk_layer *ly = &f->lay[layer];
    if (ly->evicted) return HKV_OK;   /* one selection per sequence (see the top) */
    f->lo = far->lo;
    ly->evict_hi = far->hi;
    ly->evicted = 1;
    const hkv_query_view win = hkv_ws_last_rows(qv, f->window);
    const int do_tsp = layer == f->tsp_layer && f->tsp_n > 0 && !far->rows && qv->n > 0 &&
                       qv->pos0 + qv->n == f->tsp_n;
    /* The present prompt positions [0, end): all, or the propagated list. */
    const int64_t end = win.n > 0 ? win.pos0 + win.n : far->hi;
    int64_t n_c = end;
    if (far->rows) {
        n_c = 0;
        for (int64_t i = 0; i < far->n_rows && far->rows[i] < end; i++) n_c++;
        n_c += end > far->rows_end ? end - far->rows_end : 0;
    }
    if (n_c == 0) {
        for (int h = 0; h < f->KH; h++) ly->n_kept[h] = 0;
        return HKV_OK;
    }
    /* cand [n_c] | scores [KH][n_c] | tot [n_c] | pool tmp [2 n_c] | idx, scr [n_c] each */
    const size_t bytes = (size_t)n_c * 4 * ((size_t)f->KH + 6);
    int32_t *cand = hkv_host_alloc(f->mem, HKV_TIER_WORKSPACE, bytes, err);
    if (!cand) return hkv_err_prefix(err, "fastkv scores (%lld tokens)", (long long)n_c);
    float *sc = (float *)(cand + n_c), *tot = sc + (size_t)f->KH * n_c, *tmp = tot + n_c;
    int32_t *idx = (int32_t *)(tmp + 2 * n_c), *scr = idx + n_c;
    if (far->rows) {
        int64_t c = 0;
        for (int64_t i = 0; i < far->n_rows && far->rows[i] < end; i++) cand[c++] = far->rows[i];
        for (int64_t p = far->rows_end; p < end; p++) cand[c++] = (int32_t)p;
    } else {
        for (int64_t i = 0; i < n_c; i++) cand[i] = (int32_t)i;
    }
    /* The far slice [a, b) of the candidates. */
    int64_t a = 0, b = n_c;
    while (a < n_c && cand[a] < far->lo) a++;
    b = a;
    while (b < n_c && cand[b] < far->hi) b++;
    const int64_t n_far = b - a;
    const int scored = do_tsp || (n_far > f->budget && win.n > 0);
    int rc = HKV_OK;
    const int32_t *rowp[64];
    int64_t nrow[64];
    if (f->KH > 64) rc = hkv_seterr(err, HKV_E_RANGE, "fastkv: %d KV heads (at most 64)", f->KH);
    for (int h = 0; !rc && h < f->KH; h++) rowp[h] = cand, nrow[h] = n_c;
    hkv_far_view all = *far;   /* scores over every present key: exact softmax */
    all.lo = 0;
    all.hi = end;
    hkv_ws_job job = {.far = &all, .qv = &win, .n_head = f->H, .rows = rowp, .n_rows = nrow,
                      .out = sc, .ld_out = n_c, .n_threads = f->n_threads};
    if (!rc && scored) rc = hkv_ws_window_scores(f->kern, &job, f->mem, err);
    if (!rc && scored)
        for (int h = 0; h < f->KH; h++) hkv_ws_pool(sc + (int64_t)h * n_c, n_c, f->kernel, f->avg, tmp);
    if (!rc && do_tsp) {
        for (int64_t i = 0; i < n_c; i++) {
            double s = 0;
            for (int h = 0; h < f->KH; h++) s += sc[(int64_t)h * n_c + i];
            tot[i] = (float)s;
        }
        rc = choose_tsp(f, tot, n_c, idx, scr, err);
    }
    for (int h = 0; !rc && h < f->KH; h++) {
        int32_t *kp = ly->kept + (int64_t)h * f->budget;
        if (n_far <= f->budget || win.n == 0) {
            /* all fit; or no window to score with: the most recent */
            int64_t k = n_far < f->budget ? n_far : f->budget;
            memcpy(kp, cand + b - k, (size_t)k * sizeof(int32_t));
            ly->n_kept[h] = k;
        } else {
            ly->n_kept[h] = hkv_ws_keep(sc + (int64_t)h * n_c + a, cand + a, 0, n_far, f->budget,
                                        win.pos0, kp, idx, scr);
        }
    }
    hkv_host_free(f->mem, HKV_TIER_WORKSPACE, cand, bytes);
    return rc ? hkv_err_prefix(err, "fastkv prompt end, layer %d", layer) : HKV_OK;
}

static void fastkv_on_far_append(void *self, int layer, const hkv_far_view *far)
{
    (void)self, (void)layer, (void)far;   /* post-selection tokens are read off far->hi */
}

static int64_t fastkv_max_select(void *self, int64_t n_far)
{
    const fastkv *f = self;
    if (n_far <= 0) return 0;
    int64_t ehi = INT64_MAX;
    for (int l = 0; l < f->L; l++) {
        if (!f->lay[l].evicted) return n_far;
        if (f->lay[l].evict_hi < ehi) ehi = f->lay[l].evict_hi;
    }
    int64_t post = f->lo + n_far - ehi, m = f->budget + (post > 0 ? post : 0);
    return m < n_far ? m : n_far;
}

static void fastkv_scratch_need(void *self, int64_t n_far, int64_t *nf, int64_t *ni)
{
    (void)self, (void)n_far;
    *nf = *ni = 0;
}

static int64_t fastkv_select(void *self, int layer, int kvh, const float *q, const hkv_far_view *far,
                             int32_t *out, hkv_policy_scratch *ws)
{
    fastkv *f = self;
    (void)q;
    if (layer < 0 || layer >= f->L || kvh < 0 || kvh >= f->KH || !far || !out) return HKV_E_INVAL;
    const fk_layer *ly = &f->lay[layer];
    int64_t c = 0, from = far->lo;
    if (ly->evicted) {
        const int32_t *kp = ly->kept + (int64_t)kvh * f->budget;
        for (int64_t i = 0; i < ly->n_kept[kvh]; i++)
            if (kp[i] >= far->lo && kp[i] < far->hi) out[c++] = kp[i];
        if (ws) ws->bytes += (uint64_t)ly->n_kept[kvh] * 4;   /* the kept positions */
        from = ly->evict_hi > far->lo ? ly->evict_hi : far->lo;
    } else if (far->rows) {
        return HKV_E_INVAL;   /* a propagated layer is always selected at its prompt end */
    }
    for (int64_t p = from; p < far->hi; p++) out[c++] = (int32_t)p;
    return c;
}

static int fastkv_tsp_layer(void *self, int64_t n_prompt)
{
    fastkv *f = self;
    f->tsp_n = 0;
    if (n_prompt <= f->tsp_len || f->tsp_layer >= f->L - 1) return -1;
    f->tsp_n = n_prompt;
    return f->tsp_layer;
}

static int64_t fastkv_tsp_rows(void *self, int32_t *out, int64_t cap)
{
    const fastkv *f = self;
    if (!f->tsp || f->n_tsp > cap) return HKV_E_INVAL;
    memcpy(out, f->tsp, (size_t)f->n_tsp * sizeof(int32_t));
    return f->n_tsp;
}

static void fastkv_describe(void *self, char *buf, size_t cap)
{
    const fastkv *f = self;
    double kept = 0;
    int n = 0;
    for (int l = 0; l < f->L; l++) {
        if (!f->lay[l].evicted) continue;
        n++;
        for (int h = 0; h < f->KH; h++) kept += (double)f->lay[l].n_kept[h] / f->KH;
    }
    char t[96] = "prompt not cut";
    if (f->n_tsp > 0)
        snprintf(t, sizeof t, "%lld of %lld prompt tokens propagated past layer %d",
                 (long long)f->n_tsp, (long long)f->tsp_n, f->tsp_layer);
    snprintf(buf, cap, "fastkv budget=%lld window=%lld kernel=%d %s-pool tsp_len=%lld tsp_layer=%d; "
             "%s; %.0f far tokens kept per KV head over %d layers", (long long)f->budget,
             (long long)f->window, f->kernel, f->avg ? "avg" : "max", (long long)f->tsp_len,
             f->tsp_layer, t, n ? kept / n : 0.0, n);
}

static void fastkv_destroy(void *self)
{
    fastkv *f = self;
    if (!f) return;
    hkv_host_free(f->mem, HKV_TIER_INDEX, f->tsp, f->tsp_b);
    hkv_host_free(f->mem, HKV_TIER_INDEX, f->kept, f->kept_b);
    hkv_host_free(f->mem, HKV_TIER_INDEX, f->n_kept, f->n_kept_b);
    hkv_host_free(f->mem, HKV_TIER_INDEX, f->lay, f->lay_b);
    hkv_host_free(f->mem, HKV_TIER_INDEX, f, sizeof *f);
}

/* The kept set for a device holding its rows: fixed once evicted. */
static int fastkv_device_takes(void *self, int layer)
{
    const fastkv *f = self;
    return layer >= 0 && layer < f->L && f->lay[layer].evicted ? HKV_FALLBACK_NONE
                                                               : HKV_FALLBACK_BEFORE_SELECTION;
}

static int fastkv_kept_set(void *self, int layer, hkv_kept_set *out)
{
    const fastkv *f = self;
    if (layer < 0 || layer >= f->L || !f->lay[layer].evicted) return HKV_E_INVAL;
    const fk_layer *ly = &f->lay[layer];
    *out = (hkv_kept_set){.pos = ly->kept, .n = ly->n_kept, .ld = f->budget, .from = ly->evict_hi,
                          .version = 1};
    return HKV_OK;
}

static const hkv_policy_ops fastkv_ops = {
    .prefill_end = fastkv_prefill_end,
    .on_far_append = fastkv_on_far_append,
    .select = fastkv_select,
    .device_takes = fastkv_device_takes,
    .kept_set = fastkv_kept_set,
    .max_select = fastkv_max_select,
    .scratch_need = fastkv_scratch_need,
    .tsp_layer = fastkv_tsp_layer,
    .tsp_rows = fastkv_tsp_rows,
    .describe = fastkv_describe,
    .destroy = fastkv_destroy,
};

static int fastkv_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                         hkv_err *err)
{
    const hkv_kv_shape *sh = &env->shape;
    if (!env->kern || sh->n_layer < 1 || sh->n_head_kv < 1 || sh->head_dim < 1 ||
        sh->n_head < sh->n_head_kv || sh->n_head % sh->n_head_kv || sh->n_head_kv > 64)
        return hkv_seterr(err, HKV_E_INVAL, "fastkv: bad shape (%d layers, %d heads, %d KV heads, "
                          "d=%d) or no kernels", sh->n_layer, sh->n_head, sh->n_head_kv, sh->head_dim);
    int rc_args = hkv_policy_args_check(&hkv_policy_fastkv, a, err);
    if (rc_args) return rc_args;
    if (((int)arg_of(a, P_KERNEL) & 1) == 0)
        return hkv_seterr(err, HKV_E_RANGE, "fastkv: kernel=%g must be odd (a centred window)",
                          arg_of(a, P_KERNEL));
    double tl = arg_of(a, P_TSP_LAYER);
    int tsp_layer = isnan(tl) ? sh->n_layer / 2 - 1 : (int)tl;
    if (tsp_layer < 0) tsp_layer = 0;
    if (tsp_layer >= sh->n_layer)
        return hkv_seterr(err, HKV_E_RANGE, "fastkv: tsp_layer=%d, but the model has %d layers "
                          "(0..%d)", tsp_layer, sh->n_layer, sh->n_layer - 1);
    int64_t window = (int64_t)arg_of(a, P_WINDOW), tsp_len = (int64_t)arg_of(a, P_TSP_LEN);
    int64_t forced = (int64_t)env->L_init + (env->L_local > window ? env->L_local : window);
    if (tsp_len < forced)
        return hkv_seterr(err, HKV_E_RANGE, "fastkv: tsp_len=%lld is below the %lld positions that "
                          "always propagate (L_init %d sinks + the last max(L_local %d, window %lld))",
                          (long long)tsp_len, (long long)forced, env->L_init, env->L_local,
                          (long long)window);
    fastkv *f = hkv_host_calloc(env->mem, HKV_TIER_INDEX, sizeof *f, err);
    if (!f) return hkv_err_prefix(err, "fastkv");
    f->kern = env->kern, f->mem = env->mem, f->n_threads = env->n_threads;
    f->L = sh->n_layer, f->KH = sh->n_head_kv, f->H = sh->n_head, f->d = sh->head_dim;
    f->L_init = env->L_init, f->L_local = env->L_local;
    double b = arg_of(a, P_BUDGET);
    f->budget = isnan(b) ? hkv_policy_default_budget(env->n_ctx) : (int64_t)b;
    if (env->n_ctx > 0 && f->budget > env->n_ctx) f->budget = env->n_ctx;
    f->window = window;
    f->kernel = (int)arg_of(a, P_KERNEL);
    f->avg = (int)arg_of(a, P_POOL);
    f->tsp_len = tsp_len;
    f->tsp_layer = tsp_layer;
    f->lo = env->L_init;
    f->lay_b = (size_t)f->L * sizeof *f->lay;
    f->kept_b = (size_t)f->L * f->KH * (size_t)f->budget * 4;
    f->n_kept_b = (size_t)f->L * f->KH * sizeof(int64_t);
    if (!(f->lay = hkv_host_calloc(f->mem, HKV_TIER_INDEX, f->lay_b, err)) ||
        !(f->kept = hkv_host_alloc(f->mem, HKV_TIER_INDEX, f->kept_b, err)) ||
        !(f->n_kept = hkv_host_calloc(f->mem, HKV_TIER_INDEX, f->n_kept_b, err))) {
        if (!f->lay) f->lay_b = 0;
        if (!f->kept) f->kept_b = 0;
        if (!f->n_kept) f->n_kept_b = 0;
        const long long budget = f->budget;   /* f is gone after the destroy */
        fastkv_destroy(f);
        return hkv_err_prefix(err, "fastkv kept sets (budget %lld)", budget);
    }
    for (int l = 0; l < f->L; l++) {
        f->lay[l].kept = f->kept + (size_t)l * f->KH * f->budget;
        f->lay[l].n_kept = f->n_kept + (size_t)l * f->KH;
    }
    out->ops = &fastkv_ops;
    out->self = f;
    return HKV_OK;
}

const hkv_policy_def hkv_policy_fastkv = {
    .name = "fastkv",
    .kind = HKV_POLICY_PREFILL,
    .prep = HKV_PREP_TSP,
    .summary = "token-selective propagation at prefill (the whole prompt through the first half of "
               "the layers, the top tsp_len tokens after) and a group-shared budget of far tokens "
               "per layer chosen by the observation window, avg-pooled (FastKV)",
    .params = fastkv_params,
    .n_params = P_COUNT,
    .queries_wanted = fastkv_queries_wanted,
    .create = fastkv_create,
};

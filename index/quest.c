/* `quest`: query-aware page selection (Quest; RocketKV's stage-2 page part).
 *
 * The far tier of each (layer, KV head) is cut into pages of P positions
 * starting at far->lo; page i holds [lo + i*P, lo + (i+1)*P), the last one
 * possibly partial. Per page the index keeps the element-wise max and min of
 * its keys. For a query q, sum_i max(q_i*max_i, q_i*min_i) bounds q.k from
 * above for every key of the page; select takes the max of that bound over
 * the KV group's query heads (Quest is per head; max over the group is the
 * GQA form that keeps the bound, as score_max does for tokens), and attends
 * every token of the best K = budget/P pages.
 *
 * Layout: a page is one fp16 row [max (d) | min (d)]. Min and max of fp16
 * keys are fp16 values, so fp16 loses nothing and halves the bytes select
 * reads (2d*2 bytes per page, 1/P of the keys' bytes times 2). With the
 * query split as q+ = max(q, 0) and q- = min(q, 0), the bound is one dot
 * product of length 2d: q+ . max + q- . min, so the existing score_max
 * kernel computes the group max of the bounds of any set of pages.
 *
 * Updates: prefill_end builds the pages of [built_hi, hi) (everything at the
 * first prompt end, the new turn's tokens at a later one); on_far_append
 * extends the last page or opens a new one. Far rows never change once
 * written, so a page's bounds only ever widen. Min/max are taken on the fp16
 * bit patterns mapped to an order-preserving integer, with no conversion. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "far_rows.h"
#include "window_scores.h"

enum { P_PAGE, P_BUDGET, P_COUNT };

static const hkv_param_def quest_params[P_COUNT] = {
    {"page", 16, 1, 4096, 1, "tokens per page (Quest's default, 16)"},
    {"budget", NAN, 1, 1 << 24, 1,
     "far tokens attended per step and KV head, rounded down to whole pages, at least one (Quest's "
     "token budget); default about 3% of n_ctx, a multiple of 32 in [32, 1024], as ctkvr's rho_p"},
};

typedef struct quest {
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    int L, KH, g, d;
    int64_t P, K;            /* page size, pages attended */
    int64_t np_cap;          /* pages room per (layer, KV head) */
    uint16_t *bounds;        /* [L][KH][np_cap][2d] fp16: max, then min */
    int64_t *built_hi;       /* [L] far positions [lo, built_hi) are in pages */
    int64_t *lo;             /* [L] far->lo the pages start at */
    int64_t *steps, *pages;  /* [L*KH] statistics for describe */
    uint64_t version;        /* moves at every prompt end (a device copy uploads again) */
    size_t bounds_b, meta_b;
} quest;

static const hkv_policy_ops quest_ops;

static double arg_of(const hkv_policy_args *a, int i)
{
    return a && !isnan(a->v[i]) ? a->v[i] : quest_params[i].dflt;
}

static inline uint16_t *page_row(const quest *s, int layer, int kvh, int64_t page)
{
    return s->bounds + (((size_t)layer * s->KH + kvh) * s->np_cap + (size_t)page) * 2 * s->d;
}

/* fp16 bits -> an integer that sorts like the value (-0 just below +0) */
static inline uint16_t ord16(uint16_t h) { return (h & 0x8000) ? (uint16_t)~h : (uint16_t)(h | 0x8000); }

/* Far positions [built_hi, far->hi) into the pages of `layer`. */
static int extend(quest *s, int layer, const hkv_far_view *far)
{
    const int d = s->d;
    if (s->built_hi[layer] < 0 || s->lo[layer] != far->lo) {   /* first build, or a new origin */
        s->built_hi[layer] = far->lo;
        s->lo[layer] = far->lo;
    }
    const int64_t lo = s->lo[layer];
    if (far->hi - lo > s->np_cap * s->P) return HKV_E_RANGE;
    for (int64_t p = s->built_hi[layer]; p < far->hi; p++) {
        const int64_t pg = (p - lo) / s->P;
        const int first = (p - lo) % s->P == 0;
        for (int h = 0; h < s->KH; h++) {
            uint16_t tmp[HKV_Q8_MAX_D];
            const uint16_t *k = hkv_far_k16(s->kern, far, h, p, tmp);
            uint16_t *mx = page_row(s, layer, h, pg), *mn = mx + d;
            if (first) {
                memcpy(mx, k, (size_t)d * 2);
                memcpy(mn, k, (size_t)d * 2);
                continue;
            }
            for (int e = 0; e < d; e++) {
                const uint16_t o = ord16(k[e]);
                if (o > ord16(mx[e])) mx[e] = k[e];
                if (o < ord16(mn[e])) mn[e] = k[e];
            }
        }
    }
    if (far->hi > s->built_hi[layer]) s->built_hi[layer] = far->hi;
    return HKV_OK;
}

static int quest_prefill_end(void *self, int layer, const hkv_far_view *far,
                             const hkv_query_view *qv, hkv_err *err)
{
    quest *s = self;
    (void)qv;
    if (layer < 0 || layer >= s->L || far->n_head_kv != s->KH || far->head_dim != s->d ||
        far->hi < far->lo)
        return hkv_seterr(err, HKV_E_INVAL, "quest: layer %d of %d, far view of %d KV heads, d=%d, "
                          "[%lld, %lld) does not match the policy (%d KV heads, d=%d)", layer, s->L,
                          far->n_head_kv, far->head_dim, (long long)far->lo, (long long)far->hi,
                          s->KH, s->d);
    if (extend(s, layer, far))
        return hkv_seterr(err, HKV_E_RANGE, "quest: far tier [%lld, %lld) exceeds the %lld pages "
                          "sized for the context", (long long)far->lo, (long long)far->hi,
                          (long long)s->np_cap);
    s->version++;
    return HKV_OK;
}

static void quest_on_far_append(void *self, int layer, const hkv_far_view *far)
{
    quest *s = self;
    /* cannot fail for a far tier within the context the pages were sized for;
     * if it ever did, select reports the unindexed tokens */
    if (layer >= 0 && layer < s->L) (void)extend(s, layer, far);
}

static int64_t quest_max_select(void *self, int64_t n_far)
{
    const quest *s = self;
    const int64_t b = s->K * s->P;
    return n_far < b ? (n_far > 0 ? n_far : 0) : b;
}

static void quest_scratch_need(void *self, int64_t n_far, int64_t *nf, int64_t *ni)
{
    const quest *s = self;
    const int64_t np = (n_far > 0 ? n_far : 0) / s->P + 1;
    *nf = 2 * (int64_t)s->g * s->d + np;
    *ni = 3 * np;
}

static int64_t quest_select(void *self, int layer, int kvh, const float *q, const hkv_far_view *far,
                            int32_t *out, hkv_policy_scratch *ws)
{
    quest *s = self;
    if (layer < 0 || layer >= s->L || kvh < 0 || kvh >= s->KH || !q || !far || !out || !ws)
        return HKV_E_INVAL;
    const int64_t lo = far->lo, hi = far->hi, n = hi - lo;
    if (n <= 0) return 0;
    if (n <= s->K * s->P) {   /* the budget covers the whole far tier */
        for (int64_t i = 0; i < n; i++) out[i] = (int32_t)(lo + i);
        return n;
    }
    if (s->built_hi[layer] < hi || s->lo[layer] != lo) return HKV_E_INVAL;   /* unindexed tokens */
    const int g = s->g, d = s->d;
    const int64_t np = (n + s->P - 1) / s->P;
    int64_t need_f, need_i;
    quest_scratch_need(s, n, &need_f, &need_i);
    if (ws->nf < need_f || ws->ni < need_i || !ws->f || !ws->i) return HKV_E_INVAL;
    float *qpm = ws->f, *sc = qpm + 2 * (int64_t)g * d;
    int32_t *pg = ws->i, *sel = pg + np, *tmp = sel + np;
    for (int j = 0; j < g; j++)   /* [q+ | q-] per head: the bound is one 2d-long dot */
        for (int e = 0; e < d; e++) {
            const float x = q[j * d + e];
            qpm[(int64_t)j * 2 * d + e] = x > 0 ? x : 0;
            qpm[(int64_t)j * 2 * d + d + e] = x < 0 ? x : 0;
        }
    for (int64_t i = 0; i < np; i++) pg[i] = (int32_t)i;
    hkv_policy_score_max(ws, s->kern, qpm, g, 2 * d, page_row(s, layer, kvh, 0), 2 * (int64_t)d, pg,
                         np, sc);
    ws->bytes += (uint64_t)np * 2 * d * 2;   /* every page's fp16 min and max keys */
    int64_t m = hkv_topk_asc(sc, np, s->K, sel, tmp);   /* ascending: sequential gathers */
    int64_t c = 0;
    for (int64_t t = 0; t < m; t++) {
        const int64_t a = lo + (int64_t)sel[t] * s->P, b = a + s->P < hi ? a + s->P : hi;
        for (int64_t p = a; p < b; p++) out[c++] = (int32_t)p;
    }
    s->steps[layer * s->KH + kvh]++;
    s->pages[layer * s->KH + kvh] += np;
    return c;
}

static int quest_device_takes(void *self, int layer)
{
    const quest *s = self;
    return layer >= 0 && layer < s->L && s->built_hi[layer] >= 0 ? HKV_FALLBACK_NONE
                                                                : HKV_FALLBACK_BEFORE_SELECTION;
}

static int quest_page_table(void *self, int layer, hkv_page_table *out)
{
    const quest *s = self;
    if (layer < 0 || layer >= s->L || s->built_hi[layer] < 0) return HKV_E_INVAL;
    *out = (hkv_page_table){.bounds = page_row(s, layer, 0, 0), .np_cap = s->np_cap, .P = s->P,
                           .K = s->K, .lo = s->lo[layer], .hi = s->built_hi[layer],
                           .version = s->version};
    return HKV_OK;
}

static void quest_describe(void *self, char *buf, size_t cap)
{
    const quest *s = self;
    int64_t steps = 0, pages = 0;
    for (int64_t i = 0; i < (int64_t)s->L * s->KH; i++) steps += s->steps[i], pages += s->pages[i];
    char mb[32];
    hkv_fmt_bytes((double)s->bounds_b, mb, sizeof mb);
    snprintf(buf, cap, "quest page=%lld budget=%lld (%lld pages), fp16 min/max, index %s; %lld "
             "selects over %.0f pages", (long long)s->P, (long long)(s->K * s->P), (long long)s->K,
             mb, (long long)steps, steps ? (double)pages / (double)steps : 0.0);
}

static void quest_destroy(void *self)
{
    quest *s = self;
    if (!s) return;
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->bounds, s->bounds_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->built_hi, s->meta_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s, sizeof *s);
}

static const hkv_policy_ops quest_ops = {
    .prefill_end = quest_prefill_end,
    .on_far_append = quest_on_far_append,
    .select = quest_select,
    .max_select = quest_max_select,
    .scratch_need = quest_scratch_need,
    .device_takes = quest_device_takes,
    .page_table = quest_page_table,
    .describe = quest_describe,
    .destroy = quest_destroy,
};

static int quest_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                        hkv_err *err)
{
    const hkv_kv_shape *sh = &env->shape;
    if (!env->kern || sh->n_layer < 1 || sh->n_head_kv < 1 || sh->head_dim < 1 ||
        sh->n_head < sh->n_head_kv || sh->n_head % sh->n_head_kv || env->n_ctx < 1)
        return hkv_seterr(err, HKV_E_INVAL, "quest: bad shape (%d layers, %d heads, %d KV heads, "
                          "d=%d, context %lld) or no kernels", sh->n_layer, sh->n_head,
                          sh->n_head_kv, sh->head_dim, (long long)env->n_ctx);
    int rc_args = hkv_policy_args_check(&hkv_policy_quest, a, err);
    if (rc_args) return rc_args;
    quest *s = hkv_host_calloc(env->mem, HKV_TIER_INDEX, sizeof *s, err);
    if (!s) return hkv_err_prefix(err, "quest");
    s->kern = env->kern, s->mem = env->mem;
    s->L = sh->n_layer, s->KH = sh->n_head_kv, s->d = sh->head_dim, s->g = sh->n_head / sh->n_head_kv;
    s->P = (int64_t)arg_of(a, P_PAGE);
    double b = arg_of(a, P_BUDGET);
    int64_t budget = isnan(b) ? hkv_policy_default_budget(env->n_ctx) : (int64_t)b;
    s->K = budget / s->P > 0 ? budget / s->P : 1;
    s->np_cap = env->n_ctx / s->P + 1;
    s->bounds_b = (size_t)s->L * s->KH * (size_t)s->np_cap * 2 * s->d * 2;
    s->meta_b = (size_t)s->L * 2 * sizeof(int64_t) + (size_t)s->L * s->KH * 2 * sizeof(int64_t);
    if (!(s->bounds = hkv_host_alloc(s->mem, HKV_TIER_INDEX, s->bounds_b, err)) ||
        !(s->built_hi = hkv_host_calloc(s->mem, HKV_TIER_INDEX, s->meta_b, err))) {
        if (!s->bounds) s->bounds_b = 0;
        if (!s->built_hi) s->meta_b = 0;
        const long long np = s->np_cap, P = s->P;   /* s is gone after the destroy */
        quest_destroy(s);
        return hkv_err_prefix(err, "quest page bounds (%lld pages of %lld)", np, P);
    }
    s->lo = s->built_hi + s->L;
    s->steps = s->lo + s->L;
    s->pages = s->steps + (int64_t)s->L * s->KH;
    for (int l = 0; l < s->L; l++) s->built_hi[l] = -1;
    out->ops = &quest_ops;
    out->self = s;
    return HKV_OK;
}

int hkv_quest_page_bounds(const hkv_policy *pol, int layer, int kvh, int64_t page,
                          const uint16_t **row, int64_t *n_pages)
{
    if (!pol || pol->ops != &quest_ops) return HKV_E_INVAL;
    const quest *s = pol->self;
    if (layer < 0 || layer >= s->L || kvh < 0 || kvh >= s->KH) return HKV_E_INVAL;
    const int64_t np = s->built_hi[layer] < 0 ? 0 : (s->built_hi[layer] - s->lo[layer] + s->P - 1) / s->P;
    if (n_pages) *n_pages = np;
    if (row) *row = page >= 0 && page < np ? page_row(s, layer, kvh, page) : NULL;
    return page >= 0 && page < np ? HKV_OK : HKV_E_RANGE;
}

const hkv_policy_def hkv_policy_quest = {
    .name = "quest",
    .kind = HKV_POLICY_SELECTION,
    .summary = "query-aware pages: per-page element-wise key min/max, upper bound of q.k (max over "
               "the group), the best budget/page pages every step (Quest)",
    .params = quest_params,
    .n_params = P_COUNT,
    .queries_wanted = NULL,
    .create = quest_create,
};

/* `ctkvr`: centroid-then-token KV retrieval (seeds/002, Algorithms 1 and 2).
 *
 * Prompt end (Algorithm 1): the last C prompt queries become centroids; for
 * each centroid and KV head, the top-rho far keys by max over the group's
 * query heads of q.k form an IVF list (ctkvr_build.c, with the later-turn rules below).
 * Decode (Algorithm 2), per KV head: cosine of the step's g query heads with
 * each centroid's matching heads, max over the group, top C' centroids
 * (recall); union of their lists, deduplicated, plus the unindexed tail;
 * score_max over those candidates and the top rho' (rerank). With dcu=1 the
 * step's query and the top rho of its reranked candidates then replace the
 * oldest centroid of that KV head (FIFO, section 3.1.3). dcu=2 is a variant
 * (see dcu_push) that refreshes a recalled DCU centroid instead of pushing
 * near-copies; on the synthetic tests it beats both 0 and 1 under drift.
 *
 * Centroids are stored L2-normalised in fp16: recall reads all C of them
 * every step (C*g*d*2 bytes per KV head, as much as the rerank reads), so
 * fp16 halves the bytes; unit-norm values lose nothing that matters for the
 * top C' order. IVF lists are absolute far positions (int32), which the
 * kernels take as row indices directly.
 *
 * The unindexed tail: far positions at or after `indexed_hi` (tokens spilled
 * in decode, a later turn's prompt) are not in any prompt-end list; the most
 * recent `tail` of them are always candidates, and with dcu=1 they reach new
 * lists through the reranked sets.
 *
 * Later turns (a second prefill_end on a layer): with dcu=0 the index is
 * kept and the new far tokens are tail. With dcu=1 the queries since the last
 * prompt end (this turn's decode steps and its prompt, at most C) are pushed
 * into each KV head's FIFO, their lists computed exactly over the whole far
 * tier; the slots select pushed for the same decode steps are reused first,
 * so a decode query is not held twice. If all C slots are rewritten, the
 * index covers the whole far tier and the tail starts again at its end.
 *
 * Threads: select for (layer, kvh) touches only that pair's FIFO, lists,
 * statistics and its g heads' slices of the layer's centroids. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "far_rows.h"
#include "ctkvr_impl.h"

enum { P_C, P_CP, P_RHO, P_RHOP, P_DCU, P_DCU_COS, P_TAIL, P_SKETCH, P_COUNT };

static const hkv_param_def ctkvr_params[P_COUNT] = {
    {"C", NAN, 1, 65536, 1,
     "query centroids per layer, the last C prompt queries (default min(2048, n_ctx/16), >= 1)"},
    {"Cp", 4, 1, 1024, 1, "centroids recalled per step and KV head (C')"},
    {"rho", NAN, 1, 1 << 20, 1, "IVF list length per centroid and KV head (default 2.5*rho_p)"},
    {"rho_p", NAN, 1, 1 << 20, 1,
     "rerank budget rho': far tokens attended per step and KV head (default about 3% of n_ctx, "
     "rounded to a multiple of 32, clamped to [32, 1024]; the paper uses 512 or 1024)"},
    {"dcu", 1, 0, 2, 1,
     "dynamic centroid update: 0 off; 1 (the paper) each step's query and its reranked top rho "
     "replace the oldest centroid of its KV head (FIFO); 2 as 1, but a step whose best recalled "
     "centroid is one DCU made, at cosine >= dcu_cos, refreshes that centroid instead"},
    {"dcu_cos", 0.9, 0, 1, 0, "dcu=2: cosine at which a step refreshes the DCU centroid it "
                              "recalled instead of pushing a new one"},
    {"tail", 1024, 0, 1 << 24, 1,
     "most recent unindexed far tokens (decode spill, later turns) always reranked"},
    {"sketch", 0, 0, 3, 1,
     "1: the rerank scores every candidate on an int8 copy of its key (a scale per 32 values, "
     "d + d/8 bytes a far token and KV head, kept by the policy) and reads the fp16 key only where the "
     "copy's error bound reaches the cut, so the attended rho' are the fp16 rerank's; 2: the top "
     "rho' by the int8 score, no fp16 key read (approximate at the cut); 3: as 2 on 4-bit codes "
     "(d/2 + d/8 bytes; with --far-kv q8 too); the DCU list is then the top rho by the sketch's "
     "score"},
};

static double arg_of(const hkv_policy_args *a, int i)
{
    return a && !isnan(a->v[i]) ? a->v[i] : ctkvr_params[i].dflt;
}

/* Parameters with the derived defaults filled in from the context length. */
static int resolve(const hkv_policy_args *a, int64_t n_ctx, ct_conf *c, hkv_err *err)
{
    int rc_args = hkv_policy_args_check(&hkv_policy_ctkvr, a, err);
    if (rc_args) return rc_args;
    if (n_ctx < 1) n_ctx = 1;
    double v = arg_of(a, P_C);
    c->C = isnan(v) ? hkv_min64(2048, n_ctx / 16) : (int64_t)v;
    c->C = hkv_max64(1, hkv_min64(c->C, n_ctx));   /* never more centroids than tokens */
    v = arg_of(a, P_RHOP);
    c->rho_p = isnan(v) ? hkv_policy_default_budget(n_ctx) : (int64_t)v;
    v = arg_of(a, P_RHO);
    c->rho = isnan(v) ? (int64_t)llround(2.5 * (double)c->rho_p) : (int64_t)v;
    c->rho = hkv_max64(1, hkv_min64(c->rho, n_ctx));   /* a list never holds more than the context */
    c->Cp = (int64_t)arg_of(a, P_CP);
    c->dcu = (int)arg_of(a, P_DCU);
    c->dcu_cos = (float)arg_of(a, P_DCU_COS);
    c->tail = (int64_t)arg_of(a, P_TAIL);
    c->sketch = (int)arg_of(a, P_SKETCH);
    return HKV_OK;
}

static int64_t ctkvr_queries_wanted(const hkv_policy_args *a, const hkv_policy_env *env)
{
    ct_conf c;
    return resolve(a, env->n_ctx, &c, NULL) == HKV_OK ? c.C : 0;
}

static void ctkvr_on_far_append(void *self, int layer, const hkv_far_view *far)
{
    (void)self, (void)layer, (void)far;   /* the tail is read off far->hi at select */
}

/* ---- decode ---------------------------------------------------------------- */

/* Candidates select can hold with a far tier of n tokens. */
static int64_t cand_bound(const ctkvr *s, int64_t n)
{
    return hkv_min64(n, s->c.Cp * s->c.rho + hkv_min64(s->c.tail, n));
}

static void ctkvr_scratch_need(void *self, int64_t n_far, int64_t *nf, int64_t *ni)
{
    const ctkvr *s = self;
    n_far = hkv_max64(n_far, 0);
    const int64_t nc = cand_bound(s, n_far), C = s->c.C;
    *ni = (n_far + 31) / 32 + 3 * C + s->c.Cp + HKV_TOPK_SCRATCH(hkv_max64(C, nc)) + 4 * nc +
          (nc + 31) / 32;
    *nf = (int64_t)s->g * s->d + 3 * C + 3 * nc;
}

static int64_t ctkvr_max_select(void *self, int64_t n_far)
{
    const ctkvr *s = self;
    return hkv_max64(0, hkv_min64(n_far, s->c.rho_p));
}

/* DCU: the step's unit queries and `n` far positions become the newest
 * centroid, or with dcu=2 refresh `best` (the best recalled centroid, cosine
 * bcos) when DCU made it and it is close: the FIFO then holds one centroid
 * per stretch of the query's path instead of C' near-copies whose lists only
 * recycle each other, and the refreshed list keeps accumulating the best keys
 * of the lists recalled alongside it. */
static int dcu_push(ctkvr *s, int layer, int kvh, const float *qn, const int32_t *cand,
                    const int32_t *pick, int64_t n, int32_t best, float bcos)
{
    ct_head *hd = &s->lay[layer].kv[kvh];
    const int64_t C = s->c.C;
    int32_t sl;
    const int refresh = s->c.dcu == 2 && best >= 0 && hkv_ctkvr_dyn(s, layer, kvh, best) &&
                        bcos >= s->c.dcu_cos;
    ct_slot w;
    if (refresh) {
        sl = best;
        if (hkv_ctkvr_slot_w(s, layer, kvh, sl, &w)) return HKV_E_NOMEM;
    } else {
        ct_head before = *hd;
        sl = hkv_ctkvr_fifo_push(hd, C);
        if (hkv_ctkvr_slot_w(s, layer, kvh, sl, &w)) {
            *hd = before;   /* the FIFO as it was: the step fails whole */
            return HKV_E_NOMEM;
        }
        hd->dcu_new++;
        *w.dyn = 1;
    }
    hd->dirty = hd->dirty == -1 || hd->dirty == sl ? sl : -2;
    for (int j = 0; j < s->g; j++)
        s->kern->f32_to_f16(qn + j * s->d, w.cent + (size_t)j * s->d, s->d);
    n = hkv_min64(n, s->c.rho);
    for (int64_t i = 0; i < n; i++) w.ivf[i] = pick ? cand[pick[i]] : cand[i];
    *w.len = (int32_t)n;
    return HKV_OK;
}

/* ---- the shared store and own rows ------------------------------------------ */

static void store_unref(ct_store *st)
{
    if (!st || --st->refs > 0) return;
    hkv_host_free(st->mem, HKV_TIER_INDEX, st->cent, st->cent_b);
    hkv_host_free(st->mem, HKV_TIER_INDEX, st->ivf, st->ivf_b);
    hkv_host_free(st->mem, HKV_TIER_INDEX, st->len, st->len_b);
    hkv_host_free(st->mem, HKV_TIER_INDEX, st->dyn, st->dyn_b);
    hkv_host_free(st->mem, HKV_TIER_INDEX, st, sizeof *st);
}

/* a*b*c*e bytes, or 0 on overflow */
static size_t bytes4(size_t a, size_t b, size_t c, size_t e)
{
    size_t r = a;
    if (b && r > SIZE_MAX / b) return 0;
    r *= b;
    if (c && r > SIZE_MAX / c) return 0;
    r *= c;
    if (e && r > SIZE_MAX / e) return 0;
    return r * e;
}

static void store_attach(ctkvr *s, ct_store *st)
{
    const size_t KH = (size_t)s->KH, C = (size_t)s->c.C;
    s->st = st;
    for (size_t l = 0; l < (size_t)s->L; l++) {
        ct_layer *ly = &s->lay[l];
        ly->cent = st->cent + l * C * (size_t)s->H * (size_t)s->d;
        ly->ivf = st->ivf + l * KH * C * (size_t)s->c.rho;
        ly->len = st->len + l * KH * C;
        ly->dyn = st->dyn + l * KH * C;
    }
}

/* The instance's own store (at creation; a fork gives it up). */
static int store_make(ctkvr *s, hkv_err *err)
{
    const size_t L = (size_t)s->L, KH = (size_t)s->KH, C = (size_t)s->c.C;
    ct_store *st = hkv_host_calloc(s->mem, HKV_TIER_INDEX, sizeof *st, err);
    if (!st) return hkv_err_prefix(err, "ctkvr index");
    st->refs = 1;
    st->mem = s->mem;
    st->cent_b = bytes4(L, C, (size_t)s->H * (size_t)s->d, 2);
    st->len_b = bytes4(L, KH, C, 4);
    st->dyn_b = bytes4(L, KH, C, 1);
    st->ivf_b = bytes4(L * KH, C, (size_t)s->c.rho, 4);
    if (!(st->cent = hkv_host_alloc(s->mem, HKV_TIER_INDEX, st->cent_b, err)) ||
        !(st->len = hkv_host_calloc(s->mem, HKV_TIER_INDEX, st->len_b, err)) ||
        !(st->dyn = hkv_host_calloc(s->mem, HKV_TIER_INDEX, st->dyn_b, err)) ||
        !(st->ivf = hkv_host_alloc(s->mem, HKV_TIER_INDEX, st->ivf_b, err))) {
        store_unref(st);
        return hkv_err_prefix(err, "ctkvr index (C=%lld, rho=%lld)", (long long)s->c.C,
                              (long long)s->c.rho);
    }
    store_attach(s, st);
    return HKV_OK;
}

static void own_free(ctkvr *s, ct_own *o)
{
    hkv_host_free(s->mem, HKV_TIER_INDEX, o->map, o->map_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, o->cent, o->rows_b);
    memset(o, 0, sizeof *o);
}

/* Room for `need` own rows: the rows of cap slots in one block (cent, ivf,
 * len, dyn, each part 64-byte aligned), doubled until they fit. */
static int own_grow(ctkvr *s, ct_own *o, int64_t need)
{
    const int64_t C = s->c.C, rho = s->c.rho;
    const size_t gd = (size_t)s->g * s->d;
    if (!o->map) {
        o->map_b = (size_t)C * sizeof *o->map;
        if (!(o->map = hkv_host_alloc(s->mem, HKV_TIER_INDEX, o->map_b, NULL))) return HKV_E_NOMEM;
        for (int64_t i = 0; i < C; i++) o->map[i] = -1;
    }
    if (need <= o->cap) return HKV_OK;
    int64_t c2 = hkv_max64(16, 2 * (int64_t)o->cap);
    while (c2 < need) c2 *= 2;
    const int32_t cap = (int32_t)hkv_min64(C, c2);
    const size_t a_c = ((size_t)cap * gd * 2 + 63) & ~(size_t)63;
    const size_t a_i = ((size_t)cap * rho * 4 + 63) & ~(size_t)63;
    const size_t a_l = ((size_t)cap * 4 + 63) & ~(size_t)63;
    const size_t bytes = a_c + a_i + a_l + (size_t)cap;
    char *b = hkv_host_alloc(s->mem, HKV_TIER_INDEX, bytes, NULL);
    if (!b) return HKV_E_NOMEM;
    uint16_t *cent = (uint16_t *)b;
    int32_t *ivf = (int32_t *)(b + a_c), *len = (int32_t *)(b + a_c + a_i);
    uint8_t *dyn = (uint8_t *)(b + a_c + a_i + a_l);
    if (o->n) {
        memcpy(cent, o->cent, (size_t)o->n * gd * 2);
        memcpy(ivf, o->ivf, (size_t)o->n * rho * 4);
        memcpy(len, o->len, (size_t)o->n * 4);
        memcpy(dyn, o->dyn, (size_t)o->n);
    }
    hkv_host_free(s->mem, HKV_TIER_INDEX, o->cent, o->rows_b);
    o->cent = cent, o->ivf = ivf, o->len = len, o->dyn = dyn;
    o->cap = cap, o->rows_b = bytes;
    return HKV_OK;
}

int hkv_ctkvr_slot_w(ctkvr *s, int layer, int kvh, int64_t sl, ct_slot *w)
{
    ct_own *o = &s->own[(size_t)layer * s->KH + (size_t)kvh];
    ct_layer *ly = &s->lay[layer];
    const int64_t C = s->c.C, rho = s->c.rho;
    const size_t gd = (size_t)s->g * s->d;
    int32_t r = o->map ? o->map[sl] : -1;
    if (r < 0 && !hkv_ctkvr_shared(s)) {   /* the only holder writes the store */
        w->cent = ly->cent + ((size_t)sl * s->H + (size_t)kvh * s->g) * s->d;
        w->ivf = ly->ivf + ((size_t)kvh * C + sl) * rho;
        w->len = ly->len + (size_t)kvh * C + sl;
        w->dyn = ly->dyn + (size_t)kvh * C + sl;
        return HKV_OK;
    }
    if (r < 0) {   /* a row of its own; every caller rewrites the centroid and the list */
        if (own_grow(s, o, o->n + 1)) return HKV_E_NOMEM;
        r = o->n++;
        o->map[sl] = r;
        o->len[r] = 0;
        o->dyn[r] = ly->dyn[(size_t)kvh * C + sl];   /* a dcu=2 refresh keeps the mark */
    }
    w->cent = o->cent + (size_t)r * gd;
    w->ivf = o->ivf + (size_t)r * rho;
    w->len = o->len + r;
    w->dyn = o->dyn + r;
    return HKV_OK;
}

/* select, with the recall given (the device's, r) or done here (r NULL). */
static int64_t select_impl(ctkvr *s, int layer, int kvh, const float *q, const hkv_far_view *far,
                           const hkv_recalled *r, int32_t *out, hkv_policy_scratch *ws)
{
    if (layer < 0 || layer >= s->L || kvh < 0 || kvh >= s->KH || !q || !far || !out || !ws)
        return HKV_E_INVAL;
    const int64_t lo = far->lo, hi = far->hi, nfar = hi - lo;
    if (nfar <= 0) return 0;
    int64_t need_f, need_i;
    ctkvr_scratch_need(s, nfar, &need_f, &need_i);
    if (ws->nf < need_f || ws->ni < need_i || !ws->f || !ws->i) return HKV_E_INVAL;
    ct_layer *ly = &s->lay[layer];
    ct_head *hd = &ly->kv[kvh];
    const int g = s->g, d = s->d;
    const int64_t C = s->c.C, W = (nfar + 31) / 32, NC = cand_bound(s, nfar);
    const int64_t rho = s->c.rho, rho_p = s->c.rho_p;
    uint32_t *bm = (uint32_t *)ws->i;          /* [W] far positions seen */
    int32_t *slots = ws->i + W;                /* [C] valid centroid slots */
    int32_t *sel = slots + C;                  /* [Cp] */
    int32_t *tsc = sel + s->c.Cp;              /* hkv_topk scratch for max(C, NC) */
    int32_t *cand = tsc + HKV_TOPK_SCRATCH(hkv_max64(C, NC));   /* [NC] candidate positions, sorted */
    int32_t *ia = cand + NC, *ib = ia + NC;    /* [NC] each: top-k picks */
    int32_t *ic = ib + NC;                     /* [NC] sketch: survivors' positions */
    uint32_t *obits = (uint32_t *)(ic + NC);   /* [(NC + 31) / 32] the output order */
    int32_t *ri = (int32_t *)(obits + (NC + 31) / 32);   /* [C] recall: store slots, then own rows */
    int32_t *rat = ri + C;                     /* [C] their places among the slots */
    float *qn = ws->f, *cs = qn + (int64_t)g * d, *ct = cs + C, *sc = ct + C, *sb = sc + NC;
    float *su = sb + NC;                       /* [NC] sketch: upper bounds */
    float *rt = su + NC;                       /* [C] recall: scores of one part */

    for (int j = 0; j < g; j++) {   /* unit queries: cosine recall and DCU centroids */
        double ss = 0;
        for (int e = 0; e < d; e++) ss += (double)q[j * d + e] * q[j * d + e];
        float r = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        for (int e = 0; e < d; e++) qn[j * d + e] = q[j * d + e] * r;
    }
    memset(bm, 0, (size_t)W * sizeof *bm);
    int64_t raw = 0, uniq = 0;
    int32_t best = -1;   /* best recalled slot and its cosine, for dcu=2 */
    float bcos = -INFINITY;
    /* recall: the top C' centroids by max-over-group cosine, best first */
    const int32_t *rs = sel;
    const float *rv = ct;
    int64_t k = 0;
    if (r) {   /* the device's */
        rs = r->slot, rv = r->score;
        k = hkv_max64(0, hkv_min64(r->n, s->c.Cp));
        for (int64_t t = 0; t < k; t++)
            if (rs[t] < 0 || rs[t] >= C) return HKV_E_INVAL;
    } else if (hd->count > 0) {
        const int64_t n = hd->count;
        const ct_own *o = hkv_ctkvr_own(s, layer, kvh);
        int64_t nb = 0, np = 0;   /* slots read from the store, from own rows (ri from the back) */
        for (int64_t i = 0; i < n; i++) {
            slots[i] = (int32_t)((hd->head + i) % C);
            const int32_t r = o->map ? o->map[slots[i]] : -1;
            if (r < 0) ri[nb] = slots[i], rat[nb++] = (int32_t)i;
            else np++, ri[n - np] = r, rat[n - np] = (int32_t)i;
        }
        for (int j = 0; j < g; j++) {
            float *dst = j ? ct : cs;
            const uint16_t *cj = ly->cent + ((int64_t)kvh * g + j) * d;
            if (!np) {
                hkv_policy_score_max(ws, s->kern, qn + j * d, 1, d, cj, (int64_t)s->H * d, slots, n,
                                     dst);
            } else {   /* each row's score is the kernel's wherever it sits in a call */
                hkv_policy_score_max(ws, s->kern, qn + j * d, 1, d, cj, (int64_t)s->H * d, ri, nb, rt);
                hkv_policy_score_max(ws, s->kern, qn + j * d, 1, d, o->cent + (int64_t)j * d,
                                     (int64_t)g * d, ri + nb, np, rt + nb);
                for (int64_t i = 0; i < n; i++) dst[rat[i]] = rt[i];
            }
            if (j)
                for (int64_t i = 0; i < n; i++) cs[i] = ct[i] > cs[i] ? ct[i] : cs[i];
        }
        k = hkv_topk(cs, n, s->c.Cp, sel, tsc);
        for (int64_t t = 0; t < k; t++) ct[t] = cs[sel[t]], sel[t] = slots[sel[t]];
        ws->bytes += (uint64_t)g * n * d * 2;   /* the centroids, fp16, once per head */
    }
    for (int64_t t = 0; t < k; t++) {   /* the union of their lists */
        int64_t sl = rs[t];
        if (rv[t] > bcos) bcos = rv[t], best = (int32_t)sl;
        int32_t len;
        const int32_t *list = hkv_ctkvr_list(s, layer, kvh, sl, &len);
        ws->bytes += 4 + (uint64_t)len * 4;   /* the list and its length */
        for (int32_t e = 0; e < len; e++) {
            int64_t p = list[e];
            if (p < lo || p >= hi) continue;   /* a position no longer in the far tier */
            /* without a branch on the bit: lists overlap at random */
            uint32_t bit = 1u << ((p - lo) & 31), *w = &bm[(p - lo) >> 5], was = *w;
            *w = was | bit;
            raw++, uniq += !(was & bit);
        }
    }
    /* the unindexed tail, newest `tail` positions */
    int64_t t0 = hkv_min64(hi, hkv_max64(lo, hkv_max64(ly->indexed_hi, hi - s->c.tail))) - lo;
    const int64_t t1 = nfar;
    for (int64_t p = t0; p < t1;) {
        if ((p & 31) == 0 && p + 32 <= t1) {
            bm[p >> 5] = ~0u;
            p += 32;
        } else {
            bm[p >> 5] |= 1u << (p & 31);
            p++;
        }
    }
    /* candidates in position order: sequential gathers for the rerank */
    int64_t n = 0;
    for (int64_t w = 0; w < W; w++)
        for (uint32_t x = bm[w]; x; x &= x - 1)
            cand[n++] = (int32_t)(lo + w * 32 + __builtin_ctz(x));
    hd->steps++, hd->cand += n, hd->raw += raw, hd->uniq += uniq, hd->tail += t1 - t0;

    if (n <= rho_p && (!s->c.dcu || n <= rho)) {   /* everything fits: no rerank needed */
        memcpy(out, cand, (size_t)n * sizeof *out);
        if (s->c.dcu && n > 0 && dcu_push(s, layer, kvh, qn, cand, NULL, n, best, bcos))
            return HKV_E_NOMEM;
        return n;
    }
    if (s->skc && !far->rows) {   /* on the sketches (ctkvr_sketch.c) */
        int64_t md = -1;   /* the DCU's list: the top rho by the sketch's score (a set), in ia */
        const int64_t m = hkv_ctkvr_rerank_sketch(s, layer, kvh, q, far, cand, n, sc, sb, su, ia,
                                                  ic, ib, tsc, obits, out, s->c.dcu ? &md : NULL, ws);
        if (s->c.dcu) {
            if (md < 0) md = hkv_topk_asc(sc, n, rho, ia, tsc);   /* (not made on the way) */
            if (dcu_push(s, layer, kvh, qn, cand, ia, md, best, bcos)) return HKV_E_NOMEM;
        }
        return m;
    }
    /* rerank: q.k, max over the group's heads */
    hkv_far_score_max(ws, s->kern, q, g, far, kvh, cand, n, sc);
    ws->bytes += (uint64_t)n * hkv_far_view_row_bytes(far);   /* the candidates' keys */
    if (!s->c.dcu) {
        int64_t m = hkv_topk(sc, n, rho_p, ia, tsc);
        for (int64_t i = 0; i < m; i++) out[i] = cand[ia[i]];
        return m;
    }
    /* top max(rho, rho') first, then the smaller set from inside it */
    const int64_t kb = hkv_max64(rho, rho_p), ks = hkv_min64(rho, rho_p);
    int64_t mb = hkv_topk(sc, n, kb, ia, tsc);
    for (int64_t i = 0; i < mb; i++) sb[i] = sc[ia[i]];
    int64_t ms = hkv_topk(sb, mb, ks, ib, tsc);
    for (int64_t i = 0; i < ms; i++) ib[i] = ia[ib[i]];   /* ib: indices into cand */
    const int32_t *p_out = rho_p >= rho ? ia : ib, *p_dcu = rho_p >= rho ? ib : ia;
    const int64_t m_out = rho_p >= rho ? mb : ms, m_dcu = rho_p >= rho ? ms : mb;
    for (int64_t i = 0; i < m_out; i++) out[i] = cand[p_out[i]];
    if (dcu_push(s, layer, kvh, qn, cand, p_dcu, m_dcu, best, bcos)) return HKV_E_NOMEM;
    return m_out;
}

static int64_t ctkvr_select(void *self, int layer, int kvh, const float *q, const hkv_far_view *far,
                            int32_t *out, hkv_policy_scratch *ws)
{
    return select_impl(self, layer, kvh, q, far, NULL, out, ws);
}

static int64_t ctkvr_select_recalled(void *self, int layer, int kvh, const float *q,
                                     const hkv_far_view *far, const hkv_recalled *r, int32_t *out,
                                     hkv_policy_scratch *ws)
{
    return r ? select_impl(self, layer, kvh, q, far, r, out, ws) : HKV_E_INVAL;
}

/* KV head kvh's part of slot sl of the layer's mirror, as the instance reads it. */
static void mirror_slot(ctkvr *s, int layer, int kvh, int64_t sl)
{
    const size_t gd = (size_t)s->g * s->d;
    memcpy(s->lay[layer].mirror + ((size_t)sl * s->H + (size_t)kvh * s->g) * s->d,
           hkv_ctkvr_cent(s, layer, kvh, sl), gd * 2);
}

/* The table a device mirrors: the store's rows where the instance reads
 * them alone; else its mirror, made whole when the version moved (or at
 * first) and otherwise brought up to date at the slots reported dirty. */
static const uint16_t *device_rows(ctkvr *s, int layer, const int32_t *dirty)
{
    ct_layer *ly = &s->lay[layer];
    int own = hkv_ctkvr_shared(s);
    for (int h = 0; h < s->KH && !own; h++) own = hkv_ctkvr_own(s, layer, h)->map != NULL;
    if (!own && !ly->mirror) return ly->cent;
    const size_t bytes = (size_t)s->c.C * s->H * s->d * 2;
    if (!ly->mirror) {
        if (!(ly->mirror = hkv_host_alloc(s->mem, HKV_TIER_INDEX, bytes, NULL))) return NULL;
        ly->mirror_ver = ly->version - 1;
    }
    if (ly->mirror_ver != ly->version) {
        memcpy(ly->mirror, ly->cent, bytes);
        for (int h = 0; h < s->KH; h++) {
            const ct_own *o = hkv_ctkvr_own(s, layer, h);
            for (int64_t sl = 0; o->map && sl < s->c.C; sl++)
                if (o->map[sl] >= 0) mirror_slot(s, layer, h, sl);
        }
        ly->mirror_ver = ly->version;
    } else {
        for (int h = 0; h < s->KH; h++)
            if (dirty[h] >= 0) mirror_slot(s, layer, h, dirty[h]);
    }
    return ly->mirror;
}

/* The device part: the centroids, recalled on the device (pipeline/). The
 * device can always read them (no device_takes): a fork on a shared store
 * hands it the mirror device_rows keeps of the table it reads. */
static int ctkvr_recall_table(void *self, int layer, hkv_recall_table *t, int32_t *fifo,
                              int32_t *dirty)
{
    ctkvr *s = self;
    if (layer < 0 || layer >= s->L || !t || !fifo || !dirty) return HKV_E_INVAL;
    ct_layer *ly = &s->lay[layer];
    for (int h = 0; h < s->KH; h++)
        if (ly->kv[h].dirty == -2) ly->version++;
    for (int h = 0; h < s->KH; h++) {
        ct_head *hd = &ly->kv[h];
        fifo[2 * h] = hd->head, fifo[2 * h + 1] = hd->count;
        dirty[h] = hd->dirty < 0 ? -1 : hd->dirty;
        hd->dirty = -1;
    }
    const uint16_t *rows = device_rows(s, layer, dirty);
    if (!rows) return HKV_E_NOMEM;
    *t = (hkv_recall_table){.rows = rows, .C = s->c.C, .k = s->c.Cp, .version = ly->version};
    return HKV_OK;
}

/* ---- lifetime and reports ---------------------------------------------------- */

static void ctkvr_describe(void *self, char *buf, size_t cap)
{
    const ctkvr *s = self;
    int64_t steps = 0, cand = 0, raw = 0, uniq = 0, tail = 0, reranks = 0, surv = 0;
    for (int64_t i = 0; i < (int64_t)s->L * s->KH; i++) {
        steps += s->heads[i].steps, cand += s->heads[i].cand, raw += s->heads[i].raw;
        uniq += s->heads[i].uniq, tail += s->heads[i].tail;
        reranks += s->heads[i].reranks, surv += s->heads[i].surv;
    }
    char mb[32], ob[32];
    size_t own = 0;
    for (int64_t i = 0; i < (int64_t)s->L * s->KH; i++) own += s->own[i].map_b + s->own[i].rows_b;
    const ct_store *st = s->st;
    hkv_fmt_bytes((double)(st->cent_b + st->ivf_b + st->len_b + st->dyn_b), mb, sizeof mb);
    hkv_fmt_bytes((double)own, ob, sizeof ob);
    double stp = steps ? (double)steps : 1.0;
    char dcu[32];
    if (s->c.dcu == 2) snprintf(dcu, sizeof dcu, "2 (cos %.2f)", s->c.dcu_cos);
    else snprintf(dcu, sizeof dcu, "%d", s->c.dcu);
    snprintf(buf, cap, "ctkvr C=%lld C'=%lld rho=%lld rho'=%lld dcu=%s tail=%lld, fp16 centroids, "
             "index %s; %lld selects: %.0f candidates (%.0f list entries, alpha=%.2f, tail %.0f)",
             (long long)s->c.C, (long long)s->c.Cp, (long long)s->c.rho, (long long)s->c.rho_p,
             dcu, (long long)s->c.tail, mb, (long long)steps, cand / stp, raw / stp,
             raw ? (double)uniq / (double)raw : 0.0, tail / stp);
    if (st->refs > 1 || own) {
        size_t o = strlen(buf);
        snprintf(buf + o, cap > o ? cap - o : 0, "; index shared by %d sequences, %s own slots",
                 st->refs, ob);
    }
    if (s->skc) {
        size_t o = strlen(buf);
        hkv_fmt_bytes((double)(s->skc_b + s->sks_b), mb, sizeof mb);
        snprintf(buf + o, cap > o ? cap - o : 0, "; %s key sketches %s, %.0f exact keys a rerank",
                 s->c.sketch == 3 ? "4-bit" : "int8", mb,
                 reranks ? (double)surv / (double)reranks : 0.0);
    }
}

static void ctkvr_destroy(void *self)
{
    ctkvr *s = self;
    if (!s) return;
    store_unref(s->st);
    for (int l = 0; s->lay && l < s->L; l++)
        hkv_host_free(s->mem, HKV_TIER_INDEX, s->lay[l].mirror,
                      (size_t)s->c.C * s->H * s->d * 2);
    for (int64_t i = 0; s->own && i < (int64_t)s->L * s->KH; i++) own_free(s, &s->own[i]);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->own, s->own_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->skc, s->skc_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->sks, s->sks_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->heads, s->heads_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->lay, s->lay_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s, sizeof *s);
}

/* src's own rows written over the slots they stand for in s's store (s
 * holds a copy of src's store, alone: hkv_ctkvr_slot_w gives the store's
 * slots): the index src reads, with no own rows. */
static void own_rows_to_store(ctkvr *s, const ctkvr *src)
{
    const size_t gd = (size_t)s->g * s->d, rho = (size_t)s->c.rho;
    for (int l = 0; l < s->L; l++)
        for (int h = 0; h < s->KH; h++) {
            const ct_own *so = &src->own[(size_t)l * s->KH + (size_t)h];
            for (int64_t sl = 0; so->map && sl < s->c.C; sl++) {
                const int32_t r = so->map[sl];
                ct_slot w;
                if (r < 0 || hkv_ctkvr_slot_w(s, l, h, sl, &w)) continue;   /* (no alloc: alone) */
                memcpy(w.cent, so->cent + (size_t)r * gd, gd * 2);
                memcpy(w.ivf, so->ivf + (size_t)r * rho, rho * 4);
                *w.len = so->len[r];
                *w.dyn = so->dyn[r];
            }
        }
}

/* src's key sketches of positions below n into s (same sketch kind: the
 * fork checks it), so that the first step after a fork does not quantise
 * the whole far tier of every layer again (149 ms a layer at 32K on two
 * threads, in the step): the rows below n are the same rows in both. Far
 * tiers of two formats (a shared index over converted rows) would sketch
 * their own rows differently: then they are made again as select reaches
 * them. */
static void fork_sketches(ctkvr *s, const ctkvr *src, int64_t n)
{
    if (!s->skc || !src->skc || s->far_q8 != src->far_q8) return;
    const size_t rb = hkv_sketch_code_bytes(s->c.sketch, s->d);
    const size_t ng = (size_t)s->d / HKV_SKETCH_GROUP;
    for (int64_t i = 0; i < (int64_t)s->L * s->KH; i++) {
        const int64_t hi = hkv_min64(hkv_min64(src->heads[i].sk_hi, n), s->cap);
        if (hi <= 0) continue;
        memcpy(s->skc + (size_t)i * s->cap * rb, src->skc + (size_t)i * src->cap * rb,
               (size_t)hi * rb);
        memcpy(s->sks + (size_t)i * s->cap * ng, src->sks + (size_t)i * src->cap * ng,
               (size_t)hi * ng * sizeof(float));
        s->heads[i].sk_hi = hi;
    }
}

/* A sequence starting with src's first n tokens, where src's prompt ended
 * (its index built, nothing decoded since): this instance, new and of the
 * same parameters, holds src's store by reference and copies of src's own
 * rows and per-head state; with copy, its own store becomes a copy of the
 * index src reads instead (an independent sequence: nothing shared, the
 * index a build from the same rows makes, without the build). Its key
 * sketches (per sequence) are src's below n, copied (fork_sketches). */
static int ctkvr_fork(void *self, const void *from, int64_t n, int copy, hkv_err *err)
{
    ctkvr *s = self;
    const ctkvr *src = from;
    const ct_conf *a = &s->c, *b = &src->c;
    if (a->C != b->C || a->Cp != b->Cp || a->rho != b->rho || a->rho_p != b->rho_p ||
        a->tail != b->tail || a->dcu != b->dcu || a->sketch != b->sketch ||
        a->dcu_cos != b->dcu_cos || s->L != src->L || s->H != src->H || s->KH != src->KH ||
        s->d != src->d)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "ctkvr: an index of other parameters or shape "
                          "cannot be shared");
    for (int l = 0; l < s->L; l++)
        if (s->lay[l].built)
            return hkv_seterr(err, HKV_E_INVAL, "ctkvr: fork into an instance with an index");
    for (int l = 0; l < s->L; l++)
        if (!src->lay[l].built || src->lay[l].q_end != n)
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "ctkvr: layer %d's index is not of the "
                              "first %lld tokens", l, (long long)n);
    const int64_t nh = (int64_t)s->L * s->KH;
    for (int64_t i = 0; i < nh; i++)
        if (src->heads[i].dcu_new)
            return hkv_seterr(err, HKV_E_UNSUPPORTED, "ctkvr: the index has changed since its "
                              "prompt end");
    if (copy) {   /* into s's own store, made at creation and never written: the
                     parameters and shape checked above give it src's sizes */
        memcpy(s->st->cent, src->st->cent, src->st->cent_b);
        memcpy(s->st->ivf, src->st->ivf, src->st->ivf_b);
        memcpy(s->st->len, src->st->len, src->st->len_b);
        memcpy(s->st->dyn, src->st->dyn, src->st->dyn_b);
        own_rows_to_store(s, src);
    }
    for (int64_t i = 0; i < nh && !copy; i++) {   /* src's own rows, copied */
        const ct_own *so = &src->own[i];
        ct_own *o = &s->own[i];
        if (!so->map) continue;
        if (own_grow(s, o, so->n)) {
            for (int64_t j = 0; j <= i; j++) own_free(s, &s->own[j]);
            return hkv_seterr(err, HKV_E_NOMEM, "ctkvr: no memory for a shared index's own rows");
        }
        const size_t gd = (size_t)s->g * s->d;
        memcpy(o->map, so->map, so->map_b);
        memcpy(o->cent, so->cent, (size_t)so->n * gd * 2);
        memcpy(o->ivf, so->ivf, (size_t)so->n * s->c.rho * 4);
        memcpy(o->len, so->len, (size_t)so->n * 4);
        memcpy(o->dyn, so->dyn, (size_t)so->n);
        o->n = so->n;
    }
    if (!copy) {
        store_unref(s->st);   /* its own, made at creation and never written */
        src->st->refs++;
        store_attach(s, src->st);
    }
    for (int l = 0; l < s->L; l++) {
        ct_layer *ly = &s->lay[l];
        const ct_layer *sl = &src->lay[l];
        ly->indexed_hi = sl->indexed_hi, ly->q_end = sl->q_end;
        ly->version = sl->version, ly->built = sl->built;
    }
    for (int64_t i = 0; i < nh; i++) {
        ct_head *h = &s->heads[i];
        memset(h, 0, sizeof *h);
        h->head = src->heads[i].head, h->count = src->heads[i].count;
        h->dirty = -1;
    }
    fork_sketches(s, src, n);
    return HKV_OK;
}

static const hkv_policy_ops ctkvr_ops = {
    .prefill_end = hkv_ctkvr_prefill_end,
    .on_far_append = ctkvr_on_far_append,
    .select = ctkvr_select,
    .max_select = ctkvr_max_select,
    .scratch_need = ctkvr_scratch_need,
    .fork = ctkvr_fork,
    .recall_table = ctkvr_recall_table,
    .select_recalled = ctkvr_select_recalled,
    .describe = ctkvr_describe,
    .destroy = ctkvr_destroy,
};

static int ctkvr_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                        hkv_err *err)
{
    const hkv_kv_shape *sh = &env->shape;
    if (!env->kern || sh->n_layer < 1 || sh->n_head_kv < 1 || sh->head_dim < 1 ||
        sh->n_head < sh->n_head_kv || sh->n_head % sh->n_head_kv)
        return hkv_seterr(err, HKV_E_INVAL, "ctkvr: bad shape (%d layers, %d heads, %d KV heads, "
                          "d=%d) or no kernels", sh->n_layer, sh->n_head, sh->n_head_kv,
                          sh->head_dim);
    ct_conf c;
    int rc = resolve(a, env->n_ctx, &c, err);
    if (rc) return rc;
    if (c.sketch && c.sketch < 3 && env->far_q8)   /* its codes would copy the far tier's own */
        return hkv_seterr(err, HKV_E_INVAL, "ctkvr: sketch=%d keeps int8 copies of fp16 far keys; "
                          "with an 8-bit far tier (--far-kv q8) the rerank scores its codes "
                          "directly: drop sketch, or take the 4-bit sketch=3", c.sketch);
    ctkvr *s = hkv_host_calloc(env->mem, HKV_TIER_INDEX, sizeof *s, err);
    if (!s) return hkv_err_prefix(err, "ctkvr");
    s->kern = env->kern, s->mem = env->mem, s->c = c, s->n_threads = env->n_threads;
    s->far_q8 = env->far_q8;
    s->L = sh->n_layer, s->H = sh->n_head, s->KH = sh->n_head_kv, s->d = sh->head_dim;
    s->g = s->H / s->KH;
    const size_t L = (size_t)s->L, KH = (size_t)s->KH, C = (size_t)c.C;
    s->lay_b = L * sizeof *s->lay;
    s->heads_b = L * KH * sizeof *s->heads;
    s->own_b = L * KH * sizeof *s->own;
    s->cap = env->n_ctx > 0 ? env->n_ctx : 1;
    if (c.sketch) {
        s->skc_b = bytes4(L * KH, (size_t)s->cap, hkv_sketch_code_bytes(c.sketch, s->d), 1);
        s->sks_b = bytes4(L * KH, (size_t)s->cap, (size_t)(s->d / HKV_SKETCH_GROUP), 4);
    }
    if (c.sketch && (s->d > HKV_CTKVR_MAX_D || s->d % HKV_SKETCH_GROUP)) {
        ctkvr_destroy(s);
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "ctkvr: sketch=%d takes head sizes that are "
                          "multiples of %d up to %d, not %d", c.sketch, HKV_SKETCH_GROUP,
                          HKV_CTKVR_MAX_D, sh->head_dim);
    }
    if (!bytes4(L, C, (size_t)s->H * (size_t)s->d, 2) || !bytes4(L * KH, C, (size_t)c.rho, 4) ||
        bytes4(L * KH, C, (size_t)c.rho, 4) > SIZE_MAX / 4 || (c.sketch && (!s->skc_b || !s->sks_b))) {
        ctkvr_destroy(s);
        return hkv_seterr(err, HKV_E_RANGE, "ctkvr: index of C=%lld, rho=%lld overflows",
                          (long long)c.C, (long long)c.rho);
    }
    if (!(s->lay = hkv_host_calloc(s->mem, HKV_TIER_INDEX, s->lay_b, err)) ||
        !(s->heads = hkv_host_calloc(s->mem, HKV_TIER_INDEX, s->heads_b, err)) ||
        !(s->own = hkv_host_calloc(s->mem, HKV_TIER_INDEX, s->own_b, err)) ||
        (c.sketch && (!(s->skc = hkv_host_alloc(s->mem, HKV_TIER_INDEX, s->skc_b, err)) ||
                      !(s->sks = hkv_host_alloc(s->mem, HKV_TIER_INDEX, s->sks_b, err))))) {
        if (!s->lay) s->lay_b = 0;
        if (!s->heads) s->heads_b = 0;
        if (!s->own) s->own_b = 0;
        ctkvr_destroy(s);
        return hkv_err_prefix(err, "ctkvr index (C=%lld, rho=%lld)", (long long)c.C,
                              (long long)c.rho);
    }
    /* The index now: a decode step may push DCU centroids before any prompt
     * end (a sequence fed without one). A fork gives it up for the store it
     * takes (ctkvr_fork). */
    if ((rc = store_make(s, err))) {
        ctkvr_destroy(s);
        return rc;
    }
    for (size_t l = 0; l < L; l++) {
        ct_layer *ly = &s->lay[l];
        ly->kv = s->heads + l * KH;
        ly->indexed_hi = -1;   /* before any prompt end, every far token is tail */
        ly->q_end = 0;
        ly->version = 1;
        for (int h = 0; h < s->KH; h++) ly->kv[h].dirty = -1;
    }
    out->ops = &ctkvr_ops;
    out->self = s;
    return HKV_OK;
}

const hkv_policy_def hkv_policy_ctkvr = {
    .name = "ctkvr",
    .kind = HKV_POLICY_SELECTION,
    .summary = "centroid-then-token retrieval: recall C' of C query centroids by cosine, union "
               "of their top-rho IVF lists, rerank by q.k to the top rho' (CTKVR)",
    .params = ctkvr_params,
    .n_params = P_COUNT,
    .queries_wanted = ctkvr_queries_wanted,
    .create = ctkvr_create,
};

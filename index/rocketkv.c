/* `rocketkv`: RocketKV's two-stage compression (seeds/000; notes A2-A6).
 *
 * Budget. `budget` is k, the far tokens attended per step and KV head, as
 * every hetkv policy's budget. The paper's token budget t also counts the
 * estimation traffic and splits it evenly (k = t/2, notes A2), so t = 2k.
 * At each stage-1 run, with S the sequence length at that prompt end (the
 * paper's code uses prompt + max_new_tokens, unknown here; generated tokens
 * are never evicted, so no room is reserved for them):
 *   c = S/t, r = min(0.2 + 0.06 log2 c, 0.8), stage 1 keeps capacity =
 *   S/c^r far tokens per KV head; stage 2 compresses the rest of the way,
 *   c2 = capacity/t, with pages of min(floor(c2), ceil(sqrt(c2))) tokens
 *   and d*page/c2 head dimensions (hkv_rocketkv_split_of).
 * The near tier (sinks, local ring) is attended on top, as for every
 * policy; the paper has none and keeps the last w prompt tokens instead.
 *
 * Stage 1 (prefill_end): SnapKV with per-group selection: the last `window`
 * prompt queries' attention over the candidates, summed over the window and
 * the group, max-pooled with kernel 63, top capacity per KV head (window
 * tokens in the far tier always kept). Normalised over the far keys, as in
 * snapkv.c (the near keys are not visible to policies).
 *
 * Stage 2 (select), Hybrid Sparse Attention over the candidate list (the
 * survivors, then every far token that arrived since): the list is cut into
 * pages of `page` entries with element-wise key min/max, stored transposed
 * ([2d][pages] per KV head) so the estimate reads only the chosen head
 * dimensions' rows. Per step: the top `dims` coordinates of sum_j |q_j|,
 * the sign of sum_j q_j per coordinate picks the max or the min row, page
 * scores z_j = q_j[dims] . rows, per head a softmax over the list's tokens
 * at temperature tau_j = sqrt(d * |q_j[dims]|_1 / |q_j|_1) (SparQ's
 * correction), summed over the group; the top k tokens are attended exactly.
 * With rerank = m > 1 the top m*k tokens by that estimate are scored
 * exactly by q.k (max over the group) and the top k of them attended: not
 * in the paper, more key reads for better recall.
 *
 * Later turns. mt=0: stage 1 runs again over what the cache still holds
 * for this policy (the survivors and the tokens since), with the new window:
 * tokens dropped earlier stay dropped, as in a single compressed cache.
 * mt=1 (RocketKV-MT, notes A6): the whole far tier is re-scored at every
 * prompt end with the new turn's window (default 128, the paper's
 * multi-turn window), so tokens dropped in one turn can return in the next. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "far_rows.h"
#include "window_scores.h"

enum { P_BUDGET, P_WINDOW, P_KERNEL, P_MT, P_SPLIT, P_RERANK, P_COUNT };

static const hkv_param_def rocketkv_params[P_COUNT] = {
    {"budget", NAN, 1, 1 << 24, 1,
     "k: far tokens attended per step and KV head; the paper's token budget is t = 2k (half "
     "estimation, half top-k); default about 3% of n_ctx, a multiple of 32 in [32, 1024], as "
     "ctkvr's rho_p (the paper sweeps t = 256..4096)"},
    {"window", NAN, 1, 4096, 1,
     "stage-1 observation window (RocketKV: 32 single-turn; default 128 with mt=1, its SCBench "
     "multi-turn setting)"},
    {"kernel", 63, 1, 1023, 1, "stage-1 max-pooling kernel, odd (RocketKV: 63)"},
    {"mt", 0, 0, 1, 1, "1: RocketKV-MT, stage 1 re-scores the whole far tier at every prompt end; "
                       "0: later prompt ends re-score only what stage 1 kept and newer tokens"},
    {"split", NAN, 0, 1, 0, "fixed stage split r (default adaptive: min(0.2 + 0.06 log2(S/t), "
                            "0.8), the paper's rule)"},
    {"rerank", 1, 1, 64, 1, "1: attend the top k by the HSA estimate (the paper); m > 1: score "
                            "the estimate's top m*k exactly by q.k, attend the top k"},
};

typedef struct rk_layer {
    int built;
    hkv_rocketkv_split sp;
    int64_t S, list_hi;     /* split's sequence length; far positions >= list_hi not listed */
    int64_t cap, pcap;      /* list entries and page columns per KV head */
    int64_t *n;             /* [KH] entries in each list */
    int32_t *cand;          /* [KH][cap] ascending far positions */
    uint16_t *bnd;          /* [KH][2d][pcap] fp16: rows 0..d-1 max, d..2d-1 min */
    size_t bytes;
    int oom;                /* a list could not grow: select reports it */
    uint64_t version;       /* moves with every new block (hkv_cand_table) */
} rk_layer;

typedef struct rocketkv {
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    int L, KH, H, g, d, n_threads, kernel, mt;
    int64_t budget, window, rerank, n_ctx;
    double split;
    rk_layer *lay;
    int64_t *steps, *cands;   /* [L*KH] statistics for describe */
    uint64_t version;         /* the last block version handed out */
    size_t lay_b, stat_b;
} rocketkv;

static const hkv_policy_ops rocketkv_ops;

static double arg_of(const hkv_policy_args *a, int i)
{
    return a && !isnan(a->v[i]) ? a->v[i] : rocketkv_params[i].dflt;
}

static int64_t window_of(const hkv_policy_args *a)
{
    double w = arg_of(a, P_WINDOW);
    if (!isnan(w)) return (int64_t)w;
    return arg_of(a, P_MT) >= 1 ? 128 : 32;
}

static int64_t rocketkv_queries_wanted(const hkv_policy_args *a, const hkv_policy_env *env)
{
    (void)env;
    return window_of(a);
}

/* ---- candidate lists and their page bounds ------------------------------------- */

static inline uint16_t ord16(uint16_t h) { return (h & 0x8000) ? (uint16_t)~h : (uint16_t)(h | 0x8000); }

/* A block for lists of cap entries with pages of `page`, cleared. */
static int block_alloc(const rocketkv *s, rk_layer *b, int64_t cap, int64_t page, hkv_err *err)
{
    b->cap = cap;
    b->pcap = cap / page + 1;
    b->bytes = (size_t)s->KH * (sizeof(int64_t) + (size_t)cap * 4 + 2 * (size_t)s->d * b->pcap * 2);
    char *p = hkv_host_alloc(s->mem, HKV_TIER_INDEX, b->bytes, err);
    if (!p) return HKV_E_NOMEM;
    b->n = (int64_t *)p;
    b->cand = (int32_t *)(b->n + s->KH);
    b->bnd = (uint16_t *)(b->cand + (size_t)s->KH * cap);
    memset(b->n, 0, (size_t)s->KH * sizeof *b->n);
    return HKV_OK;
}

static void block_free(const rocketkv *s, rk_layer *b)
{
    hkv_host_free(s->mem, HKV_TIER_INDEX, b->n, b->bytes);
    b->n = NULL, b->cand = NULL, b->bnd = NULL, b->bytes = 0, b->cap = b->pcap = 0;
}

/* Append far position p to the list of KV head h (room checked by the caller). */
static void list_push(const rocketkv *s, rk_layer *ly, int h, const hkv_far_view *far, int32_t p)
{
    const int d = s->d;
    const int64_t i = ly->n[h]++, pg = i / ly->sp.page, P = ly->pcap;
    ly->cand[(int64_t)h * ly->cap + i] = p;
    uint16_t tmp[HKV_Q8_MAX_D];
    const uint16_t *k = hkv_far_k16(s->kern, far, h, p, tmp);
    uint16_t *mx = ly->bnd + (int64_t)h * 2 * d * P + pg, *mn = mx + (int64_t)d * P;
    const int first = i % ly->sp.page == 0;
    for (int e = 0; e < d; e++) {
        uint16_t *a = mx + e * P, *b = mn + e * P;
        if (first || ord16(k[e]) > ord16(*a)) *a = k[e];
        if (first || ord16(k[e]) < ord16(*b)) *b = k[e];
    }
}

/* Room for `more` entries per list: a bigger block, the lists copied over
 * (their page columns keep their indices, the rows get the new stride). */
static int grow(rocketkv *s, rk_layer *ly, int64_t more, hkv_err *err)
{
    int64_t need = 0;
    for (int h = 0; h < s->KH; h++) need = ly->n[h] + more > need ? ly->n[h] + more : need;
    if (need <= ly->cap) return HKV_OK;
    rk_layer nb = *ly;
    int64_t cap = ly->cap * 2 > need ? ly->cap * 2 : need;
    if (cap > s->n_ctx) cap = need > s->n_ctx ? need : s->n_ctx;
    if (block_alloc(s, &nb, cap, ly->sp.page, err)) return HKV_E_NOMEM;
    for (int h = 0; h < s->KH; h++) {
        nb.n[h] = ly->n[h];
        memcpy(nb.cand + (int64_t)h * cap, ly->cand + (int64_t)h * ly->cap, (size_t)ly->n[h] * 4);
        const int64_t np = (ly->n[h] + ly->sp.page - 1) / ly->sp.page;
        for (int r = 0; r < 2 * s->d; r++)
            memcpy(nb.bnd + ((int64_t)h * 2 * s->d + r) * nb.pcap,
                   ly->bnd + ((int64_t)h * 2 * s->d + r) * ly->pcap, (size_t)np * 2);
    }
    block_free(s, ly);
    nb.version = ++s->version;   /* a new block: device copies upload it again */
    *ly = nb;
    return HKV_OK;
}

/* ---- stage 1 ---------------------------------------------------------------- */

static int stage1(rocketkv *s, int layer, const hkv_far_view *far, const hkv_query_view *qv,
                  hkv_err *err)
{
    rk_layer *ly = &s->lay[layer];
    const int KH = s->KH;
    /* mt=0 later turn: what is still held (a far tier that shrank, which the
     * cache never does, is scored afresh) */
    const int from_list = ly->built && !s->mt && far->hi >= ly->list_hi;
    int64_t nmax = 0, ntot = 0;
    for (int h = 0; h < KH; h++) {
        const int64_t n = from_list ? ly->n[h] + (far->hi - ly->list_hi) : far->hi - far->lo;
        nmax = n > nmax ? n : nmax;
        ntot += n;
    }
    rk_layer nb = {0};
    nb.S = qv->n > 0 ? qv->pos0 + qv->n : far->hi;
    hkv_rocketkv_split_of(nb.S, 2 * s->budget, s->d, s->split, &nb.sp);
    const int64_t keep = nb.sp.capacity, kmax = nmax < keep ? nmax : keep;
    /* workspace: row lists and their lengths per head, then (if any head
     * holds more than capacity and there is a window) scores, pooling, top-k */
    const int score = nmax > keep && qv->n > 0;
    const size_t bytes = (size_t)KH * (sizeof(int32_t *) + sizeof(int64_t)) + (size_t)ntot * 4 +
                         (score ? ((size_t)KH * nmax + 4 * (size_t)nmax) * 4 : 0);
    char *w = hkv_host_alloc(s->mem, HKV_TIER_WORKSPACE, bytes, err);
    int rc = w ? block_alloc(s, &nb, kmax + 1024, nb.sp.page, err) : HKV_E_NOMEM;
    if (rc) {
        if (w) hkv_host_free(s->mem, HKV_TIER_WORKSPACE, w, bytes);
        return hkv_err_prefix(err, "rocketkv stage 1 (%lld candidates)", (long long)ntot);
    }
    const int32_t **rows = (const int32_t **)w;
    int64_t *nrow = (int64_t *)(rows + KH);
    int32_t *r0 = (int32_t *)(nrow + KH);
    for (int64_t h = 0, off = 0; h < KH; off += nrow[h], h++) {
        int32_t *r = r0 + off;
        int64_t c = 0;
        if (from_list) {
            memcpy(r, ly->cand + h * ly->cap, (size_t)ly->n[h] * 4);
            c = ly->n[h];
            for (int64_t p = ly->list_hi; p < far->hi; p++) r[c++] = (int32_t)p;
        } else {
            for (int64_t p = far->lo; p < far->hi; p++) r[c++] = (int32_t)p;
        }
        rows[h] = r;
        nrow[h] = c;
    }
    float *sc = (float *)(r0 + ntot), *tmp = sc + (size_t)KH * nmax;
    int32_t *idx = (int32_t *)(tmp + 2 * nmax), *scr = idx + nmax;
    if (score) {
        hkv_ws_job job = {.far = far, .qv = qv, .n_head = s->H, .rows = rows, .n_rows = nrow,
                          .out = sc, .ld_out = nmax, .n_threads = s->n_threads};
        rc = hkv_ws_window_scores(s->kern, &job, s->mem, err);
    }
    for (int h = 0; !rc && h < KH; h++) {
        int32_t *dst = nb.cand + (int64_t)h * nb.cap;   /* kept positions, then pushed with bounds */
        int64_t m;
        if (nrow[h] <= keep) {
            memcpy(dst, rows[h], (size_t)nrow[h] * 4);
            m = nrow[h];
        } else if (!score) {   /* no window: the most recent capacity tokens */
            m = keep;
            memcpy(dst, rows[h] + nrow[h] - keep, (size_t)keep * 4);
        } else {
            float *sh = sc + (int64_t)h * nmax;
            hkv_ws_pool(sh, nrow[h], s->kernel, 0, tmp);
            m = hkv_ws_keep(sh, rows[h], 0, nrow[h], keep, qv->pos0, dst, idx, scr);
        }
        for (int64_t i = 0; i < m; i++) list_push(s, &nb, h, far, dst[i]);
    }
    hkv_host_free(s->mem, HKV_TIER_WORKSPACE, w, bytes);
    if (rc) {
        block_free(s, &nb);
        return hkv_err_prefix(err, "rocketkv stage 1");
    }
    if (ly->built) block_free(s, ly);
    nb.built = 1;
    nb.list_hi = far->hi;
    nb.version = ++s->version;
    *ly = nb;
    return HKV_OK;
}

static int rocketkv_prefill_end(void *self, int layer, const hkv_far_view *far,
                                const hkv_query_view *qv, hkv_err *err)
{
    rocketkv *s = self;
    if (layer < 0 || layer >= s->L || far->n_head_kv != s->KH || far->head_dim != s->d ||
        far->hi < far->lo || far->lo < 0)
        return hkv_seterr(err, HKV_E_INVAL, "rocketkv: layer %d of %d, far view of %d KV heads, "
                          "d=%d, [%lld, %lld) does not match the policy (%d KV heads, d=%d)", layer,
                          s->L, far->n_head_kv, far->head_dim, (long long)far->lo,
                          (long long)far->hi, s->KH, s->d);
    const hkv_query_view win = hkv_ws_last_rows(qv, s->window);
    int rc = stage1(s, layer, far, &win, err);
    return rc ? hkv_err_prefix(err, "rocketkv prompt end, layer %d", layer) : HKV_OK;
}

static void rocketkv_on_far_append(void *self, int layer, const hkv_far_view *far)
{
    rocketkv *s = self;
    if (layer < 0 || layer >= s->L || !s->lay[layer].built) return;
    rk_layer *ly = &s->lay[layer];
    if (far->hi <= ly->list_hi) return;
    hkv_err err;
    if (grow(s, ly, far->hi - ly->list_hi, &err)) {   /* cannot report here: select will */
        ly->oom = 1;
        return;
    }
    for (int64_t p = ly->list_hi; p < far->hi; p++)
        for (int h = 0; h < s->KH; h++) list_push(s, ly, h, far, (int32_t)p);
    ly->list_hi = far->hi;
}

/* ---- stage 2 ---------------------------------------------------------------- */

static int64_t rocketkv_max_select(void *self, int64_t n_far)
{
    const rocketkv *s = self;
    return n_far <= 0 ? 0 : n_far < s->budget ? n_far : s->budget;
}

static void rocketkv_scratch_need(void *self, int64_t n_far, int64_t *nf, int64_t *ni)
{
    const rocketkv *s = self;
    const int64_t n = n_far > 0 ? n_far : 0, kk = s->rerank * s->budget;
    *nf = 2 * (int64_t)s->d + (int64_t)(s->g + 3) * (n + 1) + kk;
    *ni = 2 * (int64_t)s->d + 2 * n + 2 * kk + s->budget + HKV_TOPK_SCRATCH(s->d);
}

static int64_t rocketkv_select(void *self, int layer, int kvh, const float *q,
                               const hkv_far_view *far, int32_t *out, hkv_policy_scratch *ws)
{
    rocketkv *s = self;
    if (layer < 0 || layer >= s->L || kvh < 0 || kvh >= s->KH || !q || !far || !out || !ws)
        return HKV_E_INVAL;
    const rk_layer *ly = &s->lay[layer];
    const int64_t nfar = far->hi - far->lo;
    if (nfar <= 0) return 0;
    if (!ly->built) {   /* no prompt end yet: the most recent far tokens */
        const int64_t m = nfar < s->budget ? nfar : s->budget;
        for (int64_t i = 0; i < m; i++) out[i] = (int32_t)(far->hi - m + i);
        return m;
    }
    if (ly->oom) return HKV_E_NOMEM;
    if (ly->list_hi != far->hi) return HKV_E_INVAL;   /* far tokens the lists never saw */
    const int g = s->g, d = s->d;
    const int32_t *cand = ly->cand + (int64_t)kvh * ly->cap;
    const int64_t n = ly->n[kvh], k = ly->sp.k, page = ly->sp.page, P = ly->pcap;
    s->steps[layer * s->KH + kvh]++;
    s->cands[layer * s->KH + kvh] += n;
    ws->bytes += (uint64_t)(n < k ? n : k) * 4;   /* the candidate list */
    if (n <= k) {
        memcpy(out, cand, (size_t)n * 4);
        return n;
    }
    ws->bytes += (uint64_t)(n - k) * 4;
    int64_t need_f, need_i;
    rocketkv_scratch_need(s, nfar, &need_f, &need_i);
    if (ws->nf < need_f || ws->ni < need_i || !ws->f || !ws->i || n > nfar) return HKV_E_INVAL;
    const int64_t np = (n + page - 1) / page, last = n - (np - 1) * page;
    const int64_t kk = s->rerank * k < n ? s->rerank * k : n;
    float *a = ws->f, *tau = a + d, *z = tau + g, *e = z + (int64_t)g * np, *S = e + np;
    float *ts = S + np, *sc = ts + n;
    const int64_t nscr = n > HKV_TOPK_SCRATCH(d) ? n : HKV_TOPK_SCRATCH(d);   /* both selects' scratch */
    int32_t *i1 = ws->i, *scr = i1 + d, *idx = scr + nscr, *rows = idx + kk;
    /* head dimensions: the top `dims` of sum_j |q_j| */
    for (int c = 0; c < d; c++) {
        float v = 0;
        for (int j = 0; j < g; j++) v += fabsf(q[j * d + c]);
        a[c] = v;
    }
    const int64_t m1 = hkv_topk(a, d, ly->sp.dims, i1, scr);
    memset(z, 0, (size_t)g * np * sizeof *z);
    for (int64_t t = 0; t < m1; t++) {
        const int c = i1[t];
        float sg = 0;
        for (int j = 0; j < g; j++) sg += q[j * d + c];
        const int row = sg > 0 ? c : d + c;   /* q > 0 meets the max, else the min (the code's rule) */
        s->kern->f16_to_f32(ly->bnd + ((int64_t)kvh * 2 * d + row) * P, e, np);
        ws->bytes += (uint64_t)np * 2;   /* one dimension's page bounds, fp16 */
        for (int j = 0; j < g; j++) {
            const float qc = q[j * d + c];
            float *zj = z + (int64_t)j * np;
            for (int64_t p = 0; p < np; p++) zj[p] += qc * e[p];
        }
    }
    memset(S, 0, (size_t)np * sizeof *S);
    for (int j = 0; j < g; j++) {   /* per-head softmax over the tokens at SparQ's temperature */
        double part = 0, all = 0;
        for (int64_t t = 0; t < m1; t++) part += fabsf(q[j * d + i1[t]]);
        for (int c = 0; c < d; c++) all += fabsf(q[j * d + c]);
        tau[j] = part > 0 && all > 0 ? (float)sqrt((double)d * part / all) : 1.0f;
        float *zj = z + (int64_t)j * np, mx = -INFINITY;
        for (int64_t p = 0; p < np; p++) mx = zj[p] > mx ? zj[p] : mx;
        for (int64_t p = 0; p < np; p++) e[p] = (zj[p] - mx) / tau[j];
        s->kern->exp(e, e, np);
        double Z = 0;
        for (int64_t p = 0; p < np; p++) Z += (double)e[p] * (p == np - 1 ? last : page);
        const float inv = (float)(1.0 / Z);
        for (int64_t p = 0; p < np; p++) S[p] += e[p] * inv;
    }
    for (int64_t x = 0; x < n; x++) ts[x] = S[x / page];
    int64_t m = hkv_topk_asc(ts, n, kk, idx, scr);
    if (kk <= k) {
        for (int64_t i = 0; i < m; i++) out[i] = cand[idx[i]];
        return m;
    }
    for (int64_t i = 0; i < m; i++) rows[i] = cand[idx[i]];   /* exact rerank of the top kk */
    hkv_far_score_max(ws, s->kern, q, g, far, kvh, rows, m, sc);
    ws->bytes += (uint64_t)m * hkv_far_view_row_bytes(far);   /* the reranked keys */
    int64_t mk = hkv_topk_asc(sc, m, k, idx, scr);
    for (int64_t i = 0; i < mk; i++) out[i] = rows[idx[i]];
    return mk;
}

/* The device's stage 2 is the rerank = 1 select (gpu/rocketkv_hsa.cu). */
static int rocketkv_device_takes(void *self, int layer)
{
    const rocketkv *s = self;
    if (layer < 0 || layer >= s->L) return HKV_FALLBACK_SHAPE;
    if (s->rerank != 1) return HKV_FALLBACK_CONFIG;
    if (!s->lay[layer].built) return HKV_FALLBACK_BEFORE_SELECTION;
    return s->lay[layer].oom ? HKV_FALLBACK_POLICY_OOM : HKV_FALLBACK_NONE;
}

static int rocketkv_cand_table(void *self, int layer, hkv_cand_table *out)
{
    if (rocketkv_device_takes(self, layer) != HKV_FALLBACK_NONE) return HKV_E_INVAL;
    const rocketkv *s = self;
    const rk_layer *ly = &s->lay[layer];
    *out = (hkv_cand_table){.cand = ly->cand, .n = ly->n, .bnd = ly->bnd, .cap = ly->cap,
                            .pcap = ly->pcap, .page = ly->sp.page, .dims = ly->sp.dims,
                            .k = ly->sp.k, .list_hi = ly->list_hi, .version = ly->version};
    return HKV_OK;
}

/* ---- lifetime, reports, access ------------------------------------------------- */

static void rocketkv_describe(void *self, char *buf, size_t cap)
{
    const rocketkv *s = self;
    const rk_layer *l0 = &s->lay[0];
    int64_t steps = 0, cands = 0;
    size_t bytes = 0;
    for (int64_t i = 0; i < (int64_t)s->L * s->KH; i++) steps += s->steps[i], cands += s->cands[i];
    for (int l = 0; l < s->L; l++) bytes += s->lay[l].bytes;
    char mb[32];
    hkv_fmt_bytes((double)bytes, mb, sizeof mb);
    snprintf(buf, cap, "rocketkv%s k=%lld (t=%lld) window=%lld kernel=%d rerank=%lld; layer 0: S=%lld "
             "r=%.2f capacity=%lld page=%lld dims=%lld; lists+bounds %s; %lld selects over %.0f "
             "candidates", s->mt ? "-mt" : "", (long long)s->budget, (long long)(2 * s->budget),
             (long long)s->window, s->kernel, (long long)s->rerank, (long long)l0->S, l0->sp.r,
             (long long)l0->sp.capacity, (long long)l0->sp.page, (long long)l0->sp.dims, mb,
             (long long)steps, steps ? (double)cands / (double)steps : 0.0);
}

static void rocketkv_destroy(void *self)
{
    rocketkv *s = self;
    if (!s) return;
    for (int l = 0; s->lay && l < s->L; l++)
        if (s->lay[l].n) block_free(s, &s->lay[l]);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->steps, s->stat_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s->lay, s->lay_b);
    hkv_host_free(s->mem, HKV_TIER_INDEX, s, sizeof *s);
}

static const hkv_policy_ops rocketkv_ops = {
    .prefill_end = rocketkv_prefill_end,
    .on_far_append = rocketkv_on_far_append,
    .select = rocketkv_select,
    .max_select = rocketkv_max_select,
    .scratch_need = rocketkv_scratch_need,
    .device_takes = rocketkv_device_takes,
    .cand_table = rocketkv_cand_table,
    .describe = rocketkv_describe,
    .destroy = rocketkv_destroy,
};

static int rocketkv_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                           hkv_err *err)
{
    const hkv_kv_shape *sh = &env->shape;
    if (!env->kern || sh->n_layer < 1 || sh->n_head_kv < 1 || sh->head_dim < 1 ||
        sh->n_head < sh->n_head_kv || sh->n_head % sh->n_head_kv || env->n_ctx < 1)
        return hkv_seterr(err, HKV_E_INVAL, "rocketkv: bad shape (%d layers, %d heads, %d KV heads, "
                          "d=%d, context %lld) or no kernels", sh->n_layer, sh->n_head,
                          sh->n_head_kv, sh->head_dim, (long long)env->n_ctx);
    int rc_args = hkv_policy_args_check(&hkv_policy_rocketkv, a, err);
    if (rc_args) return rc_args;
    if (((int)arg_of(a, P_KERNEL) & 1) == 0)
        return hkv_seterr(err, HKV_E_RANGE, "rocketkv: kernel=%g must be odd (a centred window)",
                          arg_of(a, P_KERNEL));
    rocketkv *s = hkv_host_calloc(env->mem, HKV_TIER_INDEX, sizeof *s, err);
    if (!s) return hkv_err_prefix(err, "rocketkv");
    s->kern = env->kern, s->mem = env->mem, s->n_threads = env->n_threads, s->n_ctx = env->n_ctx;
    s->L = sh->n_layer, s->KH = sh->n_head_kv, s->H = sh->n_head, s->d = sh->head_dim;
    s->g = s->H / s->KH;
    double b = arg_of(a, P_BUDGET);
    s->budget = isnan(b) ? hkv_policy_default_budget(env->n_ctx) : (int64_t)b;
    s->window = window_of(a);
    s->kernel = (int)arg_of(a, P_KERNEL);
    s->mt = (int)arg_of(a, P_MT);
    s->split = arg_of(a, P_SPLIT);
    s->rerank = (int64_t)arg_of(a, P_RERANK);
    s->lay_b = (size_t)s->L * sizeof *s->lay;
    s->stat_b = (size_t)s->L * s->KH * 2 * sizeof(int64_t);
    if (!(s->lay = hkv_host_calloc(s->mem, HKV_TIER_INDEX, s->lay_b, err)) ||
        !(s->steps = hkv_host_calloc(s->mem, HKV_TIER_INDEX, s->stat_b, err))) {
        if (!s->lay) s->lay_b = 0;
        if (!s->steps) s->stat_b = 0;
        rocketkv_destroy(s);
        return hkv_err_prefix(err, "rocketkv");
    }
    s->cands = s->steps + (int64_t)s->L * s->KH;
    out->ops = &rocketkv_ops;
    out->self = s;
    return HKV_OK;
}

int hkv_rocketkv_candidates(const hkv_policy *pol, int layer, int kvh, const int32_t **list,
                            int64_t *n, hkv_rocketkv_split *split)
{
    if (!pol || pol->ops != &rocketkv_ops) return HKV_E_INVAL;
    const rocketkv *s = pol->self;
    if (layer < 0 || layer >= s->L || kvh < 0 || kvh >= s->KH) return HKV_E_INVAL;
    const rk_layer *ly = &s->lay[layer];
    if (list) *list = ly->built ? ly->cand + (int64_t)kvh * ly->cap : NULL;
    if (n) *n = ly->built ? ly->n[kvh] : 0;
    if (split) *split = ly->sp;
    return HKV_OK;
}

const hkv_policy_def hkv_policy_rocketkv = {
    .name = "rocketkv",
    .kind = HKV_POLICY_EVICTION,
    .summary = "two stages: SnapKV-style eviction at prompt end to S/c^r tokens, then hybrid "
               "sparse attention (page min/max x top |q| dimensions) picks k of them per step "
               "(RocketKV; mt=1: RocketKV-MT)",
    .params = rocketkv_params,
    .n_params = P_COUNT,
    .queries_wanted = rocketkv_queries_wanted,
    .create = rocketkv_create,
};

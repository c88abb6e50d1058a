/* GPU quest and rocketkv kernels against the host policies (index/quest.c,
 * index/rocketkv.c) on random far tiers:
 *  - quest: page bounds bit-equal to the host policy's after the prompt and
 *    after appends that fill and open pages; select equal to the host's
 *    except where the float64 bounds of the K-th and (K+1)-th pages tie
 *    within 1e-4 (fp32 sums in another order; at most 10% of steps);
 *  - rocketkv stage 1 as window scores -> max pool (63) -> keep: the host
 *    policy's candidate lists, except entries whose pooled score sits within
 *    1e-4 of the cut; stage 2: list page bounds bit-equal to a reference
 *    built here, before and after far tokens are pushed onto the lists on
 *    the device (filling a page and opening the next), the HSA estimate's top k equal to the host's select except
 *    at float64 page ties by the cut (at most 25% of steps); at other k (1, within a page, past a
 *    list) against the float64 estimate, with q = 0 (all pages tie: the first k entries), with a
 *    short best last page, and with the page scores in global memory (8193 pages) equal to the
 *    shared-memory run.
 * The float64 references (quest bounds' top K, the HSA estimate) are checked
 * against the host policies first, without a device; the rest exits 77
 * (skipped) where none is usable. */
#include <omp.h>

#include "util.h"
#include "gpu_policy_world.h"

/* ---- quest ------------------------------------------------------------------------ */

static void open_quest(hkv_policy *p, const world *Wd, int64_t P, int64_t budget,
                       hkv_mem_account *mem)
{
    const hkv_policy_def *def = &hkv_policy_quest;
    hkv_policy_args a;
    hkv_err err = {0};
    char b0[64], b1[64];
    snprintf(b0, 64, "page=%lld", (long long)P);
    snprintf(b1, 64, "budget=%lld", (long long)budget);
    hkv_policy_args_init(def, &a);
    if (hkv_policy_arg_set(def, &a, b0, &err) || hkv_policy_arg_set(def, &a, b1, &err))
        gpu_die("quest args", &err);
    hkv_policy_env env = {.shape = {1, Wd->H, Wd->KH, Wd->d}, .n_ctx = Wd->cap, .L_init = 4,
                          .L_local = 64, .kern = &Wd->kern, .mem = mem, .n_threads = 1};
    if (def->create(p, &a, &env, &err)) gpu_die("quest create", &err);
}

/* Float64 group-max bound of page pg of head h from the host's fp16 bounds. */
static double bound64(const uint16_t *row, const float *q, int g, int d)
{
    double best = -INFINITY;
    for (int j = 0; j < g; j++) {
        double a = 0;
        for (int e = 0; e < d; e++) {
            const double x = q[j * d + e];
            a += fmax(x * half_to_double(row[e]), x * half_to_double(row[d + e]));
        }
        best = fmax(best, a);
    }
    return best;
}

static void quest_check(hkv_gpu_ctx *ctx, const world *Wd, int64_t P, int64_t budget, test_rng *r)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    hkv_mem_account mem = {0};
    hkv_policy pol;
    open_quest(&pol, Wd, P, budget, &mem);
    const int KH = Wd->KH, d = Wd->d, g = Wd->g, H = Wd->H;
    const int64_t np_cap = Wd->cap / P + 1, K = budget / P > 0 ? budget / P : 1;
    const size_t bb = (size_t)KH * np_cap * 2 * d * 2, kb = (size_t)KH * Wd->cap * d * 2;
    uint16_t *dk = gpu_put(ctx, Wd->k, kb), *dbounds = gpu_put(ctx, NULL, bb);
    const int64_t hi0 = Wd->hi - 40;   /* the prompt; 40 appends follow */
    hkv_far_view f = far_view(Wd, hi0);
    hkv_err err = {0};
    if (pol.ops->prefill_end(pol.self, 0, &f, NULL, &err)) gpu_die("quest prefill_end", &err);
    GPU_OK(hkv_gpu_quest_extend(dbounds, np_cap, KH, d, P, dk, d, Wd->cap * d, Wd->lo, Wd->lo, hi0,
                                st, err));
    uint16_t *hb = malloc(bb);
    float *q = malloc((size_t)H * d * 4);
    int32_t *hsel = malloc((size_t)Wd->cap * 4), *dsel = malloc((size_t)KH * Wd->cap * 4);
    double *bs = malloc((size_t)np_cap * 8);
    int64_t nf, ni;
    pol.ops->scratch_need(pol.self, Wd->hi - Wd->lo, &nf, &ni);
    hkv_policy_scratch sc = {.f = malloc((size_t)nf * 4), .i = malloc((size_t)ni * 4), .nf = nf, .ni = ni};
    int32_t *dout = gpu_put(ctx, NULL, (size_t)KH * Wd->cap * 4), *dn = gpu_put(ctx, NULL, KH * 4);
    float *dq = gpu_put(ctx, NULL, (size_t)H * d * 4);
    const size_t wsb = hkv_gpu_quest_select_ws_bytes(KH, Wd->hi - Wd->lo, P, K);
    void *ws = gpu_put(ctx, NULL, wsb);
    int bound_bad = 0, steps = 0, ties = 0, sel_bad = 0;
    for (int64_t hi = hi0; hi <= Wd->hi; hi++) {
        if (hi > hi0) {   /* one token reaches the far tier */
            f = far_view(Wd, hi);
            pol.ops->on_far_append(pol.self, 0, &f);
            if (hi % 2)   /* the one row folded, as the pipeline does from its ring copy */
                GPU_OK(hkv_gpu_quest_fold(dbounds, np_cap, KH, d, P, dk + (hi - 1) * d, Wd->cap * d,
                                          Wd->lo, hi - 1, st, err));
            else
                GPU_OK(hkv_gpu_quest_extend(dbounds, np_cap, KH, d, P, dk, d, Wd->cap * d, Wd->lo,
                                            hi - 1, hi, st, err));
        }
        if ((hi - hi0) % 8) continue;
        gpu_get(ctx, hb, dbounds, bb);
        const int64_t npg = (hi - Wd->lo + P - 1) / P;
        for (int h = 0; h < KH; h++)
            for (int64_t pg = 0; pg < npg; pg++) {
                const uint16_t *row = NULL;
                if (hkv_quest_page_bounds(&pol, 0, h, pg, &row, NULL) ||
                    memcmp(row, hb + ((size_t)h * np_cap + pg) * 2 * d, (size_t)d * 4))
                    bound_bad++;
            }
        for (int64_t i = 0; i < (int64_t)H * d; i++) q[i] = rng_uniform(r, -1.5f, 1.5f);
        GPU_OK(hkv_gpu_upload(dq, q, (size_t)H * d * 4, st, err));
        GPU_OK(hkv_gpu_quest_select(dbounds, np_cap, KH, g, d, P, K, dq, Wd->lo, hi, dout,
                                    Wd->cap, dn, ws, wsb, st, err));
        int32_t nd[8];
        gpu_get(ctx, nd, dn, (size_t)KH * 4);
        gpu_get(ctx, dsel, dout, (size_t)KH * Wd->cap * 4);
        for (int h = 0; h < KH; h++) {
            const int64_t m = pol.ops->select(pol.self, 0, h, q + (int64_t)h * g * d, &f, hsel, &sc);
            steps++;
            if (m == nd[h] && !memcmp(hsel, dsel + (int64_t)h * Wd->cap, (size_t)m * 4)) continue;
            /* a float tie at the K-th page excuses a difference */
            for (int64_t pg = 0; pg < npg; pg++) {
                const uint16_t *row = NULL;
                hkv_quest_page_bounds(&pol, 0, h, pg, &row, NULL);
                bs[pg] = bound64(row, q + (int64_t)h * g * d, g, d);
            }
            qsort(bs, (size_t)npg, 8, cmp_desc);
            if (npg > K && fabs(bs[K - 1] - bs[K]) <= 1e-4 * (1 + fabs(bs[K]))) ties++;
            else sel_bad++;
        }
    }
    CHECK(bound_bad == 0, "quest (page %lld): %d page bounds differ from the host policy's",
          (long long)P, bound_bad);
    CHECK(sel_bad == 0 && ties * 10 <= steps, "quest (page %lld, K %lld): %d of %d selections "
          "differ from the host's without a float tie, %d at ties", (long long)P, (long long)K,
          sel_bad, steps, ties);
    gpu_drop(ctx, dk, kb), gpu_drop(ctx, dbounds, bb), gpu_drop(ctx, dout, (size_t)KH * Wd->cap * 4);
    gpu_drop(ctx, dn, KH * 4), gpu_drop(ctx, dq, (size_t)H * d * 4), gpu_drop(ctx, ws, wsb);
    free(hb), free(q), free(hsel), free(dsel), free(bs), free(sc.f), free(sc.i);
    pol.ops->destroy(pol.self);
}

/* The float64 page bounds' top K against the host policy's select (no device). */
static void quest_host_check(const world *Wd, int64_t P, int64_t budget, test_rng *r)
{
    hkv_mem_account mem = {0};
    hkv_policy pol;
    open_quest(&pol, Wd, P, budget, &mem);
    const int KH = Wd->KH, d = Wd->d, g = Wd->g;
    const int64_t K = budget / P > 0 ? budget / P : 1, nfar = Wd->hi - Wd->lo;
    const int64_t npg = (nfar + P - 1) / P;
    hkv_far_view f = far_view(Wd, Wd->hi);
    hkv_err err = {0};
    if (pol.ops->prefill_end(pol.self, 0, &f, NULL, &err)) gpu_die("quest prefill_end", &err);
    int64_t nf, ni;
    pol.ops->scratch_need(pol.self, nfar, &nf, &ni);
    hkv_policy_scratch sc = {.f = malloc((size_t)nf * 4), .i = malloc((size_t)ni * 4), .nf = nf, .ni = ni};
    float *q = malloc((size_t)Wd->H * d * 4);
    int32_t *hsel = malloc((size_t)nfar * 4), *ref = malloc((size_t)nfar * 4);
    tok_s *pg = malloc((size_t)npg * sizeof *pg);
    double *bs = malloc((size_t)npg * 8);
    int steps = 0, bad = 0, ties = 0;
    for (int step = 0; step < 8; step++)
        for (int h = 0; h < KH; h++) {
            for (int64_t i = 0; i < (int64_t)Wd->H * d; i++) q[i] = rng_uniform(r, -1.5f, 1.5f);
            const float *qh = q + (int64_t)h * g * d;
            const int64_t m = pol.ops->select(pol.self, 0, h, qh, &f, hsel, &sc);
            for (int64_t i = 0; i < npg; i++) {
                const uint16_t *row = NULL;
                hkv_quest_page_bounds(&pol, 0, h, i, &row, NULL);
                pg[i] = (tok_s){bound64(row, qh, g, d), (int32_t)i};
                bs[i] = pg[i].s;
            }
            qsort(pg, (size_t)npg, sizeof *pg, cmp_tok);
            const int64_t kp = K < npg ? K : npg;
            for (int64_t i = 0; i < kp; i++) ref[i] = pg[i].x;
            qsort(ref, (size_t)kp, 4, cmp_i32);
            int64_t c = 0;   /* the reference pages' positions, ascending */
            for (int64_t i = 0; i < kp; i++) {
                const int64_t a = Wd->lo + (int64_t)ref[i] * P;
                c += (a + P < Wd->hi ? a + P : Wd->hi) - a;
            }
            int same = m == c;
            c = 0;
            for (int64_t i = 0; same && i < kp; i++)
                for (int64_t p = Wd->lo + (int64_t)ref[i] * P; same && p < Wd->lo + (ref[i] + 1) * P && p < Wd->hi; p++)
                    same = hsel[c++] == (int32_t)p;
            steps++;
            if (same) continue;
            qsort(bs, (size_t)npg, 8, cmp_desc);
            if (npg > K && fabs(bs[K - 1] - bs[K]) <= 1e-4 * (1 + fabs(bs[K]))) ties++;
            else bad++;
        }
    CHECK(bad == 0 && ties * 10 <= steps, "quest float64 bounds vs the host policy (page %lld): %d "
          "of %d selections differ without a tie, %d at ties", (long long)P, bad, steps, ties);
    free(sc.f), free(sc.i), free(q), free(hsel), free(ref), free(pg), free(bs);
    pol.ops->destroy(pol.self);
}

/* ---- rocketkv: stage 1 by composition, stage 2's estimate ------------------------ */

static uint16_t ord16(uint16_t h) { return (h & 0x8000) ? (uint16_t)~h : (uint16_t)(h | 0x8000); }

/* Float64 page scores of the HSA estimate for one head (the host algorithm). */
static void hsa_ref(const uint16_t *bnd, int64_t pcap, int64_t n, int64_t page, int64_t dims,
                    const float *q, int g, int d, double *S)
{
    double a[256], tau;
    int chosen[256], m1 = 0;
    const int64_t np = (n + page - 1) / page, last = n - (np - 1) * page;
    for (int c = 0; c < d; c++) {
        a[c] = 0;
        for (int j = 0; j < g; j++) a[c] += fabsf(q[j * d + c]);
    }
    for (int c = 0; c < d; c++) {
        int rank = 0;
        for (int c2 = 0; c2 < d; c2++) rank += a[c2] > a[c] || (a[c2] == a[c] && c2 < c);
        if (rank < dims) chosen[m1++] = c;
    }
    double *z = malloc((size_t)np * 8);
    for (int64_t p = 0; p < np; p++) S[p] = 0;
    for (int j = 0; j < g; j++) {
        double part = 0, all = 0, mx = -INFINITY, Z = 0;
        for (int t = 0; t < m1; t++) part += fabsf(q[j * d + chosen[t]]);
        for (int c = 0; c < d; c++) all += fabsf(q[j * d + c]);
        tau = part > 0 && all > 0 ? sqrt(d * part / all) : 1.0;
        for (int64_t p = 0; p < np; p++) {
            z[p] = 0;
            for (int t = 0; t < m1; t++) {
                const int c = chosen[t];
                double sg = 0;
                for (int jj = 0; jj < g; jj++) sg += q[jj * d + c];
                const int row = sg > 0 ? c : d + c;
                z[p] += q[j * d + c] * half_to_double(bnd[(int64_t)row * pcap + p]);
            }
            mx = fmax(mx, z[p]);
        }
        for (int64_t p = 0; p < np; p++) Z += exp((z[p] - mx) / tau) * (p == np - 1 ? last : page);
        for (int64_t p = 0; p < np; p++) S[p] += exp((z[p] - mx) / tau) / Z;
    }
    free(z);
}

/* Does the page holding the k-th best token sit within 1e-4 (float64) of
 * its neighbour in page order (where host and device may order pages
 * differently, changing which page is cut or kept)? Pages count `page`
 * tokens each (the short last page can only move the cut by less). */
static int hsa_near_tie(const double *S, int64_t n, int64_t page, int64_t k)
{
    const int64_t np = (n + page - 1) / page;
    double *v = malloc((size_t)np * 8);
    memcpy(v, S, (size_t)np * 8);
    qsort(v, (size_t)np, 8, cmp_desc);
    int64_t ci = 0;
    while (ci + 1 < np && (ci + 1) * page < k) ci++;
    const double tol = 1e-4 * fabs(v[ci]);
    const int tie = (ci + 1 < np && fabs(v[ci] - v[ci + 1]) <= tol) ||
                    (ci > 0 && fabs(v[ci - 1] - v[ci]) <= tol);
    free(v);
    return tie;
}

static void rk_open(hkv_policy *pol, const world *Wd, int64_t budget, hkv_mem_account *mem)
{
    const int KH = Wd->KH, d = Wd->d, H = Wd->H;
    const hkv_policy_def *def = &hkv_policy_rocketkv;
    hkv_policy_args a;
    hkv_err err = {0};
    char b0[64], b1[64];
    snprintf(b0, 64, "budget=%lld", (long long)budget);
    snprintf(b1, 64, "window=%lld", (long long)Wd->W);
    hkv_policy_args_init(def, &a);
    if (hkv_policy_arg_set(def, &a, b0, &err) || hkv_policy_arg_set(def, &a, b1, &err) ||
        hkv_policy_arg_set(def, &a, "rerank=1", &err))
        gpu_die("rocketkv args", &err);
    hkv_policy_env env = {.shape = {1, H, KH, d}, .n_ctx = Wd->cap, .L_init = 4, .L_local = 64,
                          .kern = &Wd->kern, .mem = mem, .n_threads = 1};
    if (def->create(pol, &a, &env, &err)) gpu_die("rocketkv create", &err);
    hkv_far_view f = far_view(Wd, Wd->hi);
    hkv_query_view qv = {.n = Wd->W, .pos0 = Wd->pos0, .q = Wd->q, .ld = (int64_t)H * d};
    if (pol->ops->prefill_end(pol->self, 0, &f, &qv, &err)) gpu_die("rocketkv prefill_end", &err);
}

/* Reference bounds of one head's list into b ([2d][pcap] fp16, the host's layout). */
static void rk_ref_bounds(const world *Wd, int h, const int32_t *list, int64_t n, int64_t page,
                          int64_t pcap, uint16_t *b)
{
    const int d = Wd->d;
    for (int64_t pg = 0; pg * page < n; pg++)
        for (int e = 0; e < d; e++) {
            uint16_t mx = 0, mn = 0;
            for (int64_t i = pg * page; i < n && i < (pg + 1) * page; i++) {
                const uint16_t v = Wd->kp[h][(int64_t)list[i] * d + e];
                if (i == pg * page || ord16(v) > ord16(mx)) mx = v;
                if (i == pg * page || ord16(v) < ord16(mn)) mn = v;
            }
            b[(int64_t)e * pcap + pg] = mx, b[(int64_t)(d + e) * pcap + pg] = mn;
        }
}

/* The float64 estimate and reference bounds against the host policy's
 * selections (no device): what the device's are compared with is right. */
static void rocketkv_host_check(const world *Wd, int64_t budget, test_rng *r)
{
    const int KH = Wd->KH, d = Wd->d, g = Wd->g, H = Wd->H;
    const int64_t nfar = Wd->hi - Wd->lo;
    hkv_mem_account mem = {0};
    hkv_policy pol;
    rk_open(&pol, Wd, budget, &mem);
    hkv_far_view f = far_view(Wd, Wd->hi);
    int64_t nf, ni;
    pol.ops->scratch_need(pol.self, nfar, &nf, &ni);
    hkv_policy_scratch scr = {.f = malloc((size_t)nf * 4), .i = malloc((size_t)ni * 4), .nf = nf, .ni = ni};
    float *q = malloc((size_t)H * d * 4);
    int32_t *hsel = malloc((size_t)nfar * 4), *tok = malloc((size_t)nfar * 4);
    tok_s *ts = malloc((size_t)nfar * sizeof *ts);
    int steps = 0, bad = 0, ties = 0;
    for (int h = 0; h < KH; h++) {
        const int32_t *list;
        int64_t n;
        hkv_rocketkv_split sp;
        hkv_rocketkv_candidates(&pol, 0, h, &list, &n, &sp);
        const int64_t pcap = (n + sp.page - 1) / sp.page;
        uint16_t *b = calloc((size_t)2 * d * pcap, 2);
        double *S = malloc((size_t)(pcap + 1) * 8);
        rk_ref_bounds(Wd, h, list, n, sp.page, pcap, b);
        for (int step = 0; step < 8; step++) {
            for (int64_t i = 0; i < (int64_t)H * d; i++) q[i] = rng_uniform(r, -1.5f, 1.5f);
            const float *qh = q + (int64_t)h * g * d;
            const int64_t m = pol.ops->select(pol.self, 0, h, qh, &f, hsel, &scr);
            qsort(hsel, (size_t)(m > 0 ? m : 0), 4, cmp_i32);
            hsa_ref(b, pcap, n, sp.page, sp.dims, qh, g, d, S);
            for (int64_t x = 0; x < n; x++) ts[x] = (tok_s){S[x / sp.page], (int32_t)x};
            qsort(ts, (size_t)n, sizeof *ts, cmp_tok);
            const int64_t kk = sp.k < n ? sp.k : n;
            for (int64_t i = 0; i < kk; i++) tok[i] = list[ts[i].x];
            qsort(tok, (size_t)kk, 4, cmp_i32);
            steps++;
            if (m == kk && !memcmp(tok, hsel, (size_t)kk * 4)) continue;
            if (m == kk && hsa_near_tie(S, n, sp.page, sp.k)) ties++;
            else bad++;
        }
        free(b), free(S);
    }
    CHECK(bad == 0 && ties * 4 <= steps, "rocketkv float64 estimate vs the host policy: %d of %d "
          "selections differ without a tie, %d at ties", bad, steps, ties);
    free(scr.f), free(scr.i), free(q), free(hsel), free(tok), free(ts);
    pol.ops->destroy(pol.self);
}

/* Stage 2 at other k (within a page: its first entries; 1; past the
 * shortest list) against the float64 estimate; q = 0 (every page ties: the
 * first k entries of each list); lists cut to a last page of one entry
 * whose bounds (+-8) make it the best page (the keep weighs pages by their
 * entries); and page scores in global memory (lists with room for more
 * pages than the keep's shared memory holds) equal to the shared-memory
 * run's. */
static void rocketkv_k_checks(hkv_gpu_ctx *ctx, const world *Wd, const int32_t *const *hl,
                              const int64_t *hn, int64_t cap, int64_t page, int64_t pcap,
                              const uint16_t *rb, int64_t dims, test_rng *r)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int KH = Wd->KH, d = Wd->d, g = Wd->g, H = Wd->H;
    int64_t nmin = hn[0];
    for (int h = 1; h < KH; h++) nmin = hn[h] < nmin ? hn[h] : nmin;
    /* the big copy: 8193 pages (HK_SMEM_PAGES + 1 in rocketkv_hsa.cu) */
    const int64_t capb = 8192 * page + 1, pcapb = (capb + page - 1) / page;
    int32_t *cl = calloc((size_t)KH * capb, 4), cn[8];
    uint16_t *bb = calloc((size_t)KH * 2 * d * pcapb, 2);
    for (int h = 0; h < KH; h++) {
        memcpy(cl + (int64_t)h * capb, hl[h], (size_t)hn[h] * 4), cn[h] = (int32_t)hn[h];
        for (int e = 0; e < 2 * d; e++)
            memcpy(bb + ((int64_t)h * 2 * d + e) * pcapb, rb + ((int64_t)h * 2 * d + e) * pcap,
                   (size_t)pcap * 2);
    }
    const size_t clb = (size_t)KH * capb * 4, bbb = (size_t)KH * 2 * d * pcapb * 2;
    int32_t *dcl = gpu_put(ctx, cl, clb), *dcn = gpu_put(ctx, cn, (size_t)KH * 4);
    uint16_t *dbb = gpu_put(ctx, bb, bbb);
    int32_t *dcls = gpu_put(ctx, cl, clb);   /* the same lists at stride cap */
    for (int h = 0; h < KH; h++)
        GPU_OK(hkv_gpu_upload(dcls + (int64_t)h * cap, hl[h], (size_t)hn[h] * 4, st, err));
    uint16_t *dbs = gpu_put(ctx, rb, (size_t)KH * 2 * d * pcap * 2);
    uint16_t *rs = malloc((size_t)KH * 2 * d * pcap * 2);   /* the cut lists' bounds */
    int32_t cs[8];
    int64_t ns[8];
    memcpy(rs, rb, (size_t)KH * 2 * d * pcap * 2);
    for (int h = 0; h < KH; h++) {
        ns[h] = hn[h] - (hn[h] - 1) % page, cs[h] = (int32_t)ns[h];
        for (int e = 0; e < 2 * d; e++)
            rs[((int64_t)h * 2 * d + e) * pcap + (ns[h] - 1) / page] = e < d ? 0x4800 : 0xc800;
    }
    uint16_t *dbc = gpu_put(ctx, rs, (size_t)KH * 2 * d * pcap * 2);
    int32_t *dcs = gpu_put(ctx, cs, (size_t)KH * 4);
    const size_t wsb = hkv_gpu_rocketkv_hsa_ws_bytes(KH, g, capb, page);
    void *ws = gpu_put(ctx, NULL, wsb);
    float *q = malloc((size_t)H * d * 4), *dq = gpu_put(ctx, NULL, (size_t)H * d * 4);
    const int64_t ol = cap + 1;   /* k up to the longest list + 1 */
    int32_t *dout = gpu_put(ctx, NULL, (size_t)KH * ol * 4), *dno = gpu_put(ctx, NULL, KH * 4);
    int32_t *sel = malloc((size_t)KH * ol * 4), *selb = malloc((size_t)KH * ol * 4), no[8], nob[8];
    int32_t *tok = malloc((size_t)cap * 4);
    tok_s *ts = malloc((size_t)cap * sizeof *ts);
    double *S = malloc((size_t)(pcap + 1) * 8);
    const int64_t ks[] = {2 * page + 1, 1, nmin / 2 + 1, nmin + 1};
    int steps = 0, bad = 0, ties = 0, zero_bad = 0, big_bad = 0;
    for (int ki = 0; ki < 4; ki++)
        for (int v = 0; v < 3; v++) {   /* random q, q = 0, the cut lists */
            const int64_t k = ks[ki];
            for (int64_t i = 0; i < (int64_t)H * d; i++) q[i] = v == 1 ? 0.0f : rng_uniform(r, -1.5f, 1.5f);
            GPU_OK(hkv_gpu_upload(dq, q, (size_t)H * d * 4, st, err));
            GPU_OK(hkv_gpu_rocketkv_hsa(v == 2 ? dbc : dbs, pcap, dcls, cap, v == 2 ? dcs : dcn, KH,
                                        g, d, page, dims, k, dq, dout, ol, dno, ws, wsb, st, err));
            gpu_get(ctx, no, dno, (size_t)KH * 4);
            gpu_get(ctx, sel, dout, (size_t)KH * ol * 4);
            if (v < 2)
                GPU_OK(hkv_gpu_rocketkv_hsa(dbb, pcapb, dcl, capb, dcn, KH, g, d, page, dims, k, dq, dout,
                                            ol, dno, ws, wsb, st, err));
            if (v < 2) gpu_get(ctx, nob, dno, (size_t)KH * 4);
            if (v < 2) gpu_get(ctx, selb, dout, (size_t)KH * ol * 4);
            for (int h = 0; h < KH; h++) {
                const int64_t n = v == 2 ? ns[h] : hn[h], kk = k < n ? k : n;
                const int32_t *o = sel + (int64_t)h * ol;
                if (v < 2) big_bad += nob[h] != no[h] || memcmp(selb + (int64_t)h * ol, o, (size_t)kk * 4);
                if (v == 1) {   /* every page ties: the first k entries */
                    zero_bad += no[h] != kk || memcmp(o, hl[h], (size_t)kk * 4);
                    continue;
                }
                hsa_ref((v == 2 ? rs : rb) + (int64_t)h * 2 * d * pcap, pcap, n, page, dims,
                        q + (int64_t)h * g * d, g, d, S);
                for (int64_t x = 0; x < n; x++) ts[x] = (tok_s){S[x / page], (int32_t)x};
                qsort(ts, (size_t)n, sizeof *ts, cmp_tok);
                for (int64_t i = 0; i < kk; i++) tok[i] = hl[h][ts[i].x];
                qsort(tok, (size_t)kk, 4, cmp_i32);
                steps++;
                if (no[h] == kk && !memcmp(tok, o, (size_t)kk * 4)) continue;
                if (no[h] == kk && k < n && hsa_near_tie(S, n, page, k)) ties++;
                else bad++;
            }
        }
    CHECK(bad == 0 && ties * 4 <= steps, "rocketkv stage 2 at k %lld, 1, %lld, %lld (page %lld): "
          "%d of %d selections differ from the float64 estimate's without a tie, %d at ties",
          (long long)ks[0], (long long)ks[2], (long long)ks[3], (long long)page, bad, steps, ties);
    CHECK(zero_bad == 0, "rocketkv stage 2 with q = 0 (every page ties): %d of %d selections are "
          "not the lists' first k entries", zero_bad, 4 * KH);
    CHECK(big_bad == 0, "rocketkv stage 2 with page scores in global memory (%lld pages): %d of "
          "%d selections differ from the shared-memory run's", (long long)pcapb, big_bad, 8 * KH);
    gpu_drop(ctx, dcl, clb), gpu_drop(ctx, dcn, (size_t)KH * 4), gpu_drop(ctx, dbb, bbb);
    gpu_drop(ctx, dcls, clb), gpu_drop(ctx, dbs, (size_t)KH * 2 * d * pcap * 2);
    gpu_drop(ctx, dbc, (size_t)KH * 2 * d * pcap * 2), gpu_drop(ctx, dcs, (size_t)KH * 4);
    gpu_drop(ctx, ws, wsb), gpu_drop(ctx, dq, (size_t)H * d * 4);
    gpu_drop(ctx, dout, (size_t)KH * ol * 4), gpu_drop(ctx, dno, KH * 4);
    free(cl), free(bb), free(q), free(sel), free(selb), free(tok), free(ts), free(S), free(rs);
}

static void rocketkv_check(hkv_gpu_ctx *ctx, const world *Wd, int64_t budget, test_rng *r)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int KH = Wd->KH, d = Wd->d, g = Wd->g, H = Wd->H;
    const int64_t nfar = Wd->hi - Wd->lo;
    hkv_mem_account mem = {0};
    hkv_policy pol;
    hkv_far_view f = far_view(Wd, Wd->hi);
    rk_open(&pol, Wd, budget, &mem);
    const int32_t *hl[8];
    int64_t hn[8];
    hkv_rocketkv_split sp;
    for (int h = 0; h < KH; h++) hkv_rocketkv_candidates(&pol, 0, h, &hl[h], &hn[h], &sp);

    /* stage 1 on the device: window scores -> max pool (63) -> keep capacity */
    const size_t kb = (size_t)KH * Wd->cap * d * 2, qb = (size_t)Wd->W * H * d * 2;
    uint16_t *dk = gpu_put(ctx, Wd->k, kb), *dq16 = gpu_put(ctx, Wd->q, qb);
    float *dsc = gpu_put(ctx, NULL, (size_t)KH * nfar * 4), *dpool = gpu_put(ctx, NULL, (size_t)KH * nfar * 4);
    const size_t wsb = hkv_gpu_window_scores_ws_bytes(Wd->W, H, nfar);
    void *ws = gpu_put(ctx, NULL, wsb);
    int32_t *dkeep = gpu_put(ctx, NULL, (size_t)KH * nfar * 4), *dn = gpu_put(ctx, NULL, KH * 4);
    GPU_OK(hkv_gpu_window_scores(dq16, (int64_t)H * d, Wd->W, Wd->pos0, H, KH, d, dk, d,
                                 Wd->cap * d, Wd->lo, nfar, NULL, 0, NULL, NULL, 0, dsc, nfar, ws,
                                 wsb, st, err));
    GPU_OK(hkv_gpu_pool(dsc, nfar, dpool, nfar, KH, nfar, NULL, 63, 0, st, err));
    GPU_OK(hkv_gpu_keep(dpool, nfar, KH, nfar, NULL, NULL, 0, Wd->lo, sp.capacity, Wd->pos0, dkeep,
                        nfar, dn, st, err));
    int32_t *keep = malloc((size_t)KH * nfar * 4), nd[8];
    gpu_get(ctx, keep, dkeep, (size_t)KH * nfar * 4);
    gpu_get(ctx, nd, dn, (size_t)KH * 4);
    /* the host's pooled scores, for the tie excuse at the capacity-th place */
    float *hs = malloc((size_t)KH * nfar * 4), *tmp = malloc((size_t)2 * nfar * 4);
    {
        ws_case c0;
        ws_case_init(&c0, Wd, 0, 0, 0, r);
        ws_host(Wd, &c0, hs);
        free(c0.rows), free(c0.qw);
    }
    int s1_bad = 0, s1_ties = 0;
    for (int h = 0; h < KH; h++) {
        float *sh = hs + (int64_t)h * nfar;
        hkv_ws_pool(sh, nfar, 63, 0, tmp);
        if (nd[h] == hn[h] && !memcmp(keep + (int64_t)h * nfar, hl[h], (size_t)hn[h] * 4)) continue;
        /* differences only where pooled scores sit within 1e-4 of the cut */
        double *v = malloc((size_t)nfar * 8);
        for (int64_t i = 0; i < nfar; i++) v[i] = Wd->lo + i >= Wd->pos0 ? INFINITY : sh[i];
        qsort(v, (size_t)nfar, 8, cmp_desc);
        const double cut = v[sp.capacity - 1];
        int excused = nd[h] == hn[h];
        for (int64_t i = 0; excused && i < hn[h]; i++) {
            const int32_t p = hl[h][i];
            int found = 0;
            for (int64_t j = 0; j < nd[h] && !found; j++) found = keep[(int64_t)h * nfar + j] == p;
            if (!found && fabs(sh[p - Wd->lo] - cut) > 1e-4 * fabs(cut)) excused = 0;
        }
        free(v);
        if (excused) s1_ties++;
        else s1_bad++;
    }
    CHECK(s1_bad == 0, "rocketkv stage 1 on the device (capacity %lld): %d of %d KV heads keep "
          "another set than the host policy (%d more at float ties)", (long long)sp.capacity,
          s1_bad, KH, s1_ties);

    /* stage 2: bounds from the host's lists, then the estimate's top k */
    const int64_t cap = hn[0] > hn[1] ? (hn[0] > hn[2] ? hn[0] : hn[2]) : (hn[1] > hn[2] ? hn[1] : hn[2]);
    const int64_t page = sp.page, pcap = (cap + page - 1) / page;
    int32_t *cl = calloc((size_t)KH * cap, 4), cn[8];
    for (int h = 0; h < KH; h++) memcpy(cl + (int64_t)h * cap, hl[h], (size_t)hn[h] * 4), cn[h] = (int32_t)hn[h];
    int32_t *dcl = gpu_put(ctx, cl, (size_t)KH * cap * 4), *dcn = gpu_put(ctx, cn, (size_t)KH * 4);
    const size_t bb = (size_t)KH * 2 * d * pcap * 2;
    uint16_t *dbnd = gpu_put(ctx, NULL, bb), *hb = malloc(bb), *rb = calloc(bb, 1);
    GPU_OK(hkv_gpu_rocketkv_bounds(dcl, cap, dcn, KH, d, page, pcap, 0, dk, d, Wd->cap * d, dbnd,
                                   st, err));
    gpu_get(ctx, hb, dbnd, bb);
    int bnd_bad = 0;
    for (int h = 0; h < KH; h++) {
        rk_ref_bounds(Wd, h, hl[h], hn[h], page, pcap, rb + (int64_t)h * 2 * d * pcap);
        for (int64_t pg = 0; pg * page < hn[h]; pg++)
            for (int e = 0; e < 2 * d; e++)
                bnd_bad += hb[((int64_t)h * 2 * d + e) * pcap + pg] != rb[((int64_t)h * 2 * d + e) * pcap + pg];
    }
    CHECK(bnd_bad == 0, "rocketkv page bounds on the device: %d of the reference's differ", bnd_bad);
    {   /* far tokens arriving: pushed onto every list on the device (into a copy
         * with room), against the reference bounds of the lists so extended */
        const int64_t more = page + 2, cap2 = cap + more, pcap2 = cap2 / page + 1;
        const size_t bb2 = (size_t)KH * 2 * d * pcap2 * 2;
        int32_t *cl2 = calloc((size_t)KH * cap2, 4), cn2[8];
        uint16_t *b2 = malloc(bb2), *hb2 = malloc(bb2), *rb2 = calloc(bb2, 1);
        for (int h = 0; h < KH; h++) {
            memcpy(cl2 + (int64_t)h * cap2, hl[h], (size_t)hn[h] * 4);
            cn2[h] = (int32_t)hn[h];
            for (int e = 0; e < 2 * d; e++)
                memcpy(b2 + ((int64_t)h * 2 * d + e) * pcap2, hb + ((int64_t)h * 2 * d + e) * pcap,
                       (size_t)pcap * 2);
        }
        int32_t *dcl2 = gpu_put(ctx, cl2, (size_t)KH * cap2 * 4), *dcn2 = gpu_put(ctx, cn2, (size_t)KH * 4);
        uint16_t *dbnd2 = gpu_put(ctx, b2, bb2), *krow = gpu_put(ctx, NULL, (size_t)KH * d * 2);
        for (int64_t j = 0; j < more; j++) {   /* any keys do (a repeated position too) */
            const int64_t p = Wd->hi - more + j;
            for (int h = 0; h < KH; h++)
                GPU_OK(hkv_gpu_upload(krow + (size_t)h * d, Wd->kp[h] + p * d, (size_t)d * 2, st, err));
            GPU_OK(hkv_gpu_rocketkv_push(dcl2, cap2, dcn2, KH, d, page, pcap2, dbnd2, krow, d, p, st,
                                         err));
            for (int h = 0; h < KH; h++) cl2[(int64_t)h * cap2 + hn[h] + j] = (int32_t)p;
        }
        int32_t gn[8], *gl = malloc((size_t)KH * cap2 * 4);
        gpu_get(ctx, gn, dcn2, (size_t)KH * 4);
        gpu_get(ctx, gl, dcl2, (size_t)KH * cap2 * 4);
        gpu_get(ctx, hb2, dbnd2, bb2);
        int push_bad = 0;
        for (int h = 0; h < KH; h++) {
            const int64_t n2 = hn[h] + more;
            push_bad += gn[h] != n2 || memcmp(gl + (int64_t)h * cap2, cl2 + (int64_t)h * cap2, (size_t)n2 * 4);
            rk_ref_bounds(Wd, h, cl2 + (int64_t)h * cap2, n2, page, pcap2, rb2 + (int64_t)h * 2 * d * pcap2);
            for (int64_t pg = 0; pg * page < n2; pg++)
                for (int e = 0; e < 2 * d; e++)
                    push_bad += hb2[((int64_t)h * 2 * d + e) * pcap2 + pg] !=
                                rb2[((int64_t)h * 2 * d + e) * pcap2 + pg];
        }
        CHECK(push_bad == 0, "rocketkv push of %lld far tokens on the device: %d list entries or "
              "bounds differ from the reference", (long long)more, push_bad);
        gpu_drop(ctx, dcl2, (size_t)KH * cap2 * 4), gpu_drop(ctx, dcn2, (size_t)KH * 4);
        gpu_drop(ctx, dbnd2, bb2), gpu_drop(ctx, krow, (size_t)KH * d * 2);
        free(cl2), free(b2), free(hb2), free(rb2), free(gl);
    }
    const size_t hwsb = hkv_gpu_rocketkv_hsa_ws_bytes(KH, g, cap, page);
    void *hws = gpu_put(ctx, NULL, hwsb);
    float *q = malloc((size_t)H * d * 4), *dq = gpu_put(ctx, NULL, (size_t)H * d * 4);
    int32_t *dout = gpu_put(ctx, NULL, (size_t)KH * cap * 4), *dno = gpu_put(ctx, NULL, KH * 4);
    int32_t *hsel = malloc((size_t)nfar * 4), *dsel = malloc((size_t)KH * cap * 4);
    double *S = malloc((size_t)(pcap + 1) * 8);
    int64_t nf, ni;
    pol.ops->scratch_need(pol.self, nfar, &nf, &ni);
    hkv_policy_scratch scr = {.f = malloc((size_t)nf * 4), .i = malloc((size_t)ni * 4), .nf = nf, .ni = ni};
    int steps = 0, s2_bad = 0, s2_ties = 0;
    for (int step = 0; step < 12; step++) {
        for (int64_t i = 0; i < (int64_t)H * d; i++) q[i] = rng_uniform(r, -1.5f, 1.5f);
        GPU_OK(hkv_gpu_upload(dq, q, (size_t)H * d * 4, st, err));
        GPU_OK(hkv_gpu_rocketkv_hsa(dbnd, pcap, dcl, cap, dcn, KH, g, d, page, sp.dims, sp.k, dq,
                                    dout, cap, dno, hws, hwsb, st, err));
        int32_t no[8];
        gpu_get(ctx, no, dno, (size_t)KH * 4);
        gpu_get(ctx, dsel, dout, (size_t)KH * cap * 4);
        for (int h = 0; h < KH; h++) {
            const int64_t m = pol.ops->select(pol.self, 0, h, q + (int64_t)h * g * d, &f, hsel, &scr);
            qsort(hsel, (size_t)(m > 0 ? m : 0), 4, cmp_i32);
            steps++;
            if (m == no[h] && !memcmp(hsel, dsel + (int64_t)h * cap, (size_t)m * 4)) continue;
            hsa_ref(rb + (int64_t)h * 2 * d * pcap, pcap, hn[h], page, sp.dims, q + (int64_t)h * g * d,
                    g, d, S);
            if (m == no[h] && hsa_near_tie(S, hn[h], page, sp.k)) s2_ties++;
            else s2_bad++;
        }
    }
    CHECK(s2_bad == 0 && s2_ties * 4 <= steps, "rocketkv stage 2 (page %lld, dims %lld, k %lld): "
          "%d of %d selections differ from the host's without a float tie, %d at ties",
          (long long)page, (long long)sp.dims, (long long)sp.k, s2_bad, steps, s2_ties);
    rocketkv_k_checks(ctx, Wd, hl, hn, cap, page, pcap, rb, sp.dims, r);
    gpu_drop(ctx, dk, kb), gpu_drop(ctx, dq16, qb), gpu_drop(ctx, dsc, (size_t)KH * nfar * 4);
    gpu_drop(ctx, dpool, (size_t)KH * nfar * 4), gpu_drop(ctx, ws, wsb);
    gpu_drop(ctx, dkeep, (size_t)KH * nfar * 4), gpu_drop(ctx, dn, KH * 4);
    gpu_drop(ctx, dcl, (size_t)KH * cap * 4), gpu_drop(ctx, dcn, (size_t)KH * 4), gpu_drop(ctx, dbnd, bb);
    gpu_drop(ctx, hws, hwsb), gpu_drop(ctx, dq, (size_t)H * d * 4);
    gpu_drop(ctx, dout, (size_t)KH * cap * 4), gpu_drop(ctx, dno, KH * 4);
    free(keep), free(hs), free(tmp), free(cl), free(hb), free(rb), free(q), free(hsel), free(dsel);
    free(S), free(scr.f), free(scr.i);
    pol.ops->destroy(pol.self);
}

int main(void)
{
    test_rng r = {12};
    world A, B, C, D;
    world_init(&A, 3, 3, 64, 5000, 16, &r);   /* SmolLM2's heads */
    world_init(&D, 1, 2, 256, 900, 4, &r);    /* head size 256: 8 words per lane of a page row */
    world_init(&B, 3, 3, 64, 700, 5, &r);
    world_init(&C, 2, 4, 128, 2100, 32, &r);  /* Llama-3-8B's group and head size */
    rocketkv_host_check(&A, 64, &r);
    rocketkv_host_check(&B, 32, &r);
    rocketkv_host_check(&C, 64, &r);
    quest_host_check(&A, 16, 256, &r);
    quest_host_check(&B, 5, 64, &r);
    quest_host_check(&C, 32, 512, &r);
    quest_host_check(&D, 8, 128, &r);
    if (test_failures) return test_report("gpu_page_policies (host references)");
    printf("gpu_page_policies: float64 references agree with the host (%d checks)\n", test_checks);

    hkv_gpu_ctx *ctx = gpu_test_open("gpu_page_policies");
    quest_check(ctx, &A, 16, 256, &r);
    quest_check(ctx, &B, 5, 64, &r);    /* partial last pages */
    quest_check(ctx, &B, 16, 4096, &r); /* the budget covers the far tier */
    quest_check(ctx, &C, 32, 512, &r);
    quest_check(ctx, &D, 8, 128, &r);
    rocketkv_check(ctx, &A, 64, &r);
    rocketkv_check(ctx, &B, 32, &r);
    rocketkv_check(ctx, &C, 64, &r);
    hkv_gpu_ctx_destroy(ctx);
    free(A.k), free(A.q), free(B.k), free(B.q), free(C.k), free(C.q), free(D.k), free(D.q);
    return test_report("gpu_page_policies");
}

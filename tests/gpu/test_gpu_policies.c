/* GPU pieces of the window-score policies and quest against the host
 * (index/window_scores.c, index/quest.c) on random far tiers:
 *  - window scores (sum; max with SpecPC's row weights; per-head row lists of
 *    different lengths; a window that overlaps the far tier so causality
 *    cuts keys; more than one 4096-key chunk): within fp32 tolerance of the
 *    host's and of a float64 reference;
 *  - pooling (max exact, avg within fp32 rounding) and keep (exactly the
 *    host's positions: quantised scores tie a lot and both break ties to the
 *    lower index; forced positions; k >= n; k = 0);
 *  - quest: page bounds bit-equal to the host policy's after the prompt and
 *    after appends that fill and open pages; select equal to the host's
 *    except where the float64 bounds of the K-th and (K+1)-th pages tie
 *    within 1e-4 (fp32 sums in another order; at most 10% of steps).
 * The float64 references are checked against the host first (before the
 * device opens), so the host side of this test runs without a GPU too; the
 * rest is skipped (77) there. */
#include <omp.h>

#include "util.h"
#include "window_scores.h"
#include "gpu_test.h"

typedef struct world {
    int KH, g, H, d;
    int64_t lo, hi, cap, W, pos0;
    uint16_t *k;              /* [KH][cap][d] */
    const uint16_t *kp[8], *vp[8];
    uint16_t *q;              /* [W][H][d] window queries at pos0 + a */
    hkv_cpu_kernels kern;
} world;

static void gauss_half(test_rng *r, uint16_t *dst, int64_t n, float amp)
{
    for (int64_t i = 0; i < n; i++) {
        double u1 = ((rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
        double u2 = (rng_next(r) >> 11) / 9007199254740992.0;
        dst[i] = double_to_half_ref(fmax(-4, fmin(4, amp * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2))));
    }
}

static void world_init(world *Wd, int KH, int g, int d, int64_t nfar, int64_t W, test_rng *r)
{
    Wd->KH = KH, Wd->g = g, Wd->H = KH * g, Wd->d = d;
    Wd->lo = 4, Wd->hi = 4 + nfar, Wd->cap = Wd->hi + 80, Wd->W = W;
    Wd->pos0 = Wd->hi - W / 2;   /* the first half of the window is past every far key */
    hkv_cpu_kernels_init(&Wd->kern, test_best_isa());
    Wd->k = malloc((size_t)Wd->KH * Wd->cap * Wd->d * 2);
    gauss_half(r, Wd->k, (int64_t)Wd->KH * Wd->cap * Wd->d, 0.7f);
    for (int h = 0; h < Wd->KH; h++) Wd->kp[h] = Wd->vp[h] = Wd->k + (int64_t)h * Wd->cap * Wd->d;
    Wd->q = malloc((size_t)W * Wd->H * Wd->d * 2 + 2);
    gauss_half(r, Wd->q, W * Wd->H * Wd->d, 0.7f);
}

static hkv_far_view far_view(const world *Wd, int64_t hi)
{
    hkv_far_view f = {.n_head_kv = Wd->KH, .head_dim = Wd->d, .lo = Wd->lo, .hi = hi, .k = Wd->kp,
                      .v = Wd->vp, .ld = Wd->d};
    return f;
}

/* ---- window scores ---------------------------------------------------------------- */

typedef struct ws_case {
    int reduce_max, weighted, with_rows;
    int32_t *rows;            /* [KH][nfar] when with_rows */
    int64_t n_rows[8];
    float *qw;                /* [W] */
} ws_case;

static void ws_case_init(ws_case *c, const world *Wd, int reduce_max, int weighted, int with_rows,
                         test_rng *r)
{
    const int64_t nfar = Wd->hi - Wd->lo;
    memset(c, 0, sizeof *c);
    c->reduce_max = reduce_max, c->weighted = weighted, c->with_rows = with_rows;
    c->qw = malloc((size_t)Wd->W * 4);
    for (int64_t a = 0; a < Wd->W; a++) c->qw[a] = Wd->W > 1 ? (float)a / (float)(Wd->W - 1) : 1.0f;
    c->rows = malloc((size_t)Wd->KH * nfar * 4);
    for (int h = 0; h < Wd->KH; h++) {
        int64_t m = 0;
        const uint64_t keep = 30 + 30 * (uint64_t)h;   /* percent kept: lists of different lengths */
        for (int64_t i = 0; i < nfar; i++)
            if (!with_rows || rng_next(r) % 100 < keep || i >= nfar - 8) c->rows[h * nfar + m++] = (int32_t)(Wd->lo + i);
        c->n_rows[h] = m;
    }
}

/* Float64 reference of hkv_ws_window_scores for head h, scored row i. */
static void ws_ref(const world *Wd, const ws_case *c, int h, double *out)
{
    const int64_t nfar = Wd->hi - Wd->lo, n = c->n_rows[h];
    const int d = Wd->d;
    double *s = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) out[i] = 0;
    for (int64_t a = 0; a < Wd->W; a++)
        for (int j = 0; j < Wd->g; j++) {
            const uint16_t *q = Wd->q + (a * Wd->H + (int64_t)h * Wd->g + j) * d;
            double m = -INFINITY, l = 0;
            for (int64_t i = 0; i < n; i++) {
                const int64_t p = c->rows[h * nfar + i];
                s[i] = -INFINITY;
                if (p > Wd->pos0 + a) continue;
                double x = 0;
                for (int e = 0; e < d; e++) x += half_to_double(q[e]) * half_to_double(Wd->kp[h][p * d + e]);
                s[i] = x / sqrt((double)d);
                m = fmax(m, s[i]);
            }
            if (m == -INFINITY) continue;
            for (int64_t i = 0; i < n; i++) if (s[i] > -INFINITY) l += exp(s[i] - m);
            const double wt = c->weighted ? c->qw[a] : 1.0;
            for (int64_t i = 0; i < n; i++) {
                if (s[i] == -INFINITY) continue;
                const double v = wt * exp(s[i] - m) / l;
                out[i] = c->reduce_max ? fmax(out[i], v) : out[i] + v;
            }
        }
    free(s);
}

/* Host scores of the case into host [KH][nfar]. */
static void ws_host(const world *Wd, const ws_case *c, float *host)
{
    const int64_t nfar = Wd->hi - Wd->lo;
    hkv_far_view f = far_view(Wd, Wd->hi);
    hkv_query_view qv = {.n = Wd->W, .pos0 = Wd->pos0, .q = Wd->q, .ld = (int64_t)Wd->H * Wd->d};
    const int32_t *rp[8];
    for (int h = 0; h < Wd->KH; h++) rp[h] = c->rows + h * nfar;
    hkv_ws_job job = {.far = &f, .qv = &qv, .n_head = Wd->H, .rows = c->with_rows ? rp : NULL,
                      .n_rows = c->n_rows, .out = host, .ld_out = nfar, .n_threads = 2,
                      .reduce_max = c->reduce_max, .q_weight = c->weighted ? c->qw : NULL};
    hkv_mem_account mem = {0};
    hkv_err err = {0};
    if (hkv_ws_window_scores(&Wd->kern, &job, &mem, &err)) gpu_die("host window scores", &err);
}

/* fp32 agreement: scale is the largest score of the head (probabilities over
 * thousands of keys are small, so a fixed absolute tolerance would hide errors). */
static int close_to(double x, double ref, double scale)
{
    return fabs(x - ref) <= 1e-5 * scale + 1e-4 * fabs(ref);
}

static double head_max(const float *v, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(v[i]));
    return m;
}

/* The float64 reference against the host: the reference the device is held to. */
static void ws_check_host(const world *Wd, const ws_case *c)
{
    const int64_t nfar = Wd->hi - Wd->lo;
    float *host = malloc((size_t)Wd->KH * nfar * 4);
    double *ref = malloc((size_t)nfar * 8);
    ws_host(Wd, c, host);
    int bad = 0;
    for (int h = 0; h < Wd->KH; h++) {
        ws_ref(Wd, c, h, ref);
        const double sc = head_max(host + h * nfar, c->n_rows[h]);
        for (int64_t i = 0; i < c->n_rows[h]; i++) bad += !close_to(host[h * nfar + i], ref[i], sc);
    }
    CHECK(bad == 0, "host window scores (max %d, weighted %d, rows %d): %d of the float64 "
          "reference's values differ", c->reduce_max, c->weighted, c->with_rows, bad);
    free(host), free(ref);
}

static void ws_check_gpu(hkv_gpu_ctx *ctx, const world *Wd, const ws_case *c)
{
    const int64_t nfar = Wd->hi - Wd->lo;
    void *st = hkv_gpu_ctx_stream(ctx);
    float *host = malloc((size_t)Wd->KH * nfar * 4), *dev = malloc((size_t)Wd->KH * nfar * 4);
    ws_host(Wd, c, host);
    const size_t kb = (size_t)Wd->KH * Wd->cap * Wd->d * 2, qb = (size_t)Wd->W * Wd->H * Wd->d * 2;
    uint16_t *k = gpu_put(ctx, Wd->k, kb), *q = gpu_put(ctx, Wd->q, qb);
    int32_t *rows = gpu_put(ctx, c->rows, (size_t)Wd->KH * nfar * 4);
    int32_t nr[8];
    for (int h = 0; h < Wd->KH; h++) nr[h] = (int32_t)c->n_rows[h];
    int32_t *nrows = gpu_put(ctx, nr, (size_t)Wd->KH * 4);
    float *qw = gpu_put(ctx, c->qw, (size_t)Wd->W * 4);
    float *out = gpu_poisoned(ctx, (size_t)Wd->KH * nfar);
    const size_t wsb = hkv_gpu_window_scores_ws_bytes(Wd->W, Wd->H, nfar);
    void *ws = gpu_put(ctx, NULL, wsb);
    GPU_OK(hkv_gpu_window_scores(q, (int64_t)Wd->H * Wd->d, Wd->W, Wd->pos0, Wd->H, Wd->KH, Wd->d,
                                 k, Wd->d, Wd->cap * Wd->d, Wd->lo, nfar,
                                 c->with_rows ? rows : NULL, nfar, c->with_rows ? nrows : NULL,
                                 c->weighted ? qw : NULL, c->reduce_max, out, nfar, ws, wsb, st,
                                 err));
    gpu_get(ctx, dev, out, (size_t)Wd->KH * nfar * 4);
    int bad = 0;
    double worst = 0;
    for (int h = 0; h < Wd->KH; h++) {
        const double sc = head_max(host + h * nfar, c->n_rows[h]);
        for (int64_t i = 0; i < c->n_rows[h]; i++) {
            const double x = dev[h * nfar + i], y = host[h * nfar + i];
            if (!close_to(x, y, sc)) bad++;
            if (fabs(x - y) > worst || isnan(x)) worst = isnan(x) ? INFINITY : fabs(x - y);
        }
    }
    CHECK(bad == 0, "gpu window scores (max %d, weighted %d, rows %d, %lld keys): %d values off "
          "the host's, worst |diff| %g", c->reduce_max, c->weighted, c->with_rows,
          (long long)nfar, bad, worst);
    /* workspace too small: a clear error, nothing launched */
    hkv_err err = {0};
    CHECK(hkv_gpu_window_scores(q, (int64_t)Wd->H * Wd->d, Wd->W, Wd->pos0, Wd->H, Wd->KH, Wd->d,
                                k, Wd->d, Wd->cap * Wd->d, Wd->lo, nfar, NULL, 0, NULL, NULL, 0,
                                out, nfar, ws, wsb / 2, st, &err) == HKV_E_INVAL && err.msg[0],
          "a short workspace must be refused with a message");
    gpu_drop(ctx, k, kb), gpu_drop(ctx, q, qb), gpu_drop(ctx, rows, (size_t)Wd->KH * nfar * 4);
    gpu_drop(ctx, nrows, (size_t)Wd->KH * 4), gpu_drop(ctx, qw, (size_t)Wd->W * 4);
    gpu_drop(ctx, out, ((size_t)Wd->KH * nfar + HKV_TEST_GUARD) * 4), gpu_drop(ctx, ws, wsb);
    free(host), free(dev);
}

/* ---- pooling and keep ------------------------------------------------------------- */

#define PB 3   /* batch rows */

/* Quantised scores: many exact ties. */
static void tie_scores(test_rng *r, float *s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) s[i] = (float)(rng_next(r) % 17) * 0.125f - 1.0f;
}

static void pool_keep_check(hkv_gpu_ctx *ctx, int64_t n, test_rng *r)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    float *s = malloc((size_t)PB * n * 4), *host = malloc((size_t)PB * n * 4);
    float *dev = malloc((size_t)PB * n * 4), *tmp = malloc((size_t)2 * n * 4);
    int32_t len[PB] = {(int32_t)n, (int32_t)(n - n / 3), (int32_t)(n / 7 + 1)};
    tie_scores(r, s, PB * n);
    float *din = gpu_put(ctx, s, (size_t)PB * n * 4), *dout = gpu_poisoned(ctx, (size_t)PB * n);
    int32_t *dlen = gpu_put(ctx, len, sizeof len);
    const int kernels[] = {1, 7, 63};
    for (int ki = 0; ki < 3; ki++)
        for (int avg = 0; avg <= 1; avg++) {
            GPU_OK(hkv_gpu_pool(din, n, dout, n, PB, n, dlen, kernels[ki], avg, st, err));
            gpu_get(ctx, dev, dout, (size_t)PB * n * 4);
            int bad = 0;
            for (int b = 0; b < PB; b++) {
                memcpy(host + b * n, s + b * n, (size_t)len[b] * 4);
                hkv_ws_pool(host + b * n, len[b], kernels[ki], avg, tmp);
                for (int64_t i = 0; i < len[b]; i++) {
                    const float x = dev[b * n + i], y = host[b * n + i];
                    bad += avg ? !(fabsf(x - y) <= 1e-6f * (1 + fabsf(y))) : x != y;
                }
            }
            CHECK(bad == 0, "gpu pool (n %lld, kernel %d, avg %d): %d values differ from the host's",
                  (long long)n, kernels[ki], avg, bad);
        }
    /* keep: rows lists (every other position + a gap) and plain lo + i */
    int32_t *rows = malloc((size_t)PB * n * 4), *hout = malloc((size_t)n * 4);
    int32_t *idx = malloc((size_t)n * 4), *scr = malloc((size_t)n * 4), *dsel = malloc((size_t)PB * n * 4);
    for (int b = 0; b < PB; b++)
        for (int64_t i = 0; i < n; i++) rows[b * n + i] = (int32_t)(10 + 2 * i + (i > n / 2 ? 5 : 0));
    int32_t *drows = gpu_put(ctx, rows, (size_t)PB * n * 4);
    int32_t *dkeep = gpu_put(ctx, NULL, (size_t)PB * n * 4), *dn = gpu_put(ctx, NULL, PB * 4);
    const int64_t ks[] = {0, 1, 37, n / 2, n, n + 5};
    for (int with_rows = 0; with_rows <= 1; with_rows++)
        for (int ki = 0; ki < 6; ki++) {
            const int64_t k = ks[ki], lo = 3;
            const int64_t force = with_rows ? 10 + 2 * (n - n / 10) : lo + n - 4;
            GPU_OK(hkv_gpu_keep(din, n, PB, n, dlen, with_rows ? drows : NULL, n, lo, k, force, dkeep,
                                n, dn, st, err));
            int32_t nd[PB];
            gpu_get(ctx, nd, dn, sizeof nd);
            gpu_get(ctx, dsel, dkeep, (size_t)PB * n * 4);
            int bad = 0;
            for (int b = 0; b < PB; b++) {
                memcpy(host + b * n, s + b * n, (size_t)len[b] * 4);
                const int64_t m = hkv_ws_keep(host + b * n, with_rows ? rows + b * n : NULL, lo,
                                              len[b], k, force, hout, idx, scr);
                if (m != nd[b] || memcmp(hout, dsel + b * n, (size_t)m * 4)) bad++;
            }
            CHECK(bad == 0, "gpu keep (n %lld, k %lld, rows %d): %d of %d rows differ from the "
                  "host's", (long long)n, (long long)k, with_rows, bad, PB);
        }
    gpu_drop(ctx, din, (size_t)PB * n * 4), gpu_drop(ctx, dout, ((size_t)PB * n + HKV_TEST_GUARD) * 4);
    gpu_drop(ctx, dlen, sizeof len), gpu_drop(ctx, drows, (size_t)PB * n * 4);
    gpu_drop(ctx, dkeep, (size_t)PB * n * 4), gpu_drop(ctx, dn, PB * 4);
    free(s), free(host), free(dev), free(tmp), free(rows), free(hout), free(idx), free(scr), free(dsel);
}

typedef struct tok_s { double s; int32_t x; } tok_s;
static int cmp_tok(const void *a, const void *b)   /* score desc, then lower index */
{
    const tok_s *x = a, *y = b;
    return x->s != y->s ? (x->s < y->s) - (x->s > y->s) : (x->x > y->x) - (x->x < y->x);
}

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

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
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
    test_rng r = {11};
    world A, B, C;
    world_init(&A, 3, 3, 64, 5000, 16, &r);   /* SmolLM2's heads; two 4096-key chunks */
    world_init(&B, 3, 3, 64, 700, 5, &r);
    world_init(&C, 2, 4, 128, 2100, 32, &r);  /* Llama-3-8B's group and head size */
    const world *cw[5] = {&A, &A, &A, &B, &C};
    ws_case cs[5];
    ws_case_init(&cs[0], &A, 0, 0, 0, &r);   /* SnapKV's sum */
    ws_case_init(&cs[1], &A, 1, 1, 0, &r);   /* SpecPC's weighted max */
    ws_case_init(&cs[2], &A, 0, 0, 1, &r);   /* row lists (after a token-selective prefill) */
    ws_case_init(&cs[3], &B, 1, 0, 1, &r);
    ws_case_init(&cs[4], &C, 0, 1, 0, &r);   /* weighted sum */
    for (int i = 0; i < 5; i++) ws_check_host(cw[i], &cs[i]);
    rocketkv_host_check(&A, 64, &r);
    rocketkv_host_check(&B, 32, &r);
    rocketkv_host_check(&C, 64, &r);
    quest_host_check(&A, 16, 256, &r);
    quest_host_check(&B, 5, 64, &r);
    quest_host_check(&C, 32, 512, &r);
    if (test_failures) return test_report("gpu_policies (host references)");
    printf("gpu_policies: float64 references agree with the host (%d checks)\n", test_checks);

    hkv_gpu_ctx *ctx = gpu_test_open("gpu_policies");
    for (int i = 0; i < 5; i++) ws_check_gpu(ctx, cw[i], &cs[i]);
    pool_keep_check(ctx, 5000, &r);
    pool_keep_check(ctx, 200, &r);
    quest_check(ctx, &A, 16, 256, &r);
    quest_check(ctx, &B, 5, 64, &r);    /* partial last pages */
    quest_check(ctx, &B, 16, 4096, &r); /* the budget covers the far tier */
    quest_check(ctx, &C, 32, 512, &r);
    rocketkv_check(ctx, &A, 64, &r);
    rocketkv_check(ctx, &B, 32, &r);
    rocketkv_check(ctx, &C, 64, &r);
    hkv_gpu_ctx_destroy(ctx);
    for (int i = 0; i < 5; i++) free(cs[i].rows), free(cs[i].qw);
    free(A.k), free(A.q), free(B.k), free(B.q), free(C.k), free(C.q);
    return test_report("gpu_policies");
}

/* GPU window scores, pooling and keep against the host (index/window_scores.c)
 * on random far tiers:
 *  - window scores (sum; max with SpecPC's row weights; per-head row lists of
 *    different lengths; a window that overlaps the far tier so causality
 *    cuts keys; more than one 4096-key chunk; d 64 and 128): within fp32
 *    tolerance of the host's, whose agreement with a float64 reference is
 *    checked first (before the device opens, so that part runs without a GPU);
 *  - pooling (max exact, avg within fp32 rounding) and keep (exactly the
 *    host's positions: quantised scores tie a lot and both break ties to the
 *    lower index; forced positions; k >= n; k = 0).
 * Exits 77 (skipped) after the host part where no device is usable. The
 * quest and rocketkv kernels are in test_gpu_page_policies.c. */
#include <omp.h>

#include "util.h"
#include "gpu_policy_world.h"

/* ---- window scores ---------------------------------------------------------------- */

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

/* pool's batch rows are grid.y: more than a device allows must be refused
 * as an argument error before any launch, not reported as a failed launch
 * (keep puts them in grid.x, which takes 2^31 - 1). */
static void batch_limit_check(hkv_gpu_ctx *ctx)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int nb = 70000;
    float *din = gpu_put(ctx, NULL, (size_t)nb * 4), *dout = gpu_put(ctx, NULL, (size_t)nb * 4);
    hkv_err e;
    hkv_err_clear(&e);
    int rc = hkv_gpu_pool(din, 1, dout, 1, nb, 1, NULL, 1, 0, st, &e);
    CHECK(rc == HKV_E_INVAL, "gpu pool of %d batch rows: want HKV_E_INVAL, got %d (%s)", nb, rc, e.msg);
    GPU_OK(hkv_gpu_sync(st, err));   /* nothing was launched, nothing failed */
    gpu_drop(ctx, din, (size_t)nb * 4), gpu_drop(ctx, dout, (size_t)nb * 4);
}

int main(void)
{
    test_rng r = {11};
    world A, B, C, D, E;
    world_init(&A, 3, 3, 64, 5000, 16, &r);   /* SmolLM2's heads; two 4096-key chunks */
    world_init(&B, 3, 3, 64, 700, 5, &r);
    world_init(&C, 2, 4, 128, 2100, 32, &r);  /* Llama-3-8B's group and head size */
    /* head sizes whose rows do not fill the warp tile's lanes evenly (48
     * words: lanes 16..31 idle in the second step) or fill four steps */
    world_init(&D, 1, 2, 96, 333, 3, &r);
    world_init(&E, 2, 1, 256, 97, 4, &r);
    enum { NC = 7 };
    const world *cw[NC] = {&A, &A, &A, &B, &C, &D, &E};
    ws_case cs[NC];
    ws_case_init(&cs[0], &A, 0, 0, 0, &r);   /* SnapKV's sum */
    ws_case_init(&cs[1], &A, 1, 1, 0, &r);   /* SpecPC's weighted max */
    ws_case_init(&cs[2], &A, 0, 0, 1, &r);   /* row lists (after a token-selective prefill) */
    ws_case_init(&cs[3], &B, 1, 0, 1, &r);
    ws_case_init(&cs[4], &C, 0, 1, 0, &r);   /* weighted sum */
    ws_case_init(&cs[5], &D, 0, 0, 1, &r);
    ws_case_init(&cs[6], &E, 1, 0, 0, &r);
    for (int i = 0; i < NC; i++) ws_check_host(cw[i], &cs[i]);
    if (test_failures) return test_report("gpu_policies (host references)");
    printf("gpu_policies: float64 references agree with the host (%d checks)\n", test_checks);

    hkv_gpu_ctx *ctx = gpu_test_open("gpu_policies");
    for (int i = 0; i < NC; i++) ws_check_gpu(ctx, cw[i], &cs[i]);
    pool_keep_check(ctx, 5000, &r);
    pool_keep_check(ctx, 200, &r);
    batch_limit_check(ctx);
    hkv_gpu_ctx_destroy(ctx);
    for (int i = 0; i < NC; i++) free(cs[i].rows), free(cs[i].qw);
    const world *all[] = {&A, &B, &C, &D, &E};
    for (int i = 0; i < 5; i++) free(all[i]->k), free(all[i]->q);
    return test_report("gpu_policies");
}

/* Shared by the gpu policy tests (test_gpu_policies.c, test_gpu_page_policies.c):
 * a random far tier with an observation window, the host's window scores of
 * it, and the comparisons and sorts both use. Include after util.h. */
#ifndef HKV_TEST_GPU_POLICY_WORLD_H
#define HKV_TEST_GPU_POLICY_WORLD_H

#include "window_scores.h"
#include "gpu_test.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

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

/* ---- window-score cases and the host's scores ---------------------------------------- */

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
typedef struct tok_s { double s; int32_t x; } tok_s;
static int cmp_tok(const void *a, const void *b)   /* score desc, then lower index */
{
    const tok_s *x = a, *y = b;
    return x->s != y->s ? (x->s < y->s) - (x->s > y->s) : (x->x > y->x) - (x->x < y->x);
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

#pragma GCC diagnostic pop

#endif

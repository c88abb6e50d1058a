/* Test helpers for the ctkvr policy: a synthetic far tier with clustered
 * keys and a query stream with adjacent-position similarity, the exact
 * top-k reference, and a runner that checks every select. Included by
 * test_ctkvr.c only. */
#ifndef HKV_TEST_CTKVR_WORLD_H
#define HKV_TEST_CTKVR_WORLD_H

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctkvr_impl.h"
#include "policy.h"

#include "../check.h"

typedef struct rng { uint64_t s; } rng;
static uint64_t rnext(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double runif(rng *r) { return ((rnext(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
static float rgauss(rng *r) { return (float)(sqrt(-2 * log(runif(r))) * cos(6.283185307179586 * runif(r))); }

/* fp16 -> double, independent of the library's converters */
static double h2d(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}

static void unit(float *x, int d)
{
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)x[i] * x[i];
    for (int i = 0; i < d; i++) x[i] = (float)(x[i] / sqrt(s));
}

/* ---- the synthetic world ----------------------------------------------------- */

typedef struct world {
    int KH, g, H, d, D;
    int64_t cap, lo, hi;
    hkv_cpu_kernels kern;
    uint16_t *k, *v;             /* [KH][cap][d] */
    const uint16_t *kp[16], *vp[16];
    float *dir;                  /* [KH][D][d] unit cluster directions */
    float *base, *w;             /* [H][d] persistent query part, AR state */
    float ar, amp_b, sig_w, sig_e;   /* AR coefficient, persistent, AR and i.i.d. parts */
    float *hist;                 /* [cap][H][d] every query made, by position */
    double *h2d;                 /* [65536] fp16 code -> value, for the reference */
    rng r;
} world;

static void put_key(world *W, int h, int64_t p, const float *x)
{
    float v[256];
    W->kern.f32_to_f16(x, W->k + ((int64_t)h * W->cap + p) * W->d, W->d);
    for (int i = 0; i < W->d; i++) v[i] = rgauss(&W->r);
    W->kern.f32_to_f16(v, W->v + ((int64_t)h * W->cap + p) * W->d, W->d);
}

/* a key of a random cluster of head h */
static void cluster_key(world *W, int h, int64_t p)
{
    float x[256];
    const float *c = W->dir + ((int64_t)h * W->D + (int64_t)(rnext(&W->r) % W->D)) * W->d;
    float a = 2.0f + 2.0f * (float)runif(&W->r);
    for (int i = 0; i < W->d; i++) x[i] = a * c[i] + 0.12f * rgauss(&W->r);
    put_key(W, h, p, x);
}

static void world_init(world *W, int KH, int g, int d, int64_t cap, int64_t n_far, int D,
                       float ar, uint64_t seed)
{
    memset(W, 0, sizeof *W);
    W->KH = KH, W->g = g, W->H = KH * g, W->d = d, W->D = D, W->cap = cap;
    W->lo = 4, W->hi = 4 + n_far, W->ar = ar, W->r.s = seed;
    W->amp_b = 1.0f, W->sig_w = 1.0f / sqrtf((float)d), W->sig_e = 0.4f / sqrtf((float)d);
    hkv_isa_info info;
    hkv_isa_detect(&info);
    const char *isa = getenv("HKV_TEST_ISA");   /* e.g. scalar: the other kernels' rounding */
    hkv_cpu_kernels_init(&W->kern, isa && hkv_isa_parse(isa) >= 0 ? hkv_isa_parse(isa) : info.best);
    W->k = calloc((size_t)KH * cap * d, 2);
    W->v = calloc((size_t)KH * cap * d, 2);
    W->dir = malloc((size_t)KH * D * d * sizeof(float));
    W->base = malloc((size_t)W->H * d * sizeof(float));
    W->w = calloc((size_t)W->H * d, sizeof(float));
    W->hist = calloc((size_t)cap * W->H * d, sizeof(float));
    W->h2d = malloc(65536 * sizeof(double));
    for (int c = 0; c < 65536; c++) W->h2d[c] = h2d((uint16_t)c);
    for (int h = 0; h < KH; h++) {
        W->kp[h] = W->k + (int64_t)h * cap * d;
        W->vp[h] = W->v + (int64_t)h * cap * d;
        for (int c = 0; c < D; c++) {
            float *x = W->dir + ((int64_t)h * D + c) * d;
            for (int i = 0; i < d; i++) x[i] = rgauss(&W->r);
            unit(x, d);
        }
        for (int64_t p = W->lo; p < W->hi; p++) cluster_key(W, h, p);
    }
    for (int j = 0; j < W->H; j++) {   /* each head leans towards one of its clusters */
        float *b = W->base + (int64_t)j * d;
        const float *c = W->dir + ((int64_t)(j / g) * D + (int64_t)(rnext(&W->r) % D)) * d;
        for (int i = 0; i < d; i++) b[i] = c[i] + 0.7f * rgauss(&W->r) / sqrtf((float)d);
        unit(b, d);
    }
}

static void world_free(world *W)
{
    free(W->k), free(W->v), free(W->dir), free(W->base), free(W->w), free(W->hist), free(W->h2d);
}

/* The query at position pos (all H heads, fp32 into hist): base + AR(1). */
static const float *next_query(world *W, int64_t pos)
{
    const int d = W->d;
    float *q = W->hist + pos * W->H * d;
    const float c = sqrtf(1 - W->ar * W->ar);
    for (int j = 0; j < W->H; j++)
        for (int i = 0; i < d; i++) {
            float *w = &W->w[(int64_t)j * d + i];
            *w = W->ar * *w + c * rgauss(&W->r);
            q[(int64_t)j * d + i] = 3.0f * (W->amp_b * W->base[(int64_t)j * d + i] + W->sig_w * *w +
                                            W->sig_e * rgauss(&W->r));
        }
    return q;
}

static hkv_far_view far_of(const world *W)
{
    hkv_far_view f = {.n_head_kv = W->KH, .head_dim = W->d, .lo = W->lo, .hi = W->hi,
                      .k = W->kp, .v = W->vp, .ld = W->d};
    return f;
}

/* fp16 rows [pos0, pos0+n) of the query history, for prefill_end */
static uint16_t *query_rows(const world *W, int64_t pos0, int64_t n, hkv_query_view *qv)
{
    const int64_t row = (int64_t)W->H * W->d;
    uint16_t *q = malloc((size_t)(n > 0 ? n : 1) * row * 2);
    for (int64_t i = 0; i < n; i++) W->kern.f32_to_f16(W->hist + (pos0 + i) * row, q + i * row, row);
    *qv = (hkv_query_view){.n = n, .pos0 = pos0, .q = q, .ld = row};
    return q;
}

/* Exact top-k far positions of KV head h for q [g][d], in double. */
typedef struct sp { double s; int32_t p; } sp;
static int cmp_sp(const void *a, const void *b)
{
    double x = ((const sp *)a)->s, y = ((const sp *)b)->s;
    return x < y ? 1 : x > y ? -1 : 0;
}
static int64_t oracle(const world *W, int h, const float *q, int64_t k, int32_t *out)
{
    const int64_t n = W->hi - W->lo;
    sp *a = malloc((size_t)n * sizeof *a);
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *kr = W->kp[h] + (W->lo + i) * W->d;
        double best = -INFINITY;
        for (int j = 0; j < W->g; j++) {
            double s = 0;
            for (int e = 0; e < W->d; e++) s += (double)q[j * W->d + e] * W->h2d[kr[e]];
            if (s > best) best = s;
        }
        a[i] = (sp){best, (int32_t)(W->lo + i)};
    }
    qsort(a, (size_t)n, sizeof *a, cmp_sp);
    if (k > n) k = n;
    for (int64_t i = 0; i < k; i++) out[i] = a[i].p;
    free(a);
    return k;
}

/* ---- running the policy ------------------------------------------------------- */

typedef struct runner {
    hkv_policy pol;
    hkv_mem_account mem;
    hkv_policy_scratch ws;
    int32_t *out, *orc;
    uint8_t *mark;
    int64_t max_sel;
} runner;

static int runner_open(runner *R, const world *W, const char *const *args, int n_args)
{
    memset(R, 0, sizeof *R);
    const hkv_policy_def *def = &hkv_policy_ctkvr;
    hkv_policy_args a;
    hkv_err err = {0};
    hkv_policy_args_init(def, &a);
    for (int i = 0; i < n_args; i++)
        if (hkv_policy_arg_set(def, &a, args[i], &err)) {
            printf("arg %s: %s\n", args[i], err.msg);
            return -1;
        }
    hkv_policy_env env = {.shape = {1, W->H, W->KH, W->d}, .n_ctx = W->cap, .L_init = 4,
                          .L_local = 256, .kern = &W->kern, .mem = &R->mem,
                          .n_threads = omp_get_max_threads()};
    if (def->create(&R->pol, &a, &env, &err)) {
        printf("create: %s\n", err.msg);
        return -1;
    }
    R->pol.ops->scratch_need(R->pol.self, W->cap, &R->ws.nf, &R->ws.ni);
    R->ws.f = malloc((size_t)R->ws.nf * 4 + 4);
    R->ws.i = malloc((size_t)R->ws.ni * 4 + 4);
    R->max_sel = R->pol.ops->max_select(R->pol.self, W->cap);
    R->out = malloc((size_t)R->max_sel * 4 + 4);
    R->orc = malloc((size_t)R->max_sel * 4 + 4);
    R->mark = calloc((size_t)W->cap, 1);
    return 0;
}

static void runner_close(runner *R)
{
    R->pol.ops->destroy(R->pol.self);
    CHECK(R->mem.bytes[HKV_TIER_INDEX] == 0 && R->mem.bytes[HKV_TIER_WORKSPACE] == 0,
          "memory left accounted after destroy: index %zu, workspace %zu",
          R->mem.bytes[HKV_TIER_INDEX], R->mem.bytes[HKV_TIER_WORKSPACE]);
    free(R->ws.f), free(R->ws.i), free(R->out), free(R->orc), free(R->mark);
}

static int prefill(runner *R, world *W, int64_t pos0, int64_t n)
{
    hkv_query_view qv;
    uint16_t *q = query_rows(W, pos0, n, &qv);
    hkv_far_view f = far_of(W);
    hkv_err err = {0};
    int rc = R->pol.ops->prefill_end(R->pol.self, 0, &f, &qv, &err);
    if (rc) printf("prefill_end: %s\n", err.msg);
    CHECK(rc == 0, "prefill_end failed");
    free(q);
    return rc;
}

/* select for KV head h, checked for validity; returns the oracle recall */
static double select_check(runner *R, const world *W, int h, const float *q, int64_t *n_out)
{
    hkv_far_view f = far_of(W);
    int64_t n = R->pol.ops->select(R->pol.self, 0, h, q + (int64_t)h * W->g * W->d, &f, R->out, &R->ws);
    int64_t ms = R->pol.ops->max_select(R->pol.self, W->hi - W->lo);
    CHECK(n >= 0 && n <= ms, "select returned %lld (max_select %lld)", (long long)n, (long long)ms);
    if (n < 0) return 0;
    int bad = 0, dup = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t p = R->out[i];
        if (p < W->lo || p >= W->hi) bad++;
        else if (R->mark[p]++) dup++;
    }
    CHECK(!bad && !dup, "select: %d positions outside [%lld, %lld), %d duplicates", bad,
          (long long)W->lo, (long long)W->hi, dup);
    int64_t k = oracle(W, h, q + (int64_t)h * W->g * W->d, ms, R->orc), hit = 0;
    for (int64_t i = 0; i < k; i++) hit += R->mark[R->orc[i]] != 0;
    for (int64_t i = 0; i < n; i++)
        if (R->out[i] >= W->lo && R->out[i] < W->hi) R->mark[R->out[i]] = 0;
    if (n_out) *n_out = n;
    return k ? (double)hit / (double)k : 1.0;
}

static int in_out(const runner *R, int64_t n, int32_t p)
{
    for (int64_t i = 0; i < n; i++)
        if (R->out[i] == p) return 1;
    return 0;
}


#endif

/* Shared by the quest, snapkv and rocketkv tests: a structured synthetic far tier
 * (keys in topic runs per KV head, needles), a policy opened on it through the
 * registry, observation windows, and the float64 reference of the window-score
 * pipeline (scores, pooling, top-k). Header-only: each test is one program. */
#ifndef HKV_TEST_POLICY_WORLD_H
#define HKV_TEST_POLICY_WORLD_H

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "window_scores.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "../check.h"

/* ---- the world (the same in each policy test) ------------------------------------- */

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

typedef struct world {
    int KH, g, H, d, D;
    int64_t cap, lo, hi;
    hkv_cpu_kernels kern;
    uint16_t *k, *v;               /* [KH][cap][d] */
    const uint16_t *kp[8], *vp[8];
    float *dir;                    /* [KH][D][d] unit topic directions */
    int topic[8];
    int64_t run_left[8];
    rng r;
} world;

static void put_key(world *W, int h, int64_t p, const float *x)
{
    float v[256];
    W->kern.f32_to_f16(x, W->k + ((int64_t)h * W->cap + p) * W->d, W->d);
    for (int i = 0; i < W->d; i++) v[i] = rgauss(&W->r);
    W->kern.f32_to_f16(v, W->v + ((int64_t)h * W->cap + p) * W->d, W->d);
}

/* the next key of head h's current topic run */
static void topic_key(world *W, int h, int64_t p)
{
    if (W->run_left[h]-- <= 0) {
        W->topic[h] = (int)(rnext(&W->r) % (uint64_t)W->D);
        W->run_left[h] = 8 + (int64_t)(rnext(&W->r) % 57);
    }
    const float *c = W->dir + ((int64_t)h * W->D + W->topic[h]) * W->d;
    float x[256], a = 1.5f + 2.5f * (float)runif(&W->r);
    for (int i = 0; i < W->d; i++) x[i] = a * c[i] + 0.2f * rgauss(&W->r);
    put_key(W, h, p, x);
}

static void world_init(world *W, int KH, int g, int d, int64_t cap, int64_t n_far, uint64_t seed)
{
    memset(W, 0, sizeof *W);
    W->KH = KH, W->g = g, W->H = KH * g, W->d = d, W->D = 48, W->cap = cap;
    W->lo = 4, W->hi = 4 + n_far, W->r.s = seed;
    hkv_isa_info info;
    hkv_isa_detect(&info);
    const char *isa = getenv("HKV_TEST_ISA");
    hkv_cpu_kernels_init(&W->kern, isa && hkv_isa_parse(isa) >= 0 ? hkv_isa_parse(isa) : info.best);
    W->k = calloc((size_t)KH * cap * d, 2);
    W->v = calloc((size_t)KH * cap * d, 2);
    W->dir = malloc((size_t)KH * W->D * d * sizeof(float));
    for (int h = 0; h < KH; h++) {
        W->kp[h] = W->k + (int64_t)h * cap * d;
        W->vp[h] = W->v + (int64_t)h * cap * d;
        for (int c = 0; c < W->D; c++) {
            float *x = W->dir + ((int64_t)h * W->D + c) * d;
            double s = 0;
            for (int i = 0; i < d; i++) x[i] = rgauss(&W->r), s += (double)x[i] * x[i];
            for (int i = 0; i < d; i++) x[i] = (float)(x[i] / sqrt(s));
        }
        for (int64_t p = W->lo; p < W->hi; p++) topic_key(W, h, p);
    }
}

static void world_free(world *W) { free(W->k), free(W->v), free(W->dir); }

static hkv_far_view far_of(const world *W)
{
    hkv_far_view f = {.n_head_kv = W->KH, .head_dim = W->d, .lo = W->lo, .hi = W->hi,
                      .k = W->kp, .v = W->vp, .ld = W->d};
    return f;
}

typedef struct pol {
    hkv_policy p;
    hkv_mem_account mem;
    hkv_policy_scratch ws;
    int32_t *out;
} pol;

static int pol_open(pol *P, const world *W, const char *name, const char *const *args, int n_args)
{
    memset(P, 0, sizeof *P);
    const hkv_policy_def *def = hkv_policy_find(name);
    hkv_policy_args a;
    hkv_err err = {0};
    hkv_policy_args_init(def, &a);
    for (int i = 0; i < n_args; i++)
        if (hkv_policy_arg_set(def, &a, args[i], &err)) {
            printf("arg %s: %s\n", args[i], err.msg);
            return -1;
        }
    hkv_policy_env env = {.shape = {1, W->H, W->KH, W->d}, .n_ctx = W->cap, .L_init = (int)W->lo,
                          .L_local = 64, .kern = &W->kern, .mem = &P->mem, .n_threads = 2};
    if (def->create(&P->p, &a, &env, &err)) {
        printf("create: %s\n", err.msg);
        return -1;
    }
    P->p.ops->scratch_need(P->p.self, W->cap, &P->ws.nf, &P->ws.ni);
    P->ws.f = malloc((size_t)P->ws.nf * 4 + 4);
    P->ws.i = malloc((size_t)P->ws.ni * 4 + 4);
    P->out = malloc((size_t)W->cap * 4);
    return 0;
}

static void pol_close(pol *P)
{
    P->p.ops->destroy(P->p.self);
    CHECK(P->mem.bytes[HKV_TIER_INDEX] == 0, "index memory left after destroy: %zu",
          P->mem.bytes[HKV_TIER_INDEX]);
    free(P->ws.f), free(P->ws.i), free(P->out);
}

/* prompt end with window queries q16 ([n][H][d] fp16 at positions pos0..) */
static int prefill(pol *P, const world *W, const uint16_t *q16, int64_t n, int64_t pos0)
{
    hkv_far_view f = far_of(W);
    hkv_query_view qv = {.n = n, .pos0 = pos0, .q = q16, .ld = (int64_t)W->H * W->d};
    hkv_err err = {0};
    int rc = P->p.ops->prefill_end(P->p.self, 0, &f, &qv, &err);
    CHECK(rc == 0, "prefill_end: %s", err.msg);
    return rc;
}

/* ---- float64 references ------------------------------------------------------------ */

/* Window queries [n][H][d] fp16: head j leans on topic top[j] with noise. */
static uint16_t *make_window(world *W, int64_t n, const int *top, float amp)
{
    const int64_t row = (int64_t)W->H * W->d;
    float *q = malloc((size_t)(n * row) * 4);
    uint16_t *q16 = malloc((size_t)(n * row) * 2);
    for (int64_t r = 0; r < n; r++)
        for (int j = 0; j < W->H; j++) {
            const float *c = W->dir + ((int64_t)(j / W->g) * W->D + top[j]) * W->d;
            for (int i = 0; i < W->d; i++)
                q[r * row + (int64_t)j * W->d + i] = amp * (c[i] + 0.5f * rgauss(&W->r) / sqrtf((float)W->d));
        }
    W->kern.f32_to_f16(q, q16, n * row);
    free(q);
    return q16;
}

/* Window score of head h over rows[0..n) (positions ascending), in double. */
static void ref_scores(const world *W, int h, const uint16_t *q16, int64_t nq, int64_t pos0,
                       const int32_t *rows, int64_t n, double *out)
{
    const int d = W->d;
    double *l = malloc((size_t)(n > 0 ? n : 1) * sizeof *l);
    for (int64_t x = 0; x < n; x++) out[x] = 0;
    for (int64_t r = 0; r < nq; r++)
        for (int j = 0; j < W->g; j++) {
            const uint16_t *qr = q16 + (r * W->H + (int64_t)h * W->g + j) * d;
            double m = -INFINITY, sum = 0;
            int64_t nv = 0;
            while (nv < n && rows[nv] <= pos0 + r) nv++;
            for (int64_t x = 0; x < nv; x++) {
                double s = 0;
                for (int e = 0; e < d; e++) s += h2d(qr[e]) * h2d(W->kp[h][(int64_t)rows[x] * d + e]);
                l[x] = s / sqrt((double)d);
                m = l[x] > m ? l[x] : m;
            }
            for (int64_t x = 0; x < nv; x++) sum += exp(l[x] - m);
            for (int64_t x = 0; x < nv; x++) out[x] += exp(l[x] - m) / sum;
        }
    free(l);
}

static void ref_pool(double *s, int64_t n, int kernel, int avg)
{
    double *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    for (int64_t i = 0; i < n; i++) {
        double v = avg ? 0 : -INFINITY;
        for (int64_t x = i - kernel / 2; x <= i + kernel / 2; x++) {
            if (x < 0 || x >= n) continue;
            v = avg ? v + s[x] : (s[x] > v ? s[x] : v);
        }
        t[i] = avg ? v / kernel : v;
    }
    memcpy(s, t, (size_t)n * sizeof *s);
    free(t);
}

typedef struct sx { double s; int64_t i; } sx;
static int cmp_sx(const void *a, const void *b)
{
    const sx *x = a, *y = b;
    if (x->s != y->s) return x->s < y->s ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}

/* mark[p] = 1 for the k best rows (rows >= force_from first; ties: lower index) */
static void ref_top(const double *s, const int32_t *rows, int64_t n, int64_t k, int64_t force_from,
                    uint8_t *mark)
{
    sx *a = malloc((size_t)(n > 0 ? n : 1) * sizeof *a);
    for (int64_t i = 0; i < n; i++) a[i] = (sx){rows[i] >= force_from ? INFINITY : s[i], i};
    qsort(a, (size_t)n, sizeof *a, cmp_sx);
    for (int64_t i = 0; i < k && i < n; i++) mark[rows[a[i].i]] = 1;
    free(a);
}
#pragma GCC diagnostic pop

#endif

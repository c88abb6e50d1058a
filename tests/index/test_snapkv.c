/* The snapkv policy and the window-score pieces on structured synthetic far
 * tiers (d 64 and 128, g 1/3/4).
 *
 * World: per KV head, keys in topic runs (as in test_quest.c); the window's
 * queries lean on one topic per query head and a few needle keys align with
 * them. Checked against a float64 brute force of the same pipeline (softmax
 * over the far keys each window query sees, summed over the window and the
 * group, max pooling, top budget): the window scores themselves (also with
 * the causal mask and over row subsets), pooling (max and avg) against a
 * naive loop, the kept set, the budget per KV head, the needles, every far
 * token after prompt end returned, eviction only once across turns, window
 * tokens inside the far tier kept, and the edges. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "window_scores.h"

static int n_fail;
#define CHECK(c, ...)                                                \
    do {                                                             \
        if (!(c)) {                                                  \
            n_fail++;                                                \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);              \
            printf(__VA_ARGS__);                                     \
            printf("\n");                                            \
        }                                                            \
    } while (0)

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
    hkv_far_view f = {W->KH, W->d, W->lo, W->hi, W->kp, W->vp, W->d};
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

/* ---- pieces: window scores, pooling ------------------------------------------------- */

static void test_window_scores(int d, int g)
{
    world W;
    world_init(&W, 2, g, d, 2048, 700, 300 + d + g);
    int top[16];
    for (int j = 0; j < W.H; j++) top[j] = (int)(rnext(&W.r) % (uint64_t)W.D);
    /* 40 window rows starting 20 before the far tier ends: the causal mask matters */
    const int64_t nq = 40, pos0 = W.hi - 20, n = W.hi - W.lo;
    uint16_t *q16 = make_window(&W, nq, top, 3.0f);
    hkv_far_view f = far_of(&W);
    hkv_query_view qv = {.n = nq, .pos0 = pos0, .q = q16, .ld = (int64_t)W.H * d};
    float *out = malloc((size_t)W.KH * n * 4);
    double *ref = malloc((size_t)n * sizeof *ref);
    int32_t *rows = malloc((size_t)W.KH * n * 4);
    int64_t nr[8];
    const int32_t *rp[8];
    hkv_mem_account mem = {0};
    hkv_err err = {0};
    for (int sub = 0; sub < 2; sub++) {   /* all of [lo, hi), then every third row from h */
        for (int h = 0; h < W.KH; h++) {
            nr[h] = 0;
            for (int64_t p = W.lo + (sub ? h : 0); p < W.hi; p += sub ? 3 : 1)
                rows[h * n + nr[h]++] = (int32_t)p;
            rp[h] = rows + h * n;
        }
        hkv_ws_job job = {.far = &f, .qv = &qv, .n_head = W.H, .rows = sub ? rp : NULL,
                          .n_rows = sub ? nr : NULL, .out = out, .ld_out = n, .n_threads = 2};
        for (int64_t i = 0; i < W.KH * n; i++) out[i] = NAN;   /* poisoned */
        CHECK(hkv_ws_window_scores(&W.kern, &job, &mem, &err) == 0, "window scores: %s", err.msg);
        double worst = 0, mass = 0;
        for (int h = 0; h < W.KH; h++) {
            ref_scores(&W, h, q16, nq, pos0, rp[h], nr[h], ref);
            for (int64_t x = 0; x < nr[h]; x++) {
                double e = fabs(out[h * n + x] - ref[x]) / (1e-3 + ref[x]);
                worst = e > worst || isnan(e) ? e : worst;
                mass += ref[x];
            }
        }
        /* every window row's weights sum to 1 over what it sees: total mass = rows * heads */
        printf("window scores d=%3d g=%d %s: max rel error %.2e, mass %.3f (want %d)\n", d, g,
               sub ? "row subset" : "far tier  ", worst, mass, (int)(nq * W.H));
        CHECK(worst < 1e-4, "window scores d=%d g=%d: rel error %.2e", d, g, worst);
        CHECK(fabs(mass - (double)(nq * W.H)) < 1e-6 * nq * W.H, "mass %.6f", mass);
    }
    CHECK(mem.bytes[HKV_TIER_WORKSPACE] == 0 && mem.peak[HKV_TIER_WORKSPACE] > 0, "workspace");
    free(q16), free(out), free(ref), free(rows);
    world_free(&W);
}

static void test_pool(void)
{
    rng r = {5};
    const int64_t ns[] = {1, 5, 100, 1001};
    const int ks[] = {1, 3, 7, 63};
    int64_t bad = 0;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int avg = 0; avg < 2; avg++) {
                const int64_t n = ns[a];
                float *s = malloc((size_t)n * 4), *tmp = malloc((size_t)n * 8);
                double *ref = malloc((size_t)n * 8);
                for (int64_t i = 0; i < n; i++) ref[i] = s[i] = (float)runif(&r);
                hkv_ws_pool(s, n, ks[b], avg, tmp);
                ref_pool(ref, n, ks[b], avg);
                for (int64_t i = 0; i < n; i++) bad += fabs(s[i] - ref[i]) > (avg ? 1e-6 : 0);
                free(s), free(tmp), free(ref);
            }
    printf("pooling: max and avg, kernels 1/3/7/63, n 1..1001 against a naive loop: %lld off\n",
           (long long)bad);
    CHECK(bad == 0, "pooling: %lld values off", (long long)bad);
}

/* ---- the policy ------------------------------------------------------------------------ */

/* Prompt end over a far tier of n_far, window of 32 ending L_local after it
 * (or overlapping it when overlap > 0); returns the window's start. */
static void test_policy(int d, int g, int64_t overlap)
{
    world W;
    world_init(&W, 2, g, d, 8192, 3000, 500 + d * 5 + g + overlap);
    const int64_t budget = 200, nq = 32, pos0 = overlap ? W.hi - overlap : W.hi + 64 - nq;
    int top[16];
    for (int j = 0; j < W.H; j++) top[j] = (int)(rnext(&W.r) % (uint64_t)W.D);
    uint16_t *q16 = make_window(&W, nq, top, 3.0f);
    /* needles: 4 per KV head along the last window query's head (h, i % g), early in the tier */
    int64_t needle[8][4];
    for (int h = 0; h < W.KH; h++)
        for (int i = 0; i < 4; i++) {
            const uint16_t *qr = q16 + ((nq - 1) * W.H + (int64_t)h * g + i % g) * d;
            float x[256];
            for (int e = 0; e < d; e++) x[e] = (float)(3.0 * h2d(qr[e]));   /* q.k ~ 3|q|^2: a clear winner */
            needle[h][i] = W.lo + 50 + i * 600 + (int64_t)(rnext(&W.r) % 100);
            put_key(&W, h, needle[h][i], x);
        }
    pol P;
    char a0[32];
    snprintf(a0, sizeof a0, "budget=%lld", (long long)budget);
    const char *args[] = {a0};
    if (pol_open(&P, &W, "snapkv", args, 1)) {
        CHECK(0, "open");
        return;
    }
    const int64_t n = W.hi - W.lo, evict_hi = W.hi;
    prefill(&P, &W, q16, nq, pos0);
    /* the reference kept set: scores, group sum (in the score), max pool 7, top budget */
    int32_t *rows = malloc((size_t)n * 4);
    double *ref = malloc((size_t)n * 8);
    uint8_t *mark = calloc((size_t)W.cap, 1), *got = calloc((size_t)W.cap, 1);
    for (int64_t i = 0; i < n; i++) rows[i] = (int32_t)(W.lo + i);
    int64_t agree = 0, nneedle = 0, nwin = 0, win_kept = 0;
    hkv_far_view f = far_of(&W);
    for (int h = 0; h < W.KH; h++) {
        ref_scores(&W, h, q16, nq, pos0, rows, n, ref);
        ref_pool(ref, n, 7, 0);
        memset(mark, 0, (size_t)W.cap);
        ref_top(ref, rows, n, budget, pos0, mark);
        int64_t m = P.p.ops->select(P.p.self, 0, h, NULL, &f, P.out, &P.ws);
        CHECK(m == budget, "d=%d g=%d head %d: %lld kept, budget %lld", d, g, h, (long long)m,
              (long long)budget);
        for (int64_t i = 0; i < m; i++) {
            CHECK(P.out[i] >= W.lo && P.out[i] < W.hi && !got[P.out[i]], "bad or repeated %d", P.out[i]);
            got[P.out[i]] = 1;
            agree += mark[P.out[i]];
        }
        for (int i = 0; i < 4; i++) nneedle += got[needle[h][i]];
        for (int64_t p = pos0; p < W.hi; p++) nwin++, win_kept += got[p];
        memset(got, 0, (size_t)W.cap);
    }
    const double ov = (double)agree / (double)(budget * W.KH);
    printf("snapkv d=%3d g=%d%s: kept vs float64 reference %.4f, needles %lld/%d, window tokens in "
           "the far tier kept %lld/%lld\n", d, g, overlap ? " (window overlaps the far tier)" : "",
           ov, (long long)nneedle, 4 * W.KH, (long long)win_kept, (long long)nwin);
    CHECK(ov >= 0.99, "d=%d g=%d: kept set overlap with the reference %.4f", d, g, ov);
    CHECK(nneedle == 4 * W.KH, "needles kept %lld of %d", (long long)nneedle, 4 * W.KH);
    CHECK(win_kept == nwin, "window tokens in the far tier kept %lld of %lld", (long long)win_kept,
          (long long)nwin);
    /* decode spill: every new far token is selected, the kept set unchanged */
    int32_t *kept0 = malloc((size_t)budget * 4);
    f = far_of(&W);
    P.p.ops->select(P.p.self, 0, 1, NULL, &f, kept0, &P.ws);
    for (int t = 0; t < 10; t++, W.hi++) {
        for (int h = 0; h < W.KH; h++) topic_key(&W, h, W.hi);
        f = far_of(&W);
        f.hi++;
        P.p.ops->on_far_append(P.p.self, 0, &f);
    }
    /* a second turn: 100 more far tokens and a different window; SnapKV keeps its first choice */
    W.hi += 100;
    for (int h = 0; h < W.KH; h++)
        for (int64_t p = W.hi - 100; p < W.hi; p++) topic_key(&W, h, p);
    for (int j = 0; j < W.H; j++) top[j] = (top[j] + 1) % W.D;
    uint16_t *q2 = make_window(&W, nq, top, 3.0f);
    prefill(&P, &W, q2, nq, W.hi + 64 - nq);
    f = far_of(&W);
    int64_t m = P.p.ops->select(P.p.self, 0, 1, NULL, &f, P.out, &P.ws);
    int64_t ms = P.p.ops->max_select(P.p.self, W.hi - W.lo);
    CHECK(m == budget + (W.hi - evict_hi) && m <= ms, "after spill and a second turn: %lld selected "
          "(want %lld, max_select %lld)", (long long)m, (long long)(budget + W.hi - evict_hi),
          (long long)ms);
    for (int64_t i = 0; i < m; i++) got[P.out[i]] = 1;
    int64_t same = 0, post = 0;
    for (int64_t i = 0; i < budget; i++) same += got[kept0[i]];
    for (int64_t p = evict_hi; p < W.hi; p++) post += got[p];
    CHECK(same == budget && post == W.hi - evict_hi, "second turn: %lld of the first kept set, %lld "
          "of %lld newer tokens", (long long)same, (long long)post, (long long)(W.hi - evict_hi));
    free(kept0), free(q2), free(q16), free(rows), free(ref), free(mark), free(got);
    pol_close(&P);
    world_free(&W);
}

static void test_edges(void)
{
    world W;
    world_init(&W, 2, 4, 64, 2048, 150, 91);
    int top[8] = {0};
    uint16_t *q16 = make_window(&W, 8, top, 3.0f);
    pol P;
    const char *args[] = {"budget=200", "pool=1"};
    if (pol_open(&P, &W, "snapkv", args, 2)) {
        CHECK(0, "open");
        return;
    }
    /* within the budget: everything; without a window: the most recent budget */
    CHECK(P.p.ops->max_select(P.p.self, 150) == 150, "max_select before the prompt end");
    prefill(&P, &W, q16, 8, W.hi + 10);
    hkv_far_view f = far_of(&W);
    CHECK(P.p.ops->select(P.p.self, 0, 0, NULL, &f, P.out, &P.ws) == 150, "150 far tokens, budget 200");
    pol_close(&P);
    const char *a1[] = {"budget=50"};
    pol_open(&P, &W, "snapkv", a1, 1);
    prefill(&P, &W, NULL, 0, 0);
    int64_t m = P.p.ops->select(P.p.self, 0, 1, NULL, &f, P.out, &P.ws), recent = 0;
    for (int64_t i = 0; i < m; i++) recent += P.out[i] >= W.hi - 50;
    CHECK(m == 50 && recent == 50, "no window: %lld selected, %lld recent", (long long)m, (long long)recent);
    /* the cache may keep more queries than the window: only the last `window` count */
    pol_close(&P);
    const char *a2[] = {"budget=20", "window=4", "kernel=1"};
    pol_open(&P, &W, "snapkv", a2, 3);
    const hkv_policy_def *def = hkv_policy_find("snapkv");
    hkv_policy_args pa;
    hkv_policy_args_init(def, &pa);
    hkv_err err = {0};
    hkv_policy_arg_set(def, &pa, "window=4", &err);
    CHECK(def->queries_wanted(&pa, NULL) == 4, "queries_wanted");
    /* 12 rows: 8 leaning on topic 1, then the 4 that count, on topic 2 */
    int t1[8], t2[8];
    for (int j = 0; j < 8; j++) t1[j] = 1, t2[j] = 2;
    uint16_t *qa = make_window(&W, 8, t1, 4.0f), *qb = make_window(&W, 4, t2, 4.0f);
    const int64_t row = (int64_t)W.H * W.d;
    uint16_t *q12 = malloc((size_t)(12 * row) * 2);
    memcpy(q12, qa, (size_t)(8 * row) * 2);
    memcpy(q12 + 8 * row, qb, (size_t)(4 * row) * 2);
    prefill(&P, &W, q12, 12, W.hi + 20);
    int32_t rws[150];
    double ref[150];
    uint8_t mark[2048] = {0};
    for (int i = 0; i < 150; i++) rws[i] = (int32_t)(W.lo + i);
    ref_scores(&W, 0, qb, 4, W.hi + 28, rws, 150, ref);
    ref_top(ref, rws, 150, 20, INT64_MAX, mark);
    m = P.p.ops->select(P.p.self, 0, 0, NULL, &f, P.out, &P.ws);
    int64_t agree = 0;
    for (int64_t i = 0; i < m; i++) agree += mark[P.out[i]];
    CHECK(m == 20 && agree >= 19, "window=4 of 12 rows: %lld of %lld agree", (long long)agree, (long long)m);
    pol_close(&P);
    /* parameters */
    hkv_policy pl;
    hkv_mem_account mem = {0};
    hkv_policy_env env = {.shape = {1, W.H, W.KH, W.d}, .n_ctx = 2048, .L_init = 4, .L_local = 64,
                          .kern = &W.kern, .mem = &mem, .n_threads = 1};
    hkv_policy_args_init(def, &pa);
    CHECK(hkv_policy_arg_set(def, &pa, "kernel=6", &err) == 0 &&
          def->create(&pl, &pa, &env, &err) == HKV_E_RANGE, "an even kernel accepted");
    CHECK(hkv_policy_arg_set(def, &pa, "pool=2", &err) == HKV_E_RANGE, "pool=2 accepted");
    CHECK(def->kind == HKV_POLICY_EVICTION, "snapkv is an eviction policy");
    free(q16), free(qa), free(qb), free(q12);
    world_free(&W);
}

int main(void)
{
    test_pool();
    const int dims[] = {64, 128}, gs[] = {1, 3, 4};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            test_window_scores(dims[a], gs[b]);
            test_policy(dims[a], gs[b], 0);
        }
    test_policy(64, 4, 12);    /* a local ring shorter than the window */
    test_policy(128, 3, 12);
    test_edges();
    printf(n_fail ? "%d FAILED\n" : "all passed\n", n_fail);
    return n_fail ? 1 : 0;
}

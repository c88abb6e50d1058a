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

#include "policy_world.h"


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
    printf(fails ? "%d FAILED\n" : "all passed\n", fails);
    return fails ? 1 : 0;
}

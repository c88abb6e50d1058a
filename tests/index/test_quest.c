/* The quest policy on structured synthetic far tiers (d 64 and 128, g 1/3/4).
 *
 * World: per KV head, keys come in runs of 8..64 positions drawn around one
 * of 48 random directions (topics, so pages are coherent as in real text),
 * with random scale. Checked: page bounds equal the brute-force element-wise
 * min/max after the prompt end, after decode appends and after a second
 * turn's jump; each page's bound >= the true max score of its keys (double);
 * select returns exactly the top pages by that bound (computed in double
 * from the checked bounds) within the budget; a strongly aligned needle key's
 * page is selected; recall of the oracle's top-k against a random pick; edge
 * cases (empty far tier, a far tier within the budget, budget rounding,
 * parameter checks). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "policy_world.h"

/* a query [H][d] leaning towards a topic of each head, fp32 */
static void make_query(world *W, float *q, float lean)
{
    for (int j = 0; j < W->H; j++) {
        const float *c = W->dir + ((int64_t)(j / W->g) * W->D + (int64_t)(rnext(&W->r) % W->D)) * W->d;
        for (int i = 0; i < W->d; i++)
            q[(int64_t)j * W->d + i] = lean * c[i] + rgauss(&W->r) / sqrtf((float)W->d);
    }
}

static double dot_hd(const float *q, const uint16_t *k, int d)
{
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)q[i] * h2d(k[i]);
    return s;
}

/* ---- bounds ------------------------------------------------------------------------ */

/* Every page's stored bounds against brute force over its keys. */
static int64_t check_bounds(const pol *P, const world *W, int64_t psz, const char *when)
{
    int64_t bad = 0, np = 0;
    const uint16_t *row;
    hkv_quest_page_bounds(&P->p, 0, 0, 0, &row, &np);
    CHECK(np == (W->hi - W->lo + psz - 1) / psz, "%s: %lld pages for %lld tokens", when,
          (long long)np, (long long)(W->hi - W->lo));
    for (int h = 0; h < W->KH; h++)
        for (int64_t pg = 0; pg < np; pg++) {
            if (hkv_quest_page_bounds(&P->p, 0, h, pg, &row, NULL)) {
                bad++;
                continue;
            }
            for (int e = 0; e < W->d; e++) {
                double mx = -INFINITY, mn = INFINITY;
                for (int64_t p = W->lo + pg * psz; p < W->lo + (pg + 1) * psz && p < W->hi; p++) {
                    double x = h2d(W->kp[h][p * W->d + e]);
                    mx = x > mx ? x : mx;
                    mn = x < mn ? x : mn;
                }
                bad += h2d(row[e]) != mx || h2d(row[W->d + e]) != mn;
            }
        }
    CHECK(bad == 0, "%s: %lld bound elements differ from brute force", when, (long long)bad);
    return np;
}

static void test_bounds(int d, int g)
{
    world W;
    world_init(&W, 2, g, d, 4096, 1000, 1000 + d + g);   /* 1000 = 62 pages + 8 */
    pol P;
    const char *arg = "budget=128";
    if (pol_open(&P, &W, "quest", &arg, 1)) {
        CHECK(0, "open");
        return;
    }
    prefill(&P, &W, NULL, 0, 0);
    check_bounds(&P, &W, 16, "prompt end");
    for (int step = 0; step < 37; step++) {   /* decode spill, one token at a time */
        for (int h = 0; h < W.KH; h++) topic_key(&W, h, W.hi);
        W.hi++;
        hkv_far_view f = far_of(&W);
        P.p.ops->on_far_append(P.p.self, 0, &f);
        if (step % 9 == 0 || step == 36) check_bounds(&P, &W, 16, "after on_far_append");
    }
    for (int i = 0; i < 301; i++, W.hi++)   /* a second turn: many tokens at once */
        for (int h = 0; h < W.KH; h++) topic_key(&W, h, W.hi);
    prefill(&P, &W, NULL, 0, 0);
    int64_t np = check_bounds(&P, &W, 16, "second prompt end");
    printf("bounds d=%d g=%d: %lld pages exact after prompt end, 37 appends and a second turn\n", d,
           g, (long long)np);
    pol_close(&P);
    world_free(&W);
}

/* ---- the bound, the selection, needles, recall --------------------------------------- */

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void test_select(int d, int g)
{
    world W;
    world_init(&W, 2, g, d, 8192, 6000, 2000 + d * 3 + g);
    const int64_t budget = 256, psz = 16, K = budget / psz;
    const int64_t n = W.hi - W.lo, np = (n + psz - 1) / psz;
    /* needles: a key along head (h, j)'s query at a random position */
    float *q = malloc((size_t)W.H * d * 4);
    make_query(&W, q, 1.2f);
    int64_t needle[8];
    for (int h = 0; h < W.KH; h++) {
        const float *qj = q + ((int64_t)h * g + h % g) * d;
        double s = 0;
        for (int e = 0; e < d; e++) s += (double)qj[e] * qj[e];
        float x[256];
        for (int e = 0; e < d; e++) x[e] = (float)(10.0 * qj[e] / sqrt(s));
        needle[h] = W.lo + (int64_t)(rnext(&W.r) % (uint64_t)n);
        put_key(&W, h, needle[h], x);
    }
    pol P;
    const char *arg = "budget=256";
    if (pol_open(&P, &W, "quest", &arg, 1)) {
        CHECK(0, "open");
        return;
    }
    prefill(&P, &W, NULL, 0, 0);
    double *bound = malloc((size_t)np * sizeof *bound), *sorted = malloc((size_t)np * sizeof *sorted);
    uint8_t *sel = calloc((size_t)W.cap, 1);
    double *tok = malloc((size_t)n * sizeof *tok);
    int64_t viol = 0, badsel = 0, nsteps = 0, hits = 0, tot = 0, needles = 0;
    double rec_sum = 0, rand_sum = 0;
    for (int step = 0; step < 8; step++) {
        if (step) make_query(&W, q, 1.2f);
        for (int h = 0; h < W.KH; h++) {
            const float *qh = q + (int64_t)h * g * d;
            /* bounds from the stored min/max, in double; true max per page */
            for (int64_t pg = 0; pg < np; pg++) {
                const uint16_t *row;
                hkv_quest_page_bounds(&P.p, 0, h, pg, &row, NULL);
                double b = -INFINITY, t = -INFINITY;
                for (int j = 0; j < g; j++) {
                    double s = 0;
                    for (int e = 0; e < d; e++) {
                        double x = qh[j * d + e], hi = x * h2d(row[e]), lo = x * h2d(row[d + e]);
                        s += hi > lo ? hi : lo;
                    }
                    b = s > b ? s : b;
                    for (int64_t p = W.lo + pg * psz; p < W.lo + (pg + 1) * psz && p < W.hi; p++) {
                        double v = dot_hd(qh + j * d, W.kp[h] + p * d, d);
                        t = v > t ? v : t;
                    }
                }
                bound[pg] = sorted[pg] = b;
                viol += b < t - 1e-9 * (1 + fabs(t));
            }
            qsort(sorted, (size_t)np, sizeof *sorted, cmp_desc);
            hkv_far_view f = far_of(&W);
            int64_t m = P.p.ops->select(P.p.self, 0, h, qh, &f, P.out, &P.ws);
            CHECK(m == K * psz, "select returned %lld, budget %lld", (long long)m, (long long)(K * psz));
            int64_t dup = 0, out_range = 0;
            for (int64_t i = 0; i < m; i++) {
                if (P.out[i] < W.lo || P.out[i] >= W.hi) out_range++;
                else dup += sel[P.out[i]]++;
            }
            CHECK(!dup && !out_range, "%lld duplicates, %lld outside the far tier", (long long)dup,
                  (long long)out_range);
            /* each chosen page is whole and ranks in the top K by the double bound
             * (a relative slack of 1e-5 for fp32 dot products at near ties) */
            for (int64_t pg = 0; pg < np; pg++) {
                int64_t a = W.lo + pg * psz, cnt = 0;
                for (int64_t p = a; p < a + psz && p < W.hi; p++) cnt += sel[p];
                if (cnt && (cnt != psz || bound[pg] < sorted[K - 1] - 1e-5 * (1 + fabs(sorted[K - 1]))))
                    badsel++;
            }
            if (step == 0) needles += sel[needle[h]] != 0;   /* the needles follow query 0 */
            /* recall of the oracle's top-`budget` tokens (max over the group, double) */
            for (int64_t x = 0; x < n; x++) {
                double best = -INFINITY;
                for (int j = 0; j < g; j++) {
                    double v = dot_hd(qh + j * d, W.kp[h] + (W.lo + x) * d, d);
                    best = v > best ? v : best;
                }
                tok[x] = best;
            }
            double *ts = malloc((size_t)n * sizeof *ts);
            memcpy(ts, tok, (size_t)n * sizeof *ts);
            qsort(ts, (size_t)n, sizeof *ts, cmp_desc);
            int64_t hit = 0;
            for (int64_t x = 0; x < n; x++) hit += tok[x] >= ts[budget - 1] && sel[W.lo + x];
            free(ts);
            rec_sum += (double)hit / budget, rand_sum += (double)m / n;
            hits += hit, tot += budget;
            for (int64_t i = 0; i < m; i++)
                if (P.out[i] >= W.lo && P.out[i] < W.hi) sel[P.out[i]] = 0;
            nsteps++;
        }
    }
    const double rec = rec_sum / nsteps;
    printf("select d=%3d g=%d: bound >= page max everywhere (%lld violations), top-%lld pages "
           "(%lld off), needles %lld/%d, recall %.3f (random %.3f)\n", d, g, (long long)viol,
           (long long)K, (long long)badsel, (long long)needles, W.KH, rec, rand_sum / nsteps);
    CHECK(viol == 0, "d=%d g=%d: %lld pages whose bound is below their true max", d, g, (long long)viol);
    CHECK(badsel == 0, "d=%d g=%d: %lld selected pages not in the top %lld by bound", d, g,
          (long long)badsel, (long long)K);
    CHECK(needles == W.KH, "d=%d g=%d: needle page selected for %lld of %d KV heads", d, g,
          (long long)needles, W.KH);
    /* topic runs make pages coherent, so the bound ranks them far above chance:
     * measured 0.50-0.61 over the six shapes, random is budget/n = 0.043; 0.4 is
     * ten times chance with room for other kernels' rounding at near ties */
    CHECK(rec >= 0.4, "d=%d g=%d: recall %.3f", d, g, rec);
    free(bound), free(sorted), free(sel), free(tok), free(q);
    pol_close(&P);
    world_free(&W);
}

/* ---- edges ---------------------------------------------------------------------------- */

static void test_edges(void)
{
    world W;
    world_init(&W, 2, 3, 64, 2048, 0, 77);
    pol P;
    const char *args[] = {"budget=40", "page=16"};   /* rounds down to 2 pages */
    if (pol_open(&P, &W, "quest", args, 2)) {
        CHECK(0, "open");
        return;
    }
    prefill(&P, &W, NULL, 0, 0);
    float q[3 * 2 * 64];
    make_query(&W, q, 1.0f);
    hkv_far_view f = far_of(&W);
    CHECK(P.p.ops->select(P.p.self, 0, 1, q + 3 * 64, &f, P.out, &P.ws) == 0, "empty far tier");
    CHECK(P.p.ops->max_select(P.p.self, 1000) == 32, "max_select %lld, want 32 (2 pages)",
          (long long)P.p.ops->max_select(P.p.self, 1000));
    for (int i = 0; i < 30; i++, W.hi++) {   /* within the budget: everything */
        for (int h = 0; h < 2; h++) topic_key(&W, h, W.hi);
        f = far_of(&W);
        f.hi = W.hi + 1;
        P.p.ops->on_far_append(P.p.self, 0, &f);
    }
    f = far_of(&W);
    int64_t m = P.p.ops->select(P.p.self, 0, 0, q, &f, P.out, &P.ws);
    CHECK(m == 30, "30 far tokens, budget 32: %lld selected", (long long)m);
    for (int i = 0; i < 50; i++, W.hi++) {
        for (int h = 0; h < 2; h++) topic_key(&W, h, W.hi);
        f = far_of(&W);
        f.hi = W.hi + 1;
        P.p.ops->on_far_append(P.p.self, 0, &f);
    }
    f = far_of(&W);
    m = P.p.ops->select(P.p.self, 0, 0, q, &f, P.out, &P.ws);
    CHECK(m == 32, "80 far tokens, 2 pages of 16: %lld selected", (long long)m);
    /* tokens the pages never saw are an error, not a silent miss */
    f.hi += 20;
    CHECK(P.p.ops->select(P.p.self, 0, 0, q, &f, P.out, &P.ws) == HKV_E_INVAL, "unindexed tokens");
    hkv_policy_scratch tiny = P.ws;
    tiny.nf = 1;
    f = far_of(&W);
    CHECK(P.p.ops->select(P.p.self, 0, 0, q, &f, P.out, &tiny) == HKV_E_INVAL, "small scratch");
    hkv_err err = {0};
    CHECK(P.p.ops->prefill_end(P.p.self, 3, &f, NULL, &err) == HKV_E_INVAL, "layer 3 accepted");
    char desc[256];
    P.p.ops->describe(P.p.self, desc, sizeof desc);
    printf("edges: %s\n", desc);
    pol_close(&P);
    /* parameters: ranges, integers, the derived default budget */
    const hkv_policy_def *def = hkv_policy_find("quest");
    hkv_policy_args a;
    hkv_policy_args_init(def, &a);
    CHECK(def && hkv_policy_arg_set(def, &a, "page=0", &err) == HKV_E_RANGE, "page=0 accepted");
    CHECK(hkv_policy_arg_set(def, &a, "budget=1.5", &err) == HKV_E_INVAL, "budget=1.5 accepted");
    CHECK(hkv_policy_default_budget(8192) == 256 && hkv_policy_default_budget(100) == 32 &&
          hkv_policy_default_budget(1 << 20) == 1024, "default budget rule");
    world_free(&W);
}

int main(void)
{
    const int dims[] = {64, 128}, gs[] = {1, 3, 4};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            test_bounds(dims[a], gs[b]);
            test_select(dims[a], gs[b]);
        }
    test_edges();
    printf(fails ? "%d FAILED\n" : "all passed\n", fails);
    return fails ? 1 : 0;
}

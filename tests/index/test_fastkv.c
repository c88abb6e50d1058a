/* The fastkv policy on structured synthetic prompts (tests/index/policy_world.h),
 * against a float64 brute force of FastKV's pipeline:
 *   kept set  : window attention with the exact softmax over every key each
 *               window query sees (sinks and local window included), summed
 *               over the window and the KV group, avg-pooled (kernel 7, zero
 *               padding counted) along the prompt, top `budget` far tokens
 *               per KV head;
 *   TSP set   : the pooled group scores summed over the KV heads (all
 *               heads), the sinks and the last max(L_local, window)
 *               positions forced, top tsp_len, ascending;
 *   propagated layer: the same keep among the listed positions only (the
 *               others are poisoned with NaN keys: reading one fails);
 * plus select (kept set + far tokens after the prompt end), the parameter
 * errors, and memory returned. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "window_scores.h"

#include "policy_world.h"

#define L_LOCAL 64

static int fk_open(pol *P, const world *W, int n_layer, const char *const *args, int n_args,
                   hkv_err *err)
{
    memset(P, 0, sizeof *P);
    const hkv_policy_def *def = hkv_policy_find("fastkv");
    hkv_policy_args a;
    hkv_policy_args_init(def, &a);
    for (int i = 0; i < n_args; i++)
        if (hkv_policy_arg_set(def, &a, args[i], err)) return -1;
    hkv_policy_env env = {.shape = {n_layer, W->H, W->KH, W->d}, .n_ctx = W->cap,
                          .L_init = (int)W->lo, .L_local = L_LOCAL, .kern = &W->kern,
                          .mem = &P->mem, .n_threads = 2};
    if (def->create(&P->p, &a, &env, err)) return -1;
    P->ws.f = malloc(4);
    P->ws.i = malloc(4);
    P->out = malloc((size_t)W->cap * 4);
    return 0;
}

/* Pooled exact window scores of KV head h over rows[0..n), in double. */
static void ref_pooled(const world *W, int h, const uint16_t *q16, int64_t nq, int64_t pos0,
                       const int32_t *rows, int64_t n, double *out)
{
    ref_scores(W, h, q16, nq, pos0, rows, n, out);
    ref_pool(out, n, 7, 1);
}

/* sel[0..m) (ascending positions) must be the k best of the candidates
 * rows[0..n) by s (forced ones first), up to float ties. */
static void check_top(const char *what, const int32_t *sel, int64_t m, const int32_t *rows,
                      const double *s, int64_t n, int64_t k, const uint8_t *forced)
{
    uint8_t *in = calloc(65536, 1);
    double worst_in = INFINITY, best_out = -INFINITY;
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++) {
        if (i && sel[i] <= sel[i - 1]) bad++;
        in[sel[i]] = 1;
    }
    for (int64_t i = 0; i < n; i++) {
        int p = rows[i];
        int f = forced && forced[p];
        if (in[p] && !f && s[i] < worst_in) worst_in = s[i];
        if (!in[p] && f) bad++;
        if (!in[p] && s[i] > best_out) best_out = s[i];
        in[p] = in[p] ? 2 : 0;
    }
    for (int64_t i = 0; i < m; i++) bad += in[sel[i]] != 2;   /* selected a non-candidate */
    CHECK(m == (k < n ? k : n), "%s: %lld selected, want %lld", what, (long long)m,
          (long long)(k < n ? k : n));
    CHECK(bad == 0, "%s: %lld selected out of order, outside the candidates, or forced ones missing",
          what, (long long)bad);
    CHECK(best_out <= worst_in * (1 + 1e-4) + 1e-9,
          "%s: a dropped token scores %.9g, above a kept one (%.9g)", what, best_out, worst_in);
    free(in);
}

static void test_fastkv(int d, int g, int64_t budget, int64_t tsp_len, uint64_t seed)
{
    world W;
    world_init(&W, 2, g, d, 4096, 1500, seed);
    const int64_t end = W.hi + L_LOCAL, nq = 8, pos0 = end - nq;
    for (int h = 0; h < W.KH; h++) {   /* the prompt's near positions have keys too */
        for (int64_t p = 0; p < W.lo; p++) topic_key(&W, h, p);
        for (int64_t p = W.hi; p < end; p++) topic_key(&W, h, p);
    }
    int top[16];
    for (int j = 0; j < W.H; j++) top[j] = (int)(rnext(&W.r) % (uint64_t)W.D);
    uint16_t *q16 = make_window(&W, nq, top, 3.0f);
    char a0[64], a1[64];
    snprintf(a0, sizeof a0, "budget=%lld", (long long)budget);
    snprintf(a1, sizeof a1, "tsp_len=%lld", (long long)tsp_len);
    const char *args[] = {a0, a1, "tsp_layer=0"};
    pol P;
    hkv_err err = {0};
    if (fk_open(&P, &W, 2, args, 3, &err)) {
        CHECK(0, "open: %s", err.msg);
        return;
    }
    CHECK(P.p.ops->tsp_layer(P.p.self, end) == 0, "the prompt of %lld is cut at layer 0", (long long)end);
    int32_t *all = malloc((size_t)end * 4);
    double *s = malloc((size_t)end * sizeof *s), *tot = calloc((size_t)end, sizeof *tot);
    for (int64_t i = 0; i < end; i++) all[i] = (int32_t)i;
    hkv_far_view f = far_of(&W);
    hkv_query_view qv = {.n = nq, .pos0 = pos0, .q = q16, .ld = (int64_t)W.H * d};
    /* layer 0: every prompt token present */
    CHECK(P.p.ops->prefill_end(P.p.self, 0, &f, &qv, &err) == 0, "prefill_end 0: %s", err.msg);
    CHECK(P.mem.bytes[HKV_TIER_WORKSPACE] == 0, "workspace left after prefill_end");
    for (int h = 0; h < W.KH; h++) {
        ref_pooled(&W, h, q16, nq, pos0, all, end, s);
        for (int64_t i = 0; i < end; i++) tot[i] += s[i];
        int64_t m = P.p.ops->select(P.p.self, 0, h, NULL, &f, P.out, &P.ws);
        check_top("layer 0 kept set", P.out, m, all + W.lo, s + W.lo, W.hi - W.lo, budget, NULL);
    }
    /* the TSP set */
    int32_t *tsp = malloc((size_t)end * 4);
    int64_t nt = P.p.ops->tsp_rows(P.p.self, tsp, end);
    uint8_t *forced = calloc(65536, 1);
    for (int64_t p = 0; p < W.lo; p++) forced[p] = 1;
    for (int64_t p = end - L_LOCAL; p < end; p++) forced[p] = 1;
    check_top("TSP set", tsp, nt, all, tot, end, tsp_len, forced);
    /* layer 1: only the propagated positions hold keys (the rest are NaN) */
    uint16_t *pk = malloc((size_t)W.KH * W.cap * d * 2);
    memcpy(pk, W.k, (size_t)W.KH * W.cap * d * 2);
    uint8_t *present = calloc(65536, 1);
    for (int64_t i = 0; i < nt; i++) present[tsp[i]] = 1;
    for (int h = 0; h < W.KH; h++)
        for (int64_t p = 0; p < end; p++)
            if (!present[p])
                for (int e = 0; e < d; e++) pk[((int64_t)h * W.cap + p) * d + e] = 0x7e00;
    const uint16_t *pkp[8];
    for (int h = 0; h < W.KH; h++) pkp[h] = pk + (int64_t)h * W.cap * d;
    hkv_far_view f1 = f;
    f1.k = pkp;
    f1.rows = tsp;
    f1.n_rows = nt;
    f1.rows_end = tsp[nt - 1] + 1;
    CHECK(P.p.ops->prefill_end(P.p.self, 1, &f1, &qv, &err) == 0, "prefill_end 1: %s", err.msg);
    int64_t a = 0, b = 0;
    while (a < nt && tsp[a] < W.lo) a++;
    for (b = a; b < nt && tsp[b] < W.hi; b++) {}
    for (int h = 0; h < W.KH; h++) {
        ref_pooled(&W, h, q16, nq, pos0, tsp, nt, s);
        int64_t m = P.p.ops->select(P.p.self, 1, h, NULL, &f1, P.out, &P.ws);
        check_top("layer 1 kept set (propagated tokens)", P.out, m, tsp + a, s + a, b - a, budget, NULL);
    }
    /* decode spill: far tokens after the prompt end are always selected */
    hkv_far_view f2 = f1;
    f2.hi = W.hi + 5;
    int64_t m = P.p.ops->select(P.p.self, 1, 0, NULL, &f2, P.out, &P.ws);
    CHECK(m >= 5 && P.out[m - 1] == W.hi + 4 && P.out[m - 5] == W.hi,
          "select returns the 5 tokens that reached the far tier after the prompt");
    CHECK(P.p.ops->max_select(P.p.self, f2.hi - f2.lo) >= m, "max_select bounds select");
    char desc[256];
    P.p.ops->describe(P.p.self, desc, sizeof desc);
    printf("d=%d g=%d: %s\n", d, g, desc);
    pol_close(&P);
    free(all), free(s), free(tot), free(tsp), free(forced), free(pk), free(present), free(q16);
    world_free(&W);
}

static void test_errors(void)
{
    world W;
    world_init(&W, 2, 2, 64, 1024, 100, 7);
    const char *bad[][2] = {{"tsp_layer=2", "tsp_layer"}, {"tsp_len=60", "tsp_len"},
                            {"kernel=6", "kernel"}, {"budget=0", "budget"}, {"window=0", "window"},
                            {"pool=2", "pool"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pol P;
        hkv_err err = {0};
        const char *args[] = {bad[i][0]};
        int rc = fk_open(&P, &W, 2, args, 1, &err);
        CHECK(rc != 0 && strstr(err.msg, bad[i][1]), "%s must be refused naming %s (got '%s')",
              bad[i][0], bad[i][1], rc ? err.msg : "accepted");
        if (!rc) pol_close(&P);
    }
    /* a prompt no longer than tsp_len is not cut; the last layer never cuts */
    pol P;
    hkv_err err = {0};
    const char *args[] = {"tsp_len=512"};
    if (!fk_open(&P, &W, 2, args, 1, &err)) {
        CHECK(P.p.ops->tsp_layer(P.p.self, 512) < 0, "a 512-token prompt is not cut at tsp_len 512");
        CHECK(P.p.ops->tsp_layer(P.p.self, 513) == 0, "a 513-token prompt is cut at layer "
              "2/2 - 1 = 0 (the default)");
        pol_close(&P);
    } else {
        CHECK(0, "open: %s", err.msg);
    }
    world_free(&W);
}

int main(void)
{
    test_fastkv(64, 3, 256, 600, 11);
    test_fastkv(128, 4, 100, 300, 12);
    test_fastkv(64, 1, 2000, 800, 13);   /* budget above the propagated far tokens: keep all */
    test_errors();
    printf("test_fastkv: %s (%d failures)\n", fails ? "FAIL" : "ok", fails);
    return fails ? 1 : 0;
}

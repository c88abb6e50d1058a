/* laq, speckv and specpc selection against float64 / naive references on the
 * shared synthetic world (policy_world.h):
 *   window scores with the max reduction and per-row weights (speckv,
 *   specpc) against float64;
 *   laq: stage 1 (prefill_end) = SnapKV's sum over the last w1 queries;
 *   re-selection (lookahead_end) over the whole prompt far tier with the
 *   last w2 prompt queries + the lookahead queries, true causal visibility,
 *   the last w2 prompt positions forced; needles that only the lookahead
 *   queries point at are dropped by stage 1 and come back;
 *   speckv: the max over window rows and group heads;
 *   specpc: hkv_specpc_select against a naive list-based rendering of the
 *   code's steps (pool with zero padding, top C, neighbours by |offset|,
 *   window prepended, dedup, truncate, sort);
 *   parameter errors. */
#include "policy_world.h"
#include "specpc.h"

/* max (or sum) over group heads and rows of w[r] * softmax weights, float64 */
static void ref_scores_red(const world *W, int h, const uint16_t *q16, int64_t nq, int64_t pos0,
                           const int32_t *rows, int64_t n, const double *wt, int mx, double *out)
{
    const int d = W->d;
    double *l = malloc((size_t)(n > 0 ? n : 1) * sizeof *l);
    for (int64_t x = 0; x < n; x++) out[x] = 0;
    for (int64_t r = 0; r < nq; r++)
        for (int j = 0; j < W->g; j++) {
            const uint16_t *qr = q16 + (r * W->H + (int64_t)h * W->g + j) * d;
            double m = -INFINITY, sum = 0, w = wt ? wt[r] : 1;
            int64_t nv = 0;
            while (nv < n && rows[nv] <= pos0 + r) nv++;
            for (int64_t x = 0; x < nv; x++) {
                double s = 0;
                for (int e = 0; e < d; e++) s += h2d(qr[e]) * h2d(W->kp[h][(int64_t)rows[x] * d + e]);
                l[x] = s / sqrt((double)d);
                m = l[x] > m ? l[x] : m;
            }
            for (int64_t x = 0; x < nv; x++) sum += exp(l[x] - m);
            for (int64_t x = 0; x < nv; x++) {
                double p = w * exp(l[x] - m) / sum;
                out[x] = mx ? (p > out[x] ? p : out[x]) : out[x] + p;
            }
        }
    free(l);
}

static void test_ws_variants(void)
{
    world W;
    world_init(&W, 2, 3, 64, 4096, 1500, 77);
    const int64_t nq = 20, pos0 = W.hi - 8, n = W.hi - W.lo;   /* rows overlap the far end: causal */
    int top[16];
    for (int j = 0; j < W.H; j++) top[j] = (int)(rnext(&W.r) % (uint64_t)W.D);
    uint16_t *q16 = make_window(&W, nq, top, 3.0f);
    float wt[32];
    double wd[32];
    for (int r = 0; r < nq; r++) wt[r] = (float)r / (float)(nq - 1), wd[r] = wt[r];
    hkv_far_view f = far_of(&W);
    hkv_query_view qv = {.n = nq, .pos0 = pos0, .q = q16, .ld = (int64_t)W.H * W.d};
    float *got = malloc((size_t)W.KH * n * 4);
    double *ref = malloc((size_t)n * 8);
    int32_t *rows = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) rows[i] = (int32_t)(W.lo + i);
    hkv_mem_account mem = {0};
    for (int mode = 0; mode < 3; mode++) {   /* max; max weighted; sum weighted */
        hkv_ws_job job = {.far = &f, .qv = &qv, .n_head = W.H, .out = got, .ld_out = n, .n_threads = 2,
                          .reduce_max = mode < 2, .q_weight = mode ? wt : NULL};
        hkv_err err = {0};
        CHECK(hkv_ws_window_scores(&W.kern, &job, &mem, &err) == 0, "window scores: %s", err.msg);
        double worst = 0, scale = 0;
        for (int h = 0; h < W.KH; h++) {
            ref_scores_red(&W, h, q16, nq, pos0, rows, n, mode ? wd : NULL, mode < 2, ref);
            for (int64_t i = 0; i < n; i++) {
                double e = fabs(got[h * n + i] - ref[i]);
                worst = e > worst ? e : worst;
                scale = ref[i] > scale ? ref[i] : scale;
            }
        }
        printf("window scores %s: max |err| %.2e (largest score %.3f)\n",
               mode == 0 ? "max" : mode == 1 ? "max, linspace weights" : "sum, linspace weights",
               worst, scale);
        CHECK(worst <= 1e-4 * scale, "mode %d: error %.3e of %.3e", mode, worst, scale);
    }
    CHECK(mem.bytes[HKV_TIER_WORKSPACE] == 0, "workspace left: %zu", mem.bytes[HKV_TIER_WORKSPACE]);
    free(got), free(ref), free(rows), free(q16);
    world_free(&W);
}

/* agreement of policy's kept set of head h with the reference top-budget */
static double agree_with(pol *P, const world *W, int h, const double *s_in, int64_t budget,
                         int64_t force_from, uint8_t *got_out)
{
    const int64_t n = W->hi - W->lo;
    double *s = malloc((size_t)n * 8);
    int32_t *rows = malloc((size_t)n * 4);
    uint8_t *mark = calloc((size_t)W->cap, 1);
    memcpy(s, s_in, (size_t)n * 8);
    for (int64_t i = 0; i < n; i++) rows[i] = (int32_t)(W->lo + i);
    ref_pool(s, n, 7, 0);
    ref_top(s, rows, n, budget, force_from, mark);
    hkv_far_view f = far_of(W);
    int64_t m = P->p.ops->select(P->p.self, 0, h, NULL, &f, P->out, &P->ws);
    int64_t a = 0;
    CHECK(m == budget, "head %d: %lld selected, budget %lld", h, (long long)m, (long long)budget);
    if (got_out) memset(got_out, 0, (size_t)W->cap);
    for (int64_t i = 0; i < m; i++) {
        a += mark[P->out[i]];
        if (got_out) got_out[P->out[i]] = 1;
    }
    free(s), free(rows), free(mark);
    return (double)a / (double)budget;
}

static void test_laq(int w2)
{
    world W;
    world_init(&W, 2, 2, 64, 8192, 3000, 900 + w2);
    const int64_t budget = 150, L = 8, w1 = 32, n_prompt = W.hi + 4;   /* the window reaches into the far tier */
    const int64_t keep = w1 > w2 + L ? w1 : w2 + L;
    int top[16], top2[16];
    for (int j = 0; j < W.H; j++) top[j] = (int)(rnext(&W.r) % (uint64_t)W.D), top2[j] = (top[j] + 7) % W.D;
    /* the kept query ring at prompt end: rows n_prompt - keep .. n_prompt - 1 */
    uint16_t *qp = make_window(&W, keep, top, 3.0f);
    /* after the lookahead: the last keep rows up to n_prompt + L; lookahead rows lean elsewhere */
    const int64_t row = (int64_t)W.H * W.d;
    uint16_t *qa = malloc((size_t)keep * row * 2), *ql = make_window(&W, L, top2, 3.0f);
    memcpy(qa, qp + L * row, (size_t)(keep - L) * row * 2);
    memcpy(qa + (keep - L) * row, ql, (size_t)L * row * 2);
    /* needles along lookahead query heads, early in the tier */
    int64_t needle[8][2];
    for (int h = 0; h < W.KH; h++)
        for (int i = 0; i < 2; i++) {
            const uint16_t *qr = ql + ((L - 1) * W.H + (int64_t)h * W.g + i % W.g) * W.d;
            float x[256];
            for (int e = 0; e < W.d; e++) x[e] = (float)(3.0 * h2d(qr[e]));
            needle[h][i] = W.lo + 100 + i * 900 + (int64_t)(rnext(&W.r) % 100);
            put_key(&W, h, needle[h][i], x);
        }
    pol P;
    char a0[32], a1[32];
    snprintf(a0, sizeof a0, "budget=%lld", (long long)budget);
    snprintf(a1, sizeof a1, "w2=%d", w2);
    const char *args[] = {a0, a1};
    if (pol_open(&P, &W, "laq", args, 2)) {
        CHECK(0, "open laq");
        return;
    }
    const hkv_policy_def *def = hkv_policy_find("laq");
    hkv_policy_args pa;
    hkv_policy_args_init(def, &pa);
    hkv_err err = {0};
    hkv_policy_arg_set(def, &pa, a1, &err);
    CHECK(def->queries_wanted(&pa, NULL) == keep && def->lookahead_len(&pa, NULL) == L &&
          def->prep == HKV_PREP_LOOKAHEAD_TARGET, "laq: queries_wanted %lld (want %lld), lookahead %lld",
          (long long)def->queries_wanted(&pa, NULL), (long long)keep, (long long)def->lookahead_len(&pa, NULL));
    prefill(&P, &W, qp, keep, n_prompt - keep);
    const int64_t n = W.hi - W.lo;
    int32_t *rows = malloc((size_t)n * 4);
    double *ref = malloc((size_t)n * 8);
    uint8_t *got = calloc((size_t)W.cap, 1);
    for (int64_t i = 0; i < n; i++) rows[i] = (int32_t)(W.lo + i);
    double ov1 = 0;
    int back1 = 0, back2 = 0;
    for (int h = 0; h < W.KH; h++) {   /* stage 1: the last w1 rows, sum */
        ref_scores(&W, h, qp + (keep - w1) * row, w1, n_prompt - w1, rows, n, ref);
        ov1 += agree_with(&P, &W, h, ref, budget, n_prompt - w1, got) / W.KH;
        for (int i = 0; i < 2; i++) back1 += got[needle[h][i]];
    }
    /* lookahead_end: the policy takes rows from n_prompt - w2 on */
    hkv_far_view f = far_of(&W);
    hkv_query_view qv = {.n = keep, .pos0 = n_prompt + L - keep, .q = qa, .ld = row};
    CHECK(P.p.ops->lookahead_end(P.p.self, 0, &f, &qv, &err) == 0, "lookahead_end: %s", err.msg);
    double ov2 = 0;
    for (int h = 0; h < W.KH; h++) {
        const int64_t nr = w2 + L;
        ref_scores(&W, h, qa + (keep - nr) * row, nr, n_prompt - w2, rows, n, ref);
        ov2 += agree_with(&P, &W, h, ref, budget, n_prompt - w2, got) / W.KH;
        for (int i = 0; i < 2; i++) back2 += got[needle[h][i]];
    }
    printf("laq w2=%d: stage 1 vs float64 %.4f, re-selection vs float64 %.4f; lookahead needles kept "
           "%d/%d in stage 1, %d/%d after\n", w2, ov1, ov2, back1, 2 * W.KH, back2, 2 * W.KH);
    CHECK(ov1 >= 0.99 && ov2 >= 0.99, "laq overlap with the reference: %.4f, %.4f", ov1, ov2);
    CHECK(back2 == 2 * W.KH && back1 < back2, "needles: %d before, %d after", back1, back2);
    /* decode spill: later far tokens are always selected */
    W.hi += 5;
    for (int h = 0; h < W.KH; h++)
        for (int64_t p = W.hi - 5; p < W.hi; p++) topic_key(&W, h, p);
    f = far_of(&W);
    int64_t m = P.p.ops->select(P.p.self, 0, 0, NULL, &f, P.out, &P.ws);
    CHECK(m == budget + 5 && P.out[m - 1] == W.hi - 1 && m <= P.p.ops->max_select(P.p.self, W.hi - W.lo),
          "after 5 far appends: %lld selected", (long long)m);
    /* no lookahead queries past the prompt: a clear error */
    hkv_query_view q0 = {.n = w2, .pos0 = n_prompt - w2, .q = qp, .ld = row};
    W.hi -= 5;
    f = far_of(&W);
    CHECK(P.p.ops->lookahead_end(P.p.self, 0, &f, &q0, &err) != 0 && strstr(err.msg, "lookahead"),
          "lookahead_end without lookahead rows must fail: %s", err.msg);
    free(rows), free(ref), free(got), free(qp), free(qa), free(ql);
    pol_close(&P);
    world_free(&W);
}

static void test_speckv(void)
{
    world W;
    world_init(&W, 2, 3, 64, 8192, 2500, 4242);
    const int64_t budget = 120, win = 32, L = 24, n_prompt = W.hi + 64;
    const int64_t row = (int64_t)W.H * W.d, keep = win + L;
    int top[16], top2[16];
    for (int j = 0; j < W.H; j++) top[j] = (int)(rnext(&W.r) % (uint64_t)W.D), top2[j] = (top[j] + 11) % W.D;
    uint16_t *qp = make_window(&W, keep, top, 3.0f), *ql = make_window(&W, L, top2, 3.0f);
    uint16_t *qa = malloc((size_t)keep * row * 2);
    memcpy(qa, qp + L * row, (size_t)(keep - L) * row * 2);
    memcpy(qa + (keep - L) * row, ql, (size_t)L * row * 2);
    pol P;
    const char *args[] = {"budget=120", "lookahead=24"};
    if (pol_open(&P, &W, "speckv", args, 2)) {
        CHECK(0, "open speckv");
        return;
    }
    prefill(&P, &W, qp, keep, n_prompt - keep);
    hkv_far_view f = far_of(&W);
    hkv_query_view qv = {.n = keep, .pos0 = n_prompt + L - keep, .q = qa, .ld = row};
    hkv_err err = {0};
    CHECK(P.p.ops->lookahead_end(P.p.self, 0, &f, &qv, &err) == 0, "lookahead_end: %s", err.msg);
    const int64_t n = W.hi - W.lo;
    int32_t *rows = malloc((size_t)n * 4);
    double *ref = malloc((size_t)n * 8), *refsum = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) rows[i] = (int32_t)(W.lo + i);
    double ov = 0, ovsum = 0;
    for (int h = 0; h < W.KH; h++) {
        ref_scores_red(&W, h, qa, keep, n_prompt - win, rows, n, NULL, 1, ref);
        ov += agree_with(&P, &W, h, ref, budget, n_prompt - win, NULL) / W.KH;
        ref_scores_red(&W, h, qa, keep, n_prompt - win, rows, n, NULL, 0, refsum);
        ovsum += agree_with(&P, &W, h, refsum, budget, n_prompt - win, NULL) / W.KH;
    }
    printf("speckv: kept vs float64 max reduction %.4f (vs a sum reduction %.4f)\n", ov, ovsum);
    CHECK(ov >= 0.99, "speckv overlap with the max reference %.4f", ov);
    CHECK(ovsum < ov, "the max and sum references should differ here (%.4f vs %.4f)", ovsum, ov);
    free(rows), free(ref), free(refsum), free(qp), free(ql), free(qa);
    pol_close(&P);
    world_free(&W);
}

/* The code's steps, naively (lists, O(n C nb)). */
static int64_t naive_specpc(const float *r, int64_t n, int64_t C, int64_t w, int k, int nb, int32_t *out)
{
    if (C >= n) {
        for (int64_t i = 0; i < n; i++) out[i] = (int32_t)i;
        return n;
    }
    double *s = malloc((size_t)n * 8);
    const int64_t left = (k - 1) / 2, right = k - 1 - left;
    for (int64_t i = 0; i < n; i++) {
        double m = 0;   /* zero padding */
        for (int64_t j = i - left; j <= i + right; j++) {
            double v = j < 0 || j >= n ? 0 : r[j];
            m = v > m ? v : m;
        }
        s[i] = m;
    }
    int64_t *rank = malloc((size_t)C * 8);
    uint8_t *used = calloc((size_t)n, 1);
    for (int64_t c = 0; c < C; c++) {   /* selection sort: score desc, index asc */
        int64_t b = -1;
        for (int64_t i = 0; i < n; i++)
            if (!used[i] && (b < 0 || s[i] > s[b])) b = i;
        used[b] = 1;
        rank[c] = b;
    }
    int off[4096], no = 0;
    for (int o = -((nb - 1) / 2); o <= nb - 1 - (nb - 1) / 2; o++) off[no++] = o;
    for (int i = 1; i < no; i++)   /* stable insertion sort by |offset| */
        for (int j = i; j > 0 && abs(off[j]) < abs(off[j - 1]); j--) {
            int t = off[j];
            off[j] = off[j - 1], off[j - 1] = t;
        }
    int64_t cnt = 0;
    uint8_t *seen = calloc((size_t)n, 1);
    for (int64_t p = n - 1; p >= (n - w > 0 ? n - w : 0) && cnt < C; p--) seen[p] = 1, out[cnt++] = (int32_t)p;
    for (int64_t c = 0; c < C && cnt < C; c++)
        for (int o = 0; o < no && cnt < C; o++) {
            int64_t p = rank[c] + off[o];
            p = p < 0 ? 0 : p >= n ? n - 1 : p;
            if (!seen[p]) seen[p] = 1, out[cnt++] = (int32_t)p;
        }
    for (int64_t i = 1; i < cnt; i++)
        for (int64_t j = i; j > 0 && out[j] < out[j - 1]; j--) {
            int32_t t = out[j];
            out[j] = out[j - 1], out[j - 1] = t;
        }
    free(s), free(rank), free(used), free(seen);
    return cnt;
}

static void test_specpc_select(void)
{
    rng R = {31337};
    hkv_mem_account mem = {0};
    const int64_t ns[] = {300, 1000, 2000};
    const int64_t Cs[] = {100, 257, 1999};
    const int ks[] = {32, 7, 64}, nbs[] = {32, 5, 64};
    int cases = 0;
    for (int a = 0; a < 3; a++) {
        const int64_t n = ns[a];
        float *r = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) {   /* sparse peaks over a low floor, some exact ties */
            double u = runif(&R);
            r[i] = u > 0.97 ? (float)(runif(&R) * 0.5) : (float)(floor(u * 64) / 6400.0);
        }
        for (int b = 0; b < 3; b++) {
            const int64_t C = Cs[b] < n ? Cs[b] : n - 1;
            int32_t *got = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
            hkv_err err = {0};
            int64_t m = hkv_specpc_select(r, n, C, 64, ks[b], nbs[b], got, &mem, &err);
            int64_t mw = naive_specpc(r, n, C, 64, ks[b], nbs[b], want);
            int same = m == mw;
            for (int64_t i = 0; same && i < m; i++) same = got[i] == want[i];
            CHECK(same && m == C, "specpc select n=%lld C=%lld k=%d nb=%d: %lld kept (want %lld), "
                  "sets %s", (long long)n, (long long)C, ks[b], nbs[b], (long long)m, (long long)mw,
                  same ? "equal" : "differ");
            int w_in = 1;
            for (int64_t p = n - 64; p < n; p++) {
                int f = 0;
                for (int64_t i = 0; i < m; i++) f |= got[i] == p;
                w_in &= f;
            }
            CHECK(w_in, "the last 64 positions must be kept");
            cases++;
            free(got), free(want);
        }
        free(r);
    }
    CHECK(mem.bytes[HKV_TIER_WORKSPACE] == 0, "workspace left");
    printf("specpc select: %d cases equal to the naive rendering\n", cases);
}

static void test_params(void)
{
    world W;
    world_init(&W, 1, 1, 16, 256, 100, 5);
    struct { const char *pol, *arg; } bad[] = {
        {"laq", "kernel=4"}, {"laq", "lookahead=0"}, {"laq", "w1=0"}, {"laq", "budget=0"},
        {"speckv", "kernel=8"}, {"speckv", "lookahead=5000"}, {"speckv", "window=-1"},
        {"specpc", "C=0"}, {"specpc", "neighbors=0"}, {"specpc", "kernel=99999"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const hkv_policy_def *d = hkv_policy_find(bad[i].pol);
        hkv_policy_args a;
        hkv_policy_args_init(d, &a);
        hkv_err err = {0};
        int rc = hkv_policy_arg_set(d, &a, bad[i].arg, &err);
        if (!rc) {   /* in range for the parser: the policy itself must refuse (odd kernels) */
            hkv_mem_account mem = {0};
            hkv_policy_env env = {.shape = {1, 1, 1, 16}, .n_ctx = 256, .L_init = 4, .L_local = 8,
                                  .kern = &W.kern, .mem = &mem, .n_threads = 1};
            hkv_policy p;
            rc = d->create(&p, &a, &env, &err);
            if (!rc) p.ops->destroy(p.self);
        }
        char key[32];
        snprintf(key, sizeof key, "%.*s", (int)(strchr(bad[i].arg, '=') - bad[i].arg), bad[i].arg);
        CHECK(rc != 0 && strstr(err.msg, key), "%s %s: accepted or unclear error '%s'", bad[i].pol,
              bad[i].arg, err.msg);
    }
    world_free(&W);
}

int main(void)
{
    test_ws_variants();
    test_laq(8);
    test_laq(0);
    test_speckv();
    test_specpc_select();
    test_params();
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}

/* The ctkvr policy on structured synthetic data.
 *
 * World: per KV head, far keys drawn around D random directions (clusters),
 * a few "needle" keys aligned with the last prompt queries, and a query
 * stream per query head = a persistent direction + an AR(1) part, so
 * positionally adjacent queries are similar (as RoPE'd queries are, the
 * paper's Obs. 1). Checked against the exact top-rho' (max over the group of
 * q.k over every far key, in double): recall, needles, output validity, the
 * list build against brute force, an empty far tier, a short prompt, DCU
 * under drift with decode spill and on a second turn, concurrent selects,
 * parameter ranges; and prefill_end timed on a 32K far tier. */
#include <time.h>

#include "ctkvr_world.h"

/* ---- the list build against brute force ---------------------------------------- */

/* adv: keys at the positions the build samples (offset 2 mod 4 for 10000
 * keys) all score high, so the sampled thresholds are far too high and every
 * list must be rebuilt without them. */
static void test_build(int d, int g, int64_t n_far, int64_t rho, int adv)
{
    world W;
    world_init(&W, 2, g, d, n_far + 100, n_far, 64, 0.9f, 11 + d + g + (uint64_t)n_far);
    const int64_t n = 40, row = (int64_t)W.H * d;
    float *qf = malloc((size_t)n * row * sizeof *qf);
    uint16_t *qh = malloc((size_t)n * row * 2);
    for (int64_t i = 0; i < n * row; i++) qf[i] = 0.4f * rgauss(&W.r);
    W.kern.f32_to_f16(qf, qh, n * row);
    W.kern.f16_to_f32(qh, qf, n * row);   /* the reference sees the fp16 queries too */
    if (adv)
        for (int h = 0; h < W.KH; h++)
            for (int64_t p = 2; p < n_far; p += 4) {   /* aligned with query 0's first head */
                float x[256];
                for (int e = 0; e < d; e++) x[e] = 4.0f * qf[(int64_t)h * g * d + e] + 0.3f * rgauss(&W.r);
                put_key(&W, h, W.lo + p, x);
            }
    const int64_t cap_len = rho > n_far + 50 ? rho : n_far + 50;
    int32_t *slot = malloc((size_t)W.KH * n * 4), *ivf = malloc((size_t)W.KH * n * cap_len * 4);
    int32_t *len = malloc((size_t)W.KH * n * 4), *ref = malloc((size_t)rho * 4);
    for (int64_t i = 0; i < W.KH * n; i++) slot[i] = (int32_t)((i * 7) % n);   /* a permutation per head */
    hkv_far_view f = far_of(&W);
    hkv_mem_account mem = {0};
    hkv_err err = {0};
    hkv_ctkvr_build b = {.far = &f, .q = qh, .ldq = row, .n = n, .n_head = W.H, .rho = rho,
                         .slot = slot, .ivf = ivf, .len = len, .n_slots = n, .n_threads = 2};
    CHECK(hkv_ctkvr_build_lists(&W.kern, &b, &mem, &err) == 0, "build: %s", err.msg);
    uint8_t *mark = calloc((size_t)W.cap, 1);
    int64_t hit = 0, tot = 0, bad = 0;
    for (int h = 0; h < W.KH; h++)
        for (int64_t i = 0; i < n; i++) {
            int64_t s = slot[h * n + i];
            const int32_t *l = ivf + (h * n + s) * rho;
            bad += len[h * n + s] != rho;
            for (int64_t e = 0; e < len[h * n + s]; e++) {
                if (l[e] < W.lo || l[e] >= W.hi || mark[l[e]]) bad++;
                else mark[l[e]] = 1;
            }
            int64_t k = oracle(&W, h, qf + i * row + (int64_t)h * g * d, rho, ref);
            for (int64_t e = 0; e < k; e++) hit += mark[ref[e]];
            tot += k;
            for (int64_t e = 0; e < len[h * n + s]; e++)
                if (l[e] >= W.lo && l[e] < W.hi) mark[l[e]] = 0;
        }
    double ov = (double)hit / (double)tot;
    printf("build d=%d g=%d far %lld%s: %lld lists of %lld, overlap with the exact top-%lld %.4f\n",
           d, g, (long long)n_far, adv ? " (sampling defeated)" : "", (long long)(W.KH * n),
           (long long)rho, (long long)rho, ov);
    CHECK(!bad && ov >= 0.99, "build d=%d g=%d: %lld bad entries, overlap %.4f", d, g,
          (long long)bad, ov);
    /* a far tier shorter than a list: every list is the whole tier */
    b.rho = n_far + 50;
    CHECK(hkv_ctkvr_build_lists(&W.kern, &b, &mem, &err) == 0, "build: %s", err.msg);
    for (int64_t i = 0; i < W.KH * n; i++) CHECK(len[i] == n_far, "short tier: len %d", len[i]);
    CHECK(mem.bytes[HKV_TIER_WORKSPACE] == 0 && mem.peak[HKV_TIER_WORKSPACE] > 0,
          "build workspace not accounted or not freed");
    free(qf), free(qh), free(slot), free(ivf), free(len), free(ref), free(mark);
    world_free(&W);
}

/* ---- recall, needles, short prompt --------------------------------------------- */

/* Prompt queries at positions [P - n_q - warm, P), needles, prefill with the
 * last n_q; returns P. Needle positions go to needle[KH][n_needle]. */
static int64_t make_prompt(world *W, runner *R, int64_t n_q, int n_needle, int32_t *needle)
{
    const int64_t P = W->hi + 256, warm = 200;
    for (int64_t p = P - n_q - warm; p < P; p++) next_query(W, p);
    const float *ql = W->hist + (P - 1) * W->H * W->d;
    for (int h = 0; h < W->KH; h++)
        for (int i = 0; i < n_needle; i++) {
            int64_t p = W->lo + (int64_t)(rnext(&W->r) % (uint64_t)(W->hi - W->lo));
            float x[256];
            memcpy(x, ql + ((int64_t)h * W->g + i % W->g) * W->d, (size_t)W->d * 4);
            unit(x, W->d);
            for (int e = 0; e < W->d; e++) x[e] *= 5.0f;
            put_key(W, h, p, x);
            needle[h * n_needle + i] = (int32_t)p;
        }
    prefill(R, W, P - n_q, n_q);
    return P;
}

static double test_recall(int d, int g, int64_t n_q, const char *what, const char *arg, double want)
{
    world W;
    world_init(&W, 2, g, d, 8192, 6000, 256, 0.99f, 100 + d * 7 + g);
    runner R;
    if (runner_open(&R, &W, &arg, arg ? 1 : 0)) {
        CHECK(0, "open");
        return 0;
    }
    int32_t needle[2 * 4];
    const int64_t P = make_prompt(&W, &R, n_q, 4, needle), T = 32;
    double rec = 0, rec_min = 1;
    int64_t nhit = 0, ntot = 0, nsel = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *q = next_query(&W, P + t);
        for (int h = 0; h < W.KH; h++) {
            int64_t n;
            double r = select_check(&R, &W, h, q, &n);
            rec += r, nsel += n;
            rec_min = r < rec_min ? r : rec_min;
            for (int i = 0; i < 4; i++) nhit += in_out(&R, n, needle[h * 4 + i]), ntot++;
        }
    }
    rec /= (double)(T * W.KH);
    char desc[512];
    R.pol.ops->describe(R.pol.self, desc, sizeof desc);
    printf("recall %-12s d=%3d g=%d: %.3f (min %.3f), needles %lld/%lld\n  %s\n", what, d, g, rec,
           rec_min, (long long)nhit, (long long)ntot, desc);
    CHECK(rec >= want, "%s d=%d g=%d: recall %.3f < %.2f", what, d, g, rec, want);
    CHECK(nhit == ntot, "%s d=%d g=%d: needles selected %lld of %lld", what, d, g, (long long)nhit,
          (long long)ntot);
    runner_close(&R);
    world_free(&W);
    return rec;
}

/* ---- an empty far tier, then decode spill only ------------------------------------ */

static void test_empty(void)
{
    world W;
    world_init(&W, 2, 3, 64, 4096, 0, 32, 0.98f, 7);
    runner R;
    if (runner_open(&R, &W, NULL, 0)) {
        CHECK(0, "open");
        return;
    }
    hkv_query_view qv;
    for (int64_t p = 0; p < 300; p++) next_query(&W, p);
    uint16_t *q = query_rows(&W, 44, 256, &qv);
    hkv_far_view f = far_of(&W);
    hkv_err err = {0};
    CHECK(R.pol.ops->prefill_end(R.pol.self, 0, &f, &qv, &err) == 0, "empty: %s", err.msg);
    free(q);
    const float *qq = next_query(&W, 300);
    int64_t n = R.pol.ops->select(R.pol.self, 0, 1, qq + 3 * 64, &f, R.out, &R.ws);
    CHECK(n == 0, "empty far tier: select gave %lld", (long long)n);
    /* tokens spilled in decode are the tail: all of them while they fit */
    int64_t m;
    double rmin = 1;
    for (int64_t step = 0; step < 400; step++) {
        for (int h = 0; h < W.KH; h++) cluster_key(&W, h, W.hi);
        W.hi++;
        f = far_of(&W);
        R.pol.ops->on_far_append(R.pol.self, 0, &f);
        qq = next_query(&W, 301 + step);
        for (int h = 0; h < W.KH; h++) {
            double r = select_check(&R, &W, h, qq, &m);
            rmin = r < rmin ? r : rmin;
            if (W.hi - W.lo <= 32) CHECK(m == W.hi - W.lo, "%lld of %lld far tokens", (long long)m, (long long)(W.hi - W.lo));
        }
    }
    printf("empty far tier then 400 spilled tokens: min recall %.3f\n", rmin);
    CHECK(rmin >= 0.97, "spill-only recall %.3f", rmin);
    /* a later turn without queries, a bad layer, scratch too small */
    f = far_of(&W);
    CHECK(R.pol.ops->prefill_end(R.pol.self, 0, &f, NULL, &err) == 0, "no queries: %s", err.msg);
    CHECK(R.pol.ops->prefill_end(R.pol.self, 1, &f, NULL, &err) == HKV_E_INVAL, "layer 1 accepted");
    CHECK(select_check(&R, &W, 0, qq, &m) >= 0.97, "after an empty turn");
    hkv_policy_scratch tiny = R.ws;
    tiny.ni = 10;
    CHECK(R.pol.ops->select(R.pol.self, 0, 0, qq, &f, R.out, &tiny) == HKV_E_INVAL,
          "small scratch accepted");
    runner_close(&R);
    world_free(&W);
}

/* ---- DCU: a drifting query stream with decode spill --------------------------- */

/* Average recall over T decode steps; each step spills one far token aligned
 * with the step's query (generated content the next queries look back at). */
static double drift_run(int d, int g, const char *dcu, int spill, double *late)
{
    world W;
    world_init(&W, 2, g, d, 8192, 4000, 256, 0.995f, 555 + d + g);
    runner R;
    const char *args[] = {dcu, "tail=32"};
    if (runner_open(&R, &W, args, 2)) {
        CHECK(0, "open");
        return 0;
    }
    int32_t needle[8];
    const int64_t P = make_prompt(&W, &R, 512, 0, needle), T = 400;
    double rec = 0, rec2 = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *q = next_query(&W, P + t);
        for (int h = 0; h < W.KH; h++) {
            double r = select_check(&R, &W, h, q, NULL);
            rec += r;
            if (t >= T / 2) rec2 += r;
        }
        if (spill) {
            for (int h = 0; h < W.KH; h++) {
                float x[256];
                memcpy(x, q + ((int64_t)h * g + t % g) * d, (size_t)d * 4);
                unit(x, d);
                for (int e = 0; e < d; e++) x[e] = 3.0f * x[e] + 0.1f * rgauss(&W.r);
                put_key(&W, h, W.hi, x);
            }
            W.hi++;
            hkv_far_view f = far_of(&W);
            R.pol.ops->on_far_append(R.pol.self, 0, &f);
        }
    }
    char desc[512];
    R.pol.ops->describe(R.pol.self, desc, sizeof desc);
    printf("  %s spill=%d: %s\n", dcu, spill, desc);
    runner_close(&R);
    world_free(&W);
    *late = rec2 / (double)(T / 2 * 2);
    return rec / (double)(T * 2);
}

static void test_dcu_drift(int d, int g)
{
    const char *m[3] = {"dcu=0", "dcu=1", "dcu=2"};
    double all[2][3], late[2][3];
    for (int spill = 1; spill >= 0; spill--) {
        for (int i = 0; i < 3; i++) all[spill][i] = drift_run(d, g, m[i], spill, &late[spill][i]);
        printf("%s d=%d g=%d: recall dcu=0 %.3f (second half %.3f), dcu=1 %.3f (%.3f), "
               "dcu=2 %.3f (%.3f)\n", spill ? "drift + spill" : "drift only   ", d, g,
               all[spill][0], late[spill][0], all[spill][1], late[spill][1], all[spill][2],
               late[spill][2]);
    }
    /* spilled tokens leave the tail after 32 steps: only DCU lists keep them */
    CHECK(all[1][1] >= all[1][0] + 0.1 && late[1][1] >= late[1][0] + 0.1,
          "dcu=1 did not help under drift with spill: %.3f vs %.3f", all[1][1], all[1][0]);
    CHECK(all[1][2] >= all[1][1] - 0.01, "dcu=2 below dcu=1 with spill: %.3f vs %.3f", all[1][2],
          all[1][1]);
    /* a static far tier: the paper's FIFO fills recall with near-copies (reported, not
     * asserted); the refresh variant must beat no update */
    CHECK(all[0][2] >= all[0][0] + 0.03 && late[0][2] >= late[0][0] + 0.03,
          "dcu=2 did not help under pure drift: %.3f vs %.3f", all[0][2], all[0][0]);
}

/* ---- a second turn: new far tokens on a new topic ------------------------------ */

static double turn2_run(const char *dcu, double *turn1)
{
    const int d = 64, g = 4;
    world W;
    world_init(&W, 2, g, d, 8192, 5000, 256, 0.98f, 4242);
    runner R;
    const char *args[] = {dcu, "tail=64"};
    if (runner_open(&R, &W, args, 2)) {
        CHECK(0, "open");
        return 0;
    }
    int32_t needle[8];
    const int64_t P = make_prompt(&W, &R, 512, 0, needle), T = 16, n2 = 400;
    double r1 = 0, r2 = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *q = next_query(&W, P + t);
        for (int h = 0; h < W.KH; h++) r1 += select_check(&R, &W, h, q, NULL);
    }
    /* the new turn: its tokens cluster around new directions, its queries lean to them */
    float *nd = malloc((size_t)W.KH * 8 * d * sizeof *nd);
    for (int64_t i = 0; i < W.KH * 8 * d; i++) nd[i] = rgauss(&W.r);
    for (int i = 0; i < W.KH * 8; i++) unit(nd + (int64_t)i * d, d);
    for (int64_t p = W.hi; p < W.hi + n2; p++)
        for (int h = 0; h < W.KH; h++) {
            float x[256], a = 2.0f + 2.0f * (float)runif(&W.r);
            const float *c = nd + ((int64_t)h * 8 + (int64_t)(rnext(&W.r) % 8)) * d;
            for (int e = 0; e < d; e++) x[e] = a * c[e] + 0.12f * rgauss(&W.r);
            put_key(&W, h, p, x);
        }
    W.hi += n2;
    for (int j = 0; j < W.H; j++) {
        float *b = W.base + (int64_t)j * d;
        const float *c = nd + ((int64_t)(j / g) * 8 + j % 8) * d;
        for (int e = 0; e < d; e++) b[e] = c[e] + 0.7f * rgauss(&W.r) / sqrtf((float)d);
        unit(b, d);
    }
    const int64_t P2 = P + T + n2;
    for (int64_t p = P + T; p < P2; p++) next_query(&W, p);
    prefill(&R, &W, P2 - 512, 512);   /* 16 decode + 400 new-turn + 96 older queries */
    for (int64_t t = 0; t < T; t++) {
        const float *q = next_query(&W, P2 + t);
        for (int h = 0; h < W.KH; h++) r2 += select_check(&R, &W, h, q, NULL);
    }
    char desc[512];
    R.pol.ops->describe(R.pol.self, desc, sizeof desc);
    printf("  %s: %s\n", dcu, desc);
    free(nd);
    runner_close(&R);
    world_free(&W);
    *turn1 = r1 / (double)(T * 2);
    return r2 / (double)(T * 2);
}

static void test_turn2(void)
{
    double a0, a1, a2;
    double r0 = turn2_run("dcu=0", &a0), r1 = turn2_run("dcu=1", &a1), r2 = turn2_run("dcu=2", &a2);
    printf("second turn: recall dcu=0 %.3f -> %.3f, dcu=1 %.3f -> %.3f, dcu=2 %.3f -> %.3f\n", a0,
           r0, a1, r1, a2, r2);
    CHECK(r1 >= 0.9 && r1 >= r0 + 0.1, "second turn: dcu=1 %.3f, dcu=0 %.3f", r1, r0);
    CHECK(r2 >= 0.9 && r2 >= r0 + 0.1, "second turn: dcu=2 %.3f, dcu=0 %.3f", r2, r0);
}

/* ---- concurrent selects give what sequential ones give -------------------------- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void test_concurrent(void)
{
    world W;
    world_init(&W, 4, 2, 64, 4096, 3000, 128, 0.98f, 99);
    runner A, B;
    if (runner_open(&A, &W, NULL, 0) || runner_open(&B, &W, NULL, 0)) {
        CHECK(0, "open");
        return;
    }
    int32_t needle[8];
    const int64_t P = make_prompt(&W, &A, 256, 0, needle);
    prefill(&B, &W, P - 256, 256);
    const int KH = W.KH;
    int32_t *outs = malloc((size_t)KH * A.max_sel * 4);
    hkv_policy_scratch ws[4];
    for (int h = 0; h < KH; h++) {
        ws[h] = A.ws;
        ws[h].f = malloc((size_t)A.ws.nf * 4);
        ws[h].i = malloc((size_t)A.ws.ni * 4);
    }
    int64_t diff = 0;
    for (int64_t t = 0; t < 40; t++) {
        const float *q = next_query(&W, P + t);
        hkv_far_view f = far_of(&W);
        int64_t nb[4];
        #pragma omp parallel for num_threads(2) schedule(dynamic, 1)
        for (int h = 0; h < KH; h++)
            nb[h] = B.pol.ops->select(B.pol.self, 0, h, q + h * 2 * 64, &f, outs + h * A.max_sel, &ws[h]);
        for (int h = 0; h < KH; h++) {
            int64_t na = A.pol.ops->select(A.pol.self, 0, h, q + h * 2 * 64, &f, A.out, &A.ws);
            qsort(A.out, (size_t)na, 4, cmp_i32);
            qsort(outs + h * A.max_sel, (size_t)nb[h], 4, cmp_i32);
            diff += na != nb[h] || memcmp(A.out, outs + h * A.max_sel, (size_t)na * 4);
        }
        for (int h = 0; h < KH; h++) cluster_key(&W, h, W.hi);   /* a spilled token */
        W.hi++;
    }
    printf("concurrent selects (4 KV heads, 2 threads, DCU on): %lld of 160 differ\n", (long long)diff);
    CHECK(diff == 0, "concurrent selects differ from sequential ones in %lld cases", (long long)diff);
    for (int h = 0; h < KH; h++) free(ws[h].f), free(ws[h].i);
    free(outs);
    runner_close(&A);
    runner_close(&B);
    world_free(&W);
}

/* ---- parameters ------------------------------------------------------------------ */

static void describe_with(int64_t n_ctx, const char *arg, char *buf, size_t cap, hkv_mem_account *mem)
{
    const hkv_policy_def *def = &hkv_policy_ctkvr;
    hkv_policy_args a;
    hkv_err err = {0};
    hkv_cpu_kernels k;
    hkv_cpu_kernels_init(&k, HKV_ISA_SCALAR);
    hkv_policy_args_init(def, &a);
    if (arg) CHECK(hkv_policy_arg_set(def, &a, arg, &err) == 0, "%s: %s", arg, err.msg);
    hkv_policy_env env = {.shape = {2, 8, 2, 128}, .n_ctx = n_ctx, .L_init = 4, .L_local = 256,
                          .kern = &k, .mem = mem, .n_threads = 1};
    hkv_policy p;
    buf[0] = 0;
    if (def->create(&p, &a, &env, &err)) {
        CHECK(0, "create: %s", err.msg);
        return;
    }
    p.ops->describe(p.self, buf, cap);
    p.ops->destroy(p.self);
}

static void test_params(void)
{
    const hkv_policy_def *def = hkv_policy_find("ctkvr");
    CHECK(def == &hkv_policy_ctkvr, "ctkvr not registered");
    def = &hkv_policy_ctkvr;
    hkv_policy_args a;
    hkv_err err = {0};
    hkv_policy_args_init(def, &a);
    const char *bad[] = {"C=0", "Cp=0", "dcu=3", "dcu=0.5", "dcu_cos=1.5", "rho_p=0", "rho=0",
                         "tail=-1", "C=1.5", "Cp=x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(hkv_policy_arg_set(def, &a, bad[i], &err) != 0, "%s accepted", bad[i]);
    const char *good[] = {"C=64", "Cp=8", "rho=2560", "rho_p=1024", "dcu=0", "dcu=2",
                          "dcu_cos=0.85", "tail=0"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        CHECK(hkv_policy_arg_set(def, &a, good[i], &err) == 0, "%s rejected: %s", good[i], err.msg);
    hkv_policy_args_init(def, &a);
    hkv_policy_env env = {.shape = {1, 8, 2, 128}};
    const int64_t ctx[] = {32768, 8192, 100, 10, 1 << 20}, wantC[] = {2048, 512, 6, 1, 2048};
    for (int i = 0; i < 5; i++) {
        env.n_ctx = ctx[i];
        CHECK(def->queries_wanted(&a, &env) == wantC[i], "n_ctx %lld: C %lld, want %lld",
              (long long)ctx[i], (long long)def->queries_wanted(&a, &env), (long long)wantC[i]);
    }
    char buf[512];
    hkv_mem_account mem = {0};
    struct { int64_t n; const char *arg, *want; } cases[] = {
        {32768, NULL, "C=2048 C'=4 rho=2480 rho'=992 dcu=1 tail=1024"},
        {8192, NULL, "C=512 C'=4 rho=640 rho'=256 dcu=1"},
        {131072, NULL, "C=2048 C'=4 rho=2560 rho'=1024"},
        {1000, NULL, "C=62 C'=4 rho=80 rho'=32"},
        {8192, "rho_p=512", "rho=1280 rho'=512"},
        {8192, "dcu=2", "dcu=2 (cos 0.90)"},
    };
    for (int i = 0; i < 6; i++) {
        describe_with(cases[i].n, cases[i].arg, buf, sizeof buf, &mem);
        CHECK(strstr(buf, cases[i].want) != NULL, "n_ctx %lld: '%s' lacks '%s'", (long long)cases[i].n,
              buf, cases[i].want);
    }
    printf("params: %s\n", buf);
    CHECK(mem.bytes[HKV_TIER_INDEX] == 0 && mem.peak[HKV_TIER_INDEX] >=
          (size_t)2 * 2 * 512 * 1280 * 4 + (size_t)2 * 512 * 8 * 128 * 2,
          "index memory: %zu now, peak %zu", mem.bytes[HKV_TIER_INDEX], mem.peak[HKV_TIER_INDEX]);
}

/* ---- sketch=1: the int8 rerank attends what the fp16 rerank attends ---------------- */

/* Keys with outlier channels (a per-row scale set by one large value: the
 * bound is loose) and runs of identical keys (exact ties at the cut). */
static void harden_keys(world *W)
{
    float x[256];
    for (int h = 0; h < W->KH; h++)
        for (int64_t p = W->lo; p < W->hi; p++) {
            uint16_t *k = W->k + ((int64_t)h * W->cap + p) * W->d;
            if (p % 50 == 1) {   /* a copy of the previous key */
                memcpy(k, k - W->d, (size_t)W->d * 2);
                continue;
            }
            W->kern.f16_to_f32(k, x, W->d);
            x[3] *= 30.0f;
            x[W->d - 5] *= -20.0f;
            W->kern.f32_to_f16(x, k, W->d);
        }
}

static void test_sketch(int d, int g, int hard)
{
    world W;
    world_init(&W, 2, g, d, 8192, 6000, 256, 0.99f, 900 + d + g + hard);
    if (hard) harden_keys(&W);
    runner A, B;
    const char *a0[] = {"dcu=0"}, *a1[] = {"dcu=0", "sketch=1"};
    if (runner_open(&A, &W, a0, 1) || runner_open(&B, &W, a1, 2)) {
        CHECK(0, "open");
        return;
    }
    int32_t needle[8];
    const int64_t P = make_prompt(&W, &A, 512, 0, needle), T = 24;
    prefill(&B, &W, P - 512, 512);
    int64_t same = 0, steps = 0;
    int32_t *outA = malloc((size_t)A.max_sel * 4 + 4);
    for (int64_t t = 0; t < T; t++) {
        const float *q = next_query(&W, P + t);
        for (int h = 0; h < W.KH; h++) {
            hkv_far_view f = far_of(&W);
            const float *qh = q + (int64_t)h * W.g * W.d;
            int64_t na = A.pol.ops->select(A.pol.self, 0, h, qh, &f, A.out, &A.ws);
            memcpy(outA, A.out, (size_t)(na > 0 ? na : 0) * 4);
            int64_t nb = B.pol.ops->select(B.pol.self, 0, h, qh, &f, B.out, &B.ws);
            /* the same set (the sketch path emits it ascending, the fp16 one in top-k order) */
            if (na > 0) qsort(outA, (size_t)na, sizeof *outA, cmp_i32);
            if (nb > 0) qsort(B.out, (size_t)nb, sizeof *B.out, cmp_i32);
            same += na == nb && na > 0 && !memcmp(outA, B.out, (size_t)na * 4);
            steps++;
        }
        for (int h = 0; h < W.KH; h++) cluster_key(&W, h, W.hi);   /* decode spill: catch-up */
        W.hi++;
        hkv_far_view f = far_of(&W);
        A.pol.ops->on_far_append(A.pol.self, 0, &f);
        B.pol.ops->on_far_append(B.pol.self, 0, &f);
    }
    const ctkvr *s = B.pol.self;
    int64_t reranks = 0, surv = 0, cand = 0;
    for (int h = 0; h < W.KH; h++) {
        reranks += s->heads[h].reranks, surv += s->heads[h].surv;
        cand += s->heads[h].cand;
    }
    const double fs = reranks ? (double)surv / (double)reranks : 0;
    const double fc = steps ? (double)cand / (double)steps : 0;
    printf("sketch d=%3d g=%d%s: %lld of %lld selections equal to the fp16 rerank's; %.0f exact keys "
           "a rerank of %.0f candidates (rho' %lld)\n", d, g, hard ? " outliers+ties" : "",
           (long long)same, (long long)steps, fs, fc, (long long)s->c.rho_p);
    CHECK(same == steps, "sketch d=%d g=%d: %lld of %lld selections differ", d, g,
          (long long)(steps - same), (long long)steps);
    CHECK(reranks == steps, "sketch: %lld reranks on sketches of %lld", (long long)reranks,
          (long long)steps);
    /* the point of it: far fewer exact keys than candidates (loose bounds read more) */
    CHECK(fs < (hard ? 0.6 : 0.2) * fc, "sketch: %.0f exact keys of %.0f candidates", fs, fc);
    free(outA);
    runner_close(&A);
    runner_close(&B);
    /* with DCU its lists come from the int8 scores: recall as the fp16 rerank's */
    const char *a2[] = {"sketch=1"};
    runner R0, R1;
    if (runner_open(&R0, &W, NULL, 0) || runner_open(&R1, &W, a2, 1)) {
        CHECK(0, "open");
        return;
    }
    prefill(&R0, &W, P - 512, 512);
    prefill(&R1, &W, P - 512, 512);
    double rec0 = 0, rec1 = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *q = next_query(&W, P + T + t);
        for (int h = 0; h < W.KH; h++) {
            rec0 += select_check(&R0, &W, h, q, NULL);
            rec1 += select_check(&R1, &W, h, q, NULL);
        }
    }
    rec0 /= (double)(T * W.KH), rec1 /= (double)(T * W.KH);
    printf("sketch dcu=1 d=%d g=%d: recall %.3f (fp16 rerank %.3f)\n", d, g, rec1, rec0);
    CHECK(rec1 >= rec0 - 0.03, "sketch dcu=1: recall %.3f, fp16 rerank %.3f", rec1, rec0);
    runner_close(&R0);
    runner_close(&R1);
    world_free(&W);
}

/* ---- sketch=2, 3: approximate reranks on int8 and 4-bit codes -------------------- */

/* Recall of the oracle's top set for the fp16 rerank, the int8 top-rho'
 * (sketch=2) and the 4-bit one (sketch=3), dcu=0 and 1: each approximate
 * rerank within a bound of the fp16 one (these clustered keys hold many
 * near ties at the cut, which an approximate score picks among at random:
 * measured 0.05-0.10 below fp16 for int8, 0.06-0.15 for 4-bit; a rerank at
 * random would recall about rho' / candidates = 0.25), and the 4-bit
 * sketch's memory (d / 2 + d / 8 bytes a row) against the int8 one's. */
static void test_sketch_approx(int d, int g, int hard)
{
    world W;
    world_init(&W, 2, g, d, 8192, 6000, 256, 0.99f, 700 + d + g + hard);
    if (hard) harden_keys(&W);
    const char *args[3][2] = {{"dcu=0", NULL}, {"dcu=0", "sketch=2"}, {"dcu=0", "sketch=3"}};
    double rec[2][3] = {{0}};
    size_t idx_mem[3] = {0};
    int64_t P = 0;
    const int64_t T = 16;
    for (int dcu = 0; dcu < 2; dcu++)
        for (int m = 0; m < 3; m++) {
            runner R;
            const char *a[2] = {dcu ? "dcu=1" : "dcu=0", args[m][1]};
            if (runner_open(&R, &W, a, a[1] ? 2 : 1)) {
                CHECK(0, "open");
                return;
            }
            if (!dcu) idx_mem[m] = R.mem.bytes[HKV_TIER_INDEX];
            int32_t needle[8];
            if (!P) P = make_prompt(&W, &R, 512, 0, needle);   /* the world's prompt, once */
            else prefill(&R, &W, P - 512, 512);
            for (int64_t t = 0; t < T; t++) {
                const float *q = next_query(&W, P + t);
                for (int h = 0; h < W.KH; h++) rec[dcu][m] += select_check(&R, &W, h, q, NULL);
            }
            rec[dcu][m] /= (double)(T * W.KH);
            runner_close(&R);
        }
    printf("sketch approx d=%3d g=%d%s: recall fp16 %.3f / int8 %.3f / 4-bit %.3f (dcu=0), "
           "%.3f / %.3f / %.3f (dcu=1)\n", d, g, hard ? " outliers+ties" : "", rec[0][0], rec[0][1],
           rec[0][2], rec[1][0], rec[1][1], rec[1][2]);
    for (int dcu = 0; dcu < 2; dcu++) {
        CHECK(rec[dcu][1] >= rec[dcu][0] - 0.15, "sketch=2 dcu=%d: recall %.3f, fp16 %.3f", dcu,
              rec[dcu][1], rec[dcu][0]);
        CHECK(rec[dcu][2] >= rec[dcu][0] - 0.2 && rec[dcu][2] >= 0.75,
              "sketch=3 dcu=%d: recall %.3f, fp16 %.3f", dcu, rec[dcu][2], rec[dcu][0]);
    }
    /* codes d / 2 against d bytes a row, scales d / 8 each: the 4-bit copy is 80 / 144 of the int8 one */
    const double extra2 = (double)idx_mem[1] - (double)idx_mem[0], extra3 = (double)idx_mem[2] - (double)idx_mem[0];
    CHECK(idx_mem[0] > 0 && fabs(extra3 / extra2 - (d / 2.0 + d / 8.0) / (d + d / 8.0)) < 0.01,
          "sketch memory: int8 %.0f, 4-bit %.0f bytes beside the index", extra2, extra3);
    world_free(&W);
}

/* ---- prefill_end at 32K ------------------------------------------------------------ */

static void bench_prefill(void)
{
    const char *e = getenv("HKV_CTKVR_BENCH_KH");
    const int KH = e ? atoi(e) : 2, g = 4, d = 128;
    const int64_t n_far = 32768, C = 2048;
    world W;
    world_init(&W, KH, g, d, n_far + 4 + 256 + 16, n_far, 512, 0.98f, 321);
    runner R;
    const char *args[] = {"C=2048"};
    if (runner_open(&R, &W, args, 1)) {
        CHECK(0, "open");
        return;
    }
    const int64_t P = W.hi + 256;
    for (int64_t p = P - C - 50; p < P; p++) next_query(&W, p);
    hkv_query_view qv;
    uint16_t *q = query_rows(&W, P - C, C, &qv);
    hkv_far_view f = far_of(&W);
    hkv_err err = {0};
    double t0 = omp_get_wtime();
    clock_t c0 = clock();   /* CPU seconds too: other jobs may share the cores */
    CHECK(R.pol.ops->prefill_end(R.pol.self, 0, &f, &qv, &err) == 0, "%s", err.msg);
    double t1 = omp_get_wtime(), cpu = (double)(clock() - c0) / CLOCKS_PER_SEC;
    double gflop = 2.0 * (double)C * W.H * (double)n_far * d / 1e9;
    const float *qq = next_query(&W, P);
    double t2 = omp_get_wtime();
    for (int rep = 0; rep < 20; rep++)
        for (int h = 0; h < KH; h++)
            R.pol.ops->select(R.pol.self, 0, h, qq + (int64_t)h * g * d, &f, R.out, &R.ws);
    double t3 = omp_get_wtime();
    char desc[512];
    R.pol.ops->describe(R.pol.self, desc, sizeof desc);
    printf("prefill_end: far 32768, d=128, C=2048, %d KV heads x g=4, %d threads: %.3f s wall, "
           "%.3f s CPU (%.1f GFLOP: %.1f GFLOP/s, %.1f per CPU second); select %.3f ms per KV "
           "head\n  %s\n", KH, omp_get_max_threads(), t1 - t0, cpu, gflop, gflop / (t1 - t0),
           gflop / cpu, (t3 - t2) * 1e3 / (20.0 * KH), desc);
    free(q);
    runner_close(&R);
    world_free(&W);
}

int main(int argc, char **argv)
{
    int bench_only = argc > 1 && !strcmp(argv[1], "bench");
    if (!bench_only) {
        test_params();
        const int dims[] = {64, 128}, gs[] = {1, 3, 4};
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 3; b++) test_build(dims[a], gs[b], 3000, 100, 0);
        test_build(128, 4, 20000, 600, 0);    /* sampled starting thresholds */
        test_build(64, 3, 10000, 3000, 1);    /* ... and their fallback */
        /* the defaults (dcu=1): >= 0.88 per shape, >= 0.9 over the six; no update and the
         * refresh variant: >= 0.9 per shape (the FIFO's near-copy centroids cost it a little) */
        const char *mode[3] = {"dcu=0", NULL, "dcu=2"};
        for (int m = 0; m < 3; m++) {
            double sum = 0;
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 3; b++)
                    sum += test_recall(dims[a], gs[b], 512, mode[m] ? mode[m] : "default", mode[m],
                                       mode[m] ? 0.9 : 0.88);
            printf("recall %s: %.3f over the six shapes\n", mode[m] ? mode[m] : "default", sum / 6);
            CHECK(sum / 6 >= 0.9, "recall %s: %.3f over the six shapes", mode[m] ? mode[m] : "default",
                  sum / 6);
        }
        test_recall(64, 4, 20, "short prompt", NULL, 0.85);
        test_recall(128, 3, 20, "short prompt", NULL, 0.85);
        test_empty();
        test_dcu_drift(64, 4);
        test_dcu_drift(128, 1);
        test_turn2();
        test_concurrent();
        test_sketch(64, 4, 0);
        test_sketch(128, 4, 0);
        test_sketch(128, 1, 1);
        test_sketch(64, 3, 1);
        test_sketch_approx(64, 3, 0);
        test_sketch_approx(128, 4, 0);
        test_sketch_approx(128, 4, 1);
    }
    bench_prefill();
    printf(fails ? "%d FAILED\n" : "all passed\n", fails);
    return fails ? 1 : 0;
}

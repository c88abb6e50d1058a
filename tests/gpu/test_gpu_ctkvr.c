/* GPU CTKVR against the host policy (index/ctkvr.c, ctkvr_build.c) on one
 * synthetic layer:
 *  - build: the host policy's prompt end and hkv_gpu_ctkvr_build from the
 *    same last-C queries; centroids bit-equal; every list holds rho distinct
 *    positions of [lo, hi) and equals the host's as a set, except where the
 *    float64 scores tie within 1e-5 at the rho-th place (at most 5% of lists);
 *    both the sampled-threshold path (n_far >= 8192) and a short far tier
 *    (n_far <= rho: every position) are covered;
 *  - recall: candidate ids (sorted) equal to what the host's select returns
 *    when nothing is reranked (dcu=0, rho' above any candidate count), for
 *    FIFOs full, wrapped and partly filled, with a decode tail; steps whose
 *    float64 cosines tie within 1e-4 at the C'-th place are not compared;
 *  - recall only (hkv_gpu_recall_top, the pipeline's): the host's
 *    select_recalled given the device's top C' slots returns exactly what
 *    select returns, same near ties skipped;
 *  - DCU: FIFO, centroid bits, list and length after the device update equal
 *    the host's FIFO push with the same rerank picks. */
#include <omp.h>

#include "util.h"
#include "ctkvr_impl.h"
#include "gpu_forward.h"
#include "gpu_test.h"

typedef struct world {
    int KH, g, H, d;
    int64_t lo, hi, cap, C, Cp, rho, tail;
    int64_t ws_cent;          /* centroids the build's workspace holds */
    uint16_t *k, *v;          /* [KH][cap][d] */
    const uint16_t *kp[8], *vp[8];
    uint16_t *qv;             /* [C][H][d] the last prompt queries */
    hkv_cpu_kernels kern;
} world;

static void gauss_half_rows(test_rng *r, uint16_t *dst, int64_t n, float amp)
{
    for (int64_t i = 0; i < n; i++) {
        double u1 = ((rng_next(r) >> 11) + 0.5) / 9007199254740992.0, u2 = (rng_next(r) >> 11) / 9007199254740992.0;
        dst[i] = double_to_half_ref(fmax(-2, fmin(2, amp * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2))));
    }
}

static void world_init(world *W, int64_t nfar, int64_t C, int g, int d, test_rng *r)
{
    W->KH = 3, W->g = g, W->H = 3 * g, W->d = d;
    W->lo = 4, W->hi = 4 + nfar, W->cap = W->hi + 64;
    W->C = C, W->Cp = 4, W->rho = 100, W->tail = 40;
    /* 20 centroids a launch (three per KV head: the offsets into the centroid
     * rows), or every one (several tensor-core blocks of them) */
    W->ws_cent = C > 64 ? C : 20;
    hkv_cpu_kernels_init(&W->kern, test_best_isa());
    W->k = malloc((size_t)W->KH * W->cap * W->d * 2);
    W->v = malloc((size_t)W->KH * W->cap * W->d * 2);
    gauss_half_rows(r, W->k, (int64_t)W->KH * W->cap * W->d, 0.5f);
    gauss_half_rows(r, W->v, (int64_t)W->KH * W->cap * W->d, 0.5f);
    for (int h = 0; h < W->KH; h++) {
        W->kp[h] = W->k + (int64_t)h * W->cap * W->d;
        W->vp[h] = W->v + (int64_t)h * W->cap * W->d;
    }
    W->qv = malloc((size_t)W->C * W->H * W->d * 2);
    gauss_half_rows(r, W->qv, W->C * W->H * W->d, 0.5f);
}

static hkv_far_view far_view(const world *W, int64_t hi)
{
    hkv_far_view f = {.n_head_kv = W->KH, .head_dim = W->d, .lo = W->lo, .hi = hi, .k = W->kp,
                      .v = W->vp, .ld = W->d};
    return f;
}

static int open_policy(hkv_policy *p, const world *W, hkv_mem_account *mem)
{
    const hkv_policy_def *def = &hkv_policy_ctkvr;
    hkv_policy_args a;
    hkv_err err = {0};
    char buf[4][64];
    snprintf(buf[0], 64, "C=%lld", (long long)W->C);
    snprintf(buf[1], 64, "Cp=%lld", (long long)W->Cp);
    snprintf(buf[2], 64, "rho=%lld", (long long)W->rho);
    snprintf(buf[3], 64, "tail=%lld", (long long)W->tail);
    const char *args[] = {buf[0], buf[1], buf[2], buf[3], "dcu=0", "rho_p=1048576"};
    hkv_policy_args_init(def, &a);
    for (int i = 0; i < 6; i++)
        if (hkv_policy_arg_set(def, &a, args[i], &err)) gpu_die(args[i], &err);
    hkv_policy_env env = {.shape = {1, W->H, W->KH, W->d}, .n_ctx = W->cap, .L_init = 4,
                          .L_local = 64, .kern = &W->kern, .mem = mem, .n_threads = 2};
    if (def->create(p, &a, &env, &err)) gpu_die("ctkvr create", &err);
    hkv_far_view f = far_view(W, W->hi);
    hkv_query_view qv = {.n = W->C, .pos0 = W->hi + 64 - W->C, .q = W->qv, .ld = W->H * W->d};
    if (p->ops->prefill_end(p->self, 0, &f, &qv, &err)) gpu_die("ctkvr prefill_end", &err);
    return 0;
}

/* Float64 group-max score of centroid row i (fp16 queries) with key p of head h. */
static double score64(const world *W, int64_t i, int h, int64_t p)
{
    double best = -INFINITY;
    for (int j = 0; j < W->g; j++) {
        const uint16_t *q = W->qv + (i * W->H + (int64_t)h * W->g + j) * W->d;
        const uint16_t *k = W->kp[h] + p * W->d;
        double s = 0;
        for (int e = 0; e < W->d; e++) s += half_to_double(q[e]) * half_to_double(k[e]);
        best = fmax(best, s);
    }
    return best;
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

typedef struct gix { hkv_gpu_ctkvr ix; size_t cent_b, ivf_b, len_b, fifo_b; } gix;

static void gix_alloc(hkv_gpu_ctx *ctx, gix *G, const world *W, int n_seq)
{
    hkv_err err = {0};
    G->ix = (hkv_gpu_ctkvr){.n_seq = n_seq, .n_head = W->H, .n_head_kv = W->KH, .d = W->d,
                            .C = W->C, .rho = W->rho};
    G->cent_b = (size_t)n_seq * W->C * W->H * W->d * 2;
    G->ivf_b = (size_t)n_seq * W->KH * W->C * W->rho * 4;
    G->len_b = (size_t)n_seq * W->KH * W->C * 4;
    G->fifo_b = (size_t)n_seq * W->KH * 2 * 4;
    if (!(G->ix.cent = hkv_gpu_alloc(ctx, HKV_TIER_INDEX, G->cent_b, &err)) ||
        !(G->ix.ivf = hkv_gpu_alloc(ctx, HKV_TIER_INDEX, G->ivf_b, &err)) ||
        !(G->ix.len = hkv_gpu_alloc(ctx, HKV_TIER_INDEX, G->len_b, &err)) ||
        !(G->ix.fifo = hkv_gpu_alloc(ctx, HKV_TIER_INDEX, G->fifo_b, &err)))
        gpu_die("index allocation", &err);
}

/* Sequence s of the device index := the host policy's layer 0. */
static void gix_upload(hkv_gpu_ctx *ctx, gix *G, const world *W, int s, const ct_layer *ly)
{
    hkv_err err = {0};
    void *st = hkv_gpu_ctx_stream(ctx);
    const size_t n_seq = (size_t)G->ix.n_seq;
    int32_t fifo[16];
    for (int h = 0; h < W->KH; h++) fifo[2 * h] = ly->kv[h].head, fifo[2 * h + 1] = ly->kv[h].count;
    if (hkv_gpu_upload((char *)G->ix.cent + G->cent_b / n_seq * s, ly->cent, G->cent_b / n_seq, st, &err) ||
        hkv_gpu_upload((char *)G->ix.ivf + G->ivf_b / n_seq * s, ly->ivf, G->ivf_b / n_seq, st, &err) ||
        hkv_gpu_upload((char *)G->ix.len + G->len_b / n_seq * s, ly->len, G->len_b / n_seq, st, &err) ||
        hkv_gpu_upload((char *)G->ix.fifo + G->fifo_b / n_seq * s, fifo, G->fifo_b / n_seq, st, &err) ||
        hkv_gpu_sync(st, &err))
        gpu_die("index upload", &err);
}

/* Build on the device into sequence 1 with the given score kernel and
 * compare with the host's lists; the device's lists and lengths go to
 * got_ivf / got_len (KH*C*rho, KH*C). */
static int test_build_one(hkv_gpu_ctx *ctx, gix *G, const world *W, const ct_layer *ly,
                          hkv_gpu_scores_kernel kernel, int32_t *got_ivf, int32_t *got_len)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int KH = W->KH;
    const int64_t C = W->C, rho = W->rho, nfar = W->hi - W->lo;
    int32_t *slot = malloc(KH * C * 4);
    for (int h = 0; h < KH; h++)
        for (int64_t i = 0; i < C; i++) slot[h * C + i] = (int32_t)i;   /* a first build: in order */
    int32_t fifo[16];
    for (int h = 0; h < KH; h++) fifo[2 * h] = 0, fifo[2 * h + 1] = (int32_t)C;
    const size_t kb = (size_t)KH * W->cap * W->d * 2, qb = (size_t)C * W->H * W->d * 2;
    uint16_t *dk = gpu_put(ctx, W->k, kb), *dq = gpu_put(ctx, W->qv, qb);
    int32_t *dslot = gpu_put(ctx, slot, KH * C * 4);
    GPU_OK(hkv_gpu_upload(G->ix.fifo + 2 * KH, fifo, KH * 2 * 4, st, err));
    const size_t wsb = hkv_gpu_ctkvr_build_ws_bytes(nfar, W->ws_cent);
    void *ws = gpu_put(ctx, NULL, wsb ? wsb : 4);
    GPU_OK(hkv_gpu_ctkvr_build_with(&G->ix, 1, dq, W->H * W->d, C, dslot, dk, W->d,
                                    W->cap * W->d, W->lo, W->hi, ws, wsb, kernel, st, err));
    uint16_t *cent = malloc(qb);
    int32_t *ivf = got_ivf, *len = got_len;
    gpu_get(ctx, cent, (char *)G->ix.cent + qb, qb);
    gpu_get(ctx, ivf, G->ix.ivf + KH * C * rho, KH * C * rho * 4);
    gpu_get(ctx, len, G->ix.len + KH * C, KH * C * 4);
    CHECK(memcmp(cent, ly->cent, qb) == 0, "built centroids differ from the host's (n_far %lld)",
          (long long)nfar);
    const int64_t want = nfar < rho ? nfar : rho;
    int lens_bad = 0, invalid = 0, differ = 0, not_tie = 0;
    double *sc = malloc(nfar * 8), *srt = malloc(nfar * 8);
    int32_t *a = malloc(rho * 4), *b = malloc(rho * 4);
    for (int h = 0; h < KH; h++)
        for (int64_t i = 0; i < C; i++) {
            const int64_t li = h * C + i;
            if (len[li] != want || ly->len[li] != want) { lens_bad++; continue; }
            memcpy(a, ivf + li * rho, want * 4);
            memcpy(b, ly->ivf + li * rho, want * 4);
            qsort(a, want, 4, cmp_i32), qsort(b, want, 4, cmp_i32);
            for (int64_t e = 0; e < want; e++)
                invalid += a[e] < W->lo || a[e] >= W->hi || (e && a[e] == a[e - 1]);
            if (!memcmp(a, b, want * 4)) continue;
            differ++;
            /* a difference is fine only among scores tied with the rho-th best */
            for (int64_t p = 0; p < nfar; p++) srt[p] = sc[p] = score64(W, i, h, W->lo + p);
            qsort(srt, nfar, 8, cmp_desc);
            const double thr = srt[want - 1], tol = 1e-5 * fmax(1, fabs(thr));
            for (int64_t e = 0; e < want; e++) {
                int in_b = bsearch(&a[e], b, want, 4, cmp_i32) != NULL;
                if (!in_b && sc[a[e] - W->lo] < thr - tol) not_tie++;
            }
        }
    CHECK(lens_bad == 0 && invalid == 0 && not_tie == 0 && differ * 20 <= KH * C,
          "build n_far %lld: %d lengths wrong, %d invalid entries, %d lists differ (5%% allowed), "
          "%d entries not tied at the rho-th score", (long long)nfar, lens_bad, invalid, differ,
          not_tie);
    printf("build n_far %lld (%s scores): %d of %lld lists differ from the host's at float ties\n",
           (long long)nfar, kernel == HKV_GPU_SCORES_SIMT ? "simt" : kernel == HKV_GPU_SCORES_MMA
           ? "mma" : "auto", differ, (long long)(KH * C));
    if (kernel == HKV_GPU_SCORES_MMA && W->lo + W->rho < W->hi) {
        /* forced tensor cores on key rows off 16 bytes: refused, naming why */
        hkv_err e2 = {0};
        const int rc = hkv_gpu_ctkvr_build_with(&G->ix, 1, dq, W->H * W->d, C, dslot, dk + 2,
                                                W->d, W->cap * W->d, W->lo, W->hi - 2, ws, wsb,
                                                kernel, st, &e2);
        CHECK(rc == HKV_E_UNSUPPORTED && strstr(e2.msg, "16-byte"),
              "forced mma on misaligned keys: rc %d (%s)", rc, e2.msg);
    }
    gpu_drop(ctx, dk, kb), gpu_drop(ctx, dq, qb), gpu_drop(ctx, dslot, KH * C * 4);
    gpu_drop(ctx, ws, wsb ? wsb : 4);
    free(slot), free(cent), free(sc), free(srt), free(a), free(b);
    return differ;
}

/* Both score kernels against the host (the CUDA-core one in the worlds of
 * 48 centroids); the automatic pick (tensor cores in every world here) bit
 * for bit the kernel it picks. */
static int test_build(hkv_gpu_ctx *ctx, gix *G, const world *W, const ct_layer *ly)
{
    const size_t nl = (size_t)W->KH * W->C;
    int32_t *ivf[3], *len[3];
    for (int i = 0; i < 3; i++) ivf[i] = malloc(nl * W->rho * 4), len[i] = malloc(nl * 4);
    if (W->C <= 64)   /* (the large world is for the tensor-core blocks of centroids) */
        test_build_one(ctx, G, W, ly, HKV_GPU_SCORES_SIMT, ivf[0], len[0]);
    test_build_one(ctx, G, W, ly, HKV_GPU_SCORES_MMA, ivf[1], len[1]);
    const int differ = test_build_one(ctx, G, W, ly, HKV_GPU_SCORES_AUTO, ivf[2], len[2]);
    CHECK(!memcmp(ivf[1], ivf[2], nl * W->rho * 4) && !memcmp(len[1], len[2], nl * 4),
          "build: the automatic pick's lists differ from the tensor-core kernel's (d %d)", W->d);
    for (int i = 0; i < 3; i++) free(ivf[i]), free(len[i]);
    return differ;
}

/* Float64 gap at the C'-th place of the recall cosines: a near tie makes
 * the device and host choices legitimately differ. */
static double recall_gap(const world *W, const ct_layer *ly, int h, const float *q)
{
    const int64_t n = ly->kv[h].count;
    if (n <= W->Cp) return INFINITY;
    double *c = malloc(n * 8);
    for (int64_t i = 0; i < n; i++) {
        int64_t sl = (ly->kv[h].head + i) % W->C;
        double best = -INFINITY;
        for (int j = 0; j < W->g; j++) {
            const float *qj = q + ((int64_t)h * W->g + j) * W->d;
            const uint16_t *cj = ly->cent + (sl * W->H + (int64_t)h * W->g + j) * W->d;
            double ss = 0, s = 0;
            for (int e = 0; e < W->d; e++) ss += (double)qj[e] * qj[e];
            for (int e = 0; e < W->d; e++) s += qj[e] / sqrt(ss) * half_to_double(cj[e]);
            best = fmax(best, s);
        }
        c[i] = best;
    }
    qsort(c, n, 8, cmp_desc);
    double gap = c[W->Cp - 1] - c[W->Cp];
    free(c);
    return gap;
}

static void test_recall(hkv_gpu_ctx *ctx, gix *G, world *W, hkv_policy *p, int compare_seq1,
                        test_rng *r)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    ctkvr *s = p->self;
    ct_layer *ly = &s->lay[0];
    const int KH = W->KH, H = W->H, d = W->d, n_seq = G->ix.n_seq;
    const int64_t hi2 = W->hi + 30;   /* 30 tokens spilled in decode: the tail */
    const int64_t max_far = hi2 - W->lo, cap = W->Cp * W->rho + W->tail;
    const int64_t t0 = hi2 - W->tail > ly->indexed_hi ? hi2 - W->tail : ly->indexed_hi;
    int64_t far[3 * 4];
    for (int q = 0; q < n_seq; q++) far[3 * q] = W->lo, far[3 * q + 1] = hi2, far[3 * q + 2] = t0;
    const size_t wsb = hkv_gpu_ctkvr_recall_ws_bytes(&G->ix, max_far);
    void *ws = gpu_put(ctx, NULL, wsb);
    int64_t *dfar = gpu_put(ctx, far, sizeof far);
    int32_t *dcand = gpu_put(ctx, NULL, (size_t)n_seq * KH * cap * 4);
    int32_t *dn = gpu_put(ctx, NULL, (size_t)n_seq * KH * 4);
    float *dq = gpu_put(ctx, NULL, (size_t)n_seq * H * d * 4);
    int32_t *cand = malloc((size_t)n_seq * KH * cap * 4), *ncand = malloc(n_seq * KH * 4);
    float *q = malloc((size_t)n_seq * H * d * 4);
    hkv_policy_scratch sw = {0};
    p->ops->scratch_need(p->self, max_far, &sw.nf, &sw.ni);
    sw.f = malloc(sw.nf * 4 + 4), sw.i = malloc(sw.ni * 4 + 4);
    int32_t *out = malloc((p->ops->max_select(p->self, max_far) + 1) * 4);
    int32_t *out2 = malloc((p->ops->max_select(p->self, max_far) + 1) * 4);
    /* recall only: one descriptor per query row, all on sequence 0's table */
    hkv_gpu_recall_row rrow[4];
    for (int qs = 0; qs < n_seq; qs++)
        rrow[qs] = (hkv_gpu_recall_row){.tab = G->ix.cent, .fifo = G->ix.fifo, .row = qs,
                                        .C = W->C, .k = W->Cp};
    hkv_gpu_recall_row *drow = gpu_put(ctx, rrow, sizeof rrow);
    const size_t rws_b = hkv_gpu_recall_top_ws_bytes(n_seq, KH, W->C);
    void *rws = gpu_put(ctx, NULL, rws_b);
    int32_t *dslot = gpu_put(ctx, NULL, (size_t)n_seq * KH * W->Cp * 4);
    float *dscore = gpu_put(ctx, NULL, (size_t)n_seq * KH * W->Cp * 4);
    int32_t *dntop = gpu_put(ctx, NULL, (size_t)n_seq * KH * 4);
    int32_t *slot = malloc((size_t)n_seq * KH * W->Cp * 4), *ntop = malloc(n_seq * KH * 4);
    float *score = malloc((size_t)n_seq * KH * W->Cp * 4);
    int rbad = 0, rcompared = 0;
    hkv_far_view f = far_view(W, hi2);
    /* FIFO states: as built (full, from slot 0), wrapped, partly filled */
    const int32_t heads[3] = {0, 17, 5}, counts[3] = {(int32_t)W->C, (int32_t)W->C, 29};
    int compared = 0, skipped = 0, bad = 0, bad1 = 0;
    for (int fs = 0; fs < 3; fs++) {
        for (int h = 0; h < KH; h++) ly->kv[h].head = heads[fs], ly->kv[h].count = counts[fs];
        gix_upload(ctx, G, W, 0, ly);
        if (compare_seq1) {   /* the device-built lists, same FIFO */
            int32_t fifo[16];
            for (int h = 0; h < KH; h++) fifo[2 * h] = heads[fs], fifo[2 * h + 1] = counts[fs];
            GPU_OK(hkv_gpu_upload(G->ix.fifo + 2 * KH, fifo, KH * 8, st, err));
        }
        for (int step = 0; step < 6; step++) {
            /* queries near a prompt query (so recall has a clear winner) or random */
            for (int qs = 0; qs < n_seq; qs++) {
                const int64_t row = (int64_t)(rng_next(r) % (uint64_t)W->C);
                for (int64_t i = 0; i < H * d; i++)
                    q[qs * H * d + i] = (float)half_to_double(W->qv[row * H * d + i]) * (step & 1) +
                                        rng_uniform(r, -0.5f, 0.5f);
            }
            GPU_OK(hkv_gpu_upload(dq, q, (size_t)n_seq * H * d * 4, st, err));
            GPU_OK(hkv_gpu_ctkvr_recall(&G->ix, dq, W->Cp, dfar, max_far, dcand, cap, dn, ws, wsb,
                                        st, err));
            gpu_get(ctx, cand, dcand, (size_t)n_seq * KH * cap * 4);
            gpu_get(ctx, ncand, dn, n_seq * KH * 4);
            GPU_OK(hkv_gpu_recall_top(drow, n_seq, dq, (int64_t)H * d, H, KH, d, W->Cp, W->C,
                                      dslot, dscore, dntop, rws, rws_b, st, err));
            gpu_get(ctx, slot, dslot, (size_t)n_seq * KH * W->Cp * 4);
            gpu_get(ctx, score, dscore, (size_t)n_seq * KH * W->Cp * 4);
            gpu_get(ctx, ntop, dntop, n_seq * KH * 4);
            for (int qs = 0; qs < n_seq; qs++)
                for (int h = 0; h < KH; h++) {
                    const float *qq = q + qs * H * d;
                    if (recall_gap(W, ly, h, qq) < 1e-4) continue;
                    const int64_t u = (int64_t)qs * KH + h;
                    const hkv_recalled rec = {slot + u * W->Cp, score + u * W->Cp, ntop[u]};
                    int64_t n1 = p->ops->select(p->self, 0, h, qq + h * W->g * d, &f, out, &sw);
                    int64_t n2 = p->ops->select_recalled(p->self, 0, h, qq + h * W->g * d, &f,
                                                         &rec, out2, &sw);
                    if (n1 < 0 || n1 != n2 || memcmp(out, out2, (size_t)n1 * 4)) {
                        if (rbad++ < 3)
                            fprintf(stderr, "  recall-only fifo %d step %d row %d head %d: %lld "
                                    "positions given the device's slots, %lld by select\n", fs,
                                    step, qs, h, (long long)n2, (long long)n1);
                    }
                    rcompared++;
                }
            for (int qs = 0; qs < (compare_seq1 ? 2 : 1); qs++)
                for (int h = 0; h < KH; h++) {
                    const float *qq = q + qs * H * d;
                    if (recall_gap(W, ly, h, qq) < 1e-4) { skipped++; continue; }
                    int64_t n = p->ops->select(p->self, 0, h, qq + h * W->g * d, &f, out, &sw);
                    const int64_t u = (int64_t)qs * KH + h;
                    int ok = n >= 0 && ncand[u] == n && n <= cap &&
                             !memcmp(cand + u * cap, out, (size_t)n * 4);
                    if (!ok) {
                        if (qs) bad1++; else bad++;
                        if (bad + bad1 <= 3)
                            fprintf(stderr, "  recall fifo %d step %d seq %d head %d: device %d "
                                    "candidates, host %lld\n", fs, step, qs, h, ncand[u], (long long)n);
                    }
                    compared++;
                }
        }
    }
    CHECK(bad == 0 && bad1 == 0 && compared > 0 && skipped <= compared / 4,
          "recall: %d of %d (host index) and %d (device-built index) candidate sets differ from "
          "the host select's; %d near ties skipped", bad, compared, bad1, skipped);
    printf("recall: %d candidate sets compared, %d near ties skipped\n", compared, skipped);
    CHECK(rbad == 0 && rcompared > 0, "recall only: %d of %d selections given the device's slots "
          "differ from select's", rbad, rcompared);
    printf("recall only: %d selections compared\n", rcompared);
    free(cand), free(ncand), free(q), free(sw.f), free(sw.i), free(out), free(out2), free(slot);
    free(ntop), free(score);
}

/* Device DCU on sequence 0 against the host FIFO push with the same picks. */
static void test_dcu(hkv_gpu_ctx *ctx, gix *G, world *W, hkv_policy *p, test_rng *r)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    ct_layer *ly = &((ctkvr *)p->self)->lay[0];
    const int KH = W->KH, H = W->H, d = W->d, g = W->g, n_seq = G->ix.n_seq;
    const int64_t C = W->C, rho = W->rho, sel_ld = rho + 20;
    for (int h = 0; h < KH; h++) ly->kv[h].head = 40, ly->kv[h].count = (int32_t)(h == 0 ? C - 1 : C);
    gix_upload(ctx, G, W, 0, ly);
    int32_t fifo1[16];
    gpu_get(ctx, fifo1, G->ix.fifo + 2 * KH, KH * 8);
    float *q = malloc((size_t)n_seq * H * d * 4), qn[256];
    int32_t *sel = malloc((size_t)n_seq * KH * sel_ld * 4), *nsel = malloc(n_seq * KH * 4);
    for (int64_t i = 0; i < (int64_t)n_seq * H * d; i++) q[i] = rng_nonzero(r, -1, 1);
    for (int64_t u = 0; u < (int64_t)n_seq * KH; u++) {
        nsel[u] = u >= KH ? 0 : u == 0 ? (int32_t)sel_ld : u == 1 ? 0 : 37;   /* cut, none, short */
        for (int64_t e = 0; e < sel_ld; e++) sel[u * sel_ld + e] = (int32_t)(W->lo + rng_next(r) % (uint64_t)(W->hi - W->lo));
    }
    float *dq = gpu_put(ctx, q, (size_t)n_seq * H * d * 4);
    int32_t *dsel = gpu_put(ctx, sel, (size_t)n_seq * KH * sel_ld * 4), *dn = gpu_put(ctx, nsel, n_seq * KH * 4);
    GPU_OK(hkv_gpu_ctkvr_dcu(&G->ix, dq, dsel, sel_ld, dn, st, err));
    /* the host's update with the same picks (ctkvr.c's dcu_push, dcu=1) */
    for (int h = 0; h < KH; h++) {
        if (nsel[h] <= 0) continue;
        int32_t sl = hkv_ctkvr_fifo_push(&ly->kv[h], C);
        for (int j = 0; j < g; j++) {
            const float *qj = q + ((int64_t)h * g + j) * d;
            double ss = 0;
            for (int e = 0; e < d; e++) ss += (double)qj[e] * qj[e];
            float rr = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
            for (int e = 0; e < d; e++) qn[e] = qj[e] * rr;
            W->kern.f32_to_f16(qn, ly->cent + ((int64_t)sl * H + (int64_t)h * g + j) * d, d);
        }
        int64_t n = nsel[h] < rho ? nsel[h] : rho;
        memcpy(ly->ivf + ((int64_t)h * C + sl) * rho, sel + h * sel_ld, n * 4);
        ly->len[(int64_t)h * C + sl] = (int32_t)n;
    }
    const size_t cb = (size_t)C * H * d * 2, ib = (size_t)KH * C * rho * 4, lb = (size_t)KH * C * 4;
    uint16_t *cent = malloc(cb);
    int32_t *ivf = malloc(ib), *len = malloc(lb), fifo[32];
    gpu_get(ctx, cent, G->ix.cent, cb);
    gpu_get(ctx, ivf, G->ix.ivf, ib);
    gpu_get(ctx, len, G->ix.len, lb);
    gpu_get(ctx, fifo, G->ix.fifo, (size_t)n_seq * KH * 8);
    int fifo_bad = 0, list_bad = 0;
    for (int h = 0; h < KH; h++) {
        fifo_bad += fifo[2 * h] != ly->kv[h].head || fifo[2 * h + 1] != ly->kv[h].count;
        fifo_bad += fifo[2 * KH + 2 * h] != fifo1[2 * h] || fifo[2 * KH + 2 * h + 1] != fifo1[2 * h + 1];
        for (int64_t sl = 0; sl < C; sl++) {
            const int64_t li = h * C + sl;
            list_bad += len[li] != ly->len[li] ||
                        memcmp(ivf + li * rho, ly->ivf + li * rho, (size_t)(len[li] > 0 ? len[li] : 0) * 4);
        }
    }
    CHECK(fifo_bad == 0 && list_bad == 0 && memcmp(cent, ly->cent, cb) == 0,
          "dcu: %d FIFO states and %d lists differ from the host's, centroids %s", fifo_bad,
          list_bad, memcmp(cent, ly->cent, cb) ? "differ" : "equal");
    free(q), free(sel), free(nsel), free(cent), free(ivf), free(len);
}

static void run_world(hkv_gpu_ctx *ctx, int64_t nfar, int64_t C, int g, int d, uint64_t seed)
{
    test_rng r = {seed};
    world W;
    world_init(&W, nfar, C, g, d, &r);
    printf("world: n_far %lld, C %lld, g %d, d %d\n", (long long)nfar, (long long)C, g, d);
    hkv_mem_account mem = {0};
    hkv_policy pol;
    open_policy(&pol, &W, &mem);
    ct_layer *ly = &((ctkvr *)pol.self)->lay[0];
    gix G;
    gix_alloc(ctx, &G, &W, 2);
    gix_upload(ctx, &G, &W, 0, ly);
    /* the device-built lists are compared in recall too when they equal the host's */
    int differ = test_build(ctx, &G, &W, ly);
    test_recall(ctx, &G, &W, &pol, differ == 0, &r);
    test_dcu(ctx, &G, &W, &pol, &r);
    pol.ops->destroy(pol.self);
    free(W.k), free(W.v), free(W.qv);
}

int main(void)
{
    hkv_gpu_ctx *ctx = gpu_test_open("gpu_ctkvr");
    /* (recall_common.cuh scores g 3 x d 64 and g 4 x d 128 in 16-byte loads,
     * d 40 one half a lane) */
    run_world(ctx, 3000, 48, 3, 64, 5);    /* thresholds from -inf */
    run_world(ctx, 9000, 48, 3, 64, 6);    /* the host's sampled thresholds */
    run_world(ctx, 80, 48, 3, 64, 7);      /* n_far <= rho: every position in every list */
    run_world(ctx, 3000, 48, 4, 128, 8);   /* Llama-3's group: two 16-byte loads a lane */
    run_world(ctx, 3000, 48, 3, 40, 9);    /* 5 lanes a head: the scalar path */
    /* a build launch of 136 centroids: three tensor-core blocks of them, the last partial */
    run_world(ctx, 2000, 136, 4, 128, 10);
    hkv_gpu_ctx_destroy(ctx);
    return test_report("gpu_ctkvr");
}

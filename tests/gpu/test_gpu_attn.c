/* GPU attention against the float64 reference (tests/cpu/ref.c), outputs
 * poisoned (NaN) with guards and stride padding that must stay NaN:
 *  - prefill (causal, query chunks at p0 = 0 and p0 > 0, token counts around
 *    the 32-key tile and the 8-row block, d = 32..256, GQA 1..4, and logits
 *    scaled up to stress the online softmax);
 *  - decode over contiguous rows and over gathered rows, n = 0 (out 0, lse
 *    -inf), 1, tile edges, several sequences;
 *  - merge against cpu/merge.c, including empty partials, and the split
 *    identity: merge(attn(A), attn(B)) = attn(A u B).
 * Bounds: per (row, head) max|out - ref| <= 1e-4 * max|ref|, |lse - ref| <=
 * 1e-4 * max(1, |ref|) (the cpu kernels' bounds). */
#include "ref.h"
#include "util.h"
#include "gpu_test.h"

typedef struct shape { int H, KH, d; } shape;
static const shape shapes[] = {{9, 3, 64}, {8, 2, 128}, {4, 4, 256}, {2, 1, 32}};

/* Compare one head's (out, lse) to the reference; returns 1 if within bounds. */
static int head_ok(const float *o, float l, const double *ro, double rl, int d, double *worst)
{
    double mx = 0, e = 0;
    for (int c = 0; c < d; c++) mx = fmax(mx, fabs(ro[c]));
    for (int c = 0; c < d; c++) {
        if (isnan(o[c])) return 0;
        e = fmax(e, fabs(o[c] - ro[c]));
    }
    if (rl == -INFINITY) return l == -INFINITY && e == 0;
    double el = fabs(l - rl) / fmax(1, fabs(rl));
    e = mx > 0 ? e / mx : e;
    *worst = fmax(*worst, fmax(e, el));
    return e <= 1e-4 && el <= 1e-4;
}

static uint16_t *rand_halves(test_rng *rng, size_t n)
{
    uint16_t *p = malloc(n * 2);
    for (size_t i = 0; i < n; i++) p[i] = rng_half(rng, -1, 1);
    return p;
}

static void test_prefill(hkv_gpu_ctx *ctx, const shape *sh, int64_t p0, int64_t nq, float amp,
                         test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int H = sh->H, KH = sh->KH, d = sh->d, g = H / KH;
    const int64_t cap = p0 + nq, ld = d + 8, hs = cap * ld, ldq = (int64_t)H * d + 4,
                  ldo = (int64_t)H * d + 2;
    uint16_t *k = rand_halves(rng, KH * hs), *v = rand_halves(rng, KH * hs);
    float *q = malloc(nq * ldq * 4), *out = malloc((nq * ldo + HKV_TEST_GUARD) * 4);
    float *lse = malloc((nq * H + HKV_TEST_GUARD) * 4);
    for (int64_t i = 0; i < nq * ldq; i++) q[i] = amp * rng_nonzero(rng, -1, 1);
    uint16_t *dk = gpu_put(ctx, k, KH * hs * 2), *dv = gpu_put(ctx, v, KH * hs * 2);
    float *dq = gpu_put(ctx, q, nq * ldq * 4);
    float *dout = gpu_poisoned(ctx, nq * ldo), *dlse = gpu_poisoned(ctx, nq * H);
    const float scale = 1.0f / sqrtf((float)d);
    GPU_OK(hkv_gpu_attn_prefill(dq, ldq, nq, H, KH, d, p0, dk, dv, ld, hs, scale, dout, ldo, dlse,
                                st, err));
    gpu_get(ctx, out, dout, (nq * ldo + HKV_TEST_GUARD) * 4);
    gpu_get(ctx, lse, dlse, (nq * H + HKV_TEST_GUARD) * 4);
    double ro[256], rl, worst = 0;
    int bad = 0, stray = 0;
    for (int64_t t = 0; t < nq; t++) {
        for (int qh = 0; qh < H; qh++) {
            const int h = qh / g;
            ref_attn(q + t * ldq + qh * d, 1, d, k + h * hs, v + h * hs, ld, NULL, p0 + t + 1, scale,
                     ro, &rl);
            bad += !head_ok(out + t * ldo + qh * d, lse[t * H + qh], ro, rl, d, &worst);
        }
        for (int64_t c = (int64_t)H * d; c < ldo; c++) stray += !isnan(out[t * ldo + c]);
    }
    CHECK(bad == 0 && stray == 0 && guard_intact(out, nq * ldo) && guard_intact(lse, nq * H),
          "prefill H=%d KH=%d d=%d p0=%lld nq=%lld amp %g: %d heads off (worst %.3g), %d stray",
          H, KH, d, (long long)p0, (long long)nq, amp, bad, worst, stray);
    free(k), free(v), free(q), free(out), free(lse);
}

/* Decode over n_rows[u] rows of each (sequence, KV head), contiguous or
 * through idx; with idx also the split + merge identity. */
static void test_decode(hkv_gpu_ctx *ctx, const shape *sh, int n_seq, int use_idx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int H = sh->H, KH = sh->KH, d = sh->d, g = H / KH;
    const int64_t cap = 300, ld = d + 2, hs = cap * ld, ss = KH * hs, npair = (int64_t)n_seq * KH;
    static const int32_t lens[] = {0, 1, 31, 32, 33, 300, 77};
    uint16_t *k = rand_halves(rng, n_seq * ss), *v = rand_halves(rng, n_seq * ss);
    float *q = malloc(n_seq * H * d * 4);
    for (int64_t i = 0; i < n_seq * H * d; i++) q[i] = 2.0f * rng_nonzero(rng, -1, 1);
    int32_t *nr = malloc(npair * 4), *idx = malloc(npair * cap * 4);
    for (int64_t u = 0; u < npair; u++) {
        nr[u] = lens[(u + n_seq) % 7];
        int32_t *ix = idx + u * cap;   /* a random permutation prefix: distinct rows */
        for (int64_t i = 0; i < cap; i++) ix[i] = (int32_t)i;
        for (int64_t i = cap - 1; i > 0; i--) {
            int64_t j = (int64_t)(rng_next(rng) % (uint64_t)(i + 1));
            int32_t t = ix[i];
            ix[i] = ix[j], ix[j] = t;
        }
    }
    uint16_t *dk = gpu_put(ctx, k, n_seq * ss * 2), *dv = gpu_put(ctx, v, n_seq * ss * 2);
    float *dq = gpu_put(ctx, q, n_seq * H * d * 4);
    int32_t *dnr = gpu_put(ctx, nr, npair * 4), *didx = gpu_put(ctx, idx, npair * cap * 4);
    float *dout = gpu_poisoned(ctx, n_seq * H * d), *dlse = gpu_poisoned(ctx, n_seq * H);
    float *out = malloc((n_seq * H * d + HKV_TEST_GUARD) * 4), *lse = malloc((n_seq * H + HKV_TEST_GUARD) * 4);
    const float scale = 1.0f / sqrtf((float)d);
    GPU_OK(hkv_gpu_attn_decode(dq, n_seq, H, KH, d, dk, dv, ld, hs, ss, dnr,
                               use_idx ? didx : NULL, cap, scale, dout, dlse, st, err));
    gpu_get(ctx, out, dout, (n_seq * H * d + HKV_TEST_GUARD) * 4);
    gpu_get(ctx, lse, dlse, (n_seq * H + HKV_TEST_GUARD) * 4);
    double ro[16 * 256], rl[16], worst = 0;
    int bad = 0;
    for (int s = 0; s < n_seq; s++)
        for (int h = 0; h < KH; h++) {
            const int64_t u = (int64_t)s * KH + h;
            ref_attn(q + ((int64_t)s * H + h * g) * d, g, d, k + s * ss + h * hs, v + s * ss + h * hs,
                     ld, use_idx ? idx + u * cap : NULL, nr[u], scale, ro, rl);
            for (int j = 0; j < g; j++) {
                const int64_t qh = (int64_t)s * H + h * g + j;
                bad += !head_ok(out + qh * d, lse[qh], ro + j * d, rl[j], d, &worst);
            }
        }
    CHECK(bad == 0 && guard_intact(out, n_seq * H * d) && guard_intact(lse, n_seq * H),
          "decode H=%d KH=%d d=%d %s: %d heads off (worst %.3g)", H, KH, d,
          use_idx ? "gathered" : "contiguous", bad, worst);

    /* split identity: rows idx[0..a) and idx[a..n) merged equal all n rows */
    if (use_idx) {
        int32_t *na = malloc(npair * 4), *nb = malloc(npair * 4);
        for (int64_t u = 0; u < npair; u++) na[u] = nr[u] / 3, nb[u] = nr[u] - nr[u] / 3;
        int32_t *dna = gpu_put(ctx, na, npair * 4), *dnb = gpu_put(ctx, nb, npair * 4);
        float *da = gpu_poisoned(ctx, n_seq * H * d), *dla = gpu_poisoned(ctx, n_seq * H);
        float *db = gpu_poisoned(ctx, n_seq * H * d), *dlb = gpu_poisoned(ctx, n_seq * H);
        /* the second part's indices start at na[u]: a shifted idx with the same stride */
        int32_t *idx_b = malloc(npair * cap * 4);
        for (int64_t u = 0; u < npair; u++)
            for (int64_t i = 0; i < cap; i++)
                idx_b[u * cap + i] = i + na[u] < cap ? idx[u * cap + i + na[u]] : 0;
        int32_t *didx_b = gpu_put(ctx, idx_b, npair * cap * 4);
        GPU_OK(hkv_gpu_attn_decode(dq, n_seq, H, KH, d, dk, dv, ld, hs, ss, dna, didx, cap, scale,
                                   da, dla, st, err));
        GPU_OK(hkv_gpu_attn_decode(dq, n_seq, H, KH, d, dk, dv, ld, hs, ss, dnb, didx_b, cap,
                                   scale, db, dlb, st, err));
        GPU_OK(hkv_gpu_attn_merge(da, dla, db, dlb, (int64_t)n_seq * H, d, st, err));
        gpu_get(ctx, out, da, n_seq * H * d * 4);
        gpu_get(ctx, lse, dla, n_seq * H * 4);
        bad = 0, worst = 0;
        for (int s = 0; s < n_seq; s++)
            for (int h = 0; h < KH; h++) {
                const int64_t u = (int64_t)s * KH + h;
                ref_attn(q + ((int64_t)s * H + h * g) * d, g, d, k + s * ss + h * hs,
                         v + s * ss + h * hs, ld, idx + u * cap, nr[u], scale, ro, rl);
                for (int j = 0; j < g; j++) {
                    const int64_t qh = (int64_t)s * H + h * g + j;
                    bad += !head_ok(out + qh * d, lse[qh], ro + j * d, rl[j], d, &worst);
                }
            }
        CHECK(bad == 0, "decode split + merge H=%d KH=%d d=%d: %d heads off (worst %.3g)", H, KH,
              d, bad, worst);
        free(na), free(nb), free(idx_b);
    }
    free(k), free(v), free(q), free(nr), free(idx), free(out), free(lse);
}

static void test_merge(hkv_gpu_ctx *ctx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int64_t n = 1000;
    const int d = 80;   /* not a multiple of 32: lanes stride the row */
    float *oa = malloc(n * d * 4), *ob = malloc(n * d * 4), *la = malloc(n * 4), *lb = malloc(n * 4);
    for (int64_t i = 0; i < n * d; i++) oa[i] = rng_nonzero(rng, -1, 1), ob[i] = rng_nonzero(rng, -1, 1);
    for (int64_t i = 0; i < n; i++) {
        la[i] = rng_uniform(rng, -30, 30), lb[i] = rng_uniform(rng, -30, 30);
        if (i % 10 == 1) la[i] = -INFINITY;
        if (i % 10 == 2) lb[i] = -INFINITY;
        if (i % 10 == 3) la[i] = lb[i] = -INFINITY;
        if (i % 10 == 4) lb[i] = la[i];
        if (i % 10 == 5) lb[i] = la[i] + 80;   /* one side negligible */
    }
    float *da = gpu_put(ctx, oa, n * d * 4), *db = gpu_put(ctx, ob, n * d * 4);
    float *dla = gpu_put(ctx, la, n * 4), *dlb = gpu_put(ctx, lb, n * 4);
    GPU_OK(hkv_gpu_attn_merge(da, dla, db, dlb, n, d, st, err));
    float *go = malloc(n * d * 4), *gl = malloc(n * 4);
    gpu_get(ctx, go, da, n * d * 4);
    gpu_get(ctx, gl, dla, n * 4);
    hkv_attn_merge(oa, la, ob, lb, (int)n, d);   /* the host's merge, in place into oa, la */
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (la[i] == -INFINITY) bad += gl[i] != -INFINITY;
        else bad += !(fabsf(gl[i] - la[i]) <= 1e-6f * fmaxf(1, fabsf(la[i])));
        for (int c = 0; c < d; c++) bad += !(fabsf(go[i * d + c] - oa[i * d + c]) <= 1e-6f);
    }
    CHECK(bad == 0, "merge: %d values differ from cpu/merge.c", bad);
    free(oa), free(ob), free(la), free(lb), free(go), free(gl);
}

int main(void)
{
    hkv_gpu_ctx *ctx = gpu_test_open("gpu_attn");
    test_rng rng = {23};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *sh = &shapes[i];
        test_prefill(ctx, sh, 0, 1, 1.0f, &rng);
        test_prefill(ctx, sh, 0, 33, 1.0f, &rng);
        test_prefill(ctx, sh, 45, 100, 1.0f, &rng);
        test_prefill(ctx, sh, 300, 7, 8.0f, &rng);   /* peaky softmax */
        test_decode(ctx, sh, 3, 0, &rng);
        test_decode(ctx, sh, 3, 1, &rng);
    }
    /* a long prefill in chunks (p0 advancing), as a 128K prompt would run */
    const shape big = {9, 3, 64};
    test_prefill(ctx, &big, 4096, 64, 2.0f, &rng);
    test_merge(ctx, &rng);
    hkv_gpu_ctx_destroy(ctx);
    return test_report("gpu_attn");
}

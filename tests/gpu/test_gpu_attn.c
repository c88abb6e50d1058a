/* GPU attention against the float64 reference (tests/cpu/ref.c), outputs
 * poisoned (NaN) with guards and stride padding that must stay NaN:
 *  - prefill on tensor cores, each case on both kernels (WMMA,
 *    gpu/attn_prefill.cu; mma.sync, gpu/attn_prefill_mma.cu, where it runs:
 *    d <= 128 and 16-byte rows, elsewhere it must refuse with a reason), and
 *    the automatic pick bit-equal to the kernel it picks: causal, query chunks at
 *    p0 = 0 and p0 > 0 off any tile multiple, one token, token and row counts
 *    around the 16-row warp strip, the 48/64-row block and the 16/32/64-key
 *    tiles, d = 32..256 (96, 160: the padded instantiations), GQA 1..6, one
 *    KV head, K/V rows only 4-byte aligned (the 32-bit load path), logits
 *    scaled up to stress the online softmax, keys growing along the sequence
 *    (the running max keeps growing: O rescaled many times), a long chunk at
 *    a large p0; keys bounded by a count (all of a block for every token, a
 *    bound inside the diagonal, none); and the arguments it must refuse;
 *  - decode over contiguous rows and over gathered rows, n = 0 (out 0, lse
 *    -inf), 1, tile edges, several sequences;
 *  - merge against cpu/merge.c, including empty partials, and the split
 *    identity: merge(attn(A), attn(B)) = attn(A u B).
 * Bounds, decode: per (row, head) max|out - ref| <= 1e-4 * max|ref|, |lse -
 * ref| <= 1e-4 * max(1, |ref|) (the cpu kernels' bounds). Prefill: the same
 * plus what its fp16 hi + lo splits of Q and P leave (see prefill_head_ok). */
#include "ref.h"
#include "util.h"
#include "gpu_test.h"

typedef struct shape { int H, KH, d; } shape;
static const shape shapes[] = {{9, 3, 64}, {8, 2, 128}, {4, 4, 256}, {2, 1, 32}};

static uint16_t *rand_halves(test_rng *rng, size_t n)
{
    uint16_t *p = malloc(n * 2);
    for (size_t i = 0; i < n; i++) p[i] = rng_half(rng, -1, 1);
    return p;
}

/* Prefill's bound. Scores come from Q split into fp16 hi + lo against fp16
 * K (exact products, fp32 sums), and P is split the same way for P.V: both
 * as exact as the fp32 kernels, whose bound 1e-4 * max|ref| covers fp32
 * accumulation, exp2 and the rescales. What the splits leave: a weight's lo
 * part is rounded to fp16, 2^-11 of a residual that is at most 2^-11 of p,
 * so 2^-22 relative per weight, out[c] off by 2^-22 * sum_j w_j |v_jc|
 * (rabs: the reference over |V|); when that lo part is subnormal (p below
 * about 2^-3) the rounding is 2^-25 absolute per key, over l >= exp(lse -
 * s_max) (the kernel's running max is at most s_max), times max|v| = 1 here:
 * sub = nk * 2^-25 * exp(s_max - lse). lse comes from the fp32 sum of P:
 * the fp32 bound. Tracks the worst error relative to max|ref|, relative to
 * the bound, and of lse. */
typedef struct pf_worst { double rel, of_bound, lse; } pf_worst;

static int prefill_head_ok(const float *o, float l, const double *ro, double rl, const double *rabs,
                           int d, double sub, pf_worst *w)
{
    double mx = 0;
    int ok = 1;
    for (int c = 0; c < d; c++) mx = fmax(mx, fabs(ro[c]));
    for (int c = 0; c < d; c++) {
        if (isnan(o[c])) return 0;
        const double e = fabs(o[c] - ro[c]);
        const double tol = 1e-4 * mx + ldexp(rabs[c], -22) + sub;
        w->rel = fmax(w->rel, mx > 0 ? e / mx : e);
        w->of_bound = fmax(w->of_bound, e / tol);
        ok &= e <= tol;
    }
    if (rl == -INFINITY) return ok && l == -INFINITY;
    const double el = fabs(l - rl) / fmax(1, fabs(rl));
    w->lse = fmax(w->lse, el);
    return ok && el <= 1e-4;
}

/* rise > 0: key row j of every head is scaled by 1 + rise * j / cap, so
 * later keys score higher and each row's running max keeps growing. ld_pad:
 * K/V row stride d + ld_pad (8: 16-byte rows; 2: only 4-byte aligned). */
static void test_prefill_x(hkv_gpu_ctx *ctx, const shape *sh, int64_t p0, int64_t nq, float amp,
                           float rise, int ld_pad, int64_t nk, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int H = sh->H, KH = sh->KH, d = sh->d, g = H / KH;
    const int64_t cap = p0 + nq, ld = d + ld_pad, hs = cap * ld, ldq = (int64_t)H * d + 4,
                  ldo = (int64_t)H * d + 2;
    uint16_t *k = rand_halves(rng, KH * hs), *v = rand_halves(rng, KH * hs);
    uint16_t *va = malloc(KH * hs * 2);
    if (rise > 0)
        for (int64_t i = 0; i < KH * hs; i++) {
            const int64_t j = i % hs / ld;
            k[i] = double_to_half_ref(half_to_double(k[i]) * (1 + rise * (double)j / cap));
        }
    for (int64_t i = 0; i < KH * hs; i++) va[i] = v[i] & 0x7fff;   /* |V| */
    float *q = malloc(nq * ldq * 4);
    for (int64_t i = 0; i < nq * ldq; i++) q[i] = amp * rng_nonzero(rng, -1, 1);
    uint16_t *dk = gpu_put(ctx, k, KH * hs * 2), *dv = gpu_put(ctx, v, KH * hs * 2);
    float *dq = gpu_put(ctx, q, nq * ldq * 4);
    const float scale = 1.0f / sqrtf((float)d);
    /* each kernel forced (mma.sync only where it runs: d <= 128, 16-byte
     * rows), then the automatic pick, which must equal the kernel it picks
     * bit for bit: in the small cases only, since the pick depends on the
     * head size and the rows' alignment alone (every shape and alignment
     * here has one), and the emulated kernels dominate the test's time
     * under the sanitizers */
    const int with_auto = nq * (p0 + nq) <= 4096;
    const int mma_fits = d <= 128 && ld_pad % 8 == 0;
    const hkv_gpu_prefill_kernel kinds[3] = {HKV_GPU_PREFILL_WMMA, HKV_GPU_PREFILL_MMA,
                                             HKV_GPU_PREFILL_AUTO};
    static const char *const kname[3] = {"wmma", "mma", "auto"};
    const size_t on = nq * ldo + HKV_TEST_GUARD, ln = nq * H + HKV_TEST_GUARD;
    float *out = malloc(3 * on * 4), *lse = malloc(3 * ln * 4);
    for (int kd = 0; kd < 2 + with_auto; kd++) {
        float *dout = gpu_poisoned(ctx, nq * ldo), *dlse = gpu_poisoned(ctx, nq * H);
        hkv_err e = {0};
        const int rc = hkv_gpu_attn_prefill_with(dq, ldq, nq, H, KH, d, p0, nk < 0 ? INT64_MAX : nk,
                                                 dk, dv, ld, hs, scale, dout, ldo, dlse, kinds[kd],
                                                 st, &e);
        if (kinds[kd] == HKV_GPU_PREFILL_MMA && !mma_fits)
            CHECK(rc == HKV_E_UNSUPPORTED && strstr(e.msg, "mma.sync"),
                  "prefill forced onto mma.sync with d=%d, ld +%d: returned %d (want %d), \"%s\"",
                  d, ld_pad, rc, HKV_E_UNSUPPORTED, e.msg);
        else
            CHECK(rc == HKV_OK, "prefill (%s kernel): %s", kname[kd], e.msg);
        gpu_get(ctx, out + kd * on, dout, on * 4);
        gpu_get(ctx, lse + kd * ln, dlse, ln * 4);
        gpu_drop(ctx, dout, on * 4);
        gpu_drop(ctx, dlse, ln * 4);
    }
    const int picked = mma_fits ? 1 : 0;
    CHECK(!with_auto || (!memcmp(out + 2 * on, out + picked * on, nq * ldo * 4) &&
                         !memcmp(lse + 2 * ln, lse + picked * ln, nq * H * 4)),
          "prefill d=%d ld +%d: the automatic pick differs from the %s kernel", d, ld_pad,
          kname[picked]);
    double ro[256], rabs[256], rl, rla;
    pf_worst w[2] = {{0, 0, 0}, {0, 0, 0}};
    int bad[2] = {0, 0}, stray[2] = {0, 0};
    for (int64_t t = 0; t < nq; t++) {
        for (int qh = 0; qh < H; qh++) {
            const int h = qh / g;
            const int64_t n = nk >= 0 && nk < p0 + t + 1 ? nk : p0 + t + 1;   /* its keys */
            ref_attn(q + t * ldq + qh * d, 1, d, k + h * hs, v + h * hs, ld, NULL, n, scale, ro,
                     &rl);
            ref_attn(q + t * ldq + qh * d, 1, d, k + h * hs, va + h * hs, ld, NULL, n, scale, rabs,
                     &rla);
            double smax = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                double dot = 0;
                for (int c = 0; c < d; c++)
                    dot += (double)q[t * ldq + qh * d + c] * half_to_double(k[h * hs + j * ld + c]);
                smax = fmax(smax, dot * scale);
            }
            const double sub = n ? (double)n * ldexp(1, -25) * exp(smax - rl) : 0;
            for (int kd = 0; kd < 1 + mma_fits; kd++)
                bad[kd] += !prefill_head_ok(out + kd * on + t * ldo + qh * d,
                                            lse[kd * ln + t * H + qh], ro, rl, rabs, d, sub, &w[kd]);
        }
        for (int kd = 0; kd < 1 + mma_fits; kd++)
            for (int64_t c = (int64_t)H * d; c < ldo; c++) stray[kd] += !isnan(out[kd * on + t * ldo + c]);
    }
    for (int kd = 0; kd < 1 + mma_fits; kd++) {
        CHECK(bad[kd] == 0 && stray[kd] == 0 && guard_intact(out + kd * on, nq * ldo) &&
                  guard_intact(lse + kd * ln, nq * H),
              "prefill (%s) H=%d KH=%d d=%d p0=%lld nq=%lld nk=%lld amp %g rise %g ld +%d: %d heads "
              "off (worst %.3g of max|ref|, %.3g of the bound, lse %.3g), %d stray", kname[kd], H, KH,
              d, (long long)p0, (long long)nq, (long long)nk, amp, rise, ld_pad, bad[kd], w[kd].rel,
              w[kd].of_bound, w[kd].lse, stray[kd]);
        printf("prefill (%s) H=%d KH=%d d=%d p0=%lld nq=%lld nk=%lld amp %g rise %g ld +%d: worst "
               "out error %.2e of max|ref| (%.2f of the bound), lse %.2e\n", kname[kd], H, KH, d,
               (long long)p0, (long long)nq, (long long)nk, amp, rise, ld_pad, w[kd].rel,
               w[kd].of_bound, w[kd].lse);
    }
    free(k), free(v), free(va), free(q), free(out), free(lse);
}

static void test_prefill(hkv_gpu_ctx *ctx, const shape *sh, int64_t p0, int64_t nq, float amp,
                         test_rng *rng)
{
    test_prefill_x(ctx, sh, p0, nq, amp, 0, 8, -1, rng);
}

/* What the prefill launcher must refuse, each with a message. */
static void test_prefill_args(hkv_gpu_ctx *ctx)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    float *dq = gpu_poisoned(ctx, 8 * 288), *dout = gpu_poisoned(ctx, 8 * 288);
    float *dlse = gpu_poisoned(ctx, 8);
    uint16_t *dk = gpu_put(ctx, NULL, 8 * 288 * 2 + 16), *dv = gpu_put(ctx, NULL, 8 * 288 * 2 + 16);
    static const struct { int H, KH, d; int64_t ld, hs; int koff; int want; const char *what; } bad[] = {
        {2, 1, 48, 48, 48 * 4, 0, HKV_E_UNSUPPORTED, "d = 48"},
        {2, 1, 288, 288, 288 * 4, 0, HKV_E_UNSUPPORTED, "d = 288"},
        {2, 1, 64, 65, 65 * 4, 0, HKV_E_UNSUPPORTED, "odd row stride"},
        {2, 1, 64, 64, 64 * 4, 1, HKV_E_UNSUPPORTED, "K 2-byte aligned"},
        {3, 2, 64, 64, 64 * 4, 0, HKV_E_INVAL, "heads not a multiple of KV heads"},
        {2, 1, 64, 32, 64 * 4, 0, HKV_E_UNSUPPORTED, "ld < d"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        hkv_err e;
        hkv_err_clear(&e);
        const int H = bad[i].H, d = bad[i].d;
        const int rc = hkv_gpu_attn_prefill(dq, (int64_t)H * d, 2, H, bad[i].KH, d, 0,
                                            dk + bad[i].koff, dv, bad[i].ld, bad[i].hs,
                                            0.125f, dout, (int64_t)H * d, dlse, st, &e);
        CHECK(rc == bad[i].want && e.msg[0], "prefill with %s: returned %d (want %d), \"%s\"",
              bad[i].what, rc, bad[i].want, e.msg);
    }
    hkv_err e;
    hkv_err_clear(&e);
    CHECK(hkv_gpu_attn_prefill(dq, 64, 0, 1, 1, 64, 5, dk, dv, 64, 64 * 4, 0.125f, dout, 64, dlse,
                               st, &e) == HKV_OK, "prefill of 0 queries: %s", e.msg);
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
                bad += !gpu_head_ok(out + qh * d, lse[qh], ro + j * d, rl[j], d, &worst);
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
                    bad += !gpu_head_ok(out + qh * d, lse[qh], ro + j * d, rl[j], d, &worst);
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
    /* prefill only: the padded head sizes (96 in the 128-wide kernel, 160 in
     * the 256-wide), g = 1 with 5 KV heads, one KV head serving 6 */
    static const shape odd[] = {{5, 5, 96}, {6, 1, 160}, {1, 1, 64}, {4, 1, 128}};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        test_prefill(ctx, &odd[i], 0, 1, 1.0f, &rng);
        test_prefill(ctx, &odd[i], 17, 1, 1.0f, &rng);   /* one token at an odd position */
        test_prefill(ctx, &odd[i], 13, 49, 2.0f, &rng);
        test_prefill_x(ctx, &odd[i], 70, 21, 1.0f, 0, 2, -1, &rng);   /* 4-byte aligned K/V rows */
    }
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        test_prefill_x(ctx, &shapes[i], 31, 90, 3.0f, 8.0f, 8, -1, &rng);   /* a max that keeps growing */
        /* keys bounded (the streamed prefill's blocks): all nk keys for every
         * token (p0 = nk, off a tile multiple), a bound inside the chunk's
         * diagonal, none at all (the empty partial) */
        test_prefill_x(ctx, &shapes[i], 77, 40, 2.0f, 0, 8, 77, &rng);
        test_prefill_x(ctx, &shapes[i], 20, 50, 1.0f, 0, 8, 45, &rng);
        test_prefill_x(ctx, &shapes[i], 0, 19, 1.0f, 0, 8, 0, &rng);
        test_prefill(ctx, &shapes[i], 5, 40, 30.0f, &rng);             /* nearly one-hot rows */
    }
    /* a long prefill in chunks (p0 advancing), as a 128K prompt would run */
    const shape big = {9, 3, 64}, big128 = {8, 2, 128};
    test_prefill(ctx, &big, 4096, 64, 2.0f, &rng);
    test_prefill(ctx, &big128, 2013, 150, 2.0f, &rng);
    test_prefill_args(ctx);
    test_merge(ctx, &rng);
    hkv_gpu_ctx_destroy(ctx);
    return test_report("gpu_attn");
}

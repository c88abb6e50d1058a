/* GPU model pieces against float64 references on random data, outputs
 * poisoned (NaN) with guard elements that must stay NaN:
 *  - context: per-tier accounting, the cap error message, total cap;
 *  - fp32 <-> fp16 bit-exact (every fp16 code; RNE against a search);
 *  - embedding (out-of-range ids give NaN rows), RMSNorm (|err| <= 2e-6 of
 *    the row's max), RoPE both layouts and partial rotation (<= 2e-6 of
 *    |a| + |b|), SwiGLU and the residual add (<= 1e-6 relative).
 * The weight GEMMs (gpu/qmat.cu) are tests/gpu/test_gpu_forward.c's. */
#include "ref.h"
#include "util.h"
#include "gpu_test.h"

static void test_ctx(hkv_gpu_ctx *ctx)
{
    hkv_err err;
    hkv_err_clear(&err);
    size_t before = hkv_gpu_in_use(ctx, HKV_TIER_WORKSPACE);
    void *p = hkv_gpu_alloc(ctx, HKV_TIER_WORKSPACE, 12345, &err);
    CHECK(p && hkv_gpu_in_use(ctx, HKV_TIER_WORKSPACE) == before + 12345, "accounting after alloc");
    hkv_gpu_free(ctx, HKV_TIER_WORKSPACE, p, 12345);
    CHECK(hkv_gpu_in_use(ctx, HKV_TIER_WORKSPACE) == before, "accounting after free");
    CHECK(hkv_gpu_alloc(ctx, HKV_TIER_WORKSPACE, 0, &err) == NULL && err.code == HKV_E_INVAL,
          "zero-byte allocation accepted");

    size_t caps[HKV_TIER_COUNT] = {0};
    caps[HKV_TIER_NEAR] = 1000;
    hkv_gpu_ctx *c2 = NULL;
    /* a total cap below the main stream's cuBLAS workspace: refused at
     * creation, naming it, nothing left behind */
    hkv_err_clear(&err);
    CHECK(hkv_gpu_ctx_create(&c2, 0, caps, 1 << 20, &err) == HKV_E_CAPACITY && !c2 &&
          strstr(err.msg, "cuBLAS workspace"), "1 MiB context: \"%s\"", err.msg);
    const size_t cap_all = (size_t)64 << 20;
    if (hkv_gpu_ctx_create(&c2, 0, caps, cap_all, &err)) gpu_die("second context", &err);
    const size_t base = hkv_gpu_in_use(c2, -1);   /* the cuBLAS workspace, accounted */
    CHECK(base > 0 && base == hkv_gpu_in_use(c2, HKV_TIER_WORKSPACE),
          "the cuBLAS workspace is not accounted (%zu bytes in use)", base);
    void *a = hkv_gpu_alloc(c2, HKV_TIER_NEAR, 600, &err);
    CHECK(a != NULL, "600 of a 1000-byte cap refused: %s", err.msg);
    void *b = hkv_gpu_alloc(c2, HKV_TIER_NEAR, 500, &err);
    char want[256];
    snprintf(want, sizeof want, "GPU tier %s: asked 500, cap 1000, in use 600",
             hkv_tier_name(HKV_TIER_NEAR));
    CHECK(b == NULL && err.code == HKV_E_CAPACITY && strstr(err.msg, want),
          "cap not enforced or message \"%s\" lacks \"%s\"", err.msg, want);
    void *c = hkv_gpu_alloc(c2, HKV_TIER_INDEX, cap_all - base - 600 + 1, &err);
    CHECK(c == NULL && err.code == HKV_E_CAPACITY && strstr(err.msg, "total cap"),
          "total cap not enforced: %s", err.msg);
    hkv_gpu_free(c2, HKV_TIER_NEAR, a, 600);
    CHECK(hkv_gpu_in_use(c2, -1) == base && hkv_gpu_peak(c2, HKV_TIER_NEAR) == 600, "peak/in use");
    hkv_gpu_ctx_destroy(c2);
}

static void test_convert(hkv_gpu_ctx *ctx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int64_t n = 65536;
    uint16_t *codes = malloc(n * 2), *back = malloc(n * 2);
    for (int64_t i = 0; i < n; i++) codes[i] = (uint16_t)i;
    uint16_t *dc = gpu_put(ctx, codes, n * 2);
    float *df = gpu_poisoned(ctx, n), *f = malloc((n + HKV_TEST_GUARD) * 4);
    GPU_OK(hkv_gpu_f16_to_f32(dc, df, n, st, err));
    gpu_get(ctx, f, df, (n + HKV_TEST_GUARD) * 4);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = half_to_double((uint16_t)i);
        bad += isnan(r) ? !isnan(f[i]) : (double)f[i] != r;
    }
    CHECK(bad == 0 && guard_intact(f, n), "f16_to_f32: %d codes wrong", bad);
    /* f32 -> f16: random values in [-2, 2], subnormal range, halfway cases */
    for (int64_t i = 0; i < n; i++) {
        int kind = (int)(i % 4);
        f[i] = kind == 0 ? rng_uniform(rng, -2, 2)
             : kind == 1 ? rng_uniform(rng, -1e-4f, 1e-4f)
             : kind == 2 ? (float)((half_to_double((uint16_t)(i & 0x3bff)) +
                                    half_to_double((uint16_t)((i & 0x3bff) + 1))) / 2)
                         : rng_uniform(rng, -0.01f, 0.01f);
    }
    float *dsrc = gpu_put(ctx, f, n * 4);
    GPU_OK(hkv_gpu_f32_to_f16(dsrc, dc, n, st, err));
    gpu_get(ctx, back, dc, n * 2);
    bad = 0;
    for (int64_t i = 0; i < n; i++) bad += back[i] != double_to_half_ref(f[i]);
    CHECK(bad == 0, "f32_to_f16: %d values not rounded to nearest even", bad);
    free(codes), free(back), free(f);
}

static void test_embed_norm(hkv_gpu_ctx *ctx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int64_t vocab = 50, dim = 96, n = 7;
    uint16_t *tab = malloc(vocab * dim * 2);
    for (int64_t i = 0; i < vocab * dim; i++) tab[i] = rng_half(rng, -1, 1);
    int32_t tok[7] = {0, 49, 3, -1, 50, 17, 3};
    uint16_t *dt = gpu_put(ctx, tab, vocab * dim * 2);
    int32_t *dtok = gpu_put(ctx, tok, sizeof tok);
    float *dx = gpu_poisoned(ctx, n * dim), *x = malloc((n * dim + HKV_TEST_GUARD) * 4);
    GPU_OK(hkv_gpu_embed(dt, vocab, dim, dtok, n, dx, st, err));
    gpu_get(ctx, x, dx, (n * dim + HKV_TEST_GUARD) * 4);
    int bad = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < dim; c++) {
            float v = x[r * dim + c];
            if (tok[r] < 0 || tok[r] >= vocab) bad += !isnan(v);
            else bad += (double)v != half_to_double(tab[tok[r] * dim + c]);
        }
    CHECK(bad == 0 && guard_intact(x, n * dim), "embed: %d wrong", bad);

    /* RMSNorm, strided rows, odd and model-sized dims, and in place */
    const int dims[] = {7, 576, 2048};
    for (int di = 0; di < 3; di++) {
        const int D = dims[di];
        const int64_t rows = 5, ld = D + 3;
        float *h = malloc(rows * ld * 4), *w = malloc(D * 4), *y = malloc((rows * ld + HKV_TEST_GUARD) * 4);
        for (int64_t i = 0; i < rows * ld; i++) h[i] = rng_nonzero(rng, -3, 3);
        for (int i = 0; i < D; i++) w[i] = rng_nonzero(rng, 0.5f, 1.5f);
        float *dh = gpu_put(ctx, h, rows * ld * 4), *dw = gpu_put(ctx, w, D * 4);
        float *dy = gpu_poisoned(ctx, rows * ld);
        for (int inplace = 0; inplace < 2; inplace++) {
            float *dst = inplace ? dh : dy;
            GPU_OK(hkv_gpu_rmsnorm(dh, ld, dw, rows, D, 1e-5f, dst, ld, st, err));
            gpu_get(ctx, y, dst, (rows * ld + (inplace ? 0 : HKV_TEST_GUARD)) * 4);
            double worst = 0;
            int nan = 0, stray = 0;
            for (int64_t r = 0; r < rows; r++) {
                double ss = 0, mx = 0;
                for (int c = 0; c < D; c++) ss += (double)h[r * ld + c] * h[r * ld + c];
                double rr = 1.0 / sqrt(ss / D + 1e-5);
                for (int c = 0; c < D; c++) mx = fmax(mx, fabs(h[r * ld + c] * rr * w[c]));
                for (int c = 0; c < D; c++) {
                    double ref = h[r * ld + c] * rr * w[c], v = y[r * ld + c];
                    nan += isnan(v);
                    worst = fmax(worst, fabs(v - ref) / mx);
                }
                if (!inplace)   /* the stride's padding is not written */
                    for (int c = D; c < ld; c++) stray += !isnan(y[r * ld + c]);
            }
            CHECK(nan == 0 && stray == 0 && worst <= 2e-6 && (inplace || guard_intact(y, rows * ld)),
                  "rmsnorm dim %d%s: err %.3g, %d NaN, %d stray", D, inplace ? " in place" : "",
                  worst, nan, stray);
        }
        /* the fused residual add + norm: x and y bit for bit hkv_gpu_add then
         * hkv_gpu_rmsnorm (the residual dense, as the forward pass's TMP) */
        float *res = malloc(rows * D * 4), *x1 = malloc(rows * ld * 4), *x2 = malloc(rows * ld * 4);
        float *y1 = malloc(rows * ld * 4), *y2 = malloc(rows * ld * 4);
        for (int64_t i = 0; i < rows * D; i++) res[i] = rng_nonzero(rng, -3, 3);
        float *dres = gpu_put(ctx, res, rows * D * 4);
        float *dxa = gpu_put(ctx, h, rows * ld * 4), *dxb = gpu_put(ctx, h, rows * ld * 4);
        float *dya = gpu_poisoned(ctx, rows * ld), *dyb = gpu_poisoned(ctx, rows * ld);
        for (int64_t r = 0; r < rows; r++)   /* hkv_gpu_add is dense: row by row at stride ld */
            GPU_OK(hkv_gpu_add(dxa + r * ld, dres + r * D, D, st, err));
        GPU_OK(hkv_gpu_rmsnorm(dxa, ld, dw, rows, D, 1e-5f, dya, ld, st, err));
        GPU_OK(hkv_gpu_add_rmsnorm(dxb, ld, dres, D, dw, rows, D, 1e-5f, dyb, ld, st, err));
        gpu_get(ctx, x1, dxa, rows * ld * 4), gpu_get(ctx, x2, dxb, rows * ld * 4);
        gpu_get(ctx, y1, dya, rows * ld * 4), gpu_get(ctx, y2, dyb, rows * ld * 4);
        int diff = 0;
        for (int64_t r = 0; r < rows; r++)
            for (int c = 0; c < D; c++)
                diff += memcmp(&x1[r * ld + c], &x2[r * ld + c], 4) != 0 ||
                        memcmp(&y1[r * ld + c], &y2[r * ld + c], 4) != 0;
        CHECK(diff == 0, "add_rmsnorm dim %d: %d elements differ from add then rmsnorm", D, diff);
        hkv_err e1;
        hkv_err_clear(&e1);
        CHECK(hkv_gpu_add_rmsnorm(dxb, ld, dres, D, dw, rows, D, 1e-5f, dxb, ld, st, &e1) == HKV_E_INVAL,
              "add_rmsnorm refuses y == x");
        gpu_drop(ctx, dres, rows * D * 4), gpu_drop(ctx, dxa, rows * ld * 4), gpu_drop(ctx, dxb, rows * ld * 4);
        gpu_drop(ctx, dya, (rows * ld + HKV_TEST_GUARD) * 4);
        gpu_drop(ctx, dyb, (rows * ld + HKV_TEST_GUARD) * 4);
        free(res), free(x1), free(x2), free(y1), free(y2);
        free(h), free(w), free(y);
    }
    free(tab), free(x);
}

static void test_rope(hkv_gpu_ctx *ctx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int heads = 12, hd = 64;
    const int64_t n = 9, ld = heads * hd + 5;
    for (int layout = HKV_GPU_ROPE_PAIRS; layout <= HKV_GPU_ROPE_NEOX; layout++)
        for (int rot = 32; rot <= hd; rot += 32) {
            float *x = malloc(n * ld * 4), *y = malloc(n * ld * 4), inv[32];
            int64_t pos[9];
            for (int64_t i = 0; i < n * ld; i++) x[i] = rng_nonzero(rng, -2, 2);
            for (int i = 0; i < rot / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / rot);
            for (int64_t r = 0; r < n; r++) pos[r] = r == 0 ? 0 : (int64_t)(rng_next(rng) % 200000);
            float *dx = gpu_put(ctx, x, n * ld * 4), *dinv = gpu_put(ctx, inv, sizeof inv);
            int64_t *dpos = gpu_put(ctx, pos, sizeof pos);
            float *dcs = gpu_poisoned(ctx, n * rot), *cs = malloc((n * rot + HKV_TEST_GUARD) * 4);
            GPU_OK(hkv_gpu_rope_table(dinv, rot, dpos, n, dcs, st, err));
            GPU_OK(hkv_gpu_rope(dx, ld, n, heads, hd, rot, layout, dcs, st, err));
            gpu_get(ctx, y, dx, n * ld * 4);
            gpu_get(ctx, cs, dcs, (n * rot + HKV_TEST_GUARD) * 4);
            /* the table is the host's (runtime/backend_cpu.c: float64 rounded to float) */
            int table_bad = !guard_intact(cs, n * rot);
            for (int64_t r = 0; r < n; r++)
                for (int i = 0; i < rot / 2; i++) {
                    double th = (double)pos[r] * (double)inv[i];
                    table_bad += cs[r * rot + i] != (float)cos(th) ||
                                 cs[r * rot + rot / 2 + i] != (float)sin(th);
                }
            CHECK(table_bad == 0, "rope table rot %d: %d entries differ from the host's float64 "
                  "cos/sin rounded to float", rot, table_bad);
            free(cs);
            double worst = 0;
            int untouched_bad = 0;
            for (int64_t r = 0; r < n; r++) {
                for (int h = 0; h < heads; h++) {
                    const float *a = x + r * ld + h * hd;
                    const float *b = y + r * ld + h * hd;
                    for (int i = 0; i < rot / 2; i++) {
                        int ia = layout == HKV_GPU_ROPE_PAIRS ? 2 * i : i;
                        int ib = layout == HKV_GPU_ROPE_PAIRS ? 2 * i + 1 : i + rot / 2;
                        double th = (double)pos[r] * (double)inv[i];
                        double c = (float)cos(th), s = (float)sin(th);
                        double ra = a[ia] * c - a[ib] * s, rb = a[ia] * s + a[ib] * c;
                        double m = fabs(a[ia]) + fabs(a[ib]);
                        worst = fmax(worst, fmax(fabs(b[ia] - ra), fabs(b[ib] - rb)) / m);
                    }
                    for (int i = rot; i < hd; i++) untouched_bad += b[i] != a[i];
                }
                for (int64_t c = heads * hd; c < ld; c++) untouched_bad += y[r * ld + c] != x[r * ld + c];
            }
            CHECK(worst <= 2e-6 && untouched_bad == 0, "rope layout %d rot %d: err %.3g, %d dims "
                  "outside the rotation changed", layout, rot, worst, untouched_bad);
            free(x), free(y);
        }
}

static void test_swiglu_add(hkv_gpu_ctx *ctx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int64_t n = 3, F = 1000;
    float *gu = malloc(n * 2 * F * 4), *o = malloc((n * F + HKV_TEST_GUARD) * 4);
    for (int64_t i = 0; i < n * 2 * F; i++) gu[i] = rng_nonzero(rng, -8, 8);
    float *dgu = gpu_put(ctx, gu, n * 2 * F * 4), *dout = gpu_poisoned(ctx, n * F);
    GPU_OK(hkv_gpu_swiglu(dgu, n, F, dout, st, err));
    gpu_get(ctx, o, dout, (n * F + HKV_TEST_GUARD) * 4);
    double worst = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < F; j++) {
            double g = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j], ref = g / (1 + exp(-g)) * u;
            worst = fmax(worst, fabs(o[r * F + j] - ref) / fmax(fabs(ref), 1e-3));
        }
    CHECK(worst <= 1e-6 && guard_intact(o, n * F), "swiglu: err %.3g", worst);
    /* x += y */
    GPU_OK(hkv_gpu_add(dgu, dgu + F, F, st, err));
    gpu_get(ctx, o, dgu, F * 4);
    int bad = 0;
    for (int64_t j = 0; j < F; j++) bad += o[j] != gu[j] + gu[F + j];
    CHECK(bad == 0, "add: %d wrong", bad);
    free(gu), free(o);
}

int main(void)
{
    hkv_gpu_ctx *ctx = gpu_test_open("gpu_model");
    test_rng rng = {11};
    test_ctx(ctx);
    test_convert(ctx, &rng);
    test_embed_norm(ctx, &rng);
    test_rope(ctx, &rng);
    test_swiglu_add(ctx, &rng);
    hkv_gpu_ctx_destroy(ctx);
    return test_report("gpu_model");
}

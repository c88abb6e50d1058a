/* The device pieces of the forward pass (gpu/gpu_forward.h) against the host
 * path and float64 references, outputs poisoned (NaN) with guard elements
 * and stride padding that must stay NaN.
 *
 * Weights, every type (F32, F16, Q8, Q4), random values:
 *  - upload: the device arrays equal the host arrays byte for byte, bytes ==
 *    hkv_wmat_bytes, the WEIGHTS tier accounts them and free returns them;
 *    bad matrices fail with HKV_E_INVAL; a WEIGHTS cap fails with
 *    HKV_E_CAPACITY (also when the codes fit and the scales do not) and
 *    leaves hkv_gpu_in_use unchanged;
 *  - rows (the embedding lookup): BIT-EXACT against the host scalar table's
 *    dequant_rows (and, printed if not, the best ISA's). Not a tolerance but
 *    a fact: an fp16 scale has 11 significant bits and a code at most 8, so
 *    s*q is exact in fp32; Q8 (s*q) is exact, Q4 (s*q + min) rounds once,
 *    FMA or not, on either side. ids out of range give NaN rows;
 *  - matmul, n in {1, 2, 7, 8} (GEMV; Q4 with 1, 2 and 4 output rows per warp,
 *    each the same bits as the others) and {9, 33} (panels + cuBLAS, in each
 *    hkv_gpu_qmat.gemm mode: split fp16 hi + lo, the default on A100/H100; fp16; fp32),
 *    shapes 1x32, 37x96, 300x512, 9x800, 5x1056 and 9x9248 (the Q4 GEMV's
 *    steps of 1024 columns end partway, and its x tiles: 9248 columns are
 *    resident at no n, three tiles at n = 1, ten at n = 7 and 8), 37x97 and
 *    5x1 (F32/F16), and 300x4096 at n 8 and 9 (two panels of 256 + 44 rows,
 *    panel_rows set to 256;
 *    the Q4 GEMV's x in four tiles); 37x96 at n 33 and 600 (two
 *    activation chunks, 512 + 88) with x rows from 1e-6 to 1e6 and F32
 *    weights times 1e6 and 1e-6 (fp16's range: the power-of-two scales);
 *    strided y, x at strides that are (even n) and are not (odd n) a
 *    multiple of 4 floats. With Wf the fp32
 *    weights (exact as dequant_rows gives them), mag = sum_c |Wf x|,
 *    u = 2^-24 and g(k) = k u / (1 - k u):
 *      |y - sum Wf x (float64)| <= g(h) mag: rigorous for any summation order
 *        in which every term is rounded at most h times; GEMV: h = L + 5 (one
 *        product, L - 1 additions in a lane's sequential sum of L terms, five
 *        shuffle levels; L = 32 ceil(cols/1024) for Q4 (a 32-weight block
 *        per lane and step of 1024 columns, in element order; lanes past the
 *        row's end add exact zeros), 4 ceil(cols/128) for Q8, ceil(cols/32)
 *        for F16/F32: gpu/qmat.cu's split of a row over lanes),
 *        GEMM fp32: h = cols (cuBLAS's order is not ours to know); GEMM
 *        split / fp16: gemm_bound below (the parts' representation error,
 *        ~3 2^-22 / 2^-11 per term, plus the tensor-core summation);
 *      |y - sum W x (float64, exact weights, ref_gemv)| <= the above +
 *        sum_c dq_c |x_c|, dq_c the a-priori dequantisation error (Q4:
 *        u |Wf|, the one rounding of s*q + min; F32, F16, Q8: 0, exact);
 *      |y - hkv_matmul (scalar table and best ISA)| <= (the first bound) + g(cols) mag +
 *        2 sum dq |x|.
 *    The measured maxima are printed at the end.
 *  - workspace: 0 for n <= 8, grows with n to 512 rows then stays (FP32
 *    mode: the panel only); one byte short (or none) for n > 8: HKV_E_INVAL;
 * Rows:
 *  - copy_rows with no lists, both lists, only one, negative entries skip;
 *  - add_bias exact (one fp32 add);
 *  - kv_append both cache layouts, skipped rows (dst -1), fp16 BIT-EXACT
 *    (round to nearest even, halfway cases, subnormals, overflow to inf);
 *    kv_append_q8 the same rows as the host's 8-bit far tier returns them
 *    (hkv_q8_quantize's codes times their scale, one fp16 rounding), BIT-EXACT,
 *    and a head size off the group of 32 refused;
 *  - partial_clear (out 0, lse -inf, padding untouched), then
 *    hkv_gpu_attn_merge of a cleared partial with a real one, both ways,
 *    gives the real one exactly. */
#include "ref.h"
#include "util.h"
#include "gpu_test.h"
#include "gpu_forward.h"
#include "far_rows.h"
#include "qmat_panel.h"

#define U32 (1.0 / 16777216.0)

static double gamma_k(double k) { return k * U32 / (1 - k * U32); }

/* Terms one lane of the GEMV sums in sequence (see the comment at the top). */
static int64_t gemv_lane_terms(int type, int64_t cols)
{
    if (type == HKV_W_Q4) return 32 * ((cols + 1023) / 1024);
    if (type == HKV_W_Q8) return 4 * ((cols + 127) / 128);
    return (cols + 31) / 32;
}

static const char *tname[] = {"f32", "f16", "q8", "q4"};

/* measured maxima, per type and path (0 GEMV, 1 + hkv_qmat_gemm: the GEMM modes) */
static double meas_f[4][4], meas_e[4][4], meas_h[4][4], meas_ratio[4][4];

typedef struct test_wmat { hkv_wmat w; size_t qb, sb; } test_wmat;

static void make_wmat(test_wmat *m, int type, int64_t rows, int64_t cols, test_rng *rng)
{
    memset(m, 0, sizeof *m);
    const int64_t n = rows * cols, nb = n / HKV_WBLOCK;
    m->qb = type == HKV_W_F32 ? n * 4 : type == HKV_W_F16 ? n * 2 : type == HKV_W_Q8 ? n : n / 2;
    m->sb = type >= HKV_W_Q8 ? nb * 2 : 0;
    void *q = aligned_alloc(64, (m->qb + 63) / 64 * 64);
    uint16_t *scale = NULL, *mn = NULL;
    if (type == HKV_W_F32)
        for (int64_t i = 0; i < n; i++) ((float *)q)[i] = rng_nonzero(rng, -1, 1);
    else if (type == HKV_W_F16)
        for (int64_t i = 0; i < n; i++) ((uint16_t *)q)[i] = rng_half(rng, -1, 1);
    else if (type == HKV_W_Q8)
        for (int64_t i = 0; i < n; i++) ((int8_t *)q)[i] = (int8_t)((int)(rng_next(rng) % 255) - 127);
    else
        for (int64_t i = 0; i < n / 2; i++) ((uint8_t *)q)[i] = (uint8_t)rng_next(rng);
    if (type >= HKV_W_Q8) {
        scale = malloc(nb * 2 + 2);
        for (int64_t b = 0; b < nb; b++) scale[b] = rng_half(rng, 0.001f, 0.02f);
    }
    if (type == HKV_W_Q4) {   /* both signs: s*q + min cancels sometimes */
        mn = malloc(nb * 2 + 2);
        for (int64_t b = 0; b < nb; b++) mn[b] = rng_half(rng, -0.16f, 0.05f);
    }
    m->w = (hkv_wmat){type, rows, cols, q, scale, mn, 0};
}

static void free_wmat(test_wmat *m) { free(m->w.q), free(m->w.scale), free(m->w.min); }

/* A-priori bound of |Wf[r][c] - W[r][c]|: s*q is exact in fp32 (11 x 8
 * significant bits), so only Q4's + min rounds, by at most u |Wf|. The test
 * checks the Q8/F16/F32 zero and the Q4 bound element by element. */
static double dq_err(const hkv_wmat *w, float wf)
{
    return w->type == HKV_W_Q4 ? U32 * fabs(wf) : 0;
}

static void test_upload(hkv_gpu_ctx *ctx, int type, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    test_wmat m;
    make_wmat(&m, type, 37, 96, rng);
    const size_t before = hkv_gpu_in_use(ctx, HKV_TIER_WEIGHTS);
    hkv_gpu_qmat g;
    GPU_OK(hkv_gpu_qmat_upload(ctx, &m.w, &g, st, err));
    CHECK(g.type == type && g.rows == 37 && g.cols == 96 && g.bytes == hkv_wmat_bytes(&m.w) &&
          hkv_gpu_in_use(ctx, HKV_TIER_WEIGHTS) == before + g.bytes,
          "upload %s: fields or accounting (%zu bytes, %zu expected)", tname[type], g.bytes,
          hkv_wmat_bytes(&m.w));
    CHECK((type >= HKV_W_Q8) == (g.scale != NULL) && (type == HKV_W_Q4) == (g.min != NULL),
          "upload %s: scale/min presence", tname[type]);
    char *back = malloc(m.qb);
    gpu_get(ctx, back, g.q, m.qb);
    int same = !memcmp(back, m.w.q, m.qb);
    if (g.scale) {
        gpu_get(ctx, back, g.scale, m.sb);
        same &= !memcmp(back, m.w.scale, m.sb);
    }
    if (g.min) {
        gpu_get(ctx, back, g.min, m.sb);
        same &= !memcmp(back, m.w.min, m.sb);
    }
    CHECK(same, "upload %s: device arrays differ from the host's", tname[type]);
    hkv_gpu_qmat_free(ctx, &g);
    CHECK(hkv_gpu_in_use(ctx, HKV_TIER_WEIGHTS) == before && g.q == NULL && g.bytes == 0,
          "free %s: accounting or fields", tname[type]);
    hkv_gpu_qmat_free(ctx, &g);   /* twice: a no-op */
    free(back);
    free_wmat(&m);
}

static void test_upload_errors(hkv_gpu_ctx *ctx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    hkv_err err;
    hkv_err_clear(&err);
    const size_t before = hkv_gpu_in_use(ctx, -1);
    test_wmat m;
    make_wmat(&m, HKV_W_Q4, 4, 64, rng);
    hkv_gpu_qmat g;
    hkv_wmat bad = m.w;
    bad.cols = 48;
    CHECK(hkv_gpu_qmat_upload(ctx, &bad, &g, st, &err) == HKV_E_INVAL && g.q == NULL,
          "Q4 with cols 48 accepted");
    bad = m.w, bad.type = HKV_W_Q8, bad.cols = 40;
    CHECK(hkv_gpu_qmat_upload(ctx, &bad, &g, st, &err) == HKV_E_INVAL, "Q8 with cols 40 accepted");
    bad = m.w, bad.type = 9;
    CHECK(hkv_gpu_qmat_upload(ctx, &bad, &g, st, &err) == HKV_E_INVAL, "type 9 accepted");
    bad = m.w, bad.min = NULL;
    CHECK(hkv_gpu_qmat_upload(ctx, &bad, &g, st, &err) == HKV_E_INVAL, "Q4 without mins accepted");
    bad = m.w, bad.scale = NULL;
    CHECK(hkv_gpu_qmat_upload(ctx, &bad, &g, st, &err) == HKV_E_INVAL, "Q4 without scales accepted");
    bad = m.w, bad.q = NULL;
    CHECK(hkv_gpu_qmat_upload(ctx, &bad, &g, st, &err) == HKV_E_INVAL, "no codes accepted");
    bad = m.w, bad.rows = 0;
    CHECK(hkv_gpu_qmat_upload(ctx, &bad, &g, st, &err) == HKV_E_INVAL, "0 rows accepted");
    CHECK(hkv_gpu_in_use(ctx, -1) == before, "failed uploads changed the accounting");

    /* the WEIGHTS cap: nothing fits; the codes fit but not the scales; exactly fits */
    const size_t total = hkv_wmat_bytes(&m.w);
    const size_t caps_try[3] = {m.qb - 1, m.qb + 1, total};
    for (int k = 0; k < 3; k++) {
        size_t caps[HKV_TIER_COUNT] = {0};
        caps[HKV_TIER_WEIGHTS] = caps_try[k];
        hkv_gpu_ctx *c2 = NULL;
        if (hkv_gpu_ctx_create(&c2, 0, caps, 0, &err)) gpu_die("capped context", &err);
        const size_t base = hkv_gpu_in_use(c2, -1);   /* the cuBLAS workspace */
        hkv_err_clear(&err);
        int rc = hkv_gpu_qmat_upload(c2, &m.w, &g, hkv_gpu_ctx_stream(c2), &err);
        if (k < 2) {
            char want[128];
            snprintf(want, sizeof want, "GPU tier %s: asked", hkv_tier_name(HKV_TIER_WEIGHTS));
            CHECK(rc == HKV_E_CAPACITY && err.code == HKV_E_CAPACITY && strstr(err.msg, want) &&
                  g.q == NULL && hkv_gpu_in_use(c2, HKV_TIER_WEIGHTS) == 0 &&
                  hkv_gpu_in_use(c2, -1) == base,
                  "upload over a cap of %zu: rc %d, in use %zu, \"%s\"", caps_try[k], rc,
                  hkv_gpu_in_use(c2, HKV_TIER_WEIGHTS), err.msg);
            /* and without an err record: the code still says why */
            CHECK(hkv_gpu_qmat_upload(c2, &m.w, &g, hkv_gpu_ctx_stream(c2), NULL) == HKV_E_CAPACITY &&
                  hkv_gpu_in_use(c2, -1) == base, "upload over a cap without err: wrong code or leak");
        } else {
            CHECK(rc == HKV_OK && hkv_gpu_in_use(c2, HKV_TIER_WEIGHTS) == total,
                  "upload at exactly the cap failed: %s", err.msg);
            hkv_gpu_qmat_free(c2, &g);
            CHECK(hkv_gpu_in_use(c2, -1) == base, "free after a capped upload leaves bytes");
        }
        hkv_gpu_ctx_destroy(c2);
    }
    free_wmat(&m);
}

/* rows (embedding lookup) against the scalar table's dequant_rows, bit for bit */
static void test_rows(hkv_gpu_ctx *ctx, const hkv_cpu_kernels *scalar, const hkv_cpu_kernels *best,
                      int type, int64_t rows, int64_t cols, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    test_wmat m;
    make_wmat(&m, type, rows, cols, rng);
    hkv_gpu_qmat g;
    GPU_OK(hkv_gpu_qmat_upload(ctx, &m.w, &g, st, err));
    enum { N = 9 };
    const int32_t ids[N] = {0, (int32_t)rows - 1, -1, (int32_t)rows, (int32_t)(rows / 2), 0,
                            (int32_t)(rows > 3 ? 3 : 0), INT32_MIN, INT32_MAX};
    const int64_t ld = cols + 5;
    int32_t *dids = gpu_put(ctx, ids, sizeof ids);
    float *dd = gpu_poisoned(ctx, N * ld), *d = malloc((N * ld + HKV_TEST_GUARD) * 4);
    GPU_OK(hkv_gpu_qmat_rows(&g, dids, N, dd, ld, st, err));
    gpu_get(ctx, d, dd, (N * ld + HKV_TEST_GUARD) * 4);
    float *hs = malloc(cols * 4), *hb = malloc(cols * 4);
    int bad = 0, stray = 0;
    int64_t ulp_best = 0;
    for (int i = 0; i < N; i++) {
        const float *row = d + i * ld;
        if (ids[i] < 0 || ids[i] >= rows) {
            for (int64_t c = 0; c < cols; c++) bad += !isnan(row[c]);
        } else {
            scalar->dequant_rows(&m.w, ids[i], ids[i] + 1, hs);
            best->dequant_rows(&m.w, ids[i], ids[i] + 1, hb);
            bad += memcmp(row, hs, cols * 4) != 0;
            for (int64_t c = 0; c < cols; c++) {
                int32_t a, b;
                memcpy(&a, &row[c], 4), memcpy(&b, &hb[c], 4);
                int64_t du = (int64_t)a - b;
                if (du < 0) du = -du;
                if ((a < 0) != (b < 0)) du = row[c] == hb[c] ? 0 : 1 << 30;
                if (du > ulp_best) ulp_best = du;
            }
        }
        for (int64_t c = cols; c < ld; c++) stray += !isnan(row[c]);
    }
    CHECK(bad == 0 && stray == 0 && guard_intact(d, N * ld),
          "rows %s %lldx%lld: %d rows not bit-exact to the scalar host (or not NaN), %d stray",
          tname[type], (long long)rows, (long long)cols, bad, stray);
    if (ulp_best)
        printf("gpu_forward: rows %s %lldx%lld: %lld ulp from the %s table's dequant_rows (bit-exact "
               "to scalar)\n", tname[type], (long long)rows, (long long)cols, (long long)ulp_best,
               hkv_isa_name(best->isa));
    /* bad arguments */
    hkv_err err;
    hkv_err_clear(&err);
    CHECK(hkv_gpu_qmat_rows(&g, dids, N, dd, cols - 1, st, &err) == HKV_E_INVAL,
          "rows with ld_dst < cols accepted");
    CHECK(hkv_gpu_qmat_rows(&g, NULL, N, dd, ld, st, &err) == HKV_E_INVAL, "rows without ids accepted");
    GPU_OK(hkv_gpu_qmat_rows(&g, dids, 0, dd, ld, st, err));
    hkv_gpu_qmat_free(ctx, &g);
    gpu_drop(ctx, dids, sizeof ids);
    gpu_drop(ctx, dd, (N * ld + HKV_TEST_GUARD) * 4);
    free(d), free(hs), free(hb);
    free_wmat(&m);
}

/* Rigorous bound of |y - sum Wf x| (float64) for one output of the GEMM
 * mode `mode` (n > 8; gpu/qmat.cu's header), with magf = sum |Wf x|, sw =
 * sum |Wf|, sx = sum |x|, mw = max |Wf| of the row, mx = max |x| of the row:
 *  FP32: g(cols) magf, h = cols roundings (cuBLAS's order is not ours to know).
 *  SPLIT: v = hi + lo 2^-11 per operand, both fp16, after the power-of-two
 *    range scales (exact): |v - hi - lo 2^-11| <= u16^2 |v| + 2^-36 in scaled
 *    units (u16 = 2^-11; 2^-36 where a part is subnormal), and the scales put
 *    max |v| at >= 2^13, so unscaled <= u16^2 |v| + 2^-49 max |v|. The GEMMs
 *    drop lo.lo: <= 3.01 u16^2 |Wf x| + 2^-48 (mw |x| + |Wf| mx) per term.
 *    Summation: the Whi xhi GEMM (cols terms, <= (1 + 2^-9) magf) and its
 *    beta add, the correction GEMM (2 cols terms, <= 2^-9 magf), each
 *    rounding at most 2^-23 relative (twice fp32's u: tensor cores may
 *    truncate).
 *  FP16: hi only: <= (2 u16 + u16^2) |Wf x| + 2^-37 (mw |x| + |Wf| mx) per
 *    term, cols terms summed as above. */
#define U16 (1.0 / 2048.0)
static double gamma_rz(double k) { return k * 2 * U32 / (1 - k * 2 * U32); }
static double gemm_bound(int mode, int64_t cols, double magf, double sw, double sx, double mw,
                         double mx)
{
    const double k = (double)cols, cross = mw * sx + sw * mx;
    if (mode == HKV_QMAT_GEMM_FP32) return gamma_k(k) * magf;
    if (mode == HKV_QMAT_GEMM_FP16)
        return (2 * U16 + U16 * U16 + gamma_rz(k) * (1 + 1.0 / 512)) * magf + ldexp(cross, -37);
    return (3.01 * U16 * U16 + gamma_rz(k + 1) * (1 + 1.0 / 512) + gamma_rz(2 * k) / 512) * magf +
           ldexp(cross, -48);
}

static const char *mname[] = {"split", "fp16", "fp32"};
static const char *vname[] = {" auto", " 1 row/warp", " 2 rows/warp", " 4 rows/warp"};

/* x row i scaled by 10^(3 (i % 5) - 6): 1e-6 .. 1e6, fp16 would overflow
 * (and go subnormal) without the rows' range scales */
#define MM_WIDE_X 1
/* GEMM panels of 256 rows instead of qmat_panel.h's 32 MiB: several panels
 * and a partial last one at a size the emulator runs quickly */
#define MM_PANEL256 2

static void test_matmul_x(hkv_gpu_ctx *ctx, const hkv_cpu_kernels *scalar,
                          const hkv_cpu_kernels *best, int type, int64_t rows, int64_t cols,
                          const int64_t *ns, int n_ns, int flags, float wmul, test_rng *rng)
{
    static const int64_t all_ns[] = {1, 2, 7, 8, 9, 33};
    if (!ns) ns = all_ns, n_ns = 6;
    void *st = hkv_gpu_ctx_stream(ctx);
    test_wmat m;
    make_wmat(&m, type, rows, cols, rng);
    if (type == HKV_W_F32)
        for (int64_t i = 0; i < rows * cols; i++) ((float *)m.w.q)[i] *= wmul;
    hkv_gpu_qmat g;
    GPU_OK(hkv_gpu_qmat_upload(ctx, &m.w, &g, st, err));
    CHECK(g.panel_rows == 0, "upload sets the panel rule (panel_rows %lld)", (long long)g.panel_rows);
    if (flags & MM_PANEL256) g.panel_rows = 256;
    /* the fp32 weights, their a-priori dequantisation error, the exact ones */
    float *wf = malloc(rows * cols * 4);
    double *wdq = malloc(rows * cols * 8);
    scalar->dequant_rows(&m.w, 0, rows, wf);
    int dq_over = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            wdq[r * cols + c] = dq_err(&m.w, wf[r * cols + c]);
            dq_over += !(fabs(wf[r * cols + c] - ref_weight(&m.w, r, c)) <= wdq[r * cols + c]);
        }
    CHECK(dq_over == 0, "%s: %d host fp32 weights outside the dequantisation bound", tname[type],
          dq_over);
    /* the path the device's tensor cores pay for: split on A100/H100 */
    const int want = hkv_gpu_tensor_split_pays(hkv_gpu_ctx_cc(ctx)) ? HKV_QMAT_GEMM_SPLIT
                                                                     : HKV_QMAT_GEMM_FP32;
    CHECK(hkv_gpu_tensor_split_pays(90) && hkv_gpu_tensor_split_pays(80) &&
          !hkv_gpu_tensor_split_pays(89) && !hkv_gpu_tensor_split_pays(86),
          "the split is chosen for A100/H100 only");
    CHECK(g.gemm == want && g.wscale > 0, "%s: upload left gemm mode %d (want %d), wscale %g",
          tname[type], g.gemm, want, g.wscale);
    /* workspace: none for the GEMV sizes; the split activations grow with the
     * rows up to HKV_QMAT_XCHUNK (2,048), then stay; the FP32 mode's none for
     * F32 weights */
    int64_t max_n = 0;
    for (int ni = 0; ni < n_ns; ni++) max_n = ns[ni] > max_n ? ns[ni] : max_n;
    size_t wsb = 0;
    for (int mode = HKV_QMAT_GEMM_SPLIT; mode <= HKV_QMAT_GEMM_FP32; mode++) {
        g.gemm = mode;
        const size_t s8 = hkv_gpu_qmat_matmul_ws_bytes(&g, 8), s9 = hkv_gpu_qmat_matmul_ws_bytes(&g, 9),
                     s33 = hkv_gpu_qmat_matmul_ws_bytes(&g, 33),
                     s512 = hkv_gpu_qmat_matmul_ws_bytes(&g, HKV_QMAT_XCHUNK),
                     s5000 = hkv_gpu_qmat_matmul_ws_bytes(&g, 5000);
        const int f32 = mode == HKV_QMAT_GEMM_FP32;
        CHECK(s8 == 0 && (f32 && type == HKV_W_F32 ? s9 == 0 : s9 > 0) &&
                  (f32 ? s33 == s9 : s33 > s9 && s33 >= 33 * ((size_t)cols * 4 + 4)) && s5000 == s512 &&
                  s512 >= s33,
              "ws bytes %s %s %lldx%lld: %zu, %zu, %zu, %zu, %zu for 8, 9, 33, %d, 5000 rows",
              tname[type], mname[mode], (long long)rows, (long long)cols, s8, s9, s33, s512, s5000,
              HKV_QMAT_XCHUNK);
        const size_t s = hkv_gpu_qmat_matmul_ws_bytes(&g, max_n);
        wsb = s > wsb ? s : wsb;
    }
    g.gemm = HKV_QMAT_GEMM_SPLIT;
    void *ws = wsb ? gpu_put(ctx, NULL, wsb) : NULL;
    for (int ni = 0; ni < n_ns; ni++) {
        /* even n: x rows 16-byte aligned (the GEMV's 128-bit loads), odd n: not */
        const int64_t n = ns[ni], ldx = cols + (n % 2 ? 3 : 4), ldy = rows + 3;
        const int gemm = n > HKV_GEMV_MAX_N;
        float *x = malloc(n * cols * 4), *xs = malloc(n * ldx * 4);
        for (int64_t i = 0; i < n * ldx; i++)
            xs[i] = rng_nonzero(rng, -1, 1) *
                    (flags & MM_WIDE_X ? (float)pow(10, 3 * ((i / ldx) % 5) - 6) : 1.0f);
        for (int64_t i = 0; i < n; i++) memcpy(x + i * cols, xs + i * ldx, cols * 4);
        float *dx = gpu_put(ctx, xs, n * ldx * 4);
        float *dy = gpu_poisoned(ctx, n * ldy), *y = malloc((n * ldy + HKV_TEST_GUARD) * 4);
        /* host: hkv_matmul with the scalar table and the best one */
        float *yh[2];
        for (int t = 0; t < 2; t++) {
            const hkv_cpu_kernels *kt = t ? best : scalar;
            size_t wf_n = hkv_matmul_ws_floats(&m.w);
            float *hws = wf_n ? aligned_alloc(64, (wf_n * 4 + 63) / 64 * 64) : NULL;
            yh[t] = malloc(n * rows * 4);
            if (hkv_matmul(kt, &m.w, x, n, yh[t], hws) != HKV_OK) CHECK(0, "host hkv_matmul failed");
            free(hws);
        }
        double *ref = malloc(n * rows * 8), *mag = malloc(n * rows * 8);
        ref_gemv(&m.w, x, (int)n, ref, mag);   /* exact weights */
        /* GEMM: each hkv_qmat_gemm mode; GEMV: each hkv_qmat_gemv mode (Q4's rows per warp) */
        const int last = gemm ? HKV_QMAT_GEMM_FP32 : type == HKV_W_Q4 ? HKV_QMAT_GEMV_ROW4 : 0;
        float *y0 = malloc((n * ldy + HKV_TEST_GUARD) * 4);   /* the GEMV's first mode's output */
        for (int mode = 0; mode <= last; mode++) {
            g.gemm = gemm ? mode : HKV_QMAT_GEMM_SPLIT;
            g.gemv = gemm ? HKV_QMAT_GEMV_AUTO : mode;
            const size_t need = hkv_gpu_qmat_matmul_ws_bytes(&g, n);
            const int path = gemm ? 1 + mode : 0;
            hkv_err err;
            hkv_err_clear(&err);
            if (gemm && need) {
                CHECK(hkv_gpu_qmat_matmul(ctx, &g, dx, ldx, n, dy, ldy, ws, need - 1, st, &err) ==
                          HKV_E_INVAL && strstr(err.msg, "workspace"),
                      "matmul %s %s n=%lld: a workspace 1 byte short accepted (%s)", tname[type],
                      mname[mode], (long long)n, err.msg);
                CHECK(hkv_gpu_qmat_matmul(ctx, &g, dx, ldx, n, dy, ldy, NULL, need, st, &err) ==
                          HKV_E_INVAL, "matmul %s %s n=%lld: no workspace accepted", tname[type],
                      mname[mode], (long long)n);
            }
            CHECK(hkv_gpu_qmat_matmul(ctx, &g, dx, cols - 1, n, dy, ldy, ws, wsb, st, &err) ==
                      HKV_E_INVAL, "matmul with ldx < cols accepted");
            CHECK(hkv_gpu_qmat_matmul(ctx, &g, dx, ldx, n, dy, rows - 1, ws, wsb, st, &err) ==
                      HKV_E_INVAL, "matmul with ldy < rows accepted");
            /* poisoned again for each mode */
            GPU_OK(hkv_gpu_memset(dy, 0xff, (n * ldy + HKV_TEST_GUARD) * 4, st, err));
            GPU_OK(hkv_gpu_qmat_matmul(ctx, &g, dx, ldx, n, dy, ldy, gemm ? ws : NULL,
                                       gemm ? need : 0, st, err));
            gpu_get(ctx, y, dy, (n * ldy + HKV_TEST_GUARD) * 4);
            /* the Q4 GEMV's rows per warp change which warp sums a row, not how:
             * every mode's output the same bits (batch-invariant decode relies on it) */
            if (!gemm && mode == 0) memcpy(y0, y, n * ldy * 4);
            else if (!gemm)
                CHECK(!memcmp(y0, y, n * ldy * 4), "matmul %s %lldx%lld n=%lld: GEMV %s differs in "
                      "its bits from GEMV %s", tname[type], (long long)rows, (long long)cols,
                      (long long)n, vname[mode], vname[0]);

            const double h = (double)(gemv_lane_terms(type, cols) + 5);   /* GEMV */
            double worst_f = 0, worst_e = 0, worst_h = 0, worst_ratio = 0;
            int nan = 0, stray = 0, over = 0;
            for (int64_t i = 0; i < n; i++) {
                const float *xi = x + i * cols;
                double sx = 0, mx = 0;
                for (int64_t c = 0; c < cols; c++) sx += fabs(xi[c]), mx = fmax(mx, fabs(xi[c]));
                for (int64_t r = 0; r < rows; r++) {
                    double sf = 0, magf = 0, dq = 0, sw = 0, mw = 0;
                    for (int64_t c = 0; c < cols; c++) {
                        const double wv = wf[r * cols + c], t = wv * xi[c];
                        sf += t, magf += fabs(t), dq += wdq[r * cols + c] * fabs(xi[c]);
                        sw += fabs(wv), mw = fmax(mw, fabs(wv));
                    }
                    const double v = y[i * ldy + r];
                    nan += isnan(v);
                    const double ef = fabs(v - sf), ee = fabs(v - ref[i * rows + r]);
                    double eh = 0;
                    for (int t = 0; t < 2; t++) eh = fmax(eh, fabs(v - yh[t][i * rows + r]));
                    const double bf = gemm ? gemm_bound(mode, cols, magf, sw, sx, mw, mx)
                                           : gamma_k(h) * magf,
                                 be = bf + dq, bh = bf + gamma_k((double)cols) * magf + 2 * dq;
                    over += !(ef <= bf) + !(ee <= be) + !(eh <= bh);
                    const double mg = magf > 0 ? magf : 1,
                                 mgx = mag[i * rows + r] > 0 ? mag[i * rows + r] : 1;
                    worst_f = fmax(worst_f, ef / mg), worst_e = fmax(worst_e, ee / mgx);
                    worst_h = fmax(worst_h, eh / mg);
                    worst_ratio = fmax(worst_ratio, bf > 0 ? ef / bf : ef > 0 ? INFINITY : 0);
                }
                for (int64_t r = rows; r < ldy; r++) stray += !isnan(y[i * ldy + r]);
            }
            CHECK(nan == 0 && stray == 0 && over == 0 && guard_intact(y, n * ldy),
                  "matmul %s %lldx%lld n=%lld (%s%s%s): %d over the bounds (err/mag %.3g fp32 W, "
                  "%.3g exact W, %.3g host; max err / bound %.3g), %d NaN, %d stray", tname[type],
                  (long long)rows, (long long)cols, (long long)n, gemm ? "GEMM " : "GEMV",
                  gemm ? mname[mode] : vname[mode], flags & MM_WIDE_X ? ", x rows 1e-6..1e6" : "", over,
                  worst_f, worst_e, worst_h, worst_ratio, nan, stray);
            meas_f[type][path] = fmax(meas_f[type][path], worst_f);
            meas_e[type][path] = fmax(meas_e[type][path], worst_e);
            meas_h[type][path] = fmax(meas_h[type][path], worst_h);
            meas_ratio[type][path] = fmax(meas_ratio[type][path], worst_ratio);
        }
        g.gemm = HKV_QMAT_GEMM_SPLIT;
        g.gemv = HKV_QMAT_GEMV_AUTO;
        gpu_drop(ctx, dx, n * ldx * 4);
        gpu_drop(ctx, dy, (n * ldy + HKV_TEST_GUARD) * 4);
        free(x), free(xs), free(y), free(y0), free(yh[0]), free(yh[1]), free(ref), free(mag);
    }
    /* n = 0 does nothing, whatever the workspace */
    float *dummy = gpu_put(ctx, NULL, 4);
    GPU_OK(hkv_gpu_qmat_matmul(ctx, &g, dummy, cols, 0, dummy, rows, NULL, 0, st, err));
    gpu_drop(ctx, dummy, 4);
    if (ws) gpu_drop(ctx, ws, wsb);
    hkv_gpu_qmat_free(ctx, &g);
    free(wf), free(wdq);
    free_wmat(&m);
}

/* for every n in ns[0..n_ns), or in {1, 2, 7, 8, 9, 33} when ns is NULL;
 * GEMV sizes once, GEMM sizes in every mode (hkv_gpu_qmat.gemm). F32 weights
 * are multiplied by wmul (a power of ten: fp16 range). */
static void test_matmul(hkv_gpu_ctx *ctx, const hkv_cpu_kernels *scalar,
                        const hkv_cpu_kernels *best, int type, int64_t rows, int64_t cols,
                        const int64_t *ns, int n_ns, test_rng *rng)
{
    test_matmul_x(ctx, scalar, best, type, rows, cols, ns, n_ns, 0, 1, rng);
}

/* The GEMM's cuBLAS handle is its stream's (gpu_ctx.h): on a second stream
 * of the context (hkv_gpu_ctx_add_stream: its own handle and workspace) the
 * same product bit for bit in every GEMM mode; on a stream the context did
 * not make, a clear error. Run last: the added stream's workspace stays
 * accounted until the context goes. */
static void test_matmul_streams(hkv_gpu_ctx *ctx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx), *s2 = NULL, *alien = NULL;
    const int64_t rows = 37, cols = 96, n = HKV_GEMV_MAX_N + 3;
    test_wmat m;
    make_wmat(&m, HKV_W_Q4, rows, cols, rng);
    hkv_gpu_qmat g;
    GPU_OK(hkv_gpu_qmat_upload(ctx, &m.w, &g, st, err));
    float *x = malloc(n * cols * 4), *y = malloc(n * rows * 4), *y2 = malloc(n * rows * 4);
    for (int64_t i = 0; i < n * cols; i++) x[i] = rng_nonzero(rng, -1, 1);
    float *dx = gpu_put(ctx, x, n * cols * 4);
    GPU_OK(hkv_gpu_ctx_add_stream(ctx, &s2, err));
    for (int mode = HKV_QMAT_GEMM_SPLIT; mode <= HKV_QMAT_GEMM_FP32; mode++) {
        g.gemm = mode;
        const size_t wsb = hkv_gpu_qmat_matmul_ws_bytes(&g, n);
        void *ws = gpu_put(ctx, NULL, wsb);
        float *dy = gpu_poisoned(ctx, n * rows), *dy2 = gpu_poisoned(ctx, n * rows);
        GPU_OK(hkv_gpu_qmat_matmul(ctx, &g, dx, cols, n, dy, rows, ws, wsb, st, err));
        gpu_get(ctx, y, dy, n * rows * 4);   /* the main stream is idle now: ws and dy2 ready */
        GPU_OK(hkv_gpu_qmat_matmul(ctx, &g, dx, cols, n, dy2, rows, ws, wsb, s2, err));
        GPU_OK(hkv_gpu_sync(s2, err));
        gpu_get(ctx, y2, dy2, n * rows * 4);
        CHECK(!memcmp(y, y2, n * rows * 4), "matmul %s n=%lld on a second stream differs from the "
              "main stream's", mname[mode], (long long)n);
        gpu_drop(ctx, dy, (n * rows + HKV_TEST_GUARD) * 4);
        gpu_drop(ctx, dy2, (n * rows + HKV_TEST_GUARD) * 4);
        gpu_drop(ctx, ws, wsb);
    }
    GPU_OK(hkv_gpu_stream_create(&alien, err));
    const size_t wsb = hkv_gpu_qmat_matmul_ws_bytes(&g, n);
    void *ws = gpu_put(ctx, NULL, wsb);
    float *dy = gpu_poisoned(ctx, n * rows);
    hkv_err e2;
    hkv_err_clear(&e2);
    CHECK(hkv_gpu_qmat_matmul(ctx, &g, dx, cols, n, dy, rows, ws, wsb, alien, &e2) ==
              HKV_E_INVAL && strstr(e2.msg, "no cuBLAS handle"),
          "matmul on a foreign stream: \"%s\"", e2.msg);
    hkv_gpu_stream_destroy(alien);
    gpu_drop(ctx, dy, (n * rows + HKV_TEST_GUARD) * 4);
    gpu_drop(ctx, ws, wsb);
    gpu_drop(ctx, dx, n * cols * 4);
    hkv_gpu_qmat_free(ctx, &g);
    free(x), free(y), free(y2);
    free_wmat(&m);
}

/* ---- rows --------------------------------------------------------------------------------- */

static void test_copy_rows(hkv_gpu_ctx *ctx, int64_t cols, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int64_t ns = 10, nd = 12, lds = cols + 2, ldd = cols + 4;
    float *src = malloc(ns * lds * 4), *out = malloc((nd * ldd + HKV_TEST_GUARD) * 4);
    for (int64_t i = 0; i < ns * lds; i++) src[i] = rng_nonzero(rng, -5, 5);
    float *dsrc = gpu_put(ctx, src, ns * lds * 4);
    enum { NL = 7 };
    const int32_t srow[NL] = {9, 0, 3, 3, -1, 5, 2}, drow[NL] = {0, 11, 2, 7, 1, 4, -1};
    int32_t *dsr = gpu_put(ctx, srow, sizeof srow), *ddr = gpu_put(ctx, drow, sizeof drow);
    for (int mode = 0; mode < 4; mode++) {   /* no lists, both, src only, dst only */
        const int use_s = mode == 1 || mode == 2, use_d = mode == 1 || mode == 3;
        const int64_t n = mode == 0 ? ns : NL;
        float *ddst = gpu_poisoned(ctx, nd * ldd);
        GPU_OK(hkv_gpu_copy_rows(ddst, ldd, use_d ? ddr : NULL, dsrc, lds, use_s ? dsr : NULL, n,
                                 cols, st, err));
        gpu_get(ctx, out, ddst, (nd * ldd + HKV_TEST_GUARD) * 4);
        int64_t want[12];   /* source row of each destination row, -1: untouched */
        for (int r = 0; r < 12; r++) want[r] = -1;
        for (int64_t i = 0; i < n; i++) {
            int64_t s = use_s ? srow[i] : i, d = use_d ? drow[i] : i;
            if (s >= 0 && d >= 0) want[d] = s;
        }
        int bad = 0;
        for (int64_t r = 0; r < nd; r++)
            for (int64_t c = 0; c < ldd; c++) {
                float v = out[r * ldd + c];
                if (want[r] < 0 || c >= cols) bad += !isnan(v);
                else bad += v != src[want[r] * lds + c];
            }
        CHECK(bad == 0 && guard_intact(out, nd * ldd), "copy_rows cols %lld mode %d: %d wrong",
              (long long)cols, mode, bad);
        gpu_drop(ctx, ddst, (nd * ldd + HKV_TEST_GUARD) * 4);
    }
    hkv_err err;
    hkv_err_clear(&err);
    CHECK(hkv_gpu_copy_rows((float *)dsrc, cols - 1, NULL, dsrc, lds, NULL, 1, cols, st, &err) ==
              HKV_E_INVAL, "copy_rows with ld_dst < cols accepted");
    gpu_drop(ctx, dsrc, ns * lds * 4);
    gpu_drop(ctx, dsr, sizeof srow), gpu_drop(ctx, ddr, sizeof drow);
    free(src), free(out);
}

static void test_add_bias(hkv_gpu_ctx *ctx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int64_t n = 5, cols = 300, ldx = 305;
    float *x = malloc(n * ldx * 4), *b = malloc(cols * 4), *out = malloc(n * ldx * 4);
    for (int64_t i = 0; i < n * ldx; i++) x[i] = rng_nonzero(rng, -3, 3);
    for (int64_t i = 0; i < cols; i++) b[i] = rng_nonzero(rng, -1, 1);
    float *dx = gpu_put(ctx, x, n * ldx * 4), *db = gpu_put(ctx, b, cols * 4);
    GPU_OK(hkv_gpu_add_bias(dx, ldx, n, db, cols, st, err));
    gpu_get(ctx, out, dx, n * ldx * 4);
    int bad = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < ldx; c++) {
            float want = c < cols ? x[r * ldx + c] + b[c] : x[r * ldx + c];
            bad += out[r * ldx + c] != want;
        }
    CHECK(bad == 0, "add_bias: %d wrong", bad);
    hkv_err err;
    hkv_err_clear(&err);
    CHECK(hkv_gpu_add_bias(dx, cols - 1, n, db, cols, st, &err) == HKV_E_INVAL,
          "add_bias with ldx < cols accepted");
    gpu_drop(ctx, dx, n * ldx * 4), gpu_drop(ctx, db, cols * 4);
    free(x), free(b), free(out);
}

static float kv_value(test_rng *rng, int64_t i)
{
    switch (i % 6) {
    case 0: return rng_uniform(rng, -2, 2);
    case 1: return rng_uniform(rng, -1e-4f, 1e-4f);   /* fp16 subnormals */
    case 2: {   /* halfway between two halves: ties to even */
        uint16_t h = (uint16_t)(rng_next(rng) & 0x3bff);
        return (float)((half_to_double(h) + half_to_double((uint16_t)(h + 1))) / 2);
    }
    case 3: return rng_uniform(rng, -300, 300);
    case 4: return (i & 8) ? 65519.0f : -70000.0f;   /* rounds down to 65504; overflows to -inf */
    default: return rng_uniform(rng, -0.01f, 0.01f);
    }
}

/* q8: hkv_gpu_kv_append_q8, each row what the host's 8-bit far tier gives
 * back for it (hkv_q8_quantize's codes times their scale, rounded once to
 * fp16, as q8_to_f16 forms it), bit for bit. */
static void test_kv_append(hkv_gpu_ctx *ctx, int layout, int q8, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int H = 4, KH = 2, d = 64;
    const int64_t n = 6, cap = 16, ld = (int64_t)(H + 2 * KH) * d + 7;
    const int64_t k_off = (int64_t)H * d, v_off = k_off + (int64_t)KH * d;
    /* layout 0: [head][pos][d] (hs = cap*d); 1: [pos][head][d] (hs = d) */
    const int64_t hs = layout == 0 ? cap * d : d, pos_stride = layout == 0 ? d : (int64_t)KH * d;
    const int64_t pos[6] = {3, -1, 0, 15, 7, -5};
    int64_t dst[6];
    for (int r = 0; r < 6; r++) dst[r] = pos[r] < 0 ? -1 : pos[r] * pos_stride;
    float *qkv = malloc(n * ld * 4);
    /* q8: values of mixed sizes, so that a group's absmax sits in one lane of
     * its 32 (kv_value's +-65519/70000 in every half would hide a wrong one) */
    for (int64_t i = 0; i < n * ld; i++)
        qkv[i] = !q8 ? kv_value(rng, i)
                     : rng_uniform(rng, -1, 1) * (rng_next(rng) % 7 == 0 ? 40.0f : 1.0f);
    const int64_t csz = (int64_t)KH * cap * d;
    uint16_t *init = malloc(csz * 2), *kc = malloc(csz * 2), *vc = malloc(csz * 2);
    for (int64_t i = 0; i < csz; i++) init[i] = (uint16_t)(0x7e01 + (i & 7));   /* NaN codes */
    float *dqkv = gpu_put(ctx, qkv, n * ld * 4);
    int64_t *ddst = gpu_put(ctx, dst, sizeof dst);
    uint16_t *dk = gpu_put(ctx, init, csz * 2), *dv = gpu_put(ctx, init, csz * 2);
    GPU_OK((q8 ? hkv_gpu_kv_append_q8 : hkv_gpu_kv_append)(dqkv, ld, n, k_off, v_off, KH, d, ddst,
                                                           hs, dk, dv, st, err));
    gpu_get(ctx, kc, dk, csz * 2);
    gpu_get(ctx, vc, dv, csz * 2);
    uint16_t *wk = malloc(csz * 2), *wv = malloc(csz * 2);
    memcpy(wk, init, csz * 2), memcpy(wv, init, csz * 2);
    for (int64_t r = 0; r < n; r++) {
        if (dst[r] < 0) continue;
        for (int h = 0; h < KH; h++)
            for (int kv = 0; kv < 2; kv++) {
                const float *x = qkv + r * ld + (kv ? v_off : k_off) + (int64_t)h * d;
                uint16_t *w = (kv ? wv : wk) + dst[r] + h * hs;
                int8_t code[64];
                float scale[64 / HKV_Q8_GROUP];
                if (q8) hkv_q8_quantize(x, d, code, scale);
                for (int c = 0; c < d; c++)
                    w[c] = double_to_half_ref(q8 ? (float)code[c] * scale[c / HKV_Q8_GROUP] : x[c]);
            }
    }
    int bad = 0;
    for (int64_t i = 0; i < csz; i++) bad += (kc[i] != wk[i]) + (vc[i] != wv[i]);
    CHECK(bad == 0, "kv_append%s layout %d: %d fp16 codes differ (RNE, skipped rows untouched)",
          q8 ? " q8" : "", layout, bad);
    hkv_err err;
    hkv_err_clear(&err);
    if (q8)   /* the rest of the argument check is kv_append's; q8 adds the group */
        CHECK(hkv_gpu_kv_append_q8(dqkv, ld, n, k_off, v_off, KH, 48, ddst, hs, dk, dv, st, &err) ==
                  HKV_E_INVAL, "kv_append q8 with d 48 (not a multiple of 32) accepted");
    else {
        CHECK(hkv_gpu_kv_append(dqkv, v_off + KH * d - 1, n, k_off, v_off, KH, d, ddst, hs, dk, dv,
                                st, &err) == HKV_E_INVAL, "kv_append with ld too short accepted");
        CHECK(hkv_gpu_kv_append(dqkv, ld, n, k_off, v_off, KH, d, ddst, d - 1, dk, dv, st, &err) ==
                  HKV_E_INVAL, "kv_append with overlapping heads accepted");
    }
    gpu_drop(ctx, dqkv, n * ld * 4), gpu_drop(ctx, ddst, sizeof dst);
    gpu_drop(ctx, dk, csz * 2), gpu_drop(ctx, dv, csz * 2);
    free(qkv), free(init), free(kc), free(vc), free(wk), free(wv);
}

static void test_partial_clear(hkv_gpu_ctx *ctx, test_rng *rng)
{
    void *st = hkv_gpu_ctx_stream(ctx);
    const int H = 3, d = 40;
    const int64_t n = 5, hd = (int64_t)H * d, ldo = hd + 3;
    /* strided: padding untouched */
    float *o = malloc((n * ldo + HKV_TEST_GUARD) * 4), *l = malloc((n * H + HKV_TEST_GUARD) * 4);
    float *dout = gpu_poisoned(ctx, n * ldo), *dlse = gpu_poisoned(ctx, n * H);
    GPU_OK(hkv_gpu_partial_clear(dout, ldo, dlse, n, H, d, st, err));
    gpu_get(ctx, o, dout, (n * ldo + HKV_TEST_GUARD) * 4);
    gpu_get(ctx, l, dlse, (n * H + HKV_TEST_GUARD) * 4);
    int bad = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < ldo; c++) {
            const float v = o[r * ldo + c];
            bad += c < hd ? (v != 0.0f || signbit(v)) : !isnan(v);
        }
    for (int64_t i = 0; i < n * H; i++) bad += l[i] != -INFINITY;
    CHECK(bad == 0 && guard_intact(o, n * ldo) && guard_intact(l, n * H), "partial_clear: %d wrong",
          bad);
    /* contiguous, then the exact merge with a real partial, both ways */
    const int64_t rows = n * H;
    float *ob = malloc(rows * d * 4), *lb = malloc(rows * 4), *res = malloc(rows * d * 4);
    float *lres = malloc(rows * 4);
    for (int64_t i = 0; i < rows * d; i++) ob[i] = rng_nonzero(rng, -2, 2);
    for (int64_t i = 0; i < rows; i++) lb[i] = rng_uniform(rng, -5, 5);
    float *dob = gpu_put(ctx, ob, rows * d * 4), *dlb = gpu_put(ctx, lb, rows * 4);
    float *dca = gpu_poisoned(ctx, rows * d), *dcl = gpu_poisoned(ctx, rows);
    GPU_OK(hkv_gpu_partial_clear(dca, hd, dcl, n, H, d, st, err));
    GPU_OK(hkv_gpu_attn_merge(dca, dcl, dob, dlb, rows, d, st, err));   /* cleared <- real */
    gpu_get(ctx, res, dca, rows * d * 4);
    gpu_get(ctx, lres, dcl, rows * 4);
    CHECK(!memcmp(res, ob, rows * d * 4) && !memcmp(lres, lb, rows * 4),
          "merge into a cleared partial is not the real one exactly");
    GPU_OK(hkv_gpu_partial_clear(dca, hd, dcl, n, H, d, st, err));
    GPU_OK(hkv_gpu_attn_merge(dob, dlb, dca, dcl, rows, d, st, err));   /* real <- cleared */
    gpu_get(ctx, res, dob, rows * d * 4);
    gpu_get(ctx, lres, dlb, rows * 4);
    CHECK(!memcmp(res, ob, rows * d * 4) && !memcmp(lres, lb, rows * 4),
          "merging a cleared partial changed the real one");
    hkv_err err;
    hkv_err_clear(&err);
    CHECK(hkv_gpu_partial_clear(dout, hd - 1, dlse, n, H, d, st, &err) == HKV_E_INVAL,
          "partial_clear with ldo < n_head*d accepted");
    gpu_drop(ctx, dout, (n * ldo + HKV_TEST_GUARD) * 4), gpu_drop(ctx, dlse, (n * H + HKV_TEST_GUARD) * 4);
    gpu_drop(ctx, dob, rows * d * 4), gpu_drop(ctx, dlb, rows * 4);
    gpu_drop(ctx, dca, (rows * d + HKV_TEST_GUARD) * 4), gpu_drop(ctx, dcl, (rows + HKV_TEST_GUARD) * 4);
    free(o), free(l), free(ob), free(lb), free(res), free(lres);
}

int main(void)
{
    hkv_gpu_ctx *ctx = gpu_test_open("gpu_forward");
    test_rng rng = {23};
    hkv_cpu_kernels scalar, best;
    hkv_cpu_kernels_init(&scalar, HKV_ISA_SCALAR);
    hkv_cpu_kernels_init(&best, test_best_isa());
    const size_t start = hkv_gpu_in_use(ctx, -1);
    static const int64_t big_ns[] = {8, 9}, wide_ns[] = {33, 600};

    test_upload_errors(ctx, &rng);
    for (int type = HKV_W_F32; type <= HKV_W_Q4; type++) {
        test_upload(ctx, type, &rng);
        test_rows(ctx, &scalar, &best, type, 37, 96, &rng);
        test_rows(ctx, &scalar, &best, type, 300, 512, &rng);
        test_matmul(ctx, &scalar, &best, type, 1, 32, NULL, 0, &rng);
        test_matmul(ctx, &scalar, &best, type, 37, 96, NULL, 0, &rng);
        test_matmul(ctx, &scalar, &best, type, 300, 512, NULL, 0, &rng);
        test_matmul(ctx, &scalar, &best, type, 9, 800, NULL, 0, &rng);   /* 25 blocks: a partial step */
        /* Q4 GEMV: 33 blocks (a step and one block), 289 (x in tiles at every n) */
        test_matmul(ctx, &scalar, &best, type, 5, 1056, NULL, 0, &rng);
        test_matmul(ctx, &scalar, &best, type, 9, 9248, NULL, 0, &rng);
        /* long rows (lanes loop over many blocks), and two GEMM panels of 256 + 44 rows */
        test_matmul_x(ctx, &scalar, &best, type, 300, 4096, big_ns, 2, MM_PANEL256, 1, &rng);
        /* fp16's range: x rows 1e-6 .. 1e6 (and F32 weights times 1e6 and
         * 1e-6), 600 rows: two chunks of the split activations (512 + 88) */
        test_matmul_x(ctx, &scalar, &best, type, 37, 96, wide_ns, 2, MM_WIDE_X, 1e6f, &rng);
        if (type == HKV_W_F32)
            test_matmul_x(ctx, &scalar, &best, type, 37, 96, wide_ns, 1, MM_WIDE_X, 1e-6f, &rng);
        if (type <= HKV_W_F16) {
            test_rows(ctx, &scalar, &best, type, 37, 97, &rng);
            test_matmul(ctx, &scalar, &best, type, 37, 97, NULL, 0, &rng);
            test_matmul(ctx, &scalar, &best, type, 5, 1, NULL, 0, &rng);
        }
    }
    test_copy_rows(ctx, 37, &rng);
    test_copy_rows(ctx, 700, &rng);
    test_add_bias(ctx, &rng);
    test_kv_append(ctx, 0, 0, &rng);
    test_kv_append(ctx, 1, 0, &rng);
    test_kv_append(ctx, 0, 1, &rng);
    test_kv_append(ctx, 1, 1, &rng);
    test_partial_clear(ctx, &rng);
    CHECK(hkv_gpu_in_use(ctx, -1) == start, "device bytes leaked: %zu in use, %zu at start",
          hkv_gpu_in_use(ctx, -1), start);
    test_matmul_streams(ctx, &rng);   /* after the leak check: it adds a stream */

    static const char *pname[] = {"GEMV", "GEMM split (fp16 hi+lo, tensor)", "GEMM fp16 (tensor)",
                                  "GEMM fp32 (CUDA cores)"};
    for (int type = HKV_W_F32; type <= HKV_W_Q4; type++)
        for (int p = 0; p < 4; p++)
            printf("gpu_forward: matmul %s %s: max err/mag %.3g (fp32 W), %.3g (exact W), %.3g "
                   "(host hkv_matmul); max err / rigorous bound %.3g\n", tname[type], pname[p],
                   meas_f[type][p], meas_e[type][p], meas_h[type][p], meas_ratio[type][p]);
    hkv_gpu_ctx_destroy(ctx);
    return test_report("gpu_forward");
}

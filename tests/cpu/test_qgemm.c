/* The int8-activation products (precision fast: quant_act + qgemm, and
 * hkv_matmul in FAST) against float64 references, on every ISA level:
 *  - quant_act equals a plain scalar quantiser bit for bit (q, d), block
 *    sums within float rounding, padding blocks zero;
 *  - qgemm against the float64 product of the same quantised activations:
 *    |y - ref| <= 2 * (blocks + 16) * 2^-24 * mag (two fp32 roundings of
 *    the running sum per block; mag = sum of |terms|), every n in 1..64
 *    (tiles of 8 tokens and their tails), row counts around the kernel's
 *    16-row groups, blocks around its passes of 32, Q4's 4-block and Q8's
 *    2-block loads and the 16-block scale transposes; Q4 and Q8 (incl. -128);
 *  - against the exact fp32-activation product (ref_gemv): within the
 *    rigorous quantisation bound sum_b (dx_b / 2) sum_j |scale q_j| (plus
 *    the fp32 tolerance); the worst relative error is printed;
 *  - batch invariance: a row's output is bitwise the same alone (n = 1),
 *    inside n = 37, and inside any row range, through qgemm and through
 *    hkv_matmul in FAST (threads, 64-token chunks);
 *  - the AVX2 table's two builds (vpmaddubsw, forced by HKV_ISA_NO_AVXVNNI,
 *    and AVX-VNNI where the CPU has it) through all of the above, and every
 *    FAST kernel the CPU runs (AVX2, AVX-VNNI, AVX512-VNNI, AMX) giving
 *    the same bits (the tables share hkv_quant_act_avx2);
 *  - where the table has no qgemm (scalar, AVX-512 without VNNI)
 *    set_precision(FAST) says EXACT and hkv_matmul gives the exact path's
 *    bits; FAST without ws is refused. */
#include "kernels_impl.h"
#include "ref.h"
#include "status.h"
#include "util.h"

static const char *tname(int type) { return type == HKV_W_Q4 ? "q4" : "q8"; }

static void *qbuf_alloc(int64_t cols, int64_t n)
{
    return aligned_alloc(64, (hkv_qact_bytes(cols, n) + 63) / 64 * 64);
}

static void fill_x(float *x, int64_t n, int64_t cols, test_rng *rng)
{
    for (int64_t i = 0; i < n * cols; i++) x[i] = rng_nonzero(rng, -1, 1);
    /* an outlier block, a zero block, a block of denormal-small values */
    if (cols >= 96) {
        x[5] = 40.0f;
        for (int j = 32; j < 64; j++) x[j] = 0.0f;
        for (int j = 64; j < 96; j++) x[j] = 1e-38f * (float)(j - 80);
    }
}

/* w in the interleaved layout of t's qgemm (hkv_wmat_pack) into *pk; the
 * buffer to free, NULL where the table reads rows only. */
static void *pack_for(const hkv_cpu_kernels *t, const hkv_wmat *w, hkv_wmat *pk)
{
    if (!t->qgemm_pack) return NULL;
    const size_t pb = hkv_wmat_pack_bytes(w, t->qgemm_pack);
    void *buf = aligned_alloc(64, (pb + 63) & ~(size_t)63);
    int rc = hkv_wmat_pack(w, t->qgemm_pack, buf, pk);
    CHECK(pb > 0 && rc == HKV_OK && pk->pack == t->qgemm_pack && hkv_wmat_bytes(pk) == pb && !pk->scale,
          "pack %s %lldx%lld in groups of %d: rc %d, %zu bytes", tname(w->type), (long long)w->rows,
          (long long)w->cols, t->qgemm_pack, rc, pb);
    return buf;
}

/* qgemm over the interleaved layout: the rows layout's bits (yall, all
 * nmax tokens) at n = 1, 2, 3 and nmax, and over rows from the second
 * group on; outputs beyond stay untouched. */
static int packed_diff(const hkv_cpu_kernels *t, const hkv_wmat *w, const hkv_qact *a, int nmax,
                       const float *yall, float *y)
{
    hkv_wmat pk;
    void *buf = pack_for(t, w, &pk);
    if (!buf) return 0;
    const int64_t rows = w->rows, cnt = (int64_t)nmax * rows;
    const int ns[4] = {1, 2, 3, nmax};
    int diff = 0;
    for (int k = 0; k < 4; k++) {
        const int n = ns[k] < nmax ? ns[k] : nmax;
        poison(y, cnt);
        t->qgemm(&pk, a, n, y, rows, 0, rows);
        for (int64_t j = 0; j < (int64_t)n * rows; j++) diff += memcmp(&y[j], &yall[j], sizeof(float)) != 0;
        for (int64_t j = (int64_t)n * rows; j < cnt; j++) diff += !isnan(y[j]);
    }
    const int64_t r0 = t->qgemm_pack;
    if (rows > r0 + 1) {
        poison(y, cnt);
        t->qgemm(&pk, a, nmax, y, rows, r0, rows - 1);
        for (int i = 0; i < nmax; i++)
            for (int64_t r = 0; r < rows; r++) {
                const int64_t j = (int64_t)i * rows + r;
                diff += r < r0 || r == rows - 1 ? !isnan(y[j]) : memcmp(&y[j], &yall[j], sizeof(float)) != 0;
            }
    }
    free(buf);
    return diff;
}

static void test_quant(const hkv_cpu_kernels *t, int64_t cols, int64_t n, test_rng *rng)
{
    float *x = malloc(sizeof(float) * n * cols);
    fill_x(x, n, cols, rng);
    void *buf = qbuf_alloc(cols, n);
    hkv_qact a;
    hkv_qact_view(&a, buf, cols, n);
    memset(buf, 0x55, hkv_qact_bytes(cols, n));   /* padding must be written, not assumed */
    t->quant_act(x, 0, n, &a);
    const int64_t nb = cols / 32;
    int8_t *q = malloc(cols);
    float *d = malloc(sizeof(float) * nb);
    double *sx = malloc(sizeof(double) * nb);
    int32_t *sq = malloc(sizeof(int32_t) * nb);
    int badq = 0, badd = 0, bads = 0, badpad = 0;
    for (int64_t i = 0; i < n; i++) {
        ref_quant_row(x + i * cols, cols, q, d, sx, sq);
        for (int64_t c = 0; c < cols; c++) badq += hkv_qact_at(&a, i, c) != q[c];
        for (int64_t b = 0; b < nb; b++) {
            double xabs = 0;
            for (int j = 0; j < 32; j++) xabs += fabs(x[i * cols + b * 32 + j]);
            badd += memcmp(&a.d[i * a.nbp + b], &d[b], sizeof(float)) != 0;
            bads += fabs(a.sx[i * a.nbp + b] - sx[b]) > 1e-6 * xabs || a.sa[i * a.nbp + b] != 128 * sq[b];
        }
        for (int64_t b = nb; b < a.nbp; b++) {
            badpad += a.d[i * a.nbp + b] != 0 || a.sx[i * a.nbp + b] != 0 || a.sa[i * a.nbp + b] != 0;
            for (int j = 0; j < 32; j++) badpad += hkv_qact_at(&a, i, b * 32 + j) != 0;
        }
    }
    CHECK(badq + badd + bads + badpad == 0, "quant_act cols %lld n %lld: %d q, %d d, %d sums, %d padding wrong",
          (long long)cols, (long long)n, badq, badd, bads, badpad);
    free(q); free(d); free(sx); free(sq); free(buf); free(x);
}

static void test_qgemm_shape(const hkv_cpu_kernels *t, int type, int64_t rows, int64_t cols, int nmax,
                             test_rng *rng, double *worst_exact)
{
    ref_wmat m;
    ref_make_wmat(&m, type, rows, cols, rng);
    if (type == HKV_W_Q8)   /* -128 is legal in the format, though GGUF's quantiser never makes it */
        for (int64_t i = 0; i < rows * cols; i += 7) ((int8_t *)m.q)[i] = -128;
    float *x = malloc(sizeof(float) * nmax * cols);
    fill_x(x, nmax, cols, rng);
    void *buf = qbuf_alloc(cols, nmax);
    hkv_qact a;
    hkv_qact_view(&a, buf, cols, nmax);
    t->quant_act(x, 0, nmax, &a);
    const int64_t cnt = (int64_t)nmax * rows;
    double *ref = malloc(sizeof(double) * cnt), *mag = malloc(sizeof(double) * cnt);
    double *qerr = malloc(sizeof(double) * cnt), *eref = malloc(sizeof(double) * cnt);
    double *emag = malloc(sizeof(double) * cnt);
    ref_qgemm(&m.w, &a, nmax, ref, mag, qerr);
    ref_gemv(&m.w, x, nmax, eref, emag);
    const double tol = 2 * (double)(cols / 32 + 16) * 0x1p-24;
    float *y = alloc_poisoned(cnt), *yall = alloc_poisoned(cnt);
    /* all nmax rows at once: the reference for the others bit for bit */
    t->qgemm(&m.w, &a, nmax, yall, rows, 0, rows);
    int nan;
    double e = ref_worst_err(yall, ref, mag, cnt, &nan);
    CHECK(nan == 0 && e <= tol && guard_intact(yall, cnt), "%s qgemm %s %lldx%lld n=%d: err %.3g (tol %.3g), %d NaN",
          hkv_isa_name(t->isa), tname(type), (long long)rows, (long long)cols, nmax, e, tol, nan);
    /* against the exact product: the quantisation bound */
    int over = 0;
    for (int64_t k = 0; k < cnt; k++) {
        double err = fabs(yall[k] - eref[k]);
        over += !(err <= qerr[k] * (1 + 1e-4) + tol * (mag[k] + emag[k]));
        double rel = err / (emag[k] > 0 ? emag[k] : 1);
        if (rel > *worst_exact) *worst_exact = rel;
    }
    CHECK(over == 0, "%s qgemm %s %lldx%lld: %d outputs beyond the quantisation bound", hkv_isa_name(t->isa),
          tname(type), (long long)rows, (long long)cols, over);
    /* every n: the first n rows of x give the first n rows of yall, bitwise */
    int diff = 0;
    if (t->amx) {   /* AMX tiles and vpdpbusd alone: the same bits */
        hkv_cpu_kernels tv = *t;
        hkv_cpu_kernels_set_amx(&tv, 0);
        poison(y, cnt);
        tv.qgemm(&m.w, &a, nmax, y, rows, 0, rows);
        int damx = 0;
        for (int64_t k = 0; k < cnt; k++) damx += memcmp(&y[k], &yall[k], sizeof(float)) != 0;
        CHECK(!tv.amx && damx == 0, "qgemm %s %lldx%lld n=%d: %d outputs differ between AMX and VNNI",
              tname(type), (long long)rows, (long long)cols, nmax, damx);
    }
    for (int n = 1; n <= nmax; n++) {
        poison(y, cnt);
        t->qgemm(&m.w, &a, n, y, rows, 0, rows);
        for (int64_t k = 0; k < (int64_t)n * rows; k++) diff += memcmp(&y[k], &yall[k], sizeof(float)) != 0;
        diff += !isnan(y[(int64_t)n * rows]);
    }
    /* a token alone (its own activations at row 0) and a row range */
    for (int i = 0; i < nmax; i += 5) {
        hkv_qact one = a;
        one.q += (int64_t)i * a.nbp * 32;
        one.d += (int64_t)i * a.nbp;
        one.sx += (int64_t)i * a.nbp;
        one.sa += (int64_t)i * a.nbp;
        poison(y, rows);
        t->qgemm(&m.w, &one, 1, y, rows, 0, rows);
        for (int64_t r = 0; r < rows; r++) diff += memcmp(&y[r], &yall[(int64_t)i * rows + r], sizeof(float)) != 0;
    }
    if (rows >= 4) {
        poison(y, cnt);
        t->qgemm(&m.w, &a, nmax, y, rows, 1, rows - 2);
        for (int i = 0; i < nmax; i++)
            for (int64_t r = 0; r < rows; r++) {
                int64_t k = (int64_t)i * rows + r;
                if (r < 1 || r >= rows - 2) diff += !isnan(y[k]);
                else diff += memcmp(&y[k], &yall[k], sizeof(float)) != 0;
            }
    }
    CHECK(diff == 0, "%s qgemm %s %lldx%lld: %d outputs depend on n, the token's place or the row range",
          hkv_isa_name(t->isa), tname(type), (long long)rows, (long long)cols, diff);
    diff = packed_diff(t, &m.w, &a, nmax, yall, y);
    CHECK(diff == 0, "%s qgemm %s %lldx%lld packed in groups of %d: %d outputs differ from the rows layout's",
          hkv_isa_name(t->isa), tname(type), (long long)rows, (long long)cols, t->qgemm_pack, diff);
    free(y); free(yall); free(ref); free(mag); free(qerr); free(eref); free(emag); free(buf); free(x);
    ref_free_wmat(&m);
}

/* hkv_matmul in FAST: the qgemm results (bitwise, whatever the threads and
 * the 64-token chunks), a token alone == inside the batch. */
static void test_matmul_fast(const hkv_cpu_kernels *t0, int type, int64_t rows, int64_t cols, int n,
                             test_rng *rng)
{
    hkv_cpu_kernels t = *t0;
    CHECK(hkv_cpu_kernels_set_precision(&t, HKV_PREC_FAST) == HKV_PREC_FAST, "FAST refused with qgemm");
    ref_wmat m;
    ref_make_wmat(&m, type, rows, cols, rng);
    float *x = malloc(sizeof(float) * n * cols);
    fill_x(x, n, cols, rng);
    float *ws = malloc(sizeof(float) * hkv_matmul_ws_floats(&m.w));
    float *y = alloc_poisoned((int64_t)n * rows), *y1 = alloc_poisoned(rows);
    int rc = hkv_matmul(&t, &m.w, x, n, y, ws);
    CHECK(rc == 0 && guard_intact(y, (int64_t)n * rows), "FAST matmul rc %d", rc);
    CHECK(hkv_matmul(&t, &m.w, x, n, y, NULL) == HKV_E_INVAL, "FAST matmul without ws accepted");
    int diff = 0;
    for (int i = 0; i < n; i += 3) {
        hkv_matmul(&t, &m.w, x + (int64_t)i * cols, 1, y1, ws);
        for (int64_t r = 0; r < rows; r++) diff += memcmp(&y1[r], &y[(int64_t)i * rows + r], sizeof(float)) != 0;
    }
    t.batch_invariant = 1;   /* the scheduler's flag changes nothing in FAST */
    float *yb = alloc_poisoned((int64_t)n * rows);
    hkv_matmul(&t, &m.w, x, n, yb, ws);
    for (int64_t k = 0; k < (int64_t)n * rows; k++) diff += memcmp(&yb[k], &y[k], sizeof(float)) != 0;
    CHECK(diff == 0, "%s FAST matmul %s %lldx%lld n=%d: %d outputs depend on the batch", hkv_isa_name(t.isa),
          tname(type), (long long)rows, (long long)cols, n, diff);
    /* and the same as qgemm on one thread with all n at once */
    void *buf = qbuf_alloc(cols, n);
    hkv_qact a;
    hkv_qact_view(&a, buf, cols, n);
    t.quant_act(x, 0, n, &a);
    float *yq = alloc_poisoned((int64_t)n * rows);
    t.qgemm(&m.w, &a, n, yq, rows, 0, rows);
    diff = 0;
    for (int64_t k = 0; k < (int64_t)n * rows; k++) diff += memcmp(&yq[k], &y[k], sizeof(float)) != 0;
    CHECK(diff == 0, "%s FAST matmul %s n=%d: %d outputs differ from one qgemm call", hkv_isa_name(t.isa),
          tname(type), n, diff);
    /* packed: the same bits through hkv_matmul; refused where qgemm does not run */
    hkv_wmat pk;
    void *pbuf = pack_for(&t, &m.w, &pk);
    if (pbuf) {
        poison(yq, (int64_t)n * rows);
        rc = hkv_matmul(&t, &pk, x, n, yq, ws);
        diff = 0;
        for (int64_t k = 0; k < (int64_t)n * rows; k++) diff += memcmp(&yq[k], &y[k], sizeof(float)) != 0;
        CHECK(rc == HKV_OK && diff == 0, "%s FAST matmul %s n=%d packed: rc %d, %d outputs differ", hkv_isa_name(t.isa),
              tname(type), n, rc, diff);
        hkv_cpu_kernels te = t;
        hkv_cpu_kernels_set_precision(&te, HKV_PREC_EXACT);
        hkv_wmat other = pk;
        other.pack = t.qgemm_pack == 8 ? 16 : 8;
        CHECK(hkv_matmul(&te, &pk, x, n, yq, ws) == HKV_E_INVAL && hkv_matmul(&t, &other, x, n, yq, ws) == HKV_E_INVAL &&
              hkv_matmul_parts(&te, &pk, 1, x, n, yq, rows, ws, yb) == HKV_E_INVAL,
              "a packed matrix accepted by EXACT or by another group size");
        free(pbuf);
    }
    free(buf); free(yq); free(yb); free(y); free(y1); free(ws); free(x);
    ref_free_wmat(&m);
}

/* hkv_matmul_parts: three parts (Q8, the type, Q8; rows not multiples of
 * 16) side by side in y with spare columns, in FAST and EXACT, bitwise as
 * hkv_matmul per part, the spare columns untouched. */
static void test_matmul_parts(const hkv_cpu_kernels *t0, int type, int64_t cols, int n, test_rng *rng)
{
    const int64_t rows[3] = {37, 64, 21};
    const int types[3] = {HKV_W_Q8, type, HKV_W_Q8};
    ref_wmat m[3];
    hkv_wmat parts[3];
    size_t wsf = 0;
    int64_t sum = 0;
    for (int p = 0; p < 3; p++) {
        ref_make_wmat(&m[p], types[p], rows[p], cols, rng);
        parts[p] = m[p].w;
        if (hkv_matmul_ws_floats(&parts[p]) > wsf) wsf = hkv_matmul_ws_floats(&parts[p]);
        sum += rows[p];
    }
    const int64_t ldy = sum + 3;
    float *x = malloc(sizeof(float) * n * cols);
    fill_x(x, n, cols, rng);
    float *ws = malloc(sizeof(float) * wsf), *stage = malloc(sizeof(float) * n * 64);
    float *y = alloc_poisoned((int64_t)n * ldy), *yp = alloc_poisoned((int64_t)n * 64);
    for (int prec = HKV_PREC_EXACT; prec <= HKV_PREC_FAST; prec++) {
        hkv_cpu_kernels t = *t0;
        hkv_cpu_kernels_set_precision(&t, prec);
        poison(y, (int64_t)n * ldy);
        int rc = hkv_matmul_parts(&t, parts, 3, x, n, y, ldy, ws, stage);
        int diff = 0, spare = 0;
        int64_t off = 0;
        for (int p = 0; p < 3; p++) {
            hkv_matmul(&t, &parts[p], x, n, yp, ws);
            for (int i = 0; i < n; i++)
                for (int64_t r = 0; r < rows[p]; r++)
                    diff += memcmp(&y[i * ldy + off + r], &yp[i * rows[p] + r], sizeof(float)) != 0;
            off += rows[p];
        }
        for (int i = 0; i < n; i++)
            for (int64_t c = sum; c < ldy; c++) spare += !isnan(y[i * ldy + c]);
        CHECK(rc == HKV_OK && diff == 0 && spare == 0, "%s matmul_parts %s %s n=%d: rc %d, %d outputs differ "
              "from hkv_matmul, %d spare columns written", hkv_isa_name(t.isa), prec ? "fast" : "exact",
              tname(type), n, rc, diff, spare);
    }
    CHECK(hkv_matmul_parts(t0, parts, 3, x, n, y, sum - 1, ws, stage) == HKV_E_INVAL, "ldy below the parts' rows accepted");
    if (t0->qgemm_pack) {   /* y holds FAST's: the packed parts give its bits, the middle one left in rows */
        hkv_cpu_kernels t = *t0;
        hkv_cpu_kernels_set_precision(&t, HKV_PREC_FAST);
        hkv_wmat pk[3];
        void *bufs[3] = {pack_for(&t, &parts[0], &pk[0]), NULL, pack_for(&t, &parts[2], &pk[2])};
        pk[1] = parts[1];
        float *y2 = alloc_poisoned((int64_t)n * ldy);
        int rc = hkv_matmul_parts(&t, pk, 3, x, n, y2, ldy, ws, stage), diff = 0;
        for (int64_t k = 0; k < (int64_t)n * ldy; k++)
            diff += isnan(y[k]) ? !isnan(y2[k]) : memcmp(&y[k], &y2[k], sizeof(float)) != 0;
        CHECK(rc == HKV_OK && diff == 0, "%s matmul_parts %s n=%d packed: rc %d, %d outputs differ", hkv_isa_name(t.isa),
              tname(type), n, rc, diff);
        free(y2); free(bufs[0]); free(bufs[2]);
    }
    free(yp); free(y); free(stage); free(ws); free(x);
    for (int p = 0; p < 3; p++) ref_free_wmat(&m[p]);
}

/* No qgemm in the table: FAST is refused and hkv_matmul stays exact. */
static void test_fallback(const hkv_cpu_kernels *t0, test_rng *rng)
{
    hkv_cpu_kernels t = *t0, te = *t0;
    CHECK(t.qgemm == NULL && t.quant_act == NULL, "%s table has int8 kernels", hkv_isa_name(t.isa));
    CHECK(hkv_cpu_kernels_set_precision(&t, HKV_PREC_FAST) == HKV_PREC_EXACT && t.precision == HKV_PREC_EXACT,
          "%s: FAST accepted without qgemm", hkv_isa_name(t.isa));
    for (int type = HKV_W_Q8; type <= HKV_W_Q4; type++) {
        ref_wmat m;
        ref_make_wmat(&m, type, 37, 576, rng);
        float *x = malloc(sizeof(float) * 20 * 576), *ws = malloc(sizeof(float) * hkv_matmul_ws_floats(&m.w));
        fill_x(x, 20, 576, rng);
        float *y = malloc(sizeof(float) * 20 * 37), *ye = malloc(sizeof(float) * 20 * 37);
        hkv_matmul(&t, &m.w, x, 20, y, ws);
        hkv_matmul(&te, &m.w, x, 20, ye, ws);
        CHECK(memcmp(y, ye, sizeof(float) * 20 * 37) == 0, "%s fallback differs from exact", hkv_isa_name(t.isa));
        free(x); free(ws); free(y); free(ye);
        ref_free_wmat(&m);
    }
}

/* One table's FAST kernels through every check above. */
static void test_fast_table(const hkv_cpu_kernels *t, test_rng *rng)
{
    if (t->qgemm_pack) {   /* what cannot be packed is refused */
        ref_wmat m;
        ref_make_wmat(&m, HKV_W_Q4, 9, 64, rng);
        hkv_wmat f16 = m.w, out;
        f16.type = HKV_W_F16;
        char buf[1024] __attribute__((aligned(64)));
        CHECK(hkv_wmat_pack_bytes(&m.w, 5) == 0 && hkv_wmat_pack(&m.w, 5, buf, &out) == HKV_E_INVAL &&
              hkv_wmat_pack(&f16, 8, buf, &out) == HKV_E_INVAL && hkv_wmat_pack_bytes(&m.w, 8) == 2 * 2 * 160 &&
              hkv_wmat_pack(&m.w, 8, buf, &out) == HKV_OK && hkv_wmat_pack(&out, 8, buf + 640, &out) == HKV_E_INVAL,
              "hkv_wmat_pack: a bad group size, an F16 matrix or a packed one accepted");
        ref_free_wmat(&m);
    }
    for (int64_t cols = 32; cols <= 1536; cols = cols * 3 + 32) test_quant(t, cols, 5, rng);
    test_quant(t, 544, 3, rng);
    double worst = 0;
    for (int type = HKV_W_Q8; type <= HKV_W_Q4; type++) {
        test_qgemm_shape(t, type, 37, 576, 64, rng, &worst);    /* 2 groups + 5 rows; 18 blocks */
        test_qgemm_shape(t, type, 8, 512, 64, rng, &worst);     /* one partial group, 16 blocks */
        test_qgemm_shape(t, type, 5, 96, 19, rng, &worst);      /* 3 blocks: partial loads */
        test_qgemm_shape(t, type, 1, 32, 9, rng, &worst);       /* one block, one row */
        test_qgemm_shape(t, type, 3, 4096, 7, rng, &worst);     /* 4 passes of 32 blocks */
        test_qgemm_shape(t, type, 33, 1056, 13, rng, &worst);   /* 33 blocks: a pass of one; a 1-row group */
        test_qgemm_shape(t, type, 17, 1600, 11, rng, &worst);   /* 50 blocks: a pass of 18 */
        test_qgemm_shape(t, type, 16, 800, 9, rng, &worst);     /* 25 blocks: Q4 and Q8 load tails */
        test_matmul_fast(t, type, 131, 576, 37, rng);
        test_matmul_fast(t, type, 70, 1536, 150, rng);         /* > 64: chunks */
        test_matmul_parts(t, type, 576, 1, rng);
        test_matmul_parts(t, type, 576, 70, rng);               /* > 64: chunks */
    }
    printf("%s%s: worst |fast - exact| / sum|W x| = %.3g; AMX tiles %s\n", hkv_isa_name(t->isa),
           t->isa == HKV_ISA_AVX2 ? (t->avxvnni ? " (AVX-VNNI)" : " (vpmaddubsw)") : "", worst,
           t->amx ? "used and compared with VNNI" : "not used");
}

/* Every FAST kernel this CPU runs gives the same bits (the integer sums are
 * exact and the fp32 step is the same, qgemm_avx2.inc): quant_act and
 * qgemm of each table against the first, Q4 and Q8, n = 1 and 21. */
static void test_same_bits(const hkv_cpu_kernels *tabs, int nt, test_rng *rng)
{
    const int64_t rows = 45, cols = 1056;
    for (int type = HKV_W_Q8; type <= HKV_W_Q4; type++) {
        ref_wmat m;
        ref_make_wmat(&m, type, rows, cols, rng);
        if (type == HKV_W_Q8)
            for (int64_t i = 0; i < rows * cols; i += 5) ((int8_t *)m.q)[i] = -128;
        const int n = 21;
        float *x = malloc(sizeof(float) * n * cols);
        fill_x(x, n, cols, rng);
        const size_t qb = hkv_qact_bytes(cols, n);
        void *b0 = qbuf_alloc(cols, n), *b1 = qbuf_alloc(cols, n);
        float *y0 = alloc_poisoned((int64_t)n * rows), *y1 = alloc_poisoned((int64_t)n * rows);
        hkv_qact a0, a1;
        hkv_qact_view(&a0, b0, cols, n);
        hkv_qact_view(&a1, b1, cols, n);
        memset(b0, 0, qb);
        tabs[0].quant_act(x, 0, n, &a0);
        tabs[0].qgemm(&m.w, &a0, n, y0, rows, 0, rows);
        for (int k = 1; k < nt; k++) {
            memset(b1, 0, qb);
            tabs[k].quant_act(x, 0, n, &a1);
            int dq = memcmp(b0, b1, qb) != 0, dy = 0;
            for (int nn = 1; nn <= n; nn += 20) {
                poison(y1, (int64_t)n * rows);
                tabs[k].qgemm(&m.w, &a1, nn, y1, rows, 0, rows);
                for (int64_t j = 0; j < (int64_t)nn * rows; j++) dy += memcmp(&y0[j], &y1[j], sizeof(float)) != 0;
            }
            CHECK(dq == 0 && dy == 0, "%s %s vs %s%s: quantised activations %s, %d outputs differ", tname(type),
                  hkv_isa_name(tabs[0].isa), hkv_isa_name(tabs[k].isa), tabs[k].avxvnni ? " (AVX-VNNI)" : "",
                  dq ? "differ" : "equal", dy);
        }
        free(y0); free(y1); free(b0); free(b1); free(x);
        ref_free_wmat(&m);
    }
}

int main(void)
{
    hkv_cpu_kernels t, tabs[4];
    int ntabs = 0, avx512_ran = 0, vnni256_ran = 0, amx_ran = 0;
    test_rng rng = {15};
    hkv_isa_info info;
    hkv_isa_detect(&info);
    FOR_EACH_ISA(t, isa) {
        if (!t.qgemm) {
            test_fallback(&t, &rng);
            continue;
        }
        CHECK((info.avx512_vnni && isa == HKV_ISA_AVX512) || isa == HKV_ISA_AVX2,
              "qgemm in a %s table without VNNI", hkv_isa_name(isa));
        if (isa == HKV_ISA_AVX2) {   /* both 256-bit builds, each forced where the CPU runs it */
            hkv_cpu_kernels plain;
            CHECK(hkv_cpu_kernels_init(&plain, HKV_ISA_AVX2 | HKV_ISA_NO_AVXVNNI) == HKV_ISA_AVX2 &&
                  !plain.avxvnni && plain.qgemm == hkv_qgemm_avx2, "avx2-novnni gave another table");
            test_fast_table(&plain, &rng);
            tabs[ntabs++] = plain;
            if (t.avxvnni) {
                CHECK(info.avx_vnni, "AVX-VNNI kernel in the table of a CPU without it");
                test_fast_table(&t, &rng);
                tabs[ntabs++] = t;
                vnni256_ran = 1;
            }
            continue;
        }
        avx512_ran = 1;
        test_fast_table(&t, &rng);
        tabs[ntabs++] = t;
        if (t.amx) {
            amx_ran = 1;
            hkv_cpu_kernels_set_amx(&t, 0);
            tabs[ntabs++] = t;
        }
    }
    if (ntabs > 1) test_same_bits(tabs, ntabs, &rng);
    printf("FAST kernels compared bit for bit: %d\n", ntabs);
    /* "untested ISA:" lines are collected by tools/scripts/test_summary.py, so a green
     * run says which kernels this CPU could not exercise. */
    if (!avx512_ran)
        printf("untested ISA: avx512_vnni: qgemm (cpu/qgemm_avx512.c); only the exact fallback ran on AVX-512\n");
    else if (!amx_ran)
        printf("untested ISA: amx_int8: qgemm's AMX tiles (cpu/qgemm_amx.c)\n");
    if (!vnni256_ran)
        printf("untested ISA: avx_vnni: qgemm's AVX-VNNI build (cpu/qgemm_avxvnni.c)%s\n",
               info.avx_vnni ? " (not compiled in)" : "");
    return test_report("test_qgemm");
}

/* Decode attention pieces against the float64 reference, every ISA level,
 * d in {64, 128} plus d = 48 and 80 (vector fallback / odd vector counts),
 * g in 1..8 (each its own register-kernel instance on AVX-512) and 40 (more
 * than one head pass), n across the 256-row chunks, on random fp16 K/V with a row
 * stride larger than d:
 *  - attn_dense over n in {0, 1, 7, 16, 33, 256, 257, 1000, 3000}: per head
 *    max|out - ref| <= 1e-4 * max|ref| and |lse - ref| <= 1e-4 * max(1, |ref|);
 *    n == 0 gives out exactly 0 and lse -inf;
 *  - the same with sharp logits (scale 1, large q) so the running max
 *    changes often and exp sees a wide range;
 *  - attn_sparse over random idx (with repeats) into a 5000-row cache;
 *  - score_max over random idx: |s - ref| <= 1e-5 * max_h sum_c |q_hc k_c|.
 *  Outputs are NaN-poisoned with guard elements that must stay NaN.
 * Two invariants other code relies on, bit for bit, for every table:
 *  - a head's out and lse do not depend on g or on the heads beside it: one
 *    call over S stacked groups of g heads equals S calls of g heads (so a
 *    caller may stack the heads of sequences that share their keys);
 *  - score_max and score_max_i8 (and score_max_i4: checked against float64
 *    and in pieces) form each score exactly as the tile kernel
 *    did (tile_score below), so a policy's ranking does not move with a
 *    kernel's blocking. */
#include "ref.h"
#include "util.h"

#define CACHE_ROWS 5000

static void check_attn(const hkv_cpu_kernels *t, const char *what, const float *q, int g, int d,
                       const uint16_t *k, const uint16_t *v, int64_t ld, const int32_t *idx,
                       int64_t n, float scale)
{
    float *out = alloc_poisoned((size_t)g * d), *lse = alloc_poisoned(g);
    double *rout = malloc((size_t)g * d * sizeof *rout), *rlse = malloc(g * sizeof *rlse);
    if (idx) t->attn_sparse(q, g, d, k, v, ld, idx, n, scale, out, lse);
    else t->attn_dense(q, g, d, k, v, ld, n, scale, out, lse);
    ref_attn(q, g, d, k, v, ld, idx, n, scale, rout, rlse);
    int bad = 0;
    double worst = 0, worst_l = 0;
    for (int h = 0; h < g; h++) {
        double rmax = 0, emax = 0;
        for (int c = 0; c < d; c++) rmax = fmax(rmax, fabs(rout[h * d + c]));
        for (int c = 0; c < d; c++) {
            float o = out[h * d + c];
            if (isnan(o)) { bad++; continue; }
            if (n == 0) bad += o != 0.0f;
            emax = fmax(emax, fabs(o - rout[h * d + c]));
        }
        double rel = n ? emax / rmax : 0, el;
        if (n == 0) el = (lse[h] == -INFINITY) ? 0 : 1;
        else el = fabs(lse[h] - rlse[h]) / fmax(1.0, fabs(rlse[h]));
        worst = fmax(worst, rel);
        worst_l = fmax(worst_l, isnan(lse[h]) ? 1 : el);
    }
    CHECK(bad == 0 && worst <= 1e-4 && worst_l <= 1e-4 && guard_intact(out, (size_t)g * d) &&
              guard_intact(lse, g),
          "%s %s g=%d d=%d n=%lld scale=%g: out err %.3g lse err %.3g, %d bad", hkv_isa_name(t->isa),
          what, g, d, (long long)n, scale, worst, worst_l, bad);
    free(out); free(lse); free(rout); free(rlse);
}

/* A row's score does not depend on where it sits in a call (cpu/kernels.h):
 * the scores of idx[0..n) computed in pieces starting at odd offsets equal
 * the whole call's bit for bit, so the tiered cache may spread one rerank's
 * rows over threads (kv/kv_tiered_attn.c). scale NULL: score_max; else
 * score_max_i8, or score_max_i4 when four. */
static int pieces_equal_w(const hkv_cpu_kernels *t, const float *q, int g, int d, const void *k,
                          int64_t ld, const float *scale, int four, const int32_t *idx, int64_t n,
                          const float *whole)
{
    float *s = alloc_poisoned(n);
    for (int64_t a = 0, step = 5; a < n; a += step, step = step * 3 % 97 + 1) {
        const int64_t m = a + step < n ? step : n - a;
        if (scale && four)
            t->score_max_i4(q, g, d, k, ld, scale, idx + a, m, s + a);
        else if (scale)
            t->score_max_i8(q, g, d, k, ld, scale, idx + a, m, s + a);
        else
            t->score_max(q, g, d, k, ld, idx + a, m, s + a);
    }
    const int same = memcmp(s, whole, (size_t)n * sizeof *s) == 0;
    free(s);
    return same;
}

static int pieces_equal(const hkv_cpu_kernels *t, const float *q, int g, int d, const void *k,
                        int64_t ld, const float *scale, const int32_t *idx, int64_t n,
                        const float *whole)
{
    return pieces_equal_w(t, q, g, d, k, ld, scale, 0, idx, n, whole);
}

/* One call over S groups of g heads against S calls of g heads: out and lse
 * the same bits (attn_dense when idx is NULL, else attn_sparse). */
static void check_stacked(const hkv_cpu_kernels *t, const float *q, int g, int S, int d,
                          const uint16_t *k, const uint16_t *v, int64_t ld, const int32_t *idx,
                          int64_t n, float scale)
{
    const size_t no = (size_t)S * g * d;
    float *all = alloc_poisoned(no), *all_l = alloc_poisoned((size_t)S * g);
    float *each = alloc_poisoned(no), *each_l = alloc_poisoned((size_t)S * g);
    if (idx) t->attn_sparse(q, S * g, d, k, v, ld, idx, n, scale, all, all_l);
    else t->attn_dense(q, S * g, d, k, v, ld, n, scale, all, all_l);
    for (int s = 0; s < S; s++) {
        const size_t o = (size_t)s * g * d;
        if (idx) t->attn_sparse(q + o, g, d, k, v, ld, idx, n, scale, each + o, each_l + (size_t)s * g);
        else t->attn_dense(q + o, g, d, k, v, ld, n, scale, each + o, each_l + (size_t)s * g);
    }
    CHECK(memcmp(all, each, no * sizeof *all) == 0 &&
              memcmp(all_l, each_l, (size_t)S * g * sizeof *all_l) == 0,
          "%s %s g=%d d=%d n=%lld: %d x g stacked in one call differs from %d calls of g",
          hkv_isa_name(t->isa), idx ? "sparse" : "dense", g, d, (long long)n, S, S);
    free(all); free(all_l); free(each); free(each_l);
}

/* The tile kernel's score of one key (kf: the key as float), modelled lane
 * by lane: lane l is the FMA chain over c = l, l + vl, ... from 0 in order,
 * then lanes l and l + vl/2 add, halving down to one (vf_reduce_vl's
 * association on both vector layers); vl 1 is the scalar table's running
 * sum of products. */
static float tile_score(const float *q, const float *kf, int d, int vl)
{
    float lane[16];
    if (vl == 1) {
        float s = 0.0f;
        for (int c = 0; c < d; c++) {
            const float p = q[c] * kf[c];
            s += p;
        }
        return s;
    }
    for (int l = 0; l < vl; l++) {
        lane[l] = 0.0f;
        for (int c = l; c < d; c += vl) lane[l] = fmaf(q[c], kf[c], lane[l]);
    }
    for (int w = vl / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] = lane[l] + lane[l + w];
    return lane[0];
}

/* The code of element c of a sketch row: int8, or (four) 4-bit, two a byte. */
static int code_of(const int8_t *row, int four, int c)
{
    const uint8_t *r4 = (const uint8_t *)row;
    return four ? ((r4[c / 2] >> (4 * (c & 1))) & 15) - 8 : row[c];
}

/* score_max_i4's definition (cpu/kernels.h), written here from its
 * words: the query per head and group of 32 to int8 (scale max|q| / 127,
 * round to nearest even), each group's product an exact integer, t_G =
 * ((float)I_G * qs_G) * ks_G, the groups summed as a halving tree, the max
 * over the heads. */
static float i4_model(const float *q, int g, int d, const uint8_t *row, const float *ks)
{
    float best = -INFINITY;
    for (int h = 0; h < g; h++) {
        float t[8] = {0};
        const int ng = d / HKV_SKETCH_GROUP;
        for (int G = 0; G < ng; G++) {
            const float *x = q + (int64_t)h * d + G * HKV_SKETCH_GROUP;
            float amax = 0;
            for (int e = 0; e < HKV_SKETCH_GROUP; e++) amax = fmaxf(amax, fabsf(x[e]));
            long long acc = 0;
            for (int e = 0; e < HKV_SKETCH_GROUP; e++) {
                const int c = amax > 0 ? (int)rintf(x[e] * (127.0f / amax)) : 0;
                const int c4 = code_of((const int8_t *)row, 1, G * HKV_SKETCH_GROUP + e);
                acc += (long long)c * c4;
            }
            t[G] = ((float)acc * (amax / 127.0f)) * ks[G];
        }
        for (int m = ng; m > 1;) {
            const int half = m / 2;
            for (int i = 0; i < half; i++) t[i] += t[m - half + i];
            m -= half;
        }
        if (h == 0 || t[0] > best) best = t[0];
    }
    return best;
}

/* score_max (k8 NULL), score_max_i8 (k8, sc8) or score_max_i4 (four: k8's
 * bytes as nibbles) against their models: the tile model, or i4_model (the
 * same bits at every level); the same floats, not merely close ones. */
static void check_score_model_w(const hkv_cpu_kernels *t, const float *q, int g, int d,
                                const uint16_t *k, const int8_t *k8, const float *sc8, int four,
                                int64_t ld, const int32_t *idx, int64_t n)
{
    const int level = t->isa & 0xff, lanes = level == HKV_ISA_AVX512 ? 16 : level == HKV_ISA_AVX2 ? 8 : 1;
    const int vl = d % lanes == 0 && d <= 256 /* HKV_ATTN_MAX_D */ && (!k8 || d % HKV_SKETCH_GROUP == 0) ? lanes : 1;
    float *s = alloc_poisoned(n), kf[256];
    if (k8 && four) t->score_max_i4(q, g, d, (const uint8_t *)k8, ld, sc8, idx, n, s);
    else if (k8) t->score_max_i8(q, g, d, k8, ld, sc8, idx, n, s);
    else t->score_max(q, g, d, k, ld, idx, n, s);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = idx[i];
        if (k8 && four) {
            bad += !(s[i] == i4_model(q, g, d, (const uint8_t *)k8 + row * ld,
                                      sc8 + row * (d / HKV_SKETCH_GROUP)));
            continue;
        }
        for (int c = 0; c < d; c++) {
            const int code = k8 ? code_of(k8 + row * ld, four, c) : 0;
            kf[c] = k8 ? (float)code * sc8[row * (d / HKV_SKETCH_GROUP) + c / HKV_SKETCH_GROUP]
                       : (float)half_to_double(k[row * ld + c]);
        }
        float best = -INFINITY;
        for (int h = 0; h < g; h++) {
            const float v = tile_score(q + (int64_t)h * d, kf, d, vl);
            if (v > best) best = v;
        }
        bad += !(s[i] == best);
    }
    CHECK(bad == 0, "%s %s g=%d d=%d n=%lld: %lld scores differ from its model's",
          hkv_isa_name(t->isa), !k8 ? "score_max" : four ? "score_max_i4" : "score_max_i8", g, d,
          (long long)n, (long long)bad);
    free(s);
}

static void check_score_model(const hkv_cpu_kernels *t, const float *q, int g, int d,
                              const uint16_t *k, const int8_t *k8, const float *sc8, int64_t ld,
                              const int32_t *idx, int64_t n)
{
    check_score_model_w(t, q, g, d, k, k8, sc8, 0, ld, idx, n);
}

static void check_score(const hkv_cpu_kernels *t, const float *q, int g, int d, const uint16_t *k,
                        int64_t ld, const int32_t *idx, int64_t n)
{
    float *s = alloc_poisoned(n);
    double *rs = malloc((n + 1) * sizeof *rs), *mag = malloc((n + 1) * sizeof *mag);
    t->score_max(q, g, d, k, ld, idx, n, s);
    ref_score_max(q, g, d, k, ld, idx, n, rs, mag);
    int bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(s[i])) { bad++; continue; }
        worst = fmax(worst, fabs(s[i] - rs[i]) / mag[i]);
    }
    CHECK(bad == 0 && worst <= 1e-5 && guard_intact(s, n), "%s score_max g=%d d=%d n=%lld: err %.3g, %d NaN",
          hkv_isa_name(t->isa), g, d, (long long)n, worst, bad);
    CHECK(pieces_equal(t, q, g, d, k, ld, NULL, idx, n, s), "%s score_max g=%d d=%d n=%lld: in "
          "pieces, the same scores bit for bit", hkv_isa_name(t->isa), g, d, (long long)n);
    free(s); free(rs); free(mag);
}

/* score_max_i8, or (four) score_max_i4 over the same bytes as nibbles,
 * against double sums of q . (code times its group's scale):
 * |s - ref| <= 1e-5 * max_h sum_c |q_hc k~_c| (fp32 sums, as score_max's),
 * plus for four the query's int8 rounding, at most max_h sum_G
 * (max|q_hG| / 254) sum_{c in G} |k~_c|. */
static void check_score_q(const hkv_cpu_kernels *t, const float *q, int g, int d, const int8_t *k,
                          int64_t ld, const float *scale, int four, const int32_t *idx, int64_t n)
{
    const char *name = four ? "score_max_i4" : "score_max_i8";
    float *s = alloc_poisoned(n);
    int bad = 0;
    double worst = 0;
    if (four) t->score_max_i4(q, g, d, (const uint8_t *)k, ld, scale, idx, n, s);
    else t->score_max_i8(q, g, d, k, ld, scale, idx, n, s);
    const int ng = d / HKV_SKETCH_GROUP;
    for (int64_t i = 0; i < n; i++) {
        const int8_t *row = k + (int64_t)idx[i] * ld;
        const float *sc = scale + (int64_t)idx[i] * ng;
        double best = -INFINITY, mag = 0, qerr = 0;
        for (int h = 0; h < g; h++) {
            double v = 0, m = 0, qe = 0;
            for (int G = 0; G < ng; G++) {
                double amax = 0, kabs = 0;
                for (int c = G * HKV_SKETCH_GROUP; c < (G + 1) * HKV_SKETCH_GROUP; c++) {
                    const double kc = (double)code_of(row, four, c) * sc[G];
                    v += (double)q[h * d + c] * kc;
                    m += fabs((double)q[h * d + c] * kc);
                    amax = fmax(amax, fabs((double)q[h * d + c])), kabs += fabs(kc);
                }
                qe += amax / 254.0 * kabs;
            }
            best = fmax(best, v), mag = fmax(mag, m), qerr = fmax(qerr, qe);
        }
        const double ref = best, tol = 1e-5 * mag + (four ? qerr : 0) + 1e-30;
        if (isnan(s[i])) bad++;
        else worst = fmax(worst, fabs(s[i] - ref) / tol);
    }
    CHECK(bad == 0 && worst <= 1 && guard_intact(s, n), "%s %s g=%d d=%d n=%lld: err %.3g of the "
          "bound, %d NaN", hkv_isa_name(t->isa), name, g, d, (long long)n, worst, bad);
    CHECK(pieces_equal_w(t, q, g, d, k, ld, scale, four, idx, n, s), "%s %s g=%d d=%d n=%lld: in "
          "pieces, the same scores bit for bit", hkv_isa_name(t->isa), name, g, d, (long long)n);
    free(s);
}

int main(void)
{
    hkv_cpu_kernels t;
    test_rng rng = {11};
    const int ds[] = {64, 128, 48, 80};
    const int gs[] = {1, 2, 3, 4, 5, 6, 7, 8, 40};
    const int64_t ns[] = {0, 1, 7, 16, 33, 256, 257, 1000, 3000};
    for (unsigned di = 0; di < sizeof ds / sizeof *ds; di++) {
        int d = ds[di];
        int64_t ld = d + 24;   /* rows padded: the kernels must honour ld */
        uint16_t *k = malloc(CACHE_ROWS * ld * 2), *v = malloc(CACHE_ROWS * ld * 2);
        for (int64_t i = 0; i < CACHE_ROWS * ld; i++) {
            k[i] = rng_half(&rng, -1, 1);
            v[i] = rng_half(&rng, -1, 1);
        }
        int32_t *idx = malloc(3000 * sizeof *idx);
        for (int i = 0; i < 3000; i++) idx[i] = (int32_t)(rng_next(&rng) % CACHE_ROWS);
        float *q = malloc(192 * d * sizeof *q), *qsharp = malloc(40 * d * sizeof *q);
        for (int i = 0; i < 192 * d; i++) q[i] = rng_nonzero(&rng, -1, 1);
        for (int i = 0; i < 40 * d; i++) qsharp[i] = q[i] * 6.0f;
        int8_t *k8 = malloc(CACHE_ROWS * ld);
        float *sc8 = malloc(CACHE_ROWS * (d / HKV_SKETCH_GROUP + 1) * sizeof *sc8);
        for (int64_t i = 0; i < CACHE_ROWS * ld; i++) k8[i] = (int8_t)((int)(rng_next(&rng) % 255) - 127);
        for (int64_t i = 0; i < CACHE_ROWS * (d / HKV_SKETCH_GROUP + 1); i++)
            sc8[i] = (float)(rng_next(&rng) % 1000 + 1) * 1e-4f;
        FOR_EACH_ISA(t, isa) {
            for (unsigned gi = 0; gi < sizeof gs / sizeof *gs; gi++) {
                int g = gs[gi];
                if (g == 40 && d != 64) continue;
                for (unsigned ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                    int64_t n = ns[ni];
                    if (di >= 2 && n > 1000) continue;   /* odd d: fewer, smaller cases */
                    if (g == 40 && n > 33) continue;
                    float scale = 1.0f / sqrtf((float)d);
                    check_attn(&t, "dense", q, g, d, k, v, ld, NULL, n, scale);
                    check_attn(&t, "sparse", q, g, d, k, v, ld, idx, n, scale);
                    if (n >= 7 && n <= 1000) check_attn(&t, "sparse-sharp", qsharp, g, d, k, v, ld, idx, n, 1.0f);
                    check_score(&t, q, g, d, k, ld, idx, n);
                    if (d % HKV_SKETCH_GROUP == 0) check_score_q(&t, q, g, d, k8, ld, sc8, 0, idx, n);
                    if (d % HKV_SKETCH_GROUP == 0)   /* the same bytes as nibbles, half a row */
                        check_score_q(&t, q, g, d, k8, ld, sc8, 1, idx, n);
                    if (n == 257 || n == 1000) {
                        check_score_model(&t, q, g, d, k, NULL, NULL, ld, idx, n);
                        if (d % HKV_SKETCH_GROUP == 0) check_score_model(&t, q, g, d, NULL, k8, sc8, ld, idx, n);
                        if (d % HKV_SKETCH_GROUP == 0)
                            check_score_model_w(&t, q, g, d, NULL, k8, sc8, 1, ld, idx, n);
                    }
                }
            }
            /* stacked heads: g = 3 as 64 sequences' worth (SmolLM2's group),
             * the other g over enough groups to cross the head passes */
            for (unsigned gi = 0; gi < sizeof gs / sizeof *gs; gi++) {
                const int g = gs[gi], S = g == 3 ? 64 : g == 40 ? 2 : 5;
                const int64_t sn[] = {1, 33, 257, 1000};
                for (unsigned ni = 0; ni < sizeof sn / sizeof *sn; ni++) {
                    if ((g == 40 || di >= 2) && sn[ni] > 257) continue;
                    const float scale = 1.0f / sqrtf((float)d);
                    check_stacked(&t, q, g, S, d, k, v, ld, NULL, sn[ni], scale);
                    check_stacked(&t, q, g, S, d, k, v, ld, idx, sn[ni], scale);
                }
            }
        }
        free(k); free(v); free(idx); free(q); free(qsharp); free(k8); free(sc8);
    }
    /* The AVX2 table without AVX-VNNI (--isa avx2-novnni) differs from the
     * AVX2 one in its int8 products only: its attention is what was checked. */
    if (test_best_isa() >= HKV_ISA_AVX2) {
        hkv_cpu_kernels a, b;
        hkv_cpu_kernels_init(&a, HKV_ISA_AVX2);
        hkv_cpu_kernels_init(&b, HKV_ISA_AVX2 | HKV_ISA_NO_AVXVNNI);
        CHECK(a.attn_dense == b.attn_dense && a.attn_sparse == b.attn_sparse &&
                  a.score_max == b.score_max && a.score_max_i8 == b.score_max_i8 &&
                  a.score_max_i4 == b.score_max_i4,
              "avx2-novnni: attention kernels other than the AVX2 table's");
    }
    return test_report("test_attn");
}

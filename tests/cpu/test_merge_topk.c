/* hkv_attn_merge, hkv_topk and hkv_topk_asc:
 *  - merge: attention over a random split of the keys into two disjoint
 *    sets, merged, equals attention over the union (<= 1e-5 relative, lse
 *    <= 1e-5); an empty side (lse -inf, either side) gives the other side
 *    exactly; both empty give out 0 and lse -inf; merging is symmetric;
 *  - topk and topk_asc (its indices also ascending): against a full sort by
 *    (value desc, index asc), for n from 0 to 9000, k = 0, 1, n/2, n-1, n, > n, with many ties (values from a small
 *    set), -inf entries, sorted and reverse-sorted input; the result must be
 *    exactly the reference set, with no duplicates;
 *  - hkv_topk's order: exactly the order the plain quickselect below leaves
 *    (branchy Lomuto partitions, as hkv_topk was first written): ctkvr's
 *    attention sums its rows in that order, so a faster partition must not
 *    move them. */
#include "ref.h"
#include "util.h"

static const float *cmp_s;
static int cmp_desc(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (cmp_s[i] > cmp_s[j]) return -1;
    if (cmp_s[i] < cmp_s[j]) return 1;
    return (i > j) - (i < j);
}

/* hkv_topk's algorithm as first written: the order it must keep. */
static uint64_t ref_rank(const float *s, int64_t i)
{
    float f = s[i];
    uint32_t b;
    if (f == 0.0f) f = 0.0f;
    memcpy(&b, &f, 4);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((uint64_t)b << 32) | (uint32_t)(0x7fffffff - i);
}
static int64_t ref_med3(const uint64_t *r, int64_t i, int64_t j, int64_t l)
{
    uint64_t x = r[i], y = r[j], z = r[l];
    if (x < y) return y < z ? j : x < z ? l : i;
    if (x < z) return i;
    return y < z ? l : j;
}
static void ref_topk_order(const float *s, int64_t n, int64_t k, int32_t *idx)
{
    uint64_t *a = malloc((size_t)(n + 1) * sizeof *a), t;
    for (int64_t i = 0; i < n; i++) a[i] = ref_rank(s, i);
    int64_t lo = 0, hi = n;
    while (hi - lo > 16) {
        int64_t mid = lo + (hi - lo) / 2, p;
        if (hi - lo > 1024) {
            int64_t e = (hi - lo) / 8;
            p = ref_med3(a, ref_med3(a, lo, lo + e, lo + 2 * e), ref_med3(a, mid - e, mid, mid + e),
                         ref_med3(a, hi - 1 - 2 * e, hi - 1 - e, hi - 1));
        } else {
            p = ref_med3(a, lo, mid, hi - 1);
        }
        t = a[p], a[p] = a[hi - 1], a[hi - 1] = t;
        const uint64_t pr = a[hi - 1];
        int64_t st = lo;
        for (int64_t j = lo; j < hi - 1; j++)
            if (a[j] > pr) t = a[st], a[st] = a[j], a[j] = t, st++;
        t = a[st], a[st] = a[hi - 1], a[hi - 1] = t;
        if (st == k || st + 1 == k) {
            lo = hi = k;
            break;
        }
        if (st > k) hi = st;
        else lo = st + 1;
    }
    for (int64_t i = lo + 1; i < hi; i++) {
        const uint64_t r = a[i];
        int64_t j = i;
        while (j > lo && a[j - 1] < r) a[j] = a[j - 1], j--;
        a[j] = r;
    }
    for (int64_t i = 0; i < k; i++) idx[i] = (int32_t)(0x7fffffff - (uint32_t)a[i]);
    free(a);
}

static void check_topk(const float *s, int64_t n, int64_t k, const char *what)
{
    int32_t *idx = malloc((k > 0 ? k : 1) * sizeof *idx + 64);
    int32_t *scratch = malloc(HKV_TOPK_SCRATCH(n + 1) * sizeof *scratch);
    int32_t *order = malloc((n + 1) * sizeof *order);
    for (int64_t i = 0; i < n; i++) order[i] = (int32_t)i;
    cmp_s = s;
    qsort(order, n, sizeof *order, cmp_desc);
    int64_t want = k < 0 ? 0 : k < n ? k : n;
    /* hkv_topk_asc's scratch is n int32 (kernels.h): exactly that, a canary behind */
    int32_t *ascr = malloc((size_t)(n + 16) * sizeof *ascr);
    for (int i = 0; i < 16; i++) ascr[n + i] = 0x5a5a5a5a;
    for (int asc = 0; asc < 2; asc++) {
    int64_t got = asc ? hkv_topk_asc(s, n, k, idx, ascr) : hkv_topk(s, n, k, idx, scratch);
    int ok = got == want;
    for (int i = 0; asc && i < 16; i++) ok &= ascr[n + i] == 0x5a5a5a5a;   /* nothing past n */
    for (int64_t i = 1; asc && ok && i < got; i++) ok = idx[i] > idx[i - 1];   /* ascending */
    if (ok) {
        char *mark = calloc(n + 1, 1);
        for (int64_t i = 0; i < want; i++) mark[order[i]] = 1;
        for (int64_t i = 0; i < got && ok; i++) {
            if (idx[i] < 0 || idx[i] >= n || mark[idx[i]] != 1) ok = 0;
            else mark[idx[i]] = 2;   /* a second hit on the same index fails */
        }
        free(mark);
    }
    CHECK(ok, "topk%s %s n=%lld k=%lld: got %lld", asc ? "_asc" : "", what, (long long)n,
          (long long)k, (long long)got);
    if (!asc && ok && k > 0 && k < n) {   /* the order, not only the set */
        int32_t *ref = malloc((size_t)k * sizeof *ref);
        ref_topk_order(s, n, k, ref);
        CHECK(memcmp(ref, idx, (size_t)k * sizeof *ref) == 0, "topk %s n=%lld k=%lld: the order "
              "moved from the plain quickselect's", what, (long long)n, (long long)k);
        free(ref);
    }
    }
    free(idx); free(scratch); free(ascr); free(order);
}

static void test_topk(test_rng *rng)
{
    const int64_t ns[] = {0, 1, 2, 7, 17, 100, 1025, 5000, 9000};
    for (unsigned ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
        int64_t n = ns[ni];
        float *s = malloc((n + 1) * sizeof *s);
        for (int kind = 0; kind < 7; kind++) {
            const char *what = "random";
            for (int64_t i = 0; i < n; i++) {
                switch (kind) {
                /* every key in one bin of the top 11 bits (the radix select's first digit),
                 * more than it copies out at 9000: distinct, then with ties */
                case 5: s[i] = rng_uniform(rng, 1.0f, 1.2f); what = "one bin"; break;
                case 6: s[i] = 1.0f + (float)(rng_next(rng) % 64) / 512.0f; what = "one bin, ties"; break;
                case 0: s[i] = rng_uniform(rng, -10, 10); break;
                case 1: s[i] = (float)(rng_next(rng) % 4); what = "ties"; break;
                case 2: s[i] = (rng_next(rng) % 3) ? -INFINITY : rng_uniform(rng, -1, 1); what = "-inf"; break;
                case 3: s[i] = (float)i; what = "sorted"; break;
                default: s[i] = (float)(n - i); what = "reversed"; break;
                }
            }
            const int64_t ks[] = {0, 1, n / 2, n - 1, n, n + 3};
            for (unsigned ki = 0; ki < 6; ki++) check_topk(s, n, ks[ki], what);
            if (n > 100) check_topk(s, n, 37, what);
        }
        free(s);
    }
}

static void test_merge(test_rng *rng)
{
    const int g = 4, d = 64, n = 300;
    uint16_t *k = malloc(n * d * 2), *v = malloc(n * d * 2);
    for (int i = 0; i < n * d; i++) { k[i] = rng_half(rng, -1, 1); v[i] = rng_half(rng, -1, 1); }
    float q[4 * 64];
    for (int i = 0; i < g * d; i++) q[i] = rng_nonzero(rng, -3, 3);
    int32_t a_idx[300], b_idx[300], all[300];
    int na = 0, nb = 0;
    for (int i = 0; i < n; i++) {
        all[i] = i;
        if (rng_next(rng) % 3) a_idx[na++] = i;
        else b_idx[nb++] = i;
    }
    hkv_cpu_kernels t;
    FOR_EACH_ISA(t, isa) {
        float oa[256], la[4], ob[256], lb[256], ou[256], lu[4];
        t.attn_sparse(q, g, d, k, v, d, a_idx, na, 0.3f, oa, la);
        t.attn_sparse(q, g, d, k, v, d, b_idx, nb, 0.3f, ob, lb);
        t.attn_sparse(q, g, d, k, v, d, all, n, 0.3f, ou, lu);
        float oa2[256], la2[4];
        memcpy(oa2, ob, sizeof oa2);
        memcpy(la2, lb, sizeof la2);
        hkv_attn_merge(oa, la, ob, lb, g, d);     /* a + b */
        hkv_attn_merge(oa2, la2, oa, la, 0, d);   /* h = 0: nothing happens */
        double eo = 0, el = 0;
        for (int i = 0; i < g * d; i++) eo = fmax(eo, fabs(oa[i] - ou[i]));
        for (int h = 0; h < g; h++) el = fmax(el, fabs(la[h] - lu[h]));
        CHECK(eo <= 1e-5 && el <= 1e-5, "%s merge of split != union: %.3g %.3g", hkv_isa_name(isa), eo, el);

        /* b + a gives the same */
        float ob2[256], lb2[4], oa3[256], la3[4];
        t.attn_sparse(q, g, d, k, v, d, b_idx, nb, 0.3f, ob2, lb2);
        t.attn_sparse(q, g, d, k, v, d, a_idx, na, 0.3f, oa3, la3);
        hkv_attn_merge(ob2, lb2, oa3, la3, g, d);
        eo = 0;
        for (int i = 0; i < g * d; i++) eo = fmax(eo, fabs(ob2[i] - ou[i]));
        CHECK(eo <= 1e-5, "%s merge not symmetric: %.3g", hkv_isa_name(isa), eo);

        /* empty partials */
        float oe[256], le[4], ox[256], lx[4];
        t.attn_sparse(q, g, d, k, v, d, a_idx, 0, 0.3f, oe, le);
        t.attn_sparse(q, g, d, k, v, d, a_idx, na, 0.3f, ox, lx);
        float keep[256], keepl[4];
        memcpy(keep, ox, sizeof keep);
        memcpy(keepl, lx, sizeof keepl);
        hkv_attn_merge(ox, lx, oe, le, g, d);            /* x + empty = x */
        CHECK(memcmp(ox, keep, sizeof keep) == 0 && memcmp(lx, keepl, sizeof keepl) == 0, "x + empty changed x");
        hkv_attn_merge(oe, le, keep, keepl, g, d);       /* empty + x = x */
        CHECK(memcmp(oe, keep, sizeof keep) == 0 && memcmp(le, keepl, sizeof keepl) == 0, "empty + x != x");
        float z1[256], z2[256], l1[4], l2[4];
        for (int i = 0; i < 256; i++) { z1[i] = NAN; z2[i] = 1.0f; }
        for (int h = 0; h < 4; h++) l1[h] = l2[h] = -INFINITY;
        hkv_attn_merge(z1, l1, z2, l2, g, d);
        int zero = 1;
        for (int i = 0; i < 256; i++) zero &= z1[i] == 0.0f;
        for (int h = 0; h < 4; h++) zero &= l1[h] == -INFINITY;
        CHECK(zero, "empty + empty is not (0, -inf)");
    }
    free(k); free(v);
}

int main(void)
{
    test_rng rng = {5};
    test_merge(&rng);
    test_topk(&rng);
    return test_report("test_merge_topk");
}

/* Top-k selection, two ways, O(n) on average.
 *
 * Elements are ordered by a total order: the float mapped to an unsigned key
 * that sorts like the value (-0 folded into +0, -inf lowest; a NaN lands at
 * one end instead of breaking the partition), ties towards the lower index.
 * With no two elements equal under that order the chosen set is unique; the
 * two functions choose the same set and differ in the order they return it.
 *
 * hkv_topk_asc: the keys go into scratch once; digits of the key, most
 * significant first, find the key T of the k-th best and how many keys equal
 * to T make the cut (it stops early when the cut falls on a bin's end): 8-bit
 * passes over every key for a short list, else one 11-bit pass and then only
 * the keys left in the cut's bin (cut_wide). One ordered pass then takes every
 * key above T and the first such ties. The indices come out ascending, so
 * callers' gathers of the chosen rows walk memory forwards.
 * hkv_topk was a tenth of a batch-1 ctkvr step at 8K (bench/cpu_kernels.md).
 *
 * hkv_topk: quickselect over the elements' 64-bit ranks (key, then index),
 * the order its partitions leave.
 * ctkvr keeps it: with the ascending order its CPU and CUDA-emulator paths
 * parted on a near-tie after 700 tokens (pipeline_prompt_growth, 7e-3 against
 * the 2e-3 bound), which the order of its rerank lists should not decide; not
 * yet understood, so that path is left as it was. */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* The rank of s[i]: the value's sort key above, the index below it so that
 * the lower index ranks higher on ties; distinct for distinct i. */
static inline uint64_t rank_of(const float *s, int64_t i)
{
    float f = s[i];
    uint32_t b;
    if (f == 0.0f) f = 0.0f;
    memcpy(&b, &f, 4);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((uint64_t)b << 32) | (uint32_t)(0x7fffffff - i);
}

static inline void swap_u64(uint64_t *a, uint64_t *b)
{
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Index (into r) of the median of r[i], r[j], r[l]. */
static int64_t median3(const uint64_t *r, int64_t i, int64_t j, int64_t l)
{
    uint64_t x = r[i], y = r[j], z = r[l];
    if (x < y) {
        if (y < z) return j;
        return x < z ? l : i;
    }
    if (x < z) return i;
    return y < z ? l : j;
}

/* The ranks themselves are partitioned (written once, n x 8 bytes), not an
 * index array whose every compare loads and converts a score: the same
 * compares and swaps, so the same order out, at half the time. */
int64_t hkv_topk(const float *s, int64_t n, int64_t k, int32_t *idx, int32_t *scratch)
{
    if (k <= 0 || n <= 0) return 0;
    if (k >= n) {
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
        return n;
    }
    uint64_t *a = (uint64_t *)(((uintptr_t)scratch + 7) & ~(uintptr_t)7);
    for (int64_t i = 0; i < n; i++) a[i] = rank_of(s, i);

    /* Invariant: everything in [0, lo) ranks above everything in [lo, n),
     * everything in [hi, n) below everything in [0, hi), and lo <= k <= hi. */
    int64_t lo = 0, hi = n;
    while (hi - lo > 16) {
        int64_t mid = lo + (hi - lo) / 2, p;
        if (hi - lo > 1024) {   /* ninther: keeps sorted or patterned input O(n) */
            int64_t e = (hi - lo) / 8;
            p = median3(a, median3(a, lo, lo + e, lo + 2 * e), median3(a, mid - e, mid, mid + e),
                        median3(a, hi - 1 - 2 * e, hi - 1 - e, hi - 1));
        } else {
            p = median3(a, lo, mid, hi - 1);
        }
        swap_u64(&a[p], &a[hi - 1]);
        const uint64_t pr = a[hi - 1];
        /* Lomuto's partition (a rank above the pivot swaps with the first
         * not above it), with its swap made of two selects rather than a
         * branch: the same moves, so the same order out (the order ctkvr's
         * sums depend on, above), at about half the time on random scores,
         * where half the branches mispredicted. A leading run above the
         * pivot would only swap with itself and is stepped over. */
        int64_t store = lo;
        while (store < hi - 1 && a[store] > pr) store++;
        for (int64_t j = store + 1; j < hi - 1; j++) {
            const uint64_t x = a[j], y = a[store];
            const int64_t c = x > pr;
            a[j] = c ? y : x;
            a[store] = c ? x : y;
            store += c;
        }
        swap_u64(&a[store], &a[hi - 1]);   /* pivot in its final place */
        if (store == k || store + 1 == k) {
            lo = hi = k;
            break;
        }
        if (store > k) hi = store;
        else lo = store + 1;
    }
    /* small range: insertion sort by rank, best first */
    for (int64_t i = lo + 1; i < hi; i++) {
        const uint64_t r = a[i];
        int64_t j = i;
        while (j > lo && a[j - 1] < r) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = r;
    }
    for (int64_t i = 0; i < k; i++) idx[i] = (int32_t)(0x7fffffff - (uint32_t)a[i]);
    return k;
}

static inline uint32_t key_of(float f)
{
    uint32_t b;
    f += 0.0f;   /* -0 + 0 is +0 */
    memcpy(&b, &f, 4);
    return b ^ ((uint32_t)((int32_t)b >> 31) | 0x80000000u);
}

/* From the top bin of h[0..nb) down, the bin holding the krem-th key;
 * krem becomes its rank inside that bin. */
static int cut_bin(const uint32_t *h, int nb, int64_t *krem)
{
    int64_t cum = 0;
    int b = nb - 1;
    for (; b > 0 && cum + h[b] < *krem; b--) cum += h[b];
    *krem -= cum;
    return b;
}

/* The cut as a prefix: a key whose masked bits exceed thr is taken, one
 * equal to it is taken when whole, else the first krem such in index order. */
typedef struct topk_cut {
    uint32_t thr, mask;
    int64_t krem;
    int whole;
} topk_cut;

static void cut_narrow(const uint32_t *key, int64_t n, int64_t k, topk_cut *c)
{
    c->thr = 0, c->mask = 0, c->krem = k, c->whole = 0;
    for (int shift = 24; shift >= 0 && !c->whole; shift -= 8) {
        uint32_t hist[256] = {0};
        for (int64_t i = 0; i < n; i++)
            if ((key[i] & c->mask) == c->thr) hist[(key[i] >> shift) & 255u]++;
        const int b = cut_bin(hist, 256, &c->krem);
        c->thr |= (uint32_t)b << shift;
        c->mask |= 255u << shift;
        c->whole = hist[b] == c->krem;
    }
}

/* keys of n from here up take cut_wide (below, clearing its 32 KB of
 * counters costs more than the passes it saves: 1.9 against 2.6 us at 500) */
#define TOPK_WIDE_N 1024
/* cut_wide's copy of the keys in the cut's first bin, on its stack (the
 * caller's scratch holds only the keys); a larger bin's keys are found by
 * the mask in each later pass over all of them */
#define TOPK_SUB 4096

/* The top 11 bits over every key (four histograms, so that a run of keys
 * in one bin does not wait on one counter), then bits 10..20 and 0..9 among
 * the keys of the cut's bin only, copied out when they fit TOPK_SUB. Against
 * cut_narrow's four passes over every key with a branch each: 10.8 against
 * 20.0 us at n 5,000, k 1,024 (one Zen 5 core). */
static void cut_wide(const float *s, uint32_t *key, int64_t n, int64_t k, topk_cut *c)
{
    uint32_t h[4][2048], sub[TOPK_SUB];
    memset(h, 0, sizeof h);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint32_t a = key_of(s[i]), b = key_of(s[i + 1]), x = key_of(s[i + 2]), y = key_of(s[i + 3]);
        key[i] = a, key[i + 1] = b, key[i + 2] = x, key[i + 3] = y;
        h[0][a >> 21]++, h[1][b >> 21]++, h[2][x >> 21]++, h[3][y >> 21]++;
    }
    for (; i < n; i++) h[0][(key[i] = key_of(s[i])) >> 21]++;
    for (int b = 0; b < 2048; b++) h[0][b] += h[1][b] + h[2][b] + h[3][b];
    c->krem = k;
    int b = cut_bin(h[0], 2048, &c->krem);
    c->thr = (uint32_t)b << 21, c->mask = ~0u << 21;
    c->whole = h[0][b] == c->krem;
    /* the bin's keys: copied (without a branch: about a key in 5 stays), or
     * all of them with the mask tested */
    const int copied = !c->whole && h[0][b] <= TOPK_SUB;
    const uint32_t *src = key;
    int64_t m = n;
    if (copied) {
        m = 0;
        for (int64_t j = 0; j < n; j++) {
            sub[m] = key[j];
            m += (key[j] >> 21) == (uint32_t)b;
        }
        src = sub;
    }
    for (int bits = 11, shift = 10; !c->whole && bits > 0; bits = shift, shift = 0) {
        const uint32_t dm = (1u << bits) - 1;
        memset(h[0], 0, (size_t)(dm + 1) * sizeof h[0][0]);
        if (copied)
            for (int64_t j = 0; j < m; j++) h[0][(src[j] >> shift) & dm]++;
        else
            for (int64_t j = 0; j < m; j++) h[0][(src[j] >> shift) & dm] += (src[j] & c->mask) == c->thr;
        b = cut_bin(h[0], (int)dm + 1, &c->krem);
        c->thr |= (uint32_t)b << shift, c->mask |= dm << shift;
        c->whole = h[0][b] == c->krem;
        if (copied && shift) {
            int64_t m2 = 0;
            for (int64_t j = 0; j < m; j++) {
                sub[m2] = sub[j];
                m2 += ((sub[j] >> shift) & dm) == (uint32_t)b;
            }
            m = m2;
        }
    }
}

int64_t hkv_topk_asc(const float *s, int64_t n, int64_t k, int32_t *idx, int32_t *scratch)
{
    if (k <= 0 || n <= 0) return 0;
    if (k >= n) {
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
        return n;
    }
    uint32_t *key = (uint32_t *)scratch;
    topk_cut c;
    if (n >= TOPK_WIDE_N) {
        cut_wide(s, key, n, k, &c);
    } else {
        for (int64_t i = 0; i < n; i++) key[i] = key_of(s[i]);
        cut_narrow(key, n, k, &c);
    }
    int64_t m = 0;
    if (c.whole) {   /* every key at the cut is taken: no branch on the keys */
        for (int64_t i = 0; i < n && m < k; i++) {
            idx[m] = (int32_t)i;
            m += (key[i] & c.mask) >= c.thr;
        }
        return m;
    }
    for (int64_t i = 0; i < n && m < k; i++) {   /* ties at the whole key: the first krem */
        const uint32_t u = key[i];
        if (u > c.thr || (u == c.thr && c.krem-- > 0)) idx[m++] = (int32_t)i;
    }
    return m;
}

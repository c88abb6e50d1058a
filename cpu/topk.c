/* Top-k selection, two ways, O(n) on average.
 *
 * Elements are ordered by a total order: the float mapped to an unsigned key
 * that sorts like the value (-0 folded into +0, -inf lowest; a NaN lands at
 * one end instead of breaking the partition), ties towards the lower index.
 * With no two elements equal under that order the chosen set is unique; the
 * two functions choose the same set and differ in the order they return it.
 *
 * hkv_topk_asc: the keys go into scratch once; up to four 8-bit passes find
 * the key T of the k-th best and how many keys equal to T make the cut (a
 * pass stops early when the cut falls on a bin's end); one ordered pass then
 * takes every key above T and the first such ties. The indices come out
 * ascending, so callers' gathers of the chosen rows walk memory forwards.
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
    if (f == 0.0f) f = 0.0f;
    memcpy(&b, &f, 4);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

int64_t hkv_topk_asc(const float *s, int64_t n, int64_t k, int32_t *idx, int32_t *scratch)
{
    if (k <= 0 || n <= 0) return 0;
    if (k >= n) {
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
        return n;
    }
    uint32_t *key = (uint32_t *)scratch;
    for (int64_t i = 0; i < n; i++) key[i] = key_of(s[i]);
    uint32_t prefix = 0, mask = 0;
    int64_t krem = k;   /* keys still to take among those matching prefix under mask */
    int whole = 0;      /* the cut fell on a bin's end: every key matching prefix is taken */
    for (int shift = 24; shift >= 0 && !whole; shift -= 8) {
        int64_t hist[256] = {0};
        for (int64_t i = 0; i < n; i++)
            if ((key[i] & mask) == prefix) hist[(key[i] >> shift) & 255u]++;
        int64_t cum = 0;
        for (int b = 255; b >= 0; b--) {
            if (cum + hist[b] >= krem) {
                prefix |= (uint32_t)b << shift;
                mask |= 255u << shift;
                krem -= cum;
                whole = hist[b] == krem;
                break;
            }
            cum += hist[b];
        }
    }
    /* above the cut: a key whose masked bits exceed prefix; at it: ties in index order */
    int64_t m = 0;
    for (int64_t i = 0; i < n && m < k; i++) {
        const uint32_t u = key[i] & mask;
        if (u > prefix || (u == prefix && (whole || krem-- > 0))) idx[m++] = (int32_t)i;
    }
    return m;
}

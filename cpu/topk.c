/* Top-k selection by quickselect over an index array, O(n) on average.
 *
 * Elements are ordered by a total order: the float mapped to an unsigned key
 * that sorts like the value (-0 folded into +0, -inf lowest; a NaN lands at
 * one end instead of breaking the partition), ties towards the lower index.
 * With no two elements equal under that order, the chosen set is unique, so
 * the result is deterministic whatever pivots are picked. */
#include <string.h>

#include "kernels.h"

static inline uint64_t rank_of(const float *s, int32_t i)
{
    float f = s[i];
    uint32_t b;
    if (f == 0.0f) f = 0.0f;
    memcpy(&b, &f, 4);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    /* larger rank = better: value first, then the lower index */
    return ((uint64_t)b << 32) | (uint32_t)(0x7fffffff - i);
}

static inline void swap_i32(int32_t *a, int32_t *b)
{
    int32_t t = *a;
    *a = *b;
    *b = t;
}

/* Index (into a) of the median rank of a[i], a[j], a[l]. */
static int64_t median3(const float *s, const int32_t *a, int64_t i, int64_t j, int64_t l)
{
    uint64_t x = rank_of(s, a[i]), y = rank_of(s, a[j]), z = rank_of(s, a[l]);
    if (x < y) {
        if (y < z) return j;
        return x < z ? l : i;
    }
    if (x < z) return i;
    return y < z ? l : j;
}

int64_t hkv_topk(const float *s, int64_t n, int64_t k, int32_t *idx, int32_t *scratch)
{
    if (k <= 0 || n <= 0) return 0;
    if (k >= n) {
        for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
        return n;
    }
    int32_t *a = scratch;
    for (int64_t i = 0; i < n; i++) a[i] = (int32_t)i;

    /* Invariant: everything in [0, lo) ranks above everything in [lo, n),
     * everything in [hi, n) below everything in [0, hi), and lo <= k <= hi. */
    int64_t lo = 0, hi = n;
    while (hi - lo > 16) {
        int64_t mid = lo + (hi - lo) / 2, p;
        if (hi - lo > 1024) {   /* ninther: keeps sorted or patterned input O(n) */
            int64_t e = (hi - lo) / 8;
            p = median3(s, a, median3(s, a, lo, lo + e, lo + 2 * e),
                        median3(s, a, mid - e, mid, mid + e),
                        median3(s, a, hi - 1 - 2 * e, hi - 1 - e, hi - 1));
        } else {
            p = median3(s, a, lo, mid, hi - 1);
        }
        swap_i32(&a[p], &a[hi - 1]);
        uint64_t pr = rank_of(s, a[hi - 1]);
        int64_t store = lo;
        for (int64_t j = lo; j < hi - 1; j++)
            if (rank_of(s, a[j]) > pr) swap_i32(&a[store++], &a[j]);
        swap_i32(&a[store], &a[hi - 1]);   /* pivot in its final place */
        if (store == k || store + 1 == k) {
            lo = hi = k;
            break;
        }
        if (store > k) hi = store;
        else lo = store + 1;
    }
    /* small range: insertion sort by rank, best first */
    for (int64_t i = lo + 1; i < hi; i++) {
        int32_t v = a[i];
        uint64_t r = rank_of(s, v);
        int64_t j = i;
        while (j > lo && rank_of(s, a[j - 1]) < r) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
    memcpy(idx, a, (size_t)k * sizeof *idx);
    return k;
}

/* Top-k selection by radix select over order-preserving keys, O(n).
 *
 * Elements are ordered by a total order: the float mapped to an unsigned key
 * that sorts like the value (-0 folded into +0, -inf lowest; a NaN lands at
 * one end instead of breaking the partition), ties towards the lower index.
 * The keys go into scratch once; up to four 8-bit passes find the key T of
 * the k-th best and how many keys equal to T make the cut (a pass stops early
 * when the cut falls on a bin's end); one ordered pass then takes every key
 * above T and the first such ties. The indices come out ascending: callers'
 * gathers of the chosen rows walk memory forwards. (The quickselect this
 * replaces, over an index array with the key recomputed at every compare,
 * was a tenth of a batch-1 ctkvr step at 8K.) */
#include <string.h>

#include "kernels.h"

static inline uint32_t key_of(float f)
{
    uint32_t b;
    if (f == 0.0f) f = 0.0f;
    memcpy(&b, &f, 4);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

int64_t hkv_topk(const float *s, int64_t n, int64_t k, int32_t *idx, int32_t *scratch)
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

/* score_max_i4's arithmetic, shared by every ISA level so that each gives
 * the same bits (kernels.h): the query is quantised once a call, per head
 * and group of HKV_SKETCH_GROUP values, to int8 codes with a scale
 * max|q_G| / 127; each group's product with a key's 4-bit codes is then an
 * exact integer I_G = sum_e nibble_e qc_e - 8 sum_e qc_e (nibble = code + 8,
 * ctkvr_sketch.c), and a head's score is
 *     s = sum_G t_G,  t_G = ((float)I_G * qs_G) * ks_G,
 * summed as a halving tree (d 128: (t0 + t2) + (t1 + t3); d 64: t0 + t1),
 * the order the vector kernels' lanes add in. The score's max over the
 * heads is the row's.
 *
 * Why integers: the 4-bit codes are the sketch's own error (a key's value
 * to within max|k_G| / 14); the query's int8 rounding adds a sixteenth of
 * that at most, and an integer product is a few instructions for 64 codes
 * where fp32 needed each nibble widened, converted and scaled first (the
 * far step's largest cost on the development VM, docs/HOST_KERNELS.md). */
#ifndef HKV_SKETCH_I4_H
#define HKV_SKETCH_I4_H

#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "q8_group.h"

/* One head's query row q[0..d) to codes qc, scales qs and code sums qsum
 * per group (d a multiple of HKV_SKETCH_GROUP). */
static inline void hkv_sketch_query_q8(const float *q, int d, int8_t *qc, float *qs, int32_t *qsum)
{
    hkv_q8_group_quantize(q, d, qc, qs);
    for (int G = 0; G < d / HKV_SKETCH_GROUP; G++) {
        int32_t sum = 0;
        for (int e = 0; e < HKV_SKETCH_GROUP; e++) sum += qc[G * HKV_SKETCH_GROUP + e];
        qsum[G] = sum;
    }
}

/* The halving tree over t[0..ng) (t is overwritten). */
static inline float hkv_sketch_tree(float *t, int ng)
{
    while (ng > 1) {
        const int h = ng / 2;
        for (int i = 0; i < h; i++) t[i] += t[ng - h + i];
        ng -= h;
    }
    return t[0];
}

/* One head's score over one row of 4-bit codes (d / 2 bytes) with its
 * group scales ks: the definition above, in scalar code. */
static inline float hkv_sketch_i4_dot(const uint8_t *row, const float *ks, const int8_t *qc,
                                      const float *qs, const int32_t *qsum, int d)
{
    float t[HKV_ATTN_MAX_D / HKV_SKETCH_GROUP];
    const int ng = d / HKV_SKETCH_GROUP;
    for (int G = 0; G < ng; G++) {
        int32_t acc = 0;
        for (int e = G * HKV_SKETCH_GROUP; e < (G + 1) * HKV_SKETCH_GROUP; e++)
            acc += (int32_t)((row[e / 2] >> (4 * (e & 1))) & 15) * qc[e];
        t[G] = ((float)(acc - 8 * qsum[G]) * qs[G]) * ks[G];
    }
    return hkv_sketch_tree(t, ng);
}

#endif

/* int8 codes per group of HKV_SKETCH_GROUP values, one scale absmax / 127
 * per group, round to nearest even: the 8-bit far tier's rows
 * (hkv_q8_quantize, index/far_rows.h) and the query of the integer sketch
 * products (sketch_i4.h) round alike. */
#ifndef HKV_Q8_GROUP_H
#define HKV_Q8_GROUP_H

#include <math.h>
#include <stdint.h>

#include "kernels.h"

static inline void hkv_q8_group_quantize(const float *x, int d, int8_t *codes, float *scale)
{
    for (int gi = 0; gi < d / HKV_SKETCH_GROUP; gi++) {
        const float *xg = x + gi * HKV_SKETCH_GROUP;
        float amax = 0;
        for (int e = 0; e < HKV_SKETCH_GROUP; e++) {
            const float a = fabsf(xg[e]);
            amax = a > amax ? a : amax;
        }
        const float inv = amax > 0 ? 127.0f / amax : 0.0f;
        for (int e = 0; e < HKV_SKETCH_GROUP; e++) {
            const float v = nearbyintf(xg[e] * inv);
            codes[gi * HKV_SKETCH_GROUP + e] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
        scale[gi] = amax / 127.0f;
    }
}

#endif

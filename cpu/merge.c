/* Exact merge of two attention partials over disjoint key sets (DESIGN.md):
 * m = max(lse_a, lse_b), w = exp(lse - m), out = (w_a out_a + w_b out_b) /
 * (w_a + w_b), lse = m + log(w_a + w_b). lse = -inf marks an empty partial;
 * it is handled before the formula so -inf - -inf never produces NaN. */
#include <math.h>

#include "kernels.h"

void hkv_attn_merge(float *out_a, float *lse_a, const float *out_b, const float *lse_b,
                    int h, int d)
{
    for (int i = 0; i < h; i++) {
        float *oa = out_a + (int64_t)i * d;
        const float *ob = out_b + (int64_t)i * d;
        float la = lse_a[i], lb = lse_b[i];
        if (lb == -INFINITY) {
            if (la == -INFINITY)   /* both empty: the contract's zero output */
                for (int c = 0; c < d; c++) oa[c] = 0.0f;
            continue;
        }
        if (la == -INFINITY) {
            for (int c = 0; c < d; c++) oa[c] = ob[c];
            lse_a[i] = lb;
            continue;
        }
        float m = la > lb ? la : lb;
        float wa = expf(la - m), wb = expf(lb - m);   /* one of them is 1 */
        float inv = 1.0f / (wa + wb);
        float ca = wa * inv, cb = wb * inv;
        for (int c = 0; c < d; c++) oa[c] = ca * oa[c] + cb * ob[c];
        lse_a[i] = m + log1pf(wa < wb ? wa : wb);
    }
}

/* CTKVR's key sketches (sketch=1..3): a compact second copy of every far key
 * the rerank scores its candidates on, kept beside the far tier and written
 * as rows move there.
 *
 * sketch=1, 2: int8. Each far key k (d values) is kept a second time as
 * int8 codes in groups G of 32 values, c = round(k * 127 / max_G|k|), with a scale s_G =
 * max_G|k| / 127 per group, so |k_e - s_G c_e| <= s_G / 2 (plus float
 * rounding). Per-group scales keep one outlier channel, common in real keys,
 * from coarsening the whole row (SmolLM2 at 4K: a per-row scale left 216 of
 * 527 candidates to rescore, groups of 32 far fewer). The rerank scores every
 * candidate on the codes: for a query head q, |q.k - q.k~| <= sum_G (s_G / 2)
 * |q_G|_1, and the group max of these scores is off by at most the largest
 * of those over the heads. With B_j that bound (widened by 1/32 for the
 * float rounding of both sums, which is below 1e-2 of it at d <= 256), the
 * candidates split three ways. With t_out the rho'-th largest lower bound
 * a_j - B_j, at least rho' candidates score >= t_out exactly, so one whose
 * upper bound a_j + B_j is below it is out, whatever the ties. With t_in the
 * (rho'+1)-th largest upper bound, one whose lower bound is above it can be
 * beaten by at most rho' - 1 others: in. Only the band between is scored
 * again on its fp16 keys, and its best by those exact scores (ties to the
 * lower position) fill the places left: the fp16 rerank's choice, without
 * reading the fp16 keys of the clear winners or losers. The codes are d
 * bytes against 2d: the rerank reads d + d / 8 bytes a candidate plus 2d a
 * band member.
 *
 * sketch=3: 4-bit, two codes a byte (element 2c the low nibble of byte c),
 * c = round(k * 7 / max_G|k|) stored as c + 8, the same fp32 scale per
 * group of 32 (max_G|k| / 7): d / 2 + d / 8 bytes a candidate, 80 at
 * d = 128 against the int8 sketch's 144 and fp16's 256. The error bound is
 * 18x the int8 one, so no band is certified: the top rho' by the 4-bit score
 * are attended (as sketch=2 does with its int8 score). The codes are made
 * from the far tier's rows in either format (fp16, or --far-kv q8, where the
 * attention then reads 8-bit K and V: the sketch and the 8-bit tier
 * together). */
#include <math.h>
#include <string.h>

#include "far_rows.h"
#include "ctkvr_impl.h"

static void sketch_rows(ctkvr *s, int layer, int kvh, const hkv_far_view *far, int64_t from,
                        int64_t to)
{
    const int d = s->d, ng = d / HKV_SKETCH_GROUP;
    const size_t rb = hkv_sketch_code_bytes(s->c.sketch, d);
    const size_t at = (size_t)layer * s->KH + (size_t)kvh;
    int8_t *codes = s->skc + at * (size_t)s->cap * rb;
    float *scale = s->sks + at * (size_t)s->cap * ng;
    float x[HKV_CTKVR_MAX_D];
    uint16_t tmp[HKV_CTKVR_MAX_D];
    for (int64_t p = from; p < to; p++) {
        hkv_far_k32(s->kern, far, kvh, p, tmp, x);   /* fp16, or the 8-bit tier's */
        if (s->c.sketch == 3)
            hkv_q4_quantize(x, d, (uint8_t *)codes + (size_t)p * rb, scale + (size_t)p * ng);
        else
            hkv_q8_quantize(x, d, codes + (size_t)p * rb, scale + (size_t)p * ng);
    }
}

/* Rows [sk_hi, hi) of one KV head; far rows below hi never change. */
static void sketch_catch_up(ctkvr *s, int layer, int kvh, const hkv_far_view *far)
{
    ct_head *hd = &s->lay[layer].kv[kvh];
    const int64_t from = hkv_max64(hd->sk_hi, far->lo), to = hkv_min64(far->hi, s->cap);
    if (to > from) sketch_rows(s, layer, kvh, far, from, to);
    if (to > hd->sk_hi) hd->sk_hi = to;
}

void hkv_ctkvr_sketch_layer(ctkvr *s, int layer, const hkv_far_view *far)
{
    if (!s->skc || far->rows || far->ld < s->d) return;   /* (an 8-bit tier's ld is d too) */
    const int64_t lo = far->lo, hi = hkv_min64(far->hi, s->cap), blk = 4096;
    int64_t n_blk = 0;
    for (int h = 0; h < s->KH; h++) {
        const int64_t from = hkv_max64(s->lay[layer].kv[h].sk_hi, lo);
        n_blk = hkv_max64(n_blk, (hi - from + blk - 1) / blk);
    }
    if (n_blk <= 0) return;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(s->n_threads > 0 ? s->n_threads : 1)
    for (int h = 0; h < s->KH; h++)
        for (int64_t b = 0; b < n_blk; b++) {
            const int64_t from = hkv_max64(s->lay[layer].kv[h].sk_hi, lo) + b * blk;
            if (from < hi) sketch_rows(s, layer, h, far, from, hkv_min64(hi, from + blk));
        }
    for (int h = 0; h < s->KH; h++)
        if (hi > s->lay[layer].kv[h].sk_hi) s->lay[layer].kv[h].sk_hi = hi;
}

/* out[0..m) = cand[pick[i]] in ascending position order (the sketch paths:
 * their picks come in no order of their own; ascending gathers stream). The
 * fp16 rerank keeps hkv_topk's order: the attention's sums, and through them
 * the near ties the next layer's rerank meets, stay as they were. */
static void emit_ascending(const int32_t *cand, const int32_t *pick, int64_t m, int64_t n,
                           uint32_t *bits, int32_t *out)
{
    const int64_t W = (n + 31) / 32;
    memset(bits, 0, (size_t)W * sizeof *bits);
    for (int64_t i = 0; i < m; i++) bits[pick[i] >> 5] |= 1u << (pick[i] & 31);
    int64_t o = 0;
    for (int64_t w = 0; w < W; w++)
        for (uint32_t x = bits[w]; x; x &= x - 1) out[o++] = cand[w * 32 + __builtin_ctz(x)];
}

/* B for one candidate: the largest over the heads of sum_G s_G q1[h][G]
 * (q1: each head's |q| summed over a group, halved and widened; NULL when
 * the group is too large for the stack: no bound, every candidate survives). */
static inline float sketch_bound(const float *sc, const float *q1, int g, int ng)
{
    if (!q1) return INFINITY;
    float b = 0;
    for (int j = 0; j < g; j++) {
        float t = 0;
        for (int gi = 0; gi < ng; gi++) t += sc[gi] * q1[j * ng + gi];
        b = t > b ? t : b;   /* finite: not fmaxf, a libm call at -O2 */
    }
    return b;
}

/* The rerank on sketches into out (ascending): sketch=1 certified, the
 * rho' best of cand[0..n) by exact score; 2 and 3 the rho' best by the
 * sketch's score. a[] gets every candidate's sketch score. n_dcu (NULL
 * without DCU): where the path makes the DCU's list on the way (the top rho
 * by the sketch's score, into surv), its length; else left as it was.
 * Scratch: lb, ub[n] floats, surv/sp/pick[n] int32, tsc. */
int64_t hkv_ctkvr_rerank_sketch(ctkvr *s, int layer, int kvh, const float *q,
                                const hkv_far_view *far, const int32_t *cand, int64_t n, float *a,
                                float *lb, float *ub, int32_t *surv, int32_t *sp, int32_t *pick,
                                int32_t *tsc, uint32_t *bits, int32_t *out, int64_t *n_dcu,
                                hkv_policy_scratch *ws)
{
    const int g = s->g, d = s->d, ng = d / HKV_SKETCH_GROUP;
    const int64_t k = s->c.rho_p;
    const size_t at = (size_t)layer * s->KH + (size_t)kvh;
    const size_t rb = hkv_sketch_code_bytes(s->c.sketch, d);
    const float *scale = s->sks + at * (size_t)s->cap * ng;
    const int8_t *codes = s->skc + at * (size_t)s->cap * rb;
    sketch_catch_up(s, layer, kvh, far);
    if (s->c.sketch == 3)
        hkv_policy_score_max_i4(ws, s->kern, q, g, d, (const uint8_t *)codes, (int64_t)rb, scale,
                                cand, n, a);
    else
        hkv_policy_score_max_i8(ws, s->kern, q, g, d, codes, (int64_t)rb, scale, cand, n, a);
    ws->bytes += (uint64_t)n * (rb + (size_t)ng * 4);   /* the candidates' codes and scales */
    ct_head *hd = &s->lay[layer].kv[kvh];
    hd->reranks++;
    if (n <= k) {   /* all of them: no exact score needed */
        memcpy(out, cand, (size_t)n * sizeof *out);
        return n;
    }
    /* Every pick below is a set (emitted ascending, or a threshold): the
     * radix top-k, not hkv_topk's order (three times the time here). */
    if (s->c.sketch >= 2) {   /* approximate: the sketch's scores decide at the cut too */
        int64_t mo;
        if (n_dcu && s->c.rho >= k) {
            /* the DCU's top rho first, then the top rho' inside it: the
             * same set (the subset keeps cand's order, so ties part alike),
             * one pass over n instead of two */
            const int64_t md = hkv_topk_asc(a, n, s->c.rho, surv, tsc);
            for (int64_t i = 0; i < md; i++) lb[i] = a[surv[i]];
            mo = hkv_topk_asc(lb, md, k, pick, tsc);
            for (int64_t i = 0; i < mo; i++) pick[i] = surv[pick[i]];
            *n_dcu = md;
        } else {
            mo = hkv_topk_asc(a, n, k, pick, tsc);
        }
        emit_ascending(cand, pick, mo, n, bits, out);
        return mo;
    }
    /* |q_h| summed over each group of codes, halved and widened by 1/32 */
    float q1[HKV_CTKVR_MAX_D];   /* [g][ng]: g * ng <= g * d / 32 */
    float *q1p = g * ng <= HKV_CTKVR_MAX_D ? q1 : NULL;
    for (int j = 0; q1p && j < g; j++)
        for (int gi = 0; gi < ng; gi++) {
            float t = 0;
            for (int e = 0; e < HKV_SKETCH_GROUP; e++) t += fabsf(q[j * d + gi * HKV_SKETCH_GROUP + e]);
            q1p[j * ng + gi] = t * (0.5f + 1.0f / 32.0f);
        }
    for (int64_t i = 0; i < n; i++) {   /* each exact score lies in [lb, ub] */
        const float b = sketch_bound(scale + (size_t)cand[i] * ng, q1p, g, ng);
        lb[i] = a[i] - b, ub[i] = a[i] + b;
    }
    /* t_out: the k-th largest lower bound; t_in: the (k+1)-th largest upper */
    float t_out = INFINITY, t_in = INFINITY;
    int64_t m = hkv_topk_asc(lb, n, k, pick, tsc);
    for (int64_t i = 0; i < m; i++) t_out = lb[pick[i]] < t_out ? lb[pick[i]] : t_out;
    m = hkv_topk_asc(ub, n, k + 1, pick, tsc);
    for (int64_t i = 0; i < m; i++) t_in = ub[pick[i]] < t_in ? ub[pick[i]] : t_in;
    /* ub < t_out: k candidates score above it, out. lb > t_in: at most k
     * candidates can score as high (the k + 1 largest upper bounds, itself
     * among them), in. The band between is ranked on its fp16 keys. */
    int64_t n_in = 0, nb = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ub[i] < t_out) continue;
        if (lb[i] > t_in) pick[n_in++] = (int32_t)i;
        else surv[nb] = (int32_t)i, sp[nb++] = cand[i];
    }
    int64_t mo = n_in;
    if (nb > 0 && n_in < k) {
        hkv_policy_score_max(ws, s->kern, q, g, d, far->k[kvh], far->ld, sp, nb, lb);   /* as the fp16 rerank */
        ws->bytes += (uint64_t)nb * d * 2;
        hd->surv += nb;
        int32_t *bp = pick + n_in;
        const int64_t mb = hkv_topk_asc(lb, nb, k - n_in, bp, tsc);
        for (int64_t i = 0; i < mb; i++) bp[i] = surv[bp[i]];
        mo += mb;
    }
    emit_ascending(cand, pick, mo, n, bits, out);
    return mo;
}

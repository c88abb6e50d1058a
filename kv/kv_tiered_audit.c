/* Audit mode (hetkv eval, --audit): a decode row's policy output against
 * dense attention over its whole far tier, and the selection's recall of
 * the oracle's top-k, accumulated per sequence. */
#include <math.h>
#include <string.h>

#include "kv_tiered_impl.h"

void tiered_audit_row(tiered *t, tseq *q, int layer, int kvh, const float *qv, const float *o_pol,
                             const float *o_near, const float *lse_near, const int32_t *sel, int64_t n_sel,
                             const hkv_far_view *fv, float *tmp_o, float *tmp_l, float *scores,
                             int32_t *rows, int32_t *top, int32_t *work, int32_t *mark, float *o2, float *l2,
                             uint16_t *tile) {
    const int g = t->s.n_head / t->s.n_head_kv, d = t->s.head_dim;
    const hkv_cpu_kernels *kn = t->kern;
    const int64_t n_span = fv->hi - fv->lo;
    const float scale = 1.0f / sqrtf((float)d);
    (void)layer;
    /* The far tokens present: all of [lo, hi), or after a token-selective
     * prefill the propagated ones and those after (kv_tiered_tsp.c). */
    int64_t n_far = 0;
    if (fv->rows) {
        for (int64_t i = 0; i < fv->n_rows; i++)
            if (fv->rows[i] >= fv->lo && fv->rows[i] < fv->hi) rows[n_far++] = fv->rows[i];
        for (int64_t p = fv->rows_end > fv->lo ? fv->rows_end : fv->lo; p < fv->hi; p++)
            rows[n_far++] = (int32_t)p;
    } else {
        for (int64_t i = 0; i < n_span; i++) rows[n_far++] = (int32_t)(fv->lo + i);
    }
    /* Dense reference: near + every far token. */
    memcpy(tmp_o, o_near, (size_t)g * d * sizeof(float));
    memcpy(tmp_l, lse_near, (size_t)g * sizeof(float));
    float *of = tmp_o + (size_t)g * d, *lf = tmp_l + g;
    if (hkv_far_q8(fv)) {   /* (no absent rows: a token-selective prefill is refused) */
        uint16_t *tk = tile, *tv = tile + (size_t)HKV_TIERED_PIECE * d;
        memset(of, 0, (size_t)g * d * sizeof(float));
        for (int j = 0; j < g; j++) lf[j] = -INFINITY;
        for (int64_t a = 0; a < n_far; a += HKV_TIERED_PIECE) {
            const int64_t n = n_far - a < HKV_TIERED_PIECE ? n_far - a : HKV_TIERED_PIECE;
            hkv_far_gather16(kn, fv, kvh, rows + a, 0, n, tk, tv);
            kn->attn_dense(qv, g, d, tk, tv, d, n, scale, o2, l2);
            hkv_attn_merge(of, lf, o2, l2, g, d);
        }
    } else if (fv->rows)
        kn->attn_sparse(qv, g, d, fv->k[kvh], fv->v[kvh], fv->ld, rows, n_far, scale, of, lf);
    else
        kn->attn_dense(qv, g, d, fv->k[kvh] + fv->lo * fv->ld, fv->v[kvh] + fv->lo * fv->ld, fv->ld,
                              n_far, scale, of, lf);
    hkv_attn_merge(tmp_o, tmp_l, of, lf, g, d);
    double err_sum = 0;
    for (int h = 0; h < g; h++) {
        double num = 0, den = 0;
        for (int i = 0; i < d; i++) {
            double a = o_pol[h * d + i], b = tmp_o[h * d + i];
            num += (a - b) * (a - b);
            den += b * b;
        }
        err_sum += den > 0 ? sqrt(num / den) : 0;
    }
    double recall = 1;
    if (n_far > 0) {
        const hkv_policy_scratch alone = {0};   /* (the kernels directly) */
        hkv_far_score_max(&alone, kn, qv, g, fv, kvh, rows, n_far, scores);
        int64_t k = t->p.audit_k < n_far ? t->p.audit_k : n_far;
        int64_t m = hkv_topk(scores, n_far, k, top, work);
        memset(mark, 0, (size_t)n_span * sizeof *mark);
        for (int64_t i = 0; i < m; i++) mark[rows[top[i]] - fv->lo] = 1;
        int64_t hit = 0;
        for (int64_t i = 0; i < n_sel; i++) {
            int64_t r = sel[i] - fv->lo;
            if (r >= 0 && r < n_span && mark[r]) {
                hit++;
                mark[r] = 0;
            }
        }
        recall = m ? (double)hit / (double)m : 1;
    }
#pragma omp atomic
    q->audit.n += g;
#pragma omp atomic
    q->audit.rel_err_sum += err_sum;
    if (n_far > 0) {
#pragma omp atomic
        q->audit.recall_sum += recall;
#pragma omp atomic
        q->audit.n_recall += 1;
    }
#pragma omp atomic
    q->audit.selected_sum += (double)n_sel;
#pragma omp atomic
    q->audit.far_sum += (double)n_far;
}

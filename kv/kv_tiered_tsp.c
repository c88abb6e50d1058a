/* The tiered cache's side of token-selective propagation (fastkv,
 * runtime/tsp_prefill.c): layers past the TSP layer receive prompt rows of
 * selected positions only (segments with a pos_list). Per (sequence, layer)
 * the cache keeps the list of positions written so; positions below the
 * list's end that are not in it hold no data. Prompt attention in such a
 * layer (the selected rows themselves, and any later turn) runs over the
 * present positions only (kv_tiered_attn.c), policies see the list in the
 * far view, and a policy switch to one that does not read it is refused. */
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_impl.h"

/* Record a pos_list segment's positions for (q, layer); the list is
 * allocated (INDEX tier, the sequence's capacity) at the layer's first one. */
int tiered_tsp_note(tiered *t, tseq *q, int layer, const hkv_seg *sg, hkv_err *err) {
    if (!sg->pos_list) return HKV_OK;
    if (!q->tsp) {
        q->tsp = calloc((size_t)t->s.n_layer, sizeof *q->tsp);
        if (!q->tsp) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the propagated-row tables");
    }
    tsp_list *tl = &q->tsp[layer];
    if (!tl->rows) {
        tl->bytes = (size_t)q->cap * sizeof(int32_t);
        tl->rows = hkv_host_alloc(t->mem, HKV_TIER_INDEX, tl->bytes, err);
        if (!tl->rows) {
            tl->bytes = 0;
            return hkv_err_prefix(err, "propagated-row list of layer %d", layer);
        }
        tl->n = tl->end = 0;
    }
    for (int64_t i = 0; i < sg->n; i++) {
        int64_t p = sg->pos_list[i];
        if (p < tl->end) continue;   /* already listed (checked ascending by layer_step) */
        tl->rows[tl->n++] = (int32_t)p;
        tl->end = p + 1;
    }
    return HKV_OK;
}

void tiered_tsp_free(tiered *t, tseq *q) {
    if (!q->tsp) return;
    for (int l = 0; l < t->s.n_layer; l++)
        hkv_host_free(t->mem, HKV_TIER_INDEX, q->tsp[l].rows, q->tsp[l].bytes);
    free(q->tsp);
    q->tsp = NULL;
}

int tiered_tsp_copy(tiered *t, tseq *d, const tseq *s, hkv_err *err) {
    tiered_tsp_free(t, d);
    if (!s->tsp) return HKV_OK;
    d->tsp = calloc((size_t)t->s.n_layer, sizeof *d->tsp);
    if (!d->tsp) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the propagated-row tables");
    for (int l = 0; l < t->s.n_layer; l++) {
        const tsp_list *a = &s->tsp[l];
        tsp_list *b = &d->tsp[l];
        if (!a->rows) continue;
        b->bytes = (size_t)d->cap * sizeof(int32_t);
        if (!(b->rows = hkv_host_alloc(t->mem, HKV_TIER_INDEX, b->bytes, err))) {
            b->bytes = 0;
            return hkv_err_prefix(err, "copying the propagated-row list of layer %d", l);
        }
        memcpy(b->rows, a->rows, (size_t)a->n * sizeof(int32_t));
        b->n = a->n;
        b->end = a->end;
    }
    return HKV_OK;
}

int64_t tiered_tsp_rows_upto(const tsp_list *tl, int64_t p_last, int32_t *idx) {
    int64_t c = 0;
    for (int64_t i = 0; i < tl->n && tl->rows[i] <= p_last; i++) idx[c++] = tl->rows[i];
    for (int64_t p = tl->end; p <= p_last; p++) idx[c++] = (int32_t)p;
    return c;
}

int tiered_seq_instance(void *self, int seq, const hkv_policy_def **def, hkv_policy *pol,
                        hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs || !t->seqs[seq].open)
        return hkv_seterr(err, HKV_E_INVAL, "sequence %d is not open", seq);
    if (def) *def = t->seqs[seq].def;
    if (pol) *pol = t->seqs[seq].pol;
    return HKV_OK;
}

void tiered_tsp_rewind(tiered *t, tseq *q, int64_t n) {
    if (!q->tsp) return;
    for (int l = 0; l < t->s.n_layer; l++) {
        tsp_list *tl = &q->tsp[l];
        while (tl->n > 0 && tl->rows[tl->n - 1] >= n) tl->n--;
        if (tl->end > n) tl->end = n;   /* positions >= n are written afresh */
    }
}

/* Cascade attention in the tiered cache (FlashInfer's name for it): the
 * decode rows attending in place whose first pieces lie in one shared prefix
 * (kv_prefix.h) get those pieces' partial from one pass over each piece for
 * all of them, so the prefix's rows are read once for the batch, not once a
 * row; each row's own items (kv_tiered_attn.c) go on from there. A head's
 * arithmetic in attn_dense does not depend on the other heads of the call
 * (kernels.h; tests/cpu checks it on every ISA) and the merge is per head:
 * each row's partial is bit for bit the one it would compute alone,
 * whatever the batch. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_impl.h"

typedef struct casc_member {
    const hkv_kv_prefix *pre;
    int64_t n;        /* shared pieces */
    int kvh, item;
} casc_member;

static int cmp_member(const void *pa, const void *pb) {
    const casc_member *a = pa, *b = pb;
    if (a->pre != b->pre) return (uintptr_t)a->pre < (uintptr_t)b->pre ? -1 : 1;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    if (a->kvh != b->kvh) return a->kvh - b->kvh;
    return a->item - b->item;
}

void tiered_cascade_free(tiered_cascade *c) {
    free(c->of);
    free(c->o);
    memset(c, 0, sizeof *c);
}

/* Largest query heads one cascade call takes (its scratch is 3 G d floats). */
#define CASC_MAX_ROWS 64

int tiered_cascade_run(tiered *t, int layer, const hkv_seg *segs, const tiered_item *items,
                       int n_items, const float *qkv, int64_t ld_qkv, float scale, tiered_cascade *c,
                       hkv_err *err) {
    const int KH = t->s.n_head_kv, d = t->s.head_dim, g = t->s.n_head / KH;
    memset(c, 0, sizeof *c);
    int n_cand = 0;
    for (int w = 0; w < n_items; w++) {
        const hkv_seg *sg = &segs[items[w].seg];
        const tseq *q = &t->seqs[sg->seq];
        n_cand += !tiered_is_prompt(sg) && tiered_dense_in_place(t, q, NULL) && tiered_shared_pieces(q, sg->pos) > 0;
    }
    if (n_cand < 2) return HKV_OK;
    casc_member *m = malloc((size_t)n_cand * sizeof *m);
    if (!(c->of = malloc((size_t)n_items * sizeof *c->of)) || !m) {
        free(m);
        tiered_cascade_free(c);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d cascade rows", n_cand);
    }
    int k = 0;
    for (int w = 0; w < n_items; w++) {
        c->of[w] = -1;
        const hkv_seg *sg = &segs[items[w].seg];
        const tseq *q = &t->seqs[sg->seq];
        if (!tiered_is_prompt(sg) && tiered_dense_in_place(t, q, NULL) && tiered_shared_pieces(q, sg->pos) > 0)
            m[k++] = (casc_member){q->pre, tiered_shared_pieces(q, sg->pos), items[w].kvh, w};
    }
    qsort(m, (size_t)n_cand, sizeof *m, cmp_member);
    /* Units: runs of at most CASC_MAX_ROWS / g rows of one group; a group of
     * one is left to its item (the same arithmetic). */
    const int per = CASC_MAX_ROWS / g > 0 ? CASC_MAX_ROWS / g : 1;
    int *unit = malloc((size_t)(n_cand + 1) * 2 * sizeof *unit), n_units = 0, n_slots = 0;
    if (!unit) {
        free(m);
        tiered_cascade_free(c);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d cascade rows", n_cand);
    }
    for (int a = 0, b; a < n_cand; a = b) {
        for (b = a + 1; b < n_cand && m[b].pre == m[a].pre && m[b].n == m[a].n && m[b].kvh == m[a].kvh;
             b++)
            ;
        if (b - a < 2) continue;
        for (int u = a; u < b; u += per) {
            unit[2 * n_units] = u;
            unit[2 * n_units++ + 1] = b - u < per ? b - u : per;
        }
        for (int u = a; u < b; u++) c->of[m[u].item] = n_slots++;
    }
    const size_t gd = (size_t)g * d;
    const int nth = omp_get_max_threads();
    const size_t scr = 3 * (size_t)per * gd + 2 * (size_t)per * g;
    if (n_slots && !(c->o = malloc(((size_t)n_slots * (gd + g) + (size_t)nth * scr) * sizeof(float)))) {
        free(unit), free(m);
        tiered_cascade_free(c);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d cascade partials", n_slots);
    }
    c->n = n_slots;
    c->l = c->o + (size_t)n_slots * gd;
    float *scratch = c->l + (size_t)n_slots * g;
    const hkv_cpu_kernels *kn = t->kern;
#pragma omp parallel for schedule(dynamic, 1) if (n_units > 1)
    for (int u = 0; u < n_units; u++) {
        const casc_member *mm = m + unit[2 * u];
        const int nm = unit[2 * u + 1], G = nm * g;
        float *qb = scratch + (size_t)omp_get_thread_num() * scr, *ao = qb + (size_t)nm * gd;
        float *to = ao + (size_t)nm * gd, *al = to + (size_t)nm * gd, *tl = al + G;
        for (int i = 0; i < nm; i++)
            memcpy(qb + i * gd, qkv + segs[items[mm[i].item].seg].row * ld_qkv + (size_t)mm[i].kvh * gd,
                   gd * sizeof(float));
        memset(ao, 0, (size_t)nm * gd * sizeof(float));
        for (int j = 0; j < G; j++) al[j] = -INFINITY;
        const int run = layer * KH + mm[0].kvh;
        const uint16_t *K = hkv_kv_prefix_run(mm[0].pre, 0, run), *V = hkv_kv_prefix_run(mm[0].pre, 1, run);
        /* every row's heads in one call a piece: each key converted once
         * for all of them (kernels.h: a head's arithmetic does not depend on
         * the heads beside it) */
        for (int64_t p = 0; p < mm[0].n; p++) {
            kn->attn_dense(qb, G, d, K + p * HKV_TIERED_PIECE * d, V + p * HKV_TIERED_PIECE * d, d, HKV_TIERED_PIECE, scale,
                           to, tl);
            hkv_attn_merge(ao, al, to, tl, G, d);
        }
        __atomic_fetch_add(&t->bytes_read, (uint64_t)mm[0].n * HKV_TIERED_PIECE * d * 4, __ATOMIC_RELAXED);
        for (int i = 0; i < nm; i++) {
            const int slot = c->of[mm[i].item];
            memcpy(c->o + slot * gd, ao + i * gd, gd * sizeof(float));
            memcpy(c->l + (size_t)slot * g, al + (size_t)i * g, (size_t)g * sizeof(float));
        }
    }
    free(unit);
    free(m);
    return HKV_OK;
}


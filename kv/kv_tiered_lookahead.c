/* The tiered cache's side of lookahead policies (laq, speckv) and of draft
 * prompt compression (specpc): rewinding a sequence to its prompt end,
 * handing the policy the kept queries of the lookahead tokens, and a view
 * of a freshly fed prompt's rows and queries.
 *
 * Where a position lives. Every position below the length is in its far
 * row (kv_tiered.c writes decode tokens there too); the near tier holds the
 * sinks and the ring, and the far tier is [L_init, far_hi). A rewind
 * makes the near tier again from the far rows, as a prompt end does. */
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_impl.h"

int tiered_seq_rewind(void *self, int seq, int64_t n, hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs || !t->seqs[seq].open)
        return hkv_seterr(err, HKV_E_INVAL, "rewind: sequence %d is not open", seq);
    tseq *q = &t->seqs[seq];
    q->epoch = ++t->epoch;
    if (n < 0 || n > q->len)
        return hkv_seterr(err, HKV_E_RANGE, "rewind of sequence %d to %lld tokens, but it holds %lld",
                          seq, (long long)n, (long long)q->len);
    int rc;
    if (n < q->pre_rows && (rc = tiered_prefix_unmap(t, q, 1, err))) return rc;   /* rows get rewritten */
    const int64_t Li = t->p.L_init, Ll = t->p.L_local, ring_from = n - Ll > Li ? n - Ll : Li;
    for (int l = 0; l < t->s.n_layer; l++) {
        if (q->near_k) tiered_near_from_far(t, q, l, n);   /* the far rows hold every position */
        q->far_hi[l] = ring_from;
        q->prompt_open[l] = 0;
    }
    tiered_tsp_rewind(t, q, n);
    q->len = n;
    return HKV_OK;
}

/* Rows [end - n, end) of the query ring of (q, layer) in position order. */
static int64_t linearise(const tiered *t, const tseq *q, int layer, int64_t end, uint16_t *dst,
                         int64_t cap) {
    const size_t qrow = (size_t)t->s.n_head * t->s.head_dim;
    int64_t n = end < q->q_keep ? end : q->q_keep;
    if (n > cap) n = cap;
    const uint16_t *ring = q->qh + (size_t)layer * q->q_keep * qrow;
    for (int64_t i = 0; i < n; i++) {
        int64_t p = end - n + i;
        memcpy(dst + i * qrow, ring + (size_t)(p % q->q_keep) * qrow, qrow * 2);
    }
    return n;
}

int tiered_lookahead_end(void *self, int seq, int64_t end, hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs || !t->seqs[seq].open)
        return hkv_seterr(err, HKV_E_INVAL, "lookahead end: sequence %d is not open", seq);
    tseq *q = &t->seqs[seq];
    if (!q->pol.ops || !q->pol.ops->lookahead_end)
        return hkv_seterr(err, HKV_E_INVAL, "policy '%s' has no lookahead", q->def->name);
    if (end < q->len || end > q->cap)
        return hkv_seterr(err, HKV_E_RANGE, "lookahead end at %lld, but sequence %d holds %lld "
                          "tokens of %lld", (long long)end, seq, (long long)q->len, (long long)q->cap);
    const size_t qrow = (size_t)t->s.n_head * t->s.head_dim;
    const int64_t nq = end < q->q_keep ? end : q->q_keep;
    uint16_t *lin = NULL;
    if (nq > 0 && !(lin = hkv_host_alloc(t->mem, HKV_TIER_WORKSPACE, (size_t)nq * qrow * 2, err)))
        return hkv_err_prefix(err, "lookahead queries");
    int rc = HKV_OK;
    for (int l = 0; l < t->s.n_layer && !rc; l++) {
        int64_t n = nq > 0 ? linearise(t, q, l, end, lin, nq) : 0;
        hkv_query_view qv = {.n = n, .pos0 = end - n, .q = lin, .ld = (int64_t)qrow};
        hkv_far_view fv;
        tiered_far_view(t, q, l, &fv);
        if ((rc = q->pol.ops->lookahead_end(q->pol.self, l, &fv, &qv, err)))
            hkv_err_prefix(err, "policy '%s' at lookahead end, layer %d", q->def->name, l);
    }
    if (lin) hkv_host_free(t->mem, HKV_TIER_WORKSPACE, lin, (size_t)nq * qrow * 2);
    return rc;
}

int tiered_prompt_view(void *self, int seq, int layer, hkv_far_view *far, hkv_query_view *qv,
                       uint16_t *qbuf, int64_t qbuf_rows, hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs || !t->seqs[seq].open || layer < 0 || layer >= t->s.n_layer)
        return hkv_seterr(err, HKV_E_INVAL, "prompt view: sequence %d (layer %d) is not open", seq,
                          layer);
    const tseq *q = &t->seqs[seq];
    tiered_far_view(t, q, layer, far);
    far->lo = 0;   /* the far rows hold the whole prompt just fed */
    far->hi = q->len;
    const size_t qrow = (size_t)t->s.n_head * t->s.head_dim;
    int64_t n = q->q_keep > 0 && qbuf ? linearise(t, q, layer, q->len, qbuf, qbuf_rows) : 0;
    *qv = (hkv_query_view){.n = n, .pos0 = q->len - n, .q = qbuf, .ld = (int64_t)qrow};
    return HKV_OK;
}

const hkv_policy_def *tiered_seq_policy(const void *self, int seq, hkv_policy_args *args) {
    const tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs) return NULL;
    const tseq *q = &t->seqs[seq];
    const hkv_policy_def *d = q->def ? q->def : t->p.policy;
    if (args) *args = q->def ? q->args : t->p.args;
    return d;
}

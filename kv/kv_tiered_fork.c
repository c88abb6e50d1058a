/* Forking a sequence in the tiered cache: seq_copy, and seq_share with the
 * source's rows shared by reference (kv_prefix.h). */
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_impl.h"

int tiered_prefix_unmap(tiered *t, tseq *q, int keep, hkv_err *err) {
    if (!q->pre) return HKV_OK;
    void *bufs[2] = {q->far_k, q->far_v};
    int rc = hkv_kv_prefix_unmap(q->pre, bufs, q->stride, q->pre_rows, keep, err);
    if (rc) return rc;
    q->pre = NULL;
    q->pre_rows = 0;
    q->epoch = ++t->epoch;
    return HKV_OK;
}

static int check_pair(const tiered *t, int dst, int src, const char *what, hkv_err *err) {
    if (dst < 0 || dst >= t->max_seqs || src < 0 || src >= t->max_seqs || dst == src ||
        !t->seqs[dst].open || !t->seqs[src].open)
        return hkv_seterr(err, HKV_E_INVAL, "cannot %s sequence %d to %d", what, src, dst);
    const tseq *d = &t->seqs[dst], *s = &t->seqs[src];
    if (s->len > d->cap)
        return hkv_seterr(err, HKV_E_CAPACITY, "sequence %d holds %lld tokens, more than the "
                          "%lld that sequence %d has room for", src, (long long)s->len,
                          (long long)d->cap, dst);
    return HKV_OK;
}

/* src's tokens into dst, whose far rows below `from` already hold them;
 * far rows from `upto` on are not copied (dst is rewound below them).
 * Without index, dst's tokens are a prompt not yet ended (seq_share). */
static int copy_state(tiered *t, tseq *d, const tseq *s, int64_t from, int64_t upto, int index,
                      hkv_err *err) {
    const int L = t->s.n_layer, KH = t->s.n_head_kv, d_ = t->s.head_dim;
    if (d->near_k && s->near_k) {
        memcpy(d->near_k, s->near_k, s->near_bytes);
        memcpy(d->near_v, s->near_v, s->near_bytes);
    }
    if (upto > from)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < KH; h++) {
                size_t n = (size_t)(upto - from) * d_ * 2;
                memcpy(far_rows(t, d, d->far_k, l, h) + from * d_, far_rows(t, s, s->far_k, l, h) + from * d_, n);
                memcpy(far_rows(t, d, d->far_v, l, h) + from * d_, far_rows(t, s, s->far_v, l, h) + from * d_, n);
            }
    /* Query rings agree slot by slot only when their sizes do. */
    if (d->q_keep == s->q_keep && d->qh) memcpy(d->qh, s->qh, s->qh_bytes);
    memcpy(d->prompt_open, s->prompt_open, (size_t)L * sizeof *d->prompt_open);
    memcpy(d->far_hi, s->far_hi, (size_t)L * sizeof *d->far_hi);
    memcpy(d->fed, s->fed, (size_t)L * sizeof *d->fed);
    int rt = tiered_tsp_copy(t, d, s, err);
    if (rt) return rt;
    d->len = s->len;
    d->prompt_done = index ? s->prompt_done : 0;
    d->epoch = ++t->epoch;
    memset(&d->audit, 0, sizeof d->audit);
    if (d->near_k && !s->near_k)   /* a near tier from the far rows that hold everything */
        for (int l = 0; l < L; l++) tiered_near_from_far(t, d, l, d->len);
    return tiered_policy_make(t, d, index ? s : NULL, err);
}

int tiered_seq_copy(void *self, int dst, int src, hkv_err *err) {
    tiered *t = self;
    int rc = check_pair(t, dst, src, "copy", err);
    if (rc) return rc;
    tseq *d = &t->seqs[dst];
    if ((rc = tiered_prefix_unmap(t, d, 1, err))) return rc;   /* its rows are rewritten */
    return copy_state(t, d, &t->seqs[src], 0, t->seqs[src].len, 1, err);
}

/* As copy then rewind to n, with src's rows below the last whole page of
 * its length shared by reference (kv_prefix.h): made a shared prefix the
 * first time src is shared, mapped into src itself and then into each dst
 * (as far as n reaches). The index as kv.h says. */
int tiered_seq_share(void *self, int dst, int src, int64_t n, unsigned flags, hkv_err *err) {
    tiered *t = self;
    int rc = check_pair(t, dst, src, "share", err);
    if (rc) return rc;
    if (n < 0 || n > t->seqs[src].len)
        return hkv_seterr(err, HKV_E_RANGE, "sharing %lld tokens of sequence %d, which holds %lld",
                          (long long)n, src, (long long)t->seqs[src].len);
    if (t->p.pin_far)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "a prefix shared by reference needs the host "
                          "path's far tier (with a CUDA device it is page-locked memory that the "
                          "device reads)");
    tseq *d = &t->seqs[dst], *s = &t->seqs[src];
    const int64_t pr = hkv_kv_prefix_page_rows((size_t)t->s.head_dim * 2);
    if (!s->pre && s->len >= pr) {
        void *bufs[2] = {s->far_k, s->far_v};
        const int64_t rows = s->len / pr * pr;
        hkv_kv_prefix *p;
        if ((rc = hkv_kv_prefix_create(&p, bufs, 2, t->s.n_layer * t->s.n_head_kv, s->stride, rows,
                                       (size_t)t->s.head_dim * 2, t->mem, err)))
            return rc;
        if ((rc = hkv_kv_prefix_map(p, bufs, s->stride, rows, err))) {
            hkv_kv_prefix_drop(p);
            return rc;
        }
        s->pre = p;
        s->pre_rows = rows;
    }
    if ((rc = tiered_prefix_unmap(t, d, 1, err))) return rc;
    const int64_t rows = s->pre_rows < n / pr * pr ? s->pre_rows : n / pr * pr;
    if (s->pre && rows > 0) {
        void *bufs[2] = {d->far_k, d->far_v};
        if ((rc = hkv_kv_prefix_map(s->pre, bufs, d->stride, rows, err))) return rc;
        d->pre = s->pre;
        d->pre_rows = rows;
    }
    const int index = (flags & HKV_SHARE_INDEX) && n == s->len && s->prompt_done;
    if ((rc = copy_state(t, d, s, d->pre_rows, n, index, err))) return rc;
    return n < d->len ? tiered_seq_rewind(t, dst, n, err) : HKV_OK;
}


/* Forking a sequence in the tiered cache: seq_copy, and seq_share with the
 * source's rows shared by reference (kv_prefix.h). */
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_impl.h"
#include "pinned.h"

void tiered_queries_unshare(tiered *t, tseq *q) {
    if (!q->qh_cow) return;
    hkv_mem_account_add(t->mem, HKV_TIER_INDEX, (long long)q->qh_cut);
    hkv_kv_cow_release(q->qh_cow);
    q->qh_cow = NULL;
    q->qh_cut = 0;
}

/* q maps its ring's shared bytes: its INDEX account keeps only the pages
 * it may still write, the rows from position `from` to its capacity (at
 * most a ring per layer), and gives up the rest, held once by the cow. */
static void queries_cut(tiered *t, tseq *q, int64_t from) {
    const size_t pg = 4096, qrow = (size_t)t->s.n_head * t->s.head_dim * 2;
    const size_t per_layer = (size_t)q->q_keep * qrow;
    int64_t rows = q->cap - from < q->q_keep ? q->cap - from : q->q_keep;
    size_t keep = (size_t)(rows > 0 ? rows : 0) * qrow + 2 * pg;   /* the pages those rows touch */
    if (keep > per_layer) keep = per_layer;
    const size_t own = keep * (size_t)t->s.n_layer;
    q->qh_cut = q->qh_bytes > own ? q->qh_bytes - own : 0;
    hkv_mem_account_add(t->mem, HKV_TIER_INDEX, -(long long)q->qh_cut);
}

/* d's kept queries as s's, mapped copy-on-write from one memfd that every
 * sequence starting from s's ring shares (kv_cow.h); made from s's ring the
 * first time, and again when s has written its ring since. d continues from
 * position `from`. */
static int share_queries(tiered *t, tseq *d, tseq *s, int64_t from, hkv_err *err) {
    int rc;
    if (!s->qh_cow || s->qh_dirty) {
        hkv_kv_cow *c;
        if ((rc = hkv_kv_cow_create(&c, s->qh, s->qh_bytes, t->mem, HKV_TIER_INDEX, err)))
            return rc;
        tiered_queries_unshare(t, s);   /* (an older one: now mapped over) */
        s->qh_cow = c;
        s->qh_dirty = 0;
        queries_cut(t, s, s->len);
    }
    if ((rc = hkv_kv_cow_map(s->qh_cow, d->qh, err))) return rc;
    tiered_queries_unshare(t, d);
    d->qh_cow = s->qh_cow;
    d->qh_dirty = 0;
    queries_cut(t, d, from);
    return HKV_OK;
}

/* Pages are mapped over q's far buffers between far_unlock and far_relock:
 * page-locked buffers (the device path) are unregistered first and
 * registered again over what is mapped then (pinned.h). far_relock returns
 * rc, the remap's result, unless that is OK and the register failed. */
static int far_unlock(tiered *t, tseq *q, hkv_err *err) {
    int rc = hkv_pinned_unlock(&q->far_kb, err);
    if (!rc && (rc = hkv_pinned_unlock(&q->far_vb, err))) {
        hkv_err ignore;
        hkv_pinned_relock(&q->far_kb, &t->pin, &ignore);
    }
    return rc;
}

static int far_relock(tiered *t, tseq *q, int rc, hkv_err *err) {
    hkv_err ignore;
    int rl = hkv_pinned_relock(&q->far_kb, &t->pin, rc ? &ignore : err);
    const int rv = hkv_pinned_relock(&q->far_vb, &t->pin, rc || rl ? &ignore : err);
    return rc ? rc : rl ? rl : rv;
}

int tiered_prefix_unmap(tiered *t, tseq *q, int keep, hkv_err *err) {
    if (!q->pre) return HKV_OK;
    void *bufs[2] = {q->far_k, q->far_v};
    int rc;
    if (!keep)   /* a close: the buffer is freed next, nothing is remapped */
        rc = hkv_kv_prefix_unmap(q->pre, bufs, q->stride, q->pre_rows, 0, err);
    else if (!(rc = far_unlock(t, q, err)))
        rc = far_relock(t, q, hkv_kv_prefix_unmap(q->pre, bufs, q->stride, q->pre_rows, 1, err), err);
    if (rc) return rc;
    q->pre = NULL;
    q->pre_rows = 0;
    q->epoch = ++t->epoch;
    return HKV_OK;
}

/* Map rows [0, rows) of prefix p into q (pinned.h's unlock around it); q
 * holds p whenever the map took, even if the buffers could not be locked
 * again (then an error). */
static int far_map(tiered *t, tseq *q, hkv_kv_prefix *p, int64_t rows, hkv_err *err) {
    void *bufs[2] = {q->far_k, q->far_v};
    const int refs = hkv_kv_prefix_refs(p);
    int rc = far_unlock(t, q, err);
    if (rc) return rc;
    rc = far_relock(t, q, hkv_kv_prefix_map(p, bufs, q->stride, rows, err), err);
    if (hkv_kv_prefix_refs(p) > refs) q->pre = p, q->pre_rows = rows;
    return rc;
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
 * Without index, dst's tokens are a prompt not yet ended (seq_share); with
 * it, its policy's index is src's, held by reference with by_ref
 * (seq_share), and without (seq_copy: an independent sequence, whose reads
 * share nothing with src's, as a benchmark's batch of copies wants) copied
 * where the policy can (ctkvr, same arguments, src's prompt just ended,
 * rows of one format), else built again from the rows. */
static int copy_state(tiered *t, tseq *d, tseq *s, int64_t from, int64_t upto, int index,
                      int by_ref, hkv_err *err) {
    const int L = t->s.n_layer, KH = t->s.n_head_kv, d_ = t->s.head_dim;
    if (d->near_k && s->near_k) {
        memcpy(d->near_k, s->near_k, s->near_bytes);
        memcpy(d->near_v, s->near_v, s->near_bytes);
    }
    if (upto > from && d->q8 != s->q8) {   /* another format: each row converted */
        float x[HKV_Q8_MAX_D];
        const int ng = d_ / HKV_Q8_GROUP;
        for (int l = 0; l < L; l++) {
            hkv_far_view sv;
            tiered_far_view(t, s, l, &sv);
            for (int h = 0; h < KH; h++)
                for (int64_t p = from; p < upto; p++) {
                    if (d->q8) {   /* fp16 -> codes */
                        t->kern->f16_to_f32(sv.k[h] + p * d_, x, d_);
                        hkv_q8_quantize(x, d_, far_codes(t, d, d->far_k, l, h) + p * d_,
                                        far_scales(t, d, d->far_k, l, h) + p * ng);
                        t->kern->f16_to_f32(sv.v[h] + p * d_, x, d_);
                        hkv_q8_quantize(x, d_, far_codes(t, d, d->far_v, l, h) + p * d_,
                                        far_scales(t, d, d->far_v, l, h) + p * ng);
                    } else {       /* codes -> fp16 */
                        hkv_far_gather16(t->kern, &sv, h, NULL, p, 1,
                                         far_rows(t, d, d->far_k, l, h) + p * d_,
                                         far_rows(t, d, d->far_v, l, h) + p * d_);
                    }
                }
        }
    } else if (upto > from && d->q8) {   /* codes and scales */
        const int ng = d_ / HKV_Q8_GROUP;
        const size_t n = (size_t)(upto - from) * d_, ns = (size_t)(upto - from) * ng * sizeof(float);
        for (int l = 0; l < L; l++)
            for (int h = 0; h < KH; h++) {
                memcpy(far_codes(t, d, d->far_k, l, h) + from * d_, far_codes(t, s, s->far_k, l, h) + from * d_, n);
                memcpy(far_codes(t, d, d->far_v, l, h) + from * d_, far_codes(t, s, s->far_v, l, h) + from * d_, n);
                memcpy(far_scales(t, d, d->far_k, l, h) + from * ng, far_scales(t, s, s->far_k, l, h) + from * ng, ns);
                memcpy(far_scales(t, d, d->far_v, l, h) + from * ng, far_scales(t, s, s->far_v, l, h) + from * ng, ns);
            }
    } else if (upto > from)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < KH; h++) {
                size_t n = (size_t)(upto - from) * d_ * 2;
                memcpy(far_rows(t, d, d->far_k, l, h) + from * d_, far_rows(t, s, s->far_k, l, h) + from * d_, n);
                memcpy(far_rows(t, d, d->far_v, l, h) + from * d_, far_rows(t, s, s->far_v, l, h) + from * d_, n);
            }
    /* Query rings agree slot by slot only when their sizes do: then shared
     * copy-on-write rather than copied */
    int rq = d->q_keep == s->q_keep && d->qh ? share_queries(t, d, s, upto, err) : HKV_OK;
    if (rq) return rq;
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
    /* copied (not by_ref): src's index only over rows of src's format, so
     * that it is the index these rows build */
    const int from_src = index && (by_ref || d->q8 == s->q8);
    return tiered_policy_make(t, d, from_src ? s : NULL, !by_ref, err);
}

int tiered_seq_copy(void *self, int dst, int src, hkv_err *err) {
    tiered *t = self;
    int rc = check_pair(t, dst, src, "copy", err);
    if (rc) return rc;
    tseq *d = &t->seqs[dst];
    if ((rc = tiered_prefix_unmap(t, d, 1, err))) return rc;   /* its rows are rewritten */
    return copy_state(t, d, &t->seqs[src], 0, t->seqs[src].len, 1, 0, err);
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
    tseq *d = &t->seqs[dst], *s = &t->seqs[src];
    const int64_t pr = hkv_kv_prefix_page_rows((size_t)t->s.head_dim * 2);
    /* An 8-bit far tier's rows are copied (its scales sit apart from its
     * codes, which a mapping of whole row pages does not follow), converted
     * where the two sequences' formats differ; so are all rows on a device
     * that cannot page-lock read-only pages (pinned.h). */
    const int by_copy = s->q8 || d->q8 || (t->p.pin_far && !hkv_pinned_remap_supported());
    if (!by_copy && !s->pre && s->len >= pr) {
        void *bufs[2] = {s->far_k, s->far_v};
        const int64_t rows = s->len / pr * pr;
        hkv_kv_prefix *p;
        if ((rc = hkv_kv_prefix_create(&p, bufs, 2, t->s.n_layer * t->s.n_head_kv, s->stride, rows,
                                       (size_t)t->s.head_dim * 2, ++t->epoch, t->mem, err)))
            return rc;
        rc = far_map(t, s, p, rows, err);
        if (!s->pre) hkv_kv_prefix_drop(p);   /* never mapped */
        if (rc) return rc;
    }
    if ((rc = tiered_prefix_unmap(t, d, 1, err))) return rc;
    const int64_t rows = by_copy ? 0 : s->pre_rows < n / pr * pr ? s->pre_rows : n / pr * pr;
    if (s->pre && rows > 0 && (rc = far_map(t, d, s->pre, rows, err))) return rc;
    const int index = (flags & HKV_SHARE_INDEX) && n == s->len && s->prompt_done;
    if ((rc = copy_state(t, d, s, d->pre_rows, n, index, 1, err))) return rc;
    return n < d->len ? tiered_seq_rewind(t, dst, n, err) : HKV_OK;
}


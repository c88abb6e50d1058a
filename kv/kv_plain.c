/* The plain KV cache: contiguous fp16 rows per (sequence, layer, KV head),
 * dense causal attention through the host kernels. The baseline every other
 * backend is checked against. A prompt prefix may be shared by reference
 * between sequences (seq_share: kv_prefix.h maps its pages over each
 * sequence's first rows), so the prefix cache of batch and serve holds a
 * document once here as in the tiered cache. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"
#include "kv_prefix.h"
#include "pinned.h"

typedef struct kv_seq {
    uint16_t *k, *v;      /* [n_layer][n_head_kv][stride][d] each */
    hkv_pinned kb, vb;    /* their allocations: whole pages of their own mappings */
    int64_t cap, stride, len;
    hkv_kv_prefix *pre;   /* rows [0, pre_rows) of every run mapped from it, or NULL */
    int64_t pre_rows;
} kv_seq;

typedef struct kv_plain {
    hkv_kv_shape s;
    int max_seqs;
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    kv_seq *seqs;
    uint64_t prefix_ids;  /* the last shared prefix's id */
} kv_plain;

/* Work item of the attention loop: one KV head of one segment, a tile of
 * its queries. */
typedef struct item { int seg, kvh, q0, nq; } item;
#define QTILE 32

static uint16_t *rows_of(const kv_plain *p, const kv_seq *sq, const uint16_t *base, int layer, int kvh) {
    return (uint16_t *)base + (((size_t)layer * p->s.n_head_kv + kvh) * sq->stride) * p->s.head_dim;
}

static int plain_seq_open(void *self, int seq, int64_t n_ctx, hkv_err *err) {
    kv_plain *p = self;
    if (seq < 0 || seq >= p->max_seqs)
        return hkv_seterr(err, HKV_E_RANGE, "sequence %d out of range (max %d)", seq, p->max_seqs);
    if (n_ctx < 1 || n_ctx > (int64_t)1 << 31)
        return hkv_seterr(err, HKV_E_RANGE, "context of %lld tokens is out of range",
                          (long long)n_ctx);
    kv_seq *sq = &p->seqs[seq];
    if (sq->k) return hkv_seterr(err, HKV_E_INVAL, "sequence %d is already open", seq);
    /* runs on page boundaries, so a shared prefix can be mapped over their first rows */
    const int64_t stride = hkv_kv_prefix_stride(n_ctx, (size_t)p->s.head_dim * 2);
    size_t half = (size_t)p->s.n_layer * p->s.n_head_kv * (size_t)stride * p->s.head_dim * 2;
    int rc = hkv_pinned_alloc(&sq->kb, p->mem, NULL, HKV_TIER_FAR, half, -1, HKV_PIN_MAPPED, err);
    if (rc) return rc;
    if ((rc = hkv_pinned_alloc(&sq->vb, p->mem, NULL, HKV_TIER_FAR, half, -1, HKV_PIN_MAPPED, err))) {
        hkv_pinned_free(&sq->kb, p->mem, NULL);
        return rc;
    }
    sq->k = sq->kb.p;
    sq->v = sq->vb.p;
    sq->cap = n_ctx;
    sq->stride = stride;
    sq->len = 0;
    return HKV_OK;
}

/* Give back a mapped prefix: with keep, the rows stay as the sequence's own
 * (before a write below them). */
static int prefix_unmap(kv_seq *sq, int keep, hkv_err *err) {
    if (!sq->pre) return HKV_OK;
    void *bufs[2] = {sq->k, sq->v};
    int rc = hkv_kv_prefix_unmap(sq->pre, bufs, sq->stride, sq->pre_rows, keep, err);
    if (rc) return rc;
    sq->pre = NULL;
    sq->pre_rows = 0;
    return HKV_OK;
}

static void plain_seq_close(void *self, int seq) {
    kv_plain *p = self;
    if (seq < 0 || seq >= p->max_seqs) return;
    kv_seq *sq = &p->seqs[seq];
    prefix_unmap(sq, 0, NULL);   /* (without keep it cannot fail) */
    hkv_pinned_free(&sq->kb, p->mem, NULL);
    hkv_pinned_free(&sq->vb, p->mem, NULL);
    memset(sq, 0, sizeof *sq);
}

/* Rows [from, to) of every run of s into d. */
static void copy_rows(const kv_plain *p, kv_seq *d, const kv_seq *s, int64_t from, int64_t to) {
    const size_t row = (size_t)p->s.head_dim * 2;
    if (to <= from) return;
    for (int l = 0; l < p->s.n_layer; l++)
        for (int h = 0; h < p->s.n_head_kv; h++) {
            memcpy(rows_of(p, d, d->k, l, h) + from * p->s.head_dim,
                   rows_of(p, s, s->k, l, h) + from * p->s.head_dim, (size_t)(to - from) * row);
            memcpy(rows_of(p, d, d->v, l, h) + from * p->s.head_dim,
                   rows_of(p, s, s->v, l, h) + from * p->s.head_dim, (size_t)(to - from) * row);
        }
}

static int plain_seq_copy(void *self, int dst, int src, hkv_err *err) {
    kv_plain *p = self;
    if (dst < 0 || dst >= p->max_seqs || src < 0 || src >= p->max_seqs || dst == src ||
        !p->seqs[dst].k || !p->seqs[src].k)
        return hkv_seterr(err, HKV_E_INVAL, "cannot copy sequence %d to %d", src, dst);
    kv_seq *d = &p->seqs[dst];
    const kv_seq *s = &p->seqs[src];
    if (s->len > d->cap)
        return hkv_seterr(err, HKV_E_CAPACITY, "sequence %d holds %lld tokens, more than the "
                          "%lld that sequence %d has room for", src, (long long)s->len,
                          (long long)d->cap, dst);
    int rc = prefix_unmap(d, 1, err);   /* its rows are rewritten */
    if (rc) return rc;
    copy_rows(p, d, s, 0, s->len);
    d->len = s->len;
    return HKV_OK;
}

/* As a copy then a rewind to n, src's rows below the last whole page of its
 * length shared by reference (kv_prefix.h): made a shared prefix the first
 * time src is shared, mapped into src itself and then into dst (as far as n
 * reaches); the rows past it copied. There is no index here (flags). */
static int plain_seq_share(void *self, int dst, int src, int64_t n, unsigned flags, hkv_err *err) {
    kv_plain *p = self;
    (void)flags;
    if (dst < 0 || dst >= p->max_seqs || src < 0 || src >= p->max_seqs || dst == src ||
        !p->seqs[dst].k || !p->seqs[src].k)
        return hkv_seterr(err, HKV_E_INVAL, "cannot share sequence %d to %d", src, dst);
    kv_seq *d = &p->seqs[dst], *s = &p->seqs[src];
    if (n < 0 || n > s->len || n > d->cap)
        return hkv_seterr(err, HKV_E_RANGE, "sharing %lld tokens of sequence %d (holding %lld) "
                          "with sequence %d (room for %lld)", (long long)n, src, (long long)s->len,
                          dst, (long long)d->cap);
    const int64_t pr = hkv_kv_prefix_page_rows((size_t)p->s.head_dim * 2);
    const int runs = p->s.n_layer * p->s.n_head_kv;
    int rc;
    if (!s->pre && s->len >= pr) {
        void *bufs[2] = {s->k, s->v};
        const int64_t rows = s->len / pr * pr;
        hkv_kv_prefix *pre;
        if ((rc = hkv_kv_prefix_create(&pre, bufs, 2, runs, s->stride, rows,
                                       (size_t)p->s.head_dim * 2, ++p->prefix_ids, p->mem, err)))
            return rc;
        if ((rc = hkv_kv_prefix_map(pre, bufs, s->stride, rows, err))) {
            hkv_kv_prefix_drop(pre);
            return rc;
        }
        s->pre = pre;
        s->pre_rows = rows;
    }
    if ((rc = prefix_unmap(d, 1, err))) return rc;
    const int64_t rows = s->pre_rows < n / pr * pr ? s->pre_rows : n / pr * pr;
    if (s->pre && rows > 0) {
        void *bufs[2] = {d->k, d->v};
        if ((rc = hkv_kv_prefix_map(s->pre, bufs, d->stride, rows, err))) return rc;
        d->pre = s->pre;
        d->pre_rows = rows;
    }
    copy_rows(p, d, s, d->pre_rows, n);
    d->len = n;
    return HKV_OK;
}

static int64_t plain_seq_len(void *self, int seq) {
    kv_plain *p = self;
    return seq >= 0 && seq < p->max_seqs ? p->seqs[seq].len : 0;
}

static int plain_layer_step(void *self, int layer, const hkv_seg *segs, int n_segs,
                            const float *qkv, int64_t ld_qkv, float *out, int64_t ld_out,
                            hkv_err *err) {
    kv_plain *p = self;
    const int H = p->s.n_head, KH = p->s.n_head_kv, d = p->s.head_dim, g = H / KH;
    /* Validate every segment before writing anything. */
    int n_items = 0;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if (sg->seq < 0 || sg->seq >= p->max_seqs || !p->seqs[sg->seq].k)
            return hkv_seterr(err, HKV_E_INVAL, "segment %d names sequence %d, which is not open",
                              i, sg->seq);
        const kv_seq *sq = &p->seqs[sg->seq];
        if (sg->pos_list)
            return hkv_seterr(err, HKV_E_INVAL, "sequence %d: a segment of selected positions "
                              "(token-selective propagation, fastkv) needs the tiered KV cache; "
                              "the plain cache stores contiguous positions only", sg->seq);
        if (sg->n < 1 || sg->pos < 0 || sg->pos + sg->n > sq->cap)
            return hkv_seterr(err, HKV_E_CAPACITY, "sequence %d: tokens %lld..%lld exceed its "
                              "context of %lld", sg->seq, (long long)sg->pos,
                              (long long)(sg->pos + sg->n - 1), (long long)sq->cap);
        if (layer == 0 && sg->pos > sq->len)
            return hkv_seterr(err, HKV_E_INVAL, "sequence %d: position %lld leaves a gap after "
                              "%lld stored tokens", sg->seq, (long long)sg->pos,
                              (long long)sq->len);
        n_items += KH * ((sg->n + QTILE - 1) / QTILE);
    }
    /* A segment that rewrites rows of a shared prefix (after a rewind below
     * it) gives its sequence private pages first: the prefix's are read-only. */
    for (int i = 0; i < n_segs; i++) {
        kv_seq *sq = &p->seqs[segs[i].seq];
        int rc;
        if (segs[i].pos < sq->pre_rows && (rc = prefix_unmap(sq, 1, err))) return rc;
    }
    item *items = malloc((size_t)n_items * sizeof *items);
    if (!items) return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d attention items", n_items);
    int it = 0;
    for (int i = 0; i < n_segs; i++)
        for (int h = 0; h < KH; h++)
            for (int q0 = 0; q0 < segs[i].n; q0 += QTILE)
                items[it++] = (item){i, h, q0, segs[i].n - q0 < QTILE ? segs[i].n - q0 : QTILE};

    const hkv_cpu_kernels *kn = p->kern;
    const float scale = 1.0f / sqrtf((float)d);
    /* Append: each segment's K and V rows, as fp16. */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        kv_seq *sq = &p->seqs[sg->seq];
        for (int t = 0; t < sg->n; t++) {
            const float *row = qkv + (sg->row + t) * ld_qkv;
            for (int h = 0; h < KH; h++) {
                int64_t at = (sg->pos + t) * d;
                kn->f32_to_f16(row + (size_t)(H + h) * d, rows_of(p, sq, sq->k, layer, h) + at, d);
                kn->f32_to_f16(row + (size_t)(H + KH + h) * d, rows_of(p, sq, sq->v, layer, h) + at, d);
            }
        }
    }
    /* Per-thread scratch, allocated up front so a failure is reported, not skipped. */
    int nth = omp_get_max_threads();
    size_t per = (size_t)QTILE * g * (2 * d + 1);
    float *scratch = malloc((size_t)nth * per * sizeof(float));
    if (!scratch) {
        free(items);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for attention scratch (%zu floats)",
                          (size_t)nth * per);
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int w = 0; w < n_items; w++) {
        float *qbuf = scratch + (size_t)omp_get_thread_num() * per;
        float *obuf = qbuf + (size_t)QTILE * g * d, *lse = obuf + (size_t)QTILE * g * d;
        const item *I = &items[w];
        const hkv_seg *sg = &segs[I->seg];
        const kv_seq *sq = &p->seqs[sg->seq];
        const uint16_t *K = rows_of(p, sq, sq->k, layer, I->kvh);
        const uint16_t *V = rows_of(p, sq, sq->v, layer, I->kvh);
        /* The g query heads of this KV head are adjacent in the Q row. */
        for (int t = 0; t < I->nq; t++)
            memcpy(qbuf + (size_t)t * g * d,
                   qkv + (sg->row + I->q0 + t) * ld_qkv + (size_t)I->kvh * g * d,
                   (size_t)g * d * sizeof(float));
        int64_t p0 = sg->pos + I->q0;
        if (I->nq == 1)
            kn->attn_dense(qbuf, g, d, K, V, d, p0 + 1, scale, obuf, lse);
        else
            hkv_attn_causal_for(kn)(qbuf, (int64_t)g * d, I->nq, g, d, p0, K, V, d, scale, obuf,
                            (int64_t)g * d, lse);
        for (int t = 0; t < I->nq; t++)
            memcpy(out + (sg->row + I->q0 + t) * ld_out + (size_t)I->kvh * g * d,
                   obuf + (size_t)t * g * d, (size_t)g * d * sizeof(float));
    }
    free(scratch);
    free(items);
    if (layer == p->s.n_layer - 1)
        for (int i = 0; i < n_segs; i++) {
            kv_seq *sq = &p->seqs[segs[i].seq];
            if (segs[i].pos + segs[i].n > sq->len) sq->len = segs[i].pos + segs[i].n;
        }
    return HKV_OK;
}

/* Rows past n are simply overwritten by the next segment. */
static int plain_seq_rewind(void *self, int seq, int64_t n, hkv_err *err) {
    kv_plain *p = self;
    if (seq < 0 || seq >= p->max_seqs || !p->seqs[seq].k)
        return hkv_seterr(err, HKV_E_INVAL, "rewind: sequence %d is not open", seq);
    kv_seq *sq = &p->seqs[seq];
    if (n < 0 || n > sq->len)
        return hkv_seterr(err, HKV_E_RANGE, "rewind of sequence %d to %lld tokens, but it holds %lld",
                          seq, (long long)n, (long long)sq->len);
    sq->len = n;
    return HKV_OK;
}

static void plain_destroy(void *self) {
    kv_plain *p = self;
    if (!p) return;
    for (int i = 0; i < p->max_seqs; i++) plain_seq_close(p, i);
    free(p->seqs);
    free(p);
}

static const hkv_kv_ops plain_ops = {
    .name = "plain",
    .seq_open = plain_seq_open,
    .seq_close = plain_seq_close,
    .seq_copy = plain_seq_copy,
    .seq_share = plain_seq_share,
    .seq_len = plain_seq_len,
    .seq_rewind = plain_seq_rewind,
    .layer_step = plain_layer_step,
    .destroy = plain_destroy,
};

int hkv_kv_plain_create(hkv_kv *kv, const hkv_kv_shape *shape, int max_seqs,
                        const hkv_cpu_kernels *kern, hkv_mem_account *mem, hkv_err *err) {
    if (max_seqs < 1 || max_seqs > 4096)
        return hkv_seterr(err, HKV_E_RANGE, "batch of %d sequences is out of range (1..4096)",
                          max_seqs);
    kv_plain *p = calloc(1, sizeof *p);
    if (!p) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the KV cache");
    p->seqs = calloc((size_t)max_seqs, sizeof *p->seqs);
    if (!p->seqs) {
        free(p);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d sequences", max_seqs);
    }
    p->s = *shape;
    p->max_seqs = max_seqs;
    p->kern = kern;
    p->mem = mem;
    kv->ops = &plain_ops;
    kv->self = p;
    return HKV_OK;
}

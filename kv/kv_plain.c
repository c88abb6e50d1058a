/* The plain KV cache: contiguous fp16 rows per (sequence, layer, KV head),
 * dense causal attention through the host kernels. The baseline every other
 * backend is checked against. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"

typedef struct kv_seq {
    uint16_t *k, *v;      /* [n_layer][n_head_kv][cap][d] each */
    int64_t cap, len;
    size_t bytes;         /* of k and of v together */
} kv_seq;

typedef struct kv_plain {
    hkv_kv_shape s;
    int max_seqs;
    const hkv_cpu_kernels *kern;
    hkv_mem_account *mem;
    kv_seq *seqs;
} kv_plain;

/* Work item of the attention loop: one KV head of one segment, a tile of
 * its queries. */
typedef struct item { int seg, kvh, q0, nq; } item;
#define QTILE 32

static uint16_t *rows_of(const kv_plain *p, const kv_seq *sq, const uint16_t *base, int layer, int kvh) {
    return (uint16_t *)base + (((size_t)layer * p->s.n_head_kv + kvh) * sq->cap) * p->s.head_dim;
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
    size_t half = (size_t)p->s.n_layer * p->s.n_head_kv * (size_t)n_ctx * p->s.head_dim * 2;
    sq->k = hkv_host_alloc(p->mem, HKV_TIER_FAR, half, err);
    if (!sq->k) return HKV_E_NOMEM;
    sq->v = hkv_host_alloc(p->mem, HKV_TIER_FAR, half, err);
    if (!sq->v) {
        hkv_host_free(p->mem, HKV_TIER_FAR, sq->k, half);
        sq->k = NULL;
        return HKV_E_NOMEM;
    }
    sq->cap = n_ctx;
    sq->len = 0;
    sq->bytes = half;
    return HKV_OK;
}

static void plain_seq_close(void *self, int seq) {
    kv_plain *p = self;
    if (seq < 0 || seq >= p->max_seqs) return;
    kv_seq *sq = &p->seqs[seq];
    hkv_host_free(p->mem, HKV_TIER_FAR, sq->k, sq->bytes);
    hkv_host_free(p->mem, HKV_TIER_FAR, sq->v, sq->bytes);
    memset(sq, 0, sizeof *sq);
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
    const size_t row = (size_t)p->s.head_dim * 2, n = (size_t)s->len * row;
    for (int l = 0; l < p->s.n_layer; l++)
        for (int h = 0; h < p->s.n_head_kv; h++) {
            memcpy(rows_of(p, d, d->k, l, h), rows_of(p, s, s->k, l, h), n);
            memcpy(rows_of(p, d, d->v, l, h), rows_of(p, s, s->v, l, h), n);
        }
    d->len = s->len;
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

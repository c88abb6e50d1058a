/* The tiered KV cache: sequences, appends, the near/far split, policies.
 *
 * Layout per (sequence, layer, KV head): near rows [L_init + L_local][d]
 * (sinks, then the ring, slot L_init + (p - L_init) % L_local) and far rows
 * [stride][d] indexed by position (stride: the capacity rounded to whole
 * pages). Every token is written to its far row; a decode token also takes
 * its ring slot. The far tier, what the policies select from, is
 * [L_init, far_hi): at prompt end the last L_local tokens are copied into
 * the ring and far_hi = len - L_local; in decode the token a new one
 * displaces from its slot joins it. Rows stay contiguous per head so every
 * kernel takes (base, stride, row indices) with no page-table indirection;
 * 64-token pages of a head are the transfer unit of the GPU path. The
 * first rows of a sequence may be a prefix shared with others by page
 * mapping (kv_prefix.h, seq_share). Attention is in kv_tiered_attn.c. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kv_tiered_impl.h"

void hkv_tiered_params_default(hkv_tiered_params *p) {
    memset(p, 0, sizeof *p);
    p->L_init = 4;
    p->L_local = 256;
    p->pin_numa_node = -1;
    p->policy = &hkv_policy_full;
    hkv_policy_args_init(p->policy, &p->args);
    p->audit_k = 1024;
}

void tiered_far_view(const tiered *t, const tseq *q, int layer, hkv_far_view *v) {
    v->n_head_kv = t->s.n_head_kv;
    v->head_dim = t->s.head_dim;
    v->lo = t->p.L_init;
    v->hi = q->far_hi[layer] > v->lo ? q->far_hi[layer] : v->lo;
    const size_t at = (size_t)layer * t->s.n_head_kv;
    const int q8 = q->q8;
    v->k = q8 ? NULL : q->kptr + at;
    v->v = q8 ? NULL : q->vptr + at;
    v->k8 = q8 ? q->k8ptr + at : NULL;
    v->v8 = q8 ? q->v8ptr + at : NULL;
    v->ks = q8 ? q->ksptr + at : NULL;
    v->vs = q8 ? q->vsptr + at : NULL;
    v->ld = t->s.head_dim;
    const tsp_list *tl = q->tsp ? &q->tsp[layer] : NULL;
    v->rows = tl && tl->rows ? tl->rows : NULL;
    v->n_rows = v->rows ? tl->n : 0;
    v->rows_end = v->rows ? tl->end : 0;
    v->accel = NULL;
    v->shared_id = q->pre ? hkv_kv_prefix_id(q->pre) : 0;
    v->shared_hi = q->pre ? q->pre_rows : 0;
}

static hkv_policy_env policy_env(const tiered *t, const tseq *q) {
    hkv_policy_env env = {
        .shape = t->s, .n_ctx = q->cap, .L_init = t->p.L_init, .L_local = t->p.L_local,
        .kern = t->kern, .mem = t->mem, .n_threads = omp_get_max_threads(),
        .far_q8 = q->q8,
    };
    return env;
}

int tiered_policy_rebuild(tiered *t, tseq *q, hkv_err *err) {
    return tiered_policy_make(t, q, NULL, 0, err);
}

int tiered_policy_make(tiered *t, tseq *q, const tseq *src, int copy, hkv_err *err) {
    if (q->pol.ops) q->pol.ops->destroy(q->pol.self);
    memset(&q->pol, 0, sizeof q->pol);
    if (q->q8 && q->def->prep == HKV_PREP_TSP)   /* its prompt attends listed rows in place */
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "policy '%s': a token-selective prefill over an "
                          "8-bit far tier (--far-kv q8) is not built; use --far-kv f16",
                          q->def->name);
    hkv_policy_env env = policy_env(t, q);
    int rc = q->def->create(&q->pol, &q->args, &env, err);
    if (rc) {
        memset(&q->pol, 0, sizeof q->pol);
        return hkv_err_prefix(err, "policy '%s'", q->def->name);
    }
    if (!q->prompt_done) return HKV_OK;
    /* (on the device path too: ctkvr keeps the table a shared index reads
     * for the device's mirror, index/ctkvr.c's device_rows) */
    if (src && src->prompt_done && q->pol.ops->fork && src->def == q->def &&
        !memcmp(&src->args, &q->args, sizeof q->args)) {
        hkv_err why;
        hkv_err_clear(&why);
        rc = q->pol.ops->fork(q->pol.self, src->pol.self, src->len, copy, &why);
        if (rc != HKV_E_UNSUPPORTED) {   /* (unsupported: not of these tokens, built below) */
            if (rc && err) *err = why;
            return rc ? hkv_err_prefix(err, "policy '%s', index from sequence %d", q->def->name,
                                       (int)(src - t->seqs))
                      : HKV_OK;
        }
    }
    for (int l = 0; l < t->s.n_layer; l++)
        if ((rc = tiered_prompt_end(t, q, l, q->len, err))) return rc;
    return HKV_OK;
}

int tiered_far_spread(const tiered *t) {
    const int mode = t->p.far_numa;
    return hkv_numa_spread(t->p.numa) &&
           (mode == HKV_FAR_NUMA_SPREAD || (mode == HKV_FAR_NUMA_AUTO && !t->p.pin_far));
}

/* The far rows of sequence slot seq: page-locked when the engine asked for
 * it and a CUDA device is usable, else ordinary host memory as before; on
 * the node --far-numa says (kv_tiered_params.h); FAR is accounted either way. */
static int far_alloc(tiered *t, int seq, hkv_pinned *b, size_t bytes, hkv_err *err) {
    const int mode = t->p.far_numa;
    int node = -1;
    if (tiered_far_spread(t))
        node = t->p.numa->phys[hkv_numa_seq_node(t->p.numa, seq)];
    else if (t->p.pin_far && (mode == HKV_FAR_NUMA_AUTO || mode == HKV_FAR_NUMA_GPU))
        node = t->p.pin_numa_node;
    /* host memory in pages of its own, so a shared prefix can be mapped over
     * it; page-locked by registration on the device path (pinned.h) */
    return hkv_pinned_alloc(b, t->mem, &t->pin, HKV_TIER_FAR, bytes, node,
                            t->p.pin_far ? HKV_PIN_REMAPPABLE : HKV_PIN_MAPPED, err);
}

/* A sequence keeps a near tier unless its policy is full on the host path
 * (no device to mirror it, no audit to compare with it): full attends every
 * position from the far rows in place (kv_tiered_attn.c), so the ring
 * would be a copy nobody reads. Made from the far rows when the policy
 * changes (near_fill). */
static int wants_near(const tiered *t, const tseq *q) {
    return !(q->def == &hkv_policy_full && !t->p.pin_far && !t->p.audit && !q->q8);
}

/* The near tier of (q, layer) from the far rows, as of `end` tokens: the
 * sinks and the ring's positions. */
void tiered_near_from_far(tiered *t, tseq *q, int layer, int64_t end) {
    const int KH = t->s.n_head_kv, d = t->s.head_dim, Li = t->p.L_init, Ll = t->p.L_local;
    const int64_t ring_from = end - Ll > Li ? end - Ll : Li;
    hkv_far_view fv;   /* (an 8-bit far tier's rows come back as fp16) */
    tiered_far_view(t, q, layer, &fv);
    for (int h = 0; h < KH; h++) {
        uint16_t *nk = near_rows(t, q, q->near_k, layer, h), *nv = near_rows(t, q, q->near_v, layer, h);
        for (int64_t p = 0; p < end && p < Li; p++)
            hkv_far_gather16(t->kern, &fv, h, NULL, p, 1, nk + p * d, nv + p * d);
        for (int64_t p = ring_from; p < end; p++) {
            int64_t s = ring_slot(t, p);
            hkv_far_gather16(t->kern, &fv, h, NULL, p, 1, nk + s * d, nv + s * d);
        }
    }
}

/* A near tier for q (open, without one), filled from its far rows. */
static int near_fill(tiered *t, tseq *q, hkv_err *err) {
    const size_t bytes = (size_t)t->s.n_layer * t->s.n_head_kv * t->NR * t->s.head_dim * 2;
    if (!(q->near_k = hkv_host_alloc(t->mem, HKV_TIER_NEAR, bytes, err))) return HKV_E_NOMEM;
    if (!(q->near_v = hkv_host_alloc(t->mem, HKV_TIER_NEAR, bytes, err))) {
        hkv_host_free(t->mem, HKV_TIER_NEAR, q->near_k, bytes);
        q->near_k = NULL;
        return HKV_E_NOMEM;
    }
    q->near_bytes = bytes;
    for (int l = 0; l < t->s.n_layer; l++) tiered_near_from_far(t, q, l, q->len);
    return HKV_OK;
}

static void seq_free(tiered *t, tseq *q) {
    if (q->pol.ops) q->pol.ops->destroy(q->pol.self);
    tiered_prefix_unmap(t, q, 0, NULL);   /* (without keep it cannot fail) */
    hkv_host_free(t->mem, HKV_TIER_NEAR, q->near_k, q->near_bytes);
    hkv_host_free(t->mem, HKV_TIER_NEAR, q->near_v, q->near_bytes);
    hkv_pinned_free(&q->far_kb, t->mem, &t->pin);
    hkv_pinned_free(&q->far_vb, t->mem, &t->pin);
    tiered_queries_unshare(t, q);
    hkv_pinned_free(&q->qh_b, t->mem, NULL);
    free(q->prompt_open);
    free(q->far_hi);
    free(q->fed);
    tiered_tsp_free(t, q);
    free(q->kptr);
    free(q->vptr);
    free(q->k8ptr);
    free(q->v8ptr);
    free(q->ksptr);
    free(q->vsptr);
    memset(q, 0, sizeof *q);
}

static int t_seq_open(void *self, int seq, int64_t n_ctx, hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs)
        return hkv_seterr(err, HKV_E_RANGE, "sequence %d out of range (max %d)", seq, t->max_seqs);
    if (n_ctx < 1 || n_ctx > (int64_t)1 << 31)
        return hkv_seterr(err, HKV_E_RANGE, "context of %lld tokens is out of range",
                          (long long)n_ctx);
    tseq *q = &t->seqs[seq];
    if (q->open) return hkv_seterr(err, HKV_E_INVAL, "sequence %d is already open", seq);
    const hkv_policy_def *def = q->def ? q->def : t->p.policy;
    hkv_policy_args args = q->def ? q->args : t->p.args;
    const int q8_next = q->q8_next;
    memset(q, 0, sizeof *q);
    q->def = def;
    q->args = args;
    q->q8_next = q8_next;
    q->q8 = q8_next < 0 ? t->p.far_q8 : q8_next;
    if (q->q8 && (t->s.head_dim % HKV_Q8_GROUP || t->s.head_dim > HKV_Q8_MAX_D)) {
        q->q8 = 0;
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "sequence %d: an 8-bit far tier takes head sizes "
                          "that are multiples of %d up to %d, not %d", seq, HKV_Q8_GROUP,
                          HKV_Q8_MAX_D, t->s.head_dim);
    }
    q->cap = n_ctx;
    q->stride = hkv_kv_prefix_stride(n_ctx, (size_t)t->s.head_dim * 2);
    q->epoch = ++t->epoch;
    const int L = t->s.n_layer, KH = t->s.n_head_kv, d = t->s.head_dim;
    hkv_policy_env env = policy_env(t, q);
    q->q_keep = t->p.keep_queries;
    if (def->queries_wanted) {
        int64_t w = def->queries_wanted(&args, &env);
        if (w > q->q_keep) q->q_keep = w;
    }
    if (q->q_keep > n_ctx) q->q_keep = n_ctx;
    q->near_bytes = wants_near(t, q) ? (size_t)L * KH * t->NR * d * 2 : 0;
    q->far_bytes = (size_t)L * KH * (size_t)q->stride * hkv_far_row_bytes(d, q->q8);
    q->qh_bytes = (size_t)L * q->q_keep * t->s.n_head * d * 2;
    int rc = HKV_E_NOMEM;
    q->far_kb.node = q->far_vb.node = -1;
    if ((q->near_bytes && !(q->near_k = hkv_host_alloc(t->mem, HKV_TIER_NEAR, q->near_bytes, err))) ||
        (q->near_bytes && !(q->near_v = hkv_host_alloc(t->mem, HKV_TIER_NEAR, q->near_bytes, err))) ||
        far_alloc(t, seq, &q->far_kb, q->far_bytes, err) ||
        far_alloc(t, seq, &q->far_vb, q->far_bytes, err) ||
        (q->qh_bytes && hkv_pinned_alloc(&q->qh_b, t->mem, NULL, HKV_TIER_INDEX, q->qh_bytes, -1,
                                         HKV_PIN_MAPPED, err)))   /* forks map over it: kv_cow.h */
        goto fail;
    q->qh = q->qh_b.p;
    q->far_k = q->far_kb.p;
    q->far_v = q->far_vb.p;
    q->prompt_open = calloc((size_t)L, sizeof *q->prompt_open);
    q->far_hi = calloc((size_t)L, sizeof *q->far_hi);
    q->fed = calloc((size_t)L, sizeof *q->fed);
    q->kptr = calloc((size_t)L * KH, sizeof *q->kptr);
    q->vptr = calloc((size_t)L * KH, sizeof *q->vptr);
    q->k8ptr = calloc((size_t)L * KH, sizeof *q->k8ptr);
    q->v8ptr = calloc((size_t)L * KH, sizeof *q->v8ptr);
    q->ksptr = calloc((size_t)L * KH, sizeof *q->ksptr);
    q->vsptr = calloc((size_t)L * KH, sizeof *q->vsptr);
    if (!q->prompt_open || !q->far_hi || !q->fed || !q->kptr || !q->vptr || !q->k8ptr ||
        !q->v8ptr || !q->ksptr || !q->vsptr) {
        hkv_seterr(err, HKV_E_NOMEM, "no memory for sequence %d's tables", seq);
        goto fail;
    }
    for (int l = 0; l < L; l++)
        for (int h = 0; h < KH; h++) {
            if (q->q8) {
                q->k8ptr[l * KH + h] = far_codes(t, q, q->far_k, l, h);
                q->v8ptr[l * KH + h] = far_codes(t, q, q->far_v, l, h);
                q->ksptr[l * KH + h] = far_scales(t, q, q->far_k, l, h);
                q->vsptr[l * KH + h] = far_scales(t, q, q->far_v, l, h);
                continue;
            }
            q->kptr[l * KH + h] = far_rows(t, q, q->far_k, l, h);
            q->vptr[l * KH + h] = far_rows(t, q, q->far_v, l, h);
        }
    if ((rc = tiered_policy_rebuild(t, q, err))) goto fail;
    q->open = 1;
    return HKV_OK;
fail:
    seq_free(t, q);
    q->def = def;
    q->args = args;
    q->q8_next = q8_next;
    return hkv_err_prefix(err, "opening sequence %d (context %lld)", seq, (long long)n_ctx);
}

static void t_seq_close(void *self, int seq) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs) return;
    tseq *q = &t->seqs[seq];
    const hkv_policy_def *def = q->def;
    hkv_policy_args args = q->args;
    const int q8_next = q->q8_next;
    seq_free(t, q);
    q->def = def;    /* a per-sequence policy choice outlives close/open */
    q->args = args;
    q->q8_next = q8_next;   /* so does its far format */
    q->epoch = ++t->epoch;
}

static int64_t t_seq_len(void *self, int seq) {
    tiered *t = self;
    return seq >= 0 && seq < t->max_seqs && t->seqs[seq].open ? t->seqs[seq].len : 0;
}

static int t_set_policy(void *self, int seq, const hkv_policy_def *def, const hkv_policy_args *a,
                        hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs)
        return hkv_seterr(err, HKV_E_RANGE, "sequence %d out of range", seq);
    tseq *q = &t->seqs[seq];
    if (q->open && q->tsp && def->prep != HKV_PREP_TSP)
        return hkv_seterr(err, HKV_E_INVAL, "sequence %d was prefilled with token-selective "
                          "propagation (its later layers hold the propagated tokens only); policy "
                          "'%s' would read tokens that were never computed: prefill it again",
                          seq, def->name);
    q->def = def;
    q->args = *a;
    if (!q->open) return HKV_OK;
    int rc;
    if (!q->near_k && wants_near(t, q) && (rc = near_fill(t, q, err))) return rc;
    memset(&q->audit, 0, sizeof q->audit);
    q->epoch = ++t->epoch;   /* a device mirror of the old policy's index is stale */
    return tiered_policy_rebuild(t, q, err);
}

/* The last min(q_keep, end) queries as one contiguous block, for prompt end. */
int tiered_prompt_end(tiered *t, tseq *q, int layer, int64_t end, hkv_err *err) {
    const int d = t->s.head_dim, Li = t->p.L_init, Ll = t->p.L_local;
    int64_t ring_from = end - Ll > Li ? end - Ll : Li;
    if (q->near_k) tiered_near_from_far(t, q, layer, end);
    q->far_hi[layer] = ring_from;
    q->prompt_open[layer] = 0;
    q->prompt_done = 1;
    /* Linearise the query ring: the last n queries in position order. */
    hkv_query_view qv = {0};
    uint16_t *lin = NULL;
    const size_t qrow = (size_t)t->s.n_head * d;
    if (q->q_keep > 0 && end > 0) {
        int64_t n = end < q->q_keep ? end : q->q_keep;
        lin = malloc((size_t)n * qrow * 2);
        if (!lin) return hkv_seterr(err, HKV_E_NOMEM, "no memory for %lld prompt queries", (long long)n);
        const uint16_t *ring = q->qh + (size_t)layer * q->q_keep * qrow;
        for (int64_t i = 0; i < n; i++) {
            int64_t p = end - n + i;
            memcpy(lin + i * qrow, ring + (size_t)(p % q->q_keep) * qrow, qrow * 2);
        }
        qv = (hkv_query_view){.n = n, .pos0 = end - n, .q = lin, .ld = (int64_t)qrow};
    }
    hkv_far_view fv;
    tiered_far_view(t, q, layer, &fv);
    hkv_far_accel acc = t->accel;
    acc.seq = (int)(q - t->seqs);
    if (acc.top_lists || acc.window_scores) fv.accel = &acc;
    int rc = q->pol.ops->prefill_end(q->pol.self, layer, &fv, &qv, err);
    free(lin);
    return rc ? hkv_err_prefix(err, "policy '%s' at prompt end, layer %d", q->def->name, layer) : HKV_OK;
}

/* Keep query rows of a segment in the ring (fp16). */
static void keep_queries(tiered *t, tseq *q, int layer, const hkv_seg *sg, const float *qkv,
                         int64_t ld_qkv) {
    if (!q->q_keep) return;
    const size_t qrow = (size_t)t->s.n_head * t->s.head_dim;
    uint16_t *ring = q->qh + (size_t)layer * q->q_keep * qrow;
    int64_t first = sg->n > q->q_keep ? sg->n - q->q_keep : 0;
    q->qh_dirty = 1;
    for (int64_t i = first; i < sg->n; i++)
        t->kern->f32_to_f16(qkv + (sg->row + i) * ld_qkv,
                            ring + (size_t)(seg_pos(sg, i) % q->q_keep) * qrow, (int64_t)qrow);
}

static int append_segment(tiered *t, int layer, const hkv_seg *sg, const float *qkv,
                          int64_t ld_qkv, hkv_err *err) {
    tseq *q = &t->seqs[sg->seq];
    const int H = t->s.n_head, KH = t->s.n_head_kv, d = t->s.head_dim;
    const hkv_cpu_kernels *kn = t->kern;
    int prompt = (sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1;
    int rc;
    if (prompt) {
        q->prompt_open[layer] = 1;   /* (decode rows are in the far rows already) */
        if ((rc = tiered_tsp_note(t, q, layer, sg, err))) return rc;
        for (int i = 0; i < sg->n; i++) {
            const float *row = qkv + (sg->row + i) * ld_qkv;
            int64_t p = seg_pos(sg, i);
            for (int h = 0; h < KH; h++) {
                far_store(t, q, q->far_k, layer, h, p, row + (size_t)(H + h) * d);
                far_store(t, q, q->far_v, layer, h, p, row + (size_t)(H + KH + h) * d);
            }
        }
        keep_queries(t, q, layer, sg, qkv, ld_qkv);
        q->fed[layer] = seg_pos(sg, sg->n - 1) + 1;
        return HKV_OK;   /* prompt end runs after attention */
    }
    if (q->prompt_open[layer] && (rc = tiered_prompt_end(t, q, layer, sg->pos, err))) return rc;
    const int64_t p = sg->pos;
    const float *row = qkv + sg->row * ld_qkv;
    int64_t slot = p < t->p.L_init ? p : ring_slot(t, p);
    if (p >= (int64_t)t->p.L_init + t->p.L_local) {
        /* The ring slot's token, position p - L_local, joins the far tier
         * (its far row was written with it). */
        int64_t old = p - t->p.L_local;
        q->far_hi[layer] = old + 1;
        hkv_far_view fv;
        tiered_far_view(t, q, layer, &fv);
        q->pol.ops->on_far_append(q->pol.self, layer, &fv);
    }
    /* Every token is written to its far row as well as its near slot: the
     * far rows then hold every position below the length, which full
     * attention reads in place (kv_tiered_attn.c) and a prompt that
     * continues a decoded sequence finds there. */
    /* (An 8-bit far tier's row is its codes; the near slot keeps the fp16
     * row, as the device's mirror appends it.) */
    for (int h = 0; h < KH; h++) {
        far_store(t, q, q->far_k, layer, h, p, row + (size_t)(H + h) * d);
        far_store(t, q, q->far_v, layer, h, p, row + (size_t)(H + KH + h) * d);
        if (!q->near_k) continue;
        kn->f32_to_f16(row + (size_t)(H + h) * d, near_rows(t, q, q->near_k, layer, h) + slot * d, d);
        kn->f32_to_f16(row + (size_t)(H + KH + h) * d, near_rows(t, q, q->near_v, layer, h) + slot * d, d);
    }
    keep_queries(t, q, layer, sg, qkv, ld_qkv);
    return HKV_OK;
}

static int layer_step(tiered *t, int layer, const hkv_seg *segs, int n_segs, const float *qkv,
                      int64_t ld_qkv, float *out, int64_t ld_out, float *lse_out,
                      const hkv_recall_rows *rec, hkv_err *err) {
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if (sg->seq < 0 || sg->seq >= t->max_seqs || !t->seqs[sg->seq].open)
            return hkv_seterr(err, HKV_E_INVAL, "segment %d names sequence %d, which is not open",
                              i, sg->seq);
        const tseq *q = &t->seqs[sg->seq];
        if (sg->n < 1 || sg->pos < 0 || seg_pos(sg, sg->n - 1) >= q->cap)
            return hkv_seterr(err, HKV_E_CAPACITY, "sequence %d: tokens %lld..%lld exceed its "
                              "context of %lld", sg->seq, (long long)sg->pos,
                              (long long)seg_pos(sg, sg->n - 1), (long long)q->cap);
        /* A prompt may be fed to the layers at different times (a staged
         * prefill, runtime/tsp_prefill.c): while it is open in this layer the
         * next rows continue what this layer received. */
        int64_t expect = q->prompt_open[layer] ? q->fed[layer] : q->len;
        if (sg->pos_list) {
            if (!(sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->pos != sg->pos_list[0] ||
                sg->pos < expect)
                return hkv_seterr(err, HKV_E_INVAL, "sequence %d: a segment of selected positions "
                                  "must be a prompt segment starting at or after position %lld "
                                  "with pos == pos_list[0]", sg->seq, (long long)expect);
            for (int64_t r = 1; r < sg->n; r++)
                if (sg->pos_list[r] <= sg->pos_list[r - 1])
                    return hkv_seterr(err, HKV_E_INVAL, "sequence %d: selected positions are not "
                                      "strictly ascending at row %lld", sg->seq, (long long)r);
        } else if (sg->pos != expect)
            return hkv_seterr(err, HKV_E_INVAL, "sequence %d: segment at position %lld, but %lld "
                              "tokens are stored (the tiered cache appends in order)", sg->seq,
                              (long long)sg->pos, (long long)expect);
        if ((sg->flags & HKV_SEG_STORE_ONLY) &&
            (!lse_out || !(sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->pos_list))
            return hkv_seterr(err, HKV_E_INVAL, "sequence %d: a store-only segment must be a prompt "
                              "segment of consecutive positions in a far-only layer step", sg->seq);
        for (int j = 0; j < i; j++)
            if (segs[j].seq == sg->seq)
                return hkv_seterr(err, HKV_E_INVAL, "sequence %d appears twice in one batch", sg->seq);
    }
    int rc = HKV_OK;
    hkv_err local;
    hkv_err_clear(&local);
    /* A decode batch's rows are a few KB each: copying them costs less than
     * waking the team (tens of us when its threads sleep between layers, as
     * under the CUDA pipeline's deferred host steps); prompts go wide. */
    int64_t rows = 0;
    for (int i = 0; i < n_segs; i++) rows += segs[i].n;
#pragma omp parallel for schedule(dynamic, 1) if (rows > HKV_TIERED_SERIAL_ROWS)
    for (int i = 0; i < n_segs; i++) {
        hkv_err e1;
        hkv_err_clear(&e1);
        if (append_segment(t, layer, &segs[i], qkv, ld_qkv, &e1) != HKV_OK) {
#pragma omp critical(hkv_tiered_err)
            if (!rc) {
                rc = e1.code;
                local = e1;
            }
        }
    }
    if (rc) {
        if (err) *err = local;
        return rc;
    }
    if ((rc = tiered_attend(t, layer, segs, n_segs, qkv, ld_qkv, out, ld_out, lse_out, rec, err)))
        return rc;
    for (int i = 0; i < n_segs; i++) {
        tseq *q = &t->seqs[segs[i].seq];
        const int64_t end = seg_pos(&segs[i], segs[i].n - 1) + 1;
        if ((segs[i].flags & HKV_SEG_PROMPT_END) && (rc = tiered_prompt_end(t, q, layer, end, err)))
            return rc;
        if (layer == t->s.n_layer - 1) q->len = end;
    }
    return HKV_OK;
}

static int t_layer_step(void *self, int layer, const hkv_seg *segs, int n_segs, const float *qkv,
                        int64_t ld_qkv, float *out, int64_t ld_out, hkv_err *err) {
    return layer_step(self, layer, segs, n_segs, qkv, ld_qkv, out, ld_out, NULL, NULL, err);
}

static int t_layer_step_far(void *self, int layer, const hkv_seg *segs, int n_segs,
                            const float *qkv, int64_t ld_qkv, float *out, int64_t ld_out,
                            float *lse, const hkv_recall_rows *rec, hkv_err *err) {
    tiered *t = self;
    if (t->p.audit)   /* the audit compares with the near partial, which the caller computes */
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "the attention audit runs on the host path only");
    if (!lse) return hkv_seterr(err, HKV_E_INVAL, "far-only layer step without an lse buffer");
    return layer_step(t, layer, segs, n_segs, qkv, ld_qkv, out, ld_out, lse, rec, err);
}

static void t_destroy(void *self) {
    tiered *t = self;
    if (!t) return;
    for (int i = 0; i < t->max_seqs; i++) seq_free(t, &t->seqs[i]);
    hkv_host_free(t->mem, HKV_TIER_WORKSPACE, t->scratch, t->scratch_bytes);
    hkv_host_free(t->mem, HKV_TIER_WORKSPACE, t->split, t->split_bytes);
    hkv_score_team_free(&t->team);
    free(t->seqs);
    free(t);
}

/* The far tier's table (kv_far.h); its functions below and in
 * kv_tiered_lookahead.c, kv_tiered_tsp.c. */
static void t_near_window(const void *self, hkv_near_window *w);
static int t_near(void *self, int seq, int layer, const uint16_t **k, const uint16_t **v, int *rows,
                  hkv_err *err);
static int t_far(void *self, int seq, int layer, hkv_far_view *far, hkv_err *err);

static int t_seq_far_q8(const void *self, int seq) {
    const tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs) return 0;
    const tseq *q = &t->seqs[seq];
    return q->open ? q->q8 : q->q8_next < 0 ? t->p.far_q8 : q->q8_next;
}

static int t_set_far_q8(void *self, int seq, int q8, hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs || q8 < -1 || q8 > 1)
        return hkv_seterr(err, HKV_E_RANGE, "far format %d of sequence %d out of range", q8, seq);
    if (t->seqs[seq].open)
        return hkv_seterr(err, HKV_E_INVAL, "sequence %d is open: its far tier's format is set "
                          "before seq_open", seq);
    t->seqs[seq].q8_next = q8;
    return HKV_OK;
}
static uint64_t t_seq_epoch(const void *self, int seq);
static void t_set_accel(void *self, const hkv_far_accel *a);

static int t_prompt_end(void *self, int seq, hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs || !t->seqs[seq].open)
        return hkv_seterr(err, HKV_E_INVAL, "prompt end: sequence %d is not open", seq);
    tseq *q = &t->seqs[seq];
    int rc;
    for (int l = 0; l < t->s.n_layer; l++)
        if ((rc = tiered_prompt_end(t, q, l, q->len, err))) return rc;
    q->epoch = ++t->epoch;   /* the near tier was made again */
    return HKV_OK;
}

static const hkv_kv_far_ops tiered_far_ops = {
    .near_window = t_near_window,
    .near = t_near,
    .far = t_far,
    .seq_epoch = t_seq_epoch,
    .seq_policy = tiered_seq_policy,
    .set_policy = t_set_policy,
    .seq_instance = tiered_seq_instance,
    .set_accel = t_set_accel,
    .lookahead_end = tiered_lookahead_end,
    .prompt_view = tiered_prompt_view,
    .prompt_end = t_prompt_end,
    .seq_far_q8 = t_seq_far_q8,
    .set_far_q8 = t_set_far_q8,
};

static const hkv_kv_ops tiered_ops = {
    .name = "tiered",
    .seq_open = t_seq_open,
    .seq_close = t_seq_close,
    .seq_copy = tiered_seq_copy,
    .seq_share = tiered_seq_share,
    .seq_len = t_seq_len,
    .seq_rewind = tiered_seq_rewind,
    .layer_step = t_layer_step,
    .layer_step_far = t_layer_step_far,
    .destroy = t_destroy,
    .far = &tiered_far_ops,
};

int hkv_kv_is_tiered(const hkv_kv *kv) { return kv && kv->ops == &tiered_ops; }

int hkv_kv_tiered_create(hkv_kv *kv, const hkv_kv_shape *shape, int max_seqs,
                         const hkv_tiered_params *p, const hkv_cpu_kernels *kern,
                         hkv_mem_account *mem, hkv_err *err) {
    if (max_seqs < 1 || max_seqs > 4096)
        return hkv_seterr(err, HKV_E_RANGE, "batch of %d sequences is out of range (1..4096)", max_seqs);
    if (p->L_init < 0 || p->L_init > (1 << 20))
        return hkv_seterr(err, HKV_E_RANGE, "sink tokens %d out of range (0..%d)", p->L_init, 1 << 20);
    if (p->L_local < 1 || p->L_local > (1 << 22))
        return hkv_seterr(err, HKV_E_RANGE, "local window %d out of range (1..%d)", p->L_local, 1 << 22);
    if (!p->policy) return hkv_seterr(err, HKV_E_INVAL, "no policy given");
    if (p->far_q8 && (shape->head_dim % HKV_Q8_GROUP || shape->head_dim > HKV_Q8_MAX_D))
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "an 8-bit far tier takes head sizes that are "
                          "multiples of %d up to %d, not %d", HKV_Q8_GROUP, HKV_Q8_MAX_D,
                          shape->head_dim);
    if (p->keep_queries < 0 || p->audit_k < 1)
        return hkv_seterr(err, HKV_E_RANGE, "bad query-keep or audit-k setting");
    tiered *t = calloc(1, sizeof *t);
    if (!t) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the tiered cache");
    t->seqs = calloc((size_t)max_seqs, sizeof *t->seqs);
    if (!t->seqs) {
        free(t);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d sequences", max_seqs);
    }
    for (int i = 0; i < max_seqs; i++) t->seqs[i].q8_next = -1;   /* the cache's format */
    t->s = *shape;
    t->p = *p;
    t->NR = p->L_init + p->L_local;
    t->max_seqs = max_seqs;
    t->kern = kern;
    t->mem = mem;
    kv->ops = &tiered_ops;
    kv->self = t;
    return HKV_OK;
}

int hkv_kv_tiered_set_audit(hkv_kv *kv, int on, int64_t k, hkv_err *err) {
    if (!hkv_kv_is_tiered(kv)) return hkv_seterr(err, HKV_E_INVAL, "the audit needs the tiered KV cache");
    if (k < 1) return hkv_seterr(err, HKV_E_RANGE, "audit top-k %lld is out of range", (long long)k);
    tiered *t = kv->self;
    t->p.audit = on != 0;
    t->p.audit_k = k;
    return HKV_OK;
}

void hkv_kv_tiered_audit_get(hkv_kv *kv, int seq, hkv_tiered_audit *out) {
    memset(out, 0, sizeof *out);
    if (!hkv_kv_is_tiered(kv)) return;
    tiered *t = kv->self;
    if (seq >= 0 && seq < t->max_seqs) *out = t->seqs[seq].audit;
}

void hkv_kv_tiered_audit_reset(hkv_kv *kv, int seq) {
    if (!hkv_kv_is_tiered(kv)) return;
    tiered *t = kv->self;
    if (seq >= 0 && seq < t->max_seqs) memset(&t->seqs[seq].audit, 0, sizeof t->seqs[seq].audit);
}

void hkv_kv_tiered_pinned(hkv_kv *kv, hkv_pinned_account *out) {
    memset(out, 0, sizeof *out);
    if (hkv_kv_is_tiered(kv)) *out = ((tiered *)kv->self)->pin;
}

static void t_near_window(const void *self, hkv_near_window *w) {
    const tiered *t = self;
    w->L_init = t->p.L_init;
    w->L_local = t->p.L_local;
}

static int t_near(void *self, int seq, int layer, const uint16_t **k, const uint16_t **v, int *rows,
                  hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs || !t->seqs[seq].open || layer < 0 || layer >= t->s.n_layer)
        return hkv_seterr(err, HKV_E_RANGE, "near tier of sequence %d, layer %d: not open or out "
                          "of range", seq, layer);
    tseq *q = &t->seqs[seq];
    if (!q->near_k)
        return hkv_seterr(err, HKV_E_INVAL, "sequence %d keeps no near tier (full on the host path "
                          "reads every row from the far tier)", seq);
    *k = near_rows(t, q, q->near_k, layer, 0);
    *v = near_rows(t, q, q->near_v, layer, 0);
    *rows = t->NR;
    return HKV_OK;
}

static int t_far(void *self, int seq, int layer, hkv_far_view *far, hkv_err *err) {
    tiered *t = self;
    if (seq < 0 || seq >= t->max_seqs || !t->seqs[seq].open || layer < 0 || layer >= t->s.n_layer)
        return hkv_seterr(err, HKV_E_RANGE, "far tier of sequence %d, layer %d: not open or out "
                          "of range", seq, layer);
    tiered_far_view(t, &t->seqs[seq], layer, far);
    return HKV_OK;
}

uint64_t hkv_kv_tiered_bytes_read(const hkv_kv *kv) {
    if (!hkv_kv_is_tiered(kv)) return 0;
    const tiered *t = kv->self;
    uint64_t v;
    __atomic_load(&t->bytes_read, &v, __ATOMIC_RELAXED);
    return v;
}

static uint64_t t_seq_epoch(const void *self, int seq) {
    const tiered *t = self;
    return seq >= 0 && seq < t->max_seqs ? t->seqs[seq].epoch : 0;
}

void hkv_kv_tiered_describe(hkv_kv *kv, int seq, char *buf, size_t cap) {
    if (cap) buf[0] = 0;
    if (!hkv_kv_is_tiered(kv)) return;
    tiered *t = kv->self;
    if (seq < 0 || seq >= t->max_seqs || !t->seqs[seq].open) return;
    tseq *q = &t->seqs[seq];
    if (q->pol.ops && q->pol.ops->describe) q->pol.ops->describe(q->pol.self, buf, cap);
    else snprintf(buf, cap, "%s", q->def->name);
}

static void t_set_accel(void *self, const hkv_far_accel *a) {
    tiered *t = self;
    if (a) t->accel = *a;
    else memset(&t->accel, 0, sizeof t->accel);
}

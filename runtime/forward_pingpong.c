/* Micro-batch ping-pong (docs/PIPELINE.md, "Micro-batch ping-pong"): a decode
 * batch split in two halves A and B, each half's attention begun on the
 * device (QKV down, recall, near attention queued) and ended later (the
 * host's far part, the merge), so that while the host attends one half's far
 * tier the device runs the other half's products:
 *
 *   host  : end(l,A) [far A]  queue A: O, MLP, QKV(l+1), begin(l+1,A)   end(l,B) [far B] ...
 *   device:   B: O, MLP, QKV(l+1) ...           near(l+1,A)  A's products ...
 *
 * Each half's weights are read once per layer for its rows, so the products
 * cost up to twice (GEMV-bound decode) what one batch's do: it pays when the
 * host's far part and the device's dense part are both large. The backend
 * offers it (attention_begin / attention_end / row_base) only when asked
 * (hkv_cuda_params.pingpong, `--gpu-pingpong`). */
#include <stdlib.h>

#include "engine.h"

typedef struct half {
    int64_t r0, n;
    hkv_seg *segs;
    int n_segs;
    int pending;   /* the last residual not yet added (fused with the next norm) */
} half;

/* Layer l's start for half h: norm, QKV, RoPE, the attention begun. */
static int pre(hkv_engine *e, half *h, int mb, int l, double *t_mm, hkv_err *err) {
    const hkv_backend_ops *o = e->be.ops;
    void *b = e->be.self;
    int rc;
    if ((rc = o->row_base(b, h->r0, err)) ||
        (rc = h->pending ? hkv_forward_add_norm(o, b, h->n, l, HKV_WR_ATTN_NORM, err)
                         : o->rmsnorm(b, HKV_ACT_XN, HKV_ACT_X, NULL, h->n, l, HKV_WR_ATTN_NORM, err)))
        return rc;
    h->pending = 0;
    double ts = hkv_now();
    if ((rc = o->matmul(b, HKV_ACT_QKV, HKV_ACT_XN, h->n, l, HKV_WR_QKV, err))) return rc;
    *t_mm += hkv_now() - ts;
    if ((rc = o->bias_rope(b, l, e->pos + h->r0, h->n, err))) return rc;
    if ((rc = o->attention_begin(b, mb, l, h->segs, h->n_segs, h->r0, h->n, err)))
        return hkv_err_prefix(err, "layer %d attention (micro-batch %d)", l, mb);
    return HKV_OK;
}

/* Layer l's rest for half h: the attention ended, O, the MLP. */
static int post(hkv_engine *e, half *h, int mb, int l, int last, double *t_mm, double *t_att,
                hkv_err *err) {
    const hkv_backend_ops *o = e->be.ops;
    void *b = e->be.self;
    int rc;
    double ts = hkv_now();
    if ((rc = o->row_base(b, h->r0, err))) return rc;
    if ((rc = o->attention_end(b, mb, err)))
        return hkv_err_prefix(err, "layer %d attention (micro-batch %d)", l, mb);
    *t_att += hkv_now() - ts;
    ts = hkv_now();
    if ((rc = o->matmul(b, HKV_ACT_TMP, HKV_ACT_ATT, h->n, l, HKV_WR_WO, err)) ||
        (rc = hkv_forward_add_norm(o, b, h->n, l, HKV_WR_FFN_NORM, err)) ||
        (rc = o->matmul(b, HKV_ACT_GU, HKV_ACT_XN, h->n, l, HKV_WR_FFN_IN, err)) ||
        (rc = o->swiglu(b, h->n, err)) ||
        (rc = o->matmul(b, HKV_ACT_TMP, HKV_ACT_G, h->n, l, HKV_WR_DOWN, err)))
        return rc;
    *t_mm += hkv_now() - ts;
    if (o->add_rmsnorm && !last)
        h->pending = 1;
    else if ((rc = o->add(b, HKV_ACT_X, HKV_ACT_TMP, h->n, err)))
        return rc;
    return HKV_OK;
}

int hkv_forward_pingpong_ok(const hkv_engine *e, int64_t n_rows, const hkv_seg *segs, int n_segs) {
    const hkv_backend_ops *o = e->be.ops;
    if (!o->attention_begin || !o->attention_end || !o->row_base || n_rows < 2 || n_segs != n_rows)
        return 0;
    for (int i = 0; i < n_segs; i++)   /* decode rows only, one per sequence */
        if (segs[i].n != 1 || segs[i].pos_list ||
            (segs[i].flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END | HKV_SEG_STORE_ONLY)) ||
            segs[i].row < 0 || segs[i].row >= n_rows)
            return 0;
    return 1;
}

int hkv_forward_layers_pingpong(hkv_engine *e, int l0, int l1, int64_t n_rows, const hkv_seg *segs,
                                int n_segs, hkv_err *err) {
    const hkv_backend_ops *o = e->be.ops;
    void *b = e->be.self;
    half hv[2] = {{.r0 = 0, .n = (n_rows + 1) / 2}, {.r0 = (n_rows + 1) / 2}};
    hv[1].n = n_rows - hv[0].n;
    hkv_seg *all = malloc((size_t)n_segs * sizeof *all);
    if (!all) return hkv_seterr(err, HKV_E_NOMEM, "no memory for %d micro-batch segments", n_segs);
    hv[0].segs = all, hv[1].segs = all + hv[0].n;
    for (int i = 0; i < n_segs; i++) {   /* each half's segments, rows as in the batch */
        half *h = &hv[segs[i].row >= hv[1].r0];
        h->segs[h->n_segs++] = segs[i];
    }
    double t_mm = 0, t_att = 0;
    int rc = HKV_OK;
    for (int mb = 0; mb < 2 && !rc; mb++) rc = pre(e, &hv[mb], mb, l0, &t_mm, err);
    for (int l = l0; l < l1 && !rc; l++)
        for (int mb = 0; mb < 2 && !rc; mb++) {
            rc = post(e, &hv[mb], mb, l, l + 1 == l1, &t_mm, &t_att, err);
            if (!rc && l + 1 < l1) rc = pre(e, &hv[mb], mb, l + 1, &t_mm, err);
        }
    if (rc)   /* the other half's begun step: ended (or dropped) before the segments go */
        for (int mb = 0; mb < 2; mb++) o->attention_end(b, mb, NULL);
    int rc2 = o->row_base(b, 0, rc ? NULL : err);
    if (!rc) rc = rc2;
    free(all);
    e->stats.matmul += t_mm;
    e->stats.attn += t_att;
    return rc;
}

/* The device part of a selection policy in the pipeline: recall on the
 * device, the rest of select on the host (index/policy.h, recall_table and
 * select_recalled; ctkvr's centroid recall is the one today).
 *
 * The policy's table (ctkvr: C unit query centroids per layer) is mirrored
 * in one device arena [sequence][layer][C][n_head][d] fp16. Each decode step,
 * per layer, before the host needs it:
 *   host  : ask each decode row's policy what changed (recall_table): a new
 *           version (prompt end) uploads the layer's table whole; otherwise
 *           the slots select rewrote last step (DCU: one per KV head) and
 *           every FIFO go up in one copy from a page-locked region and are
 *           scattered into the arena;
 *   device: top-k cosine recall per (row, KV head) (gpu/recall_top.cu); the
 *           slots and scores come down with the QKV rows;
 *   host  : select_recalled unions the recalled lists, adds the tail and
 *           reranks (the IVF lists stay in host memory: they are read there).
 * The host's table stays the one the policy owns and updates; the device's
 * is a byte-exact copy, so the recall scores the same rows. */
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"

/* Bytes of one layer's update region: offsets, FIFOs, descriptors, rows. */
static size_t up_layout(const cuda_be *b, size_t *o_off_rows, size_t *o_off_fifo, size_t *o_fifo,
                        size_t *o_desc, size_t *o_rows) {
    const size_t S = (size_t)b->max_seqs, KH = (size_t)b->KH, gd = (size_t)(b->H / b->KH) * b->d;
    size_t o = 0;
    *o_off_rows = o, o += S * KH * 8;
    *o_off_fifo = o, o += S * 8;
    *o_fifo = o, o += S * KH * 2 * 4;
    o = (o + 15) & ~(size_t)15;
    *o_desc = o, o += S * sizeof(hkv_gpu_recall_row);
    *o_rows = o, o += S * KH * gd * 2;
    return (o + 63) & ~(size_t)63;
}

int cb_recall_create(cuda_be *b, hkv_err *err) {
    cb_recall *r = &b->rc;
    const size_t S = (size_t)b->max_seqs, R = (size_t)b->max_rows;
    size_t a, c, d, e, f;
    r->up_bytes = up_layout(b, &a, &c, &d, &e, &f);
    int rc = hkv_pinned_alloc(&r->h_up, &b->e->mem, NULL, HKV_TIER_WORKSPACE,
                              (size_t)b->NL * r->up_bytes, -1, HKV_PIN_REQUIRE, err);
    if (rc) return hkv_err_prefix(err, "page-locked updates of the device recall tables");
    if (!(r->d_up = cb_alloc(b, HKV_TIER_WORKSPACE, r->up_bytes, err)))
        return hkv_err_prefix(err, "device recall table updates");
    if (!(r->up_ev = calloc((size_t)b->NL, sizeof *r->up_ev)) ||
        !(r->epoch = calloc(S * b->NL, sizeof *r->epoch)) ||
        !(r->ver = calloc(S * b->NL, sizeof *r->ver)) || !(r->has = calloc(R, 1)) ||
        !(r->dirty = malloc(S * b->KH * sizeof *r->dirty)) ||
        !(r->tab = malloc(S * sizeof *r->tab)) || !(r->seg = malloc(S * sizeof *r->seg)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the recall mirror's tables");
    for (int l = 0; l < b->NL; l++)
        if ((rc = hkv_gpu_event_create(&r->up_ev[l], err))) return rc;
    return HKV_OK;
}

static void free_arena(cuda_be *b) {
    cb_recall *r = &b->rc;
    const size_t out = (size_t)b->max_rows * b->KH * r->k;
    hkv_gpu_free_async(b->ctx, HKV_TIER_INDEX, r->rows, r->rows_bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_INDEX, r->fifo, r->fifo_bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, r->ws, r->ws_bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, r->d_slot, out * 4, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, r->d_score, out * 4, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, r->d_n, (size_t)b->max_rows * b->KH * 4, b->st);
    hkv_pinned_free(&r->h_out, &b->e->mem, NULL);
    r->rows = NULL, r->fifo = NULL, r->ws = NULL, r->d_slot = NULL, r->d_n = NULL;
    r->d_score = NULL;
    r->C = r->k = 0;
}

void cb_recall_destroy(cuda_be *b) {
    cb_recall *r = &b->rc;
    if (r->C) free_arena(b);
    hkv_pinned_free(&r->h_up, &b->e->mem, NULL);
    for (int l = 0; r->up_ev && l < b->NL; l++) hkv_gpu_event_destroy(r->up_ev[l]);
    free(r->up_ev);
    free(r->epoch);
    free(r->ver);
    free(r->has);
    free(r->dirty);
    free(r->tab);
    free(r->seg);
}

/* An arena of at least C slots per table and k outputs per (row, KV head):
 * grown by reallocation (every mirror then uploads again). Device memory is
 * stream-ordered (the first table, inside the step that first recalls,
 * waits for nothing); a later growth waits for the stream once, since the
 * page-locked output buffer the device may still be writing is freed. */
static int ensure_arena(cuda_be *b, int64_t C, int64_t k, hkv_err *err) {
    cb_recall *r = &b->rc;
    if (C <= r->C && k <= r->k) return HKV_OK;
    if (C < r->C) C = r->C;
    if (k < r->k) k = r->k;
    int rc;
    if (r->C) {   /* the device may still read the old arena; the other micro-batch's
                     host step the page-locked results */
        if ((rc = cb_settle_halves(b, err)) || (rc = hkv_gpu_sync(b->st, err))) return rc;
        free_arena(b);
    }
    memset(r->ver, 0, (size_t)b->max_seqs * b->NL * sizeof *r->ver);
    const size_t S = (size_t)b->max_seqs, R = (size_t)b->max_rows, KH = (size_t)b->KH;
    const size_t out = R * KH * (size_t)k;
    r->rows_bytes = S * b->NL * (size_t)C * b->H * b->d * 2;
    r->fifo_bytes = S * b->NL * KH * 2 * 4;
    r->ws_bytes = hkv_gpu_recall_top_ws_bytes((int64_t)S, b->KH, C);
    if (!(r->rows = hkv_gpu_alloc_async(b->ctx, HKV_TIER_INDEX, r->rows_bytes, b->st, err)) ||
        !(r->fifo = hkv_gpu_alloc_async(b->ctx, HKV_TIER_INDEX, r->fifo_bytes, b->st, err)) ||
        !(r->ws = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, r->ws_bytes, b->st, err)) ||
        !(r->d_slot = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, out * 4, b->st, err)) ||
        !(r->d_score = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, out * 4, b->st, err)) ||
        !(r->d_n = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, R * KH * 4, b->st, err)) ||
        (rc = hkv_pinned_alloc(&r->h_out, &b->e->mem, NULL, HKV_TIER_WORKSPACE,
                               out * 8 + R * KH * 4, -1, HKV_PIN_REQUIRE, err))) {
        int code = err ? err->code : HKV_E_NOMEM;
        r->C = C, r->k = k;   /* free_arena frees what was allocated with these sizes */
        free_arena(b);
        hkv_err_prefix(err, "device recall tables of %lld slots for %d sequences x %d layers",
                       (long long)C, b->max_seqs, b->NL);
        return code;
    }
    r->C = C, r->k = k;
    return HKV_OK;
}

int cb_recall_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t r0, int64_t n,
                   hkv_err *err) {
    cb_recall *r = &b->rc;
    hkv_kv *kv = &b->e->kv;
    const int NL = b->NL, KH = b->KH, H = b->H, d = b->d, g = H / KH;
    const size_t gd = (size_t)g * d;
    size_t o_offr, o_offf, o_fifo, o_desc, o_rows;
    up_layout(b, &o_offr, &o_offf, &o_fifo, &o_desc, &o_rows);
    char *up = (char *)r->h_up.p + (size_t)layer * r->up_bytes;
    int rc;
    r->n_desc = 0;
    memset(r->has + r0, 0, (size_t)n);
    /* This layer's region was last read by the copy of the previous step. */
    if ((rc = hkv_gpu_event_sync(r->up_ev[layer], err))) return rc;
    int64_t *off_rows = (int64_t *)(up + o_offr), *off_fifo = (int64_t *)(up + o_offf);
    int32_t *fifo = (int32_t *)(up + o_fifo);
    hkv_gpu_recall_row *desc = (hkv_gpu_recall_row *)(up + o_desc);
    uint16_t *rows = (uint16_t *)(up + o_rows);
    /* The policies' tables first (recall_table clears what it reports), so
     * that the arena is grown once, before any pointer into it is taken. */
    int n_desc = 0;
    int64_t C_max = 0, k_max = 0;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if ((sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1) continue;
        hkv_policy pol;
        if ((rc = hkv_kv_seq_instance(kv, sg->seq, NULL, &pol, err))) return rc;
        if (!pol.ops->recall_table || !pol.ops->select_recalled) continue;
        if ((size_t)g * d * 4 > 48 * 1024) {   /* gpu/recall_top.cu's shared memory */
            if (cb_far_tokens(b, sg)) cb_fallback(b, HKV_FALLBACK_SHAPE);
            continue;
        }
        if (!cb_policy_takes(b, sg, layer, &pol, 1)) continue;
        hkv_recall_table *t = &r->tab[n_desc];
        if ((rc = pol.ops->recall_table(pol.self, layer, t, fifo + (size_t)n_desc * KH * 2,
                                        r->dirty + (size_t)n_desc * KH)))
            return hkv_seterr(err, rc, "sequence %d, layer %d: the policy's recall table", sg->seq,
                              layer);
        if (t->C < 1 || t->k < 1 || !t->rows) continue;   /* nothing to recall from */
        if (t->C > C_max) C_max = t->C;
        if (t->k > k_max) k_max = t->k;
        r->seg[n_desc++] = i;
    }
    if (!n_desc) return HKV_OK;
    if ((rc = ensure_arena(b, C_max, k_max, err))) return rc;
    int n_rows = 0;
    for (int j = 0; j < n_desc; j++) {
        const hkv_seg *sg = &segs[r->seg[j]];
        const hkv_recall_table *t = &r->tab[j];
        const int32_t *dirty = r->dirty + (size_t)j * KH;
        const size_t m = (size_t)sg->seq * NL + layer;
        const uint64_t ep = hkv_kv_seq_epoch(kv, sg->seq);
        uint16_t *tab = r->rows + m * (size_t)r->C * H * d;
        if (r->ver[m] != t->version || r->epoch[m] != ep) {   /* the whole table */
            const size_t bytes = (size_t)t->C * H * d * 2;
            if ((rc = hkv_gpu_upload(tab, t->rows, bytes, b->st, err))) return rc;
            b->stats.bytes_h2d += bytes;
            b->stats.recall_resyncs++;
            r->ver[m] = t->version, r->epoch[m] = ep;
        } else {   /* the slots select rewrote since */
            for (int h = 0; h < KH; h++) {
                const int32_t sl = dirty[h];
                if (sl < 0 || sl >= t->C) continue;
                const size_t at = ((size_t)sl * H + (size_t)h * g) * d;
                memcpy(rows + (size_t)n_rows * gd, t->rows + at, gd * 2);
                off_rows[n_rows++] = (int64_t)(m * (size_t)r->C * H * d + at);
            }
        }
        off_fifo[j] = (int64_t)(m * KH * 2 * 2);   /* in 16-bit units */
        desc[j] = (hkv_gpu_recall_row){.tab = tab, .fifo = r->fifo + m * KH * 2, .row = sg->row,
                                       .C = t->C, .k = t->k};
        r->has[sg->row] = 1;
    }
    if (!n_desc) return HKV_OK;
    /* One copy of the region's used part, then scatter and recall. */
    const size_t used = o_rows + (size_t)n_rows * gd * 2;
    char *dup = (char *)r->d_up;
    if ((rc = hkv_gpu_upload(dup, up, used, b->st, err)) ||
        (rc = hkv_gpu_event_record(r->up_ev[layer], b->st, err)) ||
        (rc = hkv_gpu_scatter_u16(r->rows, (const int64_t *)(dup + o_offr),
                                  (const uint16_t *)(dup + o_rows), n_rows, (int64_t)gd, b->st,
                                  err)) ||
        (rc = hkv_gpu_scatter_u16((uint16_t *)r->fifo, (const int64_t *)(dup + o_offf),
                                  (const uint16_t *)(dup + o_fifo), n_desc, (int64_t)KH * 4, b->st,
                                  err)) ||
        (rc = hkv_gpu_recall_top((const hkv_gpu_recall_row *)(dup + o_desc), n_desc,
                                 b->act[HKV_ACT_QKV], b->qkv_w, H, KH, d, r->k, r->C, r->d_slot,
                                 r->d_score, r->d_n, r->ws, r->ws_bytes, b->st, err)))
        return rc;
    b->stats.bytes_h2d += used;
    /* Down with the QKV rows: the host's select needs both. */
    const size_t ne = (size_t)n * KH * r->k, e0 = (size_t)r0 * KH * r->k;
    int32_t *h_slot = r->h_out.p;
    float *h_score = (float *)(h_slot + (size_t)b->max_rows * KH * r->k);
    int32_t *h_n = (int32_t *)(h_score + (size_t)b->max_rows * KH * r->k);
    if ((rc = hkv_gpu_download(h_slot + e0, r->d_slot + e0, ne * 4, b->st, err)) ||
        (rc = hkv_gpu_download(h_score + e0, r->d_score + e0, ne * 4, b->st, err)) ||
        (rc = hkv_gpu_download(h_n + r0 * KH, r->d_n + r0 * KH, (size_t)n * KH * 4, b->st, err)))
        return rc;
    b->stats.bytes_d2h += ne * 8 + (size_t)n * KH * 4;
    b->stats.recall_rows += n_desc;
    r->n_desc = n_desc;
    r->rr = (hkv_recall_rows){.slot = h_slot, .score = h_score, .n = h_n, .ld = r->k};
    return HKV_OK;
}

const hkv_recall_rows *cb_recall_result(cuda_be *b, int64_t r0, int64_t n) {
    cb_recall *r = &b->rc;
    if (!r->n_desc) return NULL;
    int32_t *h_n = (int32_t *)r->rr.n;
    for (int64_t row = r0; row < r0 + n; row++)   /* rows the device did not recall for */
        if (!r->has[row])
            for (int h = 0; h < b->KH; h++) h_n[row * b->KH + h] = -1;
    return &r->rr;
}

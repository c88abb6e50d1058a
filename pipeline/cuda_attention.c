/* The attention step of the CUDA backend: the CPU-GPU co-execution of one
 * layer (the picture is in cuda_backend.h and docs/ARCHITECTURE.md).
 *
 * Decode rows: the device recalls for policies with a device part
 * (cuda_recall.c), appends their K/V to its near-tier mirror and attends
 * sinks + local window while CPU threads (the tiered cache's
 * layer_step_far: policy selection, given the device's recall, and sparse
 * attention over the far tier) compute the far partial; the far (out, lse) is uploaded and merged into
 * the near one on the device. Prompt rows: the host attends them over the
 * far tier (which holds the whole prompt while it is fed) and their output
 * is merged with an empty near partial, i.e. taken as it is.
 *
 * The near mirror of (sequence, layer) is current when it holds exactly the
 * tokens before this row and the sequence's epoch has not moved; otherwise
 * (a prompt just ended, a rewind, a copy) the host's near tier is uploaded
 * whole after the host step, and that layer's device attention waits for it.
 *
 * A step whose rows all have their whole context in the near tier (a short
 * sequence, or `full` with the context on the device) has an empty far
 * partial: the device takes its near output as the attention and goes on to
 * the next layer without waiting, and the host's step (storing the K/V rows,
 * the policy's bookkeeping) is deferred, its QKV rows kept in a slot of
 * h_qkv per layer, and run in layer order before the next host step that is
 * not deferred or at the end of the call (cb_flush). So a batch-1 step of a
 * context that fits on the device is one stream of kernels, not one device-
 * host round trip per layer. The host checks that each deferred far partial
 * was indeed empty. */
#include <math.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_tiered.h"

static int is_prompt(const hkv_seg *sg) {
    return (sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1;
}

/* Near attention of the step's decode rows (their index arrays staged). */
static int near_attend(cuda_be *b, int layer, int n_dec, hkv_err *err) {
    const size_t lofs = (size_t)layer * b->KH * b->NR * b->d;
    /* fewer splits as the batch grows: never more than the workspace's */
    int split = hkv_gpu_attn_decode_splits(hkv_gpu_ctx_sm_count(b->ctx), n_dec, b->H, b->KH, b->NR);
    if (split > b->near_split) split = b->near_split;
    int rc;
    if ((rc = hkv_gpu_copy_rows(b->d_q, b->qd, NULL, b->act[HKV_ACT_QKV], b->qkv_w, b->d_rows, n_dec,
                                b->qd, b->st, err)) ||
        (rc = hkv_gpu_attn_decode_split(b->d_q, n_dec, b->H, b->KH, b->d, b->near_k + lofs,
                                        b->near_v + lofs, b->d, (int64_t)b->NR * b->d, 0,
                                        b->d_nrows, b->d_idx, 0, 1.0f / sqrtf((float)b->d),
                                        b->d_no, b->d_nl, split, b->d_split_ws, b->split_ws_bytes,
                                        b->st, err)) ||
        (rc = cb_keep_attend(b, layer, n_dec, err)) ||
        (rc = hkv_gpu_copy_rows(b->act[HKV_ACT_ATT], b->qd, b->d_rows, b->d_no, b->qd, NULL, n_dec,
                                b->qd, b->st, err)) ||
        (rc = hkv_gpu_copy_rows(b->d_lse, b->H, b->d_rows, b->d_nl, b->H, NULL, n_dec, b->H, b->st,
                                err)))
        return rc;
    return HKV_OK;
}

/* Every deferred host step was to find nothing far: a row whose far partial
 * is not empty means the device's attention missed keys. */
static int check_empty(const cuda_be *b, int layer, int64_t n, hkv_err *err) {
    const float *l = b->h_fl.p;
    for (int64_t i = 0; i < n * b->H; i++)
        if (l[i] != -INFINITY)
            return hkv_seterr(err, HKV_E_INTERNAL, "layer %d: the host attended far keys for row %lld "
                              "in a step the device finished without them", layer,
                              (long long)(i / b->H));
    return HKV_OK;
}

int cb_flush(void *self, hkv_err *err) {
    cuda_be *b = self;
    hkv_kv *kv = &b->e->kv;
    int rc = HKV_OK;
    for (int i = 0; i < b->df_count && !rc; i++) {
        const int l = b->df_layer[i];
        const float *hq = (const float *)b->h_qkv.p + (size_t)l * b->df_n * b->qkv_w;
        double t0 = hkv_now();
        if ((rc = hkv_gpu_event_sync(b->ev[4 * l], err))) break;
        double t1 = hkv_now();
        rc = kv->ops->layer_step_far(kv->self, l, b->df_segs, b->df_nsegs, hq, b->qkv_w, b->h_fo.p,
                                     b->qd, b->h_fl.p, NULL, err);
        if (!rc) rc = check_empty(b, l, b->df_n, err);
        b->stats.cpu_wait_dev += t1 - t0;
        b->stats.cpu_busy += hkv_now() - t1;
        if (rc) {   /* the host tier lacks what the mirrors of this and later layers hold */
            for (int j = i; j < b->df_count; j++)
                for (int k = 0; k < b->df_nsegs; k++)
                    b->m_len[(int64_t)b->df_segs[k].seq * b->NL + b->df_layer[j]] = -1;
        }
    }
    b->df_count = 0;
    return rc;
}

int cb_attention(void *self, int layer, const hkv_seg *segs, int n_segs, int64_t n, hkv_err *err) {
    cuda_be *b = self;
    hkv_engine *e = b->e;
    hkv_kv *kv = &e->kv;
    const int NL = b->NL, KH = b->KH, NR = b->NR, d = b->d;
    const int64_t Li = e->p.tiered.L_init, Ll = e->p.tiered.L_local;
    const int64_t seq_rows = (int64_t)NL * KH * NR;   /* near rows of one sequence */
    void **ev = b->ev + 4 * layer;
    int rc;
    if (layer < 0 || layer >= NL || n < 1 || n > b->max_rows)
        return hkv_seterr(err, HKV_E_RANGE, "attention of layer %d over %lld rows: out of range",
                          layer, (long long)n);
    if (b->df_count && (n != b->df_n || n_segs != b->df_nsegs ||
                        memcmp(segs, b->df_segs, (size_t)n_segs * sizeof *segs)) &&
        (rc = cb_flush(b, err)))   /* another call's steps (a caller without the flush op) */
        return rc;
    if (b->ev_pending[layer]) {   /* last call's timings of this layer, before re-recording */
        if ((rc = hkv_gpu_event_sync(ev[3], err))) return rc;
        cb_harvest(b);
    }

    /* The step's decode rows: which mirrors are current, where each new
     * K/V row goes, which near rows each (row, KV head) attends. */
    int n_dec = 0, n_slow = 0;
    for (int64_t r = 0; r < n; r++) b->h_dst[r] = -1;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if (sg->seq < 0 || sg->seq >= b->max_seqs)
            return hkv_seterr(err, HKV_E_INVAL, "segment %d names sequence %d of %d", i, sg->seq,
                              b->max_seqs);
        if (is_prompt(sg)) {
            b->stats.prompt_rows += sg->n;
            continue;
        }
        const int s = sg->seq;
        const int64_t p = sg->pos, m = (int64_t)s * NL + layer;
        if (b->m_len[m] != p || b->m_epoch[m] != hkv_kv_tiered_seq_epoch(kv, s))
            b->h_slow[n_slow++] = s;
        const int64_t slot = p < Li ? p : Li + (p - Li) % Ll;
        b->h_dst[sg->row] = ((int64_t)s * seq_rows + slot) * d;
        b->h_rows[n_dec] = (int32_t)sg->row;
        const int32_t nn = (int32_t)(p + 1 < NR ? p + 1 : NR);
        for (int h = 0; h < KH; h++) {   /* the sequence's ring, rows 0 .. nn - 1 in any order */
            b->h_nrows[n_dec * KH + h] = nn;
            b->h_idx[n_dec * KH + h] = (int32_t)(s * seq_rows);
        }
        n_dec++;
    }
    b->stats.decode_rows += n_dec;
    b->stats.layer_steps++;
    const int dev_prompt = cb_prefill_plan(b, layer, segs, n_segs);
    const int merge = n_dec || dev_prompt;   /* device partials to merge the host's into */
    /* Each layer's QKV rows in their own slot where they fit, so that a
     * deferred step's rows stay until the host runs it. */
    const int slotted = (int64_t)(layer + 1) * n <= b->max_rows;
    if (!slotted && b->df_count && (rc = cb_flush(b, err))) return rc;
    float *hq = (float *)b->h_qkv.p + (slotted ? (size_t)layer * n * b->qkv_w : 0);
    /* Deferrable: decode rows only, mirrors current, every row's context
     * within the near tier (kept rows on the device: below). */
    int defer = !b->lockstep && slotted && n_dec == n_segs && n_dec == n && !n_slow && !dev_prompt;
    for (int i = 0; i < n_segs && defer; i++) defer = segs[i].pos + 1 <= NR;

    /* Device: QKV and the policies' recall down to the host first, then the
     * near part. */
    if ((rc = hkv_gpu_download(hq, b->act[HKV_ACT_QKV], (size_t)n * b->qkv_w * 4, b->st,
                               err)) ||
        (rc = cb_recall_step(b, layer, segs, n_segs, n, err)) ||
        (rc = cb_pages_step(b, layer, segs, n_segs, n, err)) ||
        (rc = hkv_gpu_event_record(ev[0], b->st, err)))
        return rc;
    b->kp.n_dec = 0;
    if (n_dec && (rc = cb_keep_step(b, layer, segs, n_segs, n, err))) return rc;
    b->stats.bytes_d2h += (uint64_t)n * b->qkv_w * 4;
    const size_t lofs = (size_t)layer * KH * NR * d;
    /* A deferred step runs without the device's recall or page selection
     * (their host buffers serve the next layer by then): the host makes its
     * own over the empty far range, as the CPU path does. Kept rows the
     * device attended would be attended twice. */
    defer = defer && !b->kp.n_dec;
    if (defer) {   /* the near output is the attention; the host step waits in the list */
        if ((rc = cb_stage(b, UP_DST, b->d_dst, b->h_dst, (size_t)n * 8, err)) ||
            (rc = cb_stage(b, UP_ROWS, b->d_rows, b->h_rows, (size_t)n_dec * 4, err)) ||
            (rc = cb_stage(b, UP_NROWS, b->d_nrows, b->h_nrows, (size_t)n_dec * KH * 4, err)) ||
            (rc = cb_stage(b, UP_IDX, b->d_idx, b->h_idx, (size_t)n_dec * KH * 4, err)) ||
            (rc = hkv_gpu_kv_append(b->act[HKV_ACT_QKV], b->qkv_w, n, (int64_t)b->H * d,
                                    (int64_t)(b->H + KH) * d, KH, d, b->d_dst, (int64_t)NR * d,
                                    b->near_k + lofs, b->near_v + lofs, b->st, err)) ||
            (rc = hkv_gpu_event_record(ev[1], b->st, err)) ||
            (rc = near_attend(b, layer, n_dec, err)) ||
            (rc = hkv_gpu_event_record(ev[2], b->st, err)) ||
            (rc = hkv_gpu_event_record(ev[3], b->st, err)))
            return rc;
        b->ev_pending[layer] = 1;
        if (!b->df_count) {
            memcpy(b->df_segs, segs, (size_t)n_segs * sizeof *segs);
            b->df_nsegs = n_segs, b->df_n = n;
        }
        b->df_layer[b->df_count++] = layer;
        b->stats.host_deferred++;
        for (int i = 0; i < n_segs; i++) {
            const int64_t m = (int64_t)segs[i].seq * NL + layer;
            b->m_len[m] = segs[i].pos + 1;
            b->m_epoch[m] = hkv_kv_tiered_seq_epoch(kv, segs[i].seq);
        }
        return HKV_OK;
    }
    /* Host steps stay in layer order: the deferred ones first. */
    if (b->df_count && (rc = cb_flush(b, err))) return rc;
    if (merge && ((rc = hkv_gpu_partial_clear(b->act[HKV_ACT_ATT], b->qd, b->d_lse, n, b->H, d,
                                              b->st, err)) ||
                  (rc = hkv_gpu_event_record(ev[1], b->st, err))))
        return rc;
    if (dev_prompt && (rc = cb_prefill_attend(b, layer, n_segs, err))) return rc;
    if (n_dec) {
        if ((rc = cb_stage(b, UP_DST, b->d_dst, b->h_dst, (size_t)n * 8, err)) ||
            (rc = cb_stage(b, UP_ROWS, b->d_rows, b->h_rows, (size_t)n_dec * 4, err)) ||
            (rc = cb_stage(b, UP_NROWS, b->d_nrows, b->h_nrows, (size_t)n_dec * KH * 4, err)) ||
            (rc = cb_stage(b, UP_IDX, b->d_idx, b->h_idx, (size_t)n_dec * KH * 4, err)) ||
            (rc = hkv_gpu_kv_append(b->act[HKV_ACT_QKV], b->qkv_w, n, (int64_t)b->H * d,
                                    (int64_t)(b->H + KH) * d, KH, d, b->d_dst, (int64_t)NR * d,
                                    b->near_k + lofs, b->near_v + lofs, b->st, err)))
            return rc;
        if (!n_slow && (rc = near_attend(b, layer, n_dec, err))) return rc;
    }
    if (merge && !n_slow && (rc = hkv_gpu_event_record(ev[2], b->st, err))) return rc;

    /* Host: the far tier, while the device attends the near one. */
    double t0 = hkv_now();
    if ((rc = hkv_gpu_event_sync(ev[0], err))) return rc;
    double t1 = hkv_now();
    /* the device's parts of the selection: recall, kept sets, selections */
    const hkv_recall_rows *rec = cb_recall_result(b, n);
    hkv_recall_rows dev = {0};
    if (rec) dev = *rec;
    if (b->kp.n_dec) dev.far_from = b->kp.h_from;
    cb_pages_result(b, n, &dev);
    rc = kv->ops->layer_step_far(kv->self, layer, b->pp_segs, n_segs, hq, b->qkv_w,
                                 b->h_fo.p, b->qd, b->h_fl.p,
                                 rec || b->kp.n_dec || b->pg.n_rows ? &dev : NULL, err);
    double t2 = hkv_now();
    b->stats.cpu_wait_dev += t1 - t0;
    b->stats.cpu_busy += t2 - t1;
    if (rc) return rc;

    if (n_slow) {   /* mirrors not current: the host's near tier, whole, then attend */
        for (int i = 0; i < n_slow; i++) {
            const uint16_t *hk, *hv;
            int rows;
            const size_t off = ((size_t)b->h_slow[i] * seq_rows) * d + lofs,
                         bytes = (size_t)KH * NR * d * 2;
            if ((rc = hkv_kv_tiered_near(kv, b->h_slow[i], layer, &hk, &hv, &rows, err)) ||
                (rc = hkv_gpu_upload(b->near_k + off, hk, bytes, b->st, err)) ||
                (rc = hkv_gpu_upload(b->near_v + off, hv, bytes, b->st, err)))
                return rc;
            b->stats.bytes_h2d += 2 * bytes;
            b->stats.near_resyncs++;
        }
        if ((rc = hkv_gpu_event_record(ev[1], b->st, err)) || (rc = near_attend(b, layer, n_dec, err)) ||
            (rc = hkv_gpu_event_record(ev[2], b->st, err)))
            return rc;
    }

    /* The far partial up, merged exactly into the near one. */
    const size_t ob = (size_t)n * b->qd * 4, lb = (size_t)n * b->H * 4;
    if (merge) {
        if ((rc = hkv_gpu_event_record(ev[3], b->st, err)) ||
            (rc = hkv_gpu_upload(b->d_fo, b->h_fo.p, ob, b->st, err)) ||
            (rc = hkv_gpu_upload(b->d_fl, b->h_fl.p, lb, b->st, err)) ||
            (rc = hkv_gpu_attn_merge(b->act[HKV_ACT_ATT], b->d_lse, b->d_fo, b->d_fl, n * b->H, d,
                                     b->st, err)))
            return rc;
        b->ev_pending[layer] = 1;
        b->stats.bytes_h2d += ob + lb;
    } else {   /* prompt rows only: the host's output is the whole attention */
        if ((rc = hkv_gpu_upload(b->act[HKV_ACT_ATT], b->h_fo.p, ob, b->st, err))) return rc;
        b->stats.bytes_h2d += ob;
    }

    if ((rc = cb_prefill_done(b, layer, n_segs, err))) return rc;
    /* What the mirrors hold now. */
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        const int64_t m = (int64_t)sg->seq * NL + layer;
        if (is_prompt(sg)) {
            b->m_len[m] = -1;
        } else {
            b->m_len[m] = sg->pos + 1;
            b->m_epoch[m] = hkv_kv_tiered_seq_epoch(kv, sg->seq);
        }
    }
    return HKV_OK;
}

/* The attention step of the CUDA backend: the CPU-GPU co-execution of one
 * layer (the picture is in cuda_backend.h and docs/PIPELINE.md).
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
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"

static int is_prompt(const hkv_seg *sg) {
    return (sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1;
}

/* Near attention of the step's decode rows (their index arrays staged, and
 * b->h_rows their rows in the batch). Rows that follow each other (a
 * decode batch, or a micro-batch of one) take their queries from the QKV
 * rows and the partial straight into the attention output and lse: three
 * launches a layer fewer, which counts where the host's queueing or the
 * launches' fixed cost bound a step. */
static int near_attend(cuda_be *b, int layer, int n_dec, hkv_err *err) {
    const size_t lofs = (size_t)layer * b->KH * b->NR * b->d;
    /* fewer splits as the batch grows: never more than the workspace's */
    int split = hkv_gpu_attn_decode_splits(hkv_gpu_ctx_sm_count(b->ctx), n_dec, b->H, b->KH, b->NR);
    if (split > b->near_split) split = b->near_split;
    int dense = n_dec > 0;
    for (int i = 1; i < n_dec && dense; i++) dense = b->h_rows[i] == b->h_rows[0] + i;
    const int64_t r = dense ? b->h_rows[0] : 0;
    float *no = dense ? b->act[HKV_ACT_ATT] + r * b->qd : b->d_no,
          *nl = dense ? b->d_lse + r * b->H : b->d_nl;
    /* Following rows' queries are read where they are, in the QKV rows (one
     * launch a layer fewer); gathered into d_q otherwise, or when the kept
     * rows' attention reads them there too. */
    const int in_place = dense && !b->kp.n_dec && !b->rs.n_dec;
    const float *q = in_place ? b->act[HKV_ACT_QKV] + r * b->qkv_w : b->d_q;
    int rc;
    if ((!in_place && (rc = hkv_gpu_copy_rows(b->d_q, b->qd, NULL, b->act[HKV_ACT_QKV], b->qkv_w,
                                              b->d_rows, n_dec, b->qd, b->st, err))) ||
        (rc = hkv_gpu_attn_decode_split_q(q, in_place ? b->qkv_w : b->qd, n_dec, b->H, b->KH, b->d,
                                          b->near_k + lofs, b->near_v + lofs, b->d,
                                          (int64_t)b->NR * b->d, 0, b->d_nrows, b->d_idx, 0,
                                          1.0f / sqrtf((float)b->d), no, nl, split, b->d_split_ws,
                                          b->split_ws_bytes, b->st, err)) ||
        (rc = cb_keep_attend(b, layer, n_dec, no, nl, err)) ||
        (rc = cb_resident_attend(b, layer, n_dec, no, nl, err)))
        return rc;
    if (!dense &&
        ((rc = hkv_gpu_copy_rows(b->act[HKV_ACT_ATT], b->qd, b->d_rows, b->d_no, b->qd, NULL, n_dec,
                                 b->qd, b->st, err)) ||
         (rc = hkv_gpu_copy_rows(b->d_lse, b->H, b->d_rows, b->d_nl, b->H, NULL, n_dec, b->H, b->st,
                                 err))))
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

/* The wait of hkv_cuda_params.team_spin: the team in a parallel region of
 * its own, thread 0 waiting on the event, the others spinning until it is
 * done, so that the far part's region after it finds them awake. */
static int wait_with_team(cuda_be *b, void *ev, int *slept, hkv_err *err) {
    atomic_int done = 0;
    int rc = HKV_OK;
#pragma omp parallel
    {
        if (omp_get_thread_num() == 0) {
            rc = hkv_gpu_event_wait(ev, b->spin_us, slept, err);
            atomic_store_explicit(&done, 1, memory_order_release);
        } else {
            while (!atomic_load_explicit(&done, memory_order_acquire)) {
#ifdef HKV_CUDA_EMU
                sched_yield();   /* the emulated device runs on these cores */
#elif defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
            }
        }
    }
    return rc;
}

/* The host's wait for the device's rows inside a step: polled, then slept
 * (hkv_cuda_params.wait_spin_us); counted when they were not there yet. */
int cb_wait(cuda_be *b, void *ev, hkv_err *err) {
    if (hkv_gpu_event_done(ev)) return HKV_OK;
    int slept = 0;
    const int rc = b->team_spin && omp_get_max_threads() > 1 && !omp_in_parallel()
                       ? wait_with_team(b, ev, &slept, err)
                       : hkv_gpu_event_wait(ev, b->spin_us, &slept, err);
    b->stats.host_waits++;
    b->stats.host_waits_slept += slept;
    return rc;
}

/* The deferred host steps in layer order: all of them, or (ready_only)
 * those at the front whose QKV rows have landed, so that the host does them
 * while the device works through the layers queued after them. */
static int df_run(cuda_be *b, int ready_only, hkv_err *err) {
    hkv_kv *kv = &b->e->kv;
    int rc = HKV_OK;
    for (; b->df_done < b->df_count && !rc; b->df_done++) {
        const int i = b->df_done, l = b->df_layer[i];
        /* (while a step is recorded nothing of it has run: its events are not yet recorded) */
        if (ready_only && (b->gr.capturing || !hkv_gpu_event_done(b->ev[4 * l]))) return HKV_OK;
        const float *hq = (const float *)b->h_qkv.p + (size_t)l * b->df_n * b->qkv_w;
        double t0 = hkv_now();
        if ((rc = cb_wait(b, b->ev[4 * l], err))) break;
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
    b->df_done = b->df_count = 0;   /* all run (or, after an error, dropped) */
    return rc;
}

int cb_flush(void *self, hkv_err *err) {
    cuda_be *b = self;
    int rc = HKV_OK;
    if (b->gr.capturing) rc = cb_graph_end(b, err != NULL, err);   /* the step's graph launched */
    if (rc) {   /* nothing of the step ran on the device: drop its host steps */
        b->df_done = b->df_count = 0;
        return rc;
    }
    return df_run(b, 0, err);
}

/* The device parts' results the host step of half h reads (recall, kept
 * rows, page selections) in and out of the modules' fields. */
static void half_swap(cuda_be *b, cb_half *h) {
    cb_half t = *h;
    h->n_desc = b->rc.n_desc, h->rr = b->rc.rr, h->kp_n_dec = b->kp.n_dec, h->pg_rows = b->pg.n_rows;
    h->rs_n_dec = b->rs.n_dec;
    b->rc.n_desc = t.n_desc, b->rc.rr = t.rr, b->kp.n_dec = t.kp_n_dec, b->pg.n_rows = t.pg_rows;
    b->rs.n_dec = t.rs_n_dec;
}

/* The host's part of a begun step: the far tier (the device attends the
 * near one meanwhile), then its partial up and merged. */
static int att_end(cuda_be *b, cb_half *h, hkv_err *err) {
    hkv_kv *kv = &b->e->kv;
    const int NL = b->NL, KH = b->KH, NR = b->NR, d = b->d, layer = h->layer, n_segs = h->n_segs;
    const int64_t r0 = h->r0, n = h->n, seq_rows = (int64_t)NL * KH * NR;
    const size_t lofs = (size_t)layer * KH * NR * d;
    void **ev = h->ev;
    int rc;
    h->open = 0;
    half_swap(b, h);   /* this half's device results in place, the caller's kept in h */
    double t0 = hkv_now();
    if ((rc = cb_wait(b, ev[0], err))) goto out;
    double t1 = hkv_now();
    /* the device's parts of the selection: recall, kept sets, selections */
    const hkv_recall_rows *rec = cb_recall_result(b, r0, n);
    hkv_recall_rows dev = {0};
    if (rec) dev = *rec;
    const int from = b->kp.n_dec || b->rs.n_dec;   /* kept or resident rows on the device */
    if (from) dev.far_from = b->kp.h_from;
    cb_pages_result(b, r0, n, &dev);
    rc = kv->ops->layer_step_far(kv->self, layer, h->dev_prompt ? b->pp_segs : h->segs, n_segs,
                                 h->hq, b->qkv_w, b->h_fo.p, b->qd, b->h_fl.p,
                                 rec || from || b->pg.n_rows ? &dev : NULL, err);
    double t2 = hkv_now();
    b->stats.cpu_wait_dev += t1 - t0;
    b->stats.cpu_busy += t2 - t1;
    if (rc) goto out;

    if (h->n_slow) {   /* mirrors not current: the host's near tier, whole, then attend */
        for (int i = 0; i < h->n_slow; i++) {
            const uint16_t *hk, *hv;
            int rows;
            const size_t off = ((size_t)b->h_slow[i] * seq_rows) * d + lofs,
                         bytes = (size_t)KH * NR * d * 2;
            if ((rc = hkv_kv_near(kv, b->h_slow[i], layer, &hk, &hv, &rows, err)) ||
                (rc = hkv_gpu_upload(b->near_k + off, hk, bytes, b->st, err)) ||
                (rc = hkv_gpu_upload(b->near_v + off, hv, bytes, b->st, err)))
                goto out;
            b->stats.bytes_h2d += 2 * bytes;
            b->stats.near_resyncs++;
        }
        if ((rc = hkv_gpu_event_record(ev[1], b->st, err)) ||
            (rc = near_attend(b, layer, h->n_dec, err)) ||
            (rc = hkv_gpu_event_record(ev[2], b->st, err)))
            goto out;
    }

    /* The far partial up, merged exactly into the near one. */
    const size_t ob = (size_t)n * b->qd * 4, lb = (size_t)n * b->H * 4;
    float *att = b->act[HKV_ACT_ATT] + r0 * b->qd;
    const float *fo = (const float *)b->h_fo.p + r0 * b->qd, *fl = (const float *)b->h_fl.p + r0 * b->H;
    if (h->merge) {
        /* (a micro-batch's arrival is recorded at its near end: behind it on
         * the stream is the other one's work, not a wait) */
        if (((!h->pp || h->n_slow) && (rc = hkv_gpu_event_record(ev[3], b->st, err))) ||
            (rc = hkv_gpu_upload(b->d_fo + r0 * b->qd, fo, ob, b->st, err)) ||
            (rc = hkv_gpu_upload(b->d_fl + r0 * b->H, fl, lb, b->st, err)) ||
            (rc = hkv_gpu_attn_merge(att, b->d_lse + r0 * b->H, b->d_fo + r0 * b->qd,
                                     b->d_fl + r0 * b->H, n * b->H, d, b->st, err)))
            goto out;
        *h->ev_pending = 1;
        b->stats.bytes_h2d += ob + lb;
    } else {   /* prompt rows only: the host's output is the whole attention */
        if ((rc = hkv_gpu_upload(att, fo, ob, b->st, err))) goto out;
        b->stats.bytes_h2d += ob;
    }

    if ((rc = cb_prefill_done(b, layer, n_segs, err))) goto out;
    /* What the mirrors hold now. */
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &h->segs[i];
        const int64_t m = (int64_t)sg->seq * NL + layer;
        if (is_prompt(sg)) {
            b->m_len[m] = -1;
        } else {
            b->m_len[m] = sg->pos + 1;
            b->m_epoch[m] = hkv_kv_seq_epoch(kv, sg->seq);
        }
    }
out:
    half_swap(b, h);
    return rc;
}

int cb_settle_halves(cuda_be *b, hkv_err *err) {
    for (int i = 0; i < 2; i++)
        if (b->half[i].open && i != b->cur_half) {
            int rc = att_end(b, &b->half[i], err);
            if (rc) return rc;
        }
    return HKV_OK;
}

int cb_layer_settle(cuda_be *b, int hi, int layer, hkv_err *err) {
    int *pending = b->ev_pending + (size_t)hi * b->NL + layer;
    if (!*pending) return HKV_OK;
    int rc = hkv_gpu_event_sync(b->ev[4 * ((size_t)hi * b->NL + layer) + 3], err);
    if (!rc) cb_harvest(b);
    return rc;
}

int cb_decode_rows(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t r0, int64_t n,
                   int *n_dec_out, int *n_slow_out, hkv_err *err) {
    hkv_kv *kv = &b->e->kv;
    const int NL = b->NL, KH = b->KH, NR = b->NR, d = b->d;
    const int64_t Li = b->Li, Ll = b->Ll;
    const int64_t seq_rows = (int64_t)NL * KH * NR;   /* near rows of one sequence */
    int n_dec = 0, n_slow = 0;
    for (int64_t r = r0; r < r0 + n; r++) b->h_dst[r] = -1;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        if (sg->seq < 0 || sg->seq >= b->max_seqs)
            return hkv_seterr(err, HKV_E_INVAL, "segment %d names sequence %d of %d", i, sg->seq,
                              b->max_seqs);
        if (sg->row < r0 || sg->row + sg->n > r0 + n)
            return hkv_seterr(err, HKV_E_INVAL, "segment %d's rows %lld..%lld outside the step's "
                              "%lld..%lld", i, (long long)sg->row, (long long)(sg->row + sg->n),
                              (long long)r0, (long long)(r0 + n));
        if (is_prompt(sg)) continue;
        const int s = sg->seq;
        const int64_t p = sg->pos, m = (int64_t)s * NL + layer;
        if (b->m_len[m] != p || b->m_epoch[m] != hkv_kv_seq_epoch(kv, s))
            b->h_slow[n_slow++] = s;
        const int64_t slot = p < Li ? p : Li + (p - Li) % Ll;
        b->h_dst[sg->row] = ((int64_t)s * seq_rows + slot) * d;
        b->h_rows[n_dec] = (int32_t)sg->row;
        const int32_t nn = (int32_t)(p + 1 < NR ? p + 1 : NR);
        for (int hh = 0; hh < KH; hh++) {   /* the sequence's ring, rows 0 .. nn - 1 in any order */
            b->h_nrows[n_dec * KH + hh] = nn;
            b->h_idx[n_dec * KH + hh] = (int32_t)(s * seq_rows);
        }
        n_dec++;
    }
    *n_dec_out = n_dec, *n_slow_out = n_slow;
    return HKV_OK;
}

void cb_defer_note(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t n) {
    hkv_kv *kv = &b->e->kv;
    b->ev_pending[layer] = 1;   /* (the whole batch's: half 0) */
    if (!b->df_count) {
        memcpy(b->df_segs, segs, (size_t)n_segs * sizeof *segs);
        b->df_nsegs = n_segs, b->df_n = n;
    }
    b->df_layer[b->df_count++] = layer;
    b->stats.host_deferred++;
    for (int i = 0; i < n_segs; i++) {
        const int64_t m = (int64_t)segs[i].seq * b->NL + layer;
        b->m_len[m] = segs[i].pos + 1;
        b->m_epoch[m] = hkv_kv_seq_epoch(kv, segs[i].seq);
    }
}

/* The device's part of layer `layer` for rows [r0, r0 + n) (segments with
 * their rows in the batch), into half hi's state; a step that cannot wait
 * for its end (mirrors to resync, prompt rows, or the whole batch: mb < 0)
 * runs its host part too before returning. */
static int att_begin(cuda_be *b, int mb, int layer, const hkv_seg *segs, int n_segs, int64_t r0,
                     int64_t n, hkv_err *err) {
    const int NL = b->NL, KH = b->KH, NR = b->NR, d = b->d, hi = mb < 0 ? 0 : mb;
    void **ev = b->ev + 4 * ((size_t)hi * NL + layer);
    int *pending = b->ev_pending + (size_t)hi * NL + layer;
    cb_half *h = &b->half[hi];
    int rc;
    if (layer < 0 || layer >= NL || n < 1 || r0 < 0 || r0 + n > b->max_rows)
        return hkv_seterr(err, HKV_E_RANGE, "attention of layer %d over rows %lld..%lld: out of range",
                          layer, (long long)r0, (long long)(r0 + n));
    if (h->open)
        return hkv_seterr(err, HKV_E_INVAL, "attention of layer %d begun for micro-batch %d, whose "
                          "layer %d has not ended", layer, hi, h->layer);
    if (b->df_count && (mb >= 0 || n != b->df_n || n_segs != b->df_nsegs ||
                        memcmp(segs, b->df_segs, (size_t)n_segs * sizeof *segs)) &&
        (rc = cb_flush(b, err)))   /* another call's steps (a caller without the flush op) */
        return rc;
    /* last call's timings of this layer, before re-recording */
    if ((rc = cb_layer_settle(b, hi, layer, err))) return rc;
    b->cur_half = hi;

    /* The step's decode rows: which mirrors are current, where each new
     * K/V row goes, which near rows each (row, KV head) attends. */
    int n_dec = 0, n_slow = 0;
    if ((rc = cb_decode_rows(b, layer, segs, n_segs, r0, n, &n_dec, &n_slow, err))) return rc;
    for (int i = 0; i < n_segs; i++)
        if (is_prompt(&segs[i])) b->stats.prompt_rows += segs[i].n;
    b->stats.decode_rows += n_dec;
    b->stats.layer_steps++;
    if (mb >= 0) b->stats.pingpong_steps++;
    const int dev_prompt = cb_prefill_plan(b, layer, segs, n_segs);
    const int merge = n_dec || dev_prompt;   /* device partials to merge the host's into */
    /* Each layer's QKV rows in their own slot where they fit (the whole
     * batch only), so that a deferred step's rows stay until the host runs
     * it; a micro-batch's rows sit at their rows in the batch. */
    const int slotted = mb < 0 && (int64_t)(layer + 1) * n <= b->qkv_rows;
    if (!slotted && b->df_count && (rc = cb_flush(b, err))) return rc;
    float *hq = (float *)b->h_qkv.p + (slotted ? (size_t)layer * n * b->qkv_w : 0);
    /* Deferrable: decode rows only, mirrors current, every row's context
     * within the near tier (kept rows on the device: below). */
    int defer = !b->lockstep && slotted && n_dec == n_segs && n_dec == n && !n_slow && !dev_prompt;
    for (int i = 0; i < n_segs && defer; i++) defer = segs[i].pos + 1 <= NR;

    /* Device: QKV and the policies' recall down to the host first, then the
     * near part. */
    float *qkv = b->act[HKV_ACT_QKV] + r0 * b->qkv_w;
    if ((rc = hkv_gpu_download(hq + r0 * b->qkv_w, qkv, (size_t)n * b->qkv_w * 4, b->st, err)) ||
        (rc = cb_recall_step(b, layer, segs, n_segs, r0, n, err)) ||
        (rc = cb_select_step(b, layer, segs, n_segs, r0, n, err)) ||
        (rc = hkv_gpu_event_record(ev[0], b->st, err)))
        return rc;
    b->kp.n_dec = b->rs.n_dec = 0;
    if (n_dec && ((rc = cb_keep_step(b, layer, segs, n_segs, r0, n, err)) ||
                  (rc = cb_resident_step(b, layer, segs, n_segs, err))))
        return rc;
    b->stats.bytes_d2h += (uint64_t)n * b->qkv_w * 4;
    const size_t lofs = (size_t)layer * KH * NR * d;
    /* A deferred step runs without the device's recall or page selection
     * (their host buffers serve the next layer by then): the host makes its
     * own over the empty far range, as the CPU path does. Kept rows the
     * device attended would be attended twice. */
    defer = defer && !b->kp.n_dec && !b->rs.n_dec;
    if (n_dec && ((rc = cb_stage(b, UP_DST, b->d_dst, b->h_dst + r0, (size_t)n * 8, err)) ||
                  (rc = cb_stage(b, UP_ROWS, b->d_rows, b->h_rows, (size_t)n_dec * 4, err)) ||
                  (rc = cb_stage(b, UP_NROWS, b->d_nrows, b->h_nrows, (size_t)n_dec * KH * 4, err)) ||
                  (rc = cb_stage(b, UP_IDX, b->d_idx, b->h_idx, (size_t)n_dec * KH * 4, err))))
        return rc;
    if (defer) {   /* the near output is the attention; the host step waits in the list */
        if ((rc = hkv_gpu_kv_append(qkv, b->qkv_w, n, (int64_t)b->H * d, (int64_t)(b->H + KH) * d,
                                    KH, d, b->d_dst, (int64_t)NR * d, b->near_k + lofs,
                                    b->near_v + lofs, b->st, err)) ||
            (rc = hkv_gpu_event_record(ev[1], b->st, err)) ||
            (rc = near_attend(b, layer, n_dec, err)) ||
            (rc = hkv_gpu_event_record(ev[2], b->st, err)) ||
            (rc = hkv_gpu_event_record(ev[3], b->st, err)))
            return rc;
        cb_defer_note(b, layer, segs, n_segs, n);   /* (mb < 0: half 0's events) */
        return df_run(b, 1, err);   /* the earlier layers' host steps whose rows are here */
    }
    /* Host steps stay in layer order: the deferred ones first. */
    if (b->df_count && (rc = cb_flush(b, err))) return rc;
    if (merge && ((rc = hkv_gpu_partial_clear(b->act[HKV_ACT_ATT] + r0 * b->qd, b->qd,
                                              b->d_lse + r0 * b->H, n, b->H, d, b->st, err)) ||
                  (rc = hkv_gpu_event_record(ev[1], b->st, err))))
        return rc;
    if (dev_prompt && (rc = cb_prefill_attend(b, layer, n_segs, err))) return rc;
    if (n_dec) {
        if ((rc = hkv_gpu_kv_append(qkv, b->qkv_w, n, (int64_t)b->H * d, (int64_t)(b->H + KH) * d,
                                    KH, d, b->d_dst, (int64_t)NR * d, b->near_k + lofs,
                                    b->near_v + lofs, b->st, err)))
            return rc;
        if (!n_slow && (rc = near_attend(b, layer, n_dec, err))) return rc;
    }
    if (merge && !n_slow && ((rc = hkv_gpu_event_record(ev[2], b->st, err)) ||
                             (mb >= 0 && (rc = hkv_gpu_event_record(ev[3], b->st, err)))))
        return rc;

    *h = (cb_half){.open = 1, .pp = mb >= 0, .layer = layer, .n_segs = n_segs, .n_dec = n_dec, .n_slow = n_slow,
                   .merge = merge, .dev_prompt = dev_prompt, .r0 = r0, .n = n, .segs = segs,
                   .hq = hq, .ev = ev, .ev_pending = pending};
    half_swap(b, h);   /* this step's device results into h */
    return mb < 0 || n_slow || dev_prompt ? att_end(b, h, err) : HKV_OK;
}

int cb_attention(void *self, int layer, const hkv_seg *segs, int n_segs, int64_t n, hkv_err *err) {
    cuda_be *b = self;
    b->cur_half = -1;
    int rc = cb_settle_halves(b, err);   /* (none open: the forward pass ends them) */
    return rc ? rc : att_begin(b, -1, layer, segs, n_segs, 0, n, err);
}

int cb_attention_begin(void *self, int mb, int layer, const hkv_seg *segs, int n_segs, int64_t r0,
                       int64_t n, hkv_err *err) {
    if (mb < 0 || mb > 1)
        return hkv_seterr(err, HKV_E_RANGE, "micro-batch %d: there are two (0 and 1)", mb);
    return att_begin(self, mb, layer, segs, n_segs, r0, n, err);
}

int cb_attention_end(void *self, int mb, hkv_err *err) {
    cuda_be *b = self;
    if (mb < 0 || mb > 1)
        return hkv_seterr(err, HKV_E_RANGE, "micro-batch %d: there are two (0 and 1)", mb);
    b->cur_half = mb;
    return b->half[mb].open ? att_end(b, &b->half[mb], err) : HKV_OK;
}

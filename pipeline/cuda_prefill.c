/* Prompt attention on the device.
 *
 * While a sequence's prompt is fed from position 0, the device keeps its own
 * copy of the prompt's K/V, [layer][KV head][token][d] fp16, growing by
 * doubling; each chunk's K/V are appended to it and the chunk attends it
 * causally there (gpu/attn_prefill.cu), flash style. The host still stores
 * every row in its far tier (the QKV rows come down each layer anyway: the
 * far tier is where decode reads the prompt from), but does not attend these
 * rows (HKV_SEG_STORE_ONLY): the O(n^2) part of a long prompt is the
 * device's. At the prompt's end the copy is freed; the near tier mirror is
 * then uploaded from the host as after any prompt.
 *
 * The copy costs layers x KV heads x d x 4 bytes per prompt token (128 KiB
 * for Llama-3-8B). When it cannot grow (the --gpu-mem cap, the device
 * refusing, --gpu-prompt-keys), it stays as it is and the keys past it
 * stream from the far tier through the device (cuda_prefill_stream.c), so a
 * prompt larger than the device is still attended there; the timeline counts
 * those rows (prompt_rows_streamed). When the prompt does not start at
 * position 0 (a later turn: its keys are the whole conversation, the recent
 * ones only in the near tier; such turns are short, n rows against the
 * context, the host's kind of work), or the segment holds selected
 * positions (token-selective prefill), or not even the streaming buffers
 * fit, the host attends the prompt as before (prompt_rows_host).
 * Over an 8-bit far tier (--far-kv q8) the copy holds each row as the far
 * tier returns it (hkv_gpu_kv_append_q8), so the device's prompt attends
 * the values the host path's does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"

int cb_prefill_create(cuda_be *b, const hkv_cuda_params *cp, hkv_err *err) {
    b->pp_ok = b->d % 32 == 0 && b->d <= 256;   /* the device attention kernels' shapes */
    int rc;
    if (!(b->pp = calloc((size_t)b->max_seqs, sizeof *b->pp)) ||
        !(b->pp_len = calloc((size_t)b->max_seqs * b->NL, sizeof *b->pp_len)) ||
        !(b->pp_segs = malloc((size_t)b->max_seqs * sizeof *b->pp_segs)) ||
        !(b->pp_dev = calloc((size_t)b->max_seqs, 1)) ||
        !(b->h_pdst = malloc((size_t)b->max_rows * sizeof *b->h_pdst)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the prompt copies' tables");
    if (!(b->d_pdst = cb_alloc(b, HKV_TIER_WORKSPACE, (size_t)b->max_rows * 8, err)))
        return hkv_err_prefix(err, "device prompt append offsets");
    if ((rc = cb_pstream_create(b, cp->prompt_keys, cp->prompt_block, err))) return rc;
    return HKV_OK;
}

/* Stream-ordered: released once the stream has run what reads the copy. */
static void prompt_free(cuda_be *b, int s) {
    cb_prompt *p = &b->pp[s];
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, p->k, p->bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, p->v, p->bytes, b->st);
    p->k = p->v = NULL;
    p->cap = 0, p->bytes = 0;
}

void cb_prefill_destroy(cuda_be *b) {
    cb_pstream_destroy(b);
    for (int s = 0; b->pp && s < b->max_seqs; s++) prompt_free(b, s);
    free(b->pp);
    free(b->pp_len);
    free(b->pp_segs);
    free(b->pp_dev);
    free(b->h_pdst);
}

/* Room for n tokens in sequence s's copy; 0 when the device will not give
 * it (the error is not the run's: the host attends instead). */
static int prompt_room(cuda_be *b, int s, int64_t n) {
    cb_prompt *p = &b->pp[s];
    const int64_t lim = b->ps.keys;   /* 0: as many as fit, -1: none */
    if (n <= p->cap) return 1;
    if (lim < 0 || (lim > 0 && n > lim)) return 0;
    int64_t cap = p->cap ? 2 * p->cap : 256;
    while (cap < n) cap *= 2;
    if (lim > 0 && cap > lim) cap = lim;
    const size_t rows = (size_t)b->NL * b->KH, row = (size_t)b->d * 2;
    const size_t bytes = rows * (size_t)cap * row;
    hkv_err e;
    hkv_err_clear(&e);
    /* Stream-ordered throughout: the new copy, the move of the old rows and
     * the old copy's release queue behind the work already on the stream,
     * and the host does not wait. */
    uint16_t *k = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, bytes, b->st, &e), *v = NULL;
    if (k) v = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, bytes, b->st, &e);
    if (!v) {
        hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, k, bytes, b->st);
        return 0;
    }
    if (p->cap &&   /* the tokens held so far, each (layer, KV head) row block at its new stride */
        (hkv_gpu_copy_2d(k, (size_t)cap * row, p->k, (size_t)p->cap * row, (size_t)p->cap * row,
                         rows, b->st, &e) ||
         hkv_gpu_copy_2d(v, (size_t)cap * row, p->v, (size_t)p->cap * row, (size_t)p->cap * row,
                         rows, b->st, &e))) {
        hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, k, bytes, b->st);
        hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, v, bytes, b->st);
        return 0;
    }
    prompt_free(b, s);
    p->k = k, p->v = v, p->cap = cap, p->bytes = bytes;
    return 1;
}

/* Sequence s's copy (tokens [0, pos) of every layer) stops growing: the
 * keys past it stream (the copy given up if the buffers need its room). 0
 * when not even the buffers fit. */
static int stream_begin(cuda_be *b, int s, int64_t pos) {
    cb_prompt *p = &b->pp[s];
    if (!cb_pstream_reserve(b)) {
        if (!p->cap) return 0;
        prompt_free(b, s);
        if (!cb_pstream_reserve(b)) return 0;
    }
    p->stream = 1;
    p->res = p->cap ? pos : 0;
    b->ps.active++;
    return 1;
}

static void stream_end(cuda_be *b, cb_prompt *p) {
    if (!p->stream) return;
    p->stream = 0, p->res = 0;
    if (--b->ps.active == 0) cb_pstream_release(b);
}

int cb_prefill_plan(cuda_be *b, int layer, const hkv_seg *segs, int n_segs) {
    hkv_kv *kv = &b->e->kv;
    int64_t rows = 0;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        b->pp_segs[i] = *sg;
        b->pp_dev[i] = 0;
        if (!(sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END))) continue;
        const int s = sg->seq;
        cb_prompt *p = &b->pp[s];
        int64_t *len = b->pp_len + (size_t)s * b->NL;
        const uint64_t ep = hkv_kv_seq_epoch(kv, s);
        if (sg->pos == 0) {   /* a prompt from the start: a fresh copy, this layer */
            if (layer == 0) {
                stream_end(b, p);   /* (one given up before its end) */
                p->off = 0, p->epoch = ep;
            }
            len[layer] = 0;
        }
        p->step_layer = layer, p->step_end = -1;
        int dev = b->pp_ok && !p->off && !sg->pos_list && p->epoch == ep && len[layer] == sg->pos;
        if (dev && !p->stream && !prompt_room(b, s, sg->pos + sg->n) &&
            !stream_begin(b, s, sg->pos)) {
            p->off = 1;   /* no room even to stream: the host attends the rest of this prompt */
            dev = 0;
        }
        if (!dev) {
            b->stats.prompt_rows_host += sg->n;
            /* a head size the prefill kernels do not take: every prompt row, counted (a
             * later turn, selected positions or no room are prompt_rows_host alone) */
            if (!b->pp_ok) b->stats.fallbacks[HKV_FALLBACK_SHAPE] += sg->n;
            continue;
        }
        p->step_end = p->stream ? p->res : sg->pos + sg->n;   /* (what the index build may read) */
        b->pp_segs[i].flags |= HKV_SEG_STORE_ONLY;
        b->pp_dev[i] = 1;
        rows += sg->n;
    }
    return rows > 0;
}

int cb_prefill_attend(cuda_be *b, int layer, int n_segs, hkv_err *err) {
    const int KH = b->KH, d = b->d;
    const float scale = 1.0f / sqrtf((float)d);
    int rc;
    for (int i = 0; i < n_segs; i++) {
        if (!b->pp_dev[i]) continue;
        const hkv_seg *sg = &b->pp_segs[i];
        cb_prompt *p = &b->pp[sg->seq];
        if (p->stream) {
            if ((rc = cb_pstream_attend(b, layer, sg, p, err))) return rc;
            b->stats.prompt_rows_dev += sg->n;
            b->stats.prompt_rows_streamed += sg->n;
            continue;
        }
        const size_t lofs = (size_t)layer * KH * p->cap * d;
        for (int64_t r = 0; r < sg->n; r++) b->h_pdst[r] = (sg->pos + r) * d;
        if ((rc = cb_stage(b, -1, b->d_pdst, b->h_pdst, (size_t)sg->n * 8, err)) ||
            (rc = (hkv_kv_seq_far_q8(&b->e->kv, sg->seq) ? hkv_gpu_kv_append_q8 : hkv_gpu_kv_append)(
                 b->act[HKV_ACT_QKV] + sg->row * b->qkv_w, b->qkv_w, sg->n, (int64_t)b->H * d,
                 (int64_t)(b->H + KH) * d, KH, d, b->d_pdst, p->cap * d, p->k + lofs, p->v + lofs,
                 b->st, err)) ||
            (rc = hkv_gpu_attn_prefill(b->act[HKV_ACT_QKV] + sg->row * b->qkv_w, b->qkv_w, sg->n,
                                       b->H, KH, d, sg->pos, p->k + lofs, p->v + lofs, d,
                                       p->cap * d, scale, b->act[HKV_ACT_ATT] + sg->row * b->qd,
                                       b->qd, b->d_lse + sg->row * b->H, b->st, err)))
            return rc;
        b->stats.prompt_rows_dev += sg->n;
    }
    return HKV_OK;
}

int cb_prefill_done(cuda_be *b, int layer, int n_segs, hkv_err *err) {
    int rc, synced = 0;
    /* the call's last layer: no copy may still read a far tier that the
     * caller could free or rewrite once the call returns */
    if (layer == b->NL - 1 && (rc = cb_pstream_wait(b, err))) return rc;
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &b->pp_segs[i];
        cb_prompt *p = &b->pp[sg->seq];
        if (b->pp_dev[i]) b->pp_len[(size_t)sg->seq * b->NL + layer] = sg->pos + sg->n;
        if ((sg->flags & HKV_SEG_PROMPT_END) && layer == b->NL - 1 && (p->cap || p->stream)) {
            if (!synced && (rc = hkv_gpu_sync(b->st, err))) return rc;   /* in use until then */
            synced = 1;
            prompt_free(b, sg->seq);   /* the prompt is in */
            stream_end(b, p);
        }
    }
    return HKV_OK;
}

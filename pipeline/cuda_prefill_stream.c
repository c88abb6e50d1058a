/* A prompt's attention on the device when its K/V copy does not fit.
 *
 * cuda_prefill.c keeps a device copy of the prompt's K/V while it is fed,
 * [layer][KV head][token][d]: 128 KiB a token for Llama-3-8B, so a 128K
 * prompt's copy is 16 GiB, more than a 24 GB card holds beside the weights.
 * When the copy cannot grow (the device refuses, the --gpu-mem cap, or
 * --gpu-prompt-keys), it stays as it is, holding tokens [0, res), and each
 * later chunk of n rows at positions [pos, pos + n) attends, per layer:
 *
 *   its own keys, causally          the chunk's K/V appended to a small
 *                                   buffer, attn_prefill at p0 = 0: the
 *                                   first partial, into the output
 *   the copy's [0, res)             attn_prefill_keys at p0 = nk = res
 *   the far tier's [res, pos)       blocks of blk keys copied from the host's
 *                                   (page-locked) far tier on a copy stream
 *                                   into two staging buffers, the copy of
 *                                   block i+1 beside the attention of block i
 *
 * each partial merged exactly into the output (gpu/attn_decode.cu's merge,
 * cpu/merge.c's formula). The host's far tier holds every prompt row while
 * the prompt is fed (the host step of each earlier chunk stored them before
 * this chunk began), and the copies read only rows before pos while the
 * host's step of this chunk writes rows from pos on.
 *
 * Cost per layer and chunk: KV heads x (pos - res) x d x 4 bytes over PCIe
 * (a 4090's ~25 GB/s) against 4 x n x heads x (pos - res) x d flops of
 * attention: the copy hides behind the attention when the chunk has more
 * than about (tensor rate / PCIe rate) x KV heads / heads rows, ~800 for
 * Llama-3-8B on a 4090 (a PREDICTION from data sheets: no GPU measured it);
 * smaller chunks are bound by the copy. */
#include <math.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"

#define PS_MIN_BLOCK 256   /* below this a block's launches cost more than its keys */

int cb_pstream_create(cuda_be *b, int64_t keys, int64_t blk, hkv_err *err) {
    cb_pstream *ps = &b->ps;
    int rc;
    ps->keys = keys;
    ps->blk_want = blk > 0 ? blk : HKV_PROMPT_BLOCK_DEFAULT;
    if ((rc = hkv_gpu_stream_create(&ps->cst, err))) return hkv_err_prefix(err, "prompt copy stream");
    for (int t = 0; t < 2; t++)
        if ((rc = hkv_gpu_event_create(&ps->copied[t], err)) ||
            (rc = hkv_gpu_event_create(&ps->used[t], err)) ||
            (rc = hkv_gpu_event_record(ps->used[t], b->st, err)))   /* both buffers free */
            return rc;
    return HKV_OK;
}

static void free_buffers(cuda_be *b) {
    cb_pstream *ps = &b->ps;
    for (int t = 0; t < 2; t++) {
        hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, ps->k[t], ps->stage_bytes, b->st);
        hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, ps->v[t], ps->stage_bytes, b->st);
        ps->k[t] = ps->v[t] = NULL;
    }
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, ps->ck, ps->chunk_bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, ps->cv, ps->chunk_bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, ps->po, (size_t)b->max_rows * b->qd * 4, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, ps->pl, (size_t)b->max_rows * b->H * 4, b->st);
    ps->ck = ps->cv = NULL, ps->po = ps->pl = NULL;
    ps->blk = 0, ps->stage_bytes = ps->chunk_bytes = 0;
}

void cb_pstream_destroy(cuda_be *b) {
    cb_pstream *ps = &b->ps;
    if (ps->cst) hkv_gpu_sync(ps->cst, NULL);   /* no copy still reading the far tier */
    if (ps->blk) free_buffers(b);
    for (int t = 0; t < 2; t++) {
        hkv_gpu_event_destroy(ps->copied[t]);
        hkv_gpu_event_destroy(ps->used[t]);
    }
    if (ps->cst) hkv_gpu_stream_destroy(ps->cst);
    memset(ps, 0, sizeof *ps);
}

/* The buffers at blk keys a block; 0 when the device refuses (all freed). */
static int try_alloc(cuda_be *b, int64_t blk) {
    cb_pstream *ps = &b->ps;
    hkv_err e;
    hkv_err_clear(&e);
    ps->blk = blk;
    ps->stage_bytes = (size_t)b->KH * blk * b->d * 2;
    ps->chunk_bytes = (size_t)b->KH * b->max_rows * b->d * 2;
    int ok = 1;
    for (int t = 0; t < 2 && ok; t++)
        ok = (ps->k[t] = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, ps->stage_bytes, b->st, &e)) &&
             (ps->v[t] = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, ps->stage_bytes, b->st, &e));
    ok = ok && (ps->ck = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, ps->chunk_bytes, b->st, &e)) &&
         (ps->cv = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, ps->chunk_bytes, b->st, &e)) &&
         (ps->po = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, (size_t)b->max_rows * b->qd * 4,
                                       b->st, &e)) &&
         (ps->pl = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, (size_t)b->max_rows * b->H * 4,
                                       b->st, &e));
    if (!ok) free_buffers(b);   /* (free_async ignores the NULLs) */
    return ok;
}

int cb_pstream_reserve(cuda_be *b) {
    cb_pstream *ps = &b->ps;
    if (ps->blk) return 1;
    /* the block asked for, then halves of it: a smaller block only costs
     * more launches and merges */
    for (int64_t blk = ps->blk_want; blk >= PS_MIN_BLOCK || blk == ps->blk_want; blk /= 2)
        if (try_alloc(b, blk)) return 1;
    return 0;
}

void cb_pstream_release(cuda_be *b) {
    if (b->ps.blk) free_buffers(b);
}

int cb_pstream_wait(cuda_be *b, hkv_err *err) {
    cb_pstream *ps = &b->ps;
    if (!ps->queued) return HKV_OK;
    ps->queued = 0;
    return hkv_gpu_sync(ps->cst, err);
}

int cb_pstream_attend(cuda_be *b, int layer, const hkv_seg *sg, const cb_prompt *p, hkv_err *err) {
    cb_pstream *ps = &b->ps;
    const int H = b->H, KH = b->KH, d = b->d;
    const float scale = 1.0f / sqrtf((float)d);
    const int64_t n = sg->n, pos = sg->pos, hs = (int64_t)b->max_rows * d;
    const float *q = b->act[HKV_ACT_QKV] + sg->row * b->qkv_w;
    float *out = b->act[HKV_ACT_ATT] + sg->row * b->qd, *lse = b->d_lse + sg->row * H;
    int rc;
    /* the chunk's own keys, causally: the first partial, into the output */
    for (int64_t r = 0; r < n; r++) b->h_pdst[r] = r * d;
    if ((rc = cb_stage(b, -1, b->d_pdst, b->h_pdst, (size_t)n * 8, err)) ||
        (rc = (hkv_kv_seq_far_q8(&b->e->kv, sg->seq) ? hkv_gpu_kv_append_q8 : hkv_gpu_kv_append)(
             q, b->qkv_w, n, (int64_t)H * d, (int64_t)(H + KH) * d, KH, d, b->d_pdst, hs, ps->ck,
             ps->cv, b->st, err)) ||
        (rc = hkv_gpu_attn_prefill(q, b->qkv_w, n, H, KH, d, 0, ps->ck, ps->cv, d, hs, scale, out,
                                   b->qd, lse, b->st, err)))
        return rc;
    /* the copy's tokens: all of them for every row */
    if (p->res > 0) {
        const size_t lofs = (size_t)layer * KH * p->cap * d;
        if ((rc = hkv_gpu_attn_prefill_keys(q, b->qkv_w, n, H, KH, d, p->res, p->res, p->k + lofs,
                                            p->v + lofs, d, p->cap * d, scale, ps->po, b->qd, ps->pl,
                                            b->st, err)) ||
            (rc = hkv_gpu_attn_merge(out, lse, ps->po, ps->pl, n * H, d, b->st, err)))
            return rc;
    }
    if (p->res >= pos) return HKV_OK;
    /* the far tier's tokens [res, pos), a block at a time */
    hkv_far_view fv;
    if ((rc = hkv_kv_far_view(&b->e->kv, sg->seq, layer, &fv, err))) return rc;
    if (fv.ld != d)
        return hkv_seterr(err, HKV_E_INTERNAL, "far tier rows of %lld halves, not %d: cannot stream "
                          "them as blocks", (long long)fv.ld, d);
    for (int64_t b0 = p->res; b0 < pos; b0 += ps->blk) {
        const int64_t nb = pos - b0 < ps->blk ? pos - b0 : ps->blk;
        const int t = ps->turn;
        const size_t bytes = (size_t)nb * d * 2;
        ps->turn ^= 1;
        if ((rc = hkv_gpu_stream_wait(ps->cst, ps->used[t], err))) return rc;   /* t is free */
        for (int h = 0; h < KH; h++)
            if ((rc = cb_upload_far(b, ps->k[t] + (size_t)h * ps->blk * d,
                                    ps->v[t] + (size_t)h * ps->blk * d, &fv, h, b0, nb, ps->cst,
                                    err)))
                return rc;
        ps->queued = 1;
        if ((rc = hkv_gpu_event_record(ps->copied[t], ps->cst, err)) ||
            (rc = hkv_gpu_stream_wait(b->st, ps->copied[t], err)) ||
            (rc = hkv_gpu_attn_prefill_keys(q, b->qkv_w, n, H, KH, d, nb, nb, ps->k[t], ps->v[t], d,
                                            ps->blk * d, scale, ps->po, b->qd, ps->pl, b->st, err)) ||
            (rc = hkv_gpu_attn_merge(out, lse, ps->po, ps->pl, n * H, d, b->st, err)) ||
            (rc = hkv_gpu_event_record(ps->used[t], b->st, err)))
            return rc;
        b->stats.bytes_h2d += 2 * KH * bytes;
    }
    return HKV_OK;
}

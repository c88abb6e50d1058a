/* A policy's prompt-end work on the device (index/policy.h, hkv_far_accel):
 * ctkvr's index build and the eviction policies' window scores.
 *
 * ctkvr's prompt end ranks every far key for each of C centroids per KV
 * head: C x n_far x n_head x d multiply-adds per layer (550 GFLOP per layer
 * for Llama-3-8B at C = 2048 and a 32K prompt), the heaviest step of the
 * whole policy and a GPU-sized one. When the device still holds the prompt's
 * K/V (cuda_prefill.c: the copy lives until the prompt's last layer is
 * done) the pipeline offers the build to the policy: the centroid queries
 * and slots go up, gpu/ctkvr_build.cu ranks the keys, and the lists come
 * down into the policy's own arrays, which stay the index decode reads. The
 * device's ranking equals the host's except where float32 scores tie at the
 * rho-th place (tests/gpu/test_gpu_ctkvr.c). When the device holds no copy
 * of the layer's keys (a prompt too large for it, whose keys streamed:
 * cuda_prefill_stream.c), the layer's far keys go up from the far tier for
 * the build alone: KV heads x n_far x d x 2 bytes (256 MiB for Llama-3-8B at
 * 128K, one layer at a time) against a host build of minutes at that size.
 * Only first builds (each KV head's slots 0..n-1) are taken; a later turn's
 * partial rebuild or no room for the scratch leave the build to the host
 * (counted: index_builds_device / index_builds_host, and the reason in
 * fallbacks).
 *
 * The window scores of snapkv, rocketkv's stage 1, fastkv, laq and speckv
 * (index/window_scores.h: each window query's softmax over the far keys,
 * summed or maxed over the window and the group) are window x n_far x
 * n_head x d x 4 flops a layer, 67 GFLOP for Llama-3-8B at a 128K prompt and
 * the default 32-row window: the far keys go up from the page-locked far
 * tier (KV heads x n_far x d x 2 bytes, K only), gpu/window_scores.cu scores
 * them and the scores come down; pooling and the top-k stay with the policy
 * (O(n_far)). A far view with absent positions (after a token-selective
 * prefill) or no room leave them to the host (window_scores_device /
 * window_scores_host, and the reason in fallbacks).
 *
 * Each op's capability query (takes_*) is asked once per (sequence, layer)
 * and counts its no; the op itself can still find no room now, also
 * counted. */
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"
#include "window_scores.h"

/* Scratch of one build, freed in reverse; stream-ordered, so a build inside
 * a prompt's last step never waits for the whole device. */
typedef struct bscratch { void *p[8]; size_t n[8]; int k; } bscratch;

static void *bs_alloc(cuda_be *b, bscratch *s, size_t bytes) {
    hkv_err e;
    hkv_err_clear(&e);
    void *p = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, bytes, b->st, &e);
    if (p) s->p[s->k] = p, s->n[s->k++] = bytes;
    return p;
}

static void bs_free(cuda_be *b, bscratch *s) {
    while (s->k > 0) {
        s->k--;
        hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, s->p[s->k], s->n[s->k], b->st);
    }
}

/* Whether the device builds these lists (policy.h, hkv_far_accel). */
static int top_lists_why(const cuda_be *b, int s, int layer, const hkv_far_view *far, int64_t n,
                         int n_head, int64_t rho, const int32_t *slot, int64_t n_slots) {
    if (s < 0 || s >= b->max_seqs || layer < 0 || layer >= b->NL || n_head != b->H || n < 1 ||
        n > n_slots || rho < 1 || far->n_head_kv != b->KH || far->head_dim != b->d ||
        far->lo < 0 || far->hi <= far->lo || far->ld != b->d)
        return HKV_FALLBACK_SHAPE;
    if (far->rows) return HKV_FALLBACK_ABSENT_ROWS;
    for (int h = 0; h < b->KH; h++)
        for (int64_t i = 0; i < n; i++)
            if (slot[(size_t)h * n + i] != i) return HKV_FALLBACK_PARTIAL_REBUILD;
    return HKV_FALLBACK_NONE;
}

static int takes_top_lists(const hkv_far_accel *a, int layer, const hkv_far_view *far, int64_t n,
                           int n_head, int64_t rho, const int32_t *slot, int64_t n_slots) {
    cuda_be *b = a->ud;
    const int why = top_lists_why(b, a->seq, layer, far, n, n_head, rho, slot, n_slots);
    if (why) b->stats.index_builds_host++;
    return cb_fallback(b, why);
}

static int top_lists(const hkv_far_accel *a, int layer, const hkv_far_view *far, const uint16_t *q,
                     int64_t ldq, int64_t n, int n_head, int64_t rho, const int32_t *slot,
                     int32_t *ivf, int32_t *len, int64_t n_slots, int *fallback, hkv_err *err) {
    cuda_be *b = a->ud;
    const int s = a->seq, KH = b->KH, H = b->H, d = b->d;
    *fallback = HKV_FALLBACK_NONE;
    if (top_lists_why(b, s, layer, far, n, n_head, rho, slot, n_slots))
        return hkv_seterr(err, HKV_E_INVAL, "device index build, sequence %d layer %d: not a "
                          "build the device takes (ask takes_top_lists first)", s, layer);
    const cb_prompt *p = &b->pp[s];
    /* the prompt's copy holds these keys, or they go up for the build */
    const int copy = p->cap && p->step_layer == layer && p->step_end >= far->hi;
    const int64_t n_far = far->hi - far->lo;
    const size_t krow = (size_t)far->hi * d;   /* an uploaded head's rows [0, hi) (lo.. used) */
    /* the scratch besides the workspace, which shrinks to what the cap leaves */
    const size_t fixed = (copy ? 0 : (size_t)KH * krow * 2) + 2 * (size_t)n * H * d * 2 +
                         (size_t)KH * n * (rho + 2) * 4 + (size_t)KH * 2 * 4;
    size_t ws = hkv_gpu_ctkvr_build_ws_bytes(n_far, n);
    const size_t ws_min = hkv_gpu_ctkvr_build_ws_bytes(n_far, 1);
    const int room = !b->offload_mem || b->offload_mem >= fixed + ws_min;
    const size_t ws_cap = b->offload_mem && room ? b->offload_mem - fixed : (size_t)256 << 20;
    if (ws > ws_cap) ws = ws_cap > ws_min ? ws_cap : ws_min;
    bscratch sc = {0};
    hkv_gpu_ctkvr ix = {.n_seq = 1, .n_head = H, .n_head_kv = KH, .d = d, .C = n, .rho = rho};
    int32_t *dslot;
    uint16_t *dq, *dk = NULL;
    void *dws;
    if (!room || (!copy && !(dk = bs_alloc(b, &sc, (size_t)KH * krow * 2))) ||
        !(ix.cent = bs_alloc(b, &sc, (size_t)n * H * d * 2)) ||
        !(ix.ivf = bs_alloc(b, &sc, (size_t)KH * n * rho * 4)) ||
        !(ix.len = bs_alloc(b, &sc, (size_t)KH * n * 4)) ||
        !(ix.fifo = bs_alloc(b, &sc, (size_t)KH * 2 * 4)) ||
        !(dslot = bs_alloc(b, &sc, (size_t)KH * n * 4)) ||
        !(dq = bs_alloc(b, &sc, (size_t)n * H * d * 2)) || !(dws = bs_alloc(b, &sc, ws))) {
        bs_free(b, &sc);
        b->stats.index_builds_host++;   /* no room on the device now */
        *fallback = cb_fallback(b, HKV_FALLBACK_NO_ROOM);
        return HKV_OK;
    }
    int rc = HKV_OK;
    if (ldq == (int64_t)H * d)
        rc = hkv_gpu_upload(dq, q, (size_t)n * H * d * 2, b->st, err);
    for (int64_t i = 0; !rc && ldq != (int64_t)H * d && i < n; i++)
        rc = hkv_gpu_upload(dq + (size_t)i * H * d, q + i * ldq, (size_t)H * d * 2, b->st, err);
    const size_t lofs = (size_t)layer * KH * p->cap * d;
    const uint16_t *keys = copy ? p->k + lofs : dk;
    const int64_t khs = copy ? p->cap * d : (int64_t)krow;
    const size_t fbytes = (size_t)(far->hi - far->lo) * d * 2;
    for (int h = 0; !rc && !copy && h < KH; h++)   /* page-locked far rows, asynchronously */
        rc = cb_upload_far(b, dk + h * krow + (size_t)far->lo * d, NULL, far, h, far->lo,
                           far->hi - far->lo, b->st, err);
    if (!rc && !(rc = hkv_gpu_upload(dslot, slot, (size_t)KH * n * 4, b->st, err)))
        rc = hkv_gpu_ctkvr_build(&ix, 0, dq, (int64_t)H * d, n, dslot, keys, d, khs, far->lo,
                                 far->hi, dws, ws, b->st, err);
    for (int h = 0; !rc && h < KH; h++)   /* each head's n lists into its first n slots */
        if (!(rc = hkv_gpu_download(ivf + (size_t)h * n_slots * rho, ix.ivf + (size_t)h * n * rho,
                                    (size_t)n * rho * 4, b->st, err)))
            rc = hkv_gpu_download(len + (size_t)h * n_slots, ix.len + (size_t)h * n, (size_t)n * 4,
                                  b->st, err);
    if (!rc) rc = hkv_gpu_sync(b->st, err);
    bs_free(b, &sc);
    if (rc) return hkv_err_prefix(err, "device index build, sequence %d layer %d", s, layer);
    b->stats.bytes_h2d += (size_t)n * H * d * 2 + (size_t)KH * n * 4 + (copy ? 0 : KH * fbytes);
    b->stats.bytes_d2h += (size_t)KH * n * (rho + 1) * 4;
    b->stats.index_builds_dev++;
    return HKV_OK;
}

/* Whether the device scores this job (policy.h, hkv_far_accel). */
static int window_scores_why(const cuda_be *b, const hkv_ws_job *j) {
    const hkv_far_view *far = j->far;
    const hkv_query_view *qv = j->qv;
    const int KH = b->KH, H = b->H, d = b->d;
    if (far->rows) return HKV_FALLBACK_ABSENT_ROWS;
    if (far->n_head_kv != KH || far->head_dim != d || j->n_head != H || far->ld != d ||
        far->hi - far->lo < 1 || qv->n < 1 || !qv->q || (d & 1) || d > 256 ||
        qv->n * (H / KH) > 65535)
        return HKV_FALLBACK_SHAPE;
    for (int h = 0; h < KH; h++)   /* some KV head has keys to score */
        if ((j->rows ? j->n_rows[h] : far->hi - far->lo) > 0) return HKV_FALLBACK_NONE;
    return HKV_FALLBACK_SHAPE;
}

static int takes_window_scores(const hkv_far_accel *a, const hkv_ws_job *j) {
    cuda_be *b = a->ud;
    const int why = window_scores_why(b, j);
    if (why) b->stats.window_scores_host++;
    return cb_fallback(b, why);
}

static int window_scores(const hkv_far_accel *a, const hkv_ws_job *j, int *fallback,
                         hkv_err *err) {
    cuda_be *b = a->ud;
    const hkv_far_view *far = j->far;
    const hkv_query_view *qv = j->qv;
    const int KH = b->KH, H = b->H, d = b->d;
    const int64_t lo = far->lo, n_all = far->hi - far->lo, W = qv->n;
    *fallback = HKV_FALLBACK_NONE;
    if (window_scores_why(b, j))
        return hkv_seterr(err, HKV_E_INVAL, "device window scores, sequence %d: not a job the "
                          "device takes (ask takes_window_scores first)", a->seq);
    int64_t nmax = 0;   /* scored keys per KV head */
    for (int h = 0; h < KH; h++) {
        const int64_t n = j->rows ? j->n_rows[h] : n_all;
        if (n > nmax) nmax = n;
    }
    bscratch sc = {0};
    uint16_t *dk, *dq;
    float *dout, *dw = NULL;
    int32_t *drows = NULL, *dn = NULL, *hrows = NULL;
    void *dws;
    const size_t wsb = hkv_gpu_window_scores_ws_bytes(W, H, nmax), krow = (size_t)far->hi * d;
    const size_t total = (size_t)KH * krow * 2 + (size_t)W * H * d * 2 + (size_t)KH * nmax * 4 +
                         wsb + (j->q_weight ? (size_t)W * 4 : 0) +
                         (j->rows ? (size_t)KH * (nmax + 1) * 4 : 0);
    if ((b->offload_mem && total > b->offload_mem) || !(dk = bs_alloc(b, &sc, (size_t)KH * krow * 2)) ||
        !(dq = bs_alloc(b, &sc, (size_t)W * H * d * 2)) ||
        !(dout = bs_alloc(b, &sc, (size_t)KH * nmax * 4)) || !(dws = bs_alloc(b, &sc, wsb)) ||
        (j->q_weight && !(dw = bs_alloc(b, &sc, (size_t)W * 4))) ||
        (j->rows && (!(drows = bs_alloc(b, &sc, (size_t)KH * nmax * 4)) ||
                     !(dn = bs_alloc(b, &sc, (size_t)KH * 4))))) {
        bs_free(b, &sc);
        b->stats.window_scores_host++;   /* no room now */
        *fallback = cb_fallback(b, HKV_FALLBACK_NO_ROOM);
        return HKV_OK;
    }
    if (j->rows && !(hrows = malloc((size_t)KH * (nmax + 1) * 4))) {
        bs_free(b, &sc);
        return hkv_seterr(err, HKV_E_NOMEM, "device window scores, sequence %d: no host memory "
                          "for the row lists", a->seq);
    }
    /* Keys of [lo, hi) where the far view has them (rows [0, lo) unused) */
    int rc = HKV_OK;
    for (int h = 0; !rc && h < KH; h++)
        rc = cb_upload_far(b, dk + h * krow + (size_t)lo * d, NULL, far, h, lo, n_all, b->st, err);
    for (int64_t r = 0; !rc && r < W; r++)
        rc = hkv_gpu_upload(dq + (size_t)r * H * d, qv->q + r * qv->ld, (size_t)H * d * 2, b->st,
                            err);
    if (!rc && dw) rc = hkv_gpu_upload(dw, j->q_weight, (size_t)W * 4, b->st, err);
    if (!rc && hrows) {
        int32_t *hn = hrows + (size_t)KH * nmax;
        for (int h = 0; h < KH; h++) {
            hn[h] = (int32_t)j->n_rows[h];
            for (int64_t i = 0; i < j->n_rows[h]; i++)
                hrows[(size_t)h * nmax + i] = j->rows[h][i];
        }
        if (!(rc = hkv_gpu_upload(drows, hrows, (size_t)KH * nmax * 4, b->st, err)))
            rc = hkv_gpu_upload(dn, hn, (size_t)KH * 4, b->st, err);
    }
    if (!rc)
        rc = hkv_gpu_window_scores(dq, (int64_t)H * d, W, qv->pos0, H, KH, d, dk, d,
                                   (int64_t)krow, lo, j->rows ? nmax : n_all, drows, nmax, dn, dw,
                                   j->reduce_max, dout, nmax, dws, wsb, b->st, err);
    for (int h = 0; !rc && h < KH; h++)
        rc = hkv_gpu_download(j->out + (size_t)h * j->ld_out, dout + (size_t)h * nmax,
                              (size_t)(j->rows ? j->n_rows[h] : n_all) * 4, b->st, err);
    if (!rc) rc = hkv_gpu_sync(b->st, err);   /* (the host copies above are read by then) */
    bs_free(b, &sc);
    free(hrows);
    if (rc) return hkv_err_prefix(err, "device window scores, sequence %d", a->seq);
    b->stats.bytes_h2d += (size_t)KH * n_all * d * 2 + (size_t)W * H * d * 2;
    b->stats.bytes_d2h += (size_t)KH * nmax * 4;
    b->stats.window_scores_dev++;
    return HKV_OK;
}

void cb_index_attach(cuda_be *b) {
    const hkv_far_accel a = {.takes_top_lists = takes_top_lists, .top_lists = top_lists,
                             .takes_window_scores = takes_window_scores,
                             .window_scores = window_scores, .ud = b};
    hkv_kv_set_far_accel(&b->e->kv, &a);
}

void cb_index_detach(cuda_be *b) {
    if (b->e) hkv_kv_set_far_accel(&b->e->kv, NULL);
}

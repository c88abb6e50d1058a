/* Index builds on the device at prompt end (index/policy.h, hkv_far_accel).
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
 * (counted: index_builds_device / index_builds_host). */
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_tiered.h"

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

static int top_lists(const hkv_far_accel *a, int layer, const hkv_far_view *far, const uint16_t *q,
                     int64_t ldq, int64_t n, int n_head, int64_t rho, const int32_t *slot,
                     int32_t *ivf, int32_t *len, int64_t n_slots, hkv_err *err) {
    cuda_be *b = a->ud;
    const int s = a->seq, KH = b->KH, H = b->H, d = b->d;
    if (s < 0 || s >= b->max_seqs || layer < 0 || layer >= b->NL || n_head != H || n < 1 ||
        n > n_slots || rho < 1 || far->n_head_kv != KH || far->head_dim != d || far->rows)
        return HKV_E_UNSUPPORTED;
    const cb_prompt *p = &b->pp[s];
    if (far->lo < 0 || far->hi <= far->lo || far->ld != d) goto host;
    /* the prompt's copy holds these keys, or they go up for the build */
    const int copy = p->cap && p->step_layer == layer && p->step_end >= far->hi;
    for (int h = 0; h < KH; h++)
        for (int64_t i = 0; i < n; i++)
            if (slot[(size_t)h * n + i] != i) goto host;   /* not a first build */
    const int64_t n_far = far->hi - far->lo;
    size_t ws = hkv_gpu_ctkvr_build_ws_bytes(n_far, n);
    const size_t ws_min = hkv_gpu_ctkvr_build_ws_bytes(n_far, 1), ws_cap = (size_t)256 << 20;
    if (ws > ws_cap) ws = ws_cap > ws_min ? ws_cap : ws_min;
    bscratch sc = {0};
    hkv_gpu_ctkvr ix = {.n_seq = 1, .n_head = H, .n_head_kv = KH, .d = d, .C = n, .rho = rho};
    int32_t *dslot;
    uint16_t *dq, *dk = NULL;
    void *dws;
    const size_t krow = (size_t)far->hi * d;   /* an uploaded head's rows [0, hi) (lo.. used) */
    if ((!copy && !(dk = bs_alloc(b, &sc, (size_t)KH * krow * 2))) ||
        !(ix.cent = bs_alloc(b, &sc, (size_t)n * H * d * 2)) ||
        !(ix.ivf = bs_alloc(b, &sc, (size_t)KH * n * rho * 4)) ||
        !(ix.len = bs_alloc(b, &sc, (size_t)KH * n * 4)) ||
        !(ix.fifo = bs_alloc(b, &sc, (size_t)KH * 2 * 4)) ||
        !(dslot = bs_alloc(b, &sc, (size_t)KH * n * 4)) ||
        !(dq = bs_alloc(b, &sc, (size_t)n * H * d * 2)) || !(dws = bs_alloc(b, &sc, ws))) {
        bs_free(b, &sc);
        goto host;   /* no room on the device now */
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
        rc = hkv_gpu_upload(dk + h * krow + (size_t)far->lo * d, far->k[h] + far->lo * far->ld,
                            fbytes, b->st, err);
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
host:
    b->stats.index_builds_host++;
    return HKV_E_UNSUPPORTED;
}

void cb_index_attach(cuda_be *b) {
    const hkv_far_accel a = {.top_lists = top_lists, .ud = b};
    hkv_kv_tiered_set_accel(&b->e->kv, &a);
}

void cb_index_detach(cuda_be *b) {
    if (b->e) hkv_kv_tiered_set_accel(&b->e->kv, NULL);
}

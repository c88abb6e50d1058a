/* The device benchmark's index-build rows: ctkvr's prompt-end build of one
 * layer as the pipeline runs it (pipeline/cuda_index.c, hkv_gpu_ctkvr_build)
 * at Llama-3-8B's shape and CTKVR's default index: C 2048 centroids of 32
 * query heads x 128 (8 KV heads, g 4), lists of rho 2560, over a far tier
 * of 32K and 96K keys, with the workspace the pipeline gives it (256 MiB:
 * ~680 centroids a launch at 96K); both score kernels, CUDA cores and
 * tensor cores.
 *
 * Why: on the H200 (docs/GPU_MEASURED.md) the split's 96K time to first
 * token was the prefill plus 18 s of index build at 3x the default budget;
 * with the prefill's attention on mma.sync the build is the gap between
 * the split's TTFT and dense's. These rows say what a layer's build costs
 * and how much of it the scores are (the tensor-core row is nearly all
 * radix select).
 *
 * FLOPs: 2 g d per centroid, KV head and key. Bytes: the keys and queries
 * read once, the fp32 scores written once and read by the select's ~6
 * passes (4 radix digits, the keys above the cut, the ties), the lists. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_gpu_impl.h"
#include "gpu_kernels.h"

#define BD_KH 8
#define BD_H 32
#define BD_D 128
#define BD_RHO 2560
#define BD_WS ((size_t)256 << 20)

typedef struct bd_call {
    bg *b;
    hkv_gpu_ctkvr ix;
    const uint16_t *q, *k;
    int32_t *slot;
    int64_t n, nfar;
    void *ws;
    size_t ws_bytes;
    hkv_gpu_scores_kernel kernel;
} bd_call;

static int build_fn(void *arg, int copy, hkv_err *err)
{
    const bd_call *c = arg;
    (void)copy;
    return hkv_gpu_ctkvr_build_with(&c->ix, 0, c->q, (int64_t)BD_H * BD_D, c->n, c->slot, c->k,
                                    BD_D, c->nfar * BD_D, 0, c->nfar, c->ws, c->ws_bytes,
                                    c->kernel, c->b->st, err);
}

static int build_row(bg *b, bd_call *c, hkv_err *err)
{
    const int simt = c->kernel == HKV_GPU_SCORES_SIMT;
    bg_row r = {.group = "index", .link = BG_DRAM, .unit = simt ? BG_FP32 : BG_TENSOR};
    const double g = (double)BD_H / BD_KH, n = (double)c->n, nfar = (double)c->nfar;
    r.flops = 2.0 * BD_KH * n * g * nfar * BD_D;
    r.bytes = BD_KH * nfar * BD_D * 2.0 + n * BD_H * BD_D * 2.0 + 7.0 * BD_KH * n * nfar * 4 +
              BD_KH * n * (BD_RHO + 1) * 4.0;
    snprintf(r.kernel, sizeof r.kernel, "ctkvr build %s", simt ? "simt" : "mma");
    snprintf(r.shape, sizeof r.shape, "KH8 g4 d128 C%lld rho%d over %lld keys", (long long)c->n,
             BD_RHO, (long long)c->nfar);
    int rc = bg_time(b, build_fn, c, 1, 1, &r, err);
    if (!rc)
        rc = bg_add(b, &r,
                    json_pack("{s:i,s:i,s:i,s:I,s:i,s:I,s:I,s:s}", "n_head_kv", BD_KH, "g",
                              BD_H / BD_KH, "d", BD_D, "C", (json_int_t)c->n, "rho", BD_RHO,
                              "n_far", (json_int_t)c->nfar, "ws_bytes", (json_int_t)c->ws_bytes,
                              "path", simt ? "simt" : "mma"),
                    err);
    return rc;
}

/* Both kernels over one far tier (n centroids); a device without mma.sync
 * says so on stderr in the tensor-core row's place. */
static int build_rows(bg *b, int64_t n, int64_t nfar, hkv_err *err)
{
    const size_t kb = (size_t)BD_KH * nfar * BD_D * 2, qb = (size_t)n * BD_H * BD_D * 2;
    const size_t cb = qb, lb = (size_t)BD_KH * n * BD_RHO * 4, nb = (size_t)BD_KH * n * 4;
    size_t wsb = hkv_gpu_ctkvr_build_ws_bytes(nfar, n);
    if (wsb > BD_WS) wsb = BD_WS;
    bd_call c = {.b = b, .n = n, .nfar = nfar, .ws_bytes = wsb,
                 .ix = {.n_seq = 1, .n_head = BD_H, .n_head_kv = BD_KH, .d = BD_D, .C = n,
                        .rho = BD_RHO}};
    int32_t *hs = malloc(nb);
    int rc = hs ? HKV_OK : hkv_seterr(err, HKV_E_NOMEM, "bench: no host memory");
    for (size_t i = 0; !rc && i < (size_t)BD_KH * n; i++) hs[i] = (int32_t)(i % (size_t)n);
    if (!rc && (!(c.k = bg_alloc_random(b, kb, BG_F16, 61, err)) ||
                !(c.q = bg_alloc_random(b, qb, BG_F16, 62, err)) ||
                !(c.ix.cent = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, cb, err)) ||
                !(c.ix.ivf = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, lb, err)) ||
                !(c.ix.len = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, nb, err)) ||
                !(c.slot = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, nb, err)) ||
                !(c.ws = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, wsb, err))))
        rc = err->code ? err->code : HKV_E_NOMEM;
    c.ix.fifo = c.slot;   /* the build reads no FIFO; any device pointer */
    if (!rc) rc = hkv_gpu_upload(c.slot, hs, nb, b->st, err);
    if (!rc) rc = hkv_gpu_sync(b->st, err);
    for (int kd = 0; kd < 2 && !rc; kd++) {
        c.kernel = kd ? HKV_GPU_SCORES_MMA : HKV_GPU_SCORES_SIMT;
        rc = build_row(b, &c, err);
        if (rc == HKV_E_UNSUPPORTED && kd) {
            fprintf(stderr, "ctkvr build: no tensor-core row: %s\n", err->msg);
            hkv_err_clear(err);
            rc = HKV_OK;
        }
    }
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.ws, wsb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.slot, nb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.ix.len, nb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.ix.ivf, lb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.ix.cent, cb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, (void *)c.q, qb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, (void *)c.k, kb);
    free(hs);
    return rc;
}

int bg_run_build(bg *b, hkv_err *err)
{
    if (!(b->only & BG_ONLY_POLICY)) return HKV_OK;
    /* the emulator: a small layer (64 centroids over 4K keys), its time meaningless */
    if (b->emulated) return build_rows(b, 64, 4096, err);
    int rc = build_rows(b, 2048, 32768, err);
    if (!rc) rc = build_rows(b, 2048, 98304, err);
    return rc;
}

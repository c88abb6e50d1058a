/* The device benchmark's attention rows at Llama-3-8B's heads (H = 32,
 * KH = 8, d = 128):
 *
 *  - decode (hkv_gpu_attn_decode_split, the near tier's flash-decoding with
 *    the split count the pipeline would pick) over 4K and 32K rows for 1 and
 *    4 sequences, rows in order and through an index list (the pipeline's
 *    near tier is read through one); for one sequence also other split
 *    counts, forced (1, 4, 8, 16: how a call's time depends on its splits,
 *    the fixed cost that keeps one sequence's 4K rows at ~12% of the card,
 *    issue 37), rows in order only. Bytes: K and V rows once, q in, out and
 *    lse out (and the index list); FLOPs 4 H d per (sequence, row). Calls
 *    rotate through copies of the K/V, as layers do.
 *  - prefill (hkv_gpu_attn_prefill_with) of a 2K-token chunk at position 0
 *    and at 30K (keys 0..32767), on each kernel: WMMA (attn_prefill.cu) and
 *    mma.sync (attn_prefill_mma.cu, what the pipeline runs at d 128). Bytes: q in, out and lse out,
 *    the keys and values up to the chunk's end once; FLOPs 4 H d per causal
 *    (query, key) pair.
 * Under the emulator: 4K rows of one sequence (and split 8 forced), and a
 * 64-token chunk at 0 and at 448. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_gpu_impl.h"
#include "gpu_kernels.h"

#define AH 32
#define AKH 8
#define AD 128

typedef struct at_call {
    bg *b;
    const float *q;
    const uint16_t *kv;    /* [copies][K | V] */
    size_t copy_elems;     /* K + V of one copy */
    int64_t rows, nq, p0;
    int seqs, split;
    hkv_gpu_prefill_kernel kernel;
    const int32_t *n_rows, *idx;
    float *out, *lse;
    void *ws;
    size_t ws_bytes;
} at_call;

static int decode_fn(void *arg, int copy, hkv_err *err)
{
    const at_call *c = arg;
    const uint16_t *k = c->kv + (size_t)copy * c->copy_elems, *v = k + c->copy_elems / 2;
    return hkv_gpu_attn_decode_split(c->q, c->seqs, AH, AKH, AD, k, v, AD, c->rows * AD,
                                     (int64_t)AKH * c->rows * AD, c->n_rows, c->idx, c->rows,
                                     1.0f / sqrtf((float)AD), c->out, c->lse, c->split, c->ws,
                                     c->ws_bytes, c->b->st, err);
}

static int prefill_fn(void *arg, int copy, hkv_err *err)
{
    const at_call *c = arg;
    (void)copy;
    const int64_t cap = c->p0 + c->nq;
    const uint16_t *k = c->kv, *v = k + (size_t)AKH * cap * AD;
    return hkv_gpu_attn_prefill_with(c->q, AH * AD, c->nq, AH, AKH, AD, c->p0, INT64_MAX, k, v, AD,
                                     cap * AD, 1.0f / sqrtf((float)AD), c->out, AH * AD, c->lse,
                                     c->kernel, c->b->st, err);
}

/* Host int32 array up to the device. */
static int32_t *up_i32(bg *b, const int32_t *h, size_t n, hkv_err *err)
{
    int32_t *d = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, n * 4, err);
    if (d && (hkv_gpu_upload(d, h, n * 4, b->st, err) || hkv_gpu_sync(b->st, err))) {
        hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, d, n * 4);
        return NULL;
    }
    return d;
}

/* force: a split count other than the pipeline's pick (0: the pick, timed
 * with the rows in order and through an index list). */
static int decode_rows(bg *b, int64_t rows, int seqs, int force, hkv_err *err)
{
    const size_t kv1 = 2 * (size_t)seqs * AKH * rows * AD;   /* K + V elements of one copy */
    const int copies = bg_copies(b, kv1 * 2.0);
    const int split = force > 0 ? force : hkv_gpu_attn_decode_splits(b->sm_count, seqs, AH, AKH, rows);
    const size_t ws_bytes = hkv_gpu_attn_decode_ws_bytes(seqs, AH, AD, split);
    const size_t nl = (size_t)seqs * AKH, qb = (size_t)seqs * AH * AD * 4, lb = (size_t)seqs * AH * 4;
    int32_t *hn = malloc(nl * 4), *hi = malloc(nl * rows * 4), *dn = NULL, *di = NULL;
    uint16_t *kv = NULL;
    float *q = NULL, *out = NULL, *lse = NULL;
    void *ws = NULL;
    int rc = hn && hi ? HKV_OK : hkv_seterr(err, HKV_E_NOMEM, "bench: no host memory");
    for (size_t i = 0; !rc && i < nl; i++) {
        hn[i] = (int32_t)rows;
        for (int64_t j = 0; j < rows; j++) hi[i * rows + j] = (int32_t)j;
    }
    if (!rc && (!(dn = up_i32(b, hn, nl, err)) || !(di = up_i32(b, hi, nl * rows, err)) ||
                !(kv = bg_alloc_random(b, kv1 * 2 * copies, BG_F16, 21, err)) ||
                !(q = bg_alloc_random(b, qb, BG_F32, 22, err)) ||
                !(out = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, qb, err)) ||
                !(lse = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, lb, err)) ||
                (ws_bytes && !(ws = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, ws_bytes, err)))))
        rc = err->code;
    for (int with_idx = 0; with_idx < (force > 0 ? 1 : 2) && !rc; with_idx++) {
        bg_row r = {.group = "attn_decode", .link = BG_DRAM, .unit = BG_FP32};
        r.bytes = kv1 * 2.0 + 2.0 * qb + lb + (with_idx ? nl * rows * 4.0 : 0);
        r.flops = 4.0 * seqs * AH * rows * AD;
        snprintf(r.kernel, sizeof r.kernel, "decode split=%d%s%s", split, with_idx ? " idx" : "",
                 force > 0 ? " forced" : "");
        snprintf(r.shape, sizeof r.shape, "H32 KH8 d128 %lld rows x %d seq%s", (long long)rows, seqs,
                 seqs > 1 ? "s" : "");
        at_call c = {.b = b, .q = q, .kv = kv, .copy_elems = kv1, .rows = rows, .seqs = seqs,
                     .split = split, .n_rows = dn, .idx = with_idx ? di : NULL, .out = out, .lse = lse,
                     .ws = ws, .ws_bytes = ws_bytes};
        if (!(rc = bg_time(b, decode_fn, &c, copies, copies, &r, err)))
            rc = bg_add(b, &r,
                        json_pack("{s:i,s:i,s:i,s:I,s:i,s:i,s:b,s:b,s:i}", "n_head", AH,
                                  "n_head_kv", AKH, "d", AD, "kv_rows", (json_int_t)rows, "seqs",
                                  seqs, "split", split, "forced", force > 0, "idx", with_idx,
                                  "copies", copies),
                        err);
    }
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, ws, ws_bytes);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, lse, lb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, out, qb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, q, qb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, kv, kv1 * 2 * copies);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, di, nl * rows * 4);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, dn, nl * 4);
    free(hn);
    free(hi);
    return rc;
}

static int prefill_row(bg *b, int64_t nq, int64_t p0, hkv_gpu_prefill_kernel kernel, hkv_err *err)
{
    const int64_t cap = p0 + nq;
    const size_t kvb = 2 * (size_t)AKH * cap * AD * 2, qb = (size_t)nq * AH * AD * 4,
                 lb = (size_t)nq * AH * 4;
    uint16_t *kv = bg_alloc_random(b, kvb, BG_F16, 31, err);
    float *q = kv ? bg_alloc_random(b, qb, BG_F32, 32, err) : NULL;
    float *out = q ? hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, qb, err) : NULL;
    float *lse = out ? hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, lb, err) : NULL;
    int rc = lse ? HKV_OK : err->code;
    if (!rc) {
        bg_row r = {.group = "attn_prefill", .link = BG_DRAM, .unit = BG_TENSOR};
        r.bytes = (double)kvb + 2.0 * qb + lb;
        r.flops = 4.0 * AH * AD * ((double)nq * p0 + nq * (nq + 1) / 2.0);
        snprintf(r.kernel, sizeof r.kernel, "prefill %s",
                 kernel == HKV_GPU_PREFILL_MMA ? "mma" : "wmma");
        snprintf(r.shape, sizeof r.shape, "H32 KH8 d128 %lld tokens at %lld", (long long)nq,
                 (long long)p0);
        at_call c = {.b = b, .q = q, .kv = kv, .nq = nq, .p0 = p0, .out = out, .lse = lse,
                     .kernel = kernel};
        if (!(rc = bg_time(b, prefill_fn, &c, 1, 1, &r, err)))
            rc = bg_add(b, &r,
                        json_pack("{s:i,s:i,s:i,s:I,s:I,s:s}", "n_head", AH, "n_head_kv", AKH, "d",
                                  AD, "nq", (json_int_t)nq, "p0", (json_int_t)p0, "path",
                                  kernel == HKV_GPU_PREFILL_MMA ? "mma" : "wmma"),
                        err);
    }
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, lse, lb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, out, qb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, q, qb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, kv, kvb);
    return rc;
}

int bg_run_attention(bg *b, hkv_err *err)
{
    /* 260: a near tier of 4 sinks and 256 local rows, what a decode step's
     * device attention reads per layer with the default window */
    static const int64_t rows_all[] = {4096, 260, 32768};
    static const int seqs_all[] = {1, 4};
    const int n_rows = b->emulated ? 1 : 3, n_seqs = b->emulated ? 1 : 2;
    int rc = HKV_OK;
    if (!(b->only & BG_ONLY_ATTENTION)) return HKV_OK;
    for (int i = 0; i < n_rows && !rc; i++)
        for (int j = 0; j < n_seqs && !rc; j++) rc = decode_rows(b, rows_all[i], seqs_all[j], 0, err);
    /* one sequence at other split counts (rows 4K and 32K; the emulator: split 8 at 4K) */
    static const int forced[] = {1, 4, 8, 16};
    for (int i = 0; i < 3 && !rc; i += 2)
        for (int f = 0; f < 4 && !rc; f++) {
            if (b->emulated && (i || forced[f] != 8)) continue;
            if (forced[f] != hkv_gpu_attn_decode_splits(b->sm_count, 1, AH, AKH, rows_all[i]))
                rc = decode_rows(b, rows_all[i], 1, forced[f], err);
        }
    const int64_t nq = b->emulated ? 64 : 2048, late = b->emulated ? 448 : 30720;
    /* both kernels (the pipeline runs mma.sync at d 128 on sm_80 and up);
     * a device without mma.sync says so in the row's place */
    for (int kd = 0; kd < 2 && !rc; kd++) {
        const hkv_gpu_prefill_kernel kernel = kd ? HKV_GPU_PREFILL_MMA : HKV_GPU_PREFILL_WMMA;
        if (!rc) rc = prefill_row(b, nq, 0, kernel, err);
        if (!rc) rc = prefill_row(b, nq, late, kernel, err);
        if (rc == HKV_E_UNSUPPORTED && kd) {
            fprintf(stderr, "attn_prefill: no mma.sync rows: %s\n", err->msg);
            hkv_err_clear(err);
            rc = HKV_OK;
        }
    }
    return rc;
}

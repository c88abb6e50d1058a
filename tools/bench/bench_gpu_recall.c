/* The device benchmark's recall rows: ctkvr's centroid recall as the
 * pipeline runs it for every layer and decode row (pipeline/cuda_recall.c,
 * hkv_gpu_recall_top) at Llama-3-8B's shape and CTKVR's default index: C
 * 2048 unit centroids of 32 query heads x 128 (8 KV heads, g 4) a table,
 * the top C' 4 per KV head, for 1 and 8 decode rows, each row its own
 * sequence's table.
 *
 * Why a row of its own: the headline run (docs/GPU_MEASURED.md, H200) had
 * the host waiting ~0.7 ms a layer for the device at every batch and
 * context, where the products and the near attention took ~0.12 ms; the
 * recall, then a chain of dependent loads in 8 blocks, was the untimed
 * suspect. This row times it alone.
 *
 * Bytes: every centroid of the row's tables (C x H x d x 2), the query
 * rows, the scores written and re-read C' times; FLOPs: 2 g d per centroid
 * and KV head. Calls rotate through copies of the tables (>> L2), as layers
 * do. Under the emulator: one copy, the small shape's time is meaningless. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_gpu_impl.h"
#include "gpu_forward.h"

#define RC_KH 8
#define RC_H 32
#define RC_D 128
#define RC_C 2048
#define RC_CP 4
#define RC_ROWS_MAX 8

typedef struct rc_call {
    bg *b;
    const hkv_gpu_recall_row *desc;   /* [copies][RC_ROWS_MAX] device */
    const float *q;                   /* [RC_ROWS_MAX][H][d] */
    int32_t *slot, *n;
    float *score;
    void *ws;
    size_t ws_bytes;
    int rows;
} rc_call;

static const size_t tab_bytes = (size_t)RC_C * RC_H * RC_D * 2;

static int recall_fn(void *arg, int copy, hkv_err *err)
{
    const rc_call *c = arg;
    return hkv_gpu_recall_top(c->desc + (size_t)copy * RC_ROWS_MAX, c->rows, c->q,
                              (int64_t)RC_H * RC_D, RC_H, RC_KH, RC_D, RC_CP, RC_C, c->slot, c->score,
                              c->n, c->ws, c->ws_bytes, c->b->st, err);
}

static int add_row(bg *b, rc_call *c, int rows, int copies, hkv_err *err)
{
    bg_row r = {.group = "recall", .link = BG_DRAM, .unit = BG_FP32};
    const double g = (double)RC_H / RC_KH;
    r.bytes = rows * ((double)tab_bytes + RC_H * RC_D * 4 + RC_KH * (RC_C * 4.0 * (1 + RC_CP)));
    r.flops = 2.0 * rows * RC_KH * RC_C * g * RC_D;
    snprintf(r.kernel, sizeof r.kernel, "ctkvr recall");
    snprintf(r.shape, sizeof r.shape, "KH8 g4 d128 C%d C'%d x%d", RC_C, RC_CP, rows);
    c->rows = rows;
    int rc = bg_time(b, recall_fn, c, copies, copies, &r, err);
    if (!rc)
        rc = bg_add(b, &r,
                    json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "n_head_kv", RC_KH, "g", RC_H / RC_KH,
                              "d", RC_D, "C", RC_C, "Cp", RC_CP, "rows", rows, "copies", copies),
                    err);
    return rc;
}

int bg_run_recall(bg *b, hkv_err *err)
{
    if (!(b->only & BG_ONLY_POLICY)) return HKV_OK;
    /* tables: enough for 8 rows of every copy to leave L2 cold */
    const int copies = bg_copies(b, (double)tab_bytes * RC_ROWS_MAX);
    const int nt = copies * RC_ROWS_MAX;
    const size_t db = (size_t)nt * sizeof(hkv_gpu_recall_row), fb = (size_t)nt * RC_KH * 2 * 4;
    const size_t qb = (size_t)RC_ROWS_MAX * RC_H * RC_D * 4, ob = (size_t)RC_ROWS_MAX * RC_KH * RC_CP * 4;
    rc_call c = {.b = b, .ws_bytes = hkv_gpu_recall_top_ws_bytes(RC_ROWS_MAX, RC_KH, RC_C)};
    uint16_t *tabs = NULL;
    int32_t *fifo = NULL;
    hkv_gpu_recall_row *hd = malloc(db), *dd = NULL;
    int32_t *hf = malloc(fb);
    int rc = hd && hf ? HKV_OK : hkv_seterr(err, HKV_E_NOMEM, "bench: no host memory");
    for (int t = 0; !rc && t < nt * RC_KH; t++) hf[2 * t] = 0, hf[2 * t + 1] = RC_C;   /* full FIFOs */
    if (!rc && (!(tabs = bg_alloc_random(b, (size_t)nt * tab_bytes, BG_F16, 51, err)) ||
                !(c.q = bg_alloc_random(b, qb, BG_F32, 52, err)) ||
                !(fifo = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, fb, err)) ||
                !(dd = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, db, err)) ||
                !(c.slot = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, ob, err)) ||
                !(c.score = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, ob, err)) ||
                !(c.n = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, (size_t)RC_ROWS_MAX * RC_KH * 4, err)) ||
                !(c.ws = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, c.ws_bytes, err))))
        rc = err->code ? err->code : HKV_E_NOMEM;
    for (int t = 0; !rc && t < nt; t++)   /* copy t / 8, row t % 8 */
        hd[t] = (hkv_gpu_recall_row){.tab = tabs + (size_t)t * (tab_bytes / 2), .fifo = fifo + (size_t)t * RC_KH * 2,
                                     .row = t % RC_ROWS_MAX, .C = RC_C, .k = RC_CP};
    if (!rc) rc = hkv_gpu_upload(dd, hd, db, b->st, err);
    if (!rc) rc = hkv_gpu_upload(fifo, hf, fb, b->st, err);
    if (!rc) rc = hkv_gpu_sync(b->st, err);
    c.desc = dd;
    if (!rc) rc = add_row(b, &c, 1, copies, err);
    if (!rc && !b->emulated) rc = add_row(b, &c, RC_ROWS_MAX, copies, err);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.ws, c.ws_bytes);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.n, (size_t)RC_ROWS_MAX * RC_KH * 4);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.score, ob);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.slot, ob);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, dd, db);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, fifo, fb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, (void *)c.q, qb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, tabs, (size_t)nt * tab_bytes);
    free(hd);
    free(hf);
    return rc;
}

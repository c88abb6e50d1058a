/* The device benchmark's policy rows: rocketkv's stage 2 at Llama-3-8B 8K
 * with budget 1024 (hkv_rocketkv_split_of: candidate lists of n = 5261
 * entries per KV head, pages of 2, dims 100, k 1024; KH 8, g 4, d 128),
 * what the pipeline runs per layer and decode row (pipeline/cuda_rocket.c):
 *
 *  - rocketkv hsa: the whole estimate (hkv_gpu_rocketkv_hsa: the page
 *    estimate kernel and the keep kernel), for 1 and 4 sequences (4 calls,
 *    one per sequence, as the pipeline makes them);
 *  - rocketkv hsa z / keep: each of its two kernels alone
 *    (hkv_gpu_rocketkv_hsa_part);
 *  - rocketkv push: the far token leaving the ring pushed onto every list;
 *  - keep tokens: hkv_gpu_keep of k = 1024 over 5261 token scores per KV
 *    head (the keep of snapkv's and quest's paths, and what stage 2 used to
 *    end with).
 * Bytes: the bound rows the chosen dims read (KH x dims x pages x 2), q,
 * the kept entries' positions read and written; FLOPs: the page estimates'
 * 2 g dims per page and KV head (none for the keeps). Calls rotate through
 * copies of the lists and bounds, as layers do. Under the emulator: one
 * sequence only. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_gpu_impl.h"
#include "gpu_kernels.h"

#define RK_KH 8
#define RK_G 4
#define RK_D 128
#define RK_N 5261
#define RK_PAGE 2
#define RK_DIMS 100
#define RK_K 1024
#define RK_CAP (RK_N + 1024)                /* the pipeline's room for pushes */
#define RK_PCAP (RK_CAP / RK_PAGE + 1)
#define RK_NP ((RK_N + RK_PAGE - 1) / RK_PAGE)

typedef struct rk_call {
    bg *b;
    uint16_t *bnd;           /* [copies][KH][2d][pcap] */
    int32_t *cand, *n;       /* [copies][KH][cap], [copies][KH] */
    const float *q;          /* [copies][H][d] */
    const float *s;          /* keep tokens: [KH][n] */
    int32_t *out, *n_out;    /* [seqs][KH][k], [seqs][KH] */
    void *ws;
    size_t ws_bytes;
    int seqs, part;
} rk_call;

static const size_t bnd_elems = (size_t)RK_KH * 2 * RK_D * RK_PCAP;

static int hsa_fn(void *arg, int copy, hkv_err *err)
{
    const rk_call *c = arg;
    for (int s = 0; s < c->seqs; s++) {
        const size_t m = (size_t)copy * c->seqs + s;
        int rc = hkv_gpu_rocketkv_hsa_part(c->bnd + m * bnd_elems, RK_PCAP, c->cand + m * RK_KH * RK_CAP,
                                           RK_CAP, c->n + m * RK_KH, RK_KH, RK_G, RK_D, RK_PAGE,
                                           RK_DIMS, RK_K, c->q + m * RK_KH * RK_G * RK_D,
                                           c->out + (size_t)s * RK_KH * RK_K, RK_K,
                                           c->n_out + (size_t)s * RK_KH, c->ws, c->ws_bytes, c->part,
                                           c->b->st, err);
        if (rc) return rc;
    }
    return HKV_OK;
}

static int push_fn(void *arg, int copy, hkv_err *err)
{
    const rk_call *c = arg;
    /* copy 0's lists grow by one a call (fewer calls than their room); any
     * fp16 rows do as the keys (the bounds' first) */
    (void)copy;
    return hkv_gpu_rocketkv_push(c->cand, RK_CAP, c->n, RK_KH, RK_D, RK_PAGE, RK_PCAP, c->bnd,
                                 c->bnd, RK_D, (int64_t)RK_CAP * 4, c->b->st, err);
}

static int keep_fn(void *arg, int copy, hkv_err *err)
{
    const rk_call *c = arg;
    (void)copy;
    return hkv_gpu_keep(c->s, RK_N, RK_KH, RK_N, NULL, c->cand, RK_CAP, 0, RK_K, INT64_MAX, c->out,
                        RK_K, c->n_out, c->b->st, err);
}

static int add_row(bg *b, const char *kernel, int seqs, int part, rk_call *c, int copies, bg_call fn,
                   hkv_err *err)
{
    bg_row r = {.group = "policy", .link = BG_DRAM, .unit = part & 1 ? BG_FP32 : BG_NONE};
    const double kept = (double)RK_KH * RK_K * 4 * 2 + RK_KH * 8;   /* positions read, written; counts */
    const double est = (double)RK_KH * RK_DIMS * RK_NP * 2 + (double)RK_KH * RK_G * RK_D * 4;
    r.bytes = seqs * ((part & 1 ? est : 0) + (part & 2 ? kept : 0));
    r.flops = part & 1 ? 2.0 * seqs * RK_KH * RK_G * RK_DIMS * RK_NP : 0;
    if (fn == push_fn) r.bytes = (double)RK_KH * (RK_D * 2 * 3 + 8), r.unit = BG_NONE;
    if (fn == keep_fn) r.bytes = (double)RK_KH * RK_N * 4 + kept, r.unit = BG_NONE;
    snprintf(r.kernel, sizeof r.kernel, "%s", kernel);
    snprintf(r.shape, sizeof r.shape, "KH8 g4 d128 n%d p%d dims%d k%d x%d", RK_N, RK_PAGE, RK_DIMS,
             RK_K, seqs);
    c->seqs = seqs, c->part = part;
    int rc = bg_time(b, fn, c, copies, copies, &r, err);
    if (!rc)
        rc = bg_add(b, &r,
                    json_pack("{s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "n_head_kv", RK_KH, "g", RK_G,
                              "d", RK_D, "n", RK_N, "page", RK_PAGE, "dims", RK_DIMS, "k", RK_K,
                              "seqs", seqs, "copies", copies),
                    err);
    return rc;
}

int bg_run_policy(bg *b, hkv_err *err)
{
    if (!(b->only & BG_ONLY_POLICY)) return HKV_OK;
    const int seqs_max = b->emulated ? 1 : 4;
    /* copies of 4 sequences' lists and bounds, enough to leave L2 cold */
    const double bytes1 = (double)bnd_elems * 2 + (double)RK_KH * RK_CAP * 4;
    int sets = bg_copies(b, bytes1 * seqs_max);
    const int nc = sets * seqs_max;
    const size_t cb = (size_t)nc * RK_KH * RK_CAP * 4, qb = (size_t)nc * RK_KH * RK_G * RK_D * 4;
    const size_t ob = (size_t)seqs_max * RK_KH * RK_K * 4, sb = (size_t)RK_KH * RK_N * 4;
    const size_t ws_bytes = hkv_gpu_rocketkv_hsa_ws_bytes(RK_KH, RK_G, RK_CAP, RK_PAGE);
    int32_t *hc = malloc(cb), *hn = malloc((size_t)nc * RK_KH * 4);
    rk_call c = {.b = b, .ws_bytes = ws_bytes};
    int rc = hc && hn ? HKV_OK : hkv_seterr(err, HKV_E_NOMEM, "bench: no host memory");
    for (size_t i = 0; !rc && i < (size_t)nc * RK_KH; i++) {   /* ascending far positions */
        hn[i] = RK_N;
        for (int64_t x = 0; x < RK_CAP; x++) hc[i * RK_CAP + x] = (int32_t)(3 * x + i % 3);
    }
    if (!rc && (!(c.bnd = bg_alloc_random(b, (size_t)nc * bnd_elems * 2, BG_F16, 41, err)) ||
                !(c.q = bg_alloc_random(b, qb, BG_F32, 42, err)) ||
                !(c.s = bg_alloc_random(b, sb, BG_F32, 43, err)) ||
                !(c.cand = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, cb, err)) ||
                !(c.n = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, (size_t)nc * RK_KH * 4, err)) ||
                !(c.out = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, ob, err)) ||
                !(c.n_out = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, (size_t)seqs_max * RK_KH * 4, err)) ||
                !(c.ws = hkv_gpu_alloc(b->ctx, HKV_TIER_WORKSPACE, ws_bytes, err)) ||
                hkv_gpu_upload(c.cand, hc, cb, b->st, err) ||
                hkv_gpu_upload(c.n, hn, (size_t)nc * RK_KH * 4, b->st, err) || hkv_gpu_sync(b->st, err)))
        rc = err->code ? err->code : HKV_E_NOMEM;
    const int copies1 = nc;   /* one sequence a call: every copy in turn */
    if (!rc) rc = add_row(b, "rocketkv hsa", 1, 3, &c, copies1, hsa_fn, err);
    if (!rc && seqs_max == 4) rc = add_row(b, "rocketkv hsa", 4, 3, &c, sets, hsa_fn, err);
    if (!rc) rc = add_row(b, "rocketkv hsa z", 1, 1, &c, copies1, hsa_fn, err);
    /* keep alone: every copy's workspace state is the last z's; the keep reads only it */
    if (!rc) rc = add_row(b, "rocketkv hsa keep", 1, 2, &c, copies1, hsa_fn, err);
    if (!rc) rc = add_row(b, "keep tokens", 1, 0, &c, 1, keep_fn, err);
    if (!rc) rc = add_row(b, "rocketkv push", 1, 0, &c, 1, push_fn, err);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.ws, ws_bytes);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.n_out, (size_t)seqs_max * RK_KH * 4);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.out, ob);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.n, (size_t)nc * RK_KH * 4);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, c.cand, cb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, (void *)c.s, sb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, (void *)c.q, qb);
    hkv_gpu_free(b->ctx, HKV_TIER_WORKSPACE, (void *)c.bnd, (size_t)nc * bnd_elems * 2);
    free(hc);
    free(hn);
    return rc;
}

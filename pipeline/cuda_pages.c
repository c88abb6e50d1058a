/* A page-bounds policy's selection on the device (index/policy.h,
 * page_table; quest): its step reads the bounds of every far page (2d fp16
 * per page and KV head: at 96K and P = 16, 768 MB per Llama-3-8B step), too
 * much for the host to scan each step, so the device keeps a copy and
 * selects; the host attends the positions it chose.
 *
 * Per layer, before the host step (and before the near tier's ring slot is
 * overwritten by this step's append):
 *   host  : for each decode row whose policy has pages and whose near mirror
 *           is current, upload the policy's bounds whole when its version or
 *           the sequence's epoch moved (a prompt end, a rewind);
 *   device: fold the token leaving the near ring (the row in the device's
 *           mirror, before the append) into its page, as the policy does on
 *           the host in this step's on_far_append, then select the K best
 *           pages per KV head (gpu/quest_select.cu) over the far tier as it
 *           will be after this step; the positions come down with the QKV
 *           rows (hkv_recall_rows.sel: the host attends them).
 * A row whose near mirror is not current (the first step after a prompt)
 * selects on the host, and its copy is uploaded again at the next step.
 *
 * The step's device selections, whichever policy made them (quest here,
 * rocketkv's stage 2 in cuda_rocket.c), come down in one buffer
 * ([row][KV head][sel_ld] positions, a count per (row, KV head)), sized
 * for every row of the step before any selection is queued. */
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "kv_far.h"

int cb_pages_create(cuda_be *b, hkv_err *err) {
    cb_pages *g = &b->pg;
    const size_t S = (size_t)b->max_seqs;
    if (!(g->ver = calloc(S * b->NL, sizeof *g->ver)) ||
        !(g->epoch = calloc(S * b->NL, sizeof *g->epoch)) ||
        !(g->has = malloc((size_t)b->max_rows * b->KH * sizeof *g->has)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the page bounds' tables");
    return HKV_OK;
}

static void free_bounds(cuda_be *b) {
    cb_pages *g = &b->pg;
    hkv_gpu_free_async(b->ctx, HKV_TIER_INDEX, g->bounds, g->bytes, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, g->ws, g->ws_bytes, b->st);
    g->bounds = NULL, g->ws = NULL;
    g->np_cap = 0, g->bytes = g->ws_bytes = 0;
}

static void free_out(cuda_be *b) {
    cb_pages *g = &b->pg;
    const size_t out = (size_t)b->max_rows * b->KH * g->sel_ld;
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, g->d_sel, out * 4, b->st);
    hkv_gpu_free_async(b->ctx, HKV_TIER_WORKSPACE, g->d_n, (size_t)b->max_rows * b->KH * 4, b->st);
    hkv_pinned_free(&g->h_out, &b->e->mem, NULL);
    g->d_sel = g->d_n = NULL;
    g->sel_ld = 0;
}

void cb_pages_destroy(cuda_be *b) {
    cb_pages *g = &b->pg;
    if (g->np_cap) free_bounds(b);
    if (g->sel_ld) free_out(b);
    free(g->ver);
    free(g->epoch);
    free(g->has);
}

/* Room for np_cap pages per (sequence, layer, KV head) of 2d. A growth
 * waits for the stream (the device may still read the old arena) and
 * uploads every copy again. */
static int ensure_bounds(cuda_be *b, int64_t np_cap, hkv_err *err) {
    cb_pages *g = &b->pg;
    if (np_cap <= g->np_cap) return HKV_OK;
    int rc = HKV_OK;
    if (g->np_cap) {   /* the other micro-batch's selection reads the old bounds first */
        if ((rc = cb_settle_halves(b, err)) || (rc = hkv_gpu_sync(b->st, err))) return rc;
        free_bounds(b);
    }
    memset(g->ver, 0, (size_t)b->max_seqs * b->NL * sizeof *g->ver);
    g->np_cap = np_cap;   /* free_bounds frees with these sizes */
    g->bytes = (size_t)b->max_seqs * b->NL * b->KH * (size_t)np_cap * 2 * b->d * 2;
    g->ws_bytes = hkv_gpu_quest_select_ws_bytes(b->KH, np_cap, 1, np_cap);
    if (!(g->bounds = hkv_gpu_alloc_async(b->ctx, HKV_TIER_INDEX, g->bytes, b->st, err)) ||
        !(g->ws = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, g->ws_bytes, b->st, err))) {
        rc = err && err->code ? err->code : HKV_E_NOMEM;
        free_bounds(b);
        hkv_err_prefix(err, "device page bounds of %lld pages for %d sequences x %d layers",
                       (long long)np_cap, b->max_seqs, b->NL);
        return rc;
    }
    return HKV_OK;
}

/* Room for sel_ld positions per (row, KV head) in the selections' output,
 * device and page-locked. A growth waits for the other micro-batch's host
 * step (it reads the old output) and the stream. */
static int ensure_out(cuda_be *b, int64_t sel_ld, hkv_err *err) {
    cb_pages *g = &b->pg;
    if (sel_ld <= g->sel_ld) return HKV_OK;
    int rc = HKV_OK;
    if (g->sel_ld) {
        if ((rc = cb_settle_halves(b, err)) || (rc = hkv_gpu_sync(b->st, err))) return rc;
        free_out(b);
    }
    const size_t R = (size_t)b->max_rows, KH = (size_t)b->KH, out = R * KH * (size_t)sel_ld;
    g->sel_ld = sel_ld;   /* free_out frees with it */
    if (!(g->d_sel = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, out * 4, b->st, err)) ||
        !(g->d_n = hkv_gpu_alloc_async(b->ctx, HKV_TIER_WORKSPACE, R * KH * 4, b->st, err)) ||
        (rc = hkv_pinned_alloc(&g->h_out, &b->e->mem, NULL, HKV_TIER_WORKSPACE, out * 4 + R * KH * 4,
                               -1, HKV_PIN_REQUIRE, err))) {
        rc = err && err->code ? err->code : HKV_E_NOMEM;
        free_out(b);
        hkv_err_prefix(err, "device selections of %lld positions for %d rows x %d KV heads",
                       (long long)sel_ld, b->max_rows, b->KH);
        return rc;
    }
    return HKV_OK;
}

/* 1 when segment sg is a decode row whose policy has pages for layer (into
 * *t), 0 when not (with count, a fallback counted), < 0 an error. */
static int decode_pages(cuda_be *b, const hkv_seg *sg, int layer, int count, hkv_page_table *t,
                        hkv_err *err) {
    if ((sg->flags & (HKV_SEG_PROMPT | HKV_SEG_PROMPT_END)) || sg->n > 1) return 0;
    hkv_policy pol;
    int rc = hkv_kv_seq_instance(&b->e->kv, sg->seq, NULL, &pol, err);
    if (rc) return rc;
    if (!pol.ops->page_table) return 0;
    const int g = b->H / b->KH;
    if (b->d > 256 || (size_t)g * 2 * b->d * 4 > 48 * 1024) {   /* gpu/quest_select.cu's shapes */
        if (count && cb_far_tokens(b, sg)) cb_fallback(b, HKV_FALLBACK_SHAPE);
        return 0;
    }
    if (!cb_policy_takes(b, sg, layer, &pol, count)) return 0;
    if ((rc = pol.ops->page_table(pol.self, layer, t)))
        return hkv_seterr(err, rc, "sequence %d, layer %d: the policy's page table", sg->seq, layer);
    return 1;
}

int cb_select_step(cuda_be *b, int layer, const hkv_seg *segs, int n_segs, int64_t r0, int64_t n,
                   hkv_err *err) {
    cb_pages *g = &b->pg;
    hkv_kv *kv = &b->e->kv;
    const int NL = b->NL, KH = b->KH, d = b->d, NR = b->NR;
    const int64_t Li = b->Li, Ll = b->Ll;
    int rc;
    g->n_rows = 0;
    for (int64_t i = r0 * KH; i < (r0 + n) * KH; i++) g->has[i] = 0;
    /* The arenas first, sized for every row of the step that selects here. */
    int64_t np_need = 0, sel_need = 0;
    for (int i = 0; i < n_segs; i++) {
        hkv_page_table t;
        if ((rc = decode_pages(b, &segs[i], layer, 1, &t, err)) <= 0) {   /* (the one count) */
            if (rc) return rc;
            continue;
        }
        if (t.np_cap > np_need) np_need = t.np_cap;
        if (t.K * t.P > sel_need) sel_need = t.K * t.P;
    }
    const int64_t rk_need = cb_rocket_sel_need(b, layer, segs, n_segs);
    if (rk_need > sel_need) sel_need = rk_need;
    if (!sel_need) return HKV_OK;
    if ((rc = ensure_out(b, sel_need, err)) || (rc = ensure_bounds(b, np_need, err)) ||
        (rc = cb_rocket_step(b, layer, segs, n_segs, err)))
        return rc;
    const size_t tab = (size_t)KH * g->np_cap * 2 * d;   /* elements of one (sequence, layer) */
    for (int i = 0; i < n_segs; i++) {
        const hkv_seg *sg = &segs[i];
        hkv_page_table t;
        if ((rc = decode_pages(b, sg, layer, 0, &t, err)) <= 0) {
            if (rc) return rc;
            continue;
        }
        const size_t m = (size_t)sg->seq * NL + layer;
        const uint64_t ep = hkv_kv_seq_epoch(kv, sg->seq);
        const int64_t p = sg->pos;
        if (b->m_len[m] != p || b->m_epoch[m] != ep) {   /* no current ring to fold from */
            g->ver[m] = 0;
            if (cb_far_tokens(b, sg)) cb_fallback(b, HKV_FALLBACK_NO_DEVICE_COPY);
            continue;
        }
        uint16_t *bd = g->bounds + m * tab;
        if (g->ver[m] != t.version || g->epoch[m] != ep) {   /* the policy's bounds, whole */
            const int64_t np = (t.hi - t.lo + t.P - 1) / t.P;
            for (int h = 0; h < KH && np > 0; h++) {
                const size_t off = (size_t)h * t.np_cap * 2 * d, bytes = (size_t)np * 2 * d * 2;
                if ((rc = hkv_gpu_upload(bd + (size_t)h * g->np_cap * 2 * d, t.bounds + off, bytes,
                                         b->st, err)))
                    return rc;
                b->stats.bytes_h2d += bytes;
            }
            g->ver[m] = t.version, g->epoch[m] = ep;
            b->stats.page_resyncs++;
        }
        /* The token this step pushes out of the ring reaches the far tier. */
        int64_t hi = t.hi;
        if (p >= Li + Ll) {
            const int64_t pf = p - Ll, slot = Li + (p - Li) % Ll;
            if (pf != t.hi)
                return hkv_seterr(err, HKV_E_INVAL, "sequence %d, layer %d: the far tier ends at "
                                  "%lld but position %lld leaves the ring", sg->seq, layer,
                                  (long long)t.hi, (long long)pf);
            const uint16_t *row = b->near_k + (m * KH * NR + (size_t)slot) * d;
            if ((rc = hkv_gpu_quest_fold(bd, g->np_cap, KH, d, t.P, row, (int64_t)NR * d, t.lo, pf,
                                         b->st, err)))
                return rc;
            hi = pf + 1;
        }
        const int64_t r = sg->row;
        if ((rc = hkv_gpu_quest_select(bd, g->np_cap, KH, b->H / KH, d, t.P, t.K,
                                       b->act[HKV_ACT_QKV] + r * b->qkv_w, t.lo, hi,
                                       g->d_sel + (size_t)r * KH * g->sel_ld, g->sel_ld,
                                       g->d_n + (size_t)r * KH, g->ws, g->ws_bytes, b->st, err)))
            return hkv_err_prefix(err, "sequence %d, layer %d: page selection", sg->seq, layer);
        for (int h = 0; h < KH; h++) g->has[r * KH + h] = 1;
        g->n_rows++;
    }
    if (!g->n_rows) return HKV_OK;
    /* Down with the QKV rows: the host attends what was selected (both kinds). */
    const size_t ne = (size_t)n * KH * g->sel_ld, e0 = (size_t)r0 * KH * g->sel_ld;
    int32_t *h_sel = g->h_out.p, *h_n = h_sel + (size_t)b->max_rows * KH * g->sel_ld;
    if ((rc = hkv_gpu_download(h_sel + e0, g->d_sel + e0, ne * 4, b->st, err)) ||
        (rc = hkv_gpu_download(h_n + r0 * KH, g->d_n + r0 * KH, (size_t)n * KH * 4, b->st, err)))
        return rc;
    b->stats.bytes_d2h += ne * 4 + (size_t)n * KH * 4;
    b->stats.device_selects += g->n_rows;
    return HKV_OK;
}

void cb_pages_result(cuda_be *b, int64_t r0, int64_t n, hkv_recall_rows *rec) {
    cb_pages *g = &b->pg;
    if (!g->n_rows) return;
    int32_t *h_sel = g->h_out.p, *h_n = h_sel + (size_t)b->max_rows * b->KH * g->sel_ld;
    for (int64_t i = r0 * b->KH; i < (r0 + n) * b->KH; i++)   /* rows the device did not select for */
        if (!g->has[i]) h_n[i] = -1;
    rec->sel = h_sel;
    rec->sel_n = h_n;
    rec->sel_ld = g->sel_ld;
}

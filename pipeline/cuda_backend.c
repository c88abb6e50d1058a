/* The CUDA backend: creation (weights uploaded once, activations and the
 * near-tier mirror allocated for the engine's batch), the dense ops of the
 * forward pass on the device stream, and host reads/writes of activations.
 * The attention step is cuda_attention.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_impl.h"
#include "device.h"
#include "qmat_panel.h"
#include "kv_far.h"

void *cb_alloc(cuda_be *b, int tier, size_t bytes, hkv_err *err) {
    if (b->n_allocs == b->cap_allocs) {
        int nc = b->cap_allocs ? 2 * b->cap_allocs : 64;
        struct dalloc *na = realloc(b->allocs, (size_t)nc * sizeof *na);
        if (!na) {
            hkv_seterr(err, HKV_E_NOMEM, "no host memory for the device allocation list");
            return NULL;
        }
        b->allocs = na;
        b->cap_allocs = nc;
    }
    void *p = hkv_gpu_alloc(b->ctx, tier, bytes, err);
    if (p) b->allocs[b->n_allocs++] = (struct dalloc){p, bytes, tier};
    return p;
}

int cb_policy_takes(cuda_be *b, const hkv_seg *sg, int layer, const hkv_policy *pol, int count) {
    const int why = pol->ops->device_takes ? pol->ops->device_takes(pol->self, layer)
                                           : HKV_FALLBACK_NONE;
    if (why == HKV_FALLBACK_NONE) return 1;
    if (count && cb_far_tokens(b, sg)) cb_fallback(b, why);
    return 0;
}

void cb_up_remember(cuda_be *b, int id, const void *src, size_t bytes) {
    if (b->up_cap[id] < bytes) {
        void *nc = realloc(b->up_cache[id], bytes);
        if (!nc) {
            b->up_len[id] = 0;
            return;   /* no cache: the next call uploads again */
        }
        b->up_cache[id] = nc;
        b->up_cap[id] = bytes;
    }
    memcpy(b->up_cache[id], src, bytes);
    b->up_len[id] = bytes;
}

int cb_stage(cuda_be *b, int id, void *dev, const void *src, size_t bytes, hkv_err *err) {
    if (!bytes) return HKV_OK;
    if (id >= 0 && b->up_len[id] == bytes && !memcmp(b->up_cache[id], src, bytes)) return HKV_OK;
    if (b->gr.capturing) return cb_graph_stage(b, id, dev, src, bytes, err);
    /* Through the page-locked slots, slot-sized pieces in turn: an upload
     * larger than one slot (a kept set of thousands of rows per KV head)
     * takes several. The cache stays invalid until all of it is sent. */
    if (id >= 0) b->up_len[id] = 0;
    for (size_t off = 0; off < bytes; off += b->slot_bytes) {
        const size_t piece = bytes - off < b->slot_bytes ? bytes - off : b->slot_bytes;
        int s = b->slot_next;
        b->slot_next = (s + 1) % STAGE_SLOTS;
        int rc;
        /* The slot's previous copy must have read it before it is overwritten. */
        if ((rc = hkv_gpu_event_sync(b->slot_ev[s], err))) return rc;
        char *slot = (char *)b->h_stage.p + (size_t)s * b->slot_bytes;
        memcpy(slot, (const char *)src + off, piece);
        if ((rc = hkv_gpu_upload((char *)dev + off, slot, piece, b->st, err)) ||
            (rc = hkv_gpu_event_record(b->slot_ev[s], b->st, err)))
            return rc;
    }
    b->stats.bytes_h2d += bytes;
    if (id >= 0) cb_up_remember(b, id, src, bytes);
    return HKV_OK;
}

/* ---- weights ------------------------------------------------------------------ */

static int up_mat(cuda_be *b, const hkv_wmat *w, hkv_gpu_qmat *d, hkv_err *err) {
    if (w->pack)   /* hkv_engine_open packs only without device_cuda */
        return hkv_seterr(err, HKV_E_INVAL, "%lld x %lld weights are interleaved for the host's fast "
                          "products, not in the rows the device reads: open the engine for the device",
                          (long long)w->rows, (long long)w->cols);
    int rc = hkv_gpu_qmat_upload(b->ctx, w, d, b->st, err);
    if (rc)
        return hkv_err_prefix(err, "%lld x %lld weights on the device", (long long)w->rows,
                              (long long)w->cols);
    if (b->gemm >= 0) d->gemm = b->gemm;   /* before the workspace is sized for it */
    return HKV_OK;
}

static float *up_vec(cuda_be *b, const float *v, int64_t n, hkv_err *err) {
    float *d = cb_alloc(b, HKV_TIER_WEIGHTS, (size_t)n * sizeof(float), err);
    if (d && hkv_gpu_upload(d, v, (size_t)n * sizeof(float), b->st, err)) return NULL;
    return d;
}

static int upload_weights(cuda_be *b, hkv_err *err) {
    const hkv_model *m = &b->e->model;
    int rc;
    if ((rc = up_mat(b, &m->tok_embd, &b->tok, err))) return rc;
    b->out_is_tok = m->output.q == m->tok_embd.q;
    if (!b->out_is_tok && (rc = up_mat(b, &m->output, &b->out, err))) return rc;
    if (!(b->out_norm = up_vec(b, m->out_norm, m->cfg.dim, err)) ||
        !(b->inv_freq = up_vec(b, m->rope_inv_freq, m->cfg.rope_dim / 2, err)))
        return err->code;
    if (!(b->L = calloc((size_t)b->NL, sizeof *b->L)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for %d layer tables", b->NL);
    for (int l = 0; l < b->NL; l++) {
        const hkv_layer_weights *L = &m->layers[l];
        dlayer *D = &b->L[l];
        D->n_qkv = L->n_qkv;
        D->n_ffn_in = L->n_ffn_in;
        for (int i = 0; i < L->n_qkv; i++)
            if ((rc = up_mat(b, &L->qkv[i], &D->qkv[i], err))) return rc;
        for (int i = 0; i < L->n_ffn_in; i++)
            if ((rc = up_mat(b, &L->ffn_in[i], &D->ffn_in[i], err))) return rc;
        if ((rc = up_mat(b, &L->wo, &D->wo, err)) || (rc = up_mat(b, &L->wdown, &D->down, err)))
            return rc;
        if (!(D->attn_norm = up_vec(b, L->attn_norm, m->cfg.dim, err)) ||
            !(D->ffn_norm = up_vec(b, L->ffn_norm, m->cfg.dim, err)) ||
            (L->bqkv && !(D->bqkv = up_vec(b, L->bqkv, b->qkv_w, err))))
            return err->code;
    }
    return hkv_gpu_sync(b->st, err);
}

static void free_weights(cuda_be *b) {
    hkv_gpu_qmat_free(b->ctx, &b->tok);
    if (!b->out_is_tok) hkv_gpu_qmat_free(b->ctx, &b->out);
    for (int l = 0; b->L && l < b->NL; l++) {
        dlayer *D = &b->L[l];
        for (int i = 0; i < 3; i++) hkv_gpu_qmat_free(b->ctx, &D->qkv[i]);
        for (int i = 0; i < 2; i++) hkv_gpu_qmat_free(b->ctx, &D->ffn_in[i]);
        hkv_gpu_qmat_free(b->ctx, &D->wo);
        hkv_gpu_qmat_free(b->ctx, &D->down);
    }
    free(b->L);
    b->L = NULL;
}

/* The parts of a matrix role and their count. */
static int parts_of(cuda_be *b, int layer, int role, const hkv_gpu_qmat **p) {
    if (role == HKV_WR_OUTPUT) {
        *p = b->out_is_tok ? &b->tok : &b->out;
        return 1;
    }
    if (layer < 0 || layer >= b->NL) return 0;
    dlayer *D = &b->L[layer];
    switch (role) {
    case HKV_WR_QKV: *p = D->qkv; return D->n_qkv;
    case HKV_WR_WO: *p = &D->wo; return 1;
    case HKV_WR_FFN_IN: *p = D->ffn_in; return D->n_ffn_in;
    case HKV_WR_DOWN: *p = &D->down; return 1;
    default: return 0;
    }
}

/* ---- device time of the ops and of the calls (cb_timer) ------------------------ */

const char *hkv_dev_op_name(int op) {
    static const char *const names[HKV_DEV_OP_COUNT] = {
        "embed", "rmsnorm", "qkv", "wo", "ffn_in", "down", "head", "rope", "attention", "swiglu",
        "add", "copy"};
    return op >= 0 && op < HKV_DEV_OP_COUNT ? names[op] : NULL;
}

static int is_product(int op) { return op >= HKV_DEV_OP_QKV && op <= HKV_DEV_OP_HEAD; }

static int tm_create(cuda_be *b, hkv_err *err) {
    cb_timer *t = &b->tm;
    t->call_cur = -1;
    /* two calls' timed ops (the products: 4 a layer and the head; profiled:
     * 11 a layer and 4 more): the older call is done by the time the newer
     * one's first attention step has waited for its QKV */
    t->cap = 2 * ((b->profile ? 11 : 4) * b->NL + 4) + 8;
    if (!(t->ev = calloc((size_t)2 * t->cap, sizeof *t->ev)) || !(t->kind = calloc((size_t)t->cap, 1)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the timing events");
    int rc;
    for (int i = 0; i < 2 * t->cap; i++)
        if ((rc = hkv_gpu_event_create(&t->ev[i], err))) return rc;
    for (int i = 0; i < 4; i++)
        if ((rc = hkv_gpu_event_create(&t->call_ev[i / 2][i % 2], err))) return rc;
    return HKV_OK;
}

static void tm_destroy(cuda_be *b) {
    cb_timer *t = &b->tm;
    for (int i = 0; t->ev && i < 2 * t->cap; i++) hkv_gpu_event_destroy(t->ev[i]);
    for (int i = 0; i < 4; i++) hkv_gpu_event_destroy(t->call_ev[i / 2][i % 2]);
    free(t->ev);
    free(t->kind);
    t->ev = NULL;
    t->kind = NULL;
}

/* Pairs whose end has completed, oldest first (one stream: they complete in order). */
static void tm_harvest(cuda_be *b) {
    cb_timer *t = &b->tm;
    float ms = 0;
    while (t->n > 0) {
        void **e = t->ev + 2 * t->tail;
        if (!hkv_gpu_event_done(e[1])) break;
        if (!hkv_gpu_event_elapsed(e[0], e[1], &ms, NULL)) {
            b->stats.dev_op[t->kind[t->tail]] += ms * 1e-3;
            if (is_product(t->kind[t->tail])) b->stats.dev_products += ms * 1e-3;
        }
        t->tail = (t->tail + 1) % t->cap;
        t->n--;
    }
    for (int i = 0; i < 2; i++)
        if (t->call_state[i] == 2 && hkv_gpu_event_done(t->call_ev[i][1])) {
            if (!hkv_gpu_event_elapsed(t->call_ev[i][0], t->call_ev[i][1], &ms, NULL))
                b->stats.dev_total += ms * 1e-3;
            t->call_state[i] = 0;
        }
}

/* The open call has ended: its pair waits to be harvested (dropped when it
 * has no end: a call that failed before its layers ended). */
static void tm_call_close(cuda_be *b) {
    cb_timer *t = &b->tm;
    if (t->call_cur < 0) return;
    t->call_state[t->call_cur] = t->call_has_end ? 2 : 0;
    t->call_cur = -1;
}

static int tm_call_start(cuda_be *b, hkv_err *err) {
    cb_timer *t = &b->tm;
    const int prev = t->call_cur;
    int rc;
    tm_call_close(b);
    tm_harvest(b);
    int s = prev == 0 ? 1 : 0;   /* the pairs in turn, or the free one */
    if (t->call_state[s] && !t->call_state[1 - s]) s = 1 - s;
    if (t->call_state[s] == 2) {   /* two calls back: done by now, normally */
        if ((rc = hkv_gpu_event_sync(t->call_ev[s][1], err))) return rc;
        tm_harvest(b);
    }
    if ((rc = hkv_gpu_event_record(t->call_ev[s][0], b->st, err))) return rc;
    t->call_cur = s;
    t->call_state[s] = 1;
    t->call_has_end = 0;
    return HKV_OK;
}

static int tm_call_end(cuda_be *b, hkv_err *err) {
    cb_timer *t = &b->tm;
    /* (a recorded step's end is recorded after its launch: cb_graph_end) */
    if (t->call_cur < 0 || b->gr.capturing) return HKV_OK;
    int rc = hkv_gpu_event_record(t->call_ev[t->call_cur][1], b->st, err);
    if (!rc) t->call_has_end = 1;
    return rc;
}

int cb_call_start(cuda_be *b, hkv_err *err) { return tm_call_start(b, err); }
int cb_call_end(cuda_be *b, hkv_err *err) { return tm_call_end(b, err); }

/* An op's pair: the next slot of the ring (a full ring waits for its oldest). */
static int tm_op_begin(cuda_be *b, int op, int *slot, hkv_err *err) {
    cb_timer *t = &b->tm;
    int rc;
    *slot = -1;
    if (b->gr.capturing) return HKV_OK;   /* a graph's ops are timed as a whole */
    if (b->profile) t->host_t0 = hkv_now(), t->host_op = op;
    if (t->n == t->cap) tm_harvest(b);
    if (t->n == t->cap) {
        if ((rc = hkv_gpu_event_sync(t->ev[2 * t->tail + 1], err))) return rc;
        tm_harvest(b);
    }
    *slot = (t->tail + t->n) % t->cap;
    t->kind[*slot] = (unsigned char)op;
    return hkv_gpu_event_record(t->ev[2 * *slot], b->st, err);
}

static int tm_op_end(cuda_be *b, int slot, hkv_err *err) {
    if (slot < 0) return HKV_OK;
    int rc = hkv_gpu_event_record(b->tm.ev[2 * slot + 1], b->st, err);
    if (!rc) b->tm.n++;
    if (b->profile) b->stats.host_op[b->tm.host_op] += hkv_now() - b->tm.host_t0;
    return rc;
}

/* ---- ops ----------------------------------------------------------------------- */

static int act_ok(int act) { return act >= 0 && act < HKV_ACT_COUNT; }

static int g_embed(void *self, const int32_t *tokens, int64_t n, hkv_err *err) {
    cuda_be *b = self;
    /* the embedding starts a forward call (a recorded one started before its capture) */
    int rc = b->gr.capturing ? HKV_OK : tm_call_start(b, err);
    if (!rc) rc = cb_stage(b, UP_TOK, b->d_tok, tokens, (size_t)n * sizeof *tokens, err);
    return rc ? rc : hkv_gpu_qmat_rows(&b->tok, b->d_tok, n, b->act[HKV_ACT_X], b->act_w[HKV_ACT_X],
                                       b->st, err);
}

/* The norm weights of (layer, role) on the device; NULL for a bad pair. */
static const float *norm_weight(const cuda_be *b, int layer, int role) {
    return role == HKV_WR_OUT_NORM         ? b->out_norm
           : layer < 0 || layer >= b->NL   ? NULL
           : role == HKV_WR_ATTN_NORM      ? b->L[layer].attn_norm
           : role == HKV_WR_FFN_NORM       ? b->L[layer].ffn_norm
                                           : NULL;
}

static int g_rmsnorm(void *self, int dst, int src, const int64_t *rows, int64_t n, int layer,
                     int role, hkv_err *err) {
    cuda_be *b = self;
    const float *w = norm_weight(b, layer, role);
    if (!w || !act_ok(dst) || !act_ok(src))
        return hkv_seterr(err, HKV_E_INVAL, "rmsnorm: bad buffer or weight role");
    const int dim = b->e->model.cfg.dim;
    const float *x = b->act[src] + b->r0 * b->act_w[src];
    int64_t ldx = b->act_w[src];
    float *y = b->act[dst] + b->r0 * b->act_w[dst];
    int rc;
    if (rows) {   /* gather the rows first (the head's logit rows) */
        int32_t r32[256];
        for (int64_t i0 = 0; i0 < n; i0 += 256) {
            int64_t c = n - i0 < 256 ? n - i0 : 256;
            for (int64_t i = 0; i < c; i++) r32[i] = (int32_t)rows[i0 + i];
            if ((rc = cb_stage(b, -1, b->d_lrows, r32, (size_t)c * sizeof *r32, err)) ||
                (rc = hkv_gpu_copy_rows(y + i0 * b->act_w[dst], b->act_w[dst], NULL,
                                        x, ldx, b->d_lrows, c, dim, b->st, err)))
                return rc;
        }
        x = y;
        ldx = b->act_w[dst];
    }
    return hkv_gpu_rmsnorm(x, ldx, w, n, dim, b->e->model.cfg.norm_eps, y, b->act_w[dst],
                           b->st, err);
}

static int g_matmul(void *self, int dst, int src, int64_t n, int layer, int role, hkv_err *err) {
    cuda_be *b = self;
    const hkv_gpu_qmat *parts = NULL;
    int np = parts_of(b, layer, role, &parts);
    if (!np || !act_ok(dst) || !act_ok(src))
        return hkv_seterr(err, HKV_E_INVAL, "matmul: bad buffer or weight role");
    int64_t ldy = 0, off = 0;
    for (int i = 0; i < np; i++) ldy += parts[i].rows;
    if (dst != HKV_ACT_TMP && ldy != b->act_w[dst])
        return hkv_seterr(err, HKV_E_INTERNAL, "matmul: %lld outputs into a %lld-wide buffer",
                          (long long)ldy, (long long)b->act_w[dst]);
    if (dst == HKV_ACT_TMP && (size_t)((b->r0 + n) * ldy) > b->act_n[dst])
        return hkv_seterr(err, HKV_E_RANGE, "matmul: %lld rows of %lld outputs do not fit the "
                          "device's product buffer (the head takes at most %lld rows a call)",
                          (long long)n, (long long)ldy,
                          (long long)hkv_head_rows(b->max_rows, b->max_seqs));
    /* Up to HKV_QMAT_GEMV_CHUNKED_ROWS rows (a decode batch) the GEMV, 8 rows
     * a call, reads the weights once per 8 rows and beats the panel GEMM
     * (gpu/qmat_panel.h). Batch-invariant steps (the scheduler's decode,
     * kernels.h) take it at any size: the GEMV's per-row sums do not depend on
     * how many rows share a call, the panel GEMM's do. */
    const int64_t per = b->e->kern.batch_invariant || n <= HKV_QMAT_GEMV_CHUNKED_ROWS
                            ? HKV_QMAT_GEMV_MAX_ROWS
                            : n;
    static const int op_of[] = {[HKV_WR_QKV] = HKV_DEV_OP_QKV, [HKV_WR_WO] = HKV_DEV_OP_WO,
                                [HKV_WR_FFN_IN] = HKV_DEV_OP_FFN_IN, [HKV_WR_DOWN] = HKV_DEV_OP_DOWN,
                                [HKV_WR_OUTPUT] = HKV_DEV_OP_HEAD};
    int slot, rc;
    if ((rc = tm_op_begin(b, op_of[role], &slot, err))) return rc;
    for (int i = 0; i < np; i++) {
        for (int64_t r = 0; r < n; r += per) {
            const int64_t m = n - r < per ? n - r : per;
            rc = hkv_gpu_qmat_matmul(b->ctx, &parts[i], b->act[src] + (b->r0 + r) * b->act_w[src],
                                     b->act_w[src], m, b->act[dst] + (b->r0 + r) * ldy + off, ldy,
                                     b->ws,
                                     b->ws_bytes, b->st, err);
            if (rc) return rc;
        }
        off += parts[i].rows;
    }
    if ((rc = tm_op_end(b, slot, err))) return rc;
    /* a call ends with the last layer's residual, or with the head */
    b->tm.last_down = role == HKV_WR_DOWN && layer == b->NL - 1;
    return role == HKV_WR_OUTPUT ? tm_call_end(b, err) : HKV_OK;
}

static int g_bias_rope(void *self, int layer, const int64_t *pos, int64_t n, hkv_err *err) {
    cuda_be *b = self;
    const hkv_model_config *c = &b->e->model.cfg;
    float *qkv = b->act[HKV_ACT_QKV] + b->r0 * b->qkv_w;
    int rc;
    if (b->L[layer].bqkv &&
        (rc = hkv_gpu_add_bias(qkv, b->qkv_w, n, b->L[layer].bqkv, b->qkv_w, b->st,
                               err)))
        return rc;
    /* The cos/sin table follows the positions: built when they change (the
     * step's first layer), then every layer only rotates. */
    const size_t pb = (size_t)n * sizeof *pos;
    if (!(b->up_len[UP_POS] == pb && !memcmp(b->up_cache[UP_POS], pos, pb)) &&
        ((rc = cb_stage(b, UP_POS, b->d_pos, pos, pb, err)) ||
         (rc = hkv_gpu_rope_table(b->inv_freq, c->rope_dim, b->d_pos, n, b->d_rope_cs, b->st, err)))) {
        b->up_len[UP_POS] = 0;   /* no table for these positions */
        return rc;
    }
    return hkv_gpu_rope(qkv, b->qkv_w, n, c->n_head + c->n_head_kv, c->head_dim,
                        c->rope_dim,
                        c->rope_layout == HKV_ROPE_PAIRS ? HKV_GPU_ROPE_PAIRS : HKV_GPU_ROPE_NEOX,
                        b->d_rope_cs, b->st, err);
}

static int g_swiglu(void *self, int64_t n, hkv_err *err) {
    cuda_be *b = self;
    return hkv_gpu_swiglu(b->act[HKV_ACT_GU] + b->r0 * b->act_w[HKV_ACT_GU], n, b->e->model.cfg.ffn,
                          b->act[HKV_ACT_G] + b->r0 * b->act_w[HKV_ACT_G], b->st, err);
}

static int g_add(void *self, int dst, int src, int64_t n, hkv_err *err) {
    cuda_be *b = self;
    if (!act_ok(dst) || !act_ok(src)) return hkv_seterr(err, HKV_E_INVAL, "add: bad buffer");
    /* Both are dim-wide and dense (X, and TMP after a dim-row product). */
    const int64_t o = b->r0 * b->e->model.cfg.dim;
    int rc = hkv_gpu_add(b->act[dst] + o, b->act[src] + o, n * b->e->model.cfg.dim, b->st, err);
    if (!rc && b->tm.last_down) {   /* the last layer's residual: the call's end so far */
        b->tm.last_down = 0;
        rc = tm_call_end(b, err);
    }
    return rc;
}

static int g_add_rmsnorm(void *self, int dst, int x, int src, int64_t n, int layer, int role,
                         hkv_err *err) {
    cuda_be *b = self;
    const float *w = norm_weight(b, layer, role);
    if (!w || !act_ok(dst) || !act_ok(x) || !act_ok(src) || dst == x)
        return hkv_seterr(err, HKV_E_INVAL, "add_rmsnorm: bad buffer or weight role");
    /* src is dim-wide and dense (TMP after a dim-row product), as in g_add */
    const int dim = b->e->model.cfg.dim;
    const int64_t r0 = b->r0;
    return hkv_gpu_add_rmsnorm(b->act[x] + r0 * b->act_w[x], b->act_w[x], b->act[src] + r0 * dim, dim,
                               w, n, dim, b->e->model.cfg.norm_eps, b->act[dst] + r0 * b->act_w[dst],
                               b->act_w[dst], b->st, err);
}

static int g_copy(cuda_be *b, int act, int64_t r0, int64_t n, int64_t cols, float *host, int down,
                  hkv_err *err) {
    if (!act_ok(act) || cols < 1 || cols > b->act_w[act] || r0 < 0 || n < 0 ||
        r0 + n > b->max_rows ||
        (size_t)(r0 + n) * (size_t)(act == HKV_ACT_TMP ? cols : b->act_w[act]) > b->act_n[act])
        return hkv_seterr(err, HKV_E_RANGE, "rows %lld..%lld of device buffer %d (%lld wide) out of "
                          "range", (long long)r0, (long long)(r0 + n), act, (long long)cols);
    /* Rows are read at stride cols: TMP holds the last product's rows densely. */
    const int64_t ld = act == HKV_ACT_TMP ? cols : b->act_w[act];
    int rc = HKV_OK;
    if (ld == cols) {   /* dense rows (the logits): one copy */
        float *dv = b->act[act] + r0 * ld;
        const size_t bytes = (size_t)n * cols * 4;
        rc = down ? hkv_gpu_download(host, dv, bytes, b->st, err)
                  : hkv_gpu_upload(dv, host, bytes, b->st, err);
    }
    for (int64_t r = 0; r < n && !rc && ld != cols; r++) {
        float *dv = b->act[act] + (r0 + r) * ld;
        rc = down ? hkv_gpu_download(host + r * cols, dv, (size_t)cols * 4, b->st, err)
                  : hkv_gpu_upload(dv, host + r * cols, (size_t)cols * 4, b->st, err);
    }
    if (!rc) rc = hkv_gpu_sync(b->st, err);
    if (!rc && down) cb_harvest(b);
    return rc;
}

static int g_read(void *self, int act, int64_t r0, int64_t n, int64_t cols, float *dst, hkv_err *err) {
    return g_copy(self, act, r0, n, cols, dst, 1, err);
}

static int g_write(void *self, int act, int64_t r0, int64_t n, int64_t cols, const float *src,
                   hkv_err *err) {
    return g_copy(self, act, r0, n, cols, (float *)src, 0, err);
}

static void g_destroy(void *self) {
    cuda_be *b = self;
    if (!b) return;
    if (b->st) hkv_gpu_sync(b->st, NULL);
    if (b->ctx) cb_index_detach(b), cb_recall_destroy(b), cb_keep_destroy(b), cb_resident_destroy(b),
                  cb_pages_destroy(b), cb_rocket_destroy(b), cb_prefill_destroy(b), cb_graph_destroy(b),
                  cb_far_stage_destroy(b);
    free_weights(b);
    for (int i = b->n_allocs - 1; i >= 0; i--)
        hkv_gpu_free(b->ctx, b->allocs[i].tier, b->allocs[i].p, b->allocs[i].bytes);
    free(b->allocs);
    for (int i = 0; i < STAGE_SLOTS; i++) hkv_gpu_event_destroy(b->slot_ev[i]);
    for (int i = 0; b->ev && i < 8 * b->NL; i++) hkv_gpu_event_destroy(b->ev[i]);
    tm_destroy(b);
    free(b->ev);
    free(b->ev_pending);
    for (int i = 0; i < UP_COUNT; i++) free(b->up_cache[i]);
    hkv_pinned_free(&b->h_qkv, &b->e->mem, NULL);
    hkv_pinned_free(&b->h_fo, &b->e->mem, NULL);
    hkv_pinned_free(&b->h_fl, &b->e->mem, NULL);
    hkv_pinned_free(&b->h_stage, &b->e->mem, NULL);
    free(b->m_epoch);
    free(b->m_len);
    free(b->h_rows);
    free(b->h_nrows);
    free(b->h_idx);
    free(b->h_dst);
    free(b->h_slow);
    free(b->df_layer);
    free(b->df_segs);
    hkv_gpu_ctx_destroy(b->ctx);
    free(b);
}

/* The profile (hkv_cuda_params.profile): a pair of events around each op
 * other than the products (timed always, in g_matmul); nothing without it. */
static int pf_begin(cuda_be *b, int op, int *slot, hkv_err *err) {
    *slot = -1;
    return b->profile ? tm_op_begin(b, op, slot, err) : HKV_OK;
}

static int pf_end(cuda_be *b, int slot, int rc, hkv_err *err) {
    return !rc && slot >= 0 ? tm_op_end(b, slot, err) : rc;
}

static int p_embed(void *self, const int32_t *tokens, int64_t n, hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_EMBED, &slot, err);
    return pf_end(self, slot, rc ? rc : g_embed(self, tokens, n, err), err);
}

static int p_rmsnorm(void *self, int dst, int src, const int64_t *rows, int64_t n, int layer,
                     int role, hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_RMSNORM, &slot, err);
    return pf_end(self, slot, rc ? rc : g_rmsnorm(self, dst, src, rows, n, layer, role, err), err);
}

static int p_bias_rope(void *self, int layer, const int64_t *pos, int64_t n, hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_ROPE, &slot, err);
    return pf_end(self, slot, rc ? rc : g_bias_rope(self, layer, pos, n, err), err);
}

static int p_swiglu(void *self, int64_t n, hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_SWIGLU, &slot, err);
    return pf_end(self, slot, rc ? rc : g_swiglu(self, n, err), err);
}

static int p_add(void *self, int dst, int src, int64_t n, hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_ADD, &slot, err);
    return pf_end(self, slot, rc ? rc : g_add(self, dst, src, n, err), err);
}

/* profiled as an rmsnorm: the add it absorbs is a few per cent of it */
static int p_add_rmsnorm(void *self, int dst, int x, int src, int64_t n, int layer, int role,
                         hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_RMSNORM, &slot, err);
    return pf_end(self, slot, rc ? rc : g_add_rmsnorm(self, dst, x, src, n, layer, role, err), err);
}

static int p_attention(void *self, int layer, const hkv_seg *segs, int n_segs, int64_t n,
                       hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_ATTENTION, &slot, err);
    return pf_end(self, slot, rc ? rc : cb_attention(self, layer, segs, n_segs, n, err), err);
}

static int p_attention_begin(void *self, int mb, int layer, const hkv_seg *segs, int n_segs,
                             int64_t r0, int64_t n, hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_ATTENTION, &slot, err);
    return pf_end(self, slot,
                  rc ? rc : cb_attention_begin(self, mb, layer, segs, n_segs, r0, n, err), err);
}

static int p_attention_end(void *self, int mb, hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_ATTENTION, &slot, err);
    return pf_end(self, slot, rc ? rc : cb_attention_end(self, mb, err), err);
}

static int g_row_base(void *self, int64_t r0, hkv_err *err) {
    cuda_be *b = self;
    if (r0 < 0 || r0 >= b->max_rows)
        return hkv_seterr(err, HKV_E_RANGE, "row base %lld of %d rows", (long long)r0, b->max_rows);
    b->r0 = r0;
    return HKV_OK;
}

static int p_read(void *self, int act, int64_t r0, int64_t n, int64_t cols, float *dst,
                  hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_COPY, &slot, err);
    return pf_end(self, slot, rc ? rc : g_read(self, act, r0, n, cols, dst, err), err);
}

static int p_write(void *self, int act, int64_t r0, int64_t n, int64_t cols, const float *src,
                   hkv_err *err) {
    int slot, rc = pf_begin(self, HKV_DEV_OP_COPY, &slot, err);
    return pf_end(self, slot, rc ? rc : g_write(self, act, r0, n, cols, src, err), err);
}

static const hkv_backend_ops cuda_ops = {
    .name = "cuda",
    .embed = p_embed,
    .rmsnorm = p_rmsnorm,
    .matmul = g_matmul,
    .bias_rope = p_bias_rope,
    .swiglu = p_swiglu,
    .add = p_add,
    .add_rmsnorm = p_add_rmsnorm,
    .attention = p_attention,
    .flush = cb_flush,
    .step_graph = cb_graph_step,
    .read = p_read,
    .write = p_write,
    .destroy = g_destroy,
};

/* The same with micro-batch ping-pong (hkv_cuda_params.pingpong). */
static const hkv_backend_ops cuda_ops_pp = {
    .name = "cuda",
    .embed = p_embed,
    .rmsnorm = p_rmsnorm,
    .matmul = g_matmul,
    .bias_rope = p_bias_rope,
    .swiglu = p_swiglu,
    .add = p_add,
    .add_rmsnorm = p_add_rmsnorm,
    .attention = p_attention,
    .row_base = g_row_base,
    .attention_begin = p_attention_begin,
    .attention_end = p_attention_end,
    .flush = cb_flush,
    .step_graph = cb_graph_step,
    .read = p_read,
    .write = p_write,
    .destroy = g_destroy,
};

int hkv_backend_is_cuda(const hkv_backend *be) {
    return be && (be->ops == &cuda_ops || be->ops == &cuda_ops_pp);
}

/* ---- creation ------------------------------------------------------------------- */

static int alloc_buffers(cuda_be *b, hkv_err *err) {
    const hkv_model_config *c = &b->e->model.cfg;
    const size_t R = (size_t)b->max_rows, S = (size_t)b->max_seqs;
    int64_t w[HKV_ACT_COUNT] = {
        [HKV_ACT_X] = c->dim, [HKV_ACT_XN] = c->dim, [HKV_ACT_QKV] = b->qkv_w,
        [HKV_ACT_ATT] = b->qd, [HKV_ACT_GU] = 2 * (int64_t)c->ffn, [HKV_ACT_G] = c->ffn,
        [HKV_ACT_TMP] = c->vocab > c->dim ? c->vocab : c->dim,
    };
    for (int a = 0; a < HKV_ACT_COUNT; a++) {
        b->act_w[a] = w[a];
        /* TMP holds a product's rows densely ((r0 + n) x its width, g_matmul):
         * R rows of dim, or the head's logits, hkv_head_rows of them */
        size_t n = R * (size_t)w[a];
        if (a == HKV_ACT_TMP) {
            n = R * (size_t)c->dim;
            const size_t lg = (size_t)hkv_head_rows((int64_t)R, (int64_t)S) * (size_t)w[a];
            if (n < lg) n = lg;
        }
        b->act_n[a] = n;
        if (!(b->act[a] = cb_alloc(b, HKV_TIER_WORKSPACE, n * 4, err)))
            return hkv_err_prefix(err, "device activations for %zu rows", R);
    }
    /* The product workspace: the most any matrix needs for a call of up to
     * max_rows rows (its dequantised panel and the split activations). */
    size_t ws = hkv_gpu_qmat_matmul_ws_bytes(b->out_is_tok ? &b->tok : &b->out, b->max_rows);
    for (int l = 0; l < b->NL; l++) {
        const hkv_gpu_qmat *all[] = {&b->L[l].qkv[0], &b->L[l].qkv[1], &b->L[l].qkv[2], &b->L[l].wo,
                                     &b->L[l].ffn_in[0], &b->L[l].ffn_in[1], &b->L[l].down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]->q) {
                size_t s = hkv_gpu_qmat_matmul_ws_bytes(all[i], b->max_rows);
                if (s > ws) ws = s;
            }
    }
    b->ws_bytes = ws;
    if (ws && !(b->ws = cb_alloc(b, HKV_TIER_WORKSPACE, ws, err))) return err->code;
    const size_t near = S * (size_t)b->NL * b->KH * b->NR * b->d * 2;
    struct { void **p; size_t bytes; int tier; } bufs[] = {
        {(void **)&b->d_tok, R * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_lrows, 256 * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_pos, R * 8, HKV_TIER_WORKSPACE},
        {(void **)&b->d_rope_cs, R * (size_t)c->rope_dim * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_dst, R * 8, HKV_TIER_WORKSPACE},
        {(void **)&b->d_rows, S * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_nrows, S * b->KH * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_idx, S * b->KH * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_lse, R * b->H * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_fo, R * (size_t)b->qd * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_fl, R * b->H * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_q, S * (size_t)b->qd * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_no, S * (size_t)b->qd * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->d_nl, S * b->H * 4, HKV_TIER_WORKSPACE},
        {(void **)&b->near_k, near, HKV_TIER_NEAR},
        {(void **)&b->near_v, near, HKV_TIER_NEAR},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i].p = cb_alloc(b, bufs[i].tier, bufs[i].bytes, err))) return err->code;
    /* Near attention splits its keys across blocks when the step's (sequence,
     * KV head) grid is too small for the device: sized for one sequence (the
     * worst case), the workspace for a full batch at that split count. */
    b->near_split = hkv_gpu_attn_decode_splits(hkv_gpu_ctx_sm_count(b->ctx), 1, b->H, b->KH, b->NR);
    b->split_ws_bytes = hkv_gpu_attn_decode_ws_bytes(b->max_seqs, b->H, b->d, b->near_split);
    if (b->split_ws_bytes &&
        !(b->d_split_ws = cb_alloc(b, HKV_TIER_WORKSPACE, b->split_ws_bytes, err)))
        return hkv_err_prefix(err, "device flash-decoding workspace");
    /* Page-locked host buffers: the copies each step makes must be DMA. */
    /* a step's row targets fit one slot; larger uploads (kept sets) go in
     * slot-sized pieces (cb_stage) */
    b->slot_bytes = R * 8 > 1024 ? R * 8 : 1024;
    b->slot_bytes = (b->slot_bytes + 63) & ~(size_t)63;
    int rc;
    /* QKV rows down: a prompt chunk's, or every layer's of a decode batch
     * (one row a sequence) so that all of a step's host parts can wait */
    const size_t qkv_row = (size_t)b->qkv_w * 4;
    size_t qrows = (size_t)b->NL * S;
    if (qrows * qkv_row > HKV_DEFER_PINNED_MAX) qrows = HKV_DEFER_PINNED_MAX / qkv_row;
    if (qrows < R) qrows = R;
    b->qkv_rows = (int64_t)qrows;
    if ((rc = hkv_pinned_alloc(&b->h_qkv, &b->e->mem, NULL, HKV_TIER_WORKSPACE, qrows * qkv_row, -1,
                               HKV_PIN_REQUIRE, err)) ||
        (rc = hkv_pinned_alloc(&b->h_fo, &b->e->mem, NULL, HKV_TIER_WORKSPACE, R * b->qd * 4, -1,
                               HKV_PIN_REQUIRE, err)) ||
        (rc = hkv_pinned_alloc(&b->h_fl, &b->e->mem, NULL, HKV_TIER_WORKSPACE, R * b->H * 4, -1,
                               HKV_PIN_REQUIRE, err)) ||
        (rc = hkv_pinned_alloc(&b->h_stage, &b->e->mem, NULL, HKV_TIER_WORKSPACE,
                               STAGE_SLOTS * b->slot_bytes, -1, HKV_PIN_REQUIRE, err)))
        return hkv_err_prefix(err, "page-locked staging for the pipeline");
    for (int i = 0; i < STAGE_SLOTS; i++)
        if ((rc = hkv_gpu_event_create(&b->slot_ev[i], err))) return rc;
    if (!(b->ev = calloc((size_t)8 * b->NL, sizeof *b->ev)) ||
        !(b->ev_pending = calloc((size_t)2 * b->NL, sizeof *b->ev_pending)) ||
        !(b->m_epoch = calloc(S * b->NL, sizeof *b->m_epoch)) ||
        !(b->m_len = malloc(S * b->NL * sizeof *b->m_len)) ||
        !(b->h_rows = malloc(S * sizeof *b->h_rows)) ||
        !(b->h_nrows = malloc(S * b->KH * sizeof *b->h_nrows)) ||
        !(b->h_idx = malloc(S * b->KH * sizeof *b->h_idx)) ||
        !(b->h_dst = malloc(R * sizeof *b->h_dst)) || !(b->h_slow = malloc(S * sizeof *b->h_slow)) ||
        !(b->df_layer = malloc((size_t)b->NL * sizeof *b->df_layer)) ||
        !(b->df_segs = malloc(S * sizeof *b->df_segs)))
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the pipeline's tables");
    for (size_t i = 0; i < S * b->NL; i++) b->m_len[i] = -1;
    for (int i = 0; i < 8 * b->NL; i++)
        if ((rc = hkv_gpu_event_create(&b->ev[i], err))) return rc;
    return tm_create(b, err);
}

int hkv_cuda_backend_create(hkv_backend *be, struct hkv_engine *e, const hkv_cuda_params *p,
                            hkv_err *err) {
    be->ops = NULL;
    be->self = NULL;
    if (!hkv_kv_has_far(&e->kv) || !e->kv.ops->layer_step_far)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "the CUDA backend needs the tiered KV cache (its "
                          "far tier is attended by the CPU)");
    const hkv_model_config *c = &e->model.cfg;
    /* the device's attention kernels (gpu/gpu_kernels.h): refused here, not
     * at the first decode step */
    if (c->head_dim % 32 || c->head_dim > 256)
        return hkv_seterr(err, HKV_E_UNSUPPORTED, "the CUDA backend's attention needs a head size "
                          "that is a multiple of 32 and at most 256; %s has %d (--device cpu "
                          "runs it)", c->name[0] ? c->name : "this model", c->head_dim);
    cuda_be *b = calloc(1, sizeof *b);
    if (!b) return hkv_seterr(err, HKV_E_NOMEM, "no host memory for the CUDA backend");
    b->e = e;
    b->gemm = p->gemm;
    b->profile = p->profile;
    b->lockstep = p->lockstep;
    b->spin_us = p->wait_spin_us > 0    ? p->wait_spin_us
                 : p->wait_spin_us < 0 ? 0
                 : strcmp(hkv_gpu_backend(), "cuda-emu") ? HKV_WAIT_SPIN_US_DEFAULT
                                                          : 0;
    b->team_spin = p->team_spin;
    b->offload_mem = p->offload_mem;
    b->NL = c->n_layer, b->H = c->n_head, b->KH = c->n_head_kv, b->d = c->head_dim;
    const hkv_near_window w = hkv_kv_near_window(&e->kv);
    b->Li = w.L_init, b->Ll = w.L_local, b->NR = w.L_init + w.L_local;
    b->max_rows = e->max_rows, b->max_seqs = e->p.max_seqs;
    b->qd = (int64_t)b->H * b->d;
    b->qkv_w = e->qkv_rows;
    int rc;
    if ((int64_t)b->max_seqs * b->NL * b->KH * b->NR >= ((int64_t)1 << 31)) {
        rc = hkv_seterr(err, HKV_E_RANGE, "%d sequences x %d layers x %d KV heads x %d near rows "
                        "exceed the 32-bit row indices of the near tier", b->max_seqs, b->NL, b->KH,
                        b->NR);
        goto fail;
    }
    if ((rc = hkv_gpu_ctx_create(&b->ctx, p->device, NULL, p->gpu_mem, err))) goto fail;
    b->st = hkv_gpu_ctx_stream(b->ctx);
    if ((rc = upload_weights(b, err)) || (rc = alloc_buffers(b, err)) ||
        (rc = cb_recall_create(b, err)) || (rc = cb_keep_create(b, err)) ||
        (rc = cb_resident_create(b, p, e->p.n_ctx, err)) ||
        (rc = cb_pages_create(b, err)) || (rc = cb_rocket_create(b, err)) ||
        (rc = cb_prefill_create(b, p, err)) || (rc = cb_graph_create(b, p->graphs_off, err)))
        goto fail;
    cb_index_attach(b);
    be->ops = p->pingpong ? &cuda_ops_pp : &cuda_ops;
    be->self = b;
    return HKV_OK;
fail:
    g_destroy(b);
    return rc;
}

void cb_harvest(cuda_be *b) {
    if (b->gr.capturing) return;   /* the recorded step's events have not happened */
    for (int l = 0; l < 2 * b->NL; l++) {
        if (!b->ev_pending[l]) continue;
        void **ev = b->ev + 4 * l;
        if (!hkv_gpu_event_done(ev[3])) continue;   /* a layer of the call in flight */
        float near_ms = 0, wait_ms = 0;
        if (!hkv_gpu_event_elapsed(ev[1], ev[2], &near_ms, NULL)) b->stats.dev_near += near_ms * 1e-3;
        if (!hkv_gpu_event_elapsed(ev[2], ev[3], &wait_ms, NULL) && wait_ms > 0)
            b->stats.dev_wait_cpu += wait_ms * 1e-3;
        b->ev_pending[l] = 0;
    }
    tm_harvest(b);
}

int hkv_cuda_backend_stats(const hkv_backend *be, hkv_pipeline_stats *out, hkv_err *err) {
    if (!hkv_backend_is_cuda(be)) return hkv_seterr(err, HKV_E_INVAL, "not the CUDA backend");
    cuda_be *b = be->self;
    int rc = hkv_gpu_sync(b->st, err);
    if (rc) return rc;
    tm_call_close(b);   /* read between calls: the last call has ended */
    cb_harvest(b);
    b->stats.dev_in_use = hkv_gpu_in_use(b->ctx, -1);
    b->stats.dev_peak = hkv_gpu_peak(b->ctx, -1);
    for (int t = 0; t < HKV_TIER_COUNT && t < 5; t++) b->stats.dev_tier[t] = hkv_gpu_in_use(b->ctx, t);
    *out = b->stats;
    return HKV_OK;
}

void hkv_cuda_backend_stats_reset(hkv_backend *be) {
    if (!hkv_backend_is_cuda(be)) return;
    cuda_be *b = be->self;
    hkv_gpu_sync(b->st, NULL);
    tm_call_close(b);
    cb_harvest(b);
    memset(&b->stats, 0, sizeof b->stats);
}

/* The GPU memory plan (gpu_plan.h): bytes per tier from shapes alone. */
#include "far_rows.h"
#include "gpu_plan.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "host_mem.h"
#include "qmat_panel.h"
#include "window_scores.h"   /* hkv_rocketkv_split */

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static uint64_t ws_align(uint64_t b) { return (b + HKV_QMAT_ALIGN - 1) / HKV_QMAT_ALIGN * HKV_QMAT_ALIGN; }

uint64_t hkv_plan_param_count(const hkv_model_config *c) {
    const uint64_t dim = (uint64_t)c->dim, hd = (uint64_t)c->head_dim;
    const uint64_t qkv = (uint64_t)(c->n_head + 2 * c->n_head_kv) * hd;
    uint64_t per_layer = qkv * dim + dim * (uint64_t)c->n_head * hd + 3 * dim * (uint64_t)c->ffn;
    per_layer += 2 * dim + (c->qkv_bias ? qkv : 0);   /* norms, biases */
    uint64_t emb = (uint64_t)c->vocab * dim * (c->tied_output ? 1 : 2);
    return emb + dim + (uint64_t)c->n_layer * per_layer;
}

uint64_t hkv_plan_weight_bytes(const hkv_model_config *c, int elem) {
    const uint64_t dim = (uint64_t)c->dim, hd = (uint64_t)c->head_dim;
    const uint64_t qkv = (uint64_t)(c->n_head + 2 * c->n_head_kv) * hd;
    const uint64_t mats = qkv * dim + dim * (uint64_t)c->n_head * hd + 3 * dim * (uint64_t)c->ffn;
    const uint64_t vecs = 2 * dim + (c->qkv_bias ? qkv : 0);   /* kept fp32: tiny, precise */
    uint64_t emb = (uint64_t)c->vocab * dim * (c->tied_output ? 1 : 2);
    return (emb + (uint64_t)c->n_layer * mats) * (uint64_t)elem +
           ((uint64_t)c->n_layer * vecs + dim) * 4;
}

static int shape_ok(const hkv_model_config *c, hkv_err *err) {
    if (!c || c->n_layer < 1 || c->dim < 1 || c->n_head < 1 || c->n_head_kv < 1 ||
        c->head_dim < 1 || c->ffn < 1 || c->vocab < 1 || c->n_head % c->n_head_kv)
        return hkv_seterr(err, HKV_E_INVAL, "plan: bad model shape");
    return HKV_OK;
}

/* As ctkvr.c's resolve(): C = min(2048, n/16), rho' = about 3% of n in
 * [32, 1024], rho = 2.5 rho', C and rho clamped to the context. */
static void ctkvr_conf(const hkv_policy_args *a, int64_t n_ctx, int64_t *C, int64_t *rho_p,
                       int64_t *rho) {
    const hkv_policy_def *d = &hkv_policy_ctkvr;
    double v = hkv_policy_arg(d, a, "C");
    *C = isnan(v) ? min64(2048, n_ctx / 16) : (int64_t)v;
    *C = max64(1, min64(*C, n_ctx));
    v = hkv_policy_arg(d, a, "rho_p");
    *rho_p = isnan(v) ? hkv_policy_default_budget(n_ctx) : (int64_t)v;
    v = hkv_policy_arg(d, a, "rho");
    *rho = isnan(v) ? (int64_t)llround(2.5 * (double)*rho_p) : (int64_t)v;
    *rho = max64(1, min64(*rho, n_ctx));
}

/* A kept-set policy's budget, resolved as its create() does: NAN = about 3%
 * of the context, never more than the context (keepset.c, snapkv.c,
 * fastkv.c clamp; rocketkv's k is the budget as given). */
static int64_t budget_of(const hkv_policy_def *d, const hkv_policy_args *a, int64_t n_ctx) {
    double v = hkv_policy_arg(d, a, "budget");
    int64_t b = isnan(v) ? hkv_policy_default_budget(n_ctx) : (int64_t)v;
    if (d != &hkv_policy_rocketkv) b = min64(b, n_ctx);
    return max64(b, 1);
}

/* rocketkv's stage-1 split at a prompt of n (rocketkv.c: S = the prompt, t = 2k). */
static void rocketkv_conf(const hkv_policy_args *a, int64_t n_ctx, int d, hkv_rocketkv_split *sp) {
    hkv_rocketkv_split_of(n_ctx, 2 * budget_of(&hkv_policy_rocketkv, a, n_ctx), d,
                          hkv_policy_arg(&hkv_policy_rocketkv, a, "split"), sp);
}

/* fastkv's TSP layer (fastkv.c: default n_layer/2 - 1) and whether a prompt
 * of n is cut (only a prompt longer than tsp_len is). */
static int fastkv_tsp_layer(const hkv_policy_args *a, int n_layer) {
    double v = hkv_policy_arg(&hkv_policy_fastkv, a, "tsp_layer");
    int l = isnan(v) ? n_layer / 2 - 1 : (int)v;
    return l < 0 ? 0 : l >= n_layer ? n_layer - 1 : l;
}

static int fastkv_cuts(const hkv_policy_args *a, int64_t n_ctx) {
    return n_ctx > (int64_t)hkv_policy_arg(&hkv_policy_fastkv, a, "tsp_len");
}

static int64_t lookahead_of(const hkv_policy_def *d, const hkv_policy_args *a, int64_t n_ctx) {
    if (!d->lookahead_len) return 0;
    hkv_policy_env env = {.n_ctx = n_ctx};
    int64_t L = d->lookahead_len(a, &env);
    return L > 0 ? L : 0;
}

static int64_t far_of(const hkv_plan_params *p) {
    return max64(0, p->n_ctx - p->L_init - p->L_local);
}

/* The policy's arguments, or its defaults when none were given. */
static const hkv_policy_args *args_or_default(const hkv_policy_def *d, const hkv_policy_args *a,
                                              hkv_policy_args *dflt) {
    if (a) return a;
    hkv_policy_args_init(d, dflt);
    return dflt;
}

void hkv_plan_describe(const hkv_policy_def *d, const hkv_policy_args *a, int64_t n_ctx,
                       char *buf, size_t cap) {
    hkv_policy_args dflt;
    a = args_or_default(d, a, &dflt);
    if (d == &hkv_policy_ctkvr) {
        int64_t C, rho_p, rho;
        ctkvr_conf(a, n_ctx, &C, &rho_p, &rho);
        const int sk = (int)hkv_policy_arg(d, a, "sketch");
        snprintf(buf, cap, "ctkvr C=%lld rho=%lld rho'=%lld%s", (long long)C, (long long)rho,
                 (long long)rho_p, sk == 3 ? " 4-bit sketch" : sk ? " int8 sketch" : "");
    } else if (d == &hkv_policy_quest) {
        snprintf(buf, cap, "quest page=%.0f", hkv_policy_arg(d, a, "page"));
    } else if (d == &hkv_policy_snapkv) {
        snprintf(buf, cap, "snapkv budget=%lld", (long long)budget_of(d, a, n_ctx));
    } else if (d == &hkv_policy_rocketkv) {
        hkv_rocketkv_split sp;
        rocketkv_conf(a, n_ctx, 128, &sp);
        snprintf(buf, cap, "rocketkv k=%lld keep=%lld%s", (long long)budget_of(d, a, n_ctx),
                 (long long)sp.capacity, hkv_policy_arg(d, a, "mt") >= 1 ? " mt" : "");
    } else if (d == &hkv_policy_laq || d == &hkv_policy_speckv) {
        snprintf(buf, cap, "%s budget=%lld L=%lld", d->name, (long long)budget_of(d, a, n_ctx),
                 (long long)lookahead_of(d, a, n_ctx));
    } else if (d == &hkv_policy_fastkv) {
        snprintf(buf, cap, "fastkv budget=%lld tsp=%.0f", (long long)budget_of(d, a, n_ctx),
                 hkv_policy_arg(d, a, "tsp_len"));
    } else if (d == &hkv_policy_specpc) {
        snprintf(buf, cap, "specpc C=%.0f", hkv_policy_arg(d, a, "C"));
    } else {
        snprintf(buf, cap, "%s", d->name);
    }
}

int64_t hkv_plan_kept_rows(const hkv_plan_params *p) {
    const hkv_policy_def *d = p->policy ? p->policy : &hkv_policy_full;
    hkv_policy_args dflt;
    const hkv_policy_args *a = args_or_default(d, p->args, &dflt);
    const int64_t far = far_of(p);
    if (d == &hkv_policy_snapkv || d == &hkv_policy_laq || d == &hkv_policy_speckv ||
        d == &hkv_policy_fastkv)
        return min64(budget_of(d, a, p->n_ctx), far);
    if (d == &hkv_policy_rocketkv) {   /* the stage-1 survivors stage 2 picks from each step */
        hkv_rocketkv_split sp;
        rocketkv_conf(a, p->n_ctx, p->cfg->head_dim, &sp);
        return min64(sp.capacity, far);
    }
    return 0;
}

int hkv_plan_index_bytes(const hkv_plan_params *p, uint64_t *gpu, uint64_t *host, hkv_err *err) {
    *gpu = 0;
    if (host) *host = 0;
    const hkv_model_config *c = p->cfg;
    int rc = shape_ok(c, err);
    if (rc) return rc;
    const hkv_policy_def *d = p->policy ? p->policy : &hkv_policy_full;
    hkv_policy_args dflt;
    const hkv_policy_args *a = args_or_default(d, p->args, &dflt);
    const int64_t n_ctx = p->n_ctx;
    const int index_on_host = p->index_on_host;
    const uint64_t L = (uint64_t)c->n_layer, KH = (uint64_t)c->n_head_kv, H = (uint64_t)c->n_head;
    const uint64_t hd = (uint64_t)c->head_dim;
    uint64_t g = 0, h = 0;
    if (d == &hkv_policy_full || d == &hkv_policy_oracle || d == &hkv_policy_specpc) {
        /* full (and specpc, which runs full over its C tokens) keeps the KV
         * itself on the GPU (counted as near); oracle scans the far tier on
         * the host: none has an index. */
    } else if (d == &hkv_policy_ctkvr) {
        int64_t C, rho_p, rho;
        ctkvr_conf(a, n_ctx, &C, &rho_p, &rho);
        const uint64_t cent = L * (uint64_t)C * H * hd * 2;      /* [C][H][d] fp16 per layer */
        const uint64_t fifo = L * KH * (8 + (uint64_t)C);        /* cursor, count; DCU flags */
        const uint64_t ivf = L * KH * (uint64_t)C * (uint64_t)rho * 4 +  /* [KH][C][rho] int32 */
                             L * KH * (uint64_t)C * 4;                  /* list lengths */
        /* sketch=1..3: a copy of every far key for the rerank, on the host
         * (ctkvr_sketch.c): int8 or 4-bit codes and an fp32 scale per 32 */
        const int sk = (int)hkv_policy_arg(d, a, "sketch");
        const uint64_t sketch = L * KH * (uint64_t)n_ctx * hkv_sketch_row_bytes(sk, (int)hd);
        g = cent + fifo + (index_on_host ? 0 : ivf);
        h = (index_on_host ? ivf : 0) + sketch;
    } else if (d == &hkv_policy_quest) {
        /* Per page of P far tokens, the element-wise min and max key (fp16). */
        int64_t P = (int64_t)hkv_policy_arg(d, a, "page");
        if (P < 1) return hkv_seterr(err, HKV_E_RANGE, "plan: quest page %lld", (long long)P);
        const uint64_t pages = (uint64_t)(n_ctx / P + 1);
        g = L * KH * pages * 2 * hd * 2 + L * 16 + L * KH * 16;
    } else if (d == &hkv_policy_snapkv || d == &hkv_policy_laq || d == &hkv_policy_speckv ||
               d == &hkv_policy_fastkv) {
        /* The kept positions per (layer, KV head), int32, and their counts;
         * laq/speckv (keepset.c) add per-layer selection ends, scored counts,
         * flags and prompt ends; laq's stage-1 set is the same storage,
         * re-selected at lookahead_end. */
        const uint64_t b = (uint64_t)budget_of(d, a, n_ctx);
        uint64_t kept = L * KH * b * 4 + L * KH * 8, tsp = 0;
        if (d == &hkv_policy_laq || d == &hkv_policy_speckv) kept += L * (8 + 8 + 4 + 8);
        if (d == &hkv_policy_fastkv && fastkv_cuts(a, n_ctx)) {
            /* The propagated positions: the policy's [n] list, and the tiered
             * cache's per-layer lists of the sequence's capacity for every
             * layer past the TSP layer (kv_tiered_tsp.c). */
            const uint64_t later = L - 1 - (uint64_t)fastkv_tsp_layer(a, c->n_layer);
            tsp = (uint64_t)n_ctx * 4 + later * (uint64_t)n_ctx * 4;
        }
        g = index_on_host ? 0 : kept + tsp;
        h = index_on_host ? kept + tsp : 0;
    } else if (d == &hkv_policy_rocketkv) {
        /* Per layer and KV head: a count, the candidate list (survivors, room
         * for 1024 later far tokens) and the page min/max bounds of the HSA
         * estimate, [2d][pages] fp16 (rocketkv.c block_alloc), plus per-step
         * statistics. The GPU reads the bounds every step; the list can live
         * on the host, where the chosen pages' positions are resolved. */
        hkv_rocketkv_split sp;
        rocketkv_conf(a, n_ctx, c->head_dim, &sp);
        const uint64_t cap = (uint64_t)min64(sp.capacity, far_of(p)) + 1024;
        const uint64_t pcap = cap / (uint64_t)sp.page + 1;
        const uint64_t list = L * KH * cap * 4;
        const uint64_t rest = L * KH * (8 + 2 * hd * pcap * 2) + L * KH * 16;
        g = rest + (index_on_host ? 0 : list);
        h = index_on_host ? list : 0;
    } else {
        return hkv_seterr(err, HKV_E_UNSUPPORTED,
                          "plan: no GPU memory formula for policy '%s' yet", d->name);
    }
    *gpu = g;
    if (host) *host = h;
    return HKV_OK;
}

/* Candidate ids the GPU hands the host per (sequence, KV head) each step. */
/* The weight products' workspace (gpu/qmat.cu, hkv_gpu_qmat_matmul_ws_bytes,
 * sized by pipeline/cuda_backend.c for the most rows a call has): the
 * largest over the matrices of one dequantised panel (4 bytes a weight) and
 * the split activations of up to HKV_QMAT_XCHUNK rows (the tensor-core
 * modes; counted in every mode, a bound); none while every call is a GEMV. */
static uint64_t product_ws(const hkv_model_config *c, uint64_t R) {
    if (R <= HKV_QMAT_GEMV_MAX_ROWS) return 0;
    const int64_t q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_head_kv * c->head_dim;
    const int64_t shape[][2] = {{q, c->dim}, {kv, c->dim}, {c->dim, q}, {c->ffn, c->dim},
                                {c->dim, c->ffn}, {c->vocab, c->dim}};
    const uint64_t xc = R < HKV_QMAT_XCHUNK ? R : HKV_QMAT_XCHUNK;
    uint64_t most = 0;
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) {
        const uint64_t cols = (uint64_t)shape[i][1];
        const uint64_t panel = (uint64_t)hkv_qmat_panel_rows(shape[i][0], shape[i][1]) * cols * 4;
        const uint64_t ws = ws_align(panel) + ws_align(xc * cols * 4) + xc * 4;
        if (ws > most) most = ws;
    }
    return most;
}

static uint64_t step_ids(const hkv_policy_def *d, const hkv_policy_args *a, int64_t n_ctx) {
    if (d == &hkv_policy_ctkvr) {
        int64_t C, rho_p, rho;
        ctkvr_conf(a, n_ctx, &C, &rho_p, &rho);
        return (uint64_t)min64(n_ctx, (int64_t)hkv_policy_arg(d, a, "Cp") * rho);
    }
    return 0;
}

int hkv_plan_compute(const hkv_plan_params *p, hkv_plan *o, hkv_err *err) {
    memset(o, 0, sizeof *o);
    int rc = shape_ok(p->cfg, err);
    if (rc) return rc;
    const hkv_model_config *c = p->cfg;
    if (p->batch < 1 || p->batch > 1 << 20)
        return hkv_seterr(err, HKV_E_RANGE, "plan: batch %d out of range (1..%d)", p->batch, 1 << 20);
    if (p->n_ctx < 1 || p->n_ctx > ((int64_t)1 << 31))
        return hkv_seterr(err, HKV_E_RANGE, "plan: context %lld out of range (1..2^31)",
                          (long long)p->n_ctx);
    if (p->L_init < 0 || p->L_local < 1 || p->max_rows < 0)
        return hkv_seterr(err, HKV_E_RANGE, "plan: near tier %d + %d or rows %d out of range",
                          p->L_init, p->L_local, p->max_rows);
    const hkv_policy_def *d = p->policy ? p->policy : &hkv_policy_full;
    hkv_policy_args dflt;
    const hkv_policy_args *a = args_or_default(d, p->args, &dflt);
    const uint64_t B = (uint64_t)p->batch, L = (uint64_t)c->n_layer, KH = (uint64_t)c->n_head_kv;
    const uint64_t hd = (uint64_t)c->head_dim, H = (uint64_t)c->n_head;
    const uint64_t ctx = (uint64_t)p->n_ctx;
    o->kv_per_token = L * KH * hd * 2 * 2;
    o->far_per_token = L * KH * 2 * hkv_far_row_bytes((int)hd, p->far_q8);
    o->weights = p->weight_bytes ? p->weight_bytes : hkv_plan_weight_bytes(c, 2);

    if (p->n_gen < 0 || p->n_gen >= p->n_ctx)
        return hkv_seterr(err, HKV_E_RANGE, "plan: %lld generated tokens do not leave a prompt in "
                          "a context of %lld", (long long)p->n_gen, (long long)p->n_ctx);
    if (p->draft && (rc = shape_ok(p->draft, err))) return hkv_err_prefix(err, "draft");
    uint64_t ig = 0, ih = 0;
    if ((rc = hkv_plan_index_bytes(p, &ig, &ih, err))) return rc;
    const int64_t prompt = p->n_ctx - p->n_gen;
    const int full_split = d == &hkv_policy_full && p->full_split &&
                           (int64_t)p->L_init + p->L_local < p->n_ctx;
    o->kv_on_gpu = (d == &hkv_policy_full && !full_split) || d == &hkv_policy_specpc;
    if (d == &hkv_policy_full && !full_split) {
        o->per_seq_near = ctx * o->kv_per_token;   /* dense decode reads it all every step */
        o->per_seq_pinned = 0;
    } else if (d == &hkv_policy_specpc) {
        /* The target prefills only C prompt tokens and attends densely over
         * them and what it generates: no far tier at all. */
        const double C = hkv_policy_arg(d, a, "C");
        o->per_seq_near = (uint64_t)(min64((int64_t)C, prompt) + p->n_gen) * o->kv_per_token;
        o->per_seq_pinned = 0;
    } else {
        /* The near rows never exceed the context, an eviction policy's kept
         * rows sit beside them; the far tier is reserved for the whole context
         * (and the lookahead room of laq/speckv) at seq_open, as kv_tiered.c
         * and generate.c do. */
        uint64_t nr = (uint64_t)min64((int64_t)p->L_init + p->L_local, p->n_ctx);
        o->per_seq_kept = (uint64_t)hkv_plan_kept_rows(p) * o->kv_per_token;
        o->per_seq_near = nr * o->kv_per_token + o->per_seq_kept;
        o->per_seq_pinned = (ctx + (uint64_t)lookahead_of(d, a, p->n_ctx)) * o->far_per_token + ih;
    }
    o->per_seq_index = ig;
    o->near = B * o->per_seq_near;
    o->index = B * ig;
    o->pinned = B * o->per_seq_pinned;
    if (p->shared_rows > 0 && o->per_seq_pinned && B > 1) {
        /* (the shared rows are whole pages of every run: never more than the context's) */
        const uint64_t sh = (uint64_t)min64(p->shared_rows, p->n_ctx) * o->far_per_token;
        o->shared_pinned = sh < o->per_seq_pinned ? sh : o->per_seq_pinned;
        o->pinned -= (B - 1) * o->shared_pinned;
    }

    /* Workspace: the device's fp32 activations for R rows (pipeline/
     * cuda_backend.c: X, XN, QKV, ATT, GU, G, and TMP, which holds R rows of
     * dim or the head's logits, hkv_head_rows of them), near and far
     * attention partials (out, lse) of each decode row, the candidate ids
     * handed to the host, cuBLAS's workspace. */
    const uint64_t R = (uint64_t)max64(p->max_rows ? p->max_rows : 256, p->batch);
    const uint64_t qkv = (H + 2 * KH) * hd, dim = (uint64_t)c->dim, ffn = (uint64_t)c->ffn;
    uint64_t ws = R * (2 * dim + qkv + H * hd + 3 * ffn) * 4;
    const uint64_t logits = (uint64_t)hkv_head_rows((int64_t)R, B) * (uint64_t)c->vocab;
    ws += (R * dim > logits ? R * dim : logits) * 4;
    ws += 2 * B * H * (hd + 1) * 4;
    ws += B * KH * step_ids(d, a, p->n_ctx) * 4;
    ws += p->cublas_ws ? p->cublas_ws : HKV_PLAN_CUBLAS_WS;
    ws += product_ws(c, R);
    /* fastkv cutting a prompt keeps every prompt token's hidden row (fp32)
     * through the first layers (tsp_prefill.c); prefills run one at a time. */
    if (d == &hkv_policy_fastkv && fastkv_cuts(a, p->n_ctx)) ws += (uint64_t)prompt * dim * 4;
    o->workspace = ws;
    if (d->prep == HKV_PREP_LOOKAHEAD_DRAFT || d->prep == HKV_PREP_COMPRESS_DRAFT) {
        /* The draft (runtime/draft.c): its weights, the KV of the one sequence
         * it prefills (the prompt, plus speckv's answer) kept dense, its
         * activations for R rows and one row of logits. With no draft given
         * the target drafts for itself: the weights are already there. */
        const hkv_model_config *dc = p->draft ? p->draft : c;
        const uint64_t dw = p->draft ? hkv_plan_weight_bytes(dc, 2) : 0;
        const uint64_t dkv = (uint64_t)dc->n_layer * dc->n_head_kv * dc->head_dim * 2 * 2;
        const uint64_t dqkv = (uint64_t)(dc->n_head + 2 * dc->n_head_kv) * dc->head_dim;
        const uint64_t dtok = (uint64_t)prompt + (uint64_t)lookahead_of(d, a, p->n_ctx);
        o->draft = dw + dtok * dkv +
                   R * (2 * (uint64_t)dc->dim + dqkv + (uint64_t)dc->n_head * dc->head_dim +
                        2 * (uint64_t)dc->ffn) * 4 +
                   (uint64_t)dc->vocab * 4;
    }
    if (p->resident > 0 && !o->kv_on_gpu) {
        /* (the pipeline's slots take n_ctx less the near ring; the sinks' rows as well) */
        const int64_t far = p->n_ctx - (int64_t)p->L_init - p->L_local;
        const uint64_t fr = far > 0 ? (uint64_t)far : 0,
                       own = p->resident_rows > 0 && (uint64_t)p->resident_rows < fr
                                 ? (uint64_t)p->resident_rows : fr;
        o->resident = ((uint64_t)p->resident * own +
                       (uint64_t)(p->resident_prefixes > 0 ? p->resident_prefixes : 0) * fr) *
                          o->kv_per_token +
                      B * (H * (hd + 1) * 4 + KH * 16);
    }
    o->gpu_total = o->weights + o->near + o->index + o->workspace + o->draft + o->resident;
    return HKV_OK;
}

int hkv_plan_admit(const hkv_plan_params *p, const hkv_plan *o, uint64_t cap, hkv_err *err) {
    if (o->gpu_total <= cap) return HKV_OK;
    char t[32], w[32], n[32], i[32], s[32], cp[32];
    hkv_fmt_bytes((double)o->gpu_total, t, sizeof t);
    hkv_fmt_bytes((double)o->weights, w, sizeof w);
    hkv_fmt_bytes((double)o->near, n, sizeof n);
    hkv_fmt_bytes((double)o->index, i, sizeof i);
    hkv_fmt_bytes((double)o->workspace, s, sizeof s);
    hkv_fmt_bytes((double)cap, cp, sizeof cp);
    char dr[96] = "";
    if (o->draft) {
        char x[32];
        hkv_fmt_bytes((double)o->draft, x, sizeof x);
        snprintf(dr, sizeof dr, ", draft %s", x);
    }
    if (o->resident) {
        char x[32];
        hkv_fmt_bytes((double)o->resident, x, sizeof x);
        snprintf(dr + strlen(dr), sizeof dr - strlen(dr), ", %d resident sequences %s",
                 p->resident, x);
    }
    return hkv_seterr(err, HKV_E_CAPACITY,
                      "batch %d x context %lld with policy %s needs %s of GPU memory (weights %s, "
                      "near %s, index %s, workspace %s%s) but the cap is %s", p->batch,
                      (long long)p->n_ctx, p->policy ? p->policy->name : "full", t, w, n, i, s, dr,
                      cp);
}

int hkv_plan_admit_host(const hkv_plan_params *p, const hkv_plan *o, uint64_t avail,
                        int capped, hkv_err *err) {
    if (!avail || o->pinned <= avail) return HKV_OK;
    uint64_t ig = 0, ih = 0;
    int rc = hkv_plan_index_bytes(p, &ig, &ih, err);
    if (rc) return rc;
    const uint64_t ih_all = (uint64_t)p->batch * ih;   /* (0 unless on the host) */
    char t[32], kv[32], ix[32], per[32], av[32];
    hkv_fmt_bytes((double)o->pinned, t, sizeof t);
    hkv_fmt_bytes((double)(o->pinned - ih_all), kv, sizeof kv);
    hkv_fmt_bytes((double)ih_all, ix, sizeof ix);
    hkv_fmt_bytes((double)o->per_seq_pinned, per, sizeof per);
    hkv_fmt_bytes((double)avail, av, sizeof av);
    /* with a shared prefix: the prefix once, each sequence its own rest */
    const uint64_t sh = o->shared_pinned, own = o->per_seq_pinned - sh;
    const long long fit = !o->per_seq_pinned ? 0
                          : !sh             ? (long long)(avail / o->per_seq_pinned)
                          : avail < sh      ? 0
                          : own             ? (long long)((avail - sh) / own)
                                            : p->batch;
    return hkv_seterr(err, HKV_E_CAPACITY,
                      "batch %d x context %lld with policy %s needs %s of page-locked host memory "
                      "(far tier K and V %s, index lists %s; %s a sequence%s) but %s %s%s: at most "
                      "%lld such sequences fit", p->batch, (long long)p->n_ctx,
                      p->policy ? p->policy->name : "full", t, kv, ix, per,
                      sh ? ", its shared prompt held once" : "",
                      capped ? "the cap is" : "the host has", av, capped ? "" : " available", fit);
}

int hkv_plan_max_batch(const hkv_plan_params *p, uint64_t cap, int max_batch, int *out,
                       hkv_err *err) {
    *out = 0;
    hkv_plan_params q = *p;
    hkv_plan o;
    int lo = 0, hi = max_batch;   /* lo fits (0 trivially), answer in [lo, hi] */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        q.batch = mid;
        int rc = hkv_plan_compute(&q, &o, err);
        if (rc) return rc;
        if (o.gpu_total <= cap) lo = mid;
        else hi = mid - 1;
    }
    *out = lo;
    return HKV_OK;
}

int hkv_parse_size(const char *what, const char *s, uint64_t *out, hkv_err *err) {
    const char *p = s;
    double v = 0, frac = 0.1;
    int digits = 0;
    while (isdigit((unsigned char)*p)) v = v * 10 + (*p++ - '0'), digits++;
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) v += (*p++ - '0') * frac, frac /= 10, digits++;
    }
    if (!digits)
        return hkv_seterr(err, HKV_E_INVAL, "%s: '%s' is not a size (e.g. 24G, 500M, 1.5T)", what, s);
    static const struct { const char *u; double m; } units[] = {
        {"", 1}, {"b", 1},
        {"k", 1024.0}, {"kb", 1024.0}, {"kib", 1024.0},
        {"m", 1048576.0}, {"mb", 1048576.0}, {"mib", 1048576.0},
        {"g", 1073741824.0}, {"gb", 1073741824.0}, {"gib", 1073741824.0},
        {"t", 1099511627776.0}, {"tb", 1099511627776.0}, {"tib", 1099511627776.0},
    };
    double mul = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(p, units[i].u)) mul = units[i].m;
    if (mul == 0)
        return hkv_seterr(err, HKV_E_INVAL, "%s: unknown unit in '%s' (use K, M, G, T, as in 24G)",
                          what, s);
    double b = v * mul;
    if (b < 1) return hkv_seterr(err, HKV_E_RANGE, "%s: '%s' is zero", what, s);
    if (b > 1125899906842624.0)   /* 1 PiB: no device or host comes close */
        return hkv_seterr(err, HKV_E_RANGE, "%s: '%s' is absurdly large (more than 1 PiB)", what, s);
    *out = (uint64_t)b;
    return HKV_OK;
}

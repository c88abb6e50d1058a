/* The GPU memory plan (gpu_plan.h): bytes per tier from shapes alone. */
#include "gpu_plan.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "host_mem.h"
#include "window_scores.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

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
    *rho_p = isnan(v) ? hkv_ws_default_budget(n_ctx) : (int64_t)v;
    v = hkv_policy_arg(d, a, "rho");
    *rho = isnan(v) ? (int64_t)llround(2.5 * (double)*rho_p) : (int64_t)v;
    *rho = max64(1, min64(*rho, n_ctx));
}

static int64_t snapkv_budget(const hkv_policy_args *a, int64_t n_ctx) {
    double v = hkv_policy_arg(&hkv_policy_snapkv, a, "budget");
    return min64(isnan(v) ? hkv_ws_default_budget(n_ctx) : (int64_t)v, n_ctx);
}

void hkv_plan_describe(const hkv_policy_def *d, const hkv_policy_args *a, int64_t n_ctx,
                       char *buf, size_t cap) {
    hkv_policy_args dflt;
    if (!a) {
        hkv_policy_args_init(d, &dflt);
        a = &dflt;
    }
    if (d == &hkv_policy_ctkvr) {
        int64_t C, rho_p, rho;
        ctkvr_conf(a, n_ctx, &C, &rho_p, &rho);
        snprintf(buf, cap, "ctkvr C=%lld rho=%lld rho'=%lld", (long long)C, (long long)rho,
                 (long long)rho_p);
    } else if (d == &hkv_policy_quest) {
        snprintf(buf, cap, "quest page=%.0f", hkv_policy_arg(d, a, "page"));
    } else if (d == &hkv_policy_snapkv) {
        snprintf(buf, cap, "snapkv budget=%lld", (long long)snapkv_budget(a, n_ctx));
    } else {
        snprintf(buf, cap, "%s", d->name);
    }
}

int hkv_plan_index_bytes(const hkv_policy_def *d, const hkv_policy_args *a,
                         const hkv_model_config *c, int64_t n_ctx, int index_on_host,
                         uint64_t *gpu, uint64_t *host, hkv_err *err) {
    *gpu = 0;
    if (host) *host = 0;
    int rc = shape_ok(c, err);
    if (rc) return rc;
    hkv_policy_args dflt;
    if (!a) {
        hkv_policy_args_init(d, &dflt);
        a = &dflt;
    }
    const uint64_t L = (uint64_t)c->n_layer, KH = (uint64_t)c->n_head_kv, H = (uint64_t)c->n_head;
    const uint64_t hd = (uint64_t)c->head_dim;
    uint64_t g = 0, h = 0;
    if (d == &hkv_policy_full || d == &hkv_policy_oracle) {
        /* full keeps the KV itself on the GPU (counted as near); oracle scans
         * the far tier on the host: neither has an index. */
    } else if (d == &hkv_policy_ctkvr) {
        int64_t C, rho_p, rho;
        ctkvr_conf(a, n_ctx, &C, &rho_p, &rho);
        const uint64_t cent = L * (uint64_t)C * H * hd * 2;      /* [C][H][d] fp16 per layer */
        const uint64_t fifo = L * KH * (8 + (uint64_t)C);        /* cursor, count; DCU flags */
        const uint64_t ivf = L * KH * (uint64_t)C * (uint64_t)rho * 4 +  /* [KH][C][rho] int32 */
                             L * KH * (uint64_t)C * 4;                  /* list lengths */
        g = cent + fifo + (index_on_host ? 0 : ivf);
        h = index_on_host ? ivf : 0;
    } else if (d == &hkv_policy_quest) {
        /* Per page of P far tokens, the element-wise min and max key (fp16). */
        int64_t P = (int64_t)hkv_policy_arg(d, a, "page");
        if (P < 1) return hkv_seterr(err, HKV_E_RANGE, "plan: quest page %lld", (long long)P);
        const uint64_t pages = (uint64_t)(n_ctx / P + 1);
        g = L * KH * pages * 2 * hd * 2 + L * 16 + L * KH * 16;
    } else if (d == &hkv_policy_snapkv) {
        /* The kept positions per (layer, KV head), int32. */
        const int64_t b = snapkv_budget(a, n_ctx);
        const uint64_t kept = L * KH * (uint64_t)b * 4 + L * KH * 8;
        g = index_on_host ? 0 : kept;
        h = index_on_host ? kept : 0;
    } else {
        return hkv_seterr(err, HKV_E_UNSUPPORTED,
                          "plan: no GPU memory formula for policy '%s' yet (full, oracle, "
                          "ctkvr, quest and snapkv have one)", d->name);
    }
    *gpu = g;
    if (host) *host = h;
    return HKV_OK;
}

/* Candidate ids the GPU hands the host per (sequence, KV head) each step. */
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
    if (p->L_init < 0 || p->L_local < 1 || p->max_rows < 0 || p->weight_elem_bytes < 0 ||
        p->weight_elem_bytes > 4)
        return hkv_seterr(err, HKV_E_RANGE, "plan: near tier %d + %d, rows %d or weight bytes %d "
                          "out of range", p->L_init, p->L_local, p->max_rows, p->weight_elem_bytes);
    const hkv_policy_def *d = p->policy ? p->policy : &hkv_policy_full;
    hkv_policy_args dflt;
    const hkv_policy_args *a = p->args;
    if (!a) {
        hkv_policy_args_init(d, &dflt);
        a = &dflt;
    }
    const uint64_t B = (uint64_t)p->batch, L = (uint64_t)c->n_layer, KH = (uint64_t)c->n_head_kv;
    const uint64_t hd = (uint64_t)c->head_dim, H = (uint64_t)c->n_head;
    const uint64_t ctx = (uint64_t)p->n_ctx;
    o->kv_per_token = L * KH * hd * 2 * 2;
    o->weights = hkv_plan_weight_bytes(c, p->weight_elem_bytes ? p->weight_elem_bytes : 2);

    uint64_t ig = 0, ih = 0;
    if ((rc = hkv_plan_index_bytes(d, a, c, p->n_ctx, p->index_on_host, &ig, &ih, err))) return rc;
    o->kv_on_gpu = d == &hkv_policy_full;
    if (o->kv_on_gpu) {
        o->per_seq_near = ctx * o->kv_per_token;   /* dense decode reads it all every step */
        o->per_seq_pinned = 0;
    } else {
        /* The near rows never exceed the context; the far tier is reserved for
         * the whole context at seq_open, as kv_tiered.c does. */
        uint64_t nr = (uint64_t)min64((int64_t)p->L_init + p->L_local, p->n_ctx);
        o->per_seq_near = nr * o->kv_per_token;
        o->per_seq_pinned = ctx * o->kv_per_token + ih;
    }
    o->per_seq_index = ig;
    o->near = B * o->per_seq_near;
    o->index = B * ig;
    o->pinned = B * o->per_seq_pinned;

    /* Workspace: fp32 activations for R rows (the engine's buffers), logits of
     * one row per sequence, near and far attention partials (out, lse) of each
     * decode row, the candidate ids handed to the host, cuBLAS's workspace. */
    const uint64_t R = (uint64_t)max64(p->max_rows ? p->max_rows : 256, p->batch);
    const uint64_t qkv = (H + 2 * KH) * hd, dim = (uint64_t)c->dim, ffn = (uint64_t)c->ffn;
    uint64_t ws = R * (2 * dim + qkv + H * hd + 2 * ffn) * 4;
    ws += B * (uint64_t)c->vocab * 4;
    ws += 2 * B * H * (hd + 1) * 4;
    ws += B * KH * step_ids(d, a, p->n_ctx) * 4;
    ws += p->cublas_ws ? p->cublas_ws : HKV_PLAN_CUBLAS_WS;
    o->workspace = ws;
    o->gpu_total = o->weights + o->near + o->index + o->workspace;
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
    return hkv_seterr(err, HKV_E_CAPACITY,
                      "batch %d x context %lld with policy %s needs %s of GPU memory (weights %s, "
                      "near %s, index %s, workspace %s) but the cap is %s", p->batch,
                      (long long)p->n_ctx, p->policy ? p->policy->name : "full", t, w, n, i, s, cp);
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

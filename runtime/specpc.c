/* SpecPC prompt compression (specpc.h). */
#include "specpc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "kv_far.h"
#include "window_scores.h"

typedef struct ranked { float s; int32_t i; } ranked;

static int cmp_rank(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int64_t hkv_specpc_select(const float *r, int64_t n, int64_t C, int64_t window, int kernel,
                          int neighbors, int32_t *keep, hkv_mem_account *mem, hkv_err *err) {
    if (n <= 0 || C <= 0) return 0;
    if (C >= n) {
        for (int64_t i = 0; i < n; i++) keep[i] = (int32_t)i;
        return n;
    }
    /* smoothed scores, top-k index/scratch, ranks, seen flags, offsets */
    const size_t bytes = (size_t)n * (4 + 4 + 4 + 1) + (size_t)C * sizeof(ranked) +
                         (size_t)neighbors * 4 + 64;
    char *ws = hkv_host_alloc(mem, HKV_TIER_WORKSPACE, bytes, err);
    if (!ws) {
        hkv_err_prefix(err, "specpc selection over %lld tokens", (long long)n);
        return HKV_E_NOMEM;
    }
    float *sm = (float *)ws;
    int32_t *idx = (int32_t *)(sm + n), *scr = idx + n;
    ranked *rk = (ranked *)(scr + n);
    int32_t *off = (int32_t *)(rk + C);
    unsigned char *seen = (unsigned char *)(off + neighbors);
    const int64_t left = (kernel - 1) / 2, right = kernel - 1 - left;
    for (int64_t i = 0; i < n; i++) {   /* zero padding: scores are >= 0, so a clipped max */
        int64_t a = i - left < 0 ? 0 : i - left, b = i + right >= n ? n - 1 : i + right;
        float m = 0;
        for (int64_t j = a; j <= b; j++) m = r[j] > m ? r[j] : m;
        sm[i] = m;
    }
    int64_t m = hkv_topk_asc(sm, n, C, idx, scr);
    for (int64_t i = 0; i < m; i++) rk[i] = (ranked){sm[idx[i]], idx[i]};
    qsort(rk, (size_t)m, sizeof *rk, cmp_rank);
    /* offsets -(nb-1)/2 .. nb-1-(nb-1)/2 by |offset|, the negative one first on ties
     * (Python's stable sorted(key=abs) over the ascending range) */
    const int lo = -((neighbors - 1) / 2);
    int no = 0;
    off[no++] = 0;
    for (int a = 1; no < neighbors; a++) {
        if (-a >= lo && no < neighbors) off[no++] = -a;
        if (a <= lo + neighbors - 1 && no < neighbors) off[no++] = a;
    }
    memset(seen, 0, (size_t)n);
    /* The window from its end: with C >= window (always in the paper) the
     * same set as the code's ascending prepend; with C < window the last C
     * tokens (the question, the assistant prefix) rather than the first C. */
    int64_t c = 0;
    for (int64_t p = n - 1; p >= (n - window < 0 ? 0 : n - window) && c < C; p--) {
        seen[p] = 1;
        keep[c++] = (int32_t)p;
    }
    for (int64_t i = 0; i < m && c < C; i++)
        for (int o = 0; o < no && c < C; o++) {
            int64_t p = rk[i].i + off[o];
            p = p < 0 ? 0 : p >= n ? n - 1 : p;
            if (!seen[p]) {
                seen[p] = 1;
                keep[c++] = (int32_t)p;
            }
        }
    qsort(keep, (size_t)c, sizeof *keep, cmp_i32);
    hkv_host_free(mem, HKV_TIER_WORKSPACE, ws, bytes);
    return c;
}

/* Per-token scores of the draft's attention: r[j] = max over layers >=
 * skip, heads, window rows a of weight[a] * softmax weight of key j. */
static int draft_scores(hkv_engine *d, int64_t n, int64_t window, int skip, float *r, hkv_err *err) {
    const hkv_model_config *c = &d->model.cfg;
    const int KH = c->n_head_kv;
    const size_t qb = (size_t)window * c->n_head * c->head_dim * 2, sb = (size_t)KH * n * 4,
                 wb = (size_t)window * 4;
    uint16_t *q = hkv_host_alloc(&d->mem, HKV_TIER_WORKSPACE, qb, err);
    float *s = q ? hkv_host_alloc(&d->mem, HKV_TIER_WORKSPACE, sb, err) : NULL;
    float *wt = s ? hkv_host_alloc(&d->mem, HKV_TIER_WORKSPACE, wb, err) : NULL;
    int rc = wt ? HKV_OK : hkv_err_prefix(err, "specpc scores");
    memset(r, 0, (size_t)n * 4);
    for (int l = skip; !rc && l < c->n_layer; l++) {
        hkv_far_view far;
        hkv_query_view qv;
        if ((rc = hkv_kv_prompt_view(&d->kv, 0, l, &far, &qv, q, window, err))) break;
        int64_t want = window < n ? window : n;
        if (qv.n < want) {
            rc = hkv_seterr(err, HKV_E_INVAL, "specpc: window=%lld, but the draft keeps %lld "
                            "prompt queries (give specpc on the command line so the draft keeps "
                            "enough)", (long long)window, (long long)qv.n);
            break;
        }
        for (int64_t a = 0; a < qv.n; a++)   /* torch.linspace(0, 1, w) */
            wt[a] = qv.n > 1 ? (float)((double)a / (double)(qv.n - 1)) : 1.0f;
        hkv_ws_job job = {.far = &far, .qv = &qv, .n_head = c->n_head, .out = s, .ld_out = n,
                          .reduce_max = 1, .q_weight = wt};
        if ((rc = hkv_ws_window_scores(&d->kern, &job, &d->mem, err))) break;
        for (int h = 0; h < KH; h++)
            for (int64_t j = 0; j < n; j++) r[j] = s[h * n + j] > r[j] ? s[h * n + j] : r[j];
    }
    if (wt) hkv_host_free(&d->mem, HKV_TIER_WORKSPACE, wt, wb);
    if (s) hkv_host_free(&d->mem, HKV_TIER_WORKSPACE, s, sb);
    if (q) hkv_host_free(&d->mem, HKV_TIER_WORKSPACE, q, qb);
    return rc;
}

int hkv_specpc_compress(hkv_engine *e, const hkv_policy_def *def, const hkv_policy_args *a,
                        const int32_t *prompt, int64_t n, int32_t *keep, int64_t *n_keep,
                        hkv_err *err) {
    *n_keep = 0;
    const int64_t C = (int64_t)hkv_policy_arg(def, a, "C");
    const int64_t window = (int64_t)hkv_policy_arg(def, a, "window");
    const int kernel = (int)hkv_policy_arg(def, a, "kernel");
    const int nb = (int)hkv_policy_arg(def, a, "neighbors");
    const int skip = (int)hkv_policy_arg(def, a, "skip_layers");
    if (n <= C) {   /* nothing to compress (the code's n <= C case) */
        for (int64_t i = 0; i < n; i++) keep[i] = (int32_t)i;
        *n_keep = n;
        return HKV_OK;
    }
    hkv_engine *d = e->draft;
    if (!d)
        return hkv_seterr(err, HKV_E_INVAL, "specpc needs --draft MODEL (a GGUF model with the "
                          "target's tokenizer; the target itself will do)");
    if (skip >= d->model.cfg.n_layer)
        return hkv_seterr(err, HKV_E_RANGE, "specpc: skip_layers=%d leaves none of the draft's %d "
                          "layers", skip, d->model.cfg.n_layer);
    float *r = hkv_host_alloc(&d->mem, HKV_TIER_WORKSPACE, (size_t)n * 4, err);
    if (!r) return hkv_err_prefix(err, "specpc scores");
    int rc = d->kv.ops->seq_open(d->kv.self, 0, n + 1, err);
    if (!rc) {
        rc = hkv_prefill(d, 0, prompt, n, 0, NULL, err);
        if (!rc) rc = draft_scores(d, n, window, skip, r, err);
        d->kv.ops->seq_close(d->kv.self, 0);
    }
    if (!rc) {
        int64_t c = hkv_specpc_select(r, n, C, window, kernel, nb, keep, &d->mem, err);
        if (c < 0) rc = (int)c;
        else *n_keep = c;
    }
    hkv_host_free(&d->mem, HKV_TIER_WORKSPACE, r, (size_t)n * 4);
    return rc ? hkv_err_prefix(err, "specpc draft compression") : HKV_OK;
}

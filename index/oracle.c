/* `oracle`: the exact top-k of the far tier by q.k (max over the KV group's
 * query heads) every step: FLAT in the CTKVR paper. The upper bound any
 * top-k selection policy is measured against; it reads every far key. */
#include <math.h>
#include <stdlib.h>

#include "far_rows.h"
#include "policy.h"

static const hkv_param_def oracle_params[] = {
    {"k", 1024, 1, 1 << 24, 1, "far tokens attended per step and KV head"},
};

typedef struct oracle_state {
    const hkv_cpu_kernels *kern;
    int g, d;
    int64_t k;
} oracle_state;

static int oracle_prefill_end(void *self, int layer, const hkv_far_view *far,
                              const hkv_query_view *qv, hkv_err *err) {
    (void)self, (void)layer, (void)far, (void)qv, (void)err;
    return HKV_OK;
}

static void oracle_on_far_append(void *self, int layer, const hkv_far_view *far) {
    (void)self, (void)layer, (void)far;
}

static int64_t oracle_select(void *self, int layer, int kvh, const float *q,
                             const hkv_far_view *far, int32_t *out, hkv_policy_scratch *ws) {
    (void)layer;
    oracle_state *s = self;
    int64_t n = far->hi - far->lo;
    if (n <= s->k) {
        for (int64_t i = 0; i < n; i++) out[i] = (int32_t)(far->lo + i);
        return n;
    }
    int32_t *rows = ws->i, *sel = ws->i + n, *tmp = ws->i + 2 * n;
    for (int64_t i = 0; i < n; i++) rows[i] = (int32_t)(far->lo + i);
    hkv_far_score_max(ws, s->kern, q, s->g, far, kvh, rows, n, ws->f);
    ws->bytes += (uint64_t)n * hkv_far_view_row_bytes(far);   /* every far key */
    int64_t m = hkv_topk_asc(ws->f, n, s->k, sel, tmp);
    for (int64_t i = 0; i < m; i++) out[i] = rows[sel[i]];
    return m;
}

static int64_t oracle_max_select(void *self, int64_t n_far) {
    oracle_state *s = self;
    return n_far < s->k ? n_far : s->k;
}

static void oracle_scratch_need(void *self, int64_t n_far, int64_t *nf, int64_t *ni) {
    (void)self;
    *nf = n_far;
    *ni = 3 * n_far;
}

static void oracle_destroy(void *self) { free(self); }

static const hkv_policy_ops oracle_ops = {
    .prefill_end = oracle_prefill_end,
    .on_far_append = oracle_on_far_append,
    .select = oracle_select,
    .max_select = oracle_max_select,
    .scratch_need = oracle_scratch_need,
    .destroy = oracle_destroy,
};

static int oracle_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                         hkv_err *err) {
    oracle_state *s = calloc(1, sizeof *s);
    if (!s) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the oracle policy");
    s->kern = env->kern;
    s->g = env->shape.n_head / env->shape.n_head_kv;
    s->d = env->shape.head_dim;
    s->k = (int64_t)hkv_policy_arg(&hkv_policy_oracle, a, "k");
    out->ops = &oracle_ops;
    out->self = s;
    return HKV_OK;
}

const hkv_policy_def hkv_policy_oracle = {
    .name = "oracle",
    .kind = HKV_POLICY_SELECTION,
    .summary = "exact top-k far tokens by q.k every step (FLAT); reads every far key",
    .params = oracle_params,
    .n_params = 1,
    .queries_wanted = NULL,
    .create = oracle_create,
};

/* `full`: every far token, every step. The dense reference: with it the
 * tiered cache computes exactly what the plain cache does. */
#include <stdlib.h>

#include "policy.h"

typedef struct full_state { int unused; } full_state;

static int full_prefill_end(void *self, int layer, const hkv_far_view *far,
                            const hkv_query_view *qv, hkv_err *err) {
    (void)self, (void)layer, (void)far, (void)qv, (void)err;
    return HKV_OK;
}

static void full_on_far_append(void *self, int layer, const hkv_far_view *far) {
    (void)self, (void)layer, (void)far;
}

static int64_t full_select(void *self, int layer, int kvh, const float *q, const hkv_far_view *far,
                           int32_t *out, hkv_policy_scratch *ws) {
    (void)self, (void)layer, (void)kvh, (void)q, (void)ws;
    for (int64_t p = far->lo; p < far->hi; p++) out[p - far->lo] = (int32_t)p;
    return far->hi - far->lo;
}

static int64_t full_max_select(void *self, int64_t n_far) {
    (void)self;
    return n_far;
}

static void full_scratch_need(void *self, int64_t n_far, int64_t *nf, int64_t *ni) {
    (void)self, (void)n_far;
    *nf = *ni = 0;
}

static void full_destroy(void *self) { free(self); }

static const hkv_policy_ops full_ops = {
    .prefill_end = full_prefill_end,
    .on_far_append = full_on_far_append,
    .select = full_select,
    .max_select = full_max_select,
    .scratch_need = full_scratch_need,
    .destroy = full_destroy,
};

static int full_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                       hkv_err *err) {
    (void)a, (void)env;
    full_state *s = calloc(1, sizeof *s);
    if (!s) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the full policy");
    out->ops = &full_ops;
    out->self = s;
    return HKV_OK;
}

const hkv_policy_def hkv_policy_full = {
    .name = "full",
    .kind = HKV_POLICY_SELECTION,
    .summary = "dense attention over the near and far tiers (the reference)",
    .params = NULL,
    .n_params = 0,
    .queries_wanted = NULL,
    .create = full_create,
};

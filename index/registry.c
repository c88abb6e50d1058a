/* The one list of policies and their typed parameters. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

static const hkv_policy_def *const all_policies[] = {
    &hkv_policy_full,
    &hkv_policy_oracle,
    &hkv_policy_ctkvr,
    &hkv_policy_quest,
    &hkv_policy_snapkv,
    &hkv_policy_rocketkv,
    &hkv_policy_laq,
    &hkv_policy_speckv,
    &hkv_policy_specpc,
    &hkv_policy_fastkv,
    NULL,
};

const hkv_policy_def *const *hkv_policy_list(void) { return all_policies; }

const hkv_policy_def *hkv_policy_find(const char *name) {
    for (int i = 0; all_policies[i]; i++)
        if (!strcmp(all_policies[i]->name, name)) return all_policies[i];
    return NULL;
}

int hkv_policy_args_init(const hkv_policy_def *d, hkv_policy_args *a) {
    (void)d;
    for (int i = 0; i < HKV_POLICY_MAX_PARAMS; i++) a->v[i] = NAN;
    return HKV_OK;
}

static int param_index(const hkv_policy_def *d, const char *key, size_t len) {
    for (int i = 0; i < d->n_params; i++)
        if (strlen(d->params[i].key) == len && !strncmp(d->params[i].key, key, len)) return i;
    return -1;
}

int hkv_policy_arg_set(const hkv_policy_def *d, hkv_policy_args *a, const char *kv, hkv_err *err) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv || !eq[1])
        return hkv_seterr(err, HKV_E_INVAL, "policy argument '%s' is not KEY=VALUE", kv);
    int i = param_index(d, kv, (size_t)(eq - kv));
    if (i < 0) {
        char known[256] = "";
        for (int j = 0; j < d->n_params; j++) {
            strncat(known, j ? ", " : "", sizeof known - strlen(known) - 1);
            strncat(known, d->params[j].key, sizeof known - strlen(known) - 1);
        }
        return hkv_seterr(err, HKV_E_INVAL, "policy '%s' has no parameter '%.*s' (it has: %s)",
                          d->name, (int)(eq - kv), kv, d->n_params ? known : "none");
    }
    const hkv_param_def *p = &d->params[i];
    char *end;
    double v = strtod(eq + 1, &end);
    if (end == eq + 1 || *end || !isfinite(v))
        return hkv_seterr(err, HKV_E_INVAL, "policy '%s': %s='%s' is not a number", d->name, p->key,
                          eq + 1);
    if (p->is_int && v != floor(v))
        return hkv_seterr(err, HKV_E_INVAL, "policy '%s': %s must be an integer, got %s", d->name,
                          p->key, eq + 1);
    if (v < p->lo || v > p->hi)
        return hkv_seterr(err, HKV_E_RANGE, "policy '%s': %s=%g is out of range (%g..%g)", d->name,
                          p->key, v, p->lo, p->hi);
    a->v[i] = v;
    return HKV_OK;
}

int hkv_policy_args_check(const hkv_policy_def *d, const hkv_policy_args *a, hkv_err *err) {
    for (int i = 0; a && i < d->n_params; i++) {
        const double v = a->v[i];
        const hkv_param_def *p = &d->params[i];
        if (!isnan(v) && (v < p->lo || v > p->hi || (p->is_int && v != floor(v))))
            return hkv_seterr(err, HKV_E_RANGE, "%s: %s=%g is out of range (%g..%g%s)", d->name,
                              p->key, v, p->lo, p->hi, p->is_int ? ", integer" : "");
    }
    return HKV_OK;
}

double hkv_policy_arg(const hkv_policy_def *d, const hkv_policy_args *a, const char *key) {
    int i = param_index(d, key, strlen(key));
    if (i < 0) return NAN;
    return isnan(a->v[i]) ? d->params[i].dflt : a->v[i];
}

int64_t hkv_policy_default_budget(int64_t n_ctx) {
    int64_t r = (int64_t)llround(0.03 * (double)(n_ctx > 0 ? n_ctx : 0) / 32.0) * 32;
    return r < 32 ? 32 : r > 1024 ? 1024 : r;
}

const char *hkv_fallback_name(int reason) {
    static const char *const names[HKV_FALLBACK_COUNT] = {
        [HKV_FALLBACK_SHAPE] = "shape",
        [HKV_FALLBACK_ABSENT_ROWS] = "absent_rows",
        [HKV_FALLBACK_PARTIAL_REBUILD] = "partial_rebuild",
        [HKV_FALLBACK_NO_ROOM] = "no_room",
        [HKV_FALLBACK_BEFORE_SELECTION] = "before_first_selection",
        [HKV_FALLBACK_CONFIG] = "policy_config",
        [HKV_FALLBACK_POLICY_OOM] = "policy_oom",
        [HKV_FALLBACK_NO_DEVICE_COPY] = "no_device_copy",
        [HKV_FALLBACK_SHARED_INDEX] = "shared_index",
    };
    return reason > HKV_FALLBACK_NONE && reason < HKV_FALLBACK_COUNT ? names[reason] : NULL;
}

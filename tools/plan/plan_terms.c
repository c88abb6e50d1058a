#include "plan_terms.h"

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* Each term with the range its --flag takes (tools/plan/cmd_plan.c). */
static const struct {
    const char *name;
    size_t off;
    double lo, hi;
} terms[] = {
    {"mem_eff", offsetof(hkv_pred_terms, mem_eff), 1e-3, 1},
    {"attn_eff", offsetof(hkv_pred_terms, attn_eff), 1e-3, 1},
    {"gemv_row_cost", offsetof(hkv_pred_terms, gemv_row_cost), 0, 16},
    {"kernel_us", offsetof(hkv_pred_terms, kernel_us), 1e-3, 1e5},
    {"host_eff", offsetof(hkv_pred_terms, host_eff), 1e-3, 1},
    {"host_wake_us", offsetof(hkv_pred_terms, host_wake_us), 1e-3, 1e5},
    {"trip_us", offsetof(hkv_pred_terms, trip_us), 0, 1e6},
};

int hkv_pred_terms_load(const char *path, hkv_pred_terms *t, hkv_err *err) {
    memset(t, 0, sizeof *t);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return hkv_seterr(err, HKV_E_IO, "--calibration %s: %s (line %d)", path, je.text, je.line);
    int rc = HKV_OK;
    json_t *sum = json_object_get(root, "summary");
    json_t *params = sum ? json_object_get(sum, "params") : NULL;
    if (!json_is_object(params)) {
        rc = hkv_seterr(err, HKV_E_FORMAT, "--calibration %s: no summary.params (the terms "
                        "bench/predict_fit.py writes to predict_fit.json)", path);
        goto out;
    }
    for (size_t i = 0; i < sizeof terms / sizeof terms[0]; i++) {
        json_t *v = json_object_get(params, terms[i].name);
        const double x = json_is_number(v) ? json_number_value(v) : -1;
        if (!json_is_number(v) || !(x >= terms[i].lo && x <= terms[i].hi)) {
            rc = hkv_seterr(err, HKV_E_FORMAT, "--calibration %s: summary.params.%s %s (a number "
                            "in %g..%g)", path, terms[i].name, json_is_number(v) ? "out of range"
                            : "missing or not a number", terms[i].lo, terms[i].hi);
            goto out;
        }
        *(double *)((char *)t + terms[i].off) = x;
    }
    const char *dev = json_string_value(json_object_get(sum, "device"));
    snprintf(t->device, sizeof t->device, "%s", dev ? dev : "?");
    json_t *cs = json_object_get(sum, "commits");
    for (size_t i = 0; json_is_array(cs) && i < json_array_size(cs); i++) {
        const char *c = json_string_value(json_array_get(cs, i));
        size_t l = strlen(t->commits);
        if (c) snprintf(t->commits + l, sizeof t->commits - l, "%s%s", l ? "," : "", c);
    }
out:
    json_decref(root);
    return rc;
}

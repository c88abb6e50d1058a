/* The measured terms of `plan --predict` from a calibration file: what
 * bench/predict_fit.py fitted to a GPU run's rows (its predict_fit.json,
 * "summary": {"device": ..., "params": {...}}), so that a prediction for
 * another card can be made with them in one flag (--calibration FILE). */
#ifndef HKV_PLAN_TERMS_H
#define HKV_PLAN_TERMS_H

#include "status.h"

typedef struct hkv_pred_terms {
    double mem_eff, attn_eff, gemv_row_cost, kernel_us, host_eff, host_wake_us, trip_us;
    char device[32];            /* the card the terms were fitted on */
    char commits[64];           /* the code they describe, as the run recorded it */
} hkv_pred_terms;

/* Read path's terms. Errors name the file and the field: unreadable, not
 * JSON, no summary.params, a term missing, not a number or out of the
 * range `plan --predict` takes for its flag. */
int hkv_pred_terms_load(const char *path, hkv_pred_terms *t, hkv_err *err);

#endif

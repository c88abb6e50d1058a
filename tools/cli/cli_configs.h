/* Policy configurations as the sweeping commands take them (bench --configs,
 * eval --configs, plan --configs): "full;oracle:k=64;ctkvr:rho_p=3%,dcu=0",
 * each a policy and its arguments, the budget (far tokens attended per step
 * and KV head: oracle's k, ctkvr's rho_p) fixed, a share of the context
 * ("3%") resolved per context length, or, not given, the policy's own
 * default (hkv_policy_default_budget: 3% clamped to [32, 1024]). */
#ifndef HKV_CLI_CONFIGS_H
#define HKV_CLI_CONFIGS_H

#include <stddef.h>
#include <stdint.h>

#include "policy.h"
#include "status.h"

#define HKV_MAX_CONFIGS 32
#define HKV_SPEC_LEN 160

typedef struct hkv_config {
    char spec[HKV_SPEC_LEN];     /* as written, "ctkvr:rho_p=3%,dcu=0" */
    char extra[HKV_SPEC_LEN];    /* the non-budget arguments as written, "dcu=0" */
    const hkv_policy_def *def;
    hkv_policy_args args;        /* every argument but the budget */
    const char *budget_key;      /* NULL: the policy has no budget parameter */
    double budget_frac;          /* > 0: budget = round(frac * context) */
    int64_t budget_abs;          /* > 0: a fixed budget */
    int far_q8;                  /* "far=q8": over the 8-bit far tier (far=f16: 0) */
    int far_set;                 /* far= given (else the run's --far-kv) */
} hkv_config;

/* Parse "full;oracle:k=64;ctkvr:rho_p=3%,dcu=0". Checks policy names, keys
 * and values (ranges from the policy's table); nothing is resolved yet. */
int hkv_configs_parse(const char *spec, hkv_config *out, int *n, int cap, hkv_err *err);
/* --budgets "1%,3%,10%,1024": each configuration whose policy takes a budget
 * and does not set it is repeated once per value; the others stay as they are. */
int hkv_configs_cross_budgets(hkv_config *cfg, int *n, int cap, const char *budgets, hkv_err *err);
/* full; oracle and ctkvr at 1%, 3%, 10% of the context; ctkvr 3% with dcu=0. */
extern const char hkv_default_configs[];
/* The configuration at one context: its arguments with the budget set, the
 * budget itself (0 when the policy has none), and a label. far_tokens is
 * the far tier at prompt end: a budget above it is an error. */
int hkv_config_resolve(const hkv_config *c, int64_t ctx, int64_t far_tokens,
                       hkv_policy_args *args, int64_t *budget, char *label, size_t cap,
                       hkv_err *err);

#endif

/* `specpc`: SpecPC prompt compression by a draft model (Galim et al.;
 * notes Part B.3). Its work is done before the target's prefill
 * (runtime/specpc.c, prep HKV_PREP_COMPRESS_DRAFT): the draft's attention
 * picks C prompt tokens and the target prefills only those, positions
 * renumbered 0..C-1. Over that short prompt the target attends densely,
 * so the policy instance is `full`'s. The parameters live here so that
 * `--policy-arg` checks them like any policy's. */
#include <math.h>

#include "policy.h"

static const hkv_param_def specpc_params[] = {
    {"C", 1024, 1, 1 << 24, 1, "prompt tokens kept (SpecPC: 1024; the target prefills these only)"},
    {"window", 64, 1, 4096, 1, "the draft's last prompt queries that score (SpecPC: 64)"},
    {"kernel", 32, 1, 4096, 1, "max-pool smoothing kernel, zero padded, asymmetric for even "
                               "kernels (SpecPC: 32 Llama, 64 Qwen)"},
    {"neighbors", 32, 1, 4096, 1, "tokens kept around each top token (SpecPC: 32 Llama, 64 Qwen)"},
    {"skip_layers", 8, 0, 4096, 1, "the draft's first layers left out of the scores (SpecPC: 8)"},
};

static int specpc_create(hkv_policy *out, const hkv_policy_args *a, const hkv_policy_env *env,
                         hkv_err *err) {
    int rc_args = hkv_policy_args_check(&hkv_policy_specpc, a, err);
    if (rc_args) return rc_args;
    hkv_policy_args none;
    hkv_policy_args_init(&hkv_policy_full, &none);
    return hkv_policy_full.create(out, &none, env, err);
}

const hkv_policy_def hkv_policy_specpc = {
    .name = "specpc",
    .kind = HKV_POLICY_PREFILL,
    .prep = HKV_PREP_COMPRESS_DRAFT,
    .summary = "SpecPC: the draft model (--draft MODEL) keeps C prompt tokens by its attention "
               "(last 64 queries, layers >= 8, max, smoothed, neighbours); the target prefills "
               "those and attends densely",
    .params = specpc_params,
    .n_params = (int)(sizeof specpc_params / sizeof specpc_params[0]),
    .queries_wanted = NULL,
    .create = specpc_create,
};

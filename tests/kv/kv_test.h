/* What the kv/ tests share: the check macro, deterministic fill, and a
 * prompt fed to one sequence of a cache in chunks. */
#ifndef HKV_KV_TEST_H
#define HKV_KV_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kv.h"
#include "kv_tiered.h"

#include "../check.h"

static void fill(float *x, int64_t n, uint64_t seed) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5) * 2.0f;
    }
}

/* n_prompt tokens into seq in chunks, ending the prompt: layer l of the
 * chunk at pos gets rows filled from seed pos * 7 + l + 1000 * tag. qkv
 * and out have room for a chunk of ld and n_out floats a row. */
static void feed_prompt(hkv_kv *kv, int seq, int64_t n_prompt, int chunk, int n_layer, int64_t ld,
                        int64_t n_out, uint64_t tag, float *qkv, float *out) {
    hkv_err err;
    for (int64_t pos = 0; pos < n_prompt; pos += chunk) {
        const int n = n_prompt - pos < chunk ? (int)(n_prompt - pos) : chunk;
        hkv_seg sg = {.seq = seq, .n = n, .pos = pos, .row = 0,
                      .flags = HKV_SEG_PROMPT | (pos + n == n_prompt ? HKV_SEG_PROMPT_END : 0)};
        for (int l = 0; l < n_layer; l++) {
            fill(qkv, (int64_t)n * ld, (uint64_t)pos * 7 + (uint64_t)l + 1000 * tag);
            CHECK(kv->ops->layer_step(kv->self, l, &sg, 1, qkv, ld, out, n_out, &err) == HKV_OK,
                  "prompt of sequence %d: %s", seq, err.msg);
        }
    }
}

/* The tests' tiered cache: 4 sinks, a 64-row ring, policy pol (NULL: the
 * default's) with quest at quest_budget and ctkvr at rho_p 64. */
static void test_params(hkv_tiered_params *p, const hkv_policy_def *pol, const char *quest_budget) {
    hkv_tiered_params_default(p);
    p->L_init = 4;
    p->L_local = 64;
    if (!pol) return;
    p->policy = pol;
    hkv_policy_args_init(pol, &p->args);
    if (pol == &hkv_policy_quest) hkv_policy_arg_set(pol, &p->args, quest_budget, NULL);
    if (pol == &hkv_policy_ctkvr) hkv_policy_arg_set(pol, &p->args, "rho_p=64", NULL);
}

#endif

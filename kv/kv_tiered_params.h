/* What the tiered cache (kv_tiered.h) is created with. Apart from the
 * cache's API so that the engine's parameters (runtime/engine.h), which
 * hold these for every command, do not hand the concrete cache to all that
 * include the engine: the pipeline and the scheduler reach the cache
 * through kv.h and kv_far.h. */
#ifndef HKV_KV_TIERED_PARAMS_H
#define HKV_KV_TIERED_PARAMS_H

#include <stdint.h>

#include "policy.h"

typedef struct hkv_tiered_params {
    int L_init;                    /* sink tokens (default 4) */
    int L_local;                   /* local window (default 256) */
    const hkv_policy_def *policy;  /* for every sequence unless set per sequence */
    hkv_policy_args args;
    int64_t keep_queries;          /* last prompt queries kept for policies (0: as the policy asks) */
    int audit;                     /* also compute dense and oracle attention, for eval */
    int64_t audit_k;               /* oracle top-k the recall is measured against */
    int pin_far;                   /* 1: far rows page-locked for a CUDA device when one is usable
                                      (hkv_pinned_alloc); 0: ordinary host memory. Set by the
                                      engine for --device cuda; FAR is accounted the same way */
    int pin_numa_node;             /* with pin_far: the GPU's NUMA node to bind to, -1: none */
    int score_alone;               /* 1: each selection scores its rows on its own thread, not
                                      shared with the step's idle threads (kv_score_team.h);
                                      for side-by-side timing (bench far --scoring alone) */
} hkv_tiered_params;

void hkv_tiered_params_default(hkv_tiered_params *p);

#endif

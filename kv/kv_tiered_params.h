/* What the tiered cache (kv_tiered.h) is created with. Apart from the
 * cache's API so that the engine's parameters (runtime/engine.h), which
 * hold these for every command, do not hand the concrete cache to all that
 * include the engine: the pipeline and the scheduler reach the cache
 * through kv.h and kv_far.h. */
#ifndef HKV_KV_TIERED_PARAMS_H
#define HKV_KV_TIERED_PARAMS_H

#include <stdint.h>

#include "numa_map.h"
#include "policy.h"

/* Where the far tier sits on a host with several NUMA nodes. */
enum hkv_far_numa {
    HKV_FAR_NUMA_AUTO = 0,   /* the host path spreads; --device cuda binds to the GPU's node */
    HKV_FAR_NUMA_GPU,        /* every far tier on the GPU's node (pin_numa_node), if known */
    HKV_FAR_NUMA_SPREAD,     /* each sequence's on its slot's node, its far work claimed first
                                by that node's workers (base/numa_map.h) */
    HKV_FAR_NUMA_OFF,        /* no binding: where the first write puts it */
};

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
    int far_numa;                  /* enum hkv_far_numa */
    const hkv_numa_map *numa;      /* the workers' nodes (the engine's threads), NULL: one node */
    int far_q8;                    /* 1: the far tier's K and V rows in 8 bits (int8 codes, an
                                      fp32 scale per 32: index/far_rows.h), 0.56x the bytes of
                                      fp16; the near tier stays fp16 (--far-kv q8) */
    int64_t q8_prompt_whole;       /* an 8-bit far tier: a prompt tile whose prefix is at most
                                      this many rows attends it whole, in the causal kernel
                                      (fp16 tiles of it on each thread); longer, in 512-row
                                      pieces merged (0: 8192) */
    int score_alone;               /* 1: each selection scores its rows on its own thread, not
                                      shared with the step's idle threads (kv_score_team.h);
                                      for side-by-side timing (bench far --scoring alone) */
} hkv_tiered_params;

void hkv_tiered_params_default(hkv_tiered_params *p);

#endif

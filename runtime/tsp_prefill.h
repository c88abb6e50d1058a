/* Token-selective propagation (FastKV, notes B2): a first prompt runs
 * through layers 0..L_TSP in full, the TSP layer's observation window picks
 * the tokens whose hidden states go on, and layers L_TSP+1.. process only
 * those, at their original positions. The sequence's policy (prep
 * HKV_PREP_TSP, index/fastkv.c) chooses the layer and the rows. */
#ifndef HKV_TSP_PREFILL_H
#define HKV_TSP_PREFILL_H

#include <stdint.h>

#include "engine.h"

/* 1 when the first prompt of n tokens of open sequence seq goes through
 * hkv_tsp_prefill: a tiered cache, a policy of prep HKV_PREP_TSP, nothing
 * stored yet, and the policy cuts this prompt (a prompt no longer than the
 * TSP length is prefilled normally: nothing would be dropped). */
int hkv_tsp_wanted(hkv_engine *e, int seq, int64_t n);

/* Prefill prompt[0..n) into seq (open, empty) with propagation; logits of
 * the last token (always propagated) go to last_logits (may be NULL). The
 * hidden states of every prompt token are held between the two stages
 * ([n][dim] floats, WORKSPACE tier). */
int hkv_tsp_prefill(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, float *last_logits,
                    hkv_err *err);

#endif

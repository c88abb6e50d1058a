/* Prompt processing that a policy's prep asks for (index/policy.h,
 * enum hkv_policy_prep): the lookahead of laq (the target decodes a few
 * greedy tokens) and speckv (the draft model answers, the target reads the
 * answer), both followed by a rewind to the prompt end and the policy's
 * re-selection; and specpc's prompt compression by the draft. */
#ifndef HKV_LOOKAHEAD_H
#define HKV_LOOKAHEAD_H

#include <stdint.h>

#include "engine.h"

/* Prefill prompt (n tokens) into the open sequence seq, from position 0, as
 * its policy's prep asks:
 *   NONE, TSP       : hkv_prefill;
 *   LOOKAHEAD_*     : hkv_prefill, then hkv_lookahead;
 *   COMPRESS_DRAFT  : the draft picks the tokens to keep (runtime/specpc.c),
 *                     the target prefills those only, renumbered 0..C-1.
 * last_logits (vocab floats, required) receives the logits of the first
 * generated token: the prefill's (the lookahead never changes them).
 * room: tokens seq may hold past the prompt (its capacity less n): bounds
 * the lookahead. max_new: the request's output cap (0: none): bounds the
 * draft's answer (SpecKV generates to EOS or the task's output cap).
 * *n_stored: tokens seq holds afterwards, where decoding continues (n, or
 * the compressed length). */
int hkv_prefill_prep(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, float *last_logits,
                     int64_t room, int64_t max_new, int64_t *n_stored, hkv_err *err);

/* The same for a sequence forked (seq_copy) from a prefilled prompt of n
 * tokens whose prefill logits are in logits: the lookahead (laq, speckv),
 * or (specpc) the fork re-prefilled from the compressed prompt, logits
 * replaced by its. Open the fork with hkv_lookahead_room more capacity.
 * *base: where the fork continues. */
int hkv_fork_prep(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, float *logits,
                  int64_t max_new, int64_t *base, hkv_err *err);

/* Prompt tokens seq will hold for a prompt of n: min(n, C) for a
 * compressing policy (specpc), else n. Open it for that many (+ output), so
 * its far tier reserves only what it will hold. */
int64_t hkv_prep_prompt_len(const hkv_engine *e, int seq, int64_t n);

/* Extra tokens of capacity a sequence needs for its policy's lookahead
 * (its lookahead_len; 0 for other policies): open it with that much more. */
int64_t hkv_lookahead_room(const hkv_engine *e, int seq);
/* The same two for a policy given by definition and arguments (NULL
 * definition: none), not by the sequence that runs it. */
int64_t hkv_prep_prompt_len_of(const hkv_policy_def *def, const hkv_policy_args *args, int64_t n);
int64_t hkv_lookahead_room_of(const hkv_engine *e, const hkv_policy_def *def,
                              const hkv_policy_args *args);

/* The lookahead of a sequence whose prompt (n tokens) was just prefilled,
 * last_logits its prefill logits; nothing for a policy without one. The
 * sequence holds n tokens again afterwards, its policy re-selected from the
 * lookahead queries. *n_look (may be NULL): lookahead tokens run. */
int hkv_lookahead(hkv_engine *e, int seq, const int32_t *prompt, int64_t n,
                  const float *last_logits, int64_t room, int64_t max_new, int64_t *n_look,
                  hkv_err *err);

#endif

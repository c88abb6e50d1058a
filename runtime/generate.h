/* Generation: prefill each prompt (in chunks), then advance all sequences
 * together, one batched decode step per token. */
#ifndef HKV_GENERATE_H
#define HKV_GENERATE_H

#include <stdint.h>

#include "engine.h"
#include "sampler.h"

/* Why a sequence stopped: its token cap, an end-of-generation token, or (the
 * scheduler) one of the request's stop strings in the text. */
enum hkv_stop { HKV_STOP_NONE = 0, HKV_STOP_LENGTH, HKV_STOP_EOG, HKV_STOP_STRING, HKV_STOP_CANCEL };

typedef struct hkv_gen_request {
    const int32_t *prompt;
    int64_t n_prompt;
    int n_predict;            /* tokens to generate at most */
    hkv_sampler_params sp;
    int stop_at_eog;          /* stop at the tokenizer's end-of-generation tokens */
    /* results (out has room for n_predict ids, allocated by the caller) */
    int32_t *out;
    int n_out;
    int stop;                 /* enum hkv_stop */
    double t_first_token;     /* seconds from the start of its prefill */
} hkv_gen_request;

typedef struct hkv_gen_stats {
    double t_prefill, t_decode;
    int64_t n_prefill_tokens, n_decode_tokens;
    int decode_steps;
} hkv_gen_stats;

/* Called after each generated token of request `req`. Nonzero ends the
 * generation there: every unfinished request stops with HKV_STOP_CANCEL,
 * its tokens so far kept, and hkv_generate returns HKV_E_CANCELLED. */
typedef int (*hkv_token_cb)(void *ud, int req, int32_t tok);

/* Checks every request (batch size, context) before any work; on a failure
 * midway the tokens generated so far stay in reqs[i].out / n_out. */
int hkv_generate(hkv_engine *e, hkv_gen_request *reqs, int n_reqs, hkv_token_cb cb, void *ud,
                 hkv_gen_stats *st, hkv_err *err);

/* Prefill prompt into sequence seq (already open) from position pos0;
 * logits of the last prompt token go to last_logits (may be NULL). */
int hkv_prefill(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, int64_t pos0,
                float *last_logits, hkv_err *err);

/* One prefill chunk: prompt tokens [done, done + chunk) of an n-token prompt
 * at positions pos0 + done.., one forward call (chunk <= e->max_rows); the
 * chunk reaching n ends the prompt and, when last_logits is given, writes
 * the last token's logits there. hkv_prefill is these in turn; the
 * scheduler interleaves them with other sequences' decode steps. */
int hkv_prefill_chunk(hkv_engine *e, int seq, const int32_t *prompt, int64_t n, int64_t pos0,
                      int64_t done, int64_t chunk, float *last_logits, hkv_err *err);

/* After the n_out-th generated token tok: HKV_STOP_EOG, HKV_STOP_LENGTH
 * (n_out reached n_predict) or HKV_STOP_NONE. */
int hkv_gen_stop_after(const hkv_engine *e, int stop_at_eog, int32_t tok, int n_out,
                       int n_predict);

#endif

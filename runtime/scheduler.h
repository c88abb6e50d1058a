/* Continuous batching over the engine's sequence slots: requests arrive at
 * any time (hkv_sched_submit), up to max_batch run at once, a finished
 * sequence's slot is refilled at the next step, and new prompts are
 * prefilled in fixed chunks interleaved with the running sequences' decode
 * steps, so one long prompt does not stall the others. Admission is by
 * memory: each request's KV (near, far, index) is reserved from a host
 * budget; one that does not fit now waits (first come, first served), one
 * that can never fit is refused at submit.
 *
 * Batch invariance: prompts are prefilled alone in forward calls whose
 * chunk boundaries depend only on the prompt, and decode steps run the
 * kernels' batch-invariant GEMV (cpu/kernels.h), so with temperature 0 a
 * request's tokens do not depend on what else is in flight.
 *
 * Policies whose prep runs around the whole prompt (laq and speckv
 * lookahead, fastkv token-selective propagation, specpc draft compression)
 * prefill their prompt in one step, as hkv_generate does.
 *
 * Prefix cache (prefix_slots > 0): a prompt's KV as of its last whole chunk
 * before the end is kept in a sequence slot of its own (slots max_batch ..
 * max_batch + prefix_slots - 1, least recently used replaced), and a later
 * request whose prompt starts with those tokens, under the same policy,
 * starts from it and prefills only the rest. The tiered cache shares the
 * prefix's rows by reference (kv.h, seq_share: one copy in host memory for
 * the entry and every request on it, read once a step under full); the
 * plain cache, and the tiered one with a CUDA device, copy them. Either way
 * the request holds the KV it would have computed itself (the same chunks,
 * the same kernels), so its tokens are those it gets without the cache. A
 * policy that shares its index (ctkvr) builds it at the prompt's last whole
 * chunk, the rest a later turn, and a request whose last whole chunk is the
 * kept prefix's end takes it by reference: its tokens do not depend on
 * whether it found the prefix, though they may differ a little from a run
 * without the cache (docs/POLICIES.md, "Over a shared prefix"). */
#ifndef HKV_SCHEDULER_H
#define HKV_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "generate.h"
#include "sampler.h"

#define HKV_SCHED_MAX_STOP 4

typedef struct hkv_sched_req hkv_sched_req;

/* Called once per request when it is finished (r->status says whether it
 * succeeded); the scheduler no longer touches r afterwards. */
typedef void (*hkv_sched_done_cb)(void *ud, hkv_sched_req *r);
/* Called after each generated token (may be NULL): streaming. */
typedef void (*hkv_sched_token_cb)(void *ud, hkv_sched_req *r, int32_t tok);

typedef struct hkv_sched_params {
    int max_batch;          /* sequences in flight, <= the engine's max_seqs */
    int64_t chunk;          /* prompt tokens per prefill forward call; 0: 256 (capped at
                               the engine's max_rows). Fixed per job: batch invariance
                               needs the same chunk boundaries whatever else runs */
    uint64_t mem_budget;    /* host bytes for the KV of the sequences in flight; 0: no cap */
    int batch_invariant;    /* decode steps with the batch-invariant GEMV (default 1) */
    int prefix_slots;       /* prompt prefixes kept for reuse (0: none); the engine needs
                               max_batch + prefix_slots sequence slots */
    int resident;           /* per-sequence placement (--policy auto on a device): up to this
                               many requests without a policy of their own run `full` at once,
                               their whole KV kept on the device (the backend's resident
                               slots, hkv_cuda_params.resident_seqs); the rest the engine's
                               policy. 0: every request its own or the engine's policy */
    int64_t resident_rows;  /* far rows one resident slot holds (--gpu-resident-rows, or sized
                               from a batch job's requests): a request whose prompt and answer
                               reach past them runs the engine's policy instead of outgrowing
                               its slot (the backend would run it on the host). 0: a whole
                               context, every request fits */
    int resident_wait;      /* with resident: a request that fits a slot waits in the queue
                               while every slot is busy, rather than run the engine's policy
                               (the split) at once: a split sequence decodes far slower than
                               a resident one and, in the same step, holds them to its pace.
                               Requests no slot can hold still run the engine's policy */
    hkv_sched_done_cb on_done;
    hkv_sched_done_cb on_drop;   /* may be NULL: called by hkv_sched_free for each request
                                    still queued or running, unfinished (no on_done), so the
                                    caller can free what it attached to it */
    hkv_sched_token_cb on_token;
    void *ud;
} hkv_sched_params;

void hkv_sched_params_default(hkv_sched_params *p);

struct hkv_sched_req {
    /* in: set by the caller; prompt must stay valid until on_done */
    const int32_t *prompt;
    int64_t n_prompt;
    int n_predict;                          /* tokens to generate at most (>= 1) */
    hkv_sampler_params sp;
    int stop_at_eog;
    const char *stop[HKV_SCHED_MAX_STOP];   /* stop strings: the text ends before the first */
    int n_stop;
    /* The KV policy of this request (NULL: the one the engine's sequences
     * were opened with when the scheduler was created); only a policy
     * without prompt preparation (prep HKV_PREP_NONE) may differ from the
     * engine's. args NULL: the policy's defaults. Both stay valid until
     * on_done. */
    const hkv_policy_def *policy;
    const hkv_policy_args *policy_args;
    void *user;
    /* out (valid in on_done); hkv_sched_req_clear frees out and text */
    int32_t *out;
    int n_out;
    char *text;                             /* NUL-terminated, stop string cut off */
    size_t text_len;
    int finish;                             /* enum hkv_stop */
    int status;                             /* HKV_OK, or this request's error in err */
    hkv_err err;
    uint64_t kv_bytes;                      /* the KV reserved for it */
    double t_submit, t_admit;               /* hkv_now() */
    double t_prefill;                       /* its own prefill forward calls (+ prep) */
    double t_first;                         /* submit to first token */
    double t_decode;                        /* first token to done (steps shared) */
    int resident;                           /* placed `full`, whole on the device
                                               (hkv_sched_params.resident) */
    /* the scheduler's own */
    hkv_sched_req *next_;
    int waited_;                            /* it waited for a resident slot */
};

typedef struct hkv_sched_stats {
    int64_t n_prompt_tokens, n_gen_tokens;  /* prompt tokens prefilled (reused ones not) */
    int64_t steps, decode_rows;
    double t_prefill, t_decode;             /* wall time in prefill and decode calls */
    int64_t prefix_hits, prefix_tokens;     /* requests that started from a kept prefix, and
                                               the prompt tokens they did not prefill */
    int64_t prefix_stored, prefix_evicted;  /* prefixes kept, and replaced */
    int prefix_entries;                     /* kept now */
    uint64_t prefix_bytes;                  /* their KV reservations */
    uint64_t prefix_saved_bytes;            /* far-tier bytes shared rather than copied (a
                                               hit's, and a kept prefix's own) */
    double t_prefix_fork;                   /* seconds hits spent starting from their prefix
                                               (their prefill_s holds it with their suffix's) */
    int64_t prefix_index_builds;            /* indexes built at a prompt's last whole chunk (a
                                               policy that shares its index: ctkvr) */
    int64_t prefix_index_hits;              /* hits that took the kept prefix's index by
                                               reference instead of building one */
    int64_t resident_waits;                 /* requests that waited in the queue for a resident
                                               slot (resident_wait) */
} hkv_sched_stats;

typedef struct hkv_sched hkv_sched;

int hkv_sched_create(hkv_sched **out, hkv_engine *e, const hkv_sched_params *p, hkv_err *err);
/* Frees the scheduler; requests still queued or running are dropped
 * unfinished (on_drop, when set, is called for each). */
void hkv_sched_free(hkv_sched *s);

/* Queue r. Refuses (returns the error, r untouched by the scheduler) a
 * request that can never run: empty prompt, prompt + n_predict over the
 * engine's context, more KV than the whole budget, bad sampler values. */
int hkv_sched_submit(hkv_sched *s, hkv_sched_req *r, hkv_err *err);

/* One step: admit waiting requests into free slots while their KV fits,
 * one batched decode step of the decoding sequences, then prefill chunks
 * of the prefilling ones (oldest first, about one chunk of tokens in all).
 * A request that fails alone (its prefill, its KV allocation) finishes with
 * its error and the rest go on; an error returned here (a decode step)
 * leaves the scheduler unusable. */
int hkv_sched_step(hkv_sched *s, hkv_err *err);

/* Take r out now, between steps, without calling on_done (a server's client
 * went away): a queued request leaves the queue, a running one's sequence
 * is closed and its KV reservation given back, so its slot is refilled at
 * the next step. HKV_E_NOTFOUND when r is neither (already finished). The
 * scheduler no longer touches r afterwards; r->out and r->text stay the
 * caller's to clear. */
int hkv_sched_cancel(hkv_sched *s, hkv_sched_req *r);

/* Requests queued or in flight. */
int hkv_sched_pending(const hkv_sched *s);
int hkv_sched_running(const hkv_sched *s);
void hkv_sched_get_stats(const hkv_sched *s, hkv_sched_stats *st);

/* Host bytes the KV of one sequence with capacity cap tokens takes under the
 * engine's cache and policy (near, far, kept queries, policy index). */
uint64_t hkv_sched_kv_bytes(const hkv_engine *e, int64_t cap);
/* The same under a given policy (NULL: none, the cache alone). */
uint64_t hkv_sched_kv_bytes_of(const hkv_engine *e, const hkv_policy_def *def,
                               const hkv_policy_args *args, int64_t cap);

/* Tokens of capacity request r opens its sequence with. */
int64_t hkv_sched_capacity(const hkv_engine *e, const hkv_sched_req *r);

void hkv_sched_req_clear(hkv_sched_req *r);

#endif

/* The tiered KV cache: per sequence and layer, a near tier (L_init sink
 * tokens + an L_local ring) and a far tier in host memory, with a policy
 * (index/policy.h) choosing which far tokens each decode step attends to.
 * Near and far partials merge exactly. */
#ifndef HKV_KV_TIERED_H
#define HKV_KV_TIERED_H

#include "kv.h"
#include "pinned.h"
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
} hkv_tiered_params;

void hkv_tiered_params_default(hkv_tiered_params *p);

/* Fidelity counters of one sequence (audit mode), over decode steps and
 * (layer, query head) pairs. */
typedef struct hkv_tiered_audit {
    double n;              /* (step, layer, head) samples */
    double rel_err_sum;    /* |o_policy - o_dense| / |o_dense| */
    double recall_sum;     /* |selected ∩ oracle top-k| / min(k, far) per (step, layer, KV head) */
    double n_recall;
    double selected_sum;   /* far tokens attended per (step, layer, KV head) */
    double far_sum;        /* far tier size, same samples */
} hkv_tiered_audit;

int hkv_kv_tiered_create(hkv_kv *kv, const hkv_kv_shape *shape, int max_seqs,
                         const hkv_tiered_params *p, const hkv_cpu_kernels *kern,
                         hkv_mem_account *mem, hkv_err *err);

/* Give one open sequence another policy; if its prompt has ended, the new
 * policy builds its index now from the far tier and the kept queries. */
int hkv_kv_tiered_set_policy(hkv_kv *kv, int seq, const hkv_policy_def *d,
                             const hkv_policy_args *a, hkv_err *err);

/* Switch the audit on or off and set its oracle top-k, between forward
 * calls (every layer step reads both afresh; its scratch grows on demand). */
int hkv_kv_tiered_set_audit(hkv_kv *kv, int on, int64_t k, hkv_err *err);

void hkv_kv_tiered_audit_get(hkv_kv *kv, int seq, hkv_tiered_audit *out);
void hkv_kv_tiered_audit_reset(hkv_kv *kv, int seq);
/* The policy's describe() line for a sequence. */
void hkv_kv_tiered_describe(hkv_kv *kv, int seq, char *buf, size_t cap);

/* Lookahead (kv_tiered_lookahead.c). After seq_rewind to the prompt end n,
 * call the sequence's policy's lookahead_end for every layer with the far
 * tier of the prompt and the kept queries of positions up to end (> n: the
 * lookahead tokens' queries stay in the query ring after the rewind). */
int hkv_kv_tiered_lookahead_end(hkv_kv *kv, int seq, int64_t end, hkv_err *err);
/* Right after a prompt was fed to seq (nothing decoded since): layer's K/V
 * rows of every position [0, len) (lo = 0: sinks and ring included, the far
 * rows hold the whole prompt) and the last kept queries, copied into qbuf
 * (room for qbuf_rows rows of n_head*d fp16). Used by draft compression. */
int hkv_kv_tiered_prompt_view(hkv_kv *kv, int seq, int layer, hkv_far_view *far,
                              hkv_query_view *qv, uint16_t *qbuf, int64_t qbuf_rows, hkv_err *err);

/* Page-locked far-tier bytes now held and their peak (0 without a CUDA
 * device or without pin_far). */
void hkv_kv_tiered_pinned(hkv_kv *kv, hkv_pinned_account *out);

/* Bytes the decode steps have read so far on the host: the near rows the
 * host attended, the far rows it attended, and what the policies' selections
 * read (centroids, page bounds, lists, the keys they reranked); the bench's
 * bytes per step. 0 for another cache. */
uint64_t hkv_kv_tiered_bytes_read(const hkv_kv *kv);

/* The policy definition and instance serving an open sequence (the
 * token-selective prefill asks the instance which rows propagate). */
int hkv_kv_tiered_seq_instance(hkv_kv *kv, int seq, const hkv_policy_def **def, hkv_policy *pol,
                               hkv_err *err);

/* The policy a sequence runs (or will run when opened) and its arguments;
 * NULL when kv is not tiered or seq is out of range. */
const hkv_policy_def *hkv_kv_tiered_seq_policy(const hkv_kv *kv, int seq, hkv_policy_args *args);

/* The near tier of (seq, layer) for a mirror of it (the device's, pipeline/):
 * K and V [n_head_kv][rows][d] fp16, rows = L_init + L_local (sinks, then the
 * ring: position p >= L_init in slot L_init + (p - L_init) % L_local). After
 * a prompt has ended, a token at position p attends rows [0, min(p + 1,
 * rows)). */
int hkv_kv_tiered_near(hkv_kv *kv, int seq, int layer, const uint16_t **k, const uint16_t **v,
                       int *rows, hkv_err *err);
/* The far tier of (seq, layer) as its policy sees it (index/policy.h): for
 * a device copying rows the policy keeps (pipeline/cuda_keep.c). */
int hkv_kv_tiered_far(hkv_kv *kv, int seq, int layer, hkv_far_view *far, hkv_err *err);
/* Near rows per (layer, KV head) (0 when kv is not tiered). */
int hkv_kv_tiered_near_rows(const hkv_kv *kv);
/* A number that changes whenever seq's stored tokens change other than by
 * appending through layer_step (open, close, a copy into it, a rewind) or
 * its policy is replaced. A device mirror of its near tier or its policy's
 * index is current only while the epoch it saw holds. */
uint64_t hkv_kv_tiered_seq_epoch(const hkv_kv *kv, int seq);

/* Offer a device's index builds to every prompt end from now on (NULL:
 * stop); the cache fills in the sequence. */
void hkv_kv_tiered_set_accel(hkv_kv *kv, const hkv_far_accel *a);
/* 1 when kv is a tiered cache. */
int hkv_kv_is_tiered(const hkv_kv *kv);

#endif

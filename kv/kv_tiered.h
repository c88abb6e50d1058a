/* The tiered KV cache: per sequence and layer, a near tier (L_init sink
 * tokens + an L_local ring) and a far tier in host memory, with a policy
 * (index/policy.h) choosing which far tokens each decode step attends to.
 * Near and far partials merge exactly.
 *
 * Its concrete API, for whoever creates it (the engine) and the tools that
 * measure it (audit, bytes read, page-locked bytes). What the device
 * pipeline and the scheduler need of it (near and far views, epochs, the
 * sequences' policies) is its kv_far.h table, hkv_kv_ops.far. */
#ifndef HKV_KV_TIERED_H
#define HKV_KV_TIERED_H

#include "kv.h"
#include "kv_far.h"
#include "kv_tiered_params.h"
#include "pinned.h"
#include "policy.h"

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

/* Switch the audit on or off and set its oracle top-k, between forward
 * calls (every layer step reads both afresh; its scratch grows on demand). */
int hkv_kv_tiered_set_audit(hkv_kv *kv, int on, int64_t k, hkv_err *err);

void hkv_kv_tiered_audit_get(hkv_kv *kv, int seq, hkv_tiered_audit *out);
void hkv_kv_tiered_audit_reset(hkv_kv *kv, int seq);
/* The policy's describe() line for a sequence. */
void hkv_kv_tiered_describe(hkv_kv *kv, int seq, char *buf, size_t cap);

/* Page-locked far-tier bytes now held and their peak (0 without a CUDA
 * device or without pin_far). */
void hkv_kv_tiered_pinned(hkv_kv *kv, hkv_pinned_account *out);

/* Bytes the decode steps have read so far on the host: the near rows the
 * host attended, the far rows it attended, and what the policies' selections
 * read (centroids, page bounds, lists, the keys they reranked); the bench's
 * bytes per step. 0 for another cache. */
uint64_t hkv_kv_tiered_bytes_read(const hkv_kv *kv);

/* 1 when kv is a tiered cache. */
int hkv_kv_is_tiered(const hkv_kv *kv);

#endif

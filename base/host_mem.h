/* Host memory with per-tier accounting. Every byte the runtime holds for
 * weights, KV tiers, indexes and workspaces goes through here, so the CLI can
 * report each tier and a failed allocation can say what was asked and what
 * the machine had free. */
#ifndef HKV_HOST_MEM_H
#define HKV_HOST_MEM_H

#include <stddef.h>

#include "status.h"

enum hkv_tier {
    HKV_TIER_WEIGHTS = 0,
    HKV_TIER_NEAR,       /* sinks + local window */
    HKV_TIER_FAR,        /* paged bulk of the KV cache */
    HKV_TIER_INDEX,      /* retrieval indexes (centroids, IVF lists, page bounds) */
    HKV_TIER_WORKSPACE,  /* activations and scratch */
    HKV_TIER_COUNT
};

typedef struct hkv_mem_account {
    size_t bytes[HKV_TIER_COUNT];
    size_t peak[HKV_TIER_COUNT];
    size_t n_allocs[HKV_TIER_COUNT];
} hkv_mem_account;

const char *hkv_tier_name(int tier);

/* Buffers of at least this size start on a 2 MiB boundary and are advised
 * onto transparent huge pages: a streamed read then costs one TLB entry per
 * 2 MiB, not per 4 KiB (docs/HOST_KERNELS.md, "Huge pages"). */
#define HKV_HUGE_PAGE ((size_t)2 << 20)

/* madvise(MADV_HUGEPAGE) over the whole 2 MiB pages of [p, p + bytes); a
 * kernel that refuses (THP "never", no THP) keeps 4 KiB pages: same bytes,
 * same results, so a refusal is not an error. */
void hkv_host_advise_huge(void *p, size_t bytes);

/* 64-byte aligned (2 MiB from HKV_HUGE_PAGE up); NULL on failure with err naming the tier, the size asked
 * for and the free memory. acc may be NULL (not accounted). */
void *hkv_host_alloc(hkv_mem_account *acc, int tier, size_t bytes, hkv_err *err);
/* Same, zero-filled. */
void *hkv_host_calloc(hkv_mem_account *acc, int tier, size_t bytes, hkv_err *err);
/* bytes must be what was asked at allocation. p may be NULL. */
void hkv_host_free(hkv_mem_account *acc, int tier, void *p, size_t bytes);

/* Bytes a tier holds other than through hkv_host_alloc (memory shared by
 * mappings, kv/kv_cow.c): delta added to acc's tier (negative: released;
 * never below 0), its peak kept. Atomic, as the allocations'. */
void hkv_mem_account_add(hkv_mem_account *acc, int tier, long long delta);

/* Free and total physical memory of this machine (bytes; 0 if unknown). */
size_t hkv_host_mem_free(void);
size_t hkv_host_mem_total(void);

/* "1.5 GiB" style. */
void hkv_fmt_bytes(double bytes, char *buf, size_t cap);

#endif

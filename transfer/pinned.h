/* Host memory for the far tier, page-locked for the GPU when there is one.
 *
 * With CUDA and a device: cudaHostAlloc (portable, mapped), or, when a NUMA
 * node is given, an mmap bound to that node (mbind) then cudaHostRegister, so
 * the far tier sits next to the GPU's memory controller. Without a device:
 * ordinary host memory, bound to the node with libnuma when one is given.
 * The kind obtained is reported, never hidden: a caller that needs page-locked
 * memory passes HKV_PIN_REQUIRE and gets an error instead of pageable memory.
 * Bytes are accounted in the given tier of the hkv_mem_account (the far tier,
 * normally) and, when page-locked, in an hkv_pinned_account beside it. */
#ifndef HKV_PINNED_H
#define HKV_PINNED_H

#include <stddef.h>

#include "host_mem.h"
#include "status.h"

enum hkv_pinned_kind {
    HKV_PIN_PAGEABLE = 0,       /* plain host memory (no GPU, or not asked) */
    HKV_PIN_PAGEABLE_NUMA,      /* plain host memory bound to a NUMA node */
    HKV_PIN_CUDA_HOST,          /* cudaHostAlloc(portable | mapped) */
    HKV_PIN_CUDA_REGISTERED,    /* mmap (+ mbind to the node) + cudaHostRegister */
    HKV_PIN_PAGEABLE_MAPPED,    /* plain host memory, whole pages of its own mmap */
};

/* Flags. */
#define HKV_PIN_REQUIRE 1       /* fail unless the memory is page-locked for a GPU */
#define HKV_PIN_NO_CUDA 2       /* never use CUDA (plain host memory) */
/* Plain host memory in whole pages of its own mapping, so that the caller may
 * map other pages over parts of it (a shared prefix, kv/kv_prefix.h); with a
 * NUMA node, bound as HKV_PIN_PAGEABLE_NUMA. Implies HKV_PIN_NO_CUDA. */
#define HKV_PIN_MAPPED 4
/* Whole pages of its own mapping, as HKV_PIN_MAPPED, but page-locked with
 * cudaHostRegister when CUDA is usable (HKV_PIN_CUDA_REGISTERED): the far
 * tier on the device path, over which a shared prefix is mapped between
 * hkv_pinned_unlock and hkv_pinned_relock. */
#define HKV_PIN_REMAPPABLE 8

typedef struct hkv_pinned_account {
    size_t bytes, peak, n_allocs;   /* page-locked bytes only */
} hkv_pinned_account;

typedef struct hkv_pinned {
    void *p;
    size_t bytes;      /* as asked */
    size_t mapped;     /* bytes mmap'd (rounded to pages); 0 for other kinds */
    int kind;          /* enum hkv_pinned_kind */
    int tier;
    int node;          /* NUMA node bound to, or -1 */
} hkv_pinned;

const char *hkv_pinned_kind_name(int kind);

/* Allocate bytes for tier (numa_node < 0: no binding). On failure *out is
 * zeroed and err names the bytes asked, the free host memory, and the CUDA
 * or system error. acc and pin may be NULL (not accounted). */
int hkv_pinned_alloc(hkv_pinned *out, hkv_mem_account *acc, hkv_pinned_account *pin, int tier,
                     size_t bytes, int numa_node, unsigned flags, hkv_err *err);
/* Release and un-account (the same acc and pin as at allocation). */
void hkv_pinned_free(hkv_pinned *b, hkv_mem_account *acc, hkv_pinned_account *pin);

/* Mapping other pages over parts of a HKV_PIN_CUDA_REGISTERED buffer: the
 * registration pins the pages it was made over, so a remap between unlock
 * and relock is what the device then reads. relock registers the buffer
 * read-only for the device (its pages may be mapped read-only for the host:
 * a shared prefix); on failure the buffer is left pageable (its kind says
 * so, pin un-accounted) and err names the CUDA error. No device copy may be
 * reading the buffer meanwhile. Other kinds: nothing to do. */
int hkv_pinned_unlock(hkv_pinned *b, hkv_err *err);
int hkv_pinned_relock(hkv_pinned *b, hkv_pinned_account *pin, hkv_err *err);
/* 1 when relock can work: no CUDA (nothing to lock), or a device that
 * registers read-only host pages (cudaDevAttrHostRegisterReadOnlySupported). */
int hkv_pinned_remap_supported(void);

/* NUMA node of CUDA device dev (from its PCI bus id in sysfs); -1 when
 * unknown or built without CUDA. */
int hkv_pinned_gpu_numa_node(int dev);

#endif

/* Far-tier host memory, page-locked for the GPU when there is one (pinned.h). */
#include "fault.h"
#include "pinned.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef HKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

const char *hkv_pinned_kind_name(int kind) {
    switch (kind) {
    case HKV_PIN_PAGEABLE: return "pageable";
    case HKV_PIN_PAGEABLE_NUMA: return "pageable, NUMA-bound";
    case HKV_PIN_CUDA_HOST: return "pinned (cudaHostAlloc)";
    case HKV_PIN_CUDA_REGISTERED: return "pinned (mapped, cudaHostRegister)";
    case HKV_PIN_PAGEABLE_MAPPED: return "pageable, mapped";
    }
    return "?";
}

/* "cannot allocate 1.00 GiB of ... for the far tier (20.1 GiB available): why" */
static int fail(hkv_err *err, int code, const char *what, int tier, size_t bytes, const char *why) {
    char want[32], have[32];
    hkv_fmt_bytes((double)bytes, want, sizeof want);
    hkv_fmt_bytes((double)hkv_host_mem_free(), have, sizeof have);
    return hkv_seterr(err, code, "cannot allocate %s of %s for the %s tier (%s of host memory "
                      "available): %s", want, what, hkv_tier_name(tier), have, why);
}

/* Validate node against the machine; 0 or an error. */
static int check_node(int node, int tier, size_t bytes, hkv_err *err) {
    char why[128];
    if (numa_available() < 0) {
        snprintf(why, sizeof why, "NUMA node %d asked but this system has no NUMA support", node);
        return fail(err, HKV_E_INVAL, "NUMA-bound memory", tier, bytes, why);
    }
    if (node > numa_max_node() || !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node)) {
        snprintf(why, sizeof why, "NUMA node %d does not exist (nodes 0..%d)", node, numa_max_node());
        return fail(err, HKV_E_INVAL, "NUMA-bound memory", tier, bytes, why);
    }
    return HKV_OK;
}

/* mmap rounded to pages, bound to node with MPOL_BIND (pages fault in on it;
 * node < 0: not bound). */
static void *map_on_node(size_t bytes, int node, size_t *mapped, int tier, hkv_err *err) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (bytes + pg - 1) / pg * pg;
    if (len < bytes) {
        fail(err, HKV_E_NOMEM, "mapped host memory", tier, bytes, "size overflows");
        return NULL;
    }
    /* From HKV_HUGE_PAGE up, on a 2 MiB boundary (as hkv_host_alloc's), so every
     * 2 MiB of it can be a huge page: map 2 MiB more, give back both ends. */
    const size_t slack = len >= HKV_HUGE_PAGE ? HKV_HUGE_PAGE : 0;
    uint8_t *m = mmap(NULL, len + slack, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fail(err, HKV_E_NOMEM, "mapped host memory", tier, bytes, strerror(errno));
        return NULL;
    }
    uint8_t *p = m;
    if (slack) {
        p = (uint8_t *)(((uintptr_t)m + HKV_HUGE_PAGE - 1) & ~(uintptr_t)(HKV_HUGE_PAGE - 1));
        if (p > m) munmap(m, (size_t)(p - m));
        if (m + len + slack > p + len) munmap(p + len, (size_t)(m + len + slack - (p + len)));
    }
    unsigned long mask[16] = {0};
    if (node < 0) {
        hkv_host_advise_huge(p, len);
        *mapped = len;
        return p;
    }
    if (node >= (int)(sizeof mask * 8)) {
        munmap(p, len);
        fail(err, HKV_E_INVAL, "NUMA-bound memory", tier, bytes, "node number too large");
        return NULL;
    }
    mask[node / (8 * sizeof mask[0])] |= 1UL << (node % (8 * sizeof mask[0]));
    if (mbind(p, len, MPOL_BIND, mask, sizeof mask * 8, 0) != 0) {
        char why[128];
        snprintf(why, sizeof why, "mbind to node %d: %s", node, strerror(errno));
        munmap(p, len);
        fail(err, HKV_E_NOMEM, "NUMA-bound memory", tier, bytes, why);
        return NULL;
    }
    hkv_host_advise_huge(p, len);   /* before the first touch faults pages in */
    *mapped = len;
    return p;
}

/* Page-locked pages cannot be reclaimed: locking what the host has left gets
 * the process killed by the kernel later, on some unrelated allocation (the
 * H200 run of 2026-11-30 lost a bench that way at 96K). So a lock that would
 * leave the host less than a reserve (1/32 of its memory, at least 1 GiB: the
 * pageable memory beside the far tier, the index lists, the driver's own) is
 * refused here, naming the bytes. MemAvailable unknown: no check. */
static int check_lockable(int tier, size_t bytes, hkv_err *err) {
    const size_t avail = hkv_host_mem_free(), total = hkv_host_mem_total();
    if (!avail) return HKV_OK;
    size_t reserve = total / 32;
    if (reserve < ((size_t)1 << 30)) reserve = (size_t)1 << 30;
    if (bytes + reserve <= avail) return HKV_OK;
    char why[160], r[32];
    hkv_fmt_bytes((double)reserve, r, sizeof r);
    snprintf(why, sizeof why, "locking it would leave the host less than its reserve of %s for "
             "pageable memory", r);
    return fail(err, HKV_E_NOMEM, "page-locked memory", tier, bytes, why);
}

/* 1 when a CUDA device is usable; why says otherwise. */
static int cuda_usable(char *why, size_t cap) {
#ifdef HKV_HAVE_CUDA
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(why, cap, "no CUDA device (%s)", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
        return 0;
    }
    return 1;
#else
    snprintf(why, cap, "this binary was built without CUDA");
    return 0;
#endif
}

int hkv_pinned_alloc(hkv_pinned *out, hkv_mem_account *acc, hkv_pinned_account *pin, int tier,
                     size_t bytes, int numa_node, unsigned flags, hkv_err *err) {
    memset(out, 0, sizeof *out);
    out->node = -1;
    if (tier < 0 || tier >= HKV_TIER_COUNT)
        return hkv_seterr(err, HKV_E_INTERNAL, "pinned allocation for unknown tier %d", tier);
    if (bytes == 0) return hkv_seterr(err, HKV_E_INVAL, "pinned allocation of 0 bytes");
    if (bytes > SIZE_MAX / 2) return fail(err, HKV_E_NOMEM, "host memory", tier, bytes, "size is absurd");
    if (hkv_fault_hit_kind(HKV_FAULT_PINNED)) return fail(err, HKV_E_NOMEM, "host memory", tier, bytes, "fault injection");
    int rc;
    if (numa_node >= 0 && (rc = check_node(numa_node, tier, bytes, err))) return rc;
    char why[256] = "";
    if (flags & HKV_PIN_MAPPED) flags |= HKV_PIN_NO_CUDA;
    const int use_cuda = !(flags & HKV_PIN_NO_CUDA) && cuda_usable(why, sizeof why);
    if (!use_cuda && (flags & HKV_PIN_REQUIRE)) {
        if (flags & HKV_PIN_NO_CUDA) snprintf(why, sizeof why, "CUDA was excluded by the caller");
        return fail(err, HKV_E_DEVICE, "page-locked memory", tier, bytes, why);
    }
    if (use_cuda && (rc = check_lockable(tier, bytes, err))) return rc;
    if (use_cuda) {
#ifdef HKV_HAVE_CUDA
        cudaError_t e;
        if (numa_node < 0 && !(flags & HKV_PIN_REMAPPABLE)) {
            e = cudaHostAlloc(&out->p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
            if (e != cudaSuccess) {
                out->p = NULL;
                snprintf(why, sizeof why, "cudaHostAlloc: %s", cudaGetErrorString(e));
                return fail(err, HKV_E_NOMEM, "pinned host memory", tier, bytes, why);
            }
            out->kind = HKV_PIN_CUDA_HOST;
        } else {
            if (!(out->p = map_on_node(bytes, numa_node, &out->mapped, tier, err))) return HKV_E_NOMEM;
            e = cudaHostRegister(out->p, out->mapped, cudaHostRegisterPortable | cudaHostRegisterMapped);
            if (e != cudaSuccess) {
                munmap(out->p, out->mapped);
                memset(out, 0, sizeof *out);
                snprintf(why, sizeof why, "cudaHostRegister (node %d): %s", numa_node,
                         cudaGetErrorString(e));
                return fail(err, HKV_E_NOMEM, "pinned host memory", tier, bytes, why);
            }
            out->kind = HKV_PIN_CUDA_REGISTERED;
            out->node = numa_node;
        }
#endif
    } else if (numa_node >= 0 || (flags & (HKV_PIN_MAPPED | HKV_PIN_REMAPPABLE))) {
        if (!(out->p = map_on_node(bytes, numa_node, &out->mapped, tier, err))) return HKV_E_NOMEM;
        out->kind = numa_node >= 0 ? HKV_PIN_PAGEABLE_NUMA : HKV_PIN_PAGEABLE_MAPPED;
        out->node = numa_node;
    } else {
        if (!(out->p = hkv_host_alloc(NULL, tier, bytes, err))) return HKV_E_NOMEM;
        out->kind = HKV_PIN_PAGEABLE;
    }
    out->bytes = bytes;
    out->tier = tier;
    if (acc) {
        acc->bytes[tier] += bytes;
        acc->n_allocs[tier]++;
        if (acc->bytes[tier] > acc->peak[tier]) acc->peak[tier] = acc->bytes[tier];
    }
    if (pin && (out->kind == HKV_PIN_CUDA_HOST || out->kind == HKV_PIN_CUDA_REGISTERED)) {
        pin->bytes += bytes;
        pin->n_allocs++;
        if (pin->bytes > pin->peak) pin->peak = pin->bytes;
    }
    return HKV_OK;
}

void hkv_pinned_free(hkv_pinned *b, hkv_mem_account *acc, hkv_pinned_account *pin) {
    if (!b || !b->p) return;
    switch (b->kind) {
#ifdef HKV_HAVE_CUDA
    case HKV_PIN_CUDA_HOST: cudaFreeHost(b->p); break;
    case HKV_PIN_CUDA_REGISTERED:
        cudaHostUnregister(b->p);
        munmap(b->p, b->mapped);
        break;
#endif
    case HKV_PIN_PAGEABLE_NUMA:
    case HKV_PIN_PAGEABLE_MAPPED: munmap(b->p, b->mapped); break;
    default: free(b->p); break;
    }
    if (acc) {
        acc->bytes[b->tier] -= b->bytes <= acc->bytes[b->tier] ? b->bytes : acc->bytes[b->tier];
        if (acc->n_allocs[b->tier]) acc->n_allocs[b->tier]--;
    }
    if (pin && (b->kind == HKV_PIN_CUDA_HOST || b->kind == HKV_PIN_CUDA_REGISTERED)) {
        pin->bytes -= b->bytes <= pin->bytes ? b->bytes : pin->bytes;
        if (pin->n_allocs) pin->n_allocs--;
    }
    memset(b, 0, sizeof *b);
    b->node = -1;
}

int hkv_pinned_unlock(hkv_pinned *b, hkv_err *err) {
    if (!b->p || b->kind != HKV_PIN_CUDA_REGISTERED) return HKV_OK;
#ifdef HKV_HAVE_CUDA
    cudaError_t e = cudaHostUnregister(b->p);
    if (e != cudaSuccess)
        return hkv_seterr(err, HKV_E_DEVICE, "cudaHostUnregister of %zu bytes of the %s tier: %s",
                          b->mapped, hkv_tier_name(b->tier), cudaGetErrorString(e));
#else
    (void)err;
#endif
    return HKV_OK;
}

int hkv_pinned_relock(hkv_pinned *b, hkv_pinned_account *pin, hkv_err *err) {
    if (!b->p || b->kind != HKV_PIN_CUDA_REGISTERED) return HKV_OK;
#ifdef HKV_HAVE_CUDA
    cudaError_t e = hkv_fault_hit_kind(HKV_FAULT_PINNED)
                        ? cudaErrorMemoryAllocation
                        : cudaHostRegister(b->p, b->mapped, cudaHostRegisterPortable |
                                           cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    if (e == cudaSuccess) return HKV_OK;
    b->kind = b->node >= 0 ? HKV_PIN_PAGEABLE_NUMA : HKV_PIN_PAGEABLE_MAPPED;
    if (pin) {
        pin->bytes -= b->bytes <= pin->bytes ? b->bytes : pin->bytes;
        if (pin->n_allocs) pin->n_allocs--;
    }
    char want[32];
    hkv_fmt_bytes((double)b->mapped, want, sizeof want);
    return hkv_seterr(err, HKV_E_DEVICE, "cannot page-lock %s of the %s tier again after mapping "
                      "a shared prefix over it (left pageable): cudaHostRegister: %s", want,
                      hkv_tier_name(b->tier), cudaGetErrorString(e));
#else
    (void)pin, (void)err;
    return HKV_OK;
#endif
}

int hkv_pinned_remap_supported(void) {
#ifdef HKV_HAVE_CUDA
    char why[128];
    if (!cuda_usable(why, sizeof why)) return 1;
    int dev = 0, ro = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return ro != 0;
#else
    return 1;
#endif
}

int hkv_pinned_gpu_numa_node(int dev) {
#ifdef HKV_HAVE_CUDA
    char bus[32], path[128];
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) {
        (void)cudaGetLastError();   /* an answered question, not an error for the next launch check */
        return -1;
    }
    for (char *c = bus; *c; c++)   /* sysfs spells the bus id in lower case */
        if (*c >= 'A' && *c <= 'F') *c = (char)(*c - 'A' + 'a');
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1) node = -1;
    fclose(f);
    return node;
#else
    (void)dev;
    return -1;
#endif
}

#include "host_mem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *const tier_names[HKV_TIER_COUNT] = {
    "weights", "near", "far", "index", "workspace",
};

const char *hkv_tier_name(int tier) {
    return tier >= 0 && tier < HKV_TIER_COUNT ? tier_names[tier] : "?";
}

size_t hkv_host_mem_free(void) {
    /* MemAvailable is what a new allocation can really get. */
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}

size_t hkv_host_mem_total(void) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
}

void hkv_fmt_bytes(double b, char *buf, size_t cap) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(buf, cap, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

void hkv_host_advise_huge(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    /* Only the whole 2 MiB pages inside [p, p + bytes) can be huge. */
    const uintptr_t a = ((uintptr_t)p + HKV_HUGE_PAGE - 1) & ~(uintptr_t)(HKV_HUGE_PAGE - 1);
    const uintptr_t e = ((uintptr_t)p + bytes) & ~(uintptr_t)(HKV_HUGE_PAGE - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_HUGEPAGE);   /* advice: refused is no error */
#else
    (void)p, (void)bytes;
#endif
}

/* The account's counters change with atomics: policies grow their own
 * tables from the decode step's threads (ctkvr's private index rows). */
static void account_count(hkv_mem_account *acc, int tier, int up) {
    size_t n = __atomic_load_n(&acc->n_allocs[tier], __ATOMIC_RELAXED);
    while ((up || n) && !__atomic_compare_exchange_n(&acc->n_allocs[tier], &n, up ? n + 1 : n - 1, 1,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

void hkv_mem_account_add(hkv_mem_account *acc, int tier, long long delta) {
    if (!acc || tier < 0 || tier >= HKV_TIER_COUNT || !delta) return;
    if (delta > 0) {
        const size_t now = __atomic_add_fetch(&acc->bytes[tier], (size_t)delta, __ATOMIC_RELAXED);
        size_t pk = __atomic_load_n(&acc->peak[tier], __ATOMIC_RELAXED);
        while (now > pk && !__atomic_compare_exchange_n(&acc->peak[tier], &pk, now, 1,
                                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
        return;
    }
    const size_t d = (size_t)-delta;
    size_t cur = __atomic_load_n(&acc->bytes[tier], __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&acc->bytes[tier], &cur, cur - (d <= cur ? d : cur), 1,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

void *hkv_host_alloc(hkv_mem_account *acc, int tier, size_t bytes, hkv_err *err) {
    if (tier < 0 || tier >= HKV_TIER_COUNT) {
        hkv_seterr(err, HKV_E_INTERNAL, "allocation for unknown memory tier %d", tier);
        return NULL;
    }
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (bytes == 0 || rounded < bytes) rounded = 64;
    void *p = NULL;
    const int huge = bytes >= HKV_HUGE_PAGE;
    if (bytes > SIZE_MAX / 2 || posix_memalign(&p, huge ? HKV_HUGE_PAGE : 64, rounded) != 0) p = NULL;
    if (p && huge) hkv_host_advise_huge(p, rounded);
    if (!p) {
        char want[32], have[32];
        hkv_fmt_bytes((double)bytes, want, sizeof want);
        hkv_fmt_bytes((double)hkv_host_mem_free(), have, sizeof have);
        hkv_seterr(err, HKV_E_NOMEM, "cannot allocate %s of host memory for the %s tier "
                   "(%s available)", want, tier_names[tier], have);
        return NULL;
    }
    if (acc) {
        hkv_mem_account_add(acc, tier, (long long)bytes);
        account_count(acc, tier, 1);
    }
    return p;
}

void *hkv_host_calloc(hkv_mem_account *acc, int tier, size_t bytes, hkv_err *err) {
    void *p = hkv_host_alloc(acc, tier, bytes, err);
    if (p) memset(p, 0, bytes);
    return p;
}

void hkv_host_free(hkv_mem_account *acc, int tier, void *p, size_t bytes) {
    if (!p) return;
    free(p);
    if (acc && tier >= 0 && tier < HKV_TIER_COUNT) {
        hkv_mem_account_add(acc, tier, -(long long)bytes);
        account_count(acc, tier, 0);
    }
}

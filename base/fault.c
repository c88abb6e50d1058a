/* The fault-injection build's allocation wrappers (base/fault.h). The one
 * piece of process-wide state in the project, by necessity: malloc has no
 * context argument. Only compiled into -Dfault_inject=true builds. */
#ifdef HKV_FAULT_INJECT
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);

static atomic_long n_alloc;
static atomic_long fail_at = -2;   /* -2: environment not read yet; -1: never */
static atomic_int kinds = -1;      /* -1: not read yet; else HKV_FAULT_* bits counted */

static int kinds_counted(void) {
    int k = atomic_load(&kinds);
    if (k >= 0) return k;
    const char *s = getenv("HKV_FAULT_KINDS");
    if (!s || !*s) {
        k = HKV_FAULT_HOST | HKV_FAULT_PINNED | HKV_FAULT_DEVICE;
    } else {
        k = 0;
        if (strstr(s, "host")) k |= HKV_FAULT_HOST;
        if (strstr(s, "pinned")) k |= HKV_FAULT_PINNED;
        if (strstr(s, "device")) k |= HKV_FAULT_DEVICE;
    }
    atomic_store(&kinds, k);
    return k;
}

int hkv_fault_hit_kind(int kind) {
    if (!(kinds_counted() & kind)) return 0;
    long at = atomic_load(&fail_at);
    if (at == -2) {
        const char *s = getenv("HKV_FAULT_AT");
        at = s && *s ? strtol(s, NULL, 10) : -1;
        atomic_store(&fail_at, at);
    }
    const long k = atomic_fetch_add(&n_alloc, 1) + 1;
    return at > 0 && k == at;
}

static int hkv_fault_hit(void) { return hkv_fault_hit_kind(HKV_FAULT_HOST); }

__attribute__((destructor)) static void report(void) {
    const char *path = getenv("HKV_FAULT_REPORT");
    if (!path) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "%ld\n", atomic_load(&n_alloc));
    fclose(f);
}

void *__wrap_malloc(size_t n) {
    if (hkv_fault_hit()) return errno = ENOMEM, NULL;
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m) {
    if (hkv_fault_hit()) return errno = ENOMEM, NULL;
    return __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n) {
    if (hkv_fault_hit()) return errno = ENOMEM, NULL;
    return __real_realloc(p, n);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n) {
    if (hkv_fault_hit()) return ENOMEM;
    return __real_posix_memalign(p, a, n);
}

void *__wrap_aligned_alloc(size_t a, size_t n) {
    if (hkv_fault_hit()) return errno = ENOMEM, NULL;
    return __real_aligned_alloc(a, n);
}

char *__wrap_strdup(const char *s) {
    if (hkv_fault_hit()) return errno = ENOMEM, NULL;
    size_t n = strlen(s) + 1;
    char *d = __real_malloc(n);
    return d ? memcpy(d, s, n) : NULL;
}

char *__wrap_strndup(const char *s, size_t m) {
    if (hkv_fault_hit()) return errno = ENOMEM, NULL;
    size_t n = strnlen(s, m);
    char *d = __real_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}
#else
typedef int hkv_fault_off; /* an empty translation unit is not ISO C */
#endif

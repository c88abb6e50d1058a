/* Copy-on-write buffers over a memfd (kv_cow.h). */
#include "kv_cow.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fault.h"

struct hkv_kv_cow {
    int refs;
    int fd;
    size_t bytes;   /* page-rounded */
    hkv_mem_account *mem;
    int tier;
};

static size_t pages(size_t bytes) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes + pg - 1) / pg * pg;
}

static int map_over(hkv_kv_cow *c, void *buf, const char *what, hkv_err *err) {
    errno = 0;
    if (((uintptr_t)buf % (uintptr_t)sysconf(_SC_PAGESIZE)) || hkv_fault_hit_kind(HKV_FAULT_PINNED) ||
        mmap(buf, c->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, c->fd, 0) == MAP_FAILED) {
        char b[32];
        hkv_fmt_bytes((double)c->bytes, b, sizeof b);
        return hkv_seterr(err, HKV_E_NOMEM, "cannot %s %s of kept queries copy-on-write: %s", what, b,
                          errno ? strerror(errno) : "a buffer off a page, or fault injection");
    }
    return HKV_OK;
}

int hkv_kv_cow_create(hkv_kv_cow **out, void *buf, size_t bytes, hkv_mem_account *mem, int tier,
                      hkv_err *err) {
    *out = NULL;
    hkv_kv_cow *c = calloc(1, sizeof *c);
    if (!c) return hkv_seterr(err, HKV_E_NOMEM, "no memory for a copy-on-write buffer");
    c->bytes = pages(bytes);
    c->fd = -1;
    void *tmp = MAP_FAILED;
    errno = 0;
    if (hkv_fault_hit_kind(HKV_FAULT_PINNED) ||
        (c->fd = memfd_create("hetkv-queries", MFD_CLOEXEC)) < 0 || ftruncate(c->fd, (off_t)c->bytes) ||
        (tmp = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0)) == MAP_FAILED) {
        char b[32];
        hkv_fmt_bytes((double)c->bytes, b, sizeof b);
        int rc = hkv_seterr(err, HKV_E_NOMEM, "cannot make %s of shared memory for kept queries: %s",
                            b, errno ? strerror(errno) : "fault injection");
        if (c->fd >= 0) close(c->fd);
        free(c);
        return rc;
    }
    memcpy(tmp, buf, bytes);
    munmap(tmp, c->bytes);
    int rc = map_over(c, buf, "share", err);
    if (rc) {
        close(c->fd);
        free(c);
        return rc;
    }
    c->refs = 1;
    c->mem = mem, c->tier = tier;
    hkv_mem_account_add(mem, tier, (long long)c->bytes);
    *out = c;
    return HKV_OK;
}

int hkv_kv_cow_map(hkv_kv_cow *c, void *buf, hkv_err *err) {
    int rc = map_over(c, buf, "map", err);
    if (!rc) c->refs++;
    return rc;
}

void hkv_kv_cow_release(hkv_kv_cow *c) {
    if (!c || --c->refs > 0) return;
    hkv_mem_account_add(c->mem, c->tier, -(long long)c->bytes);
    close(c->fd);
    free(c);
}

size_t hkv_kv_cow_bytes(const hkv_kv_cow *c) { return c ? c->bytes : 0; }

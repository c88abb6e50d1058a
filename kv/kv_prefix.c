/* Shared prefix rows by page mapping (kv_prefix.h). */
#include "kv_prefix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fault.h"

struct hkv_kv_prefix {
    int refs;             /* sequences mapping it */
    int fd;
    int n_bufs, n_runs;
    int64_t rows;         /* per run */
    uint64_t id;
    size_t row_bytes, run_bytes, bytes;
    uint8_t *base;        /* [n_bufs][n_runs][rows][row_bytes], read-only */
    hkv_mem_account *mem;
};

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static size_t gcd(size_t a, size_t b) {
    while (b) {
        size_t r = a % b;
        a = b, b = r;
    }
    return a;
}

int64_t hkv_kv_prefix_page_rows(size_t row_bytes) {
    const size_t pg = page_size();
    return row_bytes ? (int64_t)(pg / gcd(pg, row_bytes)) : 0;
}

int64_t hkv_kv_prefix_stride(int64_t cap, size_t row_bytes) {
    const int64_t r = hkv_kv_prefix_page_rows(row_bytes);
    return r ? (cap + r - 1) / r * r : cap;
}

static void account(hkv_mem_account *mem, long long delta) {
    hkv_mem_account_add(mem, HKV_TIER_FAR, delta);
}

static uint8_t *run_at(void *const *bufs, int b, int run, int64_t stride, size_t row_bytes) {
    return (uint8_t *)bufs[b] + (size_t)run * (size_t)stride * row_bytes;
}

static int check_shape(const hkv_kv_prefix *p, void *const *bufs, int64_t stride, int64_t rows,
                       const char *what, hkv_err *err) {
    const int64_t pr = hkv_kv_prefix_page_rows(p->row_bytes);
    if (rows < 0 || rows > p->rows || rows % pr || stride % pr || stride < rows)
        return hkv_seterr(err, HKV_E_INTERNAL, "shared prefix %s: %lld rows (stride %lld) of a "
                          "prefix of %lld rows, pages of %lld rows", what, (long long)rows,
                          (long long)stride, (long long)p->rows, (long long)pr);
    for (int b = 0; b < p->n_bufs; b++)
        if ((uintptr_t)bufs[b] % page_size())
            return hkv_seterr(err, HKV_E_INTERNAL, "shared prefix %s: a buffer that does not start "
                              "on a page", what);
    return HKV_OK;
}

int hkv_kv_prefix_create(hkv_kv_prefix **out, void *const *bufs, int n_bufs, int n_runs,
                         int64_t stride, int64_t rows, size_t row_bytes, uint64_t id,
                         hkv_mem_account *mem, hkv_err *err) {
    *out = NULL;
    hkv_kv_prefix *p = calloc(1, sizeof *p);
    if (!p) return hkv_seterr(err, HKV_E_NOMEM, "no memory for a shared prefix");
    *p = (hkv_kv_prefix){.fd = -1, .n_bufs = n_bufs, .n_runs = n_runs, .rows = rows,
                         .row_bytes = row_bytes, .run_bytes = (size_t)rows * row_bytes, .id = id,
                         .mem = mem};
    p->bytes = (size_t)n_bufs * n_runs * p->run_bytes;
    int rc = check_shape(p, bufs, stride, rows, "create", err);
    if (!rc && (rows < 1 || n_bufs < 1 || n_runs < 1))
        rc = hkv_seterr(err, HKV_E_INTERNAL, "shared prefix of %lld rows, %d buffers of %d runs",
                        (long long)rows, n_bufs, n_runs);
    if (rc) {
        free(p);
        return rc;
    }
    char bytes[32];
    hkv_fmt_bytes((double)p->bytes, bytes, sizeof bytes);
    errno = 0;
    if (hkv_fault_hit_kind(HKV_FAULT_PINNED) ||
        (p->fd = memfd_create("hetkv-prefix", MFD_CLOEXEC)) < 0 || ftruncate(p->fd, (off_t)p->bytes) ||
        (p->base = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0)) == MAP_FAILED) {
        rc = hkv_seterr(err, HKV_E_NOMEM, "cannot make %s of shared memory for a prefix of %lld "
                        "tokens: %s", bytes, (long long)rows,
                        errno ? strerror(errno) : "fault injection");
        if (p->fd >= 0) close(p->fd);
        free(p);
        return rc;
    }
    for (int b = 0; b < n_bufs; b++)
        for (int r = 0; r < n_runs; r++)
            memcpy(p->base + ((size_t)b * n_runs + r) * p->run_bytes,
                   run_at(bufs, b, r, stride, row_bytes), p->run_bytes);
    mprotect(p->base, p->bytes, PROT_READ);   /* a stray write faults, here too */
    account(mem, (long long)p->bytes);
    *out = p;
    return HKV_OK;
}

void hkv_kv_prefix_drop(hkv_kv_prefix *p) {
    if (!p) return;
    munmap(p->base, p->bytes);
    close(p->fd);
    account(p->mem, -(long long)p->bytes);
    free(p);
}

/* Private zero pages over rows [0, rows) of every run; with keep, the
 * prefix's rows copied in. */
static int private_pages(hkv_kv_prefix *p, void *const *bufs, int64_t stride, int64_t rows, int keep,
                         hkv_err *err) {
    const size_t len = (size_t)rows * p->row_bytes;
    for (int b = 0; b < p->n_bufs; b++)
        for (int r = 0; r < p->n_runs; r++) {
            uint8_t *at = run_at(bufs, b, r, stride, p->row_bytes);
            if (mmap(at, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
                return hkv_seterr(err, HKV_E_NOMEM, "cannot give a sequence its own pages for %lld "
                                  "shared prefix rows: %s", (long long)rows, strerror(errno));
            if (keep) memcpy(at, p->base + ((size_t)b * p->n_runs + r) * p->run_bytes, len);
        }
    return HKV_OK;
}

int hkv_kv_prefix_map(hkv_kv_prefix *p, void *const *bufs, int64_t stride, int64_t rows,
                      hkv_err *err) {
    int rc = check_shape(p, bufs, stride, rows, "map", err);
    if (rc || rows == 0) return rc;
    const size_t len = (size_t)rows * p->row_bytes;
    errno = 0;
    for (int b = 0; b < p->n_bufs; b++)
        for (int r = 0; r < p->n_runs; r++) {
            const off_t off = (off_t)(((size_t)b * p->n_runs + r) * p->run_bytes);
            if (hkv_fault_hit_kind(HKV_FAULT_PINNED) ||
                mmap(run_at(bufs, b, r, stride, p->row_bytes), len, PROT_READ, MAP_SHARED | MAP_FIXED,
                     p->fd, off) == MAP_FAILED) {
                const int e = errno;
                /* the runs mapped so far get their rows back as private pages */
                hkv_err ignore;
                private_pages(p, bufs, stride, rows, 1, &ignore);
                return hkv_seterr(err, HKV_E_NOMEM, "cannot map a shared prefix of %lld tokens: %s",
                                  (long long)rows, e ? strerror(e) : "fault injection");
            }
        }
    p->refs++;
    account(p->mem, -(long long)((size_t)p->n_bufs * p->n_runs * len));
    return HKV_OK;
}

int hkv_kv_prefix_unmap(hkv_kv_prefix *p, void *const *bufs, int64_t stride, int64_t rows, int keep,
                        hkv_err *err) {
    int rc = check_shape(p, bufs, stride, rows, "unmap", err);
    if (rc) return rc;
    if (keep && rows && (rc = private_pages(p, bufs, stride, rows, 1, err))) return rc;
    account(p->mem, (long long)((size_t)p->n_bufs * p->n_runs * (size_t)rows * p->row_bytes));
    if (--p->refs <= 0) hkv_kv_prefix_drop(p);
    return HKV_OK;
}

const void *hkv_kv_prefix_run(const hkv_kv_prefix *p, int buf, int run) {
    return p->base + ((size_t)buf * p->n_runs + run) * p->run_bytes;
}
int64_t hkv_kv_prefix_rows(const hkv_kv_prefix *p) { return p->rows; }
uint64_t hkv_kv_prefix_id(const hkv_kv_prefix *p) { return p->id; }
int hkv_kv_prefix_refs(const hkv_kv_prefix *p) { return p->refs; }
size_t hkv_kv_prefix_bytes(const hkv_kv_prefix *p) { return p->bytes; }

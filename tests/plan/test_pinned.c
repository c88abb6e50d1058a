/* Far-tier host memory (transfer/pinned.h): allocation, NUMA binding
 * (checked with get_mempolicy, not with our own bookkeeping), accounting,
 * and failures that name the problem. With a CUDA device present the
 * page-locked path runs too; without one, REQUIRE must fail clearly. */
#include <numaif.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "device.h"
#include "pinned.h"

#include "../check.h"

static void fill_and_check(hkv_pinned *b) {
    unsigned char *p = b->p;
    for (size_t i = 0; i < b->bytes; i++) p[i] = (unsigned char)(i * 31 + 7);
    size_t bad = 0;
    for (size_t i = 0; i < b->bytes; i++) bad += p[i] != (unsigned char)(i * 31 + 7);
    CHECK(bad == 0, "%zu bytes read back wrong", bad);
}

/* HKV_PIN_REMAPPABLE: page-locked by registration where a device is, and a
 * page of another mapping put over it between unlock and relock is what
 * the buffer reads after (a shared prefix, kv/kv_prefix.h), page-locked
 * again (the emulator tracks registrations by address: relock over a
 * range still registered would fail). */
static void remappable(int n_gpu, hkv_mem_account *acc, hkv_pinned_account *pin) {
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), bytes = 4 * pg;
    hkv_pinned b;
    hkv_err err;
    hkv_err_clear(&err);
    int rc = hkv_pinned_alloc(&b, acc, pin, HKV_TIER_FAR, bytes, -1, HKV_PIN_REMAPPABLE, &err);
    CHECK(rc == HKV_OK && b.kind == (n_gpu ? HKV_PIN_CUDA_REGISTERED : HKV_PIN_PAGEABLE_MAPPED) &&
              b.mapped >= bytes && (uintptr_t)b.p % pg == 0,
          "remappable: rc %d kind %s: %s", rc, hkv_pinned_kind_name(b.kind), err.msg);
    if (rc) return;
    const size_t pinned0 = pin->bytes;
    memset(b.p, 1, bytes);
    int fd = memfd_create("test-pinned", MFD_CLOEXEC);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)pg) == 0, "memfd");
    unsigned char *src = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    memset(src, 7, pg);
    CHECK(hkv_pinned_unlock(&b, &err) == HKV_OK, "unlock: %s", err.msg);
    unsigned char *at = (unsigned char *)b.p + pg;
    CHECK(mmap(at, pg, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) == at, "map over the buffer");
    CHECK(hkv_pinned_relock(&b, pin, &err) == HKV_OK &&
              b.kind == (n_gpu ? HKV_PIN_CUDA_REGISTERED : HKV_PIN_PAGEABLE_MAPPED) &&
              pin->bytes == pinned0,
          "relock: %s (kind %s)", err.msg, hkv_pinned_kind_name(b.kind));
    const unsigned char *r = b.p;
    CHECK(r[0] == 1 && r[pg] == 7 && r[2 * pg - 1] == 7 && r[2 * pg] == 1,
          "the buffer does not read the pages mapped over it");
    CHECK(hkv_pinned_remap_supported(), "this device cannot page-lock read-only pages");
    /* a second cycle: unlock must find the registration relock made */
    CHECK(hkv_pinned_unlock(&b, &err) == HKV_OK && hkv_pinned_relock(&b, pin, &err) == HKV_OK,
          "a second remap: %s", err.msg);
    hkv_pinned_free(&b, acc, pin);
    CHECK(pin->bytes == pinned0 - (n_gpu ? bytes : 0), "pinned bytes after free: %zu", pin->bytes);
    munmap(src, pg);
    close(fd);
}

int main(void) {
    hkv_gpu_device dev[4];
    int n_gpu = 0;
    char why[256];
    hkv_gpu_query(dev, 4, &n_gpu, why, sizeof why);
    printf("test_pinned: %d CUDA device(s)%s%s\n", n_gpu, n_gpu ? "" : ": ", n_gpu ? "" : why);

    hkv_mem_account acc = {0};
    hkv_pinned_account pin = {0};
    hkv_err err;
    hkv_pinned b;
    const size_t MB = 1 << 20;

    /* Default: page-locked with a GPU, plain memory without; the kind says which. */
    CHECK(hkv_pinned_alloc(&b, &acc, &pin, HKV_TIER_FAR, 3 * MB + 5, -1, 0, &err) == HKV_OK, "%s", err.msg);
    CHECK(b.kind == (n_gpu ? HKV_PIN_CUDA_HOST : HKV_PIN_PAGEABLE), "kind %s", hkv_pinned_kind_name(b.kind));
    CHECK(acc.bytes[HKV_TIER_FAR] == 3 * MB + 5 && acc.n_allocs[HKV_TIER_FAR] == 1, "far accounted");
    CHECK(pin.bytes == (n_gpu ? 3 * MB + 5 : 0), "pinned counter %zu", pin.bytes);
    fill_and_check(&b);
    hkv_pinned_free(&b, &acc, &pin);
    CHECK(acc.bytes[HKV_TIER_FAR] == 0 && acc.peak[HKV_TIER_FAR] == 3 * MB + 5 && pin.bytes == 0,
          "freed and un-accounted");

    /* Bound to node 0: the kernel's policy for the range must be MPOL_BIND to node 0. */
    CHECK(hkv_pinned_alloc(&b, &acc, &pin, HKV_TIER_FAR, 8 * MB, 0, 0, &err) == HKV_OK, "%s", err.msg);
    CHECK(b.node == 0 && (b.kind == HKV_PIN_PAGEABLE_NUMA || b.kind == HKV_PIN_CUDA_REGISTERED),
          "node %d kind %s", b.node, hkv_pinned_kind_name(b.kind));
    fill_and_check(&b);
    int mode = -1;
    unsigned long mask[16] = {0};
    CHECK(get_mempolicy(&mode, mask, sizeof mask * 8, b.p, MPOL_F_ADDR) == 0 && mode == MPOL_BIND &&
              (mask[0] & 1),
          "policy of the range: mode %d mask %#lx", mode, mask[0]);
    int node = -1;
    CHECK(get_mempolicy(&node, NULL, 0, (char *)b.p + 4 * MB, MPOL_F_NODE | MPOL_F_ADDR) == 0 && node == 0,
          "a touched page lives on node %d", node);
    CHECK(acc.bytes[HKV_TIER_FAR] == 8 * MB, "far accounted");
    hkv_pinned_free(&b, &acc, &pin);
    CHECK(acc.bytes[HKV_TIER_FAR] == 0 && b.p == NULL, "freed");

    /* Failures name the problem. */
    hkv_err_clear(&err);
    CHECK(hkv_pinned_alloc(&b, &acc, &pin, HKV_TIER_FAR, MB, 999, 0, &err) == HKV_E_INVAL &&
              strstr(err.msg, "NUMA node 999 does not exist") && !b.p,
          "bad node: %s", err.msg);
    const size_t absurd = (size_t)1 << 60;   /* 1 EiB: beyond any address space */
    hkv_err_clear(&err);
    CHECK(hkv_pinned_alloc(&b, &acc, &pin, HKV_TIER_FAR, absurd, -1, 0, &err) == HKV_E_NOMEM &&
              strstr(err.msg, "1048576.00 TiB") && strstr(err.msg, "available") &&
              strstr(err.msg, "far") && !b.p,
          "absurd size: %s", err.msg);
    hkv_err_clear(&err);
    CHECK(hkv_pinned_alloc(&b, &acc, &pin, HKV_TIER_FAR, absurd, 0, 0, &err) == HKV_E_NOMEM &&
              strstr(err.msg, "1048576.00 TiB") && strstr(err.msg, "available") && !b.p,
          "absurd size on a node: %s", err.msg);
    if (n_gpu && hkv_host_mem_free()) {
        /* what the host has, all of it: locking it would get the process killed
         * later (the emulator's cudaHostAlloc is lazy and would have said yes) */
        hkv_err_clear(&err);
        CHECK(hkv_pinned_alloc(&b, &acc, &pin, HKV_TIER_FAR, hkv_host_mem_free(), -1, 0, &err) ==
                      HKV_E_NOMEM && strstr(err.msg, "reserve") && strstr(err.msg, "page-locked") && !b.p,
              "all the host's memory: %s", err.msg);
    }
    CHECK(acc.bytes[HKV_TIER_FAR] == 0 && acc.n_allocs[HKV_TIER_FAR] == 0, "failures not accounted");
    hkv_err_clear(&err);
    CHECK(hkv_pinned_alloc(&b, &acc, &pin, HKV_TIER_FAR, 0, -1, 0, &err) == HKV_E_INVAL &&
              strstr(err.msg, "0 bytes"),
          "zero bytes: %s", err.msg);
    hkv_err_clear(&err);
    int rc = hkv_pinned_alloc(&b, &acc, &pin, HKV_TIER_FAR, MB, -1, HKV_PIN_REQUIRE, &err);
    if (n_gpu) {
        CHECK(rc == HKV_OK && b.kind == HKV_PIN_CUDA_HOST && pin.bytes == MB, "required pinned: %s", err.msg);
        hkv_pinned_free(&b, &acc, &pin);
    } else {
        CHECK(rc == HKV_E_DEVICE && strstr(err.msg, "page-locked") &&
                  (strstr(err.msg, "no CUDA device") || strstr(err.msg, "without CUDA")) && !b.p,
              "required pinned without a GPU: %s", err.msg);
    }
    hkv_err_clear(&err);
    CHECK(hkv_pinned_alloc(&b, &acc, &pin, HKV_TIER_FAR, MB, -1, HKV_PIN_REQUIRE | HKV_PIN_NO_CUDA,
                           &err) == HKV_E_DEVICE && strstr(err.msg, "excluded"),
          "require without CUDA: %s", err.msg);
    remappable(n_gpu, &acc, &pin);
    printf("test_pinned: %s (%d failures)\n", fails ? "FAIL" : "ok", fails);
    return fails ? 1 : 0;
}

/* A buffer's bytes held once for many copies of it, copy-on-write (a
 * sequence's kept prompt queries, which every fork of a shared prompt
 * starts from; kv_tiered_fork.c).
 *
 * The first share copies the buffer into a memfd and maps it MAP_PRIVATE
 * over the buffer itself; each copy maps it the same way over its own
 * buffer. All of them read the same physical pages until one writes a
 * page, which the kernel then copies for that one alone: a fork holds only
 * the pages it writes (a prompt's rest, its decode steps' queries). The
 * buffers are whole pages of their own mapping (hkv_pinned_alloc with
 * HKV_PIN_MAPPED), unmapped by their owner; the memfd goes with the last
 * release. Linux (memfd_create). The memfd's bytes count once in the tier
 * given at creation; what the buffers no longer hold themselves is the
 * caller's to take off. */
#ifndef HKV_KV_COW_H
#define HKV_KV_COW_H

#include <stddef.h>

#include "host_mem.h"
#include "status.h"

typedef struct hkv_kv_cow hkv_kv_cow;

/* buf's bytes (a page-aligned buffer of whole pages) into a memfd, mapped
 * over buf copy-on-write: buf reads what it held. One reference. On failure
 * buf is as it was. */
int hkv_kv_cow_create(hkv_kv_cow **out, void *buf, size_t bytes, hkv_mem_account *mem, int tier,
                      hkv_err *err);
/* Map c over buf (the same size) copy-on-write: buf then reads c's bytes;
 * one more reference. On failure buf is as it was. */
int hkv_kv_cow_map(hkv_kv_cow *c, void *buf, hkv_err *err);
/* A buffer no longer maps c (its owner unmapped it); the last release frees c. */
void hkv_kv_cow_release(hkv_kv_cow *c);
/* The bytes c holds once (page-rounded). */
size_t hkv_kv_cow_bytes(const hkv_kv_cow *c);

#endif

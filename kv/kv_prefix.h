/* A prompt prefix's KV rows shared by reference between sequences (issue 39).
 *
 * A cache keeps a sequence's rows position-indexed, in runs: one run of
 * `stride` rows per (buffer, layer, KV head), every policy and kernel
 * addressing row p of a run as base + p * row. A shared prefix keeps rows
 * [0, rows) of every run once, in a memfd; each sequence that starts with it
 * maps those pages over the first rows of its own runs (MAP_SHARED,
 * read-only). Its runs keep their addresses, so nothing that reads them
 * changes, and every sequence on the prefix reads the same physical pages:
 * the prefix's bytes are held once and, read by a batch in one step, come
 * from DRAM once. A write into a mapped row faults, so the caches map only
 * rows they never write again (below the sequence's length) and unmap
 * before a rewind below them.
 *
 * Runs must start on page boundaries (hkv_kv_prefix_stride rounds a
 * capacity up so they do) and the shared rows are whole pages of every run
 * (hkv_kv_prefix_page_rows). Linux (memfd_create). */
#ifndef HKV_KV_PREFIX_H
#define HKV_KV_PREFIX_H

#include <stddef.h>
#include <stdint.h>

#include "host_mem.h"
#include "status.h"

typedef struct hkv_kv_prefix hkv_kv_prefix;

/* Rows of row_bytes that fill whole pages: shared row counts are multiples. */
int64_t hkv_kv_prefix_page_rows(size_t row_bytes);
/* A run stride of at least cap rows whose runs start on page boundaries. */
int64_t hkv_kv_prefix_stride(int64_t cap, size_t row_bytes);

/* A prefix of rows [0, rows) (a multiple of hkv_kv_prefix_page_rows) of the
 * n_runs runs of each of the n_bufs buffers bufs[] (run stride `stride`
 * rows), copied into shared pages; its bytes go to mem's FAR tier. No
 * sequence is mapped yet (hkv_kv_prefix_map; a prefix never mapped is freed
 * by hkv_kv_prefix_drop). id names it for as long as it lives and never
 * another one after it (the cache's own counter): a device's mirror of the
 * prefix is keyed by it. */
int hkv_kv_prefix_create(hkv_kv_prefix **out, void *const *bufs, int n_bufs, int n_runs,
                         int64_t stride, int64_t rows, size_t row_bytes, uint64_t id,
                         hkv_mem_account *mem, hkv_err *err);
/* Map rows [0, rows) (rows <= the prefix's, a page multiple) of every run of
 * bufs over the sequence's own pages there, which are released (their bytes
 * leave mem's FAR tier, where they were accounted with the buffer). On
 * failure nothing is mapped and the buffer holds what it held. */
int hkv_kv_prefix_map(hkv_kv_prefix *p, void *const *bufs, int64_t stride, int64_t rows,
                      hkv_err *err);
/* Undo a map of `rows` rows: with keep, the sequence gets private pages
 * holding the same rows (before a write below them); without, the pages
 * are left to the buffer's own release. The prefix is freed with its last
 * mapping. */
int hkv_kv_prefix_unmap(hkv_kv_prefix *p, void *const *bufs, int64_t stride, int64_t rows, int keep,
                        hkv_err *err);
/* Free a prefix no sequence maps (after a failed first map). */
void hkv_kv_prefix_drop(hkv_kv_prefix *p);

/* Rows of run `run` of buffer `buf` in the prefix's own mapping (row p at
 * + p * row_bytes), for reads that group the sequences on it. */
const void *hkv_kv_prefix_run(const hkv_kv_prefix *p, int buf, int run);
int64_t hkv_kv_prefix_rows(const hkv_kv_prefix *p);
uint64_t hkv_kv_prefix_id(const hkv_kv_prefix *p);
/* Sequences mapping it; bytes it holds. */
int hkv_kv_prefix_refs(const hkv_kv_prefix *p);
size_t hkv_kv_prefix_bytes(const hkv_kv_prefix *p);

#endif

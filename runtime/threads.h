/* CPU threads: the hwloc topology, and OpenMP workers pinned one per core so
 * the memory-bound kernels keep their caches and NUMA locality. */
#ifndef HKV_THREADS_H
#define HKV_THREADS_H

#include "numa_map.h"
#include "status.h"

typedef struct hkv_threads hkv_threads;

typedef struct hkv_topo_info {
    int n_cores;          /* physical cores */
    int n_pus;            /* hardware threads */
    int n_numa;           /* NUMA nodes */
    int n_packages;
    char cpu_model[128];
    unsigned long long mem_total;   /* bytes, from hwloc */
    unsigned long long llc_bytes;   /* the last-level caches together (L3, else L2); 0: unknown */
} hkv_topo_info;

/* Load the topology, set the OpenMP thread count (0: one per core) and bind
 * worker i to core i. */
int hkv_threads_init(hkv_threads **out, int n_threads, hkv_err *err);
void hkv_threads_free(hkv_threads *t);
int hkv_threads_count(const hkv_threads *t);
/* 1 when every worker was bound to its own core. */
int hkv_threads_pinned(const hkv_threads *t);
/* The NUMA node of each worker (base/numa_map.h); n = 1 on one node. */
const hkv_numa_map *hkv_threads_numa(const hkv_threads *t);

/* Topology facts without pinning anything. */
int hkv_topo_query(hkv_topo_info *info, hkv_err *err);

#endif

/* Where the host's workers and the sequences' far tiers sit on a host with
 * several NUMA nodes (issue 35, part 3): the far tier of sequence slot s
 * is placed on one node, and a decode step's far work for it is claimed
 * first by that node's workers, so each node's threads read rows from
 * their own memory controller. On one node (every machine CI runs on) the
 * map has n <= 1 and nothing changes. The placement and the claim order
 * are plain functions, so a map of two nodes made up on one node tests
 * them (tests/kv/test_kv_numa.c). */
#ifndef HKV_NUMA_MAP_H
#define HKV_NUMA_MAP_H

#define HKV_NUMA_MAX_NODES 16

typedef struct hkv_numa_map {
    int n;                          /* nodes that have workers (<= 1: nothing to place) */
    int phys[HKV_NUMA_MAX_NODES];   /* each one's OS node id, for binding memory */
    int n_workers;
    const int *worker;              /* [n_workers]: the node (index < n) of OpenMP worker i */
} hkv_numa_map;

/* 1 when the map has more than one node to spread over. */
static inline int hkv_numa_spread(const hkv_numa_map *m) { return m && m->n > 1 && m->worker; }

/* The node (index < m->n) of sequence slot seq's far tier: slots in turn,
 * so that the sequences of a batch, admitted into the lowest free slots,
 * split evenly. */
int hkv_numa_seq_node(const hkv_numa_map *m, int seq);
/* The node of OpenMP worker tid (0 outside the map). */
int hkv_numa_worker_node(const hkv_numa_map *m, int tid);

/* Work items grouped by node: items [next[k], hi[k]) belong to node k,
 * next[k] (starting at the node's first item) being its shared cursor. A worker of node `node`
 * takes its node's next item, and when those are gone the next item of
 * node + 1, node + 2, ... (atomically: workers of every node call it at
 * once). Returns the item, or -1 when none is left. */
int hkv_numa_claim(const int *hi, int *next, int n, int node);

#endif

/* NUMA placement and node-affine claiming (numa_map.h). */
#include "numa_map.h"

int hkv_numa_seq_node(const hkv_numa_map *m, int seq) {
    return hkv_numa_spread(m) && seq >= 0 ? seq % m->n : 0;
}

int hkv_numa_worker_node(const hkv_numa_map *m, int tid) {
    if (!hkv_numa_spread(m) || tid < 0 || tid >= m->n_workers) return 0;
    const int k = m->worker[tid];
    return k >= 0 && k < m->n ? k : 0;
}

int hkv_numa_claim(const int *hi, int *next, int n, int node) {
    for (int j = 0; j < n; j++) {
        const int k = (node + j) % n;
        if (__atomic_load_n(&next[k], __ATOMIC_RELAXED) >= hi[k]) continue;   /* drained */
        const int w = __atomic_fetch_add(&next[k], 1, __ATOMIC_RELAXED);
        if (w < hi[k]) return w;
    }
    return -1;
}

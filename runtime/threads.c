#include "threads.h"

#include <hwloc.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct hkv_threads {
    hwloc_topology_t topo;
    int n;
    int pinned;
    hkv_numa_map numa;
    int *worker_node;   /* numa.worker */
};

/* The NUMA node of each worker's core (worker i on core i mod cores), as
 * node indices in the order first met, with their OS ids; one node when
 * hwloc sees one or the cores carry no node set. */
static void numa_map_make(hkv_threads *t, int n_cores) {
    hkv_numa_map *m = &t->numa;
    m->n = 1;
    m->phys[0] = 0;
    m->n_workers = t->n;
    m->worker = t->worker_node;
    if (hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_NUMANODE) < 2) return;
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        hwloc_obj_t core = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_CORE, i % n_cores);
        const int os = core && core->nodeset ? hwloc_bitmap_first(core->nodeset) : -1;
        int k = 0;
        while (k < n && m->phys[k] != os) k++;
        if (k == n && n < HKV_NUMA_MAX_NODES) m->phys[n++] = os;
        t->worker_node[i] = k < n ? k : 0;
    }
    for (int k = 0; k < n; k++)
        if (m->phys[k] < 0) n = 0;   /* a core without a node: place nothing */
    m->n = n > 0 ? n : 1;
}

static int topo_load(hwloc_topology_t *topo, hkv_err *err) {
    if (hwloc_topology_init(topo) != 0)
        return hkv_seterr(err, HKV_E_INTERNAL, "hwloc: cannot initialise the topology");
    if (hwloc_topology_load(*topo) != 0) {
        hwloc_topology_destroy(*topo);
        return hkv_seterr(err, HKV_E_INTERNAL, "hwloc: cannot load the topology");
    }
    return HKV_OK;
}

int hkv_topo_query(hkv_topo_info *info, hkv_err *err) {
    memset(info, 0, sizeof *info);
    hwloc_topology_t topo;
    int rc = topo_load(&topo, err);
    if (rc) return rc;
    info->n_cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    info->n_pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    info->n_numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    info->n_packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    if (info->n_numa < 1) info->n_numa = 1;
    hwloc_obj_t pkg = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
    const char *model = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
    snprintf(info->cpu_model, sizeof info->cpu_model, "%s", model ? model : "unknown");
    hwloc_obj_t root = hwloc_get_root_obj(topo);
    info->mem_total = root ? (unsigned long long)root->total_memory : 0;
    static const hwloc_obj_type_t levels[] = {HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L2CACHE};
    for (int lv = 0; lv < 2 && !info->llc_bytes; lv++) {
        const int n = hwloc_get_nbobjs_by_type(topo, levels[lv]);
        for (int i = 0; i < n; i++) {
            hwloc_obj_t c = hwloc_get_obj_by_type(topo, levels[lv], (unsigned)i);
            if (c && c->attr) info->llc_bytes += (unsigned long long)c->attr->cache.size;
        }
    }
    hwloc_topology_destroy(topo);
    return HKV_OK;
}

int hkv_threads_init(hkv_threads **out, int n_threads, hkv_err *err) {
    *out = NULL;
    hkv_threads *t = calloc(1, sizeof *t);
    if (!t) return hkv_seterr(err, HKV_E_NOMEM, "no memory for the thread context");
    int rc = topo_load(&t->topo, err);
    if (rc) {
        free(t);
        return rc;
    }
    int n_cores = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_CORE);
    if (n_cores < 1) n_cores = 1;
    if (n_threads < 0 || n_threads > 4096) {
        hkv_threads_free(t);
        return hkv_seterr(err, HKV_E_RANGE, "thread count %d is out of range (0..4096)", n_threads);
    }
    t->n = n_threads ? n_threads : n_cores;
    omp_set_num_threads(t->n);
    /* Bind worker i to core i (round robin when oversubscribed); record
     * whether every bind succeeded so `info`/`bench` can say so. */
    int ok = 1;
    hwloc_topology_t topo = t->topo;
#pragma omp parallel num_threads(t->n) reduction(&& : ok)
    {
        int i = omp_get_thread_num();
        hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, i % n_cores);
        if (!core || hwloc_set_cpubind(topo, core->cpuset, HWLOC_CPUBIND_THREAD) != 0) ok = 0;
    }
    t->pinned = ok && t->n <= n_cores;
    if (!(t->worker_node = calloc((size_t)t->n, sizeof *t->worker_node))) {
        hkv_threads_free(t);
        return hkv_seterr(err, HKV_E_NOMEM, "no memory for the thread context");
    }
    numa_map_make(t, n_cores);
    *out = t;
    return HKV_OK;
}

void hkv_threads_free(hkv_threads *t) {
    if (!t) return;
    hwloc_topology_destroy(t->topo);
    free(t->worker_node);
    free(t);
}

int hkv_threads_count(const hkv_threads *t) { return t ? t->n : 0; }
int hkv_threads_pinned(const hkv_threads *t) { return t ? t->pinned : 0; }
const hkv_numa_map *hkv_threads_numa(const hkv_threads *t) { return t ? &t->numa : NULL; }

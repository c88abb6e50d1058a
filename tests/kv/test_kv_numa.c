/* The far tier spread over NUMA nodes (base/numa_map.h, --far-numa spread)
 * with a map of two nodes made up on this machine's one:
 *   - the placement (slots in turn) and the claim order (a node's own
 *     items first, then the others' in turn) as plain functions;
 *   - claims from many threads at once take every item exactly once;
 *   - the tiered cache with the map decodes a batch bit for bit as without
 *     it (which thread attends an item never changes its result), under
 *     full, quest and ctkvr. The binding itself (mbind) is tests/plan's
 *     test_far_pin; the map's node ids here are -1, nothing bound. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kv_far.h"
#include "kv_test.h"
#include "kv_tiered.h"
#include "numa_map.h"


enum { L = 2, H = 6, KH = 2, D = 64, N_PROMPT = 600, CHUNK = 256, B = 5, STEPS = 12, CTX = 700 };
enum { LD = (H + 2 * KH) * D };


static void pure_functions(void) {
    static const int workers[4] = {0, 1, 0, 1};
    hkv_numa_map m = {.n = 2, .phys = {-1, -1}, .n_workers = 4, .worker = workers};
    CHECK(hkv_numa_spread(&m) && hkv_numa_seq_node(&m, 0) == 0 && hkv_numa_seq_node(&m, 1) == 1 &&
              hkv_numa_seq_node(&m, 4) == 0 && hkv_numa_worker_node(&m, 3) == 1 &&
              hkv_numa_worker_node(&m, 9) == 0,
          "placement");
    hkv_numa_map one = {.n = 1, .worker = workers, .n_workers = 4};
    CHECK(!hkv_numa_spread(&one) && hkv_numa_seq_node(&one, 3) == 0, "one node: nothing placed");
    /* node 0 owns items 0..2, node 1 items 3..4 */
    int hi[2] = {3, 5}, next[2] = {0, 3}, got[8], n = 0;
    for (int w; (w = hkv_numa_claim(hi, next, 2, 1)) >= 0 && n < 8;) got[n++] = w;
    CHECK(n == 5 && got[0] == 3 && got[1] == 4 && got[2] == 0 && got[4] == 2,
          "node 1 claims its own first: %d items, %d %d %d", n, got[0], got[1], got[2]);
    /* four nodes, many threads: every item once */
    enum { NN = 4, PER = 2000 };
    int hi4[NN], next4[NN];
    for (int k = 0; k < NN; k++) next4[k] = k * PER, hi4[k] = (k + 1) * PER;
    int *seen = calloc(NN * PER, sizeof *seen);
#pragma omp parallel num_threads(8)
    {
        const int node = omp_get_thread_num() % NN;
        for (int w; (w = hkv_numa_claim(hi4, next4, NN, node)) >= 0;) __atomic_fetch_add(&seen[w], 1, __ATOMIC_RELAXED);
    }
    int once = 1;
    for (int i = 0; i < NN * PER; i++) once &= seen[i] == 1;
    CHECK(once, "claims from 8 threads: an item taken twice or never");
    free(seen);
}

/* B sequences, each its own prompt, then STEPS decode steps of all of them;
 * every decode output into out. */
static void drive(const hkv_policy_def *pol, const hkv_numa_map *map, float *out,
                  const hkv_cpu_kernels *kern) {
    hkv_tiered_params p;
    test_params(&p, pol, "budget=96");
    p.numa = map;
    p.far_numa = map ? HKV_FAR_NUMA_SPREAD : HKV_FAR_NUMA_AUTO;
    hkv_kv_shape sh = {L, H, KH, D};
    hkv_mem_account mem = {0};
    hkv_kv kv;
    hkv_err err;
    CHECK(hkv_kv_tiered_create(&kv, &sh, B, &p, kern, &mem, &err) == HKV_OK, "create: %s", err.msg);
    float *qkv = malloc((size_t)CHUNK * LD * sizeof(float)), *o = malloc((size_t)CHUNK * H * D * 4);
    for (int s = 0; s < B; s++) {
        CHECK(kv.ops->seq_open(kv.self, s, CTX, &err) == HKV_OK, "open: %s", err.msg);
        feed_prompt(&kv, s, N_PROMPT, CHUNK, L, LD, H * D, (uint64_t)s, qkv, o);
    }
    hkv_seg segs[B];
    size_t at = 0;
    for (int t = 0; t < STEPS; t++) {
        for (int s = 0; s < B; s++) segs[s] = (hkv_seg){.seq = s, .n = 1, .pos = N_PROMPT + t, .row = s};
        for (int l = 0; l < L; l++) {
            fill(qkv, (int64_t)B * LD, 5000 + (uint64_t)(t * L + l));
            CHECK(kv.ops->layer_step(kv.self, l, segs, B, qkv, LD, out + at, H * D, &err) == HKV_OK,
                  "decode: %s", err.msg);
            at += (size_t)B * H * D;
        }
    }
    kv.ops->destroy(kv.self);
    free(qkv);
    free(o);
}

int main(void) {
    hkv_cpu_kernels kern;
    hkv_isa_info info;
    hkv_isa_detect(&info);
    hkv_cpu_kernels_init(&kern, info.best);
    pure_functions();
    omp_set_num_threads(4);
    static const int workers[4] = {0, 1, 1, 0};
    const hkv_numa_map two = {.n = 2, .phys = {-1, -1}, .n_workers = 4, .worker = workers};
    const hkv_policy_def *pols[] = {&hkv_policy_full, &hkv_policy_quest, &hkv_policy_ctkvr};
    const size_t n_out = (size_t)STEPS * L * B * H * D;
    float *a = malloc(n_out * sizeof *a), *b = malloc(n_out * sizeof *b);
    for (int i = 0; i < 3; i++) {
        drive(pols[i], NULL, a, &kern);
        drive(pols[i], &two, b, &kern);
        CHECK(!memcmp(a, b, n_out * sizeof *a), "%s: outputs differ with the far tier spread over "
              "two nodes", pols[i]->name);
    }
    free(a);
    free(b);
    if (fails) printf("%d failures\n", fails);
    else printf("ok\n");
    return fails ? 1 : 0;
}

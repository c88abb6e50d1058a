/* The tiered cache's far tier through hkv_pinned_alloc (pin_far): FAR is
 * accounted the same with and without it (the near tier only with it: full on
 * the host path keeps none), the page-locked counter says 0
 * without a CUDA device (and the far bytes with one), close returns every
 * byte, and a prompt + decode through a pin_far cache gives bit-identical
 * outputs to the ordinary one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kv_prefix.h"
#include "kv_tiered.h"
#include "pinned.h"

#include "../check.h"

enum { L = 3, H = 4, KH = 2, D = 16, N_PROMPT = 300, N_DEC = 20, CTX = 400 };

/* Prompt then decode steps through one cache; outputs of every layer and row
 * into out ([steps][L][rows][H D]). Returns the FAR bytes while open. */
static size_t drive(int pin_far, const hkv_cpu_kernels *kern, float *out, hkv_pinned_account *pin,
                    hkv_mem_account *mem) {
    hkv_tiered_params p;
    hkv_tiered_params_default(&p);
    p.L_init = 4;
    p.L_local = 32;
    p.policy = &hkv_policy_full;
    hkv_policy_args_init(p.policy, &p.args);
    p.pin_far = pin_far;
    p.pin_numa_node = -1;
    hkv_kv_shape sh = {L, H, KH, D};
    hkv_kv kv;
    hkv_err err;
    memset(mem, 0, sizeof *mem);
    CHECK(hkv_kv_tiered_create(&kv, &sh, 2, &p, kern, mem, &err) == HKV_OK, "create: %s", err.msg);
    CHECK(kv.ops->seq_open(kv.self, 0, CTX, &err) == HKV_OK, "open: %s", err.msg);
    const size_t far = mem->bytes[HKV_TIER_FAR];
    hkv_kv_tiered_pinned(&kv, pin);
    const int64_t ld = (H + 2 * KH) * D;
    float *qkv = malloc((size_t)N_PROMPT * ld * sizeof(float));
    uint64_t s = 12345;
    size_t o = 0;
    for (int step = 0; step <= N_DEC; step++) {
        const int n = step ? 1 : N_PROMPT;
        for (int64_t i = 0; i < (int64_t)n * ld; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            qkv[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
        }
        hkv_seg sg = {.seq = 0, .n = n, .pos = step ? N_PROMPT + step - 1 : 0, .row = 0,
                      .flags = step ? 0 : HKV_SEG_PROMPT | HKV_SEG_PROMPT_END};
        for (int l = 0; l < L; l++) {
            CHECK(kv.ops->layer_step(kv.self, l, &sg, 1, qkv, ld, out + o, H * D, &err) == HKV_OK,
                  "step %d layer %d: %s", step, l, err.msg);
            o += (size_t)n * H * D;
        }
    }
    free(qkv);
    kv.ops->seq_close(kv.self, 0);
    hkv_pinned_account after;
    hkv_kv_tiered_pinned(&kv, &after);
    CHECK(mem->bytes[HKV_TIER_FAR] == 0 && after.bytes == 0, "close returns the far tier "
          "(FAR %zu, pinned %zu)", mem->bytes[HKV_TIER_FAR], after.bytes);
    kv.ops->destroy(kv.self);
    return far;
}

int main(void) {
    hkv_cpu_kernels kern;
    hkv_cpu_kernels_init(&kern, HKV_ISA_SCALAR);
    /* Is there a device that can page-lock? (test_pinned covers that path.) */
    hkv_pinned probe;
    hkv_err err;
    const int device = hkv_pinned_alloc(&probe, NULL, NULL, HKV_TIER_FAR, 4096, -1,
                                        HKV_PIN_REQUIRE, &err) == HKV_OK;
    if (device) hkv_pinned_free(&probe, NULL, NULL);
    printf("CUDA page-locking %s\n", device ? "available" : "not available (pinned counter stays 0)");

    const size_t n_out = ((size_t)N_PROMPT + N_DEC) * L * H * D;
    float *a = calloc(n_out, sizeof(float)), *b = calloc(n_out, sizeof(float));
    hkv_pinned_account pa, pb;
    hkv_mem_account ma, mb;
    const size_t far_a = drive(0, &kern, a, &pa, &ma);
    const size_t far_b = drive(1, &kern, b, &pb, &mb);
    /* K and V, fp16, whole context: the runs' stride rounded to whole pages (kv_prefix.h) */
    const size_t want = 2ULL * L * KH * (size_t)hkv_kv_prefix_stride(CTX, D * 2) * D * 2;
    CHECK(far_a == want && far_b == want, "FAR %zu and %zu, want %zu", far_a, far_b, want);
    CHECK(pa.bytes == 0 && pa.n_allocs == 0, "pin_far=0: nothing page-locked (%zu)", pa.bytes);
    CHECK(pb.bytes == (device ? want : 0), "pin_far=1: page-locked %zu, want %zu", pb.bytes,
          device ? want : (size_t)0);
    CHECK(pb.peak == pb.bytes, "peak %zu", pb.peak);
    /* full on the host path keeps no near tier (it reads every row in place); with a
     * device to mirror it, it does */
    for (int t = 0; t < HKV_TIER_COUNT; t++)
        CHECK(t == HKV_TIER_NEAR || ma.peak[t] == mb.peak[t], "tier %d peak %zu vs %zu", t,
              ma.peak[t], mb.peak[t]);
    CHECK(ma.peak[HKV_TIER_NEAR] == 0 && mb.peak[HKV_TIER_NEAR] > 0, "near tier peaks %zu and %zu",
          ma.peak[HKV_TIER_NEAR], mb.peak[HKV_TIER_NEAR]);
    size_t diff = 0;
    for (size_t i = 0; i < n_out; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    CHECK(diff == 0, "%zu outputs differ between pin_far=0 and 1", diff);
    double mag = 0;
    for (size_t i = 0; i < n_out; i++) mag += fabs(a[i]);
    CHECK(mag > 1, "outputs are not all zero (%g)", mag);
    free(a);
    free(b);
    printf("test_far_pin: %s (%d failures)\n", fails ? "FAIL" : "ok", fails);
    return fails ? 1 : 0;
}

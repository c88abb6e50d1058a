/* A prompt shared by reference (seq_share, kv/kv_prefix.h) against the same
 * prompt copied (seq_copy), through the tiered cache:
 *   - every decode output is bit-identical, under full (whose shared pieces
 *     go through the cascade) and under quest and ctkvr (which read the
 *     shared rows in place; ctkvr's forks hold the prompt's index by
 *     reference, with own rows for the slots DCU rewrites, against an index
 *     built for each copy), in a batch that mixes shared and unshared
 *     sequences, and in a batch of one (the split step); under full also on
 *     16 threads (the batch split by pieces), as on 2;
 *   - the far tier holds the shared rows once (the FAR account), the
 *     cascade reads them once a step (the bytes-read counter), and every
 *     byte is returned when the last sequence closes;
 *   - a rewind below the shared rows gives the sequence its own copy and
 *     leaves the others as they were;
 *   - a sequence under full on the host path keeps no near tier; switched
 *     to quest after its prompt, it decodes as one that was quest all along;
 *   - a fork of a fork (ctkvr, after a second turn) decodes as its source;
 *   - a ctkvr fork's device table (recall_table, what the pipeline mirrors)
 *     is slot for slot the centroids its select reads, through its DCU
 *     rewrites, asked after every step (dirty slots) and at a version move;
 *   - kept queries shared copy-on-write (kv_cow.h): one memfd read by two
 *     buffers, each write its own, counted once;
 *   - the plain cache's seq_share: the same outputs as copies, the prompt
 *     held once, a rewind below it and a new continuation as with copies. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctkvr_impl.h"
#include "kernels.h"
#include "kv_cow.h"
#include "kv_far.h"
#include "kv_prefix.h"
#include "kv_test.h"
#include "kv_tiered.h"
#include "pinned.h"


/* d 64: 32 rows a page; a 1100-token prompt shares 1088 rows, two whole
 * 512-row pieces of full's cascade */
enum { L = 2, H = 6, KH = 2, D = 64, N_PROMPT = 1100, CHUNK = 256, B = 6, CTX = 1300 };
enum { LD = (H + 2 * KH) * D };


typedef struct run {
    hkv_kv kv;
    hkv_mem_account mem;
    float *out;   /* every decode output, in order */
    size_t n_out;
    uint64_t bytes;
    size_t index;   /* INDEX bytes with every fork made */
} run;

static void step(run *r, const hkv_seg *segs, int n, uint64_t seed) {
    float qkv[(B + 2) * LD], out[(B + 2) * H * D];
    hkv_err err;
    for (int l = 0; l < L; l++) {
        fill(qkv, (int64_t)n * LD, seed * 31 + (uint64_t)l);
        int rc = r->kv.ops->layer_step(r->kv.self, l, segs, n, qkv, LD, out, H * D, &err);
        CHECK(rc == HKV_OK, "decode step: %s", err.msg);
        memcpy(r->out + r->n_out, out, (size_t)n * H * D * sizeof(float));
        r->n_out += (size_t)n * H * D;
    }
}

/* Prompt into sequence 0 (and a different one into B + 1), B sequences from
 * it by share or copy, decode batches; returns the FAR bytes with all open. */
/* ctkvr: seq's recall_table for every layer equals, slot by slot and KV
 * head by KV head, the centroids select reads (hkv_ctkvr_cent). */
static void check_device_table(run *r, int seq) {
    const hkv_policy_def *def;
    hkv_policy pol;
    hkv_err err;
    if (hkv_kv_seq_instance(&r->kv, seq, &def, &pol, &err) || def != &hkv_policy_ctkvr) return;
    ctkvr *s = pol.self;
    for (int l = 0; l < L; l++) {
        hkv_recall_table t;
        int32_t fifo[2 * KH], dirty[KH];
        CHECK((!pol.ops->device_takes || pol.ops->device_takes(pol.self, l) == HKV_FALLBACK_NONE) &&
                  pol.ops->recall_table(pol.self, l, &t, fifo, dirty) == HKV_OK,
              "ctkvr: sequence %d's recall table, layer %d", seq, l);
        long bad = 0;
        for (int h = 0; h < KH; h++)
            for (int64_t sl = 0; sl < t.C; sl++)
                bad += memcmp(t.rows + ((size_t)sl * H + (size_t)h * s->g) * D,
                              hkv_ctkvr_cent(s, l, h, sl), (size_t)s->g * D * 2) != 0;
        CHECK(bad == 0, "ctkvr: sequence %d, layer %d: %ld device table slots unlike select's", seq,
              l, bad);
    }
}

static size_t drive(run *r, const hkv_policy_def *pol, int share, const hkv_cpu_kernels *kern) {
    hkv_tiered_params p;
    test_params(&p, pol, "budget=128");
    hkv_kv_shape sh = {L, H, KH, D};
    hkv_err err;
    memset(&r->mem, 0, sizeof r->mem);
    CHECK(hkv_kv_tiered_create(&r->kv, &sh, B + 2, &p, kern, &r->mem, &err) == HKV_OK, "create: %s",
          err.msg);
    const hkv_kv_ops *ops = r->kv.ops;
    float *qkv = malloc((size_t)CHUNK * LD * sizeof(float)), *out = malloc((size_t)CHUNK * H * D * 4);
    for (int s = 0; s < B + 2; s++)
        CHECK(ops->seq_open(r->kv.self, s, CTX, &err) == HKV_OK, "open %d: %s", s, err.msg);
    for (int which = 0; which < 2; which++)
        feed_prompt(&r->kv, which ? B + 1 : 0, N_PROMPT, CHUNK, L, LD, H * D, (uint64_t)which, qkv, out);
    /* copied: each fork's index built again from its rows (set_policy), which
     * the shared prompt's forks take by reference where the policy can */
    for (int s = 1; s <= B; s++)
        CHECK((share ? ops->seq_share(r->kv.self, s, 0, N_PROMPT, HKV_SHARE_INDEX, &err)
                     : ops->seq_copy(r->kv.self, s, 0, &err) ||
                           hkv_kv_set_policy(&r->kv, s, pol, &p.args, &err)) == HKV_OK,
              "fork %d: %s", s, err.msg);
    const size_t far = r->mem.bytes[HKV_TIER_FAR];
    r->index = r->mem.bytes[HKV_TIER_INDEX];
    const uint64_t b0 = hkv_kv_tiered_bytes_read(&r->kv);
    /* B forks and the unshared sequence side by side, 24 steps */
    hkv_seg segs[B + 2];
    check_device_table(r, 1);   /* (its mirror made here, brought up to date below) */
    for (int t = 0; t < 24; t++) {
        for (int i = 0; i < B + 1; i++)
            segs[i] = (hkv_seg){.seq = i + 1, .n = 1, .pos = N_PROMPT + t, .row = i};
        step(r, segs, B + 1, (uint64_t)t + 1);
        if (t % 3 == 0) check_device_table(r, 1);   /* dirty slots, or the version moved */
    }
    r->bytes = hkv_kv_tiered_bytes_read(&r->kv) - b0;
    /* one fork alone (the split step), then a rewind below the shared rows
     * and a different continuation, then the batch again */
    for (int t = 0; t < 4; t++) {
        segs[0] = (hkv_seg){.seq = 2, .n = 1, .pos = N_PROMPT + 24 + t, .row = 0};
        step(r, segs, 1, 100 + (uint64_t)t);
    }
    CHECK(ops->seq_rewind(r->kv.self, 3, 700, &err) == HKV_OK, "rewind: %s", err.msg);
    for (int t = 0; t < 4; t++) {
        segs[0] = (hkv_seg){.seq = 3, .n = 1, .pos = 700 + t, .row = 0};
        segs[1] = (hkv_seg){.seq = 4, .n = 1, .pos = N_PROMPT + 24 + t, .row = 1};
        step(r, segs, 2, 200 + (uint64_t)t);
    }
    free(qkv);
    free(out);
    return far;
}

/* Two sequences over one prompt, one opened under full (no near tier) and
 * switched to quest after it, one under quest throughout: the same decode. */
static void switch_policy(const hkv_cpu_kernels *kern) {
    hkv_tiered_params p;
    test_params(&p, NULL, NULL);
    hkv_kv_shape sh = {L, H, KH, D};
    hkv_mem_account mem = {0};
    hkv_kv kv;
    hkv_err err;
    CHECK(hkv_kv_tiered_create(&kv, &sh, 2, &p, kern, &mem, &err) == HKV_OK, "create: %s", err.msg);
    hkv_policy_args qa;
    hkv_policy_args_init(&hkv_policy_quest, &qa);
    hkv_policy_arg_set(&hkv_policy_quest, &qa, "budget=128", NULL);
    CHECK(hkv_kv_set_policy(&kv, 1, &hkv_policy_quest, &qa, &err) == HKV_OK, "quest: %s", err.msg);
    for (int s = 0; s < 2; s++)
        CHECK(kv.ops->seq_open(kv.self, s, CTX, &err) == HKV_OK, "open: %s", err.msg);
    CHECK(mem.bytes[HKV_TIER_NEAR] == (size_t)L * KH * (4 + 64) * D * 2 * 2,
          "near tier of the quest sequence only: %zu bytes", mem.bytes[HKV_TIER_NEAR]);
    float *qkv = malloc((size_t)CHUNK * LD * sizeof(float)), *out = malloc((size_t)CHUNK * H * D * 4);
    float o[2][L][H * D];
    for (int s = 0; s < 2; s++) feed_prompt(&kv, s, N_PROMPT, CHUNK, L, LD, H * D, 0, qkv, out);
    CHECK(hkv_kv_set_policy(&kv, 0, &hkv_policy_quest, &qa, &err) == HKV_OK, "switch: %s", err.msg);
    int same = 1;
    for (int t = 0; t < 80; t++)
        for (int s = 0; s < 2; s++) {
            hkv_seg sg = {.seq = s, .n = 1, .pos = N_PROMPT + t, .row = 0};
            for (int l = 0; l < L; l++) {
                fill(qkv, LD, 5000 + (uint64_t)(t * L + l));
                CHECK(kv.ops->layer_step(kv.self, l, &sg, 1, qkv, LD, o[s][l], H * D, &err) == HKV_OK,
                      "decode: %s", err.msg);
            }
            if (s == 1) same &= !memcmp(o[0], o[1], sizeof o[0]);
        }
    CHECK(same, "full switched to quest decodes unlike quest throughout");
    kv.ops->destroy(kv.self);
    free(qkv);
    free(out);
}

/* A fork of a fork (ctkvr): sequence 1 starts from 0's prompt, takes a
 * second prompt turn (its rest's centroids become own rows, more than one
 * block of them), and 2 starts from 1 there. 2 then decodes as 1 does,
 * bit for bit: it holds 1's index, the shared store and copies of 1's own
 * rows. */
static void fork_of_fork(const hkv_cpu_kernels *kern) {
    hkv_tiered_params p;
    test_params(&p, &hkv_policy_ctkvr, NULL);
    hkv_kv_shape sh = {L, H, KH, D};
    hkv_mem_account mem = {0};
    hkv_kv kv;
    hkv_err err;
    CHECK(hkv_kv_tiered_create(&kv, &sh, 3, &p, kern, &mem, &err) == HKV_OK, "create: %s", err.msg);
    float *qkv = malloc((size_t)CHUNK * LD * sizeof(float)), *out = malloc((size_t)CHUNK * H * D * 4);
    for (int s = 0; s < 3; s++)
        CHECK(kv.ops->seq_open(kv.self, s, CTX, &err) == HKV_OK, "open: %s", err.msg);
    feed_prompt(&kv, 0, N_PROMPT, CHUNK, L, LD, H * D, 7, qkv, out);
    CHECK(kv.ops->seq_share(kv.self, 1, 0, N_PROMPT, HKV_SHARE_INDEX, &err) == HKV_OK, "share: %s",
          err.msg);
    enum { TURN = 60 };   /* the second turn: 60 new centroids a KV head, own rows */
    hkv_seg sg = {.seq = 1, .n = TURN, .pos = N_PROMPT, .row = 0,
                  .flags = HKV_SEG_PROMPT | HKV_SEG_PROMPT_END};
    for (int l = 0; l < L; l++) {
        fill(qkv, (int64_t)TURN * LD, 900 + (uint64_t)l);
        CHECK(kv.ops->layer_step(kv.self, l, &sg, 1, qkv, LD, out, H * D, &err) == HKV_OK,
              "second turn: %s", err.msg);
    }
    CHECK(kv.ops->seq_share(kv.self, 2, 1, N_PROMPT + TURN, HKV_SHARE_INDEX, &err) == HKV_OK,
          "share of a fork: %s", err.msg);
    int same = 1;
    float o[2][H * D];
    for (int t = 0; t < 16; t++)
        for (int l = 0; l < L; l++) {
            fill(qkv, LD, 7000 + (uint64_t)(t * L + l));
            for (int s = 1; s <= 2; s++) {
                hkv_seg d = {.seq = s, .n = 1, .pos = N_PROMPT + TURN + t, .row = 0};
                CHECK(kv.ops->layer_step(kv.self, l, &d, 1, qkv, LD, o[s - 1], H * D, &err) ==
                          HKV_OK, "decode: %s", err.msg);
            }
            same &= !memcmp(o[0], o[1], sizeof o[0]);
        }
    CHECK(same, "a fork of a fork decodes unlike its source");
    kv.ops->destroy(kv.self);
    CHECK(mem.bytes[HKV_TIER_INDEX] == 0, "index bytes left: %zu", mem.bytes[HKV_TIER_INDEX]);
    free(qkv);
    free(out);
}

/* kv_cow.h: two buffers on one memfd read the same bytes, and a write to
 * either is its own; the memfd's bytes count once and go with the last. */
static void cow_buffers(void) {
    const size_t bytes = 3 * 4096 + 100;
    hkv_mem_account mem = {0};
    hkv_pinned a, b;
    hkv_err err;
    CHECK(hkv_pinned_alloc(&a, NULL, NULL, HKV_TIER_INDEX, bytes, -1, HKV_PIN_MAPPED, &err) == HKV_OK &&
              hkv_pinned_alloc(&b, NULL, NULL, HKV_TIER_INDEX, bytes, -1, HKV_PIN_MAPPED, &err) == HKV_OK,
          "buffers: %s", err.msg);
    unsigned char *pa = a.p, *pb = b.p;
    for (size_t i = 0; i < bytes; i++) pa[i] = (unsigned char)(i * 7), pb[i] = 0;
    hkv_kv_cow *c;
    CHECK(hkv_kv_cow_create(&c, pa, bytes, &mem, HKV_TIER_INDEX, &err) == HKV_OK, "cow: %s", err.msg);
    CHECK(hkv_kv_cow_map(c, pb, &err) == HKV_OK, "cow map: %s", err.msg);
    int same = 1;
    for (size_t i = 0; i < bytes; i++) same &= pa[i] == (unsigned char)(i * 7) && pb[i] == pa[i];
    CHECK(same, "a copy-on-write buffer does not read the shared bytes");
    pb[5000] = 1;   /* each write its own */
    pa[9000] = 2;
    CHECK(pa[5000] == (unsigned char)(5000 * 7) && pb[9000] == (unsigned char)(9000 * 7) &&
              pb[5000] == 1 && pa[9000] == 2,
          "a write reached the other buffer");
    CHECK(mem.bytes[HKV_TIER_INDEX] == 4 * 4096, "the memfd counted %zu bytes", mem.bytes[HKV_TIER_INDEX]);
    hkv_kv_cow_release(c);
    CHECK(mem.bytes[HKV_TIER_INDEX] == 4 * 4096, "freed with a holder left");
    hkv_kv_cow_release(c);
    CHECK(mem.bytes[HKV_TIER_INDEX] == 0, "not freed with the last");
    CHECK(pb[100] == (unsigned char)(100 * 7), "a mapping lost its bytes when the memfd was closed");
    hkv_pinned_free(&a, NULL, NULL);
    hkv_pinned_free(&b, NULL, NULL);
}

/* The plain cache shares by reference too (kv_plain.c): 3 forks of a prompt
 * decode bit for bit as 3 copies, the far tier holds the shared rows once, a
 * fork rewound below them and fed a different continuation (a write into
 * rows that were the prefix's) matches the copy doing the same, and every
 * byte goes back at close. */
static void plain_cache(const hkv_cpu_kernels *kern) {
    enum { NF = 3 };
    hkv_kv_shape sh = {L, H, KH, D};
    float *qkv = malloc((size_t)CHUNK * LD * sizeof(float)), *out = malloc((size_t)CHUNK * H * D * 4);
    float *got[2];
    size_t n_got = 0, far[2];
    hkv_mem_account mem[2];
    memset(mem, 0, sizeof mem);
    for (int share = 0; share < 2; share++) {
        hkv_kv kv;
        hkv_err err;
        CHECK(hkv_kv_plain_create(&kv, &sh, NF + 1, kern, &mem[share], &err) == HKV_OK, "plain: %s",
              err.msg);
        const hkv_kv_ops *ops = kv.ops;
        for (int s = 0; s <= NF; s++)
            CHECK(ops->seq_open(kv.self, s, CTX, &err) == HKV_OK, "plain open %d: %s", s, err.msg);
        feed_prompt(&kv, 0, N_PROMPT, CHUNK, L, LD, H * D, 0, qkv, out);
        for (int s = 1; s <= NF; s++)
            CHECK((share ? ops->seq_share(kv.self, s, 0, N_PROMPT, 0, &err)
                         : ops->seq_copy(kv.self, s, 0, &err)) == HKV_OK, "plain fork %d: %s", s,
                  err.msg);
        far[share] = mem[share].bytes[HKV_TIER_FAR];
        got[share] = malloc((size_t)16 * (NF + 1) * L * H * D * sizeof(float));
        n_got = 0;
        hkv_seg segs[NF + 1];
        for (int t = 0; t < 12; t++) {
            const int rewound = t >= 6;   /* fork 2 from position 300 on, other tokens */
            if (t == 6)
                CHECK(ops->seq_rewind(kv.self, 2, 300, &err) == HKV_OK, "plain rewind: %s", err.msg);
            for (int i = 0; i <= NF; i++)
                segs[i] = (hkv_seg){.seq = i, .n = 1, .pos = N_PROMPT + t, .row = i};
            if (rewound) segs[2].pos = 300 + t - 6;
            for (int l = 0; l < L; l++) {
                fill(qkv, (int64_t)(NF + 1) * LD, (uint64_t)t * 31 + (uint64_t)l + 7);
                CHECK(ops->layer_step(kv.self, l, segs, NF + 1, qkv, LD, out, H * D, &err) == HKV_OK,
                      "plain step: %s", err.msg);
                memcpy(got[share] + n_got, out, (size_t)(NF + 1) * H * D * sizeof(float));
                n_got += (size_t)(NF + 1) * H * D;
            }
        }
        for (int s = 0; s <= NF; s++) ops->seq_close(kv.self, s);
        CHECK(mem[share].bytes[HKV_TIER_FAR] == 0, "plain: far bytes left after close: %zu",
              mem[share].bytes[HKV_TIER_FAR]);
        ops->destroy(kv.self);
    }
    CHECK(!memcmp(got[0], got[1], n_got * sizeof(float)),
          "plain: shared forks decode unlike copies");
    const size_t shared = (size_t)L * KH * 1088 * D * 2 * 2;
    CHECK(far[0] - far[1] == (size_t)NF * shared, "plain: far tier %zu copied, %zu shared (%zu less "
          "expected)", far[0], far[1], (size_t)NF * shared);
    free(got[0]);
    free(got[1]);
    free(qkv);
    free(out);
}

int main(void) {
    hkv_cpu_kernels kern;
    hkv_isa_info info;
    hkv_isa_detect(&info);
    hkv_cpu_kernels_init(&kern, info.best);
    const hkv_policy_def *pols[] = {&hkv_policy_full, &hkv_policy_quest, &hkv_policy_ctkvr,
                                    &hkv_policy_full};
    const size_t n_max = (size_t)(24 * (B + 1) + 4 + 8) * L * H * D;
    float *full2t = malloc(n_max * sizeof(float));   /* full's outputs on 2 threads */
    for (int i = 0; i < 4; i++) {
        /* full again on 16 threads: a batch of B + 1 rows x KH heads is then split by
         * pieces across them (kv_tiered_attn.c), the cascade's partial first */
        if (i == 3) omp_set_num_threads(16);
        run a = {.out = malloc(n_max * sizeof(float))}, b = {.out = malloc(n_max * sizeof(float))};
        const size_t far_copy = drive(&a, pols[i], 0, &kern);
        const size_t far_share = drive(&b, pols[i], 1, &kern);
        const char *name = pols[i]->name;
        size_t first = a.n_out;
        double worst = 0;
        for (size_t j = 0; j < a.n_out && j < b.n_out; j++)
            if (a.out[j] != b.out[j]) {
                if (first == a.n_out) first = j;
                double e = fabs(a.out[j] - b.out[j]);
                worst = e > worst ? e : worst;
            }
        CHECK(a.n_out == b.n_out && first == a.n_out,
              "%s: outputs differ between the shared and the copied prompt (first at %zu of %zu, "
              "largest difference %.3g)", name, first, a.n_out, worst);
        /* the forks' 1088 shared rows are held once, not B + 1 times */
        const size_t shared = (size_t)L * KH * 1088 * D * 2 * 2;
        CHECK(far_copy - far_share == (size_t)B * shared, "%s: far tier %zu copied, %zu shared "
              "(%zu less expected)", name, far_copy, far_share, (size_t)B * shared);
        if (i == 0) memcpy(full2t, b.out, b.n_out * sizeof(float));
        if (i == 3)
            CHECK(!memcmp(full2t, b.out, b.n_out * sizeof(float)) &&
                      !memcmp(full2t, a.out, a.n_out * sizeof(float)),
                  "full: outputs differ between 2 and 16 threads");
        if (pols[i] == &hkv_policy_ctkvr) {   /* the forks hold the prompt's index once */
            /* C = CTX / 16 centroids, rho = 2.5 rho' list entries: per layer the
             * centroids (fp16), lists, their lengths and DCU marks */
            const size_t C = CTX / 16, rho = 160;
            const size_t store = (size_t)L * (C * H * D * 2 + KH * C * rho * 4 + KH * C * 5);
            CHECK(a.index - b.index >= (size_t)B * store &&   /* (and each store's header) */
                      a.index - b.index <= (size_t)B * (store + 256), "ctkvr: index %zu bytes shared, %zu "
                  "built for each fork (%zu less expected)", b.index, a.index, (size_t)B * store);
        }
        if (pols[i] == &hkv_policy_full)   /* the cascade reads the shared pieces once a step */
            CHECK(b.bytes * 2 < a.bytes, "full: %llu bytes read shared, %llu copied",
                  (unsigned long long)b.bytes, (unsigned long long)a.bytes);
        printf("%s: far tier %.1f MiB copied, %.1f MiB shared; index %.2f / %.2f MiB; decode read "
               "%.1f / %.1f MB\n", name, far_copy / 1048576.0, far_share / 1048576.0,
               a.index / 1048576.0, b.index / 1048576.0, a.bytes / 1e6, b.bytes / 1e6);
        for (int s = 0; s < B + 2; s++) {
            a.kv.ops->seq_close(a.kv.self, s);
            b.kv.ops->seq_close(b.kv.self, s);
        }
        CHECK(b.mem.bytes[HKV_TIER_FAR] == 0 && a.mem.bytes[HKV_TIER_FAR] == 0,
              "%s: far bytes left after close: %zu shared, %zu copied", name,
              b.mem.bytes[HKV_TIER_FAR], a.mem.bytes[HKV_TIER_FAR]);
        a.kv.ops->destroy(a.kv.self);
        b.kv.ops->destroy(b.kv.self);
        CHECK(a.mem.bytes[HKV_TIER_INDEX] == 0 && b.mem.bytes[HKV_TIER_INDEX] == 0,
              "%s: index bytes left: %zu shared, %zu copied", name, b.mem.bytes[HKV_TIER_INDEX],
              a.mem.bytes[HKV_TIER_INDEX]);
        free(a.out);
        free(b.out);
    }
    free(full2t);
    omp_set_num_threads(2);
    switch_policy(&kern);
    fork_of_fork(&kern);
    cow_buffers();
    plain_cache(&kern);
    /* the page arithmetic */
    CHECK(hkv_kv_prefix_page_rows(128) == 32 && hkv_kv_prefix_page_rows(160) == 128,
          "page rows %lld %lld", (long long)hkv_kv_prefix_page_rows(128),
          (long long)hkv_kv_prefix_page_rows(160));
    CHECK(hkv_kv_prefix_stride(1000, 128) == 1024 && hkv_kv_prefix_stride(1024, 128) == 1024,
          "stride");
    if (fails) printf("%d failures\n", fails);
    else printf("ok\n");
    return fails ? 1 : 0;
}

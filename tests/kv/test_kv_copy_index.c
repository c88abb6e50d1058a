/* seq_copy takes ctkvr's index from its source instead of building it again
 * (index/policy.h, fork with copy), through the tiered cache:
 *   - a copy decodes bit for bit as a copy whose index was built from its
 *     rows (hkv_kv_set_policy after the copy), and holds its own store
 *     (nothing shared: each copy's index bytes counted);
 *   - a copy of a fork that took a second prompt turn (own rows over a
 *     shared store) holds one store with those rows in it, no own rows, and
 *     decodes as its source;
 *   - where the source's index cannot be taken (the source has decoded
 *     since its prompt ended; the copy's far tier is 8-bit and the
 *     source's fp16) the copy builds its own, and decodes as a built one;
 *   - with key sketches (sketch=3), a copy holds its source's sketches of
 *     every far row (not made again at its first step), byte for byte the
 *     sketches a build from its rows makes, and decodes as a built one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctkvr_impl.h"
#include "far_rows.h"
#include "kernels.h"
#include "kv_test.h"
#include "kv_tiered.h"

enum { L = 2, H = 6, KH = 2, D = 64, N_PROMPT = 1100, CHUNK = 256, CTX = 1400, N_SEQ = 9 };
enum { LD = (H + 2 * KH) * D };

static ctkvr *instance(hkv_kv *kv, int seq) {
    const hkv_policy_def *def;
    hkv_policy pol;
    hkv_err err;
    if (hkv_kv_seq_instance(kv, seq, &def, &pol, &err) || def != &hkv_policy_ctkvr) return NULL;
    return pol.self;
}

/* Sequences a and b decode `steps` tokens side by side from position pos
 * (each layer's rows the same for both): 1 if every output agrees bit for bit. */
static int same_decode(hkv_kv *kv, int a, int b, int64_t pos, int steps, uint64_t seed) {
    float qkv[LD], o[2][H * D];
    hkv_err err;
    int same = 1;
    for (int t = 0; t < steps; t++)
        for (int l = 0; l < L; l++) {
            fill(qkv, LD, seed + (uint64_t)(t * L + l));
            for (int i = 0; i < 2; i++) {
                hkv_seg sg = {.seq = i ? b : a, .n = 1, .pos = pos + t, .row = 0};
                CHECK(kv->ops->layer_step(kv->self, l, &sg, 1, qkv, LD, o[i], H * D, &err) == HKV_OK,
                      "decode of %d: %s", i ? b : a, err.msg);
            }
            same &= !memcmp(o[0], o[1], sizeof o[0]);
        }
    return same;
}

/* No own rows, the store its own alone. */
static int owns_index(const ctkvr *s) {
    if (!s || s->st->refs != 1) return 0;
    for (int i = 0; i < s->L * s->KH; i++)
        if (s->own[i].map) return 0;
    return 1;
}

/* sketch=3: 1 copied from 0 (the sketches with the index), 2 copied and
 * built again (sketches made from its rows at its prompt end). */
static void sketch_copies(const hkv_cpu_kernels *kern, float *qkv, float *out) {
    hkv_tiered_params p;
    test_params(&p, &hkv_policy_ctkvr, NULL);
    hkv_err err;
    CHECK(hkv_policy_arg_set(&hkv_policy_ctkvr, &p.args, "sketch=3", &err) == HKV_OK, "%s", err.msg);
    const hkv_kv_shape sh = {L, H, KH, D};
    hkv_mem_account mem = {0};
    hkv_kv kv;
    CHECK(hkv_kv_tiered_create(&kv, &sh, 3, &p, kern, &mem, &err) == HKV_OK, "create: %s", err.msg);
    const hkv_kv_ops *ops = kv.ops;
    for (int s = 0; s < 3; s++)
        CHECK(ops->seq_open(kv.self, s, CTX, &err) == HKV_OK, "open %d: %s", s, err.msg);
    feed_prompt(&kv, 0, N_PROMPT, CHUNK, L, LD, H * D, 5, qkv, out);
    CHECK(ops->seq_copy(kv.self, 1, 0, &err) == HKV_OK && ops->seq_copy(kv.self, 2, 0, &err) == HKV_OK &&
              hkv_kv_set_policy(&kv, 2, &hkv_policy_ctkvr, &p.args, &err) == HKV_OK,
          "sketch copies: %s", err.msg);
    const ctkvr *c0 = instance(&kv, 0), *c1 = instance(&kv, 1), *c2 = instance(&kv, 2);
    int sketched = c0 && c1 && c2 && c1->skc && c2->skc;
    const size_t rb = hkv_sketch_code_bytes(3, D), ng = D / HKV_SKETCH_GROUP;
    for (int i = 0; sketched && i < L * KH; i++) {
        const int64_t hi = c2->heads[i].sk_hi;
        sketched &= hi > N_PROMPT / 2 && c1->heads[i].sk_hi == hi && c0->heads[i].sk_hi == hi &&
                    !memcmp(c1->skc + (size_t)i * c1->cap * rb, c2->skc + (size_t)i * c2->cap * rb,
                            (size_t)hi * rb) &&
                    !memcmp(c1->sks + (size_t)i * c1->cap * ng, c2->sks + (size_t)i * c2->cap * ng,
                            (size_t)hi * ng * sizeof(float));
    }
    CHECK(sketched, "a copy does not hold its source's sketches of every far row, as a build makes "
          "them");
    CHECK(same_decode(&kv, 1, 2, N_PROMPT, 16, 1100), "a copy with sketches decodes unlike a built one");
    kv.ops->destroy(kv.self);
    CHECK(mem.bytes[HKV_TIER_INDEX] == 0, "sketch index bytes left: %zu", mem.bytes[HKV_TIER_INDEX]);
}

int main(void) {
    hkv_cpu_kernels kern;
    hkv_isa_info info;
    hkv_isa_detect(&info);
    hkv_cpu_kernels_init(&kern, info.best);
    hkv_tiered_params p;
    test_params(&p, &hkv_policy_ctkvr, NULL);
    const hkv_kv_shape sh = {L, H, KH, D};
    hkv_mem_account mem = {0};
    hkv_kv kv;
    hkv_err err;
    CHECK(hkv_kv_tiered_create(&kv, &sh, N_SEQ, &p, &kern, &mem, &err) == HKV_OK, "create: %s", err.msg);
    const hkv_kv_ops *ops = kv.ops;
    for (int s = 7; s <= 8; s++)   /* the 8-bit pair */
        CHECK(hkv_kv_set_far_q8(&kv, s, 1, &err) == HKV_OK, "q8 %d: %s", s, err.msg);
    for (int s = 0; s < N_SEQ; s++)
        CHECK(ops->seq_open(kv.self, s, CTX, &err) == HKV_OK, "open %d: %s", s, err.msg);
    float *qkv = malloc((size_t)CHUNK * LD * sizeof(float)), *out = malloc((size_t)CHUNK * H * D * 4);
    feed_prompt(&kv, 0, N_PROMPT, CHUNK, L, LD, H * D, 3, qkv, out);

    /* 7 and 8 hold 8-bit rows converted from 0's fp16 ones (0's index could
     * be taken, but is of the fp16 rows): 7 copied, 8 copied and built again */
    CHECK(ops->seq_copy(kv.self, 7, 0, &err) == HKV_OK && ops->seq_copy(kv.self, 8, 0, &err) == HKV_OK &&
              hkv_kv_set_policy(&kv, 8, &hkv_policy_ctkvr, &p.args, &err) == HKV_OK,
          "8-bit copies: %s", err.msg);
    const ctkvr *c7 = instance(&kv, 7), *c8 = instance(&kv, 8), *f16 = instance(&kv, 0);
    CHECK(c7 && c8 && f16 && memcmp(f16->st->ivf, c8->st->ivf, c8->st->ivf_b),
          "the 8-bit rows build the fp16 rows' lists (the next check proves nothing)");
    CHECK(c7 && c8 && !memcmp(c7->st->ivf, c8->st->ivf, c7->st->ivf_b) &&
              !memcmp(c7->st->cent, c8->st->cent, c7->st->cent_b),
          "an 8-bit copy's index is not the one its rows build");

    /* 1 copied with its index, 2 copied and built again */
    const size_t idx0 = mem.bytes[HKV_TIER_INDEX];
    CHECK(ops->seq_copy(kv.self, 1, 0, &err) == HKV_OK, "copy: %s", err.msg);
    const size_t idx1 = mem.bytes[HKV_TIER_INDEX];
    CHECK(ops->seq_copy(kv.self, 2, 0, &err) == HKV_OK &&
              hkv_kv_set_policy(&kv, 2, &hkv_policy_ctkvr, &p.args, &err) == HKV_OK,
          "copy and build: %s", err.msg);
    const size_t idx2 = mem.bytes[HKV_TIER_INDEX];
    const ctkvr *c0 = instance(&kv, 0), *c1 = instance(&kv, 1), *c2 = instance(&kv, 2);
    CHECK(c0 && c1 && c2 && c1->st != c0->st && owns_index(c0) && owns_index(c1),
          "a copy shares its source's index");
    CHECK(c1 && c2 && c1->st->cent_b == c2->st->cent_b &&
              !memcmp(c1->st->cent, c2->st->cent, c1->st->cent_b) &&
              !memcmp(c1->st->ivf, c2->st->ivf, c1->st->ivf_b) &&
              !memcmp(c1->st->len, c2->st->len, c1->st->len_b) &&
              !memcmp(c1->st->dyn, c2->st->dyn, c1->st->dyn_b),
          "the copied index is not the one the rows build");
    CHECK(idx1 - idx0 == idx2 - idx1, "index bytes: the copy added %zu, the built one %zu",
          idx1 - idx0, idx2 - idx1);
    CHECK(same_decode(&kv, 1, 2, N_PROMPT, 16, 100), "a copied index decodes unlike a built one");

    /* a fork of 0 (shared store), a second prompt turn (own rows), copied */
    enum { TURN = 60 };
    CHECK(ops->seq_share(kv.self, 3, 0, N_PROMPT, HKV_SHARE_INDEX, &err) == HKV_OK, "share: %s", err.msg);
    hkv_seg sg = {.seq = 3, .n = TURN, .pos = N_PROMPT, .row = 0,
                  .flags = HKV_SEG_PROMPT | HKV_SEG_PROMPT_END};
    for (int l = 0; l < L; l++) {
        fill(qkv, (int64_t)TURN * LD, 900 + (uint64_t)l);
        CHECK(ops->layer_step(kv.self, l, &sg, 1, qkv, LD, out, H * D, &err) == HKV_OK,
              "second turn: %s", err.msg);
    }
    CHECK(ops->seq_copy(kv.self, 4, 3, &err) == HKV_OK, "copy of a fork: %s", err.msg);
    const ctkvr *c3 = instance(&kv, 3), *c4 = instance(&kv, 4);
    int own3 = 0;
    for (int i = 0; c3 && i < L * KH; i++) own3 += c3->own[i].n;
    CHECK(own3 > 0 && c3->st->refs > 1, "the fork holds no own rows over a shared store (%d)", own3);
    CHECK(owns_index(c4), "a copy of a fork keeps own rows or a shared store");
    CHECK(same_decode(&kv, 3, 4, N_PROMPT + TURN, 16, 300), "a copy of a fork decodes unlike it");

    /* 0 decodes, then 5 is copied from it: built again, as 6 is */
    float o[H * D];
    for (int l = 0; l < L; l++) {
        fill(qkv, LD, 500 + (uint64_t)l);
        hkv_seg d = {.seq = 0, .n = 1, .pos = N_PROMPT, .row = 0};
        CHECK(ops->layer_step(kv.self, l, &d, 1, qkv, LD, o, H * D, &err) == HKV_OK, "decode: %s", err.msg);
    }
    CHECK(ops->seq_copy(kv.self, 5, 0, &err) == HKV_OK && ops->seq_copy(kv.self, 6, 0, &err) == HKV_OK &&
              hkv_kv_set_policy(&kv, 6, &hkv_policy_ctkvr, &p.args, &err) == HKV_OK,
          "copies after a decode: %s", err.msg);
    CHECK(owns_index(instance(&kv, 5)), "a copy after a decode holds a shared index");
    CHECK(same_decode(&kv, 5, 6, N_PROMPT + 1, 16, 700), "a copy after a decode decodes unlike a "
          "built one");

    CHECK(same_decode(&kv, 7, 8, N_PROMPT, 16, 900), "an 8-bit copy decodes unlike a built one");

    kv.ops->destroy(kv.self);
    CHECK(mem.bytes[HKV_TIER_INDEX] == 0, "index bytes left: %zu", mem.bytes[HKV_TIER_INDEX]);
    sketch_copies(&kern, qkv, out);
    free(qkv);
    free(out);
    if (fails) printf("%d failures\n", fails);
    else printf("ok\n");
    return fails ? 1 : 0;
}

/* The 8-bit far tier (hkv_tiered_params.far_q8, --far-kv q8):
 *   - q8_to_f16 gives the same bits at every ISA level, fp16(code x scale);
 *     attn_q8 (the codes converted as the attention's kernels load them)
 *     equals attn_sparse over the rows made fp16, bit for bit at every level;
 *     quantising a row errs by at most half a step (+ fp16's rounding);
 *   - a cache with an 8-bit far tier attends what an fp16 cache attends when
 *     that one is fed the rows as the 8-bit tier returns them (prompt rows)
 *     and the decode rows as they are (the near tier keeps them in fp16):
 *     prompt outputs (a prefix of up to q8_prompt_whole rows in the fp16
 *     tier's own causal kernel: bit for bit; a longer one over whole
 *     512-row pieces and the rest: within float rounding) and decode outputs
 *     under full and quest, within float rounding;
 *   - a decode row's result does not depend on the thread count (1, 2, 4);
 *   - a copy (seq_copy) decodes bit for bit as its source;
 *   - the format per sequence (set_far_q8): an 8-bit copy of an fp16
 *     sequence (its rows converted, as bench forks its configurations)
 *     decodes bit for bit as an 8-bit sequence fed the same fp16 rows;
 *     the setter refuses an open sequence;
 *   - it holds (d + d/8) / 2d of the fp16 tier's far bytes and counts its
 *     selected rows at that size;
 *   - what it cannot do is refused by name: a token-selective prefill
 *     (fastkv), ctkvr's sketches, head sizes off the group. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "far_rows.h"
#include "kernels.h"
#include "kv_test.h"
#include "kv_tiered.h"

enum { L = 2, H = 6, KH = 2, D = 64, N_PROMPT = 800, CHUNK = 256, CTX = 1000, STEPS = 24 };
enum { LD = (H + 2 * KH) * D, NG = D / HKV_Q8_GROUP };
/* decode steps of the runs: past the 64-row ring, so decode rows reach the far tier */
enum { DEC = 72 };

/* A K or V row as the 8-bit tier returns it. */
static void q8_round(const hkv_cpu_kernels *kn, float *x) {
    int8_t c[D];
    float s[NG];
    uint16_t h[D];
    hkv_q8_quantize(x, D, c, s);
    kn->q8_to_f16(c, s, D, h);
    kn->f16_to_f32(h, x, D);
}

static void kernel_checks(const hkv_cpu_kernels *ref) {
    enum { N = 256 };
    float x[N], back[N];
    int8_t c[N];
    float s[N / HKV_Q8_GROUP];
    uint16_t want[N];
    fill(x, N, 7);
    x[3] = 0, x[40] = 100.0f, x[41] = -1e-3f;   /* an outlier in a group, a zero */
    for (int i = 64; i < 96; i++) x[i] = 0;      /* an all-zero group: scale 0 */
    hkv_q8_quantize(x, N, c, s);
    ref->q8_to_f16(c, s, N, want);
    ref->f16_to_f32(want, back, N);
    for (int i = 0; i < N; i++) {
        const float step = s[i / HKV_Q8_GROUP];
        CHECK(fabsf(back[i] - x[i]) <= 0.5f * step + fabsf(x[i]) * 1e-3f + 1e-7f,
              "element %d: %g back as %g (step %g)", i, x[i], back[i], step);
        float prod = (float)c[i] * step;
        uint16_t one;
        ref->f32_to_f16(&prod, &one, 1);
        CHECK(want[i] == one, "element %d: q8_to_f16 is not fp16(code x scale)", i);
    }
    CHECK(s[2] == 0 && back[70] == 0, "an all-zero group has scale 0 (%g) and returns 0", s[2]);
    for (int isa = HKV_ISA_SCALAR; isa <= HKV_ISA_AVX512; isa++) {
        hkv_cpu_kernels kn;
        hkv_cpu_kernels_init(&kn, isa);
        if (kn.isa != isa) continue;   /* not on this CPU */
        uint16_t got[N];
        kn.q8_to_f16(c, s, N, got);
        CHECK(!memcmp(got, want, sizeof got), "q8_to_f16 at ISA level %d differs from level %d",
              isa, ref->isa);
    }
}

/* attn_q8 against attn_sparse over the same rows made fp16 (q8_to_f16):
 * bit for bit at every ISA level (the vector levels read the codes in the
 * same kernels, converting as they load), for gathered and consecutive
 * rows, head sizes 64, 96, 128, more rows than one chunk of the register
 * kernel. */
static void attn_kernel_checks(void) {
    enum { ROWS = 700, N = 300, G = 5, DMAX = 128 };
    static int8_t kc[ROWS * DMAX], vc[ROWS * DMAX];
    static float ksc[ROWS * DMAX / 32], vsc[ROWS * DMAX / 32], x[ROWS * DMAX];
    static uint16_t k16[ROWS * DMAX], v16[ROWS * DMAX];
    float q[G * DMAX], o_ref[G * DMAX], l_ref[G], o[G * DMAX], l[G];
    int32_t idx[N];
    for (int i = 0; i < N; i++) idx[i] = (int32_t)((i * 7919 + 13) % ROWS);
    const int ds[] = {64, 96, 128};
    for (int di = 0; di < 3; di++) {
        const int d = ds[di], ng = d / 32;
        for (int isa = HKV_ISA_SCALAR; isa <= HKV_ISA_AVX512; isa++) {
            hkv_cpu_kernels kn;
            hkv_cpu_kernels_init(&kn, isa);
            if (kn.isa != isa) continue;
            fill(x, (int64_t)ROWS * d, 11 + (uint64_t)d);
            for (int r = 0; r < ROWS; r++) hkv_q8_quantize(x + r * d, d, kc + r * d, ksc + r * ng);
            fill(x, (int64_t)ROWS * d, 12 + (uint64_t)d);
            for (int r = 0; r < ROWS; r++) hkv_q8_quantize(x + r * d, d, vc + r * d, vsc + r * ng);
            kn.q8_to_f16(kc, ksc, (int64_t)ROWS * d, k16);
            kn.q8_to_f16(vc, vsc, (int64_t)ROWS * d, v16);
            fill(q, G * d, 13);
            for (int gathered = 0; gathered < 2; gathered++) {
                const int32_t *ix = gathered ? idx : NULL;
                if (ix) kn.attn_sparse(q, G, d, k16, v16, d, ix, N, 0.125f, o_ref, l_ref);
                else kn.attn_dense(q, G, d, k16, v16, d, N, 0.125f, o_ref, l_ref);
                kn.attn_q8(q, G, d, kc, ksc, vc, vsc, d, ix, N, 0.125f, o, l);
                double worst = 0;
                for (int i = 0; i < G * d; i++) worst = fmax(worst, fabs((double)o[i] - o_ref[i]));
                for (int h = 0; h < G; h++) worst = fmax(worst, fabs((double)l[h] - l_ref[h]));
                CHECK(worst == 0, "attn_q8 at ISA level %d, d %d%s: %g from attn_sparse over the "
                      "rows made fp16", isa, d, ix ? " gathered" : "", worst);
            }
        }
    }
}

typedef struct cache {
    hkv_kv kv;
    hkv_mem_account mem;
} cache;

static int64_t prompt_whole = 0;   /* hkv_tiered_params.q8_prompt_whole of make()'s caches */

static void make(cache *c, const hkv_policy_def *pol, int q8, const hkv_cpu_kernels *kern) {
    hkv_tiered_params p;
    test_params(&p, pol, "budget=128");
    p.q8_prompt_whole = prompt_whole;
    if (pol == &hkv_policy_oracle) hkv_policy_arg_set(pol, &p.args, "k=96", NULL);
    p.far_q8 = q8;
    hkv_kv_shape sh = {L, H, KH, D};
    hkv_err err;
    memset(&c->mem, 0, sizeof c->mem);
    CHECK(hkv_kv_tiered_create(&c->kv, &sh, 3, &p, kern, &c->mem, &err) == HKV_OK, "create: %s",
          err.msg);
    for (int s = 0; s < 3; s++)
        CHECK(c->kv.ops->seq_open(c->kv.self, s, CTX, &err) == HKV_OK, "open %d: %s", s, err.msg);
}

/* Rows for layer l of a chunk at pos (n rows); with round, each K and V row
 * as the 8-bit tier returns it. */
static void rows_of(const hkv_cpu_kernels *kn, float *qkv, int n, int64_t pos, int l, int round) {
    fill(qkv, (int64_t)n * LD, (uint64_t)pos * 7 + (uint64_t)l);
    for (int r = 0; round && r < n; r++)
        for (int h = 0; h < 2 * KH; h++) q8_round(kn, qkv + (size_t)r * LD + (size_t)(H + h) * D);
}

static double max_rel(const float *a, const float *b, size_t n) {
    double m = 0, s = 1e-3;
    for (size_t i = 0; i < n; i++) s = fmax(s, fabs(b[i]));
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]) / s);
    return m;
}

/* The prompt into sequence 0 of both caches (the fp16 one fed rounded rows),
 * then STEPS decode steps; every output compared. */
static void against_f16(const hkv_policy_def *pol, double tol, const hkv_cpu_kernels *kern) {
    cache a, b;
    make(&a, pol, 1, kern);
    make(&b, pol, 0, kern);
    float *qkv = malloc((size_t)CHUNK * LD * 4), *oa = malloc((size_t)CHUNK * H * D * 4),
          *ob = malloc((size_t)CHUNK * H * D * 4);
    hkv_err err;
    double worst_p = 0, worst_d = 0;
    for (int64_t pos = 0; pos < N_PROMPT; pos += CHUNK) {
        const int n = N_PROMPT - pos < CHUNK ? (int)(N_PROMPT - pos) : CHUNK;
        hkv_seg sg = {.seq = 0, .n = n, .pos = pos, .row = 0,
                      .flags = HKV_SEG_PROMPT | (pos + n == N_PROMPT ? HKV_SEG_PROMPT_END : 0)};
        for (int l = 0; l < L; l++) {
            rows_of(kern, qkv, n, pos, l, 0);
            CHECK(a.kv.ops->layer_step(a.kv.self, l, &sg, 1, qkv, LD, oa, H * D, &err) == HKV_OK,
                  "q8 prompt: %s", err.msg);
            rows_of(kern, qkv, n, pos, l, 1);
            CHECK(b.kv.ops->layer_step(b.kv.self, l, &sg, 1, qkv, LD, ob, H * D, &err) == HKV_OK,
                  "f16 prompt: %s", err.msg);
            worst_p = fmax(worst_p, max_rel(oa, ob, (size_t)n * H * D));
        }
    }
    for (int t = 0; t < STEPS; t++) {   /* decode rows stay in the ring: fp16 in both */
        hkv_seg sg = {.seq = 0, .n = 1, .pos = N_PROMPT + t, .row = 0};
        for (int l = 0; l < L; l++) {
            rows_of(kern, qkv, 1, 5000 + t, l, 0);
            CHECK(a.kv.ops->layer_step(a.kv.self, l, &sg, 1, qkv, LD, oa, H * D, &err) == HKV_OK,
                  "q8 decode: %s", err.msg);
            CHECK(b.kv.ops->layer_step(b.kv.self, l, &sg, 1, qkv, LD, ob, H * D, &err) == HKV_OK,
                  "f16 decode: %s", err.msg);
            worst_d = fmax(worst_d, max_rel(oa, ob, (size_t)H * D));
        }
    }
    /* a prefix of up to q8_prompt_whole rows: the fp16 tier's causal kernel over
     * the same values, bit for bit; longer, in pieces merged: within rounding */
    if (prompt_whole == 0)
        CHECK(worst_p == 0, "%s: whole-prefix prompt outputs differ by %g", pol->name, worst_p);
    CHECK(worst_p <= 1e-5, "%s: prompt outputs differ by %g (relative)", pol->name, worst_p);
    CHECK(worst_d <= tol, "%s: decode outputs differ by %g (relative, tolerance %g)", pol->name,
          worst_d, tol);
    printf("%s (prompts whole up to %lld rows): prompt %.2g, decode %.2g relative to the fp16 "
           "tier fed the same values\n", pol->name, (long long)(prompt_whole ? prompt_whole : 8192),
           worst_p, worst_d);
    /* (d + d/8) / 2d of the far bytes */
    const double ratio = (double)a.mem.bytes[HKV_TIER_FAR] / (double)b.mem.bytes[HKV_TIER_FAR];
    CHECK(fabs(ratio - (D + NG * 4.0) / (2.0 * D)) < 1e-9, "far bytes %.4f of fp16's", ratio);
    a.kv.ops->destroy(a.kv.self);
    b.kv.ops->destroy(b.kv.self);
    free(qkv), free(oa), free(ob);
}

/* Decode outputs of sequence 0 after the prompt, threads threads; with
 * copy, sequence 1 (a seq_copy of 0) decodes too and must match. */
static void decode_run(const hkv_policy_def *pol, int threads, float *out, uint64_t *bytes,
                       const hkv_cpu_kernels *kern) {
    cache a;
    make(&a, pol, 1, kern);
    float *qkv = malloc((size_t)CHUNK * LD * 4), *o = malloc((size_t)CHUNK * H * D * 4);
    hkv_err err;
    feed_prompt(&a.kv, 0, N_PROMPT, CHUNK, L, LD, H * D, 3, qkv, o);
    CHECK(a.kv.ops->seq_copy(a.kv.self, 1, 0, &err) == HKV_OK, "copy: %s", err.msg);
    omp_set_num_threads(threads);
    const uint64_t b0 = hkv_kv_tiered_bytes_read(&a.kv);
    for (int t = 0; t < DEC; t++) {   /* past the ring: decode rows from the far tier too */
        hkv_seg sg[2] = {{.seq = 0, .n = 1, .pos = N_PROMPT + t, .row = 0},
                         {.seq = 1, .n = 1, .pos = N_PROMPT + t, .row = 1}};
        for (int l = 0; l < L; l++) {
            rows_of(kern, qkv, 1, 9000 + t, l, 0);
            memcpy(qkv + LD, qkv, LD * sizeof(float));
            CHECK(a.kv.ops->layer_step(a.kv.self, l, sg, t % 2 ? 2 : 1, qkv, LD, o, H * D, &err) ==
                      HKV_OK, "decode: %s", err.msg);
            memcpy(out + ((size_t)t * L + l) * H * D, o, (size_t)H * D * 4);
            if (t % 2)
                CHECK(!memcmp(o, o + H * D, (size_t)H * D * 4),
                      "%s: the copy's output differs from its source's (step %d layer %d)",
                      pol->name, t, l);
        }
        if (t % 2 == 0) {   /* the copy catches up alone, with the same row */
            hkv_seg one = {.seq = 1, .n = 1, .pos = N_PROMPT + t, .row = 0};
            for (int l = 0; l < L; l++) {
                rows_of(kern, qkv, 1, 9000 + t, l, 0);
                CHECK(a.kv.ops->layer_step(a.kv.self, l, &one, 1, qkv, LD, o, H * D, &err) ==
                          HKV_OK, "decode: %s", err.msg);
                CHECK(!memcmp(o, out + ((size_t)t * L + l) * H * D, (size_t)H * D * 4),
                      "%s: the copy alone differs from its source (step %d layer %d)", pol->name,
                      t, l);
            }
        }
    }
    *bytes = hkv_kv_tiered_bytes_read(&a.kv) - b0;
    omp_set_num_threads(2);
    a.kv.ops->destroy(a.kv.self);
    free(qkv), free(o);
}

static void thread_invariance(const hkv_policy_def *pol, const hkv_cpu_kernels *kern) {
    const size_t n = (size_t)DEC * L * H * D;
    float *o1 = calloc(n, 4), *o2 = calloc(n, 4), *o4 = calloc(n, 4);
    uint64_t b1, b2, b4;
    decode_run(pol, 1, o1, &b1, kern);
    decode_run(pol, 2, o2, &b2, kern);
    decode_run(pol, 4, o4, &b4, kern);
    CHECK(!memcmp(o1, o2, n * 4) && !memcmp(o1, o4, n * 4),
          "%s: decode outputs depend on the thread count", pol->name);
    CHECK(b1 == b2 && b1 == b4, "%s: bytes read depend on the thread count", pol->name);
    free(o1), free(o2), free(o4);
}

/* oracle k=96 over the 8-bit tier: what each step reads, by the counter's
 * own sizes: every far key's codes and scales (the rerank), the near rows
 * in fp16 and the selected rows' K and V codes and scales. */
static void bytes_counted(const hkv_cpu_kernels *kern) {
    const size_t n = (size_t)DEC * L * H * D;
    float *o = calloc(n, 4);
    uint64_t got;
    decode_run(&hkv_policy_oracle, 2, o, &got, kern);
    uint64_t want = 0;
    const uint64_t row8 = D + NG * 4;
    for (int t = 0; t < DEC; t++) {
        const int rows = t % 2 ? 2 : 1;
        for (int r = 0; r < rows + (t % 2 == 0); r++) {   /* (the copy alone on even steps) */
            const int64_t len = N_PROMPT + t + 1, near = 4 + 64 < len ? 4 + 64 : len;
            const int64_t far = N_PROMPT + t - 64 - 4 + 1 > 0 ? N_PROMPT + t + 1 - 64 - 4 : 0;
            const int64_t sel = far < 96 ? far : 96;
            want += (uint64_t)L * KH * ((uint64_t)near * D * 4 + (uint64_t)far * row8 * (far > 96) +
                                        (uint64_t)sel * 2 * row8);
        }
    }
    CHECK(got == want, "oracle over the 8-bit tier read %llu bytes, counted %llu",
          (unsigned long long)got, (unsigned long long)want);
    free(o);
}

/* Rows for layer l as fp16 would store them (every value rounded). */
static void rows16(const hkv_cpu_kernels *kn, float *qkv, int n, int64_t pos, int l) {
    uint16_t h[LD];
    rows_of(kn, qkv, n, pos, l, 0);
    for (int r = 0; r < n; r++) {
        kn->f32_to_f16(qkv + (size_t)r * LD, h, LD);
        kn->f16_to_f32(h, qkv + (size_t)r * LD, LD);
    }
}

static void per_sequence(const hkv_policy_def *pol, const hkv_cpu_kernels *kern) {
    cache a;
    make(&a, pol, 0, kern);   /* slots 0..2 open fp16 */
    hkv_err err;
    CHECK(hkv_kv_set_far_q8(&a.kv, 1, 1, &err) == HKV_E_INVAL, "set_far_q8 on an open sequence");
    CHECK(hkv_kv_seq_far_q8(&a.kv, 1) == 0, "slot 1 is fp16");
    for (int s = 1; s <= 2; s++) {
        a.kv.ops->seq_close(a.kv.self, s);
        CHECK(hkv_kv_set_far_q8(&a.kv, s, 1, &err) == HKV_OK, "set_far_q8: %s", err.msg);
        CHECK(a.kv.ops->seq_open(a.kv.self, s, CTX, &err) == HKV_OK, "open: %s", err.msg);
        CHECK(hkv_kv_seq_far_q8(&a.kv, s) == 1, "slot %d is 8-bit", s);
    }
    float *qkv = malloc((size_t)CHUNK * LD * 4), *o = malloc((size_t)CHUNK * H * D * 4),
          *o2 = malloc((size_t)H * D * 4);
    for (int64_t pos = 0; pos < N_PROMPT; pos += CHUNK) {   /* 0 fp16 and 2 8-bit, fed alike */
        const int n = N_PROMPT - pos < CHUNK ? (int)(N_PROMPT - pos) : CHUNK;
        for (int s = 0; s <= 2; s += 2) {
            hkv_seg sg = {.seq = s, .n = n, .pos = pos, .row = 0,
                          .flags = HKV_SEG_PROMPT | (pos + n == N_PROMPT ? HKV_SEG_PROMPT_END : 0)};
            for (int l = 0; l < L; l++) {
                rows16(kern, qkv, n, pos, l);
                CHECK(a.kv.ops->layer_step(a.kv.self, l, &sg, 1, qkv, LD, o, H * D, &err) == HKV_OK,
                      "prompt: %s", err.msg);
            }
        }
    }
    CHECK(a.kv.ops->seq_copy(a.kv.self, 1, 0, &err) == HKV_OK, "copy fp16 -> 8-bit: %s", err.msg);
    int same = 1;
    for (int t = 0; t < DEC; t++)
        for (int l = 0; l < L; l++) {
            rows16(kern, qkv, 1, 7000 + t, l);
            for (int s = 1; s <= 2; s++) {
                hkv_seg sg = {.seq = s, .n = 1, .pos = N_PROMPT + t, .row = 0};
                CHECK(a.kv.ops->layer_step(a.kv.self, l, &sg, 1, qkv, LD, s == 1 ? o : o2, H * D,
                                           &err) == HKV_OK, "decode: %s", err.msg);
            }
            same &= !memcmp(o, o2, (size_t)H * D * 4);
        }
    CHECK(same, "%s: an 8-bit copy of an fp16 sequence decodes otherwise than an 8-bit sequence "
          "fed the same rows", pol->name);
    a.kv.ops->destroy(a.kv.self);
    free(qkv), free(o), free(o2);
}

static void refusals(const hkv_cpu_kernels *kern) {
    hkv_tiered_params p;
    hkv_kv_shape sh = {L, H, KH, D};
    hkv_mem_account mem = {0};
    hkv_kv kv;
    hkv_err err;
    test_params(&p, &hkv_policy_fastkv, NULL);
    p.far_q8 = 1;
    CHECK(hkv_kv_tiered_create(&kv, &sh, 1, &p, kern, &mem, &err) == HKV_OK, "create: %s", err.msg);
    int rc = kv.ops->seq_open(kv.self, 0, CTX, &err);
    CHECK(rc == HKV_E_UNSUPPORTED && strstr(err.msg, "8-bit far tier"),
          "fastkv over an 8-bit far tier: %d (%s)", rc, err.msg);
    kv.ops->destroy(kv.self);
    test_params(&p, &hkv_policy_ctkvr, NULL);
    hkv_policy_arg_set(&hkv_policy_ctkvr, &p.args, "sketch=1", NULL);
    p.far_q8 = 1;
    CHECK(hkv_kv_tiered_create(&kv, &sh, 1, &p, kern, &mem, &err) == HKV_OK, "create: %s", err.msg);
    rc = kv.ops->seq_open(kv.self, 0, CTX, &err);
    CHECK(rc != HKV_OK && strstr(err.msg, "drop sketch"), "ctkvr sketch=1 over q8: %d (%s)", rc,
          err.msg);
    kv.ops->destroy(kv.self);
    hkv_kv_shape odd = {L, H, KH, 48};
    test_params(&p, NULL, NULL);
    p.far_q8 = 1;
    rc = hkv_kv_tiered_create(&kv, &odd, 1, &p, kern, &mem, &err);
    CHECK(rc == HKV_E_UNSUPPORTED && strstr(err.msg, "multiples of 32"), "d 48 over q8: %d (%s)",
          rc, err.msg);
    if (rc == HKV_OK) kv.ops->destroy(kv.self);
    CHECK(mem.bytes[HKV_TIER_FAR] == 0 && mem.bytes[HKV_TIER_INDEX] == 0,
          "refusals left bytes behind");
}

int main(void) {
    hkv_cpu_kernels kern;
    hkv_cpu_kernels_init(&kern, -1);
    omp_set_num_threads(2);
    kernel_checks(&kern);
    attn_kernel_checks();
    against_f16(&hkv_policy_full, 1e-5, &kern);
    against_f16(&hkv_policy_quest, 1e-5, &kern);
    prompt_whole = 512;   /* the 800-token prompt's later chunks in pieces */
    against_f16(&hkv_policy_full, 1e-5, &kern);
    prompt_whole = 0;
    thread_invariance(&hkv_policy_full, &kern);
    thread_invariance(&hkv_policy_ctkvr, &kern);
    bytes_counted(&kern);
    per_sequence(&hkv_policy_full, &kern);
    per_sequence(&hkv_policy_ctkvr, &kern);
    refusals(&kern);
    if (fails) printf("%d checks failed\n", fails);
    else printf("kv q8: all checks passed\n");
    return fails ? 1 : 0;
}

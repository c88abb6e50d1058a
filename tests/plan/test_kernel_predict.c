/* The per-kernel PREDICTION (plan/gpu_kernel_predict.h): bytes and FLOPs
 * of a GEMV, a decode attention (with and without splits) and a prefill
 * chunk at small shapes against hand counts; the split rule against the
 * cases tests/gpu/test_gpu_decode_split.c holds the CUDA one to; memory- vs
 * compute-bound flipping with the batch; monotonicity in the context; what
 * the split buys at batch 1; `hetkv plan --predict DEV --kernels` (argv[1]). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "gpu_kernel_predict.h"
#include "kernels.h"
#include "synthetic.h"

#include "../check.h"
#define NEAR(a, b) CHECK(fabs((double)(a) - (double)(b)) <= 1e-9 * fabs((double)(b)) + 1e-12, \
                         "%s = %.12g, want %.12g", #a, (double)(a), (double)(b))

static void hand(void) {
    hkv_err err;
    hkv_kcost c;
    const hkv_device_spec *g4090 = hkv_device_spec_find("rtx4090", &err);
    /* GEMV, W 64 x 64 in Q4 (nibbles 2048 B + fp16 scale and min per 32: 512
     * B), 2 rows: x 2x64x4 read, y 2x64x4 written; 2 flops per weight and
     * row, plus one FMA per weight to dequantise */
    hkv_kshape s = {.kind = HKV_KN_GEMV, .wtype = HKV_W_Q4, .rows = 64, .cols = 64, .n = 2};
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_OK, "%s", err.msg);
    NEAR(c.bytes_read, 2560 + 512);
    NEAR(c.bytes_written, 512);
    NEAR(c.flops[HKV_KU_FP32], 2 * 2 * 64 * 64 + 2 * 64 * 64);
    CHECK(c.unit == HKV_KU_FP32 && c.launches == 1 && c.blocks == 8 && !strcmp(c.name, "k_qm_gemv_q4"),
          "gemv %s unit %d launches %lld blocks %lld", c.name, c.unit, (long long)c.launches,
          (long long)c.blocks);
    s.n = 9;
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_E_RANGE, "a GEMV of 9 rows is refused");

    /* decode attention, 1 sequence, 4/2 heads of 32, 100 keys, one split:
     * K and V 2 x 100 x 32 x 2 x 2, lengths 2 x 4, Q 4 x 32 x 4 read, (out,
     * lse) 4 x 33 x 4 written; 4 d flops per (query head, key), two expf */
    s = (hkv_kshape){.kind = HKV_KN_ATTN_DECODE, .n_seq = 1, .H = 4, .KH = 2, .d = 32, .keys = 100,
                     .n_split = 1};
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_OK, "%s", err.msg);
    NEAR(c.bytes_read, 25600 + 8 + 512);
    NEAR(c.bytes_written, 528);
    NEAR(c.flops[HKV_KU_FP32], 4 * 100 * 4 * 32);
    NEAR(c.flops[HKV_KU_SFU], 4 * 100 * 2);
    CHECK(c.launches == 1 && c.blocks == 2, "one launch, 2 blocks: %lld %lld", (long long)c.launches,
          (long long)c.blocks);
    /* two splits: each writes its partial, the combine reads them back and
     * merges (2 d flops per split and query head, 34 SFU ops a row) */
    s.n_split = 2;
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_OK, "%s", err.msg);
    NEAR(c.bytes, 25600 + 8 + 512 + 528 + 2 * 2 * 528);
    NEAR(c.flops[HKV_KU_FP32], 4 * 100 * 4 * 32 + 4 * 2 * 2 * 32);
    NEAR(c.flops[HKV_KU_SFU], 800 + 4 * 34);
    CHECK(c.launches == 2 && c.blocks == 4 && c.n_split == 2, "split: %lld launches, %lld blocks",
          (long long)c.launches, (long long)c.blocks);
    /* through an index list: 4 B per key and KV head more */
    s.n_split = 1, s.gather = 1;
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_OK, "%s", err.msg);
    NEAR(c.bytes, 25600 + 8 + 512 + 528 + 2 * 100 * 4);

    /* prefill: 16 queries of one head of 32 at p0 = 0 are one warp of the
     * d <= 64 mma.sync kernel, one 64-key tile computed whole: 2 x 4 x 8 S
     * MMAs (Q hi/lo, 64 dims, 8-key tiles) and 2 x 4 x 8 P V ones (P hi/lo,
     * 16-key steps, 8-dim tiles) of 4096 flops; useful 4 d x (1 + ... + 16) */
    s = (hkv_kshape){.kind = HKV_KN_ATTN_PREFILL, .nq = 16, .H = 1, .KH = 1, .d = 32};
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_OK, "%s", err.msg);
    NEAR(c.flops[HKV_KU_TENSOR], 2 * 64 * 4096);
    NEAR(c.useful_flops, 4 * 32 * 136);
    CHECK(!strcmp(c.name, "k_attn_prefill_mma<64>") && c.blocks == 1, "%s %lld", c.name,
          (long long)c.blocks);
    /* d 256 stays on the WMMA kernel: one 16-key chunk, 4 x 16 MMAs of 8192 */
    s.d = 256;
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_OK, "%s", err.msg);
    NEAR(c.flops[HKV_KU_TENSOR], 4 * 16 * 8192);
    CHECK(!strcmp(c.name, "k_attn_prefill_d256") && c.blocks == 1, "%s %lld", c.name,
          (long long)c.blocks);
    /* at scale the hi/lo splits double the useful MMA work, the diagonal
     * chunks add little */
    s = (hkv_kshape){.kind = HKV_KN_ATTN_PREFILL, .nq = 4096, .H = 32, .KH = 8, .d = 128};
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_OK, "%s", err.msg);
    const double ratio = c.flops[HKV_KU_TENSOR] / c.useful_flops;
    CHECK(ratio >= 2.0 && ratio < 2.05, "issued / useful MMA flops %.4f", ratio);
    CHECK(!strcmp(c.name, "k_attn_prefill_mma<128>") && c.blocks == 4096 * 4 / 64 * 8,
          "%s %lld blocks", c.name, (long long)c.blocks);

    /* bad shapes are errors, not figures */
    s = (hkv_kshape){.kind = HKV_KN_ATTN_DECODE, .n_seq = 1, .H = 3, .KH = 2, .d = 32, .keys = 1};
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_E_INVAL, "3/2 heads");
    s = (hkv_kshape){.kind = HKV_KN_COUNT};
    CHECK(hkv_kernel_cost(&s, g4090, &c, &err) == HKV_E_INVAL, "unknown kind");
}

static void splits(void) {
    /* the cases tests/gpu/test_gpu_decode_split.c checks for the CUDA rule */
    CHECK(hkv_kernel_decode_splits(128, 1, 32, 8, 32768) == 32, "32K, B 1");
    CHECK(hkv_kernel_decode_splits(128, 1, 32, 8, 260) == 4, "260 rows");
    CHECK(hkv_kernel_decode_splits(128, 64, 32, 8, 32768) == 1, "B 64");
    CHECK(hkv_kernel_decode_splits(128, 16, 32, 8, 32768) == 2, "B 16");
    CHECK(hkv_kernel_decode_splits(0, 1, 32, 8, 32768) == 1, "no SMs");
}

static double t_of(const hkv_kshape *s, const hkv_device_spec *dev, const hkv_keff *e, hkv_kpred *k) {
    hkv_err err;
    if (hkv_kernel_predict(s, dev, e, k, &err)) {
        CHECK(0, "%s", err.msg);
        return NAN;
    }
    return k->time.t_s;
}

static void roofline(void) {
    hkv_err err;
    const hkv_device_spec *h100 = hkv_device_spec_find("h100", &err);
    const hkv_device_spec *g4090 = hkv_device_spec_find("rtx4090", &err);
    hkv_predict_params p;
    hkv_predict_defaults(&p);
    hkv_keff e;
    hkv_keff_from_params(&p, &e);
    CHECK(e.mem_eff == 0.8 && e.compute_eff == 0.7 && e.t_kernel == 4e-6 && e.sat_frac == 0.25,
          "the predict conventions");
    hkv_keff e0 = e;
    e0.t_kernel = 0;
    hkv_kpred k;

    /* the target's tensor-core product of Llama-3-8B's gate/up in Q4: AI =
     * 2n / 0.625 flops per weight byte, so memory-bound at 16 rows and
     * compute-bound at 512 on an H100 (ridge 989.5 x 0.7 / (3350 x 0.8) =
     * 258 flops/B) */
    hkv_kshape s = {.kind = HKV_KN_TC_GEMM, .wtype = HKV_W_Q4, .rows = 28672, .cols = 4096, .n = 16};
    t_of(&s, h100, &e0, &k);
    CHECK(k.time.bound == HKV_KB_MEMORY, "16 rows: %s", hkv_kernel_bound_name(k.time.bound));
    s.n = 512;
    t_of(&s, h100, &e0, &k);
    CHECK(k.time.bound == HKV_KB_COMPUTE && k.time.bound_unit == HKV_KU_TENSOR, "512 rows: %s",
          hkv_kernel_bound_name(k.time.bound));
    /* as built (fp32 panels + SGEMM on the CUDA cores): memory at 9 rows,
     * fp32-bound at 256 on the RTX 4090 */
    s.kind = HKV_KN_PANEL_GEMM, s.n = 9;
    t_of(&s, g4090, &e0, &k);
    CHECK(k.time.bound == HKV_KB_MEMORY, "panels, 9 rows: %s", hkv_kernel_bound_name(k.time.bound));
    s.n = 256;
    t_of(&s, g4090, &e0, &k);
    CHECK(k.time.bound == HKV_KB_COMPUTE && k.time.bound_unit == HKV_KU_FP32, "panels, 256 rows");
    /* 2 launches per 32 MiB panel (14 panels of 2048 rows x 4096): with the
     * launch floor, 16 rows are bound by the panels' bytes, not the launches
     * (the 4 MiB panels' 112 were launch-bound, as an H100 measured) */
    s.n = 16;
    t_of(&s, g4090, &e, &k);
    CHECK(k.time.bound == HKV_KB_MEMORY && k.cost.launches == 2 * 14, "panels at 16 rows: %s, %lld",
          hkv_kernel_bound_name(k.time.bound), (long long)k.cost.launches);

    /* decode attention is memory-bound and grows with the context; prefill
     * is tensor-bound */
    double last = 0;
    const int64_t ctx[] = {4096, 32768, 131072};
    for (int i = 0; i < 3; i++) {
        s = (hkv_kshape){.kind = HKV_KN_ATTN_DECODE, .n_seq = 1, .H = 32, .KH = 8, .d = 128, .keys = ctx[i]};
        const double t = t_of(&s, g4090, &e, &k);
        CHECK(t > last && k.time.bound == HKV_KB_MEMORY, "decode %lld keys: %.1f us after %.1f, %s",
              (long long)ctx[i], t * 1e6, last * 1e6, hkv_kernel_bound_name(k.time.bound));
        last = t;
    }
    /* at 128K: 32 splits; 537 MB at 0.8 x 1008 GB/s */
    CHECK(k.cost.n_split == 32 && fabs(k.time.t_s - k.cost.bytes / (1008e9 * 0.8)) < 1e-9,
          "128K split %d, %.2f us", k.cost.n_split, k.time.t_s * 1e6);
    /* the split's effect: without it 8 blocks reach 8 / (0.25 x 128) of the
     * bandwidth, 4x slower */
    const double split_t = k.time.t_s;
    s.n_split = 1;
    const double one = t_of(&s, g4090, &e, &k);
    CHECK(fabs(one / split_t - 4.0) < 0.01, "no split / split = %.3f", one / split_t);
    /* batch 16 fills the device without splitting as much */
    s.n_split = 0, s.n_seq = 16;
    t_of(&s, g4090, &e, &k);
    CHECK(k.cost.n_split == 2, "B 16: %d splits", k.cost.n_split);

    s = (hkv_kshape){.kind = HKV_KN_ATTN_PREFILL, .nq = 256, .p0 = 32768, .H = 32, .KH = 8, .d = 128};
    t_of(&s, h100, &e, &k);
    CHECK(k.time.bound == HKV_KB_COMPUTE && k.time.bound_unit == HKV_KU_TENSOR, "prefill chunk: %s",
          hkv_kernel_bound_name(k.time.bound));
}

static void step_rows(void) {
    hkv_err err;
    hkv_model_config c;
    CHECK(hkv_synthetic_config("llama3-8b", &c, &err) == HKV_OK, "%s", err.msg);
    hkv_predict_params p;
    hkv_predict_defaults(&p);
    p.cfg = &c;
    p.dev = hkv_device_spec_find("h100", &err);
    p.policy = &hkv_policy_ctkvr;
    p.host_gbs = 50;
    p.batch = 4;
    p.n_ctx = 32768;
    hkv_kstep_row rows[32];
    int n = 0;
    CHECK(hkv_kernel_step_rows(&p, HKV_PRED_BUILT, rows, 32, &n, &err) == HKV_OK, "%s", err.msg);
    int saw_recall = 0, saw_near = 0, saw_prefill = 0, saw_build = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].k.shape.kind == HKV_KN_CTKVR_BUILD) {
            /* the prompt's index: every layer once; tensor FLOPs 2 KH C g far d, and the
             * select's six passes over the fp32 scores dominate the bytes */
            const hkv_kshape *b = &rows[i].k.shape;
            const double sc = 8.0 * b->C * b->far * 4;
            saw_build = !strcmp(rows[i].phase, "prompt") && rows[i].calls == c.n_layer &&
                        b->KH == 8 && b->C == 2048 && b->far > 32000 &&
                        rows[i].k.cost.flops[HKV_KU_TENSOR] == 2.0 * 8 * 2048 * 4 * b->far * 128 &&
                        rows[i].k.cost.bytes > 7 * sc && rows[i].k.cost.bytes < 8 * sc &&
                        rows[i].k.cost.serial;
        }
        saw_recall |= !strcmp(rows[i].k.cost.name, "k_recall_top");
        saw_near |= rows[i].k.shape.kind == HKV_KN_ATTN_DECODE && rows[i].k.shape.keys == 260 &&
                    rows[i].k.shape.gather;
        saw_prefill |= rows[i].k.shape.kind == HKV_KN_ATTN_PREFILL && !strcmp(rows[i].phase, "prompt");
        CHECK(rows[i].k.time.t_s > 0 && rows[i].calls > 0, "row %s", rows[i].what);
    }
    CHECK(saw_recall && saw_near && saw_prefill && saw_build,
          "ctkvr rows: recall %d near %d prefill %d index build %d", saw_recall, saw_near,
          saw_prefill, saw_build);
    p.policy = &hkv_policy_full;   /* no index, no build row */
    CHECK(hkv_kernel_step_rows(&p, HKV_PRED_BUILT, rows, 32, &n, &err) == HKV_OK, "%s", err.msg);
    for (int i = 0; i < n; i++)
        CHECK(rows[i].k.shape.kind != HKV_KN_CTKVR_BUILD, "full: an index build row");
    p.policy = &hkv_policy_ctkvr;
    CHECK(hkv_kernel_step_rows(&p, HKV_PRED_BUILT, rows, 3, &n, &err) == HKV_E_RANGE, "a short table");
    p.policy = &hkv_policy_quest;
    CHECK(hkv_kernel_step_rows(&p, HKV_PRED_BUILT, rows, 32, &n, &err) == HKV_E_UNSUPPORTED, "quest");
}

static int run(const char *cmd, char *out, size_t cap) {
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    while (fgetc(f) != EOF) {
    }
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void cli(const char *hetkv) {
    static char out[1 << 17];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' plan --predict rtx4090 --synthetic llama3-8b --policy full --ctx "
             "32768 --batch 1 --kernels 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) == 0, "kernels: %s", out);
    CHECK(!strncmp(out, "PREDICTION per kernel", 21) && strstr(out, "| `k_attn_decode + k_attn_combine`") &&
          strstr(out, "PREDICTED us/call") && strstr(out, "k_attn_prefill_mma<128>") && !strstr(out, "NOT BUILT"),
          "kernels output:\n%s", out);
    /* every line is a PREDICTION header, a table line or blank */
    for (const char *l = out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
        if (strncmp(l, "PREDICTION", 10) && *l != '\n' && *l != '|') {
            CHECK(0, "a line that is neither a PREDICTION header nor a table line: %.80s", l);
            break;
        }
    snprintf(cmd, sizeof cmd, "'%s' plan --predict h100 --synthetic llama3-8b --policy ctkvr --ctx "
             "32768 --batch 16 --kernels --pipeline target --json 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) == 0, "kernels json: %s", out);
    CHECK(!strncmp(out, "{\"prediction\":true", 18) && strstr(out, "\"kernel\":\"k_ctkvr_recall\"") &&
          strstr(out, "\"built\":false") && strstr(out, "\"pipeline\":\"target\""), "json:\n%.2000s", out);
    snprintf(cmd, sizeof cmd, "'%s' plan --synthetic llama3-8b --gpu-mem 24G --kernels 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) != 0 && strstr(out, "--predict"), "--kernels alone: %s", out);
}

int main(int argc, char **argv) {
    hand();
    splits();
    roofline();
    step_rows();
    if (argc > 1) cli(argv[1]);
    else printf("(no hetkv binary given: CLI checks skipped)\n");
    if (fails) {
        printf("%d check(s) failed\n", fails);
        return 1;
    }
    printf("all kernel predict checks passed\n");
    return 0;
}

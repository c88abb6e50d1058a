/* The decode-speed PREDICTION (plan/gpu_predict.h): bytes per step of a
 * tiny shape against hand-computed numbers, the step time with latencies
 * set to zero on a 1 GB/s device, monotonicity in context and batch, the
 * memory verdict, errors naming what is known, and `hetkv plan --predict`
 * itself (argv[1]: the hetkv binary). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_predict.h"
#include "kernels.h"
#include "policy.h"
#include "synthetic.h"

#include "../check.h"
#define NEAR(a, b) CHECK(fabs((double)(a) - (double)(b)) <= 1e-9 * fabs((double)(b)) + 1e-15, \
                         "%s = %.12g, want %.12g", #a, (double)(a), (double)(b))

/* 2 layers, dim 64, 4/2 heads of 32, ffn 128, vocab 256 (untied). */
static hkv_model_config tiny(void) {
    hkv_model_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "tiny");
    c.n_layer = 2, c.dim = 64, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 32, c.ffn = 128;
    c.vocab = 256, c.rope_dim = 32, c.rope_base = 10000, c.rope_scale = 1, c.norm_eps = 1e-5f;
    return c;
}

/* A device of round numbers: 1 GB/s memory and PCIe, compute never binding. */
static const hkv_device_spec unit_dev = {"unit", "unit test device", 1ULL << 30, 1.0, 1.0, "test",
                                         1e6, 1e6, 1, "none", 1e6, 1e6, 0};

static void tiny_ctkvr_args(hkv_policy_args *a) {
    hkv_err err;
    hkv_policy_args_init(&hkv_policy_ctkvr, a);
    const char *kv[] = {"C=16", "Cp=2", "rho=40", "rho_p=16"};
    for (int i = 0; i < 4; i++)
        CHECK(hkv_policy_arg_set(&hkv_policy_ctkvr, a, kv[i], &err) == HKV_OK, "%s", err.msg);
}

static hkv_predict_params unit_params(const hkv_model_config *c) {
    hkv_predict_params p;
    hkv_predict_defaults(&p);
    p.cfg = c;
    p.dev = &unit_dev;
    p.batch = 2;
    p.n_ctx = 1024;
    p.L_init = 4;
    p.L_local = 60;   /* 64 near rows, 960 far */
    p.host_gbs = 1;
    p.mem_eff = p.pcie_eff = p.host_eff_scan = p.host_eff_attn = 1;
    p.t_kernel = p.t_copy = p.t_host = 0;
    return p;
}

static void hand_case(void) {
    hkv_model_config c = tiny();
    hkv_policy_args a;
    tiny_ctkvr_args(&a);
    hkv_predict_params p = unit_params(&c);
    p.policy = &hkv_policy_ctkvr;
    p.args = &a;
    hkv_prediction o;
    hkv_err err;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    CHECK(o.C == 16 && o.Cp == 2 && o.rho == 40 && o.rho_p == 16, "ctkvr %lld %lld %lld %lld",
          (long long)o.C, (long long)o.Cp, (long long)o.rho, (long long)o.rho_p);
    CHECK(o.near_rows == 64 && o.far_rows == 960, "rows %lld %lld", (long long)o.near_rows,
          (long long)o.far_rows);
    CHECK(o.candidates == 80 && o.selected == 16 && o.rerank == 1, "cand %lld sel %lld",
          (long long)o.candidates, (long long)o.selected);
    /* Q4 (0.5 B + 4 B per 32): QKV 256x64 = 10240, O 64x128 = 5120, gate/up
     * 256x64 = 10240, down 64x128 = 5120, norms 2*64*4 = 512 -> 31232 a layer;
     * embedding rows 2 x 40, output 256x64 = 10240 + its norm 256. */
    const hkv_predict_mode *b = &o.mode[HKV_PRED_BUILT], *t = &o.mode[HKV_PRED_TARGET];
    NEAR(b->dev_weight_bytes, 2 * 31232 + 80 + 10240 + 256);
    /* near K+V: B 2 x KH 2 x 64 rows x 32 x 2 B x 2, two layers */
    NEAR(b->dev_kv_bytes, 2 * 32768);
    /* the recall on the device reads every centroid: 16 x 2 x 32 x 2 per
     * (sequence, layer, KV head) */
    NEAR(b->dev_index_bytes, 8 * 2048);
    /* QKV down 2 x 8 heads x 32 x 4 per layer, the recalled slots and
     * cosines 4 x (2 x 8 + 4) per layer; logits 2 x 256 x 4 */
    NEAR(b->pcie_down_bytes, 2 * 2048 + 2 * 80 + 2048);
    /* far (out, lse) 2 x 4 x (32 + 1) x 4 per layer, a rewritten centroid
     * row and its offsets 4 x (2 x 32 x 2 + 16) per layer; ids, rows,
     * positions, slots 2 x 24 */
    NEAR(b->pcie_up_bytes, 2 * 1056 + 2 * 576 + 48);
    /* host, per (sequence, layer, KV head): lists 2 x 40 x 4, rerank 80
     * keys x 64 B, attention 16 x 32 x 2 x 2 */
    NEAR(b->host_index_bytes, 8 * 320);
    NEAR(b->host_rerank_bytes, 8 * 5120);
    NEAR(b->host_attn_bytes, 8 * 2048);
    NEAR(b->host_bytes, 59904);
    /* target: centroids and lists read on the device, 80 ids per head down */
    NEAR(t->dev_index_bytes, 8 * (2048 + 320));
    NEAR(t->host_index_bytes, 8 * 320);
    NEAR(t->host_rerank_bytes, 8 * 5120);
    NEAR(t->pcie_down_bytes, 2 * 2048 + 2048 + 8 * 320);
    NEAR(t->dev_weight_bytes, 2 * 31232 + 80 + 10240 + 256 + (t->pingpong ? 2 * 31232 : 0));

    /* Step time, latencies 0, all at 1e9 B/s, every kernel's DRAM bytes
     * (gpu_kernel_predict.h). Per layer:
     *  - the four GEMVs read W and x and write y (b = 2 rows): QKV 10240 +
     *    2x64x4 + 2x256x4 = 12800, O 5120 + 1024 + 512 = 6656, gate/up 12800,
     *    down 6656: 38912;
     *  - small kernels: 2 residual adds fused with the norms 2 x (read x and
     *    the residual 2x64x4x2 + the norm 64x4, write x and y 2x64x4x2) =
     *    2 x 2304 = 4608, RoPE over 6 heads of 32 (read 1536 + table 256,
     *    write 1536) 3328, SwiGLU (2x128x8 + 2x128x4) 3072, K/V append
     *    (2x2x32x2x4 + 16 + 2x2x32x2x2) 1552, partials cleared 8x33x4 = 1056,
     *    the merge 8x33x4x3 = 3168: 16784;
     *  - near attention: k_attn_decode (one split: 4 blocks on one SM; the
     *    queries read in the QKV rows, out and lse written in place) K/V
     *    32768 + lengths 16 + ring index 4x64x4 + Q 1024 + (out, lse) 1056:
     *    35888;
     *  - k_recall_top per (row, KV head): centroids 2048 + Q 256 + table row
     *    and FIFO 24 read, scores 64 + C' slots and cosines 16 + count 4
     *    written: 4 x 2412 = 9648;
     *  - copies: the centroid row up 576, QKV and slots down 2048 + 80,
     *    max(near 35888, host 4 x 7488 = 29952), up 1056.
     * Outside: embedding 80 + head GEMV 10240 + 512 + 2048 + copies 48 + 2048. */
    const double dense = 38912, small = 16784, near = 35888, recall = 9648, head = 12800;
    const double layer = (dense + small + 576 + recall + 2128 + near + 1056) * 1e-9;
    const double step = 2 * layer + (80 + head + 48 + 2048) * 1e-9;
    NEAR(b->step_s, step);
    NEAR(b->tok_s, 2 / step);
    NEAR(b->host_busy_s, 2 * 29952e-9);
    NEAR(b->dev_busy_s, 2 * (dense + small + near + recall) * 1e-9 + (80 + head) * 1e-9);
    NEAR(b->dev_wait_frac, 1 - b->dev_busy_s / step);
    NEAR(b->cpu_wait_frac, 1 - 2 * 29952e-9 / step);
    /* what the kernels move beyond weights, K/V and centroids: per layer
     * 8192 (x, y) + 16784 - 2 x 256 (the norms' weights are the layer's) +
     * 35888 - 32768 + 9648 - 8192; the head's x and y 2560 */
    NEAR(b->dev_act_bytes, 2 * (8192 + 16784 - 512 + 35888 - 32768 + 9648 - 8192) + 2560);
    NEAR(b->dev_bytes, b->dev_weight_bytes + b->dev_kv_bytes + b->dev_index_bytes + b->dev_act_bytes);
    CHECK(o.fits, "the tiny shape fits 1 GiB: %s", o.refusal);
    /* a host 10x slower (299520 ns a layer) is the layer's critical path,
     * the copies serial around it: QKV and slots down before, partials up
     * after */
    p.host_gbs = 0.1;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    NEAR(b->step_s, 2 * (dense + small + 576 + recall + 2128 + 299520 + 1056) * 1e-9 +
                        (80 + head + 48 + 2048) * 1e-9);
    NEAR(b->host_busy_s, 2 * 299520e-9);
    p.host_gbs = 1;

    /* full: the whole KV on the device, no CPU part, no per-layer PCIe. */
    p.policy = &hkv_policy_full;
    p.args = NULL;
    p.host_gbs = 0;   /* not needed */
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    b = &o.mode[HKV_PRED_BUILT];
    CHECK(!o.has_host, "full has no host part");
    NEAR(b->dev_kv_bytes, 2 * 2.0 * 2 * 1024 * 32 * 4);
    NEAR(b->host_bytes, 0);
    NEAR(b->pcie_down_bytes, 2048);
    NEAR(b->pcie_up_bytes, 2 * 16);
    /* per layer: the GEMVs 38912, small kernels without clear and merge
     * 16784 - 1056 - 3168, and k_attn_decode over the whole KV (no index
     * list, one split) 524288 + 16 + 1024 + 1056 */
    NEAR(b->step_s, 2 * (38912 + 12560 + 526384) * 1e-9 + (80 + 12800 + 32 + 2048) * 1e-9);
    NEAR(o.mode[HKV_PRED_TARGET].step_s, b->step_s);

    /* as built, 9..32 rows run as 8-row GEMVs (one more launch per product
     * for each 8 rows), more rows take the panel path: two launches per
     * 32 MiB panel */
    hkv_predict_defaults(&p);
    p.cfg = &c, p.dev = &unit_dev, p.n_ctx = 1024, p.policy = &hkv_policy_full;
    p.batch = 8;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    const int64_t k8 = o.mode[HKV_PRED_BUILT].kernels;
    /* per layer 4 GEMV + 5 small + 1 attention; head GEMV + 3 */
    CHECK(k8 == 2 * 10 + 4, "kernels at batch 8: %lld", (long long)k8);
    p.batch = 9;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    /* two GEMVs (8 + 1 rows) per product */
    CHECK(o.mode[HKV_PRED_BUILT].kernels == 2 * (8 + 6) + 2 + 3, "kernels at batch 9: %lld",
          (long long)o.mode[HKV_PRED_BUILT].kernels);
    p.batch = 32;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    CHECK(o.mode[HKV_PRED_BUILT].kernels == 2 * (16 + 6) + 4 + 3, "kernels at batch 32: %lld",
          (long long)o.mode[HKV_PRED_BUILT].kernels);
    p.batch = 33;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    /* every tiny matrix is one panel (<= 128 rows, or 256 rows of 64 within 32 MiB) */
    CHECK(o.mode[HKV_PRED_BUILT].kernels == 2 * (8 + 6) + 2 + 3, "kernels at batch 33: %lld",
          (long long)o.mode[HKV_PRED_BUILT].kernels);
    CHECK(o.mode[HKV_PRED_TARGET].kernels == k8, "target kernels %lld",
          (long long)o.mode[HKV_PRED_TARGET].kernels);
}

static void llama(void) {
    hkv_model_config c;
    hkv_err err;
    CHECK(hkv_synthetic_config("llama3-8b", &c, &err) == HKV_OK, "%s", err.msg);
    const hkv_device_spec *h100 = hkv_device_spec_find("h100", &err);
    const hkv_device_spec *g4090 = hkv_device_spec_find("rtx4090", &err);
    CHECK(h100 && g4090, "specs: %s", err.msg);
    if (!h100 || !g4090) return;
    /* Llama-3-8B in Q4 on the device: 8.03e9 weights at 0.625 B plus fp32 norms. */
    CHECK(fabs(hkv_predict_weight_bytes(&c, HKV_W_Q4) - (8029995008.0 * 0.625 + 266240 * 4)) < 1,
          "q4 weights %llu", (unsigned long long)hkv_predict_weight_bytes(&c, HKV_W_Q4));
    CHECK(hkv_predict_weight_bytes(&c, HKV_W_F16) == hkv_plan_weight_bytes(&c, 2),
          "f16 weights agree with the plan");

    hkv_predict_params p;
    hkv_predict_defaults(&p);
    p.cfg = &c;
    p.dev = h100;
    p.host_gbs = 50;
    hkv_prediction o;

    /* full: tok/s falls with the context, in both pipelines */
    const int64_t ctx[] = {4096, 16384, 32768, 65536, 98304};
    double last[HKV_PRED_MODES] = {INFINITY, INFINITY};
    p.policy = &hkv_policy_full;
    p.batch = 1;
    for (int i = 0; i < 5; i++) {
        p.n_ctx = ctx[i];
        CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
        CHECK(o.fits, "full %lld x 1 fits an H100: %s", (long long)ctx[i], o.refusal);
        for (int m = 0; m < HKV_PRED_MODES; m++) {
            CHECK(o.mode[m].tok_s > 0 && o.mode[m].tok_s < last[m], "full %lld mode %d: %.2f tok/s "
                  "after %.2f", (long long)ctx[i], m, o.mode[m].tok_s, last[m]);
            last[m] = o.mode[m].tok_s;
        }
    }
    /* full at 32K: batch 16 runs each product as two 8-row GEMVs (one more
     * launch per product and the head); the built panel path (batch > 32)
     * has more than 5x the launches of the GEMV and fewer tokens/s than
     * batch 8; the target's tokens/s still rise */
    p.n_ctx = 32768;
    p.batch = 8;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    hkv_prediction o8 = o;
    p.batch = 16;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    CHECK(o.mode[0].kernels - o8.mode[0].kernels == 4 * c.n_layer + 1, "batch 16 launches %lld vs "
          "%lld at batch 8", (long long)o.mode[0].kernels, (long long)o8.mode[0].kernels);
    p.batch = 40;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    CHECK(o.mode[0].kernels > 5 * o8.mode[0].kernels, "built launches %lld vs %lld",
          (long long)o.mode[0].kernels, (long long)o8.mode[0].kernels);
    CHECK(o.mode[0].tok_s < o8.mode[0].tok_s, "built batch 40 %.1f < batch 8 %.1f tok/s",
          o.mode[0].tok_s, o8.mode[0].tok_s);
    CHECK(o.mode[1].tok_s > o8.mode[1].tok_s, "target batch 40 %.1f > batch 8 %.1f tok/s",
          o.mode[1].tok_s, o8.mode[1].tok_s);

    /* ctkvr at 96K: host bytes grow with the batch, in both pipelines, and
     * the recall moves bytes from the host to the device in the target */
    p.policy = &hkv_policy_ctkvr;
    p.dev = g4090;
    p.gpu_cap = 24ULL << 30;
    p.n_ctx = 98304;
    double hb[HKV_PRED_MODES] = {0, 0};
    for (int B = 1; B <= 16; B *= 2) {
        p.batch = B;
        CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
        CHECK(o.fits, "ctkvr 96K x %d fits 24 GiB with its lists on the host: %s", B, o.refusal);
        for (int m = 0; m < HKV_PRED_MODES; m++) {
            CHECK(o.mode[m].host_bytes > hb[m], "ctkvr batch %d mode %d host bytes %.0f after %.0f",
                  B, m, o.mode[m].host_bytes, hb[m]);
            hb[m] = o.mode[m].host_bytes;
            CHECK(o.mode[m].dev_wait_frac >= 0 && o.mode[m].dev_wait_frac <= 1 &&
                  o.mode[m].cpu_wait_frac >= 0 && o.mode[m].cpu_wait_frac <= 1,
                  "wait fractions %.3f %.3f", o.mode[m].dev_wait_frac, o.mode[m].cpu_wait_frac);
        }
        /* built: the centroids read on the device, the lists on the host (as
         * many bytes as the candidate ids the target sends down);
         * target: the lists read on the device too */
        CHECK(o.mode[1].host_bytes <= o.mode[0].host_bytes &&
              o.mode[1].dev_index_bytes > o.mode[0].dev_index_bytes &&
              o.mode[0].dev_index_bytes > 0, "the lists move to the device in the target");
        CHECK(o.C == 2048 && o.rho_p == 1024 && o.rho == 2560 && o.Cp == 4, "ctkvr defaults at 96K");
        CHECK(o.candidates == 4 * 2560 && o.selected == 1024, "candidates %lld selected %lld",
              (long long)o.candidates, (long long)o.selected);
    }
    /* a faster host never makes a step slower */
    p.batch = 4;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    hkv_prediction slow = o;
    p.host_gbs = 400;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    for (int m = 0; m < HKV_PRED_MODES; m++)
        CHECK(o.mode[m].step_s < slow.mode[m].step_s, "mode %d: %.3f ms at 400 GB/s, %.3f at 50", m,
              o.mode[m].step_s * 1e3, slow.mode[m].step_s * 1e3);
    /* decoded tokens add the unindexed tail to the candidates */
    p.n_gen = 4096;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    CHECK(o.candidates == 4 * 2560 + 1024, "tail candidates: %lld", (long long)o.candidates);
    p.n_gen = 0;

    /* full at 96K x 4 does not fit 24 GiB (48 GiB of KV); at 32K x 1 it does */
    p.policy = &hkv_policy_full;
    p.n_ctx = 98304;
    p.batch = 4;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    CHECK(!o.fits, "full 96K x 4 must not fit 24 GiB");
    CHECK(strstr(o.refusal, "batch 4 x context 98304") && strstr(o.refusal, "24.00 GiB"),
          "refusal: %s", o.refusal);
    p.n_ctx = 32768;
    p.batch = 1;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    CHECK(o.fits && !o.refusal[0], "full 32K x 1 fits 24 GiB: %s", o.refusal);
    /* without a cap the device's own memory: 96K x 4 fits an H100 */
    p.gpu_cap = 0;
    p.dev = h100;
    p.n_ctx = 98304;
    p.batch = 4;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK && o.fits, "full 96K x 4 on an H100: %s", o.refusal);
    CHECK(o.cap == h100->mem_bytes, "cap %llu", (unsigned long long)o.cap);
}

static void errors(void) {
    hkv_err err;
    hkv_err_clear(&err);
    CHECK(hkv_device_spec_find("a6000", &err) == NULL && err.code == HKV_E_NOTFOUND, "a6000");
    CHECK(strstr(err.msg, "a6000") && strstr(err.msg, "rtx4090") && strstr(err.msg, "h100") &&
          strstr(err.msg, "h100-pcie"), "message names the known devices: %s", err.msg);
    int n = 0;
    const hkv_device_spec *s = hkv_device_specs(&n);
    CHECK(n >= 3, "%d specs", n);
    for (int i = 0; i < n; i++)
        CHECK(s[i].mem_gbs > 0 && s[i].pcie_gbs > 0 && s[i].tensor_tflops > s[i].fp32_tflops &&
              s[i].sms > 0 && s[i].mem_bytes > (16ULL << 30) && strstr(s[i].source, "https://"),
              "spec %s", s[i].name);
    const hkv_device_spec *h = hkv_device_spec_find("h100", &err), *g = hkv_device_spec_find("rtx4090", &err);
    CHECK(h && h->mem_gbs == 3350 && h->sms == 132 && fabs(h->tensor_tflops - 989.5) < 1, "h100 sheet");
    CHECK(g && g->mem_gbs == 1008 && g->sms == 128 && fabs(g->tensor_tflops - 165.2) < 0.1, "4090 sheet");

    hkv_model_config c = tiny();
    hkv_predict_params p = unit_params(&c);
    hkv_prediction o;
    p.policy = &hkv_policy_quest;
    CHECK(hkv_predict(&p, &o, &err) == HKV_E_UNSUPPORTED && strstr(err.msg, "quest") &&
          strstr(err.msg, "full") && strstr(err.msg, "ctkvr"), "quest: %s", err.msg);
    p.policy = &hkv_policy_ctkvr;
    p.host_gbs = 0;
    CHECK(hkv_predict(&p, &o, &err) == HKV_E_INVAL && strstr(err.msg, "--host-gbs"), "no host: %s",
          err.msg);
    p.host_gbs = 1;
    p.mem_eff = 1.5;
    CHECK(hkv_predict(&p, &o, &err) == HKV_E_RANGE, "efficiency 1.5");
    p.mem_eff = 1;
    p.batch = 0;
    CHECK(hkv_predict(&p, &o, &err) == HKV_E_RANGE, "batch 0");
    p.batch = 1;
    p.dev = NULL;
    CHECK(hkv_predict(&p, &o, &err) == HKV_E_INVAL, "no device");
}

/* Run a command, return its exit status and the first `cap` bytes of its stdout+stderr. */
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
    static char out[1 << 16];
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' plan --predict rtx4090 --synthetic llama3-8b --gpu-mem 24G "
             "--ctx 98304 --batch 1,4 --host-gbs 30 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) == 0, "text: %s", out);
    /* every header line says PREDICTION; the device, its sheet and the host bandwidth are named */
    CHECK(!strncmp(out, "PREDICTION", 10) && strstr(out, "RTX 4090") && strstr(out, "https://") &&
          strstr(out, "30.0 GB/s, given with --host-gbs") && strstr(out, "does not fit: batch 4 x "
          "context 98304 with policy full"), "text output:\n%s", out);
    /* lines are PREDICTION headers, table rows (indented under one) or blank */
    for (const char *l = out; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
        if (strncmp(l, "PREDICTION", 10) && *l != '\n' && strncmp(l, "           ", 11)) {
            CHECK(0, "a line that is neither a PREDICTION header nor a table row: %.80s", l);
            break;
        }
    snprintf(cmd, sizeof cmd, "'%s' plan --predict h100 --synthetic llama3-8b --policy ctkvr "
             "--ctx 32768 --batch 2 --host-gbs 100 --pipeline target --json 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) == 0, "json: %s", out);
    CHECK(!strncmp(out, "{\"prediction\":true", 18) && strstr(out, "\"target\":{") &&
          !strstr(out, "\"built\":{") && strstr(out, "\"host_gbs\":100.0") /* jansson writes 100.0 */ &&
          strstr(out, "\"fits\":true"), "json output:\n%s", out);
    /* the round trip's terms as measured (bench kernels --only sync, the timeline):
     * taken as given, and a slower round trip predicts a slower step */
    double fast = 0, slow = 0;
    snprintf(cmd, sizeof cmd, "'%s' plan --predict h200 --synthetic llama3.1-8b --policy ctkvr "
             "--ctx 32768 --batch 1 --host-gbs 140 --pipeline built -o jsonl 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "\"built_tok_s\":"), "jsonl: %s", out);
    if (strstr(out, "\"built_tok_s\":")) fast = atof(strstr(out, "\"built_tok_s\":") + 14);
    snprintf(cmd, sizeof cmd, "'%s' plan --predict h200 --synthetic llama3.1-8b --policy ctkvr "
             "--ctx 32768 --batch 1 --host-gbs 140 --pipeline built -o jsonl --host-wake-us 550 "
             "--kernel-us 14 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "\"assumptions_t_host_us\":550") &&
          strstr(out, "\"assumptions_t_kernel_us\":14"), "--host-wake-us, --kernel-us: %s", out);
    if (strstr(out, "\"built_tok_s\":")) slow = atof(strstr(out, "\"built_tok_s\":") + 14);
    /* 32 layers x (535 + ~16 x 10) us more a step than the defaults' 12.6 ms */
    CHECK(fast > 0 && slow > 0 && 1 / slow - 1 / fast > 0.015 && 1 / slow - 1 / fast < 0.03,
          "a slower round trip: %g -> %g tok/s", fast, slow);
    /* the host's cores as a ceiling (bench far -t 1 --warm): 2 ms a (sequence,
     * KV head) on 4 cores is 32 x 8 x 0.5 ms = 128 ms of host time a token */
    snprintf(cmd, sizeof cmd, "'%s' plan --predict h200 --synthetic llama3.1-8b --policy ctkvr "
             "--ctx 32768 --batch 1 --host-gbs 140 --pipeline built -o jsonl --host-core-us 2000 "
             "--host-cores 4 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "\"assumptions_host_core_us\":2000") &&
          strstr(out, "\"assumptions_host_cores\":4") && strstr(out, "\"built_host_busy_ms\":128"),
          "--host-core-us, --host-cores: %s", out);
    snprintf(cmd, sizeof cmd, "'%s' plan --predict h200 --synthetic llama3.1-8b --policy ctkvr "
             "--ctx 32768 --batch 1 --host-gbs 140 --host-cores 4 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) != 0 && strstr(out, "--host-core-us"), "--host-cores alone: %s", out);
    snprintf(cmd, sizeof cmd, "'%s' plan --synthetic llama3-8b --host-wake-us 5 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) != 0 && strstr(out, "--predict"), "--host-wake-us alone: %s", out);
    snprintf(cmd, sizeof cmd, "'%s' plan --predict a6000 --synthetic llama3-8b 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) != 0 && strstr(out, "a6000") && strstr(out, "rtx4090, h100, "
          "h200, h100-pcie"), "bad device: %s", out);
    snprintf(cmd, sizeof cmd, "'%s' plan --synthetic llama3-8b --gpu-mem 24G --host-gbs 3 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) != 0 && strstr(out, "--predict"), "--host-gbs alone: %s", out);
    snprintf(cmd, sizeof cmd, "'%s' plan --predict h100 --synthetic llama3-8b --policy quest 2>&1",
             hetkv);
    CHECK(run(cmd, out, sizeof out) != 0 && strstr(out, "full and ctkvr"), "quest: %s", out);
    /* the plan itself is unchanged: --batch N is still its admission check
     * (dense at 96K: one sequence beside Q4 weights under 24 GiB, not two) */
    snprintf(cmd, sizeof cmd, "'%s' plan --synthetic llama3-8b --gpu-mem 24G --ctx 98304 --policy "
             "full --batch 2 2>&1", hetkv);
    CHECK(run(cmd, out, sizeof out) == 1 && strstr(out, "refused"), "plan --batch: %s", out);
}

/* --calibration FILE: bench/predict_fit.py's terms in one flag, the same
 * prediction as the seven flags; a flag given beside it wins; a bad file
 * is refused naming the field. */
static double tok_s_of(const char *out) {
    const char *t = strstr(out, "\"built_tok_s\":");
    return t ? atof(t + 14) : -1;
}

static void calibration_cli(const char *hetkv) {
    static char out[1 << 16];
    char cmd[2048], path[] = "/tmp/hkv_test_calib_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"summary\": {\"device\": \"h200\", \"commits\": [\"abc1234\"], \"params\": "
               "{\"mem_eff\": 0.33, \"attn_eff\": 0.48, \"gemv_row_cost\": 0.22, \"kernel_us\": 12, "
               "\"host_eff\": 0.42, \"host_wake_us\": 268, \"trip_us\": 647}}}\n");
    fclose(f);
    const char *q = "plan --predict rtx4090 --synthetic llama3.1-8b --configs ctkvr --ctx 98304 "
                    "--batch 4 --gpu-mem 24G --host-gbs 70 --pipeline built -o jsonl";
    snprintf(cmd, sizeof cmd, "'%s' %s --calibration %s 2>&1", hetkv, q, path);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "\"assumptions_calibration_device\":\"h200\"") &&
          strstr(out, "\"assumptions_t_trip_us\":647"), "--calibration: %s", out);
    const double cal = tok_s_of(out);
    snprintf(cmd, sizeof cmd, "'%s' %s --mem-eff 0.33 --attn-eff 0.48 --gemv-row-cost 0.22 "
             "--kernel-us 12 --host-eff 0.42 --host-wake-us 268 --trip-us 647 2>&1", hetkv, q);
    CHECK(run(cmd, out, sizeof out) == 0, "the seven flags: %s", out);
    const double flags = tok_s_of(out);
    CHECK(cal > 0 && fabs(cal - flags) < 1e-3 * flags, "file %g tok/s, flags %g", cal, flags);
    snprintf(cmd, sizeof cmd, "'%s' %s --calibration %s --trip-us 0 2>&1", hetkv, q, path);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "\"assumptions_t_trip_us\":0") &&
          tok_s_of(out) > 1.1 * cal, "--trip-us 0 beside the file: %g tok/s after %g",
          tok_s_of(out), cal);
    snprintf(cmd, sizeof cmd, "'%s' plan --predict h200 --synthetic llama3.1-8b --calibration %s "
             "--json 2>&1", hetkv, path);
    CHECK(run(cmd, out, sizeof out) == 0 && strstr(out, "\"calibration\":\"/tmp/hkv_test_calib_"),
          "--json names the file: %.300s", out);
    f = fopen(path, "w");
    fprintf(f, "{\"summary\": {\"params\": {\"mem_eff\": 0.33, \"attn_eff\": 3, \"gemv_row_cost\": 0, "
               "\"kernel_us\": 12, \"host_eff\": 0.42, \"host_wake_us\": 268, \"trip_us\": 0}}}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' %s --calibration %s 2>&1", hetkv, q, path);
    CHECK(run(cmd, out, sizeof out) != 0 && strstr(out, path) && strstr(out, "attn_eff") &&
          strstr(out, "out of range"), "an attention share of 3: %s", out);
    f = fopen(path, "w");
    fprintf(f, "{\"rows\": []}\n");
    fclose(f);
    CHECK(run(cmd, out, sizeof out) != 0 && strstr(out, "summary.params"), "no terms: %s", out);
    snprintf(cmd, sizeof cmd, "'%s' %s --calibration /nonexistent/predict_fit.json 2>&1", hetkv, q);
    CHECK(run(cmd, out, sizeof out) != 0 && strstr(out, "/nonexistent/predict_fit.json"),
          "a missing file: %s", out);
    unlink(path);
}

/* The 8-bit far tier: the rerank's keys and the attended rows at d + d/8
 * bytes (36 at d 32) instead of 2d (64); the index's reads as before. */
static void far_q8_case(void) {
    hkv_model_config c = tiny();
    hkv_policy_args a;
    tiny_ctkvr_args(&a);
    hkv_predict_params p = unit_params(&c);
    p.policy = &hkv_policy_ctkvr;
    p.args = &a;
    p.far_q8 = 1;
    hkv_prediction o;
    hkv_err err;
    CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
    const hkv_predict_mode *b = &o.mode[HKV_PRED_BUILT];
    NEAR(b->host_index_bytes, 8 * 320);
    NEAR(b->host_rerank_bytes, 8 * 80 * 36);
    NEAR(b->host_attn_bytes, 8 * 16 * 36 * 2);
    /* the far tier reserved for the context: 2 layers x 2 KV heads x K, V x
     * 36 bytes a token, 28 fewer than fp16's 64 for each of 1024 tokens */
    NEAR(o.plan.far_per_token, 2 * 2 * 2 * 36);
    hkv_prediction f;
    p.far_q8 = 0;
    CHECK(hkv_predict(&p, &f, &err) == HKV_OK, "%s", err.msg);
    NEAR(f.plan.far_per_token, 2 * 2 * 2 * 64);
    NEAR((double)f.plan.per_seq_pinned - (double)o.plan.per_seq_pinned, 1024.0 * 2 * 2 * 2 * 28);
}

/* ctkvr's key sketches: the rerank reads each candidate's sketch (4-bit:
 * 16 B of codes + 4 B of scale at d 32; int8: 32 + 4), not its far row; the
 * attended rows and the index's reads as before. */
static void sketch_case(void) {
    hkv_model_config c = tiny();
    hkv_err err;
    const struct { const char *kv; int far_q8; double row, attn; } cases[] = {
        {"sketch=3", 1, 20, 36}, {"sketch=2", 0, 36, 64}, {"sketch=0", 1, 36, 36}};
    for (int i = 0; i < 3; i++) {
        hkv_policy_args a;
        tiny_ctkvr_args(&a);
        CHECK(hkv_policy_arg_set(&hkv_policy_ctkvr, &a, cases[i].kv, &err) == HKV_OK, "%s", err.msg);
        hkv_predict_params p = unit_params(&c);
        p.policy = &hkv_policy_ctkvr;
        p.args = &a;
        p.far_q8 = cases[i].far_q8;
        hkv_prediction o;
        CHECK(hkv_predict(&p, &o, &err) == HKV_OK, "%s", err.msg);
        const hkv_predict_mode *b = &o.mode[HKV_PRED_BUILT];
        NEAR(b->host_index_bytes, 8 * 320);
        NEAR(b->host_rerank_bytes, 8 * 80 * cases[i].row);
        NEAR(b->host_attn_bytes, 8 * 16 * cases[i].attn * 2);
    }
}

/* Llama-3-8B's shape on an H200's sheet, a 100 GB/s host, the defaults
 * otherwise; 0 when the shape or the sheet is missing (a CHECK failed). */
static int h200_llama(hkv_model_config *c, hkv_predict_params *p) {
    hkv_err err;
    CHECK(hkv_synthetic_config("llama3-8b", c, &err) == HKV_OK, "%s", err.msg);
    hkv_predict_defaults(p);
    p->cfg = c;
    p->dev = hkv_device_spec_find("h200", &err);
    CHECK(p->dev != NULL, "%s", err.msg);
    p->host_gbs = 100;
    return p->dev != NULL;
}

/* attn_eff: the decode attention alone at its own share of the bandwidth.
 * 0 is mem_eff's; a lower share slows full's step (all attention) and leaves
 * the split's host part and the weights' bytes as they were. */
static void attn_eff_case(void) {
    hkv_model_config c;
    hkv_predict_params p;
    hkv_err err;
    if (!h200_llama(&c, &p)) return;
    p.batch = 1;
    p.n_ctx = 98304;
    p.policy = &hkv_policy_full;
    hkv_prediction a, b, d;
    CHECK(hkv_predict(&p, &a, &err) == HKV_OK, "%s", err.msg);
    p.attn_eff = p.mem_eff;
    CHECK(hkv_predict(&p, &b, &err) == HKV_OK, "%s", err.msg);
    NEAR(b.mode[HKV_PRED_BUILT].step_s, a.mode[HKV_PRED_BUILT].step_s);
    p.attn_eff = p.mem_eff / 2;
    CHECK(hkv_predict(&p, &d, &err) == HKV_OK, "%s", err.msg);
    /* 96K rows of K and V a layer, 12.9 GB a step: at half the share they
     * take twice as long, the rest of the step unchanged */
    const double kv_s = b.mode[HKV_PRED_BUILT].dev_kv_bytes / (p.dev->mem_gbs * 1e9 * p.mem_eff);
    CHECK(fabs(d.mode[HKV_PRED_BUILT].step_s - b.mode[HKV_PRED_BUILT].step_s - kv_s) < 0.02 * kv_s,
          "full 96K: %.3f ms at half the attention share, %.3f ms at mem_eff's, KV alone %.3f ms",
          d.mode[HKV_PRED_BUILT].step_s * 1e3, b.mode[HKV_PRED_BUILT].step_s * 1e3, kv_s * 1e3);
    NEAR(d.mode[HKV_PRED_BUILT].dev_weight_bytes, b.mode[HKV_PRED_BUILT].dev_weight_bytes);
    p.policy = &hkv_policy_ctkvr;
    p.attn_eff = 0;
    CHECK(hkv_predict(&p, &a, &err) == HKV_OK, "%s", err.msg);
    p.attn_eff = 0.1;
    CHECK(hkv_predict(&p, &b, &err) == HKV_OK, "%s", err.msg);
    NEAR(b.mode[HKV_PRED_BUILT].host_busy_s, a.mode[HKV_PRED_BUILT].host_busy_s);
    p.attn_eff = 1.5;
    CHECK(hkv_predict(&p, &b, &err) == HKV_E_RANGE, "attention share 1.5");
}

/* The other measured terms: a GEMV row's cost scales the products of a batch
 * (not of one row); the round trip adds to each layer of the built split
 * (not to the target's, nor to full's); the host's wake is host time. */
static void measured_terms_case(void) {
    hkv_model_config c;
    hkv_predict_params p;
    hkv_err err;
    if (!h200_llama(&c, &p)) return;
    p.n_ctx = 32768;
    p.policy = &hkv_policy_full;
    hkv_prediction a, b;
    for (int batch = 1; batch <= 4; batch += 3) {
        p.batch = batch;
        p.gemv_row_cost = 0;
        CHECK(hkv_predict(&p, &a, &err) == HKV_OK, "%s", err.msg);
        p.gemv_row_cost = 0.25;
        CHECK(hkv_predict(&p, &b, &err) == HKV_OK, "%s", err.msg);
        NEAR(b.mode[HKV_PRED_BUILT].dev_products_s,
             a.mode[HKV_PRED_BUILT].dev_products_s * (1 + 0.25 * (batch - 1)));
        CHECK(a.mode[HKV_PRED_BUILT].dev_products_s > 0 &&
              a.mode[HKV_PRED_BUILT].dev_products_s < a.mode[HKV_PRED_BUILT].dev_busy_s,
              "products %.3f ms of the device's %.3f", a.mode[HKV_PRED_BUILT].dev_products_s * 1e3,
              a.mode[HKV_PRED_BUILT].dev_busy_s * 1e3);
    }
    p.gemv_row_cost = 0;
    p.batch = 1;
    p.t_trip = 500e-6;
    CHECK(hkv_predict(&p, &b, &err) == HKV_OK, "%s", err.msg);
    p.t_trip = 0;
    CHECK(hkv_predict(&p, &a, &err) == HKV_OK, "%s", err.msg);
    NEAR(b.mode[HKV_PRED_BUILT].step_s, a.mode[HKV_PRED_BUILT].step_s);
    p.policy = &hkv_policy_ctkvr;
    CHECK(hkv_predict(&p, &a, &err) == HKV_OK, "%s", err.msg);
    p.t_trip = 500e-6;
    CHECK(hkv_predict(&p, &b, &err) == HKV_OK, "%s", err.msg);
    NEAR(b.mode[HKV_PRED_BUILT].step_s - a.mode[HKV_PRED_BUILT].step_s, c.n_layer * 500e-6);
    NEAR(b.mode[HKV_PRED_TARGET].step_s, a.mode[HKV_PRED_TARGET].step_s);
    p.t_trip = 0;
    p.t_host = 0;
    CHECK(hkv_predict(&p, &b, &err) == HKV_OK, "%s", err.msg);
    NEAR(a.mode[HKV_PRED_BUILT].host_busy_s - b.mode[HKV_PRED_BUILT].host_busy_s, c.n_layer * 15e-6);
    p.t_trip = 2;
    CHECK(hkv_predict(&p, &b, &err) == HKV_E_RANGE, "a round trip of 2 s a layer");
    p.t_trip = 0;
    p.gemv_row_cost = -1;
    CHECK(hkv_predict(&p, &b, &err) == HKV_E_RANGE, "a negative row cost");
}

/* The host's compute ceiling (host_core_s, host_cores): the far part takes
 * at least items x core time / cores; a ceiling below the bandwidth terms
 * changes nothing; it applies to the split's host time alone. */
static void core_ceiling_case(void) {
    hkv_model_config c;
    hkv_predict_params p;
    hkv_err err;
    if (!h200_llama(&c, &p)) return;
    p.n_ctx = 98304;
    p.policy = &hkv_policy_ctkvr;
    p.t_host = 0;
    hkv_prediction a, b;
    for (int batch = 1; batch <= 4; batch += 3) {
        p.batch = batch;
        p.host_core_s = 0;
        CHECK(hkv_predict(&p, &a, &err) == HKV_OK, "%s", err.msg);
        p.host_core_s = 1e-6, p.host_cores = 16;   /* far below the bytes' time */
        CHECK(hkv_predict(&p, &b, &err) == HKV_OK, "%s", err.msg);
        NEAR(b.mode[HKV_PRED_BUILT].host_busy_s, a.mode[HKV_PRED_BUILT].host_busy_s);
        NEAR(b.mode[HKV_PRED_BUILT].step_s, a.mode[HKV_PRED_BUILT].step_s);
        p.host_core_s = 2e-3, p.host_cores = 8;    /* 2 ms a (sequence, KV head) on 8 cores */
        CHECK(hkv_predict(&p, &b, &err) == HKV_OK, "%s", err.msg);
        NEAR(b.mode[HKV_PRED_BUILT].host_busy_s, c.n_layer * (double)batch * c.n_head_kv * 2e-3 / 8);
        CHECK(b.mode[HKV_PRED_BUILT].step_s > a.mode[HKV_PRED_BUILT].step_s + 0.9 *
              (b.mode[HKV_PRED_BUILT].host_busy_s - a.mode[HKV_PRED_BUILT].host_busy_s),
              "batch %d: a core-bound host slows the step: %.2f -> %.2f ms", batch,
              a.mode[HKV_PRED_BUILT].step_s * 1e3, b.mode[HKV_PRED_BUILT].step_s * 1e3);
        p.host_cores = 16;                         /* twice the cores, half the time */
        CHECK(hkv_predict(&p, &a, &err) == HKV_OK, "%s", err.msg);
        NEAR(a.mode[HKV_PRED_BUILT].host_busy_s, b.mode[HKV_PRED_BUILT].host_busy_s / 2);
    }
    p.policy = &hkv_policy_full;   /* no CPU part: nothing to bound */
    p.host_core_s = 0;
    CHECK(hkv_predict(&p, &a, &err) == HKV_OK, "%s", err.msg);
    p.host_core_s = 2e-3;
    CHECK(hkv_predict(&p, &b, &err) == HKV_OK, "%s", err.msg);
    NEAR(b.mode[HKV_PRED_BUILT].step_s, a.mode[HKV_PRED_BUILT].step_s);
    p.host_cores = 0;
    CHECK(hkv_predict(&p, &b, &err) == HKV_E_RANGE, "a core time with no cores");
    p.host_core_s = 0;
}

int main(int argc, char **argv) {
    hand_case();
    core_ceiling_case();
    far_q8_case();
    sketch_case();
    attn_eff_case();
    measured_terms_case();
    llama();
    errors();
    if (argc > 1) {
        cli(argv[1]);
        calibration_cli(argv[1]);
    }
    else printf("(no hetkv binary given: CLI checks skipped)\n");
    if (fails) {
        printf("%d check(s) failed\n", fails);
        return 1;
    }
    printf("all predict checks passed\n");
    return 0;
}

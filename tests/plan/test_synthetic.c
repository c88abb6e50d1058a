/* Synthetic-weight models: shapes, sizes, weight statistics, determinism,
 * and a forward pass through the engine whose logits stay finite. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gpu_plan.h"
#include "synthetic.h"

#include "../check.h"

static void shapes(void) {
    hkv_err err;
    hkv_model_config c;
    CHECK(hkv_synthetic_config("llama3-8b", &c, &err) == HKV_OK, "llama3-8b");
    CHECK(c.n_layer == 32 && c.dim == 4096 && c.n_head == 32 && c.n_head_kv == 8 &&
              c.head_dim == 128 && c.ffn == 14336 && c.vocab == 128256 && c.rope_base == 500000.0f &&
              c.ctx_train == 8192 && !c.tied_output && !c.qkv_bias,
          "llama3-8b shape");
    CHECK(hkv_synthetic_config("llama3.1-8b", &c, &err) == HKV_OK && c.ctx_train == 131072, "3.1");
    CHECK(hkv_synthetic_config("yi-9b", &c, &err) == HKV_OK && c.n_layer == 48 && c.dim == 4096 &&
              c.n_head == 32 && c.n_head_kv == 4 && c.ffn == 11008 && c.vocab == 64000,
          "yi-9b shape");
    CHECK(hkv_synthetic_config("qwen2.5-7b", &c, &err) == HKV_OK && c.n_layer == 28 &&
              c.dim == 3584 && c.n_head == 28 && c.n_head_kv == 4 && c.ffn == 18944 &&
              c.vocab == 152064 && c.qkv_bias && c.rope_layout == HKV_ROPE_NEOX,
          "qwen2.5-7b shape");
    CHECK(hkv_synthetic_config("smollm2-135m", &c, &err) == HKV_OK && c.n_layer == 30 &&
              c.n_head == 9 && c.n_head_kv == 3 && c.head_dim == 64 && c.tied_output,
          "smollm2 shape");
    hkv_err_clear(&err);
    CHECK(hkv_synthetic_config("gpt5", &c, &err) == HKV_E_NOTFOUND && strstr(err.msg, "gpt5") &&
              strstr(err.msg, "llama3-8b"),
          "unknown name named, known listed: %s", err.msg);
    /* Llama-3-8B in Q4 (4 bits + fp16 scale and min per 32 = 5 bits a
     * weight): 8,029,995,008 * 5/8 bytes of matrices, plus fp32 norms and
     * the rope table: about 5.02e9 bytes, checked without building it. */
    hkv_synthetic_config("llama3-8b", &c, &err);
    unsigned long long want = 8029995008ULL / 8 * 5 + 266240ULL * 4 + 64 * 4;
    CHECK(hkv_synthetic_host_bytes(&c, HKV_W_Q4) == want, "llama3-8b q4 host bytes %llu, want %llu",
          (unsigned long long)hkv_synthetic_host_bytes(&c, HKV_W_Q4), want);
    CHECK(hkv_synthetic_host_bytes(&c, HKV_W_F16) == 8029995008ULL * 2 + 266240ULL * 4 + 64 * 4,
          "llama3-8b f16 host bytes");
    CHECK(hkv_synthetic_wtype_parse("q4") == HKV_W_Q4 && hkv_synthetic_wtype_parse("f16") == HKV_W_F16 &&
              hkv_synthetic_wtype_parse("q8") == HKV_W_Q8 && hkv_synthetic_wtype_parse("int3") < 0,
          "weight type names");
}

/* Dequantised weights have mean about 0 and sd about 1/sqrt(fan_in). */
static void weight_stats(const hkv_model *m, const char *what) {
    hkv_cpu_kernels kern;
    hkv_cpu_kernels_init(&kern, HKV_ISA_SCALAR);
    const hkv_wmat *mats[] = {&m->layers[0].qkv[0], &m->layers[1].wdown, &m->output};
    for (int i = 0; i < 3; i++) {
        const hkv_wmat *w = mats[i];
        int64_t rows = w->rows < 64 ? w->rows : 64;
        float *buf = malloc((size_t)rows * w->cols * sizeof(float));
        kern.dequant_rows(w, 0, rows, buf);
        double s = 0, ss = 0;
        const int64_t n = rows * w->cols;
        for (int64_t k = 0; k < n; k++) s += buf[k], ss += (double)buf[k] * buf[k];
        double mean = s / n, sd = sqrt(ss / n - mean * mean), want = 1.0 / sqrt((double)w->cols);
        CHECK(fabs(mean) < 0.05 * want && fabs(sd / want - 1) < 0.05,
              "%s matrix %d: mean %g sd %g, want 0 and %g", what, i, mean, sd, want);
        free(buf);
    }
}

static void build_and_forward(int wtype, const char *what) {
    hkv_err err;
    hkv_model a, b, c;
    CHECK(hkv_synthetic_build(&a, "smollm2-135m", wtype, 7, &err) == HKV_OK, "build: %s", err.msg);
    CHECK(hkv_synthetic_build(&b, "smollm2-135m", wtype, 7, &err) == HKV_OK, "build again");
    CHECK(hkv_synthetic_build(&c, "smollm2-135m", wtype, 8, &err) == HKV_OK, "other seed");
    const hkv_wmat *wa = &a.layers[5].ffn_in[0], *wb = &b.layers[5].ffn_in[0], *wc = &c.layers[5].ffn_in[0];
    /* Compare the whole value buffer of one fused matrix. */
    size_t qb = (size_t)(wa->rows * wa->cols) * (wa->type == HKV_W_Q4 ? 1 : 4) / 2;
    CHECK(!memcmp(wa->q, wb->q, qb), "%s: same seed, same weights", what);
    CHECK(memcmp(wa->q, wc->q, qb), "%s: another seed, other weights", what);
    /* weight_bytes counts the matrices; host_bytes adds norms and the rope table. */
    CHECK(hkv_synthetic_host_bytes(&a.cfg, wtype) ==
              a.weight_bytes + (2ULL * 30 * 576 + 576) * 4 + 32 * 4,
          "%s: host bytes %llu vs built %zu", what,
          (unsigned long long)hkv_synthetic_host_bytes(&a.cfg, wtype), a.weight_bytes);
    weight_stats(&a, what);
    hkv_model_free(&a);
    hkv_model_free(&b);
    hkv_model_free(&c);

    /* Through the engine: a prompt of 12 tokens and 3 decode steps. */
    hkv_engine_params ep;
    hkv_engine_params_default(&ep);
    ep.synthetic = "smollm2-135m";
    ep.synthetic_wtype = wtype;
    ep.max_seqs = 1;
    ep.n_ctx = 64;
    ep.max_rows = 16;
    hkv_engine *e = NULL;
    if (hkv_engine_open(&e, &ep, &err) != HKV_OK) {
        CHECK(0, "engine open: %s", err.msg);
        return;
    }
    CHECK(e->tok == NULL, "no tokenizer");
    CHECK(e->mem.bytes[HKV_TIER_WEIGHTS] == e->model.weight_bytes, "weights accounted");
    const int V = e->model.cfg.vocab;
    float *logits = malloc((size_t)V * sizeof(float));
    int32_t toks[12];
    for (int i = 0; i < 12; i++) toks[i] = (i * 7919 + 13) % V;
    CHECK(e->kv.ops->seq_open(e->kv.self, 0, 64, &err) == HKV_OK, "seq_open: %s", err.msg);
    hkv_seg sg = {.seq = 0, .n = 12, .pos = 0, .row = 0, .flags = HKV_SEG_PROMPT | HKV_SEG_PROMPT_END};
    int64_t last = 11;
    CHECK(hkv_forward(e, toks, 12, &sg, 1, &last, 1, logits, &err) == HKV_OK, "prefill: %s", err.msg);
    for (int step = 0; step < 4; step++) {
        int finite = 1, best = 0;
        double s = 0, ss = 0;
        for (int i = 0; i < V; i++) {
            finite &= isfinite(logits[i]);
            s += logits[i], ss += (double)logits[i] * logits[i];
            if (logits[i] > logits[best]) best = i;
        }
        double sd = sqrt(ss / V - (s / V) * (s / V));
        CHECK(finite, "%s step %d: logits finite", what, step);
        /* Not degenerate: the logits spread, and not so much that softmax is one-hot junk. */
        CHECK(sd > 0.05 && sd < 100, "%s step %d: logit sd %g", what, step, sd);
        if (step == 3) break;
        int32_t t = best;
        hkv_seg d = {.seq = 0, .n = 1, .pos = 12 + step, .row = 0};
        int64_t r0 = 0;
        CHECK(hkv_forward(e, &t, 1, &d, 1, &r0, 1, logits, &err) == HKV_OK, "decode: %s", err.msg);
    }
    free(logits);
    hkv_engine_close(e);
}

static void engine_errors(void) {
    hkv_err err;
    hkv_engine_params ep;
    hkv_engine_params_default(&ep);
    ep.synthetic = "nope-1b";
    hkv_engine *e = NULL;
    hkv_err_clear(&err);
    CHECK(hkv_engine_open(&e, &ep, &err) == HKV_E_NOTFOUND && strstr(err.msg, "nope-1b") && !e,
          "unknown synthetic: %s", err.msg);
    ep.synthetic = "smollm2-135m";
    ep.model_path = "x.gguf";
    CHECK(hkv_engine_open(&e, &ep, &err) == HKV_E_INVAL && strstr(err.msg, "not both"), "both: %s",
          err.msg);
}

int main(void) {
    shapes();
    build_and_forward(HKV_W_Q4, "q4");
    build_and_forward(HKV_W_F16, "f16");
    engine_errors();
    printf("test_synthetic: %s (%d failures)\n", fails ? "FAIL" : "ok", fails);
    return fails ? 1 : 0;
}

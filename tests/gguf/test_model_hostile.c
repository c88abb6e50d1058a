/* Hostile model metadata on a file that opens: hkv_model_load must refuse
 * it with a message, never allocate for what the file cannot hold. */
#include <stdlib.h>

#include "ggml_types.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "model.h"
#include "tcase.h"

/* A llama config (dim 32, one head) with block_count layers and only the
 * token embeddings ([32, 4] f32) as tensors. */
static void config_only(gw *w, uint32_t block_count) {
    const uint64_t ne[2] = {32, 4};
    gw_header(w, 3, 1, 6);
    gw_kv_str(w, "general.architecture", "llama");
    gw_kv_u32(w, "llama.block_count", block_count);
    gw_kv_u32(w, "llama.embedding_length", 32);
    gw_kv_u32(w, "llama.feed_forward_length", 32);
    gw_kv_u32(w, "llama.attention.head_count", 1);
    gw_key(w, "llama.attention.layer_norm_rms_epsilon", HKV_GGUF_F32);
    gw_f32(w, 1e-5f);
    gw_tensor(w, "token_embd.weight", 2, ne, HKV_GGML_F32, 0);
    gw_pad(w, 32);
    for (int i = 0; i < 32 * 4; i++) gw_f32(w, 0.01f * (float)i);
}

static int load(uint32_t block_count, hkv_err *err) {
    gw w = {0};
    config_only(&w, block_count);
    hkv_gguf *g = NULL;
    int rc = hkv_gguf_open_buffer(&g, w.p, w.n, err);
    if (rc == HKV_OK) {
        hkv_model_config cfg;
        rc = hkv_model_config_read(g, &cfg, err);
        if (rc == HKV_OK) {
            hkv_model m;
            rc = hkv_model_load(&m, g, err);
            if (rc == HKV_OK) hkv_model_free(&m);
        } else {
            rc = 12345;   /* the config must read: reported as a code mismatch */
        }
        hkv_gguf_close(g);
    }
    gw_free(&w);
    return rc;
}

/* 2^30 layers in a file of one tensor: the per-layer structs alone would be
 * hundreds of GB (found by fuzz_gguf: an out-of-memory at the calloc). */
static int t_block_count_beyond_tensors(void) {
    hkv_err e;
    hkv_err_clear(&e);
    int rc = load(1u << 30, &e);
    CHECK(rc == HKV_E_FORMAT && strstr(e.msg, "block_count 1073741824"), "rc %s: %s", hkv_status_name(rc), e.msg);
    hkv_err_clear(&e);
    rc = load(1, &e);
    CHECK(rc == HKV_E_FORMAT && strstr(e.msg, "block_count 1 needs at least 11 tensors"), "rc %s: %s",
          hkv_status_name(rc), e.msg);
    return 0;
}

static const tcase cases[] = {
    {"block_count_beyond_tensors", t_block_count_beyond_tensors},
};

int main(int argc, char **argv) {
    return tcase_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}

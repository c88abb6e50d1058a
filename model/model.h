/* A Llama-family model (llama: Llama 2/3, SmolLM2, Mistral; qwen2: QKV bias)
 * loaded from GGUF, weights repacked into the host kernels' formats. */
#ifndef HKV_MODEL_H
#define HKV_MODEL_H

#include <stdint.h>

#include "gguf.h"
#include "kernels.h"
#include "status.h"

enum hkv_arch { HKV_ARCH_LLAMA = 0, HKV_ARCH_QWEN2 = 1 };
enum hkv_rope_layout {
    HKV_ROPE_PAIRS = 0,   /* rotate (x[2i], x[2i+1]): llama GGUF (Q/K permuted by the converter) */
    HKV_ROPE_NEOX = 1,    /* rotate (x[i], x[i+rot/2]): qwen2 */
};

typedef struct hkv_model_config {
    int arch;             /* enum hkv_arch */
    char arch_name[16];
    char name[96];        /* general.name */
    int n_layer;
    int dim;              /* embedding length */
    int n_head;
    int n_head_kv;
    int head_dim;
    int ffn;              /* feed-forward hidden size */
    int vocab;
    int ctx_train;        /* context_length from metadata */
    int rope_dim;         /* rotated dims per head (<= head_dim) */
    int rope_layout;      /* enum hkv_rope_layout */
    float rope_base;
    float rope_scale;     /* linear scaling: positions divided by this (1 = none) */
    float norm_eps;
    int qkv_bias;         /* qwen2 */
    int tied_output;      /* output projection is token_embd */
} hkv_model_config;

/* The most rows whose logits the output head computes in one call: every
 * sequence of a decode step, and up to HKV_HEAD_ROWS of a prompt's rows (a
 * GEMM's worth; hkv_forward_head asks for more in turn). It sizes the logits
 * buffer of both backends and the memory plan's: at 2,048-row prompt chunks
 * a buffer of max_rows logits was 1 GiB for a 128K vocabulary. */
#define HKV_HEAD_ROWS 256
static inline int64_t hkv_head_rows(int64_t max_rows, int64_t max_seqs) {
    const int64_t r = max_rows < HKV_HEAD_ROWS ? max_rows : HKV_HEAD_ROWS;
    return r > max_seqs ? r : max_seqs;
}

typedef struct hkv_layer_weights {
    float *attn_norm;     /* [dim] */
    /* Q, K, V projections: fused into one matrix ([(n_head + 2 n_head_kv)
     * head_dim][dim], n_qkv = 1) when their repacked types agree, else
     * three (n_qkv = 3) whose outputs the forward pass lays side by side. */
    hkv_wmat qkv[3];
    int n_qkv;
    float *bqkv;          /* [(n_head + 2 n_head_kv) head_dim] or NULL */
    hkv_wmat wo;          /* [dim][n_head head_dim] */
    float *ffn_norm;      /* [dim] */
    hkv_wmat ffn_in[2];   /* gate then up: fused ([2 ffn][dim], n_ffn_in = 1) or two */
    int n_ffn_in;
    hkv_wmat wdown;       /* [dim][ffn] */
} hkv_layer_weights;

typedef struct hkv_model {
    hkv_model_config cfg;
    hkv_wmat tok_embd;    /* [vocab][dim]; rows dequantised for lookup */
    hkv_wmat output;      /* [vocab][dim]; aliases tok_embd's buffers when tied */
    float *out_norm;      /* [dim] */
    float *rope_inv_freq; /* [rope_dim/2], with rope_freqs factors applied */
    hkv_layer_weights *layers;
    size_t weight_bytes;  /* bytes of repacked weights held */
    int n_repacked_f16;   /* matrices whose GGUF type had no exact kernel format */
} hkv_model;

/* Read the config from GGUF metadata; errors name the missing or bad key. */
int hkv_model_config_read(const hkv_gguf *g, hkv_model_config *cfg, hkv_err *err);

/* The layer matrices and the head into the FAST products' interleaved
 * layout in groups of g (hkv_wmat_pack; the table's qgemm_pack), the
 * embeddings left in rows for the lookup (a tied head gets its own packed
 * copy). After it only FAST products read the matrices: hkv_matmul refuses
 * them otherwise, and a device upload would read the wrong layout. */
int hkv_model_pack(hkv_model *m, int g, hkv_err *err);

/* Load and repack all weights. The gguf handle may be closed afterwards. */
int hkv_model_load(hkv_model *m, const hkv_gguf *g, hkv_err *err);
void hkv_model_free(hkv_model *m);

/* Repack one GGUF tensor ([rows][cols], ne[0] = cols) into a kernel matrix. */
int hkv_wmat_from_gguf(hkv_wmat *w, const hkv_gguf_tensor *t, int *approx, hkv_err *err);
void hkv_wmat_free(hkv_wmat *w);
/* The kernel format (enum hkv_wtype) a GGUF tensor type repacks into. */
int hkv_wmat_type_for_gguf(int ggml_type);
/* Bytes of every tensor of g once repacked (matrices in their kernel
 * formats, vectors fp32): what the weights take in host memory or on the
 * device, from the tensor table alone (no data read). */
uint64_t hkv_model_repacked_bytes(const hkv_gguf *g);
/* Stack matrices with equal cols and type by rows into one. */
int hkv_wmat_concat(hkv_wmat *out, const hkv_wmat *parts, int n, hkv_err *err);

#endif

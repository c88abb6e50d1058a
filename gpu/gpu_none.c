/* Built without CUDA (-Dcuda=disabled or no nvcc): the GPU tier's C API
 * links and every call says so (HKV_E_UNSUPPORTED), so callers fail with a
 * message instead of a missing symbol. */
#include <string.h>

#include "gpu_forward.h"
#include "gpu_kernels.h"

#define NO_CUDA(err, what) hkv_seterr((err), HKV_E_UNSUPPORTED, "%s: this binary was built without CUDA", (what))

int hkv_gpu_ctx_create(hkv_gpu_ctx **out, int device, const size_t *tier_cap, size_t total_cap,
                       hkv_err *err)
{
    (void)device, (void)tier_cap, (void)total_cap;
    if (out) *out = NULL;
    return NO_CUDA(err, "GPU context");
}
void hkv_gpu_ctx_destroy(hkv_gpu_ctx *ctx) { (void)ctx; }
void *hkv_gpu_ctx_stream(hkv_gpu_ctx *ctx) { (void)ctx; return NULL; }
int hkv_gpu_ctx_sm_count(const hkv_gpu_ctx *ctx) { (void)ctx; return 0; }
int hkv_gpu_ctx_cc(const hkv_gpu_ctx *ctx) { (void)ctx; return 0; }
int hkv_gpu_tensor_split_pays(int cc) { return cc == 80 || cc >= 90; }
int hkv_gpu_ctx_add_stream(hkv_gpu_ctx *ctx, void **stream, hkv_err *err)
{
    (void)ctx;
    if (stream) *stream = NULL;
    return NO_CUDA(err, "GPU stream");
}
void *hkv_gpu_alloc(hkv_gpu_ctx *ctx, int tier, size_t bytes, hkv_err *err)
{
    (void)ctx, (void)tier, (void)bytes;
    NO_CUDA(err, "GPU allocation");
    return NULL;
}
void hkv_gpu_free(hkv_gpu_ctx *ctx, int tier, void *p, size_t bytes) { (void)ctx, (void)tier, (void)p, (void)bytes; }
void *hkv_gpu_alloc_async(hkv_gpu_ctx *ctx, int tier, size_t bytes, void *stream, hkv_err *err)
{
    (void)ctx, (void)tier, (void)bytes, (void)stream;
    NO_CUDA(err, "GPU allocation");
    return NULL;
}
void hkv_gpu_free_async(hkv_gpu_ctx *ctx, int tier, void *p, size_t bytes, void *stream)
{
    (void)ctx, (void)tier, (void)p, (void)bytes, (void)stream;
}
size_t hkv_gpu_in_use(const hkv_gpu_ctx *ctx, int tier) { (void)ctx, (void)tier; return 0; }
size_t hkv_gpu_peak(const hkv_gpu_ctx *ctx, int tier) { (void)ctx, (void)tier; return 0; }
int hkv_gpu_upload(void *dst, const void *src, size_t bytes, void *stream, hkv_err *err)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return NO_CUDA(err, "GPU upload");
}
int hkv_gpu_download(void *dst, const void *src, size_t bytes, void *stream, hkv_err *err)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return NO_CUDA(err, "GPU download");
}
int hkv_gpu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height, void *stream, hkv_err *err)
{
    (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)height, (void)stream;
    return NO_CUDA(err, "GPU copy");
}
int hkv_gpu_upload_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t height, void *stream, hkv_err *err)
{
    (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)height, (void)stream;
    return NO_CUDA(err, "GPU upload");
}
int hkv_gpu_copy(void *dst, const void *src, size_t bytes, void *stream, hkv_err *err)
{
    (void)dst, (void)src, (void)bytes, (void)stream;
    return NO_CUDA(err, "GPU copy");
}
int hkv_gpu_memset(void *dst, int byte, size_t bytes, void *stream, hkv_err *err)
{
    (void)dst, (void)byte, (void)bytes, (void)stream;
    return NO_CUDA(err, "GPU memset");
}
int hkv_gpu_sync(void *stream, hkv_err *err)
{
    (void)stream;
    return NO_CUDA(err, "GPU sync");
}

int hkv_gpu_embed(const uint16_t *table, int64_t vocab, int64_t dim, const int32_t *tokens,
                  int64_t n, float *x, void *stream, hkv_err *err)
{
    (void)table, (void)vocab, (void)dim, (void)tokens, (void)n, (void)x, (void)stream;
    return NO_CUDA(err, "gpu embed");
}
int hkv_gpu_rmsnorm(const float *x, int64_t ldx, const float *w, int64_t n, int dim, float eps,
                    float *y, int64_t ldy, void *stream, hkv_err *err)
{
    (void)x, (void)ldx, (void)w, (void)n, (void)dim, (void)eps, (void)y, (void)ldy, (void)stream;
    return NO_CUDA(err, "gpu rmsnorm");
}
int hkv_gpu_add_rmsnorm(float *x, int64_t ldx, const float *res, int64_t ldr, const float *w,
                        int64_t n, int dim, float eps, float *y, int64_t ldy, void *stream,
                        hkv_err *err)
{
    (void)x, (void)ldx, (void)res, (void)ldr, (void)w, (void)n, (void)dim, (void)eps, (void)y;
    (void)ldy, (void)stream;
    return NO_CUDA(err, "gpu add_rmsnorm");
}
int hkv_gpu_rope_table(const float *inv_freq, int rot, const int64_t *pos, int64_t n, float *cs,
                       void *stream, hkv_err *err)
{
    (void)inv_freq, (void)rot, (void)pos, (void)n, (void)cs, (void)stream;
    return NO_CUDA(err, "gpu rope table");
}
int hkv_gpu_rope(float *x, int64_t ldx, int64_t n, int n_heads, int head_dim, int rot,
                 int layout, const float *cs, void *stream, hkv_err *err)
{
    (void)x, (void)ldx, (void)n, (void)n_heads, (void)head_dim, (void)rot, (void)layout;
    (void)cs, (void)stream;
    return NO_CUDA(err, "gpu rope");
}
int hkv_gpu_swiglu(const float *gu, int64_t n, int64_t F, float *out, void *stream, hkv_err *err)
{
    (void)gu, (void)n, (void)F, (void)out, (void)stream;
    return NO_CUDA(err, "gpu swiglu");
}
int hkv_gpu_add(float *x, const float *y, int64_t n, void *stream, hkv_err *err)
{
    (void)x, (void)y, (void)n, (void)stream;
    return NO_CUDA(err, "gpu add");
}
int hkv_gpu_f32_to_f16(const float *src, uint16_t *dst, int64_t n, void *stream, hkv_err *err)
{
    (void)src, (void)dst, (void)n, (void)stream;
    return NO_CUDA(err, "gpu f32_to_f16");
}
int hkv_gpu_f16_to_f32(const uint16_t *src, float *dst, int64_t n, void *stream, hkv_err *err)
{
    (void)src, (void)dst, (void)n, (void)stream;
    return NO_CUDA(err, "gpu f16_to_f32");
}

int hkv_gpu_attn_prefill(const float *q, int64_t ldq, int64_t nq, int n_head, int n_head_kv,
                         int d, int64_t p0, const uint16_t *k, const uint16_t *v, int64_t ld,
                         int64_t hs, float scale, float *out, int64_t ldo, float *lse,
                         void *stream, hkv_err *err)
{
    (void)q, (void)ldq, (void)nq, (void)n_head, (void)n_head_kv, (void)d, (void)p0, (void)k;
    (void)v, (void)ld, (void)hs, (void)scale, (void)out, (void)ldo, (void)lse, (void)stream;
    return NO_CUDA(err, "gpu prefill attention");
}
int hkv_gpu_attn_prefill_keys(const float *q, int64_t ldq, int64_t nq, int n_head, int n_head_kv,
                              int d, int64_t p0, int64_t nk, const uint16_t *k, const uint16_t *v,
                              int64_t ld, int64_t hs, float scale, float *out, int64_t ldo,
                              float *lse, void *stream, hkv_err *err)
{
    (void)nk;
    return hkv_gpu_attn_prefill(q, ldq, nq, n_head, n_head_kv, d, p0, k, v, ld, hs, scale, out,
                                ldo, lse, stream, err);
}
int hkv_gpu_attn_prefill_with(const float *q, int64_t ldq, int64_t nq, int n_head, int n_head_kv,
                              int d, int64_t p0, int64_t nk, const uint16_t *k, const uint16_t *v,
                              int64_t ld, int64_t hs, float scale, float *out, int64_t ldo,
                              float *lse, hkv_gpu_prefill_kernel kernel, void *stream,
                              hkv_err *err)
{
    (void)nk, (void)kernel;
    return hkv_gpu_attn_prefill(q, ldq, nq, n_head, n_head_kv, d, p0, k, v, ld, hs, scale, out,
                                ldo, lse, stream, err);
}
int hkv_gpu_attn_decode(const float *q, int n_seq, int n_head, int n_head_kv, int d,
                        const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs, int64_t ss,
                        const int32_t *n_rows, const int32_t *idx, int64_t idx_ld, float scale,
                        float *out, float *lse, void *stream, hkv_err *err)
{
    (void)q, (void)n_seq, (void)n_head, (void)n_head_kv, (void)d, (void)k, (void)v, (void)ld;
    (void)hs, (void)ss, (void)n_rows, (void)idx, (void)idx_ld, (void)scale, (void)out, (void)lse;
    (void)stream;
    return NO_CUDA(err, "gpu decode attention");
}
int hkv_gpu_attn_decode_split(const float *q, int n_seq, int n_head, int n_head_kv, int d,
                              const uint16_t *k, const uint16_t *v, int64_t ld, int64_t hs,
                              int64_t ss, const int32_t *n_rows, const int32_t *idx,
                              int64_t idx_ld, float scale, float *out, float *lse, int n_split,
                              void *ws, size_t ws_bytes, void *stream, hkv_err *err)
{
    (void)q, (void)n_seq, (void)n_head, (void)n_head_kv, (void)d, (void)k, (void)v, (void)ld;
    (void)hs, (void)ss, (void)n_rows, (void)idx, (void)idx_ld, (void)scale, (void)out, (void)lse;
    (void)n_split, (void)ws, (void)ws_bytes, (void)stream;
    return NO_CUDA(err, "gpu decode attention");
}
int hkv_gpu_attn_decode_split_q(const float *q, int64_t ldq, int n_seq, int n_head, int n_head_kv,
                                int d, const uint16_t *k, const uint16_t *v, int64_t ld,
                                int64_t hs, int64_t ss, const int32_t *n_rows, const int32_t *idx,
                                int64_t idx_ld, float scale, float *out, float *lse, int n_split,
                                void *ws, size_t ws_bytes, void *stream, hkv_err *err)
{
    (void)ldq;
    return hkv_gpu_attn_decode_split(q, n_seq, n_head, n_head_kv, d, k, v, ld, hs, ss, n_rows, idx,
                                     idx_ld, scale, out, lse, n_split, ws, ws_bytes, stream, err);
}
size_t hkv_gpu_attn_decode_ws_bytes(int n_seq, int n_head, int d, int n_split)
{
    (void)n_seq, (void)n_head, (void)d, (void)n_split;
    return 0;
}
int hkv_gpu_attn_decode_splits(int sm_count, int n_seq, int n_head, int n_head_kv,
                               int64_t max_rows)
{
    (void)sm_count, (void)n_seq, (void)n_head, (void)n_head_kv, (void)max_rows;
    return 1;
}
int hkv_gpu_attn_merge(float *out_a, float *lse_a, const float *out_b, const float *lse_b,
                       int64_t n, int d, void *stream, hkv_err *err)
{
    (void)out_a, (void)lse_a, (void)out_b, (void)lse_b, (void)n, (void)d, (void)stream;
    return NO_CUDA(err, "gpu attention merge");
}

size_t hkv_gpu_ctkvr_recall_ws_bytes(const hkv_gpu_ctkvr *ix, int64_t max_far)
{
    (void)ix, (void)max_far;
    return 0;
}
int hkv_gpu_ctkvr_recall(const hkv_gpu_ctkvr *ix, const float *q, int64_t Cp, const int64_t *far,
                         int64_t max_far, int32_t *cand, int64_t cand_cap, int32_t *n_cand,
                         void *ws, size_t ws_bytes, void *stream, hkv_err *err)
{
    (void)ix, (void)q, (void)Cp, (void)far, (void)max_far, (void)cand, (void)cand_cap;
    (void)n_cand, (void)ws, (void)ws_bytes, (void)stream;
    return NO_CUDA(err, "gpu ctkvr recall");
}
int hkv_gpu_ctkvr_dcu(const hkv_gpu_ctkvr *ix, const float *q, const int32_t *sel, int64_t sel_ld,
                      const int32_t *n_sel, void *stream, hkv_err *err)
{
    (void)ix, (void)q, (void)sel, (void)sel_ld, (void)n_sel, (void)stream;
    return NO_CUDA(err, "gpu ctkvr dcu");
}
size_t hkv_gpu_ctkvr_build_ws_bytes(int64_t n_far, int64_t n_centroids)
{
    (void)n_far, (void)n_centroids;
    return 0;
}
int hkv_gpu_ctkvr_build(const hkv_gpu_ctkvr *ix, int s, const uint16_t *q, int64_t ldq, int64_t n,
                        const int32_t *slot, const uint16_t *k, int64_t ld, int64_t hs,
                        int64_t lo, int64_t hi, void *ws, size_t ws_bytes, void *stream,
                        hkv_err *err)
{
    (void)ix, (void)s, (void)q, (void)ldq, (void)n, (void)slot, (void)k, (void)ld, (void)hs;
    (void)lo, (void)hi, (void)ws, (void)ws_bytes, (void)stream;
    return NO_CUDA(err, "gpu ctkvr build");
}
int hkv_gpu_ctkvr_build_with(const hkv_gpu_ctkvr *ix, int s, const uint16_t *q, int64_t ldq,
                             int64_t n, const int32_t *slot, const uint16_t *k, int64_t ld,
                             int64_t hs, int64_t lo, int64_t hi, void *ws, size_t ws_bytes,
                             hkv_gpu_scores_kernel kernel, void *stream, hkv_err *err)
{
    (void)kernel;
    return hkv_gpu_ctkvr_build(ix, s, q, ldq, n, slot, k, ld, hs, lo, hi, ws, ws_bytes, stream,
                               err);
}

size_t hkv_gpu_window_scores_ws_bytes(int64_t W, int n_head, int64_t n)
{
    (void)W, (void)n_head, (void)n;
    return 0;
}
int hkv_gpu_window_scores(const uint16_t *q, int64_t ldq, int64_t W, int64_t pos0, int n_head,
                          int n_head_kv, int d, const uint16_t *k, int64_t ld, int64_t hs,
                          int64_t lo, int64_t n, const int32_t *rows, int64_t rows_ld,
                          const int32_t *n_rows, const float *q_weight, int reduce_max,
                          float *out, int64_t ld_out, void *ws, size_t ws_bytes, void *stream,
                          hkv_err *err)
{
    (void)q, (void)ldq, (void)W, (void)pos0, (void)n_head, (void)n_head_kv, (void)d, (void)k;
    (void)ld, (void)hs, (void)lo, (void)n, (void)rows, (void)rows_ld, (void)n_rows, (void)q_weight;
    (void)reduce_max, (void)out, (void)ld_out, (void)ws, (void)ws_bytes, (void)stream;
    return NO_CUDA(err, "gpu window scores");
}
int hkv_gpu_pool(const float *in, int64_t ld_in, float *out, int64_t ld_out, int n_batch,
                 int64_t n, const int32_t *n_len, int kernel, int avg, void *stream,
                 hkv_err *err)
{
    (void)in, (void)ld_in, (void)out, (void)ld_out, (void)n_batch, (void)n, (void)n_len;
    (void)kernel, (void)avg, (void)stream;
    return NO_CUDA(err, "gpu pool");
}
int hkv_gpu_keep(const float *s, int64_t lds, int n_batch, int64_t n, const int32_t *n_len,
                 const int32_t *rows, int64_t rows_ld, int64_t lo, int64_t k, int64_t force_from,
                 int32_t *out, int64_t out_ld, int32_t *n_out, void *stream, hkv_err *err)
{
    (void)s, (void)lds, (void)n_batch, (void)n, (void)n_len, (void)rows, (void)rows_ld, (void)lo;
    (void)k, (void)force_from, (void)out, (void)out_ld, (void)n_out, (void)stream;
    return NO_CUDA(err, "gpu keep");
}
int hkv_gpu_quest_extend(uint16_t *bounds, int64_t np_cap, int n_head_kv, int d, int64_t P,
                         const uint16_t *k, int64_t ld, int64_t hs, int64_t lo, int64_t from,
                         int64_t to, void *stream, hkv_err *err)
{
    (void)bounds, (void)np_cap, (void)n_head_kv, (void)d, (void)P, (void)k, (void)ld, (void)hs;
    (void)lo, (void)from, (void)to, (void)stream;
    return NO_CUDA(err, "gpu quest extend");
}
int hkv_gpu_quest_fold(uint16_t *bounds, int64_t np_cap, int n_head_kv, int d, int64_t P,
                       const uint16_t *k, int64_t hs, int64_t lo, int64_t pos, void *stream,
                       hkv_err *err)
{
    (void)bounds, (void)np_cap, (void)n_head_kv, (void)d, (void)P, (void)k, (void)hs, (void)lo;
    (void)pos, (void)stream;
    return NO_CUDA(err, "gpu quest fold");
}
size_t hkv_gpu_quest_select_ws_bytes(int n_head_kv, int64_t n_far, int64_t P, int64_t K)
{
    (void)n_head_kv, (void)n_far, (void)P, (void)K;
    return 0;
}
int hkv_gpu_quest_select(const uint16_t *bounds, int64_t np_cap, int n_head_kv, int g, int d,
                         int64_t P, int64_t K, const float *q, int64_t lo, int64_t hi, int32_t *out,
                         int64_t out_ld, int32_t *n_out, void *ws, size_t ws_bytes, void *stream,
                         hkv_err *err)
{
    (void)bounds, (void)np_cap, (void)n_head_kv, (void)g, (void)d, (void)P, (void)K, (void)q;
    (void)lo, (void)hi, (void)out, (void)out_ld, (void)n_out, (void)ws, (void)ws_bytes, (void)stream;
    return NO_CUDA(err, "gpu quest select");
}
int hkv_gpu_rocketkv_bounds(const int32_t *cand, int64_t cap, const int32_t *n_cand, int n_head_kv,
                            int d, int64_t page, int64_t pcap, int64_t pg_from, const uint16_t *k,
                            int64_t ld, int64_t hs, uint16_t *bnd, void *stream, hkv_err *err)
{
    (void)cand, (void)cap, (void)n_cand, (void)n_head_kv, (void)d, (void)page, (void)pcap;
    (void)pg_from, (void)k, (void)ld, (void)hs, (void)bnd, (void)stream;
    return NO_CUDA(err, "gpu rocketkv bounds");
}
int hkv_gpu_rocketkv_push(int32_t *cand, int64_t cap, int32_t *n_cand, int n_head_kv, int d,
                          int64_t page, int64_t pcap, uint16_t *bnd, const uint16_t *k, int64_t hs,
                          int64_t pos, void *stream, hkv_err *err)
{
    (void)cand, (void)cap, (void)n_cand, (void)n_head_kv, (void)d, (void)page, (void)pcap;
    (void)bnd, (void)k, (void)hs, (void)pos, (void)stream;
    return NO_CUDA(err, "gpu rocketkv push");
}
size_t hkv_gpu_rocketkv_hsa_ws_bytes(int n_head_kv, int g, int64_t cap, int64_t page)
{
    (void)n_head_kv, (void)g, (void)cap, (void)page;
    return 0;
}
int hkv_gpu_rocketkv_hsa(const uint16_t *bnd, int64_t pcap, const int32_t *cand, int64_t cap,
                         const int32_t *n_cand, int n_head_kv, int g, int d, int64_t page,
                         int64_t dims, int64_t k, const float *q, int32_t *out, int64_t out_ld,
                         int32_t *n_out, void *ws, size_t ws_bytes, void *stream, hkv_err *err)
{
    (void)bnd, (void)pcap, (void)cand, (void)cap, (void)n_cand, (void)n_head_kv, (void)g, (void)d;
    (void)page, (void)dims, (void)k, (void)q, (void)out, (void)out_ld, (void)n_out, (void)ws;
    (void)ws_bytes, (void)stream;
    return NO_CUDA(err, "gpu rocketkv hsa");
}
int hkv_gpu_rocketkv_hsa_part(const uint16_t *bnd, int64_t pcap, const int32_t *cand, int64_t cap,
                              const int32_t *n_cand, int n_head_kv, int g, int d, int64_t page,
                              int64_t dims, int64_t k, const float *q, int32_t *out, int64_t out_ld,
                              int32_t *n_out, void *ws, size_t ws_bytes, int part, void *stream,
                              hkv_err *err)
{
    (void)bnd, (void)pcap, (void)cand, (void)cap, (void)n_cand, (void)n_head_kv, (void)g, (void)d;
    (void)page, (void)dims, (void)k, (void)q, (void)out, (void)out_ld, (void)n_out, (void)ws;
    (void)ws_bytes, (void)part, (void)stream;
    return NO_CUDA(err, "gpu rocketkv hsa");
}

int hkv_gpu_qmat_upload(hkv_gpu_ctx *ctx, const hkv_wmat *src, hkv_gpu_qmat *dst, void *stream,
                        hkv_err *err)
{
    (void)ctx, (void)src, (void)stream;
    if (dst) memset(dst, 0, sizeof *dst);
    return NO_CUDA(err, "gpu qmat upload");
}
void hkv_gpu_qmat_free(hkv_gpu_ctx *ctx, hkv_gpu_qmat *w)
{
    (void)ctx;
    if (w) memset(w, 0, sizeof *w);
}
int hkv_gpu_qmat_clone(hkv_gpu_ctx *ctx, const hkv_gpu_qmat *src, hkv_gpu_qmat *dst, void *stream,
                       hkv_err *err)
{
    (void)ctx, (void)src, (void)stream;
    if (dst) memset(dst, 0, sizeof *dst);
    return NO_CUDA(err, "gpu qmat clone");
}
int hkv_gpu_qmat_rows(const hkv_gpu_qmat *w, const int32_t *ids, int64_t n, float *dst,
                      int64_t ld_dst, void *stream, hkv_err *err)
{
    (void)w, (void)ids, (void)n, (void)dst, (void)ld_dst, (void)stream;
    return NO_CUDA(err, "gpu qmat rows");
}
size_t hkv_gpu_qmat_matmul_ws_bytes(const hkv_gpu_qmat *w, int64_t max_n)
{
    (void)w, (void)max_n;
    return 0;
}
int hkv_gpu_qmat_matmul(hkv_gpu_ctx *ctx, const hkv_gpu_qmat *w, const float *x, int64_t ldx,
                        int64_t n, float *y, int64_t ldy, void *ws, size_t ws_bytes, void *stream,
                        hkv_err *err)
{
    (void)ctx, (void)w, (void)x, (void)ldx, (void)n, (void)y, (void)ldy, (void)ws, (void)ws_bytes;
    (void)stream;
    return NO_CUDA(err, "gpu qmat matmul");
}
int hkv_gpu_copy_rows(float *dst, int64_t ld_dst, const int32_t *dst_rows, const float *src,
                      int64_t ld_src, const int32_t *src_rows, int64_t n, int64_t cols,
                      void *stream, hkv_err *err)
{
    (void)dst, (void)ld_dst, (void)dst_rows, (void)src, (void)ld_src, (void)src_rows, (void)n;
    (void)cols, (void)stream;
    return NO_CUDA(err, "gpu copy rows");
}
int hkv_gpu_add_bias(float *x, int64_t ldx, int64_t n, const float *b, int64_t cols, void *stream,
                     hkv_err *err)
{
    (void)x, (void)ldx, (void)n, (void)b, (void)cols, (void)stream;
    return NO_CUDA(err, "gpu add bias");
}
int hkv_gpu_kv_append(const float *qkv, int64_t ld, int64_t n, int64_t k_off, int64_t v_off,
                      int n_head_kv, int d, const int64_t *dst, int64_t hs, uint16_t *k_cache,
                      uint16_t *v_cache, void *stream, hkv_err *err)
{
    (void)qkv, (void)ld, (void)n, (void)k_off, (void)v_off, (void)n_head_kv, (void)d, (void)dst;
    (void)hs, (void)k_cache, (void)v_cache, (void)stream;
    return NO_CUDA(err, "gpu kv append");
}
int hkv_gpu_kv_append_q8(const float *qkv, int64_t ld, int64_t n, int64_t k_off, int64_t v_off,
                         int n_head_kv, int d, const int64_t *dst, int64_t hs, uint16_t *k_cache,
                         uint16_t *v_cache, void *stream, hkv_err *err)
{
    (void)qkv, (void)ld, (void)n, (void)k_off, (void)v_off, (void)n_head_kv, (void)d, (void)dst;
    (void)hs, (void)k_cache, (void)v_cache, (void)stream;
    return NO_CUDA(err, "gpu kv append q8");
}
int hkv_gpu_partial_clear(float *out, int64_t ldo, float *lse, int64_t n, int n_head, int d,
                          void *stream, hkv_err *err)
{
    (void)out, (void)ldo, (void)lse, (void)n, (void)n_head, (void)d, (void)stream;
    return NO_CUDA(err, "gpu partial clear");
}
int hkv_gpu_scatter_u16(uint16_t *dst, const int64_t *off, const uint16_t *src, int64_t n,
                        int64_t n16, void *stream, hkv_err *err)
{
    (void)dst, (void)off, (void)src, (void)n, (void)n16, (void)stream;
    return NO_CUDA(err, "gpu scatter");
}
size_t hkv_gpu_recall_top_ws_bytes(int64_t n_rows, int n_head_kv, int64_t C_max)
{
    (void)n_rows, (void)n_head_kv, (void)C_max;
    return 0;
}
int hkv_gpu_recall_top(const hkv_gpu_recall_row *rows, int64_t n_rows, const float *q,
                       int64_t ld_q, int n_head, int n_head_kv, int d, int64_t k_cap,
                       int64_t C_max, int32_t *slot, float *score, int32_t *n_top, void *ws,
                       size_t ws_bytes, void *stream, hkv_err *err)
{
    (void)rows, (void)n_rows, (void)q, (void)ld_q, (void)n_head, (void)n_head_kv, (void)d;
    (void)k_cap, (void)C_max, (void)slot, (void)score, (void)n_top, (void)ws, (void)ws_bytes;
    (void)stream;
    return NO_CUDA(err, "gpu recall");
}

/* Device pieces of the forward pass that the CUDA backend (pipeline/) needs
 * beside gpu_kernels.h: weights kept on the device in their repacked host
 * formats (4/8-bit, fp16, fp32) with dequantising products, and row
 * movement (gather/scatter of activation rows, K/V appends to the near tier,
 * bias rows). C API usable from C11, conventions of gpu_kernels.h.
 *
 * Why the repacked formats rather than fp16: an 8B model is 16 GB in fp16,
 * two thirds of a 24 GB card; in Q4 it is 4.5 GB and leaves the rest to the
 * near tier and the batch. The products dequantise on the fly (batch-1 and
 * small-batch GEMV, memory-bound: reading 4 bits per weight is the win) or
 * by row panels into a workspace followed by an fp32 cuBLAS GEMM (prefill,
 * compute-bound). Accumulation is fp32 throughout, inputs fp32, so results
 * track the host path (cpu/kernels.h's hkv_matmul) to summation order. */
#ifndef HKV_GPU_FORWARD_H
#define HKV_GPU_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "gpu_ctx.h"
#include "kernels.h"   /* hkv_wmat, enum hkv_wtype */

#ifdef __cplusplus
extern "C" {
#endif

/* How hkv_gpu_qmat_matmul runs products of more than 8 rows (gpu/qmat.cu):
 * SPLIT: weights and activations as fp16 hi + lo parts, tensor
 * cores, 3 fp16 products' work, ~2^-22 relative error per product (~fp32);
 * FP16: hi parts only, 1 product, ~2^-11 relative per product (not accurate
 * enough for the host-parity tests; an explicit choice); FP32: fp32 panels
 * and an fp32 CUDA-core GEMM, what upload sets for now (bit-identical to the
 * host under the emulator, which pipeline_prompt_growth's ctkvr near-ties
 * need; also faster than SPLIT where fp32-accumulate tensor throughput is
 * under 3x the fp32 one, e.g. RTX 4090). */
enum hkv_qmat_gemm { HKV_QMAT_GEMM_SPLIT = 0, HKV_QMAT_GEMM_FP16 = 1, HKV_QMAT_GEMM_FP32 = 2 };

/* Output rows per warp of the Q4 GEMV (n <= 8): AUTO (upload's choice) takes
 * two for matrices of 4096 rows or more, else one; ROW1, ROW2 and ROW4 (four
 * rows, from n = 4; below it two) force it (the kernel benchmark measures
 * each; four is not AUTO's until measured on a GPU, gpu/qmat_gemv.cu says why). A
 * row's sums are the same bits whichever it is. Other types ignore it. */
enum hkv_qmat_gemv { HKV_QMAT_GEMV_AUTO = 0, HKV_QMAT_GEMV_ROW1 = 1, HKV_QMAT_GEMV_ROW2 = 2,
                     HKV_QMAT_GEMV_ROW4 = 3 };

/* A weight matrix on the device in the layout of hkv_wmat (cpu/kernels.h):
 * q, scale, min are device copies of the host arrays (scale/min only for
 * Q8/Q4). */
typedef struct hkv_gpu_qmat {
    int type;            /* enum hkv_wtype */
    int64_t rows, cols;
    void *q;
    uint16_t *scale, *min;
    size_t bytes;        /* device bytes held (WEIGHTS tier) */
    int gemm;            /* enum hkv_qmat_gemm; upload sets FP32, callers may change it
                          * (then size workspaces after the change) */
    int gemv;            /* enum hkv_qmat_gemv; upload sets AUTO */
    int64_t panel_rows;  /* GEMM path: weight rows dequantised per cuBLAS call; upload
                          * sets 0, qmat_panel.h's rule (size workspaces after a change) */
    float wscale;        /* set by upload: the power of two taking max |W| to [2^14, 2^15)
                          * for the fp16 parts (1 for F16 weights) */
} hkv_gpu_qmat;

/* Copy src as it is (no conversion) to the WEIGHTS tier; dst->bytes is
 * hkv_wmat_bytes(src). Returns after the copies on `stream` are done (the
 * host arrays may be pageable). Errors: bad matrix (HKV_E_INVAL: unknown
 * type, empty, Q8/Q4 with cols % 32 != 0, missing arrays), the tier cap
 * (HKV_E_CAPACITY, message with sizes); on any error nothing stays
 * allocated and *dst is zeroed. */
int hkv_gpu_qmat_upload(hkv_gpu_ctx *ctx, const hkv_wmat *src, hkv_gpu_qmat *dst, void *stream,
                        hkv_err *err);
void hkv_gpu_qmat_free(hkv_gpu_ctx *ctx, hkv_gpu_qmat *w);
/* dst = a second device copy of src (device-to-device on `stream`, the same
 * type, gemm mode and wscale; WEIGHTS tier). The kernel benchmark rotates
 * through such copies so that no call finds its weights in L2. On error
 * nothing stays allocated and *dst is zeroed. */
int hkv_gpu_qmat_clone(hkv_gpu_ctx *ctx, const hkv_gpu_qmat *src, hkv_gpu_qmat *dst, void *stream,
                       hkv_err *err);

/* dst[i][0..cols) = row ids[i] of W dequantised to fp32 (i < n, row stride
 * ld_dst >= cols; ids device int32, an id outside [0, rows) gives a NaN
 * row). The embedding lookup. Bit for bit the host's dequant_rows (fp16
 * scale times code is exact in fp32, so every ISA level agrees). */
int hkv_gpu_qmat_rows(const hkv_gpu_qmat *w, const int32_t *ids, int64_t n, float *dst,
                      int64_t ld_dst, void *stream, hkv_err *err);

/* Workspace bytes of hkv_gpu_qmat_matmul for w and calls of at most max_n
 * rows: 0 when max_n <= 8 (the GEMV); else the dequantised row panel (about
 * 32 MiB, at least 2,048 rows or the whole matrix: gpu/qmat_panel.h) and, for
 * the fp16 modes, the split activations of min(max_n, 2048) rows (cols * 4 +
 * 4 bytes each; longer calls run in 2,048-row chunks, so this stays
 * bounded); FP32 mode with F32 weights: 0. */
size_t hkv_gpu_qmat_matmul_ws_bytes(const hkv_gpu_qmat *w, int64_t max_n);

/* y[i][r] = sum_c W[r][c] x[i][c] for i < n: x fp32 [n][cols] (row stride
 * ldx >= cols), y fp32 rows at stride ldy >= rows (y must not overlap x or
 * ws; y[i][rows..ldy) is not written). n <= 8: GEMV dequantising on the fly,
 * fp32 sums, ws unused (may be NULL); larger n: panels of W dequantised into
 * ws then cuBLAS GEMMs as w->gemm says (SPLIT: fp16 hi + lo on tensor
 * cores, ~fp32 accuracy; FP32: CUDA cores), ws device memory of at least
 * hkv_gpu_qmat_matmul_ws_bytes(w, n) bytes (else HKV_E_INVAL); ws is in use
 * until the work on `stream` is done. Dequantised weights equal the host
 * path's bit for bit; sums are in another order than hkv_matmul's. */
int hkv_gpu_qmat_matmul(hkv_gpu_ctx *ctx, const hkv_gpu_qmat *w, const float *x, int64_t ldx,
                        int64_t n, float *y, int64_t ldy, void *ws, size_t ws_bytes, void *stream,
                        hkv_err *err);

/* dst[dst_rows ? dst_rows[i] : i][0..cols) = src[src_rows ? src_rows[i] : i][0..cols), i < n,
 * fp32 rows at strides ld_dst, ld_src >= cols (row lists device int32; a
 * negative entry in either list skips that i; no aliasing, and no two i with
 * the same destination row). */
int hkv_gpu_copy_rows(float *dst, int64_t ld_dst, const int32_t *dst_rows, const float *src,
                      int64_t ld_src, const int32_t *src_rows, int64_t n, int64_t cols,
                      void *stream, hkv_err *err);

/* x[r][j] += b[j] for r < n, j < cols (the QKV bias). */
int hkv_gpu_add_bias(float *x, int64_t ldx, int64_t n, const float *b, int64_t cols, void *stream,
                     hkv_err *err);

/* Append K and V of n batch rows to fp16 caches: row r's KV head h
 * (fp32 at qkv + r*ld + k_off + h*d, V at v_off) goes, rounded to fp16 as
 * hkv_gpu_f32_to_f16, to k_cache + dst[r] + h*hs (v_cache likewise), h <
 * n_head_kv; dst[r] < 0 skips the row (device int64 [n], element offsets).
 * Needs ld >= k_off + n_head_kv*d and >= v_off + n_head_kv*d, hs >= d when
 * n_head_kv > 1. */
int hkv_gpu_kv_append(const float *qkv, int64_t ld, int64_t n, int64_t k_off, int64_t v_off,
                      int n_head_kv, int d, const int64_t *dst, int64_t hs, uint16_t *k_cache,
                      uint16_t *v_cache, void *stream, hkv_err *err);
/* As hkv_gpu_kv_append, each 32 values of a head rounded as the host's 8-bit
 * far tier stores them (index/far_rows.h: a prompt's rows on the device read
 * what the host path reads); d a multiple of 32. */
int hkv_gpu_kv_append_q8(const float *qkv, int64_t ld, int64_t n, int64_t k_off, int64_t v_off,
                         int n_head_kv, int d, const int64_t *dst, int64_t hs, uint16_t *k_cache,
                         uint16_t *v_cache, void *stream, hkv_err *err);

/* out[i][0..n_head*d) = 0 and lse[i][0..n_head) = -inf for the rows of a
 * partial (n rows of n_head heads of d; row strides ldo >= n_head*d, and
 * n_head for lse): the empty partial that the exact merge leaves the other
 * side's value in. */
int hkv_gpu_partial_clear(float *out, int64_t ldo, float *lse, int64_t n, int n_head, int d,
                          void *stream, hkv_err *err);

/* dst + off[i] receives the n16 16-bit values of src + i*n16, i < n (device:
 * off int64 [n] element offsets, src fp16/u16 [n][n16]); off[i] < 0 skips
 * it. Rows written by a host policy reach its device mirror this way. */
int hkv_gpu_scatter_u16(uint16_t *dst, const int64_t *off, const uint16_t *src, int64_t n,
                        int64_t n16, void *stream, hkv_err *err);

/* ---- recall over FIFO tables of unit rows (recall_top.cu) ------------------- */

/* One query row's recall: the batch row whose query heads it takes, its
 * table (fp16 [C][n_head][d], unit rows; KV head h's are the g heads h*g ..
 * of each slot), the table's FIFO per KV head (int32 [n_head_kv][2]: oldest
 * slot, slots in use; the valid slots are (oldest + i) % C, i < in use) and
 * how many slots to recall. Pointers are device memory. */
typedef struct hkv_gpu_recall_row {
    const uint16_t *tab;
    const int32_t *fifo;
    int64_t row, C, k;
} hkv_gpu_recall_row;

size_t hkv_gpu_recall_top_ws_bytes(int64_t n_rows, int n_head_kv, int64_t C_max);

/* For each of n_rows descriptors (device array) and KV head h, at = row *
 * n_head_kv + h: the cosine of the unit query heads (q + row*ld_q, fp32
 * [n_head][d]; sum of squares in float64 as the host) with each valid slot
 * of the table, max over h's group, and the top min(k, k_cap, in use) slots
 * (ties to the older) into slot[at*k_cap ..], their cosines into score,
 * their count into n_top[at]. Entries of batch rows without a descriptor
 * are not written. C <= C_max; ws as hkv_gpu_recall_top_ws_bytes. */
int hkv_gpu_recall_top(const hkv_gpu_recall_row *rows, int64_t n_rows, const float *q,
                       int64_t ld_q, int n_head, int n_head_kv, int d, int64_t k_cap,
                       int64_t C_max, int32_t *slot, float *score, int32_t *n_top, void *ws,
                       size_t ws_bytes, void *stream, hkv_err *err);

#ifdef __cplusplus
}
#endif

#endif

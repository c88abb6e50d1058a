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

/* A weight matrix on the device in the layout of hkv_wmat (cpu/kernels.h):
 * q, scale, min are device copies of the host arrays (scale/min only for
 * Q8/Q4). */
typedef struct hkv_gpu_qmat {
    int type;            /* enum hkv_wtype */
    int64_t rows, cols;
    void *q;
    uint16_t *scale, *min;
    size_t bytes;        /* device bytes held (WEIGHTS tier) */
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

/* dst[i][0..cols) = row ids[i] of W dequantised to fp32 (i < n, row stride
 * ld_dst >= cols; ids device int32, an id outside [0, rows) gives a NaN
 * row). The embedding lookup. Bit for bit the host's dequant_rows (fp16
 * scale times code is exact in fp32, so every ISA level agrees). */
int hkv_gpu_qmat_rows(const hkv_gpu_qmat *w, const int32_t *ids, int64_t n, float *dst,
                      int64_t ld_dst, void *stream, hkv_err *err);

/* Workspace bytes of hkv_gpu_qmat_matmul for w (the dequantised row panel
 * of the GEMM path, about 4 MiB and at least 128 rows or the whole matrix;
 * 0 for F32 matrices). */
size_t hkv_gpu_qmat_matmul_ws_bytes(const hkv_gpu_qmat *w);

/* y[i][r] = sum_c W[r][c] x[i][c] for i < n: x fp32 [n][cols] (row stride
 * ldx >= cols), y fp32 rows at stride ldy >= rows (y must not overlap x or
 * ws; y[i][rows..ldy) is not written). n <= 8: GEMV dequantising on the fly,
 * ws unused (may be NULL); larger n: panels of W dequantised into ws then
 * cuBLAS fp32 GEMM, ws device memory of at least
 * hkv_gpu_qmat_matmul_ws_bytes(w) bytes (else HKV_E_INVAL); ws is in use
 * until the work on `stream` is done. Dequantised weights equal the host
 * path's bit for bit; sums are fp32 in another order than hkv_matmul's. */
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

/* out[i][0..n_head*d) = 0 and lse[i][0..n_head) = -inf for the rows of a
 * partial (n rows of n_head heads of d; row strides ldo >= n_head*d, and
 * n_head for lse): the empty partial that the exact merge leaves the other
 * side's value in. */
int hkv_gpu_partial_clear(float *out, int64_t ldo, float *lse, int64_t n, int n_head, int d,
                          void *stream, hkv_err *err);

#ifdef __cplusplus
}
#endif

#endif

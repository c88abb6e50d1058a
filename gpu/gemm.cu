/* Weight upload (dequantised to fp16 on the host at load) and the GEMM
 * y = x W^T through cuBLAS GemmEx: fp16 inputs, fp32 accumulation and output.
 *
 * Layout: cuBLAS is column-major. W, row-major [rows][cols], is the
 * column-major cols x rows matrix A (lda = cols); x, row-major [n][cols], is
 * the column-major cols x n matrix B (ldb = cols). C = A^T B, rows x n
 * column-major with ldc = ldy, is y row-major [n][ldy]. */
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.cuh"

extern "C" {
#include "gpu_kernels.h"
}

#define PANEL_FLOATS (1 << 20)   /* host staging: 4 MB of fp32 + 2 MB of fp16 per panel */

extern "C" void hkv_gpu_wmat_free(hkv_gpu_ctx *ctx, hkv_gpu_wmat *w)
{
    if (!w || !w->w) return;
    hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, w->w, (size_t)w->rows * (size_t)w->cols * 2);
    w->w = NULL;
}

extern "C" int hkv_gpu_wmat_upload(hkv_gpu_ctx *ctx, const hkv_cpu_kernels *kern,
                                   const hkv_wmat *src, hkv_mem_account *host_mem,
                                   hkv_gpu_wmat *dst, hkv_err *err)
{
    memset(dst, 0, sizeof *dst);
    if (!ctx || !kern || !src || src->rows < 1 || src->cols < 1 || !src->q)
        return hkv_seterr(err, HKV_E_INVAL, "gpu weight upload: empty matrix or no context");
    if ((size_t)src->rows > SIZE_MAX / 2 / (size_t)src->cols)
        return hkv_seterr(err, HKV_E_RANGE, "gpu weight upload: %lld x %lld overflows",
                          (long long)src->rows, (long long)src->cols);
    const int64_t rows = src->rows, cols = src->cols;
    const size_t bytes = (size_t)rows * (size_t)cols * 2;
    int64_t pr = PANEL_FLOATS / cols;   /* rows per panel */
    if (pr < 1) pr = 1;
    if (pr > rows) pr = rows;
    const size_t stage_b = (size_t)pr * (size_t)cols * (sizeof(float) + 2);
    uint16_t *w = (uint16_t *)hkv_gpu_alloc(ctx, HKV_TIER_WEIGHTS, bytes, err);
    if (!w) return hkv_err_prefix(err, "weights %lld x %lld fp16", (long long)rows, (long long)cols);
    char *stage = (char *)hkv_host_alloc(host_mem, HKV_TIER_WORKSPACE, stage_b, err);
    if (!stage) {
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, w, bytes);
        return hkv_err_prefix(err, "gpu weight upload staging");
    }
    float *f = (float *)stage;
    uint16_t *h = (uint16_t *)(stage + (size_t)pr * (size_t)cols * sizeof(float));
    int rc = HKV_OK;
    cudaStream_t st = (cudaStream_t)hkv_gpu_ctx_stream(ctx);
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += pr) {
        const int64_t r1 = r0 + pr < rows ? r0 + pr : rows, ne = (r1 - r0) * cols;
        kern->dequant_rows(src, r0, r1, f);
        kern->f32_to_f16(f, h, ne);
        cudaError_t e = cudaMemcpyAsync(w + r0 * cols, h, (size_t)ne * 2, cudaMemcpyHostToDevice, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);   /* the panel buffer is reused */
        if (e != cudaSuccess) rc = hkv_gpu_fail(err, e, "cudaMemcpyAsync (weight panel)");
    }
    hkv_host_free(host_mem, HKV_TIER_WORKSPACE, stage, stage_b);
    if (rc) {
        hkv_gpu_free(ctx, HKV_TIER_WEIGHTS, w, bytes);
        return rc;
    }
    dst->rows = rows, dst->cols = cols, dst->w = w;
    return HKV_OK;
}

extern "C" int hkv_gpu_gemm(hkv_gpu_ctx *ctx, const hkv_gpu_wmat *w, const uint16_t *x, int64_t n,
                            float *y, int64_t ldy, void *stream, hkv_err *err)
{
    if (!ctx || !w || !w->w || !x || !y || n < 0 || ldy < w->rows)
        return hkv_seterr(err, HKV_E_INVAL, "gpu gemm: bad arguments (n %lld, ldy %lld)",
                          (long long)n, (long long)ldy);
    if (w->rows > 2147483647 || w->cols > 2147483647 || n > 2147483647 || ldy > 2147483647)
        return hkv_seterr(err, HKV_E_RANGE, "gpu gemm: %lld x %lld by %lld rows exceeds cuBLAS's "
                          "int dimensions", (long long)w->rows, (long long)w->cols, (long long)n);
    if (!n) return HKV_OK;
    cublasHandle_t hb = hkv_gpu_ctx_blas(ctx, stream);
    if (!hb) return hkv_seterr(err, HKV_E_INVAL, "gpu gemm: " HKV_NO_BLAS_STREAM);
    const float alpha = 1.0f, beta = 0.0f;
    const int m = (int)w->rows, nn = (int)n, kk = (int)w->cols;
    HKV_CUBLAS_TRY(err, cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, kk, &alpha, w->w,
                                     CUDA_R_16F, kk, x, CUDA_R_16F, kk, &beta, y, CUDA_R_32F,
                                     (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return HKV_OK;
}

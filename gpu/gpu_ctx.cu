/* Device selection, the main stream, the cuBLAS handle, device memory
 * accounted per tier against caps, copies; and the one place CUDA/cuBLAS
 * status codes become hkv_err messages. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.cuh"

struct hkv_gpu_ctx {
    int device;
    int sm_count;                   /* what kernels size their grids by (flash-decoding) */
    cudaStream_t stream;
    cublasHandle_t blas;
    size_t cap[HKV_TIER_COUNT];     /* 0: no per-tier cap */
    size_t total_cap;
    size_t bytes[HKV_TIER_COUNT], peak[HKV_TIER_COUNT];
};

int hkv_gpu_fail(hkv_err *err, cudaError_t e, const char *what)
{
    int code = e == cudaErrorMemoryAllocation ? HKV_E_NOMEM : HKV_E_DEVICE;
    return hkv_seterr(err, code, "CUDA: %s failed: %s (%s)", what, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

int hkv_gpu_fail(hkv_err *err, cublasStatus_t s, const char *what)
{
    int code = s == CUBLAS_STATUS_ALLOC_FAILED ? HKV_E_NOMEM : HKV_E_DEVICE;
    return hkv_seterr(err, code, "cuBLAS: %s failed: %s (%s)", what, cublasGetStatusString(s),
                      cublasGetStatusName(s));
}

cublasHandle_t hkv_gpu_ctx_blas(hkv_gpu_ctx *ctx) { return ctx->blas; }

extern "C" void hkv_gpu_ctx_destroy(hkv_gpu_ctx *ctx)
{
    if (!ctx) return;
    cudaSetDevice(ctx->device);
    if (ctx->blas) cublasDestroy(ctx->blas);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    free(ctx);
}

extern "C" int hkv_gpu_ctx_create(hkv_gpu_ctx **out, int device, const size_t *tier_cap,
                                  size_t total_cap, hkv_err *err)
{
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return hkv_seterr(err, HKV_E_DEVICE, "no CUDA device usable: %s (%s)",
                          cudaGetErrorString(e), cudaGetErrorName(e));
    if (device < 0 || device >= count)
        return hkv_seterr(err, HKV_E_DEVICE, "CUDA device %d asked, %d present", device, count);
    hkv_gpu_ctx *c = (hkv_gpu_ctx *)calloc(1, sizeof *c);
    if (!c) return hkv_seterr(err, HKV_E_NOMEM, "GPU context: out of host memory");
    c->device = device;
    int rc = HKV_OK;
    size_t fr = 0, tot = 0;
    if ((e = cudaSetDevice(device)) != cudaSuccess) rc = hkv_gpu_fail(err, e, "cudaSetDevice");
    else if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess)
        rc = hkv_gpu_fail(err, e, "cudaStreamCreateWithFlags");
    else if ((e = cudaMemGetInfo(&fr, &tot)) != cudaSuccess)
        rc = hkv_gpu_fail(err, e, "cudaMemGetInfo");
    else if ((e = cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device)) !=
             cudaSuccess)
        rc = hkv_gpu_fail(err, e, "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    else {
        cublasStatus_t s = cublasCreate(&c->blas);
        if (s != CUBLAS_STATUS_SUCCESS) {
            c->blas = NULL;
            rc = hkv_gpu_fail(err, s, "cublasCreate");
        } else if ((s = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS) {
            rc = hkv_gpu_fail(err, s, "cublasSetStream");
        }
    }
    if (rc) {
        hkv_gpu_ctx_destroy(c);
        return rc;
    }
    for (int t = 0; t < HKV_TIER_COUNT; t++) c->cap[t] = tier_cap ? tier_cap[t] : 0;
    c->total_cap = total_cap ? total_cap : fr;
    *out = c;
    return HKV_OK;
}

extern "C" void *hkv_gpu_ctx_stream(hkv_gpu_ctx *ctx) { return ctx ? (void *)ctx->stream : NULL; }

extern "C" int hkv_gpu_ctx_sm_count(const hkv_gpu_ctx *ctx) { return ctx ? ctx->sm_count : 0; }

static size_t in_use_all(const hkv_gpu_ctx *ctx)
{
    size_t s = 0;
    for (int t = 0; t < HKV_TIER_COUNT; t++) s += ctx->bytes[t];
    return s;
}

extern "C" void *hkv_gpu_alloc(hkv_gpu_ctx *ctx, int tier, size_t bytes, hkv_err *err)
{
    if (!ctx || tier < 0 || tier >= HKV_TIER_COUNT || bytes == 0) {
        hkv_seterr(err, HKV_E_INVAL, "GPU allocation: no context, tier %d or %zu bytes", tier, bytes);
        return NULL;
    }
    const char *tn = hkv_tier_name(tier);
    const size_t cap = ctx->cap[tier], used = ctx->bytes[tier], all = in_use_all(ctx);
    if (cap && (bytes > cap || used > cap - bytes)) {
        hkv_seterr(err, HKV_E_CAPACITY, "GPU tier %s: asked %zu, cap %zu, in use %zu", tn, bytes,
                   cap, used);
        return NULL;
    }
    if (bytes > ctx->total_cap || all > ctx->total_cap - bytes) {
        hkv_seterr(err, HKV_E_CAPACITY, "GPU tier %s: asked %zu, total cap %zu, in use %zu (all "
                   "tiers)", tn, bytes, ctx->total_cap, all);
        return NULL;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();   /* clear the recorded error so the next call does not report it */
        cudaMemGetInfo(&fr, &tot);
        hkv_seterr(err, e == cudaErrorMemoryAllocation ? HKV_E_NOMEM : HKV_E_DEVICE,
                   "GPU tier %s: cudaMalloc of %zu bytes failed: %s (device free %zu of %zu)", tn,
                   bytes, cudaGetErrorString(e), fr, tot);
        return NULL;
    }
    ctx->bytes[tier] += bytes;
    if (ctx->bytes[tier] > ctx->peak[tier]) ctx->peak[tier] = ctx->bytes[tier];
    return p;
}

extern "C" void hkv_gpu_free(hkv_gpu_ctx *ctx, int tier, void *p, size_t bytes)
{
    if (!ctx || !p || tier < 0 || tier >= HKV_TIER_COUNT) return;
    cudaFree(p);
    ctx->bytes[tier] -= bytes < ctx->bytes[tier] ? bytes : ctx->bytes[tier];
}

extern "C" size_t hkv_gpu_in_use(const hkv_gpu_ctx *ctx, int tier)
{
    if (!ctx || tier >= HKV_TIER_COUNT) return 0;
    return tier < 0 ? in_use_all(ctx) : ctx->bytes[tier];
}

extern "C" size_t hkv_gpu_peak(const hkv_gpu_ctx *ctx, int tier)
{
    if (!ctx || tier >= HKV_TIER_COUNT) return 0;
    if (tier >= 0) return ctx->peak[tier];
    size_t s = 0;
    for (int t = 0; t < HKV_TIER_COUNT; t++) s += ctx->peak[t];
    return s;
}

extern "C" int hkv_gpu_upload(void *dst, const void *src, size_t bytes, void *stream, hkv_err *err)
{
    if (!bytes) return HKV_OK;
    HKV_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, hkv_stream(stream)));
    return HKV_OK;
}

extern "C" int hkv_gpu_download(void *dst, const void *src, size_t bytes, void *stream,
                                hkv_err *err)
{
    if (!bytes) return HKV_OK;
    HKV_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, hkv_stream(stream)));
    return HKV_OK;
}

extern "C" int hkv_gpu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                               size_t width, size_t height, void *stream, hkv_err *err)
{
    if (!width || !height) return HKV_OK;
    HKV_CUDA_TRY(err, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                        cudaMemcpyDeviceToDevice, hkv_stream(stream)));
    return HKV_OK;
}

extern "C" int hkv_gpu_memset(void *dst, int byte, size_t bytes, void *stream, hkv_err *err)
{
    if (!bytes) return HKV_OK;
    HKV_CUDA_TRY(err, cudaMemsetAsync(dst, byte, bytes, hkv_stream(stream)));
    return HKV_OK;
}

extern "C" int hkv_gpu_sync(void *stream, hkv_err *err)
{
    HKV_CUDA_TRY(err, cudaStreamSynchronize(hkv_stream(stream)));
    return HKV_OK;
}

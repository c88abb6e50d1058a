/* Device selection, the streams and their cuBLAS handles, device memory
 * accounted per tier against caps, copies; and the one place CUDA/cuBLAS
 * status codes become hkv_err messages.
 *
 * cuBLAS: one handle per stream, bound to it once at creation with its own
 * workspace (cublasSetWorkspace, from the context's accounted memory), so no
 * call switches a handle's stream (a handle is not safe to share between
 * threads driving different streams) and no GEMM allocates: cuBLAS's own
 * workspace allocation would be a cudaMalloc inside a step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.cuh"

#include "fault.h"

struct hkv_gpu_ctx {
    int device;
    int sm_count;                   /* what kernels size their grids by (flash-decoding) */
    int cc;                         /* compute capability x 10 + minor: which GEMM path pays (qmat.cu) */
    cudaStream_t stream;            /* == streams[0] */
    int n_streams;
    cudaStream_t streams[HKV_GPU_MAX_STREAMS];
    cublasHandle_t blas[HKV_GPU_MAX_STREAMS];
    void *blas_ws[HKV_GPU_MAX_STREAMS];
    size_t blas_ws_bytes;
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

cublasHandle_t hkv_gpu_ctx_blas(hkv_gpu_ctx *ctx, void *stream)
{
    for (int i = 0; ctx && i < ctx->n_streams; i++)
        if (ctx->streams[i] == hkv_stream(stream)) return ctx->blas[i];
    return NULL;
}

extern "C" void hkv_gpu_ctx_destroy(hkv_gpu_ctx *ctx)
{
    if (!ctx) return;
    cudaSetDevice(ctx->device);
    for (int i = 0; i < ctx->n_streams; i++) {
        if (ctx->blas[i]) cublasDestroy(ctx->blas[i]);
        if (ctx->streams[i]) cudaStreamDestroy(ctx->streams[i]);
        hkv_gpu_free(ctx, HKV_TIER_WORKSPACE, ctx->blas_ws[i], ctx->blas_ws_bytes);
    }
    free(ctx);
}

/* A non-blocking stream with its own cuBLAS handle and workspace, in slot
 * ctx->n_streams. */
static int add_stream(hkv_gpu_ctx *c, hkv_err *err)
{
    if (c->n_streams >= HKV_GPU_MAX_STREAMS)
        return hkv_seterr(err, HKV_E_CAPACITY, "GPU context: %d streams already (the most)",
                          c->n_streams);
    const int i = c->n_streams;
    cudaError_t e;
    cublasStatus_t s;
    if ((e = cudaStreamCreateWithFlags(&c->streams[i], cudaStreamNonBlocking)) != cudaSuccess) {
        c->streams[i] = NULL;
        return hkv_gpu_fail(err, e, "cudaStreamCreateWithFlags");
    }
    c->n_streams++;   /* destroy cleans up whatever of this slot exists */
    if ((s = cublasCreate(&c->blas[i])) != CUBLAS_STATUS_SUCCESS) {
        c->blas[i] = NULL;
        return hkv_gpu_fail(err, s, "cublasCreate");
    }
    if (!(c->blas_ws[i] = hkv_gpu_alloc(c, HKV_TIER_WORKSPACE, c->blas_ws_bytes, err)))
        return hkv_err_prefix(err, "cuBLAS workspace of stream %d", i);
    if ((s = cublasSetStream(c->blas[i], c->streams[i])) != CUBLAS_STATUS_SUCCESS)
        return hkv_gpu_fail(err, s, "cublasSetStream");
    if ((s = cublasSetWorkspace(c->blas[i], c->blas_ws[i], c->blas_ws_bytes)) !=
        CUBLAS_STATUS_SUCCESS)
        return hkv_gpu_fail(err, s, "cublasSetWorkspace");
    return HKV_OK;
}

extern "C" int hkv_gpu_ctx_add_stream(hkv_gpu_ctx *ctx, void **stream, hkv_err *err)
{
    if (!ctx || !stream) return hkv_seterr(err, HKV_E_INVAL, "GPU stream: no context");
    *stream = NULL;
    int rc = add_stream(ctx, err);
    if (rc) return rc;
    *stream = ctx->streams[ctx->n_streams - 1];
    return HKV_OK;
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
    int rc = HKV_OK, major = 0, minor = 0;
    size_t fr = 0, tot = 0;
    if ((e = cudaSetDevice(device)) != cudaSuccess) rc = hkv_gpu_fail(err, e, "cudaSetDevice");
    else if ((e = cudaMemGetInfo(&fr, &tot)) != cudaSuccess)
        rc = hkv_gpu_fail(err, e, "cudaMemGetInfo");
    else if ((e = cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, device)) !=
             cudaSuccess)
        rc = hkv_gpu_fail(err, e, "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    else if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) !=
             cudaSuccess)
        rc = hkv_gpu_fail(err, e, "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMajor)");
    else if ((e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
             cudaSuccess)
        rc = hkv_gpu_fail(err, e, "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMinor)");
    if (!rc) {
        for (int t = 0; t < HKV_TIER_COUNT; t++) c->cap[t] = tier_cap ? tier_cap[t] : 0;
        c->total_cap = total_cap ? total_cap : fr;
        /* the workspace cuBLAS's documentation asks for: 32 MiB on Hopper, 4 MiB before */
        c->blas_ws_bytes = (size_t)(major >= 9 ? 32 : 4) << 20;
        c->cc = 10 * major + minor;
        if (!(rc = add_stream(c, err))) c->stream = c->streams[0];
    }
    if (rc) {
        hkv_gpu_ctx_destroy(c);
        return rc;
    }
    *out = c;
    return HKV_OK;
}

extern "C" void *hkv_gpu_ctx_stream(hkv_gpu_ctx *ctx) { return ctx ? (void *)ctx->stream : NULL; }

extern "C" int hkv_gpu_ctx_sm_count(const hkv_gpu_ctx *ctx) { return ctx ? ctx->sm_count : 0; }

extern "C" int hkv_gpu_ctx_cc(const hkv_gpu_ctx *ctx) { return ctx ? ctx->cc : 0; }

extern "C" int hkv_gpu_tensor_split_pays(int cc) { return cc == 80 || cc >= 90; }

static size_t in_use_all(const hkv_gpu_ctx *ctx)
{
    size_t s = 0;
    for (int t = 0; t < HKV_TIER_COUNT; t++) s += ctx->bytes[t];
    return s;
}

/* The one allocation path: caps, then cudaMalloc, or cudaMallocAsync on
 * `stream` when async (stream-ordered: no device-wide synchronisation). */
static void *ctx_alloc(hkv_gpu_ctx *ctx, int tier, size_t bytes, int async, cudaStream_t stream,
                       hkv_err *err)
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
    if (hkv_fault_hit_kind(HKV_FAULT_DEVICE)) {   /* a -Dfault_inject=true build (tests/fault) */
        hkv_seterr(err, HKV_E_NOMEM, "GPU tier %s: %s of %zu bytes failed: out of memory (fault "
                   "injection)", tn, async ? "cudaMallocAsync" : "cudaMalloc", bytes);
        return NULL;
    }
    void *p = NULL;
    cudaError_t e = async ? cudaMallocAsync(&p, bytes, stream) : cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();   /* clear the recorded error so the next call does not report it */
        cudaMemGetInfo(&fr, &tot);
        hkv_seterr(err, e == cudaErrorMemoryAllocation ? HKV_E_NOMEM : HKV_E_DEVICE,
                   "GPU tier %s: %s of %zu bytes failed: %s (device free %zu of %zu)", tn,
                   async ? "cudaMallocAsync" : "cudaMalloc", bytes, cudaGetErrorString(e), fr, tot);
        return NULL;
    }
    ctx->bytes[tier] += bytes;
    if (ctx->bytes[tier] > ctx->peak[tier]) ctx->peak[tier] = ctx->bytes[tier];
    return p;
}

extern "C" void *hkv_gpu_alloc(hkv_gpu_ctx *ctx, int tier, size_t bytes, hkv_err *err)
{
    return ctx_alloc(ctx, tier, bytes, 0, 0, err);
}

extern "C" void *hkv_gpu_alloc_async(hkv_gpu_ctx *ctx, int tier, size_t bytes, void *stream,
                                     hkv_err *err)
{
    return ctx_alloc(ctx, tier, bytes, 1, hkv_stream(stream), err);
}

extern "C" void hkv_gpu_free(hkv_gpu_ctx *ctx, int tier, void *p, size_t bytes)
{
    if (!ctx || !p || tier < 0 || tier >= HKV_TIER_COUNT) return;
    cudaFree(p);
    ctx->bytes[tier] -= bytes < ctx->bytes[tier] ? bytes : ctx->bytes[tier];
}

extern "C" void hkv_gpu_free_async(hkv_gpu_ctx *ctx, int tier, void *p, size_t bytes, void *stream)
{
    if (!ctx || !p || tier < 0 || tier >= HKV_TIER_COUNT) return;
    if (cudaFreeAsync(p, hkv_stream(stream)) != cudaSuccess) {
        cudaGetLastError();   /* refused (a driver without memory pools): the blocking way */
        cudaFree(p);
    }
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

extern "C" int hkv_gpu_upload_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
                                  size_t width, size_t height, void *stream, hkv_err *err)
{
    if (!width || !height) return HKV_OK;
    HKV_CUDA_TRY(err, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                        cudaMemcpyHostToDevice, hkv_stream(stream)));
    return HKV_OK;
}

extern "C" int hkv_gpu_copy(void *dst, const void *src, size_t bytes, void *stream, hkv_err *err)
{
    if (!bytes) return HKV_OK;
    HKV_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, hkv_stream(stream)));
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

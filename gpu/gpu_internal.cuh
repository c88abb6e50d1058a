/* Internal to the .cu files of gpu/: turning CUDA and cuBLAS status codes
 * into hkv_err (the one conversion point), launch checks, small device
 * helpers. Not a public header. */
#ifndef HKV_GPU_INTERNAL_CUH
#define HKV_GPU_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "gpu_ctx.h"
#include "gpu_forward.h"
#include "status.h"
}

/* Record a CUDA / cuBLAS failure of `what` (the call's text) in err and
 * return the HKV_E_* code: HKV_E_NOMEM for allocation failures, else
 * HKV_E_DEVICE. */
int hkv_gpu_fail(hkv_err *err, cudaError_t e, const char *what);
int hkv_gpu_fail(hkv_err *err, cublasStatus_t s, const char *what);

#define HKV_CUDA_TRY(err, call)                                               \
    do {                                                                      \
        cudaError_t hkv_e_ = (call);                                          \
        if (hkv_e_ != cudaSuccess) return hkv_gpu_fail((err), hkv_e_, #call); \
    } while (0)

#define HKV_CUBLAS_TRY(err, call)                                                       \
    do {                                                                                \
        cublasStatus_t hkv_s_ = (call);                                                 \
        if (hkv_s_ != CUBLAS_STATUS_SUCCESS) return hkv_gpu_fail((err), hkv_s_, #call); \
    } while (0)

/* The two constructs of CUDA C++ that are not C++, one macro each in both
 * builds: nvcc gets the chevrons and `extern __shared__`; the CUDA emulator
 * (gpu/emu/, -Dgpu_emu=true) a launch that captures the arguments and a
 * pointer to the block's dynamic shared memory. Kernel bodies are the same
 * source for both. Use: HKV_LAUNCH(kernel, grid, block, smem, stream)(args). */
#ifdef HKV_CUDA_EMU
#define HKV_LAUNCH HKV_EMU_LAUNCH
#define HKV_DYN_SHARED HKV_EMU_DYN_SHARED
#else
#define HKV_LAUNCH(kernel, grid, block, smem, stream) kernel<<<(grid), (block), (smem), (stream)>>>
#define HKV_DYN_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

/* After a launch: a bad configuration shows up here, not at the next sync. */
#define HKV_LAUNCH_CHECK(err) HKV_CUDA_TRY(err, cudaGetLastError())

/* A comma inside a HKV_LAUNCH kernel argument (a template with two
 * arguments): the macro splits its arguments before expanding this. */
#define HKV_COMMA ,

/* The cuBLAS handle bound to `stream`, one of the context's (gpu_ctx.cu);
 * NULL for any other stream. */
cublasHandle_t hkv_gpu_ctx_blas(hkv_gpu_ctx *ctx, void *stream);
#define HKV_NO_BLAS_STREAM                                                                   \
    "the stream is not one of the context's (hkv_gpu_ctx_stream, hkv_gpu_ctx_add_stream): "   \
    "no cuBLAS handle is bound to it"

static inline cudaStream_t hkv_stream(void *s) { return (cudaStream_t)s; }

/* Blocks for a 1-D grid over n items, capped (kernels stride over the rest). */
static inline unsigned hkv_grid1(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b > 65535 * 16) b = 65535 * 16;
    return (unsigned)(b < 1 ? 1 : b);
}

/* Butterfly reductions over a full warp: every lane gets the result. In an
 * emulator build each is one collective that performs these five shuffles'
 * operations exactly (emu_device.h, hkv_emu::warp_tree): the same bits, a
 * fifth of the emulated stack switches; the shuffles themselves are tested
 * by emu_shfl and used as written by every other kernel. */
#ifdef HKV_CUDA_EMU
#define HKV_WARP_TREE(op, x) hkv_emu::warp_tree(HKV_EMU_SITE, hkv_emu::op, x)
__device__ __forceinline__ float hkv_warp_max(float x) { return HKV_WARP_TREE(W_TREE_FMAX, x); }
__device__ __forceinline__ float hkv_warp_sum(float x) { return HKV_WARP_TREE(W_TREE_FSUM, x); }
__device__ __forceinline__ double hkv_warp_sum_d(double x) { return HKV_WARP_TREE(W_TREE_DSUM, x); }
#else
__device__ __forceinline__ float hkv_warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float hkv_warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ double hkv_warp_sum_d(double x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
#endif

__device__ __forceinline__ float hkv_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t hkv_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
__host__ __device__ __forceinline__ int64_t hkv_min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

/* A prefill block's rows (attn_prefill.cu, attn_prefill_mma.cu): of nrows
 * (token, group head) rows, block x owns bm from the returned first; the
 * last rows see the most keys, so their blocks start first. *kend: the
 * block's keys are [0, kend). */
__device__ __forceinline__ int64_t hkv_pf_block_rows(int bm, int64_t nrows, int g, int64_t p0,
                                                     int64_t nk, int64_t *kend)
{
    const int64_t r0 = ((int64_t)gridDim.x - 1 - blockIdx.x) * bm;
    *kend = hkv_min_i64(p0 + (hkv_min_i64(r0 + bm, nrows) - 1) / g + 1, nk);
    return r0;
}

/* qmat_gemv.cu: hkv_gpu_qmat_matmul's products of 1 to HKV_QMAT_GEMV_MAX_ROWS
 * rows (arguments checked by it). */
extern "C" int hkv_gpu_qmat_gemv(const hkv_gpu_qmat *w, const float *x, int64_t ldx, int64_t n,
                                 float *y, int64_t ldy, cudaStream_t st, hkv_err *err);

/* Why an mma.sync kernel (fn, any instance) cannot run on the current
 * device (NULL: it can): m16n8k16 needs compute capability 8.0, and a build
 * for an older architecture runs its PTX through the JIT, where the kernel
 * has no mma code (it would trap). */
static inline const char *hkv_gpu_mma_arch_unfit(const void *fn)
{
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return "the device's compute capability is unknown";
    if (major < 8) return "mma.sync m16n8k16 needs compute capability 8.0";
#ifndef HKV_CUDA_EMU
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, fn) != cudaSuccess || fa.ptxVersion < 80)
        return "the library was built for an architecture below sm_80 (-Dgpu_arch)";
#else
    (void)fn;
#endif
    return NULL;
}

/* attn_prefill_mma.cu, dispatched from attn_prefill.cu: the mma.sync prefill
 * (arguments checked by the caller; qscale is scale * log2 e). unfit says
 * why it cannot run a call here (head size, K/V alignment, the device or
 * the build's architecture), NULL when it can. */
extern "C" const char *hkv_gpu_prefill_mma_unfit(int d, int vec16);
extern "C" int hkv_gpu_prefill_mma(const float *q, int64_t ldq, int64_t nq, int n_head,
                                   int n_head_kv, int d, int64_t p0, int64_t nk, const uint16_t *k,
                                   const uint16_t *v, int64_t ld, int64_t hs, float qscale,
                                   float *out, int64_t ldo, float *lse, cudaStream_t st,
                                   hkv_err *err);

/* ctkvr_scores_mma.cu, dispatched from ctkvr_build.cu: the build's score
 * block on mma.sync, what k_build_scores writes (arguments checked by the
 * caller; the kernel's launch limits by this). unfit: why it cannot run
 * here (head size, row alignment, the device or the build), NULL if it can. */
extern "C" const char *hkv_gpu_ctkvr_scores_mma_unfit(int d, int vec16);
extern "C" int hkv_gpu_ctkvr_scores_mma(const uint16_t *q, int64_t ldq, int64_t i0, int64_t nc,
                                        int g, int d, int h, const uint16_t *k, int64_t ld,
                                        int64_t lo, int64_t nfar, float *scores, cudaStream_t st,
                                        hkv_err *err);

#endif

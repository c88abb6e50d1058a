/* cuBLAS GemmEx on the CPU, in order on the handle's stream: the operands are
 * widened to fp32 (exact for fp16 and bf16) and multiplied by oneDNN's sgemm
 * with fp32 accumulation, as CUBLAS_COMPUTE_32F specifies; an fp16/bf16
 * output is rounded to nearest even. The summation order differs from any
 * GPU algorithm: tests compare against references with fp32 tolerances.
 *
 * Argument checks follow the cuBLAS reference (m, n, k >= 0; lda >= rows of
 * op(A) as stored; unsupported type combinations are NOT_SUPPORTED), and the
 * operands must lie in device memory: a GEMM reading a host pointer is an
 * illegal address on a GPU, a sticky fault here. */
#include <stdlib.h>
#include <string.h>

#include <vector>

#include <oneapi/dnnl/dnnl.h>

#include "emu_cublas.h"
#include "emu_internal.h"

struct hkv_emu_cublas {
    cudaStream_t stream = 0;
    void *workspace = nullptr;   /* cublasSetWorkspace: recorded; the emulated GEMMs need none */
    size_t workspace_bytes = 0;
};

namespace {

using namespace hkv_emu;

int elem_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/* Span in elements of a column-major rows x cols matrix with leading dim ld. */
size_t span(int rows, int cols, int ld)
{
    return rows && cols ? (size_t)ld * (size_t)(cols - 1) + (size_t)rows : 0;
}

void widen(const void *src, cudaDataType t, size_t n, float *dst)
{
    if (t == CUDA_R_32F) { memcpy(dst, src, n * 4); return; }
    const uint16_t *h = (const uint16_t *)src;
    if (t == CUDA_R_16F)
        for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(h[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(h[i]);
}

bool in_device(const void *p, size_t bytes)
{
    bool over = false;
    return !bytes || (classify(p, bytes, &over) == MEM_DEVICE && !over) ||
           (classify(p, bytes, &over) == MEM_PINNED);
}

struct gemm_args {
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha, beta;
    const void *A, *B;
    void *C;
    cudaDataType at, bt, ct;
    int lda, ldb, ldc;
};

/* C = alpha op(A) op(B) + beta C, column-major. Row-major sgemm on the same
 * buffers computes the transpose: C^T = op(B)^T op(A)^T. */
void run_gemm(const gemm_args &g)
{
    const int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
    const int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
    const size_t na = span(ar, ac, g.lda), nb = span(br, bc, g.ldb), nc = span(g.m, g.n, g.ldc);
    std::vector<float> a(na ? na : 1), b(nb ? nb : 1), c(nc ? nc : 1);
    widen(g.A, g.at, na, a.data());
    widen(g.B, g.bt, nb, b.data());
    if (g.beta != 0.0f) widen(g.C, g.ct, nc, c.data());
    else
        for (int j = 0; j < g.n; j++)   /* beta = 0: C is not read (it may hold NaN) */
            memset(&c[(size_t)j * g.ldc], 0, (size_t)g.m * 4);
    if (g.m && g.n) {
        if (g.k == 0) {
            for (int j = 0; j < g.n; j++)
                for (int i = 0; i < g.m; i++) c[(size_t)j * g.ldc + i] *= g.beta;
        } else {
            dnnl_status_t st = dnnl_sgemm(g.tb == CUBLAS_OP_N ? 'N' : 'T', g.ta == CUBLAS_OP_N ? 'N' : 'T',
                                          g.n, g.m, g.k, g.alpha, b.data(), g.ldb, a.data(), g.lda,
                                          g.beta, c.data(), g.ldc);
            if (st != dnnl_success) {
                device_fault("cublasGemmEx: oneDNN sgemm failed");
                return;
            }
        }
    }
    for (int j = 0; j < g.n; j++) {
        const float *cs = &c[(size_t)j * g.ldc];
        if (g.ct == CUDA_R_32F) {
            memcpy((float *)g.C + (size_t)j * g.ldc, cs, (size_t)g.m * 4);
        } else {
            uint16_t *d = (uint16_t *)g.C + (size_t)j * g.ldc;
            for (int i = 0; i < g.m; i++)
                d[i] = g.ct == CUDA_R_16F ? f32_to_f16(cs[i], RN) : f32_to_bf16(cs[i], RN);
        }
    }
}

cublasStatus_t check(const gemm_args &g, cublasComputeType_t ct)
{
    if (g.m < 0 || g.n < 0 || g.k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    /* CUBLAS_OP_C is the transpose for real data */
    const auto op_ok = [](cublasOperation_t o) {
        return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C;
    };
    if (!op_ok(g.ta) || !op_ok(g.tb)) return CUBLAS_STATUS_INVALID_VALUE;
    const int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, br = g.tb == CUBLAS_OP_N ? g.k : g.n;
    if (g.lda < (ar > 1 ? ar : 1) || g.ldb < (br > 1 ? br : 1) || g.ldc < (g.m > 1 ? g.m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ct != CUBLAS_COMPUTE_32F && ct != CUBLAS_COMPUTE_32F_FAST_16F) return CUBLAS_STATUS_NOT_SUPPORTED;
    const bool half_in = (g.at == CUDA_R_16F && g.bt == CUDA_R_16F) ||
                         (g.at == CUDA_R_16BF && g.bt == CUDA_R_16BF);
    const bool f32_in = g.at == CUDA_R_32F && g.bt == CUDA_R_32F;
    if (!(half_in && (g.ct == g.at || g.ct == CUDA_R_32F)) && !(f32_in && g.ct == CUDA_R_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = new hkv_emu_cublas;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream_valid(s)) return CUBLAS_STATUS_INVALID_VALUE;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

/* As cuBLAS: the workspace is device memory, 256-byte aligned (NULL and 0
 * give the library its own back). */
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((!ws) != (bytes == 0) || ((uintptr_t)ws & 255)) return CUBLAS_STATUS_INVALID_VALUE;
    bool overrun = false;
    if (ws && (classify(ws, bytes, &overrun) != MEM_DEVICE || overrun))
        return CUBLAS_STATUS_INVALID_VALUE;
    h->workspace = ws;
    h->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!s) return CUBLAS_STATUS_INVALID_VALUE;
    *s = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) { return h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED; }

const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
#define N(x) case x: return #x;
        N(CUBLAS_STATUS_SUCCESS) N(CUBLAS_STATUS_NOT_INITIALIZED) N(CUBLAS_STATUS_ALLOC_FAILED)
        N(CUBLAS_STATUS_INVALID_VALUE) N(CUBLAS_STATUS_ARCH_MISMATCH) N(CUBLAS_STATUS_MAPPING_ERROR)
        N(CUBLAS_STATUS_EXECUTION_FAILED) N(CUBLAS_STATUS_INTERNAL_ERROR) N(CUBLAS_STATUS_NOT_SUPPORTED)
#undef N
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "unknown cuBLAS status";
    }
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType at,
                                          int lda, long long sa, const void *B, cudaDataType bt,
                                          int ldb, long long sb, const void *beta, void *C,
                                          cudaDataType ctp, int ldc, long long sc, int batch,
                                          cublasComputeType_t comp, cublasGemmAlgo_t)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    gemm_args g{ta, tb, m, n, k, *(const float *)alpha, *(const float *)beta, A, B, C, at, bt, ctp,
                lda, ldb, ldc};
    cublasStatus_t st = check(g, comp);
    if (st) return st;
    if (!m || !n || !batch) return CUBLAS_STATUS_SUCCESS;
    if (sticky()) return CUBLAS_STATUS_EXECUTION_FAILED;
    const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m;
    const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    for (int i = 0; i < batch; i++) {
        gemm_args gi = g;
        gi.A = (const char *)A + (size_t)(i * sa) * elem_bytes(at);
        gi.B = (const char *)B + (size_t)(i * sb) * elem_bytes(bt);
        gi.C = (char *)C + (size_t)(i * sc) * elem_bytes(ctp);
        if (!in_device(gi.A, span(ar, ac, lda) * elem_bytes(at)) ||
            !in_device(gi.B, span(br, bc, ldb) * elem_bytes(bt)) ||
            !in_device(gi.C, span(m, n, ldc) * elem_bytes(ctp))) {
            device_fault("cublasGemmEx: an operand lies outside device memory (an illegal address "
                         "on a GPU)");
            return CUBLAS_STATUS_EXECUTION_FAILED;
        }
        if (enqueue(h->stream, [gi] { run_gemm(gi); }) != cudaSuccess)
            return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ctp, int ldc, cublasComputeType_t comp,
                            cublasGemmAlgo_t algo)
{
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0,
                                      beta, C, ctp, ldc, 0, 1, comp, algo);
}

}  // extern "C"

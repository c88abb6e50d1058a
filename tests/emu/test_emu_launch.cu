/* Launch configuration limits of the emulated device against the CUDA C++
 * Programming Guide, "Technical Specifications per Compute Capability", for
 * compute capability 8.9 (the emulator's default): at most 1024 threads per
 * block, block dimensions at most 1024 x 1024 x 64, grid dimensions at most
 * (2^31 - 1) x 65535 x 65535, 48 KB of shared memory per block without
 * opt-in, 99 KB (101376 bytes) with cudaFuncSetAttribute(...,
 * cudaFuncAttributeMaxDynamicSharedMemorySize, ...), 100 KB per SM, 1536
 * threads per SM, 32 threads per warp. A launch past a limit must fail as on
 * a device (CUDA Runtime API, "Error Handling"): cudaGetLastError() right
 * after the launch returns cudaErrorInvalidConfiguration (shared memory past
 * the function's limit: cudaErrorInvalidValue), the kernel does not run, and
 * the error is not sticky: cudaGetLastError() clears it
 * (cudaPeekAtLastError() does not) and the device keeps working. */
#include <stdint.h>

#include <vector>

#include "emu_test.h"

static __global__ void k_mark(int *flag) { atomicAdd(flag, 1); }

/* Every thread fills its stripe of the dynamic shared memory with a pattern,
 * then (after the barrier) checks a stripe filled by another thread: all
 * `bytes` are writable and shared by the block. */
static __global__ void k_smem_fill(unsigned bytes, unsigned *bad)
{
    HKV_DYN_SHARED(unsigned char, sm);
    const unsigned n = blockDim.x, t = threadIdx.x;
    for (unsigned i = t; i < bytes; i += n) sm[i] = (unsigned char)(i * 131u + (i >> 8) + 7u);
    __syncthreads();
    unsigned b = 0;
    for (unsigned i = (t + 1) % n; i < bytes; i += n) b += sm[i] != (unsigned char)(i * 131u + (i >> 8) + 7u);
    /* the last byte, read by everyone */
    b += sm[bytes - 1] != (unsigned char)((bytes - 1) * 131u + ((bytes - 1) >> 8) + 7u);
    if (b) atomicAdd(bad, b);
    atomicAdd(bad + 1, 1u);   /* threads that ran */
}
/* a second kernel, for the limit without opt-in (the attribute is per function) */
static __global__ void k_smem_plain(unsigned bytes, unsigned *bad)
{
    HKV_DYN_SHARED(unsigned char, sm);
    for (unsigned i = threadIdx.x; i < bytes; i += blockDim.x) sm[i] = 1;
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(bad + 1, 1u);
}

static int *g_flag;

static int read_flag(void)
{
    int h = -1;
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(&h, g_flag, sizeof h, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemset(g_flag, 0, sizeof(int)));
    return h;
}

/* A launch that must be refused with `want`, not run, and not stick. */
static void refused(dim3 grid, dim3 block, cudaError_t want, const char *what)
{
    CUDA_OK(cudaMemset(g_flag, 0, sizeof(int)));
    HKV_LAUNCH(k_mark, grid, block, 0, 0)(g_flag);
    CUDA_IS(want, cudaPeekAtLastError());   /* peek does not clear ... */
    const cudaError_t e = cudaGetLastError();
    CHECK(e == want, "%s: cudaGetLastError after the launch: %s, want %s", what, cudaGetErrorName(e),
          cudaGetErrorName(want));
    CUDA_IS(cudaSuccess, cudaGetLastError());   /* ... get does: the error is not sticky */
    CHECK(read_flag() == 0, "%s: the kernel ran", what);
}

/* A launch at a limit that must run: every thread marks once. */
static void accepted(dim3 grid, dim3 block, const char *what)
{
    CUDA_OK(cudaMemset(g_flag, 0, sizeof(int)));
    HKV_LAUNCH(k_mark, grid, block, 0, 0)(g_flag);
    const cudaError_t e = cudaGetLastError();
    CHECK(e == cudaSuccess, "%s: launch refused with %s", what, cudaGetErrorName(e));
    const long long want = (long long)grid.x * grid.y * grid.z * block.x * block.y * block.z;
    const int got = read_flag();
    CHECK(got == want, "%s: %d threads ran, want %lld", what, got, want);
}

static void test_properties(void)
{
    cudaDeviceProp p;
    CUDA_OK(cudaGetDeviceProperties(&p, 0));
    CHECK(p.major == 8 && p.minor == 9, "compute capability %d.%d, want 8.9", p.major, p.minor);
    CHECK(p.maxThreadsPerBlock == 1024, "maxThreadsPerBlock %d", p.maxThreadsPerBlock);
    CHECK(p.maxThreadsDim[0] == 1024 && p.maxThreadsDim[1] == 1024 && p.maxThreadsDim[2] == 64,
          "maxThreadsDim %d %d %d", p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2]);
    CHECK(p.maxGridSize[0] == 2147483647 && p.maxGridSize[1] == 65535 && p.maxGridSize[2] == 65535,
          "maxGridSize %d %d %d", p.maxGridSize[0], p.maxGridSize[1], p.maxGridSize[2]);
    CHECK(p.sharedMemPerBlock == 49152, "sharedMemPerBlock %zu", p.sharedMemPerBlock);
    CHECK(p.sharedMemPerBlockOptin == 101376, "sharedMemPerBlockOptin %zu", p.sharedMemPerBlockOptin);
    CHECK(p.sharedMemPerMultiprocessor == 102400, "sharedMemPerMultiprocessor %zu", p.sharedMemPerMultiprocessor);
    CHECK(p.maxThreadsPerMultiProcessor == 1536, "maxThreadsPerMultiProcessor %d", p.maxThreadsPerMultiProcessor);
    CHECK(p.warpSize == 32 && warpSize == 32, "warpSize %d", p.warpSize);
    int v = 0;
    CUDA_OK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    CHECK(v == 101376, "cudaDevAttrMaxSharedMemoryPerBlockOptin %d", v);
    CUDA_OK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxGridDimY, 0));
    CHECK(v == 65535, "cudaDevAttrMaxGridDimY %d", v);
    CUDA_OK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMinor, 0));
    CHECK(v == 9, "cudaDevAttrComputeCapabilityMinor %d", v);
    int n = 0;
    CUDA_OK(cudaGetDeviceCount(&n));
    CHECK(n == 1, "cudaGetDeviceCount %d", n);
    CUDA_IS(cudaErrorInvalidDevice, cudaSetDevice(1));
    CUDA_IS(cudaErrorInvalidDevice, cudaGetLastError());
    CUDA_IS(cudaSuccess, cudaGetLastError());
}

static void test_limits(void)
{
    refused(1, dim3(1025), cudaErrorInvalidConfiguration, "1025 threads per block");
    refused(1, dim3(1024, 2, 1), cudaErrorInvalidConfiguration, "1024 x 2 threads (2048 per block)");
    refused(1, dim3(32, 32, 2), cudaErrorInvalidConfiguration, "32 x 32 x 2 threads (2048 per block)");
    refused(1, dim3(1, 1, 65), cudaErrorInvalidConfiguration, "block z = 65");
    refused(1, dim3(1, 1025, 1), cudaErrorInvalidConfiguration, "block y = 1025");
    refused(dim3(1, 65536, 1), 1, cudaErrorInvalidConfiguration, "grid y = 65536");
    refused(dim3(1, 1, 65536), 1, cudaErrorInvalidConfiguration, "grid z = 65536");
    refused(dim3(2147483648u, 1, 1), 1, cudaErrorInvalidConfiguration, "grid x = 2^31");
    refused(dim3(0, 1, 1), 32, cudaErrorInvalidConfiguration, "grid x = 0");
    refused(dim3(1, 0, 1), 32, cudaErrorInvalidConfiguration, "grid y = 0");
    refused(dim3(1, 1, 0), 32, cudaErrorInvalidConfiguration, "grid z = 0");
    refused(1, dim3(0, 1, 1), cudaErrorInvalidConfiguration, "block x = 0");
    refused(1, dim3(1, 0, 1), cudaErrorInvalidConfiguration, "block y = 0");
    refused(1, dim3(1, 1, 0), cudaErrorInvalidConfiguration, "block z = 0");
    accepted(1, dim3(1024), "1024 threads per block");
    accepted(1, dim3(1, 1024, 1), "block y = 1024");
    accepted(1, dim3(16, 1, 64), "block z = 64");
    accepted(dim3(1, 65535, 1), 1, "grid y = 65535");
    accepted(dim3(1, 1, 65535), 1, "grid z = 65535");
    accepted(dim3(70000, 1, 1), 1, "grid x = 70000 (past 65535: x allows 2^31 - 1)");
    accepted(dim3(3, 5, 7), dim3(2, 3, 4), "3-D grid of 3-D blocks");
}

static void smem_launch(void (*k)(unsigned, unsigned *), const char *kname, size_t bytes, cudaError_t want,
                        unsigned *d_bad)
{
    const unsigned threads = 256;
    CUDA_OK(cudaMemset(d_bad, 0, 2 * sizeof(unsigned)));
    HKV_LAUNCH(k, 1, threads, bytes, 0)((unsigned)bytes, d_bad);
    const cudaError_t e = cudaGetLastError();
    CHECK(e == want, "%s with %zu bytes of dynamic shared memory: %s, want %s", kname, bytes, cudaGetErrorName(e),
          cudaGetErrorName(want));
    CUDA_OK(cudaDeviceSynchronize());
    unsigned h[2] = {9, 9};
    CUDA_OK(cudaMemcpy(h, d_bad, sizeof h, cudaMemcpyDeviceToHost));
    if (want == cudaSuccess) {
        CHECK(h[1] == (k == k_smem_fill ? threads : 1u), "%s with %zu bytes: %u threads ran", kname, bytes, h[1]);
        CHECK(h[0] == 0, "%s with %zu bytes: %u bytes read back wrong", kname, bytes, h[0]);
    } else {
        CHECK(h[1] == 0, "%s with %zu bytes: refused, yet it ran", kname, bytes);
        CUDA_IS(cudaSuccess, cudaGetLastError());
    }
}

static void test_shared_memory(void)
{
    unsigned *d_bad;
    CUDA_OK(cudaMalloc((void **)&d_bad, 2 * sizeof(unsigned)));
    /* without opt-in: 48 KB runs, one byte more is refused */
    smem_launch(k_smem_plain, "k_smem_plain", 49152, cudaSuccess, d_bad);
    smem_launch(k_smem_plain, "k_smem_plain", 49153, cudaErrorInvalidValue, d_bad);
    smem_launch(k_smem_fill, "k_smem_fill", 49153, cudaErrorInvalidValue, d_bad);
    /* opt-in to 64 KB: 64 KB runs and all of it is usable; 64 KB + 1 refused */
    CUDA_OK(cudaFuncSetAttribute(k_smem_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    smem_launch(k_smem_fill, "k_smem_fill", 65536, cudaSuccess, d_bad);
    smem_launch(k_smem_fill, "k_smem_fill", 65537, cudaErrorInvalidValue, d_bad);
    /* the attribute is per function: k_smem_plain still has the 48 KB limit */
    smem_launch(k_smem_plain, "k_smem_plain", 65536, cudaErrorInvalidValue, d_bad);
    /* the sm_89 opt-in maximum, 99 KB, and not a byte more */
    CUDA_OK(cudaFuncSetAttribute(k_smem_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 101376));
    smem_launch(k_smem_fill, "k_smem_fill", 101376, cudaSuccess, d_bad);
    CUDA_IS(cudaErrorInvalidValue, cudaFuncSetAttribute(k_smem_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 101377));
    CUDA_IS(cudaErrorInvalidValue, cudaGetLastError());
    CUDA_IS(cudaSuccess, cudaGetLastError());
    CUDA_IS(cudaErrorInvalidValue, cudaFuncSetAttribute(k_smem_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 128 << 10));
    CUDA_IS(cudaErrorInvalidValue, cudaFuncSetAttribute(k_smem_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, -1));
    (void)cudaGetLastError();
    /* a refused setting leaves the previous one in force */
    smem_launch(k_smem_fill, "k_smem_fill", 101376, cudaSuccess, d_bad);
    smem_launch(k_smem_fill, "k_smem_fill", 101377, cudaErrorInvalidValue, d_bad);
    CUDA_OK(cudaFree(d_bad));
}

int main(void)
{
    CUDA_OK(cudaMalloc((void **)&g_flag, sizeof(int)));
    test_properties();
    test_limits();
    test_shared_memory();
    /* after all those refusals the device is not in an error state */
    CUDA_IS(cudaSuccess, cudaDeviceSynchronize());
    CUDA_IS(cudaSuccess, cudaGetLastError());
    CUDA_OK(cudaFree(g_flag));
    return test_report("emu_launch");
}

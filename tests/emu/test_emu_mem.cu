/* Device and host memory of the CUDA emulator against the CUDA Runtime API
 * reference ("Memory Management", "API synchronization behavior"):
 *  - the device size comes from HKV_EMU_MEM (this test runs with 64M):
 *    cudaMemGetInfo reports it; allocations up to it succeed, past it
 *    cudaMalloc fails with cudaErrorMemoryAllocation (not sticky); cudaFree
 *    gives the bytes back; fresh device memory reads as 0xff bytes (the
 *    emulator's documented NaN fill: GPU memory is not zeroed);
 *  - cudaMemset, cudaMemcpy in every direction (and cudaMemcpyDefault),
 *    cudaMemcpy2DAsync;
 *  - cudaMemcpyAsync from pageable host memory: "the function will return once
 *    the pageable buffer has been copied to the staging memory", so the host
 *    may overwrite it at once; to pageable host memory: "the function will
 *    return only once the copy has completed";
 *  - page-locked memory: cudaHostAlloc (mapped: cudaHostGetDevicePointer, a
 *    kernel writes through it), cudaHostRegister / cudaHostUnregister
 *    (registering again: cudaErrorHostMemoryAlreadyRegistered; unregistering
 *    what is not registered: cudaErrorHostMemoryNotRegistered);
 *  - errors: a copy or memset running past the end of a device allocation, a
 *    direction that contradicts the pointers, cudaFree of a pointer that
 *    cudaMalloc did not return (cudaErrorInvalidValue), cudaFree(NULL) is a
 *    no-op; cudaMallocAsync / cudaFreeAsync in stream order.
 * With --bad-env (HKV_EMU_MEM=abc): the device fails to initialise,
 * cudaGetDeviceCount returns cudaErrorInitializationError. */
#include <stdint.h>

#include <thread>
#include <vector>

#include "emu_test.h"

static const size_t MiB = 1u << 20;

/* Waits (volatile loads of page-locked host memory) until the host sets
 * *gate, then writes v to out[0..n). Bounded so that a broken emulator fails
 * instead of hanging. */
static __global__ void k_gated_fill(const volatile int *gate, int *out, int n, int v)
{
    if (threadIdx.x == 0) {
        long long spins = 0;
        while (*gate == 0 && spins < (1ll << 33)) spins++;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = v;
}

static __global__ void k_write_mapped(int *p, int n)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x) p[i] = i * 3 + 1;
}

static void test_cap(void)
{
    size_t fr = 0, tot = 0;
    CUDA_OK(cudaMemGetInfo(&fr, &tot));
    CHECK(tot == 64 * MiB, "cudaMemGetInfo total %zu, want 64 MiB (HKV_EMU_MEM=64M)", tot);
    CHECK(fr == 64 * MiB, "free %zu at start, want 64 MiB", fr);
    cudaDeviceProp p;
    CUDA_OK(cudaGetDeviceProperties(&p, 0));
    CHECK(p.totalGlobalMem == 64 * MiB, "totalGlobalMem %zu", p.totalGlobalMem);
    /* one allocation of the whole device, then one of a byte more */
    void *a = nullptr;
    CUDA_IS(cudaErrorMemoryAllocation, cudaMalloc(&a, 64 * MiB + 1));
    CUDA_IS(cudaErrorMemoryAllocation, cudaGetLastError());
    CUDA_IS(cudaSuccess, cudaGetLastError());   /* not sticky */
    CUDA_OK(cudaMalloc(&a, 64 * MiB));
    CUDA_OK(cudaMemGetInfo(&fr, &tot));
    CHECK(fr == 0, "free %zu with the whole device allocated", fr);
    void *b = nullptr;
    CUDA_IS(cudaErrorMemoryAllocation, cudaMalloc(&b, 1));
    (void)cudaGetLastError();
    CUDA_OK(cudaFree(a));
    /* four quarters exactly, a fifth byte fails, freeing one quarter lets it back */
    void *q[4];
    for (int i = 0; i < 4; i++) CUDA_OK(cudaMalloc(&q[i], 16 * MiB));
    CUDA_IS(cudaErrorMemoryAllocation, cudaMalloc(&b, 1));
    (void)cudaGetLastError();
    CUDA_OK(cudaFree(q[2]));
    CUDA_OK(cudaMemGetInfo(&fr, &tot));
    CHECK(fr == 16 * MiB, "free %zu after freeing 16 MiB of a full device", fr);
    CUDA_IS(cudaErrorMemoryAllocation, cudaMalloc(&b, 16 * MiB + 1));
    (void)cudaGetLastError();
    CUDA_OK(cudaMalloc(&q[2], 16 * MiB));
    /* fresh memory: 0xff bytes everywhere (read back in full) */
    std::vector<unsigned char> h(16 * MiB, 0);
    CUDA_OK(cudaMemcpy(h.data(), q[2], h.size(), cudaMemcpyDeviceToHost));
    size_t not_ff = 0;
    for (unsigned char c : h) not_ff += c != 0xff;
    CHECK(not_ff == 0, "fresh device memory: %zu bytes are not 0xff", not_ff);
    float f;
    memcpy(&f, h.data(), 4);
    CHECK(f != f, "fresh device memory read as float is not NaN");
    for (int i = 0; i < 4; i++) CUDA_OK(cudaFree(q[i]));
    CUDA_OK(cudaMemGetInfo(&fr, &tot));
    CHECK(fr == 64 * MiB, "free %zu after freeing everything", fr);
    /* zero bytes: success */
    CUDA_OK(cudaMalloc(&b, 0));
    CUDA_OK(cudaFree(b));
}

static void test_copies(void)
{
    const size_t n = 1000;
    std::vector<int> h1(n), h2(n, 0), h3(n, 0);
    for (size_t i = 0; i < n; i++) h1[i] = (int)(i * 7919 + 13);
    int *d1, *d2;
    CUDA_OK(cudaMalloc((void **)&d1, n * sizeof(int)));
    CUDA_OK(cudaMalloc((void **)&d2, n * sizeof(int)));
    /* memset: bytes */
    CUDA_OK(cudaMemset(d1, 0x3c, n * sizeof(int)));
    CUDA_OK(cudaMemset(d1 + 10, 0x01, 5 * sizeof(int)));
    CUDA_OK(cudaMemcpy(h2.data(), d1, n * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += h2[i] != ((i >= 10 && i < 15) ? 0x01010101 : 0x3c3c3c3c);
    CHECK(bad == 0, "cudaMemset: %d wrong words", bad);
    /* host -> device -> device -> host, host -> host */
    CUDA_OK(cudaMemcpy(d1, h1.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d2, d1, n * sizeof(int), cudaMemcpyDeviceToDevice));
    CUDA_OK(cudaMemcpy(h2.data(), d2, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(h2 == h1, "H2D, D2D, D2H round trip differs");
    CUDA_OK(cudaMemcpy(h3.data(), h2.data(), n * sizeof(int), cudaMemcpyHostToHost));
    CHECK(h3 == h1, "cudaMemcpyHostToHost differs");
    /* cudaMemcpyDefault in every direction (unified addressing) */
    std::fill(h2.begin(), h2.end(), 0);
    CUDA_OK(cudaMemset(d2, 0, n * sizeof(int)));
    CUDA_OK(cudaMemcpy(d2 + 1, h1.data() + 1, 10 * sizeof(int), cudaMemcpyDefault));
    CUDA_OK(cudaMemcpy(d1, d2, n * sizeof(int), cudaMemcpyDefault));
    CUDA_OK(cudaMemcpy(h2.data(), d1, n * sizeof(int), cudaMemcpyDefault));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += h2[i] != ((i >= 1 && i < 11) ? h1[i] : 0);
    CHECK(bad == 0, "cudaMemcpyDefault: %d wrong words", bad);
    /* 2-D: 4 rows of 3 ints from a pitch of 5 ints into a pitch of 4 */
    std::vector<int> src(20), dst(16, -1);
    for (int i = 0; i < 20; i++) src[i] = i;
    CUDA_OK(cudaMemset(d1, 0xff, 16 * sizeof(int)));
    CUDA_OK(cudaMemcpy2DAsync(d1, 4 * sizeof(int), src.data(), 5 * sizeof(int), 3 * sizeof(int), 4,
                              cudaMemcpyHostToDevice, 0));
    CUDA_OK(cudaMemcpy(dst.data(), d1, 16 * sizeof(int), cudaMemcpyDeviceToHost));
    bad = 0;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) bad += dst[r * 4 + c] != (c < 3 ? r * 5 + c : -1);
    CHECK(bad == 0, "cudaMemcpy2DAsync: %d wrong words", bad);
    /* errors: past the end of an allocation (either side), the destination untouched */
    std::vector<int> big(n + 1, 77);
    CUDA_OK(cudaMemset(d1, 0, n * sizeof(int)));
    cudaError_t e;
    stderr_capture cap;
    cap.begin();
    e = cudaMemcpy(d1, big.data(), (n + 1) * sizeof(int), cudaMemcpyHostToDevice);
    cap.end();
    CHECK(e == cudaErrorInvalidValue, "H2D copy past the end of the allocation: %s", cudaGetErrorName(e));
    CUDA_IS(cudaErrorInvalidValue, cudaGetLastError());
    CUDA_IS(cudaSuccess, cudaGetLastError());
    cap.begin();
    e = cudaMemcpy(big.data(), d1 + 1, n * sizeof(int), cudaMemcpyDeviceToHost);
    cap.end();
    CHECK(e != cudaSuccess, "D2H copy from past the end of the allocation succeeded");
    cap.begin();
    e = cudaMemcpy(d2 + 500, d1, n * sizeof(int), cudaMemcpyDeviceToDevice);
    cap.end();
    CHECK(e != cudaSuccess, "D2D copy past the end of the destination succeeded");
    cap.begin();
    e = cudaMemset(d1 + 1, 0, n * sizeof(int));
    cap.end();
    CHECK(e != cudaSuccess, "cudaMemset past the end succeeded");
    (void)cudaGetLastError();
    CUDA_OK(cudaMemcpy(h2.data(), d1, n * sizeof(int), cudaMemcpyDeviceToHost));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += h2[i] != 0;
    CHECK(bad == 0, "a refused copy or memset changed %d words of the destination", bad);
    CHECK(big[0] == 77 && big[n] == 77, "a refused D2H copy changed the host buffer");
    /* errors: the direction contradicts the pointers */
    cap.begin();
    e = cudaMemcpy(d2, d1, 16, cudaMemcpyHostToDevice);   /* device source */
    cap.end();
    CHECK(e != cudaSuccess, "HostToDevice with a device source succeeded");
    cap.begin();
    e = cudaMemcpy(h2.data(), h1.data(), 16, cudaMemcpyDeviceToHost);   /* host source */
    cap.end();
    CHECK(e != cudaSuccess, "DeviceToHost with a host source succeeded");
    cap.begin();
    e = cudaMemcpy(h2.data(), d1, 16, cudaMemcpyDeviceToDevice);   /* host destination */
    cap.end();
    CHECK(e != cudaSuccess, "DeviceToDevice with a host destination succeeded");
    e = cudaMemcpy(d2, d1, 16, (cudaMemcpyKind)7);
    CHECK(e == cudaErrorInvalidMemcpyDirection, "copy kind 7: %s, want cudaErrorInvalidMemcpyDirection",
          cudaGetErrorName(e));
    (void)cudaGetLastError();
    /* errors: frees */
    int local = 0;
    CUDA_IS(cudaErrorInvalidValue, cudaFree(&local));
    CUDA_IS(cudaErrorInvalidValue, cudaFree(d1 + 4));   /* inside an allocation, not its start */
    CUDA_IS(cudaErrorInvalidValue, cudaFreeHost(d1));    /* device memory to cudaFreeHost */
    CUDA_OK(cudaFree(nullptr));
    CUDA_OK(cudaFree(d1));
    CUDA_IS(cudaErrorInvalidValue, cudaFree(d1));       /* twice */
    (void)cudaGetLastError();
    CUDA_OK(cudaFree(d2));
}

static void test_async_pageable(void)
{
    const int n = 4096;
    int *d;
    int *gate;   /* page-locked, read by the kernel */
    CUDA_OK(cudaMalloc((void **)&d, n * sizeof(int)));
    CUDA_OK(cudaHostAlloc((void **)&gate, sizeof(int), cudaHostAllocMapped));
    int *d_gate;
    CUDA_OK(cudaHostGetDevicePointer((void **)&d_gate, gate, 0));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    /* host -> device from pageable memory: the source is read at the call.
     * A gated kernel holds the stream, so the copy cannot run before the
     * host overwrites its source. */
    for (int it = 0; it < 3; it++) {
        std::vector<int> src(n);
        for (int i = 0; i < n; i++) src[i] = i * 5 + it;
        *(volatile int *)gate = 0;
        HKV_LAUNCH(k_gated_fill, 1, 64, 0, s)(d_gate, d, n, -1);
        CUDA_OK(cudaGetLastError());
        CUDA_OK(cudaMemcpyAsync(d, src.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
        for (int i = 0; i < n; i++) src[i] = -7;   /* overwritten before the copy ran */
        *(volatile int *)gate = 1;
        CUDA_OK(cudaStreamSynchronize(s));
        std::vector<int> got(n);
        CUDA_OK(cudaMemcpy(got.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < n; i++) bad += got[i] != i * 5 + it;
        CHECK(bad == 0, "cudaMemcpyAsync H2D from pageable memory: %d words are not the data at the call", bad);
    }
    /* device -> pageable host: returns only once the copy is complete. The
     * kernel before it is released by another host thread 30 ms later. */
    {
        std::vector<int> dst(n, 0);
        *(volatile int *)gate = 0;
        HKV_LAUNCH(k_gated_fill, 1, 64, 0, s)(d_gate, d, n, 4242);
        CUDA_OK(cudaGetLastError());
        std::thread opener([gate] {
            usleep(30000);
            __atomic_store_n(gate, 1, __ATOMIC_SEQ_CST);
        });
        CUDA_OK(cudaMemcpyAsync(dst.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        int bad = 0;
        for (int i = 0; i < n; i++) bad += dst[i] != 4242;   /* no synchronisation before this read */
        CHECK(bad == 0, "cudaMemcpyAsync D2H to pageable memory returned before the copy completed (%d words)", bad);
        opener.join();
        CUDA_OK(cudaStreamSynchronize(s));
    }
    /* to and from page-locked memory: correct after the sync */
    {
        int *pin;
        CUDA_OK(cudaMallocHost((void **)&pin, n * sizeof(int)));
        for (int i = 0; i < n; i++) pin[i] = i ^ 0x1234;
        CUDA_OK(cudaMemcpyAsync(d, pin, n * sizeof(int), cudaMemcpyHostToDevice, s));
        CUDA_OK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++) pin[i] = 0;
        CUDA_OK(cudaMemcpyAsync(pin, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        CUDA_OK(cudaStreamSynchronize(s));
        int bad = 0;
        for (int i = 0; i < n; i++) bad += pin[i] != (i ^ 0x1234);
        CHECK(bad == 0, "async copies through page-locked memory: %d wrong", bad);
        CUDA_OK(cudaFreeHost(pin));
    }
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFreeHost(gate));
    CUDA_OK(cudaFree(d));
}

static void test_pinned(void)
{
    /* cudaHostAlloc mapped: a kernel writes through the device pointer */
    const int n = 1000;
    int *h, *dp;
    CUDA_OK(cudaHostAlloc((void **)&h, n * sizeof(int), cudaHostAllocMapped));
    CUDA_OK(cudaHostGetDevicePointer((void **)&dp, h, 0));
    CHECK(dp != nullptr, "no device pointer for mapped memory");
    HKV_LAUNCH(k_write_mapped, 1, 128, 0, 0)(dp, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != i * 3 + 1;
    CHECK(bad == 0, "kernel writes through cudaHostGetDevicePointer: %d wrong", bad);
    void *x = nullptr;
    CUDA_IS(cudaErrorInvalidValue, cudaHostGetDevicePointer(&x, h, 1));   /* flags must be 0 */
    int pageable_word = 0;
    CUDA_IS(cudaErrorInvalidValue, cudaHostGetDevicePointer(&x, &pageable_word, 0));
    (void)cudaGetLastError();
    CUDA_IS(cudaErrorInvalidValue, cudaFree(h));   /* page-locked memory to cudaFree */
    (void)cudaGetLastError();
    CUDA_OK(cudaFreeHost(h));

    /* cudaHostRegister / cudaHostUnregister */
    const size_t bytes = 1 << 16;
    char *buf = (char *)aligned_alloc(4096, bytes);
    CUDA_OK(cudaHostRegister(buf, bytes, cudaHostRegisterMapped));
    CUDA_IS(cudaErrorHostMemoryAlreadyRegistered, cudaHostRegister(buf, bytes, 0));
    CUDA_IS(cudaErrorHostMemoryAlreadyRegistered, cudaHostRegister(buf + 4096, 4096, 0));   /* a part of it */
    CUDA_IS(cudaErrorHostMemoryAlreadyRegistered, cudaGetLastError());
    CUDA_IS(cudaSuccess, cudaGetLastError());
    int *rp;
    CUDA_OK(cudaHostGetDevicePointer((void **)&rp, buf, 0));
    HKV_LAUNCH(k_write_mapped, 1, 64, 0, 0)(rp, 100);
    CUDA_OK(cudaDeviceSynchronize());
    bad = 0;
    for (int i = 0; i < 100; i++) bad += ((int *)buf)[i] != i * 3 + 1;
    CHECK(bad == 0, "kernel writes through a registered range: %d wrong", bad);
    /* registered memory is a valid async copy source */
    int *d;
    CUDA_OK(cudaMalloc((void **)&d, 100 * sizeof(int)));
    CUDA_OK(cudaMemcpyAsync(d, buf, 100 * sizeof(int), cudaMemcpyHostToDevice, 0));
    std::vector<int> back(100);
    CUDA_OK(cudaMemcpy(back.data(), d, 100 * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(memcmp(back.data(), buf, 100 * sizeof(int)) == 0, "copy from registered memory differs");
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaHostUnregister(buf));
    CUDA_IS(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(buf));
    int other = 0;
    CUDA_IS(cudaErrorHostMemoryNotRegistered, cudaHostUnregister(&other));
    (void)cudaGetLastError();
    /* registrable again once unregistered */
    CUDA_OK(cudaHostRegister(buf, bytes, 0));
    CUDA_OK(cudaHostUnregister(buf));
    free(buf);
}

static void test_async_alloc(void)
{
    cudaStream_t s;
    CUDA_OK(cudaStreamCreate(&s));
    size_t fr0, fr, tot;
    CUDA_OK(cudaMemGetInfo(&fr0, &tot));
    int *p = nullptr;
    CUDA_OK(cudaMallocAsync((void **)&p, 8 * MiB, s));
    CHECK(p != nullptr, "cudaMallocAsync gave no pointer");
    CUDA_OK(cudaMemsetAsync(p, 0x11, 8 * MiB, s));
    int h = 0;
    CUDA_OK(cudaMemcpyAsync(&h, p + 12345, sizeof h, cudaMemcpyDeviceToHost, s));
    CHECK(h == 0x11111111, "cudaMallocAsync memory after cudaMemsetAsync: 0x%08x", h);
    CUDA_OK(cudaFreeAsync(p, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemGetInfo(&fr, &tot));
    CHECK(fr == fr0, "after cudaFreeAsync and a sync: %zu free, was %zu", fr, fr0);
    int local = 0;
    CUDA_IS(cudaErrorInvalidValue, cudaFreeAsync(&local, s));
    (void)cudaGetLastError();
    CUDA_OK(cudaStreamDestroy(s));
}

static int bad_env(void)
{
    int n = 5;
    stderr_capture cap;
    cap.begin();
    const cudaError_t e = cudaGetDeviceCount(&n);
    const std::string msg = cap.end();
    CHECK(e == cudaErrorInitializationError, "cudaGetDeviceCount with HKV_EMU_MEM=%s: %s", getenv("HKV_EMU_MEM"),
          cudaGetErrorName(e));
    CHECK(n == 0, "device count %d with a malformed HKV_EMU_MEM", n);
    CHECK(has(msg, "HKV_EMU_MEM"), "the message does not name the variable: \"%s\"", msg.c_str());
    void *p = nullptr;
    CUDA_IS(cudaErrorInitializationError, cudaMalloc(&p, 16));
    CUDA_IS(cudaErrorInitializationError, cudaSetDevice(0));
    size_t fr, tot;
    CUDA_IS(cudaErrorInitializationError, cudaMemGetInfo(&fr, &tot));
    return test_report("emu_mem_bad_env");
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--bad-env")) return bad_env();
    const char *cap = getenv("HKV_EMU_MEM");
    if (!cap || strcmp(cap, "64M")) {
        fprintf(stderr, "FAIL: run with HKV_EMU_MEM=64M (tests/emu/meson.build sets it)\n");
        return 1;
    }
    test_cap();
    test_copies();
    test_async_pageable();
    test_pinned();
    test_async_alloc();
    return test_report("emu_mem");
}

/* Kernel faults the CUDA emulator must detect, each followed by
 * cudaDeviceReset() to clear the sticky error:
 *  - "Synchronization Functions": __syncthreads() in conditional code is
 *    allowed only if the condition is the same across the whole block; a
 *    barrier some threads skip (early return) and two different
 *    __syncthreads() sites are undefined on a GPU (a hang or corruption) and a
 *    fault here;
 *  - "Warp Shuffle Functions": width must be a power of two in [1, warpSize];
 *    each calling thread must have its own bit set in mask, and all threads
 *    named in mask must execute the same intrinsic; reading a lane that does
 *    not take part gives an undefined value. The emulator turns these into
 *    faults, and (stricter than the guide, by design: gpu/emu/emu_block.cc)
 *    also a mask naming a lane that has exited or does not exist.
 * A fault must surface as on a GPU after an error in a kernel: the launch
 * itself succeeds (cudaGetLastError() is cudaSuccess), the next
 * synchronisation returns cudaErrorLaunchFailure, and the error is sticky
 * (CUDA Runtime API, "Error Handling": every later call returns it, and
 * cudaGetLastError() does not clear it) until cudaDeviceReset(). The
 * emulator's report on stderr must name the kernel. */
#include <vector>

#include "emu_test.h"

static __global__ void k_early_return(int *out)
{
    if (threadIdx.x >= 40) return;   /* skip the barrier: 40 of 64 reach it */
    __syncthreads();
    out[threadIdx.x] = 1;
}

static __global__ void k_two_sites(int *out)
{
    if (threadIdx.x < 16) {
        __syncthreads();
        out[threadIdx.x] = 1;
    } else {
        __syncthreads();
        out[threadIdx.x] = 2;
    }
}

static __global__ void k_shfl_width(int w, int *out)
{
    out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 1, w);
}

static __global__ void k_shfl_exited(int *out)
{
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0);
}

static __global__ void k_shfl_beyond_warp(int *out)
{
    /* a block of 7 threads: lanes 7..31 do not exist */
    out[threadIdx.x] = __shfl_xor_sync(0xffu, (int)threadIdx.x, 1);
}

static __global__ void k_shfl_read_outside(int *out)
{
    const unsigned lo = 0x0000ffffu, hi = 0xffff0000u;
    /* the low half reads lane 20, which is not in its mask */
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(lo, (int)threadIdx.x, 20);
    else out[threadIdx.x] = __shfl_sync(hi, (int)threadIdx.x, 20);
}

static __global__ void k_shfl_not_self(int *out)
{
    out[threadIdx.x] = __shfl_sync(0xfffffffeu, (int)threadIdx.x, 1);   /* lane 0 not in its own mask */
}

static __global__ void k_ballot_exited(int *out)
{
    if (threadIdx.x & 1) return;
    out[threadIdx.x] = (int)__ballot_sync(0xffffffffu, 1);
}

static __global__ void k_divergent_masks(int *out)
{
    /* lanes 0..15 with one mask, 8..31 with another overlapping one */
    const unsigned m = threadIdx.x < 16 ? 0x0000ffffu : 0xffffff00u;
    out[threadIdx.x] = __shfl_sync(m, (int)threadIdx.x, 8);
}

static __global__ void k_warp_vs_barrier(int *out)
{
    /* lane 0 waits in __syncwarp for lanes that wait at __syncthreads */
    if (threadIdx.x == 0) __syncwarp();
    else __syncthreads();
    out[threadIdx.x] = 1;
}

/* A fault in one block of many: only block 5 of 64 misbehaves. */
static __global__ void k_one_bad_block(int *out)
{
    if (blockIdx.x == 5 && threadIdx.x == 3) return;
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

static __global__ void k_fill(int *out, int v) { out[blockIdx.x * blockDim.x + threadIdx.x] = v; }

/* A kernel that runs correctly: after a reset, the device works again. */
static void expect_device_works(const char *after)
{
    (void)cudaGetLastError();   /* the last error after a reset is not specified: cleared here */
    int *d = nullptr;
    CUDA_OK(cudaMalloc((void **)&d, 64 * sizeof(int)));
    HKV_LAUNCH(k_fill, 2, 32, 0, 0)(d, 42);
    cudaError_t e = cudaGetLastError();
    CHECK(e == cudaSuccess, "after %s and cudaDeviceReset: launch gives %s", after, cudaGetErrorName(e));
    CUDA_OK(cudaDeviceSynchronize());
    int h[64] = {0};
    CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += h[i] != 42;
    CHECK(bad == 0, "after %s and cudaDeviceReset: a correct kernel wrote %d wrong values", after, bad);
    CUDA_OK(cudaFree(d));
}

/* Launch via `launch` (which enqueues a faulting kernel on `stream`), then
 * check the error protocol and the report. `sync` picks the call that must
 * report the fault: 0 cudaStreamSynchronize, 1 cudaDeviceSynchronize,
 * 2 cudaEventSynchronize of an event recorded after the kernel. */
template <class F>
static void expect_fault(const char *kernel, const char *what, F launch, int sync = 0,
                         cudaStream_t stream = 0)
{
    int *d = nullptr;
    CUDA_OK(cudaMalloc((void **)&d, 64 * 64 * sizeof(int)));
    cudaEvent_t ev = nullptr;
    if (sync == 2) CUDA_OK(cudaEventCreate(&ev));
    stderr_capture cap;
    cap.begin();
    launch(d, stream);
    const cudaError_t at_launch = cudaGetLastError();
    /* the record may already see the fault (it is asynchronous): then the
     * record is the call that reports it */
    const cudaError_t at_record = sync == 2 ? cudaEventRecord(ev, stream) : cudaSuccess;
    const cudaError_t at_sync = sync == 0 ? cudaStreamSynchronize(stream)
                                : sync == 1 ? cudaDeviceSynchronize()
                                : at_record != cudaSuccess ? at_record : cudaEventSynchronize(ev);
    const std::string msg = cap.end();
    /* the configuration is valid: the launch returns success, or already the
     * sticky error if the kernel has faulted by then */
    CHECK(at_launch == cudaSuccess || at_launch == cudaErrorLaunchFailure,
          "%s: the launch itself returned %s", kernel, cudaGetErrorName(at_launch));
    CHECK(at_sync == cudaErrorLaunchFailure, "%s: the sync returned %s, want cudaErrorLaunchFailure", kernel,
          cudaGetErrorName(at_sync));
    CHECK(has(msg, kernel), "%s: the report does not name the kernel: \"%s\"", kernel, msg.c_str());
    /* what: one phrase, or alternatives separated by '|' (which fault is seen
     * first can depend on the order the emulator runs the threads in) */
    bool said = false;
    for (std::string alts = what; !said && !alts.empty();) {
        const size_t bar = alts.find('|');
        said = has(msg, alts.substr(0, bar).c_str());
        alts = bar == std::string::npos ? "" : alts.substr(bar + 1);
    }
    CHECK(said, "%s: the report does not say \"%s\": \"%s\"", kernel, what, msg.c_str());
    /* sticky: cudaGetLastError returns it and does not clear it; other calls fail */
    CUDA_IS(cudaErrorLaunchFailure, cudaGetLastError());
    CUDA_IS(cudaErrorLaunchFailure, cudaGetLastError());
    CUDA_IS(cudaErrorLaunchFailure, cudaPeekAtLastError());
    CUDA_IS(cudaErrorLaunchFailure, cudaDeviceSynchronize());
    void *p = nullptr;
    CUDA_IS(cudaErrorLaunchFailure, cudaMalloc(&p, 16));
    int h = 0;
    CUDA_IS(cudaErrorLaunchFailure, cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    /* a launch after the fault does not run */
    HKV_LAUNCH(k_fill, 1, 32, 0, 0)(d, 7);
    CUDA_IS(cudaErrorLaunchFailure, cudaGetLastError());
    if (ev) CUDA_OK(cudaEventDestroy(ev));
    CUDA_OK(cudaDeviceReset());   /* clears the sticky error; frees all device memory */
    expect_device_works(kernel);
}

int main(void)
{
    expect_fault("k_early_return", "barrier divergence",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_early_return, 1, 64, 0, s)(d); });
    expect_fault("k_early_return", "barrier divergence",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_early_return, 1, 64, 0, s)(d); }, 1);
    expect_fault("k_two_sites", "divergent barriers",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_two_sites, 1, 64, 0, s)(d); });
    expect_fault("k_shfl_width", "width 3",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_shfl_width, 1, 32, 0, s)(3, d); });
    expect_fault("k_shfl_width", "width 64",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_shfl_width, 1, 32, 0, s)(64, d); }, 2);
    expect_fault("k_shfl_width", "width 0",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_shfl_width, 1, 32, 0, s)(0, d); });
    expect_fault("k_shfl_exited", "exited",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_shfl_exited, 1, 32, 0, s)(d); });
    expect_fault("k_shfl_beyond_warp", "do not exist",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_shfl_beyond_warp, 1, 7, 0, s)(d); });
    expect_fault("k_shfl_read_outside", "not in the mask",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_shfl_read_outside, 1, 32, 0, s)(d); });
    expect_fault("k_shfl_not_self", "does not name its own lane",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_shfl_not_self, 1, 32, 0, s)(d); });
    expect_fault("k_ballot_exited", "__ballot_sync",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_ballot_exited, 1, 32, 0, s)(d); });
    /* lanes 8..15 are in both masks: either the masks are seen to diverge, or
     * the low group completes and exits before the high group calls */
    expect_fault("k_divergent_masks", "divergent warp collectives|have exited",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_divergent_masks, 1, 32, 0, s)(d); });
    expect_fault("k_warp_vs_barrier", "deadlock",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_warp_vs_barrier, 1, 32, 0, s)(d); });
    expect_fault("k_one_bad_block", "block (5,0,0)",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_one_bad_block, 64, 64, 0, s)(d); }, 1);
    /* on a created stream: that stream's sync reports it */
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    expect_fault("k_early_return", "barrier divergence",
                 [](int *d, cudaStream_t s) { HKV_LAUNCH(k_early_return, 1, 64, 0, s)(d); }, 0, st);
    (void)cudaStreamDestroy(st);   /* a reset destroys streams on a GPU: the result is not checked */
    return test_report("emu_fault");
}

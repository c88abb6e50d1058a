/* Internal to the CUDA emulator's library (the .cc files of gpu/emu): configuration,
 * the error state, streams as host queues, grid execution.
 *
 * The emulated device is process-wide state, as a CUDA driver's context is:
 * the runtime API it implements has no context argument. It lives in one
 * object per concern (config, error state, memory table, stream registry,
 * worker pool), each created on first use and never destroyed, so that a
 * call from a static destructor or a still-running stream thread at exit
 * finds it alive. */
#ifndef HKV_EMU_INTERNAL_H
#define HKV_EMU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <string>

#include "emu_device.h"

/* Which sanitizer instruments this build: GCC says so with __SANITIZE_*__,
 * clang with __has_feature (the TSan build is clang's, for libomp's Archer). */
#if defined(__SANITIZE_ADDRESS__)
#define HKV_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HKV_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define HKV_EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HKV_EMU_TSAN 1
#endif
#endif

namespace hkv_emu {

struct config {
    size_t mem_cap;        /* HKV_EMU_MEM: emulated device memory, bytes */
    int workers;           /* HKV_EMU_WORKERS: threads running blocks */
    bool eager;            /* HKV_EMU_EAGER=1: every stream item runs at enqueue */
    int delay_us;          /* HKV_EMU_DELAY=N: a stream thread sleeps 0..N us (pseudo-random)
                              before each item, so host code that reuses a buffer an
                              asynchronous copy still reads loses the race it would lose
                              on a busy GPU */
    bool shuffle;          /* HKV_EMU_SHUFFLE=0 turns off shuffled block/thread order */
    uint64_t seed;         /* HKV_EMU_SEED */
    size_t stack_bytes;    /* HKV_EMU_STACK: per CUDA thread (fiber) */
    int sm;                /* HKV_EMU_SM: 89 or 90, whose limits the device has */
    bool abort_on_fault;   /* HKV_EMU_ABORT=1: abort() at a kernel fault, for a debugger */
    bool refuse_capture;   /* HKV_EMU_REFUSE_CAPTURE=1: every stream capture ends invalidated,
                              as when a driver refuses one of its operations (tests the
                              callers' way back) */
    std::string bad;       /* a malformed variable: the device then fails to initialise */
};
const config &cfg(void);

/* Limits of the emulated architecture (CUDA Programming Guide, "Technical
 * Specifications per Compute Capability"). */
struct arch_limits {
    int max_threads_block;
    int max_block_dim[3];
    unsigned max_grid[3];
    size_t smem_static, smem_optin, smem_sm;
    int sm_count, threads_sm;
};
const arch_limits &limits(void);

/* Errors: the calling host thread's last error, the device's sticky fault. */
cudaError_t ret(cudaError_t e);           /* records e as the last error unless success */
cudaError_t sticky(void);                 /* cudaErrorLaunchFailure after a fault, else success */
void device_fault(const std::string &what);   /* records, prints once, sticky from now on */
void clear_sticky(void);

/* Streams. An item runs on the stream's own host thread, in order; with
 * cfg().eager it runs at once on the caller's thread. s may be 0 (the legacy
 * default stream, ordered against every blocking stream). */
cudaError_t enqueue(cudaStream_t s, std::function<void()> item);
/* Enqueue and wait for that item to complete. */
cudaError_t enqueue_wait(cudaStream_t s, std::function<void()> item);
bool stream_valid(cudaStream_t s);
void device_sync(void);
/* Stream capture (emu_stream.cc): an operation that cannot be captured,
 * issued on stream s, gets cudaErrorStreamCaptureUnsupported and
 * invalidates s's capture if one is open (else cudaSuccess); a
 * synchronising call (device-wide, cudaMalloc, cudaFree, and any work on the
 * legacy stream: enqueue and enqueue_wait check that) is refused the same
 * way while a global-mode capture is open anywhere (true: refuse). */
cudaError_t capture_refuse(cudaStream_t s);
bool capture_forbids_sync(void);

/* Memory kinds for copy checks. */
enum mem_kind { MEM_PAGEABLE, MEM_DEVICE, MEM_PINNED };
/* The kind of [p, p + bytes); MEM_DEVICE only when the whole range lies in
 * one device allocation. *overrun is set when it starts in one and runs
 * past its end (a bug on a GPU too). */
mem_kind classify(const void *p, size_t bytes, bool *overrun);
void free_all_device(void);

/* Grids. run_grid executes every block (on the worker pool and the calling
 * thread) and returns the first fault's description, or "". */
struct grid_job {
    kernel_body *body;
    const char *name;
    dim3 grid, block;
    size_t smem;
};
std::string run_grid(const grid_job &job);

}  // namespace hkv_emu

#endif

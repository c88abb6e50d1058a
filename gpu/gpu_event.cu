/* Streams and events behind gpu_ctx.h's C API (the pipeline's overlap of
 * device work with host work is built from these), the spin that keeps a
 * stream busy while a benchmark queues work behind it, and graphs: a
 * stream's work captured and replayed whole. */
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "gpu_internal.cuh"

extern "C" int hkv_gpu_stream_create(void **stream, hkv_err *err)
{
    cudaStream_t s = NULL;
    *stream = NULL;
    HKV_CUDA_TRY(err, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = (void *)s;
    return HKV_OK;
}

extern "C" void hkv_gpu_stream_destroy(void *stream)
{
    if (stream) cudaStreamDestroy(hkv_stream(stream));
}

extern "C" int hkv_gpu_event_create(void **event, hkv_err *err)
{
    cudaEvent_t e = NULL;
    *event = NULL;
    /* Blocking sync: a host thread waiting for the device sleeps instead of
     * spinning on a core the CPU workers need. */
    HKV_CUDA_TRY(err, cudaEventCreateWithFlags(&e, cudaEventBlockingSync));
    *event = (void *)e;
    return HKV_OK;
}

extern "C" void hkv_gpu_event_destroy(void *event)
{
    if (event) cudaEventDestroy((cudaEvent_t)event);
}

extern "C" int hkv_gpu_event_record(void *event, void *stream, hkv_err *err)
{
    /* While the stream is captured, an external record: a node that each
     * launch of the graph records, which the host can wait for (a plain
     * record there would be an internal node, invisible to the host). */
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    HKV_CUDA_TRY(err, cudaStreamIsCapturing(hkv_stream(stream), &st));
    HKV_CUDA_TRY(err, cudaEventRecordWithFlags((cudaEvent_t)event, hkv_stream(stream),
                                               st == cudaStreamCaptureStatusNone
                                                   ? cudaEventRecordDefault
                                                   : cudaEventRecordExternal));
    return HKV_OK;
}

static double wait_clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

extern "C" int hkv_gpu_event_wait(void *event, double spin_us, int *slept, hkv_err *err)
{
    if (slept) *slept = 0;
    if (spin_us > 0) {
        const double end = wait_clock_s() + spin_us * 1e-6;
        for (;;) {
            const cudaError_t e = cudaEventQuery((cudaEvent_t)event);
            if (e == cudaSuccess) return HKV_OK;
            if (e != cudaErrorNotReady) return hkv_gpu_fail(err, e, "cudaEventQuery");
            cudaGetLastError();   /* "not ready" must not become the next launch's error */
            if (wait_clock_s() >= end) break;
#ifdef HKV_CUDA_EMU
            sched_yield();   /* the emulated device runs on these cores */
#elif defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
    }
    if (slept) *slept = 1;
    HKV_CUDA_TRY(err, cudaEventSynchronize((cudaEvent_t)event));
    return HKV_OK;
}

extern "C" int hkv_gpu_event_sync(void *event, hkv_err *err)
{
    return hkv_gpu_event_wait(event, 0, NULL, err);
}

extern "C" int hkv_gpu_stream_wait(void *stream, void *event, hkv_err *err)
{
    HKV_CUDA_TRY(err, cudaStreamWaitEvent(hkv_stream(stream), (cudaEvent_t)event, 0));
    return HKV_OK;
}

extern "C" int hkv_gpu_event_elapsed(void *start, void *end, float *ms, hkv_err *err)
{
    cudaError_t e = cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end);
    if (e != cudaSuccess) {
        cudaGetLastError();   /* a timing not ready is not the next launch's error */
        return hkv_gpu_fail(err, e, "cudaEventElapsedTime");
    }
    return HKV_OK;
}

extern "C" int hkv_gpu_event_done(void *event)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e != cudaSuccess) cudaGetLastError();
    return e == cudaSuccess;
}

/* Nanoseconds of the device's global timer (the emulator's device is the
 * host, whose monotonic clock stands in for it). */
__device__ __forceinline__ unsigned long long ev_timer_ns(void)
{
#ifdef HKV_CUDA_EMU
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
#else
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#endif
}

static __global__ void k_spin(unsigned long long ns)
{
    const unsigned long long t0 = ev_timer_ns();
    while (ev_timer_ns() - t0 < ns) {
    }
}

extern "C" int hkv_gpu_spin(double us, void *stream, hkv_err *err)
{
    if (!(us >= 0) || us > 1e7)
        return hkv_seterr(err, HKV_E_INVAL, "gpu spin: %g us (0 to 10 s)", us);
    HKV_LAUNCH(k_spin, 1, 1, 0, hkv_stream(stream))((unsigned long long)(us * 1e3));
    HKV_LAUNCH_CHECK(err);
    return HKV_OK;
}

/* ---- graphs ---------------------------------------------------------------- */

struct hkv_gpu_graph {
    cudaGraphExec_t exec;
    size_t nodes;
};

extern "C" int hkv_gpu_capture_begin(void *stream, hkv_err *err)
{
    /* Thread-local: this thread may not make a call that would synchronise
     * with the captured stream (the emulator refuses the same); the host's
     * worker threads never call CUDA. */
    HKV_CUDA_TRY(err, cudaStreamBeginCapture(hkv_stream(stream), cudaStreamCaptureModeThreadLocal));
    return HKV_OK;
}

extern "C" int hkv_gpu_capturing(void *stream)
{
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(hkv_stream(stream), &st) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return st == cudaStreamCaptureStatusNone ? 0 : st == cudaStreamCaptureStatusActive ? 1 : 2;
}

extern "C" void hkv_gpu_capture_abort(void *stream)
{
    cudaGraph_t g = NULL;
    if (cudaStreamEndCapture(hkv_stream(stream), &g) != cudaSuccess) cudaGetLastError();
    if (g) cudaGraphDestroy(g);
}

extern "C" int hkv_gpu_capture_end(void *stream, hkv_gpu_graph **out, hkv_err *err)
{
    *out = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(hkv_stream(stream), &g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return hkv_gpu_fail(err, e, "cudaStreamEndCapture (an operation of the step could not be "
                                    "captured)");
    }
    hkv_gpu_graph *x = (hkv_gpu_graph *)calloc(1, sizeof *x);
    if (!x) {
        cudaGraphDestroy(g);
        return hkv_seterr(err, HKV_E_NOMEM, "no host memory for a graph");
    }
    if ((e = cudaGraphGetNodes(g, NULL, &x->nodes)) != cudaSuccess ||
        (e = cudaGraphInstantiate(&x->exec, g, 0)) != cudaSuccess) {
        cudaGetLastError();
        cudaGraphDestroy(g);
        free(x);
        return hkv_gpu_fail(err, e, "cudaGraphInstantiate");
    }
    cudaGraphDestroy(g);   /* the executable graph is a copy */
    *out = x;
    return HKV_OK;
}

extern "C" int hkv_gpu_graph_launch(hkv_gpu_graph *g, void *stream, hkv_err *err)
{
    HKV_CUDA_TRY(err, cudaGraphLaunch(g->exec, hkv_stream(stream)));
    return HKV_OK;
}

extern "C" size_t hkv_gpu_graph_nodes(const hkv_gpu_graph *g) { return g ? g->nodes : 0; }

extern "C" void hkv_gpu_graph_free(hkv_gpu_graph *g)
{
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    free(g);
}

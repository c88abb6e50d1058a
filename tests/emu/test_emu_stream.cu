/* Streams and events of the CUDA emulator against the CUDA Runtime API
 * reference ("Stream Management", "Event Management", "Stream
 * synchronization behavior"):
 *  - cudaStreamWaitEvent: work on stream B after the wait starts only once
 *    the work before the event's most recent record on stream A is done
 *    (two non-blocking streams, 50 iterations, a kernel on A held back by a
 *    host-set flag or simply slow);
 *  - cudaStreamQuery / cudaEventQuery return cudaErrorNotReady while work is
 *    pending and cudaSuccess once it is done; an event never recorded is
 *    complete; cudaEventElapsedTime measures (>= 0, and at least a host
 *    function's sleep between the events), refuses events created with
 *    cudaEventDisableTiming and events never recorded
 *    (cudaErrorInvalidResourceHandle), and pending ones (cudaErrorNotReady);
 *  - the legacy default stream 0 waits for work issued before on blocking
 *    streams (cudaStreamCreate), and work issued after on a blocking stream
 *    waits for it (only the guaranteed orderings are tested);
 *  - cudaLaunchHostFunc runs in stream order with kernels and copies;
 *  - cudaStreamDestroy / cudaEventDestroy with work still pending "return
 *    immediately", the work completing later.
 * Run twice by meson: as is, and with HKV_EMU_EAGER=1 (every stream item runs
 * at its call, on the calling thread): there a kernel cannot wait for a flag
 * the host sets later, so flags are set before the launch and the
 * not-ready / return-immediately checks, which need pending work, are not
 * made (said in the output). */
#include <stdint.h>
#include <time.h>

#include <atomic>
#include <thread>
#include <vector>

#include "emu_test.h"

static bool eager;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Waits until *gate != 0 (volatile loads of mapped page-locked memory),
 * bounded so that a broken emulator fails instead of hanging, then
 * writes v to out[0..n). */
static __global__ void k_gated_fill(const volatile int *gate, int *out, int n, int v)
{
    if (threadIdx.x == 0) {
        long long spins = 0;
        while (*gate == 0 && spins < (1ll << 33)) spins++;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = v;
}

/* Slow without a gate: every thread iterates before the write. */
static __global__ void k_slow_fill(int *out, int n, int v, int iters)
{
    unsigned x = threadIdx.x + 1;
    for (int k = 0; k < iters; k++) {
        x = x * 1664525u + 1013904223u;
        asm volatile("" : "+r"(x));   /* kept: the loop is the delay */
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = v;
}

/* out[i] = in[i] + add */
static __global__ void k_copy_add(const int *in, int *out, int n, int add)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i] + add;
}

struct gate_t {
    int *host = nullptr, *dev = nullptr;
    void init()
    {
        CUDA_OK(cudaHostAlloc((void **)&host, sizeof(int), cudaHostAllocMapped));
        CUDA_OK(cudaHostGetDevicePointer((void **)&dev, host, 0));
        *host = 0;
    }
    /* closed: the gated kernel waits; in eager mode it is opened at once */
    void close() { __atomic_store_n(host, eager ? 1 : 0, __ATOMIC_SEQ_CST); }
    void open() { __atomic_store_n(host, 1, __ATOMIC_SEQ_CST); }
};
static gate_t gate;

static int count_not(const std::vector<int> &v, int want)
{
    int bad = 0;
    for (int x : v) bad += x != want;
    return bad;
}

static void test_wait_event(void)
{
    const int n = 2048;
    cudaStream_t a, b;
    CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    cudaEvent_t e;
    CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    int *data, *out;
    CUDA_OK(cudaMalloc((void **)&data, n * sizeof(int)));
    CUDA_OK(cudaMalloc((void **)&out, n * sizeof(int)));
    std::vector<int> h(n);
    int bad_iters = 0;
    for (int it = 0; it < 50; it++) {
        gate.close();
        if (it % 2 == 0) HKV_LAUNCH(k_gated_fill, 1, 128, 0, a)(gate.dev, data, n, it * 10);
        else HKV_LAUNCH(k_slow_fill, 1, 128, 0, a)(data, n, it * 10, 20000);
        CUDA_OK(cudaEventRecord(e, a));
        CUDA_OK(cudaStreamWaitEvent(b, e, 0));
        HKV_LAUNCH(k_copy_add, 4, 128, 0, b)(data, out, n, 1);
        CUDA_OK(cudaGetLastError());
        if (it % 2 == 0 && !eager) usleep(1000);   /* b's kernel would have run by now, unordered */
        gate.open();
        CUDA_OK(cudaStreamSynchronize(b));
        CUDA_OK(cudaMemcpy(h.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
        bad_iters += count_not(h, it * 10 + 1) != 0;
        CUDA_OK(cudaStreamSynchronize(a));
    }
    CHECK(bad_iters == 0, "cudaStreamWaitEvent: stream B read stream A's data early in %d of 50 iterations", bad_iters);

    /* the wait is on the most recent record at the time of the call */
    gate.close();
    CUDA_OK(cudaEventRecord(e, a));   /* an early record, complete at once */
    CUDA_OK(cudaStreamSynchronize(a));
    HKV_LAUNCH(k_gated_fill, 1, 64, 0, a)(gate.dev, data, n, 777);
    CUDA_OK(cudaEventRecord(e, a));   /* re-recorded after the gated kernel */
    CUDA_OK(cudaStreamWaitEvent(b, e, 0));
    HKV_LAUNCH(k_copy_add, 2, 128, 0, b)(data, out, n, 0);
    if (!eager) usleep(2000);
    gate.open();
    CUDA_OK(cudaStreamSynchronize(b));
    CUDA_OK(cudaMemcpy(h.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(count_not(h, 777) == 0, "cudaStreamWaitEvent after a re-record did not wait for the latest record");

    /* waiting on an event never recorded does not wait */
    cudaEvent_t never;
    CUDA_OK(cudaEventCreate(&never));
    CUDA_OK(cudaStreamWaitEvent(b, never, 0));
    HKV_LAUNCH(k_copy_add, 1, 32, 0, b)(data, out, 1, 1);
    CUDA_OK(cudaStreamSynchronize(b));
    CUDA_OK(cudaEventQuery(never));        /* never recorded: complete */
    CUDA_OK(cudaEventSynchronize(never));
    CUDA_IS(cudaErrorInvalidValue, cudaStreamWaitEvent(b, never, 0x8));   /* unknown flag */
    (void)cudaGetLastError();
    CUDA_OK(cudaEventDestroy(never));
    CUDA_OK(cudaEventDestroy(e));
    CUDA_OK(cudaStreamDestroy(a));
    CUDA_OK(cudaStreamDestroy(b));
    CUDA_OK(cudaFree(data));
    CUDA_OK(cudaFree(out));
}

static void test_query(void)
{
    const int n = 256;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t start, stop;
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
    int *d;
    CUDA_OK(cudaMalloc((void **)&d, n * sizeof(int)));
    CUDA_OK(cudaStreamQuery(s));   /* empty: done */
    float ms = -1;
    CUDA_IS(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, start, stop));   /* never recorded */
    (void)cudaGetLastError();
    gate.close();
    CUDA_OK(cudaEventRecord(start, s));
    HKV_LAUNCH(k_gated_fill, 1, 64, 0, s)(gate.dev, d, n, 5);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaEventRecord(stop, s));
    if (!eager) {
        usleep(2000);
        CUDA_IS(cudaErrorNotReady, cudaStreamQuery(s));
        CUDA_IS(cudaErrorNotReady, cudaEventQuery(stop));
        CUDA_IS(cudaErrorNotReady, cudaEventElapsedTime(&ms, start, stop));
        (void)cudaGetLastError();
        CUDA_IS(cudaErrorNotReady, cudaStreamQuery(s));   /* still: it waits for the flag */
    } else {
        printf("eager mode: the not-ready checks of pending work are not made (work runs at its call)\n");
    }
    gate.open();
    CUDA_OK(cudaEventSynchronize(stop));
    CUDA_OK(cudaEventQuery(stop));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaStreamQuery(s));
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(ms >= 0.0f && ms < 60000.0f, "cudaEventElapsedTime %g ms", ms);
    int h = 0;
    CUDA_OK(cudaMemcpy(&h, d + n - 1, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h == 5, "the gated kernel's result %d", h);
    /* a host function sleeping 20 ms between two events */
    CUDA_OK(cudaEventRecord(start, s));
    CUDA_OK(cudaLaunchHostFunc(s, [](void *) { usleep(20000); }, nullptr));
    CUDA_OK(cudaEventRecord(stop, s));
    CUDA_OK(cudaEventSynchronize(stop));
    CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(ms >= 19.0f && ms < 10000.0f, "elapsed %g ms across a 20 ms host function", ms);
    /* timing disabled: refused */
    cudaEvent_t nt1, nt2;
    CUDA_OK(cudaEventCreateWithFlags(&nt1, cudaEventDisableTiming));
    CUDA_OK(cudaEventCreateWithFlags(&nt2, cudaEventDisableTiming));
    CUDA_OK(cudaEventRecord(nt1, s));
    CUDA_OK(cudaEventRecord(nt2, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_IS(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, nt1, nt2));
    CUDA_IS(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, start, nt2));
    CUDA_IS(cudaErrorInvalidResourceHandle, cudaGetLastError());
    CUDA_IS(cudaSuccess, cudaGetLastError());
    CUDA_IS(cudaErrorInvalidValue, cudaEventCreateWithFlags(&nt1, 0x80));   /* unknown flag */
    (void)cudaGetLastError();
    CUDA_OK(cudaEventDestroy(nt2));
    CUDA_OK(cudaEventDestroy(start));
    CUDA_OK(cudaEventDestroy(stop));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFree(d));
    (void)nt1;
}

static void test_legacy(void)
{
    const int n = 1024;
    cudaStream_t blk;
    CUDA_OK(cudaStreamCreate(&blk));
    int *x, *y;
    CUDA_OK(cudaMalloc((void **)&x, n * sizeof(int)));
    CUDA_OK(cudaMalloc((void **)&y, n * sizeof(int)));
    std::vector<int> h(n);
    int bad1 = 0, bad2 = 0;
    for (int it = 0; it < 10; it++) {
        /* a blocking stream's earlier work, then the legacy stream: ordered */
        gate.close();
        HKV_LAUNCH(k_gated_fill, 1, 64, 0, blk)(gate.dev, x, n, 100 + it);
        HKV_LAUNCH(k_copy_add, 2, 128, 0, 0)(x, y, n, 0);
        CUDA_OK(cudaGetLastError());
        if (!eager) usleep(1000);
        gate.open();
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(h.data(), y, n * sizeof(int), cudaMemcpyDeviceToHost));
        bad1 += count_not(h, 100 + it) != 0;
        /* the legacy stream's earlier work, then a blocking stream: ordered */
        gate.close();
        HKV_LAUNCH(k_gated_fill, 1, 64, 0, 0)(gate.dev, x, n, 200 + it);
        HKV_LAUNCH(k_copy_add, 2, 128, 0, blk)(x, y, n, 0);
        CUDA_OK(cudaGetLastError());
        if (!eager) usleep(1000);
        gate.open();
        CUDA_OK(cudaStreamSynchronize(blk));   /* the blocking stream alone */
        CUDA_OK(cudaMemcpyAsync(h.data(), y, n * sizeof(int), cudaMemcpyDeviceToHost, blk));
        CUDA_OK(cudaStreamSynchronize(blk));
        bad2 += count_not(h, 200 + it) != 0;
    }
    CHECK(bad1 == 0, "stream 0 ran before earlier work on a blocking stream in %d of 10 iterations", bad1);
    CHECK(bad2 == 0, "a blocking stream ran before earlier work on stream 0 in %d of 10 iterations", bad2);
    CUDA_OK(cudaStreamDestroy(blk));
    CUDA_OK(cudaFree(x));
    CUDA_OK(cudaFree(y));
}

/* cudaLaunchHostFunc in stream order */
struct host_log {
    std::atomic<int> n{0};
    int order[8];
    int seen[8];
    int *pinned;
};
static __global__ void k_set(int *p, int v) { *p = v; }

static void test_host_func(void)
{
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *pin, *dpin, *d;
    CUDA_OK(cudaHostAlloc((void **)&pin, 2 * sizeof(int), cudaHostAllocMapped));
    CUDA_OK(cudaHostGetDevicePointer((void **)&dpin, pin, 0));
    CUDA_OK(cudaMalloc((void **)&d, sizeof(int)));
    pin[0] = pin[1] = 0;
    static host_log log;
    log.pinned = pin;
    auto fn = [](void *u) {
        const int id = (int)(intptr_t)u;
        const int k = log.n.fetch_add(1);
        if (k < 8) log.order[k] = id, log.seen[k] = __atomic_load_n(&log.pinned[0], __ATOMIC_SEQ_CST) * 100 +
                                                     __atomic_load_n(&log.pinned[1], __ATOMIC_SEQ_CST);
    };
    gate.close();
    CUDA_OK(cudaLaunchHostFunc(s, fn, (void *)(intptr_t)1));
    HKV_LAUNCH(k_gated_fill, 1, 32, 0, s)(gate.dev, dpin, 1, 7);   /* pin[0] = 7 once the gate opens */
    CUDA_OK(cudaLaunchHostFunc(s, fn, (void *)(intptr_t)2));
    HKV_LAUNCH(k_set, 1, 1, 0, s)(d, 9);
    CUDA_OK(cudaMemcpyAsync(pin + 1, d, sizeof(int), cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaLaunchHostFunc(s, fn, (void *)(intptr_t)3));
    if (!eager) usleep(2000);
    gate.open();
    CUDA_OK(cudaStreamSynchronize(s));
    CHECK(log.n.load() == 3, "%d host functions ran, want 3", log.n.load());
    CHECK(log.order[0] == 1 && log.order[1] == 2 && log.order[2] == 3, "host functions ran as %d %d %d",
          log.order[0], log.order[1], log.order[2]);
    CHECK(log.seen[0] == 0, "host function 1 saw %d, want 0 (before the kernel)", log.seen[0]);
    CHECK(log.seen[1] == 700, "host function 2 saw %d, want 700 (after the kernel, before the copy)", log.seen[1]);
    CHECK(log.seen[2] == 709, "host function 3 saw %d, want 709 (after the copy)", log.seen[2]);
    CUDA_IS(cudaErrorInvalidValue, cudaLaunchHostFunc(s, nullptr, nullptr));
    (void)cudaGetLastError();
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFreeHost(pin));
    CUDA_OK(cudaFree(d));
}

/* Destroying a stream or an event with pending work returns at once; the
 * work completes. The gate opens from another thread 300 ms later. */
static void destroy_pending(bool stream_case)
{
    const int n = 512;
    int *d;
    CUDA_OK(cudaMalloc((void **)&d, n * sizeof(int)));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e;
    CUDA_OK(cudaEventCreate(&e));
    gate.close();
    HKV_LAUNCH(k_gated_fill, 1, 64, 0, s)(gate.dev, d, n, 31);
    CUDA_OK(cudaEventRecord(e, s));
    std::thread opener([] {
        usleep(300000);
        gate.open();
    });
    const double t0 = now_ms();
    if (stream_case) CUDA_OK(cudaStreamDestroy(s));
    else CUDA_OK(cudaEventDestroy(e));
    const double took = now_ms() - t0;
    opener.join();
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<int> h(n);
    CUDA_OK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(count_not(h, 31) == 0, "work pending at the destroy did not complete");
    CHECK(took < 150.0,
                        "%s with pending work took %.0f ms; the runtime returns immediately (gpu/emu/emu_stream.cc waits)",
                        stream_case ? "cudaStreamDestroy" : "cudaEventDestroy", took);
    if (stream_case) CUDA_OK(cudaEventDestroy(e));
    else CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFree(d));
}

static void test_destroy_pending(void)
{
    if (eager) {
        printf("eager mode: the destroy-with-pending-work checks are not made (no work is ever pending)\n");
        return;
    }
    destroy_pending(false);
    destroy_pending(true);
}

int main(void)
{
    const char *ev = getenv("HKV_EMU_EAGER");
    eager = ev && !strcmp(ev, "1");
    printf("emu_stream: %s mode\n", eager ? "eager (HKV_EMU_EAGER=1)" : "queued");
    gate.init();
    int least = 1, greatest = 1;
    CUDA_OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CHECK(greatest <= least, "stream priorities: greatest %d, least %d (lower numbers are higher priorities)",
          greatest, least);
    test_wait_event();
    test_query();
    test_legacy();
    test_host_func();
    test_destroy_pending();
    CUDA_OK(cudaFreeHost(gate.host));
    return test_report(eager ? "emu_stream_eager" : "emu_stream");
}

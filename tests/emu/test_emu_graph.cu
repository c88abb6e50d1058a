/* Stream capture and graphs of the CUDA emulator against the CUDA Runtime API
 * reference ("Graph Management", "Stream Management": cudaStreamBeginCapture,
 * cudaStreamEndCapture, cudaStreamIsCapturing, cudaGraphInstantiate,
 * cudaGraphLaunch, cudaGraphExecUpdate; the CUDA C++ Programming Guide's
 * "CUDA Graphs", "Prohibited and Unhandled Operations"):
 *  - work issued to a capturing stream does not run; the graph has one node
 *    per operation, and each launch of its executable form runs them all, in
 *    order, on the launching stream: kernels with the arguments they were
 *    captured with, copies from page-locked memory reading it when the graph
 *    runs (so a step's inputs are written there before each launch), memsets,
 *    host functions, cuBLAS GEMMs;
 *  - cudaStreamIsCapturing says none / active / invalidated;
 *  - the legacy stream cannot be captured; a second begin on a capturing
 *    stream and an end without a begin are cudaErrorIllegalState;
 *  - what cannot be captured returns cudaErrorStreamCaptureUnsupported and
 *    invalidates the capture, whose end then returns
 *    cudaErrorStreamCaptureInvalidated and no graph: synchronising the
 *    stream, a pageable copy, cudaMallocAsync, cudaEventRecord on the
 *    capturing stream, and, in the global mode, cudaDeviceSynchronize,
 *    cudaMalloc and work on the legacy stream (cudaMemcpy, cudaMemset) from
 *    anywhere (in the relaxed mode cudaMalloc is allowed);
 *  - cudaGraphExecUpdate takes a graph of the same shape (new arguments) and
 *    refuses another (cudaErrorGraphExecUpdateFailure, topology changed);
 *  - an executable graph destroyed while its launch is queued still runs;
 *  - cudaEventRecordWithFlags(cudaEventRecordExternal) on a capturing stream
 *    is an event record node: each launch records the event at that point
 *    of the graph, so the host waits for part of a graph after launching it
 *    (cudaEventSynchronize, cudaEventQuery, cudaEventElapsedTime between two
 *    such nodes); outside a capture it is cudaEventRecord; flags other than
 *    cudaEventRecordExternal are cudaErrorInvalidValue; an update that moves
 *    an event node is a topology change; while the capture is open, the
 *    event recorded in it cannot be queried, waited for or timed
 *    (cudaErrorCapturedEvent). */
#include <stdint.h>

#include <atomic>
#include <vector>

#include "cublas_v2.h"
#include "emu_test.h"

/* y[i] = a * x[i] + *b (b read from device memory when the kernel runs) */
static __global__ void k_axpb(const float *x, float *y, int n, float a, const float *b)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] = a * x[i] + *b;
}

static void count_up(void *p) { ++*(int *)p; }

static int count_not(const std::vector<float> &v, float want)
{
    int bad = 0;
    for (float x : v) bad += x != want;
    return bad;
}

static cudaStream_t new_stream(void)
{
    cudaStream_t s = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}

static size_t nodes_of(cudaGraph_t g)
{
    size_t n = 0;
    CUDA_OK(cudaGraphGetNodes(g, nullptr, &n));
    return n;
}

/* One step's worth: its input (a scalar) copied up from page-locked memory,
 * two kernels, a memset and a host function, replayed with new inputs. */
static void test_capture_replay(void)
{
    const int n = 1000;
    cudaStream_t s = new_stream();
    float *x, *y, *z, *b, *hb;
    CUDA_OK(cudaMalloc((void **)&x, n * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&y, n * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&z, n * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&b, sizeof(float)));
    CUDA_OK(cudaHostAlloc((void **)&hb, sizeof(float), cudaHostAllocDefault));
    std::vector<float> h(n, 1.0f);
    CUDA_OK(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(y, 0, n * sizeof(float)));
    CUDA_OK(cudaMemset(z, 0, n * sizeof(float)));
    int host_calls = 0;

    cudaStreamCaptureStatus st;
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    CHECK(st == cudaStreamCaptureStatusNone, "a fresh stream is not capturing (%d)", (int)st);
    *hb = 5.0f;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    CHECK(st == cudaStreamCaptureStatusActive, "capturing after the begin (%d)", (int)st);
    CUDA_OK(cudaMemcpyAsync(b, hb, sizeof(float), cudaMemcpyHostToDevice, s));
    HKV_LAUNCH(k_axpb, 4, 128, 0, s)(x, y, n, 2.0f, b);   /* y = 2 + b */
    HKV_LAUNCH(k_axpb, 4, 128, 0, s)(y, z, n, 3.0f, b);   /* z = 3 y + b */
    CUDA_OK(cudaMemsetAsync(y, 0, n * sizeof(float), s));
    CUDA_OK(cudaLaunchHostFunc(s, count_up, &host_calls));
    CUDA_OK(cudaGetLastError());
    cudaGraph_t g = nullptr;
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CHECK(g != nullptr, "a graph from the capture");
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    CHECK(st == cudaStreamCaptureStatusNone, "not capturing after the end (%d)", (int)st);
    CHECK(g && nodes_of(g) == 5, "5 nodes captured, got %zu", g ? nodes_of(g) : 0);
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(h.data(), z, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_not(h, 0.0f) == 0 && host_calls == 0, "captured work ran during the capture "
          "(%d values written, %d host calls)", count_not(h, 0.0f), host_calls);

    cudaGraphExec_t ex = nullptr;
    CUDA_OK(cudaGraphInstantiate(&ex, g, 0));
    int bad = 0;
    for (int it = 0; it < 4; it++) {   /* each launch reads the page-locked input anew */
        *hb = (float)(10 * it);
        CUDA_OK(cudaGraphLaunch(ex, s));
        CUDA_OK(cudaStreamSynchronize(s));
        const float yb = 2.0f + *hb, want = 3.0f * yb + *hb;
        CUDA_OK(cudaMemcpy(h.data(), z, n * sizeof(float), cudaMemcpyDeviceToHost));
        bad += count_not(h, want) != 0;
        CUDA_OK(cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
        bad += count_not(h, 0.0f) != 0;   /* the memset ran after the kernels */
    }
    CHECK(bad == 0, "replays: %d of 8 results wrong", bad);
    CHECK(host_calls == 4, "the host function ran once a launch: %d of 4", host_calls);

    /* a second stream replays the same executable graph */
    cudaStream_t s2 = new_stream();
    *hb = 1.0f;
    CUDA_OK(cudaGraphLaunch(ex, s2));
    CUDA_OK(cudaStreamSynchronize(s2));
    CUDA_OK(cudaMemcpy(h.data(), z, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_not(h, 3.0f * 3.0f + 1.0f) == 0, "a launch on another stream");

    /* the same shape with other arguments: the executable graph takes them */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_OK(cudaMemcpyAsync(b, hb, sizeof(float), cudaMemcpyHostToDevice, s));
    HKV_LAUNCH(k_axpb, 4, 128, 0, s)(x, y, n, 4.0f, b);
    HKV_LAUNCH(k_axpb, 4, 128, 0, s)(y, z, n, 1.0f, b);
    CUDA_OK(cudaMemsetAsync(y, 0, n * sizeof(float), s));
    CUDA_OK(cudaLaunchHostFunc(s, count_up, &host_calls));
    cudaGraph_t g2 = nullptr;
    CUDA_OK(cudaStreamEndCapture(s, &g2));
    cudaGraphExecUpdateResultInfo info;
    CUDA_OK(cudaGraphExecUpdate(ex, g2, &info));
    CHECK(info.result == cudaGraphExecUpdateSuccess, "the update's result: %d", (int)info.result);
    *hb = 2.0f;
    CUDA_OK(cudaGraphLaunch(ex, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(h.data(), z, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_not(h, (4.0f + 2.0f) + 2.0f) == 0, "the updated graph runs its new arguments");

    /* another shape is refused, and the executable graph is left as it was */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    HKV_LAUNCH(k_axpb, 4, 128, 0, s)(x, z, n, 7.0f, b);
    cudaGraph_t g3 = nullptr;
    CUDA_OK(cudaStreamEndCapture(s, &g3));
    CUDA_IS(cudaErrorGraphExecUpdateFailure, cudaGraphExecUpdate(ex, g3, &info));
    CHECK(info.result == cudaGraphExecUpdateErrorTopologyChanged, "refused as a topology change: %d",
          (int)info.result);
    (void)cudaGetLastError();
    CUDA_OK(cudaGraphLaunch(ex, s));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(h.data(), z, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_not(h, 6.0f + 2.0f) == 0, "a refused update left the graph as it was");

    /* destroyed while its launch is queued: the launch still runs */
    HKV_LAUNCH(k_axpb, 1, 32, 0, s)(x, z, n, 0.0f, b);
    *hb = 3.0f;
    CUDA_OK(cudaGraphLaunch(ex, s));
    CUDA_OK(cudaGraphExecDestroy(ex));
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaGraphDestroy(g2));
    CUDA_OK(cudaGraphDestroy(g3));
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(h.data(), z, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_not(h, 4.0f + 3.0f + 3.0f) == 0, "a launch queued before the destroy ran");
    CUDA_IS(cudaErrorInvalidResourceHandle, cudaGraphLaunch(ex, s));
    (void)cudaGetLastError();

    CUDA_OK(cudaStreamDestroy(s2));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFree(x));
    CUDA_OK(cudaFree(y));
    CUDA_OK(cudaFree(z));
    CUDA_OK(cudaFree(b));
    CUDA_OK(cudaFreeHost(hb));
}

/* A cuBLAS GEMM on the capturing stream is a node like a kernel. */
static void test_cublas(void)
{
    const int m = 8, n = 4, k = 16;
    cudaStream_t s = new_stream();
    cublasHandle_t hd;
    CHECK(cublasCreate(&hd) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
    CHECK(cublasSetStream(hd, s) == CUBLAS_STATUS_SUCCESS, "cublasSetStream");
    float *a, *bm, *c;
    CUDA_OK(cudaMalloc((void **)&a, m * k * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&bm, k * n * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&c, m * n * sizeof(float)));
    std::vector<float> ha(m * k, 0.5f), hbm(k * n, 2.0f), hc(m * n);
    CUDA_OK(cudaMemcpy(a, ha.data(), ha.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(bm, hbm.data(), hbm.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(c, 0, m * n * sizeof(float)));
    const float one = 1.0f, zero = 0.0f;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cublasGemmEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a, CUDA_R_32F, m, bm, CUDA_R_32F,
                       k, &zero, c, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
              CUBLAS_STATUS_SUCCESS, "cublasGemmEx while capturing");
    cudaGraph_t g = nullptr;
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CHECK(g && nodes_of(g) == 1, "one node for the GEMM");
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(hc.data(), c, hc.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_not(hc, 0.0f) == 0, "the captured GEMM did not run at the capture");
    cudaGraphExec_t ex = nullptr;
    CUDA_OK(cudaGraphInstantiate(&ex, g, 0));
    for (int r = 0; r < 2; r++) {
        CUDA_OK(cudaGraphLaunch(ex, s));
        CUDA_OK(cudaStreamSynchronize(s));
    }
    CUDA_OK(cudaMemcpy(hc.data(), c, hc.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(count_not(hc, 0.5f * 2.0f * k) == 0, "the replayed GEMM: %g, want %g", hc[0], 0.5f * 2.0f * k);
    CUDA_OK(cudaGraphExecDestroy(ex));
    CUDA_OK(cudaGraphDestroy(g));
    cublasDestroy(hd);
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaFree(bm));
    CUDA_OK(cudaFree(c));
}

/* Begins a global capture on s with one kernel in it. */
static void begin_with_work(cudaStream_t s, float *d)
{
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    HKV_LAUNCH(k_axpb, 1, 32, 0, s)(d, d, 8, 1.0f, d);
}

/* The capture was invalidated: the end says so and gives no graph. */
static void end_invalidated(cudaStream_t s, const char *what)
{
    cudaStreamCaptureStatus st;
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    CHECK(st == cudaStreamCaptureStatusInvalidated, "%s: the capture is invalidated (%d)", what, (int)st);
    cudaGraph_t g = (cudaGraph_t)1;
    CUDA_IS(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &g));
    CHECK(g == nullptr, "%s: no graph from an invalidated capture", what);
    (void)cudaGetLastError();
    CUDA_OK(cudaStreamIsCapturing(s, &st));
    CHECK(st == cudaStreamCaptureStatusNone, "%s: the stream is free again", what);
}

static void test_refusals(void)
{
    cudaStream_t s = new_stream(), other = new_stream();
    float *d, *hp;
    CUDA_OK(cudaMalloc((void **)&d, 64 * sizeof(float)));
    CUDA_OK(cudaMemset(d, 0, 64 * sizeof(float)));
    std::vector<float> pageable(64, 1.0f);
    cudaEvent_t e;
    CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

    CUDA_IS(cudaErrorStreamCaptureUnsupported, cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal));
    cudaGraph_t g = nullptr;
    CUDA_IS(cudaErrorIllegalState, cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_IS(cudaErrorIllegalState, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CHECK(g && nodes_of(g) == 0, "an empty capture is an empty graph");
    CUDA_OK(cudaGraphDestroy(g));
    (void)cudaGetLastError();

    begin_with_work(s, d);
    CUDA_IS(cudaErrorStreamCaptureUnsupported, cudaStreamSynchronize(s));
    end_invalidated(s, "cudaStreamSynchronize");

    begin_with_work(s, d);
    CUDA_IS(cudaErrorStreamCaptureUnsupported,
            cudaMemcpyAsync(d, pageable.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, s));
    end_invalidated(s, "a pageable copy");

    begin_with_work(s, d);
    void *p = nullptr;
    CUDA_IS(cudaErrorStreamCaptureUnsupported, cudaMallocAsync(&p, 256, s));
    end_invalidated(s, "cudaMallocAsync");

    begin_with_work(s, d);
    CUDA_IS(cudaErrorStreamCaptureUnsupported, cudaEventRecord(e, s));
    end_invalidated(s, "cudaEventRecord");

    begin_with_work(s, d);
    CUDA_IS(cudaErrorStreamCaptureUnsupported, cudaDeviceSynchronize());
    end_invalidated(s, "cudaDeviceSynchronize in the global mode");

    begin_with_work(s, d);
    CUDA_IS(cudaErrorStreamCaptureUnsupported, cudaMalloc((void **)&hp, 256));
    end_invalidated(s, "cudaMalloc in the global mode");

    begin_with_work(s, d);
    CUDA_IS(cudaErrorStreamCaptureUnsupported,
            cudaMemcpy(pageable.data(), d, 64 * sizeof(float), cudaMemcpyDeviceToHost));
    end_invalidated(s, "cudaMemcpy (the legacy stream) in the global mode");

    begin_with_work(s, d);
    CUDA_IS(cudaErrorStreamCaptureUnsupported, cudaMemset(d, 0, 64 * sizeof(float)));
    end_invalidated(s, "cudaMemset (the legacy stream) in the global mode");

    /* relaxed: cudaMalloc is allowed, and other streams run as usual */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    float *q = nullptr;
    CUDA_OK(cudaMalloc((void **)&q, 64 * sizeof(float)));
    CUDA_OK(cudaMemsetAsync(q, 0, 64 * sizeof(float), other));
    CUDA_OK(cudaStreamSynchronize(other));
    HKV_LAUNCH(k_axpb, 1, 32, 0, s)(d, q, 8, 1.0f, d);
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CHECK(g && nodes_of(g) == 1, "relaxed capture: one node");
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaFree(q));

    /* a stream destroyed while capturing ends its capture: syncs work again */
    cudaStream_t t = new_stream();
    begin_with_work(t, d);
    CUDA_OK(cudaStreamDestroy(t));
    CUDA_OK(cudaDeviceSynchronize());

    CUDA_OK(cudaEventDestroy(e));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaStreamDestroy(other));
    CUDA_OK(cudaFree(d));
}

/* (atomic: the host reads the count while a stream thread may write it) */
static void sleep_then_count(void *p)
{
    usleep(50 * 1000);
    ++*(std::atomic<int> *)p;
}

/* A graph with two external event nodes around a slow host function: the
 * host waits for the first, then the second, of each launch. */
static void test_event_nodes(void)
{
    const int n = 256;
    const bool eager = getenv("HKV_EMU_EAGER") && atoi(getenv("HKV_EMU_EAGER"));
    cudaStream_t s = new_stream();
    cudaEvent_t a = nullptr, b = nullptr;
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    float *x, *y, *d1;
    CUDA_OK(cudaMalloc((void **)&x, n * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&y, n * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d1, sizeof(float)));
    std::vector<float> h(n, 1.0f);
    const float one = 1.0f;
    CUDA_OK(cudaMemcpy(x, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d1, &one, sizeof(float), cudaMemcpyHostToDevice));
    std::atomic<int> slow{0};

    CHECK(cudaEventRecordWithFlags(a, s, 0x4u) == cudaErrorInvalidValue, "unknown record flags refused");
    cudaGetLastError();
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    HKV_LAUNCH(k_axpb, 2, 128, 0, s)(x, y, n, 2.0f, d1);   /* y = 3 */
    CUDA_OK(cudaEventRecordWithFlags(a, s, cudaEventRecordExternal));
    CUDA_OK(cudaLaunchHostFunc(s, sleep_then_count, &slow));
    CUDA_OK(cudaEventRecordWithFlags(b, s, cudaEventRecordExternal));
    cudaGraph_t g = nullptr;
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CHECK(g && nodes_of(g) == 4, "kernel, two event nodes and the host function: %zu nodes",
          g ? nodes_of(g) : 0);
    CHECK(cudaEventQuery(a) == cudaSuccess, "a captured record is not a record: the event "
          "is as it was (never recorded)");
    /* while the capture is open, an event last recorded in it cannot be
     * queried or waited for (cudaErrorCapturedEvent) */
    {
        cudaStream_t s3 = new_stream();
        CUDA_OK(cudaStreamBeginCapture(s3, cudaStreamCaptureModeThreadLocal));
        CUDA_OK(cudaEventRecordWithFlags(b, s3, cudaEventRecordExternal));
        CHECK(cudaEventQuery(b) == cudaErrorCapturedEvent, "query of an event in an open capture");
        CHECK(cudaEventSynchronize(b) == cudaErrorCapturedEvent, "sync of an event in an open capture");
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, b, b) == cudaErrorCapturedEvent, "elapsed time to it");
        cudaGetLastError();
        cudaGraph_t g3 = nullptr;
        CUDA_OK(cudaStreamEndCapture(s3, &g3));
        CHECK(cudaEventQuery(b) == cudaSuccess, "the capture ended: the event is as it was");
        CUDA_OK(cudaGraphDestroy(g3));
        CUDA_OK(cudaStreamDestroy(s3));
    }
    cudaGraphExec_t ex = nullptr;
    CUDA_OK(cudaGraphInstantiate(&ex, g, 0));
    int bad = 0;
    for (int it = 1; it <= 3; it++) {
        CUDA_OK(cudaGraphLaunch(ex, s));
        CUDA_OK(cudaEventSynchronize(a));
        CUDA_OK(cudaMemcpy(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
        bad += count_not(h, 3.0f) != 0;   /* the kernel before the first node ran */
        if (!eager) bad += slow != it - 1 || cudaEventQuery(b) != cudaErrorNotReady;
        CUDA_OK(cudaEventSynchronize(b));
        bad += slow != it;   /* the second node waited for this launch's host function */
        float ms = -1;
        CUDA_OK(cudaEventElapsedTime(&ms, a, b));
        bad += !(ms >= 45.0f);
    }
    CHECK(bad == 0, "waits on the event nodes of 3 launches: %d wrong", bad);

    /* an update may change what runs, not where the event nodes are */
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(cudaEventRecordWithFlags(a, s, cudaEventRecordExternal));
    HKV_LAUNCH(k_axpb, 2, 128, 0, s)(x, y, n, 2.0f, d1);
    CUDA_OK(cudaLaunchHostFunc(s, sleep_then_count, &slow));
    CUDA_OK(cudaEventRecordWithFlags(b, s, cudaEventRecordExternal));
    cudaGraph_t g2 = nullptr;
    CUDA_OK(cudaStreamEndCapture(s, &g2));
    cudaGraphExecUpdateResultInfo info;
    CHECK(cudaGraphExecUpdate(ex, g2, &info) == cudaErrorGraphExecUpdateFailure &&
          info.result == cudaGraphExecUpdateErrorTopologyChanged, "an event node moved: refused");
    cudaGetLastError();

    /* outside a capture the flag is a plain record */
    CUDA_OK(cudaEventRecordWithFlags(a, s, cudaEventRecordExternal));
    CUDA_OK(cudaEventSynchronize(a));
    CUDA_OK(cudaGraphDestroy(g));
    CUDA_OK(cudaGraphDestroy(g2));
    CUDA_OK(cudaGraphExecDestroy(ex));
    CUDA_OK(cudaEventDestroy(a));
    CUDA_OK(cudaEventDestroy(b));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(cudaFree(x));
    CUDA_OK(cudaFree(y));
    CUDA_OK(cudaFree(d1));
}

int main(void)
{
    test_capture_replay();
    test_cublas();
    test_refusals();
    test_event_nodes();
    return test_report("test_emu_graph");
}

/* The GPU side's context: one device, its main stream, the cuBLAS handle and
 * every device allocation, accounted per tier against caps (--gpu-mem), the
 * way base/host_mem.h accounts host memory. Usable from C11.
 *
 * Streams cross the C API as void* (a cudaStream_t); NULL is the legacy
 * default stream. Device pointers are plain pointers the host must not
 * dereference. Built without CUDA, every call fails with HKV_E_UNSUPPORTED
 * ("built without CUDA"); hkv_gpu_query (device.h) says why there is no GPU. */
#ifndef HKV_GPU_CTX_H
#define HKV_GPU_CTX_H

#include <stddef.h>
#include <stdint.h>

#include "host_mem.h"   /* enum hkv_tier: the GPU uses the same tiers */
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hkv_gpu_ctx hkv_gpu_ctx;

/* Select `device`, create its stream and cuBLAS handle. tier_cap (may be
 * NULL) holds HKV_TIER_COUNT byte caps, 0 meaning no per-tier cap;
 * total_cap caps the sum (0: the device's free memory at creation). Fails
 * with HKV_E_DEVICE naming the CUDA error when there is no usable device. */
int hkv_gpu_ctx_create(hkv_gpu_ctx **out, int device, const size_t *tier_cap, size_t total_cap,
                       hkv_err *err);
void hkv_gpu_ctx_destroy(hkv_gpu_ctx *ctx);

/* The context's main stream (a cudaStream_t). */
void *hkv_gpu_ctx_stream(hkv_gpu_ctx *ctx);
/* Another stream of the context, with its own cuBLAS handle bound to it and
 * its own workspace: GEMMs (hkv_gpu_qmat_matmul) run only on
 * the context's streams. At most HKV_GPU_MAX_STREAMS in all; destroyed with
 * the context. Create them before the steps: it allocates. Only tests call
 * it (the pipeline runs every GEMM on the main stream); it stays as a few
 * lines over what creates the main stream (gpu_ctx.cu's add_stream), the
 * way to a second compute stream. */
#define HKV_GPU_MAX_STREAMS 8
int hkv_gpu_ctx_add_stream(hkv_gpu_ctx *ctx, void **stream, hkv_err *err);
/* The device's streaming multiprocessors (grids are sized by it). */
int hkv_gpu_ctx_sm_count(const hkv_gpu_ctx *ctx);
/* Its compute capability as 10 x major + minor (80 A100, 86/89 GeForce
 * Ampere/Ada, 90 H100). */
int hkv_gpu_ctx_cc(const hkv_gpu_ctx *ctx);
/* 1 where the weight GEMMs' tensor-core split (3x the fp16 tensor work) beats
 * the fp32 CUDA-core GEMM by the data sheets: the data-centre parts (A100:
 * 312 vs 19.5 TFLOPS, H100: 989 vs 67), not the GeForce ones, whose fp16
 * tensor rate with fp32 accumulation is only ~2x their fp32 rate (RTX 4090:
 * 165 vs 82.6). A PREDICTION: no GPU measured it. */
int hkv_gpu_tensor_split_pays(int cc);

/* Device memory in `tier`. Fails with HKV_E_CAPACITY and "GPU tier X: asked
 * N, cap C, in use U" when a cap would be exceeded, HKV_E_NOMEM with the CUDA
 * error when the device refuses. bytes == 0 is an error (HKV_E_INVAL). */
void *hkv_gpu_alloc(hkv_gpu_ctx *ctx, int tier, size_t bytes, hkv_err *err);
/* bytes must be what was asked; p may be NULL. cudaFree: it waits for the
 * whole device, so never inside a step. */
void hkv_gpu_free(hkv_gpu_ctx *ctx, int tier, void *p, size_t bytes);
/* Stream-ordered (cudaMallocAsync / cudaFreeAsync from the device's default
 * pool): usable by work enqueued on `stream` after the call, released when
 * the stream reaches the free; neither waits for the device. What a step
 * that must grow a buffer uses. Same caps and accounting (a pending free no
 * longer counts). */
void *hkv_gpu_alloc_async(hkv_gpu_ctx *ctx, int tier, size_t bytes, void *stream, hkv_err *err);
void hkv_gpu_free_async(hkv_gpu_ctx *ctx, int tier, void *p, size_t bytes, void *stream);
/* Bytes in use in a tier (tier < 0: all tiers), and the peak. */
size_t hkv_gpu_in_use(const hkv_gpu_ctx *ctx, int tier);
size_t hkv_gpu_peak(const hkv_gpu_ctx *ctx, int tier);

/* Copies and fills on a stream (asynchronous with respect to the host only
 * for pinned host memory); hkv_gpu_sync waits for the stream and reports any
 * error a kernel on it raised. */
int hkv_gpu_upload(void *dst, const void *src, size_t bytes, void *stream, hkv_err *err);
int hkv_gpu_download(void *dst, const void *src, size_t bytes, void *stream, hkv_err *err);
int hkv_gpu_memset(void *dst, int byte, size_t bytes, void *stream, hkv_err *err);
/* Device to device: height rows of width bytes, row i from src + i*spitch
 * to dst + i*dpitch. */
int hkv_gpu_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                    size_t height, void *stream, hkv_err *err);
/* Host to device: height rows of width bytes, row i from host src + i*spitch
 * to dst + i*dpitch. */
int hkv_gpu_upload_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t height, void *stream, hkv_err *err);
/* Device to device, bytes from src to dst (no overlap). */
int hkv_gpu_copy(void *dst, const void *src, size_t bytes, void *stream, hkv_err *err);
int hkv_gpu_sync(void *stream, hkv_err *err);

/* Streams and events, for pipelines that overlap the device with host work
 * (pipeline/): a stream that does not synchronise with the legacy default
 * stream; an event marks a point in a stream's work; event_sync blocks the
 * calling thread (without spinning) until that point is reached;
 * stream_wait makes a stream wait for an event recorded in another;
 * elapsed gives milliseconds between two completed events (timing enabled). */
int hkv_gpu_stream_create(void **stream, hkv_err *err);
void hkv_gpu_stream_destroy(void *stream);
int hkv_gpu_event_create(void **event, hkv_err *err);
void hkv_gpu_event_destroy(void *event);
int hkv_gpu_event_record(void *event, void *stream, hkv_err *err);
int hkv_gpu_event_sync(void *event, hkv_err *err);
/* Wait for an event, polling it for up to spin_us microseconds before
 * sleeping in event_sync: a sleeping thread is woken by the driver's
 * interrupt, which on a virtual machine can take longer than the work
 * waited for. *slept (may be NULL): 1 when the poll ran out. */
int hkv_gpu_event_wait(void *event, double spin_us, int *slept, hkv_err *err);
int hkv_gpu_stream_wait(void *stream, void *event, hkv_err *err);
int hkv_gpu_event_elapsed(void *start, void *end, float *ms, hkv_err *err);
/* 1 when the work before the event's last record has completed (without waiting). */
int hkv_gpu_event_done(void *event);
/* Graphs (gpu_graph.cu): a stream's work recorded once and replayed whole,
 * so that the host queues one launch instead of hundreds. Between
 * capture_begin and capture_end nothing issued to the stream runs; the
 * events recorded on it meanwhile (hkv_gpu_event_record) become nodes that
 * each launch records, so the host waits for part of a launched graph as it
 * would for the same work queued op by op. A copy from page-locked memory
 * reads it when the graph runs, not when it was captured. capture_end turns
 * the capture into an executable graph (*g, NULL on error: a refused or
 * failed operation during the capture names itself in err);
 * capture_abort ends a capture and drops what it recorded. */
typedef struct hkv_gpu_graph hkv_gpu_graph;
int hkv_gpu_capture_begin(void *stream, hkv_err *err);
int hkv_gpu_capture_end(void *stream, hkv_gpu_graph **g, hkv_err *err);
void hkv_gpu_capture_abort(void *stream);
/* 0: `stream` is not capturing; 1: it is; 2: its capture was invalidated
 * (an operation the driver refused), to be ended. */
int hkv_gpu_capturing(void *stream);
int hkv_gpu_graph_launch(hkv_gpu_graph *g, void *stream, hkv_err *err);
/* Operations the graph holds (its nodes). */
size_t hkv_gpu_graph_nodes(const hkv_gpu_graph *g);
void hkv_gpu_graph_free(hkv_gpu_graph *g);

/* Keep `stream` busy for `us` microseconds (one thread reading the device's
 * clock). A benchmark queues the kernels it times behind it, so that their
 * launches' host cost stays out of the device time its events measure. */
int hkv_gpu_spin(double us, void *stream, hkv_err *err);

#ifdef __cplusplus
}
#endif

#endif

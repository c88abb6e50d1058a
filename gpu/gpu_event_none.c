/* Built without CUDA: gpu_ctx.h's streams and events say so. */
#include "gpu_ctx.h"

#define NO_CUDA(err, what) hkv_seterr((err), HKV_E_UNSUPPORTED, "%s: this binary was built without CUDA", (what))

int hkv_gpu_stream_create(void **stream, hkv_err *err)
{
    *stream = NULL;
    return NO_CUDA(err, "GPU stream");
}
void hkv_gpu_stream_destroy(void *stream) { (void)stream; }
int hkv_gpu_event_create(void **event, hkv_err *err)
{
    *event = NULL;
    return NO_CUDA(err, "GPU event");
}
void hkv_gpu_event_destroy(void *event) { (void)event; }
int hkv_gpu_event_record(void *event, void *stream, hkv_err *err)
{
    (void)event, (void)stream;
    return NO_CUDA(err, "GPU event");
}
int hkv_gpu_event_sync(void *event, hkv_err *err)
{
    (void)event;
    return NO_CUDA(err, "GPU event");
}
int hkv_gpu_event_wait(void *event, double spin_us, int *slept, hkv_err *err)
{
    (void)event, (void)spin_us;
    if (slept) *slept = 0;
    return NO_CUDA(err, "GPU event");
}
int hkv_gpu_stream_wait(void *stream, void *event, hkv_err *err)
{
    (void)stream, (void)event;
    return NO_CUDA(err, "GPU stream");
}
int hkv_gpu_event_elapsed(void *start, void *end, float *ms, hkv_err *err)
{
    (void)start, (void)end;
    *ms = 0;
    return NO_CUDA(err, "GPU event");
}
int hkv_gpu_event_done(void *event)
{
    (void)event;
    return 1;
}
int hkv_gpu_spin(double us, void *stream, hkv_err *err)
{
    (void)us, (void)stream;
    return NO_CUDA(err, "GPU spin");
}
int hkv_gpu_capture_begin(void *stream, hkv_err *err)
{
    (void)stream;
    return NO_CUDA(err, "GPU graph");
}
int hkv_gpu_capture_end(void *stream, hkv_gpu_graph **g, hkv_err *err)
{
    (void)stream;
    *g = NULL;
    return NO_CUDA(err, "GPU graph");
}
void hkv_gpu_capture_abort(void *stream) { (void)stream; }
int hkv_gpu_capturing(void *stream)
{
    (void)stream;
    return 0;
}
int hkv_gpu_graph_launch(hkv_gpu_graph *g, void *stream, hkv_err *err)
{
    (void)g, (void)stream;
    return NO_CUDA(err, "GPU graph");
}
size_t hkv_gpu_graph_nodes(const hkv_gpu_graph *g)
{
    (void)g;
    return 0;
}
void hkv_gpu_graph_free(hkv_gpu_graph *g) { (void)g; }

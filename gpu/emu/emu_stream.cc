/* Streams as in-order host queues, each drained by its own host thread, so
 * work on two streams really runs at the same time and a missing
 * synchronisation shows as a wrong result or a ThreadSanitizer report.
 * Events are counters under a lock: a record is a queue item that completes
 * the event's latest generation; a wait is an item that blocks until the
 * generation recorded at the time of the wait call completes. The legacy
 * default stream (0) is ordered against every blocking stream in both
 * directions, as the CUDA runtime defines it; non-blocking streams are not.
 * HKV_EMU_EAGER=1 runs each item on the calling thread at enqueue time, all
 * streams in program order: a bug that disappears there is an ordering bug. */
#include <time.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "emu_internal.h"

struct hkv_emu_event;

/* A captured operation: work to run, or (ev set) an external event record
 * node, whose generation each launch of the graph takes anew. */
struct hkv_emu_node {
    std::function<void()> f;
    hkv_emu_event *ev = nullptr;
};

struct hkv_emu_stream {
    unsigned flags = 0;
    int priority = 0;
    bool legacy = false;
    /* stream capture: the items issued while it is open, kept not run */
    cudaStreamCaptureStatus cap_state = cudaStreamCaptureStatusNone;
    cudaStreamCaptureMode cap_mode = cudaStreamCaptureModeGlobal;
    std::vector<hkv_emu_node> cap;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> q;
    uint64_t enq = 0, done = 0;
    bool stop = false;
    std::thread th;
};

/* A captured graph and its executable form: the items in capture order.
 * An executable graph shares its list with the launches still queued. */
struct hkv_emu_graph {
    std::vector<hkv_emu_node> items;
};
struct hkv_emu_graph_exec {
    std::shared_ptr<const std::vector<hkv_emu_node>> items;
};

struct hkv_emu_event {
    unsigned flags = 0;
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0, completed = 0;
    double t = 0;        /* seconds, at the latest completion */
    int pending = 0;     /* queued records and waits that point here */
    bool destroyed = false;
    /* the stream whose capture holds the latest record (an external node),
     * while that capture is open: the event cannot be queried or waited for
     * (cudaErrorCapturedEvent); a record outside a capture clears it */
    hkv_emu_stream *cap_by = nullptr;
};

namespace hkv_emu {

namespace {

struct registry {
    std::mutex mu;
    std::set<hkv_emu_stream *> streams;
    std::set<hkv_emu_event *> events;
    std::set<hkv_emu_graph *> graphs;
    std::set<hkv_emu_graph_exec *> execs;
    int global_captures = 0;   /* open captures in cudaStreamCaptureModeGlobal */
    hkv_emu_stream *legacy = nullptr;
    /* Destroyed streams: their threads finish the queued work after
     * cudaStreamDestroy returns, and items of other streams may still wait
     * on their counters, so the objects are kept (a few hundred bytes each). */
    std::vector<hkv_emu_stream *> retired;
};

void drain(hkv_emu_stream *s)
{
    std::unique_lock<std::mutex> lk(s->mu);
    uint64_t rng = cfg().seed ^ (uint64_t)(uintptr_t)s;
    for (;;) {
        s->cv.wait(lk, [s] { return s->stop || !s->q.empty(); });
        if (s->q.empty()) return;
        std::function<void()> item = std::move(s->q.front());
        s->q.pop_front();
        lk.unlock();
        if (cfg().delay_us > 0) {   /* a busy device: the item starts late */
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            std::this_thread::sleep_for(
                std::chrono::microseconds((rng >> 33) % (uint64_t)(cfg().delay_us + 1)));
        }
        item();
        lk.lock();
        s->done++;
        s->cv.notify_all();
    }
}

void start(hkv_emu_stream *s)
{
    if (!cfg().eager) s->th = std::thread(drain, s);
}

registry &reg()
{
    static registry *r = [] {
        registry *x = new registry;
        x->legacy = new hkv_emu_stream;
        x->legacy->legacy = true;
        start(x->legacy);
        x->streams.insert(x->legacy);
        return x;
    }();
    return *r;
}

hkv_emu_stream *resolve(cudaStream_t s) { return s ? s : reg().legacy; }

/* Wait until stream t has completed its first n items. */
void wait_done(hkv_emu_stream *t, uint64_t n)
{
    std::unique_lock<std::mutex> lk(t->mu);
    t->cv.wait(lk, [t, n] { return t->done >= n; });
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Append an item; returns its sequence number in s (1-based). */
uint64_t push(hkv_emu_stream *s, std::function<void()> item)
{
    registry &r = reg();
    /* implicit ordering with the legacy stream, captured now */
    std::vector<std::pair<hkv_emu_stream *, uint64_t>> deps;
    {
        std::lock_guard<std::mutex> lk(r.mu);
        if (s->legacy) {
            for (hkv_emu_stream *t : r.streams)
                if (t != s && !(t->flags & cudaStreamNonBlocking)) {
                    std::lock_guard<std::mutex> tl(t->mu);
                    if (t->enq > t->done) deps.push_back({t, t->enq});
                }
        } else if (!(s->flags & cudaStreamNonBlocking)) {
            std::lock_guard<std::mutex> tl(r.legacy->mu);
            if (r.legacy->enq > r.legacy->done) deps.push_back({r.legacy, r.legacy->enq});
        }
    }
    if (cfg().eager) {
        item();
        std::lock_guard<std::mutex> lk(s->mu);
        s->done = ++s->enq;
        return s->enq;
    }
    std::lock_guard<std::mutex> lk(s->mu);
    if (deps.empty()) s->q.push_back(std::move(item));
    else
        s->q.push_back([deps, item] {
            for (auto &d : deps) wait_done(d.first, d.second);
            item();
        });
    s->cv.notify_all();
    return ++s->enq;
}

}  // namespace

bool stream_valid(cudaStream_t s)
{
    if (!s) return true;
    registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    return r.streams.count(s) != 0;
}

/* Invalidate t's open capture (t->mu held). */
static void invalidate_locked(hkv_emu_stream *t)
{
    if (t->cap_state == cudaStreamCaptureStatusActive) {
        t->cap_state = cudaStreamCaptureStatusInvalidated;
        t->cap.clear();
    }
}

cudaError_t capture_refuse(cudaStream_t s)
{
    if (!s) return cudaSuccess;   /* the legacy stream is never captured */
    std::lock_guard<std::mutex> lk(s->mu);
    if (s->cap_state == cudaStreamCaptureStatusNone) return cudaSuccess;
    invalidate_locked(s);
    return cudaErrorStreamCaptureUnsupported;
}

bool capture_forbids_sync(void)
{
    registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    if (!r.global_captures) return false;
    for (hkv_emu_stream *t : r.streams) {
        std::lock_guard<std::mutex> tl(t->mu);
        if (t->cap_mode == cudaStreamCaptureModeGlobal) invalidate_locked(t);
    }
    return true;
}

cudaError_t enqueue(cudaStream_t s, std::function<void()> item)
{
    if (!stream_valid(s)) return cudaErrorInvalidResourceHandle;
    /* the legacy stream synchronises with the blocking streams: not while a
     * global-mode capture is open (cudaMemset, cudaMemcpy and the like) */
    if (!s && capture_forbids_sync()) return cudaErrorStreamCaptureUnsupported;
    if (s) {   /* captured, not run */
        std::lock_guard<std::mutex> lk(s->mu);
        if (s->cap_state == cudaStreamCaptureStatusActive) {
            s->cap.push_back(hkv_emu_node{std::move(item), nullptr});
            return cudaSuccess;
        }
        if (s->cap_state == cudaStreamCaptureStatusInvalidated) return cudaErrorStreamCaptureInvalidated;
    }
    push(resolve(s), std::move(item));
    return cudaSuccess;
}

cudaError_t enqueue_wait(cudaStream_t s, std::function<void()> item)
{
    if (!stream_valid(s)) return cudaErrorInvalidResourceHandle;
    if (!s && capture_forbids_sync()) return cudaErrorStreamCaptureUnsupported;
    cudaError_t e = capture_refuse(s);
    if (e) return e;
    hkv_emu_stream *t = resolve(s);
    wait_done(t, push(t, std::move(item)));
    return cudaSuccess;
}

void device_sync(void)
{
    registry &r = reg();
    std::vector<std::pair<hkv_emu_stream *, uint64_t>> all;
    {
        std::lock_guard<std::mutex> lk(r.mu);
        for (hkv_emu_stream *t : r.streams) {
            std::lock_guard<std::mutex> tl(t->mu);
            all.push_back({t, t->enq});
        }
        for (hkv_emu_stream *t : r.retired) {   /* destroyed, maybe still draining */
            std::lock_guard<std::mutex> tl(t->mu);
            all.push_back({t, t->enq});
        }
    }
    for (auto &p : all) wait_done(p.first, p.second);
}

}  // namespace hkv_emu

using namespace hkv_emu;

extern "C" {

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *out, unsigned int flags, int priority)
{
    if (!out || (flags & ~cudaStreamNonBlocking)) return ret(cudaErrorInvalidValue);
    if (sticky()) return ret(sticky());
    hkv_emu_stream *s = new hkv_emu_stream;
    s->flags = flags;
    s->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
    start(s);
    registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    r.streams.insert(s);
    *out = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    return cudaStreamCreateWithPriority(out, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithPriority(out, 0, 0); }

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s || !stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    registry &r = reg();
    {
        std::lock_guard<std::mutex> lk(r.mu);
        r.streams.erase(s);
        std::lock_guard<std::mutex> sl(s->mu);
        if (s->cap_state != cudaStreamCaptureStatusNone) {   /* its open capture ends unused */
            if (s->cap_mode == cudaStreamCaptureModeGlobal) r.global_captures--;
            s->cap_state = cudaStreamCaptureStatusNone;
            s->cap.clear();
        }
    }
    /* CUDA returns at once and releases the stream when its work is done:
     * the stream's thread drains the queue and ends. */
    {
        std::lock_guard<std::mutex> lk(s->mu);
        s->stop = true;
        s->cv.notify_all();
    }
    if (s->th.joinable()) s->th.detach();
    std::lock_guard<std::mutex> lk(r.mu);
    r.retired.push_back(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (!stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = capture_refuse(s)) return ret(e);
    hkv_emu_stream *t = resolve(s);
    uint64_t n;
    {
        std::lock_guard<std::mutex> lk(t->mu);
        n = t->enq;
    }
    wait_done(t, n);
    return sticky() ? ret(sticky()) : cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    if (!stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = capture_refuse(s)) return ret(e);
    if (sticky()) return ret(sticky());
    hkv_emu_stream *t = resolve(s);
    std::lock_guard<std::mutex> lk(t->mu);
    return t->done == t->enq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *user)
{
    if (!fn) return ret(cudaErrorInvalidValue);
    if (sticky()) return ret(sticky());
    return ret(enqueue(s, [fn, user] { fn(user); }));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags)
{
    if (!out || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)))
        return ret(cudaErrorInvalidValue);
    hkv_emu_event *e = new hkv_emu_event;
    e->flags = flags;
    registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    r.events.insert(e);
    *out = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, 0); }

static bool event_valid(cudaEvent_t e)
{
    registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    return e && r.events.count(e);
}

/* e's latest record is a node of a capture still open (e->mu held). */
static bool captured_locked(hkv_emu_event *e)
{
    if (!e->cap_by) return false;
    std::lock_guard<std::mutex> sl(e->cap_by->mu);
    return e->cap_by->cap_state != cudaStreamCaptureStatusNone;
}

/* A queued record or wait on e is done with it; the last one frees a
 * destroyed event. */
static void event_item_done(hkv_emu_event *e)
{
    bool free_it;
    {
        std::lock_guard<std::mutex> lk(e->mu);
        free_it = --e->pending == 0 && e->destroyed;
    }
    if (free_it) delete e;
}

/* Returns at once, as CUDA does; the memory goes when no queued record or
 * wait points to the event any more. */
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!event_valid(e)) return ret(cudaErrorInvalidResourceHandle);
    registry &r = reg();
    {
        std::lock_guard<std::mutex> lk(r.mu);
        r.events.erase(e);
    }
    bool free_now;
    {
        std::lock_guard<std::mutex> lk(e->mu);
        e->destroyed = true;
        free_now = e->pending == 0;
    }
    if (free_now) delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!event_valid(e) || !stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if (cudaError_t c = capture_refuse(s)) return ret(c);   /* an event node: not modelled */
    if (sticky()) return ret(sticky());
    uint64_t g;
    {
        std::lock_guard<std::mutex> lk(e->mu);
        g = ++e->recorded;
        e->pending++;
        e->cap_by = nullptr;
    }
    cudaError_t rc = enqueue(s, [e, g] {
        {
            std::lock_guard<std::mutex> lk(e->mu);
            if (g > e->completed) {
                e->completed = g;
                e->t = now_s();
            }
            e->cv.notify_all();
        }
        event_item_done(e);
    });
    if (rc) event_item_done(e);
    return ret(rc);
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags)
{
    if (flags & ~cudaEventRecordExternal) return ret(cudaErrorInvalidValue);
    if (!event_valid(e) || !stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if ((flags & cudaEventRecordExternal) && s) {
        cudaStreamCaptureStatus st;
        {
            std::lock_guard<std::mutex> lk(s->mu);
            st = s->cap_state;
            /* a node, recorded by each launch */
            if (st == cudaStreamCaptureStatusActive) s->cap.push_back(hkv_emu_node{nullptr, e});
        }
        if (st == cudaStreamCaptureStatusActive) {   /* (e->mu after s->mu's release: the
                                                         query takes them the other way) */
            std::lock_guard<std::mutex> el(e->mu);
            e->cap_by = s;
            return cudaSuccess;
        }
        if (st == cudaStreamCaptureStatusInvalidated) return ret(cudaErrorStreamCaptureInvalidated);
    }
    return cudaEventRecord(e, s);
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!event_valid(e)) return ret(cudaErrorInvalidResourceHandle);
    if (sticky()) return ret(sticky());
    std::lock_guard<std::mutex> lk(e->mu);
    if (captured_locked(e)) return ret(cudaErrorCapturedEvent);
    return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!event_valid(e)) return ret(cudaErrorInvalidResourceHandle);
    std::unique_lock<std::mutex> lk(e->mu);
    if (captured_locked(e)) return ret(cudaErrorCapturedEvent);
    const uint64_t g = e->recorded;
    e->cv.wait(lk, [e, g] { return e->completed >= g; });
    return sticky() ? ret(sticky()) : cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if (!ms || !event_valid(a) || !event_valid(b)) return ret(cudaErrorInvalidResourceHandle);
    if ((a->flags | b->flags) & cudaEventDisableTiming) return ret(cudaErrorInvalidResourceHandle);
    double ta, tb;
    {
        std::lock_guard<std::mutex> lk(a->mu);
        if (captured_locked(a)) return ret(cudaErrorCapturedEvent);
        if (!a->recorded) return ret(cudaErrorInvalidResourceHandle);
        if (a->completed < a->recorded) return ret(cudaErrorNotReady);
        ta = a->t;
    }
    {
        std::lock_guard<std::mutex> lk(b->mu);
        if (captured_locked(b)) return ret(cudaErrorCapturedEvent);
        if (!b->recorded) return ret(cudaErrorInvalidResourceHandle);
        if (b->completed < b->recorded) return ret(cudaErrorNotReady);
        tb = b->t;
    }
    *ms = (float)((tb - ta) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    if (!event_valid(e) || !stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if (cudaError_t c = capture_refuse(s)) return ret(c);   /* a cross-stream join: not modelled */
    if (flags) return ret(cudaErrorInvalidValue);
    if (sticky()) return ret(sticky());
    uint64_t g;
    {
        std::lock_guard<std::mutex> lk(e->mu);
        g = e->recorded;   /* the most recent record at the time of this call */
        if (g) e->pending++;
    }
    if (!g) return cudaSuccess;
    cudaError_t rc = enqueue(s, [e, g] {
        {
            std::unique_lock<std::mutex> lk(e->mu);
            e->cv.wait(lk, [e, g] { return e->completed >= g; });
        }
        event_item_done(e);
    });
    if (rc) event_item_done(e);
    return ret(rc);
}

/* ---- stream capture and graphs ---------------------------------------------- */

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    if (!s) return ret(cudaErrorStreamCaptureUnsupported);   /* the legacy stream cannot be */
    if (!stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed)
        return ret(cudaErrorInvalidValue);
    if (sticky()) return ret(sticky());
    registry &r = reg();
    std::lock_guard<std::mutex> rl(r.mu);
    std::lock_guard<std::mutex> lk(s->mu);
    if (s->cap_state != cudaStreamCaptureStatusNone) return ret(cudaErrorIllegalState);
    s->cap_state = cudaStreamCaptureStatusActive;
    s->cap_mode = mode;
    s->cap.clear();
    if (mode == cudaStreamCaptureModeGlobal) r.global_captures++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    if (!s || !graph) return ret(cudaErrorInvalidValue);
    if (!stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    registry &r = reg();
    std::vector<hkv_emu_node> items;
    {
        std::lock_guard<std::mutex> rl(r.mu);
        std::lock_guard<std::mutex> lk(s->mu);
        if (s->cap_state == cudaStreamCaptureStatusNone) return ret(cudaErrorIllegalState);
        const bool valid = s->cap_state == cudaStreamCaptureStatusActive && !cfg().refuse_capture;
        if (s->cap_mode == cudaStreamCaptureModeGlobal) r.global_captures--;
        s->cap_state = cudaStreamCaptureStatusNone;
        items.swap(s->cap);
        if (!valid) {
            *graph = nullptr;
            return ret(cudaErrorStreamCaptureInvalidated);
        }
    }
    hkv_emu_graph *g = new hkv_emu_graph;
    g->items = std::move(items);
    std::lock_guard<std::mutex> rl(r.mu);
    r.graphs.insert(g);
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status)
{
    if (!status) return ret(cudaErrorInvalidValue);
    if (!stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if (!s) {
        *status = cudaStreamCaptureStatusNone;
        return cudaSuccess;
    }
    std::lock_guard<std::mutex> lk(s->mu);
    *status = s->cap_state;
    return cudaSuccess;
}

extern "C++" {   /* the registry's helpers, inside the C API's block */
/* A graph or an executable graph the registry holds (set: which). */
template <class T> static bool registered(std::set<T *> registry::*set, T *p)
{
    registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    return p && (r.*set).count(p);
}
static bool graph_valid(cudaGraph_t g) { return registered(&registry::graphs, g); }
static bool exec_valid(cudaGraphExec_t x) { return registered(&registry::execs, x); }

/* Out of the registry and freed; a queued launch holds its own items. */
template <class T> static cudaError_t unregister(std::set<T *> registry::*set, T *p)
{
    registry &r = reg();
    {
        std::lock_guard<std::mutex> lk(r.mu);
        if (!p || !(r.*set).erase(p)) return ret(cudaErrorInvalidResourceHandle);
    }
    delete p;
    return cudaSuccess;
}
}  // extern "C++"

cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *num)
{
    if (!num) return ret(cudaErrorInvalidValue);
    if (!graph_valid(g)) return ret(cudaErrorInvalidResourceHandle);
    const size_t n = g->items.size();
    /* opaque node handles: 1-based positions in capture order */
    for (size_t i = 0; nodes && i < n && i < *num; i++) nodes[i] = (cudaGraphNode_t)(uintptr_t)(i + 1);
    *num = n;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t g, unsigned long long flags)
{
    if (!exec || flags) return ret(cudaErrorInvalidValue);
    if (!graph_valid(g)) return ret(cudaErrorInvalidResourceHandle);
    hkv_emu_graph_exec *x = new hkv_emu_graph_exec;
    x->items = std::make_shared<const std::vector<hkv_emu_node>>(g->items);
    registry &r = reg();
    std::lock_guard<std::mutex> lk(r.mu);
    r.execs.insert(x);
    *exec = x;
    return cudaSuccess;
}

/* The emulator's graphs are lists, so "the same topology" is the same
 * number of nodes with event nodes at the same places: the executable graph
 * takes the new graph's items (their arguments, the events recorded), as
 * cudaGraphExecUpdate takes new kernel parameters. */
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t x, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info)
{
    if (info) *info = cudaGraphExecUpdateResultInfo{cudaGraphExecUpdateError, nullptr, nullptr};
    if (!exec_valid(x) || !graph_valid(g)) return ret(cudaErrorInvalidResourceHandle);
    bool same = g->items.size() == x->items->size();
    for (size_t i = 0; same && i < g->items.size(); i++)
        same = !g->items[i].ev == !(*x->items)[i].ev;
    if (!same) {
        if (info) info->result = cudaGraphExecUpdateErrorTopologyChanged;
        return ret(cudaErrorGraphExecUpdateFailure);
    }
    x->items = std::make_shared<const std::vector<hkv_emu_node>>(g->items);
    if (info) info->result = cudaGraphExecUpdateSuccess;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s)
{
    if (!exec_valid(x) || !stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if (cudaError_t c = capture_refuse(s)) return ret(c);   /* a child graph: not modelled */
    if (sticky()) return ret(sticky());
    std::shared_ptr<const std::vector<hkv_emu_node>> items = x->items;
    /* Each event node is a record made now (the host may wait for it once
     * the launch returns), completed when the graph reaches it. */
    for (const hkv_emu_node &nd : *items)
        if (nd.ev && !event_valid(nd.ev)) return ret(cudaErrorInvalidResourceHandle);
    auto gens = std::make_shared<std::vector<uint64_t>>(items->size(), 0);
    for (size_t i = 0; i < items->size(); i++)
        if (hkv_emu_event *e = (*items)[i].ev) {
            std::lock_guard<std::mutex> lk(e->mu);
            (*gens)[i] = ++e->recorded;
            e->pending++;
            e->cap_by = nullptr;
        }
    cudaError_t rc = enqueue(s, [items, gens] {
        for (size_t i = 0; i < items->size(); i++) {
            const hkv_emu_node &nd = (*items)[i];
            if (!nd.ev) {
                nd.f();
                continue;
            }
            hkv_emu_event *e = nd.ev;
            {
                std::lock_guard<std::mutex> lk(e->mu);
                if ((*gens)[i] > e->completed) {
                    e->completed = (*gens)[i];
                    e->t = now_s();
                }
                e->cv.notify_all();
            }
            event_item_done(e);
        }
    });
    if (rc)   /* not queued: the records complete now, as if run (nothing waits forever) */
        for (size_t i = 0; i < items->size(); i++)
            if (hkv_emu_event *e = (*items)[i].ev) {
                {
                    std::lock_guard<std::mutex> lk(e->mu);
                    if ((*gens)[i] > e->completed) e->completed = (*gens)[i];
                    e->cv.notify_all();
                }
                event_item_done(e);
            }
    return ret(rc);
}

/* Both return at once; queued launches keep their items alive (CUDA frees an
 * executable graph in flight when it completes). */
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) { return unregister(&registry::execs, x); }

cudaError_t cudaGraphDestroy(cudaGraph_t g) { return unregister(&registry::graphs, g); }

}  // extern "C"

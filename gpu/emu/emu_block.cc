/* Thread blocks on the CPU: every CUDA thread of a block is a fiber (its own
 * stack, Boost.Context's fcontext switch) on one OS thread; a fiber runs until
 * it reaches a barrier or a warp collective, where it parks until every
 * thread the operation names has arrived. Between those points any order is
 * a legal CUDA schedule, so released threads resume in a shuffled order to
 * expose races that a fixed order would hide.
 *
 * Stricter than a GPU where that costs nothing: a __syncthreads that not
 * every thread of the block reaches, two different __syncthreads sites met by
 * one barrier, a collective whose mask names a lane that exited, does not
 * exist or reads a lane outside the mask, and any deadlock are faults that
 * stop the grid with a message naming the kernel, the block, the threads and
 * the source lines.
 *
 * Sanitizers are told about every stack switch (ASan: start/finish switch
 * fiber; TSan: one fiber per CUDA thread). TSan sees each switch as a
 * synchronisation (the scheduler and its fibers share bookkeeping), so it
 * reports races between blocks on different workers, between streams and
 * between the host and a stream, not between threads of one block: those
 * show as wrong results under the shuffled order. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/context/detail/fcontext.hpp>

#include "emu_internal.h"

#ifdef HKV_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef HKV_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace ctx = boost::context::detail;

#if defined(__x86_64__)
/* emu_switch_x86_64.S: Boost.Context's contract without the FPU control words */
extern "C" ctx::transfer_t hkv_emu_jump(ctx::fcontext_t to, void *data);
extern "C" void hkv_emu_trampoline(void);
#endif

namespace hkv_emu {

static thread_local thread_view *tl_thread = nullptr;

const thread_view *current_thread(void) { return tl_thread; }

/* The stack switch, and a fresh context at the top of a stack that starts
 * fn(transfer_t) when first jumped to. */
static inline ctx::transfer_t jump_to(ctx::fcontext_t to, void *data)
{
#if defined(__x86_64__)
    return hkv_emu_jump(to, data);
#else
    return ctx::jump_fcontext(to, data);
#endif
}

static ctx::fcontext_t make_context(char *top, size_t size, void (*fn)(ctx::transfer_t))
{
#if defined(__x86_64__)
    /* hkv_emu_jump pops r12-r15, rbx (fn), rbp, then returns to the
     * trampoline with rsp 16-byte aligned for its call */
    (void)size;
    void **sp = (void **)(((uintptr_t)top & ~(uintptr_t)15) - 72);
    sp[0] = sp[1] = sp[2] = sp[3] = nullptr;
    sp[4] = (void *)fn;
    sp[5] = nullptr;
    sp[6] = (void *)hkv_emu_trampoline;
    return (ctx::fcontext_t)sp;
#else
    return ctx::make_fcontext(top, size, fn);
#endif
}

namespace {

enum fiber_state { F_READY, F_WAIT_BAR, F_WAIT_WARP, F_DONE };

struct block_run;

struct fiber {
    ctx::fcontext_t fc = nullptr;
    char *map = nullptr;     /* mmap'ed stack with a guard page below */
    size_t map_bytes = 0;
    char *stack_lo = nullptr;
    size_t stack_bytes = 0;
    size_t color = 0;        /* bytes left unused at the stack's top (stack_init) */
    bool dirty = false;      /* abandoned mid-call by a fault: ASan shadow to clear */
    void *tsan = nullptr;
    thread_view view;
    int linear = 0, warp = 0, lane = 0;
    fiber_state st = F_DONE;
    const char *site = nullptr;   /* where it waits */
    int op = 0;
    uint64_t result = 0;
    block_run *blk = nullptr;
};

struct warp_group {          /* one collective in progress in a warp */
    unsigned mask, arrived;
    int op, width;
    const char *site;
    uint64_t val[32];
    int arg[32];
};

struct warp_state {
    unsigned exists = 0, exited = 0;
    std::vector<warp_group> pending;
    char sync = 0;           /* TSan happens-before object */
};

struct rng {
    uint64_t s;
    uint64_t next()
    {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        return s;
    }
    /* Uniform in [0, n): the high bits scaled, no division (this runs at
     * every barrier and warp collective of every block). */
    uint32_t below(uint32_t n) { return (uint32_t)(((next() >> 32) * n) >> 32); }
};

struct block_run {
    const grid_job *job;
    block_view view;
    int n = 0, done = 0;
    std::vector<fiber *> *f = nullptr;
    std::vector<int> ready;
    std::vector<int> bar_ids;   /* the threads a barrier releases */
    int bar_count = 0, bar_mode = 0, bar_acc = 0;
    const char *bar_site = nullptr;
    std::vector<warp_state> warps;
    bool faulted = false;
    std::string fault;
    rng r{1};
    char start_sync = 0, bar_sync = 0, end_sync = 0;
};

/* Per OS thread that runs blocks: the scheduler's context and a pool of
 * fibers reused from block to block. */
struct worker {
    ctx::fcontext_t sched = nullptr;
    std::vector<fiber *> pool;
    fiber *cur = nullptr;
    void *tsan_self = nullptr;
    const void *asan_bottom = nullptr;
    size_t asan_size = 0;
    ~worker()
    {
        for (fiber *f : pool) {
#ifdef HKV_EMU_TSAN
            if (f->tsan) __tsan_destroy_fiber(f->tsan);
#endif
            if (f->map) munmap(f->map, f->map_bytes);
            delete f;
        }
    }
};
thread_local worker tl_worker;

inline void tsan_release(void *a)
{
#ifdef HKV_EMU_TSAN
    __tsan_release(a);
#else
    (void)a;
#endif
}
inline void tsan_acquire(void *a)
{
#ifdef HKV_EMU_TSAN
    __tsan_acquire(a);
#else
    (void)a;
#endif
}

const char *op_name(int op)
{
    switch (op) {
    case W_IDX: return "__shfl_sync";
    case W_UP: return "__shfl_up_sync";
    case W_DOWN: return "__shfl_down_sync";
    case W_XOR: return "__shfl_xor_sync";
    case W_BALLOT: return "__ballot_sync";
    case W_ANY: return "__any_sync";
    case W_ALL: return "__all_sync";
    case W_SYNC: return "__syncwarp";
    case W_RADD: return "__reduce_add_sync";
    case W_RMIN: return "__reduce_min_sync";
    case W_RMAX: return "__reduce_max_sync";
    case W_MATCH_ANY: return "__match_any_sync";
    case W_MATCH_ALL: return "__match_all_sync";
    case W_TREE_FSUM: return "hkv_warp_sum (__shfl_xor_sync x5)";
    case W_TREE_FMAX: return "hkv_warp_max (__shfl_xor_sync x5)";
    case W_TREE_DSUM: return "hkv_warp_sum_d (__shfl_xor_sync x5)";
    }
    return "?";
}

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

std::string where(const block_run *b)
{
    const uint3 &i = b->view.idx;
    return fmt("kernel %s, block (%u,%u,%u) of (%u,%u,%u), %u x %u x %u threads", b->job->name, i.x,
               i.y, i.z, b->view.grid.x, b->view.grid.y, b->view.grid.z, b->view.dim.x,
               b->view.dim.y, b->view.dim.z);
}
std::string thread_name(const fiber *f)
{
    return fmt("thread (%u,%u,%u) (warp %d, lane %d)", f->view.idx.x, f->view.idx.y, f->view.idx.z,
               f->warp, f->lane);
}

bool same_site(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

/* ---- fiber switching ---- */

void fiber_entry(ctx::transfer_t t);

void stack_init(fiber *f, int index)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t want = (cfg().stack_bytes + page - 1) / page * page;
    f->map_bytes = want + page;
    f->map = (char *)mmap(nullptr, f->map_bytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (f->map == MAP_FAILED) {
        fprintf(stderr, "hkv cuda-emu: cannot map a %zu-byte fiber stack: %s\n", f->map_bytes,
                strerror(errno));
        abort();
    }
    mprotect(f->map, page, PROT_NONE);   /* overflow faults instead of corrupting */
    f->stack_lo = f->map + page;
    f->stack_bytes = want;
    /* Every stack's top is page-aligned, so without this the hot frames of
     * all the threads of a warp, switched between at every collective, fall
     * in the same few L1 sets; 64 offsets a cache line apart spread them
     * over a page. */
    f->color = (size_t)(index * 5 % 64) * 64;
#ifdef HKV_EMU_TSAN
    f->tsan = __tsan_create_fiber(0);
#endif
}

/* A switch has landed in a fiber (at its entry, or back in park):
 * t.fctx is where the one that switched here stopped, the scheduler
 * (t.data null) or another fiber of the block (t.data). */
void landed(worker *w, ctx::transfer_t t, void *fake)
{
    fiber *from = (fiber *)t.data;
    if (from) from->fc = t.fctx;
    else w->sched = t.fctx;
#ifdef HKV_EMU_ASAN
    if (from) __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
    else __sanitizer_finish_switch_fiber(fake, &w->asan_bottom, &w->asan_size);
#else
    (void)fake;
#endif
}

/* Scheduler side: run f until the block has nothing ready (every fiber
 * parked or done, or a fault); the fibers hand over to each other in
 * between (park, leave). */
void resume(worker *w, fiber *f)
{
    tl_thread = &f->view;
    w->cur = f;
#ifdef HKV_EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack_lo, f->stack_bytes);
#endif
#ifdef HKV_EMU_TSAN
    __tsan_switch_to_fiber(f->tsan, 0);
#endif
    ctx::transfer_t t = jump_to(f->fc, nullptr);
    ((fiber *)t.data)->fc = t.fctx;   /* the last fiber to run, not always f */
#ifdef HKV_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    w->cur = nullptr;
    tl_thread = nullptr;
}

/* The fiber to run after f parks or exits: the back of the ready list, the
 * one the scheduler would take; none when nothing is ready or the block has
 * faulted (then the scheduler). */
fiber *take_next(fiber *f)
{
    block_run *b = f->blk;
    if (b->faulted || b->ready.empty()) return nullptr;
    fiber *g = (*b->f)[b->ready.back()];
    b->ready.pop_back();
    return g;
}

/* Fiber side: from f to g (a fiber of its block) or, g null, to the
 * scheduler, the sanitizers told. fake_save: where ASan keeps the fake stack
 * of the frames f leaves behind; null when f exits. */
ctx::transfer_t switch_to(worker *w, fiber *f, fiber *g, void **fake_save)
{
    (void)fake_save;
    if (g) {
        tl_thread = &g->view;
        w->cur = g;
#ifdef HKV_EMU_ASAN
        __sanitizer_start_switch_fiber(fake_save, g->stack_lo, g->stack_bytes);
#endif
#ifdef HKV_EMU_TSAN
        __tsan_switch_to_fiber(g->tsan, 0);
#endif
        return jump_to(g->fc, f);
    }
#ifdef HKV_EMU_ASAN
    __sanitizer_start_switch_fiber(fake_save, w->asan_bottom, w->asan_size);
#endif
#ifdef HKV_EMU_TSAN
    __tsan_switch_to_fiber(w->tsan_self, 0);
#endif
    return jump_to(w->sched, f);
}

/* Fiber side: f parks and the next ready fiber of its block runs, switched
 * to directly (one stack switch instead of two through the scheduler, in
 * the order the scheduler would take), or the scheduler. Returns when f is
 * resumed. */
void park(fiber *f)
{
    worker *w = &tl_worker;
    void *fake = nullptr;
    const ctx::transfer_t t = switch_to(w, f, take_next(f), &fake);
    landed(w, t, fake);
}

/* Fiber side, never returns: the thread is finished (or abandoned). No
 * local here or in switch_to has its address taken: these frames are never
 * popped, and ASan would leave their redzones poisoned under the next
 * block's frames. */
[[noreturn]] void leave(fiber *f)
{
    switch_to(&tl_worker, f, take_next(f), nullptr);
    __builtin_unreachable();
}

[[noreturn]] __attribute__((noinline, cold)) void outside_kernel(const char *what)
{
    fprintf(stderr, "hkv cuda-emu: %s called outside a kernel\n", what);
    abort();
}

inline fiber *current(const char *what)
{
    worker *w = &tl_worker;
    if (__builtin_expect(!w->cur || !tl_thread, 0)) outside_kernel(what);
    return w->cur;
}

/* A fault inside a kernel: the block stops here; the grid stops launching
 * blocks; the device error becomes sticky (stream code). The message is
 * formatted on the fiber's stack: the fiber is abandoned, so nothing it
 * allocated would ever be freed. */
[[noreturn]] void fault(fiber *f, const char *fmt_, ...) __attribute__((format(printf, 2, 3)));
[[noreturn]] void fault(fiber *f, const char *fmt_, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt_);
    vsnprintf(what, sizeof what, fmt_, ap);
    va_end(ap);
    block_run *b = f->blk;
    if (!b->faulted) {
        b->faulted = true;
        b->fault = where(b) + ": " + what;   /* b lives on the scheduler's stack */
    }
    f->dirty = true;
    f->st = F_DONE;
    leave(f);
}

/* "thread (x,y,z) (warp w, lane l)" into buf, without the heap. */
const char *tname(const fiber *f, char *buf, size_t cap)
{
    snprintf(buf, cap, "thread (%u,%u,%u) (warp %d, lane %d)", f->view.idx.x, f->view.idx.y,
             f->view.idx.z, f->warp, f->lane);
    return buf;
}

void release_fibers(block_run *b, int *ids, int n)
{
    if (cfg().shuffle)
        for (int i = n; i > 1; i--) std::swap(ids[i - 1], ids[b->r.below((uint32_t)i)]);
    for (int k = 0; k < n; k++) {
        (*b->f)[ids[k]]->st = F_READY;
        b->ready.push_back(ids[k]);
    }
}

void thread_done(fiber *f)
{
    char tb[96];
    block_run *b = f->blk;
    f->st = F_DONE;
    b->done++;
    warp_state &ws = b->warps[f->warp];
    ws.exited |= 1u << f->lane;
    for (const warp_group &g : ws.pending)
        if (g.mask & (1u << f->lane))
            fault(f, "%s exited while lanes 0x%08x wait for it in %s (%s, mask 0x%08x)",
                         tname(f, tb, sizeof tb), g.arrived, op_name(g.op), g.site, g.mask);
    tsan_release(&b->end_sync);
}

void fiber_entry(ctx::transfer_t t)
{
    worker *w = &tl_worker;
    fiber *f = w->cur;   /* set by whoever switched here */
    landed(w, t, nullptr);
    tsan_acquire(&f->blk->start_sync);
    f->blk->job->body->run();
    thread_done(f);
    leave(f);
}

/* What every unfinished thread waits on, when none can run. */
std::string deadlock(block_run *b)
{
    char tb[96];
    int at_bar = 0, exited = 0;
    const char *bar_site = nullptr;
    std::string warp_waits, exited_list;
    for (int i = 0; i < b->n; i++) {
        fiber *f = (*b->f)[i];
        if (f->st == F_WAIT_BAR) at_bar++, bar_site = f->site;
        else if (f->st == F_DONE) {
            if (exited++ < 4) exited_list += (exited_list.empty() ? "" : ", ") + thread_name(f);
        } else if (f->st == F_WAIT_WARP && warp_waits.size() < 600)
            warp_waits += fmt("; %s waits in %s at %s", tname(f, tb, sizeof tb), op_name(f->op),
                              f->site);
    }
    if (at_bar && warp_waits.empty())
        return fmt("barrier divergence: %d of %d threads wait at __syncthreads (%s) that %d "
                   "exited threads never reach (%s%s)", at_bar, b->n, bar_site, exited,
                   exited_list.c_str(), exited > 4 ? ", ..." : "");
    return fmt("deadlock: %d threads at __syncthreads%s%s%s", at_bar, bar_site ? " (" : "",
               bar_site ? bar_site : "", bar_site ? ")" : "") + warp_waits;
}

void run_block(const grid_job &job, uint64_t linear_block, std::atomic<bool> &stop,
               std::string &fault_out, std::mutex &fault_mu)
{
    worker *w = &tl_worker;
#ifdef HKV_EMU_TSAN
    if (!w->tsan_self) w->tsan_self = __tsan_get_current_fiber();
#endif
    const int n = (int)(job.block.x * job.block.y * job.block.z);
    while ((int)w->pool.size() < n) {
        fiber *f = new fiber;
        stack_init(f, (int)w->pool.size());
        w->pool.push_back(f);
    }
    block_run b;
    b.job = &job;
    b.n = n;
    b.f = &w->pool;
    b.r.s = (cfg().seed ^ (linear_block * 0x9e3779b97f4a7c15ull)) | 1;
    const uint64_t gx = job.grid.x, gy = job.grid.y;
    b.view.idx = make_uint3((unsigned)(linear_block % gx), (unsigned)(linear_block / gx % gy),
                            (unsigned)(linear_block / (gx * gy)));
    b.view.dim = job.block;
    b.view.grid = job.grid;
    static std::atomic<uint64_t> serials{0};
    b.view.serial = serials.fetch_add(1) + 1;
    /* dynamic shared memory: exactly the bytes asked (ASan sees an overrun),
     * NaN-filled as fresh GPU memory is not zeroed */
    void *smem = malloc(job.smem ? job.smem : 1);
    if (!smem) {
        std::lock_guard<std::mutex> lk(fault_mu);
        if (fault_out.empty()) fault_out = fmt("kernel %s: no host memory for %zu bytes of shared memory", job.name, job.smem);
        stop = true;
        return;
    }
    memset(smem, 0xff, job.smem ? job.smem : 1);
    b.view.dyn_smem = smem;
    b.warps.resize((size_t)(n + 31) / 32);
    for (int i = 0; i < n; i++) b.warps[i / 32].exists |= 1u << (i % 32);
    for (int i = 0; i < n; i++) {
        fiber *f = w->pool[i];
#ifdef HKV_EMU_ASAN
        if (f->dirty) __asan_unpoison_memory_region(f->stack_lo, f->stack_bytes);
#endif
        f->dirty = false;
        f->linear = i, f->warp = i / 32, f->lane = i % 32;
        f->view.idx = make_uint3((unsigned)(i % job.block.x), (unsigned)(i / job.block.x % job.block.y),
                                 (unsigned)(i / (job.block.x * job.block.y)));
        f->view.block = &b.view;
        f->st = F_READY;
        f->blk = &b;
        f->fc = make_context(f->stack_lo + f->stack_bytes - f->color,
                                   f->stack_bytes - f->color, fiber_entry);
    }
    std::vector<int> all((size_t)n);
    for (int i = 0; i < n; i++) all[i] = n - 1 - i;   /* popped from the back: 0 first */
    b.ready.reserve((size_t)n);
    release_fibers(&b, all.data(), n);
    tsan_release(&b.start_sync);
    while (!b.faulted) {
        if (b.ready.empty()) {
            if (b.done == n) break;
            b.faulted = true;
            b.fault = where(&b) + ": " + deadlock(&b);
            break;
        }
        const int id = b.ready.back();
        b.ready.pop_back();
        resume(w, w->pool[id]);
    }
    tsan_acquire(&b.end_sync);
    if (b.faulted) {
        for (int i = 0; i < n; i++)
            if (w->pool[i]->st != F_DONE) w->pool[i]->dirty = true;
        std::lock_guard<std::mutex> lk(fault_mu);
        if (fault_out.empty()) fault_out = b.fault;
        stop = true;
    }
    free(smem);
}

/* ---- the worker pool: grids waiting for blocks, and threads taking them ---- */

struct grid_run {
    const grid_job *job;
    uint64_t n;
    std::vector<uint32_t> order;        /* shuffled block order, when n fits */
    uint64_t rot = 0;                   /* else a rotation of the linear order */
    std::atomic<uint64_t> next{0};
    uint64_t finished = 0;              /* under the pool's mutex */
    int helpers = 0;                    /* workers inside run_one loops on it, under the mutex */
    std::atomic<bool> stop{false};
    std::string fault;
    std::mutex fault_mu;
    uint64_t block_at(uint64_t i) const { return order.empty() ? (i + rot) % n : order[i]; }
};

struct pool {
    std::mutex mu;
    std::condition_variable work, done;
    std::vector<grid_run *> grids;
    std::vector<std::thread> threads;

    /* Take one block of g and run it; false when g has none left. */
    bool run_one(grid_run *g)
    {
        const uint64_t i = g->next.fetch_add(1);
        if (i >= g->n) return false;
        if (!g->stop.load()) run_block(*g->job, g->block_at(i), g->stop, g->fault, g->fault_mu);
        std::lock_guard<std::mutex> lk(mu);
        if (++g->finished == g->n) done.notify_all();
        return true;
    }
    void loop()
    {
        std::unique_lock<std::mutex> lk(mu);
        for (;;) {
            grid_run *g = nullptr;
            for (grid_run *c : grids)
                if (c->next.load() < c->n) { g = c; break; }
            if (!g) { work.wait(lk); continue; }
            g->helpers++;   /* g outlives this loop: run_grid waits for helpers to leave */
            lk.unlock();
            while (run_one(g)) {}
            lk.lock();
            if (--g->helpers == 0) done.notify_all();
        }
    }
};

pool &the_pool()
{
    static pool *p = [] {
        pool *q = new pool;
        for (int i = 0; i < cfg().workers; i++) {
            q->threads.emplace_back([q] { q->loop(); });
            q->threads.back().detach();
        }
        return q;
    }();
    return *p;
}

}  // namespace

std::string run_grid(const grid_job &job)
{
    grid_run g;
    g.job = &job;
    g.n = (uint64_t)job.grid.x * job.grid.y * job.grid.z;
    rng r{(cfg().seed + (uint64_t)job.grid.x * 31 + job.block.x) | 1};
    if (cfg().shuffle) {
        if (g.n <= (1u << 22)) {
            g.order.resize(g.n);
            for (uint64_t i = 0; i < g.n; i++) g.order[i] = (uint32_t)i;
            for (uint64_t i = g.n; i > 1; i--) std::swap(g.order[i - 1], g.order[r.next() % i]);
        } else {
            g.rot = r.next() % g.n;
        }
    }
    pool &p = the_pool();
    const bool share = g.n > 1 && cfg().workers > 0;
    if (share) {
        std::lock_guard<std::mutex> lk(p.mu);
        p.grids.push_back(&g);
        p.work.notify_all();
    }
    while (p.run_one(&g)) {}
    {
        std::unique_lock<std::mutex> lk(p.mu);
        p.done.wait(lk, [&] { return g.finished == g.n && g.helpers == 0; });
        if (share)
            for (size_t i = 0; i < p.grids.size(); i++)
                if (p.grids[i] == &g) { p.grids.erase(p.grids.begin() + (long)i); break; }
    }
    return g.fault;
}

/* ---- barriers and collectives, called from inside a kernel ---- */

int block_barrier(const char *site, int mode, int pred)
{
    char tb[96];
    fiber *f = current("__syncthreads");
    block_run *b = f->blk;
    if (b->bar_count == 0) {
        b->bar_site = site;
        b->bar_mode = mode;
        b->bar_acc = mode == 2 ? 1 : 0;
    } else if (!same_site(site, b->bar_site) || mode != b->bar_mode) {
        fault(f, "divergent barriers: %s reaches the barrier at %s while %d threads wait at %s",
                     tname(f, tb, sizeof tb), site, b->bar_count, b->bar_site);
    }
    if (mode == 1) b->bar_acc += pred;
    else if (mode == 2) b->bar_acc &= pred;
    else if (mode == 3) b->bar_acc |= pred;
    tsan_release(&b->bar_sync);
    if (++b->bar_count == b->n) {
        std::vector<int> &ids = b->bar_ids;   /* kept: no allocation per barrier */
        ids.clear();
        for (int i = 0; i < b->n; i++) {
            fiber *o = (*b->f)[i];
            o->result = (uint64_t)b->bar_acc;
            if (o != f && o->st == F_WAIT_BAR) ids.push_back(i);
        }
        b->bar_count = 0;
        release_fibers(b, ids.data(), (int)ids.size());
        tsan_acquire(&b->bar_sync);
        return (int)f->result;
    }
    f->st = F_WAIT_BAR;
    f->site = site;
    park(f);
    tsan_acquire(&b->bar_sync);
    return (int)f->result;
}

void kernel_fault(const char *what)
{
    fault(current("a device-side check"), "%s", what);
}

unsigned active_mask(void)
{
    fiber *f = current("__activemask");
    const warp_state &ws = f->blk->warps[f->warp];
    return ws.exists & ~ws.exited;
}

static bool pow2_width(int w) { return w >= 1 && w <= 32 && (w & (w - 1)) == 0; }

/* What x = x OP __shfl_xor_sync(0xffffffff, x, o) for o = 16, 8, 4, 2, 1
 * leaves in each lane: the five steps over all 32 lanes at once, each lane's
 * own value the left operand as in the loop. */
template <class T, class F>
static void butterfly_as(const warp_group &g, uint64_t out[32], F op)
{
    T x[32], y[32];
    for (int l = 0; l < 32; l++) memcpy(&x[l], &g.val[l], sizeof(T));
    for (int o = 16; o > 0; o >>= 1) {
        for (int l = 0; l < 32; l++) y[l] = op(x[l], x[l ^ o]);
        memcpy(x, y, sizeof x);
    }
    for (int l = 0; l < 32; l++) {
        out[l] = 0;
        memcpy(&out[l], &x[l], sizeof(T));
    }
}

static void butterfly(const warp_group &g, uint64_t out[32])
{
    if (g.op == W_TREE_FSUM) butterfly_as<float>(g, out, [](float a, float b) { return a + b; });
    else if (g.op == W_TREE_FMAX) butterfly_as<float>(g, out, [](float a, float b) { return fmaxf(a, b); });
    else butterfly_as<double>(g, out, [](double a, double b) { return a + b; });
}

/* Every lane's result once all of g's lanes have arrived. */
static void complete(fiber *f, warp_group &g)
{
    block_run *b = f->blk;
    const int base = f->warp * 32;
    uint64_t all = 0;
    unsigned ballot = 0, radd = 0, rmin = 0xffffffffu, rmax = 0;
    int32_t smin = INT32_MAX, smax = INT32_MIN;
    for (int l = 0; l < 32; l++)
        if (g.mask & (1u << l)) {
            const uint32_t u = (uint32_t)g.val[l];
            const int32_t i = (int32_t)u;
            ballot |= (g.val[l] != 0) << l;
            radd += u;
            rmin = u < rmin ? u : rmin;
            rmax = u > rmax ? u : rmax;
            smin = i < smin ? i : smin;
            smax = i > smax ? i : smax;
        }
    const bool is_signed = g.arg[__builtin_ctz(g.mask)] != 0;   /* reduce_minmax's int overload */
    uint64_t tree[32];
    if (g.op >= W_TREE_FSUM) butterfly(g, tree);
    for (int l = 0; l < 32; l++) {
        if (!(g.mask & (1u << l))) continue;
        fiber *o = (*b->f)[base + l];
        uint64_t r = 0;
        const int w = g.width, seg = l & ~(w - 1), pos = l & (w - 1);
        int src = l;
        switch (g.op) {
        case W_IDX: src = seg + (g.arg[l] & (w - 1)); break;
        case W_UP: src = pos >= g.arg[l] ? l - g.arg[l] : l; break;
        case W_DOWN: src = pos + g.arg[l] < w ? l + g.arg[l] : l; break;
        case W_XOR: src = l ^ g.arg[l]; if (src >= seg + w || src < 0 || src > 31) src = l; break;
        default: break;
        }
        switch (g.op) {
        case W_IDX: case W_UP: case W_DOWN: case W_XOR:
            if (!(g.mask & (1u << src)))
                fault(f, "%s: lane %d of warp %d reads lane %d, which is not in the mask "
                             "0x%08x (the value is undefined on a GPU)", op_name(g.op), l,
                             f->warp, src, g.mask);
            r = g.val[src];
            break;
        case W_BALLOT: r = ballot; break;
        case W_ANY: r = ballot != 0; break;
        case W_ALL: r = ballot == g.mask; break;
        case W_RADD: r = radd; break;
        case W_RMIN: r = is_signed ? (uint32_t)smin : rmin; break;
        case W_RMAX: r = is_signed ? (uint32_t)smax : rmax; break;
        case W_TREE_FSUM: case W_TREE_FMAX: case W_TREE_DSUM: r = tree[l]; break;
        case W_MATCH_ANY: {
            unsigned m = 0;
            for (int j = 0; j < 32; j++)
                if ((g.mask & (1u << j)) && g.val[j] == g.val[l]) m |= 1u << j;
            r = m;
            break;
        }
        default: break;
        }
        o->result = r;
        all |= r;
    }
    (void)all;
}

/* warp_op's checks, out of line: the hot path's frame stays small, and it
 * is what every parked lane's stack holds while 31 others run. */
[[noreturn]] static __attribute__((noinline, cold)) void bad_call(fiber *f, warp_op_kind op,
                                                                  unsigned mask, int width,
                                                                  const char *site)
{
    char tb[96];
    const warp_state &ws = f->blk->warps[f->warp];
    if (!(mask & (1u << f->lane)))
        fault(f, "%s at %s: %s calls it with mask 0x%08x, which does not name its own lane",
                     op_name(op), site, tname(f, tb, sizeof tb), mask);
    if (mask & ~ws.exists)
        fault(f, "%s at %s: mask 0x%08x names lanes 0x%08x that do not exist (warp %d has "
                     "%d threads)", op_name(op), site, mask, mask & ~ws.exists, f->warp,
                     __builtin_popcount(ws.exists));
    if (mask & ws.exited)
        fault(f, "%s at %s: mask 0x%08x names lanes 0x%08x that have exited", op_name(op),
                     site, mask, mask & ws.exited);
    fault(f, "%s at %s: width %d is not a power of two in [1, 32]", op_name(op), site, width);
}

[[noreturn]] static __attribute__((noinline, cold)) void divergent(fiber *f, warp_op_kind op,
                                                                   unsigned mask, int width,
                                                                   const char *site,
                                                                   const warp_group &c)
{
    fault(f, "divergent warp collectives in warp %d: lane %d calls %s at %s with mask 0x%08x "
             "(width %d) while lanes 0x%08x wait in %s at %s with mask 0x%08x (width %d)",
          f->warp, f->lane, op_name(op), site, mask, width, c.arrived, op_name(c.op), c.site,
          c.mask, c.width);
}

/* The last lane of g has arrived: every lane's result, g retired, the others
 * released. */
static __attribute__((noinline)) void finish_group(fiber *f, warp_state &ws, warp_group *g)
{
    complete(f, *g);
    int ids[32], n_ids = 0;
    for (int l = 0; l < 32; l++)
        if ((g->mask & (1u << l)) && l != f->lane) ids[n_ids++] = f->warp * 32 + l;
    for (size_t i = 0; i < ws.pending.size(); i++)
        if (&ws.pending[i] == g) { ws.pending.erase(ws.pending.begin() + (long)i); break; }
    release_fibers(f->blk, ids, n_ids);
}

uint64_t warp_op(warp_op_kind op, unsigned mask, uint64_t v, int arg, int width, int vbytes,
                 const char *site)
{
    fiber *f = current(op_name(op));
    warp_state &ws = f->blk->warps[f->warp];
    const unsigned bit = 1u << f->lane;
    (void)vbytes;
    if (!(mask & bit) || (mask & (~ws.exists | ws.exited)) || (op <= W_XOR && !pow2_width(width)))
        bad_call(f, op, mask, width, site);
    warp_group *g = nullptr;
    for (warp_group &c : ws.pending)
        if (c.mask & mask) {
            if (c.mask != mask || c.op != op || c.width != width || !same_site(c.site, site))
                divergent(f, op, mask, width, site, c);
            g = &c;
            break;
        }
    if (!g) {
        g = &ws.pending.emplace_back();   /* in place: no 400-byte temporary in the frame */
        g->mask = mask, g->arrived = 0, g->op = op, g->width = width, g->site = site;
    }
    g->val[f->lane] = v;
    g->arg[f->lane] = arg;
    g->arrived |= bit;
    tsan_release(&ws.sync);
    if (g->arrived == mask) {
        finish_group(f, ws, g);
        tsan_acquire(&ws.sync);
        return f->result;
    }
    f->st = F_WAIT_WARP;
    f->site = site;
    f->op = op;
    park(f);
    tsan_acquire(&ws.sync);
    return f->result;
}

}  // namespace hkv_emu

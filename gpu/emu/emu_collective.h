/* A warp collective whose operation needs every lane's arguments at once
 * (WMMA's load/store/mma in emu_wmma.h; mma.sync and ldmatrix in
 * emu_mma.h): each lane records its call in a per-warp table; the last lane
 * to arrive performs the operation for the whole warp, and then all meet in
 * a __syncwarp-like collective of the block scheduler (emu_block.cc), so no
 * lane reads a result before it exists and a lane that calls another
 * collective meanwhile is a divergence fault there.
 *
 * Call needs `const char *file; int line; int op;` (lanes at different call
 * sites or ops fault) and is copied into the table; perform(calls[32], warp)
 * runs once per warp-wide call on the last lane's fiber. */
#ifndef HKV_EMU_COLLECTIVE_H
#define HKV_EMU_COLLECTIVE_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "emu_device.h"

namespace hkv_emu {

[[noreturn]] inline void faultf(const char *f, ...) __attribute__((format(printf, 1, 2)));
inline void faultf(const char *f, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    kernel_fault(buf);
}

template <class Call> struct warp_table {
    uint64_t serial = 0;     /* the block run this state belongs to */
    unsigned arrived = 0;
    Call lane[32];
};

/* name(op): the operation's name for reports. */
template <class Call, class Perform>
inline void warp_collective(const Call &call, const char *(*name)(int), Perform perform)
{
    static thread_local std::vector<warp_table<Call>> table;   /* per worker thread: its running block */
    const thread_view *t = current_thread();
    const block_view *bv = t->block;
    const int lin = (int)(t->idx.x + t->idx.y * bv->dim.x + t->idx.z * bv->dim.x * bv->dim.y);
    const int warp = lin / 32, lane = lin % 32;
    if (table.size() <= (size_t)warp) table.resize((size_t)warp + 1);
    warp_table<Call> &w = table[warp];
    if (w.serial != bv->serial) w.serial = bv->serial, w.arrived = 0;
    const unsigned live = active_mask();
    if (live != 0xffffffffu)
        faultf("%s at %s:%d: warp %d has lanes 0x%08x exited or missing; it needs all 32 lanes",
               name(call.op), call.file, call.line, warp, ~live);
    if (w.arrived) {
        const Call &f = w.lane[__builtin_ctz(w.arrived)];
        if (f.op != call.op || f.line != call.line || strcmp(f.file, call.file))
            faultf("divergent calls in warp %d: lane %d calls %s at %s:%d while lanes "
                   "0x%08x wait in %s at %s:%d", warp, lane, name(call.op), call.file, call.line,
                   w.arrived, name(f.op), f.file, f.line);
    }
    w.lane[lane] = call;
    w.arrived |= 1u << lane;
    if (w.arrived == 0xffffffffu) {
        w.arrived = 0;
        perform(w.lane, warp);
    }
    /* the others park here until the last lane has performed the operation */
    warp_op(W_SYNC, 0xffffffffu, 0, 0, 32, 0, name(call.op));
}

}  // namespace hkv_emu

#endif

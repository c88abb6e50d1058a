/* Work split over an OpenMP team with stealing at the end.
 *
 * A static split (thread i takes units [n i / nt, n (i+1) / nt)) keeps each
 * thread on its own contiguous bytes, but the region ends with the slower
 * thread: on the 2-core VMs two equal halves of a batch-1 product finish
 * microseconds apart (the cores' share of the memory bandwidth moves), and
 * the faster one spins at the join; perf put that spin at 3-4% of each
 * thread's decode time (bench/cpu_kernels.md). Here each thread still walks
 * its own range front to back in chunks, and a thread whose range is done
 * takes chunks from the back of the others' ranges, so the two finish within
 * a chunk of each other. A range's front and back share one 64-bit word
 * (front in the low half): the owner's claim and a thief's are one CAS each,
 * on the owner's own cache line until a thief arrives. The units a thread
 * computes differ from run to run, never what each unit computes: results
 * stay bit-identical to the static split's. */
#ifndef HKV_CPU_WORK_SPLIT_H
#define HKV_CPU_WORK_SPLIT_H

#include <stdatomic.h>
#include <stdint.h>

/* One thread's range, on a cache line of its own. */
typedef struct hkv_split_range {
    _Alignas(64) _Atomic uint64_t fb;   /* front | (uint64_t)back << 32 */
} hkv_split_range;

/* nt ranges over n units (n < 2^32), set before the parallel region (whose
 * start orders them before any claim). nt may exceed the team: a range no
 * thread owns is taken by the others' stealing. */
static inline void hkv_split_init(hkv_split_range *r, int nt, int64_t n)
{
    for (int i = 0; i < nt; i++) {
        const uint64_t a = (uint64_t)(n * i / nt), b = (uint64_t)(n * (i + 1) / nt);
        atomic_store_explicit(&r[i].fb, a | b << 32, memory_order_relaxed);
    }
}

/* The next chunk of at most c units for thread me (< nt) into [*a, *b): its
 * own range's front first, then the back of the others' (from me + 1 on).
 * 0 when every range is empty. */
static inline int hkv_split_next(hkv_split_range *r, int me, int nt, int64_t c, int64_t *a,
                                 int64_t *b)
{
    uint64_t v = atomic_load_explicit(&r[me].fb, memory_order_acquire);
    for (;;) {
        const uint64_t f = v & 0xffffffffu, e = v >> 32;
        if (f >= e) break;
        const uint64_t nf = e - f > (uint64_t)c ? f + (uint64_t)c : e;
        if (atomic_compare_exchange_weak_explicit(&r[me].fb, &v, nf | e << 32,
                                                  memory_order_acq_rel, memory_order_acquire)) {
            *a = (int64_t)f, *b = (int64_t)nf;
            return 1;
        }
    }
    for (int k = 1; k < nt; k++) {
        hkv_split_range *o = &r[(me + k) % nt];
        v = atomic_load_explicit(&o->fb, memory_order_acquire);
        for (;;) {
            const uint64_t f = v & 0xffffffffu, e = v >> 32;
            if (f >= e) break;
            const uint64_t ne = e - f > (uint64_t)c ? e - (uint64_t)c : f;
            if (atomic_compare_exchange_weak_explicit(&o->fb, &v, f | ne << 32,
                                                      memory_order_acq_rel, memory_order_acquire)) {
                *a = (int64_t)ne, *b = (int64_t)e;
                return 1;
            }
        }
    }
    return 0;
}

#endif

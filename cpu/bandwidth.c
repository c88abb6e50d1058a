/* Memory-bandwidth probe: every OpenMP thread streams (read only) its own
 * slice of a buffer it first-touched itself (so pages sit on its NUMA node),
 * best of reps. The read loop is the widest this CPU runs, so the figure is
 * the ceiling the memory-bound kernels are compared against. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "host_mem.h"
#include "kernels_impl.h"

typedef double (*stream_read_fn)(const void *buf, size_t bytes);

static stream_read_fn pick_reader(void)
{
    hkv_isa_info info;
    hkv_isa_detect(&info);
#if defined(__x86_64__)
    if (info.best >= HKV_ISA_AVX512) return hkv_stream_read_avx512;
    if (info.best >= HKV_ISA_AVX2) return hkv_stream_read_avx2;
#endif
    return hkv_stream_read_scalar;
}

double hkv_bandwidth_probe(size_t bytes, int reps)
{
    const int nt = omp_get_max_threads();
    const size_t slice = bytes / (size_t)nt / 4096 * 4096;   /* page-aligned slices */
    if (slice == 0) return 0.0;
    if (reps < 1) reps = 1;
    const size_t total = slice * (size_t)nt;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 2u << 20, total) != 0) return 0.0;
    /* The same huge pages as the runtime's buffers (host_mem.c): the probe
     * is the ceiling they are measured against. */
    hkv_host_advise_huge(buf, total);
    stream_read_fn reader = pick_reader();

    #pragma omp parallel num_threads(nt)
    memset(buf + (size_t)omp_get_thread_num() * slice, 1, slice);

    double best = 0.0, sink = 0.0;
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
        #pragma omp parallel num_threads(nt) reduction(+ : sink)
        sink += reader(buf + (size_t)omp_get_thread_num() * slice, slice);
        double dt = omp_get_wtime() - t0;
        if (dt > 0 && (best == 0.0 || dt < best)) best = dt;
    }
    free(buf);
    /* The reads must not be optimised away: the sum escapes through a
     * volatile. (Its value wraps in 64-bit lanes, so no test on its sign:
     * that returned 0 on a 16-thread machine.) */
    volatile double keep = sink;
    (void)keep;
    return best > 0.0 ? (double)total / best : 0.0;
}

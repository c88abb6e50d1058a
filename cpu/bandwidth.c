/* Memory-bandwidth probe: every OpenMP thread streams (read only) its own
 * slice of a buffer it first-touched itself (so pages sit on its NUMA node),
 * best of reps. The read loop is the widest this CPU runs, so the figure is
 * the ceiling the memory-bound kernels are compared against. */
#include <omp.h>
#include <stdint.h>
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

/* One thread's gather over its slice: every row of pos[0..n) (ascending),
 * one 8-byte word of each of its cache lines summed, the row 64 ahead
 * prefetched to L2. */
static uint64_t gather_rows(const char *base, const int32_t *pos, int64_t n, int row_bytes)
{
    uint64_t s = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i + 64 < n) {
            const char *f = base + (size_t)pos[i + 64] * (size_t)row_bytes;
            for (int o = 0; o < row_bytes; o += 64) __builtin_prefetch(f + o, 0, 2);
        }
        const char *r = base + (size_t)pos[i] * (size_t)row_bytes;
        for (int o = 0; o < row_bytes; o += 64) {
            uint64_t w;
            memcpy(&w, r + o, sizeof w);
            s += w;
        }
    }
    return s;
}

double hkv_gather_probe(size_t bytes, int row_bytes, int reps)
{
    const int nt = omp_get_max_threads();
    if (row_bytes < 64 || row_bytes % 64) return 0.0;
    const size_t slice = bytes / (size_t)nt / (2u << 20) * (2u << 20);
    const int64_t rows = (int64_t)(slice / (size_t)row_bytes);
    if (rows < 1024 || rows > INT32_MAX) return 0.0;
    if (reps < 1) reps = 1;
    const size_t total = slice * (size_t)nt;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 2u << 20, total) != 0) return 0.0;
    hkv_host_advise_huge(buf, total);
    int32_t *pos = malloc((size_t)(rows / 8 + 1) * sizeof *pos);
    if (!pos) {
        free(buf);
        return 0.0;
    }
    /* each row with probability 1/8, ascending (the gaps as a rerank's) */
    uint64_t z = 0x9e3779b97f4a7c15ull;
    int64_t n = 0;
    for (int64_t r = 0; r < rows && n < rows / 8; r++) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        if ((z >> 29) % 8 == 0) pos[n++] = (int32_t)r;
    }
    #pragma omp parallel num_threads(nt)
    memset(buf + (size_t)omp_get_thread_num() * slice, 1, slice);
    double best = 0.0;
    uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = omp_get_wtime();
        #pragma omp parallel num_threads(nt) reduction(+ : sink)
        sink += gather_rows(buf + (size_t)omp_get_thread_num() * slice, pos, n, row_bytes);
        double dt = omp_get_wtime() - t0;
        if (dt > 0 && (best == 0.0 || dt < best)) best = dt;
    }
    free(pos);
    free(buf);
    volatile uint64_t keep = sink;
    (void)keep;
    return best > 0.0 ? (double)n * row_bytes * nt / best : 0.0;
}

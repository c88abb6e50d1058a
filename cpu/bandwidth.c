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

/* What a probe reads in its slice (one thread's part of the buffer): a sum,
 * so that the reads cannot be optimised away. */
typedef double (*probe_read_fn)(const char *slice, size_t bytes, const void *arg);

/* Both probes: nt slices of `slice` bytes (huge-page advised, as the
 * runtime's buffers, host_mem.c: the probes are the ceilings those are
 * measured against), each first-touched and then read by its own thread;
 * the seconds of the fastest of reps passes, 0 on failure. */
static double probe_best_s(size_t slice, int nt, int reps, probe_read_fn read, const void *arg)
{
    const size_t total = slice * (size_t)nt;
    char *buf = NULL;
    if (slice == 0 || posix_memalign((void **)&buf, 2u << 20, total) != 0) return 0.0;
    hkv_host_advise_huge(buf, total);
    #pragma omp parallel num_threads(nt)
    memset(buf + (size_t)omp_get_thread_num() * slice, 1, slice);
    double best = 0.0, sink = 0.0;
    for (int r = 0; r < (reps < 1 ? 1 : reps); r++) {
        double t0 = omp_get_wtime();
        #pragma omp parallel num_threads(nt) reduction(+ : sink)
        sink += read(buf + (size_t)omp_get_thread_num() * slice, slice, arg);
        double dt = omp_get_wtime() - t0;
        if (dt > 0 && (best == 0.0 || dt < best)) best = dt;
    }
    free(buf);
    /* The sum escapes through a volatile. (Its value wraps in 64-bit lanes,
     * so no test on its sign: that returned 0 on a 16-thread machine.) */
    volatile double keep = sink;
    (void)keep;
    return best;
}

static double read_stream(const char *slice, size_t bytes, const void *arg)
{
    return (*(const stream_read_fn *)arg)(slice, bytes);
}

double hkv_bandwidth_probe(size_t bytes, int reps)
{
    const int nt = omp_get_max_threads();
    const size_t slice = bytes / (size_t)nt / 4096 * 4096;   /* page-aligned slices */
    const stream_read_fn reader = pick_reader();
    const double s = probe_best_s(slice, nt, reps, read_stream, &reader);
    return s > 0.0 ? (double)(slice * (size_t)nt) / s : 0.0;
}

typedef struct gather_arg {
    const int32_t *pos;
    int64_t n;
    int row_bytes;
} gather_arg;

/* One thread's gather over its slice: every row of pos[0..n) (ascending),
 * one 8-byte word of each of its cache lines summed, the row 64 ahead
 * prefetched to L2. */
static double read_gather(const char *base, size_t bytes, const void *arg)
{
    const gather_arg *g = arg;
    const size_t rb = (size_t)g->row_bytes;
    uint64_t s = 0;
    (void)bytes;
    for (int64_t i = 0; i < g->n; i++) {
        if (i + 64 < g->n) {
            const char *f = base + (size_t)g->pos[i + 64] * rb;
            for (size_t o = 0; o < rb; o += 64) __builtin_prefetch(f + o, 0, 2);
        }
        const char *r = base + (size_t)g->pos[i] * rb;
        for (size_t o = 0; o < rb; o += 64) {
            uint64_t w;
            memcpy(&w, r + o, sizeof w);
            s += w;
        }
    }
    return (double)s;
}

double hkv_gather_probe(size_t bytes, int row_bytes, int reps)
{
    const int nt = omp_get_max_threads();
    if (row_bytes < 64 || row_bytes % 64) return 0.0;
    const size_t slice = bytes / (size_t)nt / (2u << 20) * (2u << 20);
    const int64_t rows = (int64_t)(slice / (size_t)row_bytes);
    if (rows < 1024 || rows > INT32_MAX) return 0.0;
    int32_t *pos = malloc((size_t)(rows / 8 + 1) * sizeof *pos);
    if (!pos) return 0.0;
    /* each row with probability 1/8, ascending (the gaps as a rerank's) */
    uint64_t z = 0x9e3779b97f4a7c15ull;
    int64_t n = 0;
    for (int64_t r = 0; r < rows && n < rows / 8; r++) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        if ((z >> 29) % 8 == 0) pos[n++] = (int32_t)r;
    }
    const gather_arg g = {pos, n, row_bytes};
    const double s = probe_best_s(slice, nt, reps, read_gather, &g);
    free(pos);
    return s > 0.0 ? (double)n * row_bytes * nt / s : 0.0;
}

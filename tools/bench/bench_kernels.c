/* hkv-bench-kernels: speed of the host kernels next to a memory-bandwidth
 * probe measured in the same run (DESIGN.md, performance model).
 *
 *   hetkv bench kernels [--isa scalar|avx2|avx2-novnni|avx512] [--quick] [--hot] [--cpu-time]
 *   (also built as the standalone hkv-bench-kernels; --device cuda: the gpu/
 *   kernels instead, bench_gpu.c)
 *
 * Memory-bound kernels are measured cold: each call works on the next of
 * several copies of its data (weights, or per-layer KV caches) totalling
 * more than ~1 GiB, so bytes come from DRAM as in a real decode step that
 * walks all layers. --hot instead keeps one copy (GEMV) and 2048-row caches
 * (score_max, attn_sparse) in cache: the kernels' compute speed.
 * --cpu-time times by process CPU time / threads instead of wall time: on a
 * shared machine this discounts time the scheduler gave to other processes
 * (meaningful with OMP_NUM_THREADS=1; with more threads it counts spinning).
 * Figures: GB/s of weight or K/V bytes touched (1e9), GFLOP/s for
 * compute-bound kernels; each the best of several trials. A compute probe
 * (hkv_compute_peak: int8, bf16, fp32 dot products on all threads) runs
 * beside the bandwidth probe, and the products print "roof%": the measured
 * time against the roofline at that shape, max(bytes / probe, ops / peak of
 * the family the kernel uses), whichever binds. */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "far_rows.h"
#include "host_mem.h"
#include "kernels.h"
#include "kernels_impl.h"
#include "peak.h"
#include "bench_kernels.h"
#include "cli.h"
#include "bench_gpu.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* The benchmark's settings, fixed by the command line. */
typedef struct bk {
    size_t cold_bytes;      /* data rotated through per measurement (1: hot) */
    double trial_seconds;   /* one timed trial */
    int trials;             /* best of: filters out other load */
    int use_cpu_time;
    int64_t cache_rows;     /* rows of one K (or V) cache in the sparse benchmarks */
} bk;

static double now(const bk *b)
{
    if (!b->use_cpu_time) return omp_get_wtime();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (ts.tv_sec + 1e-9 * ts.tv_nsec) / omp_get_max_threads();
}

/* Runs step(ctx) (one unit of work) repeatedly; returns the best over
 * `trials` trials of units per second. */
static double best_rate(const bk *b, void (*step)(void *ctx), void *ctx)
{
    double best = 0;
    step(ctx);   /* warm-up */
    for (int t = 0; t < b->trials; t++) {
        long units = 0;
        double t0 = now(b), dt;
        do {
            step(ctx);
            units++;
            dt = now(b) - t0;
        } while (dt < b->trial_seconds);
        if (units / dt > best) best = units / dt;
    }
    return best;
}

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    return z ^ (z >> 27);
}

/* Random fp16 in +-[0.5, 1) (no subnormals: they would slow some paths). */
static void fill_half(uint16_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 4) {
        uint64_t r = mix(&seed);
        for (size_t j = i; j < i + 4 && j < n; j++, r >>= 16)
            p[j] = (uint16_t)((r & 0x83ff) | 0x3800);
    }
}

static void fill_bytes(uint8_t *p, size_t n, uint64_t seed)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t r = mix(&seed);
        memcpy(p + i, &r, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)mix(&seed);
}

static void *xalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, bytes ? bytes : 64) != 0) {
        fprintf(stderr, "hkv-bench-kernels: cannot allocate %.2f GiB\n", bytes / GIB);
        exit(1);
    }
    hkv_host_advise_huge(p, bytes);   /* the pages the runtime's buffers and the probe get */
    return p;
}

/* ---- GEMV -------------------------------------------------------------- */

/* Weights of one matrix shape laid out `copies` times in one buffer. */
typedef struct {
    hkv_wmat *m;
    int copies;
    void *q;
    uint16_t *scale, *min;
    hkv_wmat *mp;   /* wset_pack: the same copies interleaved for a fast table */
    void *pq;
} wset;

static void wset_make(size_t cold_bytes, wset *s, int type, int64_t rows, int64_t cols)
{
    hkv_wmat one = {type, rows, cols, NULL, NULL, NULL, 0};
    *s = (wset){0};   /* wset_free frees the packed twins only wset_pack makes */
    size_t bytes = hkv_wmat_bytes(&one);
    s->copies = (int)((cold_bytes + bytes - 1) / bytes);
    size_t n = (size_t)rows * cols, nb = n / HKV_WBLOCK;
    size_t qb = type == HKV_W_F16 ? 2 * n : type == HKV_W_Q8 ? n : n / 2;
    s->q = xalloc(qb * s->copies);
    s->scale = type >= HKV_W_Q8 ? xalloc(2 * nb * s->copies) : NULL;
    s->min = type == HKV_W_Q4 ? xalloc(2 * nb * s->copies) : NULL;
    if (type == HKV_W_F16) fill_half(s->q, n * s->copies, 1);
    else fill_bytes(s->q, qb * s->copies, 1);
    if (s->scale) fill_half(s->scale, nb * s->copies, 2);
    if (s->min) fill_half(s->min, nb * s->copies, 3);
    s->m = malloc(s->copies * sizeof *s->m);
    for (int c = 0; c < s->copies; c++)
        s->m[c] = (hkv_wmat){type, rows, cols, (char *)s->q + qb * c,
                             s->scale ? s->scale + nb * c : NULL, s->min ? s->min + nb * c : NULL, 0};
}

/* The copies in the interleaved layout the fast table's qgemm reads
 * (hkv_wmat_pack, what hkv_engine_open makes for it), one buffer. */
static void wset_pack(wset *s, int g)
{
    const size_t pb = (hkv_wmat_pack_bytes(&s->m[0], g) + 63) & ~(size_t)63;
    s->pq = xalloc(pb * s->copies);
    s->mp = malloc(s->copies * sizeof *s->mp);
    for (int c = 0; c < s->copies; c++) hkv_wmat_pack(&s->m[c], g, (char *)s->pq + pb * c, &s->mp[c]);
}

static void wset_free(wset *s)
{
    free(s->q);
    free(s->scale);
    free(s->min);
    free(s->m);
    free(s->pq);
    free(s->mp);
}

typedef struct {
    const hkv_cpu_kernels *t;
    const wset *s;
    const float *x;
    float *y;
    int n;
    float *ws;   /* NULL for the exact GEMV rows; the workspace for precision fast */
    int packed;  /* the copies' interleaved twins (wset_pack) */
} gemv_ctx;

/* one pass over every copy of the weights */
static void gemv_step(void *p)
{
    gemv_ctx *g = p;
    const hkv_wmat *m = g->packed ? g->s->mp : g->s->m;
    for (int c = 0; c < g->s->copies; c++) hkv_matmul(g->t, &m[c], g->x, g->n, g->y, g->ws);
}

/* Roofline percentage of a product that took dt seconds: the larger of
 * its bytes over the bandwidth probe and its ops over the compute peak,
 * against dt. */
static double roof_pct(double bytes, double ops, double probe_gbs, double peak_ops, double dt)
{
    double tb = probe_gbs > 0 ? bytes / (probe_gbs * 1e9) : 0, tc = peak_ops > 0 ? ops / peak_ops : 0;
    return 100 * (tb > tc ? tb : tc) / dt;
}

static void bench_gemv(const bk *b, const hkv_cpu_kernels *t, double probe, const hkv_peak *pk)
{
    const int64_t shapes[][2] = {{576, 1536}, {4096, 4096}, {4096, 14336}};
    const int types[] = {HKV_W_Q4, HKV_W_Q8, HKV_W_F16};
    const char *names[] = {"f32", "f16", "q8", "q4"};
    printf("\nGEMV through hkv_matmul (%d threads), %s weights\n", omp_get_max_threads(),
           b->cold_bytes > 1 ? "cold" : "hot");
    printf("%-5s %13s %2s %10s %9s %8s %7s\n", "type", "rows x cols", "n", "us/call", "GB/s", "probe%",
           "roof%");
    for (unsigned si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (unsigned ti = 0; ti < 3; ti++) {
            wset s;
            wset_make(b->cold_bytes, &s, types[ti], shapes[si][0], shapes[si][1]);
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            float *x = xalloc(8 * cols * sizeof *x), *y = xalloc(8 * rows * sizeof *y);
            for (int64_t i = 0; i < 8 * cols; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
            for (int n = 1; n <= 8; n += 7) {
                gemv_ctx g = {t, &s, x, y, n, NULL, 0};
                double sweeps = best_rate(b, gemv_step, &g);   /* passes over all copies */
                double calls = sweeps * s.copies;
                double gbs = hkv_wmat_bytes(&s.m[0]) * calls / 1e9;
                printf("%-5s %6lldx%-6lld %2d %10.1f %9.2f %7.0f%% %6.0f%%\n", names[types[ti]], (long long)rows,
                       (long long)cols, n, 1e6 / calls, gbs, 100 * gbs / probe,
                       roof_pct(hkv_wmat_bytes(&s.m[0]), 2.0 * n * rows * cols, probe, pk->fp32_flops, 1 / calls));
            }
            free(x);
            free(y);
            wset_free(&s);
        }
}

/* ---- batched decode: precision fast (int8 activations) beside exact ------- */

/* hkv_matmul on the same weights and activations in both precisions, the
 * two timed alternately per n so machine noise hits both alike. roof% of the
 * exact path against fp32 FMA, of fast against vpdpbusd (int8). */
static void bench_qmm(const bk *b, const hkv_cpu_kernels *t0, double probe, const hkv_peak *pk, int quick)
{
    hkv_cpu_kernels te = *t0, tf = *t0;
    hkv_cpu_kernels_set_precision(&te, HKV_PREC_EXACT);
    if (hkv_cpu_kernels_set_precision(&tf, HKV_PREC_FAST) != HKV_PREC_FAST) {
        printf("\nBatched matmul, precision fast: not on this table (%s; needs AVX512-VNNI)\n",
               hkv_isa_name(t0->isa));
        return;
    }
    /* the last: SmolLM2's output head (Q8 in its GGUF; --quick times q8 on the first shape only) */
    const int64_t shapes[][2] = {{4096, 4096}, {1536, 576}, {576, 1536}, {49152, 576}};
    const int types[] = {HKV_W_Q4, HKV_W_Q8};
    const int ns[] = {1, 8, 32, 64};
    const int g = tf.qgemm_pack;
    printf("\nBatched matmul (hkv_matmul), exact (fp32 activations) vs fast (int8 activations, vpdpbusd),\n"
           "%d threads, n = 1 %s weights, n >= 8 hot; GOP/s = 2 n rows cols / time; roof%% against bandwidth or the\n"
           "family's peak (exact: fp32 %.0f GFLOP/s, fast: int8 %.0f GOP/s), whichever binds; fast on the weights\n"
           "%s; rows us: fast on the rows layout, alternated with it\n",
           omp_get_max_threads(), b->cold_bytes > 1 ? "cold" : "hot", pk->fp32_flops / 1e9, pk->int8_ops / 1e9,
           g ? "interleaved at load as the engine runs it (hkv_wmat_pack)" : "in rows (this table reads no other layout)");
    printf("%-5s %13s %2s | %10s %8s %6s | %10s %8s %6s %6s | %7s | %10s\n", "type", "rows x cols", "n", "exact us",
           "GOP/s", "roof%", "fast us", "GOP/s", "roof%", "int8%", "speedup", "rows us");
    for (unsigned si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (unsigned ti = 0; ti < 2; ti++) {
            if (quick && si > 0 && ti > 0) continue;
            /* n = 1 reads its weights (cold: from DRAM, as in a step over all
             * layers); n >= 8 is compute-bound, one copy (a cold pass over
             * 1 GiB at n = 64 would take seconds per trial) */
            wset sc, sh;
            wset_make(b->cold_bytes, &sc, types[ti], shapes[si][0], shapes[si][1]);
            wset_make(1, &sh, types[ti], shapes[si][0], shapes[si][1]);
            if (g) wset_pack(&sc, g), wset_pack(&sh, g);
            const int64_t rows = shapes[si][0], cols = shapes[si][1];
            float *x = xalloc(64 * cols * sizeof *x), *y = xalloc(64 * rows * sizeof *y);
            float *ws = xalloc(hkv_matmul_ws_floats(&sh.m[0]) * sizeof(float));
            for (int64_t i = 0; i < 64 * cols; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
            for (unsigned ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                const int n = ns[ni];
                const wset *s = n == 1 ? &sc : &sh;
                gemv_ctx ce = {&te, s, x, y, n, ws, 0}, cf = {&tf, s, x, y, n, ws, g > 0}, cr = {&tf, s, x, y, n, ws, 0};
                double re = 0, rf = 0, rr = 0;
                for (int rep = 0; rep < 2; rep++) {   /* alternate: exact, fast, fast on rows, ... */
                    double a = best_rate(b, gemv_step, &ce), c = best_rate(b, gemv_step, &cf);
                    double r = g ? best_rate(b, gemv_step, &cr) : c;
                    if (a > re) re = a;
                    if (c > rf) rf = c;
                    if (r > rr) rr = r;
                }
                const double ops = 2.0 * n * rows * cols, bytes = (double)hkv_wmat_bytes(&s->m[0]);
                const double de = 1 / (re * s->copies), df = 1 / (rf * s->copies), dr = 1 / (rr * s->copies);
                printf("%-5s %6lldx%-6lld %2d | %10.1f %8.1f %5.0f%% | %10.1f %8.1f %5.0f%% %5.0f%% | %6.2fx | %10.1f\n",
                       types[ti] == HKV_W_Q4 ? "q4" : "q8", (long long)rows, (long long)cols, n, de * 1e6,
                       ops / de / 1e9, roof_pct(bytes, ops, probe, pk->fp32_flops, de), df * 1e6, ops / df / 1e9,
                       roof_pct(bytes, ops, probe, pk->int8_ops, df),
                       pk->int8_ops > 0 ? 100 * ops / df / pk->int8_ops : 0, de / df, dr * 1e6);
            }
            free(x);
            free(y);
            free(ws);
            wset_free(&sc);
            wset_free(&sh);
        }
}

/* ---- prefill matmul ------------------------------------------------------ */

typedef struct {
    const hkv_cpu_kernels *t;
    const hkv_wmat *w;
    const float *x;
    int64_t n;
    float *y, *ws;
    int mode;
} mm_ctx;

static void mm_step(void *p)
{
    mm_ctx *c = p;
    hkv_matmul_mode(c->t, c->w, c->x, c->n, c->y, c->ws, c->mode);
}

static void bench_matmul(const bk *b, const hkv_cpu_kernels *t, int quick)
{
    const int64_t shapes[][2] = {{1536, 576}, {576, 1536}, {4096, 4096}, {14336, 4096}, {4096, 14336}};
    const int64_t n = 512;
    printf("\nPrefill matmul, n = %lld tokens, Q4 weights, %d threads (GFLOP/s)\n", (long long)n,
           omp_get_max_threads());
    printf("%13s %14s %14s\n", "rows x cols", "shared-panel", "thread-panel");
    for (unsigned si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        if (quick && si >= 3) break;
        wset s;
        wset_make(1, &s, HKV_W_Q4, shapes[si][0], shapes[si][1]);   /* compute-bound: one copy */
        int64_t rows = shapes[si][0], cols = shapes[si][1];
        float *x = xalloc(n * cols * sizeof *x), *y = xalloc(n * rows * sizeof *y);
        for (int64_t i = 0; i < n * cols; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
        printf("%6lldx%-6lld", (long long)rows, (long long)cols);
        for (int mode = HKV_MM_SHARED_PANEL; mode <= HKV_MM_THREAD_PANEL; mode++) {
            float *ws = xalloc(hkv_matmul_mode_ws_floats(&s.m[0], mode) * sizeof(float));
            mm_ctx c = {t, &s.m[0], x, n, y, ws, mode};
            double calls = best_rate(b, mm_step, &c);
            printf(" %14.1f", 2.0 * n * rows * cols * calls / 1e9);
            free(ws);
        }
        printf("\n");
        free(x);
        free(y);
        wset_free(&s);
    }
}

/* ---- rerank and sparse attention ---------------------------------------- */


typedef struct {
    const hkv_cpu_kernels *t;
    const uint16_t *kv;
    const int32_t *idx;
    const float *q;
    int ncache, d, g;
    int64_t n;
    int kern, nt;
    int64_t cache_rows;
    int64_t *pass;   /* dense: the window moves each pass, so its rows stay cold */
    const int8_t *c8;     /* kern 3: the same caches as the 8-bit far tier's codes */
    const float *s8;      /* and their scales */
    const uint8_t *c4;    /* kern 4: the same keys as ctkvr's 4-bit sketches */
    const float *s4;      /* and their scales */
} sparse_ctx;

/* one pass over all caches: each thread walks its own subset, as threads
 * serving different (sequence, KV head) pairs would */
static void sparse_step(void *p)
{
    const sparse_ctx *c = p;
    const int64_t windows = c->n <= c->cache_rows ? c->cache_rows / c->n : 1, w = (*c->pass)++;
    #pragma omp parallel num_threads(c->nt)
    {
        float out[8 * 128], lse[8], s[8192];
        int me = omp_get_thread_num();
        for (int i = me; i < c->ncache; i += c->nt) {
            const uint16_t *k = c->kv + (size_t)i * 2 * c->cache_rows * c->d;
            const uint16_t *v = k + (size_t)c->cache_rows * c->d;
            if (c->kern == 0) c->t->score_max(c->q, c->g, c->d, k, c->d, c->idx, c->n, s);
            else if (c->kern == 4) {   /* score_max_i4 over the keys' sketches */
                const int ng = c->d / 32;
                c->t->score_max_i4(c->q, c->g, c->d, c->c4 + (size_t)i * c->cache_rows * (c->d / 2),
                                   c->d / 2, c->s4 + (size_t)i * c->cache_rows * ng, c->idx, c->n, s);
            } else if (c->kern == 3) {   /* attn_q8 over the codes of the same rows */
                const int ng = c->d / 32;
                const int8_t *k8 = c->c8 + (size_t)i * 2 * c->cache_rows * c->d;
                const float *ks = c->s8 + (size_t)i * 2 * c->cache_rows * ng;
                c->t->attn_q8(c->q, c->g, c->d, k8, ks, k8 + (size_t)c->cache_rows * c->d,
                              ks + (size_t)c->cache_rows * ng, c->d, c->idx, c->n, 0.088f, out, lse);
            } else if (c->kern == 1)
                c->t->attn_sparse(c->q, c->g, c->d, k, v, c->d, c->idx, c->n, 0.088f, out, lse);
            else {
                const int64_t r0 = (w + i) % windows * c->n;
                c->t->attn_dense(c->q, c->g, c->d, k + r0 * c->d, v + r0 * c->d, c->d, c->n, 0.088f,
                                 out, lse);
            }
        }
    }
}

static void bench_sparse(const bk *b, const hkv_cpu_kernels *t, double probe, int quick)
{
    const int64_t cache_rows = b->cache_rows;
    const size_t cold_bytes = b->cold_bytes;
    const int nthreads = omp_get_max_threads();
    printf("\nscore_max / attn_sparse over %lld-row fp16 caches, random idx, %s caches, and\n"
           "attn_dense over cand contiguous rows (a far tier read whole, as full decodes);\n"
           "1 thread, and %d threads each on its own caches (GB/s of K/V bytes touched);\n"
           "q8: attn_q8 over the same rows as the 8-bit far tier's codes, its speed over\n"
           "attn_sparse's in rows a second (its bytes are 0.56x); i4: score_max_i4 over the\n"
           "same keys as ctkvr's 4-bit sketches (sketch=3), its speed over score's\n"
           "in rows a second (its bytes are 0.31x)\n",
           (long long)cache_rows, cold_bytes > 1 ? "cold" : "hot", nthreads);
    printf("%3s %2s %5s | %9s %9s %7s | %9s %9s %7s | %9s %9s %7s | %6s %6s | %6s %6s\n", "d", "g",
           "cand", "score 1t", "score Nt", "probe%", "attn 1t", "attn Nt", "probe%", "dense 1t",
           "dense Nt", "probe%", "q8 1t", "q8 Nt", "i4 1t", "i4 Nt");
    const int ds[] = {64, 128};
    const int gs[] = {3, 4, 8};
    const int64_t cands[] = {256, 1024, 4096, 8192};
    for (int di = 0; di < 2; di++) {
        int d = ds[di];
        size_t cache_b = (size_t)cache_rows * d * 2;           /* K or V of one cache */
        int ncache = (int)(cold_bytes / (2 * cache_b));          /* "layers" rotated */
        if (ncache < 2 * nthreads) ncache = 2 * nthreads;
        uint16_t *kv = xalloc(2 * cache_b * ncache);
        #pragma omp parallel for schedule(static)
        for (int c = 0; c < ncache; c++) fill_half(kv + (size_t)c * 2 * cache_rows * d, 2 * (size_t)cache_rows * d, 100 + c);
        /* the same rows as int8 codes and scales (index/far_rows.h) */
        int8_t *c8 = xalloc((size_t)ncache * 2 * cache_rows * d);
        float *s8 = xalloc((size_t)ncache * 2 * cache_rows * (d / 32) * sizeof(float));
        /* and the keys as 4-bit sketches (index/ctkvr_sketch.c) */
        uint8_t *c4 = xalloc((size_t)ncache * cache_rows * (d / 2));
        float *s4 = xalloc((size_t)ncache * cache_rows * (d / 32) * sizeof(float));
        #pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < (int64_t)ncache * 2 * cache_rows; r++) {
            float x[128];
            t->f16_to_f32(kv + r * d, x, d);
            hkv_q8_quantize(x, d, c8 + r * d, s8 + r * (d / 32));
            const int64_t cache = r / (2 * cache_rows), row = r % (2 * cache_rows);
            if (row < cache_rows) {   /* K */
                const int64_t at = cache * cache_rows + row;
                hkv_q4_quantize(x, d, c4 + at * (d / 2), s4 + at * (d / 32));
            }
        }
        int32_t *idx = malloc(8192 * sizeof *idx);
        uint64_t seed = 9;
        for (int i = 0; i < 8192; i++) idx[i] = (int32_t)(mix(&seed) % cache_rows);
        float *q = malloc(8 * d * sizeof *q);
        for (int i = 0; i < 8 * d; i++) q[i] = (float)((i * 31) % 17) / 17.0f - 0.5f;

        for (unsigned gi = 0; gi < 3; gi++)
            for (unsigned ci = 0; ci < 4; ci++) {
                int g = gs[gi];
                int64_t n = cands[ci];
                if (quick && (g == 3 || n == 1024)) continue;
                double res[5][2] = {{0}};   /* [kernel][threads] GB/s (q8, i4: calls/s) */
                /* dense reads n contiguous rows: not past a (hot, 2048-row) cache */
                const int dense = n <= cache_rows;
                for (int kern = 0; kern < 2 + dense; kern++)
                    for (int par = 0; par < 2; par++) {
                        int64_t pass = 0;
                        sparse_ctx c = {t, kv, idx, q, ncache, d, g, n, kern, par ? nthreads : 1,
                                        cache_rows, &pass, c8, s8, c4, s4};
                        double calls = best_rate(b, sparse_step, &c) * ncache;
                        double bytes = (double)n * d * 2 * (kern ? 2 : 1);
                        res[kern][par] = bytes * calls / 1e9;
                    }
                printf("%3d %2d %5lld | %9.2f %9.2f %6.0f%% | %9.2f %9.2f %6.0f%% | ", d, g,
                       (long long)n, res[0][0], res[0][1], 100 * res[0][1] / probe, res[1][0],
                       res[1][1], 100 * res[1][1] / probe);
                for (int par = 0; par < 2; par++) {   /* attn_q8, calls a second */
                    int64_t pass = 0;
                    sparse_ctx c = {t, kv, idx, q, ncache, d, g, n, 3, par ? nthreads : 1,
                                    cache_rows, &pass, c8, s8, c4, s4};
                    res[3][par] = best_rate(b, sparse_step, &c) * ncache;
                    c.kern = 4, pass = 0;
                    res[4][par] = best_rate(b, sparse_step, &c) * ncache;
                }
                const double attn_gb = (double)n * d * 4 / 1e9;   /* attn_sparse's GB a call */
                if (dense) printf("%9.2f %9.2f %6.0f%% | ", res[2][0], res[2][1], 100 * res[2][1] / probe);
                else printf("%9s %9s %7s | ", "-", "-", "-");
                const double score_gb = (double)n * d * 2 / 1e9;   /* score_max's GB a call */
                printf("%5.2fx %5.2fx | %5.2fx %5.2fx\n", res[3][0] * attn_gb / res[1][0],
                       res[3][1] * attn_gb / res[1][1], res[4][0] * score_gb / res[0][0],
                       res[4][1] * score_gb / res[0][1]);
            }
        free(kv);
        free(c8);
        free(s8);
        free(c4);
        free(s4);
        free(idx);
        free(q);
    }
}

/* ---- causal prefill attention ------------------------------------------- */

typedef void (*causal_fn)(const float *q, int64_t ldq, int nq, int g, int d, int64_t p0,
                          const uint16_t *k, const uint16_t *v, int64_t ld, float scale, float *out,
                          int64_t ldo, float *lse);

typedef struct {
    causal_fn fn;
    const uint16_t *kv;
    const float *q;
    float *out, *lse;
    int nq, d, g, nt;
} causal_ctx;

/* every thread runs one head's causal attention on its own K/V */
static void causal_step(void *p)
{
    const causal_ctx *c = p;
    #pragma omp parallel num_threads(c->nt)
    {
        int me = omp_get_thread_num();
        size_t kvn = (size_t)c->nq * c->d, qn = (size_t)c->nq * c->g * c->d;
        const uint16_t *k = c->kv + 2 * kvn * me, *v = k + kvn;
        c->fn(c->q + qn * me, (int64_t)c->g * c->d, c->nq, c->g, c->d, 0, k, v, c->d, 0.088f,
                          c->out + qn * me, (int64_t)c->g * c->d, c->lse + (size_t)c->nq * c->g * me);
    }
}

static void bench_causal(const bk *b, const hkv_cpu_kernels *t, const hkv_peak *pk)
{
    const int nq = 2048;
    const int nthreads = omp_get_max_threads();
    /* the fast path's build: AMX-BF16 tiles or 16-bit fixed point (kernels.h) */
    const int amx = t->amx && pk->amx_bf16_flops > 0;   /* AMX granted, and it has BF16 */
    const char *fast_name = amx ? "amx-bf16" : "i16";
    printf("\nattn_causal, %d tokens from position 0 (GFLOP/s; 4*g*d per query-key pair);\n"
           "fp32: the exact path's kernel; amx-bf16 or i16 (16-bit fixed point): the fast path's;\n"
           "peak%%: N threads against the family's peak (fp32 FMA, AMX bf16; none probed for i16)\n", nq);
    printf("%-9s %3s %2s %10s %10s %10s %6s\n", "kernel", "d", "g", "ms/head", "1 thread", "N threads", "peak%");
    const int cfg[][2] = {{128, 4}, {128, 8}, {64, 4}, {64, 3}};
    for (int i = 0; i < 8; i++) {
        const int fast = i >= 4;
        const causal_fn fn = fast ? t->attn_causal_fast : t->attn_causal;
        if (!fn) continue;
        int d = cfg[i % 4][0], g = cfg[i % 4][1];
        size_t kvn = (size_t)nq * d;
        uint16_t *kv = xalloc(2 * kvn * 2 * nthreads);
        fill_half(kv, 2 * kvn * nthreads, 5);
        float *q = xalloc((size_t)nq * g * d * sizeof(float) * nthreads);
        float *out = xalloc((size_t)nq * g * d * sizeof(float) * nthreads);
        float *lse = xalloc((size_t)nq * g * sizeof(float) * nthreads);
        for (size_t j = 0; j < (size_t)nq * g * d * nthreads; j++) q[j] = (float)((j * 13) % 29) / 29.0f - 0.5f;
        double flops = 4.0 * g * d * (double)nq * (nq + 1) / 2;
        double res[2], ms = 0;
        for (int par = 0; par < 2; par++) {
            causal_ctx c = {fn, kv, q, out, lse, nq, d, g, par ? nthreads : 1};
            double calls = best_rate(b, causal_step, &c) * c.nt;
            double dt = 1.0 / calls;
            res[par] = flops * calls / 1e9;
            if (!par) ms = dt * 1e3;
        }
        const double peak = fast ? (amx ? pk->amx_bf16_flops : 0) : pk->fp32_flops;
        printf("%-9s %3d %2d %10.1f %10.1f %10.1f", fast ? fast_name : "fp32", d, g, ms, res[0], res[1]);
        if (peak > 0) printf(" %5.0f%%\n", 100 * res[1] * 1e9 / peak);
        else printf("      -\n");
        free(kv);
        free(q);
        free(out);
        free(lse);
    }
}

static const char kernels_usage[] =
    "usage: hetkv bench kernels [--isa scalar|avx2|avx2-novnni|avx512] [--quick] [--hot] [--cpu-time]\n"
    "                           [--batched] [--device cpu]\n"
    "       hetkv bench kernels --device cuda [--quick] [--json] [--reps N]   (the gpu/ kernels;\n"
    "                           hetkv bench kernels --device cuda --help)\n"
    "GEMV, batched matmul in both precisions, rerank (score_max), sparse and causal\n"
    "attention, prefill matmul: GB/s, GOP/s or GFLOP/s beside a bandwidth probe and\n"
    "compute peaks measured in the same run (roof%: against the binding one).\n\n";

typedef struct kernels_opts {
    int isa, quick, hot, batched, cpu_time;
} kernels_opts;

static int parse_kernels_isa(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    if ((((kernels_opts *)base)->isa = hkv_isa_parse(v)) < 0)
        return hkv_seterr(err, HKV_E_INVAL, "bench kernels: unknown ISA '%s' (scalar, avx2, avx2-novnni, avx512)", v);
    return HKV_OK;
}

/* --device cuda never gets here (hkv_bench_gpu_main takes it): cpu only. */
static int parse_kernels_device(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)base, (void)opt;
    if (strcmp(v, "cpu"))
        return hkv_seterr(err, HKV_E_INVAL, "--device: '%s' is not cpu or cuda", v);
    return HKV_OK;
}

static const hkv_opt kernels_opts_table[] = {
    {.name = "--isa", .arg = "NAME", .kind = HKV_OPT_FN, .fn = parse_kernels_isa,
     .help = "scalar, avx2, avx2-novnni or avx512 kernels (default avx512, or the best below it)"},
    {.name = "--quick", .kind = HKV_OPT_FLAG, .off = offsetof(kernels_opts, quick),
     .help = "smaller cold sets, 2 trials"},
    {.name = "--hot", .kind = HKV_OPT_FLAG, .off = offsetof(kernels_opts, hot),
     .help = "one copy of each matrix, small caches (in-cache speed)"},
    {.name = "--cpu-time", .kind = HKV_OPT_FLAG, .off = offsetof(kernels_opts, cpu_time),
     .help = "time trials in CPU time, not wall time"},
    {.name = "--batched", .kind = HKV_OPT_FLAG, .off = offsetof(kernels_opts, batched),
     .help = "only the batched matmul (exact vs fast) rows"},
    {.name = "--device", .arg = "cpu", .kind = HKV_OPT_FN, .fn = parse_kernels_device,
     .help = "the host kernels (the default); cuda: the gpu/ kernels"},
    {0},
};

int hkv_bench_kernels_main(int argc, char **argv)
{
    /* --device cuda: the gpu/ kernels instead (bench_gpu.c) */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--device") && !strcmp(argv[i + 1], "cuda"))
            return hkv_bench_gpu_main(argc, argv);
    hkv_err err;
    hkv_err_clear(&err);
    kernels_opts ko = {.isa = HKV_ISA_AVX512};
    const hkv_opt_use use = {.opts = kernels_opts_table, .base = &ko};
    int rc = hkv_opts_parse("bench kernels", &use, 1, argc, argv, &err);
    if (rc == 1) {
        hkv_opts_help(stdout, kernels_usage, &use, 1);
        return 0;
    }
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);   /* rows appear as they are measured (long runs) */
    bk b = {.cold_bytes = (size_t)1 << 30, .trial_seconds = 0.12, .trials = 5,
            .use_cpu_time = ko.cpu_time, .cache_rows = 32768};
    const int isa = ko.isa, quick = ko.quick, hot = ko.hot, only_qmm = ko.batched;
    if (quick) {
        b.cold_bytes = (size_t)256 << 20;
        b.trials = 2;
    }
    if (hot) {
        b.cold_bytes = 1;      /* one copy of each matrix */
        b.cache_rows = 2048;   /* K+V of one cache: 0.5-1 MB */
    }
    hkv_cpu_kernels t;
    hkv_isa_info info;
    hkv_isa_detect(&info);
    int used = hkv_cpu_kernels_init(&t, isa);
    printf("hkv-bench-kernels: isa %s (best here %s), %d OpenMP threads, %s time\n",
           hkv_isa_name(used), hkv_isa_name(info.best), omp_get_max_threads(),
           b.use_cpu_time ? "CPU" : "wall");
    double probe = hkv_bandwidth_probe((size_t)2 << 30, 8) / 1e9;
    if (probe <= 0) {
        fprintf(stderr, "hkv-bench-kernels: bandwidth probe failed\n");
        return 1;
    }
    printf("bandwidth probe: %.2f GB/s (2 GiB read-only, all threads, best of 8)\n", probe);
    hkv_peak pk;
    hkv_compute_peak(&pk, used, 5);
    printf("compute peaks (all threads, best of 5): int8 vpdpbusd %.0f GOP/s, bf16 vdpbf16ps %.0f GFLOP/s, "
           "fp32 FMA %.0f GFLOP/s, AMX int8 tdpbssd %.0f GOP/s, AMX bf16 tdpbf16ps %.0f GFLOP/s "
           "(0: not on this CPU)\n", pk.int8_ops / 1e9, pk.bf16_flops / 1e9, pk.fp32_flops / 1e9,
           pk.amx_int8_ops / 1e9, pk.amx_bf16_flops / 1e9);
    if (only_qmm) {
        bench_qmm(&b, &t, probe, &pk, quick);
        return 0;
    }
    bench_gemv(&b, &t, probe, &pk);
    bench_qmm(&b, &t, probe, &pk, quick);
    bench_sparse(&b, &t, probe, quick);
    bench_causal(&b, &t, &pk);
    bench_matmul(&b, &t, quick);
    double probe2 = hkv_bandwidth_probe((size_t)2 << 30, 8) / 1e9;
    printf("\nbandwidth probe again at the end: %.2f GB/s\n", probe2);
    printf("every figure is the best of %d trials of >= %.2f s\n", b.trials, b.trial_seconds);
    return 0;
}

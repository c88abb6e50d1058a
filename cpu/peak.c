/* Compute-peak probe: each instruction family the kernels use (int8 dot,
 * bf16 dot, fp32 FMA) run as a dependency-free register loop on every
 * OpenMP thread at once, best of reps, so the figure is what the run's
 * threads can issue together (two threads on two cores, or two hardware
 * threads sharing a core, show up as they are). Only the families this CPU
 * has are run. */
#include <omp.h>
#include <string.h>
#include <time.h>

#include "kernels_impl.h"
#include "peak.h"

/* x 16 instructions: 4-10 ms per loop at 1 instruction per cycle. Shorter
 * loops on two unbound threads measured a fifth of one thread's rate (both
 * threads started on one core, the region over before the scheduler moved
 * one); an untimed first round gets the threads placed. */
#define PEAK_ITERS 1000000L
#define PEAK_INSNS_PER_ITER 16

typedef double (*peak_loop_fn)(long iters);

static double thread_cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Operations per second of loop (ops per instruction given) on all threads:
 * each thread's rate over its own CPU time, summed, best of reps. CPU time,
 * not wall time: on a machine shared with other jobs a thread's loop may be
 * descheduled midway, and the figure is meant as the ceiling the cores give
 * when they run (the kernels' --cpu-time timing compares with it). */
static double run_peak(peak_loop_fn loop, double ops_per_insn, int reps)
{
    const int nt = omp_get_max_threads();
    const double ops = (double)PEAK_ITERS * PEAK_INSNS_PER_ITER * ops_per_insn;
    double best = 0.0, sink = 0.0;
    for (int r = -1; r < reps; r++) {   /* r = -1: untimed warm-up */
        double rate = 0.0;
        #pragma omp parallel num_threads(nt) reduction(+ : sink, rate)
        {
            double t0 = thread_cpu_seconds();
            sink += loop(PEAK_ITERS);
            double dt = thread_cpu_seconds() - t0;
            rate += dt > 0 ? ops / dt : 0.0;
        }
        if (r >= 0 && rate > best) best = rate;
    }
    return sink == sink ? best : 0.0;   /* a NaN sink never happens; keeps sink used */
}

int hkv_compute_peak(hkv_peak *out, int isa, int reps)
{
    memset(out, 0, sizeof *out);
    if (reps < 1) reps = 1;
#if defined(__x86_64__)
    hkv_isa_info info;
    hkv_isa_detect(&info);
    if (isa > info.best) isa = info.best;
    if (info.best >= HKV_ISA_AVX512 && info.avx512_vnni)
        out->int8_ops = run_peak(hkv_peak_loop_vnni, 2.0 * 64, reps);
    if (info.best >= HKV_ISA_AVX512 && info.avx512_bf16)
        out->bf16_flops = run_peak(hkv_peak_loop_bf16, 2.0 * 32, reps);
#if defined(HKV_HAVE_AMX_BF16)
    /* a loop is iters / 16 rounds of 16 tile ops: ops per "instruction" / 16 */
    if (hkv_amx_request(&info) && info.amx_bf16) {
        out->amx_int8_ops = run_peak(hkv_peak_loop_amx_int8, 2.0 * 16 * 16 * 64 / 16, reps);
        out->amx_bf16_flops = run_peak(hkv_peak_loop_amx_bf16, 2.0 * 16 * 16 * 32 / 16, reps);
    }
#endif
    if (isa >= HKV_ISA_AVX512)
        out->fp32_flops = run_peak(hkv_peak_loop_fma_avx512, 2.0 * 16, reps);
    else if (isa >= HKV_ISA_AVX2)
        out->fp32_flops = run_peak(hkv_peak_loop_fma_avx2, 2.0 * 8, reps);
#else
    (void)isa;
#endif
    return out->int8_ops > 0 || out->bf16_flops > 0 || out->fp32_flops > 0 || out->amx_int8_ops > 0 ? 0 : -1;
}

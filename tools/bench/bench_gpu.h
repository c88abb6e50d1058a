/* The device kernel benchmark, reachable as `hetkv bench kernels --device
 * cuda` (and the standalone hkv-bench-kernels --device cuda). */
#ifndef HKV_BENCH_GPU_H
#define HKV_BENCH_GPU_H

/* argv as hkv_bench_kernels_main gets it (argv[0] "kernels"). Returns the
 * process exit status: 0, 1 (no device, a device error), 2 (bad usage). */
int hkv_bench_gpu_main(int argc, char **argv);

#endif

/* The host-kernel benchmark, reachable as `hetkv bench kernels` and as the
 * standalone hkv-bench-kernels. */
#ifndef HKV_BENCH_KERNELS_H
#define HKV_BENCH_KERNELS_H

int hkv_bench_kernels_main(int argc, char **argv);
/* `hetkv bench far`: the host's far step of one layer alone (bench_far.c). */
int hkv_bench_far_main(int argc, char **argv);

#endif

#include "bench_kernels.h"

int main(int argc, char **argv) { return hkv_bench_kernels_main(argc, argv); }

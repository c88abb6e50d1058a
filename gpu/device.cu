#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "device.h"
#include "status.h"
}

extern "C" int hkv_gpu_built(void) { return 1; }

#ifdef HKV_CUDA_EMU
extern "C" const char *hkv_gpu_backend(void) { return "cuda-emu"; }
#else
extern "C" const char *hkv_gpu_backend(void) { return "cuda"; }
#endif

extern "C" int hkv_gpu_query(hkv_gpu_device *devs, int max, int *n, char *why, size_t why_cap) {
    *n = 0;
    if (why && why_cap) why[0] = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        if (why && why_cap)
            snprintf(why, why_cap, "no CUDA device usable (%s: %s)",
                     e == cudaSuccess ? "cudaGetDeviceCount" : cudaGetErrorName(e),
                     e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
        return HKV_OK;
    }
    for (int i = 0; i < count && i < max; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
        hkv_gpu_device *d = &devs[*n];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "%.*s", (int)sizeof d->name - 1, p.name);
        d->mem_total = p.totalGlobalMem;
        d->cc_major = p.major;
        d->cc_minor = p.minor;
        d->sm_count = p.multiProcessorCount;
#ifdef HKV_CUDA_EMU
        d->emulated = 1;
#endif
        size_t fr = 0, tot = 0;
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&fr, &tot) == cudaSuccess)
            d->mem_free = fr;
        (*n)++;
    }
    return HKV_OK;
}

/* What CUDA devices this process can use. A binary built with CUDA runs on a
 * machine without a GPU: the query then says so plainly. */
#ifndef HKV_GPU_DEVICE_H
#define HKV_GPU_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hkv_gpu_device {
    char name[128];
    size_t mem_total, mem_free;
    int cc_major, cc_minor;
    int sm_count;
    int emulated;   /* 1: the CUDA emulator on the CPU (-Dgpu_emu=true), not a GPU */
} hkv_gpu_device;

/* 1 when this binary was built with the gpu/ tree. */
int hkv_gpu_built(void);

/* What gpu/ runs on in this binary, as JSON outputs name it: "cuda" (nvcc,
 * a real GPU), "cuda-emu" (the CUDA emulator on the CPU) or "none". */
const char *hkv_gpu_backend(void);

/* Fill up to max devices; *n gets the count (0 when none). When there are
 * none, `why` explains (not built with CUDA, no driver, no device, ...).
 * Returns HKV_OK in both cases: having no GPU is not an error. */
int hkv_gpu_query(hkv_gpu_device *devs, int max, int *n, char *why, size_t why_cap);

#ifdef __cplusplus
}
#endif

#endif

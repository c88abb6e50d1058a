/* Built without the gpu/ tree (-Dcuda=disabled or no nvcc). */
#include <stdio.h>

#include "device.h"
#include "status.h"

int hkv_gpu_built(void) { return 0; }

const char *hkv_gpu_backend(void) { return "none"; }

int hkv_gpu_query(hkv_gpu_device *devs, int max, int *n, char *why, size_t why_cap) {
    (void)devs;
    (void)max;
    *n = 0;
    if (why && why_cap) snprintf(why, why_cap, "this binary was built without CUDA");
    return HKV_OK;
}

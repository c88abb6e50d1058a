/* The emulated device: configuration from the environment, its limits, the
 * error state (per host thread last error, device-wide sticky fault),
 * device queries, and kernel launches with the checks a device makes. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "emu_internal.h"

namespace hkv_emu {

namespace {

/* "24G", "512M", "4096": bytes; 0 when malformed. */
size_t parse_size(const char *s)
{
    char *end = nullptr;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || v <= 0) return 0;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1048576.0; end++; break;
    case 'G': mul = 1073741824.0; end++; break;
    case 'T': mul = 1099511627776.0; end++; break;
    case 0: break;
    default: return 0;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return 0;
    v *= mul;
    return v >= 1.8e19 ? 0 : (size_t)v;
}

config read_config(void)
{
    config c;
    c.mem_cap = (size_t)4 << 30;
    long np = sysconf(_SC_NPROCESSORS_ONLN);
    c.workers = np > 0 ? (int)np : 1;
    c.eager = false;
    c.delay_us = 0;
    c.shuffle = true;
    c.seed = 0x5eed;
    c.sm = 89;
    c.abort_on_fault = false;
    c.refuse_capture = false;
#if defined(HKV_EMU_ASAN) || defined(HKV_EMU_TSAN)
    c.stack_bytes = 512 << 10;   /* instrumented frames are several times larger */
#else
    c.stack_bytes = 64 << 10;
#endif
    const char *v;
    if ((v = getenv("HKV_EMU_MEM")) && *v) {
        c.mem_cap = parse_size(v);
        if (!c.mem_cap) c.bad = std::string("HKV_EMU_MEM=") + v + " is not a size (like 24G)";
    }
    if ((v = getenv("HKV_EMU_WORKERS")) && *v) {
        char *e;
        long w = strtol(v, &e, 10);
        if (*e || w < 0 || w > 256) c.bad = std::string("HKV_EMU_WORKERS=") + v + " is not 0..256";
        else c.workers = (int)w;
    }
    if ((v = getenv("HKV_EMU_EAGER"))) c.eager = !strcmp(v, "1");
    if ((v = getenv("HKV_EMU_REFUSE_CAPTURE"))) c.refuse_capture = !strcmp(v, "1");
    if ((v = getenv("HKV_EMU_DELAY")) && *v) {
        char *e;
        long d = strtol(v, &e, 10);
        if (*e || d < 0 || d > 1000000) c.bad = std::string("HKV_EMU_DELAY=") + v + " is not 0..1000000 (us)";
        else c.delay_us = (int)d;
    }
    if ((v = getenv("HKV_EMU_SHUFFLE"))) c.shuffle = strcmp(v, "0") != 0;
    if ((v = getenv("HKV_EMU_SEED")) && *v) c.seed = strtoull(v, nullptr, 0);
    if ((v = getenv("HKV_EMU_ABORT"))) c.abort_on_fault = !strcmp(v, "1");
    if ((v = getenv("HKV_EMU_STACK")) && *v) {
        size_t s = parse_size(v);
        if (s < 16384) c.bad = std::string("HKV_EMU_STACK=") + v + " is not a size of at least 16K";
        else c.stack_bytes = s;
    }
    if ((v = getenv("HKV_EMU_SM")) && *v) {
        if (!strcmp(v, "89")) c.sm = 89;
        else if (!strcmp(v, "90")) c.sm = 90;
        else c.bad = std::string("HKV_EMU_SM=") + v + " is not 89 or 90";
    }
    return c;
}

thread_local cudaError_t tl_last = cudaSuccess;

struct fault_state {
    std::atomic<int> faulted{0};
    std::mutex mu;
    std::string first;
};
fault_state &faults()
{
    static fault_state *f = new fault_state;
    return *f;
}

std::map<const void *, int> &func_max_smem()
{
    static auto *m = new std::map<const void *, int>;
    return *m;
}
std::mutex &func_mu()
{
    static auto *m = new std::mutex;
    return *m;
}

}  // namespace

const config &cfg(void)
{
    static const config *c = new config(read_config());
    return *c;
}

const arch_limits &limits(void)
{
    /* CUDA Programming Guide, "Technical Specifications per Compute
     * Capability": 8.9 (RTX 4090: 128 SMs) and 9.0 (H100 SXM: 132 SMs). */
    static const arch_limits l89 = {1024, {1024, 1024, 64}, {2147483647u, 65535u, 65535u},
                                    48 << 10, 99 << 10, 100 << 10, 128, 1536};
    static const arch_limits l90 = {1024, {1024, 1024, 64}, {2147483647u, 65535u, 65535u},
                                    48 << 10, 227 << 10, 228 << 10, 132, 2048};
    return cfg().sm == 90 ? l90 : l89;
}

cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess) tl_last = e;
    return e;
}

cudaError_t sticky(void) { return faults().faulted.load() ? cudaErrorLaunchFailure : cudaSuccess; }

void device_fault(const std::string &what)
{
    fault_state &f = faults();
    std::lock_guard<std::mutex> lk(f.mu);
    if (!f.faulted.load()) f.first = what;
    f.faulted.store(1);
    fprintf(stderr, "hkv cuda-emu: kernel fault (the device error is sticky from now on, as "
            "cudaErrorLaunchFailure): %s\n", what.c_str());
    if (cfg().abort_on_fault) abort();
}

void clear_sticky(void)
{
    fault_state &f = faults();
    std::lock_guard<std::mutex> lk(f.mu);
    f.faulted.store(0);
    f.first.clear();
}

cudaError_t func_set_attribute(const void *fn, cudaFuncAttribute attr, int value)
{
    if (sticky()) return ret(sticky());
    if (!fn) return ret(cudaErrorInvalidValue);
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout)
        return value >= -1 && value <= 100 ? cudaSuccess : ret(cudaErrorInvalidValue);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return ret(cudaErrorInvalidValue);
    if (value < 0 || (size_t)value > limits().smem_optin) return ret(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(func_mu());
    func_max_smem()[fn] = value;
    return cudaSuccess;
}

void launch(kernel_body *body, const void *fn, const char *name, dim3 grid, dim3 block,
            size_t smem, cudaStream_t stream)
{
    const arch_limits &L = limits();
    cudaError_t e = sticky();
    if (!e && !cfg().bad.empty()) e = cudaErrorInitializationError;
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (!e && (block.x < 1 || block.y < 1 || block.z < 1 || (int)block.x > L.max_block_dim[0] ||
               (int)block.y > L.max_block_dim[1] || (int)block.z > L.max_block_dim[2] ||
               threads > (uint64_t)L.max_threads_block))
        e = cudaErrorInvalidConfiguration;
    if (!e && (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > L.max_grid[0] ||
               grid.y > L.max_grid[1] || grid.z > L.max_grid[2]))
        e = cudaErrorInvalidConfiguration;
    if (!e && smem > L.smem_static) {
        std::lock_guard<std::mutex> lk(func_mu());
        auto it = func_max_smem().find(fn);
        if (it == func_max_smem().end() || smem > (size_t)it->second) e = cudaErrorInvalidValue;
    }
    if (!e && !stream_valid(stream)) e = cudaErrorInvalidResourceHandle;
    if (e) {
        delete body;
        ret(e);
        return;
    }
    /* shared by every copy of the item: a captured launch runs once per replay */
    std::shared_ptr<kernel_body> owned(body);
    e = enqueue(stream, [owned, name, grid, block, smem] {
        grid_job job{owned.get(), name, grid, block, smem};
        std::string f = run_grid(job);
        if (!f.empty()) device_fault(f);
    });
    if (e) ret(e);
}

}  // namespace hkv_emu

using namespace hkv_emu;

extern "C" {

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
#define N(x) case x: return #x;
        N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation)
        N(cudaErrorInitializationError) N(cudaErrorInvalidConfiguration)
        N(cudaErrorInvalidDevicePointer) N(cudaErrorInvalidMemcpyDirection)
        N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady)
        N(cudaErrorHostMemoryAlreadyRegistered) N(cudaErrorHostMemoryNotRegistered)
        N(cudaErrorLaunchOutOfResources) N(cudaErrorLaunchFailure) N(cudaErrorInvalidDevice)
        N(cudaErrorNoDevice) N(cudaErrorNotSupported) N(cudaErrorUnknown)
        N(cudaErrorIllegalState) N(cudaErrorStreamCaptureUnsupported)
        N(cudaErrorStreamCaptureInvalidated) N(cudaErrorCapturedEvent) N(cudaErrorGraphExecUpdateFailure)
#undef N
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorGraphExecUpdateFailure: return "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
    default: return "unknown error";
    }
}

cudaError_t cudaGetLastError(void)
{
    if (sticky()) return sticky();
    cudaError_t e = tl_last;
    tl_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return sticky() ? sticky() : tl_last; }

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count) return ret(cudaErrorInvalidValue);
    if (!cfg().bad.empty()) {
        *count = 0;
        fprintf(stderr, "hkv cuda-emu: %s\n", cfg().bad.c_str());
        return ret(cudaErrorInitializationError);
    }
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (!cfg().bad.empty()) return ret(cudaErrorInitializationError);
    return device == 0 ? cudaSuccess : ret(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device) return ret(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (!p) return ret(cudaErrorInvalidValue);
    if (device != 0) return ret(cudaErrorInvalidDevice);
    const arch_limits &L = limits();
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA emulator on the CPU (sm_%d limits)", cfg().sm);
    p->totalGlobalMem = cfg().mem_cap;
    p->sharedMemPerBlock = L.smem_static;
    p->sharedMemPerBlockOptin = L.smem_optin;
    p->sharedMemPerMultiprocessor = L.smem_sm;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = L.max_threads_block;
    for (int i = 0; i < 3; i++) {
        p->maxThreadsDim[i] = L.max_block_dim[i];
        p->maxGridSize[i] = (int)L.max_grid[i];
    }
    p->major = cfg().sm / 10;
    p->minor = cfg().sm % 10;
    p->multiProcessorCount = L.sm_count;
    p->maxThreadsPerMultiProcessor = L.threads_sm;
    p->l2CacheSize = cfg().sm == 90 ? 50 << 20 : 72 << 20;
    p->memoryBusWidth = cfg().sm == 90 ? 5120 : 384;
    p->unifiedAddressing = 1;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->asyncEngineCount = 2;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    if (!value) return ret(cudaErrorInvalidValue);
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e) return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrHostRegisterReadOnlySupported: *value = 1; break;   /* as Linux x86 hosts */
    default: return ret(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

/* The emulated device sits on no PCI bus: callers that look for the GPU's
 * NUMA node get an error and fall back to no binding. */
cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device)
{
    if (!bus_id || len < 1) return ret(cudaErrorInvalidValue);
    if (device != 0) return ret(cudaErrorInvalidDevice);
    bus_id[0] = 0;
    return ret(cudaErrorNotSupported);
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (capture_forbids_sync()) return ret(cudaErrorStreamCaptureUnsupported);
    device_sync();
    return sticky() ? ret(sticky()) : cudaSuccess;
}

cudaError_t cudaDeviceReset(void)
{
    device_sync();
    free_all_device();
    clear_sticky();
    tl_last = cudaSuccess;
    return cudaSuccess;
}

int hkv_emu_active(void) { return 1; }
size_t hkv_emu_mem_cap(void) { return cfg().mem_cap; }

}  // extern "C"

/* The CUDA runtime API subset that hetkv uses, as the CUDA-on-CPU emulator
 * implements it (gpu/emu/). C-compatible, like cuda_runtime_api.h: the C
 * sources of the project (transfer/pinned.c) include it through the shim
 * include/cuda_runtime_api.h when built with -Dgpu_emu=true.
 *
 * Names and values follow the CUDA runtime API reference so that gpu/ sources
 * compile unchanged; only what the project calls is here. Semantics,
 * including where the emulator is stricter than a GPU: docs/CUDA_EMU.md. */
#ifndef HKV_EMU_RUNTIME_H
#define HKV_EMU_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#define HKV_EMU_DEFAULT(v) = v
#else
#define HKV_EMU_DEFAULT(v)
#endif

#define CUDART_VERSION 13000
#define HKV_CUDA_EMU_API 1

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorNotSupported = 801,
    cudaErrorIllegalState = 401,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorCapturedEvent = 907,
    cudaErrorGraphExecUpdateFailure = 910,
    cudaErrorUnknown = 999,
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef struct hkv_emu_stream *cudaStream_t;
typedef struct hkv_emu_event *cudaEvent_t;
typedef void (*cudaHostFn_t)(void *user_data);

#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaStreamLegacy ((cudaStream_t)0)

#define cudaEventDefault 0x0u
#define cudaEventBlockingSync 0x1u
#define cudaEventDisableTiming 0x2u
#define cudaEventRecordDefault 0x0u
#define cudaEventRecordExternal 0x1u

#define cudaHostAllocDefault 0x0u
#define cudaHostAllocPortable 0x1u
#define cudaHostAllocMapped 0x2u
#define cudaHostAllocWriteCombined 0x4u
#define cudaHostRegisterDefault 0x0u
#define cudaHostRegisterPortable 0x1u
#define cudaHostRegisterMapped 0x2u
#define cudaHostRegisterReadOnly 0x8u

typedef struct dim3 {
    unsigned int x, y, z;
#ifdef __cplusplus
    dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
#endif
} dim3;

/* The fields of cudaDeviceProp the project reads; the emulated device has the
 * limits of the architecture it stands for (sm_89 by default, HKV_EMU_SM=90). */
typedef struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    size_t sharedMemPerMultiprocessor;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major, minor;
    int multiProcessorCount;
    int maxThreadsPerMultiProcessor;
    int l2CacheSize;
    int memoryBusWidth;
    int unifiedAddressing;
    int canMapHostMemory;
    int concurrentKernels;
    int asyncEngineCount;
} cudaDeviceProp;

typedef enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
    cudaDevAttrHostRegisterReadOnlySupported = 113,
} cudaDeviceAttr;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
} cudaFuncAttribute;

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceGetPCIBusId(char *bus_id, int len, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags);
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaHostRegister(void *ptr, size_t bytes, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags);

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream HKV_EMU_DEFAULT(0));
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream HKV_EMU_DEFAULT(0));
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes,
                            cudaStream_t stream HKV_EMU_DEFAULT(0));

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *stream, unsigned int flags, int priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int flags HKV_EMU_DEFAULT(0));
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *user_data);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream HKV_EMU_DEFAULT(0));
/* cudaEventRecordExternal on a capturing stream: an event record node that
 * each launch of the graph records (the host may wait for it after the
 * launch); outside a capture, or with no flags, cudaEventRecord. */
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* Stream capture and graphs (CUDA Runtime API, "Graph Management"), as far as
 * a step replayed whole needs them: a capture on one non-legacy stream
 * records its kernels (their arguments as launched), cuBLAS calls, copies
 * between device and page-locked memory, memsets, host functions and
 * external event records (cudaEventRecordWithFlags); a
 * graph instantiated from it replays them in order on any stream. Stricter
 * than CUDA, so code that captures here captures on a GPU: what CUDA turns
 * into internal event, allocation or cross-stream nodes (cudaEventRecord
 * without cudaEventRecordExternal, cudaStreamWaitEvent, cudaMallocAsync,
 * cudaFreeAsync on the capturing stream), pageable copies, and every synchronising call (the stream's, the
 * device's, cudaMalloc and cudaFree while a global-mode capture is open)
 * return cudaErrorStreamCaptureUnsupported and invalidate the capture. */
typedef struct hkv_emu_graph *cudaGraph_t;
typedef struct hkv_emu_graph_exec *cudaGraphExec_t;
typedef struct hkv_emu_graph_node *cudaGraphNode_t;
typedef enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
} cudaStreamCaptureMode;
typedef enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
} cudaStreamCaptureStatus;
typedef enum cudaGraphExecUpdateResult {
    cudaGraphExecUpdateSuccess = 0,
    cudaGraphExecUpdateError = 1,
    cudaGraphExecUpdateErrorTopologyChanged = 2,
} cudaGraphExecUpdateResult;
typedef struct cudaGraphExecUpdateResultInfo {
    cudaGraphExecUpdateResult result;
    cudaGraphNode_t errorNode;
    cudaGraphNode_t errorFromNode;
} cudaGraphExecUpdateResultInfo;

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *num_nodes);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags HKV_EMU_DEFAULT(0));
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

/* Emulator-only introspection (no CUDA counterpart), for tests and for
 * `hetkv info`: 1 always in this build; the device memory cap in bytes. */
int hkv_emu_active(void);
size_t hkv_emu_mem_cap(void);

#ifdef __cplusplus
}
#endif

#endif

/* Device memory as ordinary host allocations of exactly the bytes asked (so
 * AddressSanitizer sees a kernel reading past a buffer), filled with 0xff
 * bytes — NaN as fp32 and fp16, -1 as an integer — since GPU memory is not
 * zeroed; counted against HKV_EMU_MEM, past which cudaMalloc fails with
 * cudaErrorMemoryAllocation as a full device does. Page-locked host memory
 * (cudaHostAlloc, cudaHostRegister) is tracked so that copies know which
 * side is which and can be asynchronous only where CUDA allows.
 *
 * Copies check what a GPU would fault on or leave undefined: a range that
 * runs past its device allocation, and a direction that does not match the
 * pointers. Pageable host memory in an async copy behaves as the runtime
 * documents: host-to-device reads the source at the call (staged), and
 * device-to-host returns only when the copy is done. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "emu_internal.h"

namespace hkv_emu {

namespace {

struct region {
    size_t bytes;
    mem_kind kind;
    bool owned;   /* cudaHostAlloc (freed by cudaFreeHost) vs cudaHostRegister */
};

struct memory {
    std::mutex mu;
    std::map<uintptr_t, region> regions;
    size_t device_used = 0, device_peak = 0;
};

memory &mem()
{
    static memory *m = new memory;
    return *m;
}

/* The region containing p, or end(). Caller holds mu. */
std::map<uintptr_t, region>::iterator find(memory &m, const void *p)
{
    const uintptr_t a = (uintptr_t)p;
    auto it = m.regions.upper_bound(a);
    if (it == m.regions.begin()) return m.regions.end();
    --it;
    return a < it->first + (it->second.bytes ? it->second.bytes : 1) ? it : m.regions.end();
}

cudaError_t device_alloc(void **out, size_t bytes)
{
    if (!out) return ret(cudaErrorInvalidValue);
    *out = nullptr;
    if (!cfg().bad.empty()) return ret(cudaErrorInitializationError);
    if (sticky()) return ret(sticky());
    if (!bytes) return cudaSuccess;
    memory &m = mem();
    {
        std::lock_guard<std::mutex> lk(m.mu);
        if (bytes > cfg().mem_cap || m.device_used > cfg().mem_cap - bytes)
            return ret(cudaErrorMemoryAllocation);
        m.device_used += bytes;   /* reserved before the host allocation */
    }
    void *p = nullptr;
    if (posix_memalign(&p, 256, bytes)) {
        std::lock_guard<std::mutex> lk(m.mu);
        m.device_used -= bytes;
        return ret(cudaErrorMemoryAllocation);
    }
    memset(p, 0xff, bytes);
    std::lock_guard<std::mutex> lk(m.mu);
    m.regions[(uintptr_t)p] = region{bytes, MEM_DEVICE, true};
    if (m.device_used > m.device_peak) m.device_peak = m.device_used;
    *out = p;
    return cudaSuccess;
}

/* Remove a device allocation that starts at p; false if there is none. */
bool device_release(void *p)
{
    memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    auto it = m.regions.find((uintptr_t)p);
    if (it == m.regions.end() || it->second.kind != MEM_DEVICE) return false;
    m.device_used -= it->second.bytes;
    m.regions.erase(it);
    free(p);
    return true;
}

const char *kind_name(mem_kind k)
{
    return k == MEM_DEVICE ? "device" : k == MEM_PINNED ? "page-locked host" : "pageable host";
}

/* Check a copy's two ranges against its direction; fills the kinds. */
cudaError_t check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                       mem_kind *dk, mem_kind *sk)
{
    if (!dst || !src) return cudaErrorInvalidValue;
    bool dover = false, sover = false;
    *dk = classify(dst, bytes, &dover);
    *sk = classify(src, bytes, &sover);
    if (dover || sover) {
        fprintf(stderr, "hkv cuda-emu: a copy of %zu bytes runs past the end of its %s device "
                "allocation\n", bytes, dover ? "destination" : "source");
        return cudaErrorInvalidValue;
    }
    const bool dd = *dk == MEM_DEVICE, sd = *sk == MEM_DEVICE;
    bool ok = true;
    switch (kind) {
    case cudaMemcpyHostToDevice: ok = dd && !sd; break;
    case cudaMemcpyDeviceToHost: ok = sd && !dd; break;
    case cudaMemcpyDeviceToDevice: ok = sd && dd; break;
    case cudaMemcpyHostToHost: ok = !sd && !dd; break;
    case cudaMemcpyDefault: ok = true; break;
    default: return cudaErrorInvalidMemcpyDirection;
    }
    if (!ok) {
        fprintf(stderr, "hkv cuda-emu: cudaMemcpy kind %d with a %s destination and a %s source "
                "(undefined on a GPU)\n", (int)kind, kind_name(*dk), kind_name(*sk));
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

cudaError_t copy_async(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                       cudaStream_t s)
{
    if (sticky()) return ret(sticky());
    if (!bytes) return cudaSuccess;
    mem_kind dk, sk;
    cudaError_t e = check_copy(dst, src, bytes, kind, &dk, &sk);
    if (e) return ret(e);
    if (!stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    /* a pageable copy is synchronous, or staged at the call: not capturable */
    if (sk == MEM_PAGEABLE || dk == MEM_PAGEABLE)
        if (cudaError_t c = capture_refuse(s)) return ret(c);
    if (sk == MEM_PAGEABLE && dk == MEM_DEVICE) {
        /* staged: the source is read now, the host may reuse it at once */
        std::shared_ptr<std::vector<char>> stage(new std::vector<char>((const char *)src,
                                                                       (const char *)src + bytes));
        return ret(enqueue(s, [dst, stage] { memcpy(dst, stage->data(), stage->size()); }));
    }
    auto item = [dst, src, bytes] { memmove(dst, src, bytes); };
    if (dk == MEM_PAGEABLE && sk == MEM_DEVICE) return ret(enqueue_wait(s, item));
    return ret(enqueue(s, item));
}

}  // namespace

mem_kind classify(const void *p, size_t bytes, bool *overrun)
{
    memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    *overrun = false;
    auto it = find(m, p);
    if (it == m.regions.end()) return MEM_PAGEABLE;
    const uintptr_t a = (uintptr_t)p;
    if (bytes > it->first + it->second.bytes - a) *overrun = it->second.kind == MEM_DEVICE;
    return it->second.kind;
}

void free_all_device(void)
{
    memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    for (auto it = m.regions.begin(); it != m.regions.end();) {
        if (it->second.kind == MEM_DEVICE) {
            free((void *)it->first);
            it = m.regions.erase(it);
        } else {
            ++it;
        }
    }
    m.device_used = 0;
}

}  // namespace hkv_emu

using namespace hkv_emu;

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    if (capture_forbids_sync()) return ret(cudaErrorStreamCaptureUnsupported);
    return device_alloc(ptr, bytes);
}

cudaError_t cudaFree(void *ptr)
{
    if (!ptr) return cudaSuccess;
    if (capture_forbids_sync()) return ret(cudaErrorStreamCaptureUnsupported);
    device_sync();   /* cudaFree synchronises the device */
    if (!device_release(ptr)) return ret(cudaErrorInvalidValue);
    return sticky() ? ret(sticky()) : cudaSuccess;
}

cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t s)
{
    if (!stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if (cudaError_t c = capture_refuse(s)) return ret(c);   /* an allocation node: not modelled */
    return device_alloc(ptr, bytes);
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t s)
{
    if (!ptr) return cudaSuccess;
    if (!stream_valid(s)) return ret(cudaErrorInvalidResourceHandle);
    if (cudaError_t c = capture_refuse(s)) return ret(c);
    {
        memory &m = mem();
        std::lock_guard<std::mutex> lk(m.mu);
        auto it = m.regions.find((uintptr_t)ptr);
        if (it == m.regions.end() || it->second.kind != MEM_DEVICE) return ret(cudaErrorInvalidValue);
    }
    /* released in stream order, without a device-wide synchronisation */
    return ret(enqueue(s, [ptr] { device_release(ptr); }));
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    if (!cfg().bad.empty()) return ret(cudaErrorInitializationError);
    memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    if (free_bytes) *free_bytes = cfg().mem_cap - m.device_used;
    if (total_bytes) *total_bytes = cfg().mem_cap;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags)
{
    if (!ptr || (flags & ~0xfu)) return ret(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (!cfg().bad.empty()) return ret(cudaErrorInitializationError);
    if (!bytes) return cudaSuccess;
    void *p = nullptr;
    if (posix_memalign(&p, 4096, bytes)) return ret(cudaErrorMemoryAllocation);
    memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    m.regions[(uintptr_t)p] = region{bytes, MEM_PINNED, true};
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

cudaError_t cudaFreeHost(void *ptr)
{
    if (!ptr) return cudaSuccess;
    device_sync();
    memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    auto it = m.regions.find((uintptr_t)ptr);
    if (it == m.regions.end() || it->second.kind != MEM_PINNED || !it->second.owned)
        return ret(cudaErrorInvalidValue);
    m.regions.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *ptr, size_t bytes, unsigned int flags)
{
    if (!ptr || !bytes || (flags & ~0xfu)) return ret(cudaErrorInvalidValue);
    if (!cfg().bad.empty()) return ret(cudaErrorInitializationError);
    memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    const uintptr_t a = (uintptr_t)ptr;
    auto it = m.regions.lower_bound(a);
    if (it != m.regions.end() && it->first < a + bytes) return ret(cudaErrorHostMemoryAlreadyRegistered);
    if (find(m, ptr) != m.regions.end()) return ret(cudaErrorHostMemoryAlreadyRegistered);
    m.regions[a] = region{bytes, MEM_PINNED, false};
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
    memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    auto it = m.regions.find((uintptr_t)ptr);
    if (it == m.regions.end() || it->second.kind != MEM_PINNED || it->second.owned)
        return ret(cudaErrorHostMemoryNotRegistered);
    m.regions.erase(it);
    return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags)
{
    if (!dev || flags) return ret(cudaErrorInvalidValue);
    memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    auto it = find(m, host);
    if (it == m.regions.end() || it->second.kind != MEM_PINNED) return ret(cudaErrorInvalidValue);
    *dev = host;   /* unified addressing: the mapping has the host's address */
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    return copy_async(dst, src, bytes, kind, s);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    if (sticky()) return ret(sticky());
    if (!bytes) return cudaSuccess;
    mem_kind dk, sk;
    cudaError_t e = check_copy(dst, src, bytes, kind, &dk, &sk);
    if (e) return ret(e);
    if (cudaError_t w = enqueue_wait(0, [dst, src, bytes] { memmove(dst, src, bytes); }))
        return ret(w);
    return sticky() ? ret(sticky()) : cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s)
{
    if (width > dpitch || width > spitch) return ret(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++) {
        cudaError_t e = copy_async((char *)dst + r * dpitch, (const char *)src + r * spitch, width,
                                   kind, s);
        if (e) return e;
    }
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s)
{
    if (sticky()) return ret(sticky());
    if (!bytes) return cudaSuccess;
    bool over = false;
    if (!dst || classify(dst, bytes, &over) != MEM_DEVICE || over) {
        fprintf(stderr, "hkv cuda-emu: cudaMemset of %zu bytes %s\n", bytes,
                over ? "runs past the end of its device allocation" : "is not in device memory");
        return ret(cudaErrorInvalidValue);
    }
    return ret(enqueue(s, [dst, value, bytes] { memset(dst, value, bytes); }));
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes)
{
    return cudaMemsetAsync(dst, value, bytes, 0);
}

}  // extern "C"

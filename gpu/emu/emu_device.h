/* The device side of the CUDA emulator: what a .cu file sees when the host
 * C++ compiler builds it with -Dgpu_emu=true. Qualifiers become C++, the
 * built-in index variables read the running CUDA thread's state, barriers and
 * warp collectives are fiber switches (emu_block.cc), atomics are the
 * compiler's atomics on the same addresses.
 *
 * Two constructs of CUDA C++ are not C++ and go through one macro each in
 * both builds (gpu/gpu_internal.cuh): the launch chevrons (HKV_LAUNCH) and
 * `extern __shared__` (HKV_DYN_SHARED). Static `__shared__` arrays become
 * `static thread_local`: the threads of one block run as fibers on one OS
 * thread, so they share it, while blocks running at the same time on other
 * worker threads each have their own. */
#ifndef HKV_EMU_DEVICE_H
#define HKV_EMU_DEVICE_H

#include <math.h>
#include <stdint.h>

#include <cmath>
#include <string.h>

#include <tuple>
#include <utility>

#include "emu_half.h"
#include "emu_runtime.h"

/* ---- qualifiers ---- */
#define __global__
#define __host__
#define __device__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __grid_constant__

/* ---- vector types (vector_types.h): sizes and alignments as CUDA's ---- */
#define HKV_EMU_VEC2(T, N, A) struct __attribute__((aligned(A))) N { T x, y; }; \
    static inline N make_##N(T x, T y) { N r; r.x = x; r.y = y; return r; }
#define HKV_EMU_VEC3(T, N) struct N { T x, y, z; }; \
    static inline N make_##N(T x, T y, T z) { N r; r.x = x; r.y = y; r.z = z; return r; }
#define HKV_EMU_VEC4(T, N, A) struct __attribute__((aligned(A))) N { T x, y, z, w; }; \
    static inline N make_##N(T x, T y, T z, T w) { N r; r.x = x; r.y = y; r.z = z; r.w = w; return r; }
HKV_EMU_VEC2(float, float2, 8)
HKV_EMU_VEC3(float, float3)
HKV_EMU_VEC4(float, float4, 16)
HKV_EMU_VEC2(int, int2, 8)
HKV_EMU_VEC3(int, int3)
HKV_EMU_VEC4(int, int4, 16)
HKV_EMU_VEC2(unsigned int, uint2, 8)
HKV_EMU_VEC3(unsigned int, uint3)
HKV_EMU_VEC4(unsigned int, uint4, 16)
HKV_EMU_VEC2(unsigned short, ushort2, 4)
HKV_EMU_VEC4(unsigned short, ushort4, 8)
HKV_EMU_VEC4(unsigned char, uchar4, 4)
HKV_EMU_VEC2(double, double2, 16)
HKV_EMU_VEC2(long long, longlong2, 16)
#undef HKV_EMU_VEC2
#undef HKV_EMU_VEC3
#undef HKV_EMU_VEC4

static inline float2 __half22float2(__half2 h) { return make_float2(__half2float(h.x), __half2float(h.y)); }
static inline __half2 __float22half2_rn(float2 f) { return __floats2half2_rn(f.x, f.y); }
static inline float2 __bfloat1622float2(__nv_bfloat162 b)
{
    return make_float2(__bfloat162float(b.x), __bfloat162float(b.y));
}

static constexpr int warpSize = 32;

namespace hkv_emu {

/* What a running CUDA thread reads: its index and its block's. */
struct block_view {
    uint3 idx;
    dim3 dim, grid;
    void *dyn_smem;
    uint64_t serial;   /* unique per block run: tells state kept per warp (emu_wmma.h) it is stale */
};
struct thread_view {
    uint3 idx;
    const block_view *block;
};
/* The running CUDA thread (set by the block scheduler before each switch).
 * A function rather than the thread_local itself: GCC's UBSan reports a
 * false null load on extern thread_local reads inside fibers. */
const thread_view *current_thread(void);

/* The call site of a barrier or collective, for divergence reports. */
#define HKV_EMU_STR2(x) #x
#define HKV_EMU_STR(x) HKV_EMU_STR2(x)
#define HKV_EMU_SITE __FILE__ ":" HKV_EMU_STR(__LINE__)

/* Block barrier; mode 0 plain, 1 count, 2 and, 3 or (the __syncthreads_*
 * variants). Returns the reduction. */
int block_barrier(const char *site, int mode, int pred);

enum warp_op_kind { W_IDX, W_UP, W_DOWN, W_XOR, W_BALLOT, W_ANY, W_ALL, W_SYNC, W_RADD,
                    W_RMIN, W_RMAX, W_MATCH_ANY, W_MATCH_ALL,
                    /* the xor butterfly over a full warp (hkv_warp_butterfly) */
                    W_TREE_FSUM, W_TREE_FMAX, W_TREE_DSUM };
/* A warp collective over the lanes in mask; v carries up to 8 bytes. */
uint64_t warp_op(warp_op_kind op, unsigned mask, uint64_t v, int arg, int width, int vbytes,
                 const char *site);
unsigned active_mask(void);
/* A fault found by device-side model code (emu_wmma.h's checks): stops the
 * block and the grid as the emulator's own faults do, naming the thread. */
[[noreturn]] void kernel_fault(const char *what);

template <class T>
static inline T warp_value(warp_op_kind op, const char *site, unsigned mask, T v, int arg, int width)
{
    static_assert(sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = warp_op(op, mask, u, arg, width, (int)sizeof(T), site);
    T r;
    memcpy(&r, &u, sizeof r);
    return r;
}
template <class T>
static inline T shfl_idx(const char *s, unsigned m, T v, int src, int w = 32) { return warp_value(W_IDX, s, m, v, src, w); }
template <class T>
static inline T shfl_up(const char *s, unsigned m, T v, unsigned d, int w = 32) { return warp_value(W_UP, s, m, v, (int)d, w); }
template <class T>
static inline T shfl_down(const char *s, unsigned m, T v, unsigned d, int w = 32) { return warp_value(W_DOWN, s, m, v, (int)d, w); }
template <class T>
static inline T shfl_xor(const char *s, unsigned m, T v, int lm, int w = 32) { return warp_value(W_XOR, s, m, v, lm, w); }
/* for (o = 16; o > 0; o >>= 1) x = x OP __shfl_xor_sync(0xffffffff, x, o),
 * as one collective: each lane gets the value those five shuffles give it,
 * computed with the same operations on the same operands in the same order
 * (so the same bits), for a fifth of the stack switches. gpu_internal.cuh's
 * hkv_warp_sum/max take it in an emulator build: they are most of the
 * collectives the decode products make (a warp sum per row and token). */
static inline float warp_tree(const char *s, warp_op_kind op, float v)
{
    return warp_value(op, s, 0xffffffffu, v, 0, 32);
}
static inline double warp_tree(const char *s, warp_op_kind op, double v)
{
    return warp_value(op, s, 0xffffffffu, v, 0, 32);
}
/* __syncwarp() or __syncwarp(mask): the site is bound first, the optional
 * mask applied by the call. */
struct syncwarp_at {
    const char *site;
    void operator()(unsigned m = 0xffffffffu) const { warp_op(W_SYNC, m, 0, 0, 32, 0, site); }
};
template <class T>
static inline unsigned match_any(const char *s, unsigned m, T v)
{
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return (unsigned)warp_op(W_MATCH_ANY, m, u, 0, 32, (int)sizeof(T), s);
}

/* __reduce_min/max_sync: the int overloads compare signed (redux.sync.s32),
 * the unsigned ones unsigned; arg carries which. */
static inline int reduce_minmax(const char *s, warp_op_kind op, unsigned m, int v)
{
    return (int)(uint32_t)warp_op(op, m, (uint32_t)v, 1, 32, 4, s);
}
static inline unsigned reduce_minmax(const char *s, warp_op_kind op, unsigned m, unsigned v)
{
    return (unsigned)warp_op(op, m, v, 0, 32, 4, s);
}

/* The running block's dynamic shared memory (HKV_DYN_SHARED). */
static inline void *dyn_shared(void) { return current_thread()->block->dyn_smem; }

/* ---- launches: arguments captured by value at the launch, as the driver does ---- */
struct kernel_body {
    virtual ~kernel_body() {}
    virtual void run() = 0;   /* one CUDA thread's execution of the kernel */
};
template <class... P>
struct kernel_call final : kernel_body {
    void (*fn)(P...);
    std::tuple<P...> args;
    kernel_call(void (*f)(P...), std::tuple<P...> &&a) : fn(f), args(std::move(a)) {}
    void run() override { std::apply(fn, args); }
};
/* Takes ownership of body; reports configuration errors through
 * cudaGetLastError as a device does. */
void launch(kernel_body *body, const void *fn, const char *name, dim3 grid, dim3 block,
            size_t smem, cudaStream_t stream);

template <class... P>
struct launcher {
    void (*fn)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <class... A>
    void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
        launch(new kernel_call<P...>(fn, std::tuple<P...>(std::forward<A>(a)...)), (const void *)fn,
               name, grid, block, smem, stream);
    }
};
template <class... P>
static inline launcher<P...> make_launcher(void (*fn)(P...), const char *name, dim3 grid, dim3 block,
                                           size_t smem = 0, cudaStream_t stream = 0)
{
    return launcher<P...>{fn, name, grid, block, smem, stream};
}

cudaError_t func_set_attribute(const void *fn, cudaFuncAttribute attr, int value);

}  // namespace hkv_emu

template <class... P>
static inline cudaError_t cudaFuncSetAttribute(void (*fn)(P...), cudaFuncAttribute attr, int value)
{
    return hkv_emu::func_set_attribute((const void *)fn, attr, value);
}

#define HKV_EMU_LAUNCH(kernel, grid, block, smem, stream) \
    hkv_emu::make_launcher(kernel, #kernel, (grid), (block), (smem), (stream))
#define HKV_EMU_DYN_SHARED(T, name) T *const name = (T *)hkv_emu::dyn_shared()

/* ---- built-in variables ---- */
#define threadIdx (hkv_emu::current_thread()->idx)
#define blockIdx (hkv_emu::current_thread()->block->idx)
#define blockDim (hkv_emu::current_thread()->block->dim)
#define gridDim (hkv_emu::current_thread()->block->grid)

/* ---- barriers and warp collectives (CUDA Programming Guide, "Synchronization
 * Functions", "Warp Shuffle Functions", "Warp Vote Functions") ---- */
#define __syncthreads() hkv_emu::block_barrier(HKV_EMU_SITE, 0, 1)
#define __syncthreads_count(p) hkv_emu::block_barrier(HKV_EMU_SITE, 1, (p) != 0)
#define __syncthreads_and(p) hkv_emu::block_barrier(HKV_EMU_SITE, 2, (p) != 0)
#define __syncthreads_or(p) hkv_emu::block_barrier(HKV_EMU_SITE, 3, (p) != 0)
#define __syncwarp(...) hkv_emu::syncwarp_at{HKV_EMU_SITE}(__VA_ARGS__)
#define __shfl_sync(...) hkv_emu::shfl_idx(HKV_EMU_SITE, __VA_ARGS__)
#define __shfl_up_sync(...) hkv_emu::shfl_up(HKV_EMU_SITE, __VA_ARGS__)
#define __shfl_down_sync(...) hkv_emu::shfl_down(HKV_EMU_SITE, __VA_ARGS__)
#define __shfl_xor_sync(...) hkv_emu::shfl_xor(HKV_EMU_SITE, __VA_ARGS__)
#define __ballot_sync(m, p) \
    ((unsigned)hkv_emu::warp_op(hkv_emu::W_BALLOT, (m), (p) != 0, 0, 32, 4, HKV_EMU_SITE))
#define __any_sync(m, p) ((int)hkv_emu::warp_op(hkv_emu::W_ANY, (m), (p) != 0, 0, 32, 4, HKV_EMU_SITE))
#define __all_sync(m, p) ((int)hkv_emu::warp_op(hkv_emu::W_ALL, (m), (p) != 0, 0, 32, 4, HKV_EMU_SITE))
#define __reduce_add_sync(m, v) \
    ((unsigned)hkv_emu::warp_op(hkv_emu::W_RADD, (m), (uint32_t)(v), 0, 32, 4, HKV_EMU_SITE))
#define __reduce_min_sync(m, v) hkv_emu::reduce_minmax(HKV_EMU_SITE, hkv_emu::W_RMIN, (m), (v))
#define __reduce_max_sync(m, v) hkv_emu::reduce_minmax(HKV_EMU_SITE, hkv_emu::W_RMAX, (m), (v))
#define __match_any_sync(m, v) hkv_emu::match_any(HKV_EMU_SITE, (m), (v))
#define __activemask() hkv_emu::active_mask()

/* ---- memory fences, clocks ---- */
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline long long clock64(void) { return (long long)__builtin_ia32_rdtsc(); }
static inline void __nanosleep(unsigned) {}
template <class T>
static inline T __ldg(const T *p) { return *p; }

/* ---- pipeline primitives (cuda_pipeline_primitives.h; Programming Guide,
 * "Pipeline Primitives Interface"): an asynchronous copy of size_and_align
 * bytes (4, 8 or 16, both addresses aligned to it) from global to shared
 * memory, its last zfill bytes zeros. The copy may complete at any time
 * before the __pipeline_wait_prior that covers its batch: here it completes
 * at once, so commit and wait have nothing left to do. ---- */
static inline void __pipeline_memcpy_async(void *dst, const void *src, size_t size_and_align,
                                           size_t zfill = 0)
{
    if ((size_and_align != 4 && size_and_align != 8 && size_and_align != 16) || zfill > size_and_align)
        hkv_emu::kernel_fault("__pipeline_memcpy_async: size_and_align must be 4, 8 or 16, zfill at most that");
    if ((uintptr_t)dst % size_and_align || (uintptr_t)src % size_and_align)
        hkv_emu::kernel_fault("__pipeline_memcpy_async: misaligned address");
    memcpy(dst, src, size_and_align - zfill);
    memset((char *)dst + (size_and_align - zfill), 0, zfill);
}
static inline void __pipeline_commit(void) {}
static inline void __pipeline_wait_prior(size_t) {}

/* ---- atomics: relaxed, as CUDA's atomic functions are ---- */
#define HKV_EMU_ATOMIC_INT(T)                                                                    \
    static inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }   \
    static inline T atomicXor(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
    static inline T atomicCAS(T *p, T cmp, T v)                                                  \
    {                                                                                            \
        __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);      \
        return cmp;                                                                              \
    }                                                                                            \
    static inline T atomicMin(T *p, T v)                                                         \
    {                                                                                            \
        T o = __atomic_load_n(p, __ATOMIC_RELAXED);                                              \
        while (v < o && !__atomic_compare_exchange_n(p, &o, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return o;                                                                                \
    }                                                                                            \
    static inline T atomicMax(T *p, T v)                                                         \
    {                                                                                            \
        T o = __atomic_load_n(p, __ATOMIC_RELAXED);                                              \
        while (v > o && !__atomic_compare_exchange_n(p, &o, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
        return o;                                                                                \
    }
HKV_EMU_ATOMIC_INT(int)
HKV_EMU_ATOMIC_INT(unsigned int)
HKV_EMU_ATOMIC_INT(long long)
HKV_EMU_ATOMIC_INT(unsigned long long)
#undef HKV_EMU_ATOMIC_INT

template <class F>
static inline F hkv_emu_atomic_fadd(F *p, F v)
{
    F o, n;
    __atomic_load(p, &o, __ATOMIC_RELAXED);
    do n = o + v;
    while (!__atomic_compare_exchange(p, &o, &n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return o;
}
static inline float atomicAdd(float *p, float v) { return hkv_emu_atomic_fadd(p, v); }
static inline double atomicAdd(double *p, double v) { return hkv_emu_atomic_fadd(p, v); }
static inline float atomicExch(float *p, float v)
{
    float o;
    __atomic_exchange(p, &v, &o, __ATOMIC_RELAXED);
    return o;
}
static inline unsigned atomicInc(unsigned *p, unsigned lim)
{
    unsigned o = __atomic_load_n(p, __ATOMIC_RELAXED), n;
    do n = o >= lim ? 0 : o + 1;
    while (!__atomic_compare_exchange_n(p, &o, n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return o;
}
static inline unsigned atomicDec(unsigned *p, unsigned lim)
{
    unsigned o = __atomic_load_n(p, __ATOMIC_RELAXED), n;
    do n = (o == 0 || o > lim) ? lim : o - 1;
    while (!__atomic_compare_exchange_n(p, &o, n, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return o;
}

/* ---- integer and bit intrinsics (CUDA Math API, "Integer Intrinsics") ---- */
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline unsigned __brev(unsigned x)
{
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
/* result byte n = byte (s >> 4n) & 7 of the 8 bytes y:x (x the low four) */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++) r |= (unsigned)(v >> (8 * ((s >> (4 * n)) & 7)) & 0xff) << (8 * n);
    return r;
}
static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b)
{
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

/* ---- type punning ---- */
static inline unsigned __float_as_uint(float f) { return hkv_emu::f32_bits(f); }
static inline int __float_as_int(float f) { return (int)hkv_emu::f32_bits(f); }
static inline float __uint_as_float(unsigned u) { return hkv_emu::bits_f32(u); }
static inline float __int_as_float(int u) { return hkv_emu::bits_f32((unsigned)u); }
static inline long long __double_as_longlong(double d) { long long r; memcpy(&r, &d, 8); return r; }
static inline double __longlong_as_double(long long u) { double r; memcpy(&r, &u, 8); return r; }

/* ---- float intrinsics. The fast ones are as accurate as the host's libm
 * here, more than on a GPU (CUDA Programming Guide, "Intrinsic Functions",
 * gives their maximum ulp error there): tests must allow the GPU's bounds. ---- */
/* glibc declares these names itself (bits/mathcalls.h): macros, after <cmath>. */
#define __expf(x) expf(x)
#define __exp10f(x) exp10f(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __sincosf(x, s, c) sincosf((x), (s), (c))
#define __powf(a, b) powf((a), (b))
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline double rsqrt(double a) { return 1.0 / sqrt(a); }
static inline float __saturatef(float a) { return a != a ? 0.0f : a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline int __float2int_rn(float a) { return (int)nearbyintf(a); }
static inline int __float2int_rz(float a) { return (int)truncf(a); }
static inline int __float2int_rd(float a) { return (int)floorf(a); }
static inline int __float2int_ru(float a) { return (int)ceilf(a); }
static inline unsigned __float2uint_rn(float a) { return (unsigned)nearbyintf(a); }
static inline float __int2float_rn(int a) { return (float)a; }
static inline float __uint2float_rn(unsigned a) { return (float)a; }

#endif

/* Warp-level tensor-core primitives with the fragment layouts the PTX ISA
 * specifies (gpu/emu/emu_mma.h spells them out), for kernels that keep a
 * softmax in registers: mma.sync m16n8k16 (f16 in, f32 accumulate) and
 * ldmatrix x4 from shared memory, plain and transposed. sm_80 and newer;
 * the emulator build runs gpu/emu/emu_mma.h in their place. */
#ifndef HKV_MMA_FRAG_CUH
#define HKV_MMA_FRAG_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#ifdef HKV_CUDA_EMU
#include "emu/emu_mma.h"
#endif

/* The emulator has every primitive; nvcc only for sm_80 and up (a kernel
 * built for less must not be launched: hkv_mma_kernel_ok). */
#if defined(HKV_CUDA_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#define HKV_MMA_OK 1
#endif

/* a and b as hi + lo in fp16 pairs: hi = fp16(x), lo = fp16(x - hi). */
__device__ __forceinline__ void hkv_split_h2(float a, float b, uint32_t *hi, uint32_t *lo)
{
    const __half2 h = __floats2half2_rn(a, b);
    const float2 f = __half22float2(h);
    const __half2 l = __floats2half2_rn(a - f.x, b - f.y);
    memcpy(hi, &h, 4);
    memcpy(lo, &l, 4);
}

#ifdef HKV_CUDA_EMU
#define hkv_mma16816(d, a, b) hkv_emu::mma::mma16816((d), (a), (b), (d), __FILE__, __LINE__)
#define hkv_ldsm_x4(r, p) hkv_emu::mma::ldsm_x4((r), (p), 0, __FILE__, __LINE__)
#define hkv_ldsm_x4_t(r, p) hkv_emu::mma::ldsm_x4((r), (p), 1, __FILE__, __LINE__)
#elif defined(HKV_MMA_OK)
/* d += a b */
__device__ __forceinline__ void hkv_mma16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* p: this lane's row of the four 8x8 matrices (lane l: row l % 8 of matrix l / 8) */
__device__ __forceinline__ void hkv_ldsm_x4(uint32_t r[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void hkv_ldsm_x4_t(uint32_t r[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
#endif

#endif

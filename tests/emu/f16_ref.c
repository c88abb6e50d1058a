/* A second, hardware reference for float -> binary16 rounding in the emulator
 * tests: the x86 F16C instruction VCVTPS2PH with its rounding mode taken from
 * the immediate (IEEE 754 rounding in all four modes, subnormals included).
 * Compiled with -mf16c (tests/emu/meson.build); used only when the CPU has
 * F16C (test_emu_half.cu asks first). */
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>

int emu_ref_have_f16c(void)
{
    /* CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports knows no "f16c") */
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* mode: 0 to nearest even, 1 toward zero, 2 down, 3 up */
uint16_t emu_ref_f16c(float f, int mode)
{
    switch (mode) {
    case 0: return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    case 1: return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    case 2: return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    default: return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
    }
}

float emu_ref_f16c_to_float(uint16_t h) { return _cvtsh_ss(h); }

/* A second, hardware reference for float -> binary16 rounding in the emulator
 * tests: the x86 F16C instruction VCVTPS2PH with its rounding mode taken from
 * the immediate (IEEE 754 rounding in all four modes, subnormals included).
 * Compiled with -mf16c (tests/emu/meson.build); used only when the CPU has
 * F16C (test_emu_half.cu asks first). */
#include <immintrin.h>
#include <stdint.h>

int emu_ref_have_f16c(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c");
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

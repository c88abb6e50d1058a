/* Shim: nvcuda::wmma (m16n16k16, half in, float/half accumulator), from the emulator (-Dgpu_emu=true). */
#include "../emu_wmma.h"

/* Shim: the cuBLAS subset, from the emulator (-Dgpu_emu=true). */
#include "../emu_cublas.h"

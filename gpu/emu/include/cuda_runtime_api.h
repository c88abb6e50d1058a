/* Shim: the CUDA runtime API, as the emulator provides it (-Dgpu_emu=true). */
#include "../emu_runtime.h"

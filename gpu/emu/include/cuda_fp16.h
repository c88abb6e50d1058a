/* Shim: fp16 types and conversions, from the emulator (-Dgpu_emu=true). */
#include "../emu_device.h"

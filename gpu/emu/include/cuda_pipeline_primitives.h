/* Shim: the pipeline primitives (asynchronous global-to-shared copies), from the emulator (-Dgpu_emu=true). */
#include "../emu_device.h"

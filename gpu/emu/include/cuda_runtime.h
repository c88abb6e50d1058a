/* Shim: what nvcc's cuda_runtime.h gives a .cu file, from the emulator
 * (-Dgpu_emu=true): the runtime API and, in C++, the device side. */
#include "../emu_runtime.h"
#ifdef __cplusplus
#include "../emu_device.h"
#endif

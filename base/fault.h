/* Fault injection (meson -Dfault_inject=true, tests/fault): with
 * HKV_FAULT_AT=N in the environment the N-th allocation of the process
 * fails, once. The malloc family of the project's own code is wrapped at link
 * time (-Wl,--wrap=malloc,...: base/fault.c), so the libraries' allocations
 * (libc's own, OpenMP, oneDNN) are neither counted nor failed; allocations
 * that are not malloc (page-locked host memory) ask hkv_fault_hit(). With
 * HKV_FAULT_REPORT=PATH the count of allocations is written there at exit,
 * which is how the walk learns how far to go. In other builds
 * hkv_fault_hit() is 0 and nothing is wrapped. */
#ifndef HKV_FAULT_H
#define HKV_FAULT_H

#ifdef HKV_FAULT_INJECT
/* Count one allocation; 1 when it is the one to fail. */
int hkv_fault_hit(void);
#else
static inline int hkv_fault_hit(void) { return 0; }
#endif

#endif

/* Fault injection (meson -Dfault_inject=true, tests/fault): with
 * HKV_FAULT_AT=N in the environment the N-th allocation of the process
 * fails, once. The malloc family of the project's own code is wrapped at link
 * time (-Wl,--wrap=malloc,...: base/fault.c), so the libraries' allocations
 * (libc's own, OpenMP, oneDNN) are neither counted nor failed; allocations
 * that are not malloc (page-locked host memory, device memory) ask
 * hkv_fault_hit_kind(). With
 * HKV_FAULT_REPORT=PATH the count of allocations is written there at exit,
 * which is how the walk learns how far to go. In other builds
 * hkv_fault_hit_kind() is 0 and nothing is wrapped. */
#ifndef HKV_FAULT_H
#define HKV_FAULT_H

/* What an allocation is: HKV_FAULT_KINDS (a comma list of host, pinned,
 * device; default all) picks the kinds that are counted and may fail, so a
 * walk can take the device's allocations alone (the host's are many more). */
enum hkv_fault_kind { HKV_FAULT_HOST = 1, HKV_FAULT_PINNED = 2, HKV_FAULT_DEVICE = 4 };

#ifdef __cplusplus
extern "C" {
#endif
#ifdef HKV_FAULT_INJECT
/* Count one allocation of this kind; 1 when it is the one to fail. */
int hkv_fault_hit_kind(int kind);
#else
static inline int hkv_fault_hit_kind(int kind) { (void)kind; return 0; }
#endif
#ifdef __cplusplus
}
#endif

#endif

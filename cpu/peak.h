/* Compute-peak probe: the throughput of each instruction family the host
 * kernels use, on all OpenMP threads, beside the bandwidth probe
 * (hkv_bandwidth_probe) so kernels can be shown against their roofline. */
#ifndef HKV_CPU_PEAK_H
#define HKV_CPU_PEAK_H

/* Operations per second; 0 where this CPU (or this build) lacks the family.
 * A multiply-add counts as 2 operations in every family. */
typedef struct hkv_peak {
    double int8_ops;    /* vpdpbusd on zmm (AVX512-VNNI): u8 x s8 -> s32 */
    double bf16_flops;  /* vdpbf16ps on zmm (AVX512-BF16): bf16 x bf16 -> f32 */
    double fp32_flops;  /* vfmadd on the widest vectors the table uses (zmm or ymm) */
    double amx_int8_ops;    /* tdpbssd (AMX-INT8, the FAST products' tiles) */
    double amx_bf16_flops;  /* tdpbf16ps (AMX-BF16, the FAST prefill attention) */
} hkv_peak;

/* Fills *out; isa caps the vector width of the fp32 loop (enum hkv_isa, as
 * the kernel table), the int8/bf16 loops run where the CPU has them. Each
 * family runs `reps` timed repetitions of a few ms on every OpenMP thread at
 * once, each thread timed by its own CPU time (a thread the OS descheduled
 * does not lower the ceiling); the best sum counts. Returns 0, or -1 if
 * nothing could be measured. */
int hkv_compute_peak(hkv_peak *out, int isa, int reps);

#endif

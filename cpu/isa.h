/* Runtime ISA detection for the host kernels. AVX-512 counts only when the
 * CPU has F/BW/VL/DQ and F16C and the OS saves ZMM state (XCR0), so a binary
 * never executes an instruction the machine cannot run. */
#ifndef HKV_ISA_H
#define HKV_ISA_H

enum hkv_isa {
    HKV_ISA_SCALAR = 0,
    HKV_ISA_AVX2 = 1,     /* AVX2 + FMA + F16C */
    HKV_ISA_AVX512 = 2,   /* AVX-512 F/BW/VL/DQ + F16C */
};
/* Or'ed into a level asked of hkv_cpu_kernels_init: the FAST products on
 * AVX2 without AVX-VNNI even where the CPU has it (an AVX2-only CPU's
 * kernels, for timings and tests on a newer one). "avx2-novnni" parses to
 * HKV_ISA_AVX2 | HKV_ISA_NO_AVXVNNI. */
#define HKV_ISA_NO_AVXVNNI 0x100

typedef struct hkv_isa_info {
    int avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, avx512_fp16, avx512_vnni;
    int avx_vnni;             /* AVX-VNNI: vpdpbusd at 256 bits, VEX-encoded */
    int amx_bf16, amx_int8;
    int os_avx, os_avx512, os_amx;
    int best;                 /* enum hkv_isa: best level usable here */
} hkv_isa_info;

void hkv_isa_detect(hkv_isa_info *out);
const char *hkv_isa_name(int isa);
/* 1 when AMX-INT8 tiles are usable by this process: the CPU has them, the
 * OS saves their state (XCR0) and, on Linux, grants this process the tile
 * data on request (arch_prctl ARCH_REQ_XCOMP_PERM; once granted it stays).
 * Else 0. */
int hkv_amx_request(const hkv_isa_info *info);
/* Parse "scalar" | "avx2" | "avx2-novnni" | "avx512"; -1 if unknown. */
int hkv_isa_parse(const char *s);

#endif

/* Runtime ISA detection: CPUID leaves 1 and 7 (subleaves 0 and 1) say what
 * the CPU implements, XCR0 (XGETBV) says which register state the OS saves.
 * A vector level counts only when both agree. Baseline code: this file runs
 * before anything else is known about the CPU. */
#include <string.h>

#include "isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static int bit(unsigned v, int b) { return (int)((v >> b) & 1u); }

/* XGETBV is only legal when CPUID.1:ECX.OSXSAVE is set; checked by caller. */
static unsigned long long read_xcr0(void)
{
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

void hkv_isa_detect(hkv_isa_info *out)
{
    memset(out, 0, sizeof *out);
    unsigned a, b, c, d;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 1 || !__get_cpuid(1, &a, &b, &c, &d)) return;
    int osxsave = bit(c, 27), avx = bit(c, 28);
    out->fma = bit(c, 12);
    out->f16c = bit(c, 29);

    if (osxsave) {
        unsigned long long xcr0 = read_xcr0();
        out->os_avx = (xcr0 & 0x6) == 0x6;                /* SSE + AVX (YMM) state */
        out->os_avx512 = out->os_avx && (xcr0 & 0xe0) == 0xe0;   /* opmask, ZMM_Hi256, Hi16_ZMM */
        out->os_amx = (xcr0 & 0x60000) == 0x60000;        /* XTILECFG + XTILEDATA */
    }
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        out->avx2 = bit(b, 5);
        out->avx512f = bit(b, 16);
        out->avx512dq = bit(b, 17);
        out->avx512bw = bit(b, 30);
        out->avx512vl = bit(b, 31);
        out->avx512_vnni = bit(c, 11);
        out->avx512_fp16 = bit(d, 23);
        int amx_tile = bit(d, 24);                        /* the tile unit itself */
        out->amx_bf16 = amx_tile && bit(d, 22);
        out->amx_int8 = amx_tile && bit(d, 25);
        unsigned max_sub = a;
        if (max_sub >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            out->avx_vnni = bit(a, 4);
            out->avx512_bf16 = bit(a, 5);
        }
    }

    int avx2_ok = avx && out->os_avx && out->avx2 && out->fma && out->f16c;
    int avx512_ok = avx2_ok && out->os_avx512 && out->avx512f && out->avx512bw &&
                    out->avx512vl && out->avx512dq;
    out->best = avx512_ok ? HKV_ISA_AVX512 : avx2_ok ? HKV_ISA_AVX2 : HKV_ISA_SCALAR;
}

#else

void hkv_isa_detect(hkv_isa_info *out)
{
    memset(out, 0, sizeof *out);
    out->best = HKV_ISA_SCALAR;
}

#endif

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#define HKV_ARCH_REQ_XCOMP_PERM 0x1023   /* <asm/prctl.h>, Linux 5.16 */
#define HKV_XFEATURE_XTILEDATA 18
#endif

int hkv_amx_request(const hkv_isa_info *info)
{
    if (!info || !info->amx_int8 || !info->os_amx) return 0;
#if defined(__linux__) && defined(__x86_64__)
    return syscall(SYS_arch_prctl, HKV_ARCH_REQ_XCOMP_PERM, HKV_XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

static const char *const isa_names[] = {"scalar", "avx2", "avx512"};

const char *hkv_isa_name(int isa)
{
    if (isa < HKV_ISA_SCALAR || isa > HKV_ISA_AVX512) return "unknown";
    return isa_names[isa];
}

int hkv_isa_parse(const char *s)
{
    if (!s) return -1;
    for (int i = HKV_ISA_SCALAR; i <= HKV_ISA_AVX512; i++)
        if (strcmp(s, isa_names[i]) == 0) return i;
    if (strcmp(s, "avx2-novnni") == 0) return HKV_ISA_AVX2 | HKV_ISA_NO_AVXVNNI;
    return -1;
}

/* ISA detection and table filling:
 *  - hkv_isa_name / hkv_isa_parse round-trip every level, reject unknown;
 *  - the detected best level is consistent with the reported feature bits
 *    (AVX-512 needs F/BW/VL/DQ + OS ZMM state, AVX2 needs FMA/F16C + OS YMM);
 *  - hkv_cpu_kernels_init clamps a request above the best level to the best,
 *    gives every level up to the best exactly, and fills every entry. */
#include "util.h"

int main(void)
{
    for (int i = HKV_ISA_SCALAR; i <= HKV_ISA_AVX512; i++) {
        const char *name = hkv_isa_name(i);
        CHECK(hkv_isa_parse(name) == i, "parse(name(%d)=%s) != %d", i, name, i);
    }
    CHECK(hkv_isa_parse("avx512") == HKV_ISA_AVX512, "avx512");
    CHECK(hkv_isa_parse("sse") == -1, "unknown name accepted");
    CHECK(hkv_isa_parse("") == -1, "empty name accepted");
    CHECK(hkv_isa_parse(NULL) == -1, "NULL accepted");
    CHECK(strcmp(hkv_isa_name(7), "unknown") == 0, "name of bad level");

    hkv_isa_info info;
    hkv_isa_detect(&info);
    printf("detected: best=%s avx2=%d fma=%d f16c=%d avx512 f/bw/vl/dq=%d/%d/%d/%d bf16=%d fp16=%d "
           "vnni=%d amx bf16/int8=%d/%d os avx/avx512/amx=%d/%d/%d\n",
           hkv_isa_name(info.best), info.avx2, info.fma, info.f16c, info.avx512f, info.avx512bw,
           info.avx512vl, info.avx512dq, info.avx512_bf16, info.avx512_fp16, info.avx512_vnni,
           info.amx_bf16, info.amx_int8, info.os_avx, info.os_avx512, info.os_amx);
    if (info.best >= HKV_ISA_AVX2)
        CHECK(info.avx2 && info.fma && info.f16c && info.os_avx, "avx2 level without its bits");
    if (info.best >= HKV_ISA_AVX512)
        CHECK(info.avx512f && info.avx512bw && info.avx512vl && info.avx512dq && info.os_avx512,
              "avx512 level without its bits");
    if (info.best < HKV_ISA_AVX512)
        CHECK(!(info.avx512f && info.avx512bw && info.avx512vl && info.avx512dq && info.os_avx512 &&
                info.best == HKV_ISA_AVX2),
              "avx512 usable but not chosen");
#if defined(__x86_64__)
    /* cross-check against the compiler's own CPU probe */
    __builtin_cpu_init();
    CHECK(info.avx2 == !!__builtin_cpu_supports("avx2"), "avx2 bit disagrees with gcc");
    CHECK(info.avx512f == !!__builtin_cpu_supports("avx512f"), "avx512f bit disagrees with gcc");
    CHECK(info.avx512bw == !!__builtin_cpu_supports("avx512bw"), "avx512bw bit disagrees");
#endif

    hkv_cpu_kernels t;
    CHECK(hkv_cpu_kernels_init(&t, 99) == info.best, "request above best not clamped");
    CHECK(t.isa == info.best, "table isa field");
    CHECK(hkv_cpu_kernels_init(&t, -3) == HKV_ISA_SCALAR, "negative request not scalar");
    for (int i = HKV_ISA_SCALAR; i <= info.best; i++) {
        memset(&t, 0, sizeof t);
        CHECK(hkv_cpu_kernels_init(&t, i) == i, "level %s not given", hkv_isa_name(i));
        CHECK(t.gemv && t.dequant_rows && t.attn_dense && t.attn_sparse && t.attn_causal &&
                  t.score_max && t.score_max_i8 && t.f16_to_f32 && t.f32_to_f16 && t.exp,
              "empty entry in %s table", hkv_isa_name(i));
    }
    return test_report("test_isa");
}

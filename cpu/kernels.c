/* Fills the caller's kernel table for one ISA level, clamped to what this
 * CPU and OS support, and sizes weight matrices. */
#include "kernels_impl.h"

#define HKV_FILL_TABLE(t, sfx)                   \
    do {                                         \
        (t)->gemv = hkv_gemv_##sfx;              \
        (t)->gemv_fixed = hkv_gemv_fixed_##sfx;  \
        (t)->dequant_rows = hkv_dequant_rows_##sfx; \
        (t)->attn_dense = hkv_attn_dense_##sfx;  \
        (t)->attn_sparse = hkv_attn_sparse_##sfx; \
        (t)->attn_causal = hkv_attn_causal_##sfx; \
        (t)->score_max = hkv_score_max_##sfx;    \
        (t)->score_max_i8 = hkv_score_max_i8_##sfx; \
        (t)->score_max_i4 = hkv_score_max_i4_##sfx; \
        (t)->f16_to_f32 = hkv_f16_to_f32_##sfx;  \
        (t)->f32_to_f16 = hkv_f32_to_f16_##sfx;  \
        (t)->q8_to_f16 = hkv_q8_to_f16_##sfx;    \
        (t)->attn_q8 = hkv_attn_q8_##sfx;        \
        (t)->exp = hkv_exp_##sfx;                \
    } while (0)

/* The 256-bit FAST products and prompt attention: AVX-VNNI where the CPU has it and the caller
 * did not opt out (HKV_ISA_NO_AVXVNNI), else vpmaddubsw; the same bits. */
static void fast_avx2(hkv_cpu_kernels *t, const hkv_isa_info *info, int no_vnni)
{
    t->quant_act = hkv_quant_act_avx2;
    t->qgemm = hkv_qgemm_avx2;
    t->qgemm_pack = 8;   /* both builds read qgemm_avx2.inc's layout */
    t->attn_causal_fast = hkv_attn_causal_i16_avx2;
#if defined(HKV_HAVE_AVXVNNI)
    if (info->avx_vnni && !no_vnni) {
        t->qgemm = hkv_qgemm_avxvnni;
        t->attn_causal_fast = hkv_attn_causal_i16_avxvnni;
        t->avxvnni = 1;
    }
#else
    (void)info, (void)no_vnni;
#endif
}

int hkv_cpu_kernels_init(hkv_cpu_kernels *t, int isa)
{
    hkv_isa_info info;
    hkv_isa_detect(&info);
    const int no_vnni = (isa & HKV_ISA_NO_AVXVNNI) != 0;
    if (isa >= 0) isa &= ~HKV_ISA_NO_AVXVNNI;
    if (isa > info.best) isa = info.best;
    if (isa < HKV_ISA_SCALAR) isa = HKV_ISA_SCALAR;
    t->isa = isa;
    t->batch_invariant = 0;
    t->precision = HKV_PREC_EXACT;
    t->quant_act = NULL;
    t->qgemm = NULL;
    t->qgemm_pack = 0;
    t->amx = 0;
    t->avxvnni = 0;
    t->attn_causal_fast = NULL;
    switch (isa) {
#if defined(__x86_64__)
    case HKV_ISA_AVX512:
        HKV_FILL_TABLE(t, avx512);
        if (info.avx512_vnni) {   /* the int8 products exist only with VNNI */
            t->quant_act = hkv_quant_act_avx2;   /* AVX2 is enough, and one quantiser means one rounding */
            t->qgemm = hkv_qgemm_avx512vnni;
            t->qgemm_pack = 16;   /* the VNNI and AMX kernels' layout (qgemm_vnni.h) */
            hkv_cpu_kernels_set_amx(t, 1);   /* AMX tiles where granted: the same bits */
            t->attn_causal_fast = hkv_attn_causal_i16_avx512vnni;
#if defined(HKV_HAVE_AMX_BF16)
            if (info.amx_bf16 && info.avx512_bf16 && hkv_amx_request(&info))
                t->attn_causal_fast = hkv_attn_causal_amxbf16;
#endif
        }
        break;
    case HKV_ISA_AVX2:
        HKV_FILL_TABLE(t, avx2);
        fast_avx2(t, &info, no_vnni);
        break;
#endif
    default: t->isa = HKV_ISA_SCALAR; HKV_FILL_TABLE(t, scalar); break;
    }
    return t->isa;
}

size_t hkv_wmat_bytes(const hkv_wmat *w)
{
    if (w->pack) return hkv_wmat_pack_bytes(&(hkv_wmat){.type = w->type, .rows = w->rows, .cols = w->cols}, w->pack);
    size_t n = (size_t)w->rows * (size_t)w->cols;
    size_t blocks = n / HKV_WBLOCK;
    switch (w->type) {
    case HKV_W_F32: return n * 4;
    case HKV_W_F16: return n * 2;
    case HKV_W_Q8: return n + blocks * 2;
    case HKV_W_Q4: return n / 2 + blocks * 4;
    default: return 0;
    }
}

int hkv_cpu_kernels_set_precision(hkv_cpu_kernels *t, int precision)
{
    t->precision = precision == HKV_PREC_FAST && t->qgemm && t->quant_act ? HKV_PREC_FAST
                                                                           : HKV_PREC_EXACT;
    return t->precision;
}

int hkv_cpu_kernels_set_amx(hkv_cpu_kernels *t, int on)
{
    t->amx = 0;
    if (!t->qgemm || t->isa != HKV_ISA_AVX512) return 0;   /* the 256-bit kernels have no AMX twin */
#if defined(HKV_HAVE_AMX) && defined(__x86_64__)
    hkv_isa_info info;
    hkv_isa_detect(&info);
    if (on && hkv_amx_request(&info)) {
        t->qgemm = hkv_qgemm_avx512amx;
        t->amx = 1;
        return 1;
    }
    t->qgemm = hkv_qgemm_avx512vnni;
#else
    (void)on;
#endif
    return 0;
}

static const char *const prec_names[] = {"exact", "fast"};

const char *hkv_precision_name(int precision)
{
    return precision == HKV_PREC_FAST ? prec_names[1] : prec_names[0];
}

int hkv_precision_parse(const char *s)
{
    if (!s) return -1;
    for (int i = HKV_PREC_EXACT; i <= HKV_PREC_FAST; i++)
        if (strcmp(s, prec_names[i]) == 0) return i;
    return -1;
}

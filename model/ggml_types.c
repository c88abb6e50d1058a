/* ggml tensor types: the block geometry table, half/bfloat16 conversions and
 * dequantisation to float.
 *
 * Written from the format definition (block layouts and formulas of ggml's
 * reference dequantisers). Blocks are read byte by byte in little-endian
 * order, so src needs no alignment and the code does not depend on the host's
 * byte order. Products are evaluated in the same order as the reference (and
 * as gguf-py), and this file is compiled without FP contraction (ISO C mode),
 * so results are bit-identical to the reference. */
#include "ggml_types.h"

#include <string.h>

#include "status.h"

#define QK_K 256

/* Immutable table indexed by type id; entries left zero are unknown ids
 * (including ids that ggml retired, such as 4, 5 and 31..33). */
static const hkv_ggml_type_info type_table[HKV_GGML_TYPE_LIMIT] = {
    [HKV_GGML_F32]     = {"f32", 1, 4, 1},
    [HKV_GGML_F16]     = {"f16", 1, 2, 1},
    [HKV_GGML_Q4_0]    = {"q4_0", 32, 2 + 16, 1},
    [HKV_GGML_Q4_1]    = {"q4_1", 32, 2 + 2 + 16, 1},
    [HKV_GGML_Q5_0]    = {"q5_0", 32, 2 + 4 + 16, 1},
    [HKV_GGML_Q5_1]    = {"q5_1", 32, 2 + 2 + 4 + 16, 1},
    [HKV_GGML_Q8_0]    = {"q8_0", 32, 2 + 32, 1},
    [HKV_GGML_Q8_1]    = {"q8_1", 32, 2 + 2 + 32, 0},   /* half d, half s */
    [HKV_GGML_Q2_K]    = {"q2_K", QK_K, 16 + 64 + 2 + 2, 1},
    [HKV_GGML_Q3_K]    = {"q3_K", QK_K, 32 + 64 + 12 + 2, 1},
    [HKV_GGML_Q4_K]    = {"q4_K", QK_K, 2 + 2 + 12 + 128, 1},
    [HKV_GGML_Q5_K]    = {"q5_K", QK_K, 2 + 2 + 12 + 32 + 128, 1},
    [HKV_GGML_Q6_K]    = {"q6_K", QK_K, 128 + 64 + 16 + 2, 1},
    [HKV_GGML_Q8_K]    = {"q8_K", QK_K, 4 + 256 + 32, 1},
    [HKV_GGML_IQ2_XXS] = {"iq2_xxs", QK_K, 2 + 64, 0},
    [HKV_GGML_IQ2_XS]  = {"iq2_xs", QK_K, 2 + 64 + 8, 0},
    [HKV_GGML_IQ3_XXS] = {"iq3_xxs", QK_K, 2 + 64 + 32, 0},
    [HKV_GGML_IQ1_S]   = {"iq1_s", QK_K, 2 + 32 + 16, 0},
    [HKV_GGML_IQ4_NL]  = {"iq4_nl", 32, 2 + 16, 0},
    [HKV_GGML_IQ3_S]   = {"iq3_s", QK_K, 2 + 64 + 32 + 8 + 4, 0},
    [HKV_GGML_IQ2_S]   = {"iq2_s", QK_K, 2 + 64 + 16, 0},
    [HKV_GGML_IQ4_XS]  = {"iq4_xs", QK_K, 2 + 2 + 128 + 4, 0},
    [HKV_GGML_I8]      = {"i8", 1, 1, 0},
    [HKV_GGML_I16]     = {"i16", 1, 2, 0},
    [HKV_GGML_I32]     = {"i32", 1, 4, 0},
    [HKV_GGML_I64]     = {"i64", 1, 8, 0},
    [HKV_GGML_F64]     = {"f64", 1, 8, 0},
    [HKV_GGML_IQ1_M]   = {"iq1_m", QK_K, 32 + 16 + 8, 0},
    [HKV_GGML_BF16]    = {"bf16", 1, 2, 1},
    [HKV_GGML_TQ1_0]   = {"tq1_0", QK_K, 2 + 52, 0},
    [HKV_GGML_TQ2_0]   = {"tq2_0", QK_K, 2 + 64, 0},
    [HKV_GGML_MXFP4]   = {"mxfp4", 32, 1 + 16, 0},
};

hkv_ggml_type_info hkv_ggml_type_get(int type) {
    hkv_ggml_type_info none = {NULL, 0, 0, 0};
    if (type < 0 || type >= HKV_GGML_TYPE_LIMIT) return none;
    return type_table[type];
}

size_t hkv_ggml_row_bytes(int type, int64_t n) {
    hkv_ggml_type_info t = hkv_ggml_type_get(type);
    if (!t.name || n < 0 || n % t.block_size != 0) return 0;
    uint64_t blocks = (uint64_t)(n / t.block_size);
    if (blocks > SIZE_MAX / (uint64_t)t.type_size) return 0;
    return (size_t)blocks * (size_t)t.type_size;
}

/* ---- scalar conversions ------------------------------------------------ */

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float hkv_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24, exact in float */
        float v = (float)man * 0x1p-24f;
        return bits_f32(f32_bits(v) | sign);
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t hkv_f32_to_fp16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: quiet it, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax & 0x7fffffu) >> 13));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (ax >= 0x38800000u) {
        /* normal half: rebias the exponent, round 13 dropped bits to even;
         * a carry out of the mantissa correctly bumps the exponent */
        uint32_t r = ax - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    uint32_t e = ax >> 23;
    if (e < 102) return sign; /* below 2^-25: rounds to zero (2^-25 itself ties to 0) */
    /* subnormal half: value in units of 2^-24 is m >> (126 - e), rounded */
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

float hkv_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t hkv_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    /* round to nearest even; overflow carries into inf as it should */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---- dequantisation ---------------------------------------------------- */

static float half_at(const uint8_t *p) { return hkv_fp16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static uint32_t u32_at(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* q4_0: half d, 16 bytes of nibbles; low nibbles are elements 0..15, high 16..31 */
static void dq_q4_0(const uint8_t *b, float *y) {
    float d = half_at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((b[2 + j] & 0xf) - 8) * d;
        y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
    }
}

/* q4_1: half d, half m, nibbles; y = q*d + m (product rounded, then added) */
static void dq_q4_1(const uint8_t *b, float *y) {
    float d = half_at(b), m = half_at(b + 2);
    for (int j = 0; j < 16; j++) {
        float lo = (float)(b[4 + j] & 0xf) * d, hi = (float)(b[4 + j] >> 4) * d;
        y[j] = lo + m;
        y[j + 16] = hi + m;
    }
}

/* q5_0: half d, u32 qh (bit i = 5th bit of element i), nibbles; q - 16 */
static void dq_q5_0(const uint8_t *b, float *y) {
    float d = half_at(b);
    uint32_t qh = u32_at(b + 2);
    for (int j = 0; j < 16; j++) {
        int x0 = (int)((b[6 + j] & 0xf) | (((qh >> j) & 1u) << 4)) - 16;
        int x1 = (int)((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
        y[j] = (float)x0 * d;
        y[j + 16] = (float)x1 * d;
    }
}

/* q5_1: half d, half m, u32 qh, nibbles; y = q*d + m */
static void dq_q5_1(const uint8_t *b, float *y) {
    float d = half_at(b), m = half_at(b + 2);
    uint32_t qh = u32_at(b + 4);
    for (int j = 0; j < 16; j++) {
        float lo = (float)((b[8 + j] & 0xf) | (((qh >> j) & 1u) << 4)) * d;
        float hi = (float)((b[8 + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) * d;
        y[j] = lo + m;
        y[j + 16] = hi + m;
    }
}

/* q8_0: half d, 32 int8 */
static void dq_q8_0(const uint8_t *b, float *y) {
    float d = half_at(b);
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* q2_K: scales[16] (low nibble scale, high nibble min), qs[64] of 2-bit
 * quants, half d, half dmin. Each 128 elements use 32 qs bytes at 4 shifts;
 * every 16 elements have their own scale/min. */
static void dq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = half_at(b + 80), dmin = half_at(b + 82);
    for (int g = 0; g < 16; g++) {             /* 16-element groups */
        const uint8_t *q = qs + (g / 8) * 32 + (g % 2) * 16;
        int shift = 2 * ((g % 8) / 2);
        float dl = d * (float)(sc[g] & 0xf), ml = dmin * (float)(sc[g] >> 4);
        for (int l = 0; l < 16; l++) {
            float t = dl * (float)((q[l] >> shift) & 3);
            y[16 * g + l] = t - ml;
        }
    }
}

/* q3_K: hmask[32], qs[64], scales[12] (16 six-bit scales), half d.
 * Quant = low 2 bits from qs, minus 4 when the hmask bit is clear. */
static void dq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32, *ps = b + 96;
    float d = half_at(b + 108);
    for (int g = 0; g < 16; g++) {             /* 16-element groups */
        int lo = g < 8 ? ps[g] & 0xf : ps[g - 8] >> 4;
        int hi = (ps[8 + g % 4] >> (2 * (g / 4))) & 3;
        float dl = d * (float)((lo | hi << 4) - 32);
        int bit = g / 2;                       /* hmask bit of the 32-element group */
        int shift = 2 * (bit % 4), off = (g % 2) * 16;
        const uint8_t *q = qs + (g / 8) * 32 + off;
        for (int l = 0; l < 16; l++) {
            int v = (q[l] >> shift) & 3;
            if (!((hm[off + l] >> bit) & 1)) v -= 4;
            y[16 * g + l] = dl * (float)v;
        }
    }
}

/* Six-bit scale and min j (0..7) of the 12-byte q4_K/q5_K scale field. */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* q4_K / q5_K: half d, half dmin, scales[12], [q5_K: qh[32]], qs[128].
 * 32-element group g reads qs bytes 32*(g/2).. (low nibbles when g is even,
 * high when odd) with scale/min g; q5_K adds bit g of qh[l] as the 5th bit. */
static void dq_k4_k5(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y) {
    float d = half_at(b), dmin = half_at(b + 2);
    for (int g = 0; g < 8; g++) {
        int sc, mn;
        scale_min_k4(g, b + 4, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        const uint8_t *q = qs + (g / 2) * 32;
        for (int l = 0; l < 32; l++) {
            int v = (g & 1) ? q[l] >> 4 : q[l] & 0xf;
            if (qh) v |= ((qh[l] >> g) & 1) << 4;
            float t = d1 * (float)v;
            y[32 * g + l] = t - m1;
        }
    }
}
static void dq_q4_k(const uint8_t *b, float *y) { dq_k4_k5(b, NULL, b + 16, y); }
static void dq_q5_k(const uint8_t *b, float *y) { dq_k4_k5(b, b + 16, b + 48, y); }

/* q6_K: ql[128], qh[64], int8 scales[16], half d. Per 128 elements: 64 ql
 * bytes (low nibbles for the first 64 elements, high for the next 64) and 32
 * qh bytes (2 bits per 32-element group); y = (d * scale) * (q - 32). */
static void dq_q6_k(const uint8_t *b, float *y) {
    float d = half_at(b + 208);
    for (int g = 0; g < 8; g++) {              /* 32-element groups */
        int half = g / 4, k = g % 4;
        const uint8_t *ql = b + half * 64 + (k & 1) * 32, *qh = b + 128 + half * 32;
        float d0 = d * (float)(int8_t)b[192 + 2 * g], d1 = d * (float)(int8_t)b[192 + 2 * g + 1];
        for (int l = 0; l < 32; l++) {
            int lo = k < 2 ? ql[l] & 0xf : ql[l] >> 4;
            int q = (lo | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
            y[32 * g + l] = (l < 16 ? d0 : d1) * (float)q;
        }
    }
}

/* q8_K: f32 d, int8 qs[256], int16 bsums[16] (sums, unused here) */
static void dq_q8_k(const uint8_t *b, float *y) {
    float d = bits_f32(u32_at(b));
    for (int j = 0; j < QK_K; j++) y[j] = (float)(int8_t)b[4 + j] * d;
}

typedef void (*dq_block_fn)(const uint8_t *, float *);

static dq_block_fn block_fn(int type) {
    switch (type) {
    case HKV_GGML_Q4_0: return dq_q4_0;
    case HKV_GGML_Q4_1: return dq_q4_1;
    case HKV_GGML_Q5_0: return dq_q5_0;
    case HKV_GGML_Q5_1: return dq_q5_1;
    case HKV_GGML_Q8_0: return dq_q8_0;
    case HKV_GGML_Q2_K: return dq_q2_k;
    case HKV_GGML_Q3_K: return dq_q3_k;
    case HKV_GGML_Q4_K: return dq_q4_k;
    case HKV_GGML_Q5_K: return dq_q5_k;
    case HKV_GGML_Q6_K: return dq_q6_k;
    case HKV_GGML_Q8_K: return dq_q8_k;
    default: return NULL;
    }
}

int hkv_ggml_dequant_row(int type, const void *src, float *dst, int64_t n) {
    hkv_ggml_type_info t = hkv_ggml_type_get(type);
    if (!t.name || !t.can_dequant) return HKV_E_UNSUPPORTED;
    if (n < 0 || n % t.block_size != 0) return HKV_E_INVAL;
    if (n == 0) return HKV_OK;
    if (!src || !dst) return HKV_E_INVAL;
    const uint8_t *s = src;
    switch (type) {
    case HKV_GGML_F32:
        for (int64_t i = 0; i < n; i++) dst[i] = bits_f32(u32_at(s + 4 * i));
        return HKV_OK;
    case HKV_GGML_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = hkv_fp16_to_f32((uint16_t)(s[2 * i] | s[2 * i + 1] << 8));
        return HKV_OK;
    case HKV_GGML_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = hkv_bf16_to_f32((uint16_t)(s[2 * i] | s[2 * i + 1] << 8));
        return HKV_OK;
    default: break;
    }
    dq_block_fn fn = block_fn(type);
    if (!fn) return HKV_E_INTERNAL; /* table says can_dequant but no kernel */
    int64_t nb = n / t.block_size;
    for (int64_t i = 0; i < nb; i++) fn(s + i * t.type_size, dst + i * t.block_size);
    return HKV_OK;
}

/* Products on int8 activations (precision FAST) with AVX-VNNI (Intel Alder
 * Lake and later, AMD Zen 5): vpdpbusd at 256 bits, VEX-encoded, where
 * AVX512-VNNI is absent or not asked for; the kernel is qgemm_avx2.inc, the
 * quantiser hkv_quant_act_avx2. In the table only where hkv_isa_detect saw
 * AVX-VNNI. */
#define QG2_VNNI 1
#define QG2_SFX avxvnni
#include "qgemm_avx2.inc"

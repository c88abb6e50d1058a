/* Private to the tokenizer: UTF-8, the Unicode classes the pre-tokenizer
 * regexes use (\p{L}, \p{N}, \s), and the GPT-2 byte<->code point map. */
#ifndef HKV_UNICODE_H
#define HKV_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Class of a code point as the pre-tokenizer patterns see it. */
enum hkv_ucls {
    HKV_UC_OTHER = 0,   /* none of the below */
    HKV_UC_LETTER = 1,  /* \p{L}: Lu Ll Lt Lm Lo */
    HKV_UC_NUMBER = 2,  /* \p{N}: Nd Nl No */
    HKV_UC_SPACE = 3,   /* \s: the White_Space property */
};

int hkv_uclass(uint32_t cp);

/* Decode one code point at s[0..n) (n >= 1). Sets *len to the bytes used.
 * An invalid or truncated sequence decodes as one byte with code point
 * HKV_UBAD, whose class is OTHER; the raw byte stays in the text, so byte-level
 * encoding still round-trips it. */
#define HKV_UBAD 0xFFFFFFFFu
uint32_t hkv_utf8_decode(const uint8_t *s, size_t n, size_t *len);

/* Encode cp (<= 0x10FFFF) into out (4 bytes room); returns the byte count. */
int hkv_utf8_encode(uint32_t cp, char *out);

/* GPT-2 byte-level map: every byte gets a printable code point (printable
 * Latin-1 bytes map to themselves, the rest to 256 + k in order). */
uint32_t hkv_byte_to_cp(uint8_t b);
/* Inverse; -1 when cp is not the image of a byte. */
int hkv_cp_to_byte(uint32_t cp);

#endif

#include "hash.h"

#include <string.h>

uint64_t hkv_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

uint64_t hkv_fnv1a_str(uint64_t h, const char *s) {
    return hkv_fnv1a(h, s, strlen(s));
}

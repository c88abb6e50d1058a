/* The one string hash of the tree: FNV-1a 64. Its values are part of
 * behaviour (batch's default seeds from custom_id, eval's sweep
 * fingerprints in resumable files), so it never changes. */
#ifndef HKV_HASH_H
#define HKV_HASH_H

#include <stddef.h>
#include <stdint.h>

#define HKV_FNV1A_INIT 0xcbf29ce484222325ULL   /* the offset basis: the hash of nothing */
/* The basis batch's default seeds and eval's sweep fingerprints have used
 * from the start: FNV's written in decimal with its last digit lost. Kept,
 * since those values are in users' files (resumable sweeps, reruns expected
 * to sample the same tokens); any basis hashes as well. */
#define HKV_FNV1A_INIT_V0 1469598103934665603ULL

/* h carried on over n bytes (start from HKV_FNV1A_INIT). */
uint64_t hkv_fnv1a(uint64_t h, const void *p, size_t n);
/* h carried on over a NUL-terminated string. */
uint64_t hkv_fnv1a_str(uint64_t h, const char *s);

#endif

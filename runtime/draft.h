/* The draft model of speckv and specpc: a second engine (any GGUF model
 * sharing the target's tokenizer) owned by the target engine. */
#ifndef HKV_DRAFT_H
#define HKV_DRAFT_H

#include "engine.h"

/* Open e->p.draft_path as e->draft: same threads and ISA, one sequence,
 * context = the target's, a tiered cache with the full policy (dense, as
 * the plain one) that keeps the last prompt queries SpecPC scores with.
 * Fails, naming the first difference, when the vocabularies differ in size
 * or in any token's text. */
int hkv_draft_open(hkv_engine *e, hkv_err *err);

#endif

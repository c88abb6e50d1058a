/* The tiered cache's audit switch and its top-k, changed between forward
 * calls.
 *
 * The public API sets both only when the cache is created
 * (hkv_tiered_params.audit / audit_k), but eval measures recall against
 * each configuration's own budget on one prefilled prompt, and times decode
 * with the audit off. Until the runtime has a setter
 * (hkv_kv_tiered_set_audit), this file alone reaches into the cache's
 * private state; it is the only place to change when the setter lands.
 * Both fields are read afresh by every layer step (the audit's scratch is
 * grown on demand), so changing them between forward calls is safe. */
#include "eval.h"
/* The private header's inline helpers leave parameters unused. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "kv_tiered_impl.h"
#pragma GCC diagnostic pop

int eval_set_audit(hkv_kv *kv, int on, int64_t k, hkv_err *err) {
    if (!hkv_kv_is_tiered(kv)) return hkv_seterr(err, HKV_E_INVAL, "eval needs the tiered KV cache");
    if (k < 1) return hkv_seterr(err, HKV_E_RANGE, "audit top-k %lld is out of range", (long long)k);
    tiered *t = kv->self;
    t->p.audit = on != 0;
    t->p.audit_k = k;
    return HKV_OK;
}

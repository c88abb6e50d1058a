/* The scheduler options hetkv batch and hetkv serve share (batch.h). */
#include <stddef.h>

#include "batch.h"

int hkv_sched_cli_engine_params(hkv_engine_params *ep, const char *model, const hkv_exec_cli *x,
                                const hkv_sched_cli *sc, const hkv_kv_cli *kv, hkv_device_cli *dev,
                                hkv_err *err) {
    hkv_engine_params_default(ep);
    ep->model_path = model;
    ep->n_threads = (int)x->threads;
    ep->isa = x->isa;
    ep->max_seqs = (int)(sc->max_batch + sc->prefix_cache);   /* the kept prefixes' slots */
    ep->n_ctx = sc->ctx;
    ep->max_rows = (int)sc->chunk;
    ep->device_cuda = dev->cuda;
    int rc = hkv_kv_cli_apply(kv, ep, err);
    if (rc) return rc;
    dev->queued = 1;   /* placement may make a request wait for a resident slot */
    return hkv_device_cli_check_near(dev, model, ep, kv->local >= 0, hkv_kv_cli_auto(kv),
                                     (int)sc->max_batch, sc->ctx, err);
}

void hkv_sched_cli_init(hkv_sched_cli *s) {
    s->max_batch = 8;
    s->chunk = 256;
    s->ctx = 0;
    s->mem = 0;
    s->prefix_cache = 0;
}

const hkv_opt hkv_sched_opts[] = {
    {.name = "--max-batch", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(hkv_sched_cli, max_batch),
     .lo = 1, .hi = 4096, .help = "sequences in flight (default 8)"},
    {.name = "--mem", .arg = "SIZE", .kind = HKV_OPT_SIZE, .off = offsetof(hkv_sched_cli, mem),
     .help = "host memory for the KV of the sequences in flight\n"
             "(default: free memory after loading, less 10%)"},
    {.name = "--chunk", .arg = "N", .kind = HKV_OPT_INT, .off = offsetof(hkv_sched_cli, chunk),
     .lo = 1, .hi = 65536, .help = "prompt tokens per prefill call (default 256)"},
    {.name = "--ctx", .short_name = 'c', .arg = "N", .kind = HKV_OPT_INT,
     .off = offsetof(hkv_sched_cli, ctx), .lo = 2, .hi = (double)(1LL << 31),
     .help = "context per sequence: prompt + max_tokens (default: the model's)"},
    {.name = "--prefix-cache", .arg = "N", .kind = HKV_OPT_INT,
     .off = offsetof(hkv_sched_cli, prefix_cache), .lo = 0, .hi = 256,
     .help = "keep the KV of up to N prompt prefixes (each as of its last whole\n"
             "--chunk before the prompt's end, least recently used replaced);\n"
             "a request with whole chunks in common with one, under the same\n"
             "policy, starts from them (shared by reference: held once, read\n"
             "once a step under full) and prefills only the rest, with the\n"
             "same tokens as without; ctkvr's index is shared too, built at\n"
             "each prompt's last whole chunk (default 0: off; with --device\n"
             "cuda copied, not shared; counted in --mem)"},
    {0},
};

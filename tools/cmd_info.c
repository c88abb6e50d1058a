/* hetkv info: what this machine offers hetkv (CPU, ISA, cores, NUMA, memory, GPUs). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "device.h"
#include "gpu_plan.h"
#include "synthetic.h"
#include "host_mem.h"
#include "isa.h"
#include "threads.h"

static const char info_usage[] =
    "usage: hetkv info [--json] [--synthetic NAME] [--device cpu|cuda] [--gpu-mem SIZE]\n"
    "\n"
    "Show the CPU model and instruction sets, cores and NUMA nodes (hwloc),\n"
    "memory, and CUDA devices or why there are none. --synthetic adds a synthetic\n"
    "model's shape and sizes; --device cuda the GPU memory cap run and bench would use.\n";

int hkv_cmd_info(int argc, char **argv) {
    int json = 0;
    hkv_err err;
    hkv_err_clear(&err);
    hkv_device_cli dc;
    hkv_device_cli_init(&dc);
    for (int i = 1; i < argc; i++) {
        int k = hkv_device_cli_parse(&dc, argc, argv, &i, &err);
        if (k < 0) {
            hkv_err_report(&err, stderr);
            return 2;
        }
        if (k == 1) continue;
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(info_usage, stdout);
            return 0;
        } else {
            hkv_seterr(&err, HKV_E_INVAL, "info: unknown option '%s'", argv[i]);
            hkv_err_report(&err, stderr);
            return 2;
        }
    }
    hkv_isa_info isa;
    hkv_isa_detect(&isa);
    hkv_topo_info topo;
    if (hkv_topo_query(&topo, &err)) {
        hkv_err_report(&err, stderr);
        return 1;
    }
    hkv_gpu_device gpus[16];
    int n_gpu = 0;
    char why[256];
    hkv_gpu_query(gpus, 16, &n_gpu, why, sizeof why);
    size_t mem_total = hkv_host_mem_total(), mem_free = hkv_host_mem_free();
    uint64_t cap = 0;
    char cap_desc[256] = "";
    if (hkv_device_cli_cap(&dc, &cap, cap_desc, sizeof cap_desc, &err)) {
        hkv_err_report(&err, stderr);
        return 1;
    }
    hkv_model_config mc;
    if (dc.synthetic && hkv_synthetic_config(dc.synthetic, &mc, &err)) {
        hkv_err_report(&err, stderr);
        return 1;
    }

    struct { const char *name; int on; } flags[] = {
        {"avx2", isa.avx2}, {"fma", isa.fma}, {"f16c", isa.f16c}, {"avx512f", isa.avx512f},
        {"avx512bw", isa.avx512bw}, {"avx512vl", isa.avx512vl}, {"avx512dq", isa.avx512dq},
        {"avx512_bf16", isa.avx512_bf16}, {"avx512_fp16", isa.avx512_fp16},
        {"avx512_vnni", isa.avx512_vnni}, {"amx_bf16", isa.amx_bf16}, {"amx_int8", isa.amx_int8},
    };
    const int nf = (int)(sizeof flags / sizeof flags[0]);
    if (json) {
        printf("{\"cpu\":{\"model\":");
        hkv_json_str(stdout, topo.cpu_model, strlen(topo.cpu_model));
        printf(",\"packages\":%d,\"cores\":%d,\"threads\":%d,\"numa_nodes\":%d,\"kernels\":\"%s\","
               "\"isa\":[", topo.n_packages, topo.n_cores, topo.n_pus, topo.n_numa,
               hkv_isa_name(isa.best));
        for (int i = 0, k = 0; i < nf; i++)
            if (flags[i].on) printf("%s\"%s\"", k++ ? "," : "", flags[i].name);
        printf("]},\"memory\":{\"total\":%zu,\"available\":%zu},", mem_total, mem_free);
        printf("\"cuda\":{\"built\":%s,\"backend\":\"%s\",\"devices\":[",
               hkv_gpu_built() ? "true" : "false", hkv_gpu_backend());
        for (int i = 0; i < n_gpu; i++) {
            printf("%s{\"name\":", i ? "," : "");
            hkv_json_str(stdout, gpus[i].name, strlen(gpus[i].name));
            printf(",\"device\":\"%s\",\"memory\":%zu,\"free\":%zu,\"compute_capability\":"
                   "\"%d.%d\",\"sms\":%d}", gpus[i].emulated ? "cuda-emu" : "cuda",
                   gpus[i].mem_total, gpus[i].mem_free, gpus[i].cc_major, gpus[i].cc_minor,
                   gpus[i].sm_count);
        }
        printf("]");
        if (!n_gpu) {
            printf(",\"reason\":");
            hkv_json_str(stdout, why, strlen(why));
        }
        printf("}");
        if (dc.cuda) printf(",\"gpu_cap\":%llu", (unsigned long long)cap);
        if (dc.synthetic) {
            printf(",\"synthetic\":{\"name\":");
            hkv_json_str(stdout, mc.name, strlen(mc.name));
            printf(",\"layers\":%d,\"dim\":%d,\"heads\":%d,\"kv_heads\":%d,\"head_dim\":%d,"
                   "\"ffn\":%d,\"vocab\":%d,\"ctx_train\":%d,\"params\":%llu,\"host_bytes_q4\":%llu,"
                   "\"host_bytes_f16\":%llu,\"gpu_weight_bytes_fp16\":%llu,\"kv_bytes_per_token\":%llu}",
                   mc.n_layer, mc.dim, mc.n_head, mc.n_head_kv, mc.head_dim, mc.ffn, mc.vocab,
                   mc.ctx_train, (unsigned long long)hkv_plan_param_count(&mc),
                   (unsigned long long)hkv_synthetic_host_bytes(&mc, HKV_W_Q4),
                   (unsigned long long)hkv_synthetic_host_bytes(&mc, HKV_W_F16),
                   (unsigned long long)hkv_plan_weight_bytes(&mc, 2),
                   (unsigned long long)mc.n_layer * mc.n_head_kv * mc.head_dim * 4);
        }
        printf("}\n");
        return 0;
    }
    char t[32], f[32];
    hkv_fmt_bytes((double)mem_total, t, sizeof t);
    hkv_fmt_bytes((double)mem_free, f, sizeof f);
    printf("CPU:     %s\n", topo.cpu_model);
    printf("         %d package(s), %d cores, %d hardware threads, %d NUMA node(s)\n",
           topo.n_packages, topo.n_cores, topo.n_pus, topo.n_numa);
    printf("ISA:    ");
    for (int i = 0; i < nf; i++)
        if (flags[i].on) printf(" %s", flags[i].name);
    printf("\nKernels: %s\n", hkv_isa_name(isa.best));
    printf("Memory:  %s total, %s available\n", t, f);
    if (!n_gpu) {
        printf("CUDA:    none: %s\n", why);
    } else {
        for (int i = 0; i < n_gpu; i++) {
            hkv_fmt_bytes((double)gpus[i].mem_total, t, sizeof t);
            hkv_fmt_bytes((double)gpus[i].mem_free, f, sizeof f);
            printf("CUDA %d:  %s, compute %d.%d, %d SMs, %s (%s free)%s\n", i, gpus[i].name,
                   gpus[i].cc_major, gpus[i].cc_minor, gpus[i].sm_count, t, f,
                   gpus[i].emulated ? "\n         emulated: not a GPU; it proves logic, ordering and "
                                      "memory bounds, never speed" : "");
        }
    }
    if (dc.cuda) {
        hkv_fmt_bytes((double)cap, t, sizeof t);
        printf("GPU cap: %s (%s)\n", t, cap_desc);
    }
    if (dc.synthetic) {
        char q4[32], f16[32], gw[32], kv[32];
        hkv_fmt_bytes((double)hkv_synthetic_host_bytes(&mc, HKV_W_Q4), q4, sizeof q4);
        hkv_fmt_bytes((double)hkv_synthetic_host_bytes(&mc, HKV_W_F16), f16, sizeof f16);
        hkv_fmt_bytes((double)hkv_plan_weight_bytes(&mc, 2), gw, sizeof gw);
        hkv_fmt_bytes((double)mc.n_layer * mc.n_head_kv * mc.head_dim * 4, kv, sizeof kv);
        printf("Model:   %s: %d layers, dim %d, %d/%d heads of %d, ffn %d, vocab %d, context %d\n",
               mc.name, mc.n_layer, mc.dim, mc.n_head, mc.n_head_kv, mc.head_dim, mc.ffn, mc.vocab,
               mc.ctx_train);
        printf("         %.2fB parameters; host weights %s (q4) or %s (f16); GPU weights %s "
               "(fp16); KV %s per token\n", (double)hkv_plan_param_count(&mc) / 1e9, q4, f16, gw, kv);
    }
    return 0;
}

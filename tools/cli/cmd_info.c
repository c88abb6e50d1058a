/* hetkv info: what this machine offers hetkv (CPU, ISA, cores, NUMA, memory, GPUs). */
#include <stddef.h>
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
    "model's shape and sizes; --device cuda the GPU memory cap run and bench would use.\n"
    "\n";

typedef struct info_opts {
    int json;
    hkv_device_cli dev;
} info_opts;

static const hkv_opt info_opts_table[] = {
    {.name = "--json", .kind = HKV_OPT_FLAG, .off = offsetof(info_opts, json),
     .help = "one JSON object on stdout"},
    {0},
};

int hkv_cmd_info(int argc, char **argv) {
    hkv_err err;
    hkv_err_clear(&err);
    info_opts o = {0};
    hkv_device_cli_init(&o.dev);
    const hkv_opt_use uses[] = {
        {.opts = info_opts_table, .base = &o},
        {.opts = hkv_device_opts, .base = &o.dev, .title = "Device"},
    };
    int rc = hkv_opts_parse("info", uses, 2, argc, argv, &err);
    if (rc == 1) {
        hkv_opts_help(stdout, info_usage, uses, 2);
        return 0;
    }
    if (rc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    const int json = o.json;
    hkv_device_cli dc = o.dev;
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
        {"avx512_vnni", isa.avx512_vnni}, {"avx_vnni", isa.avx_vnni}, {"amx_bf16", isa.amx_bf16}, {"amx_int8", isa.amx_int8},
    };
    const int nf = (int)(sizeof flags / sizeof flags[0]);
    if (json) {
        int bad = 0;
        json_t *o = json_object(), *cpu = json_object(), *fl = json_array();
        hkv_jset(cpu, "model", hkv_jstr(topo.cpu_model), &bad);
        hkv_jset(cpu, "packages", json_integer(topo.n_packages), &bad);
        hkv_jset(cpu, "cores", json_integer(topo.n_cores), &bad);
        hkv_jset(cpu, "threads", json_integer(topo.n_pus), &bad);
        hkv_jset(cpu, "numa_nodes", json_integer(topo.n_numa), &bad);
        hkv_jset(cpu, "kernels", json_string(hkv_isa_name(isa.best)), &bad);
        for (int i = 0; i < nf; i++)
            if (flags[i].on) hkv_jpush(fl, json_string(flags[i].name), &bad);
        hkv_jset(cpu, "isa", fl, &bad);
        hkv_jset(o, "cpu", cpu, &bad);
        json_t *mem = json_object();
        hkv_jset(mem, "total", json_integer((json_int_t)mem_total), &bad);
        hkv_jset(mem, "available", json_integer((json_int_t)mem_free), &bad);
        hkv_jset(o, "memory", mem, &bad);
        json_t *cu = json_object(), *devs = json_array();
        hkv_jset(cu, "built", json_boolean(hkv_gpu_built()), &bad);
        hkv_jset(cu, "backend", json_string(hkv_gpu_backend()), &bad);
        for (int i = 0; i < n_gpu; i++) {
            char cc[24];
            snprintf(cc, sizeof cc, "%d.%d", gpus[i].cc_major, gpus[i].cc_minor);
            json_t *g = json_object();
            hkv_jset(g, "name", hkv_jstr(gpus[i].name), &bad);
            hkv_jset(g, "device", json_string(gpus[i].emulated ? "cuda-emu" : "cuda"), &bad);
            hkv_jset(g, "memory", json_integer((json_int_t)gpus[i].mem_total), &bad);
            hkv_jset(g, "free", json_integer((json_int_t)gpus[i].mem_free), &bad);
            hkv_jset(g, "compute_capability", json_string(cc), &bad);
            hkv_jset(g, "sms", json_integer(gpus[i].sm_count), &bad);
            hkv_jpush(devs, g, &bad);
        }
        hkv_jset(cu, "devices", devs, &bad);
        if (!n_gpu) hkv_jset(cu, "reason", hkv_jstr(why), &bad);
        hkv_jset(o, "cuda", cu, &bad);
        if (dc.cuda) hkv_jset(o, "gpu_cap", json_integer((json_int_t)cap), &bad);
        if (dc.synthetic) {
            json_t *m = json_object();
            hkv_jset(m, "name", hkv_jstr(mc.name), &bad);
            hkv_jset(m, "layers", json_integer(mc.n_layer), &bad);
            hkv_jset(m, "dim", json_integer(mc.dim), &bad);
            hkv_jset(m, "heads", json_integer(mc.n_head), &bad);
            hkv_jset(m, "kv_heads", json_integer(mc.n_head_kv), &bad);
            hkv_jset(m, "head_dim", json_integer(mc.head_dim), &bad);
            hkv_jset(m, "ffn", json_integer(mc.ffn), &bad);
            hkv_jset(m, "vocab", json_integer(mc.vocab), &bad);
            hkv_jset(m, "ctx_train", json_integer(mc.ctx_train), &bad);
            hkv_jset(m, "params", json_integer((json_int_t)hkv_plan_param_count(&mc)), &bad);
            hkv_jset(m, "host_bytes_q4", json_integer((json_int_t)hkv_synthetic_host_bytes(&mc, HKV_W_Q4)),
                     &bad);
            hkv_jset(m, "host_bytes_f16",
                     json_integer((json_int_t)hkv_synthetic_host_bytes(&mc, HKV_W_F16)), &bad);
            hkv_jset(m, "gpu_weight_bytes_fp16", json_integer((json_int_t)hkv_plan_weight_bytes(&mc, 2)),
                     &bad);
            hkv_jset(m, "kv_bytes_per_token",
                     json_integer((json_int_t)mc.n_layer * mc.n_head_kv * mc.head_dim * 4), &bad);
            hkv_jset(o, "synthetic", m, &bad);
        }
        if (hkv_json_emit(stdout, o, bad, &err)) {
            hkv_err_report(&err, stderr);
            return 1;
        }
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

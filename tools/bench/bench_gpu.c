/* hetkv bench kernels --device cuda: each gpu/ kernel a decode step uses,
 * timed alone on the device with CUDA events, beside a device-to-device
 * copy measured in the same run and the data sheet of the card.
 *
 *   hetkv bench kernels --device cuda [--quick] [--json] [--reps N]
 *
 * Every rep is queued behind a spin kernel (hkv_gpu_spin) and timed between
 * two events around it, so what is measured is the device's time, not the
 * host's launch rate; the host's own enqueue time per call is printed beside
 * it (where it exceeds the device time, a step of such calls is launch-bound).
 * Memory-bound rows rotate through copies of their data adding up to many
 * times the L2 cache, as a decode step walking all layers does. Bytes are
 * what a call must read and write once (weights with their scales, K/V,
 * activations in and out; never workspace round trips), so GB/s is against
 * the roofline, not the kernel's actual traffic. Under the CUDA emulator the
 * command runs a small subset, and every figure times the emulation. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu.h"
#include "bench_gpu_impl.h"
#include "cli.h"   /* hkv_json_emit */
#include "device.h"
#include "engine.h"   /* hkv_now */

#define BG_MAX_REPS 64

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bg_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One rep: per_rep calls between the events; returns the device ms and the
 * host's enqueue seconds. */
static int one_rep(bg *b, bg_call fn, void *arg, int copies, int per_rep, int *next, double spin_us,
                   double *ms, double *enq, hkv_err *err)
{
    int rc;
    if (spin_us > 0 && (rc = hkv_gpu_spin(spin_us, b->st, err))) return rc;
    if ((rc = hkv_gpu_event_record(b->ev0, b->st, err))) return rc;
    const double t0 = hkv_now();
    for (int i = 0; i < per_rep; i++) {
        if ((rc = fn(arg, *next, err))) return rc;
        *next = (*next + 1) % copies;
    }
    *enq = hkv_now() - t0;
    float f = 0;
    if ((rc = hkv_gpu_event_record(b->ev1, b->st, err)) || (rc = hkv_gpu_event_sync(b->ev1, err)) ||
        (rc = hkv_gpu_event_elapsed(b->ev0, b->ev1, &f, err)))
        return rc;
    *ms = f;
    return HKV_OK;
}

int bg_time(bg *b, bg_call fn, void *arg, int copies, int per_rep, bg_row *row, hkv_err *err)
{
    double ms[BG_MAX_REPS], enq[BG_MAX_REPS], spin = 0;
    int next = 0, reps = b->reps, rc;
    if (copies < 1) copies = 1;
    if (per_rep < 1) per_rep = 1;
    if (b->warm) {   /* first-call costs (cuBLAS's heuristics), and the enqueue time to hide */
        if ((rc = one_rep(b, fn, arg, copies, per_rep, &next, 0, &ms[0], &enq[0], err))) return rc;
        if (ms[0] > 0 && ms[0] * 1e-3 * reps > b->row_s) reps = (int)(b->row_s / (ms[0] * 1e-3));
        if (reps < b->min_reps) reps = b->min_reps;
        /* a spin twice the enqueue time: the device reaches the first event
         * only after the host queued the whole rep (capped: beyond 50 ms the
         * row is launch-bound whatever the spin, and enq_us says so) */
        spin = 2e6 * enq[0] + 20;
        if (spin > 5e4) spin = 5e4;
    }
    if (reps > BG_MAX_REPS) reps = BG_MAX_REPS;
    for (int r = 0; r < reps; r++)
        if ((rc = one_rep(b, fn, arg, copies, per_rep, &next, b->emulated ? 0 : spin, &ms[r], &enq[r],
                          err)))
            return rc;
    if ((rc = hkv_gpu_sync(b->st, err))) return rc;   /* a kernel's own error surfaces here */
    row->us = bg_median(ms, reps) * 1e3 / per_rep;
    row->enq_us = bg_median(enq, reps) * 1e6 / per_rep;
    row->reps = reps;
    return HKV_OK;
}

int bg_copies(const bg *b, double bytes)
{
    if (bytes <= 0) return 1;
    double c = ceil((double)b->cold_bytes / bytes);
    return c < 1 ? 1 : c > 4096 ? 4096 : (int)c;
}

/* ---- rows out -------------------------------------------------------------------- */

static double gbs(const bg_row *r) { return r->us > 0 ? r->bytes / (r->us * 1e3) : 0; }

/* Shares: of the probe (DRAM rows), of the sheet's bandwidth, of the
 * sheet's peak for the FLOPs' unit; < 0: not meaningful. */
static void shares(const bg *b, const bg_row *r, double *probe, double *sheet, double *flop)
{
    const double g = gbs(r);
    *probe = r->link == BG_DRAM && b->d2d_gbs > 0 ? g / b->d2d_gbs : -1;
    *sheet = !b->spec ? -1 : g / (r->link == BG_PCIE ? b->spec->pcie_gbs : b->spec->mem_gbs);
    double peak = 0;
    if (b->spec && r->flops > 0 && r->us > 0) {
        if (r->unit == BG_FP32) peak = b->spec->fp32_tflops;
        else if (r->unit == BG_TENSOR) peak = b->spec->tensor_tflops;
        else if (r->unit == BG_TENSOR_SPLIT) peak = b->spec->tensor_tflops / 3;
    }
    *flop = peak > 0 ? r->flops / (r->us * 1e-6) / (peak * 1e12) : -1;
}

static void pct(char *buf, size_t cap, double f)
{
    if (f < 0) snprintf(buf, cap, "-");
    else snprintf(buf, cap, "%.0f%%", 100 * f);
}

static void print_row(const bg *b, const bg_row *r, FILE *out)
{
    double p, s, f;
    shares(b, r, &p, &s, &f);
    char ps[16], ss[16], fs[16], tf[16];
    pct(ps, sizeof ps, p), pct(ss, sizeof ss, s), pct(fs, sizeof fs, f);
    if (r->flops > 0 && r->us > 0) snprintf(tf, sizeof tf, "%.2f", r->flops / (r->us * 1e6));
    else snprintf(tf, sizeof tf, "-");
    fprintf(out, "%-12s %-20s %-38s %10.1f %9.2f %8.1f %8s %6s %6s %6s %8.1f%s\n", r->group, r->kernel,
        r->shape, r->us, r->bytes / 1e6, gbs(r), tf, ps, ss, fs, r->enq_us,
        b->emulated ? "  emulated: not a speed" : "");
}

int bg_add(bg *b, const bg_row *row, json_t *params, hkv_err *err)
{
    if (!params) return hkv_seterr(err, HKV_E_NOMEM, "bench: no memory for a row's JSON");
    if (b->n_rows == b->cap_rows) {
        int nc = b->cap_rows ? 2 * b->cap_rows : 64;
        bg_row *nr = realloc(b->rows, (size_t)nc * sizeof *nr);
        if (!nr) {
            json_decref(params);
            return hkv_seterr(err, HKV_E_NOMEM, "bench: no memory for %d rows", nc);
        }
        b->rows = nr, b->cap_rows = nc;
    }
    b->rows[b->n_rows] = *row;
    b->rows[b->n_rows++].params = params;
    /* with --json the rows go to stderr as they come: a run cut short by a
     * time limit still leaves what it measured in the log */
    print_row(b, row, b->json ? stderr : stdout);
    return HKV_OK;
}

/* A share or rate: null where it does not apply (negative) or is not finite. */
static json_t *num_or_null(double v) { return v < 0 ? json_null() : hkv_jnum(v, "%.6g"); }

static int print_json(const bg *b, const hkv_gpu_device *dev, hkv_err *err)
{
    int bad = 0;
    json_t *o = json_object(), *d = json_object(), *rows = json_array();
    hkv_jset(d, "name", hkv_jstr(dev->name), &bad);
    hkv_jset(d, "cc", json_integer(10 * dev->cc_major + dev->cc_minor), &bad);
    hkv_jset(d, "sms", json_integer(dev->sm_count), &bad);
    hkv_jset(d, "mem_bytes", json_integer((json_int_t)dev->mem_total), &bad);
    hkv_jset(d, "emulated", json_boolean(b->emulated), &bad);
    hkv_jset(d, "backend", json_string(hkv_gpu_backend()), &bad);
    hkv_jset(o, "device", d, &bad);
    json_t *sh = json_null();
    if (b->spec) {
        sh = json_object();
        hkv_jset(sh, "name", hkv_jstr(b->spec->name), &bad);
        hkv_jset(sh, "label", hkv_jstr(b->spec->label), &bad);
        hkv_jset(sh, "mem_gbs", hkv_jnum(b->spec->mem_gbs, "%.1f"), &bad);
        hkv_jset(sh, "pcie_gbs", hkv_jnum(b->spec->pcie_gbs, "%.1f"), &bad);
        hkv_jset(sh, "tensor_tflops", hkv_jnum(b->spec->tensor_tflops, "%.1f"), &bad);
        hkv_jset(sh, "fp32_tflops", hkv_jnum(b->spec->fp32_tflops, "%.1f"), &bad);
    }
    hkv_jset(o, "sheet", sh, &bad);
    hkv_jset(o, "d2d_gbs", hkv_jnum(b->d2d_gbs, "%.3f"), &bad);
    hkv_jset(o, "reps", json_integer(b->reps), &bad);
    hkv_jset(o, "cold_bytes", json_integer((json_int_t)b->cold_bytes), &bad);
    hkv_jset(o, "quick", json_boolean(b->quick), &bad);
    hkv_jset(o, "emulated", json_boolean(b->emulated), &bad);
    if (b->emulated)
        hkv_jset(o, "note", json_string("CUDA emulator on the CPU: every time is the emulation's, not a "
                                        "speed"), &bad);
    for (int i = 0; i < b->n_rows; i++) {
        const bg_row *r = &b->rows[i];
        double p, s, f;
        shares(b, r, &p, &s, &f);
        json_t *x = json_object();
        hkv_jset(x, "group", hkv_jstr(r->group), &bad);
        hkv_jset(x, "kernel", hkv_jstr(r->kernel), &bad);
        hkv_jset(x, "shape", hkv_jstr(r->shape), &bad);
        if (json_object_update(x, r->params)) bad = 1;   /* the shape's members, in their order */
        hkv_jset(x, "us", hkv_jnum(r->us, "%.3f"), &bad);
        hkv_jset(x, "host_enqueue_us", hkv_jnum(r->enq_us, "%.3f"), &bad);
        hkv_jset(x, "reps", json_integer(r->reps), &bad);
        hkv_jset(x, "bytes", hkv_jint(r->bytes), &bad);
        /* significant digits, not decimals: an emulated row under a sanitizer
         * moves kB in 100 ms, which three decimals of GB/s made 0 */
        hkv_jset(x, "gbs", hkv_jnum(gbs(r), "%.4g"), &bad);
        hkv_jset(x, "flops", r->flops > 0 ? hkv_jint(r->flops) : json_null(), &bad);
        hkv_jset(x, "tflops", num_or_null(r->flops > 0 && r->us > 0 ? r->flops / (r->us * 1e6) : -1),
                 &bad);
        hkv_jset(x, "probe_frac", num_or_null(p), &bad);
        hkv_jset(x, "sheet_frac", num_or_null(s), &bad);
        hkv_jset(x, "flop_frac", num_or_null(f), &bad);
        hkv_jset(x, "link", json_string(r->link == BG_PCIE ? "pcie" : "dram"), &bad);
        hkv_jset(x, "unit", json_string((const char *[]){"none", "fp32", "tensor", "tensor-split"}[r->unit]),
                 &bad);
        hkv_jset(x, "emulated", json_boolean(b->emulated), &bad);
        hkv_jpush(rows, x, &bad);
    }
    hkv_jset(o, "rows", rows, &bad);
    return hkv_json_emit(stdout, o, bad, err);
}

/* ---- the device and its data sheet ------------------------------------------------ */

/* The entry of hkv_device_specs() for a device name as CUDA reports it. */
static const hkv_device_spec *spec_of(const char *name)
{
    const char *key = NULL;
    if (strstr(name, "H200")) key = "h200";
    else if (strstr(name, "H100") && strstr(name, "PCIe")) key = "h100-pcie";
    else if (strstr(name, "H100") && !strstr(name, "NVL")) key = "h100";
    else if (strstr(name, "4090")) key = "rtx4090";
    else if (strstr(name, "A100")) key = "a100";
    int n = 0;
    const hkv_device_spec *s = hkv_device_specs(&n);
    for (int i = 0; key && i < n; i++)
        if (!strcmp(s[i].name, key)) return &s[i];
    return NULL;
}

static const char usage[] =
    "usage: hetkv bench kernels --device cuda [--quick] [--json] [--reps N] [--only LIST]\n"
    "The gpu/ kernels of a decode step, each timed on the device with CUDA events (median\n"
    "of N reps, default 10; --quick: 5 and smaller cold sets): a device-to-device copy (the\n"
    "probe), pinned PCIe copies, the weight products through hkv_gpu_qmat_matmul (Q4, Q8,\n"
    "F16 at Llama-3-8B's shapes; n = 1..8 GEMV, 64 and 512 in each --gpu-gemm mode), the\n"
    "near-tier decode attention, the prefill attention, and rocketkv's stage 2 (its two\n"
    "kernels together and alone, the list push, the token keep; Llama-3-8B 8K, budget 1024;\n"
    "1 and 4 sequences), and ctkvr's centroid recall (C 2048, C' 4; 1 and 8 rows; with\n"
    "policy). Per row: us per call, the bytes a call must move once and GB/s,\n"
    "TFLOP/s, shares of the probe (probe%), of the card's data sheet (sheet%, '-' for a\n"
    "card not in the table) and of its peak for the unit (flop%), and the host's enqueue\n"
    "time per call. Under the CUDA emulator: a small subset, every row labelled 'emulated:\n"
    "not a speed'. --only q4,q8,f16,attention,policy,sync: those rows (a comma list; the\n"
    "copies always run, they are the probe). The sync rows are wall-clock: the host's wait\n"
    "for a short kernel, and for one layer's round trip of the split at batch 1, asleep on\n"
    "the event against polling it (--gpu-spin-us).\n\n";

/* The options as given; hkv_bench_gpu_main moves them into its bg. */
typedef struct gpu_opts {
    int quick, json, reps, reps_set;
    unsigned only;
} gpu_opts;

/* hkv_bench_kernels_main sends only --device cuda here; anything else is refused. */
static int parse_gpu_device(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)base, (void)opt;
    if (strcmp(v, "cuda")) return hkv_seterr(err, HKV_E_INVAL, "bench kernels: --device %s here (cuda)", v);
    return HKV_OK;
}

static int parse_only(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    static const char *const names[] = {"q4", "q8", "f16", "attention", "policy", "sync"};
    gpu_opts *o = base;
    o->only = 0;
    for (const char *tok = v; tok && *tok;) {
        const char *comma = strchr(tok, ',');
        const size_t len = comma ? (size_t)(comma - tok) : strlen(tok);
        int k = 0;
        while (k < 6 && !(strlen(names[k]) == len && !strncmp(names[k], tok, len))) k++;
        if (k == 6)
            return hkv_seterr(err, HKV_E_INVAL, "bench kernels: --only %s: '%.*s' is not one of "
                              "q4, q8, f16, attention, policy, sync", v, (int)len, tok);
        o->only |= 1u << k;
        tok = comma ? comma + 1 : NULL;
    }
    return HKV_OK;
}

static int parse_reps(void *base, const char *opt, const char *v, hkv_err *err) {
    (void)opt;
    gpu_opts *o = base;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 1 || x > BG_MAX_REPS)
        return hkv_seterr(err, HKV_E_INVAL, "bench kernels: --reps %s (1..%d)", v, BG_MAX_REPS);
    o->reps = (int)x, o->reps_set = 1;
    return HKV_OK;
}

static const hkv_opt gpu_opts_table[] = {
    {.name = "--device", .arg = "cuda", .kind = HKV_OPT_FN, .fn = parse_gpu_device,
     .help = "the gpu/ kernels (this path)"},
    {.name = "--quick", .kind = HKV_OPT_FLAG, .off = offsetof(gpu_opts, quick),
     .help = "5 reps and smaller cold sets"},
    {.name = "--json", .kind = HKV_OPT_FLAG, .off = offsetof(gpu_opts, json),
     .help = "the rows as JSON"},
    {.name = "--reps", .arg = "N", .kind = HKV_OPT_FN, .fn = parse_reps,
     .help = "timed repetitions per row, 1..64 (default 10)"},
    {.name = "--only", .arg = "LIST", .kind = HKV_OPT_FN, .fn = parse_only,
     .help = "q4,q8,f16,attention,policy,sync: only those rows"},
    {0},
};

int hkv_bench_gpu_main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    hkv_err err;
    hkv_err_clear(&err);
    gpu_opts go = {.reps = 10, .only = BG_ONLY_ALL};
    const hkv_opt_use use = {.opts = gpu_opts_table, .base = &go};
    int prc = hkv_opts_parse("bench kernels --device cuda", &use, 1, argc, argv, &err);
    if (prc == 1) {
        hkv_opts_help(stdout, usage, &use, 1);
        return 0;
    }
    if (prc) {
        hkv_err_report(&err, stderr);
        return 2;
    }
    bg b = {.reps = go.reps, .min_reps = 3, .warm = 1, .row_s = 0.25, .cold_bytes = (size_t)512 << 20,
            .only = go.only, .quick = go.quick, .json = go.json};
    const int reps_set = go.reps_set;
    hkv_gpu_device dev[8];
    int n_dev = 0;
    char why[256] = "";
    hkv_gpu_query(dev, 8, &n_dev, why, sizeof why);
    if (n_dev < 1) {
        fprintf(stderr, "hetkv: error: bench kernels --device cuda: no CUDA device: %s\n", why);
        return 1;
    }
    b.emulated = dev[0].emulated;
    b.spec = b.emulated ? NULL : spec_of(dev[0].name);
    if (b.quick) b.reps = reps_set ? b.reps : 5, b.min_reps = 2, b.row_s = 0.1, b.cold_bytes >>= 1;
    if (b.emulated)   /* a subset, once each: the emulation is slow and no speed anyway */
        b.reps = reps_set ? b.reps : 1, b.min_reps = 1, b.warm = 0, b.cold_bytes = 0;
    int rc;
    if ((rc = hkv_gpu_ctx_create(&b.ctx, 0, NULL, 0, &err)) ||
        (rc = hkv_gpu_event_create(&b.ev0, &err)) || (rc = hkv_gpu_event_create(&b.ev1, &err)))
        goto out;
    b.st = hkv_gpu_ctx_stream(b.ctx);
    b.sm_count = hkv_gpu_ctx_sm_count(b.ctx);
    if (!b.json) {
        printf("hetkv bench kernels --device cuda: %s (cc %d.%d, %d SMs, %.1f GiB)%s\n", dev[0].name,
               dev[0].cc_major, dev[0].cc_minor, dev[0].sm_count, dev[0].mem_total / 1073741824.0,
               b.emulated ? " -- the CUDA emulator: every time below is the emulation's, not a speed" : "");
        if (b.spec)
            printf("data sheet: %s: %.0f GB/s, %s %.1f GB/s, %.1f TFLOPS fp16 tensor, %.1f fp32\n",
                   b.spec->label, b.spec->mem_gbs, b.spec->pcie, b.spec->pcie_gbs,
                   b.spec->tensor_tflops, b.spec->fp32_tflops);
        else
            printf("data sheet: - (this device is not in hkv_device_specs())\n");
        printf("median of up to %d reps (>= %d), each behind a spin; memory-bound rows rotate "
               "through %.0f MiB of copies;\nbytes: what a call must read and write once; probe%%: "
               "of the device-to-device copy below; sheet%%: of the data sheet's DRAM (PCIe rows: "
               "link) bandwidth; flop%%: of its peak for the unit (split: a third of the tensor "
               "peak); enq us: host time to queue one call\n\n",
               b.reps, b.min_reps, b.cold_bytes / 1048576.0);
        printf("%-12s %-20s %-38s %10s %9s %8s %8s %6s %6s %6s %8s\n", "group", "kernel", "shape",
               "us/call", "MB", "GB/s", "TFLOP/s", "probe%", "sheet%", "flop%", "enq us");
    }
    if ((rc = bg_run_copies(&b, &err)) || (rc = bg_run_products(&b, &err)) ||
        (rc = bg_run_attention(&b, &err)) || (rc = bg_run_policy(&b, &err)) ||
        (rc = bg_run_recall(&b, &err)) || (rc = bg_run_build(&b, &err)) || (rc = bg_run_sync(&b, &err)))
        goto out;
    if (b.json) rc = print_json(&b, &dev[0], &err);
out:
    if (rc) {
        hkv_err_prefix(&err, "bench kernels --device cuda");
        hkv_err_report(&err, stderr);
    }
    hkv_gpu_event_destroy(b.ev0);
    hkv_gpu_event_destroy(b.ev1);
    hkv_gpu_ctx_destroy(b.ctx);
    for (int i = 0; i < b.n_rows; i++) json_decref(b.rows[i].params);
    free(b.rows);
    return rc ? 1 : 0;
}

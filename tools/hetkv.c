/* hetkv: the command-line front end. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "eval.h"
#ifdef HKV_HAVE_SERVE
#include "serve.h"
#endif

static const char usage[] =
    "usage: hetkv COMMAND [options]\n"
    "\n"
    "Long-context LLM decoding with the KV cache split between GPU and host memory.\n"
    "\n"
    "commands:\n"
    "  run     generate text from a prompt (hetkv run --help)\n"
    "  batch   an offline job of OpenAI batch request lines, continuous batching, resumable\n"
    "  serve   an OpenAI-compatible HTTP server on the same scheduler (needs libmicrohttpd)\n"
    "  bench   prefill and decode throughput beside a memory-bandwidth probe\n"
    "  eval    fidelity of KV policies against dense attention, and retrieval tasks\n"
    "  info    CPU, instruction sets, cores, NUMA nodes, memory and CUDA devices\n"
    "  policies  the KV policies and their parameters\n"
    "  plan    the GPU memory plan: bytes per tier and the largest batch under a cap\n"
    "\n"
    "hetkv COMMAND --help shows each command's options.\n";

int main(int argc, char **argv) {
    /* A closed output (a pipe whose reader left, a client gone) is a write
     * error each command reports, keeping what it wrote (batch's finished
     * lines, run's streamed text), instead of a silent kill. */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return hkv_cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "batch")) return hkv_cmd_batch(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) {
#ifdef HKV_HAVE_SERVE
        return hkv_cmd_serve(argc - 1, argv + 1);
#else
        fputs("hetkv: error: serve: this hetkv was built without libmicrohttpd (install "
              "libmicrohttpd-dev and rebuild)\n", stderr);
        return 2;
#endif
    }
    if (!strcmp(cmd, "info")) return hkv_cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return hkv_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return hkv_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "policies")) return hkv_cmd_policies(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return hkv_cmd_plan(argc - 1, argv + 1);
    fprintf(stderr, "hetkv: error: unknown command '%s' (run, batch, serve, bench, eval, info, policies, plan; see hetkv --help)\n", cmd);
    return 2;
}

/* Progress lines on stderr for long work (a prefill, an eval sweep): the
 * share done, the rate and the time left at the rate so far. On a terminal
 * one line rewritten in place at most twice a second; otherwise (a log) a
 * line every 10 s. Nothing for work that ends within its first 2 s. */
#include <stdio.h>
#include <unistd.h>

#include "cli.h"

void hkv_progress_init(hkv_progress *p, const char *what, const char *unit) {
    p->what = what;
    p->unit = unit;
    p->tty = isatty(fileno(stderr));
    p->last = 0;
    p->shown = 0;
}

static void fmt_s(double s, char *buf, size_t cap) {
    if (s < 90) snprintf(buf, cap, "%.0f s", s);
    else if (s < 5400) snprintf(buf, cap, "%.1f min", s / 60);
    else snprintf(buf, cap, "%.1f h", s / 3600);
}

void hkv_progress_update(hkv_progress *p, double done, double total, double elapsed) {
    if (elapsed < p->last) p->last = 0;   /* a new piece of work (the next prefill) */
    if (elapsed < 2 || total <= 0) return;
    const int final = done >= total;
    if (!final && elapsed - p->last < (p->tty ? 0.5 : 10.0)) return;
    p->last = elapsed;
    char el[32], left[64] = "", count[96] = "";
    fmt_s(elapsed, el, sizeof el);
    if (!final && done > 0) {
        char t[32];
        fmt_s(elapsed * (total - done) / done, t, sizeof t);
        snprintf(left, sizeof left, ", about %s left", t);
    }
    if (p->unit)   /* "4096/8192 tokens (50%), 12 s, 341.3 tokens/s" */
        snprintf(count, sizeof count, " %.0f/%.0f %s (%.0f%%), %s, %.1f %s/s", done, total, p->unit,
                 100 * done / total, el, done / elapsed, p->unit);
    else
        snprintf(count, sizeof count, " %.0f%% done, %s", 100 * done / total, el);
    fprintf(stderr, "%shetkv: %s%s%s%s", p->tty ? "\r" : "", p->what, count, left,
            p->tty ? "\033[K" : "\n");
    if (p->tty && final) fputc('\n', stderr);
    p->shown = 1;
    fflush(stderr);
}

int hkv_progress_prefill(void *ud, int64_t done, int64_t n, double elapsed_s) {
    hkv_progress_update(ud, (double)done, (double)n, elapsed_s);
    return 0;
}
